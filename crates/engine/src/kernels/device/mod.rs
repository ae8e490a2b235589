//! The decode step's device kernels as candle ops: the rotary embedding of the query rows
//! ([`RopeRows`]), keys rotated straight into the KV cache at the step's slots
//! ([`RopeIntoCache`]) and values copied there ([`RowsIntoCache`]), attention of the new rows
//! against the cache read in place ([`CacheAttention`]), and the greedy token of each row of
//! logits ([`ArgmaxRows`]).
//!
//! On CUDA each runs a kernel of `decode.cu` (compiled to PTX by the build under the `cuda`
//! feature); on the CPU each runs [`reference`], the same algorithm in Rust, so that the CPU
//! tests check what the kernels compute and a model can run this path on the CPU too
//! (`DecoderModel::set_fused_decode`). The model's own CPU path does not use them: its kernels
//! are [`super::attention`] and the rest.
//!
//! Batch invariance: the attention splits the keys into fixed chunks of
//! [`reference::ATTENTION_CHUNK`] and combines them in chunk order, so a row's result depends
//! only on its query, its bias row and the cache, not on how many rows share the forward.

pub mod reference;

#[cfg(feature = "cuda")]
mod cuda;

use candle_core::backend::BackendStorage;
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, DType, InplaceOp2, InplaceOp3, Layout, Result, Shape, Tensor, WithDType,
};
use half::{bf16, f16};
use reference::{AttentionShape, RopeParams};

/// The contiguous elements of a CPU storage slice under `layout`.
fn contiguous<'a, T: WithDType>(data: &'a [T], layout: &Layout, what: &str) -> Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => bail!("{what}: expected a contiguous tensor"),
    }
}

/// The f32 values of a CPU tensor (inverse frequencies).
fn host_f32(t: &Tensor) -> Result<Vec<f32>> {
    t.to_device(&candle_core::Device::Cpu)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

/// The rotary embedding of the query rows: `[rows, heads * head_dim]` (or any shape with those
/// elements) at positions `[rows]` (u32) gives `[rows, heads, head_dim]`.
pub struct RopeRows<'a> {
    /// `[head_dim / 2]`, f32.
    pub inv_freq: &'a Tensor,
    pub attention_factor: f32,
    pub interleaved: bool,
    pub heads: usize,
    pub head_dim: usize,
}

impl CustomOp2 for RopeRows<'_> {
    fn name(&self) -> &'static str {
        "mdsd-rope-rows"
    }

    fn cpu_fwd(&self, x: &CpuStorage, xl: &Layout, pos: &CpuStorage, pl: &Layout) -> Result<(CpuStorage, Shape)> {
        let inv_freq = host_f32(self.inv_freq)?;
        let p =
            RopeParams { inv_freq: &inv_freq, attention_factor: self.attention_factor, interleaved: self.interleaved };
        let CpuStorage::U32(pos) = pos else { bail!("rope: positions must be u32") };
        let pos = contiguous(pos, pl, "rope positions")?;
        let rows = pos.len();
        let (h, d) = (self.heads, self.head_dim);
        if xl.shape().elem_count() != rows * h * d {
            bail!("rope: {:?} is not {rows} rows of {h} heads of {d}", xl.shape());
        }
        let out = match x {
            CpuStorage::F32(x) => CpuStorage::F32(reference::rope_rows(contiguous(x, xl, "rope")?, pos, h, d, &p)),
            CpuStorage::BF16(x) => CpuStorage::BF16(reference::rope_rows(contiguous(x, xl, "rope")?, pos, h, d, &p)),
            CpuStorage::F16(x) => CpuStorage::F16(reference::rope_rows(contiguous(x, xl, "rope")?, pos, h, d, &p)),
            other => bail!("rope: unsupported dtype {:?}", other.dtype()),
        };
        Ok((out, Shape::from((rows, h, d))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        xl: &Layout,
        pos: &candle_core::CudaStorage,
        pl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        cuda::rope_rows(self, x, xl, pos, pl)
    }
}

/// Keys rotated into a cache buffer (`[1, kv_heads, capacity, head_dim]`, the op's
/// destination): the rows `[rows, kv_heads * head_dim]` at positions `[rows]` (u32) go to cache
/// positions `start..start + rows`.
pub struct RopeIntoCache<'a> {
    pub inv_freq: &'a Tensor,
    pub attention_factor: f32,
    pub interleaved: bool,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub start: usize,
}

