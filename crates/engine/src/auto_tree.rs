//! `--tree auto`: before every speculative step, the tree with the most expected tokens per
//! second of step, from measured forward costs and the acceptance rate seen so far.
//!
//! **Cost** of a step with tree `T`: one draft forward at the root, one per deeper level that
//! has nodes to expand (as wide as that level), and one target forward over `|T|` rows:
//! `C(T) = D(1) + Σ_levels D(width) + T_target(|T|)`. The curves `D(rows)` and
//! `T_target(rows)` are measured once per [`crate::decode::Generator`] (a warm-up, then the best
//! of two forwards per row count), then follow what each step measures (moving average).
//!
//! **Tokens** of a step: the drafts of one node are tried in order, and `α_j` is the
//! probability that the draft of rank `j` is accepted when the `j` before it were rejected
//! (ranks from [`RANKS`] - 1 on share one estimate). The expected number of drafts accepted
//! below a node is `extra(v) = Σ_j Π_{i<j} (1-α_i) · α_j · (1 + extra(child_j))`, and a step
//! emits `E(T) = 1 + extra(root)` tokens (a chain of depth `d`: `Σ_{i=0}^{d} α_0^i`). Each
//! `α_j` is the ratio of accepted to tried drafts of that rank so far, with a prior worth 4
//! drafts and a forgetting factor, so that it follows the prompt. One `α` for all ranks would
//! overrate second drafts (top-2 drafts at temperature 0 on the default pair: `α_0` 0.69,
//! `α_1` 0.35) and underrate chains once wide trees were tried.
//!
//! The draft is a draft model or an EAGLE head: the head's cost per forward is measured the
//! same way (zero features, its logits through the target's output layer), and what each step
//! measures follows.
//!
//! The tree without drafts (plain decoding, `E = 1`, `C = T_target(1)`) is a candidate too;
//! while it wins no draft is tried, so every 16th such step drafts anyway to keep `α` honest.
//! Whatever tree is picked, each step is exact: the choice depends only on past steps, never
//! on the drafts or the target's logits of the step itself.

use crate::kv_cache::KvCache;
use crate::model::{causal_bias, DecoderModel};
use crate::tree::DraftTree;
use candle_core::Result;
use std::sync::Arc;
use std::time::Instant;

/// Moving-average weight of a new timing.
const EMA: f64 = 0.2;
/// Draft ranks with their own acceptance estimate (later ranks share the last).
pub const RANKS: usize = 3;
/// Prior of the acceptance rate of each rank and its weight in drafts.
const PRIOR_ALPHA: [f64; RANKS] = [0.6, 0.3, 0.2];
const PRIOR_WEIGHT: f64 = 4.0;
/// Per-step decay of the acceptance counts.
const FORGET: f64 = 0.98;
/// Steps without drafts after which one step drafts anyway.
const EXPLORE_EVERY: usize = 16;

/// The candidate trees: chains of depth 1 to 6, plus multi-draft trees when the draft keeps
/// a temperature (a one-hot q yields one distinct draft per node, so wider trees would only
/// cost rows): chains with a second draft at their first 1-3 nodes (`chain-D-forks-K`, no
/// wider draft forwards than a chain's) and full trees. Index 0 is the tree without drafts.
pub fn candidates(multi_draft: bool) -> Vec<(String, Arc<DraftTree>)> {
    let mut names: Vec<String> = vec![];
    names.extend((1..=6).map(|d| format!("chain-{d}")));
    if multi_draft {
        for d in 1..=5 {
            names.extend((1..=d.min(3)).map(|k| format!("chain-{d}-forks-{k}")));
        }
        names.extend(["drafts-2-depth-2", "drafts-2-depth-3", "drafts-3-depth-2"].map(String::from));
    }
    let mut out = vec![("no-drafts".to_string(), Arc::new(DraftTree::root_only()))];
    out.extend(names.into_iter().map(|n| {
        let t = DraftTree::preset(&n).expect("valid preset");
        (n, Arc::new(t))
    }));
    out
}

