//! K-SEQ (paper, appendix A.2; Sun et al., SpecTr) for `n` i.i.d. drafts.
//!
//! With `beta(rho) = sum_i min(p(i)/rho, q(i))`, draft `x_k` is accepted with probability
//! `min(1, p(x_k) / (rho q(x_k)))`; after `n` rejections the output is drawn from
//! `p(i) - c min(q(i), p(i)/rho)` (normalised, which divides by `(1-beta)^n`) where
//! `c = (1-(1-beta)^n)/beta`. Summing the acceptances gives `c min(q, p/rho)` per token, so the
//! output is exactly `p` whenever the residual is non-negative, i.e. whenever `c <= rho`.
//! The largest acceptance `1-(1-beta)^n` is reached at the root of
//! `1-(1-beta(rho))^n = rho beta(rho)`, which lies in `[1, n]`; [`solve_rho`] returns the
//! upper end of a bracket of that root, which still satisfies `c <= rho`, so round-off can
//! never make the residual negative.

use super::{accept_ratio, split_sums, Residual, Split, VerifyScratch};
use crate::dist::fast_sum;
use crate::TokenId;

/// The K-SEQ parameter and the resulting single-draft acceptance `beta(rho)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KSeqRho {
    pub rho: f64,
    pub beta: f64,
}

impl KSeqRho {
    /// `c = (1 - (1-beta)^n) / beta` (its limit `n` at `beta = 0`).
    pub fn c(&self, n: usize) -> f64 {
        if self.beta < 1e-300 {
            n as f64
        } else {
            (1.0 - (1.0 - self.beta).powi(n as i32)) / self.beta
        }
    }
    /// K-SEQ's acceptance rate `1 - (1-beta)^n`.
    pub fn alpha(&self, n: usize) -> f64 {
        1.0 - (1.0 - self.beta).powi(n as i32)
    }
}

/// Reusable buffers of the rho solver (the breakpoints inside the bracket).
#[derive(Debug, Default, Clone)]
pub struct RhoBuffers {
    mid: Vec<(f64, f64, f64)>,
}

/// Solves `1 - (1-beta(rho))^n = rho beta(rho)` for `rho` in `[1, n]` (inputs are normalised
/// by their sums here).
pub fn solve_rho(p: &[f64], q: &[f64], n: usize) -> KSeqRho {
    let (ip, iq) = (1.0 / fast_sum(p), 1.0 / fast_sum(q));
    let nf = n as f64;
    let mut mid = Vec::new();
    let (mut lo_p, mut hi_q) = (0.0, 0.0);
    for (&pi, &qi) in p.iter().zip(q) {
        classify(pi * ip, qi * iq, 1.0, nf, &mut lo_p, &mut hi_q, &mut mid);
    }
    solve_bracketed(n, 1.0, nf, lo_p, hi_q, &mut mid).expect("the root of g lies in [1, n]")
}

/// `g(rho) = 1 - (1-beta)^n - rho beta` with `beta = a/rho + b` (non-increasing in rho;
/// `g <= 0` is `c <= rho`).
#[inline]
fn g(n: usize, a: f64, b: f64, rho: f64) -> f64 {
    let beta = (a / rho + b).min(1.0);
    1.0 - (1.0 - beta).powi(n as i32) - rho * beta
}

#[inline]
fn at(a: f64, b: f64, rho: f64) -> KSeqRho {
    KSeqRho { rho, beta: (a / rho + b).min(1.0) }
}

/// Sorts one token into "ratio <= lo" (adds p to `lo_p`), "ratio >= hi" (adds q to `hi_q`)
/// or the breakpoints strictly inside; tokens with `q = 0` contribute nothing to beta.
#[inline]
fn classify(p: f64, q: f64, lo: f64, hi: f64, lo_p: &mut f64, hi_q: &mut f64, mid: &mut Vec<(f64, f64, f64)>) {
    if q <= 0.0 {
        return;
    }
    if p <= lo * q {
        *lo_p += p;
    } else if p >= hi * q {
        *hi_q += q;
    } else {
        mid.push((p / q, p, q));
    }
}

