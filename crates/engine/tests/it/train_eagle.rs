//! EAGLE head training (`engine::train`) on tiny random targets: the trained head, written in
//! EAGLE's layout, loads through the real loader and computes what it trained; training lowers
//! the loss; a run stopped and resumed ends where an uninterrupted one does; a run on a GPU
//! follows the CPU's; texts become chat turns with the answer marked.

use crate::common;

use candle_core::{DType, Device, Tensor};
use common::{max_diff, temp_dir, Tiny};
use engine::model::eagle::EagleHead;
use engine::model::{causal_bias, DecoderModel};
use engine::train::data::{self, Conversation, TokenizedConversation};
use engine::train::features::FeatureStore;
use engine::train::{HeadShape, TrainConfig, TrainEvent, TrainableHead, Trainer};
use rand::{Rng, SeedableRng};

fn cpu_target(tiny: &Tiny, name: &str) -> DecoderModel {
    let opts = engine::load::LoadOptions { dtype: Some(DType::F32), ..Default::default() };
    engine::load::load(&tiny.write_hf(&temp_dir(name)), &Device::Cpu, &opts).unwrap().model
}

/// The target's final hidden states of `tokens`.
fn features(target: &DecoderModel, tokens: &[u32]) -> Tensor {
    let mut cache = target.new_cache(tokens.len()).unwrap();
    target.forward_chain(tokens, &mut cache).unwrap()
}

/// A freshly initialised head, saved in f32 and loaded as an inference head, gives the
/// trainable head's outputs at every entry (LLaMA target; Qwen2 target with q/k/v biases);
/// outputs computed from entry 3 on (keys and values only before it) are those rows.
#[test]
fn trained_head_loads_and_computes_what_it_trained() {
    for (arch, tiny) in [("llama", Tiny::llama(91)), ("qwen2", Tiny::qwen2(91))] {
        let target = cpu_target(&tiny, &format!("train-target-{arch}"));
        let shape = HeadShape::for_target(target.config(), Some(48));
        assert_eq!(shape.qkv_bias, arch == "qwen2");
        let head = TrainableHead::init(shape, 7, &Device::Cpu).unwrap();
        let dir = temp_dir(&format!("train-head-{arch}"));
        head.save(&dir, DType::F32).unwrap();
        let loaded = EagleHead::load(&dir, &target).unwrap();
        assert_eq!(loaded.config().intermediate_size, 48);

        let tokens: Vec<u32> = vec![5, 17, 3, 40, 22, 9, 11, 30, 2];
        let f = features(&target, &tokens);
        let n = tokens.len() - 1;
        let feats = f.narrow(0, 0, n).unwrap();
        let embeds = target.embedding().lookup(&tokens[1..], &Device::Cpu).unwrap().to_dtype(DType::F32).unwrap();
        let trained = head.forward(&embeds, &feats, 0).unwrap();
        let mut cache = loaded.new_cache(64).unwrap();
        let pos: Vec<u32> = (0..n as u32).collect();
        let bias = causal_bias(0, n, DType::F32, &Device::Cpu).unwrap();
        let inferred = loaded.forward(&target, &feats, &tokens[1..], &pos, &bias, &mut cache).unwrap();
        assert_eq!(trained.dims(), inferred.dims());
        let d = max_diff(&trained, &inferred);
        assert!(d < 1e-4, "{arch}: trained and loaded heads differ by {d}");
        let tail = head.forward(&embeds, &feats, 3).unwrap();
        let d = max_diff(&tail, &trained.narrow(0, 3, n - 3).unwrap());
        assert!(d < 1e-5, "{arch}: outputs from entry 3 differ by {d}");
    }
}

