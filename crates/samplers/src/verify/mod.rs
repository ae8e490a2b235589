//! Verifiers: given the target distribution `p`, the draft distribution `q` and a draft
//! tuple, output one token distributed **exactly** as `p` (averaged over the drafts of the
//! matching construction) while matching a draft as often as possible.
//!
//! Every verifier here is a *walk*: it offers the drafts one by one, each with an acceptance
//! probability that may depend on the earlier rejections, and if all are rejected it samples a
//! residual distribution. The same walk gives both the random verdict ([`Verifier::verify`])
//! and the exact output distribution given the drafts ([`Verifier::output_distribution`]),
//! which the tests enumerate over all draft tuples.
//!
//! Temperature 0 is the case of one-hot `p` and `q` (see [`crate::dist::Warp`]); every
//! verifier then outputs the argmax of `p` and so accepts exactly when a draft equals it.

mod greedy;
mod kseq;
mod membership;
mod rrs;

pub use kseq::{solve_rho, KSeqRho, RhoBuffers};

use crate::construction::DraftConstruction;
use crate::dist::sample_weighted;
use crate::error::{Result, SamplerError};
use crate::pairs::validate_pair;
use crate::TokenId;
use rand::Rng;
use std::fmt;
use std::str::FromStr;

/// The verification algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verifier {
    /// Recursive rejection sampling (appendix A.1): RRS-w for drafts with replacement,
    /// RRS-wo for drafts without replacement. With one draft, standard speculative sampling.
    Rrs,
    /// K-SEQ (appendix A.2) for i.i.d. drafts, with `rho` solving `1-(1-beta)^n = rho beta`.
    KSeq,
    /// Section 5.2: optimal transport between `p` and `q` without the top `n-1` tokens,
    /// applied to the one random draft; the top tokens are accepted through the residual.
    Greedy,
    /// SpecHub (`n = 2`): the optimal plan for SpecHub's sparse pairs, which always contain
    /// the hub (the top token of `q`).
    SpecHub,
    /// For deterministic (top-k) drafts, and valid for any construction: accept draft `x`
    /// with probability `p(x)` (renormalised over the drafts not yet offered), else remove it;
    /// sample `p` without the drafts at the end. Acceptance `E[p(drafts)]`.
    TopK,
}

impl Verifier {
    pub const ALL: [Verifier; 5] = [Self::Rrs, Self::KSeq, Self::Greedy, Self::SpecHub, Self::TopK];
    pub const NAMES: &'static str = "rrs, kseq, greedy, spechub, topk";

    pub fn name(self) -> &'static str {
        match self {
            Self::Rrs => "rrs",
            Self::KSeq => "kseq",
            Self::Greedy => "greedy",
            Self::SpecHub => "spechub",
            Self::TopK => "topk",
        }
    }

    /// Verifies `drafts` (drawn by `construction` from `q` with `n` asked) against `p`.
    ///
    /// `p` and `q` must be normalised (they are not summed again on this hot path); the output
    /// is distributed as `p` to the precision of that normalisation. Allocation-free once
    /// `scratch` is warm; costs O(1) when a draft is accepted at once, and one pass over the
    /// vocabulary per rejection that needs a residual.
    #[allow(clippy::too_many_arguments)]
    pub fn verify<R: Rng + ?Sized>(
        self,
        construction: DraftConstruction,
        n: usize,
        p: &[f64],
        q: &[f64],
        drafts: &[TokenId],
        rng: &mut R,
        scratch: &mut VerifyScratch,
    ) -> Result<Verdict> {
        check_inputs(self, construction, n, p, q, drafts)?;
        Ok(sampled_verdict(p, q, drafts, rng, scratch, |s, visit| walk(self, construction, n, p, q, drafts, s, visit)))
    }

    /// The exact distribution of the output token given the drafts.
    pub fn output_distribution(
        self,
        construction: DraftConstruction,
        n: usize,
        p: &[f64],
        q: &[f64],
        drafts: &[TokenId],
    ) -> Result<Vec<f64>> {
        check_inputs(self, construction, n, p, q, drafts)?;
        Ok(exact_output(p, q, drafts, |s, visit| walk(self, construction, n, p, q, drafts, s, visit)))
    }
}

