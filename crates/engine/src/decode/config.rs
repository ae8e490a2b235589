//! What a generation is asked for ([`GenerationConfig`], [`SpecConfig`], [`DraftSource`],
//! [`TreeChoice`]) and what it reports ([`Stats`]).

use crate::decode::auto_tree::{AutoTree, WIDTHS};
use crate::decode::draft::ngram::NgramConfig;
use crate::decode::tree::DraftTree;
use crate::error::config_bail;
use crate::{Error, Result};
use samplers::dist::Warp;
use samplers::{DraftConstruction, Verifier};

/// The tree of every step: one fixed topology, or the best by measured cost and acceptance
/// before each step ([`crate::decode::auto_tree`], `--tree auto`).
#[derive(Debug, Clone)]
pub enum TreeChoice {
    Fixed(DraftTree),
    Auto,
}

impl From<DraftTree> for TreeChoice {
    fn from(t: DraftTree) -> Self {
        TreeChoice::Fixed(t)
    }
}

/// How to pick drafts and verify them.
#[derive(Debug, Clone)]
pub struct SpecConfig {
    pub tree: TreeChoice,
    pub construction: DraftConstruction,
    pub verifier: Verifier,
    /// Warp of the draft logits; `None`: the target's. Any draft distribution keeps the
    /// output exact (the verifier sees the q the drafts were drawn from); at temperature 0 a
    /// warped q is one-hot, so trees collapse to chains unless the draft keeps a temperature.
    pub draft_warp: Option<Warp>,
    /// Confidence pruning (0: off). A node's children are drafted only when the product,
    /// over the node and its ancestors, of the draft's top probability at temperature 1 is
    /// at least this; otherwise the node stays a leaf and the target samples there. Like
    /// EAGLE-2's dynamic trees this spends target rows where the draft is likely right; the
    /// choice depends only on the draft's distributions (never on the drawn tokens or the
    /// target), so the output stays exact.
    pub confidence_cutoff: f64,
    /// Where the drafts come from.
    pub source: DraftSource,
}

/// Where a step's drafts come from. N-gram drafts are deterministic (a function of the
/// context), so their nodes are verified by membership ([`samplers::verify_deterministic`])
/// whatever `SpecConfig::verifier` is; which source drafts a step depends only on the context,
/// so mixing them keeps the output exact.
#[derive(Debug, Clone, Default)]
pub enum DraftSource {
    /// The generator's draft model or EAGLE head, on [`SpecConfig::tree`].
    #[default]
    Model,
    /// N-gram lookup only ([`crate::decode::draft::ngram`]), on [`SpecConfig::tree`] (fixed): no draft model
    /// runs. `SpecConfig::verifier` must be [`Verifier::TopK`] (membership), and there is no
    /// q to warp or prune by.
    Ngram(NgramConfig),
    /// N-gram lookup on `tree` for the steps where the context has a match; the draft model or
    /// head on [`SpecConfig::tree`] for the others.
    NgramFirst { ngram: NgramConfig, tree: DraftTree },
}

impl DraftSource {
    pub(crate) fn ngram(&self) -> Option<NgramConfig> {
        match self {
            Self::Model => None,
            Self::Ngram(c) | Self::NgramFirst { ngram: c, .. } => Some(*c),
        }
    }
}

impl SpecConfig {
    /// Whether the draft's q keeps a temperature (else it is one-hot and every node gets one
    /// distinct draft).
    pub fn draft_samples(&self, warp: Warp) -> bool {
        self.draft_warp.unwrap_or(warp).temperature > 0.0
    }

    /// Whether a fixed tree that branches runs as its deepest chain: the draft's q is one-hot
    /// (temperature 0 and no draft temperature), so each node drafts one distinct token and
    /// the other branches are never drafted. `false` for chains, `auto` (which knows), and
    /// n-gram only (no q).
    pub fn runs_as_chain(&self, warp: Warp) -> bool {
        let TreeChoice::Fixed(tree) = &self.tree else { return false };
        tree.branches() && !self.draft_samples(warp) && !matches!(self.source, DraftSource::Ngram(_))
    }

