//! `mdsd serve`'s log-probabilities: completions and chat, streamed and not, against
//! `mdsd generate --logprobs`.

use super::{events, generate_json, post, s, start};
use crate::common::{mdsd, temp_dir, Tiny};
use candle_core::quantized::GgmlDType;
use serde_json::{json, Value};
/// `generate --json --logprobs 2` (temperature 0, 8 tokens): the text, one record per token
/// with 2 alternatives.
fn generate_logprobs(extra: &[&str]) -> (String, Vec<Value>) {
    let fixed = ["--temperature", "0", "--max-new-tokens", "8", "--ignore-eos", "--logprobs", "2"];
    let v = generate_json(&[&fixed[..], extra].concat());
    (v["text"].as_str().unwrap().to_string(), v["logprobs"].as_array().unwrap().clone())
}

/// The completion `logprobs` of streamed events, joined in order.
fn joined_logprobs(evs: &[Value]) -> Value {
    let mut joined = json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []});
    for e in evs {
        let l = &e["choices"][0]["logprobs"];
        if !l.is_null() {
            for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
                joined[key].as_array_mut().unwrap().extend(l[key].as_array().unwrap().iter().cloned());
            }
        }
    }
    joined
}

fn close(a: &Value, b: &Value) -> bool {
    (a.as_f64().unwrap() - b.as_f64().unwrap()).abs() < 1e-4
}

