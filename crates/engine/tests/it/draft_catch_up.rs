//! A draft model's prefill put off until drafting pays (`Generator::set_deferred_draft_prefill`,
//! on by default with `--tree auto`): the draft catches up on the text in a forward of its own
//! (`DraftContext::extend_reporting`), after the first token, and the output is unchanged.

use crate::common;
use crate::decode::model;
use common::Tiny;
use engine::decode::{GenerationConfig, Generator, PrefillProgress, TreeChoice};
use engine::DraftTree;
use samplers::DraftConstruction;
use std::sync::{Arc, Mutex};

/// A draft that put off its prompt's prefill catches up with `DraftContext::extend_reporting`:
/// after a prefill of the first `k` tokens (none, fewer than the sinks, or more) and an
/// extension by the rest, the cache holds every token, or past the window's slack what a
/// prefill of the whole text holds (the sinks and the last `recent` tokens), each at its
/// position. Where all its rows ran in the extension or the prefill saw the same tokens, the
/// next token's logits equal one forward over just those tokens (1e-4); cached rows it keeps
/// past the sinks stay bit for bit as they were (as `slide` keeps them). `keep_shared` keeps the
/// rows of a shared prefix and forgets the rest.
#[test]
fn a_draft_catches_up_as_its_prefill_would_have_run() {
    use engine::decode::draft::window::{DraftContext, DraftWindow};
    let draft = model(Tiny { scale: 0.8, ..Tiny::qwen2(53) }, "catch-up-extend");
    let tokens: Vec<u32> = (0..70u32).map(|i| (i * 7 + 3) % 32).collect();
    let next = 5u32;
    let at = |cache: &mut engine::model::kv_cache::KvCache, position: usize| {
        let bias = engine::model::causal_bias(cache.len(), 1, draft.dtype(), draft.device()).unwrap();
        draft.logits(&draft.forward(&[next], &[position as u32], &bias, cache).unwrap()).unwrap()
    };
    let layers = |cache: &engine::model::kv_cache::KvCache| -> Vec<candle_core::Tensor> {
        (0..draft.num_layers())
            .flat_map(|l| [cache.keys(l).unwrap().copy().unwrap(), cache.values(l).unwrap().copy().unwrap()])
            .collect()
    };
    let (mut by_logits, mut by_rows) = (0, 0);
    for window in [None, Some((3, 10)), Some((0, 6)), Some((4, 30)), Some((2, 40))] {
        // Every branch: sinks to fill, cached rows all dropped, some kept (42 then 70 with the
        // two widest windows), the window never reached.
        for (k, n) in [(0, 60), (2, 60), (3, 60), (20, 60), (40, 45), (55, 60), (10, 20), (0, 12), (42, 70)] {
            let w = window.map(|(s, r)| DraftWindow::new(s, r).unwrap());
            let mut context = DraftContext::new(w);
            let mut cache = draft.new_cache(96).unwrap();
            context.prefill(&draft, &mut cache, &tokens[..k]).unwrap();
            let (before, skipped_before) = (layers(&cache), context.skipped());
            let mut last = (0, 0);
            let ran = context.extend_reporting(&draft, &mut cache, &tokens[k..n], &mut |d, t| last = (d, t)).unwrap();
            let what = format!("window {window:?}, {k} then {n}");
            assert_eq!(last, (ran, ran), "{what}: progress");
            // What the prefill kept, then the extension: all of it, or past the slack the sinks
            // and the last `recent`.
            let prefilled: Vec<usize> = match w {
                Some(w) if k > w.sinks + w.recent => (0..w.sinks).chain(k - w.recent..k).collect(),
                _ => (0..k).collect(),
            };
            let kept: Vec<usize> = match w {
                Some(w) if prefilled.len() + (n - k) > w.sinks + w.recent + w.slack() => {
                    (0..w.sinks).chain(n - w.recent..n).collect()
                }
                _ => prefilled.iter().copied().chain(k..n).collect(),
            };
            assert_eq!(cache.len(), kept.len(), "{what}");
            assert_eq!(context.skipped(), n - kept.len(), "{what}");
            assert_eq!(ran, kept.iter().filter(|&&i| i >= k).count(), "{what}: tokens run");
            let sinks = w.map_or(0, |w| w.sinks);
            let old: Vec<usize> = kept.iter().copied().filter(|&i| i >= sinks && i < k).collect();
            if kept.len() < prefilled.len() + (n - k) && !old.is_empty() {
                // Cached rows kept past the sinks: row `r` held position `r + skipped` before.
                let now = layers(&cache);
                for (was, now) in before.iter().zip(&now) {
                    for (row, &p) in old.iter().enumerate() {
                        let was = was.narrow(2, p - skipped_before, 1).unwrap();
                        let now = now.narrow(2, sinks + row, 1).unwrap();
                        assert_eq!(common::max_diff(&was, &now), 0.0, "{what}: position {p}");
                    }
                }
                by_rows += 1;
                continue;
            }
            let got = at(&mut cache, n);
            let mut fresh = draft.new_cache(96).unwrap();
            let ids: Vec<u32> = kept.iter().map(|&i| tokens[i]).collect();
            let pos: Vec<u32> = kept.iter().map(|&i| i as u32).collect();
            let bias = engine::model::causal_bias(0, ids.len(), draft.dtype(), draft.device()).unwrap();
            draft.forward(&ids, &pos, &bias, &mut fresh).unwrap();
            let want = at(&mut fresh, n);
            let diff = common::max_diff(&got, &want);
            assert!(diff < 1e-4, "{what}: logits differ by {diff}");
            by_logits += 1;
        }
    }
    assert_eq!((by_logits, by_rows), (43, 2));

    // A shared prefix: its rows stay (below the sinks and past the skipped part), the rest goes.
    let mut context = DraftContext::new(Some(DraftWindow::new(2, 10).unwrap()));
    let mut cache = draft.new_cache(64).unwrap();
    context.prefill(&draft, &mut cache, &tokens[..30]).unwrap();
    assert_eq!((cache.len(), context.skipped()), (12, 18));
    assert_eq!(context.keep_shared(&mut cache, 25), 25);
    assert_eq!((cache.len(), context.skipped()), (7, 18));
    assert_eq!(context.keep_shared(&mut cache, 10), 0, "a prefix ending in the skipped part keeps nothing");
    assert_eq!((cache.len(), context.skipped()), (0, 0));
}

