//! The decode path through the device kernels (`DecoderModel::set_fused_decode`:
//! `engine::kernels::device`), on the test device: on the CPU the kernels' Rust reference, on
//! CUDA (`MDSD_TEST_DEVICE=cuda`, `--features cuda`) the kernels themselves. The path must give
//! the logits of candle's ops, and speculative decoding through it must emit plain decoding's
//! tokens at temperature 0 (its attention gives a row the same result whatever shares the
//! forward). On a GPU, each kernel is also compared with its reference on the CPU.

use crate::common::{self, load_on_test_device, logits_all, max_diff, temp_dir, test_device, Tiny};
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use engine::decode::Generator;
use engine::model::DecoderModel;

fn with_fused(mut m: DecoderModel, on: bool) -> DecoderModel {
    m.set_fused_decode(on);
    m
}

/// The fused path's logits against candle's ops, at every position of a 300-token prompt (two
/// key chunks of the attention), for LLaMA from GGUF (interleaved rotary pairs), Qwen2 and
/// Qwen3 (per-head norms) from Hugging Face folders, and a YaRN-scaled Qwen2: within 1e-4 of
/// the largest logit in f32 (the attention sums in another order). bf16 on a device: 2%.
#[test]
fn the_fused_path_gives_candle_s_logits() {
    let long = |t: Tiny| Tiny { context: 1024, ..t };
    let dir = temp_dir("fused-logits");
    let prompt: Vec<u32> = (0..300u32).map(|i| (i * 7 + 3) % 48).collect();
    let files = [
        ("llama gguf", long(Tiny::llama(61)).write_gguf(&dir.join("llama.gguf"), GgmlDType::F32, &[])),
        ("qwen2 hf", long(Tiny::qwen2(62)).write_hf(&dir.join("qwen2"))),
        ("qwen3 hf", long(Tiny::qwen3(63)).write_hf(&dir.join("qwen3"))),
        (
            "qwen2 yarn",
            long(Tiny::qwen2(64)).write_hf_with(
                &dir.join("yarn"),
                serde_json::json!({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}}),
            ),
        ),
    ];
    for (name, path) in files {
        let plain = load_on_test_device(&path);
        let fused = with_fused(load_on_test_device(&path), true);
        assert!(fused.fused_decode() && !plain.fused_decode());
        let (a, b) = (logits_all(&plain, &prompt), logits_all(&fused, &prompt));
        let scale = a.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_dtype(DType::F32).unwrap();
        let scale = scale.to_scalar::<f32>().unwrap();
        let tol = if plain.dtype() == DType::F32 { 1e-4 } else { 0.02 };
        let d = max_diff(&a, &b);
        assert!(d <= tol * scale, "{name}: max |diff| {d} of {scale}");
    }
}

/// At temperature 0, speculative decoding through the fused path emits the fused path's plain
/// tokens, for every kind of tree and draft source (the target itself, a one-layer draft, an
/// EAGLE head, lookup first), with the target's own drafts accepted: the attention gives each
/// row what it gives that row alone.
#[test]
fn fused_speculative_decoding_equals_fused_plain_decoding() {
    let (target, draft, head) = common::target_draft_head(71, "fused-sources");
    let (target, draft) = (with_fused(target, true), with_fused(draft, true));
    let prompt = [3u32, 9, 27, 4, 12, 36, 9, 27];
    let base = common::greedy(40, 0);
    let (plain, _) =
        Generator::new(&target, None, 200).unwrap().generate(&prompt, &base, |_| false, |_| Ok(())).unwrap();
    assert_eq!(plain.len(), 40);
    let runs = common::assert_every_source_equals_plain((&target, &draft, &head), &prompt, &base, &plain, |_| {});
    assert!(runs.iter().any(|(_, source, s)| *source == "EAGLE" && s.tau > 1.0), "the head never drafted");
}

