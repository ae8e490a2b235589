//! `mdsd serve` end to end on tiny random models: its OpenAI-compatible answers, streamed and
//! not, equal `mdsd generate`'s; stop strings cut them; a resent conversation reuses its cached
//! prefix; bad requests get OpenAI's error object with a 4xx status and leave the server
//! running. Log-probabilities are in [`logprobs`], `/tokenize` and chat template
//! variables in [`tokenize`].

mod batching;
mod load;
mod logprobs;
mod slots;
mod tokenize;

use crate::common;

use candle_core::quantized::GgmlDType;
use common::{mdsd, temp_dir, Tiny};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};

pub(crate) fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A running `mdsd serve`, killed when dropped.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) port: u16,
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Server {
    /// What the server printed to its standard error so far.
    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `mdsd serve --port 0 ARGS` and waits for the line naming its address.
pub(crate) fn start(args: &[&str]) -> Server {
    start_with(args, &[])
}

/// [`start`] with environment variables `env` set for the server.
pub(crate) fn start_with(args: &[&str], env: &[(&str, &str)]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mdsd"))
        .args(["serve", "--port", "0"])
        .args(args)
        .envs(env.iter().copied())
        .env("MDSD_OFFLINE", "1")
        .env("MDSD_CACHE", common::test_cache())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mdsd serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let port = loop {
        let line = lines.next().unwrap_or_else(|| panic!("mdsd serve ended: {seen:?}")).unwrap();
        if let Some(rest) = line.split("listening on http://127.0.0.1:").nth(1) {
            break rest.split(' ').next().unwrap().parse().unwrap();
        }
        seen.push(line);
    };
    // Keep reading the log so that the server never blocks on it.
    let log = std::sync::Arc::new(std::sync::Mutex::new(seen.join("\n")));
    let kept = std::sync::Arc::clone(&log);
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let mut log = kept.lock().unwrap();
            log.push_str(&line);
            log.push('\n');
        }
    });
    Server { child, port, log }
}

/// One HTTP/1.1 exchange: the status and the body (de-chunked).
pub(crate) fn http(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    http_with(port, method, path, body, "")
}

/// [`http`] with `headers` (each ending in CRLF) added to the request.
pub(crate) fn http_with(port: u16, method: &str, path: &str, body: &str, headers: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let status = line.split(' ').nth(1).unwrap().parse().unwrap();
    let (mut length, mut chunked) = (None, false);
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        let header = line.trim_end().to_ascii_lowercase();
        if header.is_empty() {
            break;
        }
        if let Some(v) = header.strip_prefix("content-length:") {
            length = Some(v.trim().parse::<usize>().unwrap());
        }
        chunked |= header == "transfer-encoding: chunked";
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            let n = usize::from_str_radix(line.trim(), 16).unwrap();
            let mut chunk = vec![0; n + 2];
            reader.read_exact(&mut chunk).unwrap();
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        let mut chunk = vec![0; length.expect("a length or chunks")];
        reader.read_exact(&mut chunk).unwrap();
        body = chunk;
    }
    (status, String::from_utf8(body).unwrap())
}

pub(crate) fn post(port: u16, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = http(port, "POST", path, &body.to_string());
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
}

/// The `data:` events of a streamed answer, `[DONE]` last.
pub(crate) fn events(port: u16, path: &str, body: &Value) -> Vec<Value> {
    let (status, text) = http(port, "POST", path, &body.to_string());
    assert_eq!(status, 200, "{text}");
    let data: Vec<&str> =
        text.split("\n\n").filter(|e| !e.is_empty()).map(|e| e.strip_prefix("data: ").unwrap()).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect()
}