/// Log-probabilities: completions (`logprobs: N`) and chat (`logprobs`, `top_logprobs`), streamed
/// and not, carry generate's values for the tokens of the text; a stop string keeps the tokens
/// whose text begins before it; bad values are refused, and so are `--logprobs` without
/// `--json` and beyond 20.
#[test]
fn serve_returns_logprobs() {
    let dir = temp_dir("serve-logprobs");
    let target = Tiny { scale: 0.8, ..Tiny::chat_llama(55) }.write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let draft = Tiny { layers: 1, ..Tiny::llama(56) }.write_hf(&dir.join("draft"));
    let models = ["--target", s(&target), "--draft", s(&draft), "--tree", "chain-2"];
    let (plain, records) = generate_logprobs(&[&models[..], &["--prompt", "ABC"]].concat());
    assert_eq!(records.len(), 8);
    let texts: String = records.iter().map(|r| r["text"].as_str().unwrap()).collect();
    assert_eq!(texts, plain, "generate: the tokens' texts make the text");
    for r in &records {
        let top = r["top"].as_array().unwrap();
        // Temperature 0: each token is the most probable one.
        assert_eq!((top.len(), &top[0]["token"]), (2, &r["token"]), "{r}");
        assert!(close(&top[0]["logprob"], &r["logprob"]) && top[1]["logprob"].as_f64() <= top[0]["logprob"].as_f64());
    }
    let server = start(&[&models[..], &["--temperature", "0"]].concat());
    let port = server.port;

    // Completions, whole and streamed: the same entries.
    let request = json!({"prompt": "ABC", "max_tokens": 8, "ignore_eos": true, "logprobs": 2});
    let (status, v) = post(port, "/v1/completions", &request);
    assert_eq!(status, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["text"].as_str().unwrap(), plain);
    let lp = &choice["logprobs"];
    let tokens: Vec<&str> = lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tokens.concat(), plain);
    let mut offset = 0;
    for (i, r) in records.iter().enumerate() {
        assert!(close(&lp["token_logprobs"][i], &r["logprob"]), "{lp}");
        assert_eq!(lp["text_offset"][i].as_u64(), Some(offset), "{lp}");
        offset += tokens[i].chars().count() as u64;
        // The two most probable tokens and the chosen one (one of them here).
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert_eq!(top.len(), 2, "{lp}");
        assert!(close(&top[tokens[i]], &r["logprob"]), "{lp}");
    }
    let mut streamed = request.clone();
    streamed["stream"] = true.into();
    let evs = events(port, "/v1/completions", &streamed);
    assert_eq!(joined_logprobs(&evs), *lp, "streamed completion logprobs");
    // A stop string the answer's end begins: that end is held back to the last event, its
    // token's entry with it.
    let mut held = streamed.clone();
    held["stop"] = format!("{}\u{1}", plain.chars().last().unwrap()).into();
    let evs = events(port, "/v1/completions", &held);
    let text: String = evs.iter().map(|e| e["choices"][0]["text"].as_str().unwrap()).collect();
    let tokens: Vec<Value> = evs
        .iter()
        .flat_map(|e| e["choices"][0]["logprobs"]["tokens"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!((text.as_str(), &tokens[..]), (plain.as_str(), &lp["tokens"].as_array().unwrap()[..]), "held back");

    // A stop string inside the answer: the tokens whose text begins before it.
    let stop = &plain[3..5];
    let cut = plain.find(stop).unwrap();
    for stream in [false, true] {
        let mut body = request.clone();
        body["stop"] = stop.into();
        body["stream"] = stream.into();
        let tokens: Vec<Value> = if stream {
            let evs = events(port, "/v1/completions", &body);
            evs.iter()
                .flat_map(|e| e["choices"][0]["logprobs"]["tokens"].as_array().cloned().unwrap_or_default())
                .collect()
        } else {
            post(port, "/v1/completions", &body).1["choices"][0]["logprobs"]["tokens"].as_array().unwrap().clone()
        };
        let expect =
            lp["text_offset"].as_array().unwrap().iter().filter(|o| (o.as_u64().unwrap() as usize) < cut).count();
        assert_eq!(tokens.len(), expect, "stop {stop:?} in {plain:?}, stream {stream}");
        assert_eq!(tokens[..], lp["tokens"].as_array().unwrap()[..expect]);
    }

    // Echo: the prompt scored by its own pass. Prompt "ABC" + the answer, no new tokens: the
    // answer's tokens get the values they had as generated tokens (one token per character in
    // this vocabulary).
    let scored = json!({"prompt": format!("ABC{plain}"), "max_tokens": 0, "echo": true, "logprobs": 2});
    let (status, v) = post(port, "/v1/completions", &scored);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), format!("ABC{plain}"));
    let e = &v["choices"][0]["logprobs"];
    let echoed: Vec<&str> = e["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(echoed.concat(), format!("ABC{plain}"));
    assert!(e["token_logprobs"][0].is_null() && e["top_logprobs"][0].is_null(), "{e}");
    assert_eq!(e["text_offset"].as_array().unwrap().len(), 11);
    for i in 0..8 {
        let (a, b) = (e["token_logprobs"][3 + i].as_f64().unwrap(), lp["token_logprobs"][i].as_f64().unwrap());
        assert!((a - b).abs() < 1e-3, "token {i}: scored {a}, generated {b}");
        assert_eq!(e["text_offset"][3 + i].as_u64(), Some(3 + i as u64));
    }
    // generate --prompt-logprobs scores the same text the same way.
    let text = format!("ABC{plain}");
    let scoring = ["--max-new-tokens", "0", "--logprobs", "2", "--prompt-logprobs", "--prompt", &text];
    let g = generate_json(&[&scoring[..], &models[..]].concat());
    let prompt_records = g["prompt_logprobs"].as_array().unwrap();
    assert_eq!((prompt_records.len(), g["new_tokens"].as_u64()), (10, Some(0)), "{g}");
    for (i, r) in prompt_records.iter().enumerate() {
        assert!(close(&r["logprob"], &e["token_logprobs"][i + 1]), "prompt token {}: {r} vs {e}", i + 1);
        assert_eq!(r["text"], e["tokens"][i + 1]);
    }

    // Echo with an answer, whole and streamed: the prompt's entries, then the answer's.
    let echo = json!({"prompt": "ABC", "max_tokens": 8, "ignore_eos": true, "echo": true, "logprobs": 2});
    let v = post(port, "/v1/completions", &echo).1;
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), format!("ABC{plain}"));
    let whole = v["choices"][0]["logprobs"].clone();
    assert_eq!(whole["tokens"].as_array().unwrap().len(), 11);
    assert_eq!(whole["tokens"].as_array().unwrap()[3..], lp["tokens"].as_array().unwrap()[..]);
    assert_eq!(whole["text_offset"][3].as_u64(), Some(3));
    let mut streamed = echo.clone();
    streamed["stream"] = true.into();
    let evs = events(port, "/v1/completions", &streamed);
    let text: String = evs.iter().map(|e| e["choices"][0]["text"].as_str().unwrap()).collect();
    assert_eq!(text, format!("ABC{plain}"));
    assert_eq!(joined_logprobs(&evs), whole, "streamed echo");
    // Echo without logprobs: the text only.
    let v = post(port, "/v1/completions", &json!({"prompt": "ABC", "max_tokens": 2, "echo": true})).1;
    assert!(v["choices"][0]["text"].as_str().unwrap().starts_with("ABC") && v["choices"][0]["logprobs"].is_null());

    // A logit bias banning the answer's first character: the server's answer equals generate's
    // with --logit-bias (the tiny vocabulary's token for a character is its code minus 0x21).
    let first = plain.chars().next().unwrap() as u32 - 0x21;
    let body = json!({"prompt": "ABC", "max_tokens": 8, "ignore_eos": true, "logit_bias": {first.to_string(): -100}});
    let biased = post(port, "/v1/completions", &body).1["choices"][0]["text"].as_str().unwrap().to_string();
    let flag = format!("{first}=-100");
    let (cli, _) = generate_logprobs(&[&models[..], &["--prompt", "ABC", "--logit-bias", &flag]].concat());
    assert!(biased == cli && !biased.starts_with(&plain[..1]), "{biased:?} / {cli:?} / {plain:?}");

    // Chat: entries with bytes and the alternatives asked for.
    let (chat, chat_records) = generate_logprobs(&[&models[..], &["--chat", "--prompt", "ABC"]].concat());
    let body = json!({"messages": [{"role": "user", "content": "ABC"}], "max_tokens": 8, "ignore_eos": true,
        "logprobs": true, "top_logprobs": 2});
    let (status, v) = post(port, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap(), chat);
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(content.len(), 8);
    let bytes: Vec<u8> =
        content.iter().flat_map(|c| c["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8)).collect();
    assert_eq!(String::from_utf8(bytes).unwrap(), chat);
    for (c, r) in content.iter().zip(&chat_records) {
        assert!(close(&c["logprob"], &r["logprob"]) && c["token"] == r["text"], "{c} vs {r}");
        assert_eq!(c["top_logprobs"].as_array().unwrap().len(), 2, "{c}");
    }
    let mut streamed = body.clone();
    streamed["stream"] = true.into();
    let evs = events(port, "/v1/chat/completions", &streamed);
    let joined: Vec<Value> = evs
        .iter()
        .flat_map(|e| e["choices"][0]["logprobs"]["content"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!(joined, content, "streamed chat logprobs");
    // Not asked for: null.
    let v =
        post(port, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "A"}], "max_tokens": 2})).1;
    assert!(v["choices"][0]["logprobs"].is_null(), "{v}");

    let bad = [
        ("/v1/completions", json!({"prompt": "AB", "logprobs": 21}), "at most 20"),
        ("/v1/completions", json!({"prompt": "AB", "logprobs": true}), "an integer"),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "A"}], "echo": true}), "echo"),
        ("/v1/completions", json!({"prompt": "AB", "max_tokens": 0}), "0 only with echo"),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "A"}], "top_logprobs": 2}),
            "needs logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "A"}], "logprobs": 2}),
            "true or false",
        ),
    ];
    for (path, body, expected) in bad {
        let (status, v) = post(port, path, &body);
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(status == 400 && msg.contains(expected), "{body}: {status} {v}");
    }
    for (flags, expected) in [
        (&["--logprobs", "2"][..], "give --json (or --jsonl) too"),
        (&["--json", "--logprobs", "21"][..], "at most 20"),
        (&["--json", "--prompt-logprobs"][..], "needs --logprobs"),
        (&["--logit-bias", "5=300"][..], "from -100 to 100"),
        (&["--logit-bias", "5"][..], "expected ID=BIAS"),
        (&["--logit-bias", "48=1"][..], "vocabulary has 48 tokens"),
    ] {
        let out = mdsd(&[&["generate", "--prompt", "AB", "--target", s(&target), "--no-spec"][..], flags].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(expected), "{flags:?}: {err}");
    }
}
