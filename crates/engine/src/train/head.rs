//! [`TrainableHead`]: an EAGLE-1 head ([`crate::model::eagle`]) whose weights are candle
//! [`Var`]s, with a differentiable forward over one whole sequence, written in EAGLE's own
//! checkpoint layout (`config.json` + `model.safetensors`, the names `cnets.py` uses) so that
//! `mdsd generate --eagle DIR` and EAGLE's current loader (`use_eagle3=False`, non-strict, the
//! embedding taken from the base model) load it; no `embed_tokens.weight` is written, which
//! EAGLE's first, strict releases want (docs/eagle-training.md).
//!
//! The forward is the inference head's, term for term (test
//! `trained_head_loads_and_computes_what_it_trained`): entry `j` is `u_j = fc([embed(x_{j+1});
//! f_j])`; one LLaMA decoder layer without its input norm (rotary position `j`, causal attention
//! over entries `0..=j`, q/k/v biases for a Qwen2 target); output `g_j` with no final norm.
//! A one-layer head's output at `j` depends on the entries before it only through their keys
//! and values, so [`TrainableHead::forward`] computes queries, the MLP and outputs only for the
//! entries that carry a loss (the answer), and keys and values for all of them (the prompt).

use candle_core::{DType, Device, Result, Tensor, Var, D};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::Path;

/// The sizes of a head: the target's hidden size, heads and vocabulary; its own MLP width.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadShape {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
    /// q/k/v biases (a Qwen2 target's heads have them).
    pub qkv_bias: bool,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub context_length: usize,
}

impl HeadShape {
    /// A head for `target` (its sizes; `intermediate`: the MLP width, `None` for the target's).
    pub fn for_target(target: &crate::model::ModelConfig, intermediate: Option<usize>) -> Self {
        Self {
            hidden: target.hidden_size,
            heads: target.num_heads,
            kv_heads: target.num_kv_heads,
            head_dim: target.head_dim,
            intermediate: intermediate.unwrap_or(target.intermediate_size),
            vocab: target.vocab_size,
            qkv_bias: target.architecture == crate::model::Architecture::Qwen2,
            rms_norm_eps: target.rms_norm_eps,
            rope_theta: target.rope_theta,
            context_length: target.context_length,
        }
    }

    /// EAGLE's `config.json` (LLaMA fields, one layer; `qkv_bias` for a Qwen2 target, as
    /// `yuhuili/EAGLE-Qwen2-7B-Instruct` says it). `torch_dtype`: the stored weights' type.
    pub fn config_json(&self, torch_dtype: &str) -> serde_json::Value {
        let mut v = serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_act": "silu",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": 1,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.context_length,
            "torch_dtype": torch_dtype,
        });
        if self.qkv_bias {
            v["qkv_bias"] = true.into();
        }
        v
    }

    /// The head's tensors in EAGLE's names with their shapes (`[out, in]` for matrices, as
    /// PyTorch stores them), in a fixed order.
    pub fn tensors(&self) -> Vec<(String, Vec<usize>)> {
        let (h, q, kv, m) = (self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate);
        let p = "layers.0.";
        let mut out: Vec<(String, Vec<usize>)> = vec![
            ("fc.weight".into(), vec![h, 2 * h]),
            ("fc.bias".into(), vec![h]),
            (format!("{p}self_attn.q_proj.weight"), vec![q, h]),
            (format!("{p}self_attn.k_proj.weight"), vec![kv, h]),
            (format!("{p}self_attn.v_proj.weight"), vec![kv, h]),
            (format!("{p}self_attn.o_proj.weight"), vec![h, q]),
            (format!("{p}post_attention_layernorm.weight"), vec![h]),
            (format!("{p}mlp.gate_proj.weight"), vec![m, h]),
            (format!("{p}mlp.up_proj.weight"), vec![m, h]),
            (format!("{p}mlp.down_proj.weight"), vec![h, m]),
        ];
        if self.qkv_bias {
            out.push((format!("{p}self_attn.q_proj.bias"), vec![q]));
            out.push((format!("{p}self_attn.k_proj.bias"), vec![kv]));
            out.push((format!("{p}self_attn.v_proj.bias"), vec![kv]));
        }
        out
    }
}

/// An EAGLE-1 head being trained (see the module docs). f32 on its device.
pub struct TrainableHead {
    shape: HeadShape,
    vars: BTreeMap<String, Var>,
    /// Rotary inverse frequencies `theta^(-2i/d)`, `i < d/2`.
    inv_freq: Vec<f32>,
    device: Device,
}

