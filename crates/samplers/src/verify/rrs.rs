//! Recursive rejection sampling (paper, appendix A.1).
//!
//! With `p_1 = p`, `q_1 = q`: draft `x_k` is accepted with probability
//! `min(1, p_k(x_k) / q_k(x_k))`; on rejection `p_{k+1} = Res^{p_k - q_k}`, the residual
//! `(p_k - q_k)_+ / sum (p_k - q_k)_+`, and `q_{k+1} = q` (RRS-w) or `q_k` without `x_k`,
//! renormalised (RRS-wo). After the last rejection the output is drawn from `p_{n+1}`.
//!
//! A rejected draft has `p_k(x) < q_k(x)`, so its residual mass is exactly zero and stays zero;
//! removed tokens therefore need no mask in the residual update.

use super::{accept_ratio, fill_residual, Residual, VerifyScratch};
use crate::dist::rest_mass;
use crate::TokenId;

pub(super) fn walk(
    p: &[f64],
    q: &[f64],
    drafts: &[TokenId],
    without_replacement: bool,
    scratch: &mut VerifyScratch,
    visit: &mut dyn FnMut(usize, f64) -> bool,
) -> Residual {
    // p_k(i) = cur(i) / zp with cur = p until the first rejection, then scratch.residual.
    let mut zp = 1.0;
    let mut zq = 1.0;
    let mut removed_mass = 0.0;
    scratch.removed.clear();
    let mut owned = false;
    for (k, &d) in drafts.iter().enumerate() {
        let d = d as usize;
        let cur_d = if owned { scratch.residual[d] } else { p[d] };
        let a = accept_ratio(cur_d / zp, q[d] / zq);
        if visit(k, a) || a >= 1.0 {
            // Taken, or rejection has probability zero: the rest of the walk has no mass.
            return if owned { Residual::Scratch(zp) } else { Residual::Target };
        }
        let (inv_p, inv_q) = (1.0 / zp, 1.0 / zq);
        let VerifyScratch { residual, blocks, removed, .. } = scratch;
        let mut total = if owned {
            fill_residual(residual, blocks, p.len(), |i, old| (old * inv_p - q[i] * inv_q).max(0.0))
        } else {
            fill_residual(residual, blocks, p.len(), |i, _| (p[i] * inv_p - q[i] * inv_q).max(0.0))
        };
        owned = true;
        if total <= 0.0 {
            // p_k == q_k up to round-off: the residual is arbitrary (paper); use q_k.
            total = fill_residual(residual, blocks, p.len(), |i, _| {
                if removed.contains(&(i as TokenId)) { 0.0 } else { q[i] * inv_q }
            });
        }
        zp = total;
        if without_replacement {
            removed.push(d as TokenId);
            removed_mass += q[d];
            zq = rest_mass(q, removed, 1.0, removed_mass);
            if zq <= 0.0 {
                break;
            }
        }
    }
    if owned {
        Residual::Scratch(zp)
    } else {
        Residual::Target
    }
}