/// Measured seconds per forward by number of rows (index = rows), filled where measured and
/// interpolated linearly between (extrapolated with the last slope) elsewhere.
#[derive(Debug, Clone, Default)]
pub struct CostCurve {
    secs: Vec<Option<f64>>,
}

impl CostCurve {
    /// Records a measurement (the first one as is, later ones as a moving average).
    pub fn record(&mut self, rows: usize, secs: f64) {
        if rows == 0 || !secs.is_finite() {
            return;
        }
        if self.secs.len() <= rows {
            self.secs.resize(rows + 1, None);
        }
        let s = &mut self.secs[rows];
        *s = Some(match *s {
            Some(old) => (1.0 - EMA) * old + EMA * secs,
            None => secs,
        });
    }

    /// Whether `rows` has a measurement.
    pub fn has(&self, rows: usize) -> bool {
        self.secs.get(rows).copied().flatten().is_some()
    }

    /// The cost of `rows`, or `None` when nothing is measured.
    pub fn at(&self, rows: usize) -> Option<f64> {
        if let Some(Some(s)) = self.secs.get(rows) {
            return Some(*s);
        }
        let known: Vec<(usize, f64)> = self.secs.iter().enumerate().filter_map(|(r, s)| s.map(|s| (r, s))).collect();
        let (&first, &last) = (known.first()?, known.last()?);
        let line = |(r0, s0): (usize, f64), (r1, s1): (usize, f64)| {
            let slope = if r1 > r0 { (s1 - s0) / (r1 - r0) as f64 } else { 0.0 };
            (s0 + slope * (rows as f64 - r0 as f64)).max(0.0)
        };
        if rows < first.0 {
            return Some(first.1);
        }
        match known.windows(2).find(|w| w[0].0 < rows && rows < w[1].0) {
            Some(w) => Some(line(w[0], w[1])),
            None if known.len() >= 2 => Some(line(known[known.len() - 2], last)),
            None => Some(last.1 * rows as f64 / last.0 as f64),
        }
    }
}

/// The state of the choice, kept across generations of one generator.
#[derive(Debug, Clone)]
pub struct AutoTree {
    pub trees: Vec<(String, Arc<DraftTree>)>,
    pub target: CostCurve,
    pub draft: CostCurve,
    /// Accepted and tried drafts by rank (forgetting applied).
    accepted: [f64; RANKS],
    tried: [f64; RANKS],
    steps_without_drafts: usize,
    /// Steps taken with each tree (same order as `trees`).
    pub uses: Vec<usize>,
}

impl AutoTree {
    pub fn new(multi_draft: bool) -> Self {
        let trees = candidates(multi_draft);
        let uses = vec![0; trees.len()];
        Self {
            trees,
            target: CostCurve::default(),
            draft: CostCurve::default(),
            accepted: [0.0; RANKS],
            tried: [0.0; RANKS],
            steps_without_drafts: 0,
            uses,
        }
    }

    /// The largest number of nodes of any candidate.
    pub fn max_len(&self) -> usize {
        self.trees.iter().map(|(_, t)| t.len()).max().unwrap_or(1)
    }

    /// Row counts that the cost model needs: target rows and draft level widths.
    pub fn needed_rows(&self) -> (Vec<usize>, Vec<usize>) {
        let mut target: Vec<usize> = self.trees.iter().map(|(_, t)| t.len()).collect();
        let mut draft: Vec<usize> = vec![1];
        for (_, t) in &self.trees {
            draft.extend(level_widths(t));
        }
        target.sort_unstable();
        target.dedup();
        draft.sort_unstable();
        draft.dedup();
        (target, draft)
    }

    /// The current estimates `α_j` by draft rank (see the module docs).
    pub fn alphas(&self) -> [f64; RANKS] {
        std::array::from_fn(|r| (self.accepted[r] + PRIOR_ALPHA[r] * PRIOR_WEIGHT) / (self.tried[r] + PRIOR_WEIGHT))
    }

