//! The tree-capable forward: against candle-transformers' reference models, across the
//! safetensors and GGUF loaders, and node by node on a draft tree.

use crate::common;

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use common::{load_cpu, load_on_test_device, logits_all, max_diff, temp_dir, test_device, Tiny};
use engine::model::{attention_bias, causal_bias, DecoderModel};
use engine::DraftTree;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn last_logits(model: &DecoderModel, tokens: &[u32]) -> Tensor {
    let l = logits_all(model, tokens);
    l.narrow(0, tokens.len() - 1, 1).unwrap().squeeze(0).unwrap()
}

const PROMPT: [u32; 7] = [3, 17, 5, 40, 22, 9, 31];

/// Our forward equals candle-transformers' LLaMA, Qwen2 and Qwen3 at every position of a chain
/// (the reference run token by token with its own cache), to 1e-4.
#[test]
fn chain_forward_matches_candle_transformers() {
    for tiny in [Tiny::llama(1), Tiny::qwen2(2), Tiny::qwen3(5)] {
        let dir = tiny.write_hf(&temp_dir(&format!("ref-{}", tiny.arch)));
        let ours = load_cpu(&dir);
        let all = logits_all(&ours, &PROMPT);
        let vb = unsafe {
            candle_nn::VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], DType::F32, &Device::Cpu)
                .unwrap()
        };
        let cfg_text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let mut reference: Vec<Tensor> = Vec::new();
        if tiny.arch == "llama" {
            use candle_transformers::models::llama;
            let cfg: llama::LlamaConfig = serde_json::from_str(&cfg_text).unwrap();
            let cfg = cfg.into_config(false);
            let model = llama::Llama::load(vb, &cfg).unwrap();
            let mut cache = llama::Cache::new(true, DType::F32, &cfg, &Device::Cpu).unwrap();
            for (i, &t) in PROMPT.iter().enumerate() {
                let x = Tensor::new(&[[t]], &Device::Cpu).unwrap();
                reference.push(model.forward(&x, i, &mut cache).unwrap().squeeze(0).unwrap());
            }
        } else if tiny.arch == "qwen3" {
            use candle_transformers::models::qwen3;
            let cfg: qwen3::Config = serde_json::from_str(&cfg_text).unwrap();
            assert_ne!(cfg.head_dim * cfg.num_attention_heads, cfg.hidden_size, "heads wider than hidden / heads");
            let mut model = qwen3::ModelForCausalLM::new(&cfg, vb).unwrap();
            for (i, &t) in PROMPT.iter().enumerate() {
                let x = Tensor::new(&[[t]], &Device::Cpu).unwrap();
                reference.push(model.forward(&x, i).unwrap().squeeze(0).unwrap().squeeze(0).unwrap());
            }
        } else {
            use candle_transformers::models::qwen2;
            let cfg: qwen2::Config = serde_json::from_str(&cfg_text).unwrap();
            let mut model = qwen2::ModelForCausalLM::new(&cfg, vb).unwrap();
            for (i, &t) in PROMPT.iter().enumerate() {
                let x = Tensor::new(&[[t]], &Device::Cpu).unwrap();
                reference.push(model.forward(&x, i).unwrap().squeeze(0).unwrap().squeeze(0).unwrap());
            }
        }
        for (i, r) in reference.iter().enumerate() {
            let d = max_diff(&all.narrow(0, i, 1).unwrap().squeeze(0).unwrap(), r);
            assert!(d < 1e-4, "{} position {i}: max |diff| = {d}", tiny.arch);
        }
        // The whole chain at once and one token at a time through our cache agree too.
        let mut cache = ours.new_cache(64).unwrap();
        for (i, &t) in PROMPT.iter().enumerate() {
            let bias = causal_bias(i, 1, DType::F32, &Device::Cpu).unwrap();
            let h = ours.forward(&[t], &[i as u32], &bias, &mut cache).unwrap();
            let d = max_diff(&ours.logits(&h).unwrap(), &all.narrow(0, i, 1).unwrap());
            assert!(d < 1e-4, "{} incremental position {i}: {d}", tiny.arch);
        }
    }
}

