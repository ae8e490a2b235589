//! `mdsd tokenize`: the target's token ids for a text, a file, or JSON lines on standard input,
//! and the text of token ids (`--decode`), with the tokenizer `generate` uses. Only the
//! tokenizer is read (a GGUF file's header, or a folder's `tokenizer.json`), not the weights.
//! Part of the `mdsd` binary (`main.rs`).

use anyhow::{bail, Context};
use clap::Args;
use engine::load::load_tokenizer;
use engine::tokenizer::TextTokenizer;
use serde_json::{json, Value};
use std::io::{BufRead, Write};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// The text to tokenize.
    #[arg(long, conflicts_with_all = ["prompt_file", "jsonl", "decode"])]
    prompt: Option<String>,
    /// Read the text to tokenize from a file (`-`: standard input).
    #[arg(long, conflicts_with_all = ["jsonl", "decode"])]
    prompt_file: Option<PathBuf>,
    /// Read texts from standard input, one per line: a JSON string, or a conversation (a JSON
    /// list of `{"role", "content"}` messages, rendered with the chat template and its
    /// generation prompt); write each one's token ids as a JSON array on a line of its own.
    #[arg(long, conflicts_with = "decode")]
    jsonl: bool,
    /// Token ids (separated by spaces or commas) to turn back into text, as `generate` prints
    /// it (special tokens left out).
    #[arg(long)]
    decode: Option<String>,
    /// Wrap the text in the model's chat template (one user turn), as `generate --chat` does.
    #[arg(long, conflicts_with = "decode")]
    chat: bool,
    /// System prompt for --chat (default: the template's own).
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Extra variables for the chat template, a JSON object, as for `generate`.
    #[arg(long, value_name = "JSON", value_parser = engine::tokenizer::parse_chat_template_kwargs)]
    chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Print one JSON object: `ids`, `tokens` (each id's text) and `count`; with --decode,
    /// `text`.
    #[arg(long, conflicts_with = "jsonl")]
    json: bool,
    /// Model pair (a manifest in models/) whose target's tokenizer is used, unless --target
    /// is given.
    #[arg(long, default_value = "qwen2.5-coder-1.5b-0.5b")]
    pair: String,
    /// Target model: a .gguf file, a Hugging Face model folder, or a hub id, as for
    /// `generate`.
    #[arg(long)]
    target: Option<String>,
    /// A tokenizer.json overriding the target's.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Folder of the model-pair manifests.
    #[arg(long)]
    models_dir: Option<PathBuf>,
}

pub fn tokenize(args: TokenizeArgs) -> anyhow::Result<()> {
    if args.prompt.is_none() && args.prompt_file.is_none() && !args.jsonl && args.decode.is_none() {
        bail!("give a text with --prompt TEXT or --prompt-file FILE, JSON lines on standard input with --jsonl, or ids with --decode IDS");
    }
    let path = crate::models::target_path(args.target.as_deref(), &args.pair, args.models_dir.as_deref())?;
    let mut tok = load_tokenizer(&path, args.tokenizer.as_deref())?;
    if let Some(kwargs) = &args.chat_template_kwargs {
        tok.set_chat_template_kwargs(kwargs.clone())?;
    }
    let mut out = std::io::stdout().lock();
    if let Some(ids) = &args.decode {
        let ids = parse_ids(ids, tok.vocab().len())?;
        let text = tok.decode(&ids)?;
        if args.json {
            writeln!(out, "{}", json!({ "text": text }))?;
        } else {
            writeln!(out, "{text}")?;
        }
        return Ok(());
    }
    if args.jsonl {
        for (i, line) in std::io::stdin().lock().lines().enumerate() {
            let line = line.context("reading standard input")?;
            if line.trim().is_empty() {
                continue;
            }
            let ids = line_text(&tok, &line, args.chat, args.system.as_deref())
                .and_then(|text| Ok(tok.encode(&text)?))
                .with_context(|| format!("standard input, line {}", i + 1))?;
            writeln!(out, "{}", Value::from(ids))?;
        }
        return Ok(());
    }
    let text = match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => crate::cli::read_prompt_file(f)?,
        (None, None) => unreachable!("checked above"),
    };
    let ids = encode(&tok, &text, &args)?;
    if args.json {
        let tokens: Vec<String> = ids.iter().map(|&id| tok.token_text(id)).collect();
        writeln!(out, "{}", json!({ "ids": ids, "tokens": tokens, "count": ids.len() }))?;
    } else {
        let line: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "{}", line.join(" "))?;
    }
    Ok(())
}

/// `text`'s ids, through the chat template with --chat.
fn encode(tok: &TextTokenizer, text: &str, args: &TokenizeArgs) -> anyhow::Result<Vec<u32>> {
    let text = if args.chat { tok.apply_chat_template(text, args.system.as_deref())? } else { text.to_string() };
    Ok(tok.encode(&text)?)
}

/// The text of one `--jsonl` line (of `tokenize` and `generate`): a JSON string, through the
/// chat template with `system` when `chat`; or a conversation, a JSON list of `{"role",
/// "content"}` messages, through the chat template with the assistant's turn opened (its
/// system turn, if any, is among its messages).
pub(crate) fn line_text(tok: &TextTokenizer, line: &str, chat: bool, system: Option<&str>) -> anyhow::Result<String> {
    match serde_json::from_str::<Value>(line) {
        Ok(Value::String(text)) if chat => Ok(tok.apply_chat_template(&text, system)?),
        Ok(Value::String(text)) => Ok(text),
        Ok(Value::Array(messages)) => Ok(tok.apply_chat_conversation(&chat_turns(&messages)?, None)?),
        _ => bail!("not a JSON string nor a list of messages"),
    }
}

/// The `(role, content)` turns of a JSON list of `{"role": TEXT, "content": TEXT}` messages.
fn chat_turns(messages: &[Value]) -> anyhow::Result<Vec<(&str, &str)>> {
    messages
        .iter()
        .map(|m| match (m["role"].as_str(), m["content"].as_str()) {
            (Some(role), Some(content)) => Ok((role, content)),
            _ => Err(anyhow::anyhow!("a message is not {{\"role\": TEXT, \"content\": TEXT}}: {m}")),
        })
        .collect()
}

/// Token ids separated by spaces or commas, each below `vocab`.
fn parse_ids(s: &str, vocab: usize) -> anyhow::Result<Vec<u32>> {
    s.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|p| !p.is_empty())
        .map(|p| {
            let id: u32 = p.parse().with_context(|| format!("--decode: `{p}` is not a token id"))?;
            if id as usize >= vocab {
                bail!("--decode: token id {id} is beyond the vocabulary of {vocab} tokens");
            }
            Ok(id)
        })
        .collect()
}
