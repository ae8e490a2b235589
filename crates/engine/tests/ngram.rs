//! N-gram (prompt lookup) drafting on tiny random models: lossless at temperature 0 (token for
//! token) and above (chi-square of the first two tokens against the exact law), and refused
//! clearly where it cannot apply.

mod common;

use common::{load_on_test_device, temp_dir, Tiny};
use engine::decode::{DraftSource, GenerationConfig, Generator, SpecConfig, TreeChoice};
use engine::model::DecoderModel;
use engine::ngram::NgramConfig;
use engine::DraftTree;
use samplers::dist::Warp;
use samplers::{DraftConstruction, Verifier};

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
    let base = GenerationConfig { max_new_tokens: 48, warp: Warp::temperature(0.0), seed: 1, speculative: None };
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
            let mut streamed = Vec::new();
            let (out, stats) = generator
                .generate(
                    &prompt,
                    &config,
                    |_| false,
                    |t| {
                        streamed.extend_from_slice(t);
                        Ok(())
                    },
                )
                .unwrap();
            assert_eq!(out, reference, "{name} ngram {min}-{max}");
            assert_eq!(streamed, out, "{name} ngram {min}-{max}: streamed tokens");
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
/// fails below a p-value of 1e-4. Some generations must accept a draft and some none.
#[test]
fn ngram_first_two_tokens_follow_the_target_law() {
    let target = model(Tiny { vocab: 5, scale: 1.0, layers: 2, ..Tiny::qwen2(31) }, "ngram-chi");
    let prompt = [1u32, 4, 0, 3, 1, 4, 2, 3, 1, 4];
    let mut generator = Generator::new(&target, None, 64).unwrap();
    let configs = [
        ("chain-2", Warp::temperature(1.0)),
        ("drafts-2-depth-2", Warp::temperature(1.0)),
        ("drafts-2-depth-2", Warp { temperature: 0.8, top_k: 4, top_p: 1.0 }),
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
        let config =
            GenerationConfig { max_new_tokens: 4, warp: Warp::temperature(0.0), seed: 0, speculative: Some(spec) };
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
