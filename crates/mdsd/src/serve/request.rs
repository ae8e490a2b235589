//! A completion request checked before it runs: OpenAI's fields (and vLLM's `ignore_eos`,
//! `chat_template_kwargs`), its prompts tokenized, its generation settings with the server's
//! defaults where unset; or the status and message that refuse it.

use super::{logprobs, refused};
use crate::cli::GenerateArgs;
use crate::session::Session;
use engine::decode::penalties::Penalties;
use engine::decode::stop::StopStrings;
use engine::decode::GenerationConfig;
use engine::tokenizer::TextTokenizer;
use samplers::dist::Warp;
use serde::Deserialize;
use serde_json::Value;

/// The server's side of checking a request: the models, the flags' defaults, the penalty flags
/// (checked at start) and the positions of a slot's caches.
pub(super) struct Defaults<'s> {
    pub(super) session: &'s Session,
    pub(super) run: &'s GenerateArgs,
    pub(super) penalties: Penalties,
    pub(super) capacity: usize,
}

/// The most stop strings one request may give, and their longest.
const MAX_STOPS: usize = 16;
const MAX_STOP_CHARS: usize = 512;

/// A completion request: OpenAI's fields that change the output, and `ignore_eos` (as vLLM's).
/// Fields that would change the answer and are not implemented are refused (`serve::refused`);
/// others (`model`, `user`, ...) are ignored.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct CompletionRequest {
    /// A string, an array of strings, an array of token ids, or an array of such arrays.
    prompt: Option<Value>,
    messages: Option<Vec<ChatMessage>>,
    /// Extra chat template variables (vLLM's), over the server's `--chat-template-kwargs`.
    chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<usize>,
    min_p: Option<f64>,
    repetition_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    seed: Option<u64>,
    stream: bool,
    n: Option<usize>,
    stop: Option<Value>,
    ignore_eos: bool,
    /// Completions: the alternatives per token (an integer); chat: whether to return them.
    logprobs: Option<Value>,
    /// Chat: the alternatives per token.
    top_logprobs: Option<usize>,
    /// Token id (a string) to a bias in [-100, 100] added to its logit.
    logit_bias: Option<serde_json::Map<String, Value>>,
    echo: bool,
}

#[derive(Deserialize)]
pub(super) struct ChatMessage {
    role: String,
    /// A string, or an array of parts of which only `{"type": "text", "text": ...}` is supported.
    content: Value,
}

impl ChatMessage {
    pub(super) fn text(&self) -> Result<String, Refusal> {
        match &self.content {
            Value::String(s) => Ok(s.clone()),
            Value::Array(parts) => parts
                .iter()
                .map(|p| match (p["type"].as_str(), p["text"].as_str()) {
                    (Some("text"), Some(t)) => Ok(t),
                    _ => refuse(400, "messages: only text content parts are supported"),
                })
                .collect(),
            _ => refuse(400, "messages: content must be a string or an array of text parts"),
        }
    }
}

/// The text `messages` run as: through the chat template (with the extra variables
/// `kwargs`), the assistant's turn opened.
pub(super) fn chat_text(
    tok: &TextTokenizer,
    messages: &[ChatMessage],
    kwargs: Option<&serde_json::Map<String, Value>>,
) -> Result<String, Refusal> {
    let texts = messages.iter().map(ChatMessage::text).collect::<Result<Vec<String>, Refusal>>()?;
    let turns: Vec<(&str, &str)> = messages.iter().zip(&texts).map(|(m, t)| (m.role.as_str(), t.as_str())).collect();
    let none = serde_json::Map::new();
    tok.apply_chat_conversation_with(&turns, None, kwargs.unwrap_or(&none))
        .map_err(|e| Refusal(400, format!("messages: {e}")))
}

/// Token ids from a JSON list, each below `vocab` (`None` if one is not).
pub(super) fn token_ids(list: &[Value], vocab: usize) -> Option<Vec<u32>> {
    list.iter().map(|v| v.as_u64().filter(|&id| (id as usize) < vocab).map(|id| id as u32)).collect()
}