/// Joined q/k/v and gate/up products (`DecoderModel::join_products`, as CUDA models with the
/// device kernels load) give the products apart's logits within 1e-5 of the largest, and
/// speculative decoding through them emits their plain tokens at temperature 0 with drafts
/// accepted: LLaMA from GGUF and Qwen2 (q/k/v biases) and Qwen3 from Hugging Face folders.
#[test]
fn joined_products_give_the_products_apart_s_logits_and_decode_exactly() {
    let dir = temp_dir("fused-joined");
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 5 + 1) % 48).collect();
    let files = [
        ("llama gguf", Tiny::llama(81).write_gguf(&dir.join("llama.gguf"), GgmlDType::F32, &[])),
        ("qwen2 hf", Tiny::qwen2(82).write_hf(&dir.join("qwen2"))),
        ("qwen3 hf", Tiny::qwen3(83).write_hf(&dir.join("qwen3"))),
    ];
    for (name, path) in files {
        let apart = with_fused(load_on_test_device(&path), true);
        let mut joined = with_fused(load_on_test_device(&path), true);
        let n = joined.join_products().unwrap();
        assert!(n >= 2 * joined.num_layers(), "{name}: {n} products joined");
        assert_eq!(joined.join_products().unwrap(), 0, "{name}: joined twice");
        let (a, b) = (logits_all(&apart, &prompt), logits_all(&joined, &prompt));
        let scale = a.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_dtype(DType::F32).unwrap();
        let scale = scale.to_scalar::<f32>().unwrap();
        let tol = if apart.dtype() == DType::F32 { 1e-5 } else { 0.02 };
        let d = max_diff(&a, &b);
        assert!(d <= tol * scale, "{name}: max |diff| {d} of {scale}");
    }
    let (target, draft, head) = common::target_draft_head(84, "fused-joined-sources");
    let (mut target, mut draft) = (with_fused(target, true), with_fused(draft, true));
    assert!(target.join_products().unwrap() > 0 && draft.join_products().unwrap() > 0);
    let base = common::greedy(30, 0);
    let prompt = [3u32, 9, 27, 4, 12, 36, 9, 27];
    let (plain, _) =
        Generator::new(&target, None, 200).unwrap().generate(&prompt, &base, |_| false, |_| Ok(())).unwrap();
    assert_eq!(plain.len(), 30);
    let runs = common::assert_every_source_equals_plain((&target, &draft, &head), &prompt, &base, &plain, |_| {});
    assert!(runs.iter().any(|(_, source, s)| *source == "1-layer" && s.tau > 1.0), "the draft never drafted");
}

/// A forward captured for replays (`engine::kernels::device::graph`: a CUDA graph on a GPU, the
/// calls again on the CPU) gives the eager forward's logits bit for bit, and a replay reads its
/// buffers' current contents: after another prompt is run eagerly into the same cache rows, the
/// replay gives the eager forward's logits on the new prompt. A three-row causal step, with the
/// device kernels and with candle's ops.
#[test]
fn a_replayed_forward_equals_the_eager_forward_on_the_current_cache() {
    use engine::kernels::device::graph::ReplayedForward;
    use std::cell::RefCell;
    let dir = temp_dir("fused-graph");
    let path = Tiny::llama(65).write_gguf(&dir.join("llama.gguf"), GgmlDType::F32, &[]);
    let bits = |t: candle_core::Result<Tensor>| -> Vec<u32> {
        let t = t.unwrap().to_dtype(DType::F32).unwrap().flatten_all().unwrap();
        t.to_vec1::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()
    };
    let prompts: [Vec<u32>; 2] =
        [(0..20u32).map(|i| (i * 5 + 1) % 48).collect(), (0..20u32).map(|i| (i * 11 + 7) % 48).collect()];
    let (rows, pos) = ([3u32, 9, 27], [20u32, 21, 22]);
    for fused in [false, true] {
        let m = with_fused(load_on_test_device(&path), fused);
        let dev = m.device().clone();
        let bias = engine::model::causal_bias(20, 3, m.dtype(), &dev).unwrap();
        let cache = RefCell::new(m.new_cache(32).unwrap());
        let step = || -> candle_core::Result<Tensor> {
            let mut c = cache.borrow_mut();
            c.truncate(20);
            let h = m.forward(&rows, &pos, &bias, &mut c)?;
            m.logits(&h)
        };
        let eager = |prompt: &[u32]| {
            let mut c = cache.borrow_mut();
            c.truncate(0);
            m.forward_chain(prompt, &mut c).unwrap();
            drop(c);
            bits(step())
        };
        let first = eager(&prompts[0]);
        let mut replayed = ReplayedForward::capture(&dev, step).unwrap();
        assert_eq!(replayed.is_graph(), !dev.is_cpu());
        assert!(bits(replayed.replay()) == first, "fused {fused}: the replay differs from the eager forward");
        let second = eager(&prompts[1]);
        assert!(second != first, "the prompts give the same logits: the test shows nothing");
        assert!(bits(replayed.replay()) == second, "fused {fused}: the replay did not read the rewritten cache");
    }
}

