//! Acceptance rates.
//!
//! - [`alpha_star`]: the optimal acceptance rate of a draft construction,
//!   `alpha* = 1 + min_H (P(H) - Q(H))` (paper, eq. (subset)) where `Q(H)` is the probability
//!   that every draft lies in `H`. For the q-convex constructions the minimum is over the
//!   prefixes of the tokens sorted by `q/p` (section 4.2), see `subset_scan`.
//! - [`alpha_kseq`]: K-SEQ's `1 - (1-beta(rho))^n` (appendix A.2).
//! - [`rrs`]: exact and Monte Carlo acceptance of recursive rejection sampling.
//! - [`reference`](mod@reference): brute force over subsets for any explicit draft table (tests, small
//!   vocabularies).

mod bucketed;
pub mod reference;
pub mod rrs;
mod subset_scan;
mod without_replacement;

pub use subset_scan::{alpha_star_conditional_poisson, alpha_star_with_replacement};
pub use without_replacement::{
    alpha_star_without_replacement, alpha_star_without_replacement_with, q_without_replacement, WorMethod,
};

use crate::construction::DraftConstruction;
use crate::dist::{fast_sum, pair_sum, rest_mass, top_k_support, validate_target_and_draft};
use crate::error::Result;
use crate::verify::solve_rho;
use crate::TokenId;

/// `alpha*` of `construction` with `n` drafts from `q` against target `p` (validated).
pub fn alpha_star(construction: DraftConstruction, p: &[f64], q: &[f64], n: usize) -> Result<f64> {
    validate_target_and_draft(p, q)?;
    construction.check_n(n)?;
    Ok(match construction {
        DraftConstruction::WithReplacement => alpha_star_with_replacement(p, q, n),
        DraftConstruction::WithoutReplacement => alpha_star_without_replacement(p, q, n),
        DraftConstruction::Greedy | DraftConstruction::SpecHub => alpha_star_greedy(p, q, n),
        DraftConstruction::TopK => alpha_star_top_k(p, q, n),
        DraftConstruction::ConditionalPoisson => alpha_star_conditional_poisson(p, q, n),
    })
}

/// Theorem 5.1: `alpha*(Greedy) = sum_{Top_{m-1}(q)} p + sum_i min(p(i), q'(i))` with
/// `q' = q` without the top `m-1` tokens, renormalised, and `m = min(n, |supp q|)`. SpecHub's
/// pairs have the same unordered law as Greedy's at `n = 2`, hence the same `alpha*`.
pub fn alpha_star_greedy(p: &[f64], q: &[f64], n: usize) -> f64 {
    let m = DraftConstruction::Greedy.num_drafts(q, n);
    let (sp, sq): (f64, f64) = (fast_sum(p), fast_sum(q));
    let mut top = Vec::new();
    top_k_support(q, m - 1, &mut top);
    let rest = rest_mass(q, &top, sq, top.iter().map(|&t| q[t as usize]).sum::<f64>());
    let (ip, iq) = (1.0 / sp, 1.0 / rest);
    let top_p: f64 = top.iter().map(|&t| p[t as usize] * ip).sum();
    // sum_i min(p_i, q'_i) over the non-top tokens: over all tokens, minus the top ones.
    let overlap = if iq.is_finite() {
        pair_sum(p, q, |a, b| (a * ip).min(b * iq))
            - top.iter().map(|&t| (p[t as usize] * ip).min(q[t as usize] * iq)).sum::<f64>()
    } else {
        // The rest's mass is below 2^-1022 (a subnormal): its reciprocal overflows, so q' is
        // q over the rest, divided (0 * inf had made NaNs, which `min` dropped).
        (0..p.len().min(q.len()))
            .filter(|&i| q[i] > 0.0 && !top.contains(&(i as TokenId)))
            .map(|i| (p[i] * ip).min(q[i] / rest))
            .sum()
    };
    (top_p + overlap).min(1.0)
}

/// Deterministic drafts: `alpha* = p(Top_m(q))`.
pub fn alpha_star_top_k(p: &[f64], q: &[f64], n: usize) -> f64 {
    let sp: f64 = fast_sum(p);
    let mut top = Vec::new();
    top_k_support(q, n, &mut top);
    top.iter().map(|&t| p[t as usize] / sp).sum::<f64>().min(1.0)
}

/// K-SEQ's acceptance rate in theory, `1 - (1 - beta(rho))^n`.
pub fn alpha_kseq(p: &[f64], q: &[f64], n: usize) -> f64 {
    solve_rho(p, q, n).alpha(n)
}

/// The paper's generating-function value for "without replacement",
/// `1 + min_H (P(H) - e_n(q_H)/e_n(q))`. It is **not** `alpha*` of sequential sampling
/// without replacement; it is exactly `alpha*` of conditional-Poisson drafts. Reported beside
/// the exact value to show the size of the formula's error.
pub fn alpha_generating_function(p: &[f64], q: &[f64], n: usize) -> f64 {
    alpha_star_conditional_poisson(p, q, n)
}
