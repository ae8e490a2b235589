//! The decoding loop on tiny random models: speculative decoding is lossless.

use crate::common;

use common::{load_on_test_device, temp_dir, Tiny};
use engine::decode::auto_tree::AutoTree;
use engine::decode::{GenerationConfig, Generator, Randomness, SpecConfig, TreeChoice};
use engine::model::DecoderModel;
use engine::DraftTree;
use samplers::dist::Warp;
use samplers::{DraftConstruction, VALID_PAIRS};

pub(crate) fn model(tiny: Tiny, name: &str) -> DecoderModel {
    load_on_test_device(&tiny.write_hf(&temp_dir(name)))
}

fn spechub_fits(c: DraftConstruction, tree: &DraftTree) -> bool {
    c != DraftConstruction::SpecHub || (0..tree.len()).all(|i| [0, 2].contains(&tree.children(i).len()))
}

const PROMPT: [u32; 4] = [7, 3, 30, 12];
/// Prompt for the 5-token models.
pub(crate) const SMALL_PROMPT: [u32; 3] = [1, 4, 0];

/// Temperature 0: speculative output equals `--no-spec` output token for token, for every
/// preset tree and every valid construction/verifier pair (target and draft are different
/// random models, so drafts are often rejected).
#[test]
fn temperature_zero_speculative_equals_plain_decoding() {
    let (target, draft, base, reference) = greedy_setup("t0");
    let mut generator = Generator::new(&target, Some(&draft), 200).unwrap();
    let mut accepted_somewhere = 0;
    // The draft's q warped like the target's (one-hot: one draft per node) or kept at
    // temperature 1 (distinct drafts on every branch); both must give the greedy output.
    let trees = ["chain-1", "chain-4", "chain-3-forks-3", "drafts-2-depth-4", "drafts-3-depth-2", "mc_sim_7b_63"];
    let cases = [None, Some(Warp::temperature(1.0))].into_iter().flat_map(|w| trees.into_iter().map(move |n| (w, n)));
    for (draft_warp, name) in cases {
        let tree = DraftTree::preset(name).unwrap();
        for &(c, v) in VALID_PAIRS {
            if !spechub_fits(c, &tree) {
                continue;
            }
            let config = GenerationConfig {
                speculative: Some(common::spec(tree.clone(), c, v, draft_warp, 0.0)),
                ..base.clone()
            };
            let what = format!("{name} {c}+{v}");
            let (out, stats) = common::generate_streamed(&mut generator, &PROMPT, &config, &what);
            assert_eq!(out, reference, "{what}");
            assert!(stats.target_forwards <= 40, "{name} {c}+{v}: {} target forwards", stats.target_forwards);
            if stats.tau > 1.0 {
                accepted_somewhere += 1;
            }
        }
    }
    assert!(accepted_somewhere > 0, "no configuration ever accepted a draft: the test would not exercise acceptance");
}

/// With the draft equal to the target, temperature 0 accepts every draft of a chain.
#[test]
fn identical_draft_accepts_whole_chains() {
    let target = model(Tiny::qwen2(23), "same");
    let mut generator = Generator::new(&target, Some(&target), 200).unwrap();
    let tree = DraftTree::preset("chain-4").unwrap();
    let config = GenerationConfig {
        max_new_tokens: 25,
        warp: Warp::temperature(0.0),
        seed: 0,
        randomness: Randomness::Stream,
        speculative: Some(SpecConfig {
            tree: tree.into(),
            construction: DraftConstruction::Greedy,
            verifier: samplers::Verifier::Greedy,
            draft_warp: None,
            confidence_cutoff: 0.0,
            source: engine::decode::DraftSource::Model,
        }),
    };
    let (out, stats) = generator.generate(&PROMPT, &config, |_| false, |_| Ok(())).unwrap();
    assert_eq!(out.len(), 25);
    assert_eq!(stats.target_forwards, 5);
    assert_eq!(stats.acceptance_per_depth, vec![1.0; 4]);
}