/// Decoding with graph-replayed target steps (`Generator::set_graphs`: CUDA graphs on a GPU,
/// the step forward itself on the CPU): at temperature 0 plain decoding gives the tokens it
/// gives without graphs, and every tree and draft source gives plain decoding's tokens with
/// drafts accepted; at temperature 0.8 the same seed gives the same text with and without
/// graphs (the logits are the same). Every target step after the prompt went through a graph
/// bucket, and the draft model's and the EAGLE head's forwards did too.
#[test]
fn graph_replayed_steps_decode_as_eager_steps() {
    let (target, draft, head) = common::target_draft_head(72, "fused-graphs");
    let (target, draft) = (with_fused(target, true), with_fused(draft, true));
    let prompt = [3u32, 9, 27, 4, 12, 36, 9, 27];
    let base = common::greedy(40, 0);
    let generate = |graphs: bool, config: &engine::decode::GenerationConfig| {
        let mut g = Generator::new(&target, None, 200).unwrap();
        g.set_graphs(graphs).unwrap();
        assert_eq!(g.graphs(), graphs);
        g.generate(&prompt, config, |_| false, |_| Ok(())).unwrap()
    };
    let (plain, _) = generate(false, &base);
    let (replayed, stats) = generate(true, &base);
    assert_eq!(replayed, plain);
    assert!(stats.graph_forwards == stats.target_forwards && stats.target_forwards >= 39, "{stats:?}");
    let runs = common::assert_every_source_equals_plain((&target, &draft, &head), &prompt, &base, &plain, |g| {
        g.set_graphs(true).unwrap();
    });
    for (tree, source, s) in &runs {
        assert!(s.graph_forwards == s.target_forwards && s.target_forwards > 0, "{tree}, {source}: {s:?}");
        // The draft model's or head's forwards replayed too.
        if s.draft_forwards > 0 {
            assert!(
                s.draft_graph_forwards > 0 && s.draft_graph_forwards <= s.draft_forwards,
                "{tree}, {source}: {s:?}"
            );
        } else {
            assert_eq!(s.draft_graph_forwards, 0, "{tree}, {source}");
        }
    }
    for source in ["1-layer", "EAGLE"] {
        assert!(
            runs.iter().any(|(_, sr, s)| *sr == source && s.tau > 1.0 && s.draft_graph_forwards > 0),
            "{source}: no replayed drafts were accepted"
        );
    }
    assert!(runs.iter().any(|(_, _, s)| s.tau > 1.5), "no drafts were accepted");
    let sampled = engine::decode::GenerationConfig { warp: samplers::dist::Warp::temperature(0.8), ..base.clone() };
    assert_eq!(generate(true, &sampled).0, generate(false, &sampled).0);
    // Graphs need the device-kernel path.
    let eager = common::target_draft_head(72, "fused-graphs-off").0;
    let e = Generator::new(&eager, None, 200).unwrap().set_graphs(true).unwrap_err();
    assert!(e.to_string().contains("MDSD_FUSED_DECODE"), "{e}");
}

