//! Distributions shaped like warped LLM logits at low temperature: one token near 1 and a
//! tail spread over hundreds of orders of magnitude (down to e^-700), where `1 - q(top)`
//! cancels and `e^{-q t}` rounds to 1 in f64. The alpha*_wor bug of `125fffb` lived here (a
//! position of `bench acceptance`). On such p and q, for every construction and verifier:
//! alpha* equals brute force over subsets and the transport LP, tuple probabilities sum to 1,
//! and every valid pair's exact output law equals p. Then the samplers themselves, by
//! Pearson's chi-square: each construction's drafts against its exact tuple law, each pair's
//! output (draft, then verify) against p, and the positional races against p and sequential
//! sampling without replacement.
//!
//! What this found, each now fixed and named in the module that had it: for the largest
//! token rounded to 1.0, alpha* without replacement at n = 2 took `1 - q = 0` (infinite odds);
//! a subnormal mass outside the top m - 1 tokens was clamped to 1e-300, which pruned tokens of
//! the optimal set and cut the quadrature's horizon short; Greedy's alpha* and verifier divided
//! by a subnormal rest mass through its infinite reciprocal (NaN, then 0 residual off q's
//! support: |out - p| = 1); RRS without replacement's residual threshold overflowed to
//! infinity (|out - p| = 0.009); and conditional-Poisson drafts, tuple law and alpha* all
//! computed `e_m(q)`, which underflowed to 0 (the sampler then took the last tokens of the
//! support whatever their q); the positional races' keys `ln(u)/w` were `-inf` for every
//! subnormal weight, so top-k drafts tied among them; and conditional-Poisson alpha* on a q
//! whose `e_m` underflows (its normalised scan) lost a product below the f64 range and gave 1
//! for 4e-16 (found by re-running with other seeds, `MDSD_TEST_SEED_OFFSET`); with the same
//! audit, alpha* without replacement on a q with a subnormal entry (the odds of its largest
//! token overflowed: 1 for 0.76), and the conditional-Poisson tuple law (a subnormal quotient in
//! the ratio update: 1 - 9e-12 for 1).

use crate::common;

use rand::Rng;
use samplers::alpha;
use samplers::alpha::reference::{alpha_star_brute_force, draft_table, output_distribution};
use samplers::alpha::WorMethod;
use samplers::construction::DraftScratch;
use samplers::{DraftConstruction, VerifyScratch, VALID_PAIRS};

/// Draws per case of a pair's output law, and per case of a construction's draft law (48
/// cases: about one in twelve has a q whose `e_4` underflows). The chi-square tests fail below
/// `SIGNIFICANCE`; over the 48 x 6 + 11 x 11 runs the chance of a failure under the null is
/// about 4%, and the seeds are fixed, so the outcome is reproducible.
const DRAWS: usize = 20_000;
const LAW_DRAWS: usize = 4_000;
const LAW_CASES: usize = 48;
const SIGNIFICANCE: f64 = 1e-4;

/// `softmax(-s * e_i)` with `e_i` exponential: at `s` of 40 to 700 the largest token holds
/// nearly all the mass and the rest spans many orders of magnitude; sometimes a second
/// token is lifted to be near the first (a near tie).
fn peaked<R: Rng>(r: &mut R, v: usize) -> Vec<f64> {
    let s = [5.0, 40.0, 150.0, 700.0][r.random_range(0..4)];
    let mut z: Vec<f64> = (0..v).map(|_| -s * -r.random::<f64>().max(1e-300).ln()).collect();
    if r.random::<f64>() < 0.3 {
        let top = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let i = r.random_range(0..v);
        z[i] = top - r.random::<f64>() * 1e-3;
    }
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut x: Vec<f64> = z.iter().map(|&l| (l - m).exp()).collect();
    let t: f64 = x.iter().sum();
    x.iter_mut().for_each(|w| *w /= t);
    x
}

/// `|a - b| <= tolerance`, false for NaN.
fn within(a: f64, b: f64, tolerance: f64) -> bool {
    (a - b).abs() <= tolerance
}