/// The unrolled forward is the inference head drafting a chain: step `s`'s output at entry `j`
/// equals the loaded head's output after it ran the true entries `0..=j-s+1` and then fed its
/// own outputs back for entries `j-s+2..=j` (the chain's tokens the true ones), with its KV
/// cache holding every entry it ran. Both targets, outputs from entry 0 and from entry 2.
#[test]
fn unrolled_steps_are_the_inference_heads_chain_drafts() {
    for (arch, tiny) in [("llama", Tiny::llama(93)), ("qwen2", Tiny::qwen2(93))] {
        let target = cpu_target(&tiny, &format!("unroll-target-{arch}"));
        let head = TrainableHead::init(HeadShape::for_target(target.config(), Some(40)), 11, &Device::Cpu).unwrap();
        let dir = temp_dir(&format!("unroll-head-{arch}"));
        head.save(&dir, DType::F32).unwrap();
        let loaded = EagleHead::load(&dir, &target).unwrap();
        let tokens: Vec<u32> = vec![8, 31, 4, 27, 19, 6, 44, 13, 35, 2];
        let f = features(&target, &tokens);
        let n = tokens.len() - 1;
        let feats = f.narrow(0, 0, n).unwrap();
        let embeds = target.embedding().lookup(&tokens[1..], &Device::Cpu).unwrap().to_dtype(DType::F32).unwrap();
        for from in [0, 2] {
            let steps = head.forward_unrolled(&embeds, &feats, from, 3).unwrap();
            assert_eq!(steps.len(), 3);
            let mut compared = 0;
            for (s, out) in steps.iter().enumerate().map(|(i, o)| (i + 1, o)) {
                assert_eq!(out.dim(0).unwrap(), n - from - (s - 1), "{arch}: rows of step {s}");
                for j in from + s - 1..n {
                    let mut cache = loaded.new_cache(64).unwrap();
                    let truth = j + 2 - s; // entries 0..truth hold true features
                    let pos: Vec<u32> = (0..truth as u32).collect();
                    let bias = causal_bias(0, truth, DType::F32, &Device::Cpu).unwrap();
                    let g = loaded
                        .forward(
                            &target,
                            &feats.narrow(0, 0, truth).unwrap(),
                            &tokens[1..=truth],
                            &pos,
                            &bias,
                            &mut cache,
                        )
                        .unwrap();
                    let mut g = g.narrow(0, truth - 1, 1).unwrap();
                    for e in truth..=j {
                        let bias = causal_bias(e, 1, DType::F32, &Device::Cpu).unwrap();
                        g = loaded.forward(&target, &g, &tokens[e + 1..e + 2], &[e as u32], &bias, &mut cache).unwrap();
                    }
                    let row = out.narrow(0, j - (from + s - 1), 1).unwrap();
                    let d = max_diff(&row, &g);
                    assert!(d < 1e-4, "{arch}: step {s}, entry {j}, from {from}: trained and inferred differ by {d}");
                    compared += 1;
                }
            }
            assert_eq!(compared, 3 * (n - from) - 3);
        }
        // Two answer entries, three steps: step 3 has none and is omitted; the others are the
        // last rows of the run from entry 0.
        let short = head.forward_unrolled(&embeds, &feats, n - 2, 3).unwrap();
        let whole = head.forward_unrolled(&embeds, &feats, 0, 3).unwrap();
        assert_eq!(short.iter().map(|t| t.dim(0).unwrap()).collect::<Vec<_>>(), [2, 1]);
        for (k, out) in short.iter().enumerate() {
            let rows = out.dim(0).unwrap();
            let tail = whole[k].narrow(0, whole[k].dim(0).unwrap() - rows, rows).unwrap();
            assert!(max_diff(out, &tail) < 1e-5, "{arch}: step {} of a short answer", k + 1);
        }
    }
}

/// Sequences (prompt of 6, answer to the end) that repeat a random pattern of 3 to 5 tokens,
/// so that the next feature is predictable; their features stored.
fn store_of(target: &DecoderModel, dir: &std::path::Path, count: usize, seed: u64) -> FeatureStore {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut store = FeatureStore::open(dir, target.config().hidden_size).unwrap();
    let mut cache = target.new_cache(64).unwrap();
    for _ in 0..count {
        let len = rng.random_range(16..40);
        let pattern: Vec<u32> =
            (0..rng.random_range(3..6)).map(|_| rng.random_range(0..target.config().vocab_size as u32)).collect();
        let tokens: Vec<u32> = (0..len).map(|i| pattern[i % pattern.len()]).collect();
        store.append(target, &TokenizedConversation { tokens, answer_start: 6 }, &mut cache).unwrap();
    }
    store
}

fn config(epochs: usize, max_steps: Option<u64>) -> TrainConfig {
    TrainConfig {
        epochs,
        lr: 3e-3,
        warmup_steps: 3,
        batch_rows: 96,
        draft_vocab: 0,
        val_every: 6,
        checkpoint_every: 1000,
        max_steps,
        ..Default::default()
    }
}

fn run(target: &DecoderModel, store: &mut FeatureStore, out: &std::path::Path, c: TrainConfig) -> Vec<TrainEvent> {
    let head = TrainableHead::init(HeadShape::for_target(target.config(), None), 3, &Device::Cpu).unwrap();
    let mut trainer = Trainer::new(target, head, c, out).unwrap();
    let mut events = Vec::new();
    trainer.train(store, None, &mut |e| events.push(e.clone())).unwrap();
    trainer.head().save(&out.join("head"), DType::F32).unwrap();
    events
}

