//! The byte-level BPE tokenizer of GGUF metadata (`tokenizer.ggml.*`), built directly and
//! shared by the models that hold the same one.

use super::err;
use crate::Result;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Qwen2's pre-tokenizer split (from its `tokenizer.json`; llama.cpp's `qwen2`).
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// LLaMA-3's split (llama.cpp's `llama-bpe`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-2's byte-level pre-tokenizer or decoder, with or without its own split regex.
fn byte_level(regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": regex})
}

/// The `tokenizer.json` pre-tokenizer of a GGUF `tokenizer.ggml.pre` value (llama.cpp's names),
/// or `None` when it is not supported.
fn pre_tokenizer_spec(pre: &str) -> Option<Value> {
    let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
    Some(match pre {
        "qwen2" | "deepseek-r1-qwen" | "megrez" => {
            json!({"type": "Sequence", "pretokenizers": [split(QWEN2_SPLIT), byte_level(false)]})
        }
        llama3 if LLAMA3_FAMILY.contains(&llama3) => {
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_SPLIT), byte_level(false)]})
        }
        "smollm" | "starcoder" | "refact" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
        "default" | "gpt2" | "gpt-2" | "phi-2" => byte_level(true),
        _ => return None,
    })
}

/// Whether pre-tokenizer `pre`'s words that are whole tokens are taken as they are, before any
/// merge: llama.cpp's `ignore_merges` for its LLaMA-3 family, as LLaMA 3's own `tokenizer.json`
/// says (`"ignore_merges": true`). A word that is in the vocabulary but that the merges do not
/// reach in rank order is then one token, as the model was trained.
fn ignores_merges(pre: &str) -> bool {
    LLAMA3_FAMILY.contains(&pre)
}

/// llama.cpp's names for LLaMA 3's pre-tokenizer (its `LLAMA_VOCAB_PRE_TYPE_LLAMA3`).
const LLAMA3_FAMILY: [&str; 4] = ["llama-bpe", "llama3", "llama-v3", "falcon3"];

/// Whether llama.cpp puts the BOS first for pre-tokenizer `pre` when the file does not say
/// (`tokenizer.ggml.add_bos_token`): for its LLaMA 3 family.
pub(super) fn adds_bos_by_default(pre: &str) -> bool {
    ignores_merges(pre)
}

/// The GGUF metadata a byte-level BPE tokenizer is built from: `tokenizer.ggml.pre`, `tokens`,
/// `merges` and `token_type`.
#[derive(PartialEq)]
pub(super) struct GgufBpe {
    pub pre: String,
    pub tokens: Vec<String>,
    pub merges: Vec<String>,
    pub types: Vec<i64>,
}

/// The last tokenizer built from GGUF metadata, with that metadata: a draft whose GGUF holds the
/// target's tokenizer (the default pair's does) takes it instead of building it again (with
/// the direct build below, the draft's load fell from 1.2-2.1 s to 0.4-0.5 s:
/// docs/results/README.md#const-gguf-tokenizer-direct).
static LAST_GGUF_BPE: Mutex<Option<(GgufBpe, Arc<tokenizers::Tokenizer>)>> = Mutex::new(None);

/// The byte-level BPE tokenizer of GGUF metadata: vocabulary `tokens` (the first id of a
/// repeated string keeps it), `merges` ("left right" by rank), control (type 3) and
/// user-defined (type 4) tokens as added tokens, GPT-2's byte-level decoder, and the
/// pre-tokenizer given as its `tokenizer.json` object. Built directly, not through a
/// `tokenizer.json` text: that round trip of 151,936 tokens and 151,387 merges took most of a
/// model's load (docs/results/README.md#const-gguf-tokenizer-direct); `tests::direct_build_equals_the_tokenizer_json` checks
/// that both give the same tokenizer.
fn build_bpe(
    tokens: &[String],
    merges: &[String],
    types: &[i64],
    pre_tokenizer: Value,
    ignore_merges: bool,
) -> std::result::Result<tokenizers::Tokenizer, String> {
    use tokenizers::models::bpe::{Vocab, BPE};
    let mut vocab = Vocab::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        let ty = types.get(id).copied().unwrap_or(1);
        if ty == 3 || ty == 4 {
            added.push(tokenizers::AddedToken::from(tok.clone(), ty == 3).normalized(false));
        }
        vocab.entry(tok.clone()).or_insert(id as u32);
    }
    // As tokenizers reads a `tokenizer.json`'s merges written as strings.
    let merges = merges
        .iter()
        .filter(|m| !m.starts_with("#version"))
        .enumerate()
        .map(|(rank, m)| match m.split(' ').collect::<Vec<_>>()[..] {
            [left, right] => Ok((left.to_string(), right.to_string())),
            _ => Err(format!("merge {} (`{m}`) is not two tokens separated by one space", rank + 1)),
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| e.to_string())?;
    let pre: tokenizers::PreTokenizerWrapper = serde_json::from_value(pre_tokenizer).map_err(|e| e.to_string())?;
    let decoder: tokenizers::DecoderWrapper = serde_json::from_value(byte_level(true)).map_err(|e| e.to_string())?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre)).with_decoder(Some(decoder));
    inner.add_tokens(added).map_err(|e| e.to_string())?;
    Ok(inner)
}

