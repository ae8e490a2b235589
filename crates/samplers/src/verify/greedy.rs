//! The Greedy verifier (paper, section 5.2 and the unfolded definition in appendix
//! "Additional Illustration") and the SpecHub verifier built on the same plan.
//!
//! Greedy drafts are `Top_{n-1}(q)` plus one token `x ~ q' = q^{not Top_{n-1}(q)}`. The verifier
//! is `pi*_{p,q'}(. | x)`: accept `x` with probability `min(1, p(x)/q'(x))`, else sample the
//! residual `(p - q')_+`, which equals `p` on the top tokens (where `q' = 0`); an output equal to
//! a top token accepts that draft. Its acceptance is Theorem 5.1's
//! `sum_{Top} p + sum_i min(p(i), q'(i))`, the optimum for this draft distribution.
//!
//! SpecHub's pairs `(x, hub)` and `(hub, x)` (hub = top token of `q`) have, as unordered sets,
//! the same law as Greedy's with `n = 2`: `{hub, x}` with probability `q(x)/(1-q(hub))`. The
//! plan above, with the hub as the deterministic token, is therefore lossless for SpecHub and
//! reaches the optimal acceptance of SpecHub's draft distribution.

use super::{accept_ratio, fill_residual, overwrite_residual, Residual, VerifyScratch};
use crate::dist::rest_mass;
use crate::TokenId;

/// Greedy walk: `drafts[..n_top]` are the deterministic top tokens, `drafts[n_top]` the
/// random one.
pub(super) fn walk(
    p: &[f64],
    q: &[f64],
    drafts: &[TokenId],
    n_top: usize,
    scratch: &mut VerifyScratch,
    visit: &mut dyn FnMut(usize, f64) -> bool,
) -> Residual {
    plan(p, q, &drafts[..n_top], n_top, drafts[n_top], scratch, visit)
}

/// SpecHub walk: the hub is the draft of larger `q` (ties: lower id), as the top token of `q`
/// is always one of SpecHub's two drafts.
pub(super) fn walk_spechub(
    p: &[f64],
    q: &[f64],
    drafts: &[TokenId],
    scratch: &mut VerifyScratch,
    visit: &mut dyn FnMut(usize, f64) -> bool,
) -> Residual {
    if drafts.len() == 1 {
        return plan(p, q, &[], 0, drafts[0], scratch, visit);
    }
    let (a, b) = (drafts[0], drafts[1]);
    let (qa, qb) = (q[a as usize], q[b as usize]);
    if qa > qb || (qa == qb && a < b) {
        plan(p, q, &drafts[..1], 1, b, scratch, visit)
    } else {
        plan(p, q, &drafts[1..2], 0, a, scratch, visit)
    }
}

/// `pi*_{p,q'}(. | last)` with `q' = q` without `top`, renormalised; `last_index` is the
/// position of `last` among the drafts.
fn plan(
    p: &[f64],
    q: &[f64],
    top: &[TokenId],
    last_index: usize,
    last: TokenId,
    scratch: &mut VerifyScratch,
    visit: &mut dyn FnMut(usize, f64) -> bool,
) -> Residual {
    let top_mass: f64 = top.iter().map(|&t| q[t as usize]).sum();
    let zq = rest_mass(q, top, 1.0, top_mass); // q'(i) = q(i) / zq off the top tokens
    let a = accept_ratio(p[last as usize], q[last as usize] / zq);
    if visit(last_index, a) || a >= 1.0 {
        return Residual::Target;
    }
    let inv_q = 1.0 / zq;
    let VerifyScratch { residual, blocks, .. } = scratch;
    let mut total = if inv_q.is_finite() {
        fill_residual(residual, blocks, p.len(), |i| (p[i] - q[i] * inv_q).max(0.0))
    } else {
        // `zq` is subnormal and its reciprocal overflows: divide instead (`0 * inf` is NaN,
        // which `max` turned into a residual of 0 for every token outside q's support).
        fill_residual(residual, blocks, p.len(), |i| (p[i] - q[i] / zq).max(0.0))
    };
    for &t in top {
        total += overwrite_residual(residual, blocks, t as usize, p[t as usize]);
    }
    if total <= 0.0 {
        return Residual::Target; // p == q' up to round-off: rejection has no mass
    }
    Residual::Scratch(total)
}