/// Exact law of the first two tokens after `SMALL_PROMPT` under the warped target.
/// Drafts with replacement repeat tokens; a repeat gets no tree node. At temperature 0 every
/// draft at a node is the argmax, so a full tree costs the target no more rows than a chain,
/// and the output is still the plain greedy output.
#[test]
fn repeated_drafts_get_no_tree_nodes() {
    let target = model(Tiny::llama(21), "dup-target");
    let draft = model(Tiny { layers: 1, ..Tiny::llama(22) }, "dup-draft");
    let prompt = [3u32, 14, 15, 9, 2, 6];
    let mut generator = Generator::new(&target, Some(&draft), 128).unwrap();
    let plain = common::greedy(24, 0);
    let (want, _) = generator.generate(&prompt, &plain, |_| false, |_| Ok(())).unwrap();
    for v in [samplers::Verifier::Rrs, samplers::Verifier::KSeq] {
        let tree = DraftTree::preset("drafts-3-depth-3").unwrap();
        let spec = SpecConfig {
            tree: tree.into(),
            construction: DraftConstruction::WithReplacement,
            verifier: v,
            draft_warp: None,
            confidence_cutoff: 0.0,
            source: engine::decode::DraftSource::Model,
        };
        let config = GenerationConfig { speculative: Some(spec), ..plain.clone() };
        let (got, stats) = generator.generate(&prompt, &config, |_| false, |_| Ok(())).unwrap();
        assert_eq!(got, want, "{v}");
        // Root plus at most one node per depth, instead of 1 + 3 + 9 + 27.
        assert!(
            stats.target_rows <= 4 * stats.target_forwards,
            "{v}: {} rows in {} steps",
            stats.target_rows,
            stats.target_forwards
        );
        assert!(stats.target_rows > stats.target_forwards);
    }
}

/// The min-p case of `chi_square::first_two_tokens_follow_the_target_law`.
pub(crate) const MIN_P: Warp = Warp { temperature: 3.0, top_k: 0, top_p: 1.0, min_p: 0.2 };

pub(crate) fn two_token_law(target: &DecoderModel, warp: Warp) -> Vec<f64> {
    common::two_token_law(target, &SMALL_PROMPT, warp)
}

/// `--tree auto` at temperature 0: whatever tree each step picks (from real timings of these
/// tiny models), the output is the plain greedy output, for every pair that can draw chains.
#[test]
fn auto_tree_at_temperature_zero_equals_plain_decoding() {
    let (target, draft, base, reference) = greedy_setup("auto-t0");
    let mut generator = Generator::new(&target, Some(&draft), 200).unwrap();
    let drafted = common::assert_auto_equals_plain(&mut generator, &PROMPT, &base, &reference);
    // Even when plain steps win on cost, one step in 16 drafts (40 tokens: at least twice).
    assert!(drafted > 0, "no generation with --tree auto ever drafted");
}

/// `--tree auto` measures the forward costs only for a generation that takes steps: a prompt
/// run with `max_new_tokens` 0 (scored, not continued) leaves them unmeasured, and the next
/// generation measures them. A generation at another temperature (other candidate trees: wider
/// ones once the draft keeps a temperature) keeps them and measures only the row counts it adds.
#[test]
fn auto_tree_measures_costs_only_when_it_generates_and_keeps_them() {
    let (target, draft, _, _) = greedy_setup("auto-no-steps");
    let mut generator = Generator::new(&target, Some(&draft), 200).unwrap();
    let config = |max_new_tokens, temperature| GenerationConfig {
        max_new_tokens,
        ..common::two_tokens(
            1,
            Warp::temperature(temperature),
            TreeChoice::Auto,
            DraftConstruction::Greedy,
            samplers::Verifier::Greedy,
            None,
        )
    };
    let (out, stats) = generator.generate(&PROMPT, &config(0, 0.0), |_| false, |_| Ok(())).unwrap();
    assert!(out.is_empty());
    assert_eq!(stats.auto_costs_s, 0.0);
    let measured = |g: &mut Generator, rows: usize| g.auto_tree_mut().as_ref().is_some_and(|a| a.target.has(rows));
    assert!(!measured(&mut generator, 1), "costs measured for a generation of no tokens");
    let (out, stats) = generator.generate(&PROMPT, &config(3, 0.0), |_| false, |_| Ok(())).unwrap();
    assert_eq!(out.len(), 3);
    // The measurements are part of the set-up before the first step.
    assert!(stats.auto_costs_s > 0.0 && stats.auto_costs_s <= stats.prefill_s, "{stats:?}");
    let (_, again) = generator.generate(&PROMPT, &config(3, 0.0), |_| false, |_| Ok(())).unwrap();
    assert_eq!(again.auto_costs_s, 0.0, "costs measured again for the same candidates");
    // Chains of depth 1 to 6: 1, 2, 4 and 7 rows.
    assert!(measured(&mut generator, 1) && measured(&mut generator, 7), "costs not measured for 3 tokens");
    assert!(!measured(&mut generator, 15));
    let (out, stats) = generator.generate(&PROMPT, &config(3, 1.0), |_| false, |_| Ok(())).unwrap();
    assert_eq!(out.len(), 3);
    assert!(stats.auto_costs_s > 0.0, "the wider trees' rows were not measured");
    let multi = AutoTree::new(true).trees.len();
    assert_eq!(generator.auto_tree_mut().as_ref().map(|a| a.trees.len()), Some(multi));
    // The multi-draft candidates' anchors are 1, 2, 4, 8 and 15 rows; 7 comes from before.
    assert!(measured(&mut generator, 15), "the wider trees' costs were not measured");
    assert!(measured(&mut generator, 7), "the costs measured at temperature 0 were dropped");
}

