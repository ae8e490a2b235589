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

/// On a GPU: each kernel against its Rust reference (the same op on the CPU), on fresh random
/// inputs. Attention, cache copies and argmax bit for bit in f32; the rotary embedding within
/// 2e-6 relative (the GPU's `cosf`/`sinf` against the CPU's).
#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs a GPU: build with --features cuda, run with MDSD_TEST_DEVICE=cuda")]
fn device_kernels_equal_their_reference() {
    use engine::kernels::device::{ArgmaxRows, CacheAttention, RopeIntoCache, RopeRows, RowsIntoCache};
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
            start,
        };
        keys_c.inplace_op3(&k_c, &pos_c, &rope(&inv_c)).unwrap();
        keys_d.inplace_op3(&k_d, &pos_d, &rope(&inv_d)).unwrap();
        let copy = RowsIntoCache { kv_heads, head_dim: hd, start };
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
        // Greedy tokens, ties included.
        let mut logits = host(&randn(&[rows, 1000]));
        logits[3 * 1000 + 10] = 9.0;
        logits[3 * 1000 + 500] = 9.0;
        let (l_c, l_d) = both(&Tensor::from_vec(logits, (rows, 1000), &cpu).unwrap());
        let ids_c = l_c.apply_op1_no_bwd(&ArgmaxRows).unwrap().to_vec1::<u32>().unwrap();
        let ids_d = l_d.apply_op1_no_bwd(&ArgmaxRows).unwrap().to_device(&cpu).unwrap().to_vec1::<u32>().unwrap();
        assert_eq!(ids_c, ids_d);
        assert_eq!(ids_c[3], 10);
    }
}
