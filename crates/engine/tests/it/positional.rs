//! `Randomness::Positional` on tiny random models: speculative decoding emits exactly the
//! tokens plain decoding with the same seed emits, at any temperature, whatever drafts them;
//! and those tokens follow the target's law.

use crate::common;

use common::{load_on_test_device, temp_dir, Tiny, TinyEagle};
use engine::decode::draft::ngram::NgramConfig;
use engine::decode::draft::window::DraftWindow;
use engine::decode::{DraftSource, GenerationConfig, Generator, Randomness, SpecConfig, Stats, TreeChoice};
use engine::model::eagle::EagleHead;
use engine::model::DecoderModel;
use engine::DraftTree;
use samplers::dist::Warp;
use samplers::{DraftConstruction, Verifier};

fn model(tiny: Tiny, name: &str) -> DecoderModel {
    load_on_test_device(&tiny.write_hf(&temp_dir(name)))
}

fn plain(max_new_tokens: usize, warp: Warp, seed: u64) -> GenerationConfig {
    GenerationConfig { max_new_tokens, warp, seed, randomness: Randomness::Positional, speculative: None }
}

/// A speculative configuration; the construction and verifier named are the defaults, which
/// positional randomness replaces by its races.
fn spec(tree: impl Into<TreeChoice>, draft_warp: Option<Warp>, cutoff: f64, source: DraftSource) -> SpecConfig {
    SpecConfig {
        tree: tree.into(),
        construction: DraftConstruction::Greedy,
        verifier: Verifier::Greedy,
        draft_warp,
        confidence_cutoff: cutoff,
        source,
    }
}

/// The warps every equality test runs: plain temperature, nucleus, top-k, and argmax.
fn warps() -> [Warp; 4] {
    [
        Warp::temperature(1.0),
        Warp { temperature: 0.7, top_k: 0, top_p: 0.9, min_p: 0.0 },
        Warp { temperature: 1.2, top_k: 8, top_p: 1.0, min_p: 0.0 },
        Warp::temperature(0.0),
    ]
}

/// Runs every configuration of `configs` against plain decoding with the same seed and warp:
/// the tokens must be equal (streamed ones too). Returns the statistics of every run.
fn assert_equal_to_plain(
    generator: &mut Generator,
    reference_model: &DecoderModel,
    prompt: &[u32],
    configs: &[(&str, SpecConfig, Option<DraftWindow>)],
) -> Vec<Stats> {
    let mut all = Vec::new();
    let mut plain_texts = Vec::new();
    for warp in warps() {
        for seed in 0..3 {
            let base = plain(40, warp, seed);
            let (reference, _) = Generator::new(reference_model, None, 200)
                .unwrap()
                .generate(prompt, &base, |_| false, |_| Ok(()))
                .unwrap();
            assert_eq!(reference.len(), 40);
            plain_texts.push(reference.clone());
            for (name, s, window) in configs {
                generator.set_draft_window(*window);
                let config = GenerationConfig { speculative: Some(s.clone()), ..base.clone() };
                let what = format!("{name}, warp {warp:?}, seed {seed}");
                let (out, stats) = common::generate_streamed(generator, prompt, &config, &what);
                assert_eq!(out, reference, "{what}");
                all.push(stats);
            }
        }
    }
    // The seed matters: at temperature 1 the three seeds give three texts.
    assert!(plain_texts[0] != plain_texts[1] && plain_texts[1] != plain_texts[2], "seeds give equal texts");
    all
}

/// With a draft model: chains, multi-draft trees, EAGLE's sparse tree, `--tree auto` (seeded
/// to favour wide trees), a sliding draft window, confidence pruning, and n-gram lookup before
/// the model, at four warps and three seeds, 40 new tokens: every text equals plain
/// decoding's. The draft is the target itself at a hotter temperature (so that drafts are
/// often accepted, which the test requires) and an unrelated one-layer model.
#[test]
fn speculative_text_equals_plain_text() {
    let target = model(Tiny { scale: 0.8, ..Tiny::llama(81) }, "positional-target");
    let other = model(Tiny { scale: 0.8, layers: 1, ..Tiny::llama(82) }, "positional-draft");
    let prompt: Vec<u32> = (0..14u32).map(|i| (i * 7 + 3) % 32).collect();
    let hot = Some(Warp::temperature(1.5));
    let window = DraftWindow::new(1, 4).ok();
    let ngram =
        DraftSource::NgramFirst { ngram: NgramConfig { min: 1, max: 3 }, tree: DraftTree::preset("chain-3").unwrap() };
    let tree = |name| DraftTree::preset(name).unwrap();
    let configs = [
        ("chain-4", spec(tree("chain-4"), hot, 0.0, DraftSource::Model), None),
        ("drafts-2-depth-4", spec(tree("drafts-2-depth-4"), hot, 0.0, DraftSource::Model), None),
        ("mc_sim_7b_63", spec(tree("mc_sim_7b_63"), None, 0.0, DraftSource::Model), None),
        ("auto", spec(TreeChoice::Auto, hot, 0.0, DraftSource::Model), None),
        ("chain-4, window 1+4", spec(tree("chain-4"), hot, 0.0, DraftSource::Model), window),
        ("drafts-3-depth-2, cutoff 0.2", spec(tree("drafts-3-depth-2"), hot, 0.2, DraftSource::Model), None),
        ("n-gram first", spec(tree("drafts-2-depth-2"), hot, 0.0, ngram), None),
    ];
    let mut accepted = [0usize; 2];
    for (d, draft) in [&target, &other].into_iter().enumerate() {
        let mut generator = Generator::new(&target, Some(draft), 200).unwrap();
        *generator.auto_tree_mut() = Some(common::auto_favouring_wide_trees());
        let stats = assert_equal_to_plain(&mut generator, &target, &prompt, &configs);
        accepted[d] = stats.iter().map(|s| s.new_tokens - s.target_forwards.min(s.new_tokens)).sum();
    }
    // The target as its own (hotter) draft confirms many tokens per forward: 1,788 drafts
    // accepted here, against 1,218 when (as a check of this test) the drafts raced on the noise
    // of the position after theirs, and 280 with the unrelated draft.
    assert!(accepted[0] > 1500, "accepted drafts: {accepted:?}");
}

