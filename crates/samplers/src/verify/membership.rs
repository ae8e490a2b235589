//! The top-k (membership) verifier: for deterministic drafts, and lossless for any draft
//! construction because its decisions never look at `q`.
//!
//! Offer the distinct drafts in order: draft `x` is accepted with probability
//! `p(x) / (1 - sum of p over the drafts already offered)`; after all are rejected, sample
//! `p` restricted to the non-drafts. This is a sequential way to draw from `p` itself, so the
//! output is exactly `p` and the acceptance is `p(drafts)`: the optimum when the drafts are
//! deterministic (`alpha*` of [`crate::DraftConstruction::TopK`]).

use super::{accept_ratio, fill_residual, overwrite_residual, Residual, VerifyScratch};
use crate::TokenId;

pub(super) fn walk(
    p: &[f64],
    drafts: &[TokenId],
    scratch: &mut VerifyScratch,
    visit: &mut dyn FnMut(usize, f64) -> bool,
) -> Residual {
    let mut remaining = 1.0;
    for (k, &d) in drafts.iter().enumerate() {
        if drafts[..k].contains(&d) {
            continue;
        }
        let pd = p[d as usize];
        let a = accept_ratio(pd, remaining);
        if visit(k, a) || a >= 1.0 {
            return Residual::Target;
        }
        remaining -= pd;
    }
    let VerifyScratch { residual, blocks, .. } = scratch;
    let mut total = fill_residual(residual, blocks, p.len(), |i| p[i]);
    for &d in drafts {
        total += overwrite_residual(residual, blocks, d as usize, 0.0);
    }
    if total <= 0.0 {
        // The drafts cover the support of p; only round-off left mass to reject.
        return Residual::Target;
    }
    Residual::Scratch(total)
}