    /// Records the verification of one node's drafts: the first `tried` drafts were looked at
    /// in order, all rejected but possibly the last.
    pub fn record_node(&mut self, tried: usize, accepted: bool) {
        for r in 0..tried {
            self.tried[r.min(RANKS - 1)] += 1.0;
        }
        if accepted && tried > 0 {
            self.accepted[(tried - 1).min(RANKS - 1)] += 1.0;
        }
    }

    /// Expected tokens per step of `tree` at acceptance `alphas` by rank (the last serves
    /// every later rank; see the module docs).
    pub fn expected_tokens(tree: &DraftTree, alphas: &[f64]) -> f64 {
        // Children come after their parents, so a reverse pass sees children first.
        let mut extra = vec![0.0; tree.len()];
        for v in (0..tree.len()).rev() {
            let mut reach = 1.0;
            let mut e = 0.0;
            for (j, &c) in tree.children(v).iter().enumerate() {
                let alpha = alphas[j.min(alphas.len() - 1)];
                e += reach * alpha * (1.0 + extra[c]);
                reach *= 1.0 - alpha;
            }
            extra[v] = e;
        }
        1.0 + extra[0]
    }

    /// Seconds of one step of `tree`, or `None` when a needed cost is unknown.
    pub fn step_cost(&self, tree: &DraftTree) -> Option<f64> {
        let mut c = self.target.at(tree.len())?;
        if !tree.children(0).is_empty() {
            c += self.draft.at(1)?;
            for w in level_widths(tree) {
                c += self.draft.at(w)?;
            }
        }
        Some(c)
    }

    /// Picks the tree for the next step (an index into `trees`) and ends the step's
    /// bookkeeping of the previous one (forgetting, exploration).
    pub fn choose(&mut self) -> usize {
        self.accepted.iter_mut().chain(self.tried.iter_mut()).for_each(|x| *x *= FORGET);
        let alphas = self.alphas();
        let rate = |i: usize| {
            let t = &self.trees[i].1;
            self.step_cost(t).map(|c| Self::expected_tokens(t, &alphas) / c.max(1e-9))
        };
        let best_of = |from: usize| {
            (from..self.trees.len())
                .filter_map(|i| rate(i).map(|r| (i, r)))
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(i, _)| i)
        };
        // The best drafting tree, then plain steps if they beat it (ties go to drafting).
        let drafting = best_of(1).map(|i| (i, rate(i).expect("rated by best_of")));
        let mut pick = match (rate(0), drafting) {
            (Some(plain), Some((i, r))) => {
                if plain > r {
                    0
                } else {
                    i
                }
            }
            (Some(_), None) => 0,
            (None, Some((i, _))) => i,
            (None, None) => 1.min(self.trees.len() - 1),
        };
        let best_drafting = drafting.map_or(0, |(i, _)| i);
        if pick == 0 {
            self.steps_without_drafts += 1;
            if self.steps_without_drafts >= EXPLORE_EVERY {
                pick = best_drafting;
            }
        }
        if pick != 0 {
            self.steps_without_drafts = 0;
        }
        self.uses[pick] += 1;
        pick
    }

    /// Measures the forward costs not measured yet: after a warm-up, the best of two
    /// forwards per row count. The target is timed with [`time_forward`] on its cache (left as
    /// it was); `draft` times one draft forward of the given number of rows (a draft model
    /// through [`time_forward`], an EAGLE head through its own timer).
    pub fn calibrate(
        &mut self,
        target: &DecoderModel,
        target_cache: &mut KvCache,
        draft: Option<&mut dyn FnMut(usize) -> Result<f64>>,
        pending: u32,
    ) -> Result<()> {
        let (target_rows, draft_rows) = self.needed_rows();
        measure(&mut self.target, &target_rows, &mut |rows| time_forward(target, target_cache, rows, pending))?;
        if let Some(time) = draft {
            measure(&mut self.draft, &draft_rows, time)?;
        }
        Ok(())
    }

    /// A one-line summary: α by rank (the ranks tried) and the steps per tree.
    pub fn summary(&self) -> String {
        let used: Vec<String> =
            self.trees.iter().zip(&self.uses).filter(|(_, &u)| u > 0).map(|((n, _), u)| format!("{n} x{u}")).collect();
        let ranks = self.tried.iter().skip(1).take_while(|&&t| t > 0.0).count() + 1;
        let alphas: Vec<String> = self.alphas()[..ranks].iter().map(|a| format!("{a:.2}")).collect();
        format!("alpha {}; steps: {}", alphas.join(" / "), used.join(", "))
    }
}

