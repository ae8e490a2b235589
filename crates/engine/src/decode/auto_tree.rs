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
//! accepted at 0.65, either of two at 0.75). Depth matters too, for a draft that reads its own
//! guesses: each `α` of a node at depth `d` is scaled by [`AutoTree::depth_factors`]`[d]`.
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
//! forwards cost at the batch's total rows ([`crate::model::take_batched_cost`]); an EAGLE
//! head's levels, batched too, record the level's wall time at the text's own rows, a more
//! cautious price (`crate::decode::draft::eagle`: with the batched seconds, `auto` drafted in
//! batches where drafting lost).
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
/// Depths of the node drafted from with their own first-draft acceptance (the root's children,
/// their children, and deeper ones together).
pub const DEPTHS: usize = 3;
/// Accepted and tried first drafts by the depth of the node drafted from (see [`DEPTHS`]).
type DepthCounts = [[f64; 2]; DEPTHS];
/// Prior of each acceptance rate and its weight in drafts.
const PRIOR_ALPHA: Alphas = [[0.6, 0.0, 0.0], [0.6, 0.3, 0.0], [0.6, 0.3, 0.2]];
const PRIOR_WEIGHT: f64 = 4.0;
/// Per-step decay of the acceptance counts.
const FORGET: f64 = 0.98;
/// Steps without drafts after which one step drafts anyway.
const EXPLORE_EVERY: usize = 16;
/// Tokens an n-gram lookup step is assumed to emit before a text has shown its own (hopeful,
/// so that lookups are tried: a text that declines them learns nothing more about them)
/// ([`AutoTree::lookup_tokens`]), as if seen on this many steps.
const LOOKUP_PRIOR_TOKENS: f64 = 3.0;
const LOOKUP_PRIOR_WEIGHT: f64 = 4.0;

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
    /// Accepted and tried first drafts by depth (forgetting applied): what
    /// [`Self::depth_factors`] scales the deeper nodes' `α` by.
    by_depth: DepthCounts,
    steps_without_drafts: usize,
    /// Steps taken with each tree (same order as `trees`).
    pub uses: Vec<usize>,
    /// Rows of the next step's first draft forward: the tokens a draft model has not run yet
    /// (it catches up on them before drafting) and the root; 1 for an EAGLE head.
    pub draft_lag: usize,
    /// The acceptance counts (accepted, tried) of the last text that tried drafts: what
    /// [`Self::catch_up_pays`] expects of a text that has tried none yet.
    carried: Option<(Alphas, Alphas, DepthCounts)>,
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
            by_depth: [[0.0; 2]; DEPTHS],
            steps_without_drafts: 0,
            uses,
            draft_lag: 1,
            carried: None,
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
        if self.has_tried() {
            self.carried = Some((self.accepted, self.tried, self.by_depth));
        }
        self.accepted = [[0.0; WIDTHS]; WIDTHS];
        self.tried = [[0.0; WIDTHS]; WIDTHS];
        self.by_depth = [[0.0; 2]; DEPTHS];
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
        estimate(&self.accepted, &self.tried)
    }

    /// Whether this text has tried any draft (its counts only decay, never back to 0).
    fn has_tried(&self) -> bool {
        self.tried.iter().flatten().any(|&t| t > 0.0)
    }

    /// The acceptance a catch-up is weighed with: this text's once it has tried drafts, else
    /// the last such text's (the pair and the machine stay; a text that never drafts learns
    /// nothing), else the prior.
    fn expected_alphas(&self) -> (Alphas, [f64; DEPTHS]) {
        match self.carried {
            Some((accepted, tried, by_depth)) if !self.has_tried() => {
                (estimate(&accepted, &tried), depth_factors(&by_depth))
            }
            _ => (self.alphas(), self.depth_factors()),
        }
    }

    /// What each depth's `α` is scaled by: the first drafts' acceptance from nodes of depth `d`
    /// over that from nodes of every depth (the width-and-rank estimates pool all depths), each
    /// shrunk towards the pooled one, so 1 (to rounding) while only the root has drafted. A draft
    /// that reads its own guesses grows less sure with depth: the EAGLE head trained here
    /// accepted 0.50 of its first drafts and 0.32 of the second ones after a first (`chain-2` on
    /// MT-Bench, docs/results/README.md#serving-eagle-batched), so one `α` for every depth
    /// priced its deeper chains too high.
    pub fn depth_factors(&self) -> [f64; DEPTHS] {
        depth_factors(&self.by_depth)
    }

    /// Whether a generation alone, whose draft model lags and has not caught up for
    /// `EXPLORE_EVERY` steps, should catch up to explore: only while no text has tried drafts
    /// yet ([`Self::catch_up_pays`] has no acceptance of this pair but the prior to go by).
    pub fn explores_lagging(&self) -> bool {
        self.carried.is_none() && !self.has_tried() && self.steps_without_drafts >= EXPLORE_EVERY
    }

    /// Records the verification of one node's `drafts` drafts, tried in order: the one of rank
    /// `accepted` was accepted after those before it were rejected, or (`None`) all were
    /// rejected. The node is the root ([`Self::record_node_at`] for deeper ones).
    pub fn record_node(&mut self, drafts: usize, accepted: Option<usize>) {
        self.record_node_at(0, drafts, accepted);
    }

    /// [`Self::record_node`] for a node at `depth` (0: the root).
    pub fn record_node_at(&mut self, depth: usize, drafts: usize, accepted: Option<usize>) {
        if drafts > 0 {
            let d = &mut self.by_depth[depth.min(DEPTHS - 1)];
            d[0] += f64::from(u8::from(accepted == Some(0)));
            d[1] += 1.0;
        }
        let k = drafts.clamp(1, WIDTHS) - 1;
        let tried = accepted.map_or(drafts, |j| j + 1);
        for r in 0..tried {
            self.tried[k][r.min(WIDTHS - 1)] += 1.0;
        }
        if let Some(j) = accepted {
            self.accepted[k][j.min(WIDTHS - 1)] += 1.0;
        }
    }

    /// Expected tokens per step of `tree` at acceptance `alphas` (see the module docs), the
    /// same at every depth.
    pub fn expected_tokens(tree: &DraftTree, alphas: &Alphas) -> f64 {
        Self::expected_tokens_by_depth(tree, alphas, &[1.0; DEPTHS])
    }

    /// [`Self::expected_tokens`] with each `α` of a node at depth `d` scaled by `factors[d]`
    /// (the last for deeper nodes; [`Self::depth_factors`]), at most 1.
    pub fn expected_tokens_by_depth(tree: &DraftTree, alphas: &Alphas, factors: &[f64; DEPTHS]) -> f64 {
        // Children come after their parents, so a reverse pass sees children first.
        let mut extra = vec![0.0; tree.len()];
        for v in (0..tree.len()).rev() {
            let mut reach = 1.0;
            let mut e = 0.0;
            let kids = tree.children(v);
            let row = &alphas[kids.len().clamp(1, WIDTHS) - 1];
            let factor = factors[tree.depth(v).min(DEPTHS - 1)];
            for (j, &c) in kids.iter().enumerate() {
                let alpha = (row[j.min(WIDTHS - 1)] * factor).min(1.0);
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
        self.step_cost_with_lag(tree, others, self.draft_lag)
    }

    /// [`Self::batch_step_cost`] with `lag` rows in the first draft forward.
    fn step_cost_with_lag(&self, tree: &DraftTree, others: &SharedLoad, lag: usize) -> Option<f64> {
        let mut c = self.target.at(others.target_rows + tree.len())?;
        if !tree.children(0).is_empty() {
            c += self.draft.at(others.draft_rows + lag.max(1))?;
            for w in level_widths(tree) {
                c += self.draft.at(others.draft_rows + w)?;
            }
        }
        Some(c)
    }

    /// Whether a draft model that has not run the text's last `owed` tokens should run them now,
    /// in a forward of their own, rather than leave the text to plain steps, in a batch whose
    /// other members ask `others` (alone: [`SharedLoad::NONE`]). True when, caught up (its first
    /// draft forward of one row), a drafting tree beats plain steps by the choice's own rule (the
    /// batch's tokens per second `R`, [`Self::choose_in_batch`]) and the tokens that gains the
    /// batch while this text drafts its `remaining` tokens exceed what the catch-up's forward
    /// (`K`, the draft's curve at `owed` rows) costs it:
    /// `remaining · C_d / E_d · (R_d - R_p) > K · R_p`, with `C_d` and `E_d` the drafting tree's
    /// step seconds (the batch's) and expected tokens, `R_p` the rate of plain steps. Every member
    /// waits for the catch-up, so in a batch its price is the whole batch's rate for `K`
    /// seconds; alone (`E_others = 0`) the rule is `remaining · (C_p - C_d / E_d) > K`, the
    /// seconds saved over the text against the catch-up's. True when a cost is unknown (the
    /// draft then catches up, as its prompt's prefill used to). The acceptance is this text's, or
    /// before it has tried drafts the last text's that did (the prior's 0.6 on the first).
    ///
    /// This is what lets a draft put off its prompt's prefill (`Generator`'s deferred draft
    /// prefill): alone, the catch-up pays for a long answer and the draft drafts as before,
    /// from the second step; in a full batch on a CPU, where plain steps win, it never runs.
    pub fn catch_up_pays(&self, owed: usize, remaining: usize, others: &SharedLoad) -> bool {
        let (alphas, factors) = self.expected_alphas();
        // (the batch's tokens per second, seconds per token of this text) of a step of `t`.
        let rates = |t: &DraftTree| {
            let e = Self::expected_tokens_by_depth(t, &alphas, &factors);
            self.step_cost_with_lag(t, others, 1).map(|c| ((e + others.tokens) / c.max(1e-9), c / e.max(1e-9)))
        };
        let plain = self.trees.iter().find(|(_, t)| t.children(0).is_empty()).map(|(_, t)| rates(t));
        let (Some(Some((plain_rate, _))), Some(catch_up)) = (plain, self.draft.at(owed.max(1))) else { return true };
        let mut best: Option<(f64, f64)> = None;
        for (_, t) in self.trees.iter().filter(|(_, t)| !t.children(0).is_empty()) {
            match rates(t) {
                Some(r) if best.is_none_or(|b| r.0 > b.0) => best = Some(r),
                Some(_) => {}
                None => return true,
            }
        }
        // The batch's tokens gained while this text drafts the rest, against those it would
        // have made in the catch-up's seconds.
        best.is_some_and(|(rate, secs)| {
            rate > plain_rate && remaining as f64 * secs * (rate - plain_rate) > catch_up * plain_rate
        })
    }

    /// The tokens a lookup step is expected to emit, from the `tokens` the text's `steps`
    /// lookup steps emitted so far and a hopeful prior.
    pub fn lookup_tokens(tokens: usize, steps: usize) -> f64 {
        (tokens as f64 + LOOKUP_PRIOR_TOKENS * LOOKUP_PRIOR_WEIGHT) / (steps as f64 + LOOKUP_PRIOR_WEIGHT)
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
        load_of_tree(tree, Self::expected_tokens_by_depth(tree, &self.alphas(), &self.depth_factors()))
    }

    /// Picks the tree for the next step (an index into `trees`) and ends the step's
    /// bookkeeping of the previous one (forgetting, exploration).
    pub fn choose(&mut self) -> usize {
        self.choose_in_batch(&SharedLoad::NONE)
    }

    /// [`Self::choose`] for a member of a batch whose other members ask `others`: the tree
    /// with the most tokens per second of the batch (see the module docs).
    pub fn choose_in_batch(&mut self, others: &SharedLoad) -> usize {
        self.forget();
        let (alphas, factors) = (self.alphas(), self.depth_factors());
        let rate = |i: usize| {
            let t = &self.trees[i].1;
            self.batch_step_cost(t, others)
                .map(|c| (Self::expected_tokens_by_depth(t, &alphas, &factors) + others.tokens) / c.max(1e-9))
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
            // Not in a batch: there every member waits for the explorer's draft forwards, the
            // first of which catches the draft up on every token since its last draft (with 8
            // generations on a 2-vCPU EPYC, such catch-ups took a fifth of the decoding time).
            if others.target_rows == 0 && self.steps_without_drafts >= EXPLORE_EVERY {
                pick = best_drafting;
            }
        }
        if pick != 0 {
            self.steps_without_drafts = 0;
        }
        self.uses[pick] += 1;
        pick
    }

    /// [`Self::choose_in_batch`] for a step that cannot draft (a draft model that owes more
    /// tokens than a step's first forward takes): the plain tree, with the same bookkeeping.
    pub fn choose_without_drafts(&mut self) -> usize {
        self.forget();
        self.steps_without_drafts += 1;
        self.uses[0] += 1;
        0
    }

    /// One step's decay of the acceptance counts.
    fn forget(&mut self) {
        self.accepted.iter_mut().chain(self.tried.iter_mut()).flatten().for_each(|x| *x *= FORGET);
        self.by_depth.iter_mut().flatten().for_each(|x| *x *= FORGET);
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

/// The estimates `α_{k,j}` from acceptance counts (see [`AutoTree::alphas`]).
fn estimate(accepted: &Alphas, tried: &Alphas) -> Alphas {
    let pooled: [f64; WIDTHS] = std::array::from_fn(|j| {
        let widths = j..WIDTHS;
        let a: f64 = widths.clone().map(|k| accepted[k][j]).sum();
        let t: f64 = widths.map(|k| tried[k][j]).sum();
        (a + PRIOR_ALPHA[j][j] * PRIOR_WEIGHT) / (t + PRIOR_WEIGHT)
    });
    std::array::from_fn(|k| {
        std::array::from_fn(|j| {
            if j <= k {
                (accepted[k][j] + pooled[j] * PRIOR_WEIGHT) / (tried[k][j] + PRIOR_WEIGHT)
            } else {
                0.0
            }
        })
    })
}

/// [`AutoTree::depth_factors`] from first-draft counts by depth.
fn depth_factors(by_depth: &DepthCounts) -> [f64; DEPTHS] {
    let accepted: f64 = by_depth.iter().map(|d| d[0]).sum();
    let tried: f64 = by_depth.iter().map(|d| d[1]).sum();
    if accepted <= 0.0 || tried <= 0.0 {
        return [1.0; DEPTHS];
    }
    let all = accepted / tried;
    std::array::from_fn(|d| {
        let [accepted, tried] = by_depth[d];
        (accepted + all * PRIOR_WEIGHT) / (tried + PRIOR_WEIGHT) / all
    })
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
#[path = "auto_tree_tests.rs"]
mod tests;
