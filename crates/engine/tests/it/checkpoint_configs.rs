//! What checkpoints' configurations ask of the forward beyond the plain architecture: rotary
//! scaling (LLaMA 3.1's `llama3`, YaRN, linear), transformers v5's `rope_parameters`, and
//! LLaMA's `attention_bias` and `mlp_bias`. Our forward against candle-transformers' LLaMA, the
//! Hugging Face and GGUF spellings of each against each other, the refusals, and (opt-in)
//! against transformers' own models.

use crate::common;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use common::{llama_cpp_rope_freqs, load_cpu, logits_all, max_diff, temp_dir, Tiny};
use engine::model::rope_scaling::RopeScaling;
use serde_json::json;
use std::path::Path;

/// 200 positions: past every original context below, so each scaling moves the logits.
fn prompt(vocab: usize) -> Vec<u32> {
    (0..200).map(|i| ((i * 37 + 11) % vocab) as u32).collect()
}

fn llama3() -> serde_json::Value {
    json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 64})
}

fn load_error(path: &Path) -> String {
    match engine::load::load(path, &Device::Cpu, &engine::load::LoadOptions::default()) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => format!("{e:#}"),
    }
}

/// LLaMA 3.1's scaling equals candle-transformers' LLaMA (which implements it) at all 200
/// positions of a chain, the reference run token by token, to 1e-4; without the scaling the
/// same weights give logits that differ by more than 0.01.
#[test]
fn llama3_scaling_matches_candle_transformers() {
    let tiny = Tiny::llama(11);
    let ids = prompt(tiny.vocab);
    let dir = tiny.write_hf_with(&temp_dir("llama3"), json!({"rope_scaling": llama3()}));
    let ours = load_cpu(&dir);
    assert!(matches!(ours.config().rope_scaling, RopeScaling::Llama3 { .. }), "{:?}", ours.config());
    let all = logits_all(&ours, &ids);

    use candle_transformers::models::llama;
    let cfg: llama::LlamaConfig =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert!(cfg.rope_scaling.is_some());
    let cfg = cfg.into_config(false);
    let vb = unsafe {
        candle_nn::VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], DType::F32, &Device::Cpu)
            .unwrap()
    };
    let model = llama::Llama::load(vb, &cfg).unwrap();
    let mut cache = llama::Cache::new(true, DType::F32, &cfg, &Device::Cpu).unwrap();
    for (i, &t) in ids.iter().enumerate() {
        let x = Tensor::new(&[[t]], &Device::Cpu).unwrap();
        let reference = model.forward(&x, i, &mut cache).unwrap().squeeze(0).unwrap();
        let d = max_diff(&all.narrow(0, i, 1).unwrap().squeeze(0).unwrap(), &reference);
        assert!(d < 1e-4, "position {i}: max |diff| = {d}");
    }

    let plain = load_cpu(&tiny.write_hf(&temp_dir("llama3-plain")));
    let d = max_diff(&logits_all(&plain, &ids), &all);
    assert!(d > 1e-2, "the scaling should change the logits, moved them by {d}");
}

