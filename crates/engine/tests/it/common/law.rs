//! Statistical checks of the decoding loop: the exact law of the first two generated tokens,
//! Pearson's chi-square against it, and the temperature-0 equality of `--tree auto`.

use engine::decode::auto_tree::AutoTree;
use engine::decode::{GenerationConfig, Generator, Randomness, SpecConfig, Stats, TreeChoice};
use samplers::dist::Warp;
use samplers::{DraftConstruction, VALID_PAIRS};

/// Exact law of the first two tokens after `prompt` under the warped target, by enumeration:
/// `law[a * V + b] = p(a | prompt) p(b | prompt, a)`.
pub fn two_token_law(target: &engine::model::DecoderModel, prompt: &[u32], warp: samplers::dist::Warp) -> Vec<f64> {
    let v = target.config().vocab_size;
    let probs = |tokens: &[u32]| -> Vec<f64> {
        let mut cache = target.new_cache(tokens.len() + 1).unwrap();
        let bias = engine::model::causal_bias(0, tokens.len(), target.dtype(), target.device()).unwrap();
        let pos: Vec<u32> = (0..tokens.len() as u32).collect();
        let h = target.forward(tokens, &pos, &bias, &mut cache).unwrap();
        let logits = target.logits(&h.narrow(0, tokens.len() - 1, 1).unwrap()).unwrap();
        let mut p = Vec::new();
        warp.apply(&logits.flatten_all().unwrap().to_vec1::<f32>().unwrap(), &mut p).unwrap();
        p
    };
    let p1 = probs(prompt);
    let mut law = vec![0.0; v * v];
    for a in 0..v {
        let p2 = probs(&[prompt, &[a as u32]].concat());
        for b in 0..v {
            law[a * v + b] = p1[a] * p2[b];
        }
    }
    law
}

/// Pearson's chi-square statistic of `counts` (out of `draws`) against the probabilities
/// `law`: a cell of zero probability must have no count; cells expecting fewer than 5 draws
/// are pooled into one (a cell of its own if it expects 5 or more, else its count must stay
/// below its expectation plus 25), as the chi-square approximation needs. Returns the
/// statistic, the number of cells of positive probability and the degrees of freedom.
pub fn pearson(counts: &[u64], law: &[f64], draws: u64) -> (f64, usize, usize) {
    let (mut stat, mut positive, mut bins) = (0.0, 0, 0);
    let (mut pooled_o, mut pooled_e) = (0.0, 0.0);
    for (i, (&o, &p)) in counts.iter().zip(law).enumerate() {
        let e = p * draws as f64;
        if e == 0.0 {
            assert_eq!(o, 0, "cell {i}: a zero-probability outcome was generated");
            continue;
        }
        positive += 1;
        if e < 5.0 {
            pooled_o += o as f64;
            pooled_e += e;
            continue;
        }
        stat += (o as f64 - e).powi(2) / e;
        bins += 1;
    }
    if pooled_e >= 5.0 {
        stat += (pooled_o - pooled_e).powi(2) / pooled_e;
        bins += 1;
    } else {
        assert!(pooled_o <= pooled_e + 25.0, "{pooled_o} draws in cells expecting {pooled_e:.2} in all");
    }
    (stat, positive, bins.max(2) - 1)
}

/// Generates two tokens after `prompt` with seeds `0..draws` (`config(seed)`), counts each
/// pair at `out[0] * vocab + out[1]`, and hands each run's statistics to `each`.
/// `MDSD_TEST_SEED_OFFSET=N` shifts the seeds to `N..N + draws`, to re-run the chi-square
/// tests on fresh draws (the seed audit: docs/results/README.md#const-seed-audit); CI runs with
/// offset 0.
///
/// When the configuration drafts, it asserts that drafts were accepted: in at least 1% of the
/// generations the first step accepted a draft (both tokens from one target forward).
/// Without that, a chi-square test would also pass with speculation silently off.
pub fn two_token_counts(
    generator: &mut Generator,
    prompt: &[u32],
    vocab: usize,
    draws: u64,
    config: impl Fn(u64) -> GenerationConfig + Sync,
    each: impl FnMut(&Stats) + Send,
) -> Vec<u64> {
    two_token_counts_batched(None, generator, prompt, vocab, draws, config, each)
}

