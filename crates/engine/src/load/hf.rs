//! Loading a [`DecoderModel`] from a Hugging Face model folder: `config.json` plus
//! `model.safetensors`, sharded `model-*.safetensors` with `model.safetensors.index.json`, or
//! `pytorch_model*.bin` (with its index when sharded).
//!
//! Weight names follow transformers' `LlamaForCausalLM` / `Qwen2ForCausalLM`:
//! `model.embed_tokens`, `model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj,
//! post_attention_layernorm, mlp.{gate,up,down}_proj}`, `model.norm`, `lm_head` (absent when
//! `tie_word_embeddings`).

use crate::model::{Architecture, DecoderModel, Layer, Linear, ModelConfig, Products};
use candle_core::quantized::QMatMul;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::file_error as err;
use crate::{Error, Result};

/// `config.json` of a LLaMA-family or Qwen2 checkpoint, as transformers writes it.
#[derive(Debug, Clone, Deserialize)]
pub struct HfConfig {
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// transformers v4's spelling; v5 writes it inside `rope_parameters`.
    pub rope_theta: Option<serde_json::Value>,
    #[serde(default = "default_ctx")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// LLaMA: biases on the q, k, v and o projections.
    pub attention_bias: Option<bool>,
    /// LLaMA: biases on the gate, up and down projections.
    pub mlp_bias: Option<bool>,
    /// EAGLE heads' name for `attention_bias` (their Qwen2 heads say `model_type: llama`).
    pub qkv_bias: Option<bool>,
    /// transformers v4's rotary scaling (`type` or `rope_type`, `factor`, ...).
    pub rope_scaling: Option<serde_json::Value>,
    /// transformers v5's rotary parameters: `rope_theta`, `rope_type` and the scaling's own.
    pub rope_parameters: Option<serde_json::Value>,
    pub partial_rotary_factor: Option<serde_json::Value>,
    pub hidden_act: Option<String>,
    /// Mistral: every layer's window; Qwen2: the window of the layers that slide.
    pub sliding_window: Option<usize>,
    /// Qwen2 (transformers v4): whether layers from `max_window_layers` on slide.
    pub use_sliding_window: Option<bool>,
    pub max_window_layers: Option<usize>,
    /// transformers v5: `full_attention` or `sliding_attention` per layer.
    pub layer_types: Option<Vec<String>>,
    /// GPTQ, AWQ, FP8 and the like: weights this loader would misread, so refused.
    pub quantization_config: Option<serde_json::Value>,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_ctx() -> usize {
    2048
}

impl HfConfig {
    /// Reads and checks `config.json`.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| err(path, format!("cannot read: {e}")))?;
        serde_json::from_str(&text).map_err(|e| err(path, format!("not a valid model config.json: {e}")))
    }

    /// The plain configuration; unsupported features are errors naming `path`.
    pub fn resolve(&self, path: &Path) -> Result<ModelConfig> {
        let architecture = match self.model_type.as_str() {
            "llama" | "mistral" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            other => {
                return Err(err(
                    path,
                    format!("unsupported model_type `{other}` (supported: llama, mistral, qwen2, qwen3)"),
                ))
            }
        };
        let rope_fields = serde_json::json!({
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "rope_parameters": self.rope_parameters,
            "partial_rotary_factor": self.partial_rotary_factor,
        });
        let (rope_theta, rope_scaling) =
            super::rope_scaling::from_hf_config(&rope_fields, self.max_position_embeddings)
                .map_err(|e| err(path, e))?;
        if let Some(act) = &self.hidden_act {
            if act != "silu" {
                return Err(err(path, format!("hidden_act `{act}` is not supported (only silu)")));
            }
        }
        if let Some(q) = self.quantization_config.as_ref().filter(|q| !q.is_null()) {
            let method = q.get("quant_method").and_then(|m| m.as_str()).unwrap_or("unnamed");
            return Err(err(
                path,
                format!(
                    "a quantized checkpoint (quant_method `{method}`) is not supported: use its GGUF file, or the \
                     unquantized weights"
                ),
            ));
        }
        let context = rope_scaling.context_length(self.max_position_embeddings);
        let config = ModelConfig {
            architecture,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: self.num_hidden_layers,
            num_heads: self.num_attention_heads,
            num_kv_heads: self.num_key_value_heads.unwrap_or(self.num_attention_heads),
            head_dim: self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1)),
            rms_norm_eps: self.rms_norm_eps,
            rope_theta,
            // Within its window a sliding layer attends as a full one does: the text stays inside it.
            context_length: self.sliding_window().map_or(context, |w| context.min(w)),
            rope_scaling,
            rope_interleaved: false,
        };
        config.validate(&path.display().to_string())?;
        Ok(config)
    }

    /// The attention window when any layer slides, as transformers decides it: Mistral's
    /// `sliding_window` for every layer; Qwen2's for the layers `layer_types` marks
    /// `sliding_attention` (v5), else, with `use_sliding_window`, those from `max_window_layers`
    /// on (v4). LLaMA has none.
    pub fn sliding_window(&self) -> Option<usize> {
        let window = self.sliding_window.filter(|&w| w > 0)?;
        let slides = match self.model_type.as_str() {
            "mistral" => true,
            "qwen2" | "qwen3" => match &self.layer_types {
                Some(types) => types.iter().any(|t| t == "sliding_attention"),
                None => {
                    self.use_sliding_window == Some(true)
                        && self.max_window_layers.unwrap_or(0) < self.num_hidden_layers
                }
            },
            _ => false,
        };
        slides.then_some(window)
    }

    pub fn qkv_bias(&self) -> bool {
        self.attention_bias.or(self.qkv_bias).unwrap_or(self.model_type == "qwen2")
    }

    /// The projections with biases, as transformers builds them: Qwen2 on q, k and v; LLaMA
    /// and Qwen3 with `attention_bias` on q, k, v and o; LLaMA with `mlp_bias` on gate, up and
    /// down.
    pub fn biases(&self) -> Biases {
        let llama = self.model_type == "llama";
        Biases {
            qkv: self.qkv_bias(),
            o: (llama || self.model_type == "qwen3") && self.attention_bias == Some(true),
            mlp: llama && self.mlp_bias == Some(true),
        }
    }
}

