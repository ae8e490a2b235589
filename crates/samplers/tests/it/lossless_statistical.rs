//! Losslessness, statistically: the real samplers (draft construction + verifier, with a fixed
//! seed) against p by Pearson's chi-square test.
//!
//! Design: vocabulary 10, 200,000 draws per (pair, n); the test fails when the p-value is
//! below 1e-4. Under the null hypothesis the chance that any of the 20 runs fails is about
//! 0.2%, and the seeds are fixed so the outcome is reproducible. A verifier off by a total
//! variation of 0.01 gives a chi-square statistic of order 200,000 * 0.01^2 / 0.1 = 200 on 9
//! degrees of freedom, far beyond the 1e-4 critical value (about 33.7).

use crate::common;

use samplers::construction::DraftScratch;
use samplers::{VerifyScratch, VALID_PAIRS};

const DRAWS: usize = 200_000;
const SIGNIFICANCE: f64 = 1e-4;

#[test]
fn every_valid_pair_passes_chi_square_against_p() {
    let mut runs = 0;
    for (k, &(construction, verifier)) in VALID_PAIRS.iter().enumerate() {
        for n in common::draft_counts(construction, 3).into_iter().filter(|&n| n >= 2) {
            let mut r = common::rng(42 + 100 * k as u64 + n as u64);
            let p = common::random_dist(&mut r, 10, false);
            let q = common::random_dist(&mut r, 10, false);
            let (mut ds, mut vs) = (DraftScratch::default(), VerifyScratch::default());
            let mut drafts = Vec::new();
            let mut counts = vec![0u64; 10];
            let mut accepted = 0u64;
            for _ in 0..DRAWS {
                construction.sample(&q, n, &mut r, &mut ds, &mut drafts).unwrap();
                let v = verifier.verify(construction, n, &p, &q, &drafts, &mut r, &mut vs).unwrap();
                counts[v.token as usize] += 1;
                if let Some(i) = v.accepted {
                    assert_eq!(drafts[i], v.token);
                    accepted += 1;
                }
            }
            let (stat, df, pval) = common::chi_square(&counts, &p);
            assert!(
                pval > SIGNIFICANCE,
                "{construction}+{verifier} n={n}: chi2 = {stat:.2} on {df} df, p-value {pval:e} (counts {counts:?}, p {p:?})"
            );
            assert!(accepted > 0);
            runs += 1;
        }
    }
    assert_eq!(runs, 20);
}

/// The same on a fixed draft tuple: the sampled verdicts follow the exact conditional
/// distribution that the enumeration tests use (so both implementations agree).
#[test]
fn sampled_verdicts_follow_the_exact_conditional_distribution() {
    let mut r = common::rng(9);
    let p = common::random_dist(&mut r, 6, false);
    let q = common::random_dist(&mut r, 6, false);
    for (k, &(construction, verifier)) in VALID_PAIRS.iter().enumerate() {
        let n = 2;
        let mut ds = DraftScratch::default();
        let mut drafts = Vec::new();
        construction.sample(&q, n, &mut common::rng(k as u64), &mut ds, &mut drafts).unwrap();
        let exact = verifier.output_distribution(construction, n, &p, &q, &drafts).unwrap();
        let mut vs = VerifyScratch::default();
        let mut counts = vec![0u64; 6];
        for _ in 0..50_000 {
            counts[verifier.verify(construction, n, &p, &q, &drafts, &mut r, &mut vs).unwrap().token as usize] += 1;
        }
        let (stat, df, pval) = common::chi_square(&counts, &exact);
        assert!(
            pval > SIGNIFICANCE,
            "{construction}+{verifier} drafts {drafts:?}: chi2 {stat:.2} on {df} df, p {pval:e}"
        );
    }
}

#[test]
fn chi_square_detects_a_biased_sampler() {
    // Power check of the test itself: a sampler off by total variation 0.01 must fail.
    let p = vec![0.1; 10];
    let mut biased = p.clone();
    biased[0] += 0.01;
    biased[1] -= 0.01;
    let mut r = common::rng(1);
    let mut counts = vec![0u64; 10];
    for _ in 0..DRAWS {
        counts[samplers::dist::sample(&biased, &mut r) as usize] += 1;
    }
    let (_, _, pval) = common::chi_square(&counts, &p);
    assert!(pval < SIGNIFICANCE, "p-value {pval}");
    assert!((common::gamma_q(4.5, 33.72 / 2.0) - 1e-4).abs() < 2e-6, "chi2(9) critical value check");
}