/// Each scaling spelt as llama.cpp's GGUF metadata gives the logits of the same weights spelt
/// as a Hugging Face folder (f32 weights, 1e-4): `rope_freqs.weight` for `llama3`,
/// `rope.scaling.type` `linear` (and the older `rope.scale_linear`), and `yarn` with its
/// original context. transformers v5's `rope_parameters` (with `rope_theta` inside, none at the
/// top) reads as v4's `rope_theta` plus `rope_scaling`, bit for bit. The context is YaRN's
/// `factor` times its original one, linear scaling's `factor` times the declared one.
#[test]
fn gguf_and_config_json_spellings_agree() {
    let root = temp_dir("rope-spellings");
    let f = |k: &str, x: f32| (k.to_string(), Value::F32(x));
    let s = |k: &str, x: &str| (k.to_string(), Value::String(x.into()));
    let u = |k: &str, x: u32| (k.to_string(), Value::U32(x));
    let yarn = json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 100});

    let llama = Tiny::llama(12);
    let qwen = Tiny::qwen2(13);
    let ids = prompt(llama.vocab);
    // (what, folder, GGUF file)
    let cases: Vec<(&str, std::path::PathBuf, std::path::PathBuf)> = vec![
        (
            "llama3 / rope_freqs",
            llama.write_hf_with(&root.join("llama3"), json!({"rope_scaling": llama3()})),
            llama.write_gguf_with(
                &root.join("llama3.gguf"),
                GgmlDType::F32,
                &[],
                vec![],
                vec![("rope_freqs.weight".into(), llama_cpp_rope_freqs(&llama, 10_000.0))],
            ),
        ),
        (
            "linear",
            llama.write_hf_with(&root.join("linear"), json!({"rope_scaling": {"type": "linear", "factor": 3.0}})),
            llama.write_gguf_with(
                &root.join("linear.gguf"),
                GgmlDType::F32,
                &[],
                vec![s("llama.rope.scaling.type", "linear"), f("llama.rope.scaling.factor", 3.0)],
                vec![],
            ),
        ),
        (
            "linear, older key",
            root.join("linear"),
            llama.write_gguf_with(
                &root.join("scale_linear.gguf"),
                GgmlDType::F32,
                &[],
                vec![f("llama.rope.scale_linear", 3.0)],
                vec![],
            ),
        ),
        (
            "yarn",
            qwen.write_hf_with(&root.join("yarn"), json!({"rope_scaling": yarn})),
            qwen.write_gguf_with(
                &root.join("yarn.gguf"),
                GgmlDType::F32,
                &[],
                vec![
                    s("qwen2.rope.scaling.type", "yarn"),
                    f("qwen2.rope.scaling.factor", 4.0),
                    u("qwen2.rope.scaling.original_context_length", 100),
                ],
                vec![],
            ),
        ),
    ];
    for (what, dir, gguf) in &cases {
        let hf = load_cpu(dir);
        let g = load_cpu(gguf);
        assert_ne!(hf.config().rope_scaling, RopeScaling::None, "{what}");
        let expect = logits_all(&hf, &ids);
        let d = max_diff(&logits_all(&g, &ids), &expect);
        assert!(d < 1e-4, "{what}: GGUF against config.json: {d}");
        let tiny = if what.starts_with("yarn") { qwen } else { llama };
        let plain = load_cpu(&tiny.write_hf(&root.join(format!("plain-{}", tiny.arch))));
        let moved = max_diff(&logits_all(&plain, &ids), &expect);
        assert!(moved > 1e-2, "{what}: the scaling should move the logits, moved them by {moved}");
        // YaRN: factor x original context; linear: factor x the declared one; llama3: declared.
        let context = match *what {
            "yarn" => 400,
            w if w.starts_with("linear") => 3 * tiny.context,
            _ => tiny.context,
        };
        assert_eq!((hf.config().context_length, g.config().context_length), (context, context), "{what}");
    }

    // transformers v5's spelling.
    let v5 = qwen.write_hf_with(
        &root.join("yarn-v5"),
        json!({"rope_theta": null, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0,
               "original_max_position_embeddings": 100}}),
    );
    let d = max_diff(&logits_all(&load_cpu(&v5), &ids), &logits_all(&load_cpu(&root.join("yarn")), &ids));
    assert_eq!(d, 0.0, "v5 yarn against v4 yarn");
    let theta_v4 = llama.write_hf_with(&root.join("theta-v4"), json!({"rope_theta": 1e6}));
    let theta_v5 = llama.write_hf_with(
        &root.join("theta-v5"),
        json!({"rope_theta": null, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}),
    );
    let v4_logits = logits_all(&load_cpu(&theta_v4), &ids);
    assert_eq!(max_diff(&logits_all(&load_cpu(&theta_v5), &ids), &v4_logits), 0.0, "v5 theta against v4 theta");
    let default_theta = logits_all(&load_cpu(&llama.write_hf(&root.join("theta-default"))), &ids);
    assert!(max_diff(&default_theta, &v4_logits) > 1e-2, "theta 1e6 should differ from the default 10,000");
}