/// Cache geometry `(kv_heads, capacity, head_dim)` of a destination `[1, kv_heads, capacity,
/// head_dim]`, checked to be contiguous from offset 0 and to have room for `rows` at `start`.
fn cache_dims(l: &Layout, kv_heads: usize, head_dim: usize, start: usize, rows: usize) -> Result<usize> {
    let dims = l.dims();
    if dims.len() != 4 || dims[0] != 1 || dims[1] != kv_heads || dims[3] != head_dim || !l.is_contiguous() {
        bail!("cache buffer {dims:?} is not [1, {kv_heads}, capacity, {head_dim}] contiguous");
    }
    if l.start_offset() != 0 || start + rows > dims[2] {
        bail!("{rows} rows at {start} do not fit a cache of {} positions", dims[2]);
    }
    Ok(dims[2])
}

impl InplaceOp3 for RopeIntoCache<'_> {
    fn name(&self) -> &'static str {
        "mdsd-rope-into-cache"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dl: &Layout,
        x: &CpuStorage,
        xl: &Layout,
        pos: &CpuStorage,
        pl: &Layout,
    ) -> Result<()> {
        let inv_freq = host_f32(self.inv_freq)?;
        let p =
            RopeParams { inv_freq: &inv_freq, attention_factor: self.attention_factor, interleaved: self.interleaved };
        let CpuStorage::U32(pos) = pos else { bail!("rope: positions must be u32") };
        let pos = contiguous(pos, pl, "rope positions")?;
        let (g, d) = (self.kv_heads, self.head_dim);
        let capacity = cache_dims(dl, g, d, self.start, pos.len())?;
        if xl.shape().elem_count() != pos.len() * g * d {
            bail!("rope into cache: {:?} is not {} rows of {g} heads of {d}", xl.shape(), pos.len());
        }
        let rope = Some((&p, pos));
        match (dst, x) {
            (CpuStorage::F32(c), CpuStorage::F32(x)) => {
                reference::rows_into_cache(c, capacity, self.start, contiguous(x, xl, "keys")?, g, d, rope)
            }
            (CpuStorage::BF16(c), CpuStorage::BF16(x)) => {
                reference::rows_into_cache(c, capacity, self.start, contiguous(x, xl, "keys")?, g, d, rope)
            }
            (CpuStorage::F16(c), CpuStorage::F16(x)) => {
                reference::rows_into_cache(c, capacity, self.start, contiguous(x, xl, "keys")?, g, d, rope)
            }
            (c, x) => bail!("rope into cache: cache {:?} and keys {:?}", c.dtype(), x.dtype()),
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        dst: &mut candle_core::CudaStorage,
        dl: &Layout,
        x: &candle_core::CudaStorage,
        xl: &Layout,
        pos: &candle_core::CudaStorage,
        pl: &Layout,
    ) -> Result<()> {
        cuda::rope_into_cache(self, dst, dl, x, xl, pos, pl)
    }
}

/// Rows `[rows, kv_heads * head_dim]` copied into a cache buffer (the destination, `[1,
/// kv_heads, capacity, head_dim]`) at positions `start..start + rows`: the values.
pub struct RowsIntoCache {
    pub kv_heads: usize,
    pub head_dim: usize,
    pub start: usize,
}