/// A node with more children than positional races draw is refused before anything runs.
#[test]
fn too_wide_a_tree_is_an_error() {
    let target = model(Tiny { scale: 0.8, ..Tiny::llama(88) }, "positional-wide-target");
    let mut generator = Generator::new(&target, Some(&target), 200).unwrap();
    let wide = spec(DraftTree::preset("drafts-65-depth-1").unwrap(), None, 0.0, DraftSource::Model);
    let config = GenerationConfig { speculative: Some(wide), ..plain(4, Warp::temperature(1.0), 0) };
    let err = generator.generate(&[1, 2, 3], &config, |_| false, |_| Ok(())).unwrap_err().to_string();
    assert!(err.contains("at most 64 drafts per node") && err.contains("65 children"), "{err}");
}

/// With an EAGLE head: chains, trees and the sparse tree, same warps and seeds.
#[test]
fn eagle_text_equals_plain_text() {
    let tiny = Tiny { vocab: 12, scale: 0.8, ..Tiny::llama(83) };
    let target = load_on_test_device(&tiny.write_hf(&temp_dir("positional-eagle-target")));
    let head_spec = TinyEagle { target: tiny, seed: 84, own_embedding: false, scale: 0.5 };
    let head = EagleHead::load(&head_spec.write(&temp_dir("positional-eagle-head"), false), &target).unwrap();
    let mut generator = Generator::with_eagle(&target, &head, 200).unwrap();
    let tree = |name| DraftTree::preset(name).unwrap();
    let configs = [
        ("chain-3", spec(tree("chain-3"), None, 0.0, DraftSource::Model), None),
        ("drafts-3-depth-2", spec(tree("drafts-3-depth-2"), None, 0.0, DraftSource::Model), None),
        ("mc_sim_7b_63", spec(tree("mc_sim_7b_63"), None, 0.0, DraftSource::Model), None),
    ];
    let stats = assert_equal_to_plain(&mut generator, &target, &[5, 1, 7, 3], &configs);
    assert!(stats.iter().any(|s| s.tau > 1.0), "no EAGLE generation accepted a draft");
}

/// Temperature 1: the first two tokens follow the exact autoregressive law of the target, for
/// plain decoding and for speculative decoding (a draft model on a chain and on a 2 x 2 tree,
/// and an EAGLE head on the 2 x 2 tree), over seeds 0..4,000. Pearson chi-square over the 25
/// cells of a 5-token vocabulary (those expecting fewer than 5 pooled); fails below a p-value
/// of 1e-4. Each catches any error of 0.059 or more in total variation (probability 0.9,
/// `common::detectable_tv`; fewer cells, less), and drafts must be accepted in at least 1% of
/// the generations (`common::two_token_counts`).
#[test]
fn first_two_tokens_follow_the_target_law() {
    let small = |seed, layers| Tiny { vocab: 5, scale: 1.0, layers, ..Tiny::qwen2(seed) };
    let tiny = small(85, 2);
    let target = model(tiny, "positional-chi-target");
    let draft = model(small(86, 1), "positional-chi-draft");
    let head_spec = TinyEagle { target: tiny, seed: 87, own_embedding: true, scale: 0.1 };
    let head = EagleHead::load(&head_spec.write(&temp_dir("positional-chi-head"), true), &target).unwrap();
    let prompt = [1u32, 4, 0];
    let warp = Warp::temperature(1.0);
    let law = common::two_token_law(&target, &prompt, warp);
    let draws = 4000;
    let counts = common::two_token_counts(
        &mut Generator::new(&target, None, 64).unwrap(),
        &prompt,
        5,
        draws,
        |seed| plain(2, warp, seed),
        |_| {},
    );
    common::assert_follows_law(&counts, &law, draws, Some(25), "plain");
    let mut with_draft = Generator::new(&target, Some(&draft), 64).unwrap();
    let mut with_head = Generator::with_eagle(&target, &head, 64).unwrap();
    for (what, eagle, tree) in [
        ("draft model, chain-2", false, "chain-2"),
        ("draft model, drafts-2-depth-2", false, "drafts-2-depth-2"),
        ("EAGLE head, drafts-2-depth-2", true, "drafts-2-depth-2"),
    ] {
        let generator = if eagle { &mut with_head } else { &mut with_draft };
        let tree = DraftTree::preset(tree).unwrap();
        let mut accepted = 0;
        let config = |seed| GenerationConfig {
            speculative: Some(spec(tree.clone(), None, 0.0, DraftSource::Model)),
            ..plain(2, warp, seed)
        };
        let counts = common::two_token_counts(generator, &prompt, 5, draws, config, |s| {
            accepted += (s.tau > 1.0) as usize;
        });
        assert!(accepted > 100, "{what}: only {accepted} of {draws} generations accepted a draft");
        common::assert_follows_law(&counts, &law, draws, Some(25), what);
    }
}