/// The events of a generation in order: each model's prefill reports (`"target"`, `"draft"`,
/// and `"catch-up"` for the draft's reports flagged `catch_up`) and each batch of emitted
/// tokens (`"emit"`).
fn generate_logged(
    generator: &mut Generator,
    prompt: &[u32],
    config: &GenerationConfig,
) -> (Vec<u32>, engine::decode::Stats, Vec<&'static str>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let reports = Arc::clone(&log);
    generator.set_prefill_progress(Some(Box::new(move |p: PrefillProgress| {
        reports.lock().unwrap().push(if p.catch_up { "catch-up" } else { p.model })
    })));
    let emits = Arc::clone(&log);
    let (out, stats) = generator
        .generate(
            prompt,
            config,
            |_| false,
            |_| {
                emits.lock().unwrap().push("emit");
                Ok(())
            },
        )
        .unwrap();
    generator.set_prefill_progress(None);
    let log = log.lock().unwrap().clone();
    (out, stats, log)
}

/// With `--tree auto` and costs that make drafting pay, the first token comes before the draft
/// runs anything (its prefill is put off), the draft then catches up on the prompt and the first
/// token in one forward of its own (the whole prompt, or a window's sinks and recent tokens),
/// and drafts are accepted (as often as with the prompt run first); at temperature 0 the text is
/// `--no-spec`'s. Turned off, or with a fixed tree, the draft runs the prompt before the first
/// token, as before.
#[test]
fn a_deferred_draft_prefill_catches_up_after_the_first_token() {
    use engine::decode::draft::window::DraftWindow;
    let tiny = Tiny { scale: 0.8, ..Tiny::llama(21) };
    let target = model(tiny, "catch-up-target");
    // The target's own weights as the draft: its drafts are accepted whenever it has caught up.
    let draft = model(tiny, "catch-up-draft");
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 13 + 5) % 32).collect();
    let base = common::greedy(30, 1);
    let (reference, _) =
        Generator::new(&target, None, 200).unwrap().generate(&prompt, &base, |_| false, |_| Ok(())).unwrap();
    assert_eq!(reference.len(), 30);
    let spec = |tree: TreeChoice| common::spec(tree, DraftConstruction::Greedy, samplers::Verifier::Greedy, None, 0.0);
    let auto = GenerationConfig { speculative: Some(spec(TreeChoice::Auto)), ..base.clone() };
    let chain = GenerationConfig { speculative: Some(spec(DraftTree::preset("chain-4").unwrap().into())), ..base };
    let first = |log: &[&str], what: &str| log.iter().position(|e| *e == what);
    for (deferred, window, config, name) in [
        (true, None, &auto, "auto"),
        (true, Some((2, 16)), &auto, "auto, window 2 + 16"),
        (false, None, &auto, "auto, deferral off"),
        (false, Some((2, 16)), &auto, "auto, window 2 + 16, deferral off"),
        (true, None, &chain, "chain-4"),
    ] {
        let mut generator = Generator::new(&target, Some(&draft), 200).unwrap();
        generator.set_deferred_draft_prefill(deferred);
        generator.set_draft_window(window.map(|(s, r)| DraftWindow::new(s, r).unwrap()));
        *generator.auto_tree_mut() = Some(common::auto_favouring_wide_trees());
        let (out, stats, log) = generate_logged(&mut generator, &prompt, config);
        assert_eq!(out, reference, "{name}");
        // A draft that sees 18 of the 40 prompt tokens agrees with these random models less.
        let least = if window.is_some() { 1.0 } else { 1.5 };
        assert!(stats.tau > least, "{name}: drafts were rarely accepted: {stats:?}");
        let emit = first(&log, "emit").unwrap();
        assert!(first(&log, "target").unwrap() < emit, "{name}: {log:?}");
        if deferred && name != "chain-4" {
            assert_eq!(first(&log, "draft"), None, "{name}: the draft ran before the first token: {log:?}");
            assert!(emit < first(&log, "catch-up").expect("the draft caught up"), "{name}: {log:?}");
            assert_eq!(stats.draft_prefill_tokens, 0, "{name}");
            // The prompt and the first token, or the window's part of them (past its slack).
            let want = match window.map(|(s, r)| DraftWindow::new(s, r).unwrap()) {
                Some(w) if prompt.len() > w.sinks + w.recent + w.slack() => w.sinks + w.recent,
                _ => prompt.len(),
            };
            assert_eq!(stats.draft_catch_up_tokens, want, "{name}");
        } else {
            assert!(first(&log, "draft").expect("the draft's prefill") < emit, "{name}: {log:?}");
            assert_eq!(first(&log, "catch-up"), None, "{name}: {log:?}");
            let want = match window {
                Some((s, r)) if prompt.len() - 1 > s + r => s + r,
                _ => prompt.len() - 1,
            };
            assert_eq!(stats.draft_prefill_tokens, want, "{name}");
            assert_eq!(stats.draft_catch_up_tokens, 0, "{name}");
        }
    }
}

