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

use crate::dist::fast_sum;
use super::{accept_ratio, VerifyScratch};
use crate::dist::{rest_mass, top_k_support};
use crate::TokenId;

/// Greedy walk: `drafts[..n_top]` are the deterministic top tokens, `drafts[n_top]` the
/// random one.
pub(super) fn walk<'s>(
    p: &'s [f64],
    q: &[f64],
    drafts: &[TokenId],
    n_top: usize,
    scratch: &'s mut VerifyScratch,
    visit: &mut dyn FnMut(usize, f64) -> bool,
) -> Option<(&'s [f64], f64)> {
    plan(p, q, &drafts[..n_top], n_top, drafts[n_top], scratch, visit)
}

pub(super) fn walk_spechub<'s>(
    p: &'s [f64],
    q: &[f64],
    drafts: &[TokenId],
    scratch: &'s mut VerifyScratch,
    visit: &mut dyn FnMut(usize, f64) -> bool,
) -> Option<(&'s [f64], f64)> {
    if drafts.len() == 1 {
        return plan(p, q, &[], 0, drafts[0], scratch, visit);
    }
    let mut hub = std::mem::take(&mut scratch.removed);
    top_k_support(q, 1, &mut hub);
    let is_hub_first = hub.first() == Some(&drafts[0]);
    scratch.removed = hub;
    if is_hub_first {
        plan(p, q, &drafts[..1], 1, drafts[1], scratch, visit)
    } else {
        plan(p, q, &drafts[1..2], 0, drafts[0], scratch, visit)
    }
}

/// `pi*_{p,q'}(. | last)` with `q' = q` without `top`, renormalised; `last_index` is the
/// position of `last` among the drafts.
fn plan<'s>(
    p: &'s [f64],
    q: &[f64],
    top: &[TokenId],
    last_index: usize,
    last: TokenId,
    scratch: &'s mut VerifyScratch,
    visit: &mut dyn FnMut(usize, f64) -> bool,
) -> Option<(&'s [f64], f64)> {
    let (sp, sq): (f64, f64) = (fast_sum(p), fast_sum(q));
    let top_mass: f64 = top.iter().map(|&t| q[t as usize]).sum();
    let zq = rest_mass(q, top, sq, top_mass); // q'(i) = q(i) / zq off the top tokens
    let a = accept_ratio(p[last as usize] / sp, q[last as usize] / zq);
    if visit(last_index, a) || a >= 1.0 {
        return Some((p, sp));
    }
    let res = &mut scratch.residual;
    res.clear();
    let (inv_p, inv_q) = (1.0 / sp, 1.0 / zq);
    res.extend(p.iter().zip(q).map(|(&pi, &qi)| (pi * inv_p - qi * inv_q).max(0.0)));
    for &t in top {
        res[t as usize] = p[t as usize] * inv_p;
    }
    let total: f64 = fast_sum(res);
    if total <= 0.0 {
        return Some((p, sp)); // p == q' up to round-off: rejection has no mass
    }
    Some((&scratch.residual[..], total))
}
