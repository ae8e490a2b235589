//! `bench predict`: tokens per second and speedup of each draft tree for a pair, from a cost
//! curve (`bench forward-cost --json`: seconds per forward of k rows for the target and the
//! draft or EAGLE head) and the acceptance of drafts by their node's width and rank (`bench
//! mt-bench` records, or a τ fitted), with the model `--tree auto` uses to choose
//! (`engine::decode::auto_tree`):
//!
//! - a step of tree `T` costs `C(T) = D(1 + P_leaf) + Σ_levels D(width) + T(|T|) + o`, the
//!   draft's forwards (the root's also runs the last step's accepted leaf draft, which was
//!   sampled but never run, with probability `P_leaf`: [`ends_at_leaf`]), the target's over
//!   the tree's rows (its runs' live rows when records ran it), and `o` the step's other work
//!   (verification, copies: the records' verification seconds per step, or `--overhead-ms`);
//! - it emits `E(T)` tokens, from the acceptance `α_{k,j}` of the draft of rank `j` among `k`
//!   ([`AutoTree::expected_tokens`]), the same at every depth: the records count drafts by
//!   width and rank, not by depth, so where deeper drafts are accepted less often (an EAGLE
//!   head's) this rates deep trees higher than `auto`, which scales each depth's `α`
//!   ([`AutoTree::depth_factors`]), now does;
//! - plain decoding emits 1 token per `T(1) + o_plain`.
//!
//! Predicted speedup `= (E(T) / C(T)) / (1 / (T(1) + o_plain))`. With records of runs of the
//! trees themselves, each prediction stands beside the measured speedup (tokens over decoding
//! seconds, against the records' `baseline`), which is how the model is checked on the CPU; on a
//! GPU, where only costs can be measured with random weights, the acceptance measured here (or
//! a paper's τ) and the GPU's costs give the GPU's figures.

