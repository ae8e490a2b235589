//! Continuous batching in `mdsd serve` and `generate --jsonl --max-batch`: requests arriving at
//! staggered times with different prompts, lengths, trees of drafts and sampling get, batched,
//! the answers they get alone (at temperature 0, and with `--reproducible` at any temperature),
//! with drafts accepted and forwards that held several sequences.

use super::{metrics, post, s, start};
use crate::cli::piped;
use crate::common::{temp_dir, Tiny};
use serde_json::{json, Value};
use std::time::Duration;

/// Eight requests: prompts of 2 to 40 characters, 3 to 40 tokens each, streamed or not, some
/// at temperature 1 with a seed.
fn requests(temperature_one: bool) -> Vec<Value> {
    (0..8)
        .map(|i| {
            let prompt: String = "ABCDEFGHIJKLMNOPQRSTUVWXYZ".chars().cycle().skip(i * 3).take(2 + i * 5).collect();
            let mut body = json!({
                "prompt": prompt,
                "max_tokens": 3 + (i * 37) % 38,
                "ignore_eos": true,
                "temperature": 0,
                "stream": i % 3 == 1,
            });
            if temperature_one && i % 2 == 0 {
                body["temperature"] = 1.0.into();
                body["seed"] = (100 + i as u64).into();
            }
            body
        })
        .collect()
}

/// The text of an answer, streamed or not.
fn answer_text(port: u16, body: &Value) -> String {
    if body["stream"] == true {
        super::events(port, "/v1/completions", body)
            .iter()
            .map(|e| e["choices"][0]["text"].as_str().unwrap_or_default().to_string())
            .collect()
    } else {
        let (status, v) = post(port, "/v1/completions", body);
        assert_eq!(status, 200, "{v}");
        v["choices"][0]["text"].as_str().unwrap().to_string()
    }
}

/// Batched answers (up to four at once, arrivals 0-70 ms apart, then closer waves until a
/// forward held two) equal the answers of a server answering one request at a time, at
/// temperature 0 and, with `--reproducible`, at temperature 1 too; drafts were accepted and forwards held several sequences.
#[test]
fn serve_batched_answers_equal_solo_answers() {
    let dir = temp_dir("serve-batch");
    let target = Tiny { scale: 0.8, ..Tiny::llama(81) }.write_hf(&dir.join("target"));
    // The draft: the target's first layer (the same embedding), so that drafts are accepted.
    let draft = Tiny { scale: 0.8, layers: 1, ..Tiny::llama(81) }.write_hf(&dir.join("draft"));
    for (flags, temperature_one) in
        [(&["--tree", "drafts-2-depth-2"][..], false), (&["--tree", "chain-3", "--reproducible"][..], true)]
    {
        let models = [&["--target", s(&target), "--draft", s(&draft)][..], flags].concat();
        let solo = start(&[&models[..], &["--max-batch", "1"]].concat());
        let batched = start(&[&models[..], &["--max-batch", "4"]].concat());
        let bodies = requests(temperature_one);
        let alone: Vec<String> = bodies.iter().map(|b| answer_text(solo.port, b)).collect();
        let port = batched.port;
        // Waves of the eight requests until a forward held two of them: the first wave's
        // arrivals are 0-70 ms apart, later waves' 0-3 ms (on a loaded machine tiny answers can
        // end before the next arrives). Every wave's answers must equal the solo answers.
        let mut waves = 0;
        let m = loop {
            waves += 1;
            let spacing = if waves == 1 { 10 } else { 1 };
            let together: Vec<String> = std::thread::scope(|scope| {
                let handles: Vec<_> = bodies
                    .iter()
                    .enumerate()
                    .map(|(i, b)| {
                        scope.spawn(move || {
                            std::thread::sleep(Duration::from_millis(spacing * (i as u64 % 8)));
                            answer_text(port, b)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
                assert_eq!(a, b, "{flags:?}: wave {waves}, request {i} ({}) batched differs from alone", bodies[i]);
            }
            let m = metrics(port);
            if m["batch_widest"] >= 2.0 || waves == 5 {
                break m;
            }
        };
        assert!(m["batch_widest"] >= 2.0, "{flags:?}: no forward held two sequences in {waves} waves: {m:?}");
        assert!(m["steps_accepting_total{depth=\"1\"}"] > 0.0, "{flags:?}: no draft accepted: {m:?}");
        assert_eq!(m["requests_total{outcome=\"generated\"}"], 8.0 * waves as f64);
    }
}

/// `generate --jsonl --max-batch 3` prints, in input order, the lines `--max-batch 1` prints
/// (temperature 0, a draft), and its forwards held several sequences.
#[test]
fn jsonl_batched_equals_one_at_a_time() {
    let dir = temp_dir("jsonl-batch");
    let target = Tiny { scale: 0.8, ..Tiny::llama(82) }.write_hf(&dir.join("target"));
    let draft = Tiny { scale: 0.8, layers: 1, ..Tiny::llama(82) }.write_hf(&dir.join("draft"));
    let input: String = (0..7).map(|i| format!("\"{}\"\n", &"ABCDEFGHIJKLMNOPQRSTUVWXYZ"[i..i + 2 + i * 2])).collect();
    let run = |batch: &str| {
        let out = piped(
            "generate",
            &[
                "--jsonl",
                "--target",
                s(&target),
                "--draft",
                s(&draft),
                "--tree",
                "chain-2",
                "--temperature",
                "0",
                "--max-new-tokens",
                "12",
                "--ignore-eos",
                "--max-batch",
                batch,
            ],
            &input,
        );
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let lines: Vec<Value> =
            String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        (lines, String::from_utf8(out.stderr).unwrap())
    };
    let (one, _) = run("1");
    let (three, log) = run("3");
    assert_eq!(one.len(), 7);
    for (a, b) in one.iter().zip(&three) {
        assert_eq!((&a["line"], &a["text"]), (&b["line"], &b["text"]));
    }
    let widest: usize = log
        .split("widest forward ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no batch summary: {log}"));
    assert!(widest >= 2, "{log}");
}
