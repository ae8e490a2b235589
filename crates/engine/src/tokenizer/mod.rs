//! Tokenizers and chat templates.
//!
//! A [`TextTokenizer`] comes from `tokenizer.json` (with `tokenizer_config.json` for the chat
//! template and special tokens) or, for a GGUF file without one, is built from the GGUF
//! metadata: byte-level BPE from `tokenizer.ggml.tokens` and `tokenizer.ggml.merges`, the
//! pre-tokenizer regex chosen by `tokenizer.ggml.pre`, control and user-defined tokens as
//! added tokens. Chat templates are Jinja (`tokenizer.chat_template` or the config's
//! `chat_template`) rendered with minijinja the way transformers renders them (trim and
//! lstrip blocks, Python string methods, `raise_exception`).

use crate::formats::gguf::GgufFile;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod gguf_bpe;
mod strftime;

use gguf_bpe::GgufBpe;

use crate::file_error as err;
use crate::{Error, Result};

/// A tokenizer with the model's special tokens and chat template.
#[derive(Clone)]
pub struct TextTokenizer {
    /// Shared by the models whose GGUF metadata is the same tokenizer (`gguf_bpe::shared`).
    inner: Arc<tokenizers::Tokenizer>,
    /// Token strings by id (for the target/draft vocabulary check).
    vocab: Vec<String>,
    chat_template: Option<String>,
    /// Extra variables of every chat template rendering (`--chat-template-kwargs`), e.g.
    /// Qwen3's `enable_thinking`.
    chat_kwargs: serde_json::Map<String, Value>,
    bos: Option<(u32, String)>,
    eos: Option<(u32, String)>,
    /// Ids that end generation.
    stop_ids: Vec<u32>,
    add_bos: bool,
    source: PathBuf,
    /// The decoder maps token strings back to bytes with GPT-2's byte-level table.
    byte_level: bool,
    /// Added (special and user-defined) tokens: their strings are their text.
    added: std::collections::HashSet<u32>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer").field("source", &self.source).field("vocab", &self.vocab.len()).finish()
    }
}

/// The `eos_token_id` (a number or a list) of a model folder's `generation_config.json`, as
/// transformers' `generate` stops on them (LLaMA 3.1 Instruct lists `<|end_of_text|>`,
/// `<|eom_id|>` and `<|eot_id|>`); none without the file. Ids outside the vocabulary of
/// `vocab` tokens are an error naming the file.
fn generation_eos_ids(path: &Path, vocab: usize) -> Result<Vec<u32>> {
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(path).map_err(|e| err(path, e))?;
    let json: Value = serde_json::from_str(&text).map_err(|e| err(path, format!("not valid JSON: {e}")))?;
    let ids: Vec<&Value> = match json.get("eos_token_id") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list.iter().collect(),
        Some(one) => vec![one],
    };
    ids.into_iter()
        .map(|v| match v.as_u64() {
            Some(id) if (id as usize) < vocab => Ok(id as u32),
            _ => Err(err(path, format!("`eos_token_id` {v} is not a token id of the {vocab}-token vocabulary"))),
        })
        .collect()
}

