//! `mdsd generate` on checkpoints with rotary scaling: what it says at load (the engine's
//! `checkpoint_configs` checks the numerics).

use crate::common::{self, llama_cpp_rope_freqs, temp_dir, Tiny};
use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;

/// `mdsd generate` says at load which rotary scaling a model applies and the context it gives:
/// here a YaRN target (original context 100, factor 4: 400 positions) with a `llama3` draft,
/// both GGUF, speculative at temperature 0.
#[test]
fn generate_names_the_scaling_at_load() {
    let root = temp_dir("scaling-note");
    let s = |k: &str, x: &str| (k.to_string(), Value::String(x.into()));
    let f = |k: &str, x: f32| (k.to_string(), Value::F32(x));
    let u = |k: &str, x: u32| (k.to_string(), Value::U32(x));
    let qwen = Tiny::qwen2(25);
    let yarn = vec![
        s("qwen2.rope.scaling.type", "yarn"),
        f("qwen2.rope.scaling.factor", 4.0),
        u("qwen2.rope.scaling.original_context_length", 100),
    ];
    let target = qwen.write_gguf_with(&root.join("yarn.gguf"), GgmlDType::F32, &[], yarn, vec![]);
    let llama = Tiny { layers: 1, ..Tiny::llama(26) };
    let freqs = vec![("rope_freqs.weight".to_string(), llama_cpp_rope_freqs(&llama, 10_000.0))];
    let draft = llama.write_gguf_with(&root.join("llama3.gguf"), GgmlDType::F32, &[], vec![], freqs);
    let out = common::mdsd(&[
        "generate",
        "--target",
        target.to_str().unwrap(),
        "--draft",
        draft.to_str().unwrap(),
        "--prompt",
        "ABC",
        "--max-new-tokens",
        "4",
        "--temperature",
        "0",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("(2 layers, YaRN rotary scaling x4, context 400)"), "{stderr}");
    assert!(stderr.contains("(1 layer, rotary frequency factors (rope_freqs), context 256)"), "{stderr}");
}
