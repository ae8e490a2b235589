//! Decoder-only transformers of the LLaMA family and Qwen2, with a forward made for tree
//! decoding.
//!
//! [`DecoderModel::forward`] takes the new token ids, their explicit position ids and an
//! additive attention bias of the new tokens against every cached position plus the new ones
//! (`[new, cached + new]`, 0 where attention is allowed, -inf elsewhere), and returns the final
//! hidden state of every new position; [`DecoderModel::logits`] maps chosen rows to logits.
//! The KV cache ([`KvCache`]) lives outside the weights. This is what candle-transformers'
//! own forwards cannot do: they return only the last position's logits, assume contiguous
//! positions and a causal mask, and own their cache.
//!
//! LLaMA and Qwen2 differ only in the q/k/v bias (Qwen2 has one) and in conventions of the
//! files they come from; both load from Hugging Face safetensors ([`hf`]) and from GGUF
//! ([`gguf`]), dense or quantized (candle's quantized matmul).

pub mod attention_kernels;
pub mod converted;
pub mod cpu_attention;
pub mod eagle;
pub mod embedding;
pub mod gguf;
pub mod hf;
pub mod q4k_interleaved;
pub mod q4k_tiled;
pub mod q6k_interleaved;
pub mod q6k_tiled;
pub mod q8k_activations;
pub mod qgemv;
#[cfg(test)]
mod repack_test_support;

use crate::kv_cache::KvCache;
use candle_core::quantized::{GgmlDType, QMatMul};
use candle_core::{DType, Device, Module, Result, Tensor, D};

/// The model families the engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// LLaMA-1/2/3, Vicuna, JackFram/llama-68m, SmolLM2, Mistral without sliding window.
    Llama,
    /// Qwen2 and Qwen2.5: bias on the q, k and v projections.
    Qwen2,
}

/// Plain, resolved model hyper-parameters (from `config.json` or the GGUF metadata).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// Longest sequence (prompt plus generated tokens) the model supports.
    pub context_length: usize,
    /// Rotary embedding on interleaved pairs (GGUF LLaMA files, whose q/k rows are permuted by
    /// the converter) instead of the two halves of each head (Hugging Face, GGUF Qwen2).
    pub rope_interleaved: bool,
}

impl ModelConfig {
    /// Checks the shapes are consistent; `source` names the file in the error.
    pub fn validate(&self, source: &str) -> Result<()> {
        let bad = |what: String| candle_core::Error::Msg(format!("{source}: invalid model configuration: {what}"));
        if self.num_layers == 0 || self.num_heads == 0 || self.num_kv_heads == 0 || self.vocab_size == 0 {
            return Err(bad(format!("zero layers, heads or vocabulary: {self:?}")));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(bad(format!("{} heads is not a multiple of {} KV heads", self.num_heads, self.num_kv_heads)));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(bad(format!("odd head dimension {}", self.head_dim)));
        }
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if !positive(self.rope_theta) || !positive(self.rms_norm_eps) {
            return Err(bad(format!("rope theta {} or RMS-norm epsilon {}", self.rope_theta, self.rms_norm_eps)));
        }
        Ok(())
    }
}

/// A matrix product with optional bias; the matrix is dense or quantized. The matrix may have
/// `pad_input` extra zero columns (re-quantized to a format whose blocks need a longer row):
/// the input then gets as many zeros, which leaves the product unchanged.
#[derive(Debug, Clone)]
pub struct Linear {
    /// The matrix in candle's form; `None` when it lives in `repacked` only.
    weight: Option<QMatMul>,
    /// A Q4_K or Q6_K matrix on an AVX2 CPU, repacked at load for our kernels
    /// ([`q4k_tiled`] and [`q6k_tiled`] with AVX-512 VNNI, else [`q4k_interleaved`] and
    /// [`q6k_interleaved`]), which then run every product with it (one
    /// copy of the weights is kept, not two).
    repacked: Option<Repacked>,
    bias: Option<Tensor>,
    pad_input: usize,
    /// Up to this many input rows go through [`qgemv`] (0: never).
    few_rows_max: usize,
}