impl TextTokenizer {
    /// Builds the tokenizer stored in a GGUF file's metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let path = file.path();
        let model = file.string("tokenizer.ggml.model")?.unwrap_or_default();
        if model != "gpt2" {
            return Err(err(
                path,
                format!(
                    "GGUF tokenizer model `{model}` is not supported (only byte-level BPE, `gpt2`); \
                     pass the model's tokenizer.json with --tokenizer"
                ),
            ));
        }
        let tokens = file.strings("tokenizer.ggml.tokens")?.ok_or_else(|| err(path, "no `tokenizer.ggml.tokens`"))?;
        let merges = file.strings("tokenizer.ggml.merges")?.ok_or_else(|| err(path, "no `tokenizer.ggml.merges`"))?;
        let types = file.ints("tokenizer.ggml.token_type")?.unwrap_or_else(|| vec![1; tokens.len()]);
        let pre = file.string("tokenizer.ggml.pre")?.unwrap_or_else(|| "default".into());
        let bos_by_default = gguf_bpe::adds_bos_by_default(&pre);
        let (inner, tokens) = gguf_bpe::shared(GgufBpe { pre, tokens, merges, types }, path)?;
        let id_token = |key: &str| -> Result<Option<(u32, String)>> {
            Ok(file.uint(key)?.and_then(|id| tokens.get(id as usize).map(|t| (id as u32, t.clone()))))
        };
        let bos = id_token("tokenizer.ggml.bos_token_id")?;
        let eos = id_token("tokenizer.ggml.eos_token_id")?;
        // Without the key, llama.cpp adds the BOS for its LLaMA 3 pre-tokenizers.
        let add_bos = match file.meta("tokenizer.ggml.add_bos_token") {
            Some(candle_core::quantized::gguf_file::Value::Bool(b)) => *b,
            _ => bos_by_default,
        };
        let chat_template = file.string("tokenizer.chat_template")?;
        // llama.cpp's end-of-turn and end-of-message tokens end generation as its EOS does.
        let mut also_stop = Vec::new();
        for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            also_stop.extend(id_token(key)?.map(|(id, _)| id));
        }
        Ok(Self::finish(inner, tokens, chat_template, bos, eos, add_bos, also_stop, path))
    }

    /// Loads `tokenizer.json` and, beside it, `tokenizer_config.json` (chat template, BOS/EOS,
    /// `add_bos_token`), `chat_template.jinja` (the chat template as transformers 5 saves it)
    /// and `generation_config.json` (more stop ids) when present.
    pub fn from_file(path: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| err(path, format!("not a valid tokenizer.json: {e}")))?;
        let map = inner.get_vocab(true);
        // Ids index a table; ids far beyond the number of tokens (a corrupt file) would make
        // that table gigabytes, so gaps of more than 2^20 ids are refused.
        let table_len = map.values().map(|&i| i as usize + 1).max().unwrap_or(0);
        if table_len > map.len() + (1 << 20) {
            return Err(err(
                path,
                format!(
                    "token ids reach {} for {} tokens: not a vocabulary of consecutive ids",
                    table_len - 1,
                    map.len()
                ),
            ));
        }
        let mut vocab = vec![String::new(); table_len];
        for (tok, id) in map {
            vocab[id as usize] = tok;
        }
        let config_path = path.with_file_name("tokenizer_config.json");
        let config: Value = if config_path.is_file() {
            let text = std::fs::read_to_string(&config_path).map_err(|e| err(&config_path, e))?;
            serde_json::from_str(&text).map_err(|e| err(&config_path, format!("not valid JSON: {e}")))?
        } else {
            Value::Null
        };
        // `bos_token` is a string or {"content": ...}.
        let special = |key: &str| -> Option<(u32, String)> {
            let v = config.get(key)?;
            let s = v.as_str().or_else(|| v.get("content").and_then(|c| c.as_str()))?;
            inner.token_to_id(s).map(|id| (id, s.to_owned()))
        };
        // transformers 5 (and 4.43 on, for some models) saves the template as
        // `chat_template.jinja`, which wins over `tokenizer_config.json`'s, as in transformers.
        let jinja = path.with_file_name("chat_template.jinja");
        let chat_template = match std::fs::read_to_string(&jinja) {
            Ok(text) => Some(text),
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(err(&jinja, format!("cannot read: {e}"))),
            Err(_) => match config.get("chat_template") {
                Some(Value::String(s)) => Some(s.clone()),
                // A list of named templates: take "default".
                Some(Value::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str().map(str::to_owned)),
                _ => None,
            },
        };
        let (bos, eos) = (special("bos_token"), special("eos_token"));
        // Without `add_bos_token`, the BOS is added when the tokenizer's own post-processor adds
        // it, as transformers does for a plain text (LLaMA 3's `TemplateProcessing`).
        let add_bos = match config.get("add_bos_token").and_then(|b| b.as_bool()) {
            Some(b) => b,
            None => bos
                .as_ref()
                .is_some_and(|(id, _)| inner.encode("a", true).is_ok_and(|e| e.get_ids().first() == Some(id))),
        };
        let also_stop = generation_eos_ids(&path.with_file_name("generation_config.json"), vocab.len())?;
        Ok(Self::finish(Arc::new(inner), vocab, chat_template, bos, eos, add_bos, also_stop, path))
    }

    /// `also_stop`: ids the files name as ending generation besides the EOS token.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        inner: Arc<tokenizers::Tokenizer>,
        vocab: Vec<String>,
        chat_template: Option<String>,
        bos: Option<(u32, String)>,
        eos: Option<(u32, String)>,
        add_bos: bool,
        also_stop: Vec<u32>,
        source: &Path,
    ) -> Self {
        // End-of-turn tokens of the common chat formats stop generation too.
        let mut stop_ids: Vec<u32> = eos.iter().map(|(id, _)| *id).collect();
        let named = ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "</s>"];
        for id in also_stop.into_iter().chain(named.iter().filter_map(|t| inner.token_to_id(t))) {
            if !stop_ids.contains(&id) {
                stop_ids.push(id);
            }
        }
        let byte_level = inner
            .get_decoder()
            .and_then(|d| serde_json::to_string(d).ok())
            .is_some_and(|d| d.contains("\"ByteLevel\""));
        let added = inner.get_added_tokens_decoder().into_keys().collect();
        Self {
            inner,
            vocab,
            chat_template,
            chat_kwargs: serde_json::Map::new(),
            bos,
            eos,
            stop_ids,
            add_bos,
            source: source.to_path_buf(),
            byte_level,
            added,
        }
    }

    /// The bytes token `id` stands for (OpenAI's `bytes` of a log-probability): a byte-level
    /// BPE token's string read through GPT-2's byte table; a SentencePiece token's with `▁` as a
    /// space and `<0xNN>` as the byte NN; an added token's string as it is. A token may hold
    /// part of a UTF-8 character. An id outside the vocabulary has no bytes.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(s) = self.vocab.get(id as usize) else { return Vec::new() };
        if self.added.contains(&id) {
            return s.as_bytes().to_vec();
        }
        if self.byte_level {
            let table = gpt2_unicode_to_byte();
            if let Some(bytes) = s.chars().map(|c| table.get(&c).copied()).collect::<Option<Vec<u8>>>() {
                return bytes;
            }
            return s.as_bytes().to_vec();
        }
        if let Some(b) = s.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')).filter(|h| h.len() == 2) {
            if let Ok(b) = u8::from_str_radix(b, 16) {
                return vec![b];
            }
        }
        s.replace('\u{2581}', " ").into_bytes()
    }

    /// [`Self::token_bytes`] as text, a partial UTF-8 character shown as U+FFFD (OpenAI's
    /// `token` of a log-probability).
    pub fn token_text(&self, id: u32) -> String {
        String::from_utf8_lossy(&self.token_bytes(id)).into_owned()
    }

    /// Where the tokenizer came from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Token strings by id.
    pub fn vocab(&self) -> &[String] {
        &self.vocab
    }

    /// Whether `id` ends generation (EOS or an end-of-turn token).
    pub fn is_stop(&self, id: u32) -> bool {
        self.stop_ids.contains(&id)
    }

    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// Token ids of `text` (special tokens written in the text are recognised); the BOS token
    /// is put first when the model asks for it and the text does not already start with it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(|e| err(&self.source, format!("tokenization failed: {e}")))?;
        let mut ids = enc.get_ids().to_vec();
        if let Some((bos, _)) = &self.bos {
            if self.add_bos && ids.first() != Some(bos) {
                ids.insert(0, *bos);
            }
        }
        Ok(ids)
    }

    /// Text of `ids`, special tokens left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(|e| err(&self.source, format!("detokenization failed: {e}")))
    }

    /// Renders the chat template for one user turn (with an optional system prompt) followed
    /// by the generation prompt.
    pub fn apply_chat_template(&self, user: &str, system: Option<&str>) -> Result<String> {
        self.apply_chat_conversation(&[("user", user)], system)
    }

    /// Renders the chat template for a conversation of `(role, content)` messages (`user` and
    /// `assistant` alternating, the last one `user`) after an optional system prompt, followed
    /// by the generation prompt: how a multi-turn benchmark asks its second turn.
    pub fn apply_chat_conversation(&self, turns: &[(&str, &str)], system: Option<&str>) -> Result<String> {
        self.apply_chat_conversation_with(turns, system, &serde_json::Map::new())
    }

    /// Sets the extra variables of every chat template rendering (vLLM's
    /// `chat_template_kwargs`, e.g. `{"enable_thinking": false}` for Qwen3). The variables the
    /// renderer sets itself (`messages`, `add_generation_prompt`, `bos_token`, `eos_token`)
    /// cannot be given.
    pub fn set_chat_template_kwargs(&mut self, kwargs: serde_json::Map<String, Value>) -> Result<()> {
        check_chat_kwargs(&kwargs).map_err(|e| err(&self.source, e))?;
        self.chat_kwargs = kwargs;
        Ok(())
    }

    /// [`Self::apply_chat_conversation`] with the variables `extra` added to (and replacing)
    /// those set by [`Self::set_chat_template_kwargs`].
    pub fn apply_chat_conversation_with(
        &self,
        turns: &[(&str, &str)],
        system: Option<&str>,
        extra: &serde_json::Map<String, Value>,
    ) -> Result<String> {
        check_chat_kwargs(extra).map_err(|e| err(&self.source, e))?;
        let mut kwargs = self.chat_kwargs.clone();
        kwargs.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        let template = self.chat_template.as_deref().ok_or_else(|| {
            err(&self.source, "the model has no chat template (tokenizer.chat_template / chat_template); drop --chat")
        })?;
        let mut messages = Vec::new();
        if let Some(s) = system {
            messages.push(json!({"role": "system", "content": s}));
        }
        for (role, content) in turns {
            messages.push(json!({"role": role, "content": content}));
        }
        render_chat_with(
            template,
            &messages,
            self.bos.as_ref().map(|b| b.1.as_str()),
            self.eos.as_ref().map(|e| e.1.as_str()),
            &kwargs,
        )
        .map_err(|e| err(&self.source, format!("chat template: {e}")))
    }
}

