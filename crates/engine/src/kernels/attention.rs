//! Attention of a few new rows against the KV cache on the CPU, read in place.
//!
//! The generic path (candle's f32 GEMM for `q k^T` and `w v`) copies every layer's cached keys
//! and values into contiguous tensors, allocates the score matrix, and asks the OS for the
//! core count on each GEMM; at one to a few new rows (decoding, draft trees) that overhead is
//! larger than the arithmetic. Here each KV head and group of up to `ROWS_PER_TASK` (8) new rows
//! is one task on the CPU worker pool, for all the query heads that share the KV head: scores
//! against the cache rows as stored (sixteen keys at a time, [`super::simd`]), the
//! additive bias, a softmax, and the weighted sum of values, written straight into the
//! `[1, t, heads * head_dim]` layout the output projection reads. Every (row, head) does the
//! same operations in the same order whatever rows share its task or forward, so a row's result
//! does not depend on how many rows share the forward.

use super::simd::{exp, key_dots, visible_sum, LANES};
use candle_core::{CpuStorage, DType, Layout, Result, Storage, Tensor};

/// New rows per task at most: each task reads its KV head's cache once for all of them.
const ROWS_PER_TASK: usize = 8;

/// Forwards of up to this many new rows take this path; longer ones use candle's GEMM.
/// Prompts are prefilled in chunks of this size (`crate::model::DecoderModel::forward_chain`).
pub const MAX_ROWS: usize = 256;

