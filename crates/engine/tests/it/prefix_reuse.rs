//! Prefix reuse (`Generator::set_prefix_reuse`): a prompt that extends, repeats or shares a
//! prefix with the last text runs only its new tokens, and generates exactly what a fresh
//! generator generates from the whole prompt.

use crate::common;

use common::{load_on_test_device, temp_dir, Tiny, TinyEagle};
use engine::decode::draft::ngram::NgramConfig;
use engine::decode::draft::window::DraftWindow;
use engine::decode::{DraftSource, GenerationConfig, Generator, Randomness, SpecConfig, TreeChoice};
use engine::model::eagle::EagleHead;
use engine::model::DecoderModel;
use engine::DraftTree;
use samplers::dist::Warp;
use samplers::{DraftConstruction, Verifier};

fn model(tiny: Tiny, name: &str) -> DecoderModel {
    load_on_test_device(&tiny.write_hf(&temp_dir(name)))
}

fn spec(tree: impl Into<TreeChoice>, source: DraftSource) -> SpecConfig {
    SpecConfig {
        tree: tree.into(),
        construction: DraftConstruction::Greedy,
        verifier: Verifier::Greedy,
        draft_warp: Some(Warp::temperature(1.5)),
        confidence_cutoff: 0.0,
        source,
    }
}