/// `--chat-template-kwargs`: a JSON object of extra chat template variables.
pub fn parse_chat_template_kwargs(text: &str) -> std::result::Result<serde_json::Map<String, Value>, String> {
    let kwargs = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => map,
        Ok(other) => {
            return Err(format!("expected a JSON object such as '{{\"enable_thinking\": false}}', got {other}"))
        }
        Err(e) => return Err(format!("not valid JSON: {e}")),
    };
    check_chat_kwargs(&kwargs)?;
    Ok(kwargs)
}

/// The variables a chat template's renderer sets itself.
const RESERVED_CHAT_VARIABLES: [&str; 4] = ["messages", "add_generation_prompt", "bos_token", "eos_token"];

/// Chat template variables given by the user may not be the renderer's own.
fn check_chat_kwargs(kwargs: &serde_json::Map<String, Value>) -> std::result::Result<(), String> {
    match kwargs.keys().find(|k| RESERVED_CHAT_VARIABLES.contains(&k.as_str())) {
        Some(k) => Err(format!("chat template variable `{k}` is set by mdsd itself and cannot be given")),
        None => Ok(()),
    }
}

/// GPT-2's byte-level table read backwards: the printable character standing for each byte.
/// Bytes that are printable (`!`..`~`, `¡`..`¬`, `®`..`ÿ`) stand for themselves; the others
/// are the characters from U+0100 on, in byte order.
fn gpt2_unicode_to_byte() -> &'static std::collections::HashMap<char, u8> {
    static TABLE: std::sync::OnceLock<std::collections::HashMap<char, u8>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        let mut next = 256u32;
        (0..=255u8)
            .map(|b| {
                if printable(b) {
                    (char::from(b), b)
                } else {
                    let c = char::from_u32(next).expect("U+0100..U+0143 are characters");
                    next += 1;
                    (c, b)
                }
            })
            .collect()
    })
}