/// Scalings this engine does not apply are refused at load, naming the file, rather than run
/// with the default frequencies.
#[test]
fn unsupported_scalings_are_refused() {
    let root = temp_dir("rope-refused");
    let tiny = Tiny::llama(14);
    for (name, patch, needle) in [
        ("dynamic", json!({"rope_scaling": {"type": "dynamic", "factor": 2.0}}), "`dynamic` is not supported"),
        (
            "longrope",
            json!({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}}),
            "`longrope` is not supported",
        ),
        ("no-factor", json!({"rope_scaling": {"rope_type": "llama3"}}), "has no `factor`"),
        (
            "partial",
            json!({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}),
            "part of each head",
        ),
    ] {
        let dir = tiny.write_hf_with(&root.join(name), patch);
        let e = load_error(&dir);
        assert!(e.contains("config.json") && e.contains(needle), "{name}: {e}");
    }
    let s = |k: &str, x: &str| (k.to_string(), Value::String(x.into()));
    let f = |k: &str, x: f32| (k.to_string(), Value::F32(x));
    let short = QTensor::quantize(&Tensor::new(&[1f32, 2.0, 4.0], &Device::Cpu).unwrap(), GgmlDType::F32).unwrap();
    let zero = QTensor::quantize(&Tensor::new(&[1f32, 0.0, 4.0, 8.0], &Device::Cpu).unwrap(), GgmlDType::F32).unwrap();
    for (name, meta, tensors, needle) in [
        ("longrope.gguf", vec![s("llama.rope.scaling.type", "longrope")], vec![], "`longrope` is not supported"),
        (
            "no-factor.gguf",
            vec![s("llama.rope.scaling.type", "yarn")],
            vec![],
            "`llama.rope.scaling.factor` is missing",
        ),
        (
            "attn-factor.gguf",
            vec![
                s("llama.rope.scaling.type", "yarn"),
                f("llama.rope.scaling.factor", 4.0),
                f("llama.rope.scaling.attn_factor", 0.5),
            ],
            vec![],
            "attn_factor",
        ),
        ("short-freqs.gguf", vec![], vec![("rope_freqs.weight".to_string(), short)], "need 4"),
        ("zero-freqs.gguf", vec![], vec![("rope_freqs.weight".to_string(), zero)], "must be positive"),
    ] {
        let path = tiny.write_gguf_with(&root.join(name), GgmlDType::F32, &[], meta, tensors);
        let e = load_error(&path);
        assert!(e.contains(name) && e.contains(needle), "{name}: {e}");
    }
}

/// A LLaMA with `attention_bias` and `mlp_bias` (biases on all seven projections) gives the
/// same logits from its folder and from a GGUF file holding the biases (q's and k's permuted as
/// their rows are), to 1e-4; the biases count: read without them (the same folder with both
/// flags false, as transformers would read it) the logits differ by more than 0.01.
#[test]
fn llama_biases_are_applied() {
    let root = temp_dir("llama-biases");
    let tiny = Tiny { llama_biases: true, ..Tiny::llama(15) };
    let ids = prompt(tiny.vocab);
    let hf = load_cpu(&tiny.write_hf(&root.join("hf")));
    let expect = logits_all(&hf, &ids);
    let gguf = load_cpu(&tiny.write_gguf(&root.join("biases.gguf"), GgmlDType::F32, &[]));
    let d = max_diff(&logits_all(&gguf, &ids), &expect);
    assert!(d < 1e-4, "GGUF against config.json: {d}");
    let without = tiny.write_hf_with(&root.join("without"), json!({"attention_bias": false, "mlp_bias": false}));
    let moved = max_diff(&logits_all(&load_cpu(&without), &ids), &expect);
    assert!(moved > 1e-2, "the biases should move the logits, moved them by {moved}");
}

