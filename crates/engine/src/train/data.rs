//! Training texts for an EAGLE head: (prompt, answer) pairs from the prompt sets in
//! `../shared/data` and from answers the target itself wrote, tokenized through the target's
//! chat template with the answer's first token marked (the loss covers the answer only, as
//! EAGLE-1's `loss_mask` does).
//!
//! EAGLE-1 trains on fixed ShareGPT answers; here the fixed answers are Alpaca's outputs,
//! CNN/DailyMail's highlights and WMT'14's English references, and the target's own answers
//! to Spec-Bench (without its MT-Bench questions), EAGLE's Alpaca prompts and the Alpaca
//! sample's instructions ([`alpaca_items`]).
//! MT-Bench is never trained on: it is the evaluation.

use crate::tokenizer::TextTokenizer;
use crate::{file_error, Result};
use std::ops::Range;
use std::path::Path;

/// One training text: a user prompt and the answer the head learns to draft.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Conversation {
    /// Where it came from (`alpaca`, `cnndm`, `wmt14`, `self/spec_bench/qa`, ...).
    pub source: String,
    pub prompt: String,
    pub answer: String,
}

/// How many items each fixed source gives, and how long an article may be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SourceLimits {
    pub alpaca: usize,
    pub cnndm: usize,
    pub wmt14: usize,
    /// CNN/DailyMail articles are cut to this many characters (at a word boundary).
    pub article_chars: usize,
}

impl Default for SourceLimits {
    fn default() -> Self {
        Self { alpaca: 500, cnndm: 250, wmt14: 1000, article_chars: 2000 }
    }
}

fn read_jsonl(path: &Path) -> Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path).map_err(|e| file_error(path, format!("cannot read: {e}")))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| file_error(path, format!("line {}: not JSON: {e}", i + 1))))
        .collect()
}

fn field<'a>(v: &'a serde_json::Value, name: &str, path: &Path, line: usize) -> Result<&'a str> {
    v.get(name)
        .and_then(|f| f.as_str())
        .ok_or_else(|| file_error(path, format!("line {}: no text field `{name}`", line + 1)))
}

/// The fixed-answer conversations of the prompt sets in `dir` (`alpaca_sample.jsonl`,
/// `cnndm_frank_test.jsonl`, `wmt14_deen_test.jsonl`), the first items of each as `limits` says.
pub fn fixed_conversations(dir: &Path, limits: &SourceLimits) -> Result<Vec<Conversation>> {
    let mut out: Vec<Conversation> = alpaca_items(dir, limits.alpaca)?
        .into_iter()
        .map(|(prompt, answer)| Conversation { source: "alpaca".into(), prompt, answer })
        .collect();
    let path = dir.join("cnndm_frank_test.jsonl");
    for (i, v) in read_jsonl(&path)?.iter().take(limits.cnndm).enumerate() {
        let article = cut_at_word(field(v, "article", &path, i)?, limits.article_chars);
        let highlights = field(v, "highlights_tokenized", &path, i).or_else(|_| field(v, "highlights", &path, i))?;
        out.push(Conversation {
            source: "cnndm".into(),
            prompt: format!("Summarize the following article in a few sentences.\n\n{article}"),
            answer: detokenize_highlights(highlights),
        });
    }
    let path = dir.join("wmt14_deen_test.jsonl");
    for (i, v) in read_jsonl(&path)?.iter().take(limits.wmt14).enumerate() {
        out.push(Conversation {
            source: "wmt14".into(),
            prompt: format!("Translate German to English: {}", field(v, "de", &path, i)?),
            answer: field(v, "en", &path, i)?.to_string(),
        });
    }
    Ok(out)
}

/// The first `n` items of `dir/alpaca_sample.jsonl` as `(prompt, output)`: the instruction,
/// followed by its input after a blank line when it has one.
pub fn alpaca_items(dir: &Path, n: usize) -> Result<Vec<(String, String)>> {
    let path = dir.join("alpaca_sample.jsonl");
    let mut out = Vec::new();
    for (i, v) in read_jsonl(&path)?.iter().take(n).enumerate() {
        let (instruction, input) = (field(v, "instruction", &path, i)?, v.get("input").and_then(|x| x.as_str()));
        let prompt = match input {
            Some(inp) if !inp.trim().is_empty() => format!("{instruction}\n\n{inp}"),
            _ => instruction.to_string(),
        };
        out.push((prompt, field(v, "output", &path, i)?.to_string()));
    }
    Ok(out)
}

