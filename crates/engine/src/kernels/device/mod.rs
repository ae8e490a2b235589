//! The decode step's device kernels as candle ops: the rotary embedding of the query rows
//! ([`RopeRows`]), keys rotated straight into the KV cache at the step's slots
//! ([`RopeIntoCache`]) and values copied there ([`RowsIntoCache`]), attention of the new rows
//! against the cache read in place ([`CacheAttention`]), a block's residual sum with the RMS
//! norm after it ([`AddRmsNorm`]), the gated MLP's activation of a joined gate/up product
//! ([`SiluMul`]), the accepted path kept in every layer's cache in one pass
//! ([`compact_rows`]), the greedy token of each row of logits ([`ArgmaxRows`]) and each row's
//! probabilities at a temperature ([`WarpRows`]).
//!
//! On CUDA each runs a kernel of `decode.cu` (compiled to PTX by the build under the `cuda`
//! feature); on the CPU each runs [`mod@reference`], the same algorithm in Rust, so that the CPU
//! tests check what the kernels compute and a model can run this path on the CPU too
//! (`DecoderModel::set_fused_decode`). The model's own CPU path does not use them: its kernels
//! are [`super::attention`] and the rest.
//!
//! Batch invariance: the attention splits the keys into fixed chunks of
//! [`reference::ATTENTION_CHUNK`] and combines them in chunk order, so a row's result depends
//! only on its query, its bias row and the cache, not on how many rows share the forward.

pub mod graph;
pub mod reference;
mod select;

#[cfg(feature = "cuda")]
mod cuda;

use candle_core::backend::BackendStorage;
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, DType, InplaceOp2, InplaceOp3, Layout, Result, Shape, Tensor, WithDType,
};
use half::{bf16, f16};
pub use reference::StepLayout;
use reference::{AttentionShape, RopeParams};
pub use select::{ArgmaxRows, SampleRow, WarpRows};

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

/// Where rows written into a cache go: from a slot the host gives, or from the start word of a
/// step's inputs ([`reference::StepLayout`], a `u32` tensor on the cache's device), which a
/// graph replay reads anew each time. The CPU ops read that word and check the rows fit; the
/// CUDA kernels cannot, and drop rows past the capacity (the caller checks, `KvCache::reserve`).
#[derive(Clone, Copy)]
pub enum Slots<'a> {
    From(usize),
    Step(&'a Tensor),
}

impl Slots<'_> {
    /// The first slot, read on the host (the CPU ops; a step's inputs must be on the CPU).
    fn host_start(&self) -> Result<usize> {
        match self {
            Self::From(s) => Ok(*s),
            Self::Step(t) => Ok(step_words(t)?[reference::StepLayout::of(t.elem_count()).start()] as usize),
        }
    }
}

/// A step's input words on the CPU.
fn step_words(t: &Tensor) -> Result<Vec<u32>> {
    if t.dtype() != DType::U32 || t.rank() != 1 || t.elem_count() < 6 || t.elem_count() % 4 != 2 {
        bail!("step inputs: expected a u32 vector of 4 rows + 2 words, got {:?} {:?}", t.dtype(), t.dims());
    }
    if !t.device().is_cpu() {
        bail!("step inputs: read on the host, but they are on {:?}", t.device().location());
    }
    t.to_vec1::<u32>()
}

/// Keys rotated into a cache buffer (`[1, kv_heads, capacity, head_dim]`, the op's
/// destination): the rows `[rows, kv_heads * head_dim]` at positions `[rows]` (u32) go to cache
/// positions `start..start + rows`, `start` as `slots` gives it.
pub struct RopeIntoCache<'a> {
    pub inv_freq: &'a Tensor,
    pub attention_factor: f32,
    pub interleaved: bool,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub slots: Slots<'a>,
}