/// Opt-in: the tiny models `benches/transformers_crosscheck.py --models DIR` builds and saves with
/// transformers (default rotary, a large theta, llama3, linear, YaRN, YaRN with mscale, a LLaMA
/// with attention and MLP biases, Qwen3 with heads wider than `hidden / heads`, with and without
/// YaRN), each
/// in transformers' own current `config.json` spelling, give the logits transformers computed,
/// at all 200 positions, to 1e-4 of the largest logit; and so do the GGUF files llama.cpp's own
/// converter made of them, when the script was given `--gguf`.
/// `MDSD_TRANSFORMERS_REFERENCE=DIR cargo test --release -p engine --test it -- --ignored checkpoint_configs::`.
#[test]
#[ignore = "needs MDSD_TRANSFORMERS_REFERENCE from benches/transformers_crosscheck.py --models"]
fn transformers_reference_models() {
    let root = std::env::var("MDSD_TRANSFORMERS_REFERENCE").expect("MDSD_TRANSFORMERS_REFERENCE=DIR");
    let mut dirs: Vec<_> = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).collect();
    dirs.sort();
    assert!(dirs.len() >= 9, "expected the nine models of transformers_crosscheck.py in {root}");
    for dir in dirs {
        let expected: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
        let ids: Vec<u32> = expected["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let rows: Vec<Vec<f32>> = expected["logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect())
            .collect();
        let vocab = rows[0].len();
        let reference = Tensor::from_vec(rows.concat(), (ids.len(), vocab), &Device::Cpu).unwrap();
        let scale = reference.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
        let model = engine::load::hf::load(&dir, DType::F32, &Device::Cpu, None).unwrap();
        // With `--gguf`, llama.cpp's converter's file of the same model too.
        let gguf = dir.join("model.gguf");
        // The weights only: the converter writes no `tokenizer.ggml.merges` for a tokenizer
        // without merges, which llama.cpp and our tokenizer refuse.
        let as_stored = engine::load::weight_format::WeightFormat::AsStored;
        let gguf =
            gguf.is_file().then(|| engine::load::gguf::load(&gguf, &Device::Cpu, None, None, as_stored).unwrap().0);
        for (what, model) in [("config.json", Some(model)), ("model.gguf", gguf)] {
            let Some(model) = model else { continue };
            // llama.cpp's converter keeps YaRN's factor, original context and betas but drops
            // `mscale` and `mscale_all_dim` (it maps them for DeepSeek only): its file of this
            // model is another model, which llama.cpp runs, as we do, with the attention
            // factor 0.1 ln(factor) + 1.
            if what == "model.gguf" && dir.ends_with("qwen2-yarn-mscale") {
                let RopeScaling::Yarn { factor, attention_factor, .. } = model.config().rope_scaling else {
                    panic!("{}: {:?}", dir.display(), model.config().rope_scaling)
                };
                assert_eq!(attention_factor, 0.1 * factor.ln() + 1.0);
                println!("{} {what}: the converter dropped mscale; not compared", dir.display());
                continue;
            }
            let d = max_diff(&logits_all(&model, &ids), &reference);
            println!(
                "{} {what}: {:?}, max |diff| {d:.2e}, logits up to {scale:.2}",
                dir.display(),
                model.config().rope_scaling
            );
            assert!(d < 1e-4 * scale.max(1.0), "{} {what}: max |diff| {d} for logits up to {scale}", dir.display());
        }
    }
}

/// Ids that end generation besides the EOS token: a folder's `generation_config.json`
/// `eos_token_id` (a list, as LLaMA 3.1 Instruct's, or one number) and GGUF's
/// `tokenizer.ggml.eot_token_id` and `eom_token_id`. An id outside the vocabulary is refused,
/// naming the file.
#[test]
fn generation_config_and_gguf_name_more_stop_ids() {
    let root = temp_dir("stop-ids");
    let tiny = Tiny::llama(16);
    let dir = tiny.write_hf(&root.join("hf"));
    let tokenizer = |dir: &Path| engine::load::load_tokenizer(dir, None);
    let plain = tokenizer(&dir).unwrap();
    // This folder has no tokenizer_config.json, so no EOS of its own.
    assert!(!plain.is_stop(2) && !plain.is_stop(5) && !plain.is_stop(7));
    std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": [2, 5, 7]}"#).unwrap();
    let t = tokenizer(&dir).unwrap();
    assert!(t.is_stop(2) && t.is_stop(5) && t.is_stop(7) && !t.is_stop(6));
    std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": 9, "do_sample": true}"#).unwrap();
    assert!(tokenizer(&dir).unwrap().is_stop(9));
    std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": [2, 4800]}"#).unwrap();
    let e = format!("{:#}", tokenizer(&dir).unwrap_err());
    assert!(e.contains("generation_config.json") && e.contains("4800"), "{e}");

    let u = |k: &str, x: u32| (k.to_string(), Value::U32(x));
    let meta = vec![u("tokenizer.ggml.eot_token_id", 5), u("tokenizer.ggml.eom_token_id", 7)];
    let gguf = tiny.write_gguf_with(&root.join("eot.gguf"), GgmlDType::F32, &[], meta, vec![]);
    let t = tokenizer(&gguf).unwrap();
    assert!(t.is_stop(2) && t.is_stop(5) && t.is_stop(7) && !t.is_stop(6));
    let plain = tokenizer(&tiny.write_gguf(&root.join("plain.gguf"), GgmlDType::F32, &[])).unwrap();
    assert!(!plain.is_stop(5) && !plain.is_stop(7));
}

