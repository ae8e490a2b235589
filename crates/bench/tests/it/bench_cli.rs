//! End-to-end tests of `bench mt-bench`, `bench acceptance`, `bench random-gguf` and `bench
//! random-eagle`: the real binary on tiny random models written as GGUF files (with a chat
//! template), two questions or prompts each. `bench forward-cost`'s are in `forward_cost_cli`.

use crate::common;

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use common::{temp_dir, test_cache, Tiny};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Roles as single vocabulary characters: `<` user, `>` assistant, `=` generation prompt.
const TEMPLATE: &str = "{% for m in messages %}{% if m.role == 'user' %}<{% else %}>{% endif %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}={% endif %}";

/// A target and a one-layer draft with the same 48-token vocabulary.
pub(crate) fn pair(dir: &Path) -> (PathBuf, PathBuf) {
    let t = Tiny { chat_template: Some(TEMPLATE), scale: 0.6, ..Tiny::llama(61) };
    let d = Tiny { chat_template: Some(TEMPLATE), layers: 1, scale: 0.6, ..Tiny::llama(62) };
    (
        t.write_gguf(&dir.join("target.gguf"), GgmlDType::F32, &[]),
        d.write_gguf(&dir.join("draft.gguf"), GgmlDType::F32, &[]),
    )
}

pub(crate) fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

pub(crate) fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .env("MDSD_OFFLINE", "1")
        .env("MDSD_CACHE", test_cache())
        .output()
        .unwrap()
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `subcommand` on missing model files with `fixed` and `extra` options; asserts that it
/// fails and returns its stderr.
fn failing(subcommand: &str, fixed: &[&str], extra: &[&str]) -> String {
    let mut args = vec![subcommand, "--target", "/nonexistent/t.gguf", "--draft", "/nonexistent/d.gguf"];
    args.extend_from_slice(fixed);
    args.extend_from_slice(extra);
    let o = bench(&args);
    assert!(!o.status.success(), "{args:?} succeeded");
    stderr(&o)
}