/// Renders a Hugging Face chat template with transformers' settings.
pub fn render_chat(
    template: &str,
    messages: &[Value],
    bos_token: Option<&str>,
    eos_token: Option<&str>,
) -> std::result::Result<String, String> {
    render_chat_with(template, messages, bos_token, eos_token, &serde_json::Map::new())
}

/// [`render_chat`] with the extra template variables `kwargs` (as transformers'
/// `apply_chat_template(..., **kwargs)`).
pub fn render_chat_with(
    template: &str,
    messages: &[Value],
    bos_token: Option<&str>,
    eos_token: Option<&str>,
    kwargs: &serde_json::Map<String, Value>,
) -> std::result::Result<String, String> {
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
        Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", |format: String| strftime::strftime(&format, strftime::now_unix()));
    env.add_template("chat", template).map_err(|e| e.to_string())?;
    let tmpl = env.get_template("chat").map_err(|e| e.to_string())?;
    let mut context = kwargs.clone();
    context.insert("messages".into(), Value::Array(messages.to_vec()));
    context.insert("add_generation_prompt".into(), Value::Bool(true));
    context.insert("bos_token".into(), Value::String(bos_token.unwrap_or("").into()));
    context.insert("eos_token".into(), Value::String(eos_token.unwrap_or("").into()));
    tmpl.render(minijinja::Value::from_serialize(&context)).map_err(|e| format!("{e:#}"))
}

