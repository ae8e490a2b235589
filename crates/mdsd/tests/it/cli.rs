//! `mdsd generate` end to end on tiny random models, and a clear error for each kind of bad
//! input (never a panic).

use crate::chat::chat;
use crate::common;

use candle_core::quantized::GgmlDType;
use common::{mdsd, temp_dir, Tiny};
use std::path::Path;
use std::process::{Command, Output};

pub(crate) fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `mdsd generate --json --temperature 0` on `target` with `prompt`, `max_new` tokens and
/// `extra` flags, expecting success; returns the JSON object.
pub(crate) fn generate_greedy_json(target: &Path, prompt: &str, max_new: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["generate", "--target", s(target), "--prompt", prompt, "--max-new-tokens", max_new];
    args.extend_from_slice(&["--json", "--temperature", "0"]);
    args.extend_from_slice(extra);
    let out = mdsd(&args);
    assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Runs `mdsd` expecting failure; returns stderr, checking it is an error line, not a panic.
pub(crate) fn fails(args: &[&str]) -> String {
    let out = mdsd(args);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "expected exit 1 for {args:?}; stderr: {err}");
    assert!(err.contains("error:") && !err.contains("panicked"), "{args:?}: {err}");
    err
}

#[test]
fn generate_json_on_tiny_models() {
    let dir = temp_dir("cli-ok");
    let target = Tiny::llama(41).write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let draft = Tiny { layers: 1, ..Tiny::llama(42) }.write_hf(&dir.join("draft"));
    for extra in [
        &["--tree", "mc_sim_7b_63", "--draft-sampling", "wor"][..],
        &["--no-spec"][..],
        &["--tree", "auto", "--draft-sampling", "wor"][..],
        // The draft sees the first token and the last three (the prompt has seven).
        &["--tree", "chain-2", "--draft-window", "3", "--draft-sinks", "1"][..],
        &[
            "--tree",
            "drafts-2-depth-2",
            "--draft-sampling",
            "wr",
            "--verifier",
            "kseq",
            "--top-k",
            "5",
            "--top-p",
            "0.9",
        ][..],
    ] {
        let mut args = vec![
            "generate",
            "--target",
            s(&target),
            "--draft",
            s(&draft),
            "--prompt",
            "ABCDEFG",
            "--max-new-tokens",
            "20",
            "--json",
            "--temperature",
            "0.9",
            "--seed",
            "5",
        ];
        args.extend_from_slice(extra);
        let out = mdsd(&args);
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        // 20 tokens, unless these random models sampled their end-of-turn token first.
        let new_tokens = v["new_tokens"].as_u64().unwrap();
        assert!(new_tokens == 20 || (new_tokens < 20 && v["stop_reason"] == "stop_token"), "{v}");
        assert_eq!(v["prompt_tokens"], 7);
        let forwards = v["target_forwards"].as_u64().unwrap();
        let tau = v["tau"].as_f64().unwrap();
        assert!((tau - new_tokens as f64 / forwards as f64).abs() < 1e-9, "{v}");
        assert!(v["text"].as_str().unwrap().chars().count() == new_tokens as usize, "{v}");
        for key in ["tokens_per_s", "draft_s", "target_s", "verify_s", "acceptance_per_depth", "stop_reason"] {
            assert!(v.get(key).is_some(), "missing {key}: {v}");
        }
        if extra.contains(&"--draft-window") {
            assert_eq!(v["draft_window"], serde_json::json!({ "sinks": 1, "recent": 3 }), "{v}");
        } else if extra.contains(&"--no-spec") {
            assert!(v["draft_window"].is_null(), "{v}");
        } else {
            assert_eq!(v["draft_window"], serde_json::json!({ "sinks": 4, "recent": 256 }), "{v}");
        }
        if extra.contains(&"auto") {
            assert!(v["auto_tree"].as_str().unwrap().starts_with("alpha "), "{v}");
        }
    }
    // Streaming mode prints the text and the stats. A fixed tree: the default (`auto`) may
    // choose not to draft at all on models this small, and then has no acceptance per depth.
    let out = mdsd(&[
        "generate",
        "--target",
        s(&target),
        "--draft",
        s(&draft),
        "--prompt",
        "ABC",
        "--max-new-tokens",
        "8",
        "--tree",
        "chain-2",
    ]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tau") && err.contains("acceptance per depth") && err.contains("tokens/s"), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim().chars().count(), 8);
}

/// `--reproducible`: at temperature 0.9 the text of one seed is the same with `--no-spec`,
/// with a chain, EAGLE's sparse tree, `auto`, n-gram lookup only and a draft window; another
/// seed gives another text; the JSON and the stats header say so; and the flags it replaces
/// are refused.
#[test]
fn reproducible_texts_do_not_depend_on_the_drafts() {
    let dir = temp_dir("cli-reproducible");
    let target = Tiny::llama(43).write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let draft = Tiny { layers: 1, ..Tiny::llama(44) }.write_hf(&dir.join("draft"));
    let run = |seed: &str, extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["generate", "--target", s(&target), "--prompt", "ABCDEFG"];
        if !extra.contains(&"only") {
            args.extend_from_slice(&["--draft", s(&draft)]);
        }
        args.extend_from_slice(&["--max-new-tokens", "24", "--json", "--temperature", "0.9", "--top-p", "0.95"]);
        args.extend_from_slice(&["--seed", seed, "--reproducible"]);
        args.extend_from_slice(extra);
        let out = mdsd(&args);
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let plain = run("5", &["--no-spec"]);
    assert_eq!(plain["randomness"], "positional", "{plain}");
    assert_eq!(plain["new_tokens"], 24, "{plain}");
    for extra in [
        &["--tree", "chain-2"][..],
        &["--tree", "mc_sim_7b_63"][..],
        &["--tree", "auto"][..],
        &["--ngram", "only"][..],
        &["--tree", "chain-3", "--draft-window", "2", "--draft-sinks", "1", "--ngram", "off"][..],
    ] {
        let v = run("5", extra);
        assert_eq!(v["text"], plain["text"], "{extra:?}: {v}");
        assert_eq!((&v["verifier"], &v["randomness"]), (&"positional".into(), &"positional".into()), "{v}");
    }
    assert_ne!(run("6", &["--tree", "chain-2"])["text"], plain["text"], "seeds 5 and 6 gave one text");
    let mut args = vec!["generate", "--target", s(&target), "--draft", s(&draft), "--prompt", "ABC"];
    args.extend_from_slice(&["--max-new-tokens", "4", "--tree", "chain-2", "--reproducible", "--seed", "9"]);
    let out = mdsd(&args);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("then positional races · draft window 4+256 · reproducible (seed 9)"), "{err}");
    for flag in [["--draft-sampling", "wor"], ["--verifier", "rrs"]] {
        let mut args =
            vec!["generate", "--target", s(&target), "--draft", s(&draft), "--prompt", "A", "--reproducible"];
        args.extend_from_slice(&flag);
        let err = fails(&args);
        assert!(err.contains(flag[0]) && err.contains("--reproducible"), "{err}");
    }
}