fn head_tensors(dir: &std::path::Path) -> Vec<(String, Tensor)> {
    let mut t: Vec<_> =
        candle_core::safetensors::load(dir.join("head/model.safetensors"), &Device::Cpu).unwrap().into_iter().collect();
    t.sort_by(|a, b| a.0.cmp(&b.0));
    t
}

/// Twelve epochs on 30 sequences of a tiny target lower the training loss by over 30% and the
/// validation loss (sequences of patterns never trained on) by over 5%; a run stopped after 7 steps and resumed
/// from its checkpoint ends with the uninterrupted run's weights.
#[test]
fn training_lowers_the_loss_and_resumes_exactly() {
    let tiny = Tiny { scale: 0.8, ..Tiny::qwen2(93) };
    let target = cpu_target(&tiny, "train-loss-target");
    let mut store = store_of(&target, &temp_dir("train-loss-store"), 30, 5);
    let whole = temp_dir("train-loss-whole");
    let events = run(&target, &mut store, &whole, config(12, None));
    let evals: Vec<&engine::train::Scores> = events
        .iter()
        .filter_map(|e| match e {
            TrainEvent::Eval { scores, .. } => Some(scores),
            _ => None,
        })
        .collect();
    assert_eq!(evals.len(), 12, "one validation score per epoch");
    let (first, last) = (evals[0], evals[11]);
    let train_loss: Vec<f64> = events
        .iter()
        .filter_map(|e| match e {
            TrainEvent::Step { scores, .. } => Some(scores.loss),
            _ => None,
        })
        .collect();
    let per_epoch = train_loss.len() / 12;
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    let (start, end) = (mean(&train_loss[..per_epoch]), mean(&train_loss[train_loss.len() - per_epoch..]));
    assert!(end < 0.7 * start, "training loss {start} -> {end}");
    assert!(last.loss < 0.95 * first.loss, "validation loss {} -> {}", first.loss, last.loss);
    assert!(matches!(events.last(), Some(TrainEvent::Stopped { reason, .. }) if reason.contains("all epochs")));
    let log = std::fs::read_to_string(whole.join("train_log.jsonl")).unwrap();
    assert_eq!(log.lines().count(), events.len());

    let parts = temp_dir("train-loss-parts");
    let first_part = run(&target, &mut store, &parts, config(12, Some(7)));
    assert!(
        matches!(first_part.last(), Some(TrainEvent::Stopped { step: 7, reason, .. }) if reason.contains("max-steps"))
    );
    run(&target, &mut store, &parts, config(12, None));
    let (a, b) = (head_tensors(&whole), head_tensors(&parts));
    assert_eq!(a.len(), b.len());
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert_eq!(max_diff(x, y), 0.0, "{name} differs after a resumed run");
    }
}

/// Unrolled training: a step's step-1 scores are EAGLE-1's (same head, same noise), its loss
/// is `(L1 + d L2) / (1 + d)` (checked by solving for `L2` at one decay and predicting the
/// loss at another); a run 3 steps deep, scored before its first step (`eval_first`), lowers
/// its validation loss (all steps weighted) and reports top-1 accuracy per depth.
#[test]
fn unrolled_training_weights_its_steps_and_learns() {
    let tiny = Tiny { scale: 0.8, ..Tiny::qwen2(94) };
    let target = cpu_target(&tiny, "unroll-train-target");
    let mut store = store_of(&target, &temp_dir("unroll-train-store"), 30, 6);
    let mut first_step = |unroll: usize, decay: f64, name: &str| {
        let c = TrainConfig { unroll, unroll_decay: decay, ..config(1, Some(1)) };
        let events = run(&target, &mut store, &temp_dir(name), c);
        events
            .into_iter()
            .find_map(|e| match e {
                TrainEvent::Step { scores, .. } => Some(scores),
                _ => None,
            })
            .unwrap()
    };
    let one = first_step(1, 0.8, "unroll-train-1");
    let half = first_step(2, 0.5, "unroll-train-2a");
    let double = first_step(2, 2.0, "unroll-train-2b");
    assert!(one.acc_steps.is_empty());
    assert_eq!(half.acc_steps.len(), 2);
    assert_eq!(half.acc_steps[0], one.acc);
    for s in [&half, &double] {
        assert_eq!((s.regression, s.token, s.acc), (one.regression, one.token, one.acc));
    }
    assert!((one.loss - (one.regression + 0.1 * one.token)).abs() < 1e-6 * one.loss);
    let l2 = (1.5 * half.loss - one.loss) / 0.5;
    let predicted = (one.loss + 2.0 * l2) / 3.0;
    assert!((double.loss - predicted).abs() < 1e-5 * predicted, "loss {} against {predicted}", double.loss);
    assert!((l2 - one.loss).abs() > 1e-3, "step 2's loss {l2} is step 1's");

    let c = TrainConfig { unroll: 3, eval_first: true, ..config(8, None) };
    let events = run(&target, &mut store, &temp_dir("unroll-train-run"), c);
    let evals: Vec<(u64, &engine::train::Scores)> = events
        .iter()
        .filter_map(|e| match e {
            TrainEvent::Eval { step, scores, .. } => Some((*step, scores)),
            _ => None,
        })
        .collect();
    assert_eq!(evals.len(), 9, "one score before training and one per epoch");
    let ((step0, first), (_, last)) = (evals[0], evals[8]);
    assert_eq!(step0, 0);
    assert_eq!((first.acc_steps.len(), last.acc_steps.len()), (3, 3));
    assert!(last.loss < 0.9 * first.loss, "validation loss {} -> {}", first.loss, last.loss);
}

