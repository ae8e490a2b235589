//! The study's Markdown: a table shaped like the paper's Table 1 (alpha and its gap to
//! alpha* per method and dataset) and the sweeps as tables.

use super::evaluate::{Metric, MetricSummary, Setting};
use super::prompts::Dataset;

/// The summaries of one dataset at one setting.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Cell {
    pub dataset: Dataset,
    pub setting: Setting,
    pub positions: usize,
    pub prompts: usize,
    pub metrics: Vec<MetricSummary>,
}

impl Cell {
    pub fn get(&self, m: Metric) -> &MetricSummary {
        &self.metrics[m.index()]
    }
}

/// Rows of Table 1: block title, metric, row label.
const ROWS: &[(&str, Metric, &str)] = &[
    ("With replacement", Metric::RrsWr, "RRS"),
    ("With replacement", Metric::KSeq, "K-SEQ"),
    ("With replacement", Metric::KSeqTheory, "α K-SEQ (theory)"),
    ("With replacement", Metric::StarWr, "α*"),
    ("Without replacement", Metric::RrsWor, "RRS"),
    ("Without replacement", Metric::Positional, "positional races (`--reproducible`)"),
    ("Without replacement", Metric::StarWor, "α*"),
    ("Without replacement", Metric::GeneratingFunction, "generating function (paper's α*)"),
    ("Greedy", Metric::GreedyVerify, "Verify"),
    ("Greedy", Metric::StarGreedy, "α*"),
    ("Top-k (deterministic)", Metric::TopK, "Verify = α*"),
];

fn pct(m: &MetricSummary) -> String {
    m.alpha.show(100.0, 1)
}

fn gap(m: &MetricSummary) -> String {
    match m.gap {
        None => "-".into(),
        Some(g) => {
            let arrow = if !m.significant {
                ""
            } else if g.mean < 0.0 {
                "↓"
            } else {
                "↑"
            };
            format!("{:+.2}{arrow}", g.mean * 100.0)
        }
    }
}

/// Table 1 at `setting`: one α / Δα column pair per dataset.
pub fn table(cells: &[Cell], setting: Setting, datasets: &[Dataset]) -> String {
    let cols: Vec<&Cell> =
        datasets.iter().filter_map(|d| cells.iter().find(|c| c.dataset == *d && c.setting == setting)).collect();
    let mut s = format!(
        "| draft sampling | method |{}\n|---|---|{}\n",
        cols.iter().map(|c| format!(" {} α (%) | Δα |", c.dataset.title())).collect::<String>(),
        "---|---|".repeat(cols.len())
    );
    let mut last = "";
    for &(block, metric, label) in ROWS {
        let b = if block == last { "" } else { block };
        last = block;
        s.push_str(&format!("| {b} | {label} |"));
        for c in &cols {
            let m = c.get(metric);
            s.push_str(&format!(" {} | {} |", pct(m), gap(m)));
        }
        s.push('\n');
    }
    s.push_str(&format!(
        "| | positions (responses) |{}\n",
        cols.iter().map(|c| format!(" {} ({}) | |", c.positions, c.prompts)).collect::<String>()
    ));
    s
}

/// A sweep as a table: one row per x value, one column per metric of `metrics`.
pub fn sweep_table(cells: &[&Cell], x_name: &str, x: impl Fn(&Setting) -> String, metrics: &[Metric]) -> String {
    let mut s = format!(
        "| {x_name} |{}\n|---|{}\n",
        metrics.iter().map(|m| format!(" {} |", m.label())).collect::<String>(),
        "---|".repeat(metrics.len())
    );
    for c in cells {
        s.push_str(&format!("| {} |", x(&c.setting)));
        for &m in metrics {
            s.push_str(&format!(" {} |", pct(c.get(m))));
        }
        s.push('\n');
    }
    s
}