/// Runs a walk (`walk(scratch, visit)`) with random acceptances and samples its residual
/// after a rejection of every draft. `q` is read only by a [`Residual::Split`].
fn sampled_verdict<R: Rng + ?Sized>(
    p: &[f64],
    q: &[f64],
    drafts: &[TokenId],
    rng: &mut R,
    scratch: &mut VerifyScratch,
    walk: impl FnOnce(&mut VerifyScratch, &mut dyn FnMut(usize, f64) -> bool) -> Residual,
) -> Verdict {
    let mut accepted = None;
    let residual = walk(scratch, &mut |k, a| {
        let take = a >= 1.0 || (a > 0.0 && rng.random::<f64>() < a);
        if take {
            accepted = Some(k);
        }
        take
    });
    let token = match (accepted, residual) {
        (Some(k), _) => drafts[k],
        (None, Residual::Target) => sample_weighted(p, 1.0, |_| false, rng),
        (None, Residual::Scratch(total)) => sample_blocked(&scratch.residual, &scratch.blocks, total, rng),
        (None, Residual::Split(split, total)) => sample_split(p, q, split, &scratch.blocks, total, rng),
    };
    Verdict { token, accepted: drafts.iter().position(|&d| d == token) }
}

/// The exact output distribution of a walk: each offered draft's acceptance times the mass not
/// yet taken, then the residual's share.
fn exact_output(
    p: &[f64],
    q: &[f64],
    drafts: &[TokenId],
    walk: impl FnOnce(&mut VerifyScratch, &mut dyn FnMut(usize, f64) -> bool) -> Residual,
) -> Vec<f64> {
    let mut out = vec![0.0; p.len()];
    let mut mass = 1.0;
    let mut scratch = VerifyScratch::default();
    let residual = walk(&mut scratch, &mut |k, a| {
        let a = a.clamp(0.0, 1.0);
        out[drafts[k] as usize] += mass * a;
        mass *= 1.0 - a;
        false
    });
    if mass > 0.0 {
        match residual {
            Residual::Target => out.iter_mut().zip(p).for_each(|(o, &x)| *o += mass * x),
            Residual::Scratch(total) => {
                out.iter_mut().zip(&scratch.residual).for_each(|(o, &x)| *o += mass * x / total)
            }
            Residual::Split(split, total) => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o += mass * split.weight(p[i], q[i]) / total;
                }
            }
        }
    }
    out
}

/// Verifies drafts that are a deterministic function of the context (n-gram lookup, a fixed
/// candidate list): there is no draft distribution, and the membership walk of
/// [`Verifier::TopK`] is lossless for any such drafts because it is a sequential draw from `p`
/// itself (draft `x` is taken with probability `p(x)` over the mass not yet offered, then `p`
/// without the drafts). Its acceptance, `p` of the distinct drafts, is the most any verifier
/// can reach: the output must be distributed as `p`, and a draft is matched only when the
/// output equals it (the transport LP with one draft tuple of probability 1).
///
/// `p` must be normalised. Allocation-free once `scratch` is warm.
pub fn verify_deterministic<R: Rng + ?Sized>(
    p: &[f64],
    drafts: &[TokenId],
    rng: &mut R,
    scratch: &mut VerifyScratch,
) -> Result<Verdict> {
    check_drafts(p, drafts)?;
    // The membership walk never splits (p, q), so `q` is not read.
    Ok(sampled_verdict(p, p, drafts, rng, scratch, |s, visit| membership::walk(p, drafts, s, visit)))
}

/// The exact distribution of [`verify_deterministic`]'s output given the drafts (`p`, for
/// every draft tuple; the tests enumerate them).
pub fn deterministic_output_distribution(p: &[f64], drafts: &[TokenId]) -> Result<Vec<f64>> {
    check_drafts(p, drafts)?;
    Ok(exact_output(p, p, drafts, |s, visit| membership::walk(p, drafts, s, visit)))
}

/// The draft tuple against `p`, for every verifier: not empty, inside the vocabulary, and `p`
/// normalised (checked in debug builds).
fn check_drafts(p: &[f64], drafts: &[TokenId]) -> Result<()> {
    if drafts.is_empty() {
        return Err(SamplerError::BadDrafts("no drafts".into()));
    }
    if let Some(&t) = drafts.iter().find(|&&t| t as usize >= p.len()) {
        return Err(SamplerError::BadDrafts(format!("draft token {t} is outside the vocabulary of {}", p.len())));
    }
    debug_assert!((crate::dist::fast_sum(p) - 1.0).abs() < 1e-9, "p is not normalised");
    Ok(())
}

impl fmt::Display for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Verifier {
    type Err = SamplerError;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "rrs" => Self::Rrs,
            "kseq" | "k-seq" => Self::KSeq,
            "greedy" => Self::Greedy,
            "spechub" => Self::SpecHub,
            "topk" | "top-k" => Self::TopK,
            _ => return Err(SamplerError::UnknownName { kind: "verifier", name: s.into(), expected: Self::NAMES }),
        })
    }
}