/// A GGUF file written from the same weights (llama.cpp names; LLaMA's q/k rows permuted for
/// interleaved rotary embedding) gives the same logits as the safetensors folder: to 1e-4
/// in f32, and within 5% of the largest logit in Q8_0 (weights and activations quantized).
#[test]
fn gguf_and_safetensors_loaders_agree() {
    for tiny in [Tiny::llama(3), Tiny::qwen2(4), Tiny::qwen3(6)] {
        let dir = temp_dir(&format!("gguf-{}", tiny.arch));
        let hf = load_cpu(&tiny.write_hf(&dir.join("hf")));
        let expect = logits_all(&hf, &PROMPT);
        let f32_path = tiny.write_gguf(&dir.join("f32.gguf"), GgmlDType::F32, &[]);
        let g = load_cpu(&f32_path);
        assert_eq!(g.config().rope_interleaved, tiny.arch == "llama");
        let d = max_diff(&logits_all(&g, &PROMPT), &expect);
        assert!(d < 1e-4, "{} f32 GGUF: {d}", tiny.arch);
        let q8 = tiny.write_gguf(&dir.join("q8.gguf"), GgmlDType::Q8_0, &[]);
        let g = load_cpu(&q8);
        let d = max_diff(&logits_all(&g, &PROMPT), &expect);
        let scale = expect.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
        assert!(d < 0.05 * scale, "{} Q8_0 GGUF: max |diff| {d} for logits up to {scale}", tiny.arch);
    }
}

