//! EAGLE-1 draft heads (`yuhuili/EAGLE-Vicuna-7B-v1.3`, `yuhuili/EAGLE-Qwen2-7B-Instruct`): a
//! feature-level draft that reads the target's hidden states.
//!
//! A head is one LLaMA decoder layer fed by a linear map of two vectors: the target's final
//! (normed) hidden state `f_j` at position `j` and the embedding of token `x_{j+1}`,
//! `u_j = fc([embed(x_{j+1}); f_j])` (`fc`: `2H -> H`, with bias). The layer has no input norm
//! (EAGLE drops it in layer 0), keeps its own KV cache, and uses rotary position `j` for entry
//! `j`. Its output `g_j` goes, without a final norm, through the **target's** output layer:
//! `q(x_{j+2}) = softmax(lm_head(g_j))`. Below the root of a draft tree the head feeds its own
//! output back as the feature: a node holding token `x` whose parent entry produced `g` is
//! the entry `(g, x)`.
//!
//! Files (read by `crate::load::eagle`): `config.json` (LLaMA fields; Qwen2 heads say `qkv_bias: true`) and
//! `pytorch_model.bin` or `model.safetensors` with `fc.{weight,bias}`,
//! `layers.0.self_attn.{q,k,v,o}_proj.*`, `layers.0.post_attention_layernorm.weight`,
//! `layers.0.mlp.{gate,up,down}_proj.weight` and, in some heads, `embed_tokens.weight`
//! (otherwise the target's embedding is used).

use super::batcher::Work;
use super::kv_cache::KvCache;
use super::products::Products;
use super::Batcher;
use super::{
    bias_parts, block_parts, split_rows, DecoderModel, Layer, Linear, ModelConfig, Part, Rope, StepInputs, Visibility,
};
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Module, Result, Tensor, D};
use std::path::{Path, PathBuf};

/// One sequence's entries of a batched head forward ([`EagleHead::forward_batch`]): their
/// features (`[t, hidden]`), tokens, positions, attention bias (`[t, cache.len() + t]`) and the
/// sequence's head cache.
pub struct HeadItem<'a> {
    pub features: &'a Tensor,
    pub tokens: &'a [u32],
    pub positions: &'a [u32],
    pub bias: &'a Tensor,
    pub cache: &'a mut KvCache,
}

/// An EAGLE-1 draft head (see the module docs).
#[derive(Debug, Clone)]
pub struct EagleHead {
    config: ModelConfig,
    fc: Linear,
    layer: Layer,
    /// The head's own token embedding, if its checkpoint has one.
    embed: Option<Tensor>,
    /// The target's output layer cut to its first token ids ([`Self::set_output_rows`]);
    /// `None`: the target's whole output layer.
    lm_head: Option<Linear>,
    rotary: super::rotary::Rotary,
    dtype: DType,
    device: Device,
    path: PathBuf,
}

impl EagleHead {
    /// Assembles a head from its weights ([`crate::load`] reads them from a folder): `fc`
    /// (`2H -> H`), the decoder `layer` (no input norm), the head's own token embedding if its
    /// checkpoint has one; `path` names the weight file in messages.
    pub fn new(
        config: ModelConfig,
        fc: Linear,
        layer: Layer,
        embed: Option<Tensor>,
        dtype: DType,
        device: &Device,
        path: PathBuf,
    ) -> Result<Self> {
        let rotary = super::rotary::Rotary::new(&config, dtype, device)?;
        let mut layer = layer;
        if super::products::joins_products(device, super::fused_from_env()) {
            layer.join_products()?;
        }
        Ok(Self { config, fc, layer, embed, lm_head: None, rotary, dtype, device: device.clone(), path })
    }

