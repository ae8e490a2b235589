//! Acceptance rates at every position: the optimum `alpha*` of each draft construction and
//! the expected acceptance of each verifier, for one (temperature, number of drafts).
//!
//! Acceptance is `P(the output token is one of the drafts)` (the tree descends into it).
//! - Exact: `alpha*` of every construction (samplers' subset scans), K-SEQ's theoretical
//!   `1 - (1 - beta(rho))^n`, RRS with replacement (its residual does not depend on the
//!   rejected token), the Greedy verifier (enumerating the one random draft: `|supp q|`
//!   exact output distributions), top-k (`p` of the top `n` tokens of `q`).
//! - Positional races (`--reproducible`): exact (quadrature) on supports of at most 64 tokens,
//!   else the fraction of `samples` positions of fresh noise that accept.
//! - Monte Carlo, with `samples` draws per position, Rao-Blackwellized: RRS without
//!   replacement scores each sampled rejection path exactly
//!   (`samplers::alpha::rrs::alpha_rrs_without_replacement_monte_carlo`; exact on supports of
//!   at most 8 tokens); K-SEQ samples draft tuples and adds the exact probability that the
//!   output is one of them. The estimation error is part of the reported standard error
//!   (each position's estimate is unbiased).

use super::store::{Position, Positions};
use crate::run_info::Progress;
use crate::stats::MeanSe;
use rand::rngs::StdRng;
use rand::SeedableRng;
use rayon::prelude::*;
use samplers::alpha::{self, rrs};
use samplers::dist::{top_k_support, Warp};
use samplers::{DraftConstruction as C, Verifier as V};

/// What is computed at each position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    RrsWr,
    KSeq,
    KSeqTheory,
    StarWr,
    RrsWor,
    StarWor,
    GeneratingFunction,
    GreedyVerify,
    StarGreedy,
    TopK,
    Positional,
}

impl Metric {
    pub const ALL: [Metric; 11] = [
        Self::RrsWr,
        Self::KSeq,
        Self::KSeqTheory,
        Self::StarWr,
        Self::RrsWor,
        Self::StarWor,
        Self::GeneratingFunction,
        Self::GreedyVerify,
        Self::StarGreedy,
        Self::TopK,
        Self::Positional,
    ];

    /// Key in the JSON output.
    pub fn key(self) -> &'static str {
        match self {
            Self::RrsWr => "rrs_wr",
            Self::KSeq => "kseq",
            Self::KSeqTheory => "kseq_theory",
            Self::StarWr => "alpha_star_wr",
            Self::RrsWor => "rrs_wor",
            Self::StarWor => "alpha_star_wor",
            Self::GeneratingFunction => "generating_function_wor",
            Self::GreedyVerify => "greedy",
            Self::StarGreedy => "alpha_star_greedy",
            Self::TopK => "topk",
            Self::Positional => "positional",
        }
    }

    /// Label in plots.
    pub fn label(self) -> &'static str {
        match self {
            Self::RrsWr => "RRS, with replacement",
            Self::KSeq => "K-SEQ",
            Self::KSeqTheory => "K-SEQ theory",
            Self::StarWr => "alpha*, with replacement",
            Self::RrsWor => "RRS, without replacement",
            Self::StarWor => "alpha*, without replacement",
            Self::GeneratingFunction => "generating function (paper)",
            Self::GreedyVerify => "Greedy verify",
            Self::StarGreedy => "alpha*, Greedy",
            Self::TopK => "top-k drafts",
            Self::Positional => "positional races",
        }
    }

    /// The optimum this metric is compared with (the table's Δα), if any.
    pub fn reference(self) -> Option<Metric> {
        match self {
            Self::RrsWr | Self::KSeq | Self::KSeqTheory => Some(Self::StarWr),
            // The draft's k best races are an ordered sample without replacement from q.
            Self::RrsWor | Self::GeneratingFunction | Self::Positional => Some(Self::StarWor),
            Self::GreedyVerify => Some(Self::StarGreedy),
            _ => None,
        }
    }

    pub fn index(self) -> usize {
        Self::ALL.iter().position(|&m| m == self).expect("listed")
    }
}

pub const METRICS: usize = Metric::ALL.len();

/// One evaluation point of the study.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Setting {
    pub temperature: f64,
    pub drafts: usize,
}