impl TrainableHead {
    /// A head with PyTorch's `nn.Linear` initialisation (weights and biases uniform in
    /// `±1/sqrt(fan_in)`), the norm's weight ones; deterministic in `seed`.
    pub fn init(shape: HeadShape, seed: u64, device: &Device) -> Result<Self> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut tensors = BTreeMap::new();
        for (name, dims) in shape.tensors() {
            let n: usize = dims.iter().product();
            let values: Vec<f32> = if name.ends_with("layernorm.weight") {
                vec![1.0; n]
            } else {
                // A bias's fan-in is its matrix's input width.
                let fan_in = if dims.len() == 2 {
                    dims[1]
                } else if name == "fc.bias" {
                    2 * shape.hidden
                } else {
                    shape.hidden
                };
                let bound = 1.0 / (fan_in as f32).sqrt();
                (0..n).map(|_| rng.random_range(-bound..bound)).collect()
            };
            tensors.insert(name, Tensor::from_vec(values, dims, device)?);
        }
        Self::from_tensors(shape, tensors, device)
    }

    /// A head from named tensors (a checkpoint's), cast to f32; every tensor of `shape` must be
    /// there with its shape.
    pub fn from_tensors(shape: HeadShape, mut tensors: BTreeMap<String, Tensor>, device: &Device) -> Result<Self> {
        let mut vars = BTreeMap::new();
        for (name, dims) in shape.tensors() {
            let t = tensors.remove(&name).ok_or_else(|| candle_core::Error::Msg(format!("no tensor {name}")))?;
            if t.dims() != dims.as_slice() {
                candle_core::bail!("tensor {name} has shape {:?}, expected {dims:?}", t.dims());
            }
            vars.insert(name, Var::from_tensor(&t.to_dtype(DType::F32)?.to_device(device)?)?);
        }
        let half = shape.head_dim / 2;
        let inv_freq =
            (0..half).map(|i| (1.0 / shape.rope_theta.powf(2.0 * i as f64 / shape.head_dim as f64)) as f32).collect();
        Ok(Self { shape, vars, inv_freq, device: device.clone() })
    }

    /// Reads the tensors of a `model.safetensors` written by [`Self::save`] (or a checkpoint).
    pub fn load(shape: HeadShape, file: &Path, device: &Device) -> Result<Self> {
        let tensors = candle_core::safetensors::load(file, device)?;
        Self::from_tensors(shape, tensors.into_iter().collect(), device)
    }

    pub fn shape(&self) -> &HeadShape {
        &self.shape
    }

    /// The head with its weights on `device` (itself when they are there already).
    pub fn to_device(self, device: &Device) -> Result<Self> {
        if self.device.same_device(device) {
            return Ok(self);
        }
        let tensors = self.tensors();
        Self::from_tensors(self.shape, tensors, device)
    }

    /// The trained variables, by name.
    pub fn vars(&self) -> &BTreeMap<String, Var> {
        &self.vars
    }

    /// The number of trained parameters.
    pub fn parameter_count(&self) -> usize {
        self.vars.values().map(|v| v.elem_count()).sum()
    }

    fn w(&self, name: &str) -> &Tensor {
        self.vars[name].as_tensor()
    }

    /// `x W^T (+ b)` for the matrix `name.weight` and, if present, `name.bias`.
    fn linear(&self, x: &Tensor, name: &str) -> Result<Tensor> {
        let y = x.matmul(&self.w(&format!("{name}.weight")).t()?)?;
        match self.vars.get(&format!("{name}.bias")) {
            Some(b) => y.broadcast_add(b.as_tensor()),
            None => Ok(y),
        }
    }

    /// Rotary embedding on the two halves of each head (`x`: `[heads, rows, d]`) at positions
    /// `first..first + rows`.
    fn rotate(&self, x: &Tensor, first: usize) -> Result<Tensor> {
        let (_, rows, d) = x.dims3()?;
        let half = d / 2;
        let mut cos = Vec::with_capacity(rows * half);
        let mut sin = Vec::with_capacity(rows * half);
        for p in first..first + rows {
            for &f in &self.inv_freq {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        let cos = Tensor::from_vec(cos, (1, rows, half), &self.device)?;
        let sin = Tensor::from_vec(sin, (1, rows, half), &self.device)?;
        let x1 = x.narrow(D::Minus1, 0, half)?;
        let x2 = x.narrow(D::Minus1, half, half)?;
        Tensor::cat(
            &[
                &(x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?,
                &(x2.broadcast_mul(&cos)? + x1.broadcast_mul(&sin)?)?,
            ],
            D::Minus1,
        )
    }

    /// The head over one sequence of `n` entries: `embeds` (`[n, hidden]`, the embeddings of
    /// `x_1..x_n`) and `features` (`[n, hidden]`, the target's `f_0..f_{n-1}`), at positions
    /// `0..n`. Returns the outputs `g_j` of entries `from..n` (`[n - from, hidden]`).
    pub fn forward(&self, embeds: &Tensor, features: &Tensor, from: usize) -> Result<Tensor> {
        let mut steps = self.forward_unrolled(embeds, features, from, 1)?;
        Ok(steps.remove(0))
    }

    /// The head drafting `steps` tokens deep from every answer entry, as it drafts a chain at
    /// inference ("training-time test", EAGLE-3 §3.2; HASS): step 1 is [`Self::forward`]. At
    /// step `s > 1` the entry `j` takes the head's own step-`(s-1)` output at `j - 1` as its
    /// feature, `u^s_j = fc([embed(x_{j+1}); g^{s-1}_{j-1}])` (the true token: a draft whose
    /// token differs is rejected anyway), and attends to what the head's cache holds when that
    /// draft runs: the step-1 (true-feature) entries `0..=j-s+1` and, for each `r` in `2..=s`,
    /// the step-`r` entry `j - s + r` (the chain's own earlier drafts, and itself). Its target
    /// is entry `j`'s at step 1 (`f_{j+1}`, `x_{j+2}`). Returns step `s`'s outputs for entries
    /// `from + s - 1..n` (`[n - from - s + 1, hidden]`; steps with none left are omitted).
    /// Gradients flow through the fed-back outputs.
    pub fn forward_unrolled(
        &self,
        embeds: &Tensor,
        features: &Tensor,
        from: usize,
        steps: usize,
    ) -> Result<Vec<Tensor>> {
        let s = &self.shape;
        let (n, h) = embeds.dims2()?;
        if features.dims() != [n, h] || h != s.hidden || from >= n || steps == 0 {
            candle_core::bail!(
                "EAGLE training: embeddings {:?}, features {:?}, outputs from {from} (hidden {}), {steps} steps",
                embeds.dims(),
                features.dims(),
                s.hidden
            );
        }
        let u = self.linear(&Tensor::cat(&[embeds, features], D::Minus1)?, "fc")?;
        // Step 1's keys and values: every entry, the prompt's included.
        let (k1, v1) = self.keys_values(&u, 0, n)?;
        let mut outs: Vec<Tensor> = Vec::with_capacity(steps);
        let mut own: Vec<(Tensor, Tensor)> = Vec::new();
        let uq = u.narrow(0, from, n - from)?;
        outs.push(self.attend(&uq, from, from, (&k1, &v1), &[])?);
        for step in 2..=steps {
            let m = n - from - (step - 1);
            if m == 0 {
                break;
            }
            let first = from + step - 1;
            let fed = outs[step - 2].narrow(0, 0, m)?;
            let u = self.linear(&Tensor::cat(&[&embeds.narrow(0, first, m)?, &fed], D::Minus1)?, "fc")?;
            own.push(self.keys_values(&u, first, m)?);
            let diagonal: Vec<(Tensor, Tensor)> =
                own.iter().map(|(k, v)| Ok((k.narrow(1, 0, m)?, v.narrow(1, 0, m)?))).collect::<Result<_>>()?;
            outs.push(self.attend(&u, first, from, (&k1, &v1), &diagonal)?);
        }
        Ok(outs)
    }

    /// Rotated keys and values of entries `first..first + rows` (inputs `u`), one per query
    /// head (grouped-query heads repeated): `[heads, rows, head_dim]` each.
    fn keys_values(&self, u: &Tensor, first: usize, rows: usize) -> Result<(Tensor, Tensor)> {
        let s = &self.shape;
        let d = s.head_dim;
        let split = |x: Tensor| x.reshape((rows, s.kv_heads, d))?.transpose(0, 1)?.contiguous();
        let k = self.rotate(&split(self.linear(u, "layers.0.self_attn.k_proj")?)?, first)?;
        let v = split(self.linear(u, "layers.0.self_attn.v_proj")?)?;
        // Grouped-query attention: each KV head serves heads / kv_heads query heads.
        let group = s.heads / s.kv_heads;
        let expand = |x: Tensor| -> Result<Tensor> {
            if group == 1 {
                return Ok(x);
            }
            x.unsqueeze(1)?.broadcast_as((s.kv_heads, group, rows, d))?.contiguous()?.reshape((s.heads, rows, d))
        };
        Ok((expand(k)?, expand(v)?))
    }

    /// The decoder layer for query entries `first..first + m` (inputs `uq`, `[m, hidden]`): the
    /// `i`-th attends to the step-1 entries `0..=causal_from + i` (`step1`) and to the `i`-th
    /// row of each of `diagonal` (keys and values `[heads, >= m, head_dim]`).
    fn attend(
        &self,
        uq: &Tensor,
        first: usize,
        causal_from: usize,
        step1: (&Tensor, &Tensor),
        diagonal: &[(Tensor, Tensor)],
    ) -> Result<Tensor> {
        let s = &self.shape;
        let (m, d) = (uq.dim(0)?, s.head_dim);
        let (k1, v1) = step1;
        let n = k1.dim(1)?;
        let q =
            self.linear(uq, "layers.0.self_attn.q_proj")?.reshape((m, s.heads, d))?.transpose(0, 1)?.contiguous()?;
        let q = self.rotate(&q, first)?;
        let scale = 1.0 / (d as f64).sqrt();
        let scores = (q.matmul(&k1.t()?)? * scale)?;
        let mut mask = vec![0f32; m * n];
        for i in 0..m {
            for key in causal_from + i + 1..n {
                mask[i * n + key] = f32::NEG_INFINITY;
            }
        }
        let mask = Tensor::from_vec(mask, (1, m, n), &self.device)?;
        let scores = scores.broadcast_add(&mask)?;
        let attended = if diagonal.is_empty() {
            candle_nn::ops::softmax(&scores, D::Minus1)?.matmul(v1)?
        } else {
            let mut all = vec![scores];
            for (k, _) in diagonal {
                all.push(((&q * k)?.sum_keepdim(D::Minus1)? * scale)?);
            }
            let probs = candle_nn::ops::softmax(&Tensor::cat(&all, D::Minus1)?, D::Minus1)?;
            let mut out = probs.narrow(D::Minus1, 0, n)?.matmul(v1)?;
            for (r, (_, v)) in diagonal.iter().enumerate() {
                out = (out + probs.narrow(D::Minus1, n + r, 1)?.broadcast_mul(v)?)?;
            }
            out
        };
        let attended = attended.transpose(0, 1)?.reshape((m, s.heads * d))?;
        let hidden = (self.linear(&attended, "layers.0.self_attn.o_proj")? + uq)?;
        let normed = rms_norm(&hidden, self.w("layers.0.post_attention_layernorm.weight"), s.rms_norm_eps)?;
        let gate = self.linear(&normed, "layers.0.mlp.gate_proj")?.silu()?;
        let up = self.linear(&normed, "layers.0.mlp.up_proj")?;
        let mlp = self.linear(&(gate * up)?, "layers.0.mlp.down_proj")?;
        hidden + mlp
    }

    /// The current weights, by name (f32).
    pub fn tensors(&self) -> BTreeMap<String, Tensor> {
        self.vars.iter().map(|(k, v)| (k.clone(), v.as_tensor().clone())).collect()
    }

    /// Writes the head in EAGLE's layout into `dir`: `config.json` and `model.safetensors`
    /// with the weights as `dtype` (f16, bf16 or f32).
    pub fn save(&self, dir: &Path, dtype: DType) -> crate::Result<()> {
        let torch_dtype = match dtype {
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            other => return Err(crate::file_error(dir, format!("cannot store an EAGLE head as {other:?}"))),
        };
        std::fs::create_dir_all(dir).map_err(|e| crate::file_error(dir, format!("cannot create: {e}")))?;
        let config = dir.join("config.json");
        let json = serde_json::to_string_pretty(&self.shape.config_json(torch_dtype)).expect("JSON of a value");
        write_atomically(&config, json.as_bytes())?;
        let tensors: Vec<(String, Tensor)> = self
            .tensors()
            .into_iter()
            .map(|(k, t)| Ok((k, t.to_dtype(dtype)?.to_device(&Device::Cpu)?)))
            .collect::<Result<_>>()?;
        save_safetensors(&dir.join("model.safetensors"), tensors)
    }
}

/// RMS norm written with differentiable operations (candle-nn's fused one has no backward).
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let mean_square = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(mean_square + eps)?.sqrt()?)?.broadcast_mul(weight)
}

/// Writes `bytes` to `path` through a temporary file in the same folder, synced, then renamed:
/// a crash leaves the old file or the new one, never half of one.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> crate::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension(format!("partial-{}", std::process::id()));
    let io = |e: std::io::Error| crate::file_error(path, format!("cannot write: {e}"));
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Saves named tensors (on any device) as safetensors at `path`, atomically ([`write_atomically`]).
pub fn save_safetensors(path: &Path, tensors: Vec<(String, Tensor)>) -> crate::Result<()> {
    let tmp = path.with_extension(format!("partial-{}", std::process::id()));
    let on_host = tensors
        .into_iter()
        .map(|(k, t)| Ok((k, t.to_device(&Device::Cpu)?)))
        .collect::<Result<std::collections::HashMap<_, _>>>()?;
    candle_core::safetensors::save(&on_host, &tmp)
        .map_err(|e| crate::file_error(path, format!("cannot write: {e}")))?;
    let io = |e: std::io::Error| crate::file_error(path, format!("cannot write: {e}"));
    std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}