/// The weight files of a model folder, in load order.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    for index in ["model.safetensors.index.json", "pytorch_model.bin.index.json"] {
        let index_path = dir.join(index);
        if index_path.is_file() {
            let text = std::fs::read_to_string(&index_path).map_err(|e| err(&index_path, e))?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| err(&index_path, format!("not valid JSON: {e}")))?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| err(&index_path, "no `weight_map` object"))?;
            let mut files: Vec<String> = map.values().filter_map(|v| v.as_str().map(str::to_owned)).collect();
            files.sort();
            files.dedup();
            let files: Vec<PathBuf> = files.into_iter().map(|f| dir.join(f)).collect();
            if let Some(missing) = files.iter().find(|f| !f.is_file()) {
                return Err(err(missing, format!("weight shard listed in {index} is missing")));
            }
            return Ok(files);
        }
    }
    for single in ["model.safetensors", "pytorch_model.bin"] {
        if dir.join(single).is_file() {
            return Ok(vec![dir.join(single)]);
        }
    }
    Err(err(dir, "no weights: expected model.safetensors, model.safetensors.index.json or pytorch_model.bin"))
}

/// Loads the model in folder `dir`. Weights are cast to `dtype` (f32 on CPU; f16/bf16 on
/// CUDA). `max_layers` keeps only the first blocks.
pub fn load(dir: &Path, dtype: DType, device: &Device, max_layers: Option<usize>) -> Result<DecoderModel> {
    let config_path = dir.join("config.json");
    let hf = HfConfig::load(&config_path)?;
    let mut config = hf.resolve(&config_path)?;
    if let Some(n) = max_layers {
        config.num_layers = config.num_layers.min(n.max(1));
    }
    let files = weight_files(dir)?;
    let vb = if files.iter().all(|f| f.extension().is_some_and(|e| e == "safetensors")) {
        for f in &files {
            check_safetensors(f)?;
        }
        // SAFETY: the files are memory-mapped read-only; they must not change while loaded.
        unsafe { VarBuilder::from_mmaped_safetensors(&files, dtype, device)? }
    } else {
        let mut all = HashMap::new();
        for f in &files {
            for (name, t) in crate::formats::torch_bin::read_all(f)? {
                all.insert(name, t);
            }
        }
        VarBuilder::from_tensors(all, dtype, device)
    };
    let shown = files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", ");
    build(&hf, config, vb, dtype, device).map_err(|e| Error::File { path: shown.into(), what: crate::plain_error(&e) })
}