/// [`two_token_counts`] with the generations' forwards batched with other threads' on `batcher`
/// (joined on the thread that runs them).
pub fn two_token_counts_batched(
    batcher: Option<&std::sync::Arc<engine::model::Batcher>>,
    generator: &mut Generator,
    prompt: &[u32],
    vocab: usize,
    draws: u64,
    config: impl Fn(u64) -> GenerationConfig + Sync,
    mut each: impl FnMut(&Stats) + Send,
) -> Vec<u64> {
    let mut counts = vec![0u64; vocab * vocab];
    let offset = match std::env::var("MDSD_TEST_SEED_OFFSET") {
        Ok(v) => v.parse::<u64>().unwrap_or_else(|_| panic!("MDSD_TEST_SEED_OFFSET={v:?} is not a number")),
        Err(_) => 0,
    };
    let (mut spec, mut accepted) = (None, 0u64);
    // candle's CPU ops (rotary embedding, softmax, RMS norm) hand each call to rayon's pool;
    // on these tiny models that handoff costs more than the op. In a one-thread pool of its
    // own this thread is the worker and runs them inline: the same arithmetic, element by
    // element, without the handoff.
    let inline = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread rayon pool");
    inline.install(|| {
        let _member = batcher.map(|b| b.join());
        for seed in offset..offset + draws {
            let config = config(seed);
            if spec.is_none() {
                spec = config.speculative.clone();
            }
            let (out, stats) = generator.generate(prompt, &config, |_| false, |_| Ok(())).unwrap();
            assert_eq!(out.len(), 2, "generated {out:?}");
            counts[out[0] as usize * vocab + out[1] as usize] += 1;
            accepted += (stats.target_forwards == 1) as u64;
            each(&stats);
        }
    });
    if let Some(s) = spec {
        assert!(
            accepted * 100 >= draws,
            "{:?} {}+{}: a draft was accepted in only {accepted} of {draws} generations: the test would not exercise speculation",
            s.tree,
            s.construction,
            s.verifier
        );
    }
    counts
}

/// The power the detection limits below are stated at.
pub const POWER: f64 = 0.9;