/// A step forward from one input buffer (`DecoderModel::forward_step`), captured once and
/// replayed with new inputs written into the buffer, across cache lengths (inside, at the end
/// of and past a key chunk, and 1) and every bucket of 1 to 8 rows with chains, trees and
/// padding: each replay's logits equal the eager step forward's on the same inputs bit for bit
/// (on a GPU: CUDA graph against eager), and the live rows' logits equal the plain forward's
/// with the bias that says the same (bit for bit on the CPU; within 1e-4 of the largest logit
/// on a GPU, 2% in bf16, whose products may round a padded bucket differently).
#[test]
fn step_forwards_replayed_equal_eager_forwards() {
    use engine::kernels::device::graph::ReplayedForward;
    use engine::model::{chain_masks, tree_masks, StepInputs};
    use std::cell::RefCell;
    let dir = temp_dir("fused-step-graph");
    let path = Tiny { context: 1024, ..Tiny::llama(66) }.write_gguf(&dir.join("llama.gguf"), GgmlDType::F32, &[]);
    let m = with_fused(load_on_test_device(&path), true);
    let dev = m.device().clone();
    let host = |t: &Tensor| -> Vec<f32> {
        t.to_device(&Device::Cpu).unwrap().to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
    };
    let prompt: Vec<u32> = (0..600u32).map(|i| (i * 13 + 5) % 48).collect();
    let cache = RefCell::new(m.new_cache(620).unwrap());
    let vocab = m.config().vocab_size;
    // Live rows' masks for a step of n rows: a chain, or a tree (row r's parent (r - 1) / 2).
    let masks = |n: usize, tree: bool| {
        if tree {
            tree_masks(&(0..n).map(|r| (r > 0).then(|| (r - 1) / 2)).collect::<Vec<_>>()).unwrap()
        } else {
            chain_masks(n)
        }
    };
    for bucket in [1usize, 2, 4, 8] {
        let step = RefCell::new(StepInputs::new(bucket, vocab, &dev).unwrap());
        let run = || -> candle_core::Result<Tensor> {
            let h = m.forward_step(&step.borrow(), &mut cache.borrow_mut())?;
            m.logits(&h)
        };
        let mut replayed = None;
        for (i, start) in [300usize, 255, 256, 1, 511].into_iter().enumerate() {
            let live = 1 + (i * 3 + bucket) % bucket;
            let tokens: Vec<u32> = (0..live as u32).map(|r| (r * 7 + start as u32) % 48).collect();
            let positions: Vec<u32> = (0..live as u32).map(|r| start as u32 + r).collect();
            let masks = masks(live, i % 2 == 1);
            {
                // The prompt's first `start` tokens cached (earlier steps wrote over some).
                let mut c = cache.borrow_mut();
                c.truncate(0);
                m.forward_chain(&prompt[..start], &mut c).unwrap();
            }
            step.borrow_mut().set(&tokens, &positions, &masks, start, start).unwrap();
            let eager = host(&run().unwrap());
            // The plain forward of the live rows with the same visibility.
            let bias = step.borrow().bias(m.dtype(), &dev).unwrap();
            let plain = {
                let mut c = cache.borrow_mut();
                c.truncate(start);
                let h = m.forward(&tokens, &positions, &bias, &mut c).unwrap();
                c.truncate(start);
                host(&m.logits(&h).unwrap())
            };
            let live_eager = &eager[..live * vocab];
            if dev.is_cpu() {
                assert!(
                    live_eager.iter().zip(&plain).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "bucket {bucket}, {live} rows at {start}: the step forward differs from the plain forward"
                );
            } else {
                let largest = plain.iter().fold(0f32, |a, b| a.max(b.abs()));
                let worst = live_eager.iter().zip(&plain).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                let tol = if m.dtype() == DType::F32 { 1e-4 } else { 0.02 };
                assert!(worst <= tol * largest, "bucket {bucket}, {live} rows at {start}: {worst} of {largest}");
            }
            let r = replayed.get_or_insert_with(|| ReplayedForward::capture(&dev, run).unwrap());
            assert_eq!(r.is_graph(), !dev.is_cpu());
            let got = host(&r.replay().unwrap());
            assert!(
                got.iter().zip(&eager).all(|(a, b)| a.to_bits() == b.to_bits()),
                "bucket {bucket}, {live} rows at {start}: the replay differs from the eager step forward"
            );
        }
    }
    // A step forward needs the device kernels.
    let plain_model = load_on_test_device(&path);
    let step = StepInputs::new(1, vocab, &dev).unwrap();
    let e = plain_model.forward_step(&step, &mut cache.borrow_mut()).unwrap_err();
    assert!(e.to_string().contains("set_fused_decode"), "{e}");
}