/// Input rows up to which ggml-layout Q4_K/Q6_K products on an AVX2 CPU use [`qgemv`] rather
/// than candle's repacked kernels (measured in `benches/RESULTS.md`, "Engine on CPU"). Q4_K and
/// Q6_K matrices repacked at load ([`q4k_interleaved`], [`q6k_interleaved`]) take our kernels at
/// every row count.
pub const FEW_ROWS_MAX: usize = 4;

impl Linear {
    pub fn new(weight: QMatMul, bias: Option<Tensor>) -> Result<Self> {
        Self::padded(weight, bias, 0)
    }

    /// A matrix whose rows were padded with `pad_input` zero columns.
    pub fn padded(weight: QMatMul, bias: Option<Tensor>, pad_input: usize) -> Result<Self> {
        let few_rows_max = match &weight {
            QMatMul::QTensor(w) if qgemv::supports(w) => few_rows_max_from_env(),
            _ => 0,
        };
        let repacked = match &weight {
            QMatMul::QTensor(w) if few_rows_max > 0 && repack_from_env() => {
                Repacked::from_raw(w.dtype(), w.shape().dims(), &w.data()?)?
            }
            _ => None,
        };
        let weight = if repacked.is_some() { None } else { Some(weight) };
        Ok(Self { weight, repacked, bias, pad_input, few_rows_max })
    }

    /// The CPU matrix of a stored ggml tensor (`dtype`, `dims`, its raw `bytes`) when our
    /// kernels take it: repacked straight from the bytes (mapped from a GGUF file), with no
    /// `QTensor` copy first. `None` when [`Self::padded`] would keep candle's form; the caller
    /// then builds the `QTensor`.
    pub fn repacked_from_raw(
        dtype: GgmlDType,
        dims: &[usize],
        bytes: &[u8],
        bias: Option<Tensor>,
        pad_input: usize,
    ) -> Result<Option<Self>> {
        let supported = q4k_interleaved::cpu_supported()
            && matches!(dtype, GgmlDType::Q4K | GgmlDType::Q6K)
            && dims.len() == 2
            && dims[1].is_multiple_of(qgemv::QK_K);
        let few_rows_max = few_rows_max_from_env();
        if !supported || few_rows_max == 0 || !repack_from_env() {
            return Ok(None);
        }
        Ok(Repacked::from_raw(dtype, dims, bytes)?.map(|r| Self {
            weight: None,
            repacked: Some(r),
            bias,
            pad_input,
            few_rows_max,
        }))
    }
}

impl Repacked {
    /// The layout our kernels take for a ggml matrix on this CPU: 16-row tiles with AVX-512
    /// VNNI, else interleaved blocks with AVX2; `None` for other types and CPUs.
    fn from_raw(dtype: GgmlDType, dims: &[usize], bytes: &[u8]) -> Result<Option<Self>> {
        use std::sync::Arc;
        Ok(if let Some(m) = q4k_tiled::Q4KTiledMatrix::from_raw(dtype, dims, bytes)? {
            Some(Self::Q4KTiled(Arc::new(m)))
        } else if let Some(m) = q4k_interleaved::Q4KMatrix::from_raw(dtype, dims, bytes)? {
            Some(Self::Q4K(Arc::new(m)))
        } else if let Some(m) = q6k_tiled::Q6KTiledMatrix::from_raw(dtype, dims, bytes)? {
            Some(Self::Q6KTiled(Arc::new(m)))
        } else {
            q6k_interleaved::Q6KMatrix::from_raw(dtype, dims, bytes)?.map(|m| Self::Q6K(Arc::new(m)))
        })
    }
}