/// `softmax(q k^T * scale + bias) v` for `q` `[1, heads, t, head_dim]`, `k`/`v`
/// `[1, kv_heads, total, head_dim]` (views of the cache with unit stride along `head_dim`),
/// `bias` `[t, total]`; query head `h` reads KV head `h / (heads / kv_heads)`. Returns the
/// output as `[1, t, heads * head_dim]`, or `None` when this path does not apply (not f32 on
/// the CPU, or more than [`MAX_ROWS`] rows) and the caller should use the generic one.
pub fn attend(q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor, scale: f32) -> Result<Option<Tensor>> {
    let (_, heads, t, hd) = q.dims4()?;
    let (_, kv_heads, total, _) = k.dims4()?;
    let all_f32 = [q, k, v, bias].iter().all(|x| x.dtype() == DType::F32 && x.device().is_cpu());
    if !all_f32 || t > MAX_ROWS || kv_heads == 0 || heads % kv_heads != 0 || bias.dims() != [t, total] {
        return Ok(None);
    }
    let q = q.contiguous()?;
    let bias = bias.contiguous()?;
    let (qs, ql) = q.storage_and_layout();
    let (ks, kl) = k.storage_and_layout();
    let (vs, vl) = v.storage_and_layout();
    let (bs, bl) = bias.storage_and_layout();
    let (Some(q), Some(kc), Some(vc), Some(b)) = (f32s(&qs), f32s(&ks), f32s(&vs), f32s(&bs)) else {
        return Ok(None);
    };
    let (Some(kv_k), Some(kv_v)) = (CacheView::new(kl, hd), CacheView::new(vl, hd)) else {
        return Ok(None);
    };
    let q = &q[ql.start_offset()..];
    let b = &b[bl.start_offset()..];
    let groups = heads / kv_heads;
    let mut out = vec![0f32; t * heads * hd];
    let out_addr = out.as_mut_ptr() as usize;
    let out_len = out.len();
    // One task per (KV head, group of rows): the `groups` query heads sharing that KV head
    // and up to `per_task` new rows are done together, so each block of cached keys and values
    // is read once per task and reused from L1 by every (row, head) of it. Fewer rows per
    // task when that leaves threads idle.
    // (The pool's size, not `get_num_threads`, which asks the OS on every call.)
    let pool = crate::kernels::pool::pool();
    let per_task = (t * kv_heads).div_ceil(pool.n_workers() + 1).clamp(1, ROWS_PER_TASK);
    let row_groups = t.div_ceil(per_task);
    let work = |items: std::ops::Range<usize>| {
        // SAFETY: item (g, rg) writes only `out[r, h * hd..(h + 1) * hd]` for its rows `r` and
        // the query heads `h` of KV head `g`, and every item is run exactly once; `out`
        // outlives the dispatch.
        let out = unsafe { std::slice::from_raw_parts_mut(out_addr as *mut f32, out_len) };
        let mut scores = vec![0f32; per_task * groups * total];
        let mut queries = vec![0f32; per_task * groups * hd];
        let mut dots = vec![0f32; per_task * groups * LANES];
        for item in items {
            let (g, rg) = (item / row_groups, item % row_groups);
            let rows = rg * per_task..(rg * per_task + per_task).min(t);
            let n = rows.len();
            // (row ri, head i) is query row ri * groups + i of the task.
            for (ri, r) in rows.clone().enumerate() {
                for i in 0..groups {
                    queries[(ri * groups + i) * hd..][..hd]
                        .copy_from_slice(&q[((g * groups + i) * t + r) * hd..][..hd]);
                }
            }
            let brow = |ri: usize| &b[(rows.start + ri) * total..][..total];
            let qn = n * groups;
            key_scores(&queries[..qn * hd], groups, hd, &brow, scale, |j| kv_k.row(kc, g, j), &mut dots, &mut scores);
            for ri in 0..n {
                // Columns before the first masked one are all visible (the cache, for every row).
                let bias = brow(ri);
                let prefix = bias.iter().position(|&x| x == f32::NEG_INFINITY).unwrap_or(total);
                for i in 0..groups {
                    softmax(&mut scores[(ri * groups + i) * total..][..total], bias, prefix);
                }
            }
            // Blocks of cached rows: a block of values stays in L1 while every (row, head) of
            // the task adds it up into its (zeroed) output, each sum held in registers across
            // the block. The sum for each (row, head) runs over the cached rows in order, as the
            // plain loop does.
            for start in (0..total).step_by(VALUE_BLOCK) {
                let end = (start + VALUE_BLOCK).min(total);
                for ri in 0..n {
                    let bias = brow(ri);
                    if bias[start..end].iter().all(|&x| x == f32::NEG_INFINITY) {
                        continue;
                    }
                    let mut i = 0;
                    while i < groups {
                        let o = &mut out[((rows.start + ri) * heads + g * groups + i) * hd..];
                        let w = &scores[(ri * groups + i) * total..];
                        let v = |j| kv_v.row(vc, g, j);
                        // Two heads at a time: each value row loaded once for both.
                        if i + 1 < groups && (hd == 64 || hd == 128) {
                            let (o0, o1) = o[..2 * hd].split_at_mut(hd);
                            let w = [&w[..total], &w[total..2 * total]];
                            match hd {
                                64 => weighted_sum::<64, 2>([o0, o1], w, bias, start..end, v),
                                _ => weighted_sum::<128, 2>([o0, o1], w, bias, start..end, v),
                            }
                            i += 2;
                            continue;
                        }
                        let (o, w) = (&mut o[..hd], &w[..total]);
                        i += 1;
                        match hd {
                            64 => weighted_sum::<64, 1>([o], [w], bias, start..end, v),
                            128 => weighted_sum::<128, 1>([o], [w], bias, start..end, v),
                            _ => {
                                for j in start..end {
                                    if bias[j] != f32::NEG_INFINITY {
                                        axpy(w[j], kv_v.row(vc, g, j), o);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    // Small work (the query-key products) runs on this thread; each item does the same
    // arithmetic on either path.
    crate::kernels::pool::chunked(t * heads * total * hd, kv_heads * row_groups, work);
    Ok(Some(Tensor::from_vec(out, (1, t, heads * hd), &candle_core::Device::Cpu)?))
}

/// The f32 elements of a CPU storage.
fn f32s(s: &Storage) -> Option<&[f32]> {
    match s {
        Storage::Cpu(CpuStorage::F32(v)) => Some(v),
        _ => None,
    }
}

/// Where row `j` of KV head `g` starts in a `[1, kv_heads, len, head_dim]` view.
#[derive(Clone, Copy)]
struct CacheView {
    offset: usize,
    head_stride: usize,
    row_stride: usize,
    hd: usize,
}

impl CacheView {
    fn new(l: &Layout, hd: usize) -> Option<Self> {
        let s = l.stride();
        (s.len() == 4 && s[3] == 1 && s[2] >= hd).then(|| Self {
            offset: l.start_offset(),
            head_stride: s[1],
            row_stride: s[2],
            hd,
        })
    }

    #[inline]
    fn row<'a>(&self, data: &'a [f32], g: usize, j: usize) -> &'a [f32] {
        &data[self.offset + g * self.head_stride + j * self.row_stride..][..self.hd]
    }
}

/// `scores[m * total + j] = dot(query m, key j) * scale + bias_m[j]` for the query rows in
/// `queries` (`hd` each; query `m` belongs to new row `m / groups`, whose bias row is
/// `bias(m / groups)`), -inf where the bias is. Head sizes that are a multiple of 16 take
/// sixteen keys at a time for every query ([`key_dots`]; a key's dot is the same at every place
/// in a block, so the last, partial block repeats its last key); others the plain [`dot`].
#[allow(clippy::too_many_arguments)]
fn key_scores<'a, 'b>(
    queries: &[f32],
    groups: usize,
    hd: usize,
    bias: &dyn Fn(usize) -> &'b [f32],
    scale: f32,
    key: impl Fn(usize) -> &'a [f32],
    dots: &mut [f32],
    scores: &mut [f32],
) {
    let qn = queries.len() / hd;
    let total = bias(0).len();
    if !hd.is_multiple_of(LANES) {
        for (m, q) in queries.chunks_exact(hd).enumerate() {
            for (j, &b) in bias(m / groups).iter().enumerate() {
                scores[m * total + j] = if b == f32::NEG_INFINITY { b } else { dot(q, key(j)) * scale + b };
            }
        }
        return;
    }
    let rows = qn / groups;
    for start in (0..total).step_by(LANES) {
        let end = (start + LANES).min(total);
        let masked = |ri: usize| bias(ri)[start..end].iter().all(|&b| b == f32::NEG_INFINITY);
        if (0..rows).all(masked) {
            for m in 0..qn {
                scores[m * total + start..][..end - start].fill(f32::NEG_INFINITY);
            }
            continue;
        }
        let keys: [&[f32]; LANES] = std::array::from_fn(|l| key((start + l).min(end - 1)));
        key_dots(queries, hd, &keys, dots);
        for m in 0..qn {
            let block = &bias(m / groups)[start..end];
            let s = &mut scores[m * total + start..][..end - start];
            for ((s, &d), &b) in s.iter_mut().zip(&dots[m * LANES..]).zip(block) {
                *s = if b == f32::NEG_INFINITY { b } else { d * scale + b };
            }
        }
    }
}

/// Scores to softmax weights in place: `exp(s - max) / sum`, 0 where masked. The maximum is
/// exact in any order, `exp` is [`exp`] and the sum is [`visible_sum`], so the
/// weights depend on the visible scores only, not on where masked columns sit. `prefix`:
/// the columns before it are all visible.
fn softmax(s: &mut [f32], bias: &[f32], prefix: usize) {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = s.chunks_exact(LANES);
    let rest = chunks.remainder().iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for c in chunks {
        for l in 0..LANES {
            lanes[l] = lanes[l].max(c[l]);
        }
    }
    let max = lanes.iter().copied().fold(rest, f32::max);
    if max == f32::NEG_INFINITY {
        s.fill(0.0);
        return;
    }
    for x in s.iter_mut() {
        *x = exp(*x - max);
    }
    let inv = 1.0 / visible_sum(s, prefix, |j| bias[j] != f32::NEG_INFINITY);
    s.iter_mut().for_each(|x| *x *= inv);
}

/// Dot product with eight independent partial sums (vectorizes).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac.remainder().iter().zip(bc.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] = x[i].mul_add(y[i], acc[i]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Cached rows per block of [`weighted_sum`].
const VALUE_BLOCK: usize = 64;

/// `o[h] += sum_j w[h][j] * row(j)` for `H` heads reading the same value rows, over the
/// unmasked `j` of `rows`, in order, for rows of `HD` values: for each head the same operations
/// as [`axpy`] row after row, with the sums kept in local arrays (registers) across the block
/// and each row loaded once for all the heads.
#[inline(always)]
fn weighted_sum<'a, const HD: usize, const H: usize>(
    o: [&mut [f32]; H],
    w: [&[f32]; H],
    bias: &[f32],
    rows: std::ops::Range<usize>,
    row: impl Fn(usize) -> &'a [f32],
) {
    let mut acc = [[0f32; HD]; H];
    for (a, o) in acc.iter_mut().zip(&o) {
        a.copy_from_slice(&o[..HD]);
    }
    for j in rows {
        if bias[j] == f32::NEG_INFINITY {
            continue;
        }
        let x = &row(j)[..HD];
        let wj: [f32; H] = std::array::from_fn(|h| w[h][j]);
        for d in 0..HD {
            for h in 0..H {
                acc[h][d] = wj[h].mul_add(x[d], acc[h][d]);
            }
        }
    }
    for (o, a) in o.into_iter().zip(&acc) {
        o[..HD].copy_from_slice(a);
    }
}

/// `o += w * x`.
#[inline]
fn axpy(w: f32, x: &[f32], o: &mut [f32]) {
    for (o, &x) in o.iter_mut().zip(x) {
        *o = w.mul_add(x, *o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::simd::test_values as values;
    use candle_core::{Device, D};

    /// Against the same attention written with candle ops (repeat KV heads, matmul, softmax).
    #[test]
    fn matches_the_generic_attention_on_cache_views() {
        let dev = Device::Cpu;
        let (heads, kv_heads, hd, cap, past) = (4, 2, 16, 40, 9);
        for t in [1usize, 3, 6] {
            let total = past + t;
            let kbuf = Tensor::from_vec(values(kv_heads * cap * hd, 1), (1, kv_heads, cap, hd), &dev).unwrap();
            let vbuf = Tensor::from_vec(values(kv_heads * cap * hd, 2), (1, kv_heads, cap, hd), &dev).unwrap();
            let (k, v) = (kbuf.narrow(2, 0, total).unwrap(), vbuf.narrow(2, 0, total).unwrap());
            let q = Tensor::from_vec(values(heads * t * hd, 3), (1, heads, t, hd), &dev).unwrap();
            // A tree-shaped bias: row r sees the past, itself and row 0.
            let bias: Vec<f32> = (0..t * total)
                .map(|i| {
                    let (r, c) = (i / total, i % total);
                    if c < past || c == past + r || c == past {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect();
            let bias = Tensor::from_vec(bias, (t, total), &dev).unwrap();
            let scale = 0.25f32;
            let got = attend(&q, &k, &v, &bias, scale).unwrap().expect("cpu f32 path");
            let rep = |x: &Tensor| {
                Tensor::cat(
                    &[
                        x.narrow(1, 0, 1).unwrap(),
                        x.narrow(1, 0, 1).unwrap(),
                        x.narrow(1, 1, 1).unwrap(),
                        x.narrow(1, 1, 1).unwrap(),
                    ],
                    1,
                )
                .unwrap()
                .contiguous()
                .unwrap()
            };
            let scores =
                (q.matmul(&rep(&k).t().unwrap()).unwrap() * scale as f64).unwrap().broadcast_add(&bias).unwrap();
            let w = candle_nn::ops::softmax_last_dim(&scores).unwrap();
            let want = w.matmul(&rep(&v)).unwrap().transpose(1, 2).unwrap().reshape((1, t, heads * hd)).unwrap();
            let diff = (got - want).unwrap().abs().unwrap().max(D::Minus1).unwrap().flatten_all().unwrap();
            let diff = diff.max(0).unwrap().to_scalar::<f32>().unwrap();
            assert!(diff < 1e-5, "t = {t}: largest difference {diff}");
        }
    }

    /// Each row's output is the attention written out over its visible columns, bit for bit:
    /// scores by `lane_dot` (`dot` for head sizes that are not a multiple of 16), `exp` by
    /// `exp`, the sum of the compacted row by `visible_sum`, and the values added
    /// row by row with `axpy` (the blocked kernels hold the sums in registers). Head sizes 40
    /// (plain dot), 64 and 128 (AVX-512 key blocks where present) and 80 (portable key blocks);
    /// a past that ends inside a block of sixteen; trees of 5 and 13 rows (one task, and several
    /// tasks of up to `ROWS_PER_TASK` rows). A row's output is also
    /// bit for bit the same computed alone, as plain decoding does: one new row against the
    /// cache plus its visible tree columns, gathered without the masked ones.
    #[test]
    fn rows_equal_the_written_out_attention_and_themselves_alone_bit_for_bit() {
        use crate::kernels::simd::lane_dot;
        let dev = Device::Cpu;
        for (hd, past, t) in [(40usize, 150usize, 5usize), (64, 150, 5), (128, 150, 13), (128, 33, 5), (80, 17, 13)] {
            let (heads, kv_heads) = (6, 2);
            let total = past + t;
            let k = Tensor::from_vec(values(kv_heads * total * hd, 5), (1, kv_heads, total, hd), &dev).unwrap();
            let v = Tensor::from_vec(values(kv_heads * total * hd, 6), (1, kv_heads, total, hd), &dev).unwrap();
            let q = Tensor::from_vec(values(heads * t * hd, 7), (1, heads, t, hd), &dev).unwrap();
            // A binary tree: row n's parent is row (n - 1) / 2. Thirteen rows are more than one
            // task takes.
            let parent: Vec<usize> = (0..t).map(|n| if n == 0 { usize::MAX } else { (n - 1) / 2 }).collect();
            let visible = |r: usize, c: usize| {
                if c < past {
                    return true;
                }
                let mut n = r;
                loop {
                    if c == past + n {
                        return true;
                    }
                    if parent[n] == usize::MAX {
                        return false;
                    }
                    n = parent[n];
                }
            };
            let bias: Vec<f32> =
                (0..t * total).map(|i| if visible(i / total, i % total) { 0.0 } else { f32::NEG_INFINITY }).collect();
            let scale = 1.0 / (hd as f32).sqrt();
            let bias_t = Tensor::from_vec(bias.clone(), (t, total), &dev).unwrap();
            let got = attend(&q, &k, &v, &bias_t, scale).unwrap().unwrap().flatten_all().unwrap();
            let got = got.to_vec1::<f32>().unwrap();
            let (qv, kv, vv) = (
                q.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                k.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                v.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            );
            let groups = heads / kv_heads;
            for r in 0..t {
                let cols: Vec<usize> = (0..total).filter(|&c| visible(r, c)).collect();
                for h in 0..heads {
                    let g = h / groups;
                    let query = &qv[(h * t + r) * hd..][..hd];
                    let key = |j: usize| &kv[(g * total + j) * hd..][..hd];
                    let s: Vec<f32> = cols
                        .iter()
                        .map(|&j| if hd % 16 == 0 { lane_dot(query, key(j)) } else { dot(query, key(j)) } * scale)
                        .collect();
                    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let e: Vec<f32> = s.iter().map(|&x| exp(x - max)).collect();
                    let inv = 1.0 / visible_sum(&e, e.len(), |_| true);
                    let mut o = vec![0f32; hd];
                    for (&j, &e) in cols.iter().zip(&e) {
                        axpy(e * inv, &vv[(g * total + j) * hd..][..hd], &mut o);
                    }
                    assert_eq!(&got[(r * heads + h) * hd..][..hd], &o[..], "hd {hd}, row {r}, head {h}");
                }
                // Row r alone: its visible key and value rows gathered, no mask.
                let idx =
                    Tensor::from_vec(cols.iter().map(|&c| c as u32).collect::<Vec<_>>(), cols.len(), &dev).unwrap();
                let alone = attend(
                    &q.narrow(2, r, 1).unwrap(),
                    &k.index_select(&idx, 2).unwrap(),
                    &v.index_select(&idx, 2).unwrap(),
                    &Tensor::zeros((1, cols.len()), DType::F32, &dev).unwrap(),
                    scale,
                )
                .unwrap()
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
                assert_eq!(&got[r * heads * hd..][..heads * hd], &alone[..], "hd {hd}, row {r} alone");
            }
        }
    }

    #[test]
    fn declines_what_it_does_not_handle() {
        let dev = Device::Cpu;
        let q = Tensor::zeros((1, 2, MAX_ROWS + 1, 8), DType::F32, &dev).unwrap();
        let kv = Tensor::zeros((1, 1, MAX_ROWS + 1, 8), DType::F32, &dev).unwrap();
        let bias = Tensor::zeros((MAX_ROWS + 1, MAX_ROWS + 1), DType::F32, &dev).unwrap();
        assert!(attend(&q, &kv, &kv, &bias, 1.0).unwrap().is_none());
        let q = q.narrow(2, 0, 2).unwrap().to_dtype(DType::F16).unwrap();
        let kv = kv.narrow(2, 0, 2).unwrap().to_dtype(DType::F16).unwrap();
        let bias = bias.narrow(0, 0, 2).unwrap().narrow(1, 0, 2).unwrap().to_dtype(DType::F16).unwrap();
        assert!(attend(&q, &kv, &kv, &bias, 1.0).unwrap().is_none());
    }
}