/// On a GPU: each kernel against its Rust reference (the same op on the CPU), on fresh random
/// inputs. Attention, cache copies, the residual sum with its norm, the gated activation, the
/// kept-path compaction and argmax bit for bit in f32, the warp's probabilities bit for bit in
/// f64 and the token drawn from them; the rotary embedding within 2e-6 relative (the GPU's `cosf`/`sinf` against the CPU's).
#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs a GPU: build with --features cuda, run with MDSD_TEST_DEVICE=cuda")]
fn device_kernels_equal_their_reference() {
    use engine::kernels::device::{
        compact_rows, AddRmsNorm, ArgmaxRows, CacheAttention, RopeIntoCache, RopeRows, RowsIntoCache, SampleRow,
        SiluMul, Slots, WarpRows,
    };
    let dev = test_device();
    assert!(!dev.is_cpu(), "MDSD_TEST_DEVICE is the CPU: this test compares a device's kernels with the CPU");
    let cpu = Device::Cpu;
    let both = |t: &Tensor| (t.clone(), t.to_device(&dev).unwrap());
    let host = |t: &Tensor| {
        t.to_device(&cpu).unwrap().to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
    };
    let bits_equal = |a: &Tensor, b: &Tensor| host(a).iter().zip(host(b)).all(|(x, y)| x.to_bits() == y.to_bits());
    let (rows, heads, kv_heads, hd) = (7usize, 8usize, 2usize, 64usize);
    for total in [1usize, 255, 256, 257, 1500] {
        let cap = total + rows;
        let randn = |shape: &[usize]| Tensor::randn(0f32, 1.0, shape, &cpu).unwrap();
        let positions =
            Tensor::from_vec((0..rows).map(|r| (total + r) as u32).collect::<Vec<_>>(), rows, &cpu).unwrap();
        let inv: Vec<f32> = (0..hd / 2).map(|i| 1.0 / 10_000f32.powf(2.0 * i as f32 / hd as f32)).collect();
        let inv = Tensor::from_vec(inv, hd / 2, &cpu).unwrap();
        let (inv_c, inv_d) = both(&inv);
        let (pos_c, pos_d) = both(&positions);
        // Rotary embedding of the queries.
        let (q_c, q_d) = both(&randn(&[rows, heads * hd]));
        let op = |inv| RopeRows { inv_freq: inv, attention_factor: 1.0, interleaved: false, heads, head_dim: hd };
        let (rq_c, rq_d) =
            (q_c.apply_op2_no_bwd(&pos_c, &op(&inv_c)).unwrap(), q_d.apply_op2_no_bwd(&pos_d, &op(&inv_d)).unwrap());
        let worst =
            host(&rq_c).iter().zip(host(&rq_d)).map(|(a, b)| (a - b).abs() / a.abs().max(1.0)).fold(0f32, f32::max);
        assert!(worst <= 2e-6, "rope: {worst:e}");
        // Keys rotated and values copied into the caches.
        let (k_c, k_d) = both(&randn(&[rows, kv_heads * hd]));
        let (v_c, v_d) = both(&randn(&[rows, kv_heads * hd]));
        let (keys_c, keys_d) = both(&randn(&[1, kv_heads, cap, hd]));
        let (vals_c, vals_d) = both(&randn(&[1, kv_heads, cap, hd]));
        let start = total.saturating_sub(rows).min(cap - rows);
        let rope = |inv| RopeIntoCache {
            inv_freq: inv,
            attention_factor: 1.0,
            interleaved: true,
            kv_heads,
            head_dim: hd,
            slots: Slots::From(start),
        };
        keys_c.inplace_op3(&k_c, &pos_c, &rope(&inv_c)).unwrap();
        keys_d.inplace_op3(&k_d, &pos_d, &rope(&inv_d)).unwrap();
        let copy = RowsIntoCache { kv_heads, head_dim: hd, slots: Slots::From(start) };
        vals_c.inplace_op2(&v_c, &copy).unwrap();
        vals_d.inplace_op2(&v_d, &copy).unwrap();
        assert!(bits_equal(&vals_c, &vals_d), "values into the cache");
        let worst =
            host(&keys_c).iter().zip(host(&keys_d)).map(|(a, b)| (a - b).abs() / a.abs().max(1.0)).fold(0f32, f32::max);
        assert!(worst <= 2e-6, "keys into the cache: {worst:e}");
        // Attention over the (GPU's own) caches, bit for bit against the reference on a copy.
        let keys_back = keys_d.to_device(&cpu).unwrap();
        let mut bias = vec![0f32; rows * total];
        for r in 0..rows {
            for j in 0..total {
                if (j * 31 + r * 7) % 11 == 0 && j != total - 1 {
                    bias[r * total + j] = f32::NEG_INFINITY;
                }
            }
        }
        let (bias_c, bias_d) = both(&Tensor::from_vec(bias, (rows, total), &cpu).unwrap());
        let (qr_c, qr_d) = both(&randn(&[rows, heads, hd]));
        let att_c = CacheAttention { keys: &keys_back, values: &vals_c, total, heads, scale: 0.125 };
        let att_d = CacheAttention { keys: &keys_d, values: &vals_d, total, heads, scale: 0.125 };
        let (a_c, a_d) =
            (qr_c.apply_op2_no_bwd(&bias_c, &att_c).unwrap(), qr_d.apply_op2_no_bwd(&bias_d, &att_d).unwrap());
        assert!(bits_equal(&a_c, &a_d), "attention, {total} positions");
        // The step kernels: slots and visibility read from a step's inputs on the device.
        let layout = engine::kernels::device::StepLayout { rows };
        let mut words = vec![0u32; layout.len()];
        words[layout.start()] = (cap - rows) as u32;
        words[layout.tail()] = (cap - rows) as u32;
        for (r, m) in engine::model::tree_masks(&(0..rows).map(|r| (r > 0).then(|| (r - 1) / 2)).collect::<Vec<_>>())
            .unwrap()
            .into_iter()
            .enumerate()
        {
            words[layout.masks().start + 2 * r] = m as u32;
        }
        let (step_c, step_d) = both(&Tensor::from_vec(words, layout.len(), &cpu).unwrap());
        let (vals2_c, vals2_d) = (vals_c.copy().unwrap(), vals_d.copy().unwrap());
        let copy = RowsIntoCache { kv_heads, head_dim: hd, slots: Slots::Step(&step_c) };
        vals2_c.inplace_op2(&v_c, &copy).unwrap();
        vals2_d.inplace_op2(&v_d, &RowsIntoCache { slots: Slots::Step(&step_d), ..copy }).unwrap();
        assert!(bits_equal(&vals2_c, &vals2_d), "values into the cache at the step's slots");
        let vals2_back = vals2_d.to_device(&cpu).unwrap();
        let step_att = |keys, values| engine::kernels::device::StepAttention { keys, values, heads, scale: 0.125 };
        let (s_c, s_d) = (
            qr_c.apply_op2_no_bwd(&step_c, &step_att(&keys_back, &vals2_back)).unwrap(),
            qr_d.apply_op2_no_bwd(&step_d, &step_att(&keys_d, &vals2_d)).unwrap(),
        );
        assert!(bits_equal(&s_c, &s_d), "step attention, {total} positions");
        // Greedy tokens, ties included.
        let mut logits = host(&randn(&[rows, 1000]));
        logits[3 * 1000 + 10] = 9.0;
        logits[3 * 1000 + 500] = 9.0;
        let (l_c, l_d) = both(&Tensor::from_vec(logits, (rows, 1000), &cpu).unwrap());
        let ids_c = l_c.apply_op1_no_bwd(&ArgmaxRows).unwrap().to_vec1::<u32>().unwrap();
        let ids_d = l_d.apply_op1_no_bwd(&ArgmaxRows).unwrap().to_device(&cpu).unwrap().to_vec1::<u32>().unwrap();
        assert_eq!(ids_c, ids_d);
        assert_eq!(ids_c[3], 10);
        // Probabilities at a temperature, and with min-p, top-k and top-p, bit for bit (the same
        // f64 exponential, sum tree and radix select), past the vocabulary of the default pair's
        // 151,936; a row with NaN comes back all NaN.
        let mut logits = host(&randn(&[3, 152_000]));
        logits[2 * 152_000 + 7] = f32::NAN;
        let (l_c, l_d) = both(&Tensor::from_vec(logits, (3, 152_000), &cpu).unwrap());
        let t = samplers::dist::Warp::temperature;
        for warp in [t(0.7), samplers::dist::Warp { min_p: 0.05, top_k: 100, top_p: 0.9, ..t(1.3) }] {
            let op = WarpRows::new(warp).unwrap();
            let p_host = |p: Tensor| p.to_device(&cpu).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap();
            let (p_c, p_d) = (p_host(l_c.apply_op1_no_bwd(&op).unwrap()), p_host(l_d.apply_op1_no_bwd(&op).unwrap()));
            assert!(p_c.iter().zip(&p_d).all(|(a, b)| a.to_bits() == b.to_bits()), "warp rows, {warp:?}");
            assert!(p_d[2 * 152_000..].iter().all(|x| x.is_nan()) && !p_d[0].is_nan());
            // A token drawn from the first row: the reference's for the same uniform.
            let row_d = l_d.apply_op1_no_bwd(&op).unwrap().narrow(0, 0, 1).unwrap();
            for u in [0.0, 0.3, 0.77, 0.999_999] {
                let id = row_d.apply_op1_no_bwd(&SampleRow { u }).unwrap().to_device(&cpu).unwrap();
                let want = engine::kernels::device::reference::sample_row(&p_c[..152_000], u);
                assert_eq!(id.to_vec1::<u32>().unwrap(), [want], "sample row, {warp:?}, u {u}");
            }
        }
        // A block's residual sum and the norm after it: bit for bit.
        let (ax_c, ax_d) = both(&randn(&[1, rows, 1536]));
        let (ay_c, ay_d) = both(&randn(&[1, rows, 1536]));
        let (aw_c, aw_d) = both(&randn(&[1536]));
        let norm = AddRmsNorm { eps: 1e-6 };
        let (an_c, an_d) =
            (ax_c.apply_op3_no_bwd(&ay_c, &aw_c, &norm).unwrap(), ax_d.apply_op3_no_bwd(&ay_d, &aw_d, &norm).unwrap());
        assert!(bits_equal(&an_c, &an_d), "add-rms-norm");
        // The gated MLP's activation of a joined gate/up product: bit for bit.
        let (gu_c, gu_d) = both(&randn(&[rows, 2 * 96]));
        let (sm_c, sm_d) = (gu_c.apply_op1_no_bwd(&SiluMul).unwrap(), gu_d.apply_op1_no_bwd(&SiluMul).unwrap());
        assert!(bits_equal(&sm_c, &sm_d), "silu-mul");
        // The accepted path kept in several buffers at once (the GPU's one launch), 70 kept
        // rows (two launches) when the cache holds them.
        let kept: Vec<u32> = if cap - start >= 140 { (0..70).map(|i| 2 * i).collect() } else { vec![0, 2, 3] };
        if start + *kept.last().unwrap() as usize >= cap {
            continue;
        }
        let bufs: Vec<Tensor> = (0..3).map(|_| randn(&[1, kv_heads, cap, hd])).collect();
        let bufs_d: Vec<Tensor> = bufs.iter().map(|b| b.to_device(&dev).unwrap()).collect();
        compact_rows(&bufs, start, &kept).unwrap();
        compact_rows(&bufs_d, start, &kept).unwrap();
        for (c, d) in bufs.iter().zip(&bufs_d) {
            assert!(bits_equal(c, d), "compact rows, {} kept", kept.len());
        }
    }
}

