//! Decoder-only transformers of the LLaMA family, Qwen2 and Qwen3, with a forward made for
//! tree decoding: the architecture and its forward only (files are `crate::load`'s, the CPU
//! kernels `crate::kernels`').
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
//! files they come from; both load from Hugging Face safetensors (`crate::load::hf`) and from
//! GGUF (`crate::load::gguf`), dense or quantized (candle's quantized matmul).

mod batcher;
pub mod eagle;
pub mod embedding;
pub mod kv_cache;
mod linear;
mod products;
mod residual;
pub mod rope_scaling;
mod rotary;
mod step_inputs;

use crate::kernels::attention as cpu_attention;
use crate::kernels::device::{CacheAttention, RopeRows, StepAttention};
pub use batcher::{
    others_load, post_load, take_batched_cost, BatchStats, Batcher, Membership, Prefilling, SharedLoad, Solo,
};
use candle_core::{DType, Device, Module, Result, Tensor, D};
pub use kv_cache::KvCache;
pub use linear::{forward_many, gated, Linear, FEW_ROWS_MAX};
pub use products::Products;
use residual::Residual;
pub use step_inputs::{chain_masks, tree_masks, StepGraphs, StepInputs};

/// The model families the engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// LLaMA-1/2/3, Vicuna, JackFram/llama-68m, SmolLM2, Mistral without sliding window.
    Llama,
    /// Qwen2 and Qwen2.5: bias on the q, k and v projections.
    Qwen2,
    /// Qwen3 (dense): an RMS norm over each query and key head before the rotary embedding,
    /// no biases.
    Qwen3,
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
    /// How the rotary frequencies are scaled for long contexts ([`rope_scaling::RopeScaling`]).
    pub rope_scaling: rope_scaling::RopeScaling,
    /// Longest sequence (prompt plus generated tokens) the model supports.
    pub context_length: usize,
    /// Rotary embedding on interleaved pairs (GGUF LLaMA files, whose q/k rows are permuted by
    /// the converter) instead of the two halves of each head (Hugging Face, GGUF Qwen2).
    pub rope_interleaved: bool,
}

impl ModelConfig {
    /// Checks the shapes are consistent; `source` names the file in the error.
    /// About the number of weights of one block's products (attention and MLP).
    pub fn layer_weight_count(&self) -> usize {
        let attention = self.hidden_size * (2 * self.num_heads * self.head_dim + 2 * self.num_kv_heads * self.head_dim);
        attention + 3 * self.hidden_size * self.intermediate_size
    }

    pub fn validate(&self, source: &str) -> Result<()> {
        let bad = |what: String| candle_core::Error::Msg(format!("{source}: invalid model configuration: {what}"));
        if self.num_layers == 0 || self.num_heads == 0 || self.num_kv_heads == 0 || self.vocab_size == 0 {
            return Err(bad(format!("zero layers, heads or vocabulary: {self:?}")));
        }
        if self.hidden_size == 0 || self.intermediate_size == 0 || self.head_dim == 0 {
            return Err(bad(format!("zero hidden, feed-forward or head size: {self:?}")));
        }
        if self.context_length == 0 {
            return Err(bad("a context of 0 positions".into()));
        }
        if self.num_heads.checked_mul(self.head_dim).is_none() || self.context_length > u32::MAX as usize + 1 {
            return Err(bad(format!(
                "{} heads of {} or a context of {} positions is out of range",
                self.num_heads, self.head_dim, self.context_length
            )));
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
        self.rope_scaling.validate(self.head_dim).map_err(bad)?;
        Ok(())
    }
}

/// One sequence's new tokens in a batched forward ([`DecoderModel::forward_batch`]): their ids,
/// positions, additive attention bias (`[t, cache.len() + t]`) and the sequence's cache.
pub struct BatchItem<'a> {
    pub tokens: &'a [u32],
    pub positions: &'a [u32],
    pub bias: &'a Tensor,
    pub cache: &'a mut KvCache,
}

