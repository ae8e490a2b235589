//! Reference computations for small vocabularies: explicit draft tables, brute-force
//! `alpha*` over all subsets, and exact output distributions of (construction, verifier)
//! pairs by enumerating every draft tuple. Exponential cost: for tests and checks only.

use crate::construction::DraftConstruction;
use crate::error::Result;
use crate::verify::Verifier;
use crate::TokenId;

/// Every draft tuple with positive probability and its probability (`|V|^m` tuples are tried).
pub fn draft_table(construction: DraftConstruction, q: &[f64], n: usize) -> Vec<(Vec<TokenId>, f64)> {
    let v = q.len();
    let m = construction.num_drafts(q, n);
    let mut out = Vec::new();
    let mut tuple = vec![0 as TokenId; m];
    let total = v.pow(m as u32);
    for code in 0..total {
        let mut c = code;
        for slot in tuple.iter_mut() {
            *slot = (c % v) as TokenId;
            c /= v;
        }
        let prob = construction.tuple_probability(q, n, &tuple);
        if prob > 0.0 {
            out.push((tuple.clone(), prob));
        }
    }
    out
}

/// `alpha* = 1 + min_H (P(H) - Q(H))` by enumerating all `2^|V|` subsets (eq. (subset)),
/// for an explicit draft distribution `table`.
pub fn alpha_star_brute_force(p: &[f64], table: &[(Vec<TokenId>, f64)]) -> f64 {
    let v = p.len();
    assert!(v <= 24, "brute force over subsets is for small vocabularies");
    let masks: Vec<(u32, f64)> = table.iter().map(|(t, pr)| (t.iter().fold(0u32, |m, &x| m | (1 << x)), *pr)).collect();
    let mut best = 0.0f64;
    for h in 0u32..(1u32 << v) {
        let ph: f64 = (0..v).filter(|i| h >> i & 1 == 1).map(|i| p[i]).sum();
        let qh: f64 = masks.iter().filter(|(m, _)| m & !h == 0).map(|(_, pr)| pr).sum();
        best = best.min(ph - qh);
    }
    1.0 + best
}

/// The exact output distribution of a pair: `sum_t P(t) pi(. | t)` over all draft tuples.
pub fn output_distribution(
    construction: DraftConstruction,
    verifier: Verifier,
    p: &[f64],
    q: &[f64],
    n: usize,
) -> Result<Vec<f64>> {
    let mut out = vec![0.0; p.len()];
    for (tuple, prob) in draft_table(construction, q, n) {
        let cond = verifier.output_distribution(construction, n, p, q, &tuple)?;
        for (o, c) in out.iter_mut().zip(cond) {
            *o += prob * c;
        }
    }
    Ok(out)
}

/// The exact acceptance rate of a pair: `P(output is one of the drafts)`.
pub fn acceptance(construction: DraftConstruction, verifier: Verifier, p: &[f64], q: &[f64], n: usize) -> Result<f64> {
    let mut alpha = 0.0;
    for (tuple, prob) in draft_table(construction, q, n) {
        let cond = verifier.output_distribution(construction, n, p, q, &tuple)?;
        let mut seen: Vec<TokenId> = Vec::new();
        for &t in &tuple {
            if !seen.contains(&t) {
                seen.push(t);
                alpha += prob * cond[t as usize];
            }
        }
    }
    Ok(alpha)
}