/// An evaluation's top-1 per depth is, over a batch of sequences of several lengths (answers
/// of 2 entries and of 1, fewer than the 3 depths), the fraction of entries `j` where the
/// head's step-`s` output at `j` and the target's feature `f_{j+1}` have the same most
/// probable token, counted here from `forward_unrolled` and the target's output layer; the
/// same whether the sequences share one batch or each has its own.
#[test]
fn evaluation_scores_each_depth_against_its_entries_targets() {
    let tiny = Tiny { scale: 0.8, ..Tiny::qwen2(95) };
    let target = cpu_target(&tiny, "depth-eval-target");
    let mut store = store_of(&target, &temp_dir("depth-eval-store"), 5, 8);
    let mut cache = target.new_cache(64).unwrap();
    let short = TokenizedConversation { tokens: vec![3, 14, 15, 9, 26, 5, 35, 8], answer_start: 6 };
    store.append(&target, &short, &mut cache).unwrap();
    // And one whose answer is a single entry: depth 1 only.
    let single = TokenizedConversation { tokens: vec![3, 14, 15, 9, 26, 5, 35], answer_start: 6 };
    store.append(&target, &single, &mut cache).unwrap();
    // A head trained a little (its checkpoint resumed), so that the counts are neither 0 nor all.
    let out = temp_dir("depth-eval-run");
    run(&target, &mut store, &out, config(3, None));
    let head = TrainableHead::init(HeadShape::for_target(target.config(), None), 5, &Device::Cpu).unwrap();
    let trainer = Trainer::new(&target, head, TrainConfig { batch_rows: 100_000, ..config(3, None) }, &out).unwrap();
    let all: Vec<usize> = (0..store.sequences().len()).collect();
    let together = trainer.evaluate(&mut store, &all).unwrap();
    let h = target.config().hidden_size;
    let top = |t: &Tensor| target.logits(t).unwrap().argmax(candle_core::D::Minus1).unwrap().to_vec1::<u32>().unwrap();
    let (mut hits, mut rows) = ([0usize; 3], [0usize; 3]);
    let mut apart = [0f64; 3];
    for &i in &all {
        let seq = store.sequences()[i].clone();
        let n = seq.tokens.len() - 1;
        let from = seq.answer_start - 1;
        let f = Tensor::from_vec(store.rows(seq.first_row, n + 1).unwrap(), (n + 1, h), &Device::Cpu).unwrap();
        let embeds = target.embedding().lookup(&seq.tokens[1..], &Device::Cpu).unwrap().to_dtype(DType::F32).unwrap();
        let steps = trainer.head().forward_unrolled(&embeds, &f.narrow(0, 0, n).unwrap(), from, 3).unwrap();
        assert_eq!(steps.len(), [3, 3, 3, 3, 3, 2, 1][i]);
        for (k, g) in steps.iter().enumerate() {
            let m = g.dim(0).unwrap();
            let wanted = top(&f.narrow(0, from + k + 1, m).unwrap());
            hits[k] += top(g).iter().zip(&wanted).filter(|(a, b)| a == b).count();
            rows[k] += m;
        }
        let alone = trainer.evaluate(&mut store, &[i]).unwrap();
        for (k, a) in alone.acc_steps.iter().enumerate() {
            apart[k] += a * steps.get(k).map_or(0, |g| g.dim(0).unwrap()) as f64;
        }
    }
    assert_eq!(together.acc_steps.len(), 3);
    for k in 0..3 {
        let counted = hits[k] as f64 / rows[k] as f64;
        assert!(
            (together.acc_steps[k] - counted).abs() < 1e-9,
            "depth {}: {} against {counted}",
            k + 1,
            together.acc_steps[k]
        );
        assert!((apart[k] / rows[k] as f64 - counted).abs() < 1e-9, "depth {}: batches of one", k + 1);
    }
    assert!(hits.iter().all(|&x| x > 0) && hits != rows, "a test that cannot tell: {hits:?} of {rows:?}");
    let alone = trainer.evaluate(&mut store, &[6]).unwrap();
    assert_eq!((alone.rows, alone.acc_steps.as_slice()), (1, [alone.acc].as_slice()), "a one-entry answer");
}