/// One transformer block's weights.
#[derive(Debug, Clone)]
pub struct Layer {
    /// `None` for a block without an input norm (EAGLE heads' first layer).
    pub attn_norm: Option<Tensor>,
    /// The query, key and value products, in that order.
    pub qkv: Products,
    pub o: Linear,
    /// Qwen3: the RMS-norm weights (`[head_dim]`) applied to every query and key head before
    /// the rotary embedding; `None` elsewhere.
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    pub mlp_norm: Tensor,
    /// The MLP's gate and up products, in that order.
    pub gate_up: Products,
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
    rotary: rotary::Rotary,
    dtype: DType,
    device: Device,
    /// Attention through the device kernels ([`crate::kernels::device`]) rather than candle's
    /// ops ([`Self::set_fused_decode`]).
    fused: bool,
}

/// Whether `MDSD_FUSED_DECODE` asks for the device kernels' decode path (`1`, `on`, `true`).
/// Off by default: the kernels are checked against their Rust reference on the CPU, and take
/// the default on CUDA once a GPU run has checked them there.
fn fused_from_env() -> bool {
    matches!(std::env::var("MDSD_FUSED_DECODE").as_deref(), Ok("1" | "on" | "true"))
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
        crate::kernels::threads::pin_thread_count();
        let rotary = rotary::Rotary::new(&config, dtype, device)?;
        let fused = fused_from_env();
        let mut model = Self { config, embed, layers, norm, lm_head, rotary, dtype, device: device.clone(), fused };
        if products::joins_products(device, fused) {
            let joined = model.join_products()?;
            tracing::info!("joined {joined} of the blocks' q/k/v and gate/up product groups into single matrices");
        }
        Ok(model)
    }

    /// Joins each block's q/k/v and gate/up products into one matrix each where their types
    /// allow ([`Products`]): fewer, larger products and launches on a GPU. Every output is the
    /// same dot product (to within a rounding where a kernel sums in another order). Done at
    /// load on CUDA with `MDSD_FUSED_DECODE=1` (`products::joins_products`); on the CPU only by
    /// this call (the CPU's own path computes them together already). Returns how many
    /// product groups it joined (0 once joined).
    pub fn join_products(&mut self) -> Result<usize> {
        let mut joined = 0;
        for layer in &mut self.layers {
            joined += layer.join_products()?;
        }
        Ok(joined)
    }

    /// Runs attention through the device kernels ([`crate::kernels::device`]: rotary embedding
    /// and KV writes in place, attention over the cache in fixed key chunks) instead of candle's
    /// ops; on the CPU those kernels are their Rust reference (for tests). The default comes
    /// from `MDSD_FUSED_DECODE`.
    pub fn set_fused_decode(&mut self, on: bool) {
        self.fused = on;
    }

    /// Whether attention runs through the device kernels ([`Self::set_fused_decode`]).
    pub fn fused_decode(&self) -> bool {
        self.fused
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

    /// About the number of weights of the layers (attention and MLP products): what a
    /// forward's cost grows with, to order models by.
    pub fn weight_count(&self) -> usize {
        self.config.num_layers * self.config.layer_weight_count()
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
    /// On a thread that is a member of a [`Batcher`], the forward runs batched with the other
    /// members' (its result is the same).
    pub fn forward(&self, tokens: &[u32], positions: &[u32], bias: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        if let Some(hidden) = self.forward_via_batcher(tokens, positions, bias, cache) {
            return hidden;
        }
        let mut hidden = self.forward_batch(&mut [BatchItem { tokens, positions, bias, cache }])?;
        Ok(hidden.pop().expect("one sequence"))
    }

    /// Runs the new tokens of several sequences in one forward, each with its own positions,
    /// attention bias and cache (see [`Self::forward`]): the norms and products of every block
    /// over all their rows at once, attention per sequence. Returns each sequence's final
    /// hidden states. With the CPU kernels a row's result does not depend on the rows that
    /// share its forward, so each sequence gets what it gets alone; the products' cost grows
    /// far slower than their rows (serving several clients at the price of about one).
    pub fn forward_batch(&self, items: &mut [BatchItem]) -> Result<Vec<Tensor>> {
        let _span = tracing::trace_span!("forward").entered();
        if items.is_empty() {
            candle_core::bail!("forward: no sequences");
        }
        for item in items.iter() {
            self.check_forward(item.tokens, item.positions, item.bias, item.cache)?;
        }
        let tokens: Vec<u32> = items.iter().flat_map(|i| i.tokens.iter().copied()).collect();
        let positions: Vec<Tensor> = items
            .iter()
            .map(|i| Tensor::from_slice(i.positions, i.positions.len(), &self.device))
            .collect::<Result<_>>()?;
        let ropes: Vec<Rope> =
            positions.iter().map(|p| Rope::new(&self.rotary, p, self.fused)).collect::<Result<_>>()?;
        let biases: Vec<Tensor> = items.iter().map(|i| i.bias.to_dtype(self.dtype)).collect::<Result<_>>()?;
        let mut x = Residual::Sum(self.embed.lookup(&tokens, &self.device)?.to_dtype(self.dtype)?.unsqueeze(0)?);
        for (l, layer) in self.layers.iter().enumerate() {
            let seqs = items.iter_mut().map(|i| (i.tokens.len(), &mut *i.cache));
            x = block_residual(&self.config, l, layer, &x, &mut bias_parts(seqs, &ropes, &biases))?;
        }
        for item in items.iter_mut() {
            item.cache.advance(item.tokens.len())?;
        }
        let hidden = x.normed(Some(&self.norm), self.config.rms_norm_eps as f32)?.1.squeeze(0)?;
        split_rows(hidden, items.iter().map(|i| i.tokens.len()))
    }

    /// The checks of one sequence's forward: as many positions as tokens, a bias of the right
    /// shape, room in the cache, positions inside the context and ids inside the vocabulary.
    fn check_forward(&self, tokens: &[u32], positions: &[u32], bias: &Tensor, cache: &KvCache) -> Result<()> {
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
        Ok(())
    }

    /// Runs a chain of tokens after the cache with causal attention (a prompt), in chunks of
    /// [`PREFILL_CHUNK_CPU`] tokens on the CPU ([`PREFILL_CHUNK_GPU`] elsewhere), and returns
    /// the final hidden states of every token, `[t, hidden]`. Chunks keep each forward's
    /// intermediate tensors small and its attention on the in-place kernel: on the CPU a
    /// 708-token prompt took 2.9 s in one forward and 2.0 s in chunks, most of the difference
    /// page faults on fresh temporaries (docs/results/README.md#const-prefill-chunks).
    pub fn forward_chain(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        self.forward_chain_from(tokens, cache.len(), cache)
    }

    /// [`Self::forward_chain`] with the chain's first token at position `first` instead of
    /// `cache.len()`: for a cache that skips part of the context (a draft window,
    /// `crate::decode::draft::window`). Every cached row stays visible.
    pub fn forward_chain_from(&self, tokens: &[u32], first: usize, cache: &mut KvCache) -> Result<Tensor> {
        self.forward_chain_reporting(tokens, first, cache, &mut |_| {})
    }

    /// [`Self::forward_chain_from`], calling `progress(done)` before the first chunk (0) and
    /// after each chunk with the number of `tokens` run so far (for a progress display).
    pub fn forward_chain_reporting(
        &self,
        tokens: &[u32],
        first: usize,
        cache: &mut KvCache,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Tensor> {
        if tokens.is_empty() {
            candle_core::bail!("forward: 0 tokens");
        }
        let batched = Batcher::current().is_some_and(|b| b.members() > 1);
        let chunk = match (self.device.is_cpu(), batched) {
            (true, true) => PREFILL_CHUNK_CPU_BATCHED,
            (true, false) => PREFILL_CHUNK_CPU,
            (false, _) => PREFILL_CHUNK_GPU,
        };
        let mut parts = Vec::with_capacity(tokens.len().div_ceil(chunk));
        progress(0);
        for (i, c) in tokens.chunks(chunk).enumerate() {
            let past = cache.len();
            let bias = causal_bias(past, c.len(), self.dtype, &self.device)?;
            let start = first + i * chunk;
            let pos: Vec<u32> = (start..start + c.len()).map(|p| p as u32).collect();
            parts.push(self.forward(c, &pos, &bias, cache)?);
            progress(i * chunk + c.len());
        }
        match parts.len() {
            1 => Ok(parts.pop().expect("one part")),
            _ => Tensor::cat(&parts, 0),
        }
    }

    /// Logits (`[rows, vocab]`, f32) of hidden states `[rows, hidden]` (batched with other
    /// members' on a [`Batcher`]'s thread).
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        match self.logits_via_batcher(hidden) {
            Some(logits) => logits,
            None => self.logits_now(hidden),
        }
    }

    /// [`Self::logits`] on this thread, now.
    fn logits_now(&self, hidden: &Tensor) -> Result<Tensor> {
        let _span = tracing::trace_span!("lm_head").entered();
        output_logits(&self.lm_head, hidden)
    }

    /// A copy of the output layer for the first `rows` token ids only ([`Linear::first_rows`]:
    /// the same logits for those ids, perhaps a few more ids in 16-row tiles), for a draft
    /// that reads this model's output layer (an EAGLE head).
    pub fn output_layer_rows(&self, rows: usize) -> Result<Linear> {
        self.lm_head.first_rows(rows)
    }
}

/// f32 logits (`[rows, outputs]`) of hidden states `[rows, hidden]` through an output layer.
pub(crate) fn output_logits(lm_head: &Linear, hidden: &Tensor) -> Result<Tensor> {
    lm_head.forward(&hidden.unsqueeze(0)?)?.squeeze(0)?.to_dtype(DType::F32)
}

/// One sequence's rows of a block over several ([`block_parts`]): how many rows (they follow the
/// previous part's), their rotary embedding, what they see and their cache.
pub(crate) struct Part<'p, 'r> {
    pub(crate) rows: usize,
    pub(crate) rope: &'p Rope<'r>,
    pub(crate) visibility: Visibility<'p>,
    pub(crate) cache: &'p mut KvCache,
}

/// What a forward's rows see of the cache and of each other: an additive attention bias
/// (`[rows, cache.len() + rows]`), or a step's inputs ([`StepInputs`]: the cache before the
/// step and the step's rows in each row's mask, read from device memory by the kernels).
#[derive(Clone, Copy)]
pub(crate) enum Visibility<'p> {
    Bias(&'p Tensor),
    Step(&'p Tensor),
}

/// The parts of a forward over several sequences ([`block_parts`]): each sequence's rows and
/// cache (`seqs`), with its rotary embedding and attention bias.
pub(crate) fn bias_parts<'p, 'r>(
    seqs: impl Iterator<Item = (usize, &'p mut KvCache)>,
    ropes: &'p [Rope<'r>],
    biases: &'p [Tensor],
) -> Vec<Part<'p, 'r>> {
    seqs.zip(ropes)
        .zip(biases)
        .map(|(((rows, cache), rope), bias)| Part { rows, rope, visibility: Visibility::Bias(bias), cache })
        .collect()
}

/// `all`'s rows (dimension 0) split into consecutive runs of `rows` each: the outputs of the
/// sequences of a batched forward or product, one after the other.
pub(crate) fn split_rows(all: Tensor, rows: impl ExactSizeIterator<Item = usize>) -> Result<Vec<Tensor>> {
    if rows.len() == 1 {
        return Ok(vec![all]);
    }
    let mut start = 0;
    let mut out = Vec::with_capacity(rows.len());
    for n in rows {
        out.push(all.narrow(0, start, n)?);
        start += n;
    }
    Ok(out)
}

/// A block over the rows of several sequences (`x`: `[1, rows, hidden]`, the parts' rows one
/// after the other): the norms and the products over every row at once, attention per sequence
/// on its own cache. With one part this is the single-sequence block, operation for operation.
pub(crate) fn block_parts(
    c: &ModelConfig,
    index: usize,
    layer: &Layer,
    x: &Tensor,
    parts: &mut [Part],
) -> Result<Tensor> {
    block_residual(c, index, layer, &Residual::Sum(x.clone()), parts)?.sum()
}

/// [`block_parts`] on the residual stream: on the device-kernel path the block's input may
/// carry the previous block's last add ([`Residual::Pending`]), done by this block's first
/// norm, and its output carries its own.
pub(crate) fn block_residual(
    c: &ModelConfig,
    index: usize,
    layer: &Layer,
    x: &Residual,
    parts: &mut [Part],
) -> Result<Residual> {
    let eps = c.rms_norm_eps as f32;
    let (x, h) = x.normed(layer.attn_norm.as_ref(), eps)?;
    let x = &x;
    let attn = {
        let _span = tracing::trace_span!("attention").entered();
        let qkv = layer.qkv.forward(&h)?;
        let whole = parts.len() == 1;
        let mut outputs = Vec::with_capacity(parts.len());
        let mut start = 0;
        for part in parts.iter_mut() {
            let rows = |y: &Tensor| if whole { Ok(y.clone()) } else { y.narrow(1, start, part.rows) };
            let (q, k, v) = (rows(&qkv[0])?, rows(&qkv[1])?, rows(&qkv[2])?);
            outputs.push(attention(c, index, layer, &q, &k, &v, part)?);
            start += part.rows;
        }
        let y = if whole { outputs.pop().expect("one output") } else { Tensor::cat(&outputs, 1)? };
        layer.o.forward(&y)?
    };
    let fused = parts.iter().all(|p| matches!(p.rope, Rope::Fused { .. }));
    finish_block(c, layer, x, attn, fused)
}

/// Attention of one sequence's rows: their projections `q`, `k`, `v` (`[1, t, heads *
/// head_dim]` and `[1, t, kv_heads * head_dim]`) against the cache of layer `index` plus the new
/// keys (appended). Returns `[1, t, heads * head_dim]`, before the output projection.
fn attention(
    c: &ModelConfig,
    index: usize,
    layer: &Layer,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    part: &mut Part,
) -> Result<Tensor> {
    let t = part.rows;
    let eps = c.rms_norm_eps as f32;
    let (visibility, cache) = (part.visibility, &mut *part.cache);
    let head_norm = |y: Tensor, w: &Option<Tensor>| -> Result<Tensor> {
        match w {
            Some(w) => candle_nn::ops::rms_norm(&y, w, eps),
            None => Ok(y),
        }
    };
    let (cos, sin) = match part.rope {
        Rope::Tables { cos, sin } => (cos, sin),
        Rope::Fused { rotary, positions } => {
            let q = head_norm(q.reshape((t, c.num_heads, c.head_dim))?, &layer.q_norm)?;
            let k = head_norm(k.reshape((t, c.num_kv_heads, c.head_dim))?, &layer.k_norm)?;
            let v = v.reshape((t, c.num_kv_heads, c.head_dim))?;
            return fused_attention(c, index, &q, &k, &v, rotary, positions, visibility, cache);
        }
    };
    let Visibility::Bias(bias) = visibility else {
        candle_core::bail!("a step's inputs are read by the device kernels only (set_fused_decode)")
    };
    let heads =
        |y: &Tensor, n: usize| -> Result<Tensor> { y.reshape((1, t, n, c.head_dim))?.transpose(1, 2)?.contiguous() };
    let q = head_norm(heads(q, c.num_heads)?, &layer.q_norm)?;
    let k = head_norm(heads(k, c.num_kv_heads)?, &layer.k_norm)?;
    let v = heads(v, c.num_kv_heads)?;
    let (q, k) = if c.rope_interleaved {
        (candle_nn::rotary_emb::rope_i(&q, cos, sin)?, candle_nn::rotary_emb::rope_i(&k, cos, sin)?)
    } else {
        (candle_nn::rotary_emb::rope(&q, cos, sin)?, candle_nn::rotary_emb::rope(&k, cos, sin)?)
    };
    let (k_all, v_all) = cache.append(index, &k, &v)?;
    let scale = 1.0 / (c.head_dim as f64).sqrt();
    if let Some(y) = cpu_attention::attend(&q, &k_all, &v_all, bias, scale as f32)? {
        return Ok(y);
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
    y.reshape((1, c.num_heads, t, c.head_dim))?.transpose(1, 2)?.reshape((1, t, c.num_heads * c.head_dim))
}

/// How a forward's rows get their rotary embedding: cos and sin tables of the forward's
/// positions for candle's ops, or the positions for the device kernels
/// ([`DecoderModel::set_fused_decode`]).
pub(crate) enum Rope<'a> {
    Tables { cos: Tensor, sin: Tensor },
    Fused { rotary: &'a rotary::Rotary, positions: &'a Tensor },
}

impl<'a> Rope<'a> {
    /// The rotary embedding of `positions` (`[t]`, u32, on the model's device).
    pub(crate) fn new(rotary: &'a rotary::Rotary, positions: &'a Tensor, fused: bool) -> Result<Self> {
        if fused {
            return Ok(Self::Fused { rotary, positions });
        }
        let (cos, sin) = rotary.at(positions)?;
        Ok(Self::Tables { cos, sin })
    }
}

/// Attention through the device kernels: the rotary embedding of `q` ([`RopeRows`]), `k`
/// rotated and `v` copied into the cache in place ([`KvCache::write_rotated`]), and attention
/// over the cache read in place ([`CacheAttention`], or [`StepAttention`] for a step's inputs).
/// `q`: `[t, heads, head_dim]`, `k` and `v`: `[t, kv_heads, head_dim]` (after the per-head
/// norms). Returns `[1, t, heads * head_dim]`.
#[allow(clippy::too_many_arguments)]
fn fused_attention(
    c: &ModelConfig,
    index: usize,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    rotary: &rotary::Rotary,
    positions: &Tensor,
    visibility: Visibility,
    cache: &mut KvCache,
) -> Result<Tensor> {
    let t = q.dim(0)?;
    let rope_q = RopeRows {
        inv_freq: rotary.inv_freq(),
        attention_factor: rotary.attention_factor(),
        interleaved: c.rope_interleaved,
        heads: c.num_heads,
        head_dim: c.head_dim,
    };
    let q = q.contiguous()?.apply_op2_no_bwd(positions, &rope_q)?;
    let start = cache.len();
    let step = match visibility {
        Visibility::Step(inputs) => Some(inputs),
        Visibility::Bias(_) => None,
    };
    cache.write_rotated(index, k, v, positions, rotary, c.rope_interleaved, step)?;
    let (keys, values) = cache.buffers(index);
    let scale = (1.0 / (c.head_dim as f64).sqrt()) as f32;
    match visibility {
        Visibility::Bias(bias) => {
            let attention = CacheAttention { keys, values, total: start + t, heads: c.num_heads, scale };
            q.apply_op2_no_bwd(&bias.contiguous()?, &attention)?.unsqueeze(0)
        }
        Visibility::Step(inputs) => {
            let attention = StepAttention { keys, values, heads: c.num_heads, scale };
            q.apply_op2_no_bwd(inputs, &attention)?.unsqueeze(0)
        }
    }
}

/// The rest of a block after attention: residual, MLP, residual. With the device kernels
/// (`fused`) each residual add is left to the norm after it ([`Residual`]).
fn finish_block(c: &ModelConfig, layer: &Layer, x: &Tensor, attn: Tensor, fused: bool) -> Result<Residual> {
    let eps = c.rms_norm_eps as f32;
    let after_attention = if fused { Residual::Pending(x.clone(), attn) } else { Residual::Sum((x + attn)?) };
    let (x, h) = after_attention.normed(Some(&layer.mlp_norm), eps)?;
    let mlp = {
        let _span = tracing::trace_span!("mlp").entered();
        layer.down.forward(&layer.gate_up.gated(&h)?)?
    };
    Ok(if fused { Residual::Pending(x, mlp) } else { Residual::Sum((x + mlp)?) })
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
/// through the same attention (docs/results/README.md#const-prefill-chunk-cpu).
pub const PREFILL_CHUNK_CPU: usize = cpu_attention::MAX_ROWS;

/// Prompt tokens per forward of [`DecoderModel::forward_chain`] on the CPU in a batch of several
/// generations: each chunk delays the others' next step by its own time, and a 64-token chunk
/// costs about a quarter of a 256-token one at nearly the same cost per token
/// (docs/results/README.md#const-prefill-chunk-cpu).
pub const PREFILL_CHUNK_CPU_BATCHED: usize = 64;

/// Prompt tokens per forward of [`DecoderModel::forward_chain`] on a GPU, which wants large
/// forwards; the bound keeps the attention scores of long prompts in memory.
pub const PREFILL_CHUNK_GPU: usize = 2048;

/// Causal bias for a chain of `t` new tokens after `past` cached ones.
pub fn causal_bias(past: usize, t: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    attention_bias(past, t, t, |i, j| j <= i, dtype, device)
}
