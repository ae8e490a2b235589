//! `/tokenize` and `/detokenize`, as vLLM's server has them: the token ids a completion request's
//! prompt (or a chat request's messages, through the chat template) runs as, and the text of
//! token ids. Answered on a blocking thread of their own: they need the tokenizer alone.

use super::request::{chat_text, refuse, token_ids, ChatMessage, Refusal};
use engine::tokenizer::TextTokenizer;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize, Default)]
#[serde(default)]
struct TokenizeRequest {
    prompt: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    /// Extra chat template variables, as in chat completions.
    chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// With `true`, the answer also has `token_strs`: each id's text.
    return_token_strs: bool,
    /// Only the default (`true`): a prompt runs with the special tokens the model asks for.
    add_special_tokens: Option<bool>,
    /// Only the default (`true`): the chat template ends with the assistant's turn opened.
    add_generation_prompt: Option<bool>,
}

/// `/tokenize`: `{"prompt": TEXT}` or `{"messages": [...]}` to `{"count", "max_model_len",
/// "tokens"}` (and `token_strs` when asked), with `capacity` the server's `--context`.
pub(super) fn tokenize(tok: &TextTokenizer, capacity: usize, body: &str) -> Result<Value, Refusal> {
    let req: TokenizeRequest =
        serde_json::from_str(body).map_err(|e| Refusal(400, format!("the body is not a valid request: {e}")))?;
    if req.add_special_tokens == Some(false) {
        return refuse(400, "add_special_tokens: only true (the ids a prompt runs as) is supported");
    }
    if req.add_generation_prompt == Some(false) {
        return refuse(400, "add_generation_prompt: only true (as chat completions run) is supported");
    }
    let text = match (&req.prompt, &req.messages) {
        (Some(p), None) => p.clone(),
        (None, Some(m)) if !m.is_empty() => chat_text(tok, m, req.chat_template_kwargs.as_ref())?,
        (None, Some(_)) => return refuse(400, "messages: empty"),
        (Some(_), Some(_)) => return refuse(400, "give prompt or messages, not both"),
        (None, None) => return refuse(400, "prompt or messages: missing"),
    };
    let ids = tok.encode(&text).map_err(|e| Refusal(400, format!("tokenizing the prompt: {e}")))?;
    let mut answer = json!({"count": ids.len(), "max_model_len": capacity, "tokens": ids});
    if req.return_token_strs {
        answer["token_strs"] = ids.iter().map(|&id| tok.token_text(id)).collect();
    }
    Ok(answer)
}

#[derive(Deserialize)]
struct DetokenizeRequest {
    tokens: Vec<Value>,
}

/// `/detokenize`: `{"tokens": [ids]}` to `{"prompt": TEXT}` (special tokens left out, as
/// completions print them).
pub(super) fn detokenize(tok: &TextTokenizer, body: &str) -> Result<Value, Refusal> {
    let req: DetokenizeRequest =
        serde_json::from_str(body).map_err(|e| Refusal(400, format!("the body is not a valid request: {e}")))?;
    let vocab = tok.vocab().len();
    let Some(ids) = token_ids(&req.tokens, vocab) else {
        return refuse(400, format!("tokens: a list of token ids below {vocab}"));
    };
    let text = tok.decode(&ids).map_err(|e| Refusal(400, format!("tokens: {e}")))?;
    Ok(json!({ "prompt": text }))
}
