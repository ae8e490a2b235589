//! `bench random-eagle`: an EAGLE-1 head with random weights for a given target, in the
//! checkpoint layout `mdsd generate --eagle` loads (`config.json` and `model.safetensors`, as
//! `yuhuili/EAGLE-Qwen2-7B-Instruct` ships them; see `engine::model::eagle`).
//!
//! No real EAGLE head exists for the models that can be had here, so this is how the cost of a
//! head step is measured at a real target's size (the engine issue's EAGLE speed item): the
//! head has the target's hidden size, heads, MLP width and vocabulary, and q/k/v biases for a
//! Qwen2 target. Its drafts are noise, so acceptance means nothing; timings do.

use anyhow::{bail, Context};
use candle_core::{DType, Device, Tensor};
use clap::Args;
use engine::load::gguf::GgufFile;
use engine::load::hf::HfConfig;
use engine::model::ModelConfig;
use engine::train::HeadShape;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct RandomEagleArgs {
    /// The target the head drafts for: a GGUF file or a Hugging Face model folder.
    #[arg(long)]
    target: PathBuf,
    /// The folder to write `config.json` and `model.safetensors` into (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// Seed of the weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Standard deviation of every matrix and bias (uniform noise); norms are ones.
    #[arg(long, default_value_t = 0.02)]
    std: f32,
    /// Type of the stored weights (the engine casts them to the target's activation type).
    #[arg(long, value_parser = ["f32", "bf16", "f16"], default_value = "bf16")]
    dtype: String,
    /// Also write the head's own `embed_tokens.weight` (vocabulary x hidden); without it the
    /// head uses the target's embedding, as EAGLE's Qwen2 head does.
    #[arg(long)]
    own_embedding: bool,
}

pub fn run(args: &RandomEagleArgs) -> anyhow::Result<()> {
    let config = target_config(&args.target)?;
    let dtype = match args.dtype.as_str() {
        "f32" => DType::F32,
        "f16" => DType::F16,
        _ => DType::BF16,
    };
    if !(args.std.is_finite() && args.std >= 0.0) {
        bail!("--std must be finite and >= 0, got {}", args.std);
    }
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let json = serde_json::to_string_pretty(&config_json(&config, &args.dtype))?;
    let config_path = args.out.join("config.json");
    std::fs::write(&config_path, json).with_context(|| format!("writing {}", config_path.display()))?;
    let mut tensors = HashMap::new();
    let mut params = 0usize;
    for (i, (name, dims)) in tensor_shapes(&config, args.own_embedding).into_iter().enumerate() {
        let std = (!name.ends_with("layernorm.weight")).then_some(args.std);
        let t = random_tensor(&dims, std, args.seed ^ ((i as u64 + 1) << 40))?.to_dtype(dtype)?;
        params += t.elem_count();
        tensors.insert(name, t);
    }
    let weights = args.out.join("model.safetensors");
    candle_core::safetensors::save(&tensors, &weights).with_context(|| format!("writing {}", weights.display()))?;
    eprintln!(
        "bench: wrote {} ({} parameters, {:?}) and {} for a {:?} target of hidden size {}",
        weights.display(),
        params,
        dtype,
        config_path.display(),
        config.architecture,
        config.hidden_size
    );
    Ok(())
}

/// The target's configuration, from a GGUF header or a model folder's `config.json`.
fn target_config(path: &Path) -> anyhow::Result<ModelConfig> {
    if path.is_dir() {
        let p = path.join("config.json");
        return Ok(HfConfig::load(&p)?.resolve(&p)?);
    }
    if !path.is_file() {
        bail!("{}: no such model file or folder", path.display());
    }
    Ok(GgufFile::open(path)?.config()?)
}

/// EAGLE's `config.json` for a head of `c` (the engine's, as `mdsd train-eagle` writes it).
fn config_json(c: &ModelConfig, dtype: &str) -> serde_json::Value {
    let torch_dtype = match dtype {
        "f32" => "float32",
        "f16" => "float16",
        _ => "bfloat16",
    };
    HeadShape::for_target(c, None).config_json(torch_dtype)
}

/// The head's tensors and their shapes (`[out, in]` for matrices, as PyTorch stores them),
/// with the head's own embedding if asked.
fn tensor_shapes(c: &ModelConfig, own_embedding: bool) -> Vec<(String, Vec<usize>)> {
    let mut out = HeadShape::for_target(c, None).tensors();
    if own_embedding {
        out.push(("embed_tokens.weight".into(), vec![c.vocab_size, c.hidden_size]));
    }
    out
}

/// Uniform noise with standard deviation `std` in shape `dims` (ones when `None`), f32.
fn random_tensor(dims: &[usize], std: Option<f32>, seed: u64) -> candle_core::Result<Tensor> {
    let mut values = vec![0f32; dims.iter().product()];
    crate::random_gguf::fill_uniform(&mut values, std, seed);
    Tensor::from_vec(values, dims, &Device::Cpu)
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::model::Architecture;

    /// A Qwen2 head has the q/k/v biases and a LLaMA head none; every matrix maps the
    /// target's sizes; `fc` reads the two concatenated vectors.
    #[test]
    fn shapes_follow_the_target() {
        let c = ModelConfig {
            architecture: Architecture::Qwen2,
            vocab_size: 100,
            hidden_size: 64,
            intermediate_size: 96,
            num_layers: 3,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            rms_norm_eps: 1e-6,
            rope_theta: 1e6,
            rope_scaling: Default::default(),
            context_length: 512,
            rope_interleaved: false,
        };
        let shapes: HashMap<String, Vec<usize>> = tensor_shapes(&c, true).into_iter().collect();
        assert_eq!(shapes["fc.weight"], [64, 128]);
        assert_eq!(shapes["layers.0.self_attn.k_proj.weight"], [32, 64]);
        assert_eq!(shapes["layers.0.self_attn.v_proj.bias"], [32]);
        assert_eq!(shapes["layers.0.mlp.down_proj.weight"], [64, 96]);
        assert_eq!(shapes["embed_tokens.weight"], [100, 64]);
        let llama = ModelConfig { architecture: Architecture::Llama, ..c.clone() };
        assert!(tensor_shapes(&llama, false).iter().all(|(n, _)| !n.ends_with("bias") || n == "fc.bias"));
        assert_eq!(config_json(&c, "bf16")["qkv_bias"], true);
        assert!(config_json(&llama, "f32").get("qkv_bias").is_none());
    }

    /// The noise has the asked spread; norms are ones.
    #[test]
    fn noise_has_the_asked_spread() {
        let t = random_tensor(&[200, 300], Some(0.05), 3).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let n = t.len() as f64;
        let mean = t.iter().map(|&v| v as f64).sum::<f64>() / n;
        let sd = (t.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(mean.abs() < 1e-3 && (sd - 0.05).abs() < 1e-3, "mean {mean}, sd {sd}");
        let ones = random_tensor(&[7], None, 0).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(ones, vec![1.0; 7]);
    }
}