impl InplaceOp2 for RowsIntoCache {
    fn name(&self) -> &'static str {
        "mdsd-rows-into-cache"
    }

    fn cpu_fwd(&self, dst: &mut CpuStorage, dl: &Layout, x: &CpuStorage, xl: &Layout) -> Result<()> {
        let (g, d) = (self.kv_heads, self.head_dim);
        let rows = xl.shape().elem_count() / (g * d);
        let capacity = cache_dims(dl, g, d, self.start, rows)?;
        match (dst, x) {
            (CpuStorage::F32(c), CpuStorage::F32(x)) => {
                reference::rows_into_cache(c, capacity, self.start, contiguous(x, xl, "values")?, g, d, None)
            }
            (CpuStorage::BF16(c), CpuStorage::BF16(x)) => {
                reference::rows_into_cache(c, capacity, self.start, contiguous(x, xl, "values")?, g, d, None)
            }
            (CpuStorage::F16(c), CpuStorage::F16(x)) => {
                reference::rows_into_cache(c, capacity, self.start, contiguous(x, xl, "values")?, g, d, None)
            }
            (c, x) => bail!("rows into cache: cache {:?} and rows {:?}", c.dtype(), x.dtype()),
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        dst: &mut candle_core::CudaStorage,
        dl: &Layout,
        x: &candle_core::CudaStorage,
        xl: &Layout,
    ) -> Result<()> {
        cuda::rows_into_cache(self, dst, dl, x, xl)
    }
}

/// Attention of the new rows (`q`: `[rows, heads, head_dim]`, rotated) against the first
/// `total` positions of the cache buffers `keys` and `values` (`[1, kv_heads, capacity,
/// head_dim]`, read in place), with the additive bias `[rows, total]`: `[rows, heads *
/// head_dim]`.
pub struct CacheAttention<'a> {
    pub keys: &'a Tensor,
    pub values: &'a Tensor,
    pub total: usize,
    pub heads: usize,
    pub scale: f32,
}

impl CacheAttention<'_> {
    /// The attention's geometry, checked against the cache buffers.
    fn shape(&self) -> Result<AttentionShape> {
        let (one, kv_heads, capacity, head_dim) = self.keys.dims4()?;
        if one != 1 || self.values.dims() != self.keys.dims() || self.total > capacity || self.total == 0 {
            bail!("attention: caches {:?}/{:?} for {} positions", self.keys.dims(), self.values.dims(), self.total);
        }
        if !self.heads.is_multiple_of(kv_heads) {
            bail!("attention: {} heads over {kv_heads} KV heads", self.heads);
        }
        Ok(AttentionShape { heads: self.heads, kv_heads, head_dim, capacity, total: self.total })
    }
}

