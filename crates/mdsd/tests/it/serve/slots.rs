//! The pool of generators behind `mdsd serve`: a slot is back in the pool before its
//! answer's end leaves, so that a client's next turn finds the cached text of its last.

use super::{events, post, s, start_with};
use crate::common::{temp_dir, Tiny};
use candle_core::quantized::GgmlDType;
use serde_json::{json, Value};

/// A next turn sent the moment the answer before it ended (streamed or whole) finds the slot
/// that holds its text: the answer's end leaves only once its slot is back in the pool. The
/// server pauses 300 ms before a slot goes back (`MDSD_TEST_SLOT_RETURN_PAUSE_MS`), which
/// turns the race this closed (the next turn took another slot and reused nothing) into a
/// certain failure.
#[test]
fn a_next_turn_sent_at_once_finds_its_slot() {
    let dir = temp_dir("serve-slot-return");
    let target = Tiny::chat_llama(51).write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let args = ["--target", s(&target), "--no-spec", "--temperature", "0", "--max-batch", "2", "--show-reused-tokens"];
    let server = start_with(&args, &[("MDSD_TEST_SLOT_RETURN_PAUSE_MS", "300")]);
    let port = server.port;
    let turn = |messages: Value| json!({"messages": messages, "max_tokens": 8, "ignore_eos": true});
    let first = json!([{"role": "user", "content": "ABC"}]);
    for stream in [false, true, false, true] {
        let mut ask = turn(first.clone());
        let answer = if stream {
            ask["stream"] = true.into();
            let evs = events(port, "/v1/chat/completions", &ask);
            evs.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect::<String>()
        } else {
            let (status, v) = post(port, "/v1/chat/completions", &ask);
            assert_eq!(status, 200, "{v}");
            v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
        };
        next_turn_reuses(port, &answer, &format!("stream {stream}"));
    }
}

/// Sends the turn after `answer` (the 8-token answer to "ABC") and checks that ">ABC;<" and the
/// answer came from the cache (all but the answer's last token at least); `what` names the case.
pub(super) fn next_turn_reuses(port: u16, answer: &str, what: &str) {
    let second = json!([
        {"role": "user", "content": "ABC"},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "DEF"},
    ]);
    let (status, v) =
        post(port, "/v1/chat/completions", &json!({"messages": second, "max_tokens": 8, "ignore_eos": true}));
    assert_eq!(status, 200, "{v}");
    assert!(v["mdsd"]["reused_tokens"].as_u64().unwrap() >= 6 + 8 - 1, "{what}: {v}");
}