/// [`FEW_ROWS_MAX`], or `MDSD_FEW_ROWS_MAX` when set (0 turns the fast path off; for
/// measuring one kernel against the other).
fn few_rows_max_from_env() -> usize {
    static VALUE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *VALUE.get_or_init(|| std::env::var("MDSD_FEW_ROWS_MAX").ok().and_then(|v| v.parse().ok()).unwrap_or(FEW_ROWS_MAX))
}

/// False when `MDSD_REPACK=0`: Q4_K and Q6_K matrices then run in ggml's layout (for
/// measuring one kernel against the other).
fn repack_from_env() -> bool {
    static VALUE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VALUE.get_or_init(|| std::env::var("MDSD_REPACK").map_or(true, |v| v != "0"))
}

/// A matrix repacked at load for our CPU kernels.
#[derive(Debug, Clone)]
enum Repacked {
    Q4KTiled(std::sync::Arc<q4k_tiled::Q4KTiledMatrix>),
    Q4K(std::sync::Arc<q4k_interleaved::Q4KMatrix>),
    Q6K(std::sync::Arc<q6k_interleaved::Q6KMatrix>),
    Q6KTiled(std::sync::Arc<q6k_tiled::Q6KTiledMatrix>),
}

impl Repacked {
    fn rows_weight(&self) -> qgemv::RowsWeight<'_> {
        match self {
            Self::Q4KTiled(m) => qgemv::RowsWeight::Q4KTiled(m),
            Self::Q4K(m) => qgemv::RowsWeight::Q4KInterleaved(m),
            Self::Q6K(m) => qgemv::RowsWeight::Q6KInterleaved(m),
            Self::Q6KTiled(m) => qgemv::RowsWeight::Q6KTiled(m),
        }
    }
}

impl Linear {
    fn matmul(&self, x: &Tensor) -> Result<Tensor> {
        // Our kernels are CPU-only: on CUDA candle's own quantized matmul runs.
        if let Some(w) = self.few_rows_weight(x) {
            return x.contiguous()?.apply_op1_no_bwd(&qgemv::QuantizedRowsMatmul(w));
        }
        match (&self.weight, &self.repacked) {
            (Some(w), _) => w.forward(x),
            // Repacked matrices are CPU-only and take f32 activations.
            (None, Some(r)) => x
                .to_dtype(DType::F32)?
                .to_device(&candle_core::Device::Cpu)?
                .contiguous()?
                .apply_op1_no_bwd(&qgemv::QuantizedRowsMatmul(r.rows_weight())),
            (None, None) => unreachable!("a Linear holds its matrix in one of the two forms"),
        }
    }
}

impl Linear {
    /// The matrix when a product with `x` takes a few-rows kernel ([`qgemv`]).
    /// A repacked matrix takes every row count; a ggml one up to `few_rows_max` rows.
    fn few_rows_weight(&self, x: &Tensor) -> Option<qgemv::RowsWeight<'_>> {
        if !(x.dtype() == DType::F32 && x.device().is_cpu()) {
            return None;
        }
        if let Some(r) = &self.repacked {
            return Some(r.rows_weight());
        }
        let Some(QMatMul::QTensor(w)) = &self.weight else { return None };
        let k = x.dims().last().copied().unwrap_or(0);
        let fits = k > 0 && x.elem_count() / k <= self.few_rows_max;
        fits.then_some(qgemv::RowsWeight::Ggml(w))
    }
}

/// Runs `f` on the elements of a CPU f32 tensor in row-major order (copying only when it is
/// not contiguous).
pub(crate) fn with_host_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(data)), Some((a, b))) => Ok(f(&data[a..b])),
        _ => candle_core::bail!("expected contiguous f32 CPU data, got {:?} on {:?}", t.dtype(), t.device()),
    }
}