/// Cache geometry `(kv_heads, capacity, head_dim)` of a destination `[1, kv_heads, capacity,
/// head_dim]`, checked to be contiguous from offset 0 and to have room for `rows` at `start`
/// (when the host knows it).
fn cache_dims(l: &Layout, kv_heads: usize, head_dim: usize, start: Option<usize>, rows: usize) -> Result<usize> {
    let dims = l.dims();
    if dims.len() != 4 || dims[0] != 1 || dims[1] != kv_heads || dims[3] != head_dim || !l.is_contiguous() {
        bail!("cache buffer {dims:?} is not [1, {kv_heads}, capacity, {head_dim}] contiguous");
    }
    if l.start_offset() != 0 || start.unwrap_or(0) + rows > dims[2] {
        bail!("{rows} rows at {} do not fit a cache of {} positions", start.unwrap_or(0), dims[2]);
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
        let start = self.slots.host_start()?;
        let capacity = cache_dims(dl, g, d, Some(start), pos.len())?;
        if xl.shape().elem_count() != pos.len() * g * d {
            bail!("rope into cache: {:?} is not {} rows of {g} heads of {d}", xl.shape(), pos.len());
        }
        let rope = Some((&p, pos));
        match (dst, x) {
            (CpuStorage::F32(c), CpuStorage::F32(x)) => {
                reference::rows_into_cache(c, capacity, start, contiguous(x, xl, "keys")?, g, d, rope)
            }
            (CpuStorage::BF16(c), CpuStorage::BF16(x)) => {
                reference::rows_into_cache(c, capacity, start, contiguous(x, xl, "keys")?, g, d, rope)
            }
            (CpuStorage::F16(c), CpuStorage::F16(x)) => {
                reference::rows_into_cache(c, capacity, start, contiguous(x, xl, "keys")?, g, d, rope)
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
/// kv_heads, capacity, head_dim]`) at positions `start..start + rows`, `start` as `slots`
/// gives it: the values.
pub struct RowsIntoCache<'a> {
    pub kv_heads: usize,
    pub head_dim: usize,
    pub slots: Slots<'a>,
}

impl InplaceOp2 for RowsIntoCache<'_> {
    fn name(&self) -> &'static str {
        "mdsd-rows-into-cache"
    }

    fn cpu_fwd(&self, dst: &mut CpuStorage, dl: &Layout, x: &CpuStorage, xl: &Layout) -> Result<()> {
        let (g, d) = (self.kv_heads, self.head_dim);
        let rows = xl.shape().elem_count() / (g * d);
        let start = self.slots.host_start()?;
        let capacity = cache_dims(dl, g, d, Some(start), rows)?;
        match (dst, x) {
            (CpuStorage::F32(c), CpuStorage::F32(x)) => {
                reference::rows_into_cache(c, capacity, start, contiguous(x, xl, "values")?, g, d, None)
            }
            (CpuStorage::BF16(c), CpuStorage::BF16(x)) => {
                reference::rows_into_cache(c, capacity, start, contiguous(x, xl, "values")?, g, d, None)
            }
            (CpuStorage::F16(c), CpuStorage::F16(x)) => {
                reference::rows_into_cache(c, capacity, start, contiguous(x, xl, "values")?, g, d, None)
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

/// Attention of a step's rows (`q`: `[rows, heads, head_dim]`, rotated) against the cache
/// buffers read in place, the visibility read from the step's inputs (the op's second operand,
/// [`reference::StepLayout`]): every cached position before the layout's tail, and from there
/// the keys in each row's mask. The same arithmetic as [`CacheAttention`] with the bias that says
/// the same (0 or `-inf`), over chunks of the whole buffer, so that the launch is the same
/// at every step (a graph replays it). `[rows, heads * head_dim]`.
pub struct StepAttention<'a> {
    pub keys: &'a Tensor,
    pub values: &'a Tensor,
    pub heads: usize,
    pub scale: f32,
}

impl StepAttention<'_> {
    /// The geometry (`total` is the buffer's capacity until the step's start is read).
    fn shape(&self) -> Result<AttentionShape> {
        CacheAttention { keys: self.keys, values: self.values, total: 1, heads: self.heads, scale: self.scale }
            .shape()
            .map(|s| AttentionShape { total: s.capacity, ..s })
    }
}

impl CustomOp2 for StepAttention<'_> {
    fn name(&self) -> &'static str {
        "mdsd-step-attention"
    }

    fn cpu_fwd(&self, q: &CpuStorage, ql: &Layout, inputs: &CpuStorage, il: &Layout) -> Result<(CpuStorage, Shape)> {
        let s = self.shape()?;
        let rows = ql.shape().elem_count() / (s.heads * s.head_dim);
        let CpuStorage::U32(inputs) = inputs else { bail!("step attention: the step's inputs must be u32") };
        let inputs = contiguous(inputs, il, "step inputs")?;
        if (reference::StepLayout { rows }).len() != inputs.len() {
            bail!("step attention: {} input words for {rows} rows", inputs.len());
        }
        let start = inputs[reference::StepLayout { rows }.start()] as usize;
        if start + rows > s.capacity {
            bail!("step attention: {rows} rows at {start} do not fit a cache of {} positions", s.capacity);
        }
        let (ks, kl) = self.keys.storage_and_layout();
        let (vs, vl) = self.values.storage_and_layout();
        let (candle_core::Storage::Cpu(ks), candle_core::Storage::Cpu(vs)) = (&*ks, &*vs) else {
            bail!("step attention: the caches are not on the CPU")
        };
        macro_rules! run {
            ($q:expr, $k:expr, $v:expr, $t:ty, $variant:ident) => {
                CpuStorage::$variant(reference::step_attention::<$t>(
                    contiguous($q, ql, "queries")?,
                    contiguous($k, kl, "keys")?,
                    contiguous($v, vl, "values")?,
                    inputs,
                    self.scale,
                    &s,
                ))
            };
        }
        let out = match (q, ks, vs) {
            (CpuStorage::F32(q), CpuStorage::F32(k), CpuStorage::F32(v)) => run!(q, k, v, f32, F32),
            (CpuStorage::BF16(q), CpuStorage::BF16(k), CpuStorage::BF16(v)) => run!(q, k, v, bf16, BF16),
            (CpuStorage::F16(q), CpuStorage::F16(k), CpuStorage::F16(v)) => run!(q, k, v, f16, F16),
            _ => bail!("step attention: queries and caches must share one dtype"),
        };
        Ok((out, Shape::from((rows, s.heads * s.head_dim))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        ql: &Layout,
        inputs: &candle_core::CudaStorage,
        il: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let s = self.shape()?;
        cuda::step_attention(self, &s, q, ql, inputs, il)
    }
}

/// Host words written into a `u32` tensor in place (its whole contiguous extent): a step's
/// inputs into the buffer a graph reads. On CUDA one copy to the device, queued on its stream.
pub struct WriteWords<'a>(pub &'a [u32]);

impl candle_core::InplaceOp1 for WriteWords<'_> {
    fn name(&self) -> &'static str {
        "mdsd-write-words"
    }

    fn cpu_fwd(&self, dst: &mut CpuStorage, l: &Layout) -> Result<()> {
        let CpuStorage::U32(d) = dst else { bail!("write words: the destination must be u32") };
        let Some((a, b)) = l.contiguous_offsets() else { bail!("write words: the destination is not contiguous") };
        if b - a != self.0.len() {
            bail!("write words: {} words into {}", self.0.len(), b - a);
        }
        d[a..b].copy_from_slice(self.0);
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, dst: &mut candle_core::CudaStorage, l: &Layout) -> Result<()> {
        cuda::write_words(self.0, dst, l)
    }
}

