//! The device ops on the CPU (their Rust reference) against candle's ops and the definitions.

use super::*;
use candle_core::{DType, Device, Tensor};
use reference::ATTENTION_CHUNK;

fn values(n: usize, seed: u32) -> Vec<f32> {
    crate::kernels::simd::test_values(n, seed)
}

/// Inverse frequencies of a LLaMA-like rotary embedding (theta 10,000) of width `d`.
fn inv_freq(d: usize) -> Vec<f32> {
    (0..d / 2).map(|i| 1.0 / 10_000f32.powf(2.0 * i as f32 / d as f32)).collect()
}

/// candle's rotary embedding as the model runs it: cos and sin of `pos * inv_freq` (times
/// `af`), in `dtype`, through `candle_nn`'s rope on `[1, heads, t, d]`; back to `[t, heads, d]`.
fn candle_rope(x: &Tensor, pos: &[u32], inv: &[f32], af: f32, interleaved: bool) -> Tensor {
    let (t, h, d) = x.dims3().unwrap();
    let dev = Device::Cpu;
    let p = Tensor::from_slice(pos, t, &dev).unwrap().to_dtype(DType::F32).unwrap().reshape((t, 1)).unwrap();
    let angles = p.broadcast_mul(&Tensor::from_slice(inv, (1, d / 2), &dev).unwrap()).unwrap();
    let (mut cos, mut sin) = (angles.cos().unwrap(), angles.sin().unwrap());
    if af != 1.0 {
        cos = (cos * af as f64).unwrap();
        sin = (sin * af as f64).unwrap();
    }
    let (cos, sin) = (cos.to_dtype(x.dtype()).unwrap(), sin.to_dtype(x.dtype()).unwrap());
    let xh = x.reshape((1, t, h, d)).unwrap().transpose(1, 2).unwrap().contiguous().unwrap();
    let r = if interleaved {
        candle_nn::rotary_emb::rope_i(&xh, &cos, &sin).unwrap()
    } else {
        candle_nn::rotary_emb::rope(&xh, &cos, &sin).unwrap()
    };
    r.transpose(1, 2).unwrap().contiguous().unwrap().reshape((t, h, d)).unwrap()
}

/// The bits of a tensor's elements, for bit-for-bit comparisons of any float dtype.
fn bits(t: &Tensor) -> Vec<u32> {
    let values = t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    values.iter().map(|x| x.to_bits()).collect()
}

/// [`RopeRows`] gives candle's rotary embedding bit for bit: f32, bf16 and f16, both
/// pairings, with and without YaRN's attention factor, at scattered positions.
#[test]
fn rope_rows_equal_candle_rope() {
    let (t, h, d) = (5, 3, 16);
    let inv = inv_freq(d);
    let pos = [0u32, 7, 3, 4095, 130_000];
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for interleaved in [false, true] {
            for af in [1.0f32, 1.2] {
                let x =
                    Tensor::from_vec(values(t * h * d, 3), (t, h, d), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
                let inv_t = Tensor::from_slice(&inv, d / 2, &Device::Cpu).unwrap();
                let op = RopeRows { inv_freq: &inv_t, attention_factor: af, interleaved, heads: h, head_dim: d };
                let positions = Tensor::from_slice(&pos, t, &Device::Cpu).unwrap();
                let ours = x.reshape((t, h * d)).unwrap().apply_op2_no_bwd(&positions, &op).unwrap();
                assert_eq!(ours.dims(), [t, h, d]);
                let theirs = candle_rope(&x, &pos, &inv, af, interleaved);
                assert_eq!(bits(&ours), bits(&theirs), "{dtype:?} interleaved {interleaved} af {af}");
            }
        }
    }
}

