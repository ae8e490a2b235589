//! OpenAI's `logprobs` for `mdsd serve`: which requests ask for them, and the objects that
//! carry them. The values are the target's ([`engine::decode::logprobs`]: temperature 1, before top-k
//! and top-p), for the tokens whose text the answer shows ([`TextStops::tokens_shown`]).
//!
//! - `/v1/completions`: `logprobs: N` (0-20) gives `{tokens, token_logprobs, top_logprobs,
//!   text_offset}`; each `top_logprobs` entry maps the N most probable tokens' texts, and the
//!   chosen token's, to their log-probabilities (as vLLM does).
//! - `/v1/chat/completions`: `logprobs: true` with `top_logprobs: N` (0-20) gives
//!   `{content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}`.
//!
//! Streamed, each event carries the entries of the tokens its text completes.

use super::request::{refuse, Kind, Refusal};
use engine::decode::logprobs::{TokenLogprobs, MAX_TOP_LOGPROBS};
use engine::decode::stop::TextStops;
use engine::tokenizer::TextTokenizer;
use serde_json::{json, Map, Value};

/// The alternatives per token a request asks for (`None`: no log-probabilities).
pub(super) fn requested(
    kind: Kind,
    logprobs: &Option<Value>,
    top_logprobs: Option<usize>,
) -> Result<Option<usize>, Refusal> {
    let in_range = |name: &str, n: u64| -> Result<usize, Refusal> {
        if n as usize > MAX_TOP_LOGPROBS {
            return refuse(400, format!("{name}: at most {MAX_TOP_LOGPROBS}"));
        }
        Ok(n as usize)
    };
    match kind {
        Kind::Text => {
            if top_logprobs.is_some() {
                return refuse(400, "top_logprobs: a chat completion field; completions take logprobs: N");
            }
            match logprobs {
                None | Some(Value::Null) => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(n) => in_range("logprobs", n).map(Some),
                    None => refuse(400, "logprobs: an integer from 0 to 20"),
                },
            }
        }
        Kind::Chat => {
            let on = match logprobs {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return refuse(400, "logprobs: true or false (top_logprobs gives the alternatives)"),
            };
            match (on, top_logprobs) {
                (false, Some(_)) => refuse(400, "top_logprobs: needs logprobs: true"),
                (false, None) => Ok(None),
                (true, n) => in_range("top_logprobs", n.unwrap_or(0) as u64).map(Some),
            }
        }
    }
}

/// The log-probabilities of a streamed answer: gathered as tokens come, handed out with the
/// text they belong to.
pub(super) struct Gathered {
    records: Vec<TokenLogprobs>,
    sent: usize,
    /// Characters before the answer in the returned text (an echoed prompt).
    shift: usize,
}

impl Gathered {
    pub(super) fn new(shift: usize) -> Self {
        Self { records: Vec::new(), sent: 0, shift }
    }

    pub(super) fn extend(&mut self, records: &[TokenLogprobs]) {
        self.records.extend_from_slice(records);
    }

    /// The entries not handed out yet whose text is shown now (all of the answer's once
    /// `finished`); `None` when there are none.
    pub(super) fn next(&mut self, kind: Kind, tok: &TextTokenizer, text: &TextStops, finished: bool) -> Option<Value> {
        let shown = text.tokens_shown(self.records.len(), finished).max(self.sent);
        if shown == self.sent {
            return None;
        }
        let value = format(kind, tok, text, &self.records[self.sent..shown], self.sent, self.shift);
        self.sent = shown;
        Some(value)
    }
}

/// The `logprobs` object of `records`, the generated tokens from index `first` on, whose text
/// follows `shift` characters of echoed prompt.
pub(super) fn format(
    kind: Kind,
    tok: &TextTokenizer,
    text: &TextStops,
    records: &[TokenLogprobs],
    first: usize,
    shift: usize,
) -> Value {
    let string = |id: u32| tok.token_text(id);
    match kind {
        Kind::Text => {
            let tops: Vec<Value> = records.iter().map(|r| top_object(tok, r)).collect();
            json!({
                "tokens": records.iter().map(|r| string(r.token)).collect::<Vec<_>>(),
                "token_logprobs": records.iter().map(|r| r.logprob).collect::<Vec<_>>(),
                "top_logprobs": tops,
                "text_offset": (first..first + records.len()).map(|i| shift + text.char_offset(i)).collect::<Vec<_>>(),
            })
        }
        Kind::Chat => {
            let entry = |id: u32, lp: f32| json!({"token": string(id), "logprob": lp, "bytes": tok.token_bytes(id)});
            let content: Vec<Value> = records
                .iter()
                .map(|r| {
                    let mut e = entry(r.token, r.logprob);
                    e["top_logprobs"] = r.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
                    e
                })
                .collect();
            json!({"content": content, "refusal": null})
        }
    }
}

/// A completion record's `top_logprobs` entry: the alternatives' and the chosen token's texts
/// with their log-probabilities.
fn top_object(tok: &TextTokenizer, r: &TokenLogprobs) -> Value {
    let mut top = Map::new();
    for &(id, lp) in r.top.iter().chain([&(r.token, r.logprob)]) {
        top.entry(tok.token_text(id)).or_insert(json!(lp));
    }
    Value::Object(top)
}

/// A completion's `logprobs` with the echoed prompt's tokens first: the first token has no
/// log-probability (`null`), each later one its record from the prompt pass (`records`, one per
/// token after the first); the prompt's offsets index `echo`, the prompt's text as returned
/// ([`TextTokenizer::char_offsets`]: special tokens it does not show take no room).
pub(super) fn with_prompt(
    tok: &TextTokenizer,
    ids: &[u32],
    echo: &str,
    records: &[TokenLogprobs],
    answer: Value,
) -> Value {
    let strings: Vec<String> = ids.iter().map(|&id| tok.token_text(id)).collect();
    // Decoding ran on these ids when the prompt was read; an error here cannot name anything new.
    let offsets = tok.char_offsets(ids, echo).unwrap_or_else(|_| vec![0; ids.len()]);
    let none = std::iter::once(Value::Null);
    let mut prompt = json!({
        "tokens": strings,
        "token_logprobs": none.clone().chain(records.iter().map(|r| json!(r.logprob))).collect::<Vec<_>>(),
        "top_logprobs": none.chain(records.iter().map(|r| top_object(tok, r))).collect::<Vec<_>>(),
        "text_offset": offsets,
    });
    for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        if let (Some(p), Some(a)) = (prompt[key].as_array_mut(), answer[key].as_array()) {
            p.extend(a.iter().cloned());
        }
    }
    prompt
}