use crate::mt_bench::TurnRecord;
use anyhow::{bail, Context};
use clap::Args;
use engine::decode::auto_tree::{Alphas, AutoTree, CostCurve, WIDTHS};
use engine::DraftTree;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct PredictArgs {
    /// `bench forward-cost --json` output: seconds per forward by role (`target`, `draft` or
    /// `eagle_head`) and number of rows.
    #[arg(long)]
    costs: PathBuf,
    /// `bench mt-bench` records (`NAME.records.jsonl`): the acceptance by draft width and rank,
    /// the verification time per step, and the measured speed of the trees they ran.
    #[arg(long)]
    records: Option<PathBuf>,
    /// Instead of (or over) the records' acceptance: one acceptance rate for every draft, fitted
    /// so that `--tau-tree` emits this many tokens per step (e.g. EAGLE-1's MT-Bench τ 3.94 for
    /// Vicuna-7B on `mc_sim_7b_63` at temperature 0).
    #[arg(long)]
    tau: Option<f64>,
    /// The tree `--tau` was measured on.
    #[arg(long, default_value = "mc_sim_7b_63")]
    tau_tree: String,
    /// Only records of this method (default: every speculative one).
    #[arg(long)]
    method: Option<String>,
    /// Only records at this temperature.
    #[arg(long, allow_negative_numbers = true)]
    temperature: Option<f64>,
    /// Comma-separated trees to predict (default: the records' trees, else chains of depth 1 to
    /// 6, `drafts-2-depth-2`, `drafts-2-depth-4` and `mc_sim_7b_63`).
    #[arg(long)]
    trees: Option<String>,
    /// Seconds per step beyond the forwards, in milliseconds (default: the records'
    /// verification time per step; 0 without records).
    #[arg(long)]
    overhead_ms: Option<f64>,
    /// Also write the table as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// The cost curves of a `forward-cost --json` file: the target's and the draft's (or head's).
fn cost_curves(v: &Value) -> anyhow::Result<(CostCurve, CostCurve, String)> {
    let curve = |role: &str| -> Option<CostCurve> {
        let by_k = v["secs"][role].as_object()?;
        let mut c = CostCurve::default();
        for (k, s) in by_k {
            c.record(k.parse().ok()?, s.as_f64()?);
        }
        Some(c)
    };
    let target = curve("target").context("the costs have no `secs.target`")?;
    let (draft, role) = match (curve("draft"), curve("eagle_head")) {
        (Some(d), _) => (d, "draft"),
        (None, Some(h)) => (h, "eagle_head"),
        (None, None) => bail!("the costs have neither `secs.draft` nor `secs.eagle_head`"),
    };
    Ok((target, draft, role.to_string()))
}

/// Acceptance rates from counts by width and rank: each (width, rank) that was tried its own
/// ratio, else the ratio of that rank over every width, else 0.
pub fn alphas_from_counts(tried: &[[u64; WIDTHS]; WIDTHS], accepted: &[[u64; WIDTHS]; WIDTHS]) -> Alphas {
    let pooled: [f64; WIDTHS] = std::array::from_fn(|j| {
        let t: u64 = (j..WIDTHS).map(|k| tried[k][j]).sum();
        let a: u64 = (j..WIDTHS).map(|k| accepted[k][j]).sum();
        if t > 0 {
            a as f64 / t as f64
        } else {
            0.0
        }
    });
    std::array::from_fn(|k| {
        std::array::from_fn(|j| match (j <= k, tried[k][j]) {
            (false, _) => 0.0,
            (true, 0) => pooled[j],
            (true, t) => accepted[k][j] as f64 / t as f64,
        })
    })
}

/// The cost of a fractional number of rows (a mean over steps): linear between the whole
/// numbers around it.
fn at_rows(curve: &CostCurve, rows: f64) -> Option<f64> {
    let (lo, hi) = (rows.floor().max(1.0) as usize, rows.ceil().max(1.0) as usize);
    let (a, b) = (curve.at(lo)?, curve.at(hi)?);
    Some(a + (b - a) * (rows - lo as f64).clamp(0.0, 1.0))
}

/// The probability that a step of `tree` at acceptance `alphas` accepts a path ending at a leaf
/// below the root (a draft never run through the draft model, which runs it at the next step's
/// root): at each node the drafts are tried in order, as in [`AutoTree::expected_tokens`].
pub fn ends_at_leaf(tree: &DraftTree, alphas: &Alphas) -> f64 {
    // Children come after their parents, so a reverse pass sees children first.
    let mut leaf = vec![0.0; tree.len()];
    for v in (0..tree.len()).rev() {
        let kids = tree.children(v);
        if kids.is_empty() {
            leaf[v] = if v == 0 { 0.0 } else { 1.0 };
            continue;
        }
        let row = &alphas[kids.len().clamp(1, WIDTHS) - 1];
        let mut reach = 1.0;
        for (j, &c) in kids.iter().enumerate() {
            let alpha = row[j.min(WIDTHS - 1)];
            leaf[v] += reach * alpha * leaf[c];
            reach *= 1.0 - alpha;
        }
    }
    leaf[0]
}

/// One acceptance rate `a` for every draft such that `tree` emits `tau` tokens per step
/// (bisection: the expected tokens grow with `a`).
pub fn fit_alpha(tree: &DraftTree, tau: f64) -> anyhow::Result<f64> {
    let at = |a: f64| AutoTree::expected_tokens(tree, &[[a; WIDTHS]; WIDTHS]);
    if !(1.0..at(1.0)).contains(&tau) {
        bail!("τ {tau} is out of reach of this tree (1 to {:.2} tokens per step)", at(1.0));
    }
    let (mut lo, mut hi) = (0.0, 1.0);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if at(mid) < tau {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(0.5 * (lo + hi))
}

/// What the records say of one (method, temperature, tree): new tokens, decoding seconds,
/// steps, verification seconds, and the acceptance counts.
#[derive(Default, Clone)]
struct Measured {
    tokens: f64,
    secs: f64,
    steps: f64,
    /// Target rows run (a tree's live nodes: at temperature 0 a node's second draft from a
    /// one-hot draft distribution is never drawn, so multi-draft trees run as chains).
    rows: f64,
    verify_s: f64,
    tried: [[u64; WIDTHS]; WIDTHS],
    accepted: [[u64; WIDTHS]; WIDTHS],
}

impl Measured {
    fn add(&mut self, r: &TurnRecord) {
        self.tokens += r.new_tokens as f64;
        self.secs += r.decode_s;
        self.steps += r.target_forwards as f64;
        self.rows += r.target_rows as f64;
        self.verify_s += r.verify_s;
        for k in 0..WIDTHS {
            for j in 0..WIDTHS {
                self.tried[k][j] += r.rank_tried[k][j];
                self.accepted[k][j] += r.rank_accepted[k][j];
            }
        }
    }

    fn tokens_per_s(&self) -> f64 {
        self.tokens / self.secs
    }

    fn overhead(&self) -> f64 {
        if self.steps > 0.0 {
            self.verify_s / self.steps
        } else {
            0.0
        }
    }
}

fn read_records(path: &PathBuf, args: &PredictArgs) -> anyhow::Result<Vec<TurnRecord>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let r: TurnRecord =
            serde_json::from_str(line).with_context(|| format!("{}: line {}: not a record", path.display(), i + 1))?;
        if args.temperature.is_some_and(|t| (t - r.temperature).abs() > 1e-9) {
            continue;
        }
        out.push(r);
    }
    if out.is_empty() {
        bail!("{}: no records at the temperature asked", path.display());
    }
    Ok(out)
}

