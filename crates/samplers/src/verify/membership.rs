//! The top-k (membership) verifier: for deterministic drafts, and lossless for any draft
//! construction because its decisions never look at `q`.
//!
//! Offer the distinct drafts in order: draft `x` is accepted with probability
//! `p(x) / (1 - sum of p over the drafts already offered)`; after all are rejected, sample
//! `p` restricted to the non-drafts. This is a sequential way to draw from `p` itself, so the
//! output is exactly `p` and the acceptance is `p(drafts)`: the optimum when the drafts are
//! deterministic (`alpha*` of [`crate::DraftConstruction::TopK`]).

use crate::dist::fast_sum;
use super::{accept_ratio, VerifyScratch};
use crate::TokenId;

pub(super) fn walk<'s>(
    p: &'s [f64],
    drafts: &[TokenId],
    scratch: &'s mut VerifyScratch,
    visit: &mut dyn FnMut(usize, f64) -> bool,
) -> Option<(&'s [f64], f64)> {
    let sp: f64 = fast_sum(p);
    let mut remaining = sp;
    for (k, &d) in drafts.iter().enumerate() {
        if drafts[..k].contains(&d) {
            continue;
        }
        let pd = p[d as usize];
        let a = accept_ratio(pd, remaining);
        if visit(k, a) || a >= 1.0 {
            return Some((p, sp));
        }
        remaining -= pd;
    }
    let res = &mut scratch.residual;
    res.clear();
    res.extend_from_slice(p);
    for &d in drafts {
        res[d as usize] = 0.0;
    }
    let total: f64 = fast_sum(res);
    if total <= 0.0 {
        // The drafts cover the support of p; only round-off left mass to reject.
        return Some((p, sp));
    }
    Some((&scratch.residual[..], total))
}
