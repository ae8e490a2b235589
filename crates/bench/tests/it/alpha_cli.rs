//! End-to-end tests of `bench alpha`: the real binary on JSON-lines files.

use serde_json::Value;
use std::process::Command;

fn run(input: &str, extra: &[&str]) -> (i32, Vec<Value>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.jsonl");
    std::fs::write(&path, input).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["alpha", "--input", path.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    let lines = String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    (out.status.code().unwrap(), lines, String::from_utf8(out.stderr).unwrap())
}

#[test]
fn prints_every_rate_and_matches_the_library() {
    let p = [0.4, 0.3, 0.2, 0.1];
    let q = [0.1, 0.2, 0.3, 0.4];
    let input = format!("{}\n", serde_json::json!({"p": p, "q": q, "n": 2}));
    let (code, lines, stderr) = run(&input, &[]);
    assert_eq!(code, 0, "{stderr}");
    let o = &lines[0];
    use samplers::{alpha, DraftConstruction as C};
    let f = |k: &str| o[k].as_f64().unwrap_or_else(|| panic!("missing {k} in {o}"));
    assert_eq!(f("alpha_star_wr"), alpha::alpha_star(C::WithReplacement, &p, &q, 2).unwrap());
    assert_eq!(f("alpha_star_wor"), alpha::alpha_star(C::WithoutReplacement, &p, &q, 2).unwrap());
    assert_eq!(f("alpha_star_greedy"), alpha::alpha_star(C::Greedy, &p, &q, 2).unwrap());
    assert_eq!(f("alpha_star_cps"), alpha::alpha_star(C::ConditionalPoisson, &p, &q, 2).unwrap());
    assert_eq!(f("alpha_kseq"), alpha::alpha_kseq(&p, &q, 2));
    assert_eq!(f("alpha_rrs_wr"), alpha::rrs::alpha_rrs_with_replacement(&p, &q, 2));
    assert_eq!(f("alpha_rrs_wor"), alpha::rrs::alpha_rrs_without_replacement_exact(&p, &q, 2));
    assert_eq!(f("alpha_rrs_wor_stderr"), 0.0);
    assert!(f("alpha_star_wor") >= f("alpha_rrs_wor") && f("alpha_star_wr") >= f("alpha_kseq"));
    assert_eq!(f("alpha_positional"), samplers::positional::coupled_acceptance(&p, &q, 2));
    assert!(f("alpha_positional") <= f("alpha_star_wor") && f("alpha_positional") > 0.0);
}

#[test]
fn default_n_logits_lines_and_optimal_methods() {
    let input = "{\"target_logits\":[1.0,2.0,3.0,0.5],\"draft_logits\":[3.0,2.0,1.0,0.5]}\n";
    let (code, lines, stderr) = run(input, &["--methods", "optimal", "--temperature", "0.7", "--n", "2"]);
    assert_eq!(code, 0, "{stderr}");
    let o = &lines[0];
    assert_eq!(o["n"], 2);
    assert!(o.get("alpha_rrs_wr").is_none() && o.get("alpha_rrs_wor").is_none(), "{o}");
    let p = samplers::dist::softmax(&[1.0, 2.0, 3.0, 0.5], 0.7).unwrap();
    let q = samplers::dist::softmax(&[3.0, 2.0, 1.0, 0.5], 0.7).unwrap();
    let expect = samplers::alpha::alpha_star_greedy(&p, &q, 2);
    assert!((o["alpha_star_greedy"].as_f64().unwrap() - expect).abs() < 1e-15);
    // Default n is 3 without --n or a per-line n.
    let (_, lines, _) = run("{\"p\":[0.5,0.5],\"q\":[0.5,0.5]}\n", &[]);
    assert_eq!(lines[0]["n"], 3);
}

#[test]
fn monte_carlo_beyond_eight_tokens_reports_its_standard_error() {
    let v = 12;
    let p: Vec<f64> = (0..v).map(|i| (i + 1) as f64 / 78.0).collect();
    let q: Vec<f64> = (0..v).map(|i| (v - i) as f64 / 78.0).collect();
    let input = format!("{}\n", serde_json::json!({"p": p, "q": q, "n": 3}));
    let (code, lines, stderr) = run(&input, &["--samples", "4000"]);
    assert_eq!(code, 0, "{stderr}");
    let o = &lines[0];
    assert!(o["alpha_rrs_wor_method"].as_str().unwrap().starts_with("monte-carlo"));
    let se = o["alpha_rrs_wor_stderr"].as_f64().unwrap();
    assert!(se > 0.0 && se < 0.01, "{o}");
    let exact = samplers::alpha::rrs::alpha_rrs_without_replacement_exact(&p, &q, 3);
    assert!((o["alpha_rrs_wor"].as_f64().unwrap() - exact).abs() < 4.5 * se, "{o} vs {exact}");
    // Positional races: exact on 12 tokens; Monte Carlo (40,000 positions) on 100, within 4.5
    // standard errors of the quadrature.
    assert_eq!(o["alpha_positional_method"], "exact");
    let v = 100;
    let p: Vec<f64> = (0..v).map(|i| (i + 1) as f64 / 5050.0).collect();
    let q: Vec<f64> = (0..v).map(|i| ((i * 37) % v + 1) as f64 / 5050.0).collect();
    let input = format!("{}\n", serde_json::json!({"p": p, "q": q, "n": 3}));
    let (code, lines, stderr) = run(&input, &["--samples", "4000"]);
    assert_eq!(code, 0, "{stderr}");
    let o = &lines[0];
    assert_eq!(o["alpha_positional_method"], "monte-carlo (40000 positions)");
    let se = o["alpha_positional_stderr"].as_f64().unwrap();
    let exact = samplers::positional::coupled_acceptance(&p, &q, 3);
    assert!((o["alpha_positional"].as_f64().unwrap() - exact).abs() < 4.5 * se, "{o} vs {exact}");
}

#[test]
fn bad_lines_are_named_and_the_rest_still_computed() {
    let input = [
        "{\"p\":[0.5,0.5],\"q\":[0.5,0.5]}",
        "{\"p\":[0.5,0.5,0.0],\"q\":[0.5,0.5]}",
        "{\"p\":[0.5,0.5],\"q\":[0.9,0.5]}",
        "{\"p\":[0.5,-0.5,1.0],\"q\":[0.5,0.5,0.0]}",
        "{\"p\":[0.5,0.5],\"q\":[0.5,0.5],\"n\":0}",
        "{\"p\":[0.5,NaN],\"q\":[0.5,0.5]}",
        "{\"target_logits\":[1.0,2.0],\"draft_logits\":[1.0]}",
    ]
    .join("\n");
    let (code, lines, stderr) = run(&input, &[]);
    assert_eq!(code, 1);
    assert_eq!(lines.len(), 1);
    for (line, text) in [
        (2, "p has 3 entries but q has 2"),
        (3, "sums to 1.4"),
        (4, "invalid entry -0.5 at index 1"),
        (5, "n = 0"),
        (6, "not a valid JSON"),
        (7, "target_logits has 2 entries but draft_logits has 1"),
    ] {
        assert!(
            stderr.contains(&format!("line {line}: ")) && stderr.contains(text),
            "line {line} ({text}) in:\n{stderr}"
        );
    }
    assert!(!stderr.contains("panicked"));
    let missing =
        Command::new(env!("CARGO_BIN_EXE_bench")).args(["alpha", "--input", "/nonexistent/x.jsonl"]).output().unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot open input file /nonexistent/x.jsonl"));
}