/// `--tree auto` at temperature 1, with costs seeded so that drafting trees win (cheap draft,
/// flat target cost): the first two tokens follow the exact law. Chi-square as in
/// `chi_square::first_two_tokens_follow_the_target_law`: 4,000 generations, cells expecting fewer than 5
/// pooled, fails below a p-value of 1e-4. Each catches any error of 0.059 or more in total variation (probability 0.9,
/// `common::detectable_tv`; fewer cells, less), and drafts must be accepted in at least 1% of
/// the generations (`common::two_token_counts`).
#[test]
fn auto_tree_follows_the_target_law() {
    let small = |seed, layers| Tiny { vocab: 5, scale: 1.0, layers, ..Tiny::qwen2(seed) };
    let target = model(small(31, 2), "auto-chi-target");
    let draft = model(small(32, 1), "auto-chi-draft");
    let warp = Warp::temperature(1.0);
    let law = two_token_law(&target, warp);
    let mut generator = Generator::new(&target, Some(&draft), 64).unwrap();
    *generator.auto_tree_mut() = Some(common::auto_favouring_wide_trees());
    let draws = 4000;
    let config = |seed| {
        common::two_tokens(
            seed,
            warp,
            TreeChoice::Auto,
            DraftConstruction::WithoutReplacement,
            samplers::Verifier::Rrs,
            None,
        )
    };
    let mut multi_draft_steps = 0;
    let counts = common::two_token_counts(&mut generator, &SMALL_PROMPT, 5, draws, config, |stats| {
        // Trees with more than one draft at a node: full trees and forked chains.
        multi_draft_steps += (stats.auto_tree.contains("drafts-") || stats.auto_tree.contains("-forks-")) as usize;
    });
    assert!(
        multi_draft_steps > draws as usize / 2,
        "multi-draft trees were picked in only {multi_draft_steps} generations"
    );
    common::assert_follows_law(&counts, &law, draws, Some(25), "auto wor+rrs");
}

