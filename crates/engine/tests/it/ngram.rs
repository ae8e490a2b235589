//! N-gram (prompt lookup) drafting on tiny random models, alone and before a draft model or
//! EAGLE head (`DraftSource::NgramFirst`): lossless at temperature 0 (token for token) and
//! above (chi-square of the first two tokens against the exact law), and refused clearly where
//! it cannot apply.

use crate::common;

use common::{load_on_test_device, temp_dir, Tiny, TinyEagle};
use engine::decode::draft::ngram::NgramConfig;
use engine::decode::{DraftSource, GenerationConfig, Generator, Randomness, SpecConfig, TreeChoice};
use engine::model::eagle::EagleHead;
use engine::model::DecoderModel;
use engine::DraftTree;
use samplers::dist::Warp;
use samplers::{DraftConstruction, Verifier, VALID_PAIRS};

fn model(tiny: Tiny, name: &str) -> DecoderModel {
    load_on_test_device(&tiny.write_hf(&temp_dir(name)))
}

fn ngram_spec(tree: impl Into<TreeChoice>, min: usize, max: usize) -> SpecConfig {
    SpecConfig {
        tree: tree.into(),
        construction: DraftConstruction::TopK,
        verifier: Verifier::TopK,
        draft_warp: None,
        confidence_cutoff: 0.0,
        source: DraftSource::Ngram(NgramConfig { min, max }),
    }
}

/// Temperature 0: n-gram speculative output equals plain decoding token for token for every
/// preset tree and several suffix lengths, with no draft model loaded. The prompt repeats
/// itself and random tiny models fall into loops, so lookups find matches and some drafts are
/// accepted (asserted, so the test exercises acceptance and rejection both).
#[test]
fn temperature_zero_ngram_equals_plain_decoding() {
    let target = model(Tiny { scale: 0.8, ..Tiny::llama(41) }, "ngram-t0");
    let prompt = [7u32, 3, 30, 12, 5, 7, 3, 30, 9, 7, 3];
    let base = common::greedy(48, 1);
    let mut generator = Generator::new(&target, None, 200).unwrap();
    let (reference, _) = generator.generate(&prompt, &base, |_| false, |_| Ok(())).unwrap();
    assert_eq!(reference.len(), 48);
    let (mut drafted, mut accepted, mut runs) = (0, 0, 0);
    for name in ["chain-1", "chain-4", "drafts-2-depth-4", "drafts-3-depth-2", "mc_sim_7b_63"] {
        for (min, max) in [(1, 1), (1, 4), (2, 4), (3, 3)] {
            let config = GenerationConfig {
                speculative: Some(ngram_spec(DraftTree::preset(name).unwrap(), min, max)),
                ..base.clone()
            };
            let what = format!("{name} ngram {min}-{max}");
            let (out, stats) = common::generate_streamed(&mut generator, &prompt, &config, &what);
            assert_eq!(out, reference, "{what}");
            assert_eq!(stats.draft_forwards, 0, "no draft model runs");
            drafted += (stats.target_rows > stats.target_forwards) as usize;
            accepted += (stats.tau > 1.0) as usize;
            runs += 1;
        }
    }
    assert_eq!(runs, 20);
    assert!(drafted >= 15, "only {drafted} of {runs} generations drafted anything");
    assert!(accepted >= 10, "only {accepted} of {runs} generations accepted a draft");
}

/// Temperature 1 (and 0.8 with top-k 4): the first two tokens after a prompt whose suffix
/// recurs follow the exact autoregressive law. The suffix `1 4` occurred twice, continuing
/// `2 3` and `0 3`: on `drafts-2-depth-2` the first step drafts both, on `chain-2` the most
/// recent. Pearson chi-square over the
/// cells of a 5-token vocabulary, 4,000 generations per configuration with seeds 0..3999;
/// fails below a p-value of 1e-4. Some generations must accept a draft and some none. Each catches any error of 0.059 or more in total variation (probability 0.9,
/// `common::detectable_tv`; fewer cells, less), and drafts must be accepted in at least 1% of
/// the generations (`common::two_token_counts`).
#[test]
fn lookup_alone_first_two_tokens_follow_the_target_law() {
    let target = model(Tiny { vocab: 5, scale: 1.0, layers: 2, ..Tiny::qwen2(31) }, "ngram-chi");
    let prompt = [1u32, 4, 0, 3, 1, 4, 2, 3, 1, 4];
    let mut generator = Generator::new(&target, None, 64).unwrap();
    let configs = [
        ("chain-2", Warp::temperature(1.0)),
        ("drafts-2-depth-2", Warp::temperature(1.0)),
        ("drafts-2-depth-2", Warp { temperature: 0.8, top_k: 4, top_p: 1.0, min_p: 0.0 }),
    ];
    for (name, warp) in configs {
        let law = common::two_token_law(&target, &prompt, warp);
        let tree = DraftTree::preset(name).unwrap();
        let draws = 4000;
        let (mut accepted, mut rejected) = (0, 0);
        let config = |seed| GenerationConfig {
            max_new_tokens: 2,
            warp,
            seed,
            randomness: Randomness::Stream,
            speculative: Some(ngram_spec(tree.clone(), 1, 2)),
        };
        let counts = common::two_token_counts(&mut generator, &prompt, 5, draws, config, |s| {
            if s.acceptance_per_depth.first().copied().unwrap_or(0.0) > 0.0 {
                accepted += 1;
            } else {
                rejected += 1;
            }
        });
        common::assert_follows_law(&counts, &law, draws, None, &format!("ngram {name} {warp:?}"));
        assert!(accepted > 100 && rejected > 100, "{name}: {accepted} generations accepted a draft, {rejected} none");
    }
}

