//! The decoding loop's output law at temperature > 0, by Pearson's chi-square: the first two
//! generated tokens against their exact law, for every verifier, and the power of these tests
//! (what error in total variation each sample size catches, `common::detectable_tv`, checked
//! against a simulation of the test itself). `decode` holds the other chi-square tests of the
//! loop (`auto`, pruning, draft windows).

use crate::common::{self, Tiny};
use crate::decode::{model, two_token_law, MIN_P, SMALL_PROMPT};
use engine::decode::Generator;
use engine::model::DecoderModel;
use engine::DraftTree;
use samplers::dist::Warp;
use samplers::{DraftConstruction, Verifier};

/// The target of the chi-square tests (a 5-token vocabulary, 2 layers) and two drafts: an
/// unrelated one-layer model (`Other`: drafts often rejected) and the target's own first layer
/// (`Shallow`: a draft close to the target, often accepted).
fn chi_square_models() -> (DecoderModel, DecoderModel, DecoderModel) {
    let small = |seed, layers| Tiny { vocab: 5, scale: 1.0, layers, ..Tiny::qwen2(seed) };
    (model(small(31, 2), "chi-target"), model(small(32, 1), "chi-draft"), model(small(31, 1), "chi-draft-shallow"))
}

/// Which draft of [`chi_square_models`] a case uses.
#[derive(Clone, Copy, PartialEq)]
enum Draft {
    Other,
    Shallow,
}

