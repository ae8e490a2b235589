//! K-SEQ (paper, appendix A.2; Sun et al., SpecTr) for `n` i.i.d. drafts.
//!
//! With `beta(rho) = sum_i min(p(i)/rho, q(i))`, draft `x_k` is accepted with probability
//! `min(1, p(x_k) / (rho q(x_k)))`; after `n` rejections the output is drawn from
//! `p(i) - c min(q(i), p(i)/rho)` (normalised, which divides by `(1-beta)^n`) where
//! `c = (1-(1-beta)^n)/beta`. Summing the acceptances gives `c min(q, p/rho)` per token, so the
//! output is exactly `p` whenever the residual is non-negative, i.e. whenever `c <= rho`.
//! The largest acceptance `1-(1-beta)^n` is reached at the root of
//! `1-(1-beta(rho))^n = rho beta(rho)`, which lies in `[1, n]`; [`solve_rho`] returns the
//! smallest `rho` of the bracket that still satisfies `c <= rho`, so round-off can never make the
//! residual negative.

use crate::dist::fast_sum;
use super::VerifyScratch;
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

/// `beta(rho) = sum_i min(p_i / rho, q_i)` (inputs normalised by their sums).
pub fn beta(p: &[f64], q: &[f64], rho: f64) -> f64 {
    let (sp, sq): (f64, f64) = (fast_sum(p), fast_sum(q));
    p.iter().zip(q).map(|(&pi, &qi)| (pi / (sp * rho)).min(qi / sq)).sum()
}

/// Solves `1 - (1-beta(rho))^n = rho beta(rho)` for `rho` in `[1, n]` robustly.
///
/// `beta` is piecewise `a/rho + b` with breakpoints at the ratios `p_i/q_i`; the function
/// `g(rho) = 1-(1-beta)^n - rho beta` is non-increasing, `g(1) >= 0` and `g(n) <= 0`. One pass
/// collects the breakpoints inside `(1, n)`, a binary search over them finds the piece where
/// `g` changes sign, and bisection on that piece's closed form brackets the root to round-off.
pub fn solve_rho(p: &[f64], q: &[f64], n: usize) -> KSeqRho {
    let (sp, sq): (f64, f64) = (fast_sum(p), fast_sum(q));
    let nf = n as f64;
    if n <= 1 {
        return KSeqRho { rho: 1.0, beta: beta(p, q, 1.0) };
    }
    // a: p-mass of tokens whose term is p/rho on all of [1, n] (ratio <= 1);
    // b: q-mass of tokens whose term is q on all of [1, n] (ratio >= n).
    let (mut a, mut b) = (0.0, 0.0);
    let mut mid: Vec<(f64, f64, f64)> = Vec::new();
    for (&pi, &qi) in p.iter().zip(q) {
        let (pi, qi) = (pi / sp, qi / sq);
        if qi <= 0.0 {
            continue;
        }
        if pi <= qi {
            a += pi;
        } else if pi >= nf * qi {
            b += qi;
        } else {
            mid.push((pi / qi, pi, qi));
        }
    }
    mid.sort_unstable_by(|x, y| x.0.total_cmp(&y.0));
    // Piece k (k = 0..=len) covers rho between breakpoint k-1 and k: the first k middle
    // tokens contribute p/rho, the others q.
    let mut pa = Vec::with_capacity(mid.len() + 1); // a + sum of p over the first k
    let mut qb = Vec::with_capacity(mid.len() + 1); // b + sum of q over the rest
    let mut acc = a;
    pa.push(acc);
    for m in &mid {
        acc += m.1;
        pa.push(acc);
    }
    let mut acc = b;
    qb.push(acc);
    for m in mid.iter().rev() {
        acc += m.2;
        qb.push(acc);
    }
    qb.reverse();
    let g = |k: usize, rho: f64| {
        let beta = (pa[k] / rho + qb[k]).min(1.0);
        1.0 - (1.0 - beta).powi(n as i32) - rho * beta
    };
    let bp = |k: usize| if k == 0 { 1.0 } else if k > mid.len() { nf } else { mid[k - 1].0 };
    // Largest k with g(k, start of piece k) >= 0; then the root lies in piece k.
    let (mut lo, mut hi) = (0usize, mid.len());
    if g(0, 1.0) <= 0.0 {
        return KSeqRho { rho: 1.0, beta: beta(p, q, 1.0) };
    }
    while lo < hi {
        let k = (lo + hi).div_ceil(2);
        if g(k, bp(k)) >= 0.0 {
            lo = k;
        } else {
            hi = k - 1;
        }
    }
    let k = lo;
    let (mut x0, mut x1) = (bp(k), bp(k + 1));
    for _ in 0..200 {
        let m = 0.5 * (x0 + x1);
        if m <= x0 || m >= x1 {
            break;
        }
        if g(k, m) >= 0.0 {
            x0 = m;
        } else {
            x1 = m;
        }
    }
    // x1 satisfies g <= 0 (c <= rho) unless the piece ended exactly at the root.
    let rho = x1;
    let mut r = KSeqRho { rho, beta: beta(p, q, rho) };
    // Guard against round-off between the closed form and the direct sum.
    while r.c(n) > r.rho * (1.0 + 1e-15) && r.rho < nf {
        r.rho = (r.rho * (1.0 + 1e-13)).min(nf);
        r.beta = beta(p, q, r.rho);
    }
    r
}

pub(super) fn walk<'s>(
    p: &'s [f64],
    q: &[f64],
    n: usize,
    drafts: &[TokenId],
    scratch: &'s mut VerifyScratch,
    visit: &mut dyn FnMut(usize, f64) -> bool,
) -> Option<(&'s [f64], f64)> {
    let (sp, sq): (f64, f64) = (fast_sum(p), fast_sum(q));
    let k = solve_rho(p, q, n);
    for (i, &d) in drafts.iter().enumerate() {
        let (pd, qd) = (p[d as usize] / sp, q[d as usize] / sq);
        let a = super::accept_ratio(pd, k.rho * qd);
        if visit(i, a) || a >= 1.0 {
            return Some((p, sp));
        }
    }
    let c = k.c(n);
    let res = &mut scratch.residual;
    res.clear();
    let mut total = 0.0;
    res.extend(p.iter().zip(q).map(|(&pi, &qi)| {
        let (pi, qi) = (pi / sp, qi / sq);
        let r = (pi - c * qi.min(pi / k.rho)).max(0.0);
        total += r;
        r
    }));
    if total <= 0.0 {
        return Some((p, sp));
    }
    Some((&scratch.residual[..], total))
}