/// The root in `[lo, hi]`, given that every token outside `mid` has its ratio `<= lo`
/// (`lo_p`: their p) or `>= hi` (`hi_q`: their q); `None` when `g` does not change sign there.
///
/// `beta` is piecewise `A/rho + B` with breakpoints at the ratios of `mid`. A quickselect-style
/// search (median pivot, keep the half where `g` changes sign; expected linear time) finds the
/// piece holding the root, and bisection on that piece's closed form brackets it to round-off.
fn solve_bracketed(
    n: usize,
    lo: f64,
    hi: f64,
    mut lo_p: f64,
    mut hi_q: f64,
    mid: &mut [(f64, f64, f64)],
) -> Option<KSeqRho> {
    let nf = n as f64;
    let mid_q: f64 = mid.iter().map(|m| m.2).sum();
    let mid_p: f64 = mid.iter().map(|m| m.1).sum();
    if n <= 1 || g(n, lo_p, hi_q + mid_q, lo) <= 0.0 {
        return if lo <= 1.0 { Some(at(lo_p, hi_q + mid_q, 1.0)) } else { None };
    }
    if hi < nf && g(n, lo_p + mid_p, hi_q, hi) > 0.0 {
        return None;
    }
    let (mut lo, mut hi) = (lo, hi);
    let mut cand: &mut [(f64, f64, f64)] = mid;
    while !cand.is_empty() {
        let k = cand.len() / 2;
        cand.select_nth_unstable_by(k, |a, b| a.0.total_cmp(&b.0));
        let pivot = cand[k].0;
        let below_p: f64 = cand[..=k].iter().map(|m| m.1).sum();
        let above_q: f64 = cand[k + 1..].iter().map(|m| m.2).sum();
        if g(n, lo_p + below_p, hi_q + above_q, pivot) >= 0.0 {
            lo = pivot;
            lo_p += below_p;
            cand = &mut cand[k + 1..];
        } else {
            hi = pivot;
            hi_q += above_q + cand[k].2;
            cand = &mut cand[..k];
        }
    }
    Some(piece_root(n, lo_p, hi_q, lo, hi))
}

/// The smallest `rho` of `[lo, hi]`, to round-off, with `g <= 0` on the piece `beta = a/rho + b`
/// (the upper end of a bisection bracket, nudged up while `c > rho`).
fn piece_root(n: usize, a: f64, b: f64, lo: f64, hi: f64) -> KSeqRho {
    let (mut x0, mut x1) = (lo, hi);
    for _ in 0..200 {
        let m = 0.5 * (x0 + x1);
        if m <= x0 || m >= x1 {
            break;
        }
        if g(n, a, b, m) >= 0.0 {
            x0 = m;
        } else {
            x1 = m;
        }
    }
    let mut r = at(a, b, x1);
    while r.c(n) > r.rho * (1.0 + 1e-15) && r.rho < n as f64 {
        r = at(a, b, (r.rho * (1.0 + 1e-13)).min(n as f64));
    }
    r
}

/// `(sum of p where p <= rho q, sum of q where p > rho q)` for normalised inputs: the piece of
/// beta at `rho`. A read-only pass with four independent accumulators.
fn piece_at(p: &[f64], q: &[f64], rho: f64) -> (f64, f64) {
    let (mut a, mut b) = ([0.0f64; 4], [0.0f64; 4]);
    let (p4, q4) = (p.chunks_exact(4), q.chunks_exact(4));
    let (mut ra, mut rb) = (0.0, 0.0);
    for (&x, &y) in p4.remainder().iter().zip(q4.remainder()) {
        if x <= rho * y {
            ra += x;
        } else {
            rb += y;
        }
    }
    for (x, y) in p4.zip(q4) {
        for l in 0..4 {
            // 0/1 mask instead of a branch: the side is unpredictable and this vectorises.
            let low = (x[l] <= rho * y[l]) as u8 as f64;
            a[l] += low * x[l];
            b[l] += (1.0 - low) * y[l];
        }
    }
    ((a[0] + a[1]) + (a[2] + a[3]) + ra, (b[0] + b[1]) + (b[2] + b[3]) + rb)
}