/// Checks that a draft tokenizer's vocabulary matches the target's: equal, or a prefix of it
/// (the target padded with extra ids, as Qwen2-7B's 152,064; those get q = 0).
pub fn check_vocabularies(target: &[String], draft: &[String], target_src: &Path, draft_src: &Path) -> Result<()> {
    if draft.len() > target.len() {
        return Err(Error::Config(format!(
            "vocabulary mismatch: the draft {} has {} tokens, more than the target {} ({})",
            draft_src.display(),
            draft.len(),
            target_src.display(),
            target.len()
        )));
    }
    if let Some(i) = (0..draft.len()).find(|&i| draft[i] != target[i]) {
        return Err(Error::Config(format!(
            "vocabulary mismatch: token {i} is {:?} in the draft {} but {:?} in the target {}",
            draft[i],
            draft_src.display(),
            target[i],
            target_src.display()
        )));
    }
    Ok(())
}

impl TextTokenizer {
    /// Where each of `ids`' texts begins in `text`, in characters, where `text` is `ids`
    /// decoded ([`Self::decode`]) or the text they were encoded from. A token advances by the
    /// text its detokenization completes ([`TokenStream`]; the first bytes of a character
    /// advance nothing, the token completing it advances past it); a special token, which
    /// decoding drops, advances by its own string where `text` has it at that point (a prompt
    /// that spelt it out) and by nothing otherwise (a BOS the encoder added, a decoded id
    /// prompt). No offset passes the end of `text`.
    pub fn char_offsets(&self, ids: &[u32], text: &str) -> Result<Vec<usize>> {
        let total = text.chars().count();
        let mut stream = TokenStream::default();
        let (mut byte, mut chars) = (0usize, 0usize);
        let mut offsets = Vec::with_capacity(ids.len());
        for &id in ids {
            offsets.push(chars.min(total));
            match stream.push(self, id)? {
                Some(piece) => {
                    byte += piece.len();
                    chars += piece.chars().count();
                }
                None if self.added.contains(&id) => {
                    let s = self.vocab.get(id as usize).map_or("", String::as_str);
                    if !s.is_empty() && text.get(byte..).is_some_and(|rest| rest.starts_with(s)) {
                        byte += s.len();
                        chars += s.chars().count();
                    }
                }
                None => {}
            }
        }
        Ok(offsets)
    }
}

/// Incremental detokenization: pushes token ids and returns the newly completed text (text is
/// held back while it ends in an incomplete UTF-8 sequence).
#[derive(Debug, Default)]
pub struct TokenStream {
    ids: Vec<u32>,
    prefix_index: usize,
    read_index: usize,
}

