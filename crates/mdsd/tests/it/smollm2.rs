//! Real weights through the binary: SmolLM2-135M-Instruct (GGUF Q4_1), resolved in this process
//! through its manifest (`common::smollm2`: the cache, else fetched), then given to `mdsd` by
//! path with `MDSD_OFFLINE` set.

use candle_core::Device;
use engine::load::{load, LoadOptions};

use crate::common::smollm2;

const PROMPTS: [&str; 3] = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
];

/// `mdsd generate --ignore-eos` keeps generating past the end-of-turn token: at temperature 0
/// the model answers the haiku prompt in fewer than 48 tokens and stops; with the flag it emits
/// exactly 48, beginning with the same text.
#[test]
fn ignore_eos_generates_the_full_length() {
    let path = smollm2();
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["generate", "--target", path.to_str().unwrap(), "--no-spec", "--chat"];
        args.extend_from_slice(&["--prompt", PROMPTS[1], "--temperature", "0", "--max-new-tokens", "48", "--json"]);
        args.extend_from_slice(extra);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mdsd"))
            .args(&args)
            .env("MDSD_OFFLINE", "1")
            .output()
            .expect("run mdsd");
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let stopped = run(&[]);
    assert_eq!(stopped["stop_reason"], "stop_token", "{stopped}");
    assert!(stopped["new_tokens"].as_u64().unwrap() < 48, "{stopped}");
    let full = run(&["--ignore-eos"]);
    assert_eq!((full["new_tokens"].as_u64(), full["stop_reason"].as_str()), (Some(48), Some("max_new_tokens")));
    let (a, b) = (stopped["text"].as_str().unwrap(), full["text"].as_str().unwrap());
    assert!(b.starts_with(a) && b.len() > a.len(), "{a:?} / {b:?}");
}

/// `mdsd chat`: Ctrl-C (SIGINT) during an answer ends it (`stop: interrupted`) and keeps the chat
/// running with what came in the conversation: the next turn reuses it.
#[cfg(unix)]
#[test]
fn chat_interrupt_ends_the_answer_and_keeps_the_conversation() {
    use std::io::{Read, Write};
    use std::process::{Command, Stdio};
    let path = smollm2();
    let mut child = Command::new(env!("CARGO_BIN_EXE_mdsd"))
        .args(["chat", "--target", path.to_str().unwrap(), "--no-spec", "--temperature", "0"])
        .args(["--max-new-tokens", "300", "--ignore-eos"])
        .env("MDSD_OFFLINE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mdsd chat");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"Tell me a very long story about a lighthouse keeper.\n").unwrap();
    stdin.flush().unwrap();
    // The answer has begun once text arrives; then Ctrl-C.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    stdout.read_exact(&mut first).unwrap();
    let sent = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(sent.success());
    stdin.write_all(b"Summarize it.\n").unwrap();
    drop(stdin);
    let reader = std::thread::spawn(move || {
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).unwrap();
        rest
    });
    let out = child.wait_with_output().unwrap();
    reader.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let turns: Vec<&str> = stderr.lines().filter(|l| l.starts_with('[')).collect();
    assert_eq!(turns.len(), 2, "{stderr}");
    assert!(turns[0].contains("stop: interrupted") && stderr.contains("(interrupted"), "{stderr}");
    let new_tokens: usize = turns[0][1..].split(' ').next().unwrap().parse().unwrap();
    assert!(new_tokens < 300, "{stderr}");
    // The second turn's prompt begins with the first's and its cut answer: all cached.
    let number_before = |line: &str, word: &str| -> usize {
        line.split(word).next().unwrap().trim_end().rsplit(' ').next().unwrap().parse().unwrap()
    };
    let (first_prompt, reused) = (number_before(turns[0], " tokens,"), number_before(turns[1], " reused"));
    assert!(reused >= first_prompt, "the second turn reused {reused}: {stderr}");
}