    /// The most nodes a step's tree can have.
    pub fn max_tree_len(&self, warp: Warp) -> usize {
        let model = match &self.tree {
            TreeChoice::Fixed(t) => t.len(),
            TreeChoice::Auto => AutoTree::new(self.draft_samples(warp)).max_len(),
        };
        match &self.source {
            DraftSource::NgramFirst { tree, .. } => model.max(tree.len()),
            _ => model,
        }
    }
}

/// Where a generation's random draws come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Randomness {
    /// One random stream seeded by [`GenerationConfig::seed`], drawn from in turn by the draft
    /// construction and the verifier (the default; every valid pair). The text is an exact
    /// sample, but which one depends on everything that draws: the tree, the draft model, and
    /// `--tree auto`'s timing-based choices.
    #[default]
    Stream,
    /// Noise keyed by `(seed, position, token)` ([`samplers::positional`]): each token is an
    /// exponential race on the warped target, each node's drafts are the draft's best `k`
    /// races on the same noise (Gumbel-top-k, in place of [`SpecConfig::construction`]), and
    /// the verifier accepts the draft equal to the target's token (in place of
    /// [`SpecConfig::verifier`]). The text then depends only on the seed, the prompt, the
    /// target and the warp: speculative decoding with any tree, draft model, EAGLE head,
    /// lookup or `auto` emits the tokens plain decoding with this randomness emits.
    Positional,
}

impl Randomness {
    /// `stream` or `positional`, as `--json` and `bench mt-bench --randomness` write it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Stream => "stream",
            Self::Positional => "positional",
        }
    }
}

impl std::str::FromStr for Randomness {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        [Self::Stream, Self::Positional]
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| format!("unknown randomness `{s}`: expected stream or positional"))
    }
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerationConfig {
    pub max_new_tokens: usize,
    pub warp: Warp,
    pub seed: u64,
    pub randomness: Randomness,
    /// `None`: plain autoregressive decoding of the target (`--no-spec`).
    pub speculative: Option<SpecConfig>,
}