impl CustomOp2 for CacheAttention<'_> {
    fn name(&self) -> &'static str {
        "mdsd-cache-attention"
    }

    fn cpu_fwd(&self, q: &CpuStorage, ql: &Layout, bias: &CpuStorage, bl: &Layout) -> Result<(CpuStorage, Shape)> {
        let s = self.shape()?;
        let rows = ql.shape().elem_count() / (s.heads * s.head_dim);
        if bl.dims() != [rows, s.total] {
            bail!("attention: bias {:?} for {rows} rows of {} positions", bl.dims(), s.total);
        }
        let (ks, kl) = self.keys.storage_and_layout();
        let (vs, vl) = self.values.storage_and_layout();
        let (candle_core::Storage::Cpu(ks), candle_core::Storage::Cpu(vs)) = (&*ks, &*vs) else {
            bail!("attention: the caches are not on the CPU")
        };
        let out = match (q, bias, ks, vs) {
            (CpuStorage::F32(q), CpuStorage::F32(b), CpuStorage::F32(k), CpuStorage::F32(v)) => {
                CpuStorage::F32(reference::cache_attention(
                    contiguous(q, ql, "queries")?,
                    contiguous(k, kl, "keys")?,
                    contiguous(v, vl, "values")?,
                    contiguous(b, bl, "bias")?,
                    self.scale,
                    &s,
                ))
            }
            (CpuStorage::BF16(q), CpuStorage::BF16(b), CpuStorage::BF16(k), CpuStorage::BF16(v)) => {
                CpuStorage::BF16(reference::cache_attention::<bf16>(
                    contiguous(q, ql, "queries")?,
                    contiguous(k, kl, "keys")?,
                    contiguous(v, vl, "values")?,
                    contiguous(b, bl, "bias")?,
                    self.scale,
                    &s,
                ))
            }
            (CpuStorage::F16(q), CpuStorage::F16(b), CpuStorage::F16(k), CpuStorage::F16(v)) => {
                CpuStorage::F16(reference::cache_attention::<f16>(
                    contiguous(q, ql, "queries")?,
                    contiguous(k, kl, "keys")?,
                    contiguous(v, vl, "values")?,
                    contiguous(b, bl, "bias")?,
                    self.scale,
                    &s,
                ))
            }
            _ => bail!("attention: queries, bias and caches must share one dtype"),
        };
        Ok((out, Shape::from((rows, s.heads * s.head_dim))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        ql: &Layout,
        bias: &candle_core::CudaStorage,
        bl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let s = self.shape()?;
        cuda::cache_attention(self, &s, q, ql, bias, bl)
    }
}

/// The greedy token of each row of f32 logits `[rows, cols]`: `[rows]` u32, the lowest index
/// among the largest values; `u32::MAX` for a row with NaN or `+inf`, or only `-inf`.
pub struct ArgmaxRows;

impl CustomOp1 for ArgmaxRows {
    fn name(&self) -> &'static str {
        "mdsd-argmax-rows"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, cols) = l.shape().dims2()?;
        let CpuStorage::F32(x) = s else { bail!("argmax: f32 logits expected, got {:?}", s.dtype()) };
        let ids = reference::argmax_rows(contiguous(x, l, "logits")?, cols);
        Ok((CpuStorage::U32(ids), Shape::from(rows)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        cuda::argmax_rows(s, l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Tensor};

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
        match t.dtype() {
            DType::F32 => t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|x| x.to_bits()).collect(),
            _ => t
                .to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect(),
        }
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
                    let x = Tensor::from_vec(values(t * h * d, 3), (t, h, d), &Device::Cpu)
                        .unwrap()
                        .to_dtype(dtype)
                        .unwrap();
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
            let before = Tensor::from_vec(values(g * cap * d, 7), (1, g, cap, d), &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let (keys, vals) = (before.copy().unwrap(), before.copy().unwrap());
            let positions = Tensor::from_slice(&pos, t, &Device::Cpu).unwrap();
            let rope = RopeIntoCache {
                inv_freq: &inv_t,
                attention_factor: 1.0,
                interleaved: false,
                kv_heads: g,
                head_dim: d,
                start,
            };
            keys.inplace_op3(&k, &positions, &rope).unwrap();
            vals.inplace_op2(&v, &RowsIntoCache { kv_heads: g, head_dim: d, start }).unwrap();
            let want_keys = before.copy().unwrap();
            let rotated = candle_rope(&k.reshape((t, g, d)).unwrap(), &pos, &inv, 1.0, false);
            want_keys
                .slice_set(&rotated.transpose(0, 1).unwrap().unsqueeze(0).unwrap().contiguous().unwrap(), 2, start)
                .unwrap();
            let want_vals = before.copy().unwrap();
            let rows =
                v.reshape((t, g, d)).unwrap().transpose(0, 1).unwrap().unsqueeze(0).unwrap().contiguous().unwrap();
            want_vals.slice_set(&rows, 2, start).unwrap();
            assert_eq!(bits(&keys), bits(&want_keys), "{dtype:?} keys");
            assert_eq!(bits(&vals), bits(&want_vals), "{dtype:?} values");
        }
        // A write past the buffer is refused.
        let k = Tensor::zeros((t, g * d), DType::F32, &Device::Cpu).unwrap();
        let cache = Tensor::zeros((1, g, cap, d), DType::F32, &Device::Cpu).unwrap();
        let e = cache.inplace_op2(&k, &RowsIntoCache { kv_heads: g, head_dim: d, start: cap - 2 }).unwrap_err();
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

    /// The same in bf16 (values and output rounded to bf16): within 1% of the largest output.
    #[test]
    fn cache_attention_in_bf16() {
        let (heads, kv_heads, hd, rows, total) = (2, 1, 32, 3, 300);
        let s = AttentionShape { heads, kv_heads, head_dim: hd, capacity: total, total };
        let dev = Device::Cpu;
        let round = |x: Vec<f32>| -> Vec<f32> { x.iter().map(|v| half::bf16::from_f32(*v).to_f32()).collect() };
        let (q, k, v) =
            (round(values(rows * heads * hd, 1)), round(values(total * hd, 2)), round(values(total * hd, 3)));
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
}
