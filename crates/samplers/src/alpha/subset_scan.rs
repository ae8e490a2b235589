//! The prefix scan of section 4.2: when `Q` is q-convex and monotone, an optimal `H` of
//! `min_H P(H) - Q(H)` is a prefix of the tokens sorted by `q/p`, largest first (Theorem
//! 4.4), so `alpha* = 1 + min_j (P(H_j) - Q(H_j))` over those prefixes (and the empty set).
//!
//! Two exact prunings keep the sort short:
//! - tokens with `q = 0` never increase `Q`, so adding them never lowers `P - Q`;
//! - a token `x` whose `p(x)` is at least its inclusion probability `pi_x = P(x is drafted)`
//!   has marginal `p(x) - Q(x|H) >= 0` for every `H` (supermodularity of `Q` gives
//!   `Q(x|H) <= Q(x|Σ\x) = pi_x`). Removing such tokens from an optimal prefix keeps it
//!   optimal and leaves a prefix of the pruned order, so they can be dropped.

use crate::construction::{elementary_symmetric, DraftConstruction};

/// Normalised `(p, q)` of the candidate tokens sorted by `q/p` descending (ties by token id).
/// `keep(p_x, q_x)` decides which tokens with `q > 0` stay; returns `(p_x, q_x)` pairs.
pub(crate) fn sorted_candidates(p: &[f64], q: &[f64], keep: impl Fn(f64, f64) -> bool) -> Vec<(f64, f64)> {
    let (sp, sq): (f64, f64) = (p.iter().sum(), q.iter().sum());
    let (ip, iq) = (1.0 / sp, 1.0 / sq);
    let mut c: Vec<(f64, f64, f64)> = Vec::new();
    for (&pi, &qi) in p.iter().zip(q) {
        if qi <= 0.0 {
            continue;
        }
        let (pi, qi) = (pi * ip, qi * iq);
        if keep(pi, qi) {
            let ratio = if pi > 0.0 { qi / pi } else { f64::INFINITY };
            c.push((ratio, pi, qi));
        }
    }
    // Stable order by ratio: equal ratios keep token order (ties do not change the minimum).
    c.sort_by(|a, b| b.0.total_cmp(&a.0));
    c.into_iter().map(|(_, pi, qi)| (pi, qi)).collect()
}

/// `alpha*` for `n` drafts with replacement: `Q(H) = q(H)^n`.
pub fn alpha_star_with_replacement(p: &[f64], q: &[f64], n: usize) -> f64 {
    let ni = n as i32;
    // Inclusion probability 1 - (1-q)^n.
    let tokens = sorted_candidates(p, q, |px, qx| px < 1.0 - (1.0 - qx).powi(ni));
    let (mut pp, mut qq, mut best) = (0.0f64, 0.0f64, 0.0f64);
    for (px, qx) in tokens {
        pp += px;
        qq += qx;
        best = best.min(pp - qq.min(1.0).powi(ni));
    }
    (1.0 + best).clamp(0.0, 1.0)
}

/// `alpha*` of conditional-Poisson drafts: `Q(H) = e_m(q_H) / e_m(q)` with
/// `m = min(n, |supp q|)` (the paper's generating-function formula, exact for this law).
pub fn alpha_star_conditional_poisson(p: &[f64], q: &[f64], n: usize) -> f64 {
    let m = DraftConstruction::ConditionalPoisson.num_drafts(q, n);
    let sq: f64 = q.iter().sum();
    let total = elementary_symmetric(q.iter().map(|&x| x / sq), m)[m];
    let tokens = sorted_candidates(p, q, |_, _| true);
    let mut e = vec![0.0; m + 1];
    e[0] = 1.0;
    let (mut pp, mut best) = (0.0f64, 0.0f64);
    for (px, qx) in tokens {
        for k in (1..=m).rev() {
            e[k] += qx * e[k - 1];
        }
        pp += px;
        best = best.min(pp - (e[m] / total).min(1.0));
    }
    (1.0 + best).clamp(0.0, 1.0)
}
