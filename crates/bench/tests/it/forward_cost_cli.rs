//! End-to-end tests of `bench forward-cost`: the real binary on a tiny pair of GGUF files
//! (`bench_cli::pair`).

use crate::bench_cli::{bench, pair, read_json, s, stderr};
use crate::common::temp_dir;
use serde_json::Value;

/// `bench forward-cost` on a tiny pair: one row per model (and three more with `--breakdown`),
/// a positive time per k; `--draft-vocab` cuts the draft's output layer and says so; bad `--ks`
/// and a missing file are named.
#[test]
fn forward_cost_times_both_models() {
    let dir = temp_dir("bench-forward-cost");
    let (target, draft) = pair(&dir);
    let args = ["forward-cost", "--target", s(&target), "--draft", s(&draft), "--ks", "1,3", "--reps", "2"];
    let o = bench(&[&args[..], &["--breakdown", "--draft-vocab", "16"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| model")).collect();
    assert_eq!(rows.len(), 8, "two models x (total, blocks, output layer, to host):\n{out}");
    assert!(rows[0].contains("target.gguf (target)") && rows[0].contains("weights as stored"), "{out}");
    assert!(rows[4].contains("draft.gguf (draft)") && rows[4].contains("logits of the first 16 ids"), "{out}");
    for row in &rows {
        let cells: Vec<f64> = row.trim_matches('|').split('|').skip(2).map(|c| c.trim().parse().unwrap()).collect();
        assert_eq!(cells.len(), 2, "{row}");
        assert!(cells.iter().all(|&c| c.is_finite() && c >= 0.0), "{row}");
    }
    let first = |row: &str| -> f64 { row.trim_matches('|').split('|').nth(2).unwrap().trim().parse().unwrap() };
    assert!(first(rows[0]) > 0.0 && first(rows[4]) > 0.0, "whole forwards take time:\n{out}");
    // Without --draft-vocab the draft's row names no cut.
    let o = bench(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("logits of the first"));
    let e = stderr(&bench(&[&args[..5], &["--ks", "1,0"]].concat()));
    assert!(e.contains("--ks needs positive numbers"), "{e}");
    let e = stderr(&bench(&[&args[..3], &["--draft", "/nonexistent/d.gguf"]].concat()));
    assert!(e.contains("/nonexistent/d.gguf"), "{e}");
}

/// `bench forward-cost --graph` on the CPU (where a replay runs the forward again): a
/// `replayed` row under each model with a time per k, and in the JSON, per role and k, the
/// replay's seconds and its logits equal to the eager forward's bit for bit. The same probe
/// on a GPU times CUDA graph launches (benches/cuda/gpu_checks.sh).
#[test]
fn forward_cost_graph_probe_replays_the_forward() {
    let dir = temp_dir("bench-forward-cost-graph");
    let (target, draft) = pair(&dir);
    let json = dir.join("costs.json");
    let args = ["forward-cost", "--target", s(&target), "--draft", s(&draft), "--json", s(&json)];
    let o = bench(&[&args[..], &["--ks", "1,3", "--reps", "2", "--graph"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let replayed: Vec<&str> = out.lines().filter(|l| l.starts_with("| | replayed |")).collect();
    assert_eq!(replayed.len(), 2, "one replayed row per model:\n{out}");
    for row in &replayed {
        let cells: Vec<f64> = row.trim_matches('|').split('|').skip(2).map(|c| c.trim().parse().unwrap()).collect();
        assert!(cells.len() == 2 && cells.iter().all(|&c| c > 0.0), "{row}");
    }
    let doc = read_json(&json);
    for role in ["target", "draft"] {
        for k in ["1", "3"] {
            assert_eq!(doc["graph_equal"][role][k], Value::Bool(true), "{role} k={k}: {doc}");
            assert!(doc["graph_secs"][role][k].as_f64().unwrap() > 0.0, "{doc}");
            assert!(doc["graph_errors"][role][k].is_null(), "{doc}");
        }
    }
    // Without --graph the JSON has no replays.
    let o = bench(&[&args[..], &["--ks", "1", "--reps", "1"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(read_json(&json).get("graph_secs").is_none());
}