/// One chi-square case: tree, construction, verifier, the target's warp, the draft's own warp
/// (`None`: the target's) and the draft.
type Case = (&'static str, DraftConstruction, samplers::Verifier, Warp, Option<Warp>, Draft);

/// Generates `draws` pairs of tokens with `case` and asserts the counts follow the exact law;
/// returns the total-variation error the check caught with probability 0.9. With
/// `prefix_reuse`, each generation keeps the prompt's cached rows from the one before
/// (`Generator::set_prefix_reuse`), as `mdsd serve` does: only the new tokens run.
fn assert_case_follows_the_law(case: Case, draws: u64, prefix_reuse: bool) -> f64 {
    let (target, other, shallow) = chi_square_models();
    let (name, c, v, warp, draft_warp, which) = case;
    let draft = if which == Draft::Other { &other } else { &shallow };
    let law = two_token_law(&target, warp);
    if warp == MIN_P {
        // Min-p left some pairs out (9 of 25 on this model), and kept several.
        let cut = law.iter().filter(|&&x| x == 0.0).count();
        assert!((3..=20).contains(&cut), "min-p cut {cut} of 25 cells: {law:?}");
    }
    let mut generator = Generator::new(&target, Some(draft), 64).unwrap();
    generator.set_prefix_reuse(prefix_reuse);
    let tree = DraftTree::preset(name).unwrap();
    let config = |seed| common::two_tokens(seed, warp, tree.clone().into(), c, v, draft_warp);
    let counts = common::two_token_counts(&mut generator, &SMALL_PROMPT, 5, draws, config, |_| {});
    // 25 cells, or 16 when top-k 4 leaves 4 x 4, fewer with min-p.
    common::assert_follows_law(&counts, &law, draws, None, &format!("{name} {c}+{v}"))
}

/// Temperature 1 (0.7 with a draft at 1.5, 0.8 with top-k, 3 with min-p): the first two tokens
/// follow the exact autoregressive law. Pearson chi-square over the 25 cells of a 5-token
/// vocabulary, 4,000 generations per case with seeds 0..3999; fails below a p-value of 1e-4.
/// Each case catches any error of 0.059 or more in total variation (probability 0.9,
/// `common::detectable_tv`), and drafts must be accepted in at least 1% of its generations.
/// The tests `one_percent_*` below run one case per verifier with [`common::DRAWS_1PCT`]
/// generations, which catch 0.01.
#[test]
fn first_two_tokens_follow_the_target_law() {
    let top_k_4 = Warp { temperature: 0.8, top_k: 4, ..Warp::default() };
    let cases: [Case; 8] = [
        (
            "drafts-2-depth-2",
            DraftConstruction::WithReplacement,
            Verifier::Rrs,
            Warp::temperature(1.0),
            None,
            Draft::Other,
        ),
        (
            "drafts-3-depth-1",
            DraftConstruction::WithoutReplacement,
            Verifier::Rrs,
            Warp::temperature(1.0),
            None,
            Draft::Other,
        ),
        (
            "drafts-2-depth-2",
            DraftConstruction::WithReplacement,
            Verifier::KSeq,
            Warp::temperature(1.0),
            None,
            Draft::Other,
        ),
        ("drafts-2-depth-2", DraftConstruction::Greedy, Verifier::Greedy, Warp::temperature(1.0), None, Draft::Other),
        // The draft's q at its own temperature (1.5): a different q, the same output law.
        (
            "drafts-3-depth-2",
            DraftConstruction::Greedy,
            Verifier::Greedy,
            Warp::temperature(0.7),
            Some(Warp::temperature(1.5)),
            Draft::Other,
        ),
        // The unrelated draft's top token is the target's in under 1% of the generations: the
        // target's own first layer drafts this one.
        ("chain-2", DraftConstruction::TopK, Verifier::TopK, top_k_4, None, Draft::Shallow),
        // Min-p cuts tokens from both laws, p's and q's, by their ratio to each one's top token.
        ("drafts-2-depth-2", DraftConstruction::WithoutReplacement, Verifier::Rrs, MIN_P, None, Draft::Other),
        // A forked chain: two drafts at the root and at depth 1, one below.
        ("chain-2-forks-2", DraftConstruction::SpecHub, Verifier::SpecHub, Warp::temperature(1.0), None, Draft::Other),
    ];
    for case in cases {
        assert_case_follows_the_law(case, 4000, false);
    }
}

/// [`first_two_tokens_follow_the_target_law`] for one case of a verifier with
/// [`common::DRAWS_1PCT`] generations: it catches any error of 0.01 or more in total variation
/// with probability 0.9. One test per verifier, so that they run in parallel; each generation
/// reuses the prompt's cached rows (the law must not depend on it), which halves its forwards.
fn one_percent(case: Case) {
    let tv = assert_case_follows_the_law(case, common::DRAWS_1PCT, true);
    assert!(tv <= 0.01, "{} {}+{}: detects only {tv:.4}", case.0, case.1, case.2);
}

#[test]
fn one_percent_rrs() {
    one_percent((
        "drafts-2-depth-2",
        DraftConstruction::WithReplacement,
        Verifier::Rrs,
        Warp::temperature(1.0),
        None,
        Draft::Shallow,
    ));
}

#[test]
fn one_percent_kseq() {
    one_percent((
        "drafts-2-depth-2",
        DraftConstruction::WithReplacement,
        Verifier::KSeq,
        Warp::temperature(1.0),
        None,
        Draft::Shallow,
    ));
}

#[test]
fn one_percent_greedy() {
    one_percent((
        "drafts-2-depth-2",
        DraftConstruction::Greedy,
        Verifier::Greedy,
        Warp::temperature(1.0),
        None,
        Draft::Other,
    ));
}

#[test]
fn one_percent_top_k() {
    let top_k_4 = Warp { temperature: 0.8, top_k: 4, ..Warp::default() };
    one_percent(("chain-2", DraftConstruction::TopK, Verifier::TopK, top_k_4, None, Draft::Shallow));
}

#[test]
fn one_percent_spechub() {
    one_percent((
        "chain-2-forks-2",
        DraftConstruction::SpecHub,
        Verifier::SpecHub,
        Warp::temperature(1.0),
        None,
        Draft::Other,
    ));
}

/// Concurrent generations (four threads, members of one [`engine::model::Batcher`]: their
/// forwards batched) each follow the target's law: multi-draft RRS, Greedy, SpecHub and plain
/// decoding at temperature 1 side by side, 4,000 generations each (each catches 0.059 in total
/// variation, probability 0.9), and the batcher did batch them.
#[test]
fn batched_generations_follow_the_target_law() {
    let (target, other, _) = chi_square_models();
    let warp = Warp::temperature(1.0);
    let law = two_token_law(&target, warp);
    let cases: [(&str, DraftConstruction, Verifier); 4] = [
        ("drafts-2-depth-2", DraftConstruction::WithReplacement, Verifier::Rrs),
        ("drafts-2-depth-2", DraftConstruction::Greedy, Verifier::Greedy),
        ("chain-2-forks-2", DraftConstruction::SpecHub, Verifier::SpecHub),
        ("none", DraftConstruction::Greedy, Verifier::Greedy),
    ];
    let batcher = engine::model::Batcher::new();
    let counts: Vec<Vec<u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .iter()
            .map(|&(name, c, v)| {
                let (batcher, target, other) = (&batcher, &target, &other);
                scope.spawn(move || {
                    let mut generator = Generator::new(target, Some(other), 64).unwrap();
                    generator.set_prefix_reuse(true);
                    let config = |seed| match name {
                        "none" => engine::decode::GenerationConfig {
                            speculative: None,
                            ..common::two_tokens(seed, warp, DraftTree::preset("chain-1").unwrap().into(), c, v, None)
                        },
                        _ => common::two_tokens(seed, warp, DraftTree::preset(name).unwrap().into(), c, v, None),
                    };
                    common::two_token_counts_batched(
                        Some(batcher),
                        &mut generator,
                        &SMALL_PROMPT,
                        5,
                        4000,
                        config,
                        |_| {},
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((name, c, v), counts) in cases.iter().zip(&counts) {
        common::assert_follows_law(counts, &law, 4000, None, &format!("batched {name} {c}+{v}"));
    }
    let stats = batcher.stats();
    // Their steps differ (drafts and target, of different depths): forwards of one model meet
    // in some rounds only.
    assert!(stats.widest >= 2 && stats.requests > stats.batches + stats.batches / 10, "{stats:?}");
}

/// The detection limits the chi-square tests state: with 4,000 draws over 25 cells (24 degrees
/// of freedom) a test catches every law at total variation 0.059 or more from the target's with
/// probability 0.9; with [`common::DRAWS_1PCT`] draws, every law at 0.01 or more. Checked
/// against a simulation of the test on a shifted law.
#[test]
fn chi_square_detection_limits_are_as_stated() {
    // The limits the tests' documentation states, at 24 degrees of freedom (25 cells; fewer
    // cells detect smaller errors at the same draws).
    let at = |draws| (common::detectable_tv(draws, 24) * 1000.0).round() / 1000.0;
    assert_eq!(at(4000), 0.059);
    assert_eq!(at(common::DRAWS_1PCT), 0.01);
    assert!(
        common::detectable_tv(common::DRAWS_1PCT, 24) <= 0.01
            && common::detectable_tv(common::DRAWS_1PCT - 1000, 24) > 0.01
    );
    assert_eq!(common::draws_to_detect(0.01, 24), common::DRAWS_1PCT);
    // Fewer degrees of freedom (pooled cells, top-k) only lower the limit.
    for df in [8, 15, 23] {
        assert!(common::detectable_tv(4000, df) < common::detectable_tv(4000, 24));
    }
    // Power: a shift of exactly the stated size is caught about 9 times in 10, by simulation of
    // Pearson's statistic on a law shifted by TV 0.059 in proportion to p (Cauchy-Schwarz's case).
    let p: Vec<f64> = (1..=25).map(|i| i as f64).collect::<Vec<_>>();
    let total: f64 = p.iter().sum();
    let p: Vec<f64> = p.iter().map(|x| x / total).collect();
    let delta = common::detectable_tv(4000, 24);
    // Half of the mass (by p) scaled up, half down, by 2 delta: TV = delta.
    let mut order: Vec<usize> = (0..25).collect();
    order.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap());
    let (mut up, mut mass) = (vec![false; 25], 0.0);
    for &i in &order {
        if mass < 0.5 {
            up[i] = true;
            mass += p[i];
        }
    }
    let m_up: f64 = (0..25).filter(|&i| up[i]).map(|i| p[i]).sum();
    let q: Vec<f64> = (0..25)
        .map(|i| if up[i] { p[i] * (1.0 + delta / m_up) } else { p[i] * (1.0 - delta / (1.0 - m_up)) })
        .collect();
    let tv: f64 = p.iter().zip(&q).map(|(a, b)| (a - b).abs()).sum::<f64>() / 2.0;
    assert!((tv - delta).abs() < 1e-12);
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let cdf: Vec<f64> = q
        .iter()
        .scan(0.0, |s, x| {
            *s += x;
            Some(*s)
        })
        .collect();
    let trials = 400;
    let mut caught = 0;
    for _ in 0..trials {
        let mut counts = vec![0u64; 25];
        for _ in 0..4000 {
            let u: f64 = rng.random();
            counts[cdf.iter().position(|&c| u < c).unwrap_or(24)] += 1;
        }
        let (stat, _, df) = common::pearson(&counts, &p, 4000);
        caught += (samplers::stats::chi_square_p_value(stat, df) <= common::P_VALUE) as usize;
    }
    // Binomial(400, 0.9): at least 4.5 standard deviations (6 draws each) below 360. The bound
    // is tight for this shape (up to the cells' granularity); others are caught more often.
    assert!((330..=395).contains(&caught), "caught {caught} of {trials}");
}