impl TokenStream {
    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let prefix = tok.decode(&self.ids[self.prefix_index..self.read_index])?;
        let text = tok.decode(&self.ids[self.prefix_index..])?;
        if text.len() > prefix.len() && !text.ends_with('\u{FFFD}') && text.is_char_boundary(prefix.len()) {
            let new = text[prefix.len()..].to_string();
            self.prefix_index = self.read_index;
            self.read_index = self.ids.len();
            Ok(Some(new))
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a BPE `tokenizer.json` with `vocab` (in id order), `decoder` and one added token
    /// after the vocabulary, and loads it.
    fn tokenizer(name: &str, vocab: &[&str], decoder: Value) -> TextTokenizer {
        let dir = std::env::temp_dir().join(format!("mdsd-tokenizer-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let map: serde_json::Map<String, Value> =
            vocab.iter().enumerate().map(|(i, t)| (t.to_string(), json!(i))).collect();
        let spec = json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{"id": vocab.len(), "content": "<|im_end|>", "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null,
            "decoder": decoder,
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": map, "merges": []}
        });
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, spec.to_string()).unwrap();
        let tok = TextTokenizer::from_file(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        tok
    }

    #[test]
    fn byte_level_tokens_map_back_to_their_bytes() {
        let decoder = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true});
        // "Ġhi" is " hi"; "Ċ" is "\n"; "Ã©" is é's two bytes, "Ã" alone its first.
        let tok = tokenizer("bytelevel", &["Ġhi", "Ċ", "Ã©", "Ã", "a"], decoder);
        assert_eq!(tok.token_bytes(0), b" hi");
        assert_eq!(tok.token_bytes(1), b"\n");
        assert_eq!(tok.token_bytes(2), "é".as_bytes());
        assert_eq!(tok.token_bytes(3), [0xC3]);
        assert_eq!(tok.token_bytes(5), b"<|im_end|>");
        assert!(tok.token_bytes(6).is_empty());
        // Every byte has one character and back.
        let table = gpt2_unicode_to_byte();
        assert_eq!(table.len(), 256);
        assert_eq!(table.values().copied().collect::<std::collections::HashSet<u8>>().len(), 256);
        assert_eq!(table[&'Ġ'], b' ');
        // The bytes of each token, concatenated, are the decoded text.
        let ids = [0u32, 1, 2];
        let bytes: Vec<u8> = ids.iter().flat_map(|&i| tok.token_bytes(i)).collect();
        assert_eq!(String::from_utf8(bytes).unwrap(), tok.decode(&ids).unwrap());
    }