    /// Re-quantizes the head's dense matrices (`fc` and the layer's seven) whose input width is
    /// a whole number of `dtype`'s blocks ([`Linear::quantized`]); returns how many were. On the
    /// CPU a head step reads all its weights for a few rows, so it is bound by their bytes:
    /// f32 matrices are 4.9 times Q6_K's. Speculative decoding stays exact with any head (the
    /// verifier uses the q the head computes); only how often drafts are accepted can move.
    pub fn quantize_matrices(&mut self, dtype: GgmlDType) -> Result<usize> {
        let mut done = 0;
        let mut quantize = |l: &mut Linear| -> Result<()> {
            if let Some(q) = l.quantized(dtype)? {
                *l = q;
                done += 1;
            }
            Ok(())
        };
        quantize(&mut self.fc)?;
        let layer = &mut self.layer;
        for products in [&mut layer.qkv, &mut layer.gate_up] {
            match products {
                Products::Apart(parts) => parts.iter_mut().try_for_each(&mut quantize)?,
                Products::Joined(runs) => runs.iter_mut().try_for_each(|(l, _)| quantize(l))?,
            }
        }
        quantize(&mut layer.o)?;
        quantize(&mut layer.down)?;
        Ok(done)
    }

    /// On a CPU where our Q6_K kernels run (x86-64 with AVX2), [`Self::quantize_matrices`] to
    /// Q6_K, unless `MDSD_EAGLE_DENSE=1`: a head step on the CPU is bound by the bytes of its
    /// weights. Elsewhere nothing changes. Returns how many matrices were quantized.
    pub fn quantize_for_this_cpu(&mut self) -> Result<usize> {
        let dense = std::env::var("MDSD_EAGLE_DENSE").is_ok_and(|v| v == "1");
        if !self.device.is_cpu() || !crate::kernels::quant::avx2::cpu_supported() || dense {
            return Ok(0);
        }
        self.quantize_matrices(GgmlDType::Q6K)
    }