/// `rho` for normalised inputs by read-only passes. Each pass at `rho` gives the piece of beta
/// there; the root of the lower end's piece is proposed (nudged just above), which lands on the
/// true root as soon as no breakpoint lies between (the passes then return the same piece).
/// Otherwise, after a few passes, the few tokens left inside the bracket are solved exactly.
/// Any returned `rho` has `g(rho) <= 0` with beta exact at `rho`, so K-SEQ stays lossless.
fn solve_rho_by_passes(p: &[f64], q: &[f64], n: usize, buffers: &mut RhoBuffers) -> KSeqRho {
    let nf = n as f64;
    let (mut a, mut b) = piece_at(p, q, 1.0);
    if n <= 1 || g(n, a, b, 1.0) <= 0.0 {
        return at(a, b, 1.0);
    }
    let (mut lo, mut hi) = (1.0, nf);
    for _ in 0..4 {
        let proposal = piece_root(n, a, b, lo, hi).rho;
        let cand = (proposal * (1.0 + 1e-14)).min(hi);
        if cand <= lo {
            break;
        }
        let (ca, cb) = piece_at(p, q, cand);
        if g(n, ca, cb, cand) <= 0.0 {
            if (ca, cb) == (a, b) {
                return at(ca, cb, cand); // no breakpoint in [lo, cand]: the piece root is the root
            }
            hi = cand;
        } else {
            lo = cand;
            (a, b) = (ca, cb);
        }
    }
    // Exact solve over the tokens whose ratio lies strictly inside [lo, hi].
    let mid = &mut buffers.mid;
    mid.clear();
    let (mut lo_p, mut hi_q) = (0.0, 0.0);
    for (&pi, &qi) in p.iter().zip(q) {
        classify(pi, qi, lo, hi, &mut lo_p, &mut hi_q, mid);
    }
    solve_bracketed(n, lo, hi, lo_p, hi_q, mid).unwrap_or_else(|| {
        let (mut lo_p, mut hi_q) = (0.0, 0.0);
        mid.clear();
        for (&pi, &qi) in p.iter().zip(q) {
            classify(pi, qi, 1.0, nf, &mut lo_p, &mut hi_q, mid);
        }
        solve_bracketed(n, 1.0, nf, lo_p, hi_q, mid).expect("the root of g lies in [1, n]")
    })
}

pub(super) fn walk(
    p: &[f64],
    q: &[f64],
    n: usize,
    drafts: &[TokenId],
    scratch: &mut VerifyScratch,
    visit: &mut dyn FnMut(usize, f64) -> bool,
) -> Residual {
    let k = solve_rho_by_passes(p, q, n, &mut scratch.rho);
    for (i, &d) in drafts.iter().enumerate() {
        let a = accept_ratio(p[d as usize], k.rho * q[d as usize]);
        if visit(i, a) || a >= 1.0 {
            return Residual::Target;
        }
    }
    // Residual p - c min(q, p/rho): (1 - c/rho) p where p <= rho q, else p - c q.
    let c = k.c(n);
    let split = Split { threshold: k.rho, low_scale: (1.0 - c / k.rho).max(0.0) };
    let total = split_sums(p, q, split, &mut scratch.blocks);
    if total <= 0.0 {
        return Residual::Target;
    }
    Residual::Split(split, total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn dist(r: &mut StdRng, v: usize, power: i32) -> Vec<f64> {
        let x: Vec<f64> = (0..v).map(|_| (-r.random::<f64>().max(1e-300).ln()).powi(power)).collect();
        let s: f64 = x.iter().sum();
        x.into_iter().map(|w| w / s).collect()
    }

    /// The pass-based solve used by the verifier agrees with the exact full solve, and its
    /// result always satisfies `c <= rho` (the condition for losslessness).
    #[test]
    fn pass_based_rho_matches_full_solve() {
        let mut r = StdRng::seed_from_u64(3);
        for case in 0..40 {
            let v = [50, 1000, 20_000, 151_936][case % 4];
            let p = dist(&mut r, v, 1 + (case % 3) as i32);
            let q = dist(&mut r, v, 1 + (case % 2) as i32);
            for n in [1, 2, 3, 4, 8] {
                let full = solve_rho(&p, &q, n);
                let fast = solve_rho_by_passes(&p, &q, n, &mut RhoBuffers::default());
                assert!((fast.rho - full.rho).abs() <= 1e-11 * full.rho, "V={v} n={n}: {fast:?} vs {full:?}");
                assert!((fast.alpha(n) - full.alpha(n)).abs() <= 1e-11, "V={v} n={n}: {fast:?} vs {full:?}");
                assert!(fast.c(n) <= fast.rho * (1.0 + 1e-15), "V={v} n={n}: c > rho");
                let direct: f64 = p.iter().zip(&q).map(|(&a, &b)| (a / fast.rho).min(b)).sum();
                assert!((fast.beta - direct).abs() < 1e-12, "beta {} vs direct {direct}", fast.beta);
            }
        }
    }
}
