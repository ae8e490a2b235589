//! Per-cell statistics of a speed run and its Markdown tables.
//!
//! Per question the turns are pooled (tokens/s = new tokens / decode seconds of all turns;
//! with prefill = new tokens / (prefill + decode seconds); prefill tokens/s = prompt tokens /
//! prefill seconds, the draft's prefill included and `--tree auto`'s one-off cost measurements
//! not (they count in the rate with prefill); tau = new tokens / target forwards; alpha at
//! depth d = accepted-at-depth-d steps / steps).
//! Means and standard errors are then taken over questions; speed ratios are per question
//! (method and reference measured back to back on it), then averaged.

use super::{Cell, Method, TurnRecord};
use crate::stats::MeanSe;
use engine::decode::Randomness;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Statistics of one cell (over questions, or over the questions of one category).
#[derive(Debug, Clone, Serialize)]
pub struct CellSummary {
    pub method: String,
    pub tree: String,
    pub temperature: f64,
    pub category: Option<String>,
    pub questions: usize,
    pub new_tokens: usize,
    pub tau: MeanSe,
    /// Target rows (tree nodes) per target forward.
    pub rows_per_forward: MeanSe,
    /// Acceptance rate at tree depth d (index d - 1): accepted steps / verification steps.
    pub alpha_per_depth: Vec<MeanSe>,
    pub tokens_per_s: MeanSe,
    /// Prompt tokens per second of prefill (the target's and, when one runs, the draft's).
    pub prefill_tokens_per_s: MeanSe,
    /// Per-question ratio to the baseline at the same temperature (and randomness, when the
    /// run has that baseline).
    pub speedup_vs_baseline: Option<MeanSe>,
    /// The same with the prefill counted: new tokens over prefill plus decode seconds.
    pub speedup_with_prefill_vs_baseline: Option<MeanSe>,
    /// Per-question ratio to `rrs-wr` on the same tree and temperature.
    pub speedup_vs_rrs_wr: Option<MeanSe>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub cells: Vec<CellSummary>,
    /// The same per category, when the questions have more than one.
    pub by_category: Vec<CellSummary>,
    /// Per speculative cell whose answers must be the baseline's (positional randomness at any
    /// temperature, or temperature 0): how many are, of the turns both answered.
    pub equal_answers: Vec<EqualAnswers>,
}

/// How many answers of a speculative cell equal plain decoding's. They all should, up to
/// floating-point differences between a tree and a single row where the target has them (at
/// temperature 0 only near-ties can part).
#[derive(Debug, Clone, Serialize)]
pub struct EqualAnswers {
    pub method: String,
    pub tree: String,
    pub temperature: f64,
    /// The baseline compared with: `baseline:positional` or `baseline`.
    pub reference: String,
    pub equal: usize,
    pub turns: usize,
}

/// Pooled per-question figures of one cell.
#[derive(Default, Clone)]
struct PerQuestion {
    new_tokens: usize,
    decode_s: f64,
    prompt_tokens: usize,
    prefill_s: f64,
    /// Of `prefill_s`, `auto`'s cost measurements.
    auto_costs_s: f64,
    forwards: usize,
    rows: usize,
    accepted: Vec<f64>,
}

impl PerQuestion {
    fn tps(&self) -> f64 {
        per_second(self.new_tokens, self.decode_s)
    }

    fn tps_with_prefill(&self) -> f64 {
        per_second(self.new_tokens, self.prefill_s + self.decode_s)
    }

    /// The prompt's own rate: `auto`'s one-off cost measurements are left out (they stay in
    /// [`Self::tps_with_prefill`]).
    fn prefill_tps(&self) -> f64 {
        per_second(self.prompt_tokens, self.prefill_s - self.auto_costs_s)
    }
}

