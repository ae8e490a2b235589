//! Reading an EAGLE-1 draft head ([`EagleHead`]) from its folder: `config.json` (LLaMA fields;
//! Qwen2 heads say `qkv_bias: true`) and `pytorch_model.bin` or `model.safetensors` with
//! `fc.{weight,bias}`, `layers.0.self_attn.{q,k,v,o}_proj.*`,
//! `layers.0.post_attention_layernorm.weight`, `layers.0.mlp.{gate,up,down}_proj.weight` and,
//! in some heads, `embed_tokens.weight`.

use super::hf::{check_safetensors, dense_linear, layer, HfConfig};
use crate::file_error as err;
pub use crate::model::eagle::EagleHead;
use crate::model::{DecoderModel, ModelConfig};
use crate::Result;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::collections::HashMap;
use std::path::Path;

impl EagleHead {
    /// Loads the head in folder `dir` for `target` ([`Self::load_dense`]); on a CPU where our
    /// Q6_K kernels run, its matrices are then re-quantized to Q6_K
    /// ([`Self::quantize_for_this_cpu`]) unless `MDSD_EAGLE_DENSE=1`.
    pub fn load(dir: &Path, target: &DecoderModel) -> Result<Self> {
        let mut head = Self::load_dense(dir, target)?;
        head.quantize_for_this_cpu().map_err(|e| err(dir, format!("quantizing the EAGLE head: {e}")))?;
        Ok(head)
    }

    /// Loads the head in folder `dir` for `target`, checking that its hidden size and
    /// vocabulary are the target's. Weights are cast to the target's dtype and kept dense.
    pub fn load_dense(dir: &Path, target: &DecoderModel) -> Result<Self> {
        let config_path = dir.join("config.json");
        let hf = HfConfig::load(&config_path)?;
        let mut config = hf.resolve(&config_path)?;
        let t = target.config();
        if config.hidden_size != t.hidden_size {
            return Err(err(
                &config_path,
                format!(
                    "EAGLE head hidden size {} does not match the target's {}: this head belongs to another model",
                    config.hidden_size, t.hidden_size
                ),
            ));
        }
        if config.vocab_size != t.vocab_size {
            return Err(err(
                &config_path,
                format!(
                    "EAGLE head vocabulary of {} tokens does not match the target's {}",
                    config.vocab_size, t.vocab_size
                ),
            ));
        }
        // The head runs at the target's positions.
        config.context_length = config.context_length.max(t.context_length);
        config.num_layers = 1;
        let file = ["model.safetensors", "pytorch_model.bin"]
            .iter()
            .map(|f| dir.join(f))
            .find(|p| p.is_file())
            .ok_or_else(|| err(dir, "no EAGLE head weights: expected model.safetensors or pytorch_model.bin"))?;
        let (dtype, device) = (target.dtype(), target.device().clone());
        let vb = if file.extension().is_some_and(|e| e == "safetensors") {
            check_safetensors(&file)?;
            // SAFETY: memory-mapped read-only; the file must not change while loaded.
            unsafe { VarBuilder::from_mmaped_safetensors(&[&file], dtype, &device)? }
        } else {
            let tensors: HashMap<String, Tensor> = crate::formats::torch_bin::read_all(&file)?.into_iter().collect();
            VarBuilder::from_tensors(tensors, dtype, &device)
        };
        let head = Self::build(&hf, config, &vb, dtype, &device, &file)
            .map_err(|e| err(&file, format!("not a valid EAGLE head: {e}")))?;
        Ok(head)
    }

    fn build(
        hf: &HfConfig,
        config: ModelConfig,
        vb: &VarBuilder,
        dtype: DType,
        device: &Device,
        path: &Path,
    ) -> Result<Self> {
        let c = &config;
        let h = c.hidden_size;
        let fc = dense_linear(&vb.pp("fc"), h, 2 * h, vb.contains_tensor("fc.bias"))?;
        // EAGLE's heads (`cnets.py`) put biases on q, k and v at most.
        let biases = super::hf::Biases { qkv: hf.qkv_bias(), ..Default::default() };
        let layer = layer(&vb.pp("layers.0"), c, biases, false)?;
        let embed = if vb.contains_tensor("embed_tokens.weight") {
            Some(vb.get((c.vocab_size, h), "embed_tokens.weight")?)
        } else {
            None
        };
        Ok(Self::new(config, fc, layer, embed, dtype, device, path.to_path_buf())?)
    }
}