/// Records into `curve` the row counts of `rows` it lacks: one warm-up forward, then the
/// best of two timings per row count.
fn measure(curve: &mut CostCurve, rows: &[usize], time: &mut dyn FnMut(usize) -> Result<f64>) -> Result<()> {
    if rows.iter().all(|&r| curve.has(r)) {
        return Ok(());
    }
    time(1)?;
    for &r in rows {
        if !curve.has(r) {
            let s = time(r)?.min(time(r)?);
            curve.record(r, s);
        }
    }
    Ok(())
}

/// Seconds of one forward of `rows` copies of `token` (id 0 when outside the model's
/// vocabulary) after the cached positions, logits of every row to the host included. The
/// cache is truncated back to its length: it is left as it was.
pub fn time_forward(model: &DecoderModel, cache: &mut KvCache, rows: usize, token: u32) -> Result<f64> {
    let base = cache.len();
    let token = if (token as usize) < model.config().vocab_size { token } else { 0 };
    let tokens = vec![token; rows];
    let pos: Vec<u32> = (base..base + rows).map(|p| p as u32).collect();
    let bias = causal_bias(base, rows, model.dtype(), model.device())?;
    let t0 = Instant::now();
    let hidden = model.forward(&tokens, &pos, &bias, cache)?;
    std::hint::black_box(model.logits(&hidden)?.flatten_all()?.to_vec1::<f32>()?);
    let s = t0.elapsed().as_secs_f64();
    cache.truncate(base);
    Ok(s)
}

