//! `mdsd serve`'s `/tokenize` and `/detokenize` against `mdsd tokenize`, and chat template
//! variables (`chat_template_kwargs`) in requests.

use super::{command_json, http, http_with, s, start_with};
use crate::common::{mdsd, temp_dir, Tiny};
use candle_core::quantized::GgmlDType;
use serde_json::{json, Value};

/// `/tokenize` gives the ids a completion's prompt (or a chat request's messages) runs as,
/// those of `mdsd tokenize`, with their count equal to the completion's `prompt_tokens`;
/// `/detokenize` gives their text back; bad requests get a 4xx and the server goes on, and
/// with an API key both need it.
#[test]
fn serve_tokenizes_as_tokenize_does() {
    let dir = temp_dir("serve-tokenize");
    let target = Tiny::chat_llama(57).write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let server = start_with(&["--target", s(&target), "--no-spec", "--context", "200"], &[("MDSD_API_KEY", "k")]);
    let port = server.port;
    let key = "Authorization: Bearer k\r\n";
    let call = |path: &str, body: &Value| -> (u16, Value) {
        let (status, text) = http_with(port, "POST", path, &body.to_string(), key);
        (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
    };
    let cli = command_json("tokenize", &["--target", s(&target), "--prompt", "ABCDEF"]);
    let (status, v) = call("/tokenize", &json!({"prompt": "ABCDEF", "return_token_strs": true}));
    assert_eq!(status, 200, "{v}");
    assert_eq!((&v["tokens"], &v["token_strs"], &v["count"]), (&cli["ids"], &cli["tokens"], &cli["count"]), "{v}");
    assert_eq!(v["max_model_len"], 200);
    assert!(v["count"].as_u64().unwrap() > 1);
    let (status, done) = call("/v1/completions", &json!({"prompt": "ABCDEF", "max_tokens": 1}));
    assert_eq!((status, &done["usage"]["prompt_tokens"]), (200, &v["count"]), "{done}");

    // Messages run through the chat template, as chat completions run them.
    let chat = command_json("tokenize", &["--target", s(&target), "--chat", "--prompt", "hi"]);
    let (status, v) = call("/tokenize", &json!({"messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!((status, &v["tokens"]), (200, &chat["ids"]), "{v}");
    assert!(v.get("token_strs").is_none(), "{v}");
    let (_, done) =
        call("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}));
    assert_eq!(done["usage"]["prompt_tokens"], v["count"], "{done}");

    let (status, back) = call("/detokenize", &json!({"tokens": cli["ids"]}));
    assert_eq!((status, back), (200, json!({"prompt": "ABCDEF"})));
    let out = mdsd(&["tokenize", "--target", s(&target), "--decode", &cli["ids"].to_string().replace(['[', ']'], "")]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ABCDEF\n");

    for (path, body, want) in [
        ("/detokenize", json!({"tokens": [1, 1_000_000]}), "tokens: a list of token ids below"),
        ("/detokenize", json!({"tokens": [1, "x"]}), "tokens: a list of token ids below"),
        ("/detokenize", json!({}), "not a valid request"),
        ("/tokenize", json!({}), "prompt or messages: missing"),
        ("/tokenize", json!({"prompt": "a", "messages": [{"role": "user", "content": "a"}]}), "not both"),
        ("/tokenize", json!({"messages": []}), "messages: empty"),
        ("/tokenize", json!({"prompt": "a", "add_special_tokens": false}), "add_special_tokens"),
        ("/tokenize", json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), "text content"),
    ] {
        let (status, v) = call(path, &body);
        assert_eq!(status, 400, "{path} {body}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(want), "{path} {body}: {v}");
    }
    let (status, text) = http_with(port, "POST", "/tokenize", "{not json", key);
    assert_eq!(status, 400, "{text}");
    assert_eq!(http_with(port, "GET", "/tokenize", "", key).0, 405);
    assert_eq!(http(port, "POST", "/tokenize", r#"{"prompt": "a"}"#).0, 401);
    assert_eq!(http(port, "POST", "/detokenize", r#"{"tokens": [1]}"#).0, 401);
    // Still serving.
    assert_eq!(call("/v1/completions", &json!({"prompt": "AB", "max_tokens": 2})).0, 200);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A chat template with a variable of its own (`tag`, default `A`).
const TAGGED_CHAT: &str = "{% for m in messages %}>{{ m.content }};{% endfor %}{{ tag | default('A') }}<";

/// Extra chat template variables (vLLM's `chat_template_kwargs`, as Qwen3's `enable_thinking`):
/// `--chat-template-kwargs` for `tokenize` and as the server's default, a request's own over
/// it, in `/tokenize` and chat completions alike; the renderer's own variables and JSON that
/// is not an object are refused.
#[test]
fn chat_template_kwargs_reach_the_template() {
    let dir = temp_dir("serve-chat-kwargs");
    let tiny = Tiny { chat_template: Some(TAGGED_CHAT), ..Tiny::llama(58) };
    let target = tiny.write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let ids = |kwargs: Option<&str>| -> Value {
        let mut args = vec!["--target", s(&target), "--chat", "--prompt", "HI"];
        if let Some(k) = kwargs {
            args.extend(["--chat-template-kwargs", k]);
        }
        command_json("tokenize", &args)["ids"].clone()
    };
    let (plain, b, c) = (ids(None), ids(Some(r#"{"tag": "B"}"#)), ids(Some(r#"{"tag": "C"}"#)));
    assert!(plain != b && b != c, "{plain} {b} {c}");
    let server = start_with(&["--target", s(&target), "--no-spec", "--chat-template-kwargs", r#"{"tag": "B"}"#], &[]);
    let call = |path: &str, body: &Value| -> (u16, Value) {
        let (status, text) = http_with(server.port, "POST", path, &body.to_string(), "");
        (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
    };
    let messages = json!([{"role": "user", "content": "HI"}]);
    let (status, v) = call("/tokenize", &json!({"messages": messages}));
    assert_eq!((status, &v["tokens"]), (200, &b), "the server's default: {v}");
    let (status, v) = call("/tokenize", &json!({"messages": messages, "chat_template_kwargs": {"tag": "C"}}));
    assert_eq!((status, &v["tokens"]), (200, &c), "the request's own: {v}");
    let request = json!({"messages": messages, "chat_template_kwargs": {"tag": "C"}, "max_tokens": 1});
    let (status, done) = call("/v1/chat/completions", &request);
    assert_eq!((status, &done["usage"]["prompt_tokens"]), (200, &json!(c.as_array().unwrap().len())), "{done}");
    let (status, v) = call("/tokenize", &json!({"messages": messages, "chat_template_kwargs": {"messages": []}}));
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("`messages` is set by mdsd"), "{v}");
    for bad in ["[1]", "{not json"] {
        let out =
            mdsd(&["tokenize", "--target", s(&target), "--chat", "--prompt", "HI", "--chat-template-kwargs", bad]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains("--chat-template-kwargs"), "{bad}: {stderr}");
    }
}
