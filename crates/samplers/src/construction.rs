//! Draft constructions: how a tuple of `n` draft tokens is drawn from the draft
//! distribution `q` (paper, section "Multi-Draft Speculative Decoding" and section 5).
//!
//! **Fewer drafts than asked.** Constructions that draw distinct tokens (all but
//! [`DraftConstruction::WithReplacement`]) never draft a token of probability zero, so they
//! return `m = min(n, |supp q|)` drafts ([`DraftConstruction::num_drafts`]); with-replacement
//! drafts always number `n` and may repeat. All probabilities are taken relative to
//! `sum(q)`, so a vector normalised only up to round-off is handled consistently.

use crate::dist::{
    fast_sum, rest_mass, sample_weighted, support_size, top_k_support, FAR_FROM_UNDERFLOW, SUBNORMAL_LIFT,
};
use crate::error::{Result, SamplerError};
use crate::TokenId;
use rand::Rng;
use std::fmt;
use std::str::FromStr;

/// The draft constructions of the paper plus top-k and conditional Poisson.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DraftConstruction {
    /// `n` i.i.d. draws from `q`: `P(t) = prod_j q(t_j)`.
    WithReplacement,
    /// Sequential draws, each from `q` renormalised over the tokens not yet drawn:
    /// `P(t) = prod_j q(t_j) / (1 - sum_{l<j} q(t_l))` (the paper's `q^{not ...}`).
    WithoutReplacement,
    /// Section 5.1: the top `n-1` tokens of `q`, then one token from `q` without them.
    Greedy,
    /// Section 5.3 (SpecHub, `n = 2` only): draw `x ~ q`; if `x` is the top token draw the
    /// second from `q` without it, else the second is the top token.
    SpecHub,
    /// The `n` most probable tokens, deterministically (EAGLE-2/3, SGLang).
    TopK,
    /// Conditional Poisson: a set `S` of `n` distinct tokens with `P(S) ∝ prod_{i∈S} q(i)`;
    /// the generating-function formula of the paper's section 4.2 is exact for it. Drafts are
    /// listed most probable first.
    ConditionalPoisson,
}

impl DraftConstruction {
    pub const ALL: [DraftConstruction; 6] = [
        Self::WithReplacement,
        Self::WithoutReplacement,
        Self::Greedy,
        Self::SpecHub,
        Self::TopK,
        Self::ConditionalPoisson,
    ];
    pub const NAMES: &'static str = "wr, wor, greedy, spechub, topk, cps";