/// `prompt_entries`: a training batch holds every entry after the prefix all stored texts
/// share (here 4 tokens, as a chat template's system turn), the prompts' included, where it
/// held the answers' only; the validation scores (answer entries) are the same either way,
/// and a run on the prompts' entries learns.
#[test]
fn prompt_entries_train_after_the_shared_prefix() {
    let tiny = Tiny { scale: 0.8, ..Tiny::qwen2(98) };
    let target = cpu_target(&tiny, "prompt-entries-target");
    let mut store = FeatureStore::open(&temp_dir("prompt-entries-store"), target.config().hidden_size).unwrap();
    assert_eq!(store.shared_prefix(), 0, "an empty store");
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let mut cache = target.new_cache(64).unwrap();
    let vocab = target.config().vocab_size as u32;
    for i in 0..12 {
        // A shared prefix of 4 tokens, a prompt of 2 to 9 more, an answer repeating a pattern.
        let mut tokens = vec![5, 6, 7, 8];
        tokens.extend((0..2 + i % 8).map(|_| rng.random_range(9..vocab)));
        let answer_start = tokens.len();
        let pattern: Vec<u32> = (0..3).map(|_| rng.random_range(0..vocab)).collect();
        tokens.extend((0..10 + i).map(|k| pattern[k % 3]));
        store.append(&target, &TokenizedConversation { tokens, answer_start }, &mut cache).unwrap();
    }
    if store.sequences().iter().all(|s| s.tokens[4] == store.sequences()[0].tokens[4]) {
        panic!("the random prompts share their first token: pick another seed");
    }
    assert_eq!(store.shared_prefix(), 4);
    let trainer = {
        let head = TrainableHead::init(HeadShape::for_target(target.config(), None), 3, &Device::Cpu).unwrap();
        Trainer::new(&target, head, config(1, None), &temp_dir("prompt-entries-split")).unwrap()
    };
    let (train, _) = trainer.split(&store);
    let entries = |from: &dyn Fn(&engine::train::features::StoredSequence) -> usize| -> usize {
        train.iter().map(|&i| &store.sequences()[i]).map(|s| s.tokens.len() - 1 - from(s)).sum()
    };
    let (answers, all) = (entries(&|s| s.answer_start - 1), entries(&|_| 3));
    let mut first_step = |prompt_entries: bool, name: &str| {
        let c = TrainConfig { batch_rows: 100_000, eval_first: true, prompt_entries, ..config(1, Some(1)) };
        let events = run(&target, &mut store, &temp_dir(name), c);
        let step = events.iter().find_map(|e| match e {
            TrainEvent::Step { scores, .. } => Some(scores.clone()),
            _ => None,
        });
        let eval = events.iter().find_map(|e| match e {
            TrainEvent::Eval { step: 0, scores, .. } => Some(scores.clone()),
            _ => None,
        });
        (step.unwrap(), eval.unwrap())
    };
    let (answer_step, answer_eval) = first_step(false, "prompt-entries-off");
    let (prompt_step, prompt_eval) = first_step(true, "prompt-entries-on");
    assert_eq!(answer_step.rows, answers);
    assert_eq!(prompt_step.rows, all);
    let on = |prompt_entries| {
        let head = TrainableHead::init(HeadShape::for_target(target.config(), None), 3, &Device::Cpu).unwrap();
        let c = TrainConfig { prompt_entries, ..config(1, None) };
        Trainer::new(&target, head, c, &temp_dir("prompt-entries-count")).unwrap().entries_per_epoch(&store)
    };
    assert_eq!((on(false), on(true)), (answers, all));
    assert!(all > answers + 30, "{all} entries against {answers}");
    assert_eq!(answer_eval, prompt_eval, "validation scores answer entries either way");

    let c = TrainConfig { prompt_entries: true, eval_first: true, ..config(12, None) };
    let events = run(&target, &mut store, &temp_dir("prompt-entries-run"), c);
    let (mut evals, mut losses) = (Vec::new(), Vec::new());
    for e in &events {
        match e {
            TrainEvent::Eval { scores, .. } => evals.push(scores.loss),
            TrainEvent::Step { scores, .. } => losses.push(scores.loss),
            _ => {}
        }
    }
    let per_epoch = losses.len() / 12;
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    let (start, end) = (mean(&losses[..per_epoch]), mean(&losses[losses.len() - per_epoch..]));
    assert!(end < 0.7 * start, "training loss {start} -> {end}");
    let (first, last) = (evals[0], evals[evals.len() - 1]);
    assert!(last < 0.95 * first, "validation loss {first} -> {last}");
}