/// Every metric at one position; `p` and `q` are normalised over the kept tokens.
pub fn evaluate_pq(p: &[f64], q: &[f64], n: usize, samples: usize, rng: &mut StdRng) -> anyhow::Result<[f64; METRICS]> {
    let mut out = [0.0; METRICS];
    let mut set = |m: Metric, v: f64| out[m.index()] = v;
    set(Metric::RrsWr, rrs::alpha_rrs_with_replacement(p, q, n));
    set(Metric::KSeqTheory, alpha::alpha_kseq(p, q, n));
    set(Metric::StarWr, alpha::alpha_star(C::WithReplacement, p, q, n)?);
    set(Metric::StarWor, alpha::alpha_star(C::WithoutReplacement, p, q, n)?);
    set(Metric::GeneratingFunction, alpha::alpha_generating_function(p, q, n));
    set(Metric::StarGreedy, alpha::alpha_star(C::Greedy, p, q, n)?);
    set(Metric::TopK, alpha::alpha_star_top_k(p, q, n));
    let support = samplers::dist::support_size(q);
    set(
        Metric::RrsWor,
        if support <= 8 {
            rrs::alpha_rrs_without_replacement_exact(p, q, n)
        } else {
            rrs::alpha_rrs_without_replacement_monte_carlo(p, q, n, samples, rng).mean
        },
    );
    // K-SEQ: sampled tuples, exact P(output in tuple | tuple).
    let mut scratch = samplers::construction::DraftScratch::default();
    let mut tuple = Vec::new();
    let mut kseq = 0.0;
    for _ in 0..samples {
        C::WithReplacement.sample(q, n, rng, &mut scratch, &mut tuple)?;
        kseq += in_tuple(&V::KSeq.output_distribution(C::WithReplacement, n, p, q, &tuple)?, &tuple);
    }
    set(Metric::KSeq, kseq / samples as f64);
    set(Metric::GreedyVerify, greedy_acceptance(p, q, n)?);
    set(Metric::Positional, positional_acceptance(p, q, n, samples, rng)?);
    Ok(out)
}

/// The acceptance of `--reproducible`'s positional races (the target's race winner among the
/// draft's `n` best races on the same noise): exact by quadrature when `p` and `q` together
/// have at most 64 tokens, else the fraction of `samples` positions of noise seeded from `rng`.
fn positional_acceptance(p: &[f64], q: &[f64], n: usize, samples: usize, rng: &mut StdRng) -> anyhow::Result<f64> {
    let noise = samplers::PositionalNoise::new(rand::Rng::random(rng));
    Ok(samplers::positional::estimated_acceptance(p, q, n, noise, samples as u64)?.0)
}

/// `sum` of `dist` over the distinct tokens of `tuple`.
fn in_tuple(dist: &[f64], tuple: &[u32]) -> f64 {
    let mut s = 0.0;
    for (k, &t) in tuple.iter().enumerate() {
        if !tuple[..k].contains(&t) {
            s += dist[t as usize];
        }
    }
    s
}

/// Exact acceptance of the Greedy verifier: the top `m - 1` drafts are fixed, the last is
/// `x` with probability `q(x) / (1 - q(top))`; each tuple's output law is exact.
pub fn greedy_acceptance(p: &[f64], q: &[f64], n: usize) -> anyhow::Result<f64> {
    let m = C::Greedy.num_drafts(q, n);
    let mut top = Vec::new();
    top_k_support(q, m - 1, &mut top);
    // The mass outside the top tokens, summed directly: `1 - q(top)` cancels to 0 or to
    // round-off when q is nearly one-hot (then every `q(x) / rest` came out wrong).
    let rest: f64 = q.iter().enumerate().filter(|(x, _)| !top.contains(&(*x as u32))).map(|(_, &qx)| qx).sum();
    let mut tuple = top.clone();
    tuple.push(0);
    let mut acc = 0.0;
    for (x, &qx) in q.iter().enumerate() {
        if qx <= 0.0 || top.contains(&(x as u32)) {
            continue;
        }
        *tuple.last_mut().expect("m >= 1") = x as u32;
        acc += qx / rest * in_tuple(&V::Greedy.output_distribution(C::Greedy, n, p, q, &tuple)?, &tuple);
    }
    Ok(acc.min(1.0))
}