pub fn run(args: &PredictArgs) -> anyhow::Result<()> {
    let costs: Value = serde_json::from_str(
        &std::fs::read_to_string(&args.costs).with_context(|| format!("reading {}", args.costs.display()))?,
    )
    .with_context(|| format!("{}: not JSON", args.costs.display()))?;
    let (target, draft, draft_role) = cost_curves(&costs)?;
    let records = args.records.as_ref().map(|p| read_records(p, args)).transpose()?;
    // Records by tree (speculative ones of the method asked), and the baseline's.
    let mut by_tree: BTreeMap<String, Measured> = BTreeMap::new();
    let mut baseline = Measured::default();
    let mut pooled = Measured::default();
    for r in records.iter().flatten() {
        if r.method == "baseline" {
            baseline.add(r);
        } else if args.method.as_ref().is_none_or(|m| *m == r.method) {
            by_tree.entry(r.tree.clone()).or_default().add(r);
            pooled.add(r);
        }
    }
    let fitted = match args.tau {
        Some(tau) => {
            let tree = DraftTree::load(&args.tau_tree).with_context(|| format!("--tau-tree {}", args.tau_tree))?;
            let a = fit_alpha(&tree, tau)?;
            println!("acceptance fitted to τ {tau} on {}: {a:.4} for every draft\n", args.tau_tree);
            Some([[a; WIDTHS]; WIDTHS])
        }
        None if records.is_none() => bail!("give --records (acceptance from runs) or --tau (a τ to fit)"),
        None => None,
    };
    let tree_names: Vec<String> = match &args.trees {
        Some(list) => list.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
        None if !by_tree.is_empty() => by_tree.keys().filter(|t| *t != "auto").cloned().collect(),
        None => ["chain-1", "chain-2", "chain-3", "chain-4", "chain-5", "chain-6", "drafts-2-depth-2"]
            .into_iter()
            .chain(["drafts-2-depth-4", "mc_sim_7b_63"])
            .map(String::from)
            .collect(),
    };
    let overhead_plain = args.overhead_ms.map(|m| m / 1e3).unwrap_or_else(|| baseline.overhead());
    let plain_cost = target.at(1).context("no cost for one target row")? + overhead_plain;
    let plain_rate = 1.0 / plain_cost;
    let mut auto = AutoTree::new(false);
    auto.target = target;
    auto.draft = draft;
    println!(
        "Predicted from {} ({} as the draft){}:\n",
        args.costs.display(),
        draft_role,
        args.records.as_ref().map_or(String::new(), |p| format!(" and {}", p.display()))
    );
    println!(
        "| tree | rows | α source | E (tokens/step) | step (ms) | tokens/s | measured tokens/s | speedup | measured speedup | error |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| plain | 1 | — | 1.00 | {:.3} | {:.1} | {} | 1.00 | | |",
        plain_cost * 1e3,
        plain_rate,
        if baseline.steps > 0.0 { format!("{:.1}", baseline.tokens_per_s()) } else { "—".into() }
    );
    let mut rows = Vec::new();
    for name in &tree_names {
        let tree = DraftTree::load(name).with_context(|| format!("tree `{name}`"))?;
        let own = by_tree.get(name);
        let (alphas, source) = match (fitted, own) {
            (Some(a), _) => (a, "τ fit"),
            (None, Some(m)) if m.tried.iter().flatten().sum::<u64>() > 0 => {
                (alphas_from_counts(&m.tried, &m.accepted), "its runs")
            }
            (None, _) => (alphas_from_counts(&pooled.tried, &pooled.accepted), "all runs"),
        };
        let e = AutoTree::expected_tokens(&tree, &alphas);
        let overhead =
            args.overhead_ms.map(|m| m / 1e3).unwrap_or_else(|| own.map_or(pooled.overhead(), Measured::overhead));
        // The target's forward over the rows the runs of this tree had per step (fewer than
        // its nodes when drafts were not drawn), else over all of its nodes.
        let live = own.filter(|m| m.steps > 0.0).map(|m| m.rows / m.steps).unwrap_or(tree.len() as f64);
        let full = auto.target.at(tree.len()).context("the costs do not cover this tree")?;
        let target_live = at_rows(&auto.target, live).context("no target cost")?;
        // The root's draft forward also runs the last step's deepest accepted draft when that
        // was a leaf (sampled, never run through the draft): 1 + P(the path ends at a leaf) rows.
        let root_extra = if draft_role == "draft" && !tree.children(0).is_empty() {
            let root = |rows| at_rows(&auto.draft, rows).context("no draft cost");
            root(1.0 + ends_at_leaf(&tree, &alphas))? - root(1.0)?
        } else {
            0.0
        };
        let cost = auto.step_cost(&tree).context("the costs do not cover this tree")? - full
            + target_live
            + root_extra
            + overhead;
        let rate = e / cost;
        let speedup = rate / plain_rate;
        let measured =
            own.filter(|m| m.steps > 0.0 && baseline.steps > 0.0).map(|m| m.tokens_per_s() / baseline.tokens_per_s());
        let error = measured.map(|m| speedup / m - 1.0);
        println!(
            "| {name} | {} | {source} | {e:.2} | {:.3} | {rate:.1} | {} | {speedup:.2} | {} | {} |",
            if (live - tree.len() as f64).abs() > 1e-9 {
                format!("{} ({live:.1} live)", tree.len())
            } else {
                tree.len().to_string()
            },
            cost * 1e3,
            own.filter(|m| m.steps > 0.0).map_or("—".into(), |m| format!("{:.1}", m.tokens_per_s())),
            measured.map_or("—".into(), |m| format!("{m:.2}")),
            error.map_or(String::new(), |e| format!("{:+.1}%", e * 100.0))
        );
        rows.push(json!({
            "tree": name, "rows": tree.len(), "live_rows": live, "alpha_source": source, "expected_tokens": e,
            "step_s": cost, "tokens_per_s": rate, "speedup": speedup,
            "measured_speedup": measured, "relative_error": error,
        }));
    }
    if let Some(path) = &args.json {
        let v = json!({
            "costs": args.costs, "records": args.records, "tau": args.tau, "plain_tokens_per_s": plain_rate,
            "overhead_plain_s": overhead_plain, "trees": rows,
        });
        std::fs::write(path, serde_json::to_string_pretty(&v)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Acceptance rates: a width/rank's own ratio, the rank's pooled one where the width was
    /// never tried, 0 past the width.
    #[test]
    fn alphas_come_from_counts() {
        let mut tried = [[0u64; WIDTHS]; WIDTHS];
        let mut accepted = [[0u64; WIDTHS]; WIDTHS];
        tried[0][0] = 10;
        accepted[0][0] = 7;
        tried[1][0] = 10;
        accepted[1][0] = 5;
        tried[1][1] = 5;
        accepted[1][1] = 1;
        let a = alphas_from_counts(&tried, &accepted);
        assert_eq!(a[0][0], 0.7);
        assert_eq!((a[1][0], a[1][1]), (0.5, 0.2));
        // Width 3 never tried: rank 0 pooled over widths (12 of 20), rank 1 over widths 2-3.
        assert_eq!((a[2][0], a[2][1], a[2][2]), (0.6, 0.2, 0.0));
        assert_eq!(a[0][1], 0.0);
    }

    /// The fitted rate reproduces the τ it was fitted to, and a chain's τ is the geometric sum.
    #[test]
    fn a_fitted_alpha_gives_back_its_tau() {
        let tree = DraftTree::preset("mc_sim_7b_63").unwrap();
        let a = fit_alpha(&tree, 3.94).unwrap();
        let e = AutoTree::expected_tokens(&tree, &[[a; WIDTHS]; WIDTHS]);
        assert!((e - 3.94).abs() < 1e-9, "{e}");
        let chain = DraftTree::preset("chain-4").unwrap();
        let a = fit_alpha(&chain, 1.0 + 0.5 + 0.25 + 0.125 + 0.0625).unwrap();
        assert!((a - 0.5).abs() < 1e-9, "{a}");
        assert!(fit_alpha(&chain, 6.0).is_err());
    }

    /// A path ends at a leaf: a chain only when every draft is accepted; two leaf drafts at the
    /// root when either is (in order); no drafts never.
    #[test]
    fn paths_end_at_leaves_as_the_drafts_are_accepted() {
        let mut alphas = [[0.0; WIDTHS]; WIDTHS];
        alphas[0][0] = 0.7;
        alphas[1][0] = 0.6;
        alphas[1][1] = 0.3;
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(ends_at_leaf(&DraftTree::preset("chain-1").unwrap(), &alphas), 0.7));
        assert!(close(ends_at_leaf(&DraftTree::preset("chain-3").unwrap(), &alphas), 0.7 * 0.7 * 0.7));
        let fork = DraftTree::from_paths(&[vec![0], vec![1]]).unwrap();
        assert!(close(ends_at_leaf(&fork, &alphas), 0.6 + 0.4 * 0.3));
        assert_eq!(ends_at_leaf(&DraftTree::root_only(), &alphas), 0.0);
    }
}