/// The tokenizer of `key`, read from `path`, and its token strings by id: the last one built
/// when its metadata is the same, else built now.
pub(super) fn shared(key: GgufBpe, path: &Path) -> Result<(Arc<tokenizers::Tokenizer>, Vec<String>)> {
    let Some(pre_tokenizer) = pre_tokenizer_spec(&key.pre) else {
        return Err(err(
            path,
            format!(
                "GGUF pre-tokenizer `{}` is not supported (qwen2, deepseek-r1-qwen, llama-bpe, smollm, starcoder, \
                 gpt2); \
                 pass the model's tokenizer.json with --tokenizer",
                key.pre
            ),
        ));
    };
    // Held while building: a second model's load waits and then takes the first's.
    let mut last = LAST_GGUF_BPE.lock().unwrap_or_else(|e| e.into_inner());
    match &*last {
        Some((k, inner)) if *k == key => Ok((inner.clone(), key.tokens)),
        _ => {
            let built = build_bpe(&key.tokens, &key.merges, &key.types, pre_tokenizer, ignores_merges(&key.pre))
                .map_err(|e| err(path, format!("cannot build the tokenizer from the GGUF metadata: {e}")))?;
            let inner = Arc::new(built);
            let tokens = key.tokens.clone();
            *last = Some((key, inner.clone()));
            Ok((inner, tokens))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::gguf::GgufFile;

    /// The tokenizer of GGUF metadata through a `tokenizer.json` text, as `from_gguf` built it
    /// before [`build_bpe`]: the reference that `build_bpe` must equal.
    fn bpe_via_json(
        tokens: &[String],
        merges: &[String],
        types: &[i64],
        pre: Value,
        ignore_merges: bool,
    ) -> tokenizers::Tokenizer {
        let mut vocab = serde_json::Map::new();
        let mut added = Vec::new();
        for (id, tok) in tokens.iter().enumerate() {
            let ty = types.get(id).copied().unwrap_or(1);
            if ty == 3 || ty == 4 {
                added.push(json!({"id": id, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
                    "normalized": false, "special": ty == 3}));
            }
            vocab.entry(tok.clone()).or_insert(json!(id));
        }
        let spec = json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
            "pre_tokenizer": pre, "post_processor": null, "decoder": byte_level(true),
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": ignore_merges,
                "vocab": vocab, "merges": merges},
        });
        tokenizers::Tokenizer::from_bytes(spec.to_string().as_bytes()).unwrap()
    }

    /// Asserts that `build_bpe` and the `tokenizer.json` reference give the same vocabulary,
    /// added tokens, encodings (with and without special tokens) and decodings of `texts`.
    fn assert_same_tokenizer(tokens: &[String], merges: &[String], types: &[i64], pre: &str, texts: &[String]) {
        let spec = pre_tokenizer_spec(pre).unwrap();
        let direct = build_bpe(tokens, merges, types, spec.clone(), ignores_merges(pre)).unwrap();
        let reference = bpe_via_json(tokens, merges, types, spec, ignores_merges(pre));
        assert_eq!(direct.get_vocab(true), reference.get_vocab(true), "{pre}: vocabularies");
        let added = |t: &tokenizers::Tokenizer| {
            let mut a: Vec<(u32, String, bool)> =
                t.get_added_tokens_decoder().into_iter().map(|(id, t)| (id, t.content, t.special)).collect();
            a.sort();
            a
        };
        assert_eq!(added(&direct), added(&reference), "{pre}: added tokens");
        for text in texts {
            let ids = direct.encode(text.as_str(), false).unwrap().get_ids().to_vec();
            assert_eq!(ids, reference.encode(text.as_str(), false).unwrap().get_ids(), "{pre}: {text:?}");
            for skip in [true, false] {
                assert_eq!(
                    direct.decode(&ids, skip).unwrap(),
                    reference.decode(&ids, skip).unwrap(),
                    "{pre}: {text:?}"
                );
            }
        }
    }

    /// GPT-2's byte-to-character table, by byte.
    fn byte_chars() -> Vec<char> {
        let mut extra = 0;
        (0..=255u32)
            .map(|b| match b {
                33..=126 | 161..=172 | 174..=255 => char::from_u32(b).unwrap(),
                _ => {
                    extra += 1;
                    char::from_u32(255 + extra).unwrap()
                }
            })
            .collect()
    }

    /// On a byte-level vocabulary with merges, a repeated string, control and user-defined
    /// tokens, every supported pre-tokenizer gives the same tokenizer built directly as through
    /// a `tokenizer.json`.
    #[test]
    fn direct_build_equals_the_tokenizer_json() {
        let mut tokens: Vec<String> = byte_chars().into_iter().map(String::from).collect();
        let merges: Vec<String> =
            ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "1 2", "Ġ 1", "e r", "Ġ in", "Ċ Ċ", "Ã ©", "Ġthe r", "o n"]
                .iter()
                .map(|m| m.to_string())
                .collect();
        for m in &merges {
            tokens.push(m.replace(' ', ""));
        }
        tokens.push("he".into()); // a repeated string: the first id keeps it
        tokens.extend(["<|im_start|>", "<|im_end|>", "<tool>"].map(String::from));
        let mut types = vec![1i64; tokens.len()];
        let n = types.len();
        types[n - 3] = 3;
        types[n - 2] = 3;
        types[n - 1] = 4;
        let texts: Vec<String> = [
            "the theory in a 123 1234567 there",
            "<|im_start|>user\nthe <tool> in\n\n\n  café  é<|im_end|>",
            "  leading spaces, tabs\tand CRLF\r\nend",
            "Ünïcödé ünd 数字 123,456.78 don't won't I'll",
            "",
        ]
        .map(String::from)
        .to_vec();
        for pre in ["qwen2", "llama-bpe", "smollm", "gpt2"] {
            assert_same_tokenizer(&tokens, &merges, &types, pre, &texts);
        }
        // A merge that is not two tokens is an error, not a panic.
        let bad = build_bpe(&tokens, &["a b c".to_string()], &types, byte_level(true), false);
        assert!(bad.unwrap_err().contains("merge 1"));
    }

    /// LLaMA 3's pre-tokenizers take a word that is a whole token as it is (llama.cpp's
    /// `ignore_merges` for them, and LLaMA 3's own `tokenizer.json`); the others build every
    /// word by merges. Vocabulary: three bytes, `ab` (merge `a b`) and `abc`, which no merge
    /// reaches.
    #[test]
    fn llama3_takes_whole_word_tokens_before_merges() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "abc"].map(String::from).to_vec();
        let merges = vec!["a b".to_string()];
        let types = vec![1i64; tokens.len()];
        for (pre, expect) in [
            ("llama-bpe", vec![4u32]),
            ("llama3", vec![4]),
            ("falcon3", vec![4]),
            ("qwen2", vec![3, 2]),
            ("deepseek-r1-qwen", vec![3, 2]),
            ("gpt2", vec![3, 2]),
        ] {
            let spec = pre_tokenizer_spec(pre).unwrap();
            let t = build_bpe(&tokens, &merges, &types, spec, ignores_merges(pre)).unwrap();
            assert_eq!(t.encode("abc", false).unwrap().get_ids(), expect, "{pre}");
            // A word that is not a token is built by merges either way.
            assert_eq!(t.encode("abcab", false).unwrap().get_ids(), [3, 2, 3], "{pre}");
        }
    }

    /// The same on the real GGUF tokenizers (the default pair's target and SmolLM2) and the 80
    /// MT-Bench questions; opt-in, as it needs the fetched models.
    #[test]
    #[ignore = "needs the default pair's target and SmolLM2 in the model cache (mdsd fetch)"]
    fn direct_build_equals_the_tokenizer_json_on_real_models() {
        let cache = crate::load::provision::cache_dir();
        let questions = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/data/mt_bench_question.jsonl"
        ))
        .unwrap();
        let texts: Vec<String> = questions
            .lines()
            .flat_map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                v["turns"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect::<Vec<_>>()
            })
            .chain(["<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n".to_string()])
            .collect();
        assert_eq!(texts.len(), 161);
        for name in ["qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"] {
            let file = GgufFile::open(&cache.join(name)).unwrap();
            let tokens = file.strings("tokenizer.ggml.tokens").unwrap().unwrap();
            let merges = file.strings("tokenizer.ggml.merges").unwrap().unwrap();
            let types = file.ints("tokenizer.ggml.token_type").unwrap().unwrap();
            let pre = file.string("tokenizer.ggml.pre").unwrap().unwrap();
            assert_same_tokenizer(&tokens, &merges, &types, &pre, &texts);
        }
    }
}