/// What a checked request asks beyond its prompt and generation settings.
pub(super) struct Checked {
    pub(super) stream: bool,
    pub(super) ignore_eos: bool,
    pub(super) stops: Vec<String>,
    /// Log-probabilities with this many alternatives per token.
    pub(super) logprobs: Option<usize>,
    /// Completions with `echo`: the prompt put before the answer (and scored, with `logprobs`).
    pub(super) echo: bool,
    /// Choices to generate, one after the other.
    pub(super) n: usize,
    /// Added to the logits of the target and the draft (the server's `--logit-bias` when the
    /// request sets none).
    pub(super) logit_bias: Vec<(u32, f32)>,
    /// Repetition, presence and frequency penalties (the server's flags where unset).
    pub(super) penalties: Penalties,
}

/// The most choices one request may ask for (`n`).
const MAX_CHOICES: usize = 16;

/// The largest request body read (413 above it): a prompt of the longest contexts and a
/// `logit_bias` over a whole vocabulary fit many times over.
pub(super) const MAX_BODY_BYTES: usize = 32 << 20;

/// The most prompts one completions request may batch.
const MAX_PROMPTS: usize = 64;

/// One prompt of a request: its tokens and its text (echoed with `echo`).
pub(super) struct Prompt {
    pub(super) ids: Vec<u32>,
    pub(super) text: String,
}

/// Which endpoint a request came to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Text,
    Chat,
}

/// A request refused with an HTTP status and a message.
pub(super) struct Refusal(pub(super) u16, pub(super) String);

pub(super) fn refuse<T>(status: u16, msg: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal(status, msg.into()))
}

/// Parses and checks a completion request: its prompts and generation settings.
pub(super) fn check(kind: Kind, body: &str, d: &Defaults) -> Result<(Checked, Vec<Prompt>, GenerationConfig), Refusal> {
    // Parsed once: the typed request, and the whole object for the refused fields.
    let json: Value = match serde_json::from_str(body) {
        Ok(v) => v,
        Err(e) => return refuse(400, format!("the body is not a valid request: {e}")),
    };
    let req = match CompletionRequest::deserialize(&json) {
        Ok(r) => r,
        Err(e) => return refuse(400, format!("the body is not a valid request: {e}")),
    };
    let n = req.n.unwrap_or(1);
    if !(1..=MAX_CHOICES).contains(&n) {
        return refuse(400, format!("n: from 1 to {MAX_CHOICES} choices"));
    }
    if req.echo && kind == Kind::Chat {
        return refuse(400, "echo: a completions field (chat completions do not echo the messages)");
    }
    let logprobs = logprobs::requested(kind, &req.logprobs, req.top_logprobs)?;
    let vocab = d.session.target.model.config().vocab_size;
    let logit_bias = match &req.logit_bias {
        None => d.run.logit_bias.clone(),
        Some(map) => map
            .iter()
            .map(|(id, bias)| match (id.parse::<u32>(), bias.as_f64()) {
                (Ok(id), Some(b)) if (id as usize) < vocab && (-100.0..=100.0).contains(&b) => Ok((id, b as f32)),
                _ => {
                    refuse(400, format!("logit_bias: {id}: {bias}: token ids below {vocab} to biases from -100 to 100"))
                }
            })
            .collect::<Result<_, _>>()?,
    };
    let defaults = d.penalties;
    let penalties = Penalties {
        repetition: req.repetition_penalty.unwrap_or(defaults.repetition),
        presence: req.presence_penalty.unwrap_or(defaults.presence),
        frequency: req.frequency_penalty.unwrap_or(defaults.frequency),
    };
    if let Err(e) = penalties.check() {
        return refuse(400, e);
    }
    let stops = match &req.stop {
        None | Some(Value::Null) => d.run.stop.clone(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
            a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()
        }
        Some(_) => return refuse(400, "stop: a string or an array of strings"),
    };
    if stops.len() > MAX_STOPS || stops.iter().any(|s| s.chars().count() > MAX_STOP_CHARS) {
        return refuse(400, format!("stop: at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters"));
    }
    if let Err(e) = StopStrings::new(stops.clone()) {
        return refuse(400, format!("stop: {e}"));
    }
    if let Some(msg) = refused::refused_field(&json) {
        return refuse(400, msg);
    }
    let tok = &d.session.target.tokenizer;
    let encode = |text: String| match tok.encode(&text) {
        Ok(ids) if !ids.is_empty() => Ok(Prompt { ids, text }),
        Ok(_) => refuse(400, "the prompt has no tokens"),
        Err(e) => refuse(400, format!("tokenizing the prompt: {e}")),
    };
    let prompts = match (kind, &req.prompt, &req.messages) {
        (Kind::Text, Some(p), _) => {
            prompts(p, tok)?.into_iter().map(|p| p.map_or_else(encode, Ok)).collect::<Result<Vec<_>, _>>()?
        }
        (Kind::Text, None, _) => return refuse(400, "prompt: missing"),
        (Kind::Chat, _, Some(m)) if !m.is_empty() => {
            vec![encode(chat_text(tok, m, req.chat_template_kwargs.as_ref())?)?]
        }
        (Kind::Chat, _, _) => return refuse(400, "messages: missing or empty"),
    };
    if prompts.len() * n > MAX_PROMPTS {
        return refuse(400, format!("prompt: {} prompts x n {n}: at most {MAX_PROMPTS} answers", prompts.len()));
    }
    let defaults = &d.session.config;
    let warp = Warp {
        temperature: req.temperature.unwrap_or(defaults.warp.temperature),
        top_k: req.top_k.unwrap_or(defaults.warp.top_k),
        top_p: req.top_p.unwrap_or(defaults.warp.top_p),
        min_p: req.min_p.unwrap_or(defaults.warp.min_p),
    };
    if let Err(e) = warp.check() {
        return refuse(400, e.to_string());
    }
    for p in &prompts {
        if let Err(e) = d.session.check_fits(p.ids.len(), d.capacity, "prompt") {
            return refuse(400, format!("{e} (the server's --context)"));
        }
    }
    let max_new_tokens = req.max_completion_tokens.or(req.max_tokens).unwrap_or(defaults.max_new_tokens);
    if max_new_tokens == 0 && !req.echo {
        return refuse(400, "max_tokens: at least 1 (0 only with echo, to score the prompt)");
    }
    // Without a seed each request draws one, reported with the answer.
    let seed = req.seed.unwrap_or_else(rand::random);
    let config = GenerationConfig { max_new_tokens, warp, seed, ..defaults.clone() };
    let echo = req.echo;
    let checked =
        Checked { stream: req.stream, ignore_eos: req.ignore_eos, stops, logprobs, echo, n, logit_bias, penalties };
    Ok((checked, prompts, config))
}