/// A model whose layers slide keeps its text inside the window, where sliding attention is
/// full attention: the context is the window. Sliding layers as transformers decides them:
/// Mistral's `sliding_window`; Qwen2's with `use_sliding_window` from `max_window_layers` on
/// (v4), or where `layer_types` says `sliding_attention` (v5); never LLaMA's. A quantized
/// checkpoint (`quantization_config`, whose weights this loader would misread) is refused,
/// naming the file.
#[test]
fn sliding_windows_bound_the_context_and_quantized_checkpoints_are_refused() {
    let root = temp_dir("sliding");
    let (llama, qwen) = (Tiny::llama(17), Tiny::qwen2(18));
    let full = llama.context;
    for (name, tiny, patch, context) in [
        ("mistral", llama, json!({"model_type": "mistral", "sliding_window": 100}), 100),
        ("mistral-null", llama, json!({"model_type": "mistral", "sliding_window": null}), full),
        ("llama", llama, json!({"sliding_window": 64}), full),
        ("qwen2-v4", qwen, json!({"use_sliding_window": true, "sliding_window": 64, "max_window_layers": 1}), 64),
        (
            "qwen2-v4-no-layer",
            qwen,
            json!({"use_sliding_window": true, "sliding_window": 64, "max_window_layers": 2}),
            full,
        ),
        ("qwen2-v4-off", qwen, json!({"use_sliding_window": false, "sliding_window": 64}), full),
        (
            "qwen2-v5",
            qwen,
            json!({"use_sliding_window": null, "sliding_window": 64,
                   "layer_types": ["full_attention", "sliding_attention"]}),
            64,
        ),
        (
            "qwen2-v5-full",
            qwen,
            json!({"sliding_window": 64, "layer_types": ["full_attention", "full_attention"]}),
            full,
        ),
    ] {
        let model = load_cpu(&tiny.write_hf_with(&root.join(name), patch));
        assert_eq!(model.config().context_length, context, "{name}");
    }
    let quantized = llama.write_hf_with(
        &root.join("fp8"),
        json!({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}),
    );
    let e = load_error(&quantized);
    assert!(e.contains("config.json") && e.contains("quant_method `fp8`"), "{e}");
}

