//! Positional noise (`samplers::positional`): the race samples `p` exactly, the top-k races
//! sample `q` without replacement, and the acceptance formulas agree with each other, with
//! Monte Carlo and with the optimum.

use crate::common;

use common::{chi_square, random_dist, rng, shifted_seed};
use samplers::alpha::alpha_star;
use samplers::positional::{coupled_acceptance, coupled_match_probability};
use samplers::{DraftConstruction, PositionalNoise, TokenId};

/// The race's token follows `p`: Pearson chi-square over 200,000 positions per distribution
/// (cells under 5 expected pooled), failing below a p-value of 1e-4. The distributions include
/// a one-in-a-thousand token and zeros.
#[test]
fn the_race_samples_p_exactly() {
    let mut r = rng(11);
    let mut cases = vec![vec![0.001, 0.6, 0.0, 0.299, 0.1], vec![0.25; 4]];
    for _ in 0..4 {
        cases.push(random_dist(&mut r, 7, true));
    }
    for (c, p) in cases.iter().enumerate() {
        let noise = PositionalNoise::new(shifted_seed(1000 + c as u64));
        let draws = 200_000u64;
        let mut counts = vec![0u64; p.len()];
        for pos in 0..draws {
            counts[noise.sample(pos, p).unwrap() as usize] += 1;
        }
        for (i, &pi) in p.iter().enumerate() {
            if pi == 0.0 {
                assert_eq!(counts[i], 0, "case {c}: token {i} has p = 0");
            }
        }
        let (stat, df, pv) = chi_square(&counts, p);
        assert!(pv > 1e-4, "case {c}: chi2 {stat:.1} on {df} df, p-value {pv:.2e}, counts {counts:?}");
    }
}

/// Across seeds at one position the race also follows `p` (the seed, not only the position,
/// keys the noise): 100,000 seeds, same test.
#[test]
fn seeds_give_independent_races() {
    let p = [0.5, 0.3, 0.15, 0.05];
    let mut counts = [0u64; 4];
    for seed in 0..100_000u64 {
        counts[PositionalNoise::new(shifted_seed(seed)).sample(17, &p).unwrap() as usize] += 1;
    }
    let (stat, df, pv) = chi_square(&counts, &p);
    assert!(pv > 1e-4, "chi2 {stat:.1} on {df} df, p-value {pv:.2e}, counts {counts:?}");
}

/// The `k` best keys are an ordered sample without replacement from `q`: chi-square of every
/// ordered tuple against `DraftConstruction::WithoutReplacement`'s exact tuple probabilities,
/// 200,000 positions per (q, k), p-value 1e-4.
#[test]
fn top_k_samples_without_replacement() {
    let mut r = rng(12);
    let qs = [vec![0.05, 0.5, 0.2, 0.0, 0.25], random_dist(&mut r, 5, false)];
    for (c, q) in qs.iter().enumerate() {
        for k in [2usize, 3] {
            let noise = PositionalNoise::new(shifted_seed(77 + c as u64));
            let v = q.len();
            let index = |t: &[TokenId]| t.iter().fold(0usize, |a, &x| a * v + x as usize);
            let cells = v.pow(k as u32);
            let mut expect = vec![0.0; cells];
            let mut tuple = vec![0 as TokenId; k];
            for (cell, e) in expect.iter_mut().enumerate() {
                let mut x = cell;
                for j in (0..k).rev() {
                    tuple[j] = (x % v) as TokenId;
                    x /= v;
                }
                *e = DraftConstruction::WithoutReplacement.tuple_probability(q, k, &tuple);
            }
            let draws = 200_000u64;
            let mut counts = vec![0u64; cells];
            let mut out = Vec::new();
            for pos in 0..draws {
                noise.top_k(pos, q, k, &mut out).unwrap();
                counts[index(&out)] += 1;
            }
            let (stat, df, pv) = chi_square(&counts, &expect);
            assert!(pv > 1e-4, "q {c}, k {k}: chi2 {stat:.1} on {df} df, p-value {pv:.2e}");
        }
    }
}

/// For one draft, the quadrature of `coupled_acceptance` equals the closed form of
/// `coupled_match_probability` (1e-9), which lies between `(1 - TV) / (1 + TV)` and the
/// optimum `1 - TV`; for 2 and 3 drafts the rate never exceeds the optimal `alpha*` of drafts
/// without replacement (the law of the top-k races), and it grows with `k`.
#[test]
fn acceptance_formulas_agree_and_respect_the_bounds() {
    let mut r = rng(13);
    for case in 0..30 {
        let v = 3 + case % 5;
        let p = random_dist(&mut r, v, case % 3 == 0);
        let q = random_dist(&mut r, v, case % 4 == 1);
        let closed = coupled_match_probability(&p, &q);
        let quad = coupled_acceptance(&p, &q, 1);
        assert!((closed - quad).abs() < 1e-9, "case {case}: closed {closed} quadrature {quad}");
        let tv = 0.5 * p.iter().zip(&q).map(|(a, b)| (a - b).abs()).sum::<f64>();
        assert!(closed <= 1.0 - tv + 1e-12, "case {case}: {closed} above 1 - TV = {}", 1.0 - tv);
        assert!(closed >= (1.0 - tv) / (1.0 + tv) - 1e-12, "case {case}: {closed} below (1-TV)/(1+TV)");
        let mut last = quad;
        for k in 2..=3 {
            let a = coupled_acceptance(&p, &q, k);
            let star = alpha_star(DraftConstruction::WithoutReplacement, &p, &q, k).unwrap();
            assert!(a <= star + 1e-9, "case {case}, k {k}: {a} above alpha* {star}");
            assert!(a >= last - 1e-12, "case {case}, k {k}: {a} below the rate with fewer drafts {last}");
            last = a;
        }
    }
}

/// Monte Carlo: how often the target's race winner is among the draft's `k` best keys,
/// against `coupled_acceptance`, 100,000 positions, within 4.5 standard errors.
#[test]
fn acceptance_matches_monte_carlo() {
    let mut r = rng(14);
    for case in 0..4 {
        let p = random_dist(&mut r, 6, case == 3);
        let q = random_dist(&mut r, 6, case == 2);
        let noise = PositionalNoise::new(shifted_seed(500 + case));
        for k in 1..=3 {
            let exact = coupled_acceptance(&p, &q, k);
            let n = 100_000u64;
            let mut drafts = Vec::new();
            let hits = (0..n)
                .filter(|&pos| {
                    noise.top_k(pos, &q, k, &mut drafts).unwrap();
                    drafts.contains(&noise.sample(pos, &p).unwrap())
                })
                .count() as f64;
            let rate = hits / n as f64;
            let se = (exact * (1.0 - exact) / n as f64).sqrt().max(1e-6);
            assert!((rate - exact).abs() < 4.5 * se, "case {case}, k {k}: measured {rate}, exact {exact}");
        }
    }
}

/// Equal distributions always agree, and the race does not care about the scale of `p`.
#[test]
fn equal_distributions_always_match() {
    let mut r = rng(15);
    let p = random_dist(&mut r, 50, true);
    let scaled: Vec<f64> = p.iter().map(|x| 3.0 * x).collect();
    let noise = PositionalNoise::new(3);
    let mut drafts = Vec::new();
    for pos in 0..1000 {
        noise.top_k(pos, &p, 1, &mut drafts).unwrap();
        assert_eq!(drafts[0], noise.sample(pos, &p).unwrap());
        assert_eq!(noise.sample(pos, &scaled), noise.sample(pos, &p));
    }
    assert!((coupled_match_probability(&p, &p) - 1.0).abs() < 1e-12);
}