/// [`RopeIntoCache`] and [`RowsIntoCache`] write exactly what candle's rope and `slice_set`
/// write at the step's slots, and nothing else of the buffer.
#[test]
fn cache_writes_equal_rope_and_slice_set() {
    let (t, g, d, cap, start) = (4, 2, 8, 12, 5);
    let inv = inv_freq(d);
    let inv_t = Tensor::from_slice(&inv, d / 2, &Device::Cpu).unwrap();
    let pos = [5u32, 6, 6, 7];
    for dtype in [DType::F32, DType::BF16] {
        let k = Tensor::from_vec(values(t * g * d, 5), (t, g * d), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
        let v = Tensor::from_vec(values(t * g * d, 6), (t, g * d), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
        let before =
            Tensor::from_vec(values(g * cap * d, 7), (1, g, cap, d), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
        let (keys, vals) = (before.copy().unwrap(), before.copy().unwrap());
        let positions = Tensor::from_slice(&pos, t, &Device::Cpu).unwrap();
        let rope = RopeIntoCache {
            inv_freq: &inv_t,
            attention_factor: 1.0,
            interleaved: false,
            kv_heads: g,
            head_dim: d,
            slots: Slots::From(start),
        };
        keys.inplace_op3(&k, &positions, &rope).unwrap();
        vals.inplace_op2(&v, &RowsIntoCache { kv_heads: g, head_dim: d, slots: Slots::From(start) }).unwrap();
        // The same writes with the slot read from a step's inputs.
        let mut words = vec![0u32; StepLayout { rows: t }.len()];
        words[StepLayout { rows: t }.start()] = start as u32;
        words[StepLayout { rows: t }.tail()] = start as u32;
        let step = Tensor::from_slice(&words, words.len(), &Device::Cpu).unwrap();
        let (keys2, vals2) = (before.copy().unwrap(), before.copy().unwrap());
        keys2.inplace_op3(&k, &positions, &RopeIntoCache { slots: Slots::Step(&step), ..rope }).unwrap();
        vals2.inplace_op2(&v, &RowsIntoCache { kv_heads: g, head_dim: d, slots: Slots::Step(&step) }).unwrap();
        assert_eq!((bits(&keys2), bits(&vals2)), (bits(&keys), bits(&vals)), "{dtype:?}: slots from the step");
        let want_keys = before.copy().unwrap();
        let rotated = candle_rope(&k.reshape((t, g, d)).unwrap(), &pos, &inv, 1.0, false);
        want_keys
            .slice_set(&rotated.transpose(0, 1).unwrap().unsqueeze(0).unwrap().contiguous().unwrap(), 2, start)
            .unwrap();
        let want_vals = before.copy().unwrap();
        let rows = v.reshape((t, g, d)).unwrap().transpose(0, 1).unwrap().unsqueeze(0).unwrap().contiguous().unwrap();
        want_vals.slice_set(&rows, 2, start).unwrap();
        assert_eq!(bits(&keys), bits(&want_keys), "{dtype:?} keys");
        assert_eq!(bits(&vals), bits(&want_vals), "{dtype:?} values");
    }
    // A write past the buffer is refused.
    let k = Tensor::zeros((t, g * d), DType::F32, &Device::Cpu).unwrap();
    let cache = Tensor::zeros((1, g, cap, d), DType::F32, &Device::Cpu).unwrap();
    let e =
        cache.inplace_op2(&k, &RowsIntoCache { kv_heads: g, head_dim: d, slots: Slots::From(cap - 2) }).unwrap_err();
    assert!(e.to_string().contains("do not fit"), "{e}");
    let mut words = vec![0u32; StepLayout { rows: t }.len()];
    words[StepLayout { rows: t }.start()] = (cap - 2) as u32;
    let step = Tensor::from_slice(&words, words.len(), &Device::Cpu).unwrap();
    let e = cache.inplace_op2(&k, &RowsIntoCache { kv_heads: g, head_dim: d, slots: Slots::Step(&step) }).unwrap_err();
    assert!(e.to_string().contains("do not fit"), "{e}");
}

/// Attention in f64 by the definition: `softmax(q k^T * scale + bias) v` per (row, head).
fn attention_f64(q: &[f32], k: &[f32], v: &[f32], bias: &[f32], scale: f32, s: &AttentionShape) -> Vec<f64> {
    let (hd, rows) = (s.head_dim, q.len() / (s.heads * s.head_dim));
    let mut out = vec![0f64; rows * s.heads * hd];
    for r in 0..rows {
        for h in 0..s.heads {
            let g = h / (s.heads / s.kv_heads);
            let qh = &q[(r * s.heads + h) * hd..][..hd];
            let scores: Vec<f64> = (0..s.total)
                .map(|j| {
                    let kj = &k[(g * s.capacity + j) * hd..][..hd];
                    let dot: f64 = qh.iter().zip(kj).map(|(a, b)| *a as f64 * *b as f64).sum();
                    dot * scale as f64 + bias[r * s.total + j] as f64
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = w.iter().sum();
            for d in 0..hd {
                let o: f64 = (0..s.total).map(|j| w[j] * v[(g * s.capacity + j) * hd + d] as f64).sum();
                out[(r * s.heads + h) * hd + d] = o / l;
            }
        }
    }
    out
}

/// [`CacheAttention`] against attention by the definition in f64: every (row, head) within
/// 2e-6 of the largest output, across one, two and three key chunks (the last partly
/// used), grouped-query heads and a tree mask; and each row's output is bit for bit the one
/// it gets alone (batch invariance).
#[test]
fn cache_attention_follows_the_definition_and_rows_do_not_depend_on_the_batch() {
    let (heads, kv_heads, hd, rows) = (4, 2, 64, 5);
    for total in [9usize, 256, 257, 700] {
        let cap = total + 3;
        let s = AttentionShape { heads, kv_heads, head_dim: hd, capacity: cap, total };
        let q = values(rows * heads * hd, total as u32);
        let k = values(kv_heads * cap * hd, 11);
        let v = values(kv_heads * cap * hd, 12);
        // The last `rows` positions are a tree: row r sees the prefix, itself and (every other)
        // earlier tree row.
        let prefix = total - rows;
        let mut bias = vec![0f32; rows * total];
        for r in 0..rows {
            for c in 0..rows {
                if c > r || (c < r && (r - c) % 2 == 1) {
                    bias[r * total + prefix + c] = f32::NEG_INFINITY;
                }
            }
        }
        let dev = Device::Cpu;
        let keys = Tensor::from_slice(&k, (1, kv_heads, cap, hd), &dev).unwrap();
        let vals = Tensor::from_slice(&v, (1, kv_heads, cap, hd), &dev).unwrap();
        let op = CacheAttention { keys: &keys, values: &vals, total, heads, scale: 0.125 };
        let qt = Tensor::from_slice(&q, (rows, heads, hd), &dev).unwrap();
        let bt = Tensor::from_slice(&bias, (rows, total), &dev).unwrap();
        let got = qt.apply_op2_no_bwd(&bt, &op).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let want = attention_f64(&q, &k, &v, &bias, 0.125, &s);
        let largest = want.iter().fold(0f64, |a, b| a.max(b.abs()));
        let worst = got.iter().zip(&want).map(|(a, b)| (*a as f64 - b).abs()).fold(0f64, f64::max);
        assert!(worst <= 2e-6 * largest, "total {total}: worst {worst:e} of {largest}");
        for r in 0..rows {
            let q1 = qt.narrow(0, r, 1).unwrap();
            let b1 = bt.narrow(0, r, 1).unwrap();
            let alone = q1.apply_op2_no_bwd(&b1, &op).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let in_batch = &got[r * heads * hd..][..heads * hd];
            assert!(
                alone.iter().zip(in_batch).all(|(a, b)| a.to_bits() == b.to_bits()),
                "total {total}: row {r} depends on its batch"
            );
        }
    }
}

/// [`StepAttention`] is [`CacheAttention`] with the bias its inputs say, bit for bit: steps
/// of 1 to 7 rows (a chain, a tree, rows that see only themselves) after caches that end
/// inside, at the end of and past a key chunk, in a buffer of three chunks, with the masks
/// starting at the step's first row or 3 keys before it (a draft's tree level, which sees some
/// of the earlier levels); [`WriteWords`] fills the inputs in place.
#[test]
fn step_attention_equals_cache_attention_with_the_same_bias() {
    let (heads, kv_heads, hd, cap) = (4, 2, 32, 3 * ATTENTION_CHUNK);
    let dev = Device::Cpu;
    let keys = Tensor::from_vec(values(kv_heads * cap * hd, 21), (1, kv_heads, cap, hd), &dev).unwrap();
    let vals = Tensor::from_vec(values(kv_heads * cap * hd, 22), (1, kv_heads, cap, hd), &dev).unwrap();
    let dense = CacheAttention { keys: &keys, values: &vals, total: 1, heads, scale: 0.17 };
    let step_op = StepAttention { keys: &keys, values: &vals, heads, scale: 0.17 };
    for (rows, start) in [(1usize, 3usize), (1, 255), (3, 200), (7, 256), (5, 511), (2, 700)] {
        for back in [0usize, 3] {
            let (layout, tail) = (StepLayout { rows }, start - back);
            let inputs = Tensor::zeros(layout.len(), DType::U32, &dev).unwrap();
            let mut words = vec![0u32; layout.len()];
            words[layout.start()] = start as u32;
            words[layout.tail()] = tail as u32;
            // Row r sees itself, the rows before it of the same parity (a tree) and the middle
            // one of the keys between the tail and the step.
            for r in 0..rows {
                let own: u64 = (0..=r).filter(|c| (r - c) % 2 == 0).map(|c| 1u64 << (back + c)).sum();
                let mask = own | if back > 0 { 1 << 1 } else { 0 };
                words[layout.masks().start + 2 * r] = mask as u32;
                words[layout.masks().start + 2 * r + 1] = (mask >> 32) as u32;
            }
            inputs.inplace_op1(&WriteWords(&words)).unwrap();
            let total = start + rows;
            let bias: Vec<f32> = (0..rows)
                .flat_map(|r| (0..total).map(move |j| (r, j)))
                .map(|(r, j)| layout.bias(&words, r, j))
                .collect();
            let seen = bias.iter().filter(|b| **b == 0.0).count();
            let want_seen = rows * (tail + back.min(1)) + (0..rows).map(|r| r / 2 + 1).sum::<usize>();
            assert_eq!(seen, want_seen, "{rows} rows at {start}, tail {tail}");
            let q = Tensor::from_vec(values(rows * heads * hd, rows as u32), (rows, heads, hd), &dev).unwrap();
            let want = q
                .apply_op2_no_bwd(
                    &Tensor::from_vec(bias, (rows, total), &dev).unwrap(),
                    &CacheAttention { total, ..dense },
                )
                .unwrap();
            let got = q.apply_op2_no_bwd(&inputs, &step_op).unwrap();
            assert_eq!(bits(&got), bits(&want), "{rows} rows at {start}, tail {tail}");
        }
    }
    // Inputs for other rows than the queries', and a step past the buffer, are refused.
    let q = Tensor::zeros((2, heads, hd), DType::F32, &dev).unwrap();
    let inputs = Tensor::zeros(StepLayout { rows: 3 }.len(), DType::U32, &dev).unwrap();
    assert!(q.apply_op2_no_bwd(&inputs, &step_op).unwrap_err().to_string().contains("input words"));
    let mut words = vec![0u32; StepLayout { rows: 2 }.len()];
    words[StepLayout { rows: 2 }.start()] = (cap - 1) as u32;
    words[StepLayout { rows: 2 }.tail()] = (cap - 1) as u32;
    let inputs = Tensor::from_slice(&words, words.len(), &dev).unwrap();
    assert!(q.apply_op2_no_bwd(&inputs, &step_op).unwrap_err().to_string().contains("do not fit"));
    let e = inputs.inplace_op1(&WriteWords(&[1, 2])).unwrap_err();
    assert!(e.to_string().contains("2 words into 10"), "{e}");
}

/// The same in bf16 (values and output rounded to bf16): within 1% of the largest output.
#[test]
fn cache_attention_in_bf16() {
    let (heads, kv_heads, hd, rows, total) = (2, 1, 32, 3, 300);
    let s = AttentionShape { heads, kv_heads, head_dim: hd, capacity: total, total };
    let dev = Device::Cpu;
    let round = |x: Vec<f32>| -> Vec<f32> { x.iter().map(|v| half::bf16::from_f32(*v).to_f32()).collect() };
    let (q, k, v) = (round(values(rows * heads * hd, 1)), round(values(total * hd, 2)), round(values(total * hd, 3)));
    let bias = vec![0f32; rows * total];
    let t = |x: &[f32], shape: &[usize]| Tensor::from_slice(x, shape, &dev).unwrap().to_dtype(DType::BF16).unwrap();
    let (keys, vals) = (t(&k, &[1, kv_heads, total, hd]), t(&v, &[1, kv_heads, total, hd]));
    let op = CacheAttention { keys: &keys, values: &vals, total, heads, scale: 0.2 };
    let got = t(&q, &[rows, heads, hd]).apply_op2_no_bwd(&t(&bias, &[rows, total]), &op).unwrap();
    assert_eq!(got.dtype(), DType::BF16);
    let got = got.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let want = attention_f64(&q, &k, &v, &bias, 0.2, &s);
    let largest = want.iter().fold(0f64, |a, b| a.max(b.abs()));
    let worst = got.iter().zip(&want).map(|(a, b)| (*a as f64 - b).abs()).fold(0f64, f64::max);
    assert!(worst <= 1e-2 * largest, "worst {worst:e} of {largest}");
}

/// [`ArgmaxRows`]: the first of equal maxima, and `u32::MAX` for NaN, +inf or only -inf.
#[test]
fn argmax_rows_pick_the_first_maximum() {
    let inf = f32::INFINITY;
    let rows = [
        [0.5f32, 2.0, 2.0, -1.0],
        [-inf, -inf, -inf, -inf],
        [1.0, f32::NAN, 3.0, 0.0],
        [1.0, 2.0, inf, 0.0],
        [-3.0, -2.0, -7.0, -2.0],
    ];
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    let t = Tensor::from_slice(&flat, (5, 4), &Device::Cpu).unwrap();
    let ids = t.apply_op1_no_bwd(&ArgmaxRows).unwrap().to_vec1::<u32>().unwrap();
    assert_eq!(ids, [1, u32::MAX, u32::MAX, u32::MAX, 1]);
    // The same as the samplers' greedy pick on finite rows.
    for (row, &id) in rows.iter().zip(&ids) {
        if id != u32::MAX && row.iter().any(|x| x.is_finite()) {
            let mut p = Vec::new();
            samplers::dist::Warp::temperature(0.0).apply(row, &mut p).unwrap();
            assert_eq!(p[id as usize], 1.0, "{row:?}");
        }
    }
}

/// [`compact_rows`] keeps what gathering the kept rows and writing them back does (the cache's
/// former path): every buffer, every head, f32 and bf16, paths that keep the prefix, skip
/// rows, or keep nothing; the rows past the kept ones are left alone. Its CUDA launches, 64
/// kept rows each ([`reference::compact_launches`]), applied in order, equal one pass.
#[test]
fn compact_rows_equal_gathering_the_kept_rows() {
    let (g, cap, d, start) = (2, 90, 8, 5);
    let dev = Device::Cpu;
    let paths: [&[u32]; 5] = [&[], &[0, 1, 2], &[0, 2, 5], &[3], &[1, 4, 6, 7, 40, 80]];
    for dtype in [DType::F32, DType::BF16] {
        for (p, kept) in paths.iter().enumerate() {
            let fill = |seed| Tensor::from_vec(values(g * cap * d, seed), (1, g, cap, d), &dev).unwrap();
            let buffers: Vec<Tensor> = (0..3).map(|b| fill(10 * p as u32 + b).to_dtype(dtype).unwrap()).collect();
            let expected: Vec<Vec<u32>> = buffers
                .iter()
                .map(|b| {
                    let copy = b.copy().unwrap();
                    let n = cap - start;
                    let idx = Tensor::from_slice(kept, kept.len(), &dev).unwrap();
                    let gathered =
                        copy.narrow(2, start, n).unwrap().contiguous().unwrap().index_select(&idx, 2).unwrap();
                    copy.slice_set(&gathered, 2, start).unwrap();
                    bits(&copy)
                })
                .collect();
            compact_rows(&buffers, start, kept).unwrap();
            for (b, e) in buffers.iter().zip(&expected) {
                assert_eq!(&bits(b), e, "{dtype:?}, kept {kept:?}");
            }
        }
    }
    // Chunks of 4 kept rows (the kernel's 64, scaled down) equal one pass.
    let kept: Vec<u32> = vec![0, 2, 3, 7, 8, 9, 11, 20, 21, 30, 33];
    let whole = values(g * cap * d, 7);
    let mut one = whole.clone();
    reference::compact_rows(&mut one, cap, d, start, &kept);
    let mut chunked = whole;
    for (at, rows) in reference::compact_launches(start, &kept, 4) {
        reference::compact_rows(&mut chunked, cap, d, at, &rows);
    }
    assert_eq!(one, chunked);
    assert_ne!(one, values(g * cap * d, 7), "nothing moved");
    // Offsets that are not increasing, or run past the capacity, are refused.
    let b = [Tensor::zeros((1, g, cap, d), DType::F32, &dev).unwrap()];
    assert!(compact_rows(&b, start, &[2, 1]).is_err());
    assert!(compact_rows(&b, start, &[(cap - start) as u32]).is_err());
}

/// [`AddRmsNorm`] gives `x + y` rounded as candle adds, and the RMS norm of that sum within
/// 2e-6 relative of its f64 definition (f32), at widths below, at and past a block's threads;
/// bf16 sums equal candle's bf16 sums; shapes that do not match are refused.
#[test]
fn add_rms_norm_follows_the_definition() {
    let dev = Device::Cpu;
    for n in [7usize, 256, 1536] {
        let rows = 3;
        let x = Tensor::from_vec(values(rows * n, 1), (1, rows, n), &dev).unwrap();
        let y = Tensor::from_vec(values(rows * n, 2), (1, rows, n), &dev).unwrap();
        let w = Tensor::from_vec(values(n, 3), n, &dev).unwrap();
        let eps = 1e-6f32;
        let both = x.apply_op3_no_bwd(&y, &w, &AddRmsNorm { eps }).unwrap();
        assert_eq!(both.dims(), &[2, 1, rows, n]);
        let sum = (&x + &y).unwrap();
        assert_eq!(bits(&both.get(0).unwrap()), bits(&sum));
        let s = sum.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let got = both.get(1).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let wv = w.to_vec1::<f32>().unwrap();
        for r in 0..rows {
            let row = &s[r * n..(r + 1) * n];
            let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
            let scale = 1.0 / (ms + eps as f64).sqrt();
            for j in 0..n {
                let want = row[j] as f64 * scale * wv[j] as f64;
                let g = got[r * n + j] as f64;
                assert!((g - want).abs() <= 2e-6 * want.abs().max(1e-3), "n {n}: {g} against {want}");
            }
        }
        let (xb, yb, wb) =
            (x.to_dtype(DType::BF16).unwrap(), y.to_dtype(DType::BF16).unwrap(), w.to_dtype(DType::BF16).unwrap());
        let both = xb.apply_op3_no_bwd(&yb, &wb, &AddRmsNorm { eps }).unwrap();
        assert_eq!(bits(&both.get(0).unwrap()), bits(&(&xb + &yb).unwrap()));
    }
    let x = Tensor::zeros((2, 8), DType::F32, &dev).unwrap();
    assert!(x.apply_op3_no_bwd(&x, &Tensor::zeros(7, DType::F32, &dev).unwrap(), &AddRmsNorm { eps: 1e-6 }).is_err());
}

/// [`WarpRows`] against the host warp (`samplers::Warp` at a temperature, with min-p, top-k
/// and top-p): the same kept set and the same probabilities within 1e-12 relative (the sums of
/// up to 151,936 terms are taken in another order), whose ratio to the host's is one constant
/// within 1e-15 (each `e_i` is the host's: only the sums differ), on rows of 151,936 and 1,000
/// entries holding `-inf` and far-apart logits, and on rows of many equal logits, whose ties
/// top-k and top-p cut by id; a row with NaN, `+inf` or only `-inf` comes back all NaN; bad
/// warps and empty rows are errors.
#[test]
fn warp_rows_equal_the_host_warp() {
    use samplers::dist::Warp;
    let t = |temperature| Warp::temperature(temperature);
    let warps = [
        t(0.7),
        t(2.5),
        Warp { min_p: 0.05, ..t(1.0) },
        Warp { top_p: 0.9, ..t(0.7) },
        Warp { top_p: 0.95, ..t(1.0) },
        Warp { top_k: 50, ..t(0.7) },
        Warp { top_k: 2, ..t(1.5) },
        Warp { top_k: 40, top_p: 0.8, min_p: 0.01, ..t(1.2) },
        Warp { top_k: 1, ..t(1.0) },
    ];
    let mut ties_cut = 0;
    for (cols, seed, levels) in [(151_936usize, 3u32, 0), (1_000, 4, 0), (1_000, 5, 7), (300, 6, 3)] {
        let mut logits: Vec<f32> = values(2 * cols, seed).iter().map(|x| 8.0 * x).collect();
        if levels > 0 {
            // Few distinct logits: the kept set ends inside a run of ties.
            logits.iter_mut().for_each(|x| *x = (*x * levels as f32 / 8.0).round());
        }
        logits[5] = f32::NEG_INFINITY;
        logits[cols + 9] = 40.0;
        logits[cols + 10] = -1e30;
        let tensor = Tensor::from_slice(&logits, (2, cols), &Device::Cpu).unwrap();
        for warp in warps {
            let what = format!("{cols} cols, {levels} levels, {warp:?}");
            let p = tensor.apply_op1_no_bwd(&WarpRows::new(warp).unwrap()).unwrap();
            assert_eq!((p.dims2().unwrap(), p.dtype()), ((2, cols), DType::F64));
            let p = p.flatten_all().unwrap().to_vec1::<f64>().unwrap();
            for (row, got) in logits.chunks_exact(cols).zip(p.chunks_exact(cols)) {
                let mut want = Vec::new();
                warp.apply(row, &mut want).unwrap();
                let top = want.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
                let ratio = got[top] / want[top];
                for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(a == 0.0, b == 0.0, "{what}: entry {i} kept in one only");
                    assert!((a - b).abs() <= 1e-12 * b, "{what}: entry {i}: {a:e} against {b:e}");
                    if b > 1e-300 {
                        assert!((a / b - ratio).abs() <= 1e-15, "{what}: entry {i}'s ratio {}", a / b);
                    }
                }
                let kept = got.iter().filter(|&&x| x > 0.0).count();
                let full = warp.top_k == 0 && warp.top_p == 1.0 && warp.min_p == 0.0;
                // One entry of each row is -inf or -1e30; min-p, top-k and top-p keep fewer.
                assert!(if full { kept == cols - 1 } else { kept >= 1 && kept < cols / 2 }, "{what}: {kept} kept");
                // A cut inside a run of equal logits (equal probabilities): some kept, some not.
                let mut runs = std::collections::BTreeMap::<u32, (bool, bool)>::new();
                for (&l, &a) in row.iter().zip(got) {
                    let run = runs.entry(l.to_bits()).or_default();
                    run.0 |= a > 0.0;
                    run.1 |= a == 0.0;
                }
                ties_cut += runs.values().filter(|&&(kept, cut)| kept && cut).count();
            }
        }
    }
    assert!(ties_cut >= 3, "a cut fell inside a run of ties only {ties_cut} times");
    let inf = f32::INFINITY;
    let bad = [[1.0f32, f32::NAN, 0.0], [1.0, inf, 0.0], [-inf, -inf, -inf], [0.0, 1.0, -inf]];
    let tensor = Tensor::from_slice(bad.as_flattened(), (4, 3), &Device::Cpu).unwrap();
    for warp in [t(1.0), Warp { top_p: 0.5, ..t(1.0) }] {
        let p = tensor.apply_op1_no_bwd(&WarpRows::new(warp).unwrap()).unwrap().to_vec2::<f64>().unwrap();
        assert!(p[..3].iter().flatten().all(|x| x.is_nan()), "{p:?}");
        assert!(p[3].iter().all(|x| !x.is_nan()) && p[3][2] == 0.0, "{p:?}");
    }
    let bad_warps =
        [t(0.0), t(1e-310), t(f64::INFINITY), t(-1.0), Warp { min_p: 1.5, ..t(1.0) }, Warp { top_p: 0.0, ..t(1.0) }];
    for warp in bad_warps {
        assert!(WarpRows::new(warp).is_err(), "{warp:?}");
    }
    let empty = Tensor::zeros((0, 5), DType::F32, &Device::Cpu).unwrap();
    assert!(empty.apply_op1_no_bwd(&WarpRows::new(t(1.0)).unwrap()).is_err());
}

/// [`SampleRow`] draws the host's token: for the same uniform (the next of the same stream),
/// `samplers::dist::sample` gives the same token in 3,000 draws from rows of 151,936 and 1,000
/// warped probabilities (some cut to 0 by min-p) and a row of 3; a row without a positive entry
/// gives `u32::MAX`; more than one row, a uniform outside `[0, 1)` or another dtype are errors.
#[test]
fn sample_row_draws_the_host_s_token() {
    use rand::{Rng, SeedableRng};
    use samplers::dist::Warp;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut draws = 0;
    for (cols, seed, warp) in [
        (151_936usize, 8u32, Warp::temperature(0.7)),
        (1_000, 9, Warp { min_p: 0.1, ..Warp::temperature(1.0) }),
        (3, 10, Warp::temperature(2.0)),
    ] {
        let logits: Vec<f32> = values(cols, seed).iter().map(|x| 6.0 * x).collect();
        let mut p = Vec::new();
        warp.apply(&logits, &mut p).unwrap();
        let row = Tensor::from_slice(&p, (1, cols), &Device::Cpu).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..1000 {
            let mut host_rng = rng.clone();
            let want = samplers::dist::sample(&p, &mut host_rng);
            let u = rng.random::<f64>();
            let got = row.apply_op1_no_bwd(&SampleRow { u }).unwrap().to_vec1::<u32>().unwrap();
            assert_eq!(got, [want], "{cols} columns, u {u}");
            assert_eq!(reference::sample_row(&p, u), want);
            seen.insert(want);
            draws += 1;
        }
        assert!(seen.len() > 2.min(cols - 1), "{cols} columns: only {} tokens drawn", seen.len());
    }
    assert_eq!(draws, 3000);
    assert_eq!(reference::sample_row(&[0.0, f64::NAN, 0.0], 0.5), u32::MAX);
    let two = Tensor::from_slice(&[0.5f64, 0.5, 0.5, 0.5], (2, 2), &Device::Cpu).unwrap();
    assert!(two.apply_op1_no_bwd(&SampleRow { u: 0.5 }).is_err());
    let one = two.narrow(0, 0, 1).unwrap();
    assert!(one.apply_op1_no_bwd(&SampleRow { u: 1.0 }).is_err());
    assert!(one.to_dtype(DType::F32).unwrap().apply_op1_no_bwd(&SampleRow { u: 0.5 }).is_err());
    assert_eq!(one.apply_op1_no_bwd(&SampleRow { u: 0.75 }).unwrap().to_vec1::<u32>().unwrap(), [1]);
}