/// A folder whose `tokenizer_config.json` does not say `add_bos_token` gets its BOS first when
/// the tokenizer's own post-processor adds it (LLaMA 3's `TemplateProcessing`), as transformers
/// does for a plain text; `add_bos_token: false` wins. A GGUF file with a LLaMA 3 pre-tokenizer
/// and no `tokenizer.ggml.add_bos_token` gets its BOS too (llama.cpp's default); `false` wins
/// there as well.
#[test]
fn bos_as_the_tokenizer_adds_it() {
    let root = temp_dir("bos");
    let tiny = Tiny::llama(19);
    let first = |path: &Path| engine::load::load_tokenizer(path, None).unwrap().encode("ABC").unwrap()[0];
    let dir = tiny.write_hf(&root.join("hf"));
    let config = |text: &str| std::fs::write(dir.join("tokenizer_config.json"), text).unwrap();
    config(r#"{"bos_token": "!"}"#);
    assert_ne!(first(&dir), 0, "no post-processor: no BOS");
    let path = dir.join("tokenizer.json");
    let mut tok: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let bos = json!({"SpecialToken": {"id": "!", "type_id": 0}});
    tok["post_processor"] = json!({"type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"!": {"id": "!", "ids": [0], "tokens": ["!"]}}});
    std::fs::write(&path, tok.to_string()).unwrap();
    assert_eq!(first(&dir), 0, "the post-processor adds the BOS");
    config(r#"{"bos_token": "!", "add_bos_token": false}"#);
    assert_ne!(first(&dir), 0, "add_bos_token false");

    let s = |k: &str, x: &str| (k.to_string(), Value::String(x.into()));
    let gguf = |name: &str, meta| tiny.write_gguf_with(&root.join(name), GgmlDType::F32, &[], meta, vec![]);
    assert_eq!(first(&gguf("llama3.gguf", vec![s("tokenizer.ggml.pre", "llama-bpe")])), 1);
    let no = vec![s("tokenizer.ggml.pre", "llama-bpe"), ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false))];
    assert_ne!(first(&gguf("llama3-no-bos.gguf", no)), 1);
    assert_ne!(first(&gguf("default.gguf", vec![])), 1, "GPT-2's pre-tokenizer: no BOS unless asked");
}

/// Speculative decoding of scaled models at temperature 0 equals plain decoding of the target,
/// token for token, past the original context: a YaRN Qwen2 target (original context 64) with
/// a one-layer Qwen3 draft under `llama3` scaling, a 150-token prompt and 60 new tokens, for
/// three trees and every valid construction/verifier pair. Tree rows get the scaled rotary at
/// their own positions.
#[test]
fn scaled_models_decode_speculatively_as_plainly() {
    use engine::decode::Generator;
    use engine::DraftTree;
    let root = temp_dir("scaled-decoding");
    let yarn = json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64});
    let target = Tiny { scale: 0.8, ..Tiny::qwen2(23) };
    let target = load_cpu(&target.write_hf_with(&root.join("target"), json!({"rope_scaling": yarn})));
    let draft = Tiny { scale: 0.8, layers: 1, ..Tiny::qwen3(24) };
    let draft = load_cpu(&draft.write_hf_with(&root.join("draft"), json!({"rope_scaling": llama3()})));
    let prompt: Vec<u32> = prompt(48)[..150].to_vec();
    let base = common::greedy(60, 1);
    let (reference, _) =
        Generator::new(&target, None, 256).unwrap().generate(&prompt, &base, |_| false, |_| Ok(())).unwrap();
    assert_eq!(reference.len(), 60);
    let mut generator = Generator::new(&target, Some(&draft), 256).unwrap();
    let mut accepted = 0;
    for name in ["chain-4", "drafts-2-depth-3", "mc_sim_7b_63"] {
        let tree = DraftTree::preset(name).unwrap();
        for &(c, v) in samplers::VALID_PAIRS {
            let two_or_none = (0..tree.len()).all(|i| [0, 2].contains(&tree.children(i).len()));
            if c == samplers::DraftConstruction::SpecHub && !two_or_none {
                continue; // SpecHub drafts two children per node
            }
            let warp = Some(samplers::dist::Warp::temperature(1.0));
            let config = engine::decode::GenerationConfig {
                speculative: Some(common::spec(tree.clone(), c, v, warp, 0.0)),
                ..base.clone()
            };
            let what = format!("{name} {c}+{v}");
            let (out, stats) = common::generate_streamed(&mut generator, &prompt, &config, &what);
            assert_eq!(out, reference, "{what}");
            accepted += usize::from(stats.tau > 1.0);
        }
    }
    assert!(accepted > 0, "no configuration accepted a draft");
}

/// transformers 5 saves a tokenizer's chat template as `chat_template.jinja` beside
/// `tokenizer_config.json`, not in it; the file is read, and wins over the config's template
/// (as in transformers).
#[test]
fn chat_template_jinja_files_are_read() {
    let dir = Tiny::llama(27).write_hf(&temp_dir("chat-jinja").join("hf"));
    let render = |dir: &Path| engine::load::load_tokenizer(dir, None).unwrap().apply_chat_template("AB", None);
    let e = format!("{:#}", render(&dir).unwrap_err());
    assert!(e.contains("no chat template"), "{e}");
    std::fs::write(dir.join("chat_template.jinja"), "{% for m in messages %}[{{ m.content }}]{% endfor %}").unwrap();
    assert_eq!(render(&dir).unwrap(), "[AB]");
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"chat_template": "{{ messages[0].content }}"}"#).unwrap();
    assert_eq!(render(&dir).unwrap(), "[AB]", "the .jinja file wins");
    std::fs::remove_file(dir.join("chat_template.jinja")).unwrap();
    assert_eq!(render(&dir).unwrap(), "AB");
}