    /// Short name used on command lines (`wr`, `wor`, `greedy`, `spechub`, `topk`, `cps`).
    pub fn name(self) -> &'static str {
        match self {
            Self::WithReplacement => "wr",
            Self::WithoutReplacement => "wor",
            Self::Greedy => "greedy",
            Self::SpecHub => "spechub",
            Self::TopK => "topk",
            Self::ConditionalPoisson => "cps",
        }
    }

    /// Checks `n` for this construction (n >= 1; SpecHub needs n = 2).
    pub fn check_n(self, n: usize) -> Result<()> {
        if n == 0 {
            return Err(SamplerError::ZeroDrafts);
        }
        if self == Self::SpecHub && n != 2 {
            return Err(SamplerError::UnsupportedDraftCount { construction: "SpecHub", supported: 2, n });
        }
        Ok(())
    }

    /// Number of drafts drawn from `q` when `n` are asked: `n` with replacement, else
    /// `min(n, |supp q|)`.
    pub fn num_drafts(self, q: &[f64], n: usize) -> usize {
        match self {
            Self::WithReplacement => n,
            _ => n.min(support_size(q)),
        }
    }

    /// Draws a draft tuple into `out` (cleared first).
    pub fn sample<R: Rng + ?Sized>(
        self,
        q: &[f64],
        n: usize,
        rng: &mut R,
        scratch: &mut DraftScratch,
        out: &mut Vec<TokenId>,
    ) -> Result<()> {
        self.check_n(n)?;
        out.clear();
        let total: f64 = fast_sum(q);
        if total.is_nan() || total <= 0.0 {
            return Err(SamplerError::BadDrafts("the draft distribution q has no positive entry".into()));
        }
        match self {
            Self::WithReplacement => sample_iid(q, total, n, rng, scratch, out),
            Self::WithoutReplacement => {
                let m = self.num_drafts(q, n);
                let mut drawn_mass = 0.0;
                for _ in 0..m {
                    let drawn = &*out;
                    let remaining = rest_mass(q, drawn, total, drawn_mass);
                    let t = sample_weighted(q, remaining, |i| drawn.contains(&(i as TokenId)), rng);
                    drawn_mass += q[t as usize];
                    out.push(t);
                }
            }
            Self::Greedy => {
                let m = self.num_drafts(q, n);
                top_k_support(q, m - 1, out);
                let removed: f64 = out.iter().map(|&t| q[t as usize]).sum();
                let top = &*out;
                let rest = rest_mass(q, top, total, removed);
                let t = sample_weighted(q, rest, |i| top.contains(&(i as TokenId)), rng);
                out.push(t);
            }
            Self::SpecHub => {
                top_k_support(q, 1, &mut scratch.tokens);
                let hub = scratch.tokens[0];
                if support_size(q) == 1 {
                    out.push(hub);
                } else {
                    let first = sample_weighted(q, total, |_| false, rng);
                    out.push(first);
                    if first == hub {
                        let rest = rest_mass(q, &[hub], total, q[hub as usize]);
                        out.push(sample_weighted(q, rest, |i| i == hub as usize, rng));
                    } else {
                        out.push(hub);
                    }
                }
            }
            Self::TopK => top_k_support(q, n, out),
            Self::ConditionalPoisson => sample_conditional_poisson(q, self.num_drafts(q, n), rng, scratch, out),
        }
        Ok(())
    }

    /// Exact probability that [`Self::sample`] returns exactly `tuple` (in this order).
    /// Used to enumerate all draft tuples on small vocabularies.
    pub fn tuple_probability(self, q: &[f64], n: usize, tuple: &[TokenId]) -> f64 {
        if self.check_n(n).is_err() || tuple.len() != self.num_drafts(q, n) {
            return 0.0;
        }
        if tuple.iter().any(|&t| t as usize >= q.len()) {
            return 0.0;
        }
        let total: f64 = fast_sum(q);
        let qt = |t: TokenId| q[t as usize] / total;
        let distinct = tuple.iter().enumerate().all(|(i, t)| !tuple[..i].contains(t));
        match self {
            Self::WithReplacement => tuple.iter().map(|&t| qt(t)).product(),
            Self::WithoutReplacement => {
                if !distinct {
                    return 0.0;
                }
                let mut used = 0.0;
                let mut prob = 1.0;
                for (k, &t) in tuple.iter().enumerate() {
                    prob *= q[t as usize] / rest_mass(q, &tuple[..k], total, used);
                    used += q[t as usize];
                }
                prob
            }
            Self::Greedy => {
                let m = tuple.len();
                let mut top = Vec::new();
                top_k_support(q, m - 1, &mut top);
                let last = tuple[m - 1];
                if tuple[..m - 1] != top[..] || top.contains(&last) {
                    return 0.0;
                }
                let removed: f64 = top.iter().map(|&t| q[t as usize]).sum();
                q[last as usize] / rest_mass(q, &top, total, removed)
            }
            Self::SpecHub => {
                let mut top = Vec::new();
                top_k_support(q, 1, &mut top);
                let hub = top[0];
                if tuple.len() == 1 {
                    return if tuple[0] == hub { 1.0 } else { 0.0 };
                }
                let (a, b) = (tuple[0], tuple[1]);
                if a == b {
                    0.0
                } else if b == hub {
                    qt(a)
                } else if a == hub {
                    qt(a) * q[b as usize] / rest_mass(q, &[hub], total, q[hub as usize])
                } else {
                    0.0
                }
            }
            Self::TopK => {
                let mut top = Vec::new();
                top_k_support(q, n, &mut top);
                if top[..] == *tuple {
                    1.0
                } else {
                    0.0
                }
            }
            Self::ConditionalPoisson => {
                if !distinct || !is_cps_order(q, tuple) {
                    return 0.0;
                }
                // prod_j q_j / e_m(q) = prod_j (q_j / rho_j), the tuple and the ratios both in
                // descending order: the product and e_m underflow when q spans hundreds of
                // orders of magnitude, while each factor stays moderate (rho_j is at least
                // the j-th largest q over C(|V|, j - 1)).
                // Each q_j is lifted as `poisson_ratios` lifts it (`q_j * (LIFT / total)`), not as
                // `(q_j / total) * LIFT`: a subnormal `q_j / total` keeps only its few bits, and
                // the factor `q_j / rho_j` of a subnormal q_j came out 1 +- 2e-10, not 1.
                let lift = SUBNORMAL_LIFT / total;
                let rho = poisson_ratios(q, lift, tuple.len());
                tuple.iter().zip(&rho).map(|(&t, r)| q[t as usize] * lift / r).product()
            }
        }
    }
}