/// Confidence pruning (`--draft-confidence`): the tree shape then depends on the draft's
/// distributions along each path. At temperature 0 the output is still the plain greedy
/// output; at temperature 1 the first two tokens follow the exact law (chi-square as in
/// `chi_square::first_two_tokens_follow_the_target_law`: 4,000 generations per configuration, fails above
/// the p = 1e-4 critical value). Each catches any error of 0.059 or more in total variation (probability 0.9,
/// `common::detectable_tv`; fewer cells, less), and drafts must be accepted in at least 1% of
/// the generations (`common::two_token_counts`).
/// The cutoff is set so that some steps are pruned and some are
/// not, which the test checks from the target rows of each generation.
#[test]
fn confidence_pruned_trees_are_exact() {
    // Temperature 0, every preset that branches or chains.
    let (target, draft, base, reference) = greedy_setup("prune-t0");
    let mut generator = Generator::new(&target, Some(&draft), 200).unwrap();
    for (name, cutoff) in [("chain-4", 0.05), ("drafts-2-depth-4", 0.05), ("mc_sim_7b_63", 0.1)] {
        for (c, v) in [
            (DraftConstruction::Greedy, samplers::Verifier::Greedy),
            (DraftConstruction::TopK, samplers::Verifier::TopK),
        ] {
            let tree = DraftTree::preset(name).unwrap();
            let spec = common::spec(tree, c, v, Some(Warp::temperature(1.0)), cutoff);
            let config = GenerationConfig { speculative: Some(spec), ..base.clone() };
            let (out, _) = generator.generate(&PROMPT, &config, |_| false, |_| Ok(())).unwrap();
            assert_eq!(out, reference, "{name}@{cutoff} {c}+{v}");
        }
    }

    // Temperature 1 on the 5-token models.
    let small = |seed, layers| Tiny { vocab: 5, scale: 1.0, layers, ..Tiny::qwen2(seed) };
    let target = model(small(31, 2), "prune-chi-target");
    let draft = model(small(32, 1), "prune-chi-draft");
    let warp = Warp::temperature(1.0);
    let law = two_token_law(&target, warp);
    let mut generator = Generator::new(&target, Some(&draft), 64).unwrap();
    let cutoff = PRUNE_CUTOFF;
    for (c, v) in [
        (DraftConstruction::WithoutReplacement, samplers::Verifier::Rrs),
        (DraftConstruction::WithReplacement, samplers::Verifier::KSeq),
        (DraftConstruction::Greedy, samplers::Verifier::Greedy),
    ] {
        let tree = DraftTree::preset("drafts-2-depth-2").unwrap();
        let draws = 4000;
        let config = |seed| GenerationConfig {
            speculative: Some(common::spec(tree.clone(), c, v, None, cutoff)),
            ..common::two_tokens(seed, warp, TreeChoice::Fixed(tree.clone()), c, v, None)
        };
        let (mut pruned, mut full) = (0, 0);
        let counts = common::two_token_counts(&mut generator, &SMALL_PROMPT, 5, draws, config, |s| {
            // A step of this tree runs 7 rows unpruned (fewer with repeated drafts).
            if s.target_rows < 7 * s.target_forwards {
                pruned += 1;
            } else {
                full += 1;
            }
        });
        eprintln!("{c}+{v}@{cutoff}: {pruned} generations pruned, {full} not");
        if c == DraftConstruction::WithoutReplacement {
            assert!(
                pruned > draws / 20 && full > draws / 20,
                "{pruned} pruned, {full} full: the cutoff does not prune"
            );
        }
        common::assert_follows_law(&counts, &law, draws, None, &format!("pruned at {cutoff}: {c}+{v}"));
    }
}

/// Temperature 0 with Q4_K GGUF models on the CPU, where every product runs our repacked
/// kernel (`model::q4k_interleaved`, on AVX2 CPUs) with 1 to 26 rows: speculative output equals
/// plain decoding token for token, so a row's result does not depend on the rows beside it.
#[test]
fn quantized_models_at_temperature_zero_equal_plain_decoding() {
    use candle_core::quantized::GgmlDType;
    let dir = temp_dir("q4k-t0");
    let file = Tiny { hidden: 256, intermediate: 512, scale: 0.8, ..Tiny::llama(31) }.write_gguf(
        &dir.join("target.gguf"),
        GgmlDType::Q4K,
        &[],
    );
    // The target drafts for itself: every draft is accepted, so every tree node's row decides
    // the output, with up to 26 rows in one product.
    let (target, draft) = (common::load_cpu(&file), common::load_cpu(&file));
    let base = common::greedy(40, 1);
    let (reference, _) =
        Generator::new(&target, None, 200).unwrap().generate(&PROMPT, &base, |_| false, |_| Ok(())).unwrap();
    assert_eq!(reference.len(), 40);
    let mut generator = Generator::new(&target, Some(&draft), 200).unwrap();
    for name in ["chain-1", "chain-4", "drafts-2-depth-4", "mc_sim_7b_63"] {
        let tree = DraftTree::preset(name).unwrap();
        for (c, v) in [
            (DraftConstruction::Greedy, samplers::Verifier::Greedy),
            (DraftConstruction::WithReplacement, samplers::Verifier::Rrs),
        ] {
            let config =
                GenerationConfig { speculative: Some(common::spec(tree.clone(), c, v, None, 0.0)), ..base.clone() };
            let (out, stats) = generator.generate(&PROMPT, &config, |_| false, |_| Ok(())).unwrap();
            assert_eq!(out, reference, "{name} {c}+{v}");
            // Every draft accepted: max_depth + 1 tokens per step, less at the 40-token limit.
            let depth = tree.max_depth() as f64;
            assert!(stats.tau >= depth, "{name} {c}+{v}: tau {} with the target as its own draft", stats.tau);
        }
    }
}

/// A confidence cutoff below the tiny draft's top probability at the root (fixed prompt) and
/// above the product along some depth-1 nodes: which nodes expand then depends on the drawn
/// path (measured: about 1 generation in 10 pruned with wor+rrs; 0.8 prunes every root).
const PRUNE_CUTOFF: f64 = 0.7;