/// `mdsd serve`: a streaming client that hangs up after the first event ends its answer early
/// (the server notices the closed connection at a later event), the server goes on serving,
/// and the next request with that prompt reuses the cached text. Then echoed prompts with the
/// chat template's special tokens, as text and as ids: their offsets index the returned text.
#[test]
fn serve_ends_an_answer_whose_client_hung_up() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpStream;
    use std::process::{Command, Stdio};
    let path = smollm2();
    /// Kills the server when the test ends, a failed assertion included (a server left running
    /// would hold the test's output pipe open).
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Killed(
        Command::new(env!("CARGO_BIN_EXE_mdsd"))
            .args([
                "serve",
                "--port",
                "0",
                "--target",
                path.to_str().unwrap(),
                "--no-spec",
                "--show-reused-tokens",
                "--max-batch",
                "1",
            ])
            .env("MDSD_OFFLINE", "1")
            .stderr(Stdio::piped())
            .spawn()
            .expect("run mdsd serve"),
    );
    let mut log = BufReader::new(child.0.stderr.take().unwrap()).lines();
    let port: u16 = loop {
        let line = log.next().expect("the server's address").unwrap();
        if let Some(rest) = line.split("listening on http://127.0.0.1:").nth(1) {
            break rest.split(' ').next().unwrap().parse().unwrap();
        }
    };
    let request = |body: &str| {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body.as_bytes()).unwrap();
        s
    };
    let prompt = "Once upon a time";
    let long =
        format!(r#"{{"prompt": "{prompt}", "max_tokens": 400, "temperature": 0, "ignore_eos": true, "stream": true}}"#);
    let mut s = request(&long);
    let mut first = [0u8; 200];
    s.read_exact(&mut first).unwrap();
    drop(s);
    let mut s = request(&format!(r#"{{"prompt": "{prompt}", "max_tokens": 2, "temperature": 0}}"#));
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200") && answer.contains(r#""reused_tokens":"#), "{answer}");

    // An echoed prompt's offsets index the returned text: special tokens spelt out in a text
    // prompt take their width, those a decoded id prompt drops take none.
    let tok = load(&path, &Device::Cpu, &LoadOptions::default()).unwrap().tokenizer;
    let spelt = "<|im_start|>user\nNaïve café?<|im_end|>\n<|im_start|>assistant\n";
    let ids = tok.encode(spelt).unwrap();
    let specials = ids.iter().filter(|&&id| tok.token_text(id).starts_with("<|im_")).count();
    assert_eq!(specials, 3, "{ids:?}");
    for prompt in [serde_json::json!(spelt), serde_json::json!(ids)] {
        let body = serde_json::json!({"prompt": prompt, "max_tokens": 0, "echo": true, "logprobs": 0});
        let mut s = request(&body.to_string());
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        let v: serde_json::Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        let choice = &v["choices"][0];
        let text: Vec<char> = choice["text"].as_str().unwrap().chars().collect();
        let offsets: Vec<usize> = choice["logprobs"]["text_offset"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_u64().unwrap() as usize)
            .collect();
        let tokens = choice["logprobs"]["tokens"].as_array().unwrap();
        assert_eq!(offsets.len(), ids.len());
        // A decoded id prompt shows no special token.
        let dropped = !choice["text"].as_str().unwrap().contains("<|im_start|>");
        for (i, (&at, t)) in offsets.iter().zip(tokens).enumerate() {
            let t = t.as_str().unwrap();
            let special = t.starts_with("<|im_");
            let here: String = text[at.min(text.len())..].iter().collect();
            if special && dropped {
                // Dropped from the decoded text: no width.
                assert_eq!(offsets.get(i + 1).copied().unwrap_or(text.len()), at, "{prompt}: {offsets:?}");
            } else if !t.contains('\u{FFFD}') {
                assert!(here.starts_with(t), "{prompt}: token {i} {t:?} at {at} of {text:?} ({offsets:?})");
            }
        }
    }
    drop(child);
    let lines: Vec<String> = log.map_while(Result::ok).collect();
    let served: Vec<&String> = lines.iter().filter(|l| l.starts_with("mdsd serve: POST")).collect();
    assert!(lines.iter().any(|l| l.contains("the client went away")), "{lines:?}");
    // "POST /v1/completions · P + N tokens (R reused) ...": the hung-up answer stopped early.
    let new_tokens: usize = served[0].split(" + ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(new_tokens < 400 && served[0].ends_with("client_gone"), "{lines:?}");
    let asked_again = served.iter().find(|l| l.contains(" + 2 tokens") && l.ends_with("max_new_tokens")).unwrap();
    let reused: usize = asked_again.split('(').nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(reused > 0, "{lines:?}");
}