/// Rows warped on the device (`engine::kernels::device::WarpRows`, at a positive temperature:
/// on CUDA the kernel, on the CPU its reference) decode as rows warped on the host: with the
/// same seed, plain decoding and every kind of fixed tree with every draft source emit the
/// host warp's tokens, at temperature 0.8, at 1.0 with min-p 0.05 and at 0.9 with top-k 20 and
/// top-p 0.9 (their `p` and `q` differ only in the sums' rounding), with drafts accepted; with
/// the device warp on, every verified and drafted row went through it, with it off none did.
#[test]
fn rows_warped_on_the_device_decode_as_rows_warped_on_the_host() {
    use engine::decode::GenerationConfig;
    use samplers::dist::Warp;
    let (target, draft, head) = common::target_draft_head(73, "fused-warp");
    let (target, draft) = (with_fused(target, true), with_fused(draft, true));
    let prompt = [3u32, 9, 27, 4, 12, 36, 9, 27];
    let mut accepted = 0;
    let cut = Warp { top_k: 20, top_p: 0.9, ..Warp::temperature(0.9) };
    for warp in [Warp::temperature(0.8), Warp { min_p: 0.05, ..Warp::temperature(1.0) }, cut] {
        let base = GenerationConfig { warp, ..common::greedy(30, 5) };
        let mut configs = vec![("plain", base.clone())];
        // `auto` picks its trees from measured timings: its text at a temperature varies
        // from run to run whatever the warp.
        for (name, s) in common::every_kind_of_tree().into_iter().filter(|(name, _)| *name != "auto") {
            configs.push((name, GenerationConfig { speculative: Some(s), ..base.clone() }));
        }
        for (name, config) in &configs {
            let sources: &[&str] = if config.speculative.is_some() { &["self", "1-layer", "EAGLE"] } else { &["none"] };
            for &source in sources {
                let run = |on: bool| {
                    let mut g = match source {
                        "self" => Generator::new(&target, Some(&target), 200).unwrap(),
                        "1-layer" => Generator::new(&target, Some(&draft), 200).unwrap(),
                        "EAGLE" => Generator::with_eagle(&target, &head, 200).unwrap(),
                        _ => Generator::new(&target, None, 200).unwrap(),
                    };
                    g.set_device_warp(on);
                    assert_eq!(g.device_warp(), on);
                    g.generate(&prompt, config, |_| false, |_| Ok(())).unwrap()
                };
                let ((device, ds), (host, hs)) = (run(true), run(false));
                let what = format!("{name}, {source}, {warp:?}");
                assert_eq!(device, host, "{what}");
                assert_eq!(device.len(), 30, "{what}");
                assert_eq!(hs.device_warped_rows, 0, "{what}");
                // At least one row per step (the verified nodes), and the drafted nodes.
                assert!(ds.device_warped_rows >= ds.target_forwards, "{what}: {ds:?}");
                if ds.draft_forwards > 0 && source != "self" {
                    assert!(ds.device_warped_rows > ds.target_forwards, "{what}: no draft row warped: {ds:?}");
                }
                if ds.tau > 1.2 {
                    accepted += 1;
                }
            }
        }
    }
    assert!(accepted >= 10, "drafts were accepted in only {accepted} runs");
}

