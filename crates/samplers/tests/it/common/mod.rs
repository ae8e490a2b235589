//! Shared test helpers: random and edge-case distributions, the chi-square test, and the
//! primal LP reference for `alpha*` (eq. (lp) of the paper) solved with `minilp`.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use samplers::{DraftConstruction, TokenId};

/// The tests' random generator. `MDSD_TEST_SEED_OFFSET=N` shifts every seed, to re-run the
/// statistical tests on fresh draws and check that they do not hold only for their fixed seeds
/// (docs/results/README.md#const-seed-audit); CI runs with the fixed seeds (offset 0).
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(shifted_seed(seed))
}

/// A test's seed shifted by `MDSD_TEST_SEED_OFFSET`: the seed of [`rng`], and of the
/// `PositionalNoise` of the race tests. The offset counts in steps of 2^64 / φ, so that
/// neighbouring offsets share no seed: with a step of 1, a test's cases `k` and `k + 1` (seeds
/// `s + k`) drew at offset `N + 1` what they drew at `N`, shifted by one case, and the race
/// tests' two fixed cases (the same p) repeated each other's draws (offsets 667 and 668 failed
/// with the same statistic).
pub fn shifted_seed(seed: u64) -> u64 {
    seed.wrapping_add(seed_offset().wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// `MDSD_TEST_SEED_OFFSET`, 0 when unset; a value that is not a number fails the test run.
pub fn seed_offset() -> u64 {
    match std::env::var("MDSD_TEST_SEED_OFFSET") {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("MDSD_TEST_SEED_OFFSET={v:?} is not a number")),
        Err(_) => 0,
    }
}

/// A random distribution over `v` tokens; with `zeros`, each entry is zero with
/// probability 1/4 (at least one entry stays positive).
pub fn random_dist<R: Rng>(rng: &mut R, v: usize, zeros: bool) -> Vec<f64> {
    loop {
        let mut x: Vec<f64> = (0..v)
            .map(|_| {
                if zeros && rng.random::<f64>() < 0.25 {
                    0.0
                } else {
                    // Exponential weights (a flat Dirichlet), sometimes sharpened.
                    -rng.random::<f64>().max(1e-300).ln()
                }
            })
            .collect();
        if rng.random::<f64>() < 0.3 {
            x.iter_mut().for_each(|w| *w = w.powi(3));
        }
        let s: f64 = x.iter().sum();
        if s > 0.0 {
            x.iter_mut().for_each(|w| *w /= s);
            return x;
        }
    }
}

pub fn one_hot(v: usize, i: usize) -> Vec<f64> {
    let mut x = vec![0.0; v];
    x[i] = 1.0;
    x
}

/// Random cases plus the edge cases: p = q, disjoint supports, one-hot p or q, zeros,
/// ties, and supports smaller than the number of drafts.
pub fn cases(v: usize, seed: u64, random: usize) -> Vec<(String, Vec<f64>, Vec<f64>)> {
    let mut r = rng(seed);
    let mut out = Vec::new();
    for k in 0..random {
        let zeros = k % 2 == 1;
        out.push((format!("random{k}"), random_dist(&mut r, v, zeros), random_dist(&mut r, v, zeros)));
    }
    let p = random_dist(&mut r, v, false);
    out.push(("p=q".into(), p.clone(), p));
    let half = v.div_ceil(2);
    let mut p = vec![0.0; v];
    let mut q = vec![0.0; v];
    for i in 0..v {
        if i < half {
            p[i] = 1.0 / half as f64;
        } else {
            q[i] = 1.0 / (v - half) as f64;
        }
    }
    if v >= 2 {
        out.push(("disjoint".into(), p, q));
    }
    out.push(("one-hot p".into(), one_hot(v, v - 1), random_dist(&mut r, v, false)));
    out.push(("one-hot q".into(), random_dist(&mut r, v, false), one_hot(v, 0)));
    out.push(("one-hot both".into(), one_hot(v, 0), one_hot(v, v - 1)));
    out.push(("uniform ties".into(), vec![1.0 / v as f64; v], vec![1.0 / v as f64; v]));
    let mut q = vec![0.0; v];
    q[0] = 0.5;
    q[v - 1] = 0.5;
    out.push(("small support".into(), random_dist(&mut r, v, true), q));
    out
}

pub use samplers::stats::gamma_q;

/// Pearson chi-square goodness of fit of `counts` against probabilities `p`; cells with an
/// expected count under 5 are pooled. Returns `(statistic, degrees of freedom, p-value)`.
pub fn chi_square(counts: &[u64], p: &[f64]) -> (f64, usize, f64) {
    let total: u64 = counts.iter().sum();
    let n = total as f64;
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut pooled_obs, mut pooled_exp) = (0.0, 0.0);
    for (&c, &pi) in counts.iter().zip(p) {
        let e = pi * n;
        if e < 5.0 {
            pooled_obs += c as f64;
            pooled_exp += e;
            continue;
        }
        stat += (c as f64 - e).powi(2) / e;
        cells += 1;
    }
    if pooled_exp >= 5.0 {
        stat += (pooled_obs - pooled_exp).powi(2) / pooled_exp;
        cells += 1;
    } else {
        assert!(pooled_obs <= pooled_exp + 25.0, "{pooled_obs} draws in cells of expected mass {pooled_exp}");
    }
    let df = cells.saturating_sub(1).max(1);
    (stat, df, gamma_q(df as f64 / 2.0, stat / 2.0))
}

/// `alpha*` by the primal LP (eq. (lp)): maximise `sum_{i, t: i in t} C[i,t]` subject to row sums
/// `p(i)`, column sums `P_draft(t)`, `C >= 0`.
pub fn alpha_star_lp(p: &[f64], table: &[(Vec<TokenId>, f64)]) -> f64 {
    use minilp::{ComparisonOp, OptimizationDirection, Problem};
    let mut lp = Problem::new(OptimizationDirection::Maximize);
    let v = p.len();
    let mut vars = vec![Vec::new(); v];
    let mut cols = Vec::new();
    for (t, _) in table {
        let mut col = Vec::new();
        for (i, row) in vars.iter_mut().enumerate() {
            let obj = if t.contains(&(i as TokenId)) { 1.0 } else { 0.0 };
            let x = lp.add_var(obj, (0.0, f64::INFINITY));
            row.push(x);
            col.push(x);
        }
        cols.push(col);
    }
    for (i, row) in vars.iter().enumerate() {
        let terms: Vec<_> = row.iter().map(|&x| (x, 1.0)).collect();
        lp.add_constraint(&terms[..], ComparisonOp::Eq, p[i]);
    }
    for (col, (_, prob)) in cols.iter().zip(table) {
        let terms: Vec<_> = col.iter().map(|&x| (x, 1.0)).collect();
        lp.add_constraint(&terms[..], ComparisonOp::Eq, *prob);
    }
    lp.solve().expect("the transport LP is feasible").objective()
}

/// Normalises an explicit table so that the LP's two marginals have equal mass exactly.
pub fn normalised_table(c: DraftConstruction, q: &[f64], n: usize) -> Vec<(Vec<TokenId>, f64)> {
    let mut t = samplers::alpha::reference::draft_table(c, q, n);
    let s: f64 = t.iter().map(|x| x.1).sum();
    t.iter_mut().for_each(|x| x.1 /= s);
    t
}

/// Valid draft counts of a construction among `1..=max`.
pub fn draft_counts(c: DraftConstruction, max: usize) -> Vec<usize> {
    (1..=max).filter(|&n| c.check_n(n).is_ok()).collect()
}