/// What n-gram drafting cannot do is refused with an error naming it.
#[test]
fn ngram_refuses_what_does_not_apply() {
    let target = model(Tiny::llama(43), "ngram-bad");
    let mut generator = Generator::new(&target, None, 64).unwrap();
    let prompt = [1u32, 2, 1];
    let tree = || DraftTree::preset("chain-2").unwrap();
    let run = |g: &mut Generator, spec: SpecConfig| {
        let config = GenerationConfig {
            max_new_tokens: 4,
            warp: Warp::temperature(0.0),
            seed: 0,
            randomness: Randomness::Stream,
            speculative: Some(spec),
        };
        g.generate(&prompt, &config, |_| false, |_| Ok(())).map(|_| ()).unwrap_err().to_string()
    };
    let e = run(&mut generator, SpecConfig { verifier: Verifier::Rrs, ..ngram_spec(tree(), 1, 2) });
    assert!(e.contains("deterministic") && e.contains("topk"), "{e}");
    let e = run(&mut generator, ngram_spec(TreeChoice::Auto, 1, 2));
    assert!(e.contains("fixed tree"), "{e}");
    let e = run(&mut generator, SpecConfig { draft_warp: Some(Warp::temperature(1.0)), ..ngram_spec(tree(), 1, 2) });
    assert!(e.contains("no draft distribution"), "{e}");
    let e = run(&mut generator, SpecConfig { confidence_cutoff: 0.5, ..ngram_spec(tree(), 1, 2) });
    assert!(e.contains("no draft distribution"), "{e}");
    let e = run(&mut generator, ngram_spec(tree(), 3, 2));
    assert!(e.contains("n-gram") && e.contains("min"), "{e}");
    // Without n-gram drafting, a generator without a draft cannot speculate.
    let e = run(&mut generator, SpecConfig { source: engine::decode::DraftSource::Model, ..ngram_spec(tree(), 1, 2) });
    assert!(e.contains("needs a draft model"), "{e}");
}

fn ngram_first(tree: impl Into<TreeChoice>, c: DraftConstruction, v: Verifier, ngram_tree: &str) -> SpecConfig {
    SpecConfig {
        tree: tree.into(),
        construction: c,
        verifier: v,
        draft_warp: None,
        confidence_cutoff: 0.0,
        source: DraftSource::NgramFirst {
            ngram: NgramConfig { min: 1, max: 3 },
            tree: DraftTree::preset(ngram_tree).unwrap(),
        },
    }
}