/// A block's residual sum and the RMS norm after it, in one pass ([`reference::add_rms_norm`]):
/// `x` and `y` (`[.., n]`, one dtype) and the norm's weight `w` (`[n]`) give `[2, ..]`: `x + y`
/// at index 0, its norm at 1 (one launch on CUDA, where candle's ops take two).
pub struct AddRmsNorm {
    pub eps: f32,
}

impl AddRmsNorm {
    /// The row width, row count and the output's shape of inputs shaped `l`, checked against
    /// `y`'s and `w`'s.
    fn shape(l: &Layout, yl: &Layout, wl: &Layout) -> Result<(usize, usize, Shape)> {
        let n = l.dims().last().copied().unwrap_or(0);
        if n == 0 || yl.dims() != l.dims() || wl.dims() != [n] {
            bail!("add-rms-norm: {:?} + {:?} normed by {:?}", l.dims(), yl.dims(), wl.dims());
        }
        let mut dims = vec![2];
        dims.extend_from_slice(l.dims());
        Ok((n, l.shape().elem_count() / n, Shape::from(dims)))
    }
}

impl candle_core::CustomOp3 for AddRmsNorm {
    fn name(&self) -> &'static str {
        "mdsd-add-rms-norm"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        xl: &Layout,
        y: &CpuStorage,
        yl: &Layout,
        w: &CpuStorage,
        wl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, _, shape) = Self::shape(xl, yl, wl)?;
        macro_rules! run {
            ($x:expr, $y:expr, $w:expr, $variant:ident) => {{
                let (x, y, w) = (contiguous($x, xl, "x")?, contiguous($y, yl, "y")?, contiguous($w, wl, "w")?);
                let (mut sums, normed) = reference::add_rms_norm(x, y, w, n, self.eps);
                sums.extend(normed);
                CpuStorage::$variant(sums)
            }};
        }
        let out = match (x, y, w) {
            (CpuStorage::F32(x), CpuStorage::F32(y), CpuStorage::F32(w)) => run!(x, y, w, F32),
            (CpuStorage::BF16(x), CpuStorage::BF16(y), CpuStorage::BF16(w)) => run!(x, y, w, BF16),
            (CpuStorage::F16(x), CpuStorage::F16(y), CpuStorage::F16(w)) => run!(x, y, w, F16),
            _ => bail!("add-rms-norm: {:?}, {:?} and {:?}", x.dtype(), y.dtype(), w.dtype()),
        };
        Ok((out, shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        xl: &Layout,
        y: &candle_core::CudaStorage,
        yl: &Layout,
        w: &candle_core::CudaStorage,
        wl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (n, rows, shape) = Self::shape(xl, yl, wl)?;
        cuda::add_rms_norm(self.eps, (x, xl), (y, yl), (w, wl), n, rows, shape)
    }
}