impl fmt::Display for DraftConstruction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DraftConstruction {
    type Err = SamplerError;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "wr" | "with-replacement" => Self::WithReplacement,
            "wor" | "without-replacement" => Self::WithoutReplacement,
            "greedy" => Self::Greedy,
            "spechub" => Self::SpecHub,
            "topk" | "top-k" => Self::TopK,
            "cps" | "conditional-poisson" => Self::ConditionalPoisson,
            _ => {
                return Err(SamplerError::UnknownName {
                    kind: "draft construction",
                    name: s.to_string(),
                    expected: Self::NAMES,
                })
            }
        })
    }
}

/// Reusable buffers of the draft constructions (no allocation per draw once warm).
#[derive(Debug, Default, Clone)]
pub struct DraftScratch {
    tokens: Vec<TokenId>,
    uniforms: Vec<(f64, usize)>,
    table: Vec<f64>,
    support: Vec<TokenId>,
}

/// `n` i.i.d. draws in one pass over `q`: sorted uniforms walk the CDF once, each result
/// goes back to the position of its uniform, so the tuple keeps its i.i.d. order.
fn sample_iid<R: Rng + ?Sized>(
    q: &[f64],
    total: f64,
    n: usize,
    rng: &mut R,
    scratch: &mut DraftScratch,
    out: &mut Vec<TokenId>,
) {
    let u = &mut scratch.uniforms;
    u.clear();
    u.extend((0..n).map(|k| (rng.random::<f64>() * total, k)));
    u.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    out.resize(n, 0);
    let mut acc = 0.0;
    let mut next = 0;
    let mut last = 0;
    for (i, &w) in q.iter().enumerate() {
        if w <= 0.0 {
            continue;
        }
        acc += w;
        last = i;
        while next < n && u[next].0 < acc {
            out[u[next].1] = i as TokenId;
            next += 1;
        }
        if next == n {
            return;
        }
    }
    for &(_, k) in &u[next..] {
        out[k] = last as TokenId;
    }
}

/// Elementary symmetric polynomials `e_0..=e_m` of the values (the paper's `W_{k,H}`).
pub fn elementary_symmetric(values: impl Iterator<Item = f64>, m: usize) -> Vec<f64> {
    let mut e = vec![0.0; m + 1];
    e[0] = 1.0;
    for x in values {
        add_to_elementary_symmetric(&mut e, x);
    }
    e
}

/// `e ← e * (1 + x t)` truncated to the length of `e` (one value added).
#[inline]
pub fn add_to_elementary_symmetric(e: &mut [f64], x: f64) {
    for k in (1..e.len()).rev() {
        e[k] += x * e[k - 1];
    }
}

/// `e_0..=e_m` of `scale * v` for a whole vector: interleaved accumulators (shortening the
/// dependency chain), combined by truncated polynomial products. For `m <= 8` the degree is a
/// compile-time constant (the update unrolls; measured about 3x faster at vocabulary 151,936).
pub fn elementary_symmetric_scaled(v: &[f64], scale: f64, m: usize) -> Vec<f64> {
    match m {
        0 => vec![1.0],
        1 => fixed_degree::<1>(v, scale),
        2 => fixed_degree::<2>(v, scale),
        3 => fixed_degree::<3>(v, scale),
        4 => fixed_degree::<4>(v, scale),
        5 => fixed_degree::<5>(v, scale),
        6 => fixed_degree::<6>(v, scale),
        7 => fixed_degree::<7>(v, scale),
        8 => fixed_degree::<8>(v, scale),
        _ => any_degree(v, scale, m),
    }
}