/// At temperature 1 the first two tokens after a 20-token prompt follow the target's law when
/// the draft's prefill is put off: the first from a plain step, the second from a step whose
/// draft caught up in a forward of its own and drafted a multi-draft tree (recursive rejection
/// sampling, drafts without replacement). `auto` starts every draw from costs that favour
/// drafting (the steps' own timings would soon say otherwise for these tiny models), so every
/// draw catches up. Chi-square as in `chi_square::first_two_tokens_follow_the_target_law`: 4,000
/// generations, cells expecting fewer than 5 pooled, fails below a p-value of 1e-4; it catches
/// any error of 0.059 or more in total variation (probability 0.9, `common::detectable_tv`).
/// A draft must be accepted in at least 1% of the draws.
#[test]
fn a_caught_up_draft_keeps_the_target_law() {
    use samplers::dist::Warp;
    let small = |seed, layers| Tiny { vocab: 5, scale: 1.0, layers, ..Tiny::qwen2(seed) };
    let target = model(small(33, 2), "catch-up-chi-target");
    let draft = model(small(34, 1), "catch-up-chi-draft");
    let prompt: Vec<u32> = (0..20u32).map(|i| (i * 3 + 1) % 5).collect();
    let warp = Warp::temperature(1.0);
    let law = common::two_token_law(&target, &prompt, warp);
    let mut generator = Generator::new(&target, Some(&draft), 64).unwrap();
    let draws = 4000u64;
    let (mut counts, mut accepted) = (vec![0u64; 25], 0);
    // One rayon thread, inline, as `common::two_token_counts` runs its draws (the same arithmetic).
    let inline = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    inline.install(|| {
        for seed in 0..draws {
            *generator.auto_tree_mut() = Some(common::auto_favouring_wide_trees());
            let tree = TreeChoice::Auto;
            let config = common::two_tokens(
                seed,
                warp,
                tree,
                DraftConstruction::WithoutReplacement,
                samplers::Verifier::Rrs,
                None,
            );
            let (out, stats) = generator.generate(&prompt, &config, |_| false, |_| Ok(())).unwrap();
            assert_eq!(out.len(), 2);
            counts[out[0] as usize * 5 + out[1] as usize] += 1;
            assert_eq!((stats.draft_prefill_tokens, stats.draft_catch_up_tokens), (0, prompt.len()), "seed {seed}");
            assert_eq!(stats.target_forwards, 2, "seed {seed}: a plain first step, then a drafted one");
            accepted += stats.accepted_at_depth.first().is_some_and(|&a| a > 0) as u64;
        }
    });
    assert!(accepted * 100 >= draws, "a draft was accepted in only {accepted} of {draws} draws");
    common::assert_follows_law(&counts, &law, draws, Some(25), "deferred draft, auto wor+rrs");
}