/// The gated MLP's activation of a joined gate/up product ([`reference::silu_mul`]): `[..,
/// 2n]` (gate columns, then up columns) gives `[.., n]`, `silu(gate) * up`, in one pass (one
/// launch on CUDA, where candle's ops take two and a temporary).
pub struct SiluMul;

impl CustomOp1 for SiluMul {
    fn name(&self) -> &'static str {
        "mdsd-silu-mul"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, shape) = silu_mul_shape(l)?;
        let out = match s {
            CpuStorage::F32(x) => CpuStorage::F32(reference::silu_mul(contiguous(x, l, "silu-mul")?, n)),
            CpuStorage::BF16(x) => CpuStorage::BF16(reference::silu_mul(contiguous(x, l, "silu-mul")?, n)),
            CpuStorage::F16(x) => CpuStorage::F16(reference::silu_mul(contiguous(x, l, "silu-mul")?, n)),
            other => bail!("silu-mul: unsupported dtype {:?}", other.dtype()),
        };
        Ok((out, shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        let (n, shape) = silu_mul_shape(l)?;
        cuda::silu_mul(s, l, n, shape)
    }
}

/// The half width `n` of a joined gate/up product and the activation's shape (`[.., n]`).
fn silu_mul_shape(l: &Layout) -> Result<(usize, Shape)> {
    let mut dims = l.dims().to_vec();
    match dims.last_mut() {
        Some(w) if *w % 2 == 0 && *w > 0 => {
            *w /= 2;
            Ok((*w, Shape::from(dims)))
        }
        _ => bail!("silu-mul: {:?} is not [.., 2n]", l.dims()),
    }
}

/// Keeps, in every cache buffer of `buffers` (`[1, kv_heads, capacity, head_dim]` each, one
/// shape, dtype and device), the positions from `start` on at offsets `kept` (strictly
/// increasing), moved to `start, start + 1, ...` ([`reference::compact_rows`]): the accepted
/// path of a speculative step kept in every layer's keys and values. On CUDA one kernel launch
/// serves up to 128 buffers and 64 kept rows (its tables are kernel parameters: nothing is
/// uploaded or allocated; more take further launches in order); on the CPU the reference runs
/// on each buffer.
pub fn compact_rows(buffers: &[Tensor], start: usize, kept: &[u32]) -> Result<()> {
    let Some(first) = buffers.first() else { return Ok(()) };
    let dims = first.dims();
    if dims.len() != 4 || dims[0] != 1 {
        bail!("compact rows: cache buffer {dims:?} is not [1, kv_heads, capacity, head_dim]");
    }
    let (capacity, head_dim) = (dims[2], dims[3]);
    let last = kept.last().map_or(0, |&k| k as usize + 1);
    if kept.windows(2).any(|w| w[0] >= w[1]) || start + last > capacity {
        bail!("compact rows: offsets {kept:?} from {start} are not increasing within a capacity of {capacity}");
    }
    for b in buffers {
        if b.dims() != dims || b.dtype() != first.dtype() || !b.device().same_device(first.device()) {
            bail!("compact rows: buffers {:?} {:?} and {dims:?} {:?} differ", b.dims(), b.dtype(), first.dtype());
        }
        if !b.is_contiguous() {
            bail!("compact rows: a cache buffer is not contiguous");
        }
    }
    #[cfg(feature = "cuda")]
    if first.device().is_cuda() {
        return cuda::compact_rows(buffers, dims[1], capacity, head_dim, start, kept);
    }
    let op = CompactRows { capacity, head_dim, start, kept };
    buffers.iter().try_for_each(|b| b.inplace_op1(&op))
}

/// [`compact_rows`] on one CPU buffer.
struct CompactRows<'a> {
    capacity: usize,
    head_dim: usize,
    start: usize,
    kept: &'a [u32],
}

impl candle_core::InplaceOp1 for CompactRows<'_> {
    fn name(&self) -> &'static str {
        "mdsd-compact-rows"
    }

    fn cpu_fwd(&self, dst: &mut CpuStorage, l: &Layout) -> Result<()> {
        let Some((a, b)) = l.contiguous_offsets() else { bail!("compact rows: the buffer is not contiguous") };
        let (c, d, s, k) = (self.capacity, self.head_dim, self.start, self.kept);
        match dst {
            CpuStorage::F32(x) => reference::compact_rows(&mut x[a..b], c, d, s, k),
            CpuStorage::BF16(x) => reference::compact_rows(&mut x[a..b], c, d, s, k),
            CpuStorage::F16(x) => reference::compact_rows(&mut x[a..b], c, d, s, k),
            other => bail!("compact rows: unsupported dtype {:?}", other.dtype()),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