/// `rho_k = e_k / e_{k-1}` of `scale * v`, `k = 1..=m` (so `e_m = prod_k rho_k`): the
/// conditional-Poisson quantities without their range problem. `e_m` of a q spanning
/// hundreds of orders of magnitude underflows f64 (it is a sum of products of `m` values),
/// while each ratio stays near the `k`-th largest value. Updated one value at a time by
/// [`add_to_poisson_ratios`]; 0 where fewer than `k` values are positive.
pub fn poisson_ratios(v: &[f64], scale: f64, m: usize) -> Vec<f64> {
    let mut rho = vec![0.0; m];
    for &x in v {
        if x > 0.0 {
            add_to_poisson_ratios(&mut rho, x * scale);
        }
    }
    rho
}

/// Adds the value `x > 0` to the set whose ratios `rho_k = e_k / e_{k-1}` (`rho[k - 1]`) are
/// given: `rho_1 += x` and, from `e_k' = e_k + x e_{k-1}`,
/// `rho_k' = rho_{k-1} (rho_k + x) / (rho_{k-1} + x)`. Nothing overflows (`rho_k <= rho_{k-1}` by
/// Newton's inequalities) and no step subtracts. The quotient taken is the one of at least 1/2:
/// `(rho_k + x) / (rho_{k-1} + x)` for `x > rho_{k-1}`, else `rho_{k-1} / (rho_{k-1} + x)`, so
/// that it never falls into the subnormal range. (Taking the first always had made it subnormal
/// for an `x` some 310 orders of magnitude below `rho_{k-1}`: a conditional-Poisson tuple of
/// probability 1 came out 1 - 9e-12.)
#[inline]
pub fn add_to_poisson_ratios(rho: &mut [f64], x: f64) {
    for k in (1..rho.len()).rev() {
        let prev = rho[k - 1];
        // With `prev = 0` (fewer than k - 1 values) `rho_k` stays 0.
        rho[k] = if prev <= 0.0 {
            0.0
        } else if x > prev {
            prev * ((rho[k] + x) / (prev + x))
        } else {
            (prev / (prev + x)) * (rho[k] + x)
        };
    }
    if let Some(first) = rho.first_mut() {
        *first += x;
    }
}

/// `s <- s * b` as polynomials given by their first `s.len()` coefficients (the product
/// truncated to the degree of `s`; `b` has at least as many coefficients).
pub(crate) fn truncated_product(s: &mut [f64], b: &[f64]) {
    // Descending degree: coefficient k reads only the degrees 0..=k of `s`, not yet rewritten.
    for k in (0..s.len()).rev() {
        let mut v = 0.0;
        for j in 0..=k {
            v += s[j] * b[k - j];
        }
        s[k] = v;
    }
}

fn fixed_degree<const M: usize>(v: &[f64], scale: f64) -> Vec<f64> {
    const LANES: usize = 4;
    let mut acc = [[0.0f64; 9]; LANES];
    for a in acc.iter_mut() {
        a[0] = 1.0;
    }
    let chunks = v.chunks_exact(LANES);
    for &x in chunks.remainder() {
        add_to_elementary_symmetric(&mut acc[0][..=M], x * scale);
    }
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            let x = x * scale;
            for k in (1..=M).rev() {
                a[k] += x * a[k - 1];
            }
        }
    }
    let [mut ab, b, mut cd, d] = acc;
    truncated_product(&mut ab[..=M], &b);
    truncated_product(&mut cd[..=M], &d);
    truncated_product(&mut ab[..=M], &cd);
    ab[..=M].to_vec()
}

fn any_degree(v: &[f64], scale: f64, m: usize) -> Vec<f64> {
    let mut a = vec![0.0; m + 1];
    let mut b = vec![0.0; m + 1];
    a[0] = 1.0;
    b[0] = 1.0;
    let pairs = v.chunks_exact(2);
    if let [x] = pairs.remainder() {
        add_to_elementary_symmetric(&mut a, x * scale);
    }
    for pair in pairs {
        add_to_elementary_symmetric(&mut a, pair[0] * scale);
        add_to_elementary_symmetric(&mut b, pair[1] * scale);
    }
    truncated_product(&mut a, &b);
    a
}

/// Conditional-Poisson drafts are listed most probable first (ties: lower id first).
fn is_cps_order(q: &[f64], tuple: &[TokenId]) -> bool {
    tuple.windows(2).all(|w| {
        let (a, b) = (q[w[0] as usize], q[w[1] as usize]);
        a > b || (a == b && w[0] < w[1])
    }) && tuple.iter().all(|&t| q[t as usize] > 0.0)
}