/// `x @ w_i^T + b_i` for several products of the same input (q/k/v). When every one takes
/// the few-rows kernel, the input is quantized once and one dispatch computes them all;
/// otherwise each runs alone. Same results either way.
pub fn forward_many(lins: &[&Linear], x: &Tensor) -> Result<Vec<Tensor>> {
    let ws: Option<Vec<_>> = lins.iter().map(|l| l.few_rows_weight(x)).collect();
    let Some(ws) = ws.filter(|ws| ws.len() > 1) else {
        return lins.iter().map(|l| l.forward(x)).collect();
    };
    let (outs, dims) = many_rows(&ws, x)?;
    lins.iter()
        .zip(outs)
        .zip(&ws)
        .map(|((l, out), w)| {
            let mut d = dims.clone();
            *d.last_mut().expect("non-empty dims") = w.dims()?.0;
            let y = Tensor::from_vec(out, d, x.device())?;
            match &l.bias {
                Some(b) => y.broadcast_add(b),
                None => Ok(y),
            }
        })
        .collect()
}

/// The products of [`forward_many`] as host vectors, with the output dims of the first.
fn many_rows(ws: &[qgemv::RowsWeight], x: &Tensor) -> Result<(Vec<Vec<f32>>, Vec<usize>)> {
    let dims = x.dims().to_vec();
    let k = *dims.last().expect("non-empty dims");
    let m = x.elem_count() / k;
    let mut outs = Vec::with_capacity(ws.len());
    for w in ws {
        outs.push(vec![0f32; m * w.dims()?.0]);
    }
    // Matrices re-quantized with zero-padded rows ([`Linear::padded`]) take as many zeros.
    let kw = ws[0].dims()?.1;
    if kw < k {
        candle_core::bail!("quantized-rows-matmul: {k} inputs against matrices of width {kw}");
    }
    with_host_f32(x, |xs| {
        let mut slices: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
        if kw == k {
            return qgemv::matmul_many(ws, xs, m, &mut slices);
        }
        let mut padded = vec![0f32; m * kw];
        for (dst, src) in padded.chunks_exact_mut(kw).zip(xs.chunks_exact(k)) {
            dst[..k].copy_from_slice(src);
        }
        qgemv::matmul_many(ws, &padded, m, &mut slices)
    })??;
    Ok((outs, dims))
}

/// The gated MLP's inner activation `silu(x @ gate^T) * (x @ up^T)`; on the few-rows path both
/// products run in one dispatch and the gating is applied on the host without temporaries.
pub fn gated(gate: &Linear, up: &Linear, x: &Tensor) -> Result<Tensor> {
    if let (Some(gw), Some(uw), None, None) = (gate.few_rows_weight(x), up.few_rows_weight(x), &gate.bias, &up.bias) {
        let (mut outs, mut dims) = many_rows(&[gw, uw], x)?;
        let u = outs.pop().expect("two outputs");
        let mut g = outs.pop().expect("two outputs");
        silu_gate(&mut g, &u);
        *dims.last_mut().expect("non-empty dims") = gw.dims()?.0;
        return Tensor::from_vec(g, dims, x.device());
    }
    candle_nn::ops::silu(&gate.forward(x)?)? * up.forward(x)?
}