    /// How many of the head's matrices are dense (not quantized).
    pub fn dense_matrices(&self) -> usize {
        let layer = &self.layer;
        let products = [&layer.qkv, &layer.gate_up].into_iter().flat_map(|p| match p {
            Products::Apart(parts) => parts.iter().collect::<Vec<_>>(),
            Products::Joined(runs) => runs.iter().map(|(l, _)| l).collect(),
        });
        [&self.fc, &layer.o, &layer.down].into_iter().chain(products).filter(|l| l.is_dense()).count()
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The weight file the head came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Computes q only for the first `rows` token ids of `target` (its output layer's first rows,
    /// copied; the other ids get q = 0, which keeps speculative decoding exact), as a draft
    /// model's `--draft-vocab` does: the output layer is most of a head step's cost at a large
    /// vocabulary. 0, or `rows` at or above the vocabulary: the whole output layer.
    pub fn set_output_rows(&mut self, target: &DecoderModel, rows: usize) -> Result<()> {
        self.lm_head = match rows {
            r if r == 0 || r >= target.config().vocab_size => None,
            r => Some(target.output_layer_rows(r)?),
        };
        Ok(())
    }

    /// The draft logits (`[rows, ids]`, f32) of head outputs `out` (`[rows, hidden]`): through
    /// the target's output layer, or its first rows ([`Self::set_output_rows`]).
    /// On a [`super::Batcher`]'s thread, batched with the other members' head logits.
    pub fn logits(&self, target: &DecoderModel, out: &Tensor) -> Result<Tensor> {
        match (&self.lm_head, Batcher::current()) {
            (Some(_), Some(batcher)) => batcher.submit(Work::HeadLogits { head: self, target, out: out.clone() }),
            _ => self.logits_now(target, out),
        }
    }

    /// [`Self::logits`] on this thread, now (the target's whole output layer still through its
    /// batcher, [`DecoderModel::logits`]).
    pub(crate) fn logits_now(&self, target: &DecoderModel, out: &Tensor) -> Result<Tensor> {
        match &self.lm_head {
            Some(head) => {
                let _span = tracing::trace_span!("eagle_lm_head").entered();
                super::output_logits(head, out)
            }
            None => target.logits(out),
        }
    }

    /// About the number of weights of `fc` and the layer's products (what a forward's cost
    /// grows with), as [`DecoderModel::weight_count`] counts a model's.
    pub fn weight_count(&self) -> usize {
        2 * self.config.hidden_size * self.config.hidden_size + self.config.layer_weight_count()
    }

    /// Whether the checkpoint carries its own token embedding.
    pub fn has_embedding(&self) -> bool {
        self.embed.is_some()
    }

    /// An empty KV cache for the head (one layer) holding up to `capacity` entries.
    pub fn new_cache(&self, capacity: usize) -> Result<KvCache> {
        KvCache::new(1, self.config.num_kv_heads, self.config.head_dim, capacity, self.dtype, &self.device)
    }

    /// Runs entries `(features[i], tokens[i])` at `positions[i]` with the additive bias
    /// `[t, cache.len() + t]` and appends them to `cache`; returns the head's outputs
    /// `[t, hidden]` (features for deeper entries; logits through the target's `lm_head`).
    /// `target` supplies the embedding when the head has none. On a thread that is a member of
    /// a [`super::Batcher`], the forward runs batched with the other members' head forwards
    /// (its result is the same).
    pub fn forward(
        &self,
        target: &DecoderModel,
        features: &Tensor,
        tokens: &[u32],
        positions: &[u32],
        bias: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        if let Some(batcher) = Batcher::current() {
            let (features, bias) = (features.clone(), bias.clone());
            return batcher.submit(Work::HeadForward { head: self, target, features, tokens, positions, bias, cache });
        }
        let mut out = self.forward_batch(target, &mut [HeadItem { features, tokens, positions, bias, cache }])?;
        Ok(out.pop().expect("one sequence"))
    }

    /// Runs the entries of several sequences in one head forward, each with its own features,
    /// positions, attention bias and cache (see [`Self::forward`]): `fc` and the layer's
    /// products over all their rows at once, attention per sequence
    /// ([`super::block_parts`]). Returns each sequence's outputs. With the CPU kernels a
    /// row's result does not depend on the rows beside it, so each sequence gets what it gets
    /// alone; on the CPU a head step is bound by reading its weights (and the output layer's,
    /// [`Self::logits`]), so several sequences' entries cost about one's.
    pub fn forward_batch(&self, target: &DecoderModel, items: &mut [HeadItem]) -> Result<Vec<Tensor>> {
        let _span = tracing::trace_span!("eagle_head").entered();
        if items.is_empty() {
            candle_core::bail!("EAGLE head: no sequences");
        }
        for item in items.iter() {
            self.check_forward(item.features, item.tokens, item.positions, item.bias, item.cache)?;
        }
        let tokens: Vec<u32> = items.iter().flat_map(|i| i.tokens.iter().copied()).collect();
        let t = tokens.len();
        let e = match &self.embed {
            Some(own) => own.index_select(&Tensor::from_slice(&tokens, t, &self.device)?, 0)?,
            None => target.embedding().lookup(&tokens, &self.device)?.to_device(&self.device)?.to_dtype(self.dtype)?,
        };
        let features = match items {
            [one] => one.features.to_dtype(self.dtype)?,
            _ => {
                let each = items.iter().map(|i| i.features.to_dtype(self.dtype)).collect::<Result<Vec<_>>>()?;
                Tensor::cat(&each, 0)?
            }
        };
        let x = Tensor::cat(&[&e, &features], D::Minus1)?;
        let x = self.fc.forward(&x.unsqueeze(0)?)?;
        let positions: Vec<Tensor> = items
            .iter()
            .map(|i| Tensor::from_slice(i.positions, i.positions.len(), &self.device))
            .collect::<Result<_>>()?;
        // The head runs attention as its target does ([`DecoderModel::set_fused_decode`]).
        let ropes: Vec<Rope> =
            positions.iter().map(|p| Rope::new(&self.rotary, p, target.fused_decode())).collect::<Result<_>>()?;
        let biases: Vec<Tensor> = items.iter().map(|i| i.bias.to_dtype(self.dtype)).collect::<Result<_>>()?;
        let seqs = items.iter_mut().map(|i| (i.tokens.len(), &mut *i.cache));
        let y = block_parts(&self.config, 0, &self.layer, &x, &mut bias_parts(seqs, &ropes, &biases))?.squeeze(0)?;
        for item in items.iter_mut() {
            item.cache.advance(item.tokens.len())?;
        }
        split_rows(y, items.iter().map(|i| i.tokens.len()))
    }

    /// The checks of one sequence's head forward: features, positions and bias that fit its
    /// tokens, room in the cache, positions inside the context and ids inside the vocabulary.
    pub(crate) fn check_forward(
        &self,
        features: &Tensor,
        tokens: &[u32],
        positions: &[u32],
        bias: &Tensor,
        cache: &KvCache,
    ) -> Result<()> {
        let t = tokens.len();
        let total = cache.len() + t;
        if t == 0 || positions.len() != t || features.dims() != [t, self.config.hidden_size] {
            candle_core::bail!(
                "EAGLE head: {t} tokens, {} positions and features {:?} (hidden {})",
                positions.len(),
                features.dims(),
                self.config.hidden_size
            );
        }
        if bias.dims() != [t, total] {
            candle_core::bail!("EAGLE head: attention bias {:?}, expected [{t}, {total}]", bias.dims());
        }
        if let Some(&bad) = tokens.iter().find(|&&x| x as usize >= self.config.vocab_size) {
            candle_core::bail!("EAGLE head: token id {bad} is outside the vocabulary of {}", self.config.vocab_size);
        }
        if let Some(&p) = positions.iter().find(|&&p| p as usize >= self.config.context_length) {
            candle_core::bail!("EAGLE head: position {p} beyond the context of {}", self.config.context_length);
        }
        cache.reserve(t)
    }

    /// [`Self::forward`] of a step set in `step` ([`StepInputs`]: tokens, positions and what
    /// each entry sees, read from the device buffer) with `features` (`[rows, hidden]`, a fixed
    /// buffer the caller fills), every row of the bucket, through the device kernels (the
    /// target's [`DecoderModel::set_fused_decode`] must be on): what a graph replays
    /// ([`super::StepGraphs::forward_head`]). The cache is not advanced, as in
    /// [`DecoderModel::forward_step`].
    pub fn forward_step(
        &self,
        target: &DecoderModel,
        features: &Tensor,
        step: &StepInputs,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        if !target.fused_decode() {
            candle_core::bail!("EAGLE head: forward_step runs the device kernels: turn on set_fused_decode");
        }
        let rows = step.rows();
        if features.dims() != [rows, self.config.hidden_size] {
            candle_core::bail!("EAGLE head: features {:?} for a step of {rows} rows", features.dims());
        }
        cache.reserve(rows)?;
        let inputs = step.tensor();
        let (tokens, positions) = (inputs.narrow(0, 0, rows)?, inputs.narrow(0, rows, rows)?);
        let e = match &self.embed {
            Some(own) => own.index_select(&tokens, 0)?,
            None => target.embedding().lookup_tensor(&tokens)?.to_device(&self.device)?.to_dtype(self.dtype)?,
        };
        let x = Tensor::cat(&[&e, &features.to_dtype(self.dtype)?], D::Minus1)?;
        let x = self.fc.forward(&x.unsqueeze(0)?)?;
        let rope = Rope::Fused { rotary: &self.rotary, positions: &positions };
        let part = Part { rows, rope: &rope, visibility: Visibility::Step(inputs), cache };
        let y = block_parts(&self.config, 0, &self.layer, &x, &mut [part])?;
        y.squeeze(0)
    }
}