/// Temperature 0: with one-hot p and q every verifier outputs the argmax of p and accepts
/// exactly when a draft equals it.
#[test]
fn temperature_zero_accepts_exactly_the_target_argmax() {
    let mut r = common::rng(5);
    for _ in 0..50 {
        let tl: Vec<f32> = (0..8).map(|_| rand::Rng::random::<f32>(&mut r)).collect();
        let dl: Vec<f32> = (0..8).map(|_| rand::Rng::random::<f32>(&mut r)).collect();
        let p = samplers::dist::softmax(&tl, 0.0).unwrap();
        let q = samplers::dist::softmax(&dl, 0.0).unwrap();
        let target = samplers::dist::argmax(&p);
        for &(construction, verifier) in VALID_PAIRS {
            for n in common::draft_counts(construction, 3) {
                let mut drafts = Vec::new();
                construction.sample(&q, n, &mut r, &mut DraftScratch::default(), &mut drafts).unwrap();
                let v =
                    verifier.verify(construction, n, &p, &q, &drafts, &mut r, &mut VerifyScratch::default()).unwrap();
                assert_eq!(v.token, target);
                assert_eq!(v.accepted.is_some(), drafts.contains(&target), "{construction}+{verifier}");
            }
        }
    }
}

/// Vocabulary 5,000: residuals span several 1,024-token blocks, so the blocked residual
/// sampler is exercised. Verdicts for fixed drafts are binned into 10 groups of 500 tokens
/// and tested against the exact conditional distribution (chi-square, 50,000 draws).
#[test]
fn large_vocabulary_residuals_are_sampled_exactly() {
    let v = 5000;
    let mut r = common::rng(12);
    let p = common::random_dist(&mut r, v, false);
    let q = common::random_dist(&mut r, v, false);
    for (k, &(construction, verifier)) in VALID_PAIRS.iter().enumerate() {
        let n = 2;
        let mut drafts = Vec::new();
        construction.sample(&q, n, &mut common::rng(k as u64), &mut DraftScratch::default(), &mut drafts).unwrap();
        let exact = verifier.output_distribution(construction, n, &p, &q, &drafts).unwrap();
        let binned: Vec<f64> = exact.chunks(500).map(|c| c.iter().sum()).collect();
        let mut vs = VerifyScratch::default();
        let mut counts = vec![0u64; 10];
        for _ in 0..50_000 {
            let t = verifier.verify(construction, n, &p, &q, &drafts, &mut r, &mut vs).unwrap().token as usize;
            counts[t / 500] += 1;
        }
        let (stat, df, pval) = common::chi_square(&counts, &binned);
        assert!(pval > SIGNIFICANCE, "{construction}+{verifier}: chi2 {stat:.2} on {df} df, p {pval:e}");
    }
}

/// Deterministic drafts (a function of a random context, as n-gram lookup gives): the sampled
/// outputs of [`samplers::verify_deterministic`] pass the chi-square test against `p`
/// (200,000 draws, vocabulary 10, p-value above 1e-4), and the acceptance rate is within four
/// standard errors of `E[p(distinct drafts)]`.
#[test]
fn deterministic_drafts_pass_chi_square_against_p() {
    let mut r = common::rng(77);
    let p = common::random_dist(&mut r, 10, false);
    // 20 contexts, each with its fixed draft tuple of 1-3 tokens (repeats allowed).
    let table: Vec<Vec<u32>> = (0..20u32).map(|c| (0..1 + c % 3).map(|k| (c * 7 + k * 3) % 10).collect()).collect();
    let mut vs = VerifyScratch::default();
    let mut counts = vec![0u64; 10];
    let (mut accepted, mut expected) = (0u64, 0.0);
    for _ in 0..DRAWS {
        let drafts = &table[rand::Rng::random_range(&mut r, 0..table.len())];
        let v = samplers::verify_deterministic(&p, drafts, &mut r, &mut vs).unwrap();
        counts[v.token as usize] += 1;
        let mut distinct = drafts.clone();
        distinct.sort_unstable();
        distinct.dedup();
        expected += distinct.iter().map(|&t| p[t as usize]).sum::<f64>();
        if let Some(i) = v.accepted {
            assert_eq!(drafts[i], v.token);
            accepted += 1;
        } else {
            assert!(!drafts.contains(&v.token));
        }
    }
    let (stat, df, pval) = common::chi_square(&counts, &p);
    assert!(pval > SIGNIFICANCE, "chi2 = {stat:.2} on {df} df, p-value {pval:e} (counts {counts:?}, p {p:?})");
    let (rate, mean) = (accepted as f64 / DRAWS as f64, expected / DRAWS as f64);
    let se = (mean * (1.0 - mean) / DRAWS as f64).sqrt();
    assert!((rate - mean).abs() < 4.0 * se, "acceptance {rate} vs expected {mean} (se {se})");
}