/// Texts sharing a prefix (as chat turns share the template's) run the prefix once when one
/// cache serves the appends, and the store is byte for byte the one a fresh cache per text
/// gives: a Hugging Face f32 target and a Q4_K GGUF one (our repacked CPU kernels).
#[test]
fn features_of_a_shared_prefix_are_reused_and_equal() {
    let wide = Tiny { hidden: 256, intermediate: 256, scale: 0.1, ..Tiny::qwen2(96) };
    let gguf =
        wide.write_gguf(&temp_dir("train-prefix-q4k").join("m.gguf"), candle_core::quantized::GgmlDType::Q4K, &[]);
    for (kind, target) in [("hf", cpu_target(&Tiny::qwen2(96), "train-prefix-hf")), ("q4k", common::load_cpu(&gguf))] {
        let prefix: Vec<u32> = (0..10).map(|i| 3 + 4 * i).collect();
        let with = |tail: &[u32]| [prefix.as_slice(), tail].concat();
        let b = with(&[9, 8, 7, 6, 5, 4, 3, 2, 1, 40, 41, 42, 43, 44, 45]);
        let texts = [with(&[7; 10]), b.clone(), b, (1..13).collect()];
        let (one, fresh) =
            (temp_dir(&format!("train-prefix-one-{kind}")), temp_dir(&format!("train-prefix-fresh-{kind}")));
        let (mut reused, mut alone) = (
            FeatureStore::open(&one, target.config().hidden_size).unwrap(),
            FeatureStore::open(&fresh, target.config().hidden_size).unwrap(),
        );
        let mut cache = target.new_cache(64).unwrap();
        let mut run = Vec::new();
        for tokens in &texts {
            let t = TokenizedConversation { tokens: tokens.clone(), answer_start: 12 };
            run.push(reused.append(&target, &t, &mut cache).unwrap());
            assert_eq!(alone.append(&target, &t, &mut target.new_cache(64).unwrap()).unwrap(), tokens.len());
        }
        assert_eq!(run, [20, 15, 1, 12], "{kind}: tokens run");
        assert_eq!(reused.sequences(), alone.sequences());
        let bytes = |d: &std::path::Path| std::fs::read(d.join("hidden.f16")).unwrap();
        assert!(bytes(&one) == bytes(&fresh), "{kind}: the stored features differ");
    }
}