/// `g = silu(g) * u` element-wise; large inputs (several rows) split over candle's thread pool,
/// with the same arithmetic per element, so the result does not depend on the split.
fn silu_gate(g: &mut [f32], u: &[f32]) {
    /// Below this many elements one thread is faster than a dispatch (about 40 us of work).
    const PARALLEL_MIN: usize = 16_384;
    fn apply(g: &mut [f32], u: &[f32]) {
        for (a, b) in g.iter_mut().zip(u) {
            *a = *a / (1.0 + attention_kernels::exp(-*a)) * b;
        }
    }
    if g.len() < PARALLEL_MIN {
        return apply(g, u);
    }
    let (base, len) = (g.as_mut_ptr() as usize, g.len());
    candle_core::utils::barrier_pool().execute_chunked(len, |r| {
        // SAFETY: the ranges are disjoint and within `g`, which outlives the dispatch.
        let g = unsafe { std::slice::from_raw_parts_mut((base as *mut f32).add(r.start), r.len()) };
        apply(g, &u[r]);
    });
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = if self.pad_input > 0 {
            self.matmul(&x.pad_with_zeros(D::Minus1, 0, self.pad_input)?)?
        } else {
            self.matmul(x)?
        };
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

/// One transformer block's weights.
#[derive(Debug, Clone)]
pub struct Layer {
    /// `None` for a block without an input norm (EAGLE heads' first layer).
    pub attn_norm: Option<Tensor>,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub mlp_norm: Tensor,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

/// A decoder-only transformer (see the module docs).
#[derive(Debug, Clone)]
pub struct DecoderModel {
    config: ModelConfig,
    embed: embedding::TokenEmbedding,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Linear,
    cos: Tensor,
    sin: Tensor,
    dtype: DType,
    device: Device,
}

impl DecoderModel {
    /// Assembles a model; `embed` is `[vocab, hidden]` (dense ones in the activation dtype).
    pub fn new(
        config: ModelConfig,
        embed: embedding::TokenEmbedding,
        layers: Vec<Layer>,
        norm: Tensor,
        lm_head: Linear,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let (cos, sin) = rotary_tables(&config, dtype, device)?;
        Ok(Self { config, embed, layers, norm, lm_head, cos, sin, dtype, device: device.clone() })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The token embedding `[vocab, hidden]` (EAGLE heads without their own reuse it).
    pub fn embedding(&self) -> &embedding::TokenEmbedding {
        &self.embed
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The dtype of activations, of the KV cache and of the attention bias.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of transformer blocks run (may be fewer than the file has; see `max_layers` in
    /// the loaders).
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// An empty KV cache for this model holding up to `capacity` positions.
    pub fn new_cache(&self, capacity: usize) -> Result<KvCache> {
        KvCache::new(
            self.layers.len(),
            self.config.num_kv_heads,
            self.config.head_dim,
            capacity,
            self.dtype,
            &self.device,
        )
    }

    /// Runs the new tokens `tokens` at positions `positions` with the additive attention bias
    /// `bias` (`[t, cache.len() + t]`) and appends their keys and values to `cache`. Returns
    /// the final (normed) hidden states `[t, hidden]`.
    pub fn forward(&self, tokens: &[u32], positions: &[u32], bias: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        let _span = tracing::trace_span!("forward").entered();
        let t = tokens.len();
        let total = cache.len() + t;
        if positions.len() != t || t == 0 {
            candle_core::bail!("forward: {t} tokens and {} positions", positions.len());
        }
        if bias.dims() != [t, total] {
            candle_core::bail!("attention bias has shape {:?}, expected [{t}, {total}]", bias.dims());
        }
        cache.reserve(t)?;
        let max_pos = positions.iter().copied().max().unwrap_or(0) as usize;
        if max_pos >= self.config.context_length {
            candle_core::bail!(
                "position {max_pos} is beyond the model's context length of {}",
                self.config.context_length
            );
        }
        if let Some(&bad) = tokens.iter().find(|&&x| x as usize >= self.config.vocab_size) {
            candle_core::bail!("token id {bad} is outside the vocabulary of {} tokens", self.config.vocab_size);
        }
        let positions = Tensor::from_slice(positions, t, &self.device)?;
        let cos = self.cos.index_select(&positions, 0)?;
        let sin = self.sin.index_select(&positions, 0)?;
        let bias = bias.to_dtype(self.dtype)?;
        let mut x = self.embed.lookup(tokens, &self.device)?.to_dtype(self.dtype)?.unsqueeze(0)?;
        for (i, layer) in self.layers.iter().enumerate() {
            x = block(&self.config, i, layer, &x, &cos, &sin, &bias, cache)?;
        }
        cache.advance(t)?;
        candle_nn::ops::rms_norm(&x.squeeze(0)?, &self.norm, self.config.rms_norm_eps as f32)
    }

    /// Runs a chain of tokens after the cache with causal attention (a prompt), in chunks of
    /// [`PREFILL_CHUNK_CPU`] tokens on the CPU ([`PREFILL_CHUNK_GPU`] elsewhere), and returns
    /// the final hidden states of every token, `[t, hidden]`. Chunks keep each forward's
    /// intermediate tensors small and its attention on the in-place kernel: on the CPU a whole
    /// 708-token prompt in one forward took 634,000 page faults for its fresh temporaries
    /// (2,800 in chunks) and 2.9 s (2.0 s in chunks; `benches/RESULTS.md`).
    pub fn forward_chain(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        self.forward_chain_from(tokens, cache.len(), cache)
    }

    /// [`Self::forward_chain`] with the chain's first token at position `first` instead of
    /// `cache.len()`: for a cache that skips part of the context (a draft window,
    /// `crate::draft_window`). Every cached row stays visible.
    pub fn forward_chain_from(&self, tokens: &[u32], first: usize, cache: &mut KvCache) -> Result<Tensor> {
        if tokens.is_empty() {
            candle_core::bail!("forward: 0 tokens");
        }
        let chunk = if self.device.is_cpu() { PREFILL_CHUNK_CPU } else { PREFILL_CHUNK_GPU };
        let mut parts = Vec::with_capacity(tokens.len().div_ceil(chunk));
        for (i, c) in tokens.chunks(chunk).enumerate() {
            let past = cache.len();
            let bias = causal_bias(past, c.len(), self.dtype, &self.device)?;
            let start = first + i * chunk;
            let pos: Vec<u32> = (start..start + c.len()).map(|p| p as u32).collect();
            parts.push(self.forward(c, &pos, &bias, cache)?);
        }
        match parts.len() {
            1 => Ok(parts.pop().expect("one part")),
            _ => Tensor::cat(&parts, 0),
        }
    }

    /// Logits (`[rows, vocab]`, f32) of hidden states `[rows, hidden]`.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let _span = tracing::trace_span!("lm_head").entered();
        self.lm_head.forward(&hidden.unsqueeze(0)?)?.squeeze(0)?.to_dtype(DType::F32)
    }
}

/// One transformer block on `x` (`[1, t, hidden]`): attention against the cache of layer
/// `index` plus the new keys (appended), then the MLP, each with its residual.
#[allow(clippy::too_many_arguments)]
pub(crate) fn block(
    c: &ModelConfig,
    index: usize,
    layer: &Layer,
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    bias: &Tensor,
    cache: &mut KvCache,
) -> Result<Tensor> {
    let (_, t, _) = x.dims3()?;
    let eps = c.rms_norm_eps as f32;
    let h = match &layer.attn_norm {
        Some(w) => candle_nn::ops::rms_norm(x, w, eps)?,
        None => x.clone(),
    };
    let attn = {
        let _span = tracing::trace_span!("attention").entered();
        let heads = |y: &Tensor, n: usize| -> Result<Tensor> {
            y.reshape((1, t, n, c.head_dim))?.transpose(1, 2)?.contiguous()
        };
        let qkv = forward_many(&[&layer.q, &layer.k, &layer.v], &h)?;
        let q = heads(&qkv[0], c.num_heads)?;
        let k = heads(&qkv[1], c.num_kv_heads)?;
        let v = heads(&qkv[2], c.num_kv_heads)?;
        let (q, k) = if c.rope_interleaved {
            (candle_nn::rotary_emb::rope_i(&q, cos, sin)?, candle_nn::rotary_emb::rope_i(&k, cos, sin)?)
        } else {
            (candle_nn::rotary_emb::rope(&q, cos, sin)?, candle_nn::rotary_emb::rope(&k, cos, sin)?)
        };
        let (k_all, v_all) = cache.append(index, &k, &v)?;
        let scale = 1.0 / (c.head_dim as f64).sqrt();
        if let Some(y) = cpu_attention::attend(&q, &k_all, &v_all, bias, scale as f32)? {
            return finish_block(c, layer, x, &layer.o.forward(&y)?);
        }
        let total = k_all.dim(2)?;
        // Grouped-query attention without repeating K/V: the query heads sharing one KV
        // head are stacked along the sequence axis.
        let groups = c.num_heads / c.num_kv_heads;
        let q = q.reshape((1, c.num_kv_heads, groups * t, c.head_dim))?;
        let k_t = k_all.contiguous()?.t()?;
        let scores = (q.matmul(&k_t)? * scale)?.reshape((1, c.num_heads, t, total))?;
        let scores = scores.broadcast_add(bias)?;
        let weights = candle_nn::ops::softmax_last_dim(&scores)?;
        let weights = weights.reshape((1, c.num_kv_heads, groups * t, total))?;
        let y = weights.matmul(&v_all.contiguous()?)?;
        let y =
            y.reshape((1, c.num_heads, t, c.head_dim))?.transpose(1, 2)?.reshape((1, t, c.num_heads * c.head_dim))?;
        layer.o.forward(&y)?
    };
    finish_block(c, layer, x, &attn)
}

/// The rest of a block after attention: residual, MLP, residual.
fn finish_block(c: &ModelConfig, layer: &Layer, x: &Tensor, attn: &Tensor) -> Result<Tensor> {
    let x = (x + attn)?;
    let h = candle_nn::ops::rms_norm(&x, &layer.mlp_norm, c.rms_norm_eps as f32)?;
    let mlp = {
        let _span = tracing::trace_span!("mlp").entered();
        layer.down.forward(&gated(&layer.gate, &layer.up, &h)?)?
    };
    x + mlp
}

/// cos and sin tables `[context_length, head_dim / 2]`: angle `pos * theta^(-2i / head_dim)`.
fn rotary_tables(c: &ModelConfig, dtype: DType, device: &Device) -> Result<(Tensor, Tensor)> {
    let half = c.head_dim / 2;
    let inv_freq: Vec<f32> =
        (0..half).map(|i| (1.0 / c.rope_theta.powf(2.0 * i as f64 / c.head_dim as f64)) as f32).collect();
    let inv_freq = Tensor::from_vec(inv_freq, (1, half), device)?;
    let pos =
        Tensor::arange(0u32, c.context_length as u32, device)?.to_dtype(DType::F32)?.reshape((c.context_length, 1))?;
    let angles = pos.broadcast_mul(&inv_freq)?;
    Ok((angles.cos()?.to_dtype(dtype)?, angles.sin()?.to_dtype(dtype)?))
}

/// Additive attention bias `[rows, prefix + cols]`: every row sees the `prefix` first
/// positions, and tail column `c` when `allowed(row, c)` (0 where visible, -inf elsewhere).
pub fn attention_bias(
    prefix: usize,
    rows: usize,
    cols: usize,
    allowed: impl Fn(usize, usize) -> bool,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let mut tail = vec![f32::NEG_INFINITY; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            if allowed(r, c) {
                tail[r * cols + c] = 0.0;
            }
        }
    }
    let tail = Tensor::from_vec(tail, (rows, cols), device)?.to_dtype(dtype)?;
    if prefix == 0 {
        return Ok(tail);
    }
    Tensor::cat(&[&Tensor::zeros((rows, prefix), dtype, device)?, &tail], D::Minus1)
}

/// Prompt tokens per forward of [`DecoderModel::forward_chain`] on the CPU: the largest
/// forward that [`cpu_attention`] takes. A 708-token prefill of the default target took
/// 2.0-2.1 s in chunks of 64 to 256 tokens, 2.3 s in chunks of 512 and 2.4 s in one forward
/// through the same attention (`benches/RESULTS.md`).
pub const PREFILL_CHUNK_CPU: usize = cpu_attention::MAX_ROWS;

/// Prompt tokens per forward of [`DecoderModel::forward_chain`] on a GPU, which wants large
/// forwards; the bound keeps the attention scores of long prompts in memory.
pub const PREFILL_CHUNK_GPU: usize = 2048;

/// Causal bias for a chain of `t` new tokens after `past` cached ones.
pub fn causal_bias(past: usize, t: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    attention_bias(past, t, t, |i, j| j <= i, dtype, device)
}

#[cfg(test)]
mod gate_tests {
    /// The gate split over the pool equals one thread's loop bit for bit, at sizes below and
    /// above the split threshold.
    #[test]
    fn parallel_gate_equals_the_serial_loop() {
        for len in [7, 4_864, 16_384, 3 * 8_960 + 5] {
            let g0: Vec<f32> = (0..len).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173).collect();
            let u: Vec<f32> = (0..len).map(|i| ((i * 13 % 17) as f32 - 8.0) * 0.31).collect();
            let mut want = g0.clone();
            for (a, b) in want.iter_mut().zip(&u) {
                *a = *a / (1.0 + super::attention_kernels::exp(-*a)) * b;
            }
            let mut got = g0;
            super::silu_gate(&mut got, &u);
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "length {len}");
        }
    }
}

#[cfg(test)]
mod raw_repack_tests {
    use super::*;
    use candle_core::quantized::QTensor;

    /// A matrix repacked straight from its bytes (how GGUF matrices load from the mapped file)
    /// computes what the same matrix built from a `QTensor` does, bit for bit: Q4_K and Q6_K,
    /// 1 and 5 input rows, all rows and a prefix of rows (a cut output head). A byte count that
    /// does not fit the shape is an error. On CPUs without our kernels both keep candle's form
    /// and `repacked_from_raw` declines.
    #[test]
    fn repacked_from_raw_equals_the_qtensor_path() {
        let dev = Device::Cpu;
        let (rows, cols) = (48, 512);
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.8).collect();
        let w = Tensor::from_vec(w, (rows, cols), &dev).unwrap();
        let x: Vec<f32> = (0..5 * cols).map(|i| ((i * 613 % 211) as f32 / 211.0 - 0.5) * 2.0).collect();
        let x = Tensor::from_vec(x, (1, 5, cols), &dev).unwrap();
        for dtype in [GgmlDType::Q4K, GgmlDType::Q6K] {
            let q = QTensor::quantize(&w, dtype).unwrap();
            let bytes = q.data().unwrap().to_vec();
            let row_bytes = bytes.len() / rows;
            for kept in [rows, 32] {
                let raw = Linear::repacked_from_raw(dtype, &[kept, cols], &bytes[..kept * row_bytes], None, 0).unwrap();
                let Some(raw) = raw else {
                    assert!(!q4k_interleaved::cpu_supported(), "{dtype:?}: our kernels exist but were not used");
                    continue;
                };
                let prefix = QTensor::quantize(&w.narrow(0, 0, kept).unwrap(), dtype).unwrap();
                let via = Linear::padded(QMatMul::from_qtensor(prefix).unwrap(), None, 0).unwrap();
                assert!(via.repacked.is_some(), "{dtype:?}: the QTensor path was not repacked");
                for n in [1, 5] {
                    let xs = x.narrow(1, 0, n).unwrap();
                    let a = raw.forward(&xs).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    let b = via.forward(&xs).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    assert_eq!(a.len(), n * kept);
                    assert!(
                        a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{dtype:?}, {kept} rows, {n} inputs"
                    );
                }
            }
            if q4k_interleaved::cpu_supported() {
                assert!(Linear::repacked_from_raw(dtype, &[rows, cols], &bytes[..bytes.len() - 1], None, 0).is_err());
            }
        }
    }
}