/// The output law with the warp on the device (the device-kernel path's models, the warp's
/// reference on the CPU): the first two tokens follow the exact autoregressive law, by
/// Pearson's chi-square over the 25 cells of a 5-token vocabulary (4,000 generations per case,
/// seeds 0..3999, p-value floor 1e-4; each case catches an error of 0.06 or more in total
/// variation with probability 0.9), with RRS: at temperature 1 over drafts with replacement,
/// with min-p over drafts without replacement, and at 0.8 with top-k 4 and top-p 0.9 over drafts
/// with replacement from the target's own first layer; every row of p and q came from the
/// device warp.
#[test]
fn the_device_warp_s_output_follows_the_target_law() {
    use crate::decode::{model, two_token_law, MIN_P, SMALL_PROMPT};
    use samplers::dist::Warp;
    use samplers::{DraftConstruction, Verifier};
    let small = |seed, layers| Tiny { vocab: 5, scale: 1.0, layers, ..Tiny::qwen2(seed) };
    let target = with_fused(model(small(31, 2), "warp-chi-target"), true);
    let other = with_fused(model(small(32, 1), "warp-chi-draft"), true);
    // The target's own first layer: its top-k drafts are the target's often enough.
    let shallow = with_fused(model(small(31, 1), "warp-chi-shallow"), true);
    let cut = Warp { top_k: 4, top_p: 0.9, ..Warp::temperature(0.8) };
    let cases = [
        (DraftConstruction::WithReplacement, Warp::temperature(1.0), &other),
        (DraftConstruction::WithoutReplacement, MIN_P, &other),
        (DraftConstruction::WithReplacement, cut, &shallow),
    ];
    for (c, warp, draft) in cases {
        let law = two_token_law(&target, warp);
        let mut generator = Generator::new(&target, Some(draft), 64).unwrap();
        assert!(generator.device_warp(), "the device warp is on by default");
        let tree = engine::DraftTree::preset("drafts-2-depth-2").unwrap();
        let config = |seed| common::two_tokens(seed, warp, tree.clone().into(), c, Verifier::Rrs, None);
        let counts = common::two_token_counts(&mut generator, &SMALL_PROMPT, 5, 4000, config, |stats| {
            assert!(stats.device_warped_rows >= 2, "the warp ran on the host: {stats:?}");
        });
        let tv = common::assert_follows_law(&counts, &law, 4000, None, &format!("device warp, {c}+rrs, {warp:?}"));
        assert!(tv <= 0.06, "detects only {tv:.4}");
    }
}