/// The temperature-0 setup of the equality tests: a tiny LLaMA target and a one-block draft
/// (different random models), 40 greedy tokens, and the plain output to compare with.
fn greedy_setup(tag: &str) -> (DecoderModel, DecoderModel, GenerationConfig, Vec<u32>) {
    let target = model(Tiny { scale: 0.8, ..Tiny::llama(21) }, &format!("{tag}-target"));
    let draft = model(Tiny { scale: 0.8, layers: 1, ..Tiny::llama(22) }, &format!("{tag}-draft"));
    let base = common::greedy(40, 1);
    let (reference, _) =
        Generator::new(&target, None, 200).unwrap().generate(&PROMPT, &base, |_| false, |_| Ok(())).unwrap();
    assert_eq!(reference.len(), 40);
    (target, draft, base, reference)
}

/// A draft window's prompt pass: the cache then holds the sinks and the last `recent` tokens
/// at their real positions, so the next token's logits equal one forward over just those
/// tokens with those position ids (1e-4; the prefill runs in other chunks). Without a window,
/// or with a prompt that fits it, every token is cached.
#[test]
fn a_draft_window_caches_its_tokens_at_their_positions() {
    use engine::decode::draft::window::{DraftContext, DraftWindow};
    let draft = model(Tiny { scale: 0.8, ..Tiny::qwen2(51) }, "window-prefill");
    let tokens: Vec<u32> = (0..40u32).map(|i| (i * 7 + 3) % 32).collect();
    let next = 5u32;
    for (sinks, recent) in [(3, 10), (0, 6), (4, 36), (4, 100), (usize::MAX, usize::MAX)] {
        let window = DraftWindow::new(sinks, recent).unwrap();
        let mut context = DraftContext::new(Some(window));
        let mut cache = draft.new_cache(64).unwrap();
        context.prefill(&draft, &mut cache, &tokens).unwrap();
        let kept: Vec<usize> = if tokens.len() > sinks.saturating_add(recent) {
            (0..sinks).chain(tokens.len() - recent..tokens.len()).collect()
        } else {
            (0..tokens.len()).collect()
        };
        let what = format!("sinks {sinks}, recent {recent}");
        assert_eq!(cache.len(), kept.len(), "{what}");
        assert_eq!(context.skipped(), tokens.len() - kept.len(), "{what}");
        let at = |cache: &mut engine::model::kv_cache::KvCache, position: usize| {
            let bias = engine::model::causal_bias(cache.len(), 1, draft.dtype(), draft.device()).unwrap();
            draft.logits(&draft.forward(&[next], &[position as u32], &bias, cache).unwrap()).unwrap()
        };
        let got = at(&mut cache, tokens.len());

        let mut fresh = draft.new_cache(64).unwrap();
        let ids: Vec<u32> = kept.iter().map(|&i| tokens[i]).collect();
        let pos: Vec<u32> = kept.iter().map(|&i| i as u32).collect();
        let bias = engine::model::causal_bias(0, ids.len(), draft.dtype(), draft.device()).unwrap();
        draft.forward(&ids, &pos, &bias, &mut fresh).unwrap();
        let want = at(&mut fresh, tokens.len());
        let diff = common::max_diff(&got, &want);
        assert!(diff < 1e-4, "{what}: logits differ by {diff}");
    }
}

/// Sliding drops the rows between the sinks and the last `recent`, bit for bit, once the cache
/// holds more than `sinks + recent + slack` rows, and counts them as skipped.
#[test]
fn a_draft_window_slides_past_its_slack() {
    use engine::decode::draft::window::{DraftContext, DraftWindow};
    let draft = model(Tiny { scale: 0.8, ..Tiny::llama(52) }, "window-slide");
    let window = DraftWindow::new(2, 8).unwrap();
    assert_eq!(window.slack(), 16);
    let mut context = DraftContext::new(Some(window));
    let mut cache = draft.new_cache(64).unwrap();
    let tokens: Vec<u32> = (0..26u32).map(|i| (i * 5 + 1) % 32).collect();
    // A prompt that fits the window, then decoded tokens up to the threshold.
    context.prefill(&draft, &mut cache, &tokens[..10]).unwrap();
    assert_eq!((cache.len(), context.skipped()), (10, 0));
    draft.forward_chain(&tokens[10..], &mut cache).unwrap();
    // At the threshold nothing moves.
    context.slide(&mut cache).unwrap();
    assert_eq!((cache.len(), context.skipped()), (26, 0));
    let bias = engine::model::causal_bias(26, 1, draft.dtype(), draft.device()).unwrap();
    draft.forward(&[9], &[26], &bias, &mut cache).unwrap();
    let before: Vec<_> = (0..draft.num_layers()).map(|l| (cache.keys(l).unwrap(), cache.values(l).unwrap())).collect();
    context.slide(&mut cache).unwrap();
    assert_eq!((cache.len(), context.skipped()), (10, 17));
    for (l, (k, v)) in before.iter().enumerate() {
        for (was, now) in [(k, cache.keys(l).unwrap()), (v, cache.values(l).unwrap())] {
            let want =
                candle_core::Tensor::cat(&[was.narrow(2, 0, 2).unwrap(), was.narrow(2, 19, 8).unwrap()], 2).unwrap();
            assert_eq!(common::max_diff(&now, &want), 0.0, "layer {l}");
        }
    }
}