/// Temperature 0, n-gram steps before a draft model and before an EAGLE head: the output
/// equals plain decoding for every valid pair that can draw the model's trees (fixed and
/// `auto`), with n-gram steps on a chain and on a two-way tree. Steps of both kinds must occur.
#[test]
fn temperature_zero_ngram_first_equals_plain_decoding() {
    let tiny = Tiny { scale: 0.8, ..Tiny::llama(45) };
    let target = model(tiny, "ngram-first-target");
    let draft = model(Tiny { layers: 1, ..Tiny { scale: 0.8, ..Tiny::llama(46) } }, "ngram-first-draft");
    let head_spec = TinyEagle { target: tiny, seed: 47, own_embedding: false, scale: 0.3 };
    let head = EagleHead::load(&head_spec.write(&temp_dir("ngram-first-head"), false), &target).unwrap();
    let prompt = [7u32, 3, 30, 12, 5, 7, 3, 30, 9, 7, 3];
    let base = common::greedy(40, 1);
    let (reference, _) =
        Generator::new(&target, None, 200).unwrap().generate(&prompt, &base, |_| false, |_| Ok(())).unwrap();
    let mut with_draft = Generator::new(&target, Some(&draft), 200).unwrap();
    let mut with_head = Generator::with_eagle(&target, &head, 200).unwrap();
    let (mut mixed, mut runs) = (0, 0);
    for (source, g) in [("draft", &mut with_draft), ("eagle", &mut with_head)] {
        for (model_tree, ngram_tree) in
            [("chain-2", "chain-4"), ("drafts-2-depth-2", "drafts-2-depth-3"), ("auto", "chain-3")]
        {
            for &(c, v) in VALID_PAIRS {
                let tree: TreeChoice = match model_tree {
                    "auto" if c == DraftConstruction::SpecHub => continue,
                    "auto" => TreeChoice::Auto,
                    name => DraftTree::preset(name).unwrap().into(),
                };
                if c == DraftConstruction::SpecHub && model_tree == "chain-2" {
                    continue;
                }
                let config =
                    GenerationConfig { speculative: Some(ngram_first(tree, c, v, ngram_tree)), ..base.clone() };
                let (out, stats) = g.generate(&prompt, &config, |_| false, |_| Ok(())).unwrap();
                assert_eq!(out, reference, "{source}: {model_tree} / ngram {ngram_tree}, {c}+{v}");
                mixed += (stats.ngram_steps > 0 && stats.ngram_steps < stats.target_forwards) as usize;
                runs += 1;
            }
        }
    }
    assert!(runs > 40, "{runs} runs");
    assert!(mixed * 2 > runs, "only {mixed} of {runs} generations had both n-gram and model steps");
}

/// Temperature 1, n-gram steps before a draft model or an EAGLE head: the first two tokens
/// follow the exact law (chi-square as in `lookup_alone_first_two_tokens_follow_the_target_law`,
/// 4,000 generations per case; each catches any error of 0.059 or more in total variation with
/// probability 0.9). The prompt's suffix recurs, so the first step drafts by lookup;
/// when its drafts are rejected the second step's context may have no match, and the draft
/// model or head drafts it (the head from the target's features of the lookup step).
#[test]
fn lookup_then_model_first_two_tokens_follow_the_target_law() {
    let tiny = Tiny { vocab: 5, scale: 1.0, layers: 2, ..Tiny::qwen2(31) };
    let target = model(tiny, "ngram-first-chi");
    let draft = model(Tiny { vocab: 5, scale: 1.0, layers: 1, ..Tiny::qwen2(32) }, "ngram-first-chi-draft");
    let head_spec = TinyEagle { target: tiny, seed: 74, own_embedding: true, scale: 0.1 };
    let head = EagleHead::load(&head_spec.write(&temp_dir("ngram-first-chi-head"), false), &target).unwrap();
    let prompt = [1u32, 4, 0, 3, 1, 4, 2, 3, 1, 4];
    let mut with_draft = Generator::new(&target, Some(&draft), 64).unwrap();
    let mut with_head = Generator::with_eagle(&target, &head, 64).unwrap();
    let warp = Warp::temperature(1.0);
    let law = common::two_token_law(&target, &prompt, warp);
    let cases = [
        ("draft model", DraftConstruction::WithoutReplacement, Verifier::Rrs),
        ("draft model", DraftConstruction::Greedy, Verifier::Greedy),
        ("EAGLE head", DraftConstruction::WithoutReplacement, Verifier::Rrs),
    ];
    for (source, c, v) in cases {
        let generator = if source == "EAGLE head" { &mut with_head } else { &mut with_draft };
        let tree = DraftTree::preset("drafts-2-depth-1").unwrap();
        let (mut lookup_only, mut with_model) = (0, 0);
        let config = |seed| GenerationConfig {
            max_new_tokens: 2,
            warp,
            seed,
            randomness: Randomness::Stream,
            speculative: Some(SpecConfig {
                source: DraftSource::NgramFirst {
                    ngram: NgramConfig { min: 2, max: 2 },
                    tree: DraftTree::preset("drafts-2-depth-2").unwrap(),
                },
                ..ngram_first(tree.clone(), c, v, "chain-1")
            }),
        };
        let counts = common::two_token_counts(generator, &prompt, 5, 4000, config, |s| {
            if s.ngram_steps == s.target_forwards {
                lookup_only += 1;
            } else {
                with_model += 1;
            }
        });
        let what = format!("ngram first, then the {source} with {c}+{v}");
        common::assert_follows_law(&counts, &law, 4000, None, &what);
        assert!(
            lookup_only > 100 && with_model > 100,
            "{what}: {lookup_only} lookup-only, {with_model} with a model step"
        );
    }
}
