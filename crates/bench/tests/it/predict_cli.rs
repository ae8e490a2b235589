//! `bench predict` end to end on tiny models: costs from `forward-cost --json`, acceptance from
//! `mt-bench` records.

use crate::bench_cli::{bench, mt_bench_files, read_json, run_mt_bench, s, stderr};
use serde_json::Value;

/// `bench predict` end to end: `forward-cost --json` costs and `mt-bench` records (which carry
/// the drafts tried and accepted by width and rank) give a prediction per tree with the
/// measured speedup beside it; a τ fitted instead gives the same expected tokens per step to
/// every tree whose acceptance it fixes; missing inputs are named.
#[test]
fn predict_sets_predictions_beside_measured_speedups() {
    let [target, draft, questions, out_dir] = mt_bench_files("bench-predict");
    let records = run_mt_bench(
        (&target, &draft, &questions, &out_dir),
        "run",
        &["--methods", "baseline,greedy", "--trees", "chain-2,drafts-2-depth-2", "--temperatures", "0"],
    );
    // The speculative records count their drafts by width and rank.
    let spec: Vec<&Value> = records.iter().filter(|r| r["method"] == "greedy").collect();
    let tried: u64 = spec
        .iter()
        .map(|r| {
            r["rank_tried"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|w| w.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()))
                .sum::<u64>()
        })
        .sum();
    assert!(tried > 0, "no drafts counted: {spec:?}");
    let costs = out_dir.join("costs.json");
    let o = bench(&[
        "forward-cost",
        "--target",
        s(&target),
        "--draft",
        s(&draft),
        "--ks",
        "1,2,3,4,5",
        "--reps",
        "2",
        "--json",
        s(&costs),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let c = read_json(&costs);
    assert_eq!(c["ks"], serde_json::json!([1, 2, 3, 4, 5]));
    assert!(c["secs"]["target"]["1"].as_f64().unwrap() > 0.0 && c["secs"]["draft"]["5"].as_f64().unwrap() > 0.0, "{c}");
    let table = out_dir.join("predict.json");
    let records_path = out_dir.join("run.records.jsonl");
    let o = bench(&["predict", "--costs", s(&costs), "--records", s(&records_path), "--json", s(&table)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let p = read_json(&table);
    let trees = p["trees"].as_array().unwrap();
    assert_eq!(trees.iter().map(|t| t["tree"].as_str().unwrap()).collect::<Vec<_>>(), ["chain-2", "drafts-2-depth-2"]);
    for t in trees {
        // The target's rows per step are the runs' own (live nodes), at most the tree's.
        let runs: Vec<&&Value> = spec.iter().filter(|r| r["tree"] == t["tree"]).collect();
        let rows: u64 = runs.iter().map(|r| r["target_rows"].as_u64().unwrap()).sum();
        let steps: u64 = runs.iter().map(|r| r["target_forwards"].as_u64().unwrap()).sum();
        let live = t["live_rows"].as_f64().unwrap();
        assert!((live - rows as f64 / steps as f64).abs() < 1e-9, "{t}: {rows} rows in {steps} steps");
        assert!(live <= t["rows"].as_f64().unwrap(), "{t}");
        assert_eq!(t["alpha_source"], "its runs", "{t}");
        let e = t["expected_tokens"].as_f64().unwrap();
        assert!((1.0..=3.0).contains(&e), "{t}");
        assert!(t["speedup"].as_f64().unwrap() > 0.0 && t["measured_speedup"].as_f64().unwrap() > 0.0, "{t}");
    }
    // A τ fit: one acceptance for every draft, the fitted tree giving back the τ.
    let o = bench(&[
        "predict",
        "--costs",
        s(&costs),
        "--tau",
        "2.5",
        "--tau-tree",
        "chain-2",
        "--trees",
        "chain-2,chain-4",
        "--json",
        s(&table),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let p = read_json(&table);
    assert!((p["trees"][0]["expected_tokens"].as_f64().unwrap() - 2.5).abs() < 1e-6, "{p}");
    assert!(p["trees"][1]["expected_tokens"].as_f64().unwrap() > 2.5, "{p}");
    assert!(p["trees"][0]["measured_speedup"].is_null());
    assert_eq!(p["trees"][1]["live_rows"].as_f64(), Some(5.0), "without records, all of chain-4's rows: {p}");
    let e = stderr(&bench(&["predict", "--costs", s(&costs)]));
    assert!(e.contains("--records") && e.contains("--tau"), "{e}");
    let e = stderr(&bench(&["predict", "--costs", "/nonexistent.json", "--tau", "2"]));
    assert!(e.contains("/nonexistent.json"), "{e}");
}