/// The draft window changes only the draft's q: at temperature 0 the output is still the plain
/// greedy output, for windows that slide many times during the 60 new tokens (with and without
/// sinks, chains and trees, drafts one-hot or at temperature 1); at temperature 1 the first two
/// tokens follow the exact law (chi-square as in `chi_square::first_two_tokens_follow_the_target_law`:
/// 4,000 generations per configuration, fails above the p = 1e-4 critical value). Each catches any error of 0.059 or more in total variation (probability 0.9,
/// `common::detectable_tv`; fewer cells, less), and drafts must be accepted in at least 1% of
/// the generations (`common::two_token_counts`).
#[test]
fn draft_windows_are_exact() {
    use engine::decode::draft::window::DraftWindow;
    let target = model(Tiny { scale: 0.8, ..Tiny::llama(21) }, "window-t0-target");
    let draft = model(Tiny { scale: 0.8, layers: 1, ..Tiny::llama(22) }, "window-t0-draft");
    let prompt: Vec<u32> = (0..14u32).map(|i| (i * 11 + 2) % 32).collect();
    let base = common::greedy(60, 1);
    let (reference, _) =
        Generator::new(&target, None, 200).unwrap().generate(&prompt, &base, |_| false, |_| Ok(())).unwrap();
    assert_eq!(reference.len(), 60);
    let mut generator = Generator::new(&target, Some(&draft), 200).unwrap();
    let mut accepted_somewhere = 0;
    for (sinks, recent) in [(0, 4), (2, 8), (1, 1)] {
        generator.set_draft_window(Some(DraftWindow::new(sinks, recent).unwrap()));
        for (name, c, v, draft_warp) in [
            ("chain-4", DraftConstruction::Greedy, samplers::Verifier::Greedy, None),
            ("drafts-2-depth-4", DraftConstruction::TopK, samplers::Verifier::TopK, Some(Warp::temperature(1.0))),
            ("mc_sim_7b_63", DraftConstruction::WithoutReplacement, samplers::Verifier::Rrs, None),
        ] {
            let tree = DraftTree::preset(name).unwrap();
            let config =
                GenerationConfig { speculative: Some(common::spec(tree, c, v, draft_warp, 0.0)), ..base.clone() };
            let what = format!("window {sinks}+{recent}, {name} {c}+{v}");
            let (out, stats) = common::generate_streamed(&mut generator, &prompt, &config, &what);
            assert_eq!(out, reference, "{what}");
            accepted_somewhere += (stats.tau > 1.0) as usize;
        }
    }
    assert!(accepted_somewhere > 0, "no configuration ever accepted a draft");

    // Temperature 1: a six-token prompt, of which the draft sees the first and the last two.
    let small = |seed, layers| Tiny { vocab: 5, scale: 1.0, layers, ..Tiny::qwen2(seed) };
    let target = model(small(31, 2), "window-chi-target");
    let draft = model(small(32, 1), "window-chi-draft");
    let prompt = [1u32, 4, 0, 2, 3, 1];
    let warp = Warp::temperature(1.0);
    let law = common::two_token_law(&target, &prompt, warp);
    let mut generator = Generator::new(&target, Some(&draft), 64).unwrap();
    generator.set_draft_window(Some(DraftWindow::new(1, 2).unwrap()));
    for (name, c, v) in [
        ("drafts-2-depth-2", DraftConstruction::WithoutReplacement, samplers::Verifier::Rrs),
        ("drafts-2-depth-2", DraftConstruction::WithReplacement, samplers::Verifier::KSeq),
    ] {
        let tree = DraftTree::preset(name).unwrap();
        let draws = 4000;
        let config = |seed| common::two_tokens(seed, warp, tree.clone().into(), c, v, None);
        let counts = common::two_token_counts(&mut generator, &prompt, 5, draws, config, |_| {});
        common::assert_follows_law(&counts, &law, draws, None, &format!("window 1+2, {name} {c}+{v}"));
    }
}