/// A Qwen3 GGUF file (llama.cpp's names: `attn_q_norm`, `attn_k_norm`, `attention.key_length`)
/// gives the logits of candle-transformers' own `quantized_qwen3` on the same file, run token
/// by token, at every position of a chain (f32 weights, 1e-4).
#[test]
fn qwen3_gguf_matches_candle_transformers_quantized_qwen3() {
    use candle_transformers::models::quantized_qwen3;
    let tiny = Tiny::qwen3(7);
    // `general.dtype` 0: the reference's rotary table in f32 (without it, f16).
    let dtype = vec![("general.dtype".to_string(), candle_core::quantized::gguf_file::Value::U32(0))];
    let path = tiny.write_gguf_with(&temp_dir("qwen3-gguf").join("f32.gguf"), GgmlDType::F32, &[], dtype, vec![]);
    let all = logits_all(&load_cpu(&path), &PROMPT);
    let mut file = std::fs::File::open(&path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let mut reference = quantized_qwen3::ModelWeights::from_gguf(content, &mut file, &Device::Cpu).unwrap();
    for (i, &t) in PROMPT.iter().enumerate() {
        let x = Tensor::new(&[[t]], &Device::Cpu).unwrap();
        let r = reference.forward(&x, i).unwrap().flatten_all().unwrap();
        let d = max_diff(&all.narrow(0, i, 1).unwrap().flatten_all().unwrap(), &r);
        assert!(d < 1e-4, "position {i}: max |diff| = {d}");
    }
}

/// The same files on the test device (`MDSD_TEST_DEVICE`, e.g. CUDA) and on the CPU give
/// the same logits: safetensors to 1e-4 at f32 (5% of the largest logit at bf16), GGUF F32 to 1e-4,
/// GGUF Q8_0 and Q4_K (whose activations are quantized differently by each backend's kernels;
/// on the CPU, Q4_K with few rows runs our own kernel) within 5% of the largest logit. Ignored
/// unless built with CUDA (`--features cuda`, run with `MDSD_TEST_DEVICE=cuda`): on the CPU it
/// would compare the CPU with itself, so there it fails rather than pass.
#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs a GPU: build with --features cuda, run with MDSD_TEST_DEVICE=cuda")]
fn test_device_agrees_with_the_cpu() {
    assert!(!test_device().is_cpu(), "MDSD_TEST_DEVICE is the CPU: this test compares another device with the CPU");
    let dir = temp_dir("device");
    // Q4_K needs every matrix's input size to be a multiple of 256. Weights of scale 0.1
    // (about 1/sqrt(256)) keep each product's output as large as its input, as 0.3 does at
    // hidden 32; at 0.3 the wide model amplified rounding so much that bf16 against f32 on
    // the CPU alone differed by 4% of the largest logit, and CUDA's Q8_0/Q4_K kernels against
    // the CPU's by 9% and 13% (H200, 2026-11-26).
    let wide = |t: Tiny| Tiny { hidden: 256, intermediate: 256, scale: 0.1, ..t };
    let mut failures = Vec::new();
    for tiny in [Tiny::llama(3), Tiny::qwen2(4), wide(Tiny::qwen2(8))] {
        let name = |kind: &str| dir.join(format!("{}-{}-{kind}", tiny.arch, tiny.hidden));
        let mut files = vec![
            ("safetensors", tiny.write_hf(&name("hf"))),
            ("F32 GGUF", tiny.write_gguf(&name("f32.gguf"), GgmlDType::F32, &[])),
            ("Q8_0 GGUF", tiny.write_gguf(&name("q8.gguf"), GgmlDType::Q8_0, &[])),
        ];
        if tiny.hidden % 256 == 0 {
            files.push(("Q4_K GGUF", tiny.write_gguf(&name("q4k.gguf"), GgmlDType::Q4K, &[])));
        }
        for (kind, path) in files {
            let on_device = load_on_test_device(&path);
            assert_eq!(on_device.device().location(), test_device().location(), "{kind}: loaded on another device");
            let expect = logits_all(&load_cpu(&path), &PROMPT);
            let got = logits_all(&on_device, &PROMPT);
            let d = max_diff(&got, &expect);
            let scale = expect.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
            let tol = match (kind, on_device.dtype()) {
                ("Q8_0 GGUF" | "Q4_K GGUF", _) => 0.05 * scale,
                (_, DType::F32) => 1e-4,
                // bf16 keeps 8 significant bits: measured on the CPU against f32, up to 2.9% of
                // the largest logit on these models.
                _ => 0.05 * scale,
            };
            let line = format!(
                "{} hidden {} {kind} ({:?}): max |diff| {d:.3e}, tolerance {tol:.3e}",
                tiny.arch,
                tiny.hidden,
                on_device.dtype()
            );
            eprintln!("{line}");
            if d > tol {
                failures.push(line);
            }
        }
    }
    assert!(failures.is_empty(), "test device against the CPU:\n{}", failures.join("\n"));
}

/// Every node of a tree run in one forward (after a cached prefix) gets the logits of its
/// root-to-node path run alone; after compacting the cache to one path, decoding continues
/// exactly as from scratch. Runs on the test device (`MDSD_TEST_DEVICE`, f32 expected).
#[test]
fn tree_nodes_match_their_paths_and_compaction_keeps_a_path() {
    let dir = temp_dir("tree");
    let mut models = vec![
        load_on_test_device(&Tiny::llama(5).write_hf(&dir.join("llama"))),
        load_on_test_device(&Tiny::qwen2(6).write_gguf(&dir.join("qwen2.gguf"), GgmlDType::F32, &[])),
        load_on_test_device(&Tiny::llama(7).write_gguf(&dir.join("llama.gguf"), GgmlDType::F32, &[])),
    ];
    // Q4_K on the CPU runs our repacked kernel at every row count (`model::q4k_interleaved`;
    // with AVX2): a row's result must not depend on how many rows share the product.
    if test_device().is_cpu() {
        let wide = Tiny { hidden: 256, intermediate: 512, ..Tiny::qwen2(9) };
        models.push(load_cpu(&wide.write_gguf(&dir.join("qwen2-q4k.gguf"), GgmlDType::Q4K, &[])));
    }
    let mut rng = StdRng::seed_from_u64(11);
    for (mi, model) in models.iter().enumerate() {
        for name in ["mc_sim_7b_63", "drafts-2-depth-3", "chain-3"] {
            let tree = DraftTree::preset(name).unwrap();
            let prefix = &PROMPT[..5];
            let tokens: Vec<u32> = (0..tree.len()).map(|_| rng.random_range(0..48)).collect();
            let mut cache = model.new_cache(128).unwrap();
            let bias = causal_bias(0, prefix.len(), model.dtype(), model.device()).unwrap();
            let pos: Vec<u32> = (0..prefix.len() as u32).collect();
            model.forward(prefix, &pos, &bias, &mut cache).unwrap();
            let bias = attention_bias(
                prefix.len(),
                tree.len(),
                tree.len(),
                |r, c| tree.is_ancestor_or_self(c, r),
                model.dtype(),
                model.device(),
            )
            .unwrap();
            let pos: Vec<u32> = tree.position_ids(prefix.len()).iter().map(|&p| p as u32).collect();
            let h = model.forward(&tokens, &pos, &bias, &mut cache).unwrap();
            let tree_logits = model.logits(&h).unwrap();
            for node in 0..tree.len() {
                let mut seq = prefix.to_vec();
                seq.extend(tree.node_path(node).iter().map(|&i| tokens[i]));
                let d =
                    max_diff(&tree_logits.narrow(0, node, 1).unwrap().squeeze(0).unwrap(), &last_logits(model, &seq));
                assert!(d < 1e-4, "model {mi} tree {name} node {node}: {d}");
            }
            // Keep the path to the last node, then run one more token.
            let leaf = tree.len() - 1;
            let path = tree.node_path(leaf);
            cache.compact(prefix.len(), &path).unwrap();
            assert_eq!(cache.len(), prefix.len() + path.len());
            let next = 13u32;
            let at = cache.len();
            let bias = causal_bias(at, 1, model.dtype(), model.device()).unwrap();
            let h = model.forward(&[next], &[at as u32], &bias, &mut cache).unwrap();
            let mut seq = prefix.to_vec();
            seq.extend(path.iter().map(|&i| tokens[i]));
            seq.push(next);
            let d = max_diff(&model.logits(&h).unwrap().squeeze(0).unwrap(), &last_logits(model, &seq));
            assert!(d < 1e-4, "model {mi} tree {name} after compaction: {d}");
        }
    }
}

/// A prompt prefilled in chunks (`forward_chain`: 256 tokens per forward on the CPU, through
/// the in-place attention) gives the hidden states of one forward over the whole prompt
/// (candle's GEMM attention) to 1e-4, and the caches it leaves decode the next token alike.
/// Head size 16, so the attention takes its sixteen-key blocks.
#[test]
fn a_prompt_prefilled_in_chunks_equals_one_forward() {
    let tiny = Tiny { hidden: 64, context: 800, ..Tiny::qwen2(21) };
    let model = load_cpu(&tiny.write_hf(&temp_dir("chunked-prefill")));
    let mut rng = StdRng::seed_from_u64(5);
    let n = 2 * engine::model::PREFILL_CHUNK_CPU + 88;
    let tokens: Vec<u32> = (0..n).map(|_| rng.random_range(0..tiny.vocab as u32)).collect();
    let mut chunked = model.new_cache(n + 1).unwrap();
    let got = model.forward_chain(&tokens, &mut chunked).unwrap();
    let mut once = model.new_cache(n + 1).unwrap();
    let pos: Vec<u32> = (0..n as u32).collect();
    let want = model.forward(&tokens, &pos, &causal_bias(0, n, DType::F32, &Device::Cpu).unwrap(), &mut once).unwrap();
    assert_eq!(got.dims(), [n, tiny.hidden]);
    let d = max_diff(&got, &want);
    assert!(d < 1e-4, "hidden states: max |diff| = {d}");
    assert_eq!(chunked.len(), n);
    let next = |cache: &mut engine::model::kv_cache::KvCache| {
        let bias = causal_bias(n, 1, DType::F32, &Device::Cpu).unwrap();
        model.logits(&model.forward(&[7], &[n as u32], &bias, cache).unwrap()).unwrap()
    };
    let d = max_diff(&next(&mut chunked), &next(&mut once));
    assert!(d < 1e-4, "next token's logits: max |diff| = {d}");
    assert!(model.forward_chain(&[], &mut chunked).is_err());
}

/// `fast-cpu` weights from the converted copy on disk (written on the first load, read on the
/// next) give the logits of the conversion done in memory, bit for bit: LLaMA (untied) and
/// Qwen2 (tied, so the copy gains a converted `output.weight`), Q8_0 matrices 64 wide (padded
/// to 256), also with fewer layers and a truncated head. A damaged copy is deleted, and a cache
/// that cannot be written is skipped: the model is converted in memory instead.
#[test]
fn converted_copies_on_disk_equal_the_conversion_in_memory() {
    use engine::load::gguf::{load_in, WeightFormat};
    let dir = temp_dir("converted");
    let cache = dir.join("cache");
    let cpu = Device::Cpu;
    for tiny in [Tiny { hidden: 64, ..Tiny::llama(31) }, Tiny { hidden: 64, ..Tiny::qwen2(32) }] {
        let src = tiny.write_gguf(&dir.join(format!("{}.gguf", tiny.arch)), GgmlDType::Q8_0, &[]);
        // The tiny writer keeps embeddings in f32; a Q8_0 one makes the tied head converted too.
        {
            let mut f = engine::load::gguf::GgufFile::open(&src).unwrap();
            let meta: Vec<(String, candle_core::quantized::gguf_file::Value)> =
                f.metadata().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            let names: Vec<String> = f.tensor_names().map(String::from).collect();
            let mut tensors = Vec::new();
            for n in names {
                let t = f.tensor(&n, &cpu).unwrap();
                let t = if n == "token_embd.weight" {
                    candle_core::quantized::QTensor::quantize(&t.dequantize(&cpu).unwrap(), GgmlDType::Q8_0).unwrap()
                } else {
                    t
                };
                tensors.push((n, t));
            }
            let meta_refs: Vec<_> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
            let tensor_refs: Vec<_> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
            let mut out = std::fs::File::create(&src).unwrap();
            candle_core::quantized::gguf_file::write(&mut out, &meta_refs, &tensor_refs).unwrap();
        }
        for (layers, rows) in [(None, None), (Some(1), Some(32))] {
            let load = |cache: Option<&std::path::Path>| {
                load_in(&src, &cpu, layers, rows, WeightFormat::FastCpu, cache).unwrap().0
            };
            let want = logits_all(&load(None), &PROMPT).flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for round in ["written", "read back"] {
                let got = logits_all(&load(Some(&cache)), &PROMPT).flatten_all().unwrap().to_vec1::<f32>().unwrap();
                assert!(
                    got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{} {layers:?} {rows:?}: {round} copy differs",
                    tiny.arch
                );
            }
        }
        let copy = engine::load::converted::path_for(&src, &cache).unwrap();
        assert!(copy.exists(), "{}", copy.display());
        let mut f = engine::load::gguf::GgufFile::open(&copy).unwrap();
        assert_eq!(f.uint("mdsd.fast_cpu.cols.blk.0.attn_q.weight").unwrap(), Some(64));
        assert_eq!(f.tensor("blk.0.attn_q.weight", &cpu).unwrap().dtype(), GgmlDType::Q4K);
        assert_eq!(f.tensor("output.weight", &cpu).unwrap().shape().dims(), [tiny.vocab, 256]);
        assert_eq!(f.tensor("token_embd.weight", &cpu).unwrap().dtype(), GgmlDType::Q8_0, "the embedding as stored");
        let len = std::fs::metadata(&copy).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&copy).unwrap().set_len(len / 2).unwrap();
        let (model, file) = load_in(&src, &cpu, None, None, WeightFormat::FastCpu, Some(&cache)).unwrap();
        assert_eq!(file.path(), src.as_path());
        assert!(!copy.exists(), "the damaged copy is deleted");
        let want = logits_all(&load_in(&src, &cpu, None, None, WeightFormat::FastCpu, None).unwrap().0, &PROMPT);
        assert_eq!(max_diff(&logits_all(&model, &PROMPT), &want), 0.0);
    }
    let converted: Vec<_> = std::fs::read_dir(cache.join("converted")).unwrap().collect();
    assert_eq!(converted.len(), 0, "both damaged copies deleted, no temporary files left");
    // A cache that cannot be written (under a plain file): converted in memory, same logits.
    let src = dir.join("llama.gguf");
    let blocked = dir.join("plain-file");
    std::fs::write(&blocked, b"x").unwrap();
    let got = load_in(&src, &cpu, None, None, WeightFormat::FastCpu, Some(&blocked.join("cache"))).unwrap().0;
    let want = load_in(&src, &cpu, None, None, WeightFormat::FastCpu, None).unwrap().0;
    assert_eq!(max_diff(&logits_all(&got, &PROMPT), &logits_all(&want, &PROMPT)), 0.0);
}