/// Exact conditional-Poisson sampling: walk the support, including token `i` with
/// probability `q_i e_{k-1}(rest) / e_k(i and rest) = q_i / (q_i + rho_k(rest))` where `k`
/// drafts are still needed and `rho_k = e_k / e_{k-1}` ([`add_to_poisson_ratios`]). From the
/// plain `e_k` where they stay above [`FAR_FROM_UNDERFLOW`], else from the ratios: `e_k` underflowed for a
/// q spanning hundreds of orders of magnitude (as at temperatures near 0), and the inclusion
/// probabilities were then 0/0, so the walk took the last tokens of the support, whatever
/// their q. (The ratios cost a division per token and draft.)
fn sample_conditional_poisson<R: Rng + ?Sized>(
    q: &[f64],
    m: usize,
    rng: &mut R,
    scratch: &mut DraftScratch,
    out: &mut Vec<TokenId>,
) {
    let support = &mut scratch.support;
    support.clear();
    support.extend((0..q.len() as TokenId).filter(|&i| q[i as usize] > 0.0));
    let s = support.len();
    let table = &mut scratch.table;
    // First the plain table (multiply-adds, vectorised): w = m + 1 columns,
    // table[i*w + k] = e_k(q over support[i..]). The walk reads e_k of a suffix only for
    // k <= min(m, its length), and those are at least the row's e_kmax (q sums to 1, so
    // e_k <= e_{k-1}), so the plain table is exact while every row's e_kmax is normal.
    let w = m + 1;
    table.clear();
    table.resize((s + 1) * w, 0.0);
    table[s * w] = 1.0;
    let mut smallest = f64::INFINITY;
    for i in (0..s).rev() {
        let qi = q[support[i] as usize];
        table[i * w] = 1.0;
        for k in 1..=m {
            table[i * w + k] = table[(i + 1) * w + k] + qi * table[(i + 1) * w + k - 1];
        }
        smallest = smallest.min(table[i * w + m.min(s - i)]);
    }
    let plain = smallest >= FAR_FROM_UNDERFLOW && smallest.is_finite();
    let w = if plain {
        w
    } else {
        // table[i*w + k - 1] = rho_k(lifted q over support[i..]), w = m columns, 0 for the
        // empty suffix.
        let w = m.max(1);
        table.clear();
        table.resize((s + 1) * w, 0.0);
        for i in (0..s).rev() {
            let (head, tail) = table.split_at_mut((i + 1) * w);
            let row = &mut head[i * w..];
            row.copy_from_slice(&tail[..w]);
            add_to_poisson_ratios(row, q[support[i] as usize] * SUBNORMAL_LIFT);
        }
        w
    };
    let mut need = m;
    for i in 0..s {
        if need == 0 {
            break;
        }
        let qi = q[support[i] as usize];
        let include = if plain {
            qi * table[(i + 1) * w + need - 1] / table[i * w + need]
        } else {
            let x = qi * SUBNORMAL_LIFT;
            x / (x + table[(i + 1) * w + need - 1])
        };
        if s - i == need || rng.random::<f64>() < include {
            out.push(support[i]);
            need -= 1;
        }
    }
    out.sort_unstable_by(|&a, &b| q[b as usize].total_cmp(&q[a as usize]).then(a.cmp(&b)));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lane-interleaved `e_0..=e_m` equals the one-token-at-a-time recursion, for every
    /// degree (fixed and general paths) and lengths that leave every remainder.
    #[test]
    fn elementary_symmetric_scaled_matches_the_plain_recursion() {
        for len in 0..14usize {
            let v: Vec<f64> = (0..len).map(|i| 0.05 + ((i * 37 + 11) % 17) as f64 / 40.0).collect();
            for m in 0..=10usize {
                let scale = 0.7;
                let want = elementary_symmetric(v.iter().map(|x| x * scale), m);
                let got = elementary_symmetric_scaled(&v, scale, m);
                assert_eq!(got.len(), m + 1);
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!((g - w).abs() <= 1e-12 * w.abs().max(1.0), "len {len}, m {m}, e_{k}: {g} vs {w}");
                }
            }
        }
    }
}
