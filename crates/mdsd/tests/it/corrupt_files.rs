//! Model files corrupted in the ways the fuzzers of `benches/fuzz` (the SmolLM2 GGUF, a tiny
//! safetensors folder) and a hand-made `pytorch_model.bin` found to crash `mdsd`: a panic
//! inside candle's GGUF parser, allocations sized by a corrupt count or shape that aborted or
//! were killed for memory, a tensor directory that disagreed with the metadata and failed later
//! inside a matmul. Each now gives exit status 1 and an error naming the file and the problem,
//! or, where the file is usable, runs.

use crate::common;

use candle_core::quantized::GgmlDType;
use common::{mdsd, temp_dir, Tiny};
use std::path::Path;

/// `mdsd generate --no-spec` on `target`: its exit status and stderr.
fn generate(target: &Path) -> (Option<i32>, String) {
    let t = target.to_str().unwrap();
    let out = mdsd(&["generate", "--target", t, "--no-spec", "--prompt", "ABCD", "--max-new-tokens", "3"]);
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Expects a clean failure whose message names `file` and contains `what`.
fn refused(target: &Path, file: &str, what: &str) {
    let (code, err) = generate(target);
    assert_eq!(code, Some(1), "expected exit 1; stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains(file) && err.contains(what), "expected `{file}` and `{what}` in: {err}");
}

/// The byte position just after the length-prefixed string `s` in a GGUF header.
fn after_string(bytes: &[u8], s: &str) -> usize {
    let mut needle = (s.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(s.as_bytes());
    let at = bytes.windows(needle.len()).position(|w| w == needle).unwrap_or_else(|| panic!("`{s}` not in the file"));
    at + needle.len()
}

/// Sets the u32 metadata value of `key`.
fn set_meta_u32(bytes: &mut [u8], key: &str, value: u32) {
    let at = after_string(bytes, key);
    assert_eq!(bytes[at..at + 4], 4u32.to_le_bytes(), "`{key}` is not a u32");
    bytes[at + 4..at + 8].copy_from_slice(&value.to_le_bytes());
}

/// The position of tensor `name`'s data offset in its directory entry.
fn offset_field(bytes: &[u8], name: &str) -> usize {
    let at = after_string(bytes, name);
    let dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    at + 4 + 8 * dims + 4
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

#[test]
fn corrupt_gguf_headers_give_clear_errors() {
    let dir = temp_dir("corrupt-gguf");
    let good = Tiny::llama(51).write_gguf(&dir.join("good.gguf"), GgmlDType::F32, &[]);
    let bytes = std::fs::read(&good).unwrap();
    let variant = |name: &str, edit: &dyn Fn(&mut Vec<u8>)| {
        let mut b = bytes.clone();
        edit(&mut b);
        let path = dir.join(name);
        std::fs::write(&path, b).unwrap();
        path
    };

    // The good file rewritten with one more metadata entry.
    let with_metas = |name: &str, extra: &[(&str, candle_core::quantized::gguf_file::Value)]| {
        use candle_core::quantized::gguf_file::{self, Value};
        let content = gguf_file::Content::read(&mut std::fs::File::open(&good).unwrap()).unwrap();
        let mut f = std::fs::File::open(&good).unwrap();
        let mut meta: Vec<(String, Value)> = content.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        meta.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
        let tensors: Vec<(String, _)> = content
            .tensor_infos
            .keys()
            .map(|n| (n.clone(), content.tensor(&mut f, n, &candle_core::Device::Cpu).unwrap()))
            .collect();
        let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let tensor_refs: Vec<(&str, _)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let path = dir.join(name);
        gguf_file::write(&mut std::fs::File::create(&path).unwrap(), &meta_refs, &tensor_refs).unwrap();
        path
    };
    let with_meta = |name: &str, key: &str, value| with_metas(name, &[(key, value)]);
    use candle_core::quantized::gguf_file::Value;
    let tiny = Tiny::llama(51);
    // A context length of 0: a model with no positions, refused when loaded (a draft so made
    // would have drafted nothing, and a target refused every prompt as too long).
    let no_context = Tiny { context: 0, ..tiny }.write_gguf(&dir.join("context0.gguf"), GgmlDType::F32, &[]);
    refused(&no_context, "context0.gguf", "invalid model configuration: a context of 0 positions");
    // `general.alignment = 0`: candle's parser divides by it (a panic before this change).
    let zero = with_meta("alignment0.gguf", "general.alignment", Value::U32(0));
    refused(&zero, "alignment0.gguf", "`general.alignment` 0");
    // `general.alignment = 1` in a file that candle's writer laid out on 32 bytes: the data
    // section moves back to the header's end while every offset stays aligned and the tensors
    // still tile, so weights would be read from shifted bytes. A padding entry of some length
    // puts the header's end off a multiple of 32, so that the section does move.
    let moved = (0..32)
        .map(|n| {
            let pad = Value::String("x".repeat(n));
            with_metas("alignment1.gguf", &[("general.alignment", Value::U32(1)), ("test.padding", pad)])
        })
        .find(|p| {
            let content =
                candle_core::quantized::gguf_file::Content::read(&mut std::fs::File::open(p).unwrap()).unwrap();
            !content.tensor_data_offset.is_multiple_of(32)
        })
        .expect("some padding length moves the data section");
    refused(&moved, "alignment1.gguf", "not written with the alignment it declares (`general.alignment` = 1)");
    // Rotary embeddings over part of each head (another architecture) are refused, not run.
    let partial = with_meta("partial-rope.gguf", "llama.rope.dimension_count", Value::U32(4));
    refused(&partial, "partial-rope.gguf", "`llama.rope.dimension_count` is 4, but the heads are 8 wide");

    // A block count of 2^31: the loader allocated a vector of that many layers and aborted.
    let many = variant("layers.gguf", &|b| set_meta_u32(b, "llama.block_count", 1 << 31));
    refused(&many, "layers.gguf", "missing tensor `blk.2.attn_norm.weight`");

    // Metadata that disagrees with the tensors (4 KV heads where `attn_k` has rows for 2): the
    // error used to come from a reshape in the first forward, naming neither tensor nor file.
    let kv = variant("kv-heads.gguf", &|b| set_meta_u32(b, "llama.attention.head_count_kv", tiny.heads as u32));
    refused(
        &kv,
        "kv-heads.gguf",
        "`blk.0.attn_k.weight` has shape [16, 32], but the metadata's sizes make it [32, 32]",
    );

    // A tensor moved onto another's bytes, past a gap, off the alignment, and to an offset that
    // wraps (the directory's order: `attn_q`, then `attn_k`).
    let q = offset_field(&bytes, "blk.0.attn_q.weight");
    let k = offset_field(&bytes, "blk.0.attn_k.weight");
    let q_offset = read_u64(&bytes, q);
    let overlap = variant("overlap.gguf", &|b| b[k..k + 8].copy_from_slice(&q_offset.to_le_bytes()));
    refused(&overlap, "overlap.gguf", "tensors `blk.0.attn_q.weight` and `blk.0.attn_k.weight` overlap in the file");
    let gap = variant("gap.gguf", &|b| b[q..q + 8].copy_from_slice(&(q_offset + 32).to_le_bytes()));
    refused(&gap, "gap.gguf", "tensor `blk.0.attn_q.weight` starts 32 bytes after the end of `blk.0.ffn_norm.weight`");
    let misaligned = variant("misaligned.gguf", &|b| b[q..q + 8].copy_from_slice(&(q_offset + 4).to_le_bytes()));
    refused(&misaligned, "misaligned.gguf", "not a multiple of the file's alignment 32");
    let wrapped = variant("wrapped.gguf", &|b| b[q..q + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes()));
    refused(&wrapped, "wrapped.gguf", "truncated GGUF file: tensor `blk.0.attn_q.weight` ends at byte 18446744073");

    // Bytes after the last tensor: a shrunken last tensor (its type or shape changed) leaves
    // them, and it was read from the wrong bytes. Appended here directly.
    let trailing = variant("trailing.gguf", &|b| b.extend_from_slice(&[0u8; 64]));
    refused(&trailing, "trailing.gguf", "the file has 64 bytes after the end of its last tensor");

    // A context of 2^32 - 1 positions is a valid file: rotary tables sized by it needed 64 GiB
    // and the process was killed; the angles are now computed per forward.
    let long = variant("long-context.gguf", &|b| set_meta_u32(b, "llama.context_length", u32::MAX));
    let (code, err) = generate(&long);
    assert_eq!(code, Some(0), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn corrupt_hugging_face_folders_give_clear_errors() {
    let dir = temp_dir("corrupt-hf");
    let tiny = Tiny::llama(52);
    // A layer count of 2^40 in config.json: the layer vector was allocated up front.
    let layers = tiny.write_hf(&dir.join("layers"));
    let mut config = tiny.config_json();
    config["num_hidden_layers"] = serde_json::json!(1u64 << 40);
    std::fs::write(layers.join("config.json"), config.to_string()).unwrap();
    refused(&layers, "model.safetensors", "model.layers.2.input_layernorm.weight");
    // A token id of 10^9 in tokenizer.json: the id-to-token table was sized by it (24 GB).
    let ids = tiny.write_hf(&dir.join("ids"));
    let mut tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ids.join("tokenizer.json")).unwrap()).unwrap();
    tok["model"]["vocab"]["ZZ"] = serde_json::json!(1_000_000_000u64);
    std::fs::write(ids.join("tokenizer.json"), tok.to_string()).unwrap();
    refused(&ids, "tokenizer.json", "token ids reach 1000000000 for 49 tokens");
    // A pytorch_model.bin whose pickle gives `fc.weight` [2^30, 2^30] over its real storage:
    // candle allocated 4 EiB before reading it, and the process aborted.
    let head_dir = dir.join("head");
    common::TinyEagle { target: tiny, seed: 53, own_embedding: false, scale: 0.3 }.write(&head_dir, false);
    let head_vb =
        candle_core::safetensors::load(head_dir.join("model.safetensors"), &candle_core::Device::Cpu).unwrap();
    std::fs::remove_file(head_dir.join("model.safetensors")).unwrap();
    let head_tensors: Vec<(String, candle_core::Tensor)> = head_vb.into_iter().collect();
    common::write_torch_bin_claiming(
        &head_dir.join("pytorch_model.bin"),
        &head_tensors,
        &[("fc.weight", &[1 << 30, 1 << 30])],
    );
    let target = tiny.write_hf(&dir.join("eagle-target"));
    let out = mdsd(&[
        "generate",
        "--target",
        target.to_str().unwrap(),
        "--eagle",
        head_dir.to_str().unwrap(),
        "--prompt",
        "ABCD",
        "--max-new-tokens",
        "3",
    ]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(
        e.contains("pytorch_model.bin")
            && e.contains("tensor `fc.weight` of shape [1073741824, 1073741824] needs more than"),
        "{e}"
    );
    // A tensor whose end offset overflows u64 is reported as outside the file.
    let wrapped = tiny.write_hf(&dir.join("wrapped"));
    let st = std::fs::read(wrapped.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&st[8..8 + n]).unwrap();
    header["lm_head.weight"]["data_offsets"][1] = serde_json::json!(u64::MAX);
    let mut text = header.to_string().into_bytes();
    text.resize(text.len().div_ceil(8) * 8, b' ');
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&st[8 + n..]);
    std::fs::write(wrapped.join("model.safetensors"), out).unwrap();
    refused(&wrapped, "model.safetensors", "truncated safetensors file: tensor `lm_head.weight`");
    std::fs::remove_dir_all(&dir).unwrap();
}