#[test]
fn peaked_distributions_keep_alpha_star_and_losslessness_exact() {
    let mut r = common::rng(4242);
    let (mut stars, mut laws) = (0, 0);
    let mut failures: Vec<String> = Vec::new();
    for case in 0..240 {
        let v = 3 + case % 4; // 3..=6
        let p = peaked(&mut r, v);
        let q = peaked(&mut r, v);
        for construction in DraftConstruction::ALL {
            for n in common::draft_counts(construction, 4) {
                let table = draft_table(construction, &q, n);
                let mass: f64 = table.iter().map(|t| t.1).sum();
                if !within(mass, 1.0, 1e-12) {
                    failures.push(format!("{construction} n={n}: tuples sum to {mass}\nq={q:?}"));
                    continue;
                }
                let fast = alpha::alpha_star(construction, &p, &q, n).unwrap();
                let brute = alpha_star_brute_force(&p, &table);
                if !within(fast, brute, 1e-9) {
                    failures
                        .push(format!("{construction} n={n}: scan {fast} vs brute force {brute}\np={p:?}\nq={q:?}"));
                }
                if table.len() * v <= 2000 {
                    let lp = common::alpha_star_lp(&p, &common::normalised_table(construction, &q, n));
                    if !within(lp, brute, 1e-7) {
                        failures
                            .push(format!("{construction} n={n}: LP {lp} vs brute force {brute}\np={p:?}\nq={q:?}"));
                    }
                }
                stars += 1;
            }
        }
        for &(construction, verifier) in VALID_PAIRS {
            for n in common::draft_counts(construction, 4) {
                let out = output_distribution(construction, verifier, &p, &q, n).unwrap();
                if !out.iter().zip(&p).all(|(&a, &b)| within(a, b, 1e-12)) {
                    let d = out.iter().zip(&p).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                    failures.push(format!(
                        "{construction}+{verifier} n={n}: |out - p| = {d:e}\np={p:?}\nq={q:?}\nout={out:?}"
                    ));
                }
                laws += 1;
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures, the first:\n{}",
        failures.len(),
        failures[..failures.len().min(5)].join("\n")
    );
    assert!(stars > 1000 && laws > 1000, "{stars} alpha* and {laws} output laws checked");
}

/// A case that the seed audit (`MDSD_TEST_SEED_OFFSET=2`) drew for the test above: q's three
/// smallest positive values span 1e-156 to 1e-203, so `e_3(q)` (about 6e-343) underflows and
/// `alpha*` takes the normalised scan, whose old update `q_x s_{k-1}` underflowed to 0 on the way
/// (it gave 1 for the brute force's 4.4e-16).
#[test]
fn conditional_poisson_alpha_star_keeps_products_below_the_f64_range() {
    let p = [0.0, 2.655358797044973e-40, 0.0, 1.0, 4.408515069420381e-57];
    let q = [1.6786406547453303e-187, 0.0, 3.552824146193482e-156, 7.267506198155345e-203, 1.0];
    let c = DraftConstruction::ConditionalPoisson;
    let brute = alpha_star_brute_force(&p, &draft_table(c, &q, 3));
    let fast = alpha::alpha_star(c, &p, &q, 3).unwrap();
    assert!(brute < 1e-15, "brute force {brute}");
    assert!(within(fast, brute, 1e-12), "scan {fast} vs brute force {brute}");
}

/// Two more cases of the seed audit, both with a subnormal q entry. Without replacement, with
/// q's whole support drafted: the closed form of m = 2 took the largest token's odds as `q /
/// rest` with a subnormal rest (infinite), and `alpha*` came out 1 (offsets 5 and 9). Conditional
/// Poisson, where the only tuple has probability 1: its ratio update formed a subnormal quotient
/// and the tuple came out 1 - 9e-12 (offset 4). And the quadrature of m >= 3 (offset 32).
#[test]
fn subnormal_draft_masses_keep_alpha_star_and_the_tuple_law_exact() {
    let c = DraftConstruction::WithoutReplacement;
    for (p, q) in [
        (
            vec![0.017360592182327578, 0.0024162960560440093, 0.2189816036022493, 0.7612415081593792],
            vec![0.0, 1.042e-321, 0.0, 1.0],
        ),
        (vec![0.08408341116287817, 0.909473264076492, 0.006443324760629898], vec![9.3013e-320, 1.0, 0.0]),
    ] {
        for n in [2, 3] {
            let brute = alpha_star_brute_force(&p, &draft_table(c, &q, n));
            let want: f64 = p.iter().zip(&q).filter(|(_, &qx)| qx > 0.0).map(|(&px, _)| px).sum();
            assert!(within(brute, want, 1e-15), "brute force {brute}, want {want}");
            let fast = alpha::alpha_star(c, &p, &q, n).unwrap();
            assert!(within(fast, brute, 1e-12), "n={n}: scan {fast} vs brute force {brute}\nq={q:?}");
        }
    }
    // Four drafts on a support of 4 whose smallest mass is subnormal: the quadrature gave a
    // set of 3 tokens Q = 4.2e-6 where it is 0, and alpha* 0.9999958 for 1 (offset 32).
    let p = [6.150370127661173e-28, 1.899782575479391e-129, 1.8870149973417308e-215, 1.0, 0.0];
    let q = [1.5431481822530995e-33, 6.078387252134133e-247, 0.0, 4.624e-321, 1.0];
    let brute = alpha_star_brute_force(&p, &draft_table(c, &q, 4));
    let fast = alpha::alpha_star(c, &p, &q, 4).unwrap();
    assert!(within(brute, 1.0, 1e-15) && within(fast, brute, 1e-12), "scan {fast} vs brute force {brute}");
    // The fourth draft lies between two subnormal tokens, 2^-1074 and 148 times that: the
    // quadrature's `q t` of a subnormal q rounded to multiples of 2^-1074, and alpha* came out
    // 0.5077099 for 0.5077072 (offset 135). The m = 2 closed form, forced through the
    // quadrature, on subnormal masses of 1 to 2^52 units.
    let p = [
        4.5840678152333543e-20,
        0.4990041766157314,
        0.0017019994108170794,
        0.49929382397345157,
        2.2849089378193953e-24,
    ];
    let q = [5.236184205835126e-23, 5e-324, 8.88001991205365e-219, 7.3e-322, 1.0];
    let brute = alpha_star_brute_force(&p, &draft_table(c, &q, 4));
    let fast = alpha::alpha_star(c, &p, &q, 4).unwrap();
    assert!(within(fast, brute, 1e-12), "scan {fast} vs brute force {brute}");
    for units in [1.0, 3.0, 148.0, 1e6, 2f64.powi(52)] {
        let tiny = units * 5e-324;
        let p = [0.3, 0.25, 0.45];
        let q = [1.0, tiny, 7.0 * tiny];
        let closed = alpha::alpha_star_without_replacement_with(&p, &q, 2, WorMethod::Auto);
        let quad = alpha::alpha_star_without_replacement_with(&p, &q, 2, WorMethod::Quadrature);
        let brute = alpha_star_brute_force(&p, &draft_table(c, &q, 2));
        assert!(
            within(closed, brute, 1e-12) && within(quad, brute, 1e-12),
            "{units} units: closed form {closed}, quadrature {quad}, brute force {brute}"
        );
    }
    let q = [0.4999451059315308, 0.0, 0.0, 0.5000548940684691, 2.293639461e-314];
    for n in [3, 4] {
        let table = draft_table(DraftConstruction::ConditionalPoisson, &q, n);
        assert_eq!(table.len(), 1, "{table:?}");
        assert!(within(table[0].1, 1.0, 1e-15), "n={n}: {table:?}");
    }
}

/// The real samplers on peaked p and q: every construction's drafts follow its exact tuple law
/// (a tuple of probability 0 never appears), and every pair's output follows p, by Pearson's
/// chi-square at 4,000 (drafts) and 20,000 (outputs) draws per case (cells of small expectation pooled by
/// `common::chi_square`). The conditional-Poisson sampler before its fix drew, on
/// q = [7e-144, 2e-288, 5e-147, 1, 6e-125] with 4 drafts, the tuple without token 0 (law:
/// ~1e-144) every time.
#[test]
fn peaked_distributions_are_sampled_by_their_laws() {
    let mut r = common::rng(777);
    let (mut ds, mut vs) = (DraftScratch::default(), VerifyScratch::default());
    let mut drafts = Vec::new();
    let mut runs = 0;
    for case in 0..LAW_CASES {
        let v = 3 + case % 4;
        let q = peaked(&mut r, v);
        for construction in DraftConstruction::ALL {
            let n = *common::draft_counts(construction, 4).last().expect("a valid n");
            let table = draft_table(construction, &q, n);
            let mut counts = vec![0u64; table.len()];
            for _ in 0..LAW_DRAWS {
                construction.sample(&q, n, &mut r, &mut ds, &mut drafts).unwrap();
                let i = table.iter().position(|(t, _)| *t == drafts);
                let i = i.unwrap_or_else(|| panic!("{construction} n={n}: drew {drafts:?}, of probability 0\nq={q:?}"));
                counts[i] += 1;
            }
            let law: Vec<f64> = table.iter().map(|t| t.1).collect();
            let (stat, df, pval) = common::chi_square(&counts, &law);
            assert!(pval > SIGNIFICANCE, "{construction} n={n}: drafts chi2 = {stat:.2} on {df} df, p-value {pval:e}\nq={q:?}\ncounts {counts:?}\nlaw {law:?}");
            runs += 1;
        }
    }
    for case in 0..11 {
        let v = 3 + case % 4;
        let p = peaked(&mut r, v);
        let q = peaked(&mut r, v);
        for &(construction, verifier) in VALID_PAIRS {
            let n = *common::draft_counts(construction, 3).last().expect("a valid n");
            let mut counts = vec![0u64; v];
            for _ in 0..DRAWS {
                construction.sample(&q, n, &mut r, &mut ds, &mut drafts).unwrap();
                let out = verifier.verify(construction, n, &p, &q, &drafts, &mut r, &mut vs).unwrap();
                counts[out.token as usize] += 1;
            }
            let (stat, df, pval) = common::chi_square(&counts, &p);
            assert!(pval > SIGNIFICANCE, "{construction}+{verifier} n={n}: chi2 = {stat:.2} on {df} df, p-value {pval:e}\np={p:?}\nq={q:?}\ncounts {counts:?}");
            runs += 1;
        }
    }
    assert_eq!(runs, LAW_CASES * DraftConstruction::ALL.len() + 11 * VALID_PAIRS.len());
}

/// Positional races (`--reproducible`) on peaked distributions: the race's token follows p, and
/// the top-k races follow sequential sampling without replacement from q, by chi-square over
/// 20,000 positions per case. Two fixed cases put the second draft between subnormal weights,
/// where the keys `ln(u)/w` had all been `-inf` (q = (1, 1e-320, 2e-320) drew token 1 second
/// every time) or partly so (q = (1, 3e-309, 6e-309): 13,942 against 16,058 in 30,000).
#[test]
fn peaked_distributions_keep_the_positional_races_exact() {
    use samplers::PositionalNoise;
    let mut r = common::rng(999);
    let mut out = Vec::new();
    let mut cases: Vec<(Vec<f64>, Vec<f64>)> =
        vec![(vec![0.5, 0.2, 0.3], vec![1.0, 1e-320, 2e-320]), (vec![0.5, 0.2, 0.3], vec![1.0, 3e-309, 6e-309])];
    for case in 0..24 {
        let v = 3 + case % 4;
        cases.push((peaked(&mut r, v), peaked(&mut r, v)));
    }
    for (case, (p, q)) in cases.into_iter().enumerate() {
        let v = p.len();
        let noise = PositionalNoise::new(common::shifted_seed(case as u64));
        let mut counts = vec![0u64; v];
        for pos in 0..DRAWS as u64 {
            counts[noise.sample(pos, &p).unwrap() as usize] += 1;
        }
        let (stat, df, pval) = common::chi_square(&counts, &p);
        assert!(pval > SIGNIFICANCE, "race: chi2 = {stat:.2} on {df} df, p-value {pval:e}\np={p:?}\ncounts {counts:?}");
        let k = if case < 2 { 2 } else { 3.min(q.iter().filter(|&&x| x > 0.0).count()) };
        let table = draft_table(DraftConstruction::WithoutReplacement, &q, k);
        let mut counts = vec![0u64; table.len()];
        for pos in 0..DRAWS as u64 {
            noise.top_k(pos, &q, k, &mut out).unwrap();
            let i = table.iter().position(|(t, _)| *t == out);
            let i = i.unwrap_or_else(|| panic!("top-{k} race drew {out:?}, of probability 0\nq={q:?}"));
            counts[i] += 1;
        }
        let law: Vec<f64> = table.iter().map(|t| t.1).collect();
        let (stat, df, pval) = common::chi_square(&counts, &law);
        assert!(
            pval > SIGNIFICANCE,
            "top-{k} race: chi2 = {stat:.2} on {df} df, p-value {pval:e}\nq={q:?}\ncounts {counts:?}\nlaw {law:?}"
        );
    }
}