/// `mdsd COMMAND --json` with `args`: its JSON object (the command must succeed).
pub(crate) fn command_json(command: &str, args: &[&str]) -> Value {
    let out = mdsd(&[&[command, "--json"][..], args].concat());
    assert!(out.status.success(), "{command} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `mdsd generate --json` with `args`: its JSON object (the command must succeed).
pub(crate) fn generate_json(args: &[&str]) -> Value {
    command_json("generate", args)
}

/// `mdsd generate --json --temperature 0` of 8 tokens with `extra` flags: its text.
pub(crate) fn generate_text(extra: &[&str]) -> String {
    let v = generate_json(&[&["--temperature", "0", "--max-new-tokens", "8", "--ignore-eos"][..], extra].concat());
    v["text"].as_str().unwrap().to_string()
}

/// Completions and chat completions, streamed and not, at temperature 0 equal `generate`'s
/// texts; a repeated prompt and a resent conversation reuse their cached prefix; a seed fixes a
/// temperature-1 answer, and an answer without one reports the seed it drew.
#[test]
fn serve_answers_as_generate_does() {
    let dir = temp_dir("serve");
    let target = Tiny::chat_llama(51).write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let draft = Tiny { layers: 1, ..Tiny::llama(52) }.write_hf(&dir.join("draft"));
    let models = ["--target", s(&target), "--draft", s(&draft), "--tree", "chain-2"];
    let server = start(&[&models[..], &["--temperature", "0", "--show-reused-tokens"]].concat());
    let port = server.port;

    let (status, health) = http(port, "GET", "/health", "");
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!((status, health), (200, json!({"status": "ok", "running": 0, "waiting": 0})));
    let (status, list) = http(port, "GET", "/v1/models", "");
    assert!(status == 200 && list.contains(r#""id":"target""#), "{list}");

    let plain = generate_text(&[&models[..], &["--prompt", "ABC"]].concat());
    let request = json!({"prompt": "ABC", "max_tokens": 8, "ignore_eos": true});
    let (status, v) = post(port, "/v1/completions", &request);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), plain);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 8);
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();

    // A stop string (two tokens of the answer) ends the answer before it, streamed or not.
    let stop = &plain[3..5];
    let cut = &plain[..plain.find(stop).unwrap()];
    for stream in [false, true] {
        let body =
            json!({"prompt": "ABC", "max_tokens": 8, "ignore_eos": true, "stop": [stop, "never"], "stream": stream});
        let (text, finish) = if stream {
            let evs = events(port, "/v1/completions", &body);
            let text: String = evs.iter().map(|e| e["choices"][0]["text"].as_str().unwrap()).collect();
            (text, evs.last().unwrap()["choices"][0]["finish_reason"].clone())
        } else {
            let v = post(port, "/v1/completions", &body).1;
            (v["choices"][0]["text"].as_str().unwrap().to_string(), v["choices"][0]["finish_reason"].clone())
        };
        assert_eq!(
            (text.as_str(), finish.as_str()),
            (cut, Some("stop")),
            "stop {stop:?}, stream {stream}, answer {plain:?}"
        );
    }

    let mut streamed = request.clone();
    streamed["stream"] = true.into();
    let evs = events(port, "/v1/completions", &streamed);
    let text: String = evs.iter().map(|e| e["choices"][0]["text"].as_str().unwrap()).collect();
    assert_eq!(text, plain, "streamed");
    let last = evs.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(last["mdsd"]["reused_tokens"].as_u64().unwrap(), prompt_tokens - 1, "the same prompt again");

    let chat = generate_text(&[&models[..], &["--chat", "--prompt", "ABC"]].concat());
    let turn = |messages: Value| json!({"messages": messages, "max_tokens": 8, "ignore_eos": true});
    // Content as an array of text parts, as newer clients send it.
    let first = json!([{"role": "user", "content": [{"type": "text", "text": "AB"}, {"type": "text", "text": "C"}]}]);
    let (status, v) = post(port, "/v1/chat/completions", &turn(first.clone()));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    let answer = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert_eq!(answer, chat);
    let mut body = turn(first);
    body["stream"] = true.into();
    let evs = events(port, "/v1/chat/completions", &body);
    assert_eq!(evs[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = evs.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, chat, "streamed chat");

    slots::next_turn_reuses(port, &answer, "the second turn");

    // A streaming client that hangs up after the first event: the server keeps serving, and
    // its caches keep the text (the next request with that prompt reuses all of it but the last).
    {
        let body = json!({"prompt": "ABCD", "max_tokens": 200, "ignore_eos": true, "stream": true}).to_string();
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(stream, "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len())
            .unwrap();
        let mut first = [0u8; 64];
        stream.read_exact(&mut first).unwrap();
        assert!(first.starts_with(b"HTTP/1.1 200"));
    }
    // Once that answer ended, its slot (the one holding the text) is free again.
    let t = std::time::Instant::now();
    while serde_json::from_str::<Value>(&http(port, "GET", "/health", "").1).unwrap()["running"] != 0 {
        assert!(t.elapsed().as_secs() < 30, "the hung-up answer still runs");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let (status, v) = post(port, "/v1/completions", &json!({"prompt": "ABCD", "max_tokens": 1}));
    assert_eq!(
        (status, v["mdsd"]["reused_tokens"].as_u64()),
        (200, Some(v["usage"]["prompt_tokens"].as_u64().unwrap() - 1)),
        "{v}"
    );

    let seeded = json!({"prompt": "ABC", "max_tokens": 8, "temperature": 1.0, "seed": 5, "ignore_eos": true});
    let a = post(port, "/v1/completions", &seeded).1;
    let b = post(port, "/v1/completions", &seeded).1;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    assert_eq!(a["mdsd"]["seed"], 5);
    // The sampling fields are generate's flags: the same seed gives the same sample.
    let warped = json!({"prompt": "ABC", "max_tokens": 8, "temperature": 1.0, "seed": 5, "ignore_eos": true,
        "min_p": 0.2, "top_k": 20, "top_p": 0.95, "repetition_penalty": 1.3, "presence_penalty": 0.5,
        "frequency_penalty": -0.25});
    let flags = ["--temperature", "1", "--seed", "5", "--min-p", "0.2", "--top-k", "20", "--top-p", "0.95"];
    let flags =
        [&flags[..], &["--repetition-penalty", "1.3", "--presence-penalty", "0.5", "--frequency-penalty", "-0.25"]]
            .concat();
    let want =
        generate_json(&[&flags[..], &["--max-new-tokens", "8", "--ignore-eos", "--prompt", "ABC"], &models].concat());
    assert_eq!(post(port, "/v1/completions", &warped).1["choices"][0]["text"], want["text"], "sampling fields");
    // The penalties reached the sample: without them it differs (checked for this seed).
    let mut plain = warped.clone();
    for k in ["repetition_penalty", "presence_penalty", "frequency_penalty"] {
        plain.as_object_mut().unwrap().remove(k);
    }
    assert_ne!(
        post(port, "/v1/completions", &plain).1["choices"][0]["text"],
        want["text"],
        "penalties changed nothing"
    );
    let unseeded = post(port, "/v1/completions", &json!({"prompt": "ABC", "max_tokens": 2})).1;
    assert!(unseeded["mdsd"]["seed"].is_u64(), "{unseeded}");
}

/// While a completion is generated, `/health` and `/v1/models` answer at once and `/health`
/// counts it running; with `--max-batch 1 --max-waiting 0` another completion request gets 503 with
/// `Retry-After`. When the streaming client hangs up, the generator is free again.
#[test]
fn serve_stays_responsive_while_generating() {
    let dir = temp_dir("serve-busy");
    let target = Tiny { context: 4096, ..Tiny::llama(61) }.write_hf(&dir.join("target"));
    let server =
        start(&["--target", s(&target), "--no-spec", "--temperature", "1", "--max-batch", "1", "--max-waiting", "0"]);
    let port = server.port;
    // 64 answers of up to 4,000 tokens: minutes of work unless the client goes away.
    let body = json!({"prompt": vec!["ABC"; 64], "max_tokens": 4000, "ignore_eos": true, "stream": true}).to_string();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    // A failure reads an error, not forever (a 503 here once left the connection open).
    stream.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
    write!(stream, "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended before its first event");
    }

    let (status, health) = http(port, "GET", "/health", "");
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!((status, health), (200, json!({"status": "ok", "running": 1, "waiting": 0})));
    assert_eq!(http(port, "GET", "/v1/models", "").0, 200);
    // Tokenizing needs no generator, so it is answered too (with the queue full).
    let (status, v) = post(port, "/tokenize", &json!({"prompt": "ABC"}));
    assert!(status == 200 && v["count"].as_u64().unwrap() > 0, "{v}");
    let (status, v) = post(port, "/detokenize", &json!({"tokens": v["tokens"]}));
    assert_eq!((status, v), (200, json!({"prompt": "ABC"})));
    let mut busy = TcpStream::connect(("127.0.0.1", port)).unwrap();
    busy.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
    let small = json!({"prompt": "AB", "max_tokens": 1}).to_string();
    write!(
        busy,
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{small}",
        small.len()
    )
    .unwrap();
    let mut answer = String::new();
    busy.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("retry-after: 1\r\n"), "{answer}");
    assert!(answer.contains("--max-waiting"), "{answer}");

    // The generator notices the hang-up at its next token.
    drop(reader);
    let start = std::time::Instant::now();
    loop {
        let health: Value = serde_json::from_str(&http(port, "GET", "/health", "").1).unwrap();
        if health["running"] == 0 {
            break;
        }
        assert!(start.elapsed().as_secs() < 60, "still generating for a client that left: {health}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (status, v) = post(port, "/v1/completions", &json!({"prompt": "AB", "max_tokens": 1}));
    assert_eq!(status, 200, "{v}");
    let m = metrics(port);
    assert_eq!((m["requests_total{outcome=\"busy\"}"], m["requests_total{outcome=\"generated\"}"]), (1.0, 2.0));
}

/// Bad requests: 4xx with OpenAI's error object naming the problem; the server keeps serving.
/// Flags that do not apply to a server are refused at start.
#[test]
fn serve_refuses_bad_requests() {
    let dir = temp_dir("serve-bad");
    let target = Tiny::chat_llama(53).write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let server = start(&["--target", s(&target), "--no-spec", "--context", "32"]);
    let port = server.port;
    let many_stops = format!(r#"{{"prompt": "AB", "stop": {}}}"#, json!(vec!["x"; 17]));
    let long_stop = format!(r#"{{"prompt": "AB", "stop": "{}"}}"#, "x".repeat(513));
    let cases: [(&str, &str, &str, u16, &str); 18] = [
        ("POST", "/v1/completions", "nonsense", 400, "not a valid request"),
        ("POST", "/v1/completions", &many_stops, 400, "stop: at most 16 strings of at most 512 characters"),
        ("POST", "/v1/completions", &long_stop, 400, "stop: at most 16 strings of at most 512 characters"),
        ("POST", "/v1/completions", r#"{"max_tokens": 4}"#, 400, "prompt: missing"),
        ("POST", "/v1/completions", r#"{"prompt": "AB", "n": 20}"#, 400, "n: from 1 to 16"),
        ("POST", "/v1/completions", r#"{"prompt": "AB", "stop": ["C", 7]}"#, 400, "stop: a string or an array"),
        ("POST", "/v1/completions", r#"{"prompt": "AB", "stop": ""}"#, 400, "an empty stop string"),
        ("POST", "/v1/completions", r#"{"prompt": "AB", "temperature": -1}"#, 400, "temperature"),
        ("POST", "/v1/completions", r#"{"prompt": "AB", "min_p": 1.5}"#, 400, "min-p must be in [0, 1]"),
        ("POST", "/v1/completions", r#"{"prompt": "AB", "best_of": 3}"#, 400, "best_of: not supported"),
        ("POST", "/v1/completions", r#"{"prompt": "AB", "presence_penalty": 2.5}"#, 400, "presence penalty must be in"),
        (
            "POST",
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "A"}], "logit_bias": {"5": 200}, "presence_penalty": 0}"#,
            400,
            "logit_bias: 5: 200",
        ),
        ("POST", "/v1/completions", r#"{"prompt": "AB", "max_tokens": 0}"#, 400, "max_tokens"),
        ("POST", "/v1/chat/completions", r#"{"messages": []}"#, 400, "messages"),
        (
            "POST",
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
            400,
            "only text content",
        ),
        ("POST", "/v1/completions", &format!(r#"{{"prompt": "{}"}}"#, "ABCDEFGH".repeat(5)), 400, "too long"),
        ("GET", "/v1/completions", "", 405, "GET is not allowed"),
        ("GET", "/v2/everything", "", 404, "no endpoint"),
    ];
    for (method, path, body, status, expected) in cases {
        let (got, text) = http(port, method, path, body);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let msg = v["error"]["message"].as_str().unwrap_or_else(|| panic!("{text}"));
        assert!(got == status && msg.contains(expected), "{method} {path} {body}: {got} {text}");
    }
    let (status, v) = post(port, "/v1/completions", &json!({"prompt": "AB", "max_tokens": 3}));
    assert_eq!((status, v["usage"]["completion_tokens"].as_u64().unwrap() <= 3), (200, true), "{v}");
    // A budget of 10^18 tokens ends at the context (it aborted the server on an allocation).
    let (status, v) = post(
        port,
        "/v1/completions",
        &json!({"prompt": "AB", "max_tokens": 1_000_000_000_000_000_000u64, "ignore_eos": true}),
    );
    assert_eq!((status, v["choices"][0]["finish_reason"].as_str()), (200, Some("length")), "{v}");
    assert_eq!(http(port, "GET", "/health", "").0, 200, "the server is still up");
    // A body announced beyond the limit gets 413 at once, unread; one of 10^11 bytes (which
    // aborted the server when tiny_http drained it into one buffer) is left unanswered, on any
    // endpoint, and the server stays up.
    let mut big = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(big, "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 40000000\r\n\r\n").unwrap();
    let mut line = String::new();
    BufReader::new(&big).read_line(&mut line).unwrap();
    assert!(line.contains(" 413 "), "{line}");
    drop(big);
    let mut huge = Vec::new();
    for path in ["/v1/completions", "/v1/nowhere", "/health"] {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(s, "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 99999999999\r\n\r\n").unwrap();
        huge.push(s);
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(http(port, "GET", "/health", "").0, 200, "the server is still up");
    // A body announced and never sent holds up no other request (it was read on the
    // generator's thread, which then waited for it).
    let mut stalled = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(stalled, "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (sent, answered) = std::sync::mpsc::channel();
    std::thread::spawn(move || sent.send(post(port, "/v1/completions", &json!({"prompt": "AB", "max_tokens": 2}))));
    let (status, v) =
        answered.recv_timeout(std::time::Duration::from_secs(60)).expect("an answer beside a stalled body");
    assert_eq!(status, 200, "{v}");
    drop(stalled);

    for flag in [&["--prompt", "AB"][..], &["--json"][..]] {
        let out = mdsd(&[&["serve", "--port", "0", "--target", s(&target), "--no-spec"][..], flag].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("does not apply to serve"), "{flag:?}: {err}");
    }
}

/// With an API key (`MDSD_API_KEY` here), requests without it or with another get 401; `/health`
/// answers anyway.
#[test]
fn serve_checks_the_api_key() {
    let dir = temp_dir("serve-key");
    let target = Tiny::llama(54).write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let server = start_with(&["--target", s(&target), "--no-spec"], &[("MDSD_API_KEY", "sesame")]);
    let body = r#"{"prompt": "AB", "max_tokens": 2}"#;
    for (headers, status) in
        [("", 401), ("Authorization: Bearer wrong\r\n", 401), ("Authorization: Bearer sesame\r\n", 200)]
    {
        let (got, text) = http_with(server.port, "POST", "/v1/completions", body, headers);
        assert_eq!(got, status, "{headers:?}: {text}");
        if status == 401 {
            assert!(text.contains("API key"), "{text}");
        }
    }
    assert_eq!(http(server.port, "GET", "/health", "").0, 200);
    assert_eq!(http(server.port, "GET", "/v1/models", "").0, 401);
    // Prometheus scrapes without the key; the two refused completions are counted.
    let m = metrics(server.port);
    assert_eq!((m["requests_total{outcome=\"unauthorized\"}"], m["requests_total{outcome=\"generated\"}"]), (2.0, 1.0));
}

/// `/metrics` as a map from `name{labels}` (without the `mdsd_` prefix) to value.
pub(crate) fn metrics(port: u16) -> std::collections::HashMap<String, f64> {
    let (status, text) = http(port, "GET", "/metrics", "");
    assert_eq!(status, 200, "{text}");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').unwrap();
            (name.strip_prefix("mdsd_").unwrap().to_string(), value.parse().unwrap())
        })
        .collect()
}

/// `/metrics` totals equal the sums of the answers' own statistics: requests by outcome,
/// choices, prompt and generated tokens, target forwards and rows, and the steps accepting at
/// each depth.
#[test]
fn serve_reports_metrics() {
    let dir = temp_dir("serve-metrics");
    let target = Tiny::llama(55).write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let draft = Tiny { layers: 1, ..Tiny::llama(56) }.write_hf(&dir.join("draft"));
    let server = start(&[
        "--target",
        s(&target),
        "--draft",
        s(&draft),
        "--tree",
        "chain-2",
        "--temperature",
        "1",
        "--show-reused-tokens",
    ]);
    let port = server.port;
    let zero = metrics(port);
    assert_eq!((zero["requests_running"], zero["requests_waiting"], zero["choices_total"]), (0.0, 0.0, 0.0));

    let mut stats: Vec<Value> = Vec::new();
    for body in [
        json!({"prompt": "ABC", "max_tokens": 8, "ignore_eos": true, "seed": 1}),
        json!({"prompt": ["AB", "ABCD"], "n": 2, "max_tokens": 4, "ignore_eos": true, "seed": 2}),
        json!({"prompt": "ABC", "max_tokens": 6, "ignore_eos": true, "seed": 3, "stream": true}),
    ] {
        let v = if body["stream"] == true {
            events(port, "/v1/completions", &body).pop().unwrap()
        } else {
            let (status, v) = post(port, "/v1/completions", &body);
            assert_eq!(status, 200, "{v}");
            v
        };
        match v["mdsd"]["choices"].as_array() {
            Some(choices) => stats.extend(choices.iter().cloned()),
            None => stats.push(v["mdsd"].clone()),
        }
    }
    assert_eq!(post(port, "/v1/completions", &json!({"prompt": "AB", "temperature": -1})).0, 400);

    let m = metrics(port);
    let sum = |key: &str| stats.iter().map(|s| s[key].as_f64().unwrap()).sum::<f64>();
    assert_eq!(m["requests_total{outcome=\"generated\"}"], 3.0);
    assert_eq!(m["requests_total{outcome=\"refused\"}"], 1.0);
    assert_eq!(m["requests_total{outcome=\"busy\"}"], 0.0);
    assert_eq!(m["choices_total"], 6.0);
    assert_eq!(m["generation_tokens_total"], 8.0 + 4.0 * 4.0 + 6.0);
    for (metric, key) in [
        ("prompt_tokens_total", "prompt_tokens"),
        ("reused_prompt_tokens_total", "reused_tokens"),
        ("generation_tokens_total", "new_tokens"),
        ("target_forwards_total", "target_forwards"),
        ("target_rows_total", "target_rows"),
        ("draft_forwards_total", "draft_forwards"),
        ("ngram_steps_total", "ngram_steps"),
        ("undrafted_steps_total", "undrafted_steps"),
    ] {
        assert_eq!(m[metric], sum(key), "{metric}");
    }
    let accepting: Vec<f64> = (1..=2).map(|d| m[&format!("steps_accepting_total{{depth=\"{d}\"}}")]).collect();
    let want: Vec<f64> =
        // Each choice's acceptance at depth d is its steps accepting there over its target forwards.
        (0..2)
            .map(|d| {
                stats
                    .iter()
                    .map(|s| {
                        let forwards = s["target_forwards"].as_f64().unwrap();
                        (s["acceptance_per_depth"][d].as_f64().unwrap() * forwards).round()
                    })
                    .sum()
            })
            .collect();
    assert_eq!(accepting, want);
    assert!(want[0] > 0.0, "no draft was accepted: {stats:?}");
    assert!(m["decode_seconds_total"] > 0.0);
}

/// `n` choices: generated one after the other, choice `i` with the seed `seed + i` (each equal to
/// a one-choice request with that seed), the prompt reused after the first; streamed, each
/// choice's events carry its index and end with its finish reason; usage sums the choices.
#[test]
fn serve_generates_n_choices() {
    let dir = temp_dir("serve-n");
    let target = Tiny { scale: 0.8, ..Tiny::llama(57) }.write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let draft = Tiny { layers: 1, ..Tiny::llama(58) }.write_hf(&dir.join("draft"));
    let server = start(&["--target", s(&target), "--draft", s(&draft), "--tree", "chain-2", "--show-reused-tokens"]);
    let port = server.port;
    let body = json!({"prompt": "ABCD", "max_tokens": 6, "ignore_eos": true, "temperature": 1.0, "seed": 5, "n": 3});
    let (status, v) = post(port, "/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 18);
    let stats = v["mdsd"]["choices"].as_array().unwrap();
    let mut texts = Vec::new();
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(stats[i]["seed"], 5 + i as u64);
        if i > 0 {
            assert!(stats[i]["reused_tokens"].as_u64().unwrap() >= prompt_tokens - 1, "choice {i}: {v}");
        }
        let mut one = body.clone();
        one["n"] = 1.into();
        one["seed"] = (5 + i as u64).into();
        let single = post(port, "/v1/completions", &one).1;
        assert_eq!(c["text"], single["choices"][0]["text"], "choice {i}");
        texts.push(c["text"].as_str().unwrap().to_string());
    }
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "three seeds, three equal texts: {texts:?}");

    let mut streamed = body.clone();
    streamed["stream"] = true.into();
    let evs = events(port, "/v1/completions", &streamed);
    for (i, text) in texts.iter().enumerate() {
        let mine: Vec<&Value> = evs.iter().filter(|e| e["choices"][0]["index"] == i).collect();
        let got: String = mine.iter().map(|e| e["choices"][0]["text"].as_str().unwrap()).collect();
        assert_eq!(&got, text, "streamed choice {i}");
        let finishes = mine.iter().filter(|e| !e["choices"][0]["finish_reason"].is_null()).count();
        assert_eq!(finishes, 1, "choice {i}");
    }
    assert_eq!(evs.last().unwrap()["usage"]["completion_tokens"], 18);

    // Echo with logprobs: every choice starts with the same scored prompt.
    let echo = json!({"prompt": "ABCD", "max_tokens": 3, "ignore_eos": true, "echo": true, "logprobs": 1, "n": 2});
    let v = post(port, "/v1/completions", &echo).1;
    let (a, b) = (&v["choices"][0]["logprobs"], &v["choices"][1]["logprobs"]);
    assert_eq!(a["token_logprobs"].as_array().unwrap()[..4], b["token_logprobs"].as_array().unwrap()[..4], "{v}");
    assert!(a["token_logprobs"][0].is_null() && a["token_logprobs"][3].is_f64(), "{v}");

    for n in [0, 17] {
        let (status, v) = post(port, "/v1/completions", &json!({"prompt": "AB", "n": n}));
        assert!(status == 400 && v["error"]["message"].as_str().unwrap().contains("n: from 1 to 16"), "{v}");
    }

    // Batched prompts (as lm-evaluation-harness sends them): strings, token ids, lists of
    // token ids; each prompt's answer is its one-prompt request's (temperature 0).
    let ask = |prompt: Value, extra: Value| {
        let mut body = json!({"prompt": prompt, "max_tokens": 4, "ignore_eos": true, "temperature": 0});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        post(port, "/v1/completions", &body)
    };
    let text = |v: &Value, i: usize| v["choices"][i]["text"].as_str().unwrap().to_string();
    let ids = |t: &str| t.chars().map(|c| c as u32 - 0x21).collect::<Vec<u32>>();
    let (abcd, bcde) = (text(&ask(json!("ABCD"), json!({})).1, 0), text(&ask(json!("BCDE"), json!({})).1, 0));
    for prompt in [json!(["ABCD", "BCDE"]), json!([ids("ABCD"), ids("BCDE")])] {
        let (status, v) = ask(prompt.clone(), json!({}));
        assert_eq!(status, 200, "{v}");
        assert_eq!((text(&v, 0), text(&v, 1)), (abcd.clone(), bcde.clone()), "{prompt}");
        assert_eq!((v["choices"][1]["index"].as_u64(), v["usage"]["prompt_tokens"].as_u64()), (Some(1), Some(8)));
    }
    assert_eq!(text(&ask(json!(ids("ABCD")), json!({})).1, 0), abcd, "token ids");
    let v = ask(json!([ids("ABCD"), ids("BCDE")]), json!({"echo": true, "logprobs": 0, "n": 2})).1;
    assert_eq!(v["choices"].as_array().unwrap().len(), 4);
    assert_eq!(text(&v, 3), format!("BCDE{bcde}"), "echo of token ids, the second prompt's second choice");
    assert!(v["choices"][2]["logprobs"]["token_logprobs"][1].is_f64(), "{v}");
    let many: Vec<&str> = vec!["AB"; 33];
    for (prompt, extra, expected) in [
        (json!([]), json!({}), "an empty list"),
        (json!([[]]), json!({}), "non-empty list of ids below 48"),
        (json!([48]), json!({}), "non-empty list of ids below 48"),
        (json!([1, "a"]), json!({}), "a string, an array of strings"),
        (json!(many), json!({"n": 2}), "at most 64 answers"),
    ] {
        let (status, v) = ask(prompt.clone(), extra);
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(status == 400 && msg.contains(expected), "{prompt}: {status} {v}");
    }
}

/// With `--tree auto` (the default), the server measures forward costs once per set of
/// candidate trees and keeps them: without the warm-up (`--no-warmup`, which measures both
/// before listening: `serve_warms_up_before_it_listens`), requests alternating temperature 0
/// (chains) and 0.7 (chains and multi-draft trees) measure on the first of each kind only
/// (`mdsd.auto_costs_s`).
#[test]
fn serve_keeps_auto_costs_across_temperatures() {
    let dir = temp_dir("serve-auto");
    let target = Tiny::llama(61).write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let draft = Tiny { layers: 1, ..Tiny::llama(62) }.write_hf(&dir.join("draft"));
    let server = start(&["--target", s(&target), "--draft", s(&draft), "--tree", "auto", "--no-warmup"]);
    let costs: Vec<f64> = [0.0, 0.7, 0.0, 0.7]
        .iter()
        .map(|t| {
            let body = json!({"prompt": "ABCD", "max_tokens": 4, "ignore_eos": true, "temperature": t, "seed": 1});
            let (status, v) = post(server.port, "/v1/completions", &body);
            assert_eq!(status, 200, "{v}");
            v["mdsd"]["auto_costs_s"].as_f64().unwrap_or_else(|| panic!("no auto_costs_s: {v}"))
        })
        .collect();
    assert!(costs[0] > 0.0 && costs[1] > 0.0, "the first request of each temperature measures: {costs:?}");
    assert_eq!(costs[2..], [0.0, 0.0], "costs measured again: {costs:?}");
}
