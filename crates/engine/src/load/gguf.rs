//! Loading a [`DecoderModel`] from a GGUF file (llama.cpp's format): LLaMA (`llama`), Qwen2
//! (`qwen2`) and Qwen3 (`qwen3`) architectures, any quantization candle's quantized matmul
//! supports.
//!
//! Tensor names follow llama.cpp: `token_embd`, `blk.N.{attn_norm, attn_q, attn_k, attn_v,
//! attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}`, `output_norm`, `output` (absent when
//! the embeddings are tied: the embedding matrix then serves as the output head). Every
//! tensor's shape is checked against the metadata before anything is read.
//!
//! The Q4_K/Q6_K matrices our CPU kernels take are repacked straight from the mapped file
//! ([`GgufFile::mapped`]), by every core (the default target loads in 0.9-1.0 s instead of
//! 1.4-2.6 s: docs/results/README.md#const-gguf-map).

use super::weight_format::fast_cpu_converts_on_cpu;
pub use super::weight_format::WeightFormat;
use crate::file_error as err;
pub use crate::formats::gguf::GgufFile;
use crate::model::{Architecture, DecoderModel, Layer, Linear, ModelConfig, Products};
use crate::Result;
use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor};
use std::path::Path;
use std::sync::Arc;

impl GgufFile {
    /// Checks that tensor `name` exists with shape `want` (`[rows, cols]` for a matrix, as
    /// candle orders dimensions), naming the tensor and the file otherwise.
    /// A matrix that a converted copy widened with zero columns ([`super::converted`]) is
    /// compared at its recorded width.
    pub fn expect_shape(&self, name: &str, want: &[usize]) -> Result<()> {
        let Some((_, dims)) = self.tensor_info(name) else {
            return Err(err(self.path(), format!("missing tensor `{name}`")));
        };
        let mut logical = dims.to_vec();
        if let [_, cols] = &mut logical[..] {
            *cols -= super::converted::padding(self, name, *cols)?;
        }
        if logical == want {
            return Ok(());
        }
        Err(err(self.path(), format!("`{name}` has shape {logical:?}, but the metadata's sizes make it {want:?}")))
    }