/// One case: a name, the speculative configuration (`None`: plain decoding) and the window.
type Case = (&'static str, Option<SpecConfig>, Option<DraftWindow>);

fn cases() -> Vec<Case> {
    let tree = |name| DraftTree::preset(name).unwrap();
    let ngram =
        DraftSource::NgramFirst { ngram: NgramConfig { min: 1, max: 3 }, tree: DraftTree::preset("chain-3").unwrap() };
    vec![
        ("plain", None, None),
        ("chain-4", Some(spec(tree("chain-4"), DraftSource::Model)), None),
        ("drafts-2-depth-3", Some(spec(tree("drafts-2-depth-3"), DraftSource::Model)), None),
        ("auto", Some(spec(TreeChoice::Auto, DraftSource::Model)), None),
        ("n-gram first", Some(spec(tree("chain-2"), ngram)), None),
        // The window slides in the second turn: the repeated prompt keeps the draft's recent
        // rows (positions past the skipped ones), the parting one prefills afresh.
        ("chain-3, window 1+16", Some(spec(tree("chain-3"), DraftSource::Model)), DraftWindow::new(1, 16).ok()),
    ]
}

/// Stream sampling at temperatures 0 and 1, and positional races at 1.
fn samplings() -> [(Warp, Randomness); 3] {
    [
        (Warp::temperature(0.0), Randomness::Stream),
        (Warp::temperature(1.0), Randomness::Stream),
        (Warp::temperature(1.0), Randomness::Positional),
    ]
}

fn fresh(
    target: &DecoderModel,
    draft: Option<&DecoderModel>,
    window: Option<DraftWindow>,
    prompt: &[u32],
    config: &GenerationConfig,
) -> Vec<u32> {
    let mut g = Generator::new(target, draft, 400).unwrap();
    g.set_draft_window(window);
    g.generate(prompt, config, |_| false, |_| Ok(())).unwrap().0
}

/// Three turns per case, sampling and draft: the conversation's second turn (the first prompt,
/// its answer and new tokens), the same prompt again, and a prompt that leaves the text after
/// eight tokens. Each equals a fresh generator's text from the whole prompt, and reuses what
/// it shares: at least the first turn's prompt and answer but the answer's last token, every
/// token but the last of a repeated prompt, exactly the shared eight of the third; the draft
/// runs fewer of the second turn's tokens than a fresh prefill (with a window, where the
/// draft's rows differ from a fresh prefill's, only temperature 0 and races must give the
/// fresh text).
#[test]
fn reused_prefixes_give_the_fresh_texts() {
    let target = model(Tiny { scale: 0.8, ..Tiny::llama(91) }, "reuse-target");
    let other = model(Tiny { scale: 0.8, layers: 1, ..Tiny::llama(92) }, "reuse-draft");
    let first: Vec<u32> = (0..14u32).map(|i| (i * 5 + 2) % 48).collect();
    let mut reused_rows = 0;
    for (name, s, window) in cases() {
        for draft in [&target, &other] {
            for (warp, randomness) in samplings() {
                // `auto` picks trees by measured times: only its stream at temperature 0 and
                // its races give one text whatever it picks.
                if name == "auto" && randomness == Randomness::Stream && warp.temperature > 0.0 {
                    continue;
                }
                let config = GenerationConfig { max_new_tokens: 20, warp, seed: 7, randomness, speculative: s.clone() };
                let what = format!("{name}, {warp:?}, {randomness:?}");
                let draft = s.as_ref().map(|_| draft);
                let mut g = Generator::new(&target, draft, 400).unwrap();
                g.set_draft_window(window);
                g.set_prefix_reuse(true);
                let (answer, stats) = g.generate(&first, &config, |_| false, |_| Ok(())).unwrap();
                assert_eq!(stats.reused_tokens, 0, "{what}: nothing to reuse on the first turn");
                assert_eq!(answer, fresh(&target, draft, window, &first, &config), "{what}: first turn");

                let mut second = first.clone();
                second.extend_from_slice(&answer);
                second.extend_from_slice(&[3, 1, 4, 1, 5]);
                // The target's cache is the fresh one's; a window's draft keeps rows a fresh
                // prefill would not run, so its stream texts at temperature > 0 may differ.
                let same_draft = window.is_none() || randomness == Randomness::Positional || warp.temperature == 0.0;
                let (out, stats) = g.generate(&second, &config, |_| false, |_| Ok(())).unwrap();
                if same_draft {
                    assert_eq!(out, fresh(&target, draft, window, &second, &config), "{what}: second turn");
                }
                if draft.is_some() {
                    let fresh_rows = if window.is_some() { 17 } else { second.len() - 1 };
                    assert!(
                        stats.draft_prefill_tokens < fresh_rows,
                        "{what}: the draft ran {} of the second turn's tokens",
                        stats.draft_prefill_tokens
                    );
                }
                let least = first.len() + answer.len() - 1;
                assert!(
                    (least..second.len()).contains(&stats.reused_tokens),
                    "{what}: reused {} of the second turn's {} tokens (at least {least})",
                    stats.reused_tokens,
                    second.len()
                );
                reused_rows += stats.reused_tokens;

                let (again, stats) = g.generate(&second, &config, |_| false, |_| Ok(())).unwrap();
                if same_draft {
                    assert_eq!(again, out, "{what}: the same prompt again");
                }
                assert_eq!(stats.reused_tokens, second.len() - 1, "{what}: the same prompt again");

                let mut third = first[..8].to_vec();
                // One token differs; the three after it are the first turn's again.
                third.push((first[8] + 1) % 48);
                third.extend_from_slice(&first[9..12]);
                third.push(2);
                let (out, stats) = g.generate(&third, &config, |_| false, |_| Ok(())).unwrap();
                assert_eq!(out, fresh(&target, draft, window, &third, &config), "{what}: a parting prompt");
                assert_eq!(stats.reused_tokens, 8, "{what}: a parting prompt");
            }
        }
    }
    assert!(reused_rows > 0);
}

/// Off (the default), nothing is reused; switching it on reuses the last text, switching it
/// off forgets it.
#[test]
fn reuse_is_off_by_default() {
    let target = model(Tiny::llama(93), "reuse-off-target");
    let config = common::greedy(6, 0);
    let prompt = [1u32, 2, 3, 4];
    let mut g = Generator::new(&target, None, 100).unwrap();
    let (out, _) = g.generate(&prompt, &config, |_| false, |_| Ok(())).unwrap();
    let (again, stats) = g.generate(&prompt, &config, |_| false, |_| Ok(())).unwrap();
    assert_eq!((again, stats.reused_tokens), (out.clone(), 0));
    // Switched on, it reuses the last text, which the cache holds either way.
    g.set_prefix_reuse(true);
    assert_eq!(g.generate(&prompt, &config, |_| false, |_| Ok(())).unwrap().1.reused_tokens, 3);
    g.set_prefix_reuse(false);
    g.set_prefix_reuse(true);
    assert_eq!(g.generate(&prompt, &config, |_| false, |_| Ok(())).unwrap().1.reused_tokens, 0);
}

/// A failed generation forgets the text: its caches may hold rows of a step that never ended.
#[test]
fn a_failed_generation_reuses_nothing_after() {
    let target = model(Tiny::llama(94), "reuse-fail-target");
    let config = common::greedy(6, 0);
    let prompt = [1u32, 2, 3, 4];
    let mut g = Generator::new(&target, None, 100).unwrap();
    g.set_prefix_reuse(true);
    g.generate(&prompt, &config, |_| false, |_| Ok(())).unwrap();
    let err = g
        .generate(&prompt, &config, |_| false, |_| Err(engine::Error::Callback("the reader hung up".into())))
        .unwrap_err();
    assert!(err.to_string().contains("hung up"), "{err}");
    assert_eq!(g.generate(&prompt, &config, |_| false, |_| Ok(())).unwrap().1.reused_tokens, 0);
}

/// An EAGLE head keeps its entries and its pending features where they cover the shared text,
/// and the target runs again where they do not: a second turn reuses the whole first text, the
/// same prompt again and a prompt parting after two tokens all but their last shared position;
/// each gives a fresh generator's text (stream sampling at temperatures 0 and 1, races at 1).
#[test]
fn eagle_reuses_what_its_features_cover() {
    let tiny = Tiny { vocab: 12, scale: 0.8, ..Tiny::llama(95) };
    let target = load_on_test_device(&tiny.write_hf(&temp_dir("reuse-eagle-target")));
    let head_spec = TinyEagle { target: tiny, seed: 96, own_embedding: false, scale: 0.5 };
    let head = EagleHead::load(&head_spec.write(&temp_dir("reuse-eagle-head"), false), &target).unwrap();
    let first = [5u32, 1, 7, 3, 9, 2, 4];
    for (warp, randomness) in samplings() {
        let config = GenerationConfig {
            max_new_tokens: 12,
            warp,
            seed: 3,
            randomness,
            speculative: Some(spec(DraftTree::preset("drafts-2-depth-2").unwrap(), DraftSource::Model)),
        };
        let what = format!("{warp:?}, {randomness:?}");
        let fresh = |prompt: &[u32]| {
            Generator::with_eagle(&target, &head, 200)
                .unwrap()
                .generate(prompt, &config, |_| false, |_| Ok(()))
                .unwrap()
                .0
        };
        let mut g = Generator::with_eagle(&target, &head, 200).unwrap();
        g.set_prefix_reuse(true);
        let (answer, _) = g.generate(&first, &config, |_| false, |_| Ok(())).unwrap();
        let mut second = first.to_vec();
        second.extend_from_slice(&answer);
        second.extend_from_slice(&[2, 6]);
        let (out, stats) = g.generate(&second, &config, |_| false, |_| Ok(())).unwrap();
        assert_eq!(out, fresh(&second), "{what}: second turn");
        assert!(stats.reused_tokens >= first.len() + answer.len() - 1, "{what}: reused {}", stats.reused_tokens);
        // The head's cache reaches past this prompt: the target runs its last shared position
        // again for the feature there.
        let (again, stats) = g.generate(&second, &config, |_| false, |_| Ok(())).unwrap();
        assert_eq!((again, stats.reused_tokens), (out, second.len() - 2), "{what}: the same prompt again");
        let parting = [5u32, 1, 8, 8];
        let (out, stats) = g.generate(&parting, &config, |_| false, |_| Ok(())).unwrap();
        assert_eq!((out, stats.reused_tokens), (fresh(&parting), 1), "{what}: a parting prompt");
    }
}

/// The draft's cache after `DraftContext::prefill_reusing` holds each row at its position: in
/// the first layer a key depends only on its token and position, so row `r` must equal the
/// key a full prefill computes at position `r` (sinks) or `r + skipped` (recent rows). Checked
/// where no window skipped rows, where one did and the shared text reaches past it (rows
/// kept), and where the shared text ends in the skipped part (a fresh window prefill).
#[test]
fn a_reused_draft_cache_keeps_every_row_at_its_position() {
    use engine::decode::draft::window::DraftContext;
    let m = model(Tiny::llama(97), "reuse-rows");
    let tokens: Vec<u32> = (0..40u32).map(|i| (i * 7 + 3) % 48).collect();
    let mut full = m.new_cache(64).unwrap();
    m.forward_chain(&tokens[..30], &mut full).unwrap();
    let full_keys = full.keys(0).unwrap();
    let assert_rows = |cache: &engine::model::kv_cache::KvCache, skipped: usize, sinks: usize, what: &str| {
        let keys = cache.keys(0).unwrap();
        for r in 0..cache.len() {
            let pos = if r < sinks { r } else { r + skipped };
            let diff = common::max_diff(&keys.narrow(2, r, 1).unwrap(), &full_keys.narrow(2, pos, 1).unwrap());
            assert!(diff < 1e-4, "{what}: row {r} is not position {pos} ({diff})");
        }
    };
    let window = DraftWindow::new(1, 4).unwrap();

    // No window slid: rows 0..7 kept, 7..12 run.
    let mut ctx = DraftContext::new(Some(window));
    let mut cache = m.new_cache(64).unwrap();
    ctx.prefill(&m, &mut cache, &tokens[..5]).unwrap();
    m.forward_chain(&tokens[5..9], &mut cache).unwrap();
    assert_eq!(ctx.prefill_reusing(&m, &mut cache, &tokens[..12], 7).unwrap(), 5);
    assert_eq!((cache.len(), ctx.skipped()), (12, 0));
    assert_rows(&cache, 0, 1, "no window slid");

    // Slid (17 tokens skipped): the sink and four recent rows kept, positions 22..26 run.
    let mut ctx = DraftContext::new(Some(window));
    let mut cache = m.new_cache(64).unwrap();
    ctx.prefill(&m, &mut cache, &tokens[..5]).unwrap();
    m.forward_chain(&tokens[5..22], &mut cache).unwrap();
    ctx.slide(&mut cache).unwrap();
    assert_eq!((cache.len(), ctx.skipped()), (5, 17));
    assert_eq!(ctx.prefill_reusing(&m, &mut cache, &tokens[..26], 25).unwrap(), 4);
    assert_eq!((cache.len(), ctx.skipped()), (9, 17));
    assert_rows(&cache, 17, 1, "slid, shared past the window");

    // The shared text ends among the skipped tokens: a fresh window over 26 tokens.
    assert_eq!(ctx.prefill_reusing(&m, &mut cache, &tokens[..26], 10).unwrap(), 5);
    assert_eq!((cache.len(), ctx.skipped()), (5, 21));
    assert_rows(&cache, 21, 1, "fresh window");
}

/// `set_prefill_progress` reports each model's prefill from 0 to its total, chunk by chunk,
/// counting only the tokens that run: a prompt of more than one chunk, then the same prompt
/// extended with prefix reuse on (only the new tokens run), then a draft window (the draft runs
/// its sinks and recent tokens only).
#[test]
fn prefill_progress_counts_the_tokens_each_model_runs() {
    use engine::decode::PrefillProgress;
    use std::sync::{Arc, Mutex};
    let tiny = Tiny { context: 1024, ..Tiny::llama(96) };
    let target = model(tiny, "progress-target");
    let draft = model(Tiny { layers: 1, ..tiny }, "progress-draft");
    let chunk = if common::test_device().is_cpu() {
        engine::model::PREFILL_CHUNK_CPU
    } else {
        engine::model::PREFILL_CHUNK_GPU
    };
    let prompt: Vec<u32> = (0..600u32).map(|i| (i * 7 + 3) % tiny.vocab as u32).collect();
    let config = GenerationConfig {
        speculative: Some(spec(DraftTree::preset("chain-2").unwrap(), DraftSource::Model)),
        ..common::greedy(4, 0)
    };
    let seen: Arc<Mutex<Vec<PrefillProgress>>> = Arc::default();
    let mut g = Generator::new(&target, Some(&draft), 1000).unwrap();
    let log = seen.clone();
    g.set_prefill_progress(Some(Box::new(move |p| log.lock().unwrap().push(p))));
    // Each model's reports: 0, then every chunk's end, the last at the total.
    let expect = |model: &'static str, total: usize| -> Vec<PrefillProgress> {
        let mut done: Vec<usize> = (0..total).step_by(chunk).collect();
        done.push(total);
        done.into_iter().map(|done| PrefillProgress { model, done, total, catch_up: false }).collect()
    };
    let take = || std::mem::take(&mut *seen.lock().unwrap());

    g.generate(&prompt[..500], &config, |_| false, |_| Ok(())).unwrap();
    assert_eq!(take(), [expect("target", 499), expect("draft", 499)].concat());

    g.set_prefix_reuse(true);
    let (_, stats) = g.generate(&prompt, &config, |_| false, |_| Ok(())).unwrap();
    let target_ran = 599 - stats.reused_tokens;
    assert!(stats.reused_tokens >= 499, "reused {}", stats.reused_tokens);
    assert_eq!(take(), [expect("target", target_ran), expect("draft", stats.draft_prefill_tokens)].concat());

    // A window of 4 sinks and 300 recent tokens: the draft runs the sinks, then the rest.
    g.set_prefix_reuse(false);
    g.set_draft_window(DraftWindow::new(4, 300).ok());
    g.generate(&prompt, &config, |_| false, |_| Ok(())).unwrap();
    let reports = take();
    assert_eq!(reports[..expect("target", 599).len()], expect("target", 599)[..]);
    let draft_done: Vec<usize> =
        reports.iter().filter(|p| p.model == "draft").inspect(|p| assert_eq!(p.total, 304)).map(|p| p.done).collect();
    // 0 and the 4 sinks, then the 300 recent tokens chunk by chunk, each count once.
    let mut window_done = vec![0, 4];
    window_done.extend((chunk..300).step_by(chunk).map(|d| 4 + d));
    window_done.push(304);
    assert_eq!(draft_done, window_done);

    // Switched off, nothing is reported.
    g.set_prefill_progress(None);
    g.generate(&prompt, &config, |_| false, |_| Ok(())).unwrap();
    assert!(take().is_empty());
}
