//! Recursive rejection sampling (paper, appendix A.1).
//!
//! With `p_1 = p`, `q_1 = q`: draft `x_k` is accepted with probability
//! `min(1, p_k(x_k) / q_k(x_k))`; on rejection `p_{k+1} = Res^{p_k - q_k}`, the residual
//! `(p_k - q_k)_+ / sum (p_k - q_k)_+`, and `q_{k+1} = q` (RRS-w) or `q_k` without `x_k`,
//! renormalised (RRS-wo). After the last rejection the output is drawn from `p_{n+1}`.
//!
//! A rejected draft has `p_k(x) < q_k(x)`, so its residual mass is exactly zero and stays zero;
//! removed tokens therefore need no mask in the residual update.

use crate::dist::fast_sum;
use super::{accept_ratio, VerifyScratch};
use crate::dist::rest_mass;
use crate::TokenId;

pub(super) fn walk<'s>(
    p: &'s [f64],
    q: &[f64],
    drafts: &[TokenId],
    without_replacement: bool,
    scratch: &'s mut VerifyScratch,
    visit: &mut dyn FnMut(usize, f64) -> bool,
) -> Option<(&'s [f64], f64)> {
    let mut zp: f64 = fast_sum(p);
    let sq: f64 = fast_sum(q);
    let mut zq = sq;
    let mut removed_mass = 0.0;
    scratch.removed.clear();
    let mut owned = false;
    for (k, &d) in drafts.iter().enumerate() {
        let d = d as usize;
        let cur = if owned { &scratch.residual[..] } else { p };
        let a = accept_ratio(cur[d] / zp, q[d] / zq);
        if visit(k, a) || a >= 1.0 {
            // Taken, or rejection has probability zero: the rest of the walk has no mass.
            return if owned { Some((&scratch.residual[..], zp)) } else { Some((p, zp)) };
        }
        let res = &mut scratch.residual;
        let (inv_p, inv_q) = (1.0 / zp, 1.0 / zq);
        let mut total = 0.0;
        if owned {
            for (r, &qi) in res.iter_mut().zip(q) {
                *r = (*r * inv_p - qi * inv_q).max(0.0);
                total += *r;
            }
        } else {
            res.clear();
            res.extend(p.iter().zip(q).map(|(&pi, &qi)| {
                let r = (pi * inv_p - qi * inv_q).max(0.0);
                total += r;
                r
            }));
            owned = true;
        }
        if total <= 0.0 {
            // p_k == q_k up to round-off: the residual is arbitrary (paper); use q_k.
            let removed = &scratch.removed;
            let res = &mut scratch.residual;
            for (i, (r, &qi)) in res.iter_mut().zip(q).enumerate() {
                *r = if removed.contains(&(i as TokenId)) { 0.0 } else { qi * inv_q };
            }
            total = fast_sum(res);
        }
        zp = total;
        if without_replacement {
            scratch.removed.push(d as TokenId);
            removed_mass += q[d];
            zq = rest_mass(q, &scratch.removed, sq, removed_mass);
            if zq <= 0.0 {
                break;
            }
        }
    }
    if owned {
        Some((&scratch.residual[..], zp))
    } else {
        Some((p, zp))
    }
}