    /// Offsets index the text the tokens came from or decode to: a special token spelt out in the
    /// text has its width, one decoding drops has none, and a character split over two tokens
    /// begins at the first.
    #[test]
    fn char_offsets_index_the_text() {
        let decoder = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true});
        // 0 "a", 1 " hi", 2 é's first byte, 3 its second, 4 "b"; 5 is <|im_end|>.
        let tok = tokenizer("offsets", &["a", "Ġhi", "Ã", "©", "b"], decoder);
        let ids = [0u32, 5, 1, 2, 3, 4];
        assert_eq!(tok.decode(&ids).unwrap(), "a hié".to_string() + "b");
        assert_eq!(tok.char_offsets(&ids, "a hiéb").unwrap(), [0, 1, 1, 4, 4, 5]);
        assert_eq!(tok.char_offsets(&ids, "a<|im_end|> hiéb").unwrap(), [0, 1, 11, 14, 14, 15]);
        // A text shorter than the tokens: offsets stop at its end.
        assert_eq!(tok.char_offsets(&[0, 4, 4], "ab").unwrap(), [0, 1, 2]);
        assert_eq!(tok.char_offsets(&[0, 4, 4, 4], "ab").unwrap(), [0, 1, 2, 2]);
        assert!(tok.char_offsets(&[], "").unwrap().is_empty());
    }

    #[test]
    fn sentencepiece_tokens_map_spaces_and_byte_fallbacks() {
        let decoder = json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]});
        let tok = tokenizer("sentencepiece", &["\u{2581}hello", "<0x0A>", "<0xE2>", "x"], decoder);
        assert_eq!(tok.token_bytes(0), b" hello");
        assert_eq!(tok.token_bytes(1), b"\n");
        assert_eq!(tok.token_bytes(2), [0xE2]);
        assert_eq!(tok.token_bytes(3), b"x");
    }

    /// LLaMA 3.2's date line: with `strftime_now` (transformers gives templates this function)
    /// today's date, not the template's fallback.
    #[test]
    fn chat_templates_get_today_from_strftime_now() {
        let template = r#"{%- if strftime_now is defined %}{%- set date_string = strftime_now("%d %b %Y") %}{%- else %}{%- set date_string = "26 Jul 2024" %}{%- endif %}Today Date: {{ date_string }}"#;
        let before = strftime::strftime("%d %b %Y", strftime::now_unix());
        let text = render_chat(template, &[], None, None).unwrap();
        let after = strftime::strftime("%d %b %Y", strftime::now_unix());
        assert!(text == format!("Today Date: {before}") || text == format!("Today Date: {after}"), "{text}");
        assert_ne!(text, "Today Date: 26 Jul 2024");
    }

    /// The Jinja constructs of Qwen3-style templates (reverse slicing, `namespace` attributes set
    /// in a loop, `loop.index0`, `is string`, Python's `startswith`, `endswith`, `split`,
    /// `strip`, `lstrip`, `rstrip`, `dict.get`, an undefined `enable_thinking`) render as
    /// jinja2 3.1.6 renders them (the expected text was printed by jinja2 with transformers'
    /// settings, `trim_blocks` and `lstrip_blocks`).
    #[test]
    fn qwen3_style_templates_render_as_jinja2_does() {
        let template = r#"{%- set ns = namespace(last_user=messages|length - 1, seen=false) %}
{%- for m in messages[::-1] %}
    {%- set i = (messages|length - 1) - loop.index0 %}
    {%- if not ns.seen and m.role == "user" and m.content is string and not (m.content.startswith('<tool>') and m.content.endswith('</tool>')) %}
        {%- set ns.seen = true %}
        {%- set ns.last_user = i %}
    {%- endif %}
{%- endfor %}
{%- for m in messages %}
    {%- set content = m.get('content', '') %}
    {%- if m.role == 'assistant' and '</think>' in content %}
        {%- set thought = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
        {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- if loop.index0 > ns.last_user %}
            {{- '<|im_start|>' + m.role + '\n<think>\n' + thought.strip('\n') + '\n</think>\n\n' + content + '<|im_end|>\n' }}
        {%- else %}
            {{- '<|im_start|>' + m.role + '\n' + content + '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>' + m.role + '\n' + content|trim + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"#;
        let messages: Vec<Value> = [
            ("system", "Be brief."),
            ("user", "  Hi  "),
            ("assistant", "<think>\nold thought\n</think>\n\nHello."),
            ("user", "Sum 2+2?"),
            ("assistant", "<think>\n\nadd them\n\n</think>\n\n4"),
            ("user", "<tool>x</tool>"),
        ]
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
        let jinja2 = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nSum 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nadd them\n</think>\n\n4<|im_end|>\n<|im_start|>user\n<tool>x</tool><|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(render_chat(template, &messages, None, None).unwrap(), jinja2);
    }

    /// Extra template variables (vLLM's `chat_template_kwargs`): Qwen3's `enable_thinking`
    /// false closes an empty thinking block; the renderer's own variables cannot be given.
    #[test]
    fn chat_template_kwargs_reach_the_template() {
        let template = "{% for m in messages %}{{ m.content }};{% endfor %}<a>{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}";
        let messages = [json!({"role": "user", "content": "hi"})];
        let plain = render_chat(template, &messages, None, None).unwrap();
        assert_eq!(plain, "hi;<a>");
        let mut kwargs = serde_json::Map::new();
        kwargs.insert("enable_thinking".into(), json!(false));
        assert_eq!(render_chat_with(template, &messages, None, None, &kwargs).unwrap(), "hi;<a><think></think>");
        kwargs.insert("enable_thinking".into(), json!(true));
        assert_eq!(render_chat_with(template, &messages, None, None, &kwargs).unwrap(), plain);
        let mut reserved = serde_json::Map::new();
        reserved.insert("messages".into(), json!([]));
        assert!(check_chat_kwargs(&reserved).unwrap_err().contains("`messages`"));
    }
}
