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

use super::{accept_ratio, fill_residual, Residual, VerifyScratch};
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

/// Reusable buffers of the rho solver (the breakpoints inside `(1, n)`).
#[derive(Debug, Default, Clone)]
pub struct RhoBuffers {
    mid: Vec<(f64, f64, f64)>,
}

/// Solves `1 - (1-beta(rho))^n = rho beta(rho)` for `rho` in `[1, n]` (inputs are normalised
/// by their sums here).
pub fn solve_rho(p: &[f64], q: &[f64], n: usize) -> KSeqRho {
    solve_rho_in(p, q, n, 1.0 / fast_sum(p), 1.0 / fast_sum(q), &mut RhoBuffers::default())
}

/// The solver, for `p * ip` and `q * iq`.
///
/// `beta` is piecewise `A/rho + B` with breakpoints at the ratios `p_i/q_i`; the function
/// `g(rho) = 1-(1-beta)^n - rho beta` is non-increasing, `g(1) >= 0` and `g(n) <= 0`. One pass
/// sorts the tokens into "ratio <= 1" (always `p/rho`), "ratio >= n" (always `q`) and the
/// breakpoints in between; a quickselect-style search over those (median pivot, keep the half
/// where `g` changes sign, expected linear time) finds the piece holding the root, and
/// bisection on that piece's closed form brackets the root to round-off.
pub(crate) fn solve_rho_in(p: &[f64], q: &[f64], n: usize, ip: f64, iq: f64, buffers: &mut RhoBuffers) -> KSeqRho {
    let nf = n as f64;
    let mid = &mut buffers.mid;
    mid.clear();
    let (mut lo_p, mut hi_q) = (0.0, 0.0); // p of tokens below the piece, q of those above
    for (&pi, &qi) in p.iter().zip(q) {
        let (pi, qi) = (pi * ip, qi * iq);
        if qi <= 0.0 {
            continue;
        }
        if pi <= qi {
            lo_p += pi;
        } else if pi >= nf * qi {
            hi_q += qi;
        } else {
            mid.push((pi / qi, pi, qi));
        }
    }
    let g = |a: f64, b: f64, rho: f64| {
        let beta = (a / rho + b).min(1.0);
        1.0 - (1.0 - beta).powi(n as i32) - rho * beta
    };
    let whole = |a: f64, b: f64, rho: f64| KSeqRho { rho, beta: (a / rho + b).min(1.0) };
    let all_mid_q: f64 = mid.iter().map(|m| m.2).sum();
    if n <= 1 || g(lo_p, hi_q + all_mid_q, 1.0) <= 0.0 {
        return whole(lo_p, hi_q + all_mid_q, 1.0);
    }
    let (mut lo, mut hi) = (1.0, nf);
    let mut cand: &mut [(f64, f64, f64)] = &mut mid[..];
    while !cand.is_empty() {
        let k = cand.len() / 2;
        cand.select_nth_unstable_by(k, |a, b| a.0.total_cmp(&b.0));
        let pivot = cand[k].0;
        let below_p: f64 = cand[..=k].iter().map(|m| m.1).sum();
        let above_q: f64 = cand[k + 1..].iter().map(|m| m.2).sum();
        if g(lo_p + below_p, hi_q + above_q, pivot) >= 0.0 {
            lo = pivot;
            lo_p += below_p;
            cand = &mut cand[k + 1..];
        } else {
            hi = pivot;
            hi_q += above_q + cand[k].2;
            cand = &mut cand[..k];
        }
    }
    // The root lies in [lo, hi], where beta = lo_p / rho + hi_q.
    let (mut x0, mut x1) = (lo, hi);
    for _ in 0..200 {
        let m = 0.5 * (x0 + x1);
        if m <= x0 || m >= x1 {
            break;
        }
        if g(lo_p, hi_q, m) >= 0.0 {
            x0 = m;
        } else {
            x1 = m;
        }
    }
    let mut r = whole(lo_p, hi_q, x1);
    // Guard against round-off: keep c <= rho so that the residual is non-negative.
    while r.c(n) > r.rho * (1.0 + 1e-15) && r.rho < nf {
        r = whole(lo_p, hi_q, (r.rho * (1.0 + 1e-13)).min(nf));
    }
    r
}

pub(super) fn walk(
    p: &[f64],
    q: &[f64],
    n: usize,
    drafts: &[TokenId],
    scratch: &mut VerifyScratch,
    visit: &mut dyn FnMut(usize, f64) -> bool,
) -> Residual {
    let k = solve_rho_in(p, q, n, 1.0, 1.0, &mut scratch.rho);
    for (i, &d) in drafts.iter().enumerate() {
        let a = accept_ratio(p[d as usize], k.rho * q[d as usize]);
        if visit(i, a) || a >= 1.0 {
            return Residual::Target;
        }
    }
    let c = k.c(n);
    let inv_rho = 1.0 / k.rho;
    let VerifyScratch { residual, blocks, .. } = scratch;
    let total = fill_residual(residual, blocks, p.len(), |i, _| (p[i] - c * q[i].min(p[i] * inv_rho)).max(0.0));
    if total <= 0.0 {
        return Residual::Target;
    }
    Residual::Scratch(total)
}