/// The smallest total-variation error that [`assert_follows_law`] catches with probability at
/// least [`POWER`] from `draws` generations over `df + 1` cells: every law `q` with
/// `TV(p, q) >= delta` fails the test that often.
///
/// Why: counts drawn from `q` give Pearson's statistic against `p` a noncentral chi-square law
/// with `df` degrees of freedom and noncentrality `lambda = draws * sum (q_i - p_i)^2 / p_i`,
/// and by Cauchy-Schwarz `sum (q_i - p_i)^2 / p_i >= (sum |q_i - p_i|)^2 = 4 TV^2` whatever
/// the shape of the shift. So `delta = sqrt(lambda* / (4 draws))`, with `lambda*` the
/// noncentrality at which the test (p-value 1e-4) rejects with probability [`POWER`].
pub fn detectable_tv(draws: u64, df: usize) -> f64 {
    let critical = chi_square_critical(df, P_VALUE);
    // The noncentrality whose rejection probability is POWER, by bisection (it increases with
    // lambda). 1,000 bounds it for every df up to 100 (about 70 at df 24), and keeps the Poisson
    // weights below within f64's range.
    let (mut lo, mut hi) = (0.0f64, 1000.0f64);
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if noncentral_chi_square_sf(critical, df, mid) < POWER {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (hi / (4.0 * draws as f64)).sqrt()
}

/// The draws [`detectable_tv`] needs to reach `delta` over `df + 1` cells, rounded up to a
/// thousand.
pub fn draws_to_detect(delta: f64, df: usize) -> u64 {
    let mut n = 1000;
    while detectable_tv(n, df) > delta {
        n += 1000;
    }
    n
}

/// The p-value below which [`assert_follows_law`] fails.
pub const P_VALUE: f64 = 1e-4;

/// The statistic whose upper tail under chi-square with `df` degrees of freedom is `alpha`.
fn chi_square_critical(df: usize, alpha: f64) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 10_000.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if samplers::stats::chi_square_p_value(mid, df) > alpha {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// `P(X > x)` for `X` noncentral chi-square (`df`, `lambda`): the Poisson(`lambda / 2`)
/// mixture of central chi-squares with `df + 2k` degrees of freedom. For `lambda` up to 1,000
/// (`e^-500` is a normal f64).
fn noncentral_chi_square_sf(x: f64, df: usize, lambda: f64) -> f64 {
    assert!((0.0..=1000.0).contains(&lambda), "noncentrality {lambda} out of range");
    let half = lambda / 2.0;
    let (mut total, mut weight, mut k) = (0.0, (-half).exp(), 0usize);
    loop {
        total += weight * samplers::stats::chi_square_p_value(x, df + 2 * k);
        k += 1;
        weight *= half / k as f64;
        if (k as f64) > half + 50.0 && weight < 1e-17 {
            return total;
        }
    }
}

/// Asserts that `counts` (out of `draws`) follow `law`: the p-value of Pearson's chi-square
/// ([`pearson`], small cells pooled) is above 1e-4; with `cells`, that many cells must have
/// positive probability. `what` names the configuration. Returns the total-variation error
/// this check caught with probability [`POWER`] ([`detectable_tv`] at its degrees of freedom).
pub fn assert_follows_law(counts: &[u64], law: &[f64], draws: u64, cells: Option<usize>, what: &str) -> f64 {
    let (stat, positive, df) = pearson(counts, law, draws);
    if let Some(c) = cells {
        assert_eq!(positive, c, "{what}: {positive} cells of positive probability, expected {c}");
    }
    let p_value = samplers::stats::chi_square_p_value(stat, df);
    assert!(p_value > P_VALUE, "{what}: chi2 = {stat:.1} on {df} df, p {p_value:.1e} (counts {counts:?}, law {law:?})");
    detectable_tv(draws, df)
}

/// Draws of the configurations that must catch a 1% error in total variation (one per
/// verifier): [`detectable_tv`]`(DRAWS_1PCT, 24) <= 0.01`, asserted by
/// `decode::chi_square_detection_limits_are_as_stated`.
pub const DRAWS_1PCT: u64 = 138_000;

/// `--tree auto` at temperature 0 (`base` must be greedy) for every valid pair but
/// SpecHub's (auto picks chains, which SpecHub cannot draw), with q one-hot and at
/// temperature 1: every output equals `reference`. Returns how many generations drafted.
pub fn assert_auto_equals_plain(
    generator: &mut Generator,
    prompt: &[u32],
    base: &GenerationConfig,
    reference: &[u32],
) -> usize {
    let mut drafted = 0;
    for draft_warp in [None, Some(Warp::temperature(1.0))] {
        for &(c, v) in VALID_PAIRS.iter().filter(|(c, _)| *c != DraftConstruction::SpecHub) {
            let config =
                GenerationConfig { speculative: Some(spec(TreeChoice::Auto, c, v, draft_warp, 0.0)), ..base.clone() };
            let (out, stats) = generator.generate(prompt, &config, |_| false, |_| Ok(())).unwrap();
            assert_eq!(out, reference, "auto {c}+{v} (draft warp {draft_warp:?}): {}", stats.auto_tree);
            assert!(stats.auto_tree.starts_with("alpha "), "{}", stats.auto_tree);
            drafted += (stats.draft_forwards > 0) as usize;
        }
    }
    drafted
}

/// A `--tree auto` state whose costs are seeded so that multi-draft trees win: a flat target
/// cost (1 s for any number of rows) and a cheap draft (10 ms per forward).
pub fn auto_favouring_wide_trees() -> AutoTree {
    let mut auto = AutoTree::new(true);
    let (target_rows, draft_rows) = auto.needed_rows();
    for r in 1..=*target_rows.last().expect("rows") {
        auto.target.record(r, 1.0);
    }
    for r in 1..=*draft_rows.last().expect("rows").max(&4) {
        auto.draft.record(r, 0.01);
    }
    auto
}

/// Generates after `prompt` with `config` (no stop token), asserting that the tokens streamed
/// are the tokens returned (`what` names the configuration).
pub fn generate_streamed(
    generator: &mut Generator,
    prompt: &[u32],
    config: &GenerationConfig,
    what: &str,
) -> (Vec<u32>, Stats) {
    let mut streamed = Vec::new();
    let (out, stats) = generator
        .generate(
            prompt,
            config,
            |_| false,
            |t| {
                streamed.extend_from_slice(t);
                Ok(())
            },
        )
        .unwrap();
    assert_eq!(streamed, out, "{what}: streamed tokens");
    (out, stats)
}

/// Plain greedy decoding of `max_new_tokens` tokens with `seed` and the stream randomness: the
/// base the temperature-0 tests add a speculative configuration to.
pub fn greedy(max_new_tokens: usize, seed: u64) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens,
        warp: Warp::temperature(0.0),
        seed,
        randomness: Randomness::Stream,
        speculative: None,
    }
}

/// A speculative configuration: `tree`, construction `c`, verifier `v`, the draft's own warp
/// (`None`: the target's) and a confidence cutoff (0: no pruning).
pub fn spec(
    tree: impl Into<TreeChoice>,
    c: DraftConstruction,
    v: samplers::Verifier,
    draft_warp: Option<Warp>,
    confidence_cutoff: f64,
) -> SpecConfig {
    SpecConfig {
        tree: tree.into(),
        construction: c,
        verifier: v,
        draft_warp,
        confidence_cutoff,
        source: engine::decode::DraftSource::Model,
    }
}

/// The configuration of the chi-square tests: two new tokens at `warp` with seed `seed`, drafted
/// on `tree` with construction `c` and verifier `v` (`draft_warp`: q's own warp, if any).
pub fn two_tokens(
    seed: u64,
    warp: Warp,
    tree: TreeChoice,
    c: DraftConstruction,
    v: samplers::Verifier,
    draft_warp: Option<Warp>,
) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: 2,
        warp,
        seed,
        randomness: Randomness::Stream,
        speculative: Some(spec(tree, c, v, draft_warp, 0.0)),
    }
}