#[test]
fn bad_inputs_give_clear_errors() {
    let dir = temp_dir("cli-bad");
    let tiny = Tiny::llama(43);
    let good = tiny.write_gguf(&dir.join("good.gguf"), GgmlDType::F32, &[]);
    let gen = |target: &Path, draft: &Path, more: &[&str]| -> String {
        let mut args =
            vec!["generate", "--target", s(target), "--draft", s(draft), "--prompt", "ABCD", "--max-new-tokens", "4"];
        args.extend_from_slice(more);
        fails(&args)
    };

    // Truncated GGUF.
    let bytes = std::fs::read(&good).unwrap();
    let truncated = dir.join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let e = gen(&truncated, &good, &[]);
    assert!(e.contains("truncated.gguf") && e.contains("truncated GGUF file"), "{e}");
    // Not a GGUF at all.
    let junk = dir.join("junk.gguf");
    std::fs::write(&junk, b"this is not a model").unwrap();
    let e = gen(&good, &junk, &[]);
    assert!(e.contains("junk.gguf") && e.contains("not a valid GGUF file"), "{e}");
    // Missing tensor in a GGUF file.
    let missing = tiny.write_gguf(&dir.join("missing.gguf"), GgmlDType::F32, &["blk.1.ffn_up.weight"]);
    let e = gen(&missing, &good, &[]);
    assert!(e.contains("missing.gguf") && e.contains("missing tensor `blk.1.ffn_up.weight`"), "{e}");
    // Missing tensor in a safetensors folder.
    let hf = tiny.write_hf(&dir.join("hf-missing"));
    let mut w = tiny.weights();
    w.remove("model.layers.0.mlp.down_proj.weight");
    candle_core::safetensors::save(&w, hf.join("model.safetensors")).unwrap();
    let e = gen(&hf, &good, &[]);
    assert!(e.contains("model.safetensors") && e.contains("model.layers.0.mlp.down_proj.weight"), "{e}");
    // Truncated safetensors.
    let hf2 = tiny.write_hf(&dir.join("hf-trunc"));
    let st = std::fs::read(hf2.join("model.safetensors")).unwrap();
    std::fs::write(hf2.join("model.safetensors"), &st[..st.len() / 2]).unwrap();
    let e = gen(&hf2, &good, &[]);
    assert!(e.contains("model.safetensors") && e.contains("truncated safetensors file"), "{e}");
    // Missing file.
    let e = gen(&dir.join("nowhere.gguf"), &good, &[]);
    assert!(e.contains("nowhere.gguf") && e.contains("no such model file"), "{e}");
    // Vocabulary mismatch: a larger draft vocabulary, and an equal size with other tokens.
    let bigger = Tiny { vocab: 50, ..Tiny::llama(44) }.write_gguf(&dir.join("bigger.gguf"), GgmlDType::F32, &[]);
    let e = gen(&good, &bigger, &[]);
    assert!(e.contains("vocabulary mismatch") && e.contains("bigger.gguf"), "{e}");
    let other_dir = Tiny::llama(45).write_hf(&dir.join("other-vocab"));
    let mut tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(other_dir.join("tokenizer.json")).unwrap()).unwrap();
    let vocab = tok["model"]["vocab"].as_object_mut().unwrap();
    vocab.remove("A");
    vocab.insert("Z".repeat(2), serde_json::json!(32));
    std::fs::write(other_dir.join("tokenizer.json"), tok.to_string()).unwrap();
    let e = gen(&good, &other_dir, &[]);
    assert!(e.contains("vocabulary mismatch") && e.contains("token 32"), "{e}");
    // A smaller draft vocabulary that is a prefix of the target's is accepted (q = 0 beyond);
    // target ids beyond it (here in the prompt: J, K, L, M are ids 41..44) reach the draft as id 0.
    let prefix = Tiny { vocab: 40, ..Tiny::llama(46) }.write_gguf(&dir.join("prefix.gguf"), GgmlDType::F32, &[]);
    let out = mdsd(&[
        "generate",
        "--target",
        s(&good),
        "--draft",
        s(&prefix),
        "--prompt",
        "ABJKLM",
        "--max-new-tokens",
        "6",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Malformed tree file.
    let tree = dir.join("bad-tree.toml");
    std::fs::write(&tree, "paths = [[0], [0, 0], [2, 1]]\n").unwrap();
    let e = gen(&good, &good, &["--tree", s(&tree)]);
    assert!(e.contains("bad-tree.toml"), "{e}");
    let e = gen(&good, &good, &["--tree", "drafts-0-depth-2"]);
    assert!(e.contains("drafts-0-depth-2"), "{e}");
    // An unknown name says what --tree takes.
    let e = gen(&good, &good, &["--tree", "chain-three"]);
    assert!(
        e.contains("chain-three") && e.contains("`auto`") && e.contains("TOML file") && e.contains("path list"),
        "{e}"
    );
    // Prompt longer than the context (256 positions).
    let long = "ABCDEFGH".repeat(40);
    let e = fails(&["generate", "--target", s(&good), "--draft", s(&good), "--prompt", &long]);
    assert!(e.contains("320 tokens") && e.contains("context"), "{e}");
    // Invalid construction/verifier pair, spechub on a chain, bad sampling parameters.
    let e = gen(&good, &good, &["--draft-sampling", "wor", "--verifier", "kseq"]);
    assert!(e.contains("kseq") && e.contains("wor"), "{e}");
    let e = gen(&good, &good, &["--draft-sampling", "spechub", "--tree", "chain-3"]);
    assert!(e.contains("spechub") && e.contains("chain-3"), "{e}");
    let e = gen(&good, &good, &["--draft-sampling", "spechub", "--tree", "auto"]);
    assert!(e.contains("spechub") && e.contains("--tree auto"), "{e}");
    let e = gen(&good, &good, &["--top-p", "1.5"]);
    assert!(e.contains("top-p"), "{e}");
    let e = gen(&good, &good, &["--min-p", "1.5"]);
    assert!(e.contains("min-p must be in [0, 1], got 1.5"), "{e}");
    // A negative value reaches the range check (not clap's "unexpected argument").
    let e = gen(&good, &good, &["--temperature", "-1"]);
    assert!(e.contains("temperature must be finite and >= 0, got -1"), "{e}");
    let e = gen(&good, &good, &["--draft-temperature", "-0.5"]);
    assert!(e.contains("-0.5"), "{e}");
    let e = gen(&good, &good, &["--draft-confidence", "-1"]);
    assert!(e.contains("--draft-confidence must be in [0, 1], got -1"), "{e}");
    // NaN logits: a model whose output head is NaN.
    let mut nan = Tiny::llama(47);
    nan.tied = false;
    let nan_dir = nan.write_hf(&dir.join("nan"));
    let mut w = nan.weights();
    let head = w["lm_head.weight"].clone();
    w.insert("lm_head.weight".into(), (head * f64::NAN).unwrap());
    candle_core::safetensors::save(&w, nan_dir.join("model.safetensors")).unwrap();
    let e = fails(&["generate", "--target", s(&nan_dir), "--no-spec", "--prompt", "ABCD", "--max-new-tokens", "4"]);
    assert!(e.contains("invalid logits") && e.contains("NaN"), "{e}");
    // No prompt.
    let e = fails(&["generate", "--target", s(&good), "--no-spec"]);
    assert!(e.contains("--prompt"), "{e}");
    // A device this build cannot use, or that does not exist.
    if !candle_core::utils::cuda_is_available() {
        let e = gen(&good, &good, &["--device", "cuda:1"]);
        assert!(e.contains("device `cuda:1`") && e.contains("--features cuda"), "{e}");
    }
    let e = gen(&good, &good, &["--device", "gpu"]);
    assert!(e.contains("unknown device `gpu`"), "{e}");
}

/// `--eagle DIR`: drafts from an EAGLE head (`pytorch_model.bin`) on a tiny Hugging Face
/// target; at temperature 0 the text equals `--no-spec`'s, with a fixed tree and with
/// `--tree auto`. A head of the wrong size is refused.
#[test]
fn generate_with_an_eagle_head() {
    let dir = temp_dir("cli-eagle");
    let tiny = Tiny::llama(48);
    let target = tiny.write_hf(&dir.join("target"));
    let head =
        common::TinyEagle { target: tiny, seed: 49, own_embedding: false, scale: 0.3 }.write(&dir.join("head"), true);
    let run = |extra: &[&str]| generate_greedy_json(&target, "ABCDEF", "16", extra);
    let plain = run(&["--no-spec"]);
    let eagle = run(&["--eagle", s(&head), "--tree", "drafts-2-depth-2", "--draft-sampling", "wor"]);
    assert_eq!(eagle["text"], plain["text"], "{eagle}");
    assert!(eagle["draft"].as_str().unwrap().ends_with("pytorch_model.bin"), "{eagle}");
    assert!(eagle["draft_forwards"].as_u64().unwrap() > 0, "{eagle}");
    let wrong = common::TinyEagle {
        target: Tiny { hidden: 16, heads: 2, kv_heads: 1, ..tiny },
        seed: 1,
        own_embedding: false,
        scale: 0.3,
    }
    .write(&dir.join("wrong"), false);
    let e = fails(&["generate", "--target", s(&target), "--prompt", "AB", "--eagle", s(&wrong)]);
    assert!(e.contains("hidden size 16") && e.contains("config.json"), "{e}");
    // At temperature 0 the head's q is one-hot: a branching tree runs as a chain, and the user
    // is told so; with a draft temperature its top tokens fill the branches (more rows a
    // step), the text unchanged; a chain, or a draft temperature, gets no warning.
    let with_stderr = |extra: &[&str]| {
        let mut args = vec!["generate", "--target", s(&target), "--prompt", "ABCDEF", "--max-new-tokens", "16"];
        args.extend_from_slice(&["--json", "--temperature", "0", "--eagle", s(&head)]);
        args.extend_from_slice(extra);
        let out = mdsd(&args);
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (v, String::from_utf8_lossy(&out.stderr).to_string())
    };
    let rows_per_step =
        |v: &serde_json::Value| v["target_rows"].as_f64().unwrap() / v["target_forwards"].as_f64().unwrap().max(1.0);
    let (collapsed, said) = with_stderr(&["--tree", "drafts-2-depth-2", "--draft-sampling", "topk"]);
    assert!(
        said.contains("warning") && said.contains("drafts-2-depth-2") && said.contains("--draft-temperature 1"),
        "{said}"
    );
    let (wide, said) =
        with_stderr(&["--tree", "drafts-2-depth-2", "--draft-sampling", "topk", "--draft-temperature", "1"]);
    assert!(!said.contains("warning"), "{said}");
    assert_eq!((&wide["text"], &collapsed["text"]), (&plain["text"], &plain["text"]));
    assert!(rows_per_step(&wide) > rows_per_step(&collapsed) + 1.0, "{wide} against {collapsed}");
    let (_, said) = with_stderr(&["--tree", "chain-3"]);
    assert!(!said.contains("warning"), "{said}");
    // `--tree auto` with the head: the same text, and the choice is reported.
    let auto = run(&["--eagle", s(&head), "--tree", "auto", "--draft-sampling", "wor"]);
    assert_eq!(auto["text"], plain["text"], "{auto}");
    assert!(auto["auto_tree"].as_str().unwrap().starts_with("alpha "), "{auto}");
}

/// `--ngram only`: prompt-lookup drafting with no draft model gives the `--no-spec` text at
/// temperature 0, and so does `--ngram first` (the default) with a draft model; what does not
/// apply is refused.
#[test]
fn generate_with_ngram_lookup() {
    let dir = temp_dir("cli-ngram");
    let target = Tiny { scale: 0.8, ..Tiny::llama(44) }.write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let run = |extra: &[&str]| generate_greedy_json(&target, "ABCDABCDABCDAB", "24", extra);
    let plain = run(&["--no-spec"]);
    for extra in [&["--ngram", "only"][..], &["--ngram", "only", "--ngram-min", "1", "--tree", "drafts-2-depth-3"][..]]
    {
        let v = run(extra);
        assert_eq!(v["text"], plain["text"], "{extra:?}: {v}");
        assert_eq!(v["draft_forwards"], 0, "{v}");
        assert!(v["draft"].as_str().unwrap().starts_with("ngram "), "{v}");
        assert_eq!(v["verifier"], "topk", "{v}");
        assert!(v["target_rows"].as_u64().unwrap() > v["target_forwards"].as_u64().unwrap(), "nothing drafted: {v}");
    }
    assert_eq!(run(&["--ngram", "only"])["tree"], "chain-4");
    // Lookup on the steps whose context has a match, a draft model on the others.
    let draft = Tiny { layers: 1, ..Tiny::llama(45) }.write_hf(&dir.join("draft"));
    let mixed = run(&["--draft", s(&draft), "--tree", "chain-2", "--ngram-tree", "drafts-2-depth-2"]);
    assert_eq!(mixed["text"], plain["text"], "{mixed}");
    assert_eq!(mixed["ngram"], "first", "the default: {mixed}");
    let (steps, forwards) = (mixed["ngram_steps"].as_u64().unwrap(), mixed["target_forwards"].as_u64().unwrap());
    assert!(steps > 0 && mixed["draft_forwards"].as_u64().unwrap() > 0, "{mixed}");
    assert!(steps <= forwards, "{mixed}");
    // A lookup step emits its accepted drafts plus one token, at most depth 2 + 1 here.
    let tokens = mixed["ngram_tokens"].as_u64().unwrap();
    assert!(tokens >= steps && tokens <= 3 * steps, "{mixed}");
    let off = run(&["--draft", s(&draft), "--tree", "chain-2", "--ngram", "off"]);
    assert_eq!(off["text"], plain["text"], "{off}");
    assert_eq!((off["ngram_steps"].as_u64(), off["ngram_tokens"].as_u64()), (Some(0), Some(0)), "{off}");
    // The draft window's default: 256 recent tokens when lookup does the copying, the whole
    // context for a draft model alone.
    assert_eq!(mixed["draft_window"], serde_json::json!({ "sinks": 4, "recent": 256 }), "{mixed}");
    assert!(off["draft_window"].is_null(), "{off}");
    let e =
        fails(&["generate", "--target", s(&target), "--draft", s(&draft), "--prompt", "AB", "--ngram-tree", "chain-0"]);
    assert!(e.contains("--ngram-tree `chain-0`"), "{e}");
    let base = ["generate", "--target", s(&target), "--prompt", "ABAB", "--ngram", "only"];
    let with = |extra: &[&'static str]| [&base[..], extra].concat();
    let e = fails(&with(&["--verifier", "rrs"]));
    assert!(e.contains("deterministic") && e.contains("topk"), "{e}");
    let e = fails(&with(&["--tree", "auto"]));
    assert!(e.contains("fixed tree"), "{e}");
    let e = fails(&with(&["--ngram-min", "3", "--ngram-max", "2"]));
    assert!(e.contains("--ngram only") && e.contains("min 3"), "{e}");
    // Flags of a draft model do not apply to it.
    for flag in [&["--draft", "x.gguf"][..], &["--draft-temperature", "1"][..], &["--draft-sampling", "wr"][..]] {
        let e = fails(&with(flag));
        assert!(e.contains(flag[0]) && e.contains("does not apply to --ngram only"), "{flag:?}: {e}");
    }
    let out = mdsd(&["generate", "--target", s(&target), "--prompt", "AB", "--ngram", "sometimes"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("off, first, only"));
}

/// `mdsd fetch` resolves a pair from the cache and converts its GGUF draft for the CPU, once:
/// a second fetch finds the copy.
#[test]
fn fetch_resolves_a_pair_and_converts_its_draft_once() {
    let dir = temp_dir("fetch");
    let (cache, models) = (dir.join("cache"), dir.join("models"));
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::create_dir_all(&models).unwrap();
    let tiny = Tiny { hidden: 64, ..Tiny::llama(41) };
    tiny.write_gguf(&cache.join("t.gguf"), GgmlDType::F32, &[]);
    tiny.write_gguf(&cache.join("d.gguf"), GgmlDType::Q8_0, &[]);
    std::fs::write(
        models.join("tiny.toml"),
        "name = \"tiny\"\n[target]\nhub_repo = \"x/t\"\nfile = \"t.gguf\"\n[draft]\nhub_repo = \"x/d\"\nfile = \"d.gguf\"\n",
    )
    .unwrap();
    let fetch = || {
        Command::new(env!("CARGO_BIN_EXE_mdsd"))
            .args(["fetch", "tiny", "--models-dir", models.to_str().unwrap()])
            .env("MDSD_OFFLINE", "1")
            .env("MDSD_CACHE", &cache)
            .output()
            .unwrap()
    };
    let converted = || std::fs::read_dir(cache.join("converted")).map_or(0, |d| d.count());
    for round in 0..2 {
        let out = fetch();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "round {round}: {stderr}");
        assert!(stdout.contains("target: ") && stdout.contains("t.gguf"), "{stdout}");
        assert!(stdout.contains("draft, converted for the CPU: "), "{stdout}");
        assert_eq!(stderr.contains("converting"), round == 0, "round {round}: {stderr}");
        assert_eq!(converted(), 1);
    }
}

/// `--stop` ends the text before the first occurrence of a string, streamed or as JSON
/// (`stop_reason` `stop_string`); an empty one is refused.
#[test]
fn generate_stops_before_a_stop_string() {
    let dir = temp_dir("cli-stop");
    let target = Tiny::llama(46).write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let full = generate_greedy_json(&target, "ABCD", "12", &["--ignore-eos", "--no-spec"]);
    let text = full["text"].as_str().unwrap().to_string();
    assert_eq!(text.chars().count(), 12, "{text}");
    let stop: String = text.chars().skip(4).take(2).collect();
    let cut = &text[..text.find(&stop).unwrap()];
    let json =
        generate_greedy_json(&target, "ABCD", "12", &["--ignore-eos", "--no-spec", "--stop", &stop, "--stop", "QQQ"]);
    assert_eq!((json["text"].as_str().unwrap(), json["stop_reason"].as_str().unwrap()), (cut, "stop_string"));
    let out = mdsd(&[
        "generate",
        "--target",
        s(&target),
        "--prompt",
        "ABCD",
        "--max-new-tokens",
        "12",
        "--temperature",
        "0",
        "--ignore-eos",
        "--no-spec",
        "--stop",
        &stop,
    ]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end_matches('\n'), cut, "streamed");
    // Refused before any model loads (no draft is fetched).
    let e = fails(&["generate", "--target", s(&target), "--prompt", "AB", "--no-spec", "--stop", ""]);
    assert!(e.contains("--stop: an empty stop string"), "{e}");
}

/// `--max-new-tokens` of usize::MAX runs to the end of the context instead of overflowing the
/// capacity sum or aborting on an allocation of that many tokens. Speculative decoding runs to
/// the same end (trees give way to plain steps there), and takes a prompt that leaves room for
/// a few tokens but not for a tree of 26 nodes. A draft with a shorter context (64 positions,
/// the target's weights) leaves the target's context to the text: it drafts within its own
/// context, not at all for a prompt beyond it, and the text equals `--no-spec`'s.
#[test]
fn an_unbounded_token_budget_stops_at_the_context() {
    let dir = temp_dir("cli-budget");
    let target = Tiny::llama(54).write_gguf(&dir.join("target.gguf"), GgmlDType::F32, &[]);
    let short = Tiny { context: 64, ..Tiny::llama(54) }.write_gguf(&dir.join("short.gguf"), GgmlDType::F32, &[]);
    let tree = ["--draft", s(&target), "--tree", "mc_sim_7b_63", "--draft-sampling", "wor", "--ignore-eos"];
    let chain = ["--draft", s(&short), "--tree", "chain-4", "--draft-sampling", "greedy", "--ignore-eos"];
    let long = "ABCDEFGH".repeat(32);
    for prompt in ["ABCD", &long[..250]] {
        let v = generate_greedy_json(&target, prompt, &usize::MAX.to_string(), &["--no-spec", "--ignore-eos"]);
        assert_eq!(v["stop_reason"], "context_length", "{v}");
        let plain = v["new_tokens"].as_u64().unwrap();
        assert!(plain > if prompt.len() < 10 { 200 } else { 2 }, "{v}");
        let w = generate_greedy_json(&target, prompt, &usize::MAX.to_string(), &tree);
        assert_eq!(w["stop_reason"], "context_length", "{w}");
        assert_eq!((w["new_tokens"].as_u64().unwrap(), &w["text"]), (plain, &v["text"]), "{w}");
        // Lookup steps draft past the draft model's context too; without them, only the model.
        for ngram in ["first", "off"] {
            let w = generate_greedy_json(
                &target,
                prompt,
                &usize::MAX.to_string(),
                &[&chain[..], &["--ngram", ngram]].concat(),
            );
            assert_eq!(w["stop_reason"], "context_length", "{w}");
            assert_eq!((w["new_tokens"].as_u64().unwrap(), &w["text"]), (plain, &v["text"]), "{w}");
            let (forwards, drafted) = (w["target_forwards"].as_u64().unwrap(), w["draft_forwards"].as_u64().unwrap());
            if prompt.len() >= 10 {
                assert_eq!((drafted, &w["draft_prefill_tokens"]), (0, &serde_json::json!(0)), "{w}");
            }
            match (ngram, prompt.len() < 10) {
                // Drafts (accepted: the target's weights) up to position 64, plain steps after.
                ("off", true) => {
                    assert!(forwards < plain && forwards + 64 > plain && drafted > 0, "{w}");
                    let undrafted = w["undrafted_steps"].as_u64().unwrap();
                    assert!(undrafted + 64 >= plain && undrafted < forwards, "{w}");
                }
                ("off", false) => assert_eq!((forwards, w["undrafted_steps"].as_u64().unwrap()), (plain, plain), "{w}"),
                _ => {}
            }
        }
    }
    let args = ["generate", "--target", s(&target), "--prompt", &long[..250], "--max-new-tokens", "4"];
    let out = mdsd(&[&args[..], &chain[..], &["--ngram", "off", "--temperature", "0"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("the draft's context (64 positions) is shorter than the target's (256)"), "{err}");
    assert!(err.contains("steps without drafts at the end of the context (or of the draft's): 4 of 4"), "{err}");
}

/// `mdsd tokenize`: the ids `generate` runs (its `prompt_tokens`, with and without `--chat`),
/// from a GGUF file's header and from a model folder's tokenizer.json; `--decode` gives the
/// text back; `--jsonl` tokenizes a line per text; `--prompt-file -` reads standard input (in
/// `generate` too; `chat` refuses it); bad input gets a clear error.
#[test]
fn tokenize_gives_the_ids_generate_runs() {
    let dir = temp_dir("cli-tokenize");
    let tiny = Tiny::chat_llama(58);
    let gguf = tiny.write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let folder = tiny.write_hf(&dir.join("hf"));
    let run = |args: &[&str]| {
        let out = mdsd(&[&["tokenize"][..], args].concat());
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    // The folder has no chat template (`write_hf` writes no tokenizer_config.json).
    for (target, chats) in [(&gguf, &[&[][..], &["--chat"][..]][..]), (&folder, &[&[][..]][..])] {
        for &chat in chats {
            let args = [&["--target", s(target), "--prompt", "ABCDEFG"][..], chat].concat();
            let v: serde_json::Value = serde_json::from_str(&run(&[&args[..], &["--json"]].concat())).unwrap();
            let ids: Vec<u64> = v["ids"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap()).collect();
            assert_eq!(v["count"].as_u64().unwrap() as usize, ids.len());
            assert_eq!(v["tokens"].as_array().unwrap().len(), ids.len());
            let g = generate_greedy_json(target, "ABCDEFG", "1", &[chat, &["--no-spec"]].concat());
            assert_eq!(g["prompt_tokens"].as_u64().unwrap() as usize, ids.len(), "{target:?} {chat:?}");
            let line: Vec<String> = ids.iter().map(u64::to_string).collect();
            assert_eq!(run(&args), format!("{}\n", line.join(" ")));
            if chat.is_empty() {
                let text = run(&["--target", s(target), "--decode", &line.join(",")]);
                assert_eq!(text, "ABCDEFG\n");
            }
        }
    }
    // One line of ids per text; blank lines are skipped.
    let out = piped("tokenize", &["--target", s(&gguf), "--jsonl"], "\"ABC\"\n\n\"DE\"\n");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(String::from).collect();
    let one = |t: &str| run(&["--target", s(&gguf), "--prompt", t]).trim().replace(' ', ",");
    assert_eq!(lines, [format!("[{}]", one("ABC")), format!("[{}]", one("DE"))]);
    let out = piped("tokenize", &["--target", s(&gguf), "--jsonl"], "\"ABC\"\nABC\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(1) && err.contains("standard input, line 2: not a JSON string"), "{err}");
    // A conversation per line goes through the chat template, as `--chat` does for one message.
    let conv = r#"[{"role": "user", "content": "ABC"}]"#;
    let out = piped("tokenize", &["--target", s(&gguf), "--jsonl"], &format!("{conv}\n[{{\"role\": 1}}]\n"));
    let chat_ids = run(&["--target", s(&gguf), "--chat", "--prompt", "ABC"]).trim().replace(' ', ",");
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("[{chat_ids}]\n"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("standard input, line 2") && err.contains("a message is not"), "{err}");
    let target = ["tokenize", "--target", s(&gguf)];
    for (extra, want) in [
        (&[][..], "give a text with --prompt TEXT"),
        (&["--decode", "1 x"][..], "--decode: `x` is not a token id"),
        (&["--decode", "1,100000"][..], "--decode: token id 100000 is beyond the vocabulary of"),
    ] {
        let err = fails(&[&target[..], extra].concat());
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    // `--prompt-file -` reads standard input, in generate and tokenize; chat refuses it (its
    // messages come on standard input).
    let from_stdin = piped("tokenize", &["--target", s(&gguf), "--prompt-file", "-"], "ABCDEFG");
    assert_eq!(String::from_utf8_lossy(&from_stdin.stdout), run(&["--target", s(&gguf), "--prompt", "ABCDEFG"]));
    let flags = ["--target", s(&gguf), "--json", "--temperature", "0", "--max-new-tokens", "4", "--no-spec"];
    let out = piped("generate", &[&flags[..], &["--prompt-file", "-"]].concat(), "ABCDEFG");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let piped_text: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let given = generate_greedy_json(&gguf, "ABCDEFG", "4", &["--no-spec"]);
    assert_eq!((&piped_text["text"], &piped_text["prompt_tokens"]), (&given["text"], &given["prompt_tokens"]));
    let out = chat(&["--target", s(&gguf), "--prompt-file", "-"], "hi\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(1) && err.contains("chat reads its messages from standard input"), "{err}");
    let missing = dir.join("missing.gguf");
    let err = fails(&["tokenize", "--target", s(&missing), "--prompt", "A"]);
    assert!(err.contains("missing.gguf") && err.contains("no such model file"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `generate --jsonl`: one answer per input line, in order, each what `generate --json` gives
/// for that prompt alone (temperature 0; the lines share one generator and its cached
/// prefixes); a conversation line goes through the chat template; a bad line gets an `error`
/// answer, the others are still answered, and the exit status is 1. `chat` and `serve`
/// refuse the flag.
#[test]
fn generate_jsonl_answers_each_line_as_generate_does() {
    let dir = temp_dir("cli-jsonl");
    let target = Tiny::chat_llama(59).write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let draft = Tiny { layers: 1, ..Tiny::llama(60) }.write_hf(&dir.join("draft"));
    let flags = ["--target", s(&target), "--draft", s(&draft), "--tree", "chain-2", "--ignore-eos"];
    let alone =
        |prompt: &str, extra: &[&str]| generate_greedy_json(&target, prompt, "6", &[&flags[2..], extra].concat());
    let input = "\"ABCD\"\n\n[{\"role\": \"user\", \"content\": \"ABC\"}]\n7\n\"ABCDEF\"\n";
    let args = [&flags[..], &["--temperature", "0", "--max-new-tokens", "6", "--jsonl"]].concat();
    for chat in [false, true] {
        let args = if chat { [&args[..], &["--chat"]].concat() } else { args.clone() };
        let out = piped("generate", &args, input);
        assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
        let lines: Vec<serde_json::Value> =
            String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.iter().map(|l| l["line"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 3, 4, 5]);
        let extra: &[&str] = if chat { &["--chat"] } else { &[] };
        for (got, prompt) in [(&lines[0], "ABCD"), (&lines[3], "ABCDEF")] {
            let want = alone(prompt, extra);
            assert_eq!((&got["text"], &got["prompt_tokens"]), (&want["text"], &want["prompt_tokens"]), "{got}");
        }
        // The conversation of one user message is `--chat`'s rendering of that message.
        let want = alone("ABC", &["--chat"]);
        assert_eq!((&lines[1]["text"], &lines[1]["prompt_tokens"]), (&want["text"], &want["prompt_tokens"]));
        assert_eq!(lines[2]["error"], "not a JSON string nor a list of messages");
        // With the chat template, line 5 shares `>ABC` with the conversation before it, and
        // reuses those rows.
        if chat {
            assert!(lines[3]["reused_tokens"].as_u64().unwrap() > 0, "{}", lines[3]);
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("1 of 4 lines failed"), "{err}");
    }
    // Log-probabilities come with each line's answer, for that line's tokens alone.
    let out = piped("generate", &[&args[..], &["--logprobs", "1", "--prompt-logprobs"]].concat(), "\"ABCD\"\n\"AB\"\n");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let count =
            |key: &str| v[key].as_array().map(Vec::len).unwrap_or_else(|| v[key]["tokens"].as_array().unwrap().len());
        assert_eq!(count("logprobs") as u64, v["new_tokens"].as_u64().unwrap(), "{v}");
        assert_eq!(count("prompt_logprobs") as u64 + 1, v["prompt_tokens"].as_u64().unwrap(), "{v}");
    }
    let err = fails(&["chat", "--target", s(&target), "--jsonl"]);
    assert!(err.contains("--jsonl does not apply to chat"), "{err}");
    let err = fails(&["serve", "--target", s(&target), "--jsonl"]);
    assert!(err.contains("--jsonl does not apply to serve"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `mdsd COMMAND` with `args`, feeding `input` on stdin.
pub(crate) fn piped(command: &str, args: &[&str], input: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_mdsd"))
        .arg(command)
        .args(args)
        .env("MDSD_OFFLINE", "1")
        .env("MDSD_CACHE", common::test_cache())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run mdsd");
    // A command refused at start exits before reading its input: a broken pipe here is expected.
    let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
    child.wait_with_output().unwrap()
}