/// A safetensors header that parses and whose tensors lie inside the file (reads only the
/// header, so a truncated download is caught before memory-mapping).
pub fn check_safetensors(path: &Path) -> Result<()> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| err(path, format!("cannot open: {e}")))?;
    let file_len = f.metadata().map_err(|e| err(path, e))?.len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|_| err(path, "corrupt safetensors file: shorter than its 8-byte header length"))?;
    let n = u64::from_le_bytes(len);
    if n > 100_000_000 || 8 + n > file_len {
        return Err(err(path, format!("corrupt safetensors file: header length {n} for a file of {file_len} bytes")));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(|e| err(path, format!("corrupt safetensors file: {e}")))?;
    let json: serde_json::Value = serde_json::from_slice(&header)
        .map_err(|e| err(path, format!("corrupt safetensors file: header is not JSON: {e}")))?;
    let entries = json.as_object().ok_or_else(|| err(path, "corrupt safetensors file: header is not an object"))?;
    for (name, info) in entries.iter().filter(|(k, _)| *k != "__metadata__") {
        let end = info.get("data_offsets").and_then(|o| o.get(1)).and_then(|e| e.as_u64());
        match end {
            Some(end) if (8 + n).saturating_add(end) <= file_len => {}
            Some(end) => {
                return Err(err(
                    path,
                    format!(
                        "truncated safetensors file: tensor `{name}` ends at byte {} of {file_len}",
                        8 + n as u128 + end as u128
                    ),
                ))
            }
            None => return Err(err(path, format!("corrupt safetensors file: tensor `{name}` has no data_offsets"))),
        }
    }
    Ok(())
}

/// A dense `Linear` from `vb`'s `weight` (`[out, inp]`) and, when `bias`, `bias`.
pub(crate) fn dense_linear(vb: &VarBuilder, out: usize, inp: usize, bias: bool) -> candle_core::Result<Linear> {
    let w = vb.get((out, inp), "weight")?;
    let b = if bias { Some(vb.get(out, "bias")?) } else { None };
    Linear::new(QMatMul::Tensor(w), b)
}

/// Qwen3's per-head RMS-norm weight `name` (`[head_dim]`) under `a`; `None` for the other
/// architectures.
fn head_norm(a: &VarBuilder, c: &ModelConfig, name: &str) -> candle_core::Result<Option<Tensor>> {
    match c.architecture {
        Architecture::Qwen3 => Ok(Some(a.get(c.head_dim, &format!("{name}.weight"))?)),
        _ => Ok(None),
    }
}

/// Which projections of a layer have biases ([`HfConfig::biases`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Biases {
    pub qkv: bool,
    pub o: bool,
    pub mlp: bool,
}

/// One decoder layer under transformers' names (`self_attn.*`, `mlp.*`, the norms) from `l`;
/// without `input_layernorm` when `input_norm` is false (EAGLE heads).
pub(crate) fn layer(l: &VarBuilder, c: &ModelConfig, biases: Biases, input_norm: bool) -> candle_core::Result<Layer> {
    let (h, kv, q) = (c.hidden_size, c.num_kv_heads * c.head_dim, c.num_heads * c.head_dim);
    let (a, f) = (l.pp("self_attn"), l.pp("mlp"));
    Ok(Layer {
        attn_norm: if input_norm { Some(l.get(h, "input_layernorm.weight")?) } else { None },
        qkv: Products::Apart(vec![
            dense_linear(&a.pp("q_proj"), q, h, biases.qkv)?,
            dense_linear(&a.pp("k_proj"), kv, h, biases.qkv)?,
            dense_linear(&a.pp("v_proj"), kv, h, biases.qkv)?,
        ]),
        o: dense_linear(&a.pp("o_proj"), h, q, biases.o)?,
        q_norm: head_norm(&a, c, "q_norm")?,
        k_norm: head_norm(&a, c, "k_norm")?,
        mlp_norm: l.get(h, "post_attention_layernorm.weight")?,
        gate_up: Products::Apart(vec![
            dense_linear(&f.pp("gate_proj"), c.intermediate_size, h, biases.mlp)?,
            dense_linear(&f.pp("up_proj"), c.intermediate_size, h, biases.mlp)?,
        ]),
        down: dense_linear(&f.pp("down_proj"), h, c.intermediate_size, biases.mlp)?,
    })
}

fn build(
    hf: &HfConfig,
    config: ModelConfig,
    vb: VarBuilder,
    dtype: DType,
    device: &Device,
) -> candle_core::Result<DecoderModel> {
    let c = &config;
    let h = c.hidden_size;
    let m = vb.pp("model");
    let embed = m.get((c.vocab_size, h), "embed_tokens.weight")?;
    // Not `with_capacity(num_layers)`: the count comes from config.json, and a corrupt one would
    // abort on the allocation before the first missing layer is reported.
    let mut layers = Vec::new();
    for i in 0..c.num_layers {
        layers.push(layer(&m.pp(format!("layers.{i}")), c, hf.biases(), true)?);
    }
    let norm = m.get(h, "norm.weight")?;
    let lm_head = if hf.tie_word_embeddings && !vb.contains_tensor("lm_head.weight") {
        embed.clone()
    } else {
        vb.get((c.vocab_size, h), "lm_head.weight")?
    };
    let embed = crate::model::embedding::TokenEmbedding::Dense(embed);
    DecoderModel::new(config, embed, layers, norm, Linear::new(QMatMul::Tensor(lm_head), None)?, dtype, device)
}
