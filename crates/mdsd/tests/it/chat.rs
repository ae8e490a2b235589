//! `mdsd chat` end to end on tiny random models: the conversation kept and its prefix reused,
//! and clear errors.

use crate::cli::{fails, generate_greedy_json, piped, s};
use crate::common::{temp_dir, Tiny};
use candle_core::quantized::GgmlDType;
use std::process::Output;

/// Runs `mdsd chat` with `args`, feeding `input` on stdin.
pub(crate) fn chat(args: &[&str], input: &str) -> Output {
    piped("chat", args, input)
}

/// The per-turn summaries' `N reused` figures.
fn reused_per_turn(stderr: &str) -> Vec<usize> {
    stderr
        .lines()
        .filter(|l| l.starts_with('['))
        .map(|l| {
            let before = l.split(" reused").next().unwrap();
            before.rsplit(' ').next().unwrap().parse().unwrap()
        })
        .collect()
}

/// `mdsd chat` keeps the conversation: a second turn reuses the first turn's cached text, a
/// conversation started again after `/clear` gives the first answer again (temperature 0),
/// which is `generate --chat`'s; `--no-prefix-reuse` gives the same answers having reused
/// nothing; commands and blank lines are not messages, a block between triple quotes is one,
/// and input after `/quit` is not read.
#[test]
fn chat_keeps_the_conversation_and_reuses_its_prefix() {
    let dir = temp_dir("cli-chat");
    let target = Tiny::chat_llama(43).write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let draft = Tiny { layers: 1, ..Tiny::llama(44) }.write_hf(&dir.join("draft"));
    let flags = ["--target", s(&target), "--draft", s(&draft), "--temperature", "0", "--max-new-tokens", "8"];
    let flags = [&flags[..], &["--ignore-eos", "--tree", "chain-2"]].concat();
    // The second message comes as a block of several lines (between triple quotes).
    let input = "ABC\n/help\n\n\"\"\"\nDEF\n\"\"\"\n/clear\nABC\n/quit\nGHI\n";
    let runs: Vec<(String, String)> = [&[][..], &["--no-prefix-reuse"][..]]
        .iter()
        .map(|extra| {
            let out = chat(&[&flags[..], extra].concat(), input);
            let stderr = String::from_utf8_lossy(&out.stderr).to_string();
            assert!(out.status.success(), "{extra:?}: {stderr}");
            (String::from_utf8_lossy(&out.stdout).to_string(), stderr)
        })
        .collect();
    let answers: Vec<&str> = runs[0].0.lines().collect();
    assert_eq!(answers.len(), 3, "{:?}", runs[0]);
    assert_eq!(answers[2], answers[0], "the cleared conversation's first answer");
    assert_eq!(runs[1].0, runs[0].0, "--no-prefix-reuse changes the answers");
    let reused = reused_per_turn(&runs[0].1);
    assert_eq!(reused.len(), 3, "{}", runs[0].1);
    // ">ABC;<" then the answer, ";>DEF;<": the second turn reuses the first prompt and answer.
    assert!(reused[0] == 0 && reused[1] >= 6 + 8 - 1 && reused[2] == 5, "{reused:?}");
    assert_eq!(reused_per_turn(&runs[1].1), [0, 0, 0]);
    assert!(runs[0].1.contains("/clear forgets the conversation") && runs[0].1.contains("(conversation cleared)"));
    let single = generate_greedy_json(&target, "ABC", "8", &["--chat", "--draft", s(&draft), "--ignore-eos"]);
    assert_eq!(single["text"].as_str().unwrap(), answers[0]);
}

/// A turn that outgrows the context is an error that leaves the chat running; flags that do not
/// apply, a model without a chat template and a context too small for a tree are refused.
#[test]
fn chat_errors() {
    let dir = temp_dir("cli-chat-errors");
    let target = Tiny::chat_llama(45).write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let plain = Tiny::llama(45).write_gguf(&dir.join("plain.gguf"), GgmlDType::Q8_0, &[]);
    let flags = ["--target", s(&target), "--no-spec", "--temperature", "0", "--max-new-tokens", "4"];
    let long = "ABCDEFGHIJKLMNOP".repeat(3);
    let out = chat(&[&flags[..], &["--context", "24"]].concat(), &format!("{long}\nAB\n"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("error: the conversation has 51 tokens") && stderr.contains("/clear"), "{stderr}");
    assert_eq!(reused_per_turn(&stderr).len(), 1, "the short message after the error is answered: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for (extra, expected) in
        [(&["--json"][..], "--json does not apply to chat"), (&["--context", "2"][..], "leaves no room")]
    {
        let out = chat(&[&flags[..], extra].concat(), "AB\n");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(expected) && !stderr.contains("panicked"),
            "{extra:?}: {stderr}"
        );
    }
    let out = chat(&["--target", s(&plain), "--no-spec"], "AB\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("has no chat template"), "{stderr}");
    let e = fails(&["generate", "--target", s(&plain), "--prompt", "AB", "--system", "be brief"]);
    assert!(e.contains("--system applies to the chat template"), "{e}");
}