/// The prompts of a completions request: each a text to tokenize (`Err`) or token ids, checked
/// against the vocabulary (`Ok`, with their text).
fn prompts(prompt: &Value, tok: &engine::tokenizer::TextTokenizer) -> Result<Vec<Result<Prompt, String>>, Refusal> {
    let vocab = tok.vocab().len();
    let ids = |list: &[Value]| -> Result<Prompt, Refusal> {
        match token_ids(list, vocab) {
            Some(ids) if !ids.is_empty() => {
                let text = tok.decode(&ids).map_err(|e| Refusal(400, format!("prompt: {e}")))?;
                Ok(Prompt { ids, text })
            }
            _ => refuse(400, format!("prompt: token ids must be a non-empty list of ids below {vocab}")),
        }
    };
    match prompt {
        Value::String(s) => Ok(vec![Err(s.clone())]),
        Value::Array(list) if list.is_empty() => refuse(400, "prompt: an empty list"),
        Value::Array(list) if list.iter().all(Value::is_string) => {
            Ok(list.iter().map(|s| Err(s.as_str().unwrap_or_default().to_string())).collect())
        }
        Value::Array(list) if list.iter().all(Value::is_number) => Ok(vec![Ok(ids(list)?)]),
        Value::Array(list) if list.iter().all(Value::is_array) => {
            list.iter().map(|l| ids(l.as_array().map_or(&[][..], Vec::as_slice)).map(Ok)).collect()
        }
        _ => refuse(400, "prompt: a string, an array of strings, an array of token ids, or an array of those"),
    }
}