/// Counters and timings of one generation.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Stats {
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys and values the target kept from the previous generation
    /// ([`crate::decode::Generator::set_prefix_reuse`]): the prompt's pass ran only the others.
    pub reused_tokens: usize,
    /// Prompt tokens the draft model ran before the first step (fewer than the prompt's with a
    /// draft window or prefix reuse; 0 without a draft model, and when its prefill was put off:
    /// `Generator::set_deferred_draft_prefill`).
    pub draft_prefill_tokens: usize,
    /// Tokens the draft model ran after the first step to catch up on the text in forwards of
    /// their own (a prefill put off, or many plain steps in a batch); a window's skipped tokens
    /// are not run.
    pub draft_catch_up_tokens: usize,
    pub new_tokens: usize,
    /// Target forwards after the prompt (one per step).
    pub target_forwards: usize,
    /// Rows the target ran after the prompt: one per plain step, the drafted tree nodes plus
    /// the root per speculative step (repeated drafts get no row).
    pub target_rows: usize,
    /// Draft forwards (one per tree depth per step).
    pub draft_forwards: usize,
    /// Mean tokens emitted per target forward, bonus token included.
    pub tau: f64,
    /// Fraction of steps that accepted a draft at depth `d` (index `d - 1`).
    pub acceptance_per_depth: Vec<f64>,
    /// Steps that accepted at least `d` drafts (index `d - 1`).
    #[serde(skip)]
    pub accepted_at_depth: Vec<usize>,
    /// Seconds before the first step: the prompt through both models and, with `--tree auto`,
    /// the forward costs it measures on a generator's first generation.
    pub prefill_s: f64,
    /// Of `prefill_s`, the seconds `--tree auto` spent measuring forward costs: on a
    /// generator's first generation with its candidate trees, 0 later.
    #[serde(default)]
    pub auto_costs_s: f64,
    pub draft_s: f64,
    pub target_s: f64,
    pub verify_s: f64,
    pub total_s: f64,
    /// New tokens per second of decoding (prefill excluded).
    pub tokens_per_s: f64,
    /// Steps drafted by n-gram lookup ([`DraftSource`]).
    pub ngram_steps: usize,
    /// Tokens those steps emitted (accepted drafts plus the target's token), before any cut at
    /// a stop token or `max_new_tokens`.
    pub ngram_tokens: usize,
    /// Steps that went without drafts because their tree did not fit: the positions left in
    /// the context, or in a draft model's shorter one (plain steps through the same path).
    pub undrafted_steps: usize,
    /// Target forwards replayed from a graph's buckets ([`crate::decode::Generator::set_graphs`];
    /// 0 when off).
    pub graph_forwards: usize,
    /// The draft model's forwards replayed so.
    pub draft_graph_forwards: usize,
    /// Rows of logits (the target's and the draft's) whose probabilities were computed on the
    /// device and reached the host as probabilities (`Generator::set_device_warp`).
    pub device_warped_rows: usize,
    /// Why generation stopped: `max_new_tokens`, `stop_token` (`is_stop` held) or
    /// `context_length`; callers that match stop strings in `is_stop` say `stop_string`.
    pub stop_reason: String,
    /// With `--tree auto`: the acceptance estimate and the steps taken with each tree.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub auto_tree: String,
    /// The drafts of the draft model's (or head's) steps that verification tried, by the
    /// number of drafts at their node `k` and their rank `j` (`[k - 1][j]`, both capped at
    /// [`WIDTHS`]): the drafts before an accepted one and every draft of a node whose drafts
    /// were all rejected ([`Self::record_node`]). With [`Self::rank_accepted`], the acceptance
    /// `α_{k,j}` that `--tree auto` and `bench predict` model.
    pub rank_tried: [[u64; WIDTHS]; WIDTHS],
    /// The drafts accepted, indexed as [`Self::rank_tried`].
    pub rank_accepted: [[u64; WIDTHS]; WIDTHS],
}

impl Stats {
    /// Counts the verification of one node's `drafts` drafts, tried in order: the one of rank
    /// `accepted` was accepted after those before it were rejected, or (`None`) all were
    /// rejected (as `AutoTree::record_node` counts them).
    pub fn record_node(&mut self, drafts: usize, accepted: Option<usize>) {
        let k = drafts.clamp(1, WIDTHS) - 1;
        for r in 0..accepted.map_or(drafts, |j| j + 1) {
            self.rank_tried[k][r.min(WIDTHS - 1)] += 1;
        }
        if let Some(j) = accepted {
            self.rank_accepted[k][j.min(WIDTHS - 1)] += 1;
        }
    }
}

/// Refuses what n-gram drafting cannot do: its drafts are deterministic (no q), so only the
/// membership verifier is lossless, and there is no q to warp or prune by, nor an acceptance
/// model for `--tree auto`.
pub fn check_ngram(s: &SpecConfig) -> Result<()> {
    let Some(c) = s.source.ngram() else { return Ok(()) };
    c.check().map_err(|e| Error::Config(format!("n-gram drafting: {e}")))?;
    if !matches!(s.source, DraftSource::Ngram(_)) {
        // N-gram steps before a model: the model's steps use its own pair and tree.
        return Ok(());
    }
    if s.verifier != Verifier::TopK {
        config_bail!(
            "n-gram drafts are deterministic: only the topk (membership) verifier is lossless for them, not {}",
            s.verifier
        );
    }
    if matches!(s.tree, TreeChoice::Auto) {
        config_bail!("n-gram drafting needs a fixed tree (e.g. chain-4); `auto` models a draft model's acceptance");
    }
    if s.draft_warp.is_some() || s.confidence_cutoff > 0.0 {
        config_bail!(
            "n-gram drafts have no draft distribution: a draft temperature or confidence cutoff does not apply"
        );
    }
    Ok(())
}