/// The result of one verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The output token, distributed as `p`.
    pub token: TokenId,
    /// Index of the first draft equal to `token`, if any: the tree branch to descend into.
    pub accepted: Option<usize>,
}

/// Reusable buffers of the verifiers (one residual vector of vocabulary size and its block
/// sums).
#[derive(Debug, Default, Clone)]
pub struct VerifyScratch {
    pub(crate) residual: Vec<f64>,
    pub(crate) blocks: Vec<f64>,
    pub(crate) removed: Vec<TokenId>,
    pub(crate) rho: RhoBuffers,
}

/// Where a walk's residual distribution lives.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Residual {
    /// `p` itself (a walk that never needed a residual).
    Target,
    /// `scratch.residual`, with this total and block sums in `scratch.blocks`.
    Scratch(f64),
    /// The weights of a [`Split`] of `(p, q)` (computed on the fly, never stored), with this
    /// total and block sums in `scratch.blocks`.
    Split(Split, f64),
}

/// Residual weights that depend on a token only through `(p_i, q_i)` and a ratio threshold
/// `T`: `low_scale * min(p_i, T q_i) + (p_i - T q_i)_+`, i.e. `low_scale * p_i` where
/// `p_i <= T q_i` and `p_i - T (1 - low_scale) q_i` above. RRS's residuals are `(p - S q)_+`
/// (`T = S`, `low_scale = 0`); K-SEQ's is `(1 - c/rho) p` below `rho` and `p - c q` above
/// (`T = rho`, `low_scale = 1 - c/rho`). The min/max form is branch-free, so the passes
/// vectorise.
///
/// `T` is held as `threshold * q_scale`, with `q_scale` a power of two multiplying `q` first:
/// RRS without replacement adds `Z_k / z_k` to `T`, which overflows f64 when the mass `z_k`
/// not yet drafted is subnormal (a q spanning 700 nats, as at temperatures near 0); as
/// `inf`, `T q` was NaN on tokens outside q's support and 0 on subnormal ones, which changed
/// the output law. Scaling by a power of two is exact, so `q_scale = 1` and any other scale
/// give the same weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Split {
    pub threshold: f64,
    pub low_scale: f64,
    pub q_scale: f64,
}

impl Split {
    #[inline(always)]
    pub(crate) fn weight(&self, p: f64, q: f64) -> f64 {
        let tq = self.threshold * (q * self.q_scale);
        self.low_scale * p.min(tq) + (p - tq).max(0.0)
    }
}

/// Tokens per block of a residual's block sums.
const RESIDUAL_BLOCK: usize = 1024;

/// Writes `residual[i] = f(i)` for `i < len` and the block sums; returns the total. One pass
/// over the vocabulary.
pub(crate) fn fill_residual(
    residual: &mut Vec<f64>,
    blocks: &mut Vec<f64>,
    len: usize,
    mut f: impl FnMut(usize) -> f64,
) -> f64 {
    residual.resize(len, 0.0);
    blocks.clear();
    let mut total = 0.0;
    for (b, chunk) in residual.chunks_mut(RESIDUAL_BLOCK).enumerate() {
        let base = b * RESIDUAL_BLOCK;
        let mut s = 0.0;
        for (j, r) in chunk.iter_mut().enumerate() {
            let v = f(base + j);
            *r = v;
            s += v;
        }
        blocks.push(s);
        total += s;
    }
    total
}

/// Block sums of a split's weights into `blocks`; returns the total. A read-only pass with
/// four independent accumulators (vectorisable); nothing of vocabulary size is written.
pub(crate) fn split_sums(p: &[f64], q: &[f64], split: Split, blocks: &mut Vec<f64>) -> f64 {
    if split.low_scale == 0.0 && split.q_scale == 1.0 {
        // RRS's residual (p - T q)_+: the same weight without the low side's min and multiply,
        // which measured about twice as fast on the vocabulary pass.
        let t = split.threshold;
        return block_sums(p, q, blocks, |a, b| (a - t * b).max(0.0));
    }
    block_sums(p, q, blocks, |a, b| split.weight(a, b))
}

#[inline(always)]
fn block_sums(p: &[f64], q: &[f64], blocks: &mut Vec<f64>, weight: impl Fn(f64, f64) -> f64) -> f64 {
    blocks.clear();
    let mut total = 0.0;
    for (pc, qc) in p.chunks(RESIDUAL_BLOCK).zip(q.chunks(RESIDUAL_BLOCK)) {
        let sum = crate::dist::pair_sum(pc, qc, &weight);
        blocks.push(sum);
        total += sum;
    }
    total
}