fn per_second(n: usize, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

fn key(method: &str, tree: &str, t: f64) -> String {
    format!("{method}|{tree}|{t}")
}

/// question id -> pooled figures, for one cell key.
fn pooled(records: &[TurnRecord]) -> BTreeMap<String, BTreeMap<String, PerQuestion>> {
    let mut out: BTreeMap<String, BTreeMap<String, PerQuestion>> = BTreeMap::new();
    for r in records {
        let e =
            out.entry(key(&r.method, &r.tree, r.temperature)).or_default().entry(r.question_id.clone()).or_default();
        e.new_tokens += r.new_tokens;
        e.decode_s += r.decode_s;
        e.prompt_tokens += r.prompt_tokens;
        e.prefill_s += r.prefill_s;
        e.auto_costs_s += r.auto_costs_s;
        e.forwards += r.target_forwards;
        e.rows += r.target_rows;
        if e.accepted.len() < r.acceptance_per_depth.len() {
            e.accepted.resize(r.acceptance_per_depth.len(), 0.0);
        }
        for (d, a) in r.acceptance_per_depth.iter().enumerate() {
            e.accepted[d] += a * r.target_forwards as f64;
        }
    }
    out
}

fn ratio(
    a: &BTreeMap<String, PerQuestion>,
    b: Option<&BTreeMap<String, PerQuestion>>,
    tps: fn(&PerQuestion) -> f64,
) -> Option<MeanSe> {
    let b = b?;
    let v: Vec<f64> =
        a.iter().filter_map(|(q, x)| b.get(q).filter(|y| tps(y) > 0.0).map(|y| tps(x) / tps(y))).collect();
    (!v.is_empty()).then(|| MeanSe::of(&v))
}

fn summarize_group(cells: &[Cell], records: &[TurnRecord], category: Option<&str>) -> Vec<CellSummary> {
    let by_cell = pooled(records);
    let mut out = Vec::new();
    for c in cells {
        let (m, tree) = (c.method_name(), c.tree_name().to_string());
        let Some(qs) = by_cell.get(&key(&m, &tree, c.temperature)) else { continue };
        let depth = qs.values().map(|q| q.accepted.len()).max().unwrap_or(0);
        let alpha_per_depth = (0..depth)
            .map(|d| {
                let v: Vec<f64> = qs
                    .values()
                    .filter(|q| q.forwards > 0)
                    .map(|q| q.accepted.get(d).copied().unwrap_or(0.0) / q.forwards as f64)
                    .collect();
                MeanSe::of(&v)
            })
            .collect();
        let taus: Vec<f64> =
            qs.values().filter(|q| q.forwards > 0).map(|q| q.new_tokens as f64 / q.forwards as f64).collect();
        let tps: Vec<f64> = qs.values().map(PerQuestion::tps).collect();
        let rows: Vec<f64> =
            qs.values().filter(|q| q.forwards > 0).map(|q| q.rows as f64 / q.forwards as f64).collect();
        // The baseline with the cell's randomness (plain decoding's own cost of it), else the
        // other one.
        let same = Cell { method: Method::Baseline, tree: None, ..c.clone() }.method_name();
        let baseline =
            by_cell.get(&key(&same, "-", c.temperature)).or_else(|| by_cell.get(&key("baseline", "-", c.temperature)));
        let rrs_wr = by_cell.get(&key("rrs-wr", &tree, c.temperature));
        out.push(CellSummary {
            method: m.clone(),
            tree: tree.clone(),
            temperature: c.temperature,
            category: category.map(str::to_string),
            questions: qs.len(),
            new_tokens: qs.values().map(|q| q.new_tokens).sum(),
            tau: MeanSe::of(&taus),
            rows_per_forward: MeanSe::of(&rows),
            alpha_per_depth,
            tokens_per_s: MeanSe::of(&tps),
            prefill_tokens_per_s: MeanSe::of(&qs.values().map(PerQuestion::prefill_tps).collect::<Vec<_>>()),
            speedup_vs_baseline: if c.method == Method::Baseline {
                None
            } else {
                ratio(qs, baseline, PerQuestion::tps)
            },
            speedup_with_prefill_vs_baseline: if c.method == Method::Baseline {
                None
            } else {
                ratio(qs, baseline, PerQuestion::tps_with_prefill)
            },
            speedup_vs_rrs_wr: if m == "rrs-wr" { None } else { ratio(qs, rrs_wr, PerQuestion::tps) },
        });
    }
    out
}

/// Statistics of every cell, overall and (with several categories) per category.
pub fn summarize(cells: &[Cell], records: &[TurnRecord]) -> Summary {
    let mut categories: Vec<&str> = records.iter().map(|r| r.category.as_str()).collect();
    categories.sort_unstable();
    categories.dedup();
    let mut by_category = Vec::new();
    if categories.len() > 1 {
        for cat in categories {
            let sub: Vec<TurnRecord> = records.iter().filter(|r| r.category == cat).cloned().collect();
            by_category.extend(summarize_group(cells, &sub, Some(cat)));
        }
    }
    Summary { cells: summarize_group(cells, records, None), by_category, equal_answers: equal_answers(cells, records) }
}

/// [`Summary::equal_answers`].
fn equal_answers(cells: &[Cell], records: &[TurnRecord]) -> Vec<EqualAnswers> {
    let plain: BTreeMap<(&str, &str, usize, String), &str> = records
        .iter()
        .filter(|r| r.method.starts_with("baseline"))
        .map(|r| ((r.method.as_str(), r.question_id.as_str(), r.turn, r.temperature.to_string()), r.answer.as_str()))
        .collect();
    let mut out = Vec::new();
    for c in cells.iter().filter(|c| c.method != Method::Baseline) {
        let reference = match c.randomness {
            Randomness::Positional => "baseline:positional",
            Randomness::Stream if c.temperature == 0.0 => "baseline",
            Randomness::Stream => continue,
        };
        let (m, tree) = (c.method_name(), c.tree_name());
        let (mut equal, mut turns) = (0, 0);
        for r in records.iter().filter(|r| r.method == m && r.tree == tree && r.temperature == c.temperature) {
            let key = (reference, r.question_id.as_str(), r.turn, r.temperature.to_string());
            if let Some(&answer) = plain.get(&key) {
                turns += 1;
                equal += (answer == r.answer) as usize;
            }
        }
        if turns > 0 {
            let (tree, temperature, reference) = (tree.to_string(), c.temperature, reference.to_string());
            out.push(EqualAnswers { method: m, tree, temperature, reference, equal, turns });
        }
    }
    out
}

fn opt(x: &Option<MeanSe>) -> String {
    x.as_ref().map_or("-".into(), |m| format!("{}×", m.show(1.0, 2)))
}

/// The report: the run's settings, then per temperature one table shaped like the paper's
/// MT-Bench tables (tau, alpha and speed ratio per method and tree), then per category.
pub fn markdown(meta: &Value, summary: &Summary) -> String {
    let mut s = String::new();
    let get = |k: &str| meta[k].to_string().trim_matches('"').to_string();
    s.push_str(&format!("# MT-Bench speed: {}\n\n", get("pair")));
    s.push_str(&format!("- command: `{}`\n", get("command")));
    s.push_str(&format!("- revision {}, {} UTC, device {}\n", get("revision"), get("date_utc"), get("device")));
    s.push_str(&format!(
        "- {} questions of {} (every turn), at most {} new tokens per turn, chat template: {}\n",
        get("questions"),
        get("questions_file"),
        get("max_new_tokens"),
        get("chat")
    ));
    if meta["interrupted"].as_bool() == Some(true) {
        s.push_str(&format!(
            "- **interrupted**: {} of {} questions finished\n",
            get("questions"),
            get("questions_asked")
        ));
    }
    for n in meta["notes"].as_array().into_iter().flatten() {
        s.push_str(&format!("- note: {}\n", n.as_str().unwrap_or_default()));
    }
    s.push_str(
        "\nMean ± standard error over questions. τ: new tokens per target forward; α: fraction of \
         verification steps that accepted a draft at depth 1 (then per depth); tokens/s: decode \
         only; ratios per question against the baseline and RRS with replacement measured back \
         to back; prefill tokens/s: prompt tokens per second of prefill (the draft's included, `auto`'s \
         cost measurements not); \
         with prefill: the ratio of new tokens per second of prefill plus decode.\n",
    );
    let mut temps: Vec<f64> = summary.cells.iter().map(|c| c.temperature).collect();
    temps.dedup();
    for t in temps {
        s.push_str(&format!(
            "\n## T = {t}\n\n| method | tree | τ | α (depth 1) | α per depth | target rows / step | tokens/s | × baseline | × rrs-wr | prefill tokens/s | × baseline, with prefill |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
        ));
        for c in summary.cells.iter().filter(|c| c.temperature == t) {
            let per_depth: Vec<String> = c.alpha_per_depth.iter().map(|a| format!("{:.2}", a.mean)).collect();
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} |\n",
                c.method,
                c.tree,
                c.tau.show(1.0, 2),
                c.alpha_per_depth.first().map_or("-".into(), |a| a.show(1.0, 3)),
                if per_depth.is_empty() { "-".into() } else { per_depth.join(" / ") },
                c.rows_per_forward.mean,
                c.tokens_per_s.show(1.0, 2),
                opt(&c.speedup_vs_baseline),
                opt(&c.speedup_vs_rrs_wr),
                c.prefill_tokens_per_s.show(1.0, 1),
                opt(&c.speedup_with_prefill_vs_baseline),
            ));
        }
    }
    if !summary.equal_answers.is_empty() {
        s.push_str("\n## Answers equal to the baseline's (temperature 0, or positional randomness)\n\n| method | tree | T | baseline | equal answers |\n|---|---|---|---|---|\n");
        for e in &summary.equal_answers {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} of {} |\n",
                e.method, e.tree, e.temperature, e.reference, e.equal, e.turns
            ));
        }
    }
    if !summary.by_category.is_empty() {
        s.push_str("\n## Per category (τ, × baseline)\n\n| category | method | tree | T | τ | × baseline |\n|---|---|---|---|---|---|\n");
        for c in &summary.by_category {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                c.category.as_deref().unwrap_or("-"),
                c.method,
                c.tree,
                c.temperature,
                c.tau.show(1.0, 2),
                opt(&c.speedup_vs_baseline)
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mt_bench::TurnRecord;
    use engine::decode::Randomness;

    fn rec(q: &str, method: &str, tree: &str, new: usize, s: f64, fwd: usize, acc: Vec<f64>) -> TurnRecord {
        TurnRecord {
            question_id: q.into(),
            category: if q == "1" { "a".into() } else { "b".into() },
            turn: 1,
            method: method.into(),
            tree: tree.into(),
            temperature: 0.0,
            seed: 0,
            order: 0,
            prompt_tokens: 5,
            reused_tokens: 0,
            new_tokens: new,
            target_forwards: fwd,
            target_rows: fwd,
            tau: new as f64 / fwd as f64,
            acceptance_per_depth: acc,
            prefill_s: 0.1,
            auto_costs_s: 0.0,
            decode_s: s,
            tokens_per_s: new as f64 / s,
            draft_s: 0.0,
            target_s: 0.0,
            verify_s: 0.0,
            ngram_steps: 0,
            ngram_tokens: 0,
            stop_reason: "max_new_tokens".into(),
            auto_tree: String::new(),
            rank_tried: [[0; 3]; 3],
            rank_accepted: [[0; 3]; 3],
            answer: String::new(),
        }
    }

    /// `--randomness stream,positional` doubles the cells, names the positional ones
    /// `METHOD:positional`, compares them with the positional baseline, and counts their answers
    /// equal to it.
    #[test]
    fn positional_cells_count_answers_equal_to_plain_decoding() {
        let tree = ("chain-2".to_string(), engine::DraftTree::load("chain-2").unwrap().into());
        let methods = [Method::Baseline, Method::parse("greedy").unwrap()];
        let (cells, _) =
            crate::mt_bench::cells(&methods, &[tree], &[0.7], &[Randomness::Stream, Randomness::Positional]);
        let names: Vec<String> = cells.iter().map(Cell::method_name).collect();
        assert_eq!(names, ["baseline", "greedy", "baseline:positional", "greedy:positional"]);
        let mut records = Vec::new();
        for (q, m, seconds, answer) in [
            ("1", "baseline", 1.0, "x"),
            ("1", "baseline:positional", 2.0, "a"),
            ("2", "baseline:positional", 2.0, "b"),
            ("1", "greedy:positional", 1.0, "a"),
            ("2", "greedy:positional", 1.0, "c"),
        ] {
            let tree = if m.starts_with("baseline") { "-" } else { "chain-2" };
            let mut r = rec(q, m, tree, 10, seconds, 5, vec![0.5]);
            (r.temperature, r.answer) = (0.7, answer.into());
            records.push(r);
        }
        let s = summarize(&cells, &records);
        assert_eq!(s.equal_answers.len(), 1, "a stream cell at T = 0.7 is not compared");
        let e = &s.equal_answers[0];
        assert_eq!((e.method.as_str(), e.tree.as_str(), e.equal, e.turns), ("greedy:positional", "chain-2", 1, 2));
        // Against the positional baseline (2 s per turn), not the stream one (1 s).
        let g = s.cells.iter().find(|c| c.method == "greedy:positional").unwrap();
        assert!((g.speedup_vs_baseline.unwrap().mean - 2.0).abs() < 1e-12);
        let md = markdown(&serde_json::json!({}), &s);
        assert!(md.contains("| greedy:positional | chain-2 | 0.7 | baseline:positional | 1 of 2 |"), "{md}");
    }

    /// A cell at temperature 0 with stream randomness; `tree` is named as in the run, and
    /// stands for `chain-1` (the summaries use only its name).
    fn t0_cell(method: &str, tree: Option<&str>) -> Cell {
        Cell {
            method: Method::parse(method).unwrap(),
            tree: tree.map(|name| (name.to_string(), engine::DraftTree::load("chain-1").unwrap().into())),
            temperature: 0.0,
            randomness: Randomness::Stream,
        }
    }

    /// `--tree auto`'s one-off cost measurements (part of a turn's prefill seconds) count in
    /// the rate with prefill, not in the prompt's own rate.
    #[test]
    fn auto_costs_stay_out_of_the_prompt_rate() {
        let cells = [t0_cell("baseline", None), t0_cell("greedy", Some("auto"))];
        let mut measured = rec("1", "greedy", "auto", 10, 0.5, 5, vec![1.0]);
        (measured.prefill_s, measured.auto_costs_s) = (0.5, 0.4);
        let records = vec![rec("1", "baseline", "-", 10, 1.0, 10, vec![]), measured];
        let s = summarize(&cells, &records);
        let g = &s.cells[1];
        // 5 prompt tokens in 0.5 - 0.4 s; with prefill, 10 tokens in 1.0 s against 10 in 1.1 s.
        assert!((g.prefill_tokens_per_s.mean - 50.0).abs() < 1e-9, "{:?}", g.prefill_tokens_per_s);
        let w = g.speedup_with_prefill_vs_baseline.unwrap();
        assert!((w.mean - 1.1).abs() < 1e-12, "{w:?}");
    }

    #[test]
    fn pools_turns_and_takes_ratios_per_question() {
        let cells = [t0_cell("baseline", None), t0_cell("rrs-wr", Some("chain-1")), t0_cell("greedy", Some("chain-1"))];
        let mut records = vec![
            rec("1", "baseline", "-", 10, 1.0, 10, vec![]),
            rec("2", "baseline", "-", 10, 2.0, 10, vec![]),
            rec("1", "rrs-wr", "chain-1", 10, 0.5, 5, vec![1.0]),
            rec("2", "rrs-wr", "chain-1", 10, 1.0, 8, vec![0.25]),
            rec("1", "greedy", "chain-1", 10, 0.25, 5, vec![1.0]),
        ];
        // A second turn of question 2 for greedy: pooled with the first.
        records.push(rec("2", "greedy", "chain-1", 10, 1.0, 10, vec![0.0]));
        let mut t2 = rec("2", "greedy", "chain-1", 10, 1.0, 10, vec![0.5]);
        t2.turn = 2;
        records.push(t2);
        let s = summarize(&cells, &records);
        let g = &s.cells[2];
        assert_eq!((g.method.as_str(), g.questions, g.new_tokens), ("greedy", 2, 30));
        // q1: 40 tokens/s vs 10 and 20; q2: 20 tokens / 2 s = 10 vs 5 and 10.
        let b = g.speedup_vs_baseline.unwrap();
        assert!((b.mean - 3.0).abs() < 1e-12 && (b.se - 1.0).abs() < 1e-12, "{b:?}");
        let r = g.speedup_vs_rrs_wr.unwrap();
        assert!((r.mean - 1.5).abs() < 1e-12, "{r:?}");
        // tau: q1 10/5 = 2, q2 20/20 = 1; alpha: q1 1, q2 (0 * 10 + 0.5 * 10) / 20 = 0.25.
        assert!((g.tau.mean - 1.5).abs() < 1e-12);
        assert!((g.alpha_per_depth[0].mean - 0.625).abs() < 1e-12);
        assert!(s.cells[0].speedup_vs_baseline.is_none() && s.cells[1].speedup_vs_rrs_wr.is_none());
        // Temperature 0: every speculative cell's answers are compared with the baseline's, on
        // the turns both answered (greedy's second turn of question 2 has no baseline turn).
        let eq: Vec<_> =
            s.equal_answers.iter().map(|e| (e.method.as_str(), e.reference.as_str(), e.equal, e.turns)).collect();
        assert_eq!(eq, [("rrs-wr", "baseline", 2, 2), ("greedy", "baseline", 2, 2)]);
        // With the 0.1 s prefill of every turn: q1 10 / 0.35 s against 10 / 1.1 s (22/7); q2
        // 20 / 2.2 s against 10 / 2.1 s (21/11). Prefill: 5 prompt tokens per 0.1 s.
        let w = g.speedup_with_prefill_vs_baseline.unwrap();
        assert!((w.mean - (22.0 / 7.0 + 21.0 / 11.0) / 2.0).abs() < 1e-12, "{w:?}");
        assert!(
            (g.prefill_tokens_per_s.mean - 50.0).abs() < 1e-9 && s.cells[0].speedup_with_prefill_vs_baseline.is_none()
        );
        assert_eq!(s.by_category.len(), 6);
        let md = markdown(&serde_json::json!({"pair": "p", "notes": []}), &s);
        assert!(md.contains("| greedy | chain-1 | 1.50 ± 0.50 |") && md.contains("3.00 ± 1.00×"), "{md}");
        assert!(md.contains("| 50.0 ± 0.0 | 2.53 ± 0.62×"), "{md}");
    }
}