/// Widths of the draft forwards below the root: the nodes with children at each depth >= 1.
fn level_widths(tree: &DraftTree) -> Vec<usize> {
    tree.levels()
        .iter()
        .skip(1)
        .map(|l| l.clone().filter(|&i| !tree.children(i).is_empty()).count())
        .take_while(|&w| w > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_tokens_of_a_chain_is_a_geometric_sum() {
        let t = DraftTree::preset("chain-3").unwrap();
        let a: f64 = 0.7;
        let want = 1.0 + a + a * a + a * a * a;
        assert!((AutoTree::expected_tokens(&t, &[a]) - want).abs() < 1e-12);
        // A chain only ever uses rank 0.
        assert!((AutoTree::expected_tokens(&t, &[a, 0.1, 0.0]) - want).abs() < 1e-12);
        assert_eq!(AutoTree::expected_tokens(&DraftTree::root_only(), &[a]), 1.0);
    }

    /// Two drafts per node, depth 1: P(first accepted) = a0, P(second) = (1-a0) a1; with a
    /// chain below the first draft (`chain-2-forks-1`), that draft's subtree adds a0 * a0.
    #[test]
    fn expected_tokens_of_two_drafts() {
        let t = DraftTree::preset("drafts-2-depth-1").unwrap();
        let (a0, a1) = (0.7, 0.3);
        let want = 1.0 + a0 + (1.0 - a0) * a1;
        assert!((AutoTree::expected_tokens(&t, &[a0, a1]) - want).abs() < 1e-12);
        assert!((AutoTree::expected_tokens(&t, &[0.4]) - (1.0 + 0.4 + 0.6 * 0.4)).abs() < 1e-12);
        let forked = DraftTree::preset("chain-2-forks-1").unwrap();
        let want = 1.0 + a0 * (1.0 + a0) + (1.0 - a0) * a1;
        assert!((AutoTree::expected_tokens(&forked, &[a0, a1]) - want).abs() < 1e-12);
    }

    /// Verifications count by rank: a node accepting its second draft rejected its first.
    #[test]
    fn acceptance_is_counted_by_rank() {
        let mut a = AutoTree::new(true);
        let prior = a.alphas();
        for _ in 0..100 {
            a.record_node(1, true); // first accepted
            a.record_node(2, true); // first rejected, second accepted
            a.record_node(2, false); // both rejected
            a.record_node(3, false); // three rejected
        }
        // Rank 0: 100 of 400; rank 1: 100 of 300; rank 2: 0 of 100, all with the prior.
        let w = PRIOR_WEIGHT;
        let want =
            [(100.0 + prior[0] * w) / (400.0 + w), (100.0 + prior[1] * w) / (300.0 + w), (prior[2] * w) / (100.0 + w)];
        for (g, e) in a.alphas().iter().zip(want) {
            assert!((g - e).abs() < 1e-12, "{:?} against {want:?}", a.alphas());
        }
        assert!(a.summary().starts_with("alpha 0.25 / 0.33 / 0.01;"), "{}", a.summary());
    }

    #[test]
    fn cost_curve_interpolates_and_extrapolates() {
        let mut c = CostCurve::default();
        assert_eq!(c.at(3), None);
        c.record(1, 1.0);
        assert_eq!(c.at(4), Some(4.0)); // one point: proportional
        c.record(3, 2.0);
        assert_eq!(c.at(2), Some(1.5));
        assert_eq!(c.at(5), Some(3.0));
        assert_eq!(c.at(1), Some(1.0));
        c.record(1, 2.0); // moving average
        assert!((c.at(1).unwrap() - 1.2).abs() < 1e-12);
    }

    /// With a costly target row and a cheap draft, long chains win at high acceptance and
    /// no drafts win at low acceptance.
    #[test]
    fn choice_follows_acceptance_and_cost() {
        let mut a = AutoTree::new(false);
        for r in 1..=7 {
            a.target.record(r, 0.040 + 0.002 * (r - 1) as f64);
        }
        a.draft.record(1, 0.004);
        for _ in 0..50 {
            a.record_node(1, true);
        }
        let pick = a.choose();
        assert_eq!(a.trees[pick].0, "chain-6", "alpha {:?}", a.alphas());
        let mut b = AutoTree::new(false);
        b.target = a.target.clone();
        b.draft.record(1, 0.030);
        for _ in 0..50 {
            b.record_node(1, false);
        }
        let pick = b.choose();
        assert_eq!(b.trees[pick].0, "no-drafts", "alpha {:?}", b.alphas());
        // Exploration: a draft step at the latest every EXPLORE_EVERY steps.
        let picks: Vec<usize> = (0..EXPLORE_EVERY).map(|_| b.choose()).collect();
        assert!(picks.iter().any(|&p| p != 0));
    }

    /// With multi-draft candidates, second drafts are drafted only when they are accepted:
    /// cheap target rows and a cheap draft, first drafts accepted at 0.7; second drafts never
    /// accepted give a tree without second drafts, second drafts accepted at 0.6 one with them.
    #[test]
    fn second_drafts_follow_their_own_acceptance() {
        let costs = |a: &mut AutoTree| {
            for r in 1..=16 {
                a.target.record(r, 0.020 + 0.0005 * (r - 1) as f64);
            }
            for r in 1..=9 {
                a.draft.record(r, 0.005 + 0.0005 * (r - 1) as f64);
            }
        };
        let second_drafts =
            |a: &AutoTree, i: usize| (0..a.trees[i].1.len()).any(|v| a.trees[i].1.children(v).len() > 1);
        let mut never = AutoTree::new(true);
        costs(&mut never);
        for i in 0..200 {
            if i % 10 < 7 {
                never.record_node(1, true);
            } else {
                never.record_node(2, false);
            }
        }
        let pick = never.choose();
        assert!(!second_drafts(&never, pick), "{} at {:?}", never.trees[pick].0, never.alphas());
        let mut often = AutoTree::new(true);
        costs(&mut often);
        for i in 0..200 {
            match i % 10 {
                0..7 => often.record_node(1, true),
                7 | 8 => often.record_node(2, true),
                _ => often.record_node(2, false),
            }
        }
        let pick = often.choose();
        assert!(second_drafts(&often, pick), "{} at {:?}", often.trees[pick].0, often.alphas());
    }
}