/// Draws from a split's weights over `total`, using the block sums of [`split_sums`].
fn sample_split<R: Rng + ?Sized>(
    p: &[f64],
    q: &[f64],
    split: Split,
    blocks: &[f64],
    total: f64,
    rng: &mut R,
) -> TokenId {
    let target = rng.random::<f64>() * total;
    let mut acc = 0.0;
    let mut last = None;
    for (b, &sum) in blocks.iter().enumerate() {
        let range = b * RESIDUAL_BLOCK..((b + 1) * RESIDUAL_BLOCK).min(p.len());
        if sum > 0.0 && target < acc + sum {
            let mut inner = acc;
            for i in range {
                let w = split.weight(p[i], q[i]);
                if w > 0.0 {
                    inner += w;
                    last = Some(i);
                    if target < inner {
                        return i as TokenId;
                    }
                }
            }
            break; // round-off at the block's end: its last positive weight
        }
        if sum > 0.0 {
            last = range.rev().find(|&i| split.weight(p[i], q[i]) > 0.0);
        }
        acc += sum;
    }
    last.unwrap_or(0) as TokenId
}

/// Sets `residual[i] = v` keeping the block sums right; returns the change of the total.
pub(crate) fn overwrite_residual(residual: &mut [f64], blocks: &mut [f64], i: usize, v: f64) -> f64 {
    let delta = v - residual[i];
    residual[i] = v;
    blocks[i / RESIDUAL_BLOCK] += delta;
    delta
}

/// Draws from `residual / total` using its block sums: O(V / block + block).
fn sample_blocked<R: Rng + ?Sized>(residual: &[f64], blocks: &[f64], total: f64, rng: &mut R) -> TokenId {
    let target = rng.random::<f64>() * total;
    let mut acc = 0.0;
    for (b, &s) in blocks.iter().enumerate() {
        if s > 0.0 && target < acc + s {
            let start = b * RESIDUAL_BLOCK;
            let chunk = &residual[start..(start + RESIDUAL_BLOCK).min(residual.len())];
            let mut inner = acc;
            let mut last = None;
            for (j, &w) in chunk.iter().enumerate() {
                if w > 0.0 {
                    inner += w;
                    last = Some(j);
                    if target < inner {
                        return (start + j) as TokenId;
                    }
                }
            }
            if let Some(j) = last {
                return (start + j) as TokenId; // round-off at the block's end
            }
        }
        acc += s;
    }
    // Round-off beyond the total: the last positive weight.
    residual.iter().rposition(|&w| w > 0.0).unwrap_or(0) as TokenId
}

fn check_inputs(
    verifier: Verifier,
    construction: DraftConstruction,
    n: usize,
    p: &[f64],
    q: &[f64],
    drafts: &[TokenId],
) -> Result<()> {
    validate_pair(construction, verifier)?;
    construction.check_n(n)?;
    if p.len() != q.len() {
        return Err(SamplerError::LengthMismatch { p: p.len(), q: q.len() });
    }
    check_drafts(p, drafts)?;
    debug_assert!((crate::dist::fast_sum(q) - 1.0).abs() < 1e-9, "q is not normalised");
    Ok(())
}

/// Runs the verifier's walk: `visit(k, a)` offers draft `k` with acceptance probability `a`
/// and returns whether it was taken (which ends the walk). Returns where the residual is
/// (meaningful only when no draft was taken).
#[allow(clippy::too_many_arguments)]
fn walk(
    verifier: Verifier,
    construction: DraftConstruction,
    n: usize,
    p: &[f64],
    q: &[f64],
    drafts: &[TokenId],
    scratch: &mut VerifyScratch,
    visit: &mut dyn FnMut(usize, f64) -> bool,
) -> Residual {
    match verifier {
        Verifier::Rrs => rrs::walk(p, q, drafts, construction == DraftConstruction::WithoutReplacement, scratch, visit),
        Verifier::KSeq => kseq::walk(p, q, n, drafts, scratch, visit),
        Verifier::Greedy => greedy::walk(p, q, drafts, drafts.len() - 1, scratch, visit),
        Verifier::SpecHub => greedy::walk_spechub(p, q, drafts, scratch, visit),
        Verifier::TopK => membership::walk(p, drafts, scratch, visit),
    }
}

/// `min(1, a / b)` with the conventions `x/0 = 1` for `x > 0` and `0/0 = 0`.
pub(crate) fn accept_ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        (a / b).min(1.0)
    } else if a > 0.0 {
        1.0
    } else {
        0.0
    }
}