/// Near the end of the context a step's tree that does not fit gives way to a plain step (the
/// root alone), so speculative decoding runs to the same last position as plain decoding: at
/// temperature 0 the same tokens, `capacity - prompt` of them, stopped by the context. With a
/// draft model (fixed trees, one of them larger than the whole context, and `auto`), an EAGLE
/// head and n-gram steps first; a prompt that leaves room for 3 tokens and no tree is taken.
#[test]
fn trees_give_way_to_plain_steps_at_the_end_of_the_context() {
    use common::TinyEagle;
    use engine::decode::draft::ngram::NgramConfig;
    use engine::decode::DraftSource;
    use engine::model::eagle::EagleHead;
    use samplers::Verifier;
    let tiny = Tiny { scale: 0.8, ..Tiny::llama(21) };
    let target = model(tiny, "context-end-target");
    let draft = model(Tiny { scale: 0.8, layers: 1, ..Tiny::llama(22) }, "context-end-draft");
    let head_spec = TinyEagle { target: tiny, seed: 23, own_embedding: false, scale: 0.5 };
    let head = EagleHead::load(&head_spec.write(&temp_dir("context-end-head"), false), &target).unwrap();
    let base = common::greedy(usize::MAX, 1);
    let (mut runs, mut drafted) = (0, 0);
    for capacity in [40, PROMPT.len() + 3] {
        let (reference, plain) =
            Generator::new(&target, None, capacity).unwrap().generate(&PROMPT, &base, |_| false, |_| Ok(())).unwrap();
        assert_eq!(plain.stop_reason, "context_length");
        assert_eq!(reference.len(), capacity - PROMPT.len());
        let mut with_draft = Generator::new(&target, Some(&draft), capacity).unwrap();
        let mut with_head = Generator::with_eagle(&target, &head, capacity).unwrap();
        let ngram_first = |tree: TreeChoice, c, v| SpecConfig {
            source: DraftSource::NgramFirst {
                ngram: NgramConfig { min: 1, max: 3 },
                tree: DraftTree::preset("drafts-2-depth-3").unwrap(),
            },
            ..common::spec(tree, c, v, None, 0.0)
        };
        let preset = |name| TreeChoice::from(DraftTree::preset(name).unwrap());
        let one_hot = DraftConstruction::Greedy;
        let configs = [
            ("chain-4", preset("chain-4"), one_hot, Verifier::Greedy, None),
            ("mc_sim_7b_63", preset("mc_sim_7b_63"), DraftConstruction::WithoutReplacement, Verifier::Rrs, None),
            ("drafts-2-depth-4", preset("drafts-2-depth-4"), DraftConstruction::TopK, Verifier::TopK, None),
            ("auto", TreeChoice::Auto, one_hot, Verifier::Greedy, Some(Warp::temperature(1.0))),
        ];
        for (name, tree, c, v, draft_warp) in configs {
            for (source, g) in [("draft", &mut with_draft), ("eagle", &mut with_head)] {
                for ngram in [false, true] {
                    let spec = if ngram {
                        ngram_first(tree.clone(), c, v)
                    } else {
                        common::spec(tree.clone(), c, v, draft_warp, 0.0)
                    };
                    let config = GenerationConfig { speculative: Some(spec), ..base.clone() };
                    let what = format!("context {capacity}, {source}, {name}, {c}+{v}, n-gram first: {ngram}");
                    let (out, stats) = common::generate_streamed(g, &PROMPT, &config, &what);
                    assert_eq!(out, reference, "{what}");
                    assert_eq!(stats.stop_reason, "context_length", "{what}");
                    runs += 1;
                    drafted += (stats.target_forwards < out.len()) as usize;
                    // A fixed tree of 5 nodes or more never fits the 2 positions left after a
                    // prompt at prompt + 3: its first step goes without drafts, and is counted.
                    if capacity == PROMPT.len() + 3 && name != "auto" && !ngram {
                        assert!(stats.undrafted_steps >= 1, "{what}: {stats:?}");
                    }
                    assert!(stats.undrafted_steps <= stats.target_forwards, "{what}: {stats:?}");
                }
            }
        }
    }
    assert_eq!(runs, 32);
    // Trees were taken before the end (fewer target forwards than tokens) in most runs at 40.
    assert!(drafted >= 8, "only {drafted} of {runs} runs accepted a draft");
}

