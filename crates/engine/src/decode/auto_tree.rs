//! `--tree auto`: before every speculative step, the tree with the most expected tokens per
//! second of step, from measured forward costs and the acceptance rate seen so far.
//!
//! **Cost** of a step with tree `T`: one draft forward at the root, one per deeper level that
//! has nodes to expand (as wide as that level), and one target forward over `|T|` rows:
//! `C(T) = D(1) + Σ_levels D(width) + T_target(|T|)`. The curves `D(rows)` and
//! `T_target(rows)` are measured once per [`crate::decode::Generator`] (a warm-up, then one
//! forward at a few row counts, [`anchors`], interpolated between), then follow what each step
//! measures (moving average). Timing every row count of every candidate (twice) took 0.9 s of a
//! 6 s generation on a 2-core CPU; the anchors take a fraction of that.
//!
//! **Tokens** of a step: the `k` drafts of one node are tried in order, and `α_{k,j}` is the
//! probability that the draft of rank `j` is accepted when the `j` before it were rejected
//! (`k` and `j` from [`WIDTHS`] on share the last estimate). The expected number of drafts
//! accepted below a node with `k` children is
//! `extra(v) = Σ_j Π_{i<j} (1-α_{k,i}) · α_{k,j} · (1 + extra(child_j))`, and a step emits
//! `E(T) = 1 + extra(root)` tokens (a chain of depth `d`: `Σ_{i=0}^{d} α_{1,0}^i`). Each
//! `α_{k,j}` is the ratio of accepted to tried drafts of that kind so far, with a prior worth 4
//! drafts and a forgetting factor, so that it follows the prompt; the prior is the rank's
//! estimate over all widths, so a width not tried yet starts from the others' acceptance.
//! Both indices matter, as measured on the default pair: a second draft is accepted far less
//! often than a first (top-2 drafts at temperature 0: 0.69, then 0.35), and the first of two
//! drafts is not the draft of a chain (the Greedy construction samples one draft from q but
//! puts q's argmax first among two: at temperature 0.7 on one prompt, a chain's draft was
//! accepted at 0.65, either of two at 0.75).
//!
//! The draft is a draft model or an EAGLE head: the head's cost per forward is measured the
//! same way (zero features, its logits through the target's output layer), and what each step
//! measures follows.
//!
//! **In a batch** (generations whose forwards a [`crate::model::Batcher`] gathers), a step's
//! forwards carry the other members' rows too, and every row slows every member: the choice
//! maximizes the batch's tokens per second, `(E(T) + E_others) / C_batch(T)`, where
//! `C_batch(T) = D(R_d + 1) + Σ_levels D(R_d + width) + T_target(R_t + |T|)` with `R_t`, `R_d`
//! and `E_others` the rows and expected tokens the others posted for their next steps
//! ([`crate::model::others_load`]). Alone (`R = 0`, `E_others = 0`) this is the rule above;
//! where a forward's cost grows with its rows (a full batch on the CPU), rows that add fewer
//! tokens than the batch's average are not worth their time, and the trees shrink, to none. The
//! curves are measured alone ([`crate::model::Solo`]) and then follow what each step's batched
//! forwards cost at the batch's total rows ([`crate::model::take_batched_cost`]).
//!
//! The tree without drafts (plain decoding, `E = 1`, `C = T_target(1)`) is a candidate too;
//! while it wins no draft is tried, so every 16th such step drafts anyway to keep `α` honest.
//! Whatever tree is picked, each step is exact: the choice depends only on past steps, never
//! on the drafts or the target's logits of the step itself.

use crate::decode::host_copy::HostLogits;
use crate::decode::tree::DraftTree;
use crate::model::kv_cache::KvCache;
use crate::model::{causal_bias, DecoderModel, SharedLoad};
use crate::Result;
use std::sync::Arc;
use std::time::Instant;