/// Runs `bench mt-bench` with `(target, draft, questions, out_dir)` (2 questions, 6 new tokens)
/// and `extra` flags, writing `<out_dir>/<name>.*`, and returns its records.
pub(crate) fn run_mt_bench(paths: (&Path, &Path, &Path, &Path), name: &str, extra: &[&str]) -> Vec<Value> {
    let (target, draft, questions, out_dir) = paths;
    let mut args = vec!["mt-bench", "--target", s(target), "--draft", s(draft), "--questions", s(questions)];
    args.extend_from_slice(&["--limit", "2", "--max-new-tokens", "6", "--out-dir", s(out_dir), "--name", name]);
    args.extend_from_slice(extra);
    let o = bench(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::read_to_string(out_dir.join(format!("{name}.records.jsonl")))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub(crate) fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

const QUESTIONS: &str = "{\"question_id\": 1, \"category\": \"math\", \"turns\": [\"ABCD\", \"EFG\"]}\n\
{\"question_id\": 2, \"category\": \"coding\", \"turns\": [\"HIJ+K\", \"LMNO\"]}\n";

/// A tiny pair, the two-question file and a results folder, in a fresh test folder `name`.
pub(crate) fn mt_bench_files(name: &str) -> [std::path::PathBuf; 4] {
    let dir = temp_dir(name);
    let (target, draft) = pair(&dir);
    let questions = dir.join("q.jsonl");
    std::fs::write(&questions, QUESTIONS).unwrap();
    [target, draft, questions, dir.join("results")]
}

#[test]
fn mt_bench_runs_every_cell_on_both_turns() {
    let [target, draft, questions, out_dir] = mt_bench_files("bench-mt");
    let records = run_mt_bench(
        (&target, &draft, &questions, &out_dir),
        "run",
        &[
            "--methods",
            "baseline,rrs-wr,greedy,spechub,ngram,ngram+greedy",
            "--trees",
            // drafts-3-depth-1 as an EAGLE path list
            "drafts-2-depth-2,[[0],[1],[2]]",
            "--temperatures",
            "0,1",
            "--draft-vocab",
            "0",
            // q at temperature 1 in every cell: at T = 0 the trees then hold distinct drafts.
            "--draft-temperature",
            "1",
            // Penalties apply to every cell, target and draft alike; T = 0 cells still agree.
            "--repetition-penalty",
            "1.5",
            "--frequency-penalty",
            "0.5",
        ],
    );
    // Cells: baseline x 2 temperatures, rrs-wr, greedy, ngram and ngram+greedy x 2 trees x 2,
    // spechub x 1 tree x 2.
    let cells = 2 + 4 + 4 + 4 + 4 + 2;
    assert_eq!(records.len(), 2 * 2 * cells);
    let doc = read_json(&out_dir.join("run.json"));
    assert_eq!(doc["records"].as_array().unwrap().len(), records.len());
    assert_eq!(doc["summary"]["cells"].as_array().unwrap().len(), cells);
    assert_eq!(doc["summary"]["by_category"].as_array().unwrap().len(), 2 * cells);
    assert!(doc["config"]["revision"].as_str().is_some_and(|r| !r.is_empty()));
    assert_eq!(doc["config"]["notes"][0], "spechub left out on [[0],[1],[2]]: a node has 3 drafts");
    assert_eq!(doc["config"]["draft_temperature"], 1.0);
    assert_eq!(
        (&doc["config"]["repetition_penalty"], &doc["config"]["presence_penalty"], &doc["config"]["frequency_penalty"]),
        (&Value::from(1.5), &Value::from(0.0), &Value::from(0.5))
    );
    let find = |q: &str, turn: u64, method: &str, tree: &str, t: f64| {
        records
            .iter()
            .find(|r| {
                r["question_id"] == q
                    && r["turn"] == turn
                    && r["method"] == method
                    && r["tree"] == tree
                    && r["temperature"] == t
            })
            .unwrap_or_else(|| panic!("no record {q} {turn} {method} {tree} {t}"))
    };
    for r in &records {
        assert!(r["new_tokens"].as_u64().unwrap() <= 6);
        if r["method"] == "baseline" {
            assert_eq!(r["tau"], 1.0);
        }
        // The second turn carries the first turn's question and this method's answer.
        if r["turn"] == 2 {
            let first = find(
                r["question_id"].as_str().unwrap(),
                1,
                r["method"].as_str().unwrap(),
                r["tree"].as_str().unwrap(),
                r["temperature"].as_f64().unwrap(),
            );
            let own = r["prompt_tokens"].as_u64().unwrap();
            let earlier = first["prompt_tokens"].as_u64().unwrap() + first["new_tokens"].as_u64().unwrap();
            assert!(own > earlier, "turn 2 prompt of {own} tokens does not hold turn 1 ({earlier})");
        }
    }
    // At T = 0 every method returns the target's argmax text: the baseline's answers.
    for q in ["1", "2"] {
        for turn in [1, 2] {
            let base = &find(q, turn, "baseline", "-", 0.0)["answer"];
            for (m, tree) in
                [("rrs-wr", "drafts-2-depth-2"), ("greedy", "[[0],[1],[2]]"), ("spechub", "drafts-2-depth-2")]
                    .into_iter()
                    .chain([("ngram", "drafts-2-depth-2"), ("ngram", "[[0],[1],[2]]")])
                    .chain([("ngram+greedy", "drafts-2-depth-2"), ("ngram+greedy", "[[0],[1],[2]]")])
            {
                assert_eq!(&find(q, turn, m, tree, 0.0)["answer"], base, "{m} on {tree}, question {q} turn {turn}");
            }
        }
    }
    // Every speculative cell has its ratio to the baseline, and to rrs-wr unless it is rrs-wr.
    for c in doc["summary"]["cells"].as_array().unwrap() {
        let spec = c["method"] != "baseline";
        assert_eq!(c["speedup_vs_baseline"].is_object(), spec, "{c}");
        assert_eq!(c["speedup_vs_rrs_wr"].is_object(), spec && c["method"] != "rrs-wr", "{c}");
        assert_eq!(c["questions"], 2);
    }
    // The penalties changed the text: the same baseline without them differs somewhere.
    let plain = run_mt_bench((&target, &draft, &questions, &out_dir), "plain", &["--methods", "baseline"]);
    assert_eq!(plain.len(), 4);
    let changed = plain.iter().filter(|r| {
        let q = r["question_id"].as_str().unwrap();
        r["answer"] != find(q, r["turn"].as_u64().unwrap(), "baseline", "-", 0.0)["answer"]
    });
    assert!(changed.count() > 0, "the penalties changed no baseline answer");
    let md = std::fs::read_to_string(out_dir.join("run.md")).unwrap();
    assert!(md.contains("## T = 0") && md.contains("## T = 1") && md.contains("| greedy | [[0],[1],[2]] |"), "{md}");
    assert!(md.contains("## Per category"));
}

/// `--prefix-reuse`: every second turn reuses the cached first turn, the answers are those of
/// a run without it, and the config records it.
#[test]
fn mt_bench_reuses_prefixes_when_asked() {
    let [target, draft, questions, out_dir] = mt_bench_files("bench-reuse");
    let flags = ["--methods", "baseline,greedy", "--trees", "chain-2", "--temperatures", "0,1"];
    let paths = (target.as_path(), draft.as_path(), questions.as_path(), out_dir.as_path());
    let whole = run_mt_bench(paths, "whole", &flags);
    let reused = run_mt_bench(paths, "reused", &[&flags[..], &["--prefix-reuse"]].concat());
    assert_eq!(whole.len(), 2 * 2 * 4);
    assert_eq!(whole.len(), reused.len());
    for (w, r) in whole.iter().zip(&reused) {
        for key in ["question_id", "turn", "method", "temperature", "answer", "prompt_tokens"] {
            assert_eq!(w[key], r[key], "{key}: {w} / {r}");
        }
        assert_eq!(w["reused_tokens"], 0, "{w}");
        if r["turn"] == 2 {
            // The first turn's prompt and answer at least (the chat template's prefix).
            assert!(r["reused_tokens"].as_u64().unwrap() >= 4, "{r}");
        }
    }
    assert_eq!(read_json(&out_dir.join("reused.json"))["config"]["prefix_reuse"], true);
    assert_eq!(read_json(&out_dir.join("whole.json"))["config"]["prefix_reuse"], false);
}

#[test]
fn mt_bench_rejects_bad_input_clearly() {
    let dir = temp_dir("bench-mt-bad");
    let q = dir.join("q.jsonl");
    std::fs::write(&q, QUESTIONS).unwrap();
    let run = |extra: &[&str]| failing("mt-bench", &["--out-dir", s(&dir)], extra);
    let e = run(&["--questions", s(&q), "--methods", "baseline,fastest"]);
    assert!(e.contains("unknown method `fastest`") && e.contains("rrs-wor"), "{e}");
    let e = run(&["--questions", s(&q), "--methods", "ngram", "--ngram-min", "0"]);
    assert!(e.contains("--ngram-min") && e.contains("min 0"), "{e}");
    let e = run(&["--questions", "/nonexistent/questions.jsonl"]);
    assert!(e.contains("/nonexistent/questions.jsonl"), "{e}");
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, format!("{QUESTIONS}{{\"turns\": \"not a list\"}}\n")).unwrap();
    let e = run(&["--questions", s(&bad), "--limit", "0"]);
    assert!(e.contains("bad.jsonl line 3") && e.contains("turns"), "{e}");
    let e = run(&["--questions", s(&q), "--trees", "drafts-2-depth-x"]);
    assert!(e.contains("drafts-2-depth-x"), "{e}");
    let e = run(&["--questions", s(&q), "--temperatures", "0,-1"]);
    assert!(e.contains("-1"), "{e}");
    let e = run(&["--questions", s(&q), "--draft-temperature=-0.5"]);
    assert!(e.contains("--draft-temperature") && e.contains("-0.5"), "{e}");
    let e = run(&["--questions", s(&q), "--presence-penalty", "3"]);
    assert!(e.contains("presence penalty must be in [-2, 2], got 3") && e.contains("--presence-penalty"), "{e}");
    let e = run(&["--questions", s(&q), "--randomness", "stream,wild"]);
    assert!(e.contains("`wild`") && e.contains("stream or positional"), "{e}");
    // Valid options: the missing model file is named.
    let e = run(&["--questions", s(&q)]);
    assert!(e.contains("/nonexistent/t.gguf"), "{e}");
}

#[cfg(unix)]
#[test]
fn mt_bench_ctrl_c_keeps_finished_questions() {
    let dir = temp_dir("bench-mt-int");
    let (target, draft) = pair(&dir);
    let q = dir.join("q.jsonl");
    let line = "{\"question_id\": 7, \"turns\": [\"ABCDEFGHIJ\", \"KLMNOP\"]}\n";
    std::fs::write(&q, line.repeat(400)).unwrap();
    let out_dir = dir.join("results");
    let child = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args([
            "mt-bench",
            "--target",
            s(&target),
            "--draft",
            s(&draft),
            "--questions",
            s(&q),
            "--limit",
            "0",
            "--max-new-tokens",
            "40",
            "--methods",
            "baseline,greedy",
            "--trees",
            "chain-2",
            "--out-dir",
            s(&out_dir),
            "--name",
            "int",
        ])
        .env("MDSD_CACHE", test_cache())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let records = out_dir.join("int.records.jsonl");
    let start = std::time::Instant::now();
    // Wait for a few finished questions (4 records each), then interrupt.
    while std::fs::read_to_string(&records).map_or(0, |t| t.lines().count()) < 9 {
        assert!(start.elapsed().as_secs() < 120, "no records after 120 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let doc = read_json(&out_dir.join("int.json"));
    assert_eq!(doc["config"]["interrupted"], true);
    let done = doc["config"]["questions"].as_u64().unwrap();
    assert!((2..400).contains(&done), "{done} questions");
    // Only whole questions enter the summary; the raw file may hold the interrupted one too.
    assert_eq!(doc["records"].as_array().unwrap().len() as u64, done * 4);
    assert!(std::fs::read_to_string(out_dir.join("int.md")).unwrap().contains("**interrupted**"));
}

/// Target or draft logits after `text` rendered as one user turn, computed alone.
fn logits_after(model: &Path, text: &str) -> Vec<f32> {
    let m = engine::load::load(model, &Device::Cpu, &engine::load::LoadOptions::default()).unwrap();
    let ids = m.tokenizer.encode(&m.tokenizer.apply_chat_template(text, None).unwrap()).unwrap();
    let mut cache = m.model.new_cache(ids.len()).unwrap();
    let pos: Vec<u32> = (0..ids.len() as u32).collect();
    let bias = engine::model::causal_bias(0, ids.len(), candle_core::DType::F32, &Device::Cpu).unwrap();
    let h = m.model.forward(&ids, &pos, &bias, &mut cache).unwrap();
    m.model.logits(&h.narrow(0, ids.len() - 1, 1).unwrap()).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

/// `bench acceptance` with `draft` (`--draft FILE` or `--eagle DIR`) for `[target, data_dir,
/// distributions, out_dir]`: the Alpaca sample, 2 samples of 5 new tokens, the top 12 logits,
/// forests of 2, `extra` flags, and `--name acc` last.
fn acceptance_args<'a>(draft: [&'a str; 2], paths: [&'a str; 4], extra: &[&'a str]) -> Vec<&'a str> {
    let [target, data, dist, out_dir] = paths;
    let mut args =
        vec!["acceptance", "--target", target, draft[0], draft[1], "--dataset", "alpaca", "--data-dir", data];
    args.extend_from_slice(&["--samples", "2", "--max-new-tokens", "5", "--keep", "12", "--batch", "2"]);
    args.extend_from_slice(&["--distributions", dist, "--out-dir", out_dir]);
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--name", "acc"]);
    args
}

/// Every alpha of every cell lies in [0, 1] and at most its alpha* (RRS without replacement
/// within 0.01: it is a Monte Carlo estimate where q has more than 8 tokens); the Greedy
/// verifier attains alpha* of Greedy drafts.
fn assert_alphas_bounded(cells: &[Value]) {
    let metric = |c: &Value, k: &str| -> f64 {
        c["metrics"].as_array().unwrap().iter().find(|m| m["metric"] == k).unwrap()["alpha"]["mean"].as_f64().unwrap()
    };
    assert!(!cells.is_empty());
    for c in cells {
        for m in c["metrics"].as_array().unwrap() {
            let a = m["alpha"]["mean"].as_f64().unwrap();
            assert!((0.0..=1.0 + 1e-9).contains(&a), "{m}");
        }
        for (v, star, tolerance) in [
            ("rrs_wr", "alpha_star_wr", 1e-9),
            ("rrs_wor", "alpha_star_wor", 1e-2),
            ("greedy", "alpha_star_greedy", 1e-9),
        ] {
            assert!(metric(c, v) <= metric(c, star) + tolerance, "{v} above {star}: {c}");
        }
        // Exact couplings never beat the optimum: positional races draw without replacement.
        assert!(metric(c, "positional") <= metric(c, "alpha_star_wor") + 1e-9, "{c}");
        assert!((metric(c, "greedy") - metric(c, "alpha_star_greedy")).abs() < 1e-9);
    }
}

#[test]
fn acceptance_study_end_to_end() {
    let dir = temp_dir("bench-acc");
    let (target, draft) = pair(&dir);
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("alpaca_sample.jsonl"),
        "{\"instruction\": \"ABC\", \"input\": \"DE\"}\n{\"instruction\": \"FGHIJKL\", \"input\": \"\"}\n{\"instruction\": \"M\"}\n",
    )
    .unwrap();
    let out_dir = dir.join("results");
    let dist = dir.join("dist");
    let extra = ["--temperatures", "0.5,1", "--drafts", "1,2"];
    let args = acceptance_args(["--draft", s(&draft)], [s(&target), s(&data), s(&dist), s(&out_dir)], &extra);
    let o = bench(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc = read_json(&out_dir.join("acc.json"));
    // The table setting (T 0.7, 3 drafts), two temperatures and two draft counts.
    let cells = doc["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 5);
    let positions = doc["data"][0]["positions"].as_u64().unwrap();
    assert!((2..=10).contains(&positions), "{positions}");
    assert_eq!(doc["data"][0]["responses"], 2);
    assert_alphas_bounded(cells);
    let md = std::fs::read_to_string(out_dir.join("acc.md")).unwrap();
    assert!(md.contains("## Table 1: T = 0.7, 3 drafts") && md.contains("| With replacement | RRS |"), "{md}");
    if doc["notes"].as_array().unwrap().is_empty() {
        for f in ["acc.temperature.png", "acc.temperature.svg", "acc.drafts.png", "acc.drafts.svg"] {
            assert!(std::fs::metadata(out_dir.join(f)).unwrap().len() > 1000, "{f}");
        }
    }

    // The stored rows are the models' own: the second prompt of the batch (decoded beside the
    // first in one forest) at its first response position, against a forward of it alone.
    let file = std::fs::read_dir(&dist).unwrap().next().unwrap().unwrap().path();
    let t = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
    let v = |k: &str| -> Tensor { t[k].clone() };
    let prompt: Vec<u32> = v("prompt").to_vec1().unwrap();
    let offsets: Vec<u32> = v("offsets").to_vec1().unwrap();
    let ids: Vec<u32> = v("ids").to_vec1().unwrap();
    let first = prompt.iter().position(|&p| p == 1).unwrap();
    let (a, b) = (offsets[first] as usize, offsets[first + 1] as usize);
    assert!(b - a <= 24 && b - a >= 12, "union of two top-12 sets: {}", b - a);
    for (key, model) in [("target_logits", &target), ("draft_logits", &draft)] {
        let stored: Vec<f32> = v(key).to_vec1().unwrap();
        let full = logits_after(model, "FGHIJKL");
        for k in a..b {
            let d = (stored[k] - full[ids[k] as usize]).abs();
            assert!(d < 1e-3, "{key} of token {}: {} vs {}", ids[k], stored[k], full[ids[k] as usize]);
        }
    }

    // A second run reads the cached distributions and gives the same figures.
    let mut again = args.to_vec();
    let n = again.len();
    again[n - 1] = "acc2";
    let o = bench(&again);
    assert!(o.status.success() && stderr(&o).contains("positions from"), "{}", stderr(&o));
    let doc2 = read_json(&out_dir.join("acc2.json"));
    assert_eq!(doc2["cells"], doc["cells"]);
}

#[test]
fn acceptance_rejects_bad_input_clearly() {
    let dir = temp_dir("bench-acc-bad");
    let run = |extra: &[&str]| failing("acceptance", &["--data-dir", s(&dir)], extra);
    let e = run(&["--dataset", "wmt14"]);
    assert!(e.contains("wmt14_deen_test.jsonl"), "{e}");
    std::fs::write(dir.join("cnndm_frank_test.jsonl"), "{\"article\": \"A B C\"}\n{\"id\": 3}\n").unwrap();
    let e = run(&["--dataset", "cnndm"]);
    assert!(e.contains("cnndm_frank_test.jsonl line 2") && e.contains("article"), "{e}");
    let e = run(&["--dataset", "imdb"]);
    assert!(e.contains("imdb"), "{e}");
    let e = run(&["--dataset", "alpaca", "--drafts", "0"]);
    assert!(e.contains("0 drafts"), "{e}");
}

/// `bench random-gguf`: `--skeleton` writes the file's header alone; `--like` that skeleton
/// writes a file with the original's metadata (tokenizer, chat template), tensor names, shapes
/// and types, which loads and gives finite logits; `--tie-output` gives the output layer the
/// embedding's values (untied, they are unrelated); a missing file is named.
#[test]
fn random_gguf_copies_a_layout_with_random_weights() {
    use candle_core::quantized::gguf_file::Content;
    let dir = temp_dir("random-gguf");
    let tiny = Tiny { hidden: 256, intermediate: 512, chat_template: Some(TEMPLATE), ..Tiny::llama(71) };
    let original = tiny.write_gguf(&dir.join("original.gguf"), GgmlDType::Q4K, &[]);
    let content = |p: &Path| Content::read(&mut std::fs::File::open(p).unwrap()).unwrap();
    let skeleton = dir.join("skeleton.gguf");
    let o = bench(&["random-gguf", "--like", s(&original), "--skeleton", s(&skeleton)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (orig_bytes, skel_bytes) = (std::fs::read(&original).unwrap(), std::fs::read(&skeleton).unwrap());
    assert_eq!(skel_bytes.len() as u64, content(&original).tensor_data_offset);
    assert!(orig_bytes.starts_with(&skel_bytes));

    let out = |name: &str, extra: &[&str]| -> PathBuf {
        let path = dir.join(name);
        let mut args = vec!["random-gguf", "--like", s(&skeleton), "--out", s(&path)];
        args.extend_from_slice(extra);
        let o = bench(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        path
    };
    let tied = out("tied.gguf", &["--tie-output", "--seed", "3"]);
    let untied = out("untied.gguf", &["--seed", "3"]);
    let (a, b) = (content(&original), content(&tied));
    let layout = |c: &Content| {
        let mut v: Vec<String> =
            c.tensor_infos.iter().map(|(n, i)| format!("{n} {:?} {:?}", i.shape.dims(), i.ggml_dtype)).collect();
        v.sort();
        v
    };
    assert_eq!(layout(&a), layout(&b));
    let meta = |c: &Content| {
        let mut v: Vec<String> = c.metadata.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
        v.sort();
        v
    };
    assert_eq!(meta(&a), meta(&b));
    let logits = logits_after(&tied, "ab");
    assert_eq!(logits.len(), tiny.vocab);
    assert!(logits.iter().all(|x| x.is_finite()));
    assert!(logits_after(&original, "ab") != logits, "random weights gave the original's logits");

    let weight = |p: &Path, name: &str| -> Vec<f32> {
        let mut f = std::fs::File::open(p).unwrap();
        let c = Content::read(&mut f).unwrap();
        let t = c.tensor(&mut f, name, &Device::Cpu).unwrap().dequantize(&Device::Cpu).unwrap();
        t.flatten_all().unwrap().to_vec1().unwrap()
    };
    let max_diff = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    let embedding = weight(&tied, "token_embd.weight");
    let scale = embedding.iter().fold(0f32, |m, x| m.max(x.abs()));
    // Q4_K of the same values: within a quantization step (a sixteenth of the block's range).
    assert!(max_diff(&weight(&tied, "output.weight"), &embedding) < 0.1 * scale);
    assert!(max_diff(&weight(&untied, "output.weight"), &weight(&untied, "token_embd.weight")) > 0.5 * scale);

    let o = bench(&["random-gguf", "--like", "/nonexistent/m.gguf", "--out", s(&dir.join("x.gguf"))]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("/nonexistent/m.gguf"), "{}", stderr(&o));
}

/// `bench random-eagle` writes a head that the engine's loader accepts for its target (a
/// LLaMA GGUF and a Qwen2 Hugging Face folder): the target's sizes, q/k/v biases for Qwen2
/// only, finite draft logits over the whole vocabulary and over a cut one. A missing target
/// is named.
#[test]
fn random_eagle_writes_a_head_the_engine_loads() {
    use engine::model::causal_bias;
    use engine::model::eagle::EagleHead;
    let dir = temp_dir("bench-random-eagle");
    for (name, tiny, gguf) in [("llama", Tiny::llama(81), true), ("qwen2", Tiny::qwen2(82), false)] {
        let target_path = if gguf {
            tiny.write_gguf(&dir.join("t.gguf"), GgmlDType::F32, &[])
        } else {
            tiny.write_hf(&dir.join(name))
        };
        let out = dir.join(format!("{name}-head"));
        let o =
            bench(&["random-eagle", "--target", s(&target_path), "--out", s(&out), "--dtype", "f32", "--seed", "4"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let weights = candle_core::safetensors::load(out.join("model.safetensors"), &Device::Cpu).unwrap();
        assert_eq!(weights["fc.weight"].dims(), [tiny.hidden, 2 * tiny.hidden], "{name}");
        assert_eq!(weights.contains_key("layers.0.self_attn.q_proj.bias"), name == "qwen2");
        let target = common::load_cpu(&target_path);
        let mut head = EagleHead::load(&out, &target).unwrap();
        let mut cache = head.new_cache(8).unwrap();
        let features = Tensor::zeros((2, tiny.hidden), target.dtype(), &Device::Cpu).unwrap();
        let bias = causal_bias(0, 2, target.dtype(), &Device::Cpu).unwrap();
        let g = head.forward(&target, &features, &[3, 5], &[0, 1], &bias, &mut cache).unwrap();
        for (rows, width) in [(0, tiny.vocab), (20, 20)] {
            head.set_output_rows(&target, rows).unwrap();
            let q = head.logits(&target, &g).unwrap();
            assert_eq!(q.dims(), [2, width], "{name}");
            let q: Vec<f32> = q.flatten_all().unwrap().to_vec1().unwrap();
            assert!(q.iter().all(|v| v.is_finite()) && q.iter().any(|&v| v != q[0]), "{name}: {q:?}");
        }
    }
    let o = bench(&["random-eagle", "--target", "/nonexistent/t.gguf", "--out", s(&dir.join("never"))]);
    assert!(!o.status.success() && stderr(&o).contains("/nonexistent/t.gguf"), "{}", stderr(&o));
}

/// `bench mt-bench --eagle HEAD`: an EAGLE head drafts (the paper's Vicuna + EAGLE table); at
/// T = 0 every speculative answer equals the baseline's, the head drafted in every speculative
/// cell, and the report names the head's file. `bench forward-cost --eagle` times the head's
/// step (whole and cut output layer); `--draft` with `--eagle` is refused.
#[test]
fn mt_bench_drafts_with_an_eagle_head() {
    let [target, _, questions, out_dir] = mt_bench_files("bench-mt-eagle");
    let tiny = Tiny { chat_template: Some(TEMPLATE), scale: 0.6, ..Tiny::llama(61) };
    let head = common::TinyEagle { target: tiny, seed: 63, own_embedding: false, scale: 0.5 }
        .write(&out_dir.with_file_name("head"), false);
    let mut args = vec!["mt-bench", "--target", s(&target), "--eagle", s(&head), "--questions", s(&questions)];
    args.extend_from_slice(&["--limit", "2", "--max-new-tokens", "6", "--out-dir", s(&out_dir), "--name", "eagle"]);
    args.extend_from_slice(&["--methods", "baseline,rrs-wr,greedy", "--trees", "chain-2,drafts-2-depth-2"]);
    args.extend_from_slice(&["--temperatures", "0", "--draft-temperature", "1", "--draft-vocab", "40"]);
    let o = bench(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("runs as a chain"), "{}", stderr(&o));
    // Without the draft temperature the branching tree runs as a chain at T = 0, and the run
    // says so (the chain is not named).
    let mut one_hot = vec!["mt-bench", "--target", s(&target), "--eagle", s(&head), "--questions", s(&questions)];
    one_hot.extend_from_slice(&[
        "--limit",
        "1",
        "--max-new-tokens",
        "6",
        "--out-dir",
        s(&out_dir),
        "--name",
        "one-hot",
    ]);
    one_hot.extend_from_slice(&["--methods", "greedy", "--trees", "chain-2,drafts-2-depth-2", "--temperatures", "0"]);
    let o = bench(&one_hot);
    let said = stderr(&o);
    assert!(o.status.success() && said.contains("drafts-2-depth-2 at T = 0 runs as a chain"), "{said}");
    assert!(!said.contains("chain-2 at"), "{said}");
    let doc = read_json(&out_dir.join("eagle.json"));
    assert!(doc["config"]["draft"].as_str().unwrap().ends_with("model.safetensors"), "{}", doc["config"]);
    let records = doc["records"].as_array().unwrap();
    assert_eq!(records.len(), 2 * 2 * (1 + 2 * 2));
    for r in records {
        let base = records
            .iter()
            .find(|b| b["method"] == "baseline" && b["question_id"] == r["question_id"] && b["turn"] == r["turn"])
            .unwrap();
        assert_eq!(r["answer"], base["answer"], "{} {} turn {}", r["method"], r["tree"], r["turn"]);
        if r["method"] != "baseline" {
            assert!(r["draft_s"].as_f64().unwrap() > 0.0, "the head did not draft: {r}");
        }
    }
    for (vocab, label) in [("0", "(EAGLE head) | mdsd |"), ("20", "(EAGLE head) | mdsd, logits of the first 20 ids |")]
    {
        let args = ["forward-cost", "--target", s(&target), "--eagle", s(&head), "--ks", "1,2", "--reps", "1"];
        let o = bench(&[&args[..], &["--draft-vocab", vocab, "--breakdown"]].concat());
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(o.status.success() && out.contains(label) && out.contains("| | head layer |"), "{out}{}", stderr(&o));
    }
    let e = stderr(&bench(&["mt-bench", "--target", s(&target), "--eagle", s(&head), "--draft", s(&target)]));
    assert!(e.contains("cannot be used with"), "{e}");
}

/// `bench acceptance --eagle HEAD` (the paper's Vicuna + EAGLE and Qwen2 + EAGLE rows): the
/// study runs with a head as the draft, every alpha lies in [0, 1] and below its alpha*, and
/// the stored draft rows are the head's root-level q: at every response position of both
/// prompts, the head run alone on the target's features of a teacher-forced pass over the text
/// gives the same logits (the study takes the features from its own decoding: a feature taken
/// one position off, or the prompt's alone, fails it).
#[test]
fn acceptance_study_with_an_eagle_head() {
    use engine::model::eagle::EagleHead;
    let dir = temp_dir("bench-acc-eagle");
    let (target, _) = pair(&dir);
    let tiny = Tiny { chat_template: Some(TEMPLATE), scale: 0.6, ..Tiny::llama(61) };
    let head =
        common::TinyEagle { target: tiny, seed: 64, own_embedding: false, scale: 0.5 }.write(&dir.join("head"), true);
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("alpaca_sample.jsonl"), "{\"instruction\": \"ABC\"}\n{\"instruction\": \"FGHIJKL\"}\n")
        .unwrap();
    let (out_dir, dist) = (dir.join("results"), dir.join("dist"));
    // Greedy responses, so that the test knows them: each is the argmax of the stored target
    // row before it.
    let args = acceptance_args(
        ["--eagle", s(&head)],
        [s(&target), s(&data), s(&dist), s(&out_dir)],
        &["--generation-temperature", "0"],
    );
    let o = bench(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_alphas_bounded(read_json(&out_dir.join("acc.json"))["cells"].as_array().unwrap());
    let file = std::fs::read_dir(&dist).unwrap().next().unwrap().unwrap().path();
    let stored = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
    let v = |k: &str| -> Vec<u32> { stored[k].to_vec1().unwrap() };
    let (prompt, offsets, ids) = (v("prompt"), v("offsets"), v("ids"));
    let target_logits: Vec<f32> = stored["target_logits"].to_vec1().unwrap();
    let draft_logits: Vec<f32> = stored["draft_logits"].to_vec1().unwrap();
    // The head's q before every response token, from the target's features of a
    // teacher-forced pass over prompt + response (the study keeps those of its decoding).
    let t = engine::load::load(&target, &Device::Cpu, &engine::load::LoadOptions::default()).unwrap();
    let h = EagleHead::load(&head, &t.model).unwrap();
    let mut checked = 0;
    for (index, text) in ["ABC", "FGHIJKL"].into_iter().enumerate() {
        let positions: Vec<usize> = (0..prompt.len()).filter(|&k| prompt[k] == index as u32).collect();
        assert!(!positions.is_empty(), "no positions of prompt {index}");
        let mut tokens = t.tokenizer.encode(&t.tokenizer.apply_chat_template(text, None).unwrap()).unwrap();
        let p = tokens.len();
        for &k in &positions[..positions.len() - 1] {
            let range = offsets[k] as usize..offsets[k + 1] as usize;
            let best =
                range.clone().max_by(|&a, &b| target_logits[a].total_cmp(&target_logits[b]).then(ids[b].cmp(&ids[a])));
            tokens.push(ids[best.unwrap()]);
        }
        let n = tokens.len();
        let mut cache = t.model.new_cache(n).unwrap();
        let features = t.model.forward_chain(&tokens, &mut cache).unwrap();
        let mut hcache = h.new_cache(n).unwrap();
        let pos: Vec<u32> = (0..n as u32 - 1).collect();
        let bias = engine::model::causal_bias(0, n - 1, candle_core::DType::F32, &Device::Cpu).unwrap();
        let out = h
            .forward(&t.model, &features.narrow(0, 0, n - 1).unwrap(), &tokens[1..], &pos, &bias, &mut hcache)
            .unwrap();
        // Response token j's q: entry p + j - 2.
        let q: Vec<Vec<f32>> =
            h.logits(&t.model, &out.narrow(0, p - 2, positions.len()).unwrap()).unwrap().to_vec2().unwrap();
        for (j, &k) in positions.iter().enumerate() {
            for e in offsets[k] as usize..offsets[k + 1] as usize {
                let d = (draft_logits[e] - q[j][ids[e] as usize]).abs();
                assert!(
                    d < 1e-3,
                    "prompt {index}, response token {j}, head logit of token {}: stored {} against {}",
                    ids[e],
                    draft_logits[e],
                    q[j][ids[e] as usize]
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 12, "{checked} head logits compared");
}