    /// The model hyper-parameters from the metadata.
    pub fn config(&self) -> Result<ModelConfig> {
        let arch_name = self.architecture()?;
        let architecture = match arch_name.as_str() {
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            other => {
                return Err(err(
                    self.path(),
                    format!("unsupported GGUF architecture `{other}` (supported: llama, qwen2, qwen3)"),
                ))
            }
        };
        let a = |k: &str| format!("{arch_name}.{k}");
        let hidden_size = self.require_uint(&a("embedding_length"))?;
        let num_heads = self.require_uint(&a("attention.head_count"))?;
        let num_kv_heads = self.uint(&a("attention.head_count_kv"))?.map(|n| n as usize).unwrap_or(num_heads);
        let head_dim = match self.uint(&a("attention.key_length"))? {
            Some(n) => n as usize,
            None if num_heads > 0 => hidden_size / num_heads,
            None => 0,
        };
        if let Some(v) = self.uint(&a("attention.value_length"))?.filter(|&v| v as usize != head_dim) {
            return Err(err(
                self.path(),
                format!("`{arch_name}.attention.value_length` is {v}, but the keys are {head_dim} wide: value heads of another width are not supported"),
            ));
        }
        // LLaMA and Qwen rotate the whole head; a file rotating part of it is another model.
        if let Some(d) = self.uint(&a("rope.dimension_count"))? {
            if d as usize != head_dim {
                return Err(err(
                    self.path(),
                    format!("`{arch_name}.rope.dimension_count` is {d}, but the heads are {head_dim} wide: partial rotary embeddings are not supported"),
                ));
            }
        }
        let vocab_size = match self.strings("tokenizer.ggml.tokens")? {
            Some(t) => t.len(),
            None => match self.tensor_info("token_embd.weight") {
                Some((_, dims)) => dims.iter().copied().max().unwrap_or(0),
                None => return Err(err(self.path(), "missing tensor `token_embd.weight`")),
            },
        };
        let rope_scaling = super::rope_scaling::from_gguf(self, &arch_name)?;
        let declared_context = self.uint(&a("context_length"))?.map(|n| n as usize).unwrap_or(4096);
        let config = ModelConfig {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size: self.require_uint(&a("feed_forward_length"))?,
            num_layers: self.require_uint(&a("block_count"))?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: self.float(&a("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
            rope_theta: self.float(&a("rope.freq_base"))?.unwrap_or(10_000.0),
            context_length: rope_scaling.context_length(declared_context),
            rope_scaling,
            // llama.cpp's converter permutes LLaMA's q/k rows into interleaved pairs; Qwen2
            // keeps the Hugging Face (NeoX) layout.
            rope_interleaved: architecture == Architecture::Llama,
        };
        config.validate(&self.path().display().to_string())?;
        Ok(config)
    }
}

/// The first `rows` rows (all: `None`) of matrix `name` repacked for our CPU kernels straight
/// from the mapped file, when `format` keeps it as stored and the kernels take it; `None`
/// otherwise (the caller then reads a `QTensor`, which reports any problem with the tensor).
fn repacked_from_map(
    file: &GgufFile,
    name: &str,
    rows: Option<usize>,
    format: WeightFormat,
    device: &Device,
    bias: Option<Tensor>,
) -> Result<Option<Linear>> {
    let Some((dtype, dims, raw)) = file.mapped(name).filter(|_| device.is_cpu()) else { return Ok(None) };
    let as_stored = match format {
        WeightFormat::AsStored => true,
        WeightFormat::FastCpu => !fast_cpu_converts_on_cpu(dtype, dims),
        WeightFormat::Dequantized => false,
    };
    if !as_stored || dims.len() != 2 || dims[0] == 0 {
        return Ok(None);
    }
    let rows = rows.unwrap_or(dims[0]);
    if rows == 0 || rows > dims[0] {
        return Ok(None);
    }
    let row_bytes = raw.len() / dims[0];
    let pad = super::converted::padding(file, name, dims[1])?;
    Ok(Linear::repacked_from_raw(dtype, &[rows, dims[1]], &raw[..rows * row_bytes], bias, pad)?)
}

/// Loads the model in `path`. `max_layers` keeps only the first blocks (a cheaper draft from
/// the same file); `output_rows` keeps only the logits of the first token ids (a cheaper draft
/// head: byte-level BPE ids follow merge order, roughly frequency; the other ids get q = 0,
/// which keeps speculative decoding exact). Activations are f32 (the quantized matmul takes
/// f32 inputs).
///
/// [`WeightFormat::FastCpu`] on the CPU loads the file's converted copy
/// ([`super::converted`]), converting and keeping it first when there is none; when the copy
/// cannot be written or read, the conversion is done in memory.
pub fn load(
    path: &Path,
    device: &Device,
    max_layers: Option<usize>,
    output_rows: Option<usize>,
    format: WeightFormat,
) -> Result<(DecoderModel, GgufFile)> {
    load_in(path, device, max_layers, output_rows, format, Some(&crate::load::provision::cache_dir()))
}

/// [`load`] with converted copies kept under `cache` (`None`: converted in memory, every time).
pub fn load_in(
    path: &Path,
    device: &Device,
    max_layers: Option<usize>,
    output_rows: Option<usize>,
    format: WeightFormat,
    cache: Option<&Path>,
) -> Result<(DecoderModel, GgufFile)> {
    if let (WeightFormat::FastCpu, true, Some(cache)) = (format, device.is_cpu(), cache) {
        // The copy as stored; a copy that does not load is deleted (`None`), and this load
        // converts in memory.
        let from_copy = |copy: &Path| match load_file(
            GgufFile::open(copy),
            device,
            max_layers,
            output_rows,
            WeightFormat::AsStored,
        ) {
            Ok((model, file)) => Some((model, file.shown_as(path))),
            Err(e) => {
                eprintln!(
                    "mdsd: the converted copy {} is unusable ({}); deleting it and converting in memory",
                    copy.display(),
                    e
                );
                let _ = std::fs::remove_file(copy);
                None
            }
        };
        // A copy made earlier is read without parsing the source's header as well.
        if let Some(copy) = super::converted::existing(path, cache) {
            return match from_copy(&copy) {
                Some(loaded) => Ok(loaded),
                None => load_file(GgufFile::open(path), device, max_layers, output_rows, format),
            };
        }
        // Problems of the source itself are reported as such, before any conversion.
        let mut source = GgufFile::open(path)?;
        match super::converted::ensure(&mut source, cache) {
            // Nothing to convert: the file as stored is what `FastCpu` would load.
            Ok(None) => return load_file(Ok(source), device, max_layers, output_rows, WeightFormat::AsStored),
            Ok(Some(copy)) => {
                if let Some(loaded) = from_copy(&copy) {
                    return Ok(loaded);
                }
            }
            Err(e) => eprintln!("mdsd: {e}; converting {} in memory instead", path.display()),
        }
        return load_file(Ok(source), device, max_layers, output_rows, format);
    }
    load_file(GgufFile::open(path), device, max_layers, output_rows, format)
}

fn load_file(
    file: Result<GgufFile>,
    device: &Device,
    max_layers: Option<usize>,
    output_rows: Option<usize>,
    format: WeightFormat,
) -> Result<(DecoderModel, GgufFile)> {
    let mut file = file?;
    let mut config = file.config()?;
    if let Some(n) = max_layers {
        config.num_layers = config.num_layers.min(n.max(1));
    }
    let c = &config;
    let (q_rows, kv_rows) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let (vocab, hidden) = (c.vocab_size, c.hidden_size);
    // Every tensor's shape is checked against the metadata before anything is read, so that a
    // file whose directory and metadata disagree is refused by name here, not by a matmul later.
    file.expect_shape("token_embd.weight", &[vocab, hidden])?;
    file.expect_shape("output_norm.weight", &[hidden])?;
    if file.has_tensor("output.weight") {
        file.expect_shape("output.weight", &[vocab, hidden])?;
    }
    for i in 0..c.num_layers {
        for (name, shape) in [
            ("attn_norm.weight", vec![hidden]),
            ("attn_q.weight", vec![q_rows, hidden]),
            ("attn_k.weight", vec![kv_rows, hidden]),
            ("attn_v.weight", vec![kv_rows, hidden]),
            ("attn_output.weight", vec![hidden, q_rows]),
            ("ffn_norm.weight", vec![hidden]),
            ("ffn_gate.weight", vec![c.intermediate_size, hidden]),
            ("ffn_up.weight", vec![c.intermediate_size, hidden]),
            ("ffn_down.weight", vec![hidden, c.intermediate_size]),
        ] {
            file.expect_shape(&format!("blk.{i}.{name}"), &shape)?;
        }
        if c.architecture == Architecture::Qwen3 {
            for name in ["attn_q_norm.weight", "attn_k_norm.weight"] {
                file.expect_shape(&format!("blk.{i}.{name}"), &[c.head_dim])?;
            }
        }
        for (name, rows) in [
            ("attn_q.bias", q_rows),
            ("attn_k.bias", kv_rows),
            ("attn_v.bias", kv_rows),
            ("attn_output.bias", hidden),
            ("ffn_gate.bias", c.intermediate_size),
            ("ffn_up.bias", c.intermediate_size),
            ("ffn_down.bias", hidden),
        ] {
            let name = format!("blk.{i}.{name}");
            if file.has_tensor(&name) {
                file.expect_shape(&name, &[rows])?;
            }
        }
    }
    let dtype = DType::F32;
    let embed_q = Arc::new(file.tensor("token_embd.weight", device)?);
    let dense =
        |file: &mut GgufFile, name: &str| -> Result<Tensor> { Ok(file.tensor(name, device)?.dequantize(device)?) };
    let mut layers = Vec::with_capacity(config.num_layers);
    let qwen3 = config.architecture == Architecture::Qwen3;
    for i in 0..config.num_layers {
        let p = |s: &str| format!("blk.{i}.{s}");
        // A bias is applied wherever the file has one, as llama.cpp does (Qwen2's q, k and v;
        // a LLaMA's with `attention_bias` or `mlp_bias`).
        let linear = |file: &mut GgufFile, name: &str| -> Result<Linear> {
            let weight_name = p(&format!("{name}.weight"));
            let bias_name = p(&format!("{name}.bias"));
            let b = if file.has_tensor(&bias_name) {
                Some(file.tensor(&bias_name, device)?.dequantize(device)?)
            } else {
                None
            };
            if let Some(l) = repacked_from_map(file, &weight_name, None, format, device, b.clone())? {
                return Ok(l);
            }
            let w = Arc::new(file.tensor(&weight_name, device)?);
            stored_linear(file, &weight_name, w, b, format, device)
        };
        layers.push(Layer {
            attn_norm: Some(dense(&mut file, &p("attn_norm.weight"))?),
            qkv: Products::Apart(vec![
                linear(&mut file, "attn_q")?,
                linear(&mut file, "attn_k")?,
                linear(&mut file, "attn_v")?,
            ]),
            o: linear(&mut file, "attn_output")?,
            q_norm: if qwen3 { Some(dense(&mut file, &p("attn_q_norm.weight"))?) } else { None },
            k_norm: if qwen3 { Some(dense(&mut file, &p("attn_k_norm.weight"))?) } else { None },
            mlp_norm: dense(&mut file, &p("ffn_norm.weight"))?,
            gate_up: Products::Apart(vec![linear(&mut file, "ffn_gate")?, linear(&mut file, "ffn_up")?]),
            down: linear(&mut file, "ffn_down")?,
        });
    }
    let norm = dense(&mut file, "output_norm.weight")?;
    // Tied embeddings (SmolLM2) use the embedding matrix as the output head.
    let head_name = if file.has_tensor("output.weight") { "output.weight" } else { "token_embd.weight" };
    let head_rows = output_rows.filter(|&rows| rows < config.vocab_size);
    // The tied head at full size shares the embedding's matrix instead of a repacked copy.
    let repacked = if head_name == "output.weight" || head_rows.is_some() {
        repacked_from_map(&file, head_name, head_rows, format, device, None)?
    } else {
        None
    };
    let lm_head = match repacked {
        Some(l) => l,
        None => {
            let head = match head_rows {
                Some(rows) => Arc::new(file.tensor_rows(head_name, rows, device)?),
                // Tied: the embedding's own matrix, shared (a repacked head keeps its own layout).
                _ if head_name == "token_embd.weight" => embed_q.clone(),
                _ => Arc::new(file.tensor(head_name, device)?),
            };
            stored_linear(&file, head_name, head, None, format, device)?
        }
    };
    let embed = crate::model::embedding::TokenEmbedding::from_qtensor(embed_q, device)?;
    let model = DecoderModel::new(config, embed, layers, norm, lm_head, dtype, device)?;
    Ok((model, file))
}

/// Matrix `name` of `file`, read as `w`, as a layer with `bias` in `format` (converted, or kept
/// as stored): its padding is the conversion's plus any a converted file records for it.
fn stored_linear(
    file: &GgufFile,
    name: &str,
    w: Arc<QTensor>,
    bias: Option<Tensor>,
    format: WeightFormat,
    device: &Device,
) -> Result<Linear> {
    let converted_pad = super::converted::padding(file, name, w.shape().dims().last().copied().unwrap_or(0))?;
    let (w, pad) = format.matmul(w, device)?;
    Ok(Linear::padded(w, bias, pad + converted_pad)?)
}