/// A draft model whose context is shorter than the target's: past its end, steps go without
/// drafts and the text runs to the target's context, at temperature 0 equal to plain decoding,
/// with and without a draft window. A prompt longer than the draft's context is decoded without
/// drafts (the draft has no positions past its context length, with a window too), and the same
/// generator drafts again on the next prompt that fits.
#[test]
fn a_draft_with_a_shorter_context_stops_drafting_at_its_end() {
    use engine::decode::draft::window::DraftWindow;
    let tiny = Tiny { scale: 0.8, ..Tiny::llama(21) };
    let target = model(tiny, "short-draft-target");
    // The target's own weights: it accepts whatever it drafts.
    let draft = model(Tiny { context: 24, ..tiny }, "short-draft-draft");
    let base = common::greedy(usize::MAX, 1);
    let tree = DraftTree::preset("chain-4").unwrap();
    let spec = common::spec(tree, DraftConstruction::Greedy, samplers::Verifier::Greedy, None, 0.0);
    let config = GenerationConfig { speculative: Some(spec), ..base.clone() };
    let prompt = &PROMPT[..];
    let mut plain = Generator::new(&target, None, 100).unwrap();
    let (reference, _) = plain.generate(prompt, &base, |_| false, |_| Ok(())).unwrap();
    assert_eq!(reference.len(), 100 - prompt.len());
    for window in [None, Some(DraftWindow::new(2, 8).unwrap())] {
        let mut g = Generator::new(&target, Some(&draft), 100).unwrap();
        g.set_draft_window(window);
        let what = format!("prompt of {}, window {window:?}", prompt.len());
        let (out, stats) = common::generate_streamed(&mut g, prompt, &config, &what);
        assert_eq!(out, reference, "{what}");
        assert_eq!(stats.stop_reason, "context_length", "{what}");
        assert!(stats.target_forwards < out.len(), "{what}: never drafted");
        // The draft's positions end at 24: the last drafted step starts below position 24.
        assert!(stats.target_forwards + 24 > out.len(), "{what}: drafted past the draft's context");
        // Every step after the draft's end is counted as one without drafts.
        assert!(
            stats.undrafted_steps + 24 >= out.len() && stats.undrafted_steps < stats.target_forwards,
            "{what}: {stats:?}"
        );
    }
    let long: Vec<u32> = (0..30u32).map(|i| (i * 7 + 3) % 32).collect();
    let (long_reference, _) = plain.generate(&long, &base, |_| false, |_| Ok(())).unwrap();
    for window in [None, Some(DraftWindow::new(2, 8).unwrap())] {
        let mut g = Generator::new(&target, Some(&draft), 100).unwrap();
        g.set_draft_window(window);
        let what = format!("prompt of 30, window {window:?}");
        let (out, stats) = common::generate_streamed(&mut g, &long, &config, &what);
        assert_eq!(out, long_reference, "{what}");
        assert_eq!(stats.stop_reason, "context_length", "{what}");
        assert_eq!(stats.draft_prefill_tokens, 0, "{what}");
        assert_eq!((stats.target_forwards, stats.draft_forwards), (out.len(), 0), "{what}: drafted");
        assert_eq!(stats.undrafted_steps, out.len(), "{what}");
        // The next prompt fits the draft's context again: it drafts.
        let (out, stats) = common::generate_streamed(&mut g, &PROMPT, &config, &what);
        assert_eq!(out, reference, "{what}, then the short prompt");
        assert!(stats.target_forwards < out.len(), "{what}, then the short prompt: never drafted");
        // With prefix reuse, prompts sharing a prefix in and out of the draft's context: each
        // text equals a fresh plain generator's, and the draft drafts exactly when it fits.
        g.set_prefix_reuse(true);
        for cut in [12, 30, 12, 20, 30, 4] {
            let what = format!("{what}, reusing, prompt of {cut}");
            let (fresh, _) = plain.generate(&long[..cut], &base, |_| false, |_| Ok(())).unwrap();
            let (out, stats) = common::generate_streamed(&mut g, &long[..cut], &config, &what);
            assert_eq!(out, fresh, "{what}");
            assert_eq!(stats.draft_forwards > 0, cut <= 24, "{what}: {stats:?}");
        }
    }
}