/// The first user turns of a question file (`turns` lists, as Spec-Bench and MT-Bench have
/// them), with their `category`, optionally leaving out some categories, and keeping of each
/// category the questions whose place among that category's questions (from 0, in file order)
/// lies in `per_category`: `0..n` keeps the first `n`, `n..n + m` the `m` after them.
pub fn first_turns(path: &Path, skip: &[&str], per_category: Range<usize>) -> Result<Vec<(String, String)>> {
    let mut counts = std::collections::HashMap::<String, usize>::new();
    let mut out = Vec::new();
    for (i, v) in read_jsonl(path)?.iter().enumerate() {
        let category = v.get("category").and_then(|c| c.as_str()).unwrap_or("none").to_string();
        if skip.contains(&category.as_str()) {
            continue;
        }
        let turn = v
            .get("turns")
            .and_then(|t| t.get(0))
            .and_then(|t| t.as_str())
            .ok_or_else(|| file_error(path, format!("line {}: no `turns` list of texts", i + 1)))?;
        let n = counts.entry(category.clone()).or_default();
        if per_category.contains(n) {
            out.push((category, turn.to_string()));
        }
        *n += 1;
    }
    Ok(out)
}

/// MT-Bench's eight categories: left out of every training set.
pub const MT_BENCH_CATEGORIES: [&str; 8] =
    ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"];

/// `text` cut to at most `chars` characters, at the last space before the cut.
fn cut_at_word(text: &str, chars: usize) -> &str {
    match text.char_indices().nth(chars) {
        None => text,
        Some((end, next)) if next.is_whitespace() => &text[..end],
        Some((end, _)) => {
            let head = &text[..end];
            &head[..head.rfind(' ').unwrap_or(end)]
        }
    }
}

/// CNN/DailyMail's tokenized highlights (`word , word .`) as plain sentences.
fn detokenize_highlights(text: &str) -> String {
    let mut s = text.replace("`` ", "\"").replace(" ''", "\"").replace("-lrb- ", "(").replace(" -rrb-", ")");
    s = s.replace(" .", ".").replace(" ,", ",").replace(" '", "'").replace(" n't", "n't");
    s.trim().to_string()
}

/// A conversation as token ids: the chat template's rendering of the prompt with its
/// generation prompt, then the answer and the end-of-turn token; `answer_start` is the index
/// of the answer's first token.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TokenizedConversation {
    pub tokens: Vec<u32>,
    pub answer_start: usize,
}

/// Tokenizes `c` for `tokenizer` (see [`TokenizedConversation`]), cut to `max_len` tokens;
/// `None` when the prompt leaves fewer than 2 answer tokens in `max_len`.
pub fn tokenize(tokenizer: &TextTokenizer, c: &Conversation, max_len: usize) -> Result<Option<TokenizedConversation>> {
    let prompt = tokenizer.apply_chat_template(&c.prompt, None)?;
    let mut tokens = tokenizer.encode(&prompt)?;
    let answer_start = tokens.len();
    // The answer alone, without a BOS: the rendered prompt ends with the assistant header and a
    // newline, so the split costs no merge.
    let answer = tokenizer.encode(&c.answer)?;
    let bos = tokenizer.encode("")?;
    tokens.extend(answer.iter().skip(usize::from(!bos.is_empty() && answer.first() == bos.first())));
    if let Some(&end) = tokenizer.stop_ids().first() {
        tokens.push(end);
    }
    tokens.truncate(max_len);
    Ok((tokens.len() >= answer_start + 2).then_some(TokenizedConversation { tokens, answer_start }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn articles_are_cut_at_a_word_and_highlights_read_as_text() {
        assert_eq!(cut_at_word("one two three", 9), "one two");
        assert_eq!(cut_at_word("short", 100), "short");
        assert_eq!(detokenize_highlights("He did n't go , said `` Bob '' ."), "He didn't go, said \"Bob\".");
    }
}