fn position_pq(x: &Position<'_>, warp: &Warp, p: &mut Vec<f64>, q: &mut Vec<f64>) -> anyhow::Result<()> {
    warp.apply(x.target, p).map_err(|e| anyhow::anyhow!("target logits: {e}"))?;
    warp.apply(x.draft, q).map_err(|e| anyhow::anyhow!("draft logits: {e}"))?;
    Ok(())
}

/// Every metric at every position for one setting (in parallel over positions; position
/// `i` draws its Monte Carlo samples from a generator seeded by `seed` and `i`).
pub fn evaluate(
    positions: &Positions,
    setting: Setting,
    samples: usize,
    seed: u64,
    progress: &Progress,
) -> anyhow::Result<Vec<[f64; METRICS]>> {
    let warp = Warp::temperature(setting.temperature);
    let chunk = 256;
    let starts: Vec<usize> = (0..positions.len()).step_by(chunk).collect();
    let parts: Vec<anyhow::Result<Vec<[f64; METRICS]>>> = starts
        .par_iter()
        .map(|&s| {
            let (mut p, mut q) = (Vec::new(), Vec::new());
            let mut out = Vec::with_capacity(chunk);
            for i in s..(s + chunk).min(positions.len()) {
                let x = positions.get(i);
                position_pq(&x, &warp, &mut p, &mut q).map_err(|e| anyhow::anyhow!("position {i}: {e}"))?;
                let mut rng = StdRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                out.push(evaluate_pq(&p, &q, setting.drafts, samples, &mut rng)?);
            }
            progress.inc();
            Ok(out)
        })
        .collect();
    let mut all = Vec::with_capacity(positions.len());
    for part in parts {
        all.extend(part?);
    }
    Ok(all)
}

/// Number of progress units of one [`evaluate`] call.
pub fn progress_units(positions: &Positions) -> u64 {
    positions.len().div_ceil(256) as u64
}

/// Mean (and gap to its optimum) of each metric, clustered by response.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MetricSummary {
    pub metric: &'static str,
    pub alpha: MeanSe,
    /// `alpha - alpha*` of the metric's construction, per position, clustered.
    pub gap: Option<MeanSe>,
    /// `|gap| > 2 se`.
    pub significant: bool,
}