/// A finished store opened for reading only (`train-eagle --reuse`) reads what was written
/// and changes nothing in its folder: no index rewritten, no rows cut, appends refused. A store
/// being written (a torn index line, rows past its index) is refused by name.
#[test]
fn a_finished_store_opens_read_only_and_stays_as_it_is() {
    use std::io::Write as _;
    let target = cpu_target(&Tiny::qwen2(97), "read-only-store-target");
    let dir = temp_dir("read-only-store");
    let h = target.config().hidden_size;
    let mut written = store_of(&target, &dir, 3, 9);
    let rows = written.sequences().iter().map(|s| s.tokens.len()).sum::<usize>();
    let expected = written.rows(0, rows).unwrap();
    let (index, data) = (dir.join("sequences.jsonl"), dir.join("hidden.f16"));
    let stamp = |p: &std::path::Path| {
        let m = std::fs::metadata(p).unwrap();
        (m.modified().unwrap(), m.len())
    };
    let before = (stamp(&index), stamp(&data));
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut read = FeatureStore::open_read_only(&dir, h).unwrap();
    assert_eq!(read.sequences(), written.sequences());
    assert_eq!(read.rows(0, rows).unwrap(), expected);
    let t = TokenizedConversation { tokens: vec![1, 2, 3, 4], answer_start: 2 };
    let e = read.append(&target, &t, &mut target.new_cache(8).unwrap()).unwrap_err().to_string();
    assert!(e.contains("read-only-store") && e.contains("reading only"), "{e}");
    assert_eq!((stamp(&index), stamp(&data)), before, "the folder was written");
    // Rows past the index (a sequence being appended) and a torn last line are refused.
    let text = std::fs::read_to_string(&index).unwrap();
    std::fs::OpenOptions::new().append(true).open(&data).unwrap().write_all(&[0; 4]).unwrap();
    let e = FeatureStore::open_read_only(&dir, h).err().unwrap().to_string();
    assert!(e.contains("hidden.f16") && e.contains("being written"), "{e}");
    std::fs::write(&index, format!("{text}{{\"tokens\":[1,")).unwrap();
    let e = FeatureStore::open_read_only(&dir, h).err().unwrap().to_string();
    assert!(e.contains("sequences.jsonl") && e.contains("cut"), "{e}");
    // Opened for writing, the same folder is mended (and then reads read-only again).
    drop(FeatureStore::open(&dir, h).unwrap());
    assert_eq!(FeatureStore::open_read_only(&dir, h).unwrap().sequences(), written.sequences());
    let e = FeatureStore::open_read_only(&temp_dir("read-only-none"), h).err().unwrap().to_string();
    assert!(e.contains("sequences.jsonl") && e.contains("no feature store"), "{e}");
}

/// Training on the test device (`MDSD_TEST_DEVICE`, e.g. CUDA; the target at f32) follows the
/// CPU's run: the features it stores are the CPU's (to f16's rounding), and from the same store,
/// head and settings each of 8 steps' losses is within 0.1% of the CPU's and the weights then
/// within 1e-3. Ignored unless built with CUDA: on the CPU it would compare the CPU with itself,
/// so there it fails rather than pass.
#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs a GPU: build with --features cuda, run with MDSD_TEST_DEVICE=cuda")]
fn training_on_the_test_device_follows_the_cpu() {
    let device = common::test_device();
    assert!(!device.is_cpu(), "MDSD_TEST_DEVICE is the CPU: this test compares another device with the CPU");
    let tiny = Tiny { scale: 0.8, ..Tiny::qwen2(95) };
    let path = tiny.write_hf(&temp_dir("train-device-target"));
    let opts = engine::load::LoadOptions { dtype: Some(DType::F32), ..Default::default() };
    let cpu = engine::load::load(&path, &Device::Cpu, &opts).unwrap().model;
    let dev = engine::load::load(&path, &device, &opts).unwrap().model;
    assert!(dev.device().same_device(&device));
    let mut store = store_of(&cpu, &temp_dir("train-device-store-cpu"), 12, 6);
    let mut on_device = store_of(&dev, &temp_dir("train-device-store-dev"), 12, 6);
    assert_eq!(store.sequences(), on_device.sequences());
    let rows = store.sequences().iter().map(|s| s.tokens.len()).sum();
    let h = cpu.config().hidden_size;
    let (a, b) = (store.rows(0, rows).unwrap(), on_device.rows(0, rows).unwrap());
    let (a, b) =
        (Tensor::from_vec(a, (rows, h), &Device::Cpu).unwrap(), Tensor::from_vec(b, (rows, h), &Device::Cpu).unwrap());
    let scale = a.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
    let d = max_diff(&a, &b);
    assert!(d <= 2e-3 * scale, "stored features differ by {d} (largest {scale})");

    let losses = |events: &[TrainEvent]| -> Vec<f64> {
        events
            .iter()
            .filter_map(|e| match e {
                TrainEvent::Step { scores, .. } => Some(scores.loss),
                _ => None,
            })
            .collect()
    };
    let (out_cpu, out_dev) = (temp_dir("train-device-cpu"), temp_dir("train-device-dev"));
    let on_cpu = losses(&run(&cpu, &mut store, &out_cpu, config(6, Some(8))));
    let on_dev = losses(&run(&dev, &mut store, &out_dev, config(6, Some(8))));
    assert_eq!((on_cpu.len(), on_dev.len()), (8, 8), "steps run");
    for (i, (x, y)) in on_cpu.iter().zip(&on_dev).enumerate() {
        assert!((x - y).abs() <= 1e-3 * x.abs(), "step {}: loss {x} on the CPU, {y} on {device:?}", i + 1);
    }
    for ((name, x), (_, y)) in head_tensors(&out_cpu).iter().zip(&head_tensors(&out_dev)) {
        let d = max_diff(x, y);
        assert!(d < 1e-3, "{name}: differs by {d} after 8 steps");
    }
}