/// Moving-average weight of a new timing.
const EMA: f64 = 0.2;
/// Draft counts per node and ranks with their own acceptance estimate (larger ones share the
/// last).
pub const WIDTHS: usize = 3;
/// Acceptance estimates `α[k - 1][j]` for rank `j` among `k` drafts (entries `j >= k` unused).
pub type Alphas = [[f64; WIDTHS]; WIDTHS];
/// Prior of each acceptance rate and its weight in drafts.
const PRIOR_ALPHA: Alphas = [[0.6, 0.0, 0.0], [0.6, 0.3, 0.0], [0.6, 0.3, 0.2]];
const PRIOR_WEIGHT: f64 = 4.0;
/// Per-step decay of the acceptance counts.
const FORGET: f64 = 0.98;
/// Steps without drafts after which one step drafts anyway.
const EXPLORE_EVERY: usize = 16;
/// Tokens an n-gram lookup step is assumed to emit before a text has shown its own (hopeful,
/// so that lookups are tried: a text that declines them learns nothing more about them)
/// ([`AutoTree::lookup_pays_in_batch`]), as if seen on this many steps.
pub const LOOKUP_PRIOR_TOKENS: f64 = 3.0;
pub const LOOKUP_PRIOR_WEIGHT: f64 = 4.0;

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

    /// Takes `other`'s measurements of the row counts this curve lacks.
    pub fn fill_from(&mut self, other: &CostCurve) {
        for (rows, secs) in other.secs.iter().enumerate() {
            if let (Some(secs), false) = (secs, self.has(rows)) {
                self.record(rows, *secs);
            }
        }
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

/// Forward costs shared by the generators of the same models on one machine (`mdsd serve`'s
/// slots, `generate --jsonl`'s workers): a generator starting a text takes the costs the book
/// has, measures only what neither has (holding the book meanwhile, so that generators
/// starting together measure once), and leaves its curves in the book when the text ends.
/// Without it each new slot timed its models again on its first request (seconds of forwards
/// that the other streams wait for).
#[derive(Debug, Clone, Default)]
pub struct CostBook(Arc<std::sync::Mutex<(CostCurve, CostCurve)>>);

impl CostBook {
    pub fn new() -> Self {
        Self::default()
    }

    /// The book's (target, draft) curves, locked.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, (CostCurve, CostCurve)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The state of the choice, kept across generations of one generator.
#[derive(Debug, Clone)]
pub struct AutoTree {
    pub trees: Vec<(String, Arc<DraftTree>)>,
    pub target: CostCurve,
    pub draft: CostCurve,
    /// Accepted and tried drafts by node width and rank (forgetting applied).
    accepted: Alphas,
    tried: Alphas,
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
            accepted: [[0.0; WIDTHS]; WIDTHS],
            tried: [[0.0; WIDTHS]; WIDTHS],
            steps_without_drafts: 0,
            uses,
        }
    }

    /// The state for the candidates of `multi_draft` ([`candidates`]): this one when it has
    /// them, else a fresh one that keeps the measured costs, which belong to the models and the
    /// machine, not to the candidates. (The candidates change with the draft's temperature:
    /// `mdsd serve` answering requests at temperature 0 and 0.7 in turn, and `bench mt-bench`
    /// with both temperatures, re-measured every cost at each change.)
    pub fn for_candidates(self, multi_draft: bool) -> Self {
        let fresh = Self::new(multi_draft);
        if fresh.trees.iter().map(|(n, _)| n).eq(self.trees.iter().map(|(n, _)| n)) {
            return self;
        }
        Self { target: self.target, draft: self.draft, ..fresh }
    }

    /// Starts a new text: forgets the acceptance seen so far, which belongs to the last text
    /// (carried over, a summary's poor acceptance kept the next questions from drafting at
    /// all), and keeps the measured costs, which belong to the models and the machine.
    pub fn new_text(&mut self) {
        self.accepted = [[0.0; WIDTHS]; WIDTHS];
        self.tried = [[0.0; WIDTHS]; WIDTHS];
        self.steps_without_drafts = 0;
        self.uses.iter_mut().for_each(|u| *u = 0);
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

    /// The current estimates `α_{k,j}` (see the module docs): each width's own counts, shrunk
    /// towards what drafts of the same rank showed at every width (that estimate itself shrunk
    /// towards `PRIOR_ALPHA`). A width not tried yet thus starts from the others' acceptance
    /// rather than a constant: with only forked trees tried at temperature 0.7 on the default
    /// pair, a chain's draft kept the prior 0.60 while forks' first drafts showed 0.84, and
    /// chains (accepted about as often, at fewer rows) were never tried.
    pub fn alphas(&self) -> Alphas {
        let pooled: [f64; WIDTHS] = std::array::from_fn(|j| {
            let widths = j..WIDTHS;
            let accepted: f64 = widths.clone().map(|k| self.accepted[k][j]).sum();
            let tried: f64 = widths.map(|k| self.tried[k][j]).sum();
            (accepted + PRIOR_ALPHA[j][j] * PRIOR_WEIGHT) / (tried + PRIOR_WEIGHT)
        });
        std::array::from_fn(|k| {
            std::array::from_fn(|j| {
                if j <= k {
                    (self.accepted[k][j] + pooled[j] * PRIOR_WEIGHT) / (self.tried[k][j] + PRIOR_WEIGHT)
                } else {
                    0.0
                }
            })
        })
    }

    /// Records the verification of one node's `drafts` drafts, tried in order: the one of rank
    /// `accepted` was accepted after those before it were rejected, or (`None`) all were
    /// rejected.
    pub fn record_node(&mut self, drafts: usize, accepted: Option<usize>) {
        let k = drafts.clamp(1, WIDTHS) - 1;
        let tried = accepted.map_or(drafts, |j| j + 1);
        for r in 0..tried {
            self.tried[k][r.min(WIDTHS - 1)] += 1.0;
        }
        if let Some(j) = accepted {
            self.accepted[k][j.min(WIDTHS - 1)] += 1.0;
        }
    }

    /// Expected tokens per step of `tree` at acceptance `alphas` (see the module docs).
    pub fn expected_tokens(tree: &DraftTree, alphas: &Alphas) -> f64 {
        // Children come after their parents, so a reverse pass sees children first.
        let mut extra = vec![0.0; tree.len()];
        for v in (0..tree.len()).rev() {
            let mut reach = 1.0;
            let mut e = 0.0;
            let kids = tree.children(v);
            let row = &alphas[kids.len().clamp(1, WIDTHS) - 1];
            for (j, &c) in kids.iter().enumerate() {
                let alpha = row[j.min(WIDTHS - 1)];
                e += reach * alpha * (1.0 + extra[c]);
                reach *= 1.0 - alpha;
            }
            extra[v] = e;
        }
        1.0 + extra[0]
    }

    /// Seconds of one step of `tree`, or `None` when a needed cost is unknown.
    pub fn step_cost(&self, tree: &DraftTree) -> Option<f64> {
        self.batch_step_cost(tree, &SharedLoad::NONE)
    }

    /// Seconds of one step of `tree` in a batch whose other members ask `others` (see the
    /// module docs), or `None` when a needed cost is unknown.
    pub fn batch_step_cost(&self, tree: &DraftTree, others: &SharedLoad) -> Option<f64> {
        let mut c = self.target.at(others.target_rows + tree.len())?;
        if !tree.children(0).is_empty() {
            c += self.draft.at(others.draft_rows + 1)?;
            for w in level_widths(tree) {
                c += self.draft.at(others.draft_rows + w)?;
            }
        }
        Some(c)
    }

    /// Whether an n-gram lookup step of `rows` target rows (no draft forward), expected to emit
    /// `tokens`, gives a batch whose other members ask `others` at least the tokens per second of
    /// a plain step (true when a cost is unknown). Alone, lookups are nearly free at a few rows;
    /// in a batch their rows are paid by every member: on a 2-vCPU AVX2 EPYC a row of the
    /// default target costs ~12 ms beside others against ~30 ms for a one-row forward
    /// (`examples/batch_timing`), so a lookup that emits 1.3 tokens loses the batch time.
    pub fn lookup_pays_in_batch(&self, rows: usize, tokens: f64, others: &SharedLoad) -> bool {
        match (self.target.at(others.target_rows + rows), self.target.at(others.target_rows + 1)) {
            (Some(lookup), Some(plain)) => {
                (tokens + others.tokens) / lookup.max(1e-9) >= (1.0 + others.tokens) / plain.max(1e-9)
            }
            _ => true,
        }
    }

    /// What a step of `tree` asks of a batch ([`SharedLoad`]): its rows and expected tokens.
    pub fn load_of(&self, tree: &DraftTree) -> SharedLoad {
        load_of_tree(tree, Self::expected_tokens(tree, &self.alphas()))
    }

    /// Picks the tree for the next step (an index into `trees`) and ends the step's
    /// bookkeeping of the previous one (forgetting, exploration).
    pub fn choose(&mut self) -> usize {
        self.choose_in_batch(&SharedLoad::NONE)
    }

    /// [`Self::choose`] for a member of a batch whose other members ask `others`: the tree
    /// with the most tokens per second of the batch (see the module docs).
    pub fn choose_in_batch(&mut self, others: &SharedLoad) -> usize {
        self.accepted.iter_mut().chain(self.tried.iter_mut()).flatten().for_each(|x| *x *= FORGET);
        let alphas = self.alphas();
        let rate = |i: usize| {
            let t = &self.trees[i].1;
            self.batch_step_cost(t, others)
                .map(|c| (Self::expected_tokens(t, &alphas) + others.tokens) / c.max(1e-9))
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
            // In a batch every member's exploration costs them all (the others wait for its
            // draft forwards): the batch explores as often as one generation alone would.
            let members = 1 + others.target_rows.min(64);
            if self.steps_without_drafts >= EXPLORE_EVERY * members {
                pick = best_drafting;
            }
        }
        if pick != 0 {
            self.steps_without_drafts = 0;
        }
        self.uses[pick] += 1;
        pick
    }

    /// Measures the forward costs not measured yet: after a warm-up, one forward per row
    /// count (the steps' own times then refine the curve, [`CostCurve::record`]). The target
    /// is timed with [`time_forward`] on its cache (left as it was), its logits copied into
    /// `host`, the steps' own buffer; `draft` times one draft forward of the given number of
    /// rows (a draft model through [`time_forward`], an EAGLE head through its own timer).
    /// Returns the number of forwards run (0 when every cost was known).
    pub fn calibrate(
        &mut self,
        target: &DecoderModel,
        target_cache: &mut KvCache,
        host: &mut HostLogits,
        draft: Option<&mut dyn FnMut(usize) -> Result<Option<f64>>>,
        pending: u32,
    ) -> Result<usize> {
        let (target_rows, draft_rows) = self.needed_rows();
        // Alone, even in a batch: the curves are of the models' own forwards.
        let _solo = crate::model::Solo::enter();
        let mut runs = measure(&mut self.target, &target_rows, &mut |rows| {
            time_forward(target, target_cache, host, rows, pending)
        })?;
        if let Some(time) = draft {
            runs += measure(&mut self.draft, &draft_rows, time)?;
        }
        Ok(runs)
    }

    /// A one-line summary: α by node width and rank (the widths tried; 1 always) and the
    /// steps per tree.
    pub fn summary(&self) -> String {
        let used: Vec<String> =
            self.trees.iter().zip(&self.uses).filter(|(_, &u)| u > 0).map(|((n, _), u)| format!("{n} x{u}")).collect();
        let alphas = self.alphas();
        let widths: Vec<String> = (0..WIDTHS)
            .filter(|&k| k == 0 || self.tried[k][0] > 0.0)
            .map(|k| {
                let ranks: Vec<String> = alphas[k][..=k].iter().map(|a| format!("{a:.2}")).collect();
                format!("{} ({} draft{})", ranks.join(" / "), k + 1, if k == 0 { "" } else { "s" })
            })
            .collect();
        format!("alpha {}; steps: {}", widths.join(", "), used.join(", "))
    }
}

/// What a step of `tree` expected to emit `tokens` asks of a batch: its target rows, and its
/// draft forwards' mean rows (0 without drafts).
pub fn load_of_tree(tree: &DraftTree, tokens: f64) -> SharedLoad {
    let widths = level_widths(tree);
    let draft_rows =
        if tree.children(0).is_empty() { 0 } else { (1 + widths.iter().sum::<usize>()).div_ceil(1 + widths.len()) };
    SharedLoad { target_rows: tree.len(), draft_rows, tokens }
}

/// Records into `curve` the [`anchors`] of `rows` it lacks: one warm-up forward, then one
/// timing per row count. A row count whose forward does not fit the cache (`time` gives
/// `None`: a prompt near the end of the context) stays unmeasured until a later text leaves
/// room; meanwhile [`CostCurve::at`] extrapolates it. Returns the number of forwards timed.
fn measure(curve: &mut CostCurve, rows: &[usize], time: &mut dyn FnMut(usize) -> Result<Option<f64>>) -> Result<usize> {
    let rows = anchors(rows);
    if rows.iter().all(|&r| curve.has(r)) || time(1)?.is_none() {
        return Ok(0);
    }
    let mut runs = 1;
    for r in rows {
        if !curve.has(r) {
            if let Some(secs) = time(r)? {
                curve.record(r, secs);
                runs += 1;
            }
        }
    }
    Ok(runs)
}

/// The row counts worth timing to know the cost of all of `rows` (sorted, distinct): the
/// smallest, the powers of two between, and the largest; [`CostCurve::at`] interpolates the rest.
pub fn anchors(rows: &[usize]) -> Vec<usize> {
    let (Some(&lo), Some(&hi)) = (rows.first(), rows.last()) else { return Vec::new() };
    let mut out = vec![lo];
    out.extend((0..usize::BITS).map(|b| 1usize << b).skip_while(|&p| p <= lo).take_while(|&p| p < hi));
    if hi > lo {
        out.push(hi);
    }
    out
}

/// Seconds of one forward of `rows` copies of `token` (id 0 when outside the model's
/// vocabulary) after the cached positions, logits of every row to the host included, copied
/// into `host` as a decoding step copies them. The cache is truncated back to its length: it
/// is left as it was. `None` (and no forward) when `rows` more rows do not fit the cache.
pub fn time_forward(
    model: &DecoderModel,
    cache: &mut KvCache,
    host: &mut HostLogits,
    rows: usize,
    token: u32,
) -> Result<Option<f64>> {
    let base = cache.len();
    if base + rows > cache.capacity() {
        return Ok(None);
    }
    let token = if (token as usize) < model.config().vocab_size { token } else { 0 };
    let tokens = vec![token; rows];
    let pos: Vec<u32> = (base..base + rows).map(|p| p as u32).collect();
    let bias = causal_bias(base, rows, model.dtype(), model.device())?;
    let t0 = Instant::now();
    let hidden = model.forward(&tokens, &pos, &bias, cache)?;
    std::hint::black_box(host.copy(&model.logits(&hidden)?)?);
    let s = t0.elapsed().as_secs_f64();
    cache.truncate(base);
    Ok(Some(s))
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

    /// A new text forgets the acceptance of the last one (back to a fresh state's estimate and
    /// choice) and keeps the measured costs.
    #[test]
    fn a_new_text_forgets_acceptance_and_keeps_costs() {
        let mut a = AutoTree::new(false);
        for (i, rows) in [1usize, 2, 3, 4, 5, 6, 7].into_iter().enumerate() {
            a.target.record(rows, 0.020 + 0.001 * i as f64);
            a.draft.record(rows, 0.006 + 0.001 * i as f64);
        }
        let fresh = a.alphas();
        let first = a.choose();
        for _ in 0..200 {
            a.record_node(1, None);
        }
        assert!(a.alphas()[0][0] < fresh[0][0], "rejections did not lower the estimate");
        a.new_text();
        assert_eq!(a.alphas(), fresh);
        assert_eq!(a.choose(), first);
        assert!(a.target.has(3) && a.draft.has(3), "costs were forgotten");
        assert!(a.uses.iter().all(|&u| u <= 1));
    }

    /// A change of candidates (a draft temperature of 0, then of 0.7) keeps the measured costs
    /// and starts the acceptance afresh; the same candidates keep the whole state.
    #[test]
    fn other_candidates_keep_the_costs() {
        let mut chains = AutoTree::new(false);
        for rows in [1, 2, 4, 7] {
            chains.target.record(rows, 0.020 + 0.001 * rows as f64);
        }
        chains.draft.record(1, 0.006);
        for _ in 0..50 {
            chains.record_node(1, None);
        }
        let same = chains.clone().for_candidates(false);
        assert_eq!(same.alphas(), chains.alphas());
        let multi = chains.clone().for_candidates(true);
        assert_eq!(multi.trees.len(), AutoTree::new(true).trees.len());
        assert!(multi.trees.len() > chains.trees.len());
        assert_eq!(multi.alphas(), AutoTree::new(true).alphas());
        for rows in [1, 2, 4, 7] {
            assert_eq!(multi.target.at(rows), chains.target.at(rows));
        }
        assert_eq!(multi.draft.at(1), Some(0.006));
        let back = multi.for_candidates(false);
        assert_eq!(back.trees.len(), chains.trees.len());
        assert!(back.target.has(7) && back.draft.has(1));
    }

    /// `α_{1,0} = c` for single drafts, `α_{2,·} = (a0, a1)` and `α_{3,·} = (b0, b1, b2)`.
    fn alphas(c: f64, (a0, a1): (f64, f64), (b0, b1, b2): (f64, f64, f64)) -> Alphas {
        [[c, 0.0, 0.0], [a0, a1, 0.0], [b0, b1, b2]]
    }

    #[test]
    fn expected_tokens_of_a_chain_is_a_geometric_sum() {
        let t = DraftTree::preset("chain-3").unwrap();
        let a: f64 = 0.7;
        let want = 1.0 + a + a * a + a * a * a;
        // A chain only ever uses the single-draft estimate.
        let al = alphas(a, (0.1, 0.2), (0.3, 0.4, 0.5));
        assert!((AutoTree::expected_tokens(&t, &al) - want).abs() < 1e-12);
        assert_eq!(AutoTree::expected_tokens(&DraftTree::root_only(), &al), 1.0);
    }

    /// Two drafts at a node: P(first accepted) = a0, P(second) = (1-a0) a1. In
    /// `chain-2-forks-1` the root has two drafts and the first one a single draft below it
    /// (estimate c); three drafts use the third row, and ranks beyond 3 its last entry.
    #[test]
    fn expected_tokens_by_width_and_rank() {
        let (c, a0, a1) = (0.65, 0.5, 0.4);
        let al = alphas(c, (a0, a1), (0.6, 0.3, 0.2));
        let t = DraftTree::preset("drafts-2-depth-1").unwrap();
        assert!((AutoTree::expected_tokens(&t, &al) - (1.0 + a0 + (1.0 - a0) * a1)).abs() < 1e-12);
        let forked = DraftTree::preset("chain-2-forks-1").unwrap();
        let want = 1.0 + a0 * (1.0 + c) + (1.0 - a0) * a1;
        assert!((AutoTree::expected_tokens(&forked, &al) - want).abs() < 1e-12);
        let three = DraftTree::preset("drafts-3-depth-1").unwrap();
        let want = 1.0 + 0.6 + 0.4 * 0.3 + 0.4 * 0.7 * 0.2;
        assert!((AutoTree::expected_tokens(&three, &al) - want).abs() < 1e-12);
        let four = DraftTree::preset("drafts-4-depth-1").unwrap();
        let want = 1.0 + 0.6 + 0.4 * 0.3 + 0.4 * 0.7 * 0.2 + 0.4 * 0.7 * 0.8 * 0.2;
        assert!((AutoTree::expected_tokens(&four, &al) - want).abs() < 1e-12);
    }

    /// Verifications count by node width and rank: a node accepting its second draft rejected
    /// its first; a chain's draft is counted apart from the first of two.
    #[test]
    fn acceptance_is_counted_by_width_and_rank() {
        let mut a = AutoTree::new(true);
        let prior = a.alphas();
        for _ in 0..100 {
            a.record_node(1, Some(0)); // a chain's draft accepted
            a.record_node(1, None); // ... rejected
            a.record_node(2, Some(0)); // first of two accepted
            a.record_node(2, Some(1)); // first rejected, second accepted
            a.record_node(2, None); // both rejected
            a.record_node(3, None); // three rejected
        }
        let w = PRIOR_WEIGHT;
        let got = a.alphas();
        // Each rank's estimate over all widths is the prior of every width's own.
        let pooled = [
            (100.0 + 100.0 + prior[0][0] * w) / (200.0 + 300.0 + 100.0 + w),
            (100.0 + prior[1][1] * w) / (200.0 + 100.0 + w),
            (prior[2][2] * w) / (100.0 + w),
        ];
        let want = [
            (0, 0, (100.0 + pooled[0] * w) / (200.0 + w)),
            (1, 0, (100.0 + pooled[0] * w) / (300.0 + w)),
            (1, 1, (100.0 + pooled[1] * w) / (200.0 + w)),
            (2, 0, (pooled[0] * w) / (100.0 + w)),
            (2, 2, (pooled[2] * w) / (100.0 + w)),
        ];
        for (k, j, e) in want {
            assert!((got[k][j] - e).abs() < 1e-12, "alpha[{k}][{j}] = {} against {e}", got[k][j]);
        }
        let summary = a.summary();
        assert!(
            summary.starts_with("alpha 0.50 (1 draft), 0.33 / 0.50 (2 drafts), 0.01 / 0.01 / 0.00 (3 drafts);"),
            "{summary}"
        );
        // Only the widths tried are shown.
        assert!(AutoTree::new(false).summary().starts_with("alpha 0.60 (1 draft);"));
    }

    /// A width not tried yet starts from what the others showed: after forks' first drafts
    /// were accepted 84 times in 100, a chain's draft is expected at about that, not at the
    /// prior 0.6, and a cheap chain is tried.
    #[test]
    fn an_untried_width_starts_from_the_others_acceptance() {
        let mut a = AutoTree::new(true);
        for i in 0..100 {
            a.record_node(
                2,
                if i < 84 {
                    Some(0)
                } else if i < 92 {
                    Some(1)
                } else {
                    None
                },
            );
        }
        let alphas = a.alphas();
        assert!((alphas[0][0] - 0.84).abs() < 0.02, "{alphas:?}");
        assert!((alphas[2][0] - 0.84).abs() < 0.02 && (alphas[2][1] - 0.5).abs() < 0.05, "{alphas:?}");
        // Each target row past the first costs a fifth of the first: the second drafts' 8 in
        // 100 do not pay for their rows.
        for r in 1..=16 {
            a.target.record(r, 0.020 + 0.004 * (r - 1) as f64);
        }
        for r in 1..=9 {
            a.draft.record(r, 0.006 + 0.003 * (r - 1) as f64);
        }
        let pick = a.choose();
        assert!(a.trees[pick].0.starts_with("chain-") && !a.trees[pick].0.contains("forks"), "{}", a.trees[pick].0);
    }

    #[test]
    fn anchors_are_the_ends_and_the_powers_of_two_between() {
        assert_eq!(anchors(&[1, 2, 3, 4, 5, 6, 7, 9, 13, 15]), [1, 2, 4, 8, 15]);
        assert_eq!(anchors(&[2, 3, 8]), [2, 4, 8]);
        assert_eq!(anchors(&[3]), [3]);
        assert!(anchors(&[]).is_empty());
        // Every candidate's rows are covered: at the anchors or between two of them.
        let a = AutoTree::new(true);
        let (target, draft) = a.needed_rows();
        for rows in [target, draft] {
            let anchors = anchors(&rows);
            assert!(rows.iter().all(|r| anchors.first() <= Some(r) && Some(r) <= anchors.last()));
        }
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
            a.record_node(1, Some(0));
        }
        let pick = a.choose();
        assert_eq!(a.trees[pick].0, "chain-6", "alpha {:?}", a.alphas());
        let mut b = AutoTree::new(false);
        b.target = a.target.clone();
        b.draft.record(1, 0.030);
        for _ in 0..50 {
            b.record_node(1, None);
        }
        let pick = b.choose();
        assert_eq!(b.trees[pick].0, "no-drafts", "alpha {:?}", b.alphas());
        // Exploration: a draft step at the latest every EXPLORE_EVERY steps.
        let picks: Vec<usize> = (0..EXPLORE_EVERY).map(|_| b.choose()).collect();
        assert!(picks.iter().any(|&p| p != 0));
    }

    /// In a batch the trees shrink as the cost curve says: with forwards that cost little more
    /// for a few rows and then grow with every row (a CPU's), drafts accepted at 0.7 make a
    /// deep chain alone, a shorter one beside three members, and none beside fifteen whose
    /// rows already fill the forward; the rate is the batch's (its tokens over its step).
    #[test]
    fn trees_shrink_as_the_batch_fills() {
        let mut a = AutoTree::new(false);
        // 25 ms up to 8 rows, then 2.5 ms per row (compute-bound); the draft a fifth of that.
        let cost = |r: usize| 0.025 + 0.0025 * r.saturating_sub(8) as f64;
        for r in 1..=200 {
            a.target.record(r, cost(r));
            a.draft.record(r, cost(r) / 5.0);
        }
        for _ in 0..60 {
            a.record_node(1, Some(0));
        }
        for _ in 0..26 {
            a.record_node(1, None);
        }
        let depth = |a: &AutoTree, i: usize| a.trees[i].1.max_depth();
        let alone = a.choose_in_batch(&SharedLoad::NONE);
        assert_eq!(alone, a.clone().choose(), "alone, the batch rule is the solo rule");
        let some = SharedLoad { target_rows: 9, draft_rows: 3, tokens: 6.0 };
        let beside_three = a.choose_in_batch(&some);
        let full = SharedLoad { target_rows: 60, draft_rows: 15, tokens: 30.0 };
        let beside_fifteen = a.choose_in_batch(&full);
        assert!(depth(&a, alone) >= 3, "alone: {}", a.trees[alone].0);
        assert!(depth(&a, beside_three) < depth(&a, alone), "beside three: {}", a.trees[beside_three].0);
        assert_eq!(a.trees[beside_fifteen].0, "no-drafts");
        // The rate chosen is the best of the batch's: no candidate gives the batch more.
        let alphas = a.alphas();
        let rate = |i: usize, o: &SharedLoad| {
            (AutoTree::expected_tokens(&a.trees[i].1, &alphas) + o.tokens) / a.batch_step_cost(&a.trees[i].1, o).unwrap()
        };
        for i in 0..a.trees.len() {
            assert!(rate(i, &some) <= rate(beside_three, &some) + 1e-12, "{} beats {}", a.trees[i].0, a.trees[beside_three].0);
        }
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
            // Single drafts and first drafts accepted at 0.7, second drafts never.
            never.record_node(1, (i % 10 < 7).then_some(0));
            if i % 10 < 7 {
                never.record_node(2, Some(0));
            } else {
                never.record_node(2, None);
            }
        }
        let pick = never.choose();
        assert!(!second_drafts(&never, pick), "{} at {:?}", never.trees[pick].0, never.alphas());
        let mut often = AutoTree::new(true);
        costs(&mut often);
        for i in 0..200 {
            often.record_node(1, (i % 10 < 7).then_some(0));
            match i % 10 {
                0..7 => often.record_node(2, Some(0)),
                7 | 8 => often.record_node(2, Some(1)),
                _ => often.record_node(2, None),
            }
        }
        let pick = often.choose();
        assert!(second_drafts(&often, pick), "{} at {:?}", often.trees[pick].0, often.alphas());
    }

    /// A lookup of 5 rows pays alone where rows are cheap beside the first, not where each row
    /// costs 40% of a one-row forward (this machine's AVX2 kernels), and in a full batch only
    /// when it emits enough for everyone's wait.
    #[test]
    fn lookups_pay_only_when_their_rows_do() {
        let curve = |first: f64, per_row: f64| {
            let mut a = AutoTree::new(false);
            for r in 1..=40 {
                a.target.record(r, first + per_row * (r - 1) as f64);
            }
            a
        };
        let cheap_rows = curve(0.030, 0.001);
        let dear_rows = curve(0.030, 0.012);
        let alone = SharedLoad::NONE;
        assert!(cheap_rows.lookup_pays_in_batch(5, 1.5, &alone));
        assert!(!dear_rows.lookup_pays_in_batch(5, 1.5, &alone));
        // 5 rows at 0.078 s against one at 0.030 s: 2.6 tokens break even.
        assert!(dear_rows.lookup_pays_in_batch(5, 2.7, &alone));
        assert!(!dear_rows.lookup_pays_in_batch(5, 2.5, &alone));
        // Beside three plain members: (t + 3) / C(8) >= 4 / C(4).
        let three = SharedLoad { target_rows: 3, draft_rows: 0, tokens: 3.0 };
        let (c8, c4) = (0.030 + 0.012 * 7.0, 0.030 + 0.012 * 3.0);
        let even = 4.0 * c8 / c4 - 3.0;
        assert!(dear_rows.lookup_pays_in_batch(5, even + 0.05, &three));
        assert!(!dear_rows.lookup_pays_in_batch(5, even - 0.05, &three));
        // Unknown costs: take the lookup.
        assert!(AutoTree::new(false).lookup_pays_in_batch(5, 1.0, &three));
    }

    /// Generators sharing a book measure once: the second takes the first's costs and keeps
    /// its own where it has them.
    #[test]
    fn a_cost_book_fills_what_a_curve_lacks() {
        let book = CostBook::new();
        {
            let mut costs = book.lock();
            costs.0.record(1, 0.03);
            costs.0.record(8, 0.1);
            costs.1.record(1, 0.01);
        }
        let mut a = AutoTree::new(false);
        a.target.record(8, 0.2);
        let costs = book.lock();
        a.target.fill_from(&costs.0);
        a.draft.fill_from(&costs.1);
        assert_eq!(a.target.at(1), Some(0.03));
        assert_eq!(a.target.at(8), Some(0.2), "its own measurement stays");
        assert_eq!(a.draft.at(1), Some(0.01));
        assert!(!a.target.has(4) && a.target.has(1));
    }
}