pub fn summarize(positions: &Positions, values: &[[f64; METRICS]]) -> Vec<MetricSummary> {
    let g = positions.prompts();
    Metric::ALL
        .iter()
        .map(|&m| {
            let mut clusters = vec![(0.0, 0usize); g];
            let mut gaps = vec![(0.0, 0usize); g];
            for (i, v) in values.iter().enumerate() {
                let c = positions.prompt[i] as usize;
                clusters[c].0 += v[m.index()];
                clusters[c].1 += 1;
                if let Some(r) = m.reference() {
                    gaps[c].0 += v[m.index()] - v[r.index()];
                    gaps[c].1 += 1;
                }
            }
            let gap = m.reference().map(|_| MeanSe::clustered(&gaps));
            let significant = gap.is_some_and(|g| g.mean.abs() > 2.0 * g.se);
            MetricSummary { metric: m.key(), alpha: MeanSe::clustered(&clusters), gap, significant }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(v: &[f64]) -> Vec<f64> {
        let s: f64 = v.iter().sum();
        v.iter().map(|x| x / s).collect()
    }

    /// On small vocabularies every verifier's expected acceptance equals the exact
    /// enumeration over draft tuples (`samplers::alpha::reference::acceptance`), and no
    /// verifier beats its construction's alpha*.
    #[test]
    fn matches_enumeration_and_never_beats_the_optimum() {
        let mut rng = StdRng::seed_from_u64(5);
        let cases = [
            (norm(&[5.0, 3.0, 1.0, 1.0, 0.5]), norm(&[1.0, 2.0, 4.0, 0.5, 1.0])),
            (norm(&[1.0, 1.0, 1.0, 1.0, 1.0]), norm(&[8.0, 1.0, 0.5, 0.25, 0.25])),
            (norm(&[0.0, 2.0, 1.0, 0.0, 3.0]), norm(&[1.0, 1.0, 0.0, 2.0, 1.0])),
        ];
        use samplers::alpha::reference::acceptance;
        for (p, q) in &cases {
            for n in 1..=3 {
                let v = evaluate_pq(p, q, n, 4000, &mut rng).unwrap();
                let get = |m: Metric| v[m.index()];
                let exact = |c, ver| acceptance(c, ver, p, q, n).unwrap();
                assert!((get(Metric::RrsWr) - exact(C::WithReplacement, V::Rrs)).abs() < 1e-9);
                assert!((get(Metric::GreedyVerify) - exact(C::Greedy, V::Greedy)).abs() < 1e-9);
                assert!((get(Metric::TopK) - exact(C::TopK, V::TopK)).abs() < 1e-9);
                // Support <= 8: RRS-wo is enumerated exactly.
                assert!((get(Metric::RrsWor) - exact(C::WithoutReplacement, V::Rrs)).abs() < 1e-9);
                // K-SEQ is Monte Carlo over tuples: 4000 samples of a value in [0, 1].
                let k = exact(C::WithReplacement, V::KSeq);
                assert!((get(Metric::KSeq) - k).abs() < 0.03, "kseq {} vs {k}", get(Metric::KSeq));
                // Five tokens: positional races are integrated exactly.
                assert_eq!(get(Metric::Positional), samplers::positional::coupled_acceptance(p, q, n));
                for (m, star) in [
                    (Metric::RrsWr, Metric::StarWr),
                    (Metric::KSeqTheory, Metric::StarWr),
                    (Metric::RrsWor, Metric::StarWor),
                    (Metric::GreedyVerify, Metric::StarGreedy),
                    (Metric::Positional, Metric::StarWor),
                ] {
                    assert!(get(m) <= get(star) + 1e-9, "{m:?} {} > {star:?} {}", get(m), get(star));
                }
            }
        }
    }

    #[test]
    fn clustered_summary_and_gaps() {
        let mut pos = Positions::new(serde_json::Value::Null);
        for prompt in 0..3u32 {
            for _ in 0..2 {
                pos.push(prompt, &[0], &[0.0], &[0.0], (1.0, 1.0));
            }
        }
        let mut values = vec![[0.5; METRICS]; 6];
        for (i, v) in values.iter_mut().enumerate() {
            v[Metric::StarWr.index()] = 0.6 + 0.01 * i as f64;
        }
        let s = summarize(&pos, &values);
        let rrs = &s[Metric::RrsWr.index()];
        assert!((rrs.alpha.mean - 0.5).abs() < 1e-12 && rrs.alpha.se.abs() < 1e-12 && rrs.alpha.n == 3);
        let gap = rrs.gap.unwrap();
        assert!((gap.mean + 0.125).abs() < 1e-12 && rrs.significant, "{gap:?}");
        assert!(s[Metric::StarWr.index()].gap.is_none());
    }
}
#[cfg(test)]
mod near_one_hot {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Low temperatures make q nearly one-hot (tails of 1e-30 and below): the Greedy
    /// verifier's exact acceptance still equals the tuple enumeration and α* of Greedy drafts
    /// (it used to collapse towards 0 when the mass outside the top tokens was taken as
    /// `1 - q(top)`). 300 random 7-token logit pairs at T = 0.05, 0.1, 0.2, 0.3, 3 drafts.
    #[test]
    fn greedy_acceptance_is_exact_on_sharp_distributions() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let soft = |l: &[f64], t: f64| {
            let m = l.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = l.iter().map(|x| ((x - m) / t).exp()).collect();
            let s: f64 = e.iter().sum();
            e.iter().map(|x| x / s).collect::<Vec<f64>>()
        };
        for _ in 0..300 {
            let lp: Vec<f64> = (0..7).map(|_| rng.random::<f64>() * 4.0).collect();
            let lq: Vec<f64> = lp.iter().map(|x| x + rng.random::<f64>() * 1.5).collect();
            for t in [0.05, 0.1, 0.2, 0.3] {
                let (p, q) = (soft(&lp, t), soft(&lq, t));
                let got = greedy_acceptance(&p, &q, 3).unwrap();
                let exact = samplers::alpha::reference::acceptance(C::Greedy, V::Greedy, &p, &q, 3).unwrap();
                let star = samplers::alpha::alpha_star_greedy(&p, &q, 3);
                assert!((got - exact).abs() < 1e-9, "T = {t}: {got} against enumeration {exact} (q {q:?})");
                assert!((got - star).abs() < 1e-9, "T = {t}: {got} against alpha* {star} (q {q:?})");
            }
        }
    }
}