/// A conversation becomes the chat template's prompt, the answer and the end-of-turn token,
/// with the answer's first index; a prompt that leaves no room for two answer tokens is
/// dropped.
#[test]
fn conversations_become_chat_turns_with_the_answer_marked() {
    let tiny = Tiny::chat_llama(94);
    let path = tiny.write_gguf(&temp_dir("train-chat").join("m.gguf"), candle_core::quantized::GgmlDType::F32, &[]);
    let tok = engine::load::load_tokenizer(&path, None).unwrap();
    let c = Conversation { source: "t".into(), prompt: "AB".into(), answer: "CD".into() };
    let t = data::tokenize(&tok, &c, 100).unwrap().unwrap();
    let prompt = tok.encode(&tok.apply_chat_template("AB", None).unwrap()).unwrap();
    assert_eq!(&t.tokens[..t.answer_start], &prompt[..]);
    let end = *tok.stop_ids().first().expect("the tiny model has a stop token");
    assert_eq!(*t.tokens.last().unwrap(), end);
    assert_eq!(tok.decode(&t.tokens[t.answer_start..t.tokens.len() - 1]).unwrap(), "CD");
    assert!(data::tokenize(&tok, &c, prompt.len() + 1).unwrap().is_none());
}

/// The prompt sets' readers: fixed answers from Alpaca, CNN/DailyMail and WMT'14 files, first
/// turns with MT-Bench's categories left out, and an error naming the file for a bad line.
#[test]
fn prompt_sets_are_read_and_mt_bench_left_out() {
    let dir = temp_dir("train-data");
    let w = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
    w("alpaca_sample.jsonl", "{\"instruction\":\"Add\",\"input\":\"1+1\",\"output\":\"2\"}\n{\"instruction\":\"Hi\",\"input\":\"\",\"output\":\"Hello\"}\n");
    w("cnndm_frank_test.jsonl", "{\"article\":\"A long story here\",\"highlights_tokenized\":\"It was long .\"}\n");
    w("wmt14_deen_test.jsonl", "{\"de\":\"Hallo\",\"en\":\"Hello\"}\n{\"de\":\"Ja\",\"en\":\"Yes\"}\n");
    let limits = data::SourceLimits { alpaca: 5, cnndm: 5, wmt14: 1, article_chars: 6 };
    let all = data::fixed_conversations(&dir, &limits).unwrap();
    let sources: Vec<&str> = all.iter().map(|c| c.source.as_str()).collect();
    assert_eq!(sources, ["alpaca", "alpaca", "cnndm", "wmt14"]);
    assert_eq!(all[0].prompt, "Add\n\n1+1");
    assert_eq!(all[1].prompt, "Hi");
    assert!(all[2].prompt.ends_with("\n\nA long") && all[2].answer == "It was long.", "{:?}", all[2]);
    let items = data::alpaca_items(&dir, 1).unwrap();
    assert_eq!(items, [("Add\n\n1+1".to_string(), "2".to_string())]);
    w("q.jsonl", "{\"category\":\"writing\",\"turns\":[\"w\"]}\n{\"category\":\"qa\",\"turns\":[\"q1\",\"x\"]}\n{\"category\":\"qa\",\"turns\":[\"q2\"]}\n");
    let q = dir.join("q.jsonl");
    let turns = data::first_turns(&q, &data::MT_BENCH_CATEGORIES, 0..1).unwrap();
    assert_eq!(turns, [("qa".to_string(), "q1".to_string())]);
    // The questions after the first of each category; none after the last.
    let next = data::first_turns(&q, &data::MT_BENCH_CATEGORIES, 1..2).unwrap();
    assert_eq!(next, [("qa".to_string(), "q2".to_string())]);
    assert!(data::first_turns(&q, &[], 2..9).unwrap().is_empty());
    let all = data::first_turns(&q, &[], 0..usize::MAX).unwrap();
    assert_eq!(all.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>(), ["w", "q1", "q2"]);
    w("bad.jsonl", "{\"category\":\"qa\"}\n");
    let e = data::first_turns(&dir.join("bad.jsonl"), &[], 0..1).unwrap_err().to_string();
    assert!(e.contains("bad.jsonl") && e.contains("turns"), "{e}");
}
