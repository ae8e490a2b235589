//! The decoding loop: multi-draft speculative decoding on a [`DraftTree`]
//! (the paper's appendix `multi_draft_speculative_decoding`), and plain autoregressive decoding
//! with the same model code and sampling.
//!
//! State between steps: the target cache holds every token before the *pending* token (the
//! last emitted one, not yet run); the draft cache may lag further behind (accepted tokens it
//! never ran). One speculative step:
//! 1. **Draft**, one batched forward per tree depth: the pending token (after the draft's
//!    missing tokens) gives `q` at the root; every expandable node at depth `d` runs at once
//!    with the tree attention bias and gives `q` at that node; a node with `k` children draws
//!    `k` drafts from its `q` with the [`samplers::DraftConstruction`].
//! 2. **Target**, one forward over the whole tree (root plus drafts), logits of every node
//!    copied to the host once.
//! 3. **Verify** from the root: the [`samplers::Verifier`] turns `(p, q, drafts)` at the node
//!    into the next token; descend while it is one of the drafts; at a node without drafts
//!    sample `p`.
//! 4. **Compact** both caches to the accepted root-to-node path.
//!
//! The draft source is a draft model (above), an EAGLE head reading the target's hidden
//! states ([`Generator::with_eagle`], `crate::decode::draft::eagle`): the same tree, bias and
//! verification, with the head's entries in place of draft-model tokens; or n-gram lookup in
//! the context ([`DraftSource`], [`crate::decode::draft::ngram`]), whose deterministic drafts the membership
//! verifier checks, alone or before the model on steps where the context has a match.
//! The draft model may see only a window of the context ([`Generator::set_draft_window`],
//! [`crate::decode::draft::window`]): its cache then skips positions, and its rows are counted apart
//! from the target's.
//!
//! Temperature, top-k and top-p ([`samplers::dist::Warp`]) apply identically to `p` and `q`;
//! the emitted tokens are then distributed exactly as autoregressive sampling of the warped
//! target (on CUDA, warped on the device where the warp allows it: `device_select`). With
//! [`Randomness::Positional`] they are moreover the very tokens plain decoding with that
//! randomness emits: every node's drafts and verdict come from noise keyed by the position.

pub mod auto_tree;
pub(crate) mod buffers;
mod config;
mod device_select;
pub mod draft;
mod graphs;
pub mod host_copy;
pub mod logprobs;
pub mod penalties;
mod prefill;
pub mod speculative;
mod step;
pub mod stop;
pub mod tree;

use crate::decode::auto_tree::AutoTree;
use crate::decode::draft::eagle::EagleDraft;
use crate::decode::draft::ngram::NgramDrafter;
use crate::decode::draft::window::{DraftContext, DraftWindow};
use crate::decode::host_copy::{HostLogits, HostProbs};
use crate::decode::logprobs::{token_logprobs, TokenLogprobs};
use crate::decode::penalties::Penalties;
use crate::decode::tree::DraftTree;
use crate::model::eagle::EagleHead;
use crate::model::kv_cache::KvCache;
use crate::model::DecoderModel;
use rand::rngs::StdRng;
use rand::SeedableRng;
use samplers::PositionalNoise;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::config_bail;
use crate::{Error, Result};
use buffers::{nan_error, StepBuffers};
pub use config::{check_ngram, DraftSource, GenerationConfig, Randomness, SpecConfig, Stats, TreeChoice};
use device_select::{argmax_ids, probs_row};
pub use prefill::PrefillProgress;
use step::StepInput;

/// Runs generations with a target (and optionally a draft) model, reusing caches and buffers.
pub struct Generator<'a> {
    target: &'a DecoderModel,
    draft: Option<&'a DecoderModel>,
    target_cache: KvCache,
    draft_cache: Option<KvCache>,
    vocab: usize,
    buf: StepBuffers,
    /// The target's logits of a step on the host.
    target_host: HostLogits,
    /// Or its probabilities, warped on the device ([`Self::set_device_warp`]).
    target_probs: HostProbs,
    /// Warp rows on the device when the warp allows it ([`Self::set_device_warp`]).
    device_warp: bool,
    /// `--tree auto` state, kept across generations (costs are the models').
    auto: Option<AutoTree>,
    /// Forward costs shared with other generators of the same models ([`Self::share_costs`]).
    cost_book: Option<crate::decode::auto_tree::CostBook>,
    /// An EAGLE head as the draft source (instead of `draft`).
    eagle: Option<EagleDraft<'a>>,
    /// The context for n-gram drafting ([`DraftSource`]).
    ngram: NgramDrafter,
    /// Which part of the context the draft model's cache holds ([`DraftWindow`]).
    draft_context: DraftContext,
    /// Keep the cached prefix a new prompt shares with the last text ([`Self::set_prefix_reuse`]).
    prefix_reuse: bool,
    /// The tokens whose keys and values the target cache holds, in order (empty after a
    /// failed generation).
    history: Vec<u32>,
    /// Alternatives per token of the log-probabilities to record ([`Self::set_logprobs`]).
    logprobs_top: Option<usize>,
    /// The running or last generation's log-probabilities, one per generated token.
    logprobs: Vec<TokenLogprobs>,
    /// Also score the prompt's tokens ([`Self::set_prompt_logprobs`]).
    score_prompt: bool,
    /// The last generation's prompt log-probabilities, one per prompt token after the first.
    prompt_logprobs: Vec<TokenLogprobs>,
    /// Told of each prefill chunk ([`Self::set_prefill_progress`]).
    prefill_progress: Option<Box<dyn FnMut(PrefillProgress) + Send>>,
    /// The target's step forwards replayed from graphs ([`Self::set_graphs`]; `None`: off).
    graphs: Option<crate::model::StepGraphs>,
    /// The draft model's, on its own cache.
    draft_graphs: Option<crate::model::StepGraphs>,
    /// With `--tree auto`, a draft model's prompt prefill waits until drafting pays
    /// ([`Self::set_deferred_draft_prefill`]).
    defer_draft_prefill: bool,
}

/// A batch of accepted tokens, as [`Generator::generate_emitting`] hands it out.
#[derive(Debug, Clone, Copy)]
pub struct Emitted<'a> {
    pub tokens: &'a [u32],
    /// One record per token when [`Generator::set_logprobs`] asked for them, else none.
    pub logprobs: &'a [TokenLogprobs],
    /// In a generation's first batch, the prompt's records when
    /// [`Generator::set_prompt_logprobs`] asked for them (as [`Generator::prompt_logprobs`]);
    /// empty in later batches.
    pub prompt_logprobs: &'a [TokenLogprobs],
}

impl<'a> Generator<'a> {
    /// A generator holding up to `capacity` positions per cache (prompt and new tokens; near
    /// the end of either model's context, steps go without drafts). The draft's vocabulary
    /// must be the target's or a prefix of it (checked by the caller on the tokenizers; here
    /// on the sizes).
    pub fn new(target: &'a DecoderModel, draft: Option<&'a DecoderModel>, capacity: usize) -> Result<Self> {
        let vocab = target.config().vocab_size;
        if let Some(d) = draft {
            if d.config().vocab_size > vocab {
                config_bail!("vocabulary mismatch: the draft has {} tokens, the target {vocab}", d.config().vocab_size);
            }
        }
        let capacity = capacity.min(target.config().context_length);
        let target_cache = target.new_cache(capacity)?;
        let draft_cache = match draft {
            Some(d) => Some(d.new_cache(capacity.min(d.config().context_length))?),
            None => None,
        };
        let mut generator = Self {
            target,
            draft,
            target_cache,
            draft_cache,
            vocab,
            buf: StepBuffers::default(),
            target_host: HostLogits::default(),
            target_probs: HostProbs::default(),
            device_warp: device_select::from_env(),
            auto: None,
            cost_book: None,
            eagle: None,
            ngram: NgramDrafter::default(),
            draft_context: DraftContext::default(),
            prefix_reuse: false,
            history: Vec::new(),
            logprobs_top: None,
            logprobs: Vec::new(),
            score_prompt: false,
            prompt_logprobs: Vec::new(),
            prefill_progress: None,
            graphs: None,
            draft_graphs: None,
            defer_draft_prefill: std::env::var("MDSD_DEFER_DRAFT_PREFILL").map_or(true, |v| v != "0"),
        };
        generator.set_graphs(graphs::from_env() && target.fused_decode())?;
        Ok(generator)
    }

    /// A generator whose drafts come from an EAGLE head reading `target`'s hidden states
    /// (the head was loaded for this target: same hidden size and vocabulary).
    pub fn with_eagle(target: &'a DecoderModel, head: &'a EagleHead, capacity: usize) -> Result<Self> {
        let mut g = Self::new(target, None, capacity)?;
        let mut eagle = EagleDraft::new(head, g.target_cache.capacity())?;
        eagle.set_graphs(g.graphs());
        g.eagle = Some(eagle);
        Ok(g)
    }

    /// Lets the draft model attend to only the first and the last tokens of the context
    /// ([`DraftWindow`]; `None`, the default: all of it). Applies from the next generation;
    /// the output stays exact either way.
    pub fn set_draft_window(&mut self, window: Option<DraftWindow>) {
        self.draft_context = DraftContext::new(window);
    }

    /// With `--tree auto` (the default: on; `MDSD_DEFER_DRAFT_PREFILL=0` turns it off), a draft
    /// model does not run the prompt before the first step: the first token comes from the
    /// target's prefill and one plain step (or an n-gram lookup step), and the draft catches up
    /// on the text in a forward of its own when `AutoTree::catch_up_pays` says drafting the rest
    /// is worth it: alone on a long answer, from the second step; in a batch whose plain steps
    /// beat drafting (a full batch on a CPU), never, where its prefill was wasted work before
    /// (docs/results/README.md#const-deferred-draft-prefill).
    /// Which tokens are drafted changes, never what is emitted: at temperature 0 the same text.
    pub fn set_deferred_draft_prefill(&mut self, on: bool) {
        self.defer_draft_prefill = on;
    }

    /// Keeps, for the next generations, the cached keys and values of the longest prefix a new
    /// prompt shares with the previous prompt and its generated text (default: off). Chat turns
    /// then run only their new tokens through the models, not the whole conversation.
    ///
    /// Exactness does not depend on it: the cache holds the same tokens either way. The keys and
    /// values come from the passes that ran them (the prompt's, or a step's tree rows) rather
    /// than one prompt pass; where the target computes a row the same in every batch (our
    /// Q4_K/Q6_K CPU kernels, f32 weights) they are the very same numbers. The draft model's
    /// cache keeps its rows of the shared text (a window's too, unless a fresh window prefill
    /// runs fewer tokens). An EAGLE head keeps its entries and the features it had not run yet
    /// where they cover the shared text; past them the target runs again for the features the
    /// head needs (`EagleDraft::reusable`).
    pub fn set_prefix_reuse(&mut self, on: bool) {
        self.prefix_reuse = on;
        if !on {
            self.history.clear();
        }
    }

    /// The tokens the target cache holds from the last generation, which a new prompt's shared
    /// prefix reuses ([`Self::set_prefix_reuse`]); empty after a failed generation.
    pub fn cached_text(&self) -> &[u32] {
        &self.history
    }

    /// Forgets the cached text: the next prompt runs whole (a server handing this generator to
    /// another client does this, so that no client learns what another's prompt began with).
    pub fn forget_cached_text(&mut self) {
        self.history.clear();
    }

    /// Records, from the next generation on, the target's log-probability of every generated
    /// token and its `top` most probable alternatives (`None`, the default: nothing), as
    /// [`crate::decode::logprobs`] defines them. They come from the rows the target ran anyway; each
    /// costs two reads of a row of logits.
    pub fn set_logprobs(&mut self, top: Option<usize>) {
        self.logprobs_top = top;
    }

    /// The last generation's log-probabilities, one per token it returned (empty unless
    /// [`Self::set_logprobs`] asked for them).
    pub fn logprobs(&self) -> &[TokenLogprobs] {
        &self.logprobs
    }

    /// Adds `bias` to the logits of those token ids, the target's and the draft's alike, before
    /// the warp, from the next generation on (OpenAI's `logit_bias`; empty, the default: none).
    /// The output then follows the biased target exactly, as the verifier sees the same biased
    /// `p` that plain decoding samples, whatever the drafts. Log-probabilities stay the raw
    /// model's. An id outside the target's vocabulary or a bias that is not finite is an error
    /// at generation.
    pub fn set_logit_bias(&mut self, bias: Vec<(u32, f32)>) {
        self.buf.logit_bias = bias;
    }

    /// Applies repetition, presence and frequency penalties ([`Penalties`]) to the target's and
    /// the draft's logits, after any logit bias and before the warp, from the next generation
    /// on (the default: none). Each tree node's rows are penalised for the text up to that node,
    /// its drafted path included, so the output follows the penalised target exactly, as plain
    /// decoding samples it. Log-probabilities stay the raw model's. Out-of-range penalties are
    /// an error at generation.
    pub fn set_penalties(&mut self, penalties: Penalties) {
        self.buf.penalties = penalties;
    }

    /// With [`Self::set_logprobs`], also records the log-probability of every prompt token after
    /// the first (and its alternatives), from the prompt's own pass: OpenAI's `echo` with
    /// `logprobs`, a text's likelihood under the target. Such a generation runs its prompt whole
    /// (no prefix reuse: reused rows have no logits) and computes the output layer for every
    /// prompt row, 64 rows at a time.
    pub fn set_prompt_logprobs(&mut self, on: bool) {
        self.score_prompt = on;
    }

    /// Calls `report` as each model starts a prompt's prefill (`done` 0) and after every chunk
    /// of it ([`crate::model::PREFILL_CHUNK_CPU`] tokens on the CPU), for the prompts to come:
    /// a progress display of long prompts. `None` stops it.
    pub fn set_prefill_progress(&mut self, report: Option<Box<dyn FnMut(PrefillProgress) + Send>>) {
        self.prefill_progress = report;
    }

    /// The last generation's prompt log-probabilities ([`Self::set_prompt_logprobs`]): the
    /// records of `prompt[1..]`, in order (empty when not asked for).
    pub fn prompt_logprobs(&self) -> &[TokenLogprobs] {
        &self.prompt_logprobs
    }

    /// The draft window set with [`Self::set_draft_window`].
    pub fn draft_window(&self) -> Option<DraftWindow> {
        self.draft_context.window()
    }

    /// Shares `--tree auto`'s measured forward costs with the other generators given the same
    /// `book` (they must run the same models on the same device): see
    /// [`crate::decode::auto_tree::CostBook`].
    pub fn share_costs(&mut self, book: crate::decode::auto_tree::CostBook) {
        self.cost_book = Some(book);
    }

    /// The `--tree auto` state (costs measured so far, acceptance); `None` before the first
    /// generation with [`TreeChoice::Auto`]. Tools and tests may seed it: rows whose cost is
    /// already known are not measured again.
    pub fn auto_tree_mut(&mut self) -> &mut Option<AutoTree> {
        &mut self.auto
    }

    /// Generates after `prompt`, calling `on_tokens` with each batch of accepted tokens (for
    /// streaming); stops after `max_new_tokens` or at a token for which `is_stop` holds (that
    /// token is not emitted). `is_stop` sees every generated token once, in order, before
    /// `on_tokens` gets it, so it may keep state (stop strings, `crate::decode::stop`). Returns the new
    /// tokens and the statistics.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        config: &GenerationConfig,
        is_stop: impl Fn(u32) -> bool,
        mut on_tokens: impl FnMut(&[u32]) -> Result<()>,
    ) -> Result<(Vec<u32>, Stats)> {
        self.generate_emitting(prompt, config, is_stop, |e| on_tokens(e.tokens))
    }

    /// [`Self::generate`], with each batch of accepted tokens given with their
    /// log-probabilities ([`Emitted`]).
    pub fn generate_emitting(
        &mut self,
        prompt: &[u32],
        config: &GenerationConfig,
        is_stop: impl Fn(u32) -> bool,
        on_emit: impl FnMut(Emitted<'_>) -> Result<()>,
    ) -> Result<(Vec<u32>, Stats)> {
        let result = self.generate_after(prompt, config, is_stop, on_emit);
        // The caches of a failed generation may hold rows no token list describes.
        if result.is_err() {
            self.history.clear();
        }
        result
    }

    fn generate_after(
        &mut self,
        prompt: &[u32],
        config: &GenerationConfig,
        is_stop: impl Fn(u32) -> bool,
        mut on_emit: impl FnMut(Emitted<'_>) -> Result<()>,
    ) -> Result<(Vec<u32>, Stats)> {
        self.logprobs.clear();
        self.prompt_logprobs.clear();
        if let Some(&(id, b)) = self.buf.logit_bias.iter().find(|(id, b)| *id as usize >= self.vocab || !b.is_finite())
        {
            config_bail!(
                "logit bias {b} for token {id}: ids must be below the vocabulary's {} and biases finite",
                self.vocab
            );
        }
        config.warp.check()?;
        self.buf.penalties.check().map_err(Error::Config)?;
        if prompt.is_empty() {
            config_bail!("the prompt is empty");
        }
        let has_draft = self.draft.is_some() || self.eagle.is_some();
        if let Some(s) = &config.speculative {
            check_ngram(s)?;
        }
        let ngram = config.speculative.as_ref().and_then(|s| s.source.ngram());
        let ngram_only = matches!(config.speculative.as_ref().map(|s| &s.source), Some(DraftSource::Ngram(_)));
        let spec = match (&config.speculative, has_draft || ngram_only) {
            (Some(s), true) => {
                samplers::validate_pair(s.construction, s.verifier)?;
                if let Some(w) = &s.draft_warp {
                    w.check().map_err(|e| Error::Sampling { during: "draft sampling", source: e })?;
                }
                Some(s)
            }
            (Some(_), false) => {
                config_bail!("speculative decoding needs a draft model, an EAGLE head or n-gram drafting")
            }
            (None, _) => None,
        };
        // Positional drafts race at most `MAX_DRAFTS` tokens per node (lookup nodes do not race;
        // `auto`'s trees are narrow).
        let model_tree = spec.filter(|s| !matches!(s.source, DraftSource::Ngram(_))).map(|s| &s.tree);
        if let (Some(TreeChoice::Fixed(t)), Randomness::Positional) = (model_tree, config.randomness) {
            let widest = (0..t.len()).map(|i| t.children(i).len()).max().unwrap_or(0);
            if widest > samplers::positional::MAX_DRAFTS {
                config_bail!(
                    "positional randomness draws at most {} drafts per node; the tree has a node with {widest} children",
                    samplers::positional::MAX_DRAFTS
                );
            }
        }
        // A prompt needs room for one plain step: near the end of the context, a tree that does
        // not fit gives way to the root alone (below), so trees never shorten the text.
        let capacity = self.target_cache.capacity();
        if prompt.len() + 1 > capacity {
            config_bail!("the prompt has {} tokens: it does not fit the context of {capacity} positions", prompt.len());
        }
        let root_only = DraftTree::root_only();
        let mut rng = StdRng::seed_from_u64(config.seed);
        self.buf.penalty.start(self.buf.penalties, self.vocab, prompt);
        self.buf.noise = match config.randomness {
            Randomness::Stream => None,
            Randomness::Positional => Some(PositionalNoise::new(config.seed)),
        };
        let n = prompt.len();
        let start = Instant::now();
        // Only `auto` weighs a catch-up against plain steps; fixed trees draft every step.
        let defer_draft = self.defer_draft_prefill
            && self.eagle.is_none()
            && spec.is_some_and(|s| matches!(s.tree, TreeChoice::Auto) && !matches!(s.source, DraftSource::Ngram(_)));
        let done = self.prefill_prompt(prompt, spec.is_some(), ngram, ngram_only, defer_draft)?;
        let (reused, draft_prefill_tokens) = (done.reused, done.draft_prefill_tokens);
        let mut stats = Stats { prompt_tokens: n, reused_tokens: reused, draft_prefill_tokens, ..Stats::default() };
        // The tokens the draft model has not run: the pending one, or the whole prompt when it
        // does not fit the draft's context (it then never drafts this text).
        let mut draft_pending: Vec<u32> = prompt[done.draft_ran..].to_vec();
        let mut pending = prompt[n - 1];
        let mut auto = match spec.map(|s| (&s.tree, s.draft_samples(config.warp))) {
            Some((TreeChoice::Auto, multi)) => {
                let mut a = match self.auto.take() {
                    Some(a) => a.for_candidates(multi),
                    None => AutoTree::new(multi),
                };
                a.new_text();
                // Nothing to generate (`max_new_tokens` 0, e.g. a prompt scored for its
                // log-probabilities): no step needs the costs, so they wait for a generation.
                if config.max_new_tokens > 0 {
                    let book = self.cost_book.clone();
                    let mut shared = book.as_ref().map(|b| b.lock());
                    if let Some(costs) = &shared {
                        a.target.fill_from(&costs.0);
                        a.draft.fill_from(&costs.1);
                    }
                    let measuring = Instant::now();
                    let target = self.target;
                    let (target_host, draft_host) = (&mut self.target_host, &mut self.buf.draft_host);
                    let runs = if let Some(e) = self.eagle.as_mut() {
                        let mut time = |rows| e.time_forward(target, draft_host, rows, pending);
                        a.calibrate(target, &mut self.target_cache, target_host, Some(&mut time), pending)?
                    } else if let (Some(d), Some(cache)) = (self.draft, self.draft_cache.as_mut()) {
                        let mut time =
                            |rows| crate::decode::auto_tree::time_forward(d, cache, draft_host, rows, pending);
                        a.calibrate(target, &mut self.target_cache, target_host, Some(&mut time), pending)?
                    } else {
                        a.calibrate(target, &mut self.target_cache, target_host, None, pending)?
                    };
                    if runs > 0 {
                        stats.auto_costs_s = measuring.elapsed().as_secs_f64();
                    }
                    if let Some(costs) = shared.as_mut() {
                        costs.0.fill_from(&a.target);
                        costs.1.fill_from(&a.draft);
                    }
                }
                Some(a)
            }
            _ => None,
        };
        // The set-up before the first step: the prompt, and `auto`'s cost measurements (for the
        // default pair on a 2-vCPU Xeon, 0.36 s at temperature 0 and 0.61 s at 0.7; once per
        // generator and set of candidates, kept when the candidates change).
        stats.prefill_s = start.elapsed().as_secs_f64();
        let decode_start = Instant::now();
        // At most what the cache holds: a request may ask for any number of tokens (10^18 made
        // `mdsd serve` abort on this allocation).
        let mut out = Vec::with_capacity(config.max_new_tokens.min(capacity));
        let mut timings = [Duration::ZERO; 3];
        stats.stop_reason = "max_new_tokens".into();
        'outer: while out.len() < config.max_new_tokens {
            // Room for the pending token, and one position to spare (a step's tree must fit in
            // `room` positions).
            let room = capacity.saturating_sub(self.target_cache.len() + 1);
            if room < 1 {
                stats.stop_reason = "context_length".into();
                break;
            }
            self.buf.emitted.clear();
            match spec {
                None if self.device_argmax(config.warp) => {
                    // Greedy on the device: one id crosses to the host, not a vocabulary-wide row.
                    let t0 = Instant::now();
                    let hidden = self.plain_step(pending, &mut stats)?;
                    let token = argmax_ids(self.target, &hidden)?[0];
                    timings[1] += t0.elapsed();
                    self.buf.emitted.push(token);
                    stats.target_forwards += 1;
                    stats.target_rows += 1;
                }
                None if self.warp_on_device(config.warp) => {
                    // Warped on the device, and drawn there (one id crosses to the host), or
                    // with positional randomness the row's probabilities cross.
                    let t0 = Instant::now();
                    let hidden = self.plain_step(pending, &mut stats)?;
                    let probs = device_select::warp_rows(&self.target.logits(&hidden)?, config.warp)?;
                    let token = match self.buf.noise {
                        None => device_select::sample_on_device(&probs, &mut rng)?,
                        Some(_) => {
                            let p = probs_row(self.target_probs.copy(&probs)?, "target")?;
                            let position = self.target_cache.len() as u64;
                            sample_token(self.buf.noise, position, p, &mut rng)?
                        }
                    };
                    timings[1] += t0.elapsed();
                    self.buf.emitted.push(token);
                    stats.target_forwards += 1;
                    stats.target_rows += 1;
                    stats.device_warped_rows += 1;
                }
                None => {
                    let t0 = Instant::now();
                    let hidden = self.plain_step(pending, &mut stats)?;
                    let logits = self.target_host.copy(&self.target.logits(&hidden)?)?;
                    timings[1] += t0.elapsed();
                    let t1 = Instant::now();
                    // Nothing emitted yet this step: the row is penalised for the text alone.
                    self.buf.warp_target_row(logits, config.warp)?;
                    // The cache now ends at the sampled token's position.
                    let position = self.target_cache.len() as u64;
                    let token = sample_token(self.buf.noise, position, &self.buf.p, &mut rng)?;
                    self.buf.emitted.push(token);
                    record_logprobs(self.logprobs_top, logits, token, &mut self.logprobs)?;
                    timings[2] += t1.elapsed();
                    stats.target_forwards += 1;
                    stats.target_rows += 1;
                }
                Some(s) => {
                    // With `--tree auto`, what the other members of a batch ask of their next
                    // steps (nothing alone).
                    let others = if auto.is_some() {
                        crate::model::others_load().unwrap_or(crate::model::SharedLoad::NONE)
                    } else {
                        crate::model::SharedLoad::NONE
                    };
                    let lookup = match &s.source {
                        DraftSource::Model => false,
                        DraftSource::Ngram(_) => true,
                        // With `--tree auto`, a lookup step is taken when it pays: alone, when
                        // its extra rows cost less than its extra tokens bring; in a batch, for
                        // the batch, since its rows cost every member (`lookup_pays_in_batch`).
                        DraftSource::NgramFirst { tree, .. } => {
                            self.ngram.has_match()
                                && auto.as_ref().is_none_or(|a| {
                                    let tokens = AutoTree::lookup_tokens(stats.ngram_tokens, stats.ngram_steps);
                                    a.lookup_pays_in_batch(tree.len(), tokens, &others)
                                })
                        }
                    };
                    let chosen;
                    let (tree, auto) = match (&s.source, &s.tree, auto.as_mut()) {
                        (DraftSource::NgramFirst { tree, .. }, _, _) if lookup => (tree, None),
                        (_, TreeChoice::Fixed(t), _) => (t, None),
                        (_, TreeChoice::Auto, Some(a)) => {
                            // A draft model that owes many tokens may catch up first; one that
                            // still lags drafts nothing this step.
                            let remaining = (config.max_new_tokens - out.len()).min(room);
                            let lag = (out.is_empty(), remaining, &others);
                            let lagging = self.settle_draft_lag(a, &mut draft_pending, lag, &mut stats)?;
                            // In a batch, knowing what the others' next steps ask.
                            let i = if lagging { a.choose_without_drafts() } else { a.choose_in_batch(&others) };
                            chosen = Arc::clone(&a.trees[i].1);
                            crate::model::post_load(Some(a.load_of(&chosen)));
                            (&*chosen, Some(a))
                        }
                        (_, TreeChoice::Auto, None) => unreachable!("auto state made above"),
                    };
                    // The last positions of the context, or of a draft model's shorter one: the
                    // root alone, a plain step through the same path, so the text ends where
                    // `--no-spec`'s does (at temperature 0, with the same tokens).
                    if auto.is_none() {
                        // A fixed tree (or n-gram lookup) posts its rows and the tokens its steps
                        // emitted so far, for the members choosing theirs in a batch.
                        let tau = (out.len() as f64 / stats.target_forwards.max(1) as f64).max(1.0);
                        crate::model::post_load(Some(crate::decode::auto_tree::load_of_tree(tree, tau)));
                    }
                    let fits = tree.len() <= room && (lookup || self.draft_fits(tree, draft_pending.len())?);
                    stats.undrafted_steps += (!fits && tree.len() > 1) as usize;
                    let (tree, auto, lookup) = if fits { (tree, auto, lookup) } else { (&root_only, None, false) };
                    stats.ngram_steps += lookup as usize;
                    let step = StepInput { tree, pending, warp: config.warp, lookup };
                    let accepted =
                        self.spec_step(s, &step, &mut draft_pending, &mut rng, &mut stats, &mut timings, auto)?;
                    if stats.accepted_at_depth.len() < tree.max_depth() {
                        stats.accepted_at_depth.resize(tree.max_depth(), 0);
                    }
                    for d in 0..accepted {
                        stats.accepted_at_depth[d] += 1;
                    }
                    if lookup {
                        stats.ngram_tokens += accepted + 1;
                    }
                }
            }
            // Every emitted token, past a cut too: the caches may hold accepted drafts beyond it.
            self.history.extend_from_slice(&self.buf.emitted);
            self.buf.penalty.push(&self.buf.emitted);
            // The step's log-probabilities follow the ones of `out` (none when not asked for).
            let logprobs = &self.logprobs[out.len().min(self.logprobs.len())..];
            let prompt_logprobs: &[TokenLogprobs] = if out.is_empty() { &self.prompt_logprobs } else { &[] };
            let emit = |k: usize| Emitted {
                tokens: &self.buf.emitted[..k],
                logprobs: &logprobs[..k.min(logprobs.len())],
                prompt_logprobs,
            };
            for i in 0..self.buf.emitted.len() {
                let t = self.buf.emitted[i];
                if is_stop(t) {
                    let e = emit(i);
                    out.extend_from_slice(e.tokens);
                    on_emit(e)?;
                    stats.stop_reason = "stop_token".into();
                    break 'outer;
                }
                if out.len() + i + 1 >= config.max_new_tokens {
                    let e = emit(i + 1);
                    out.extend_from_slice(e.tokens);
                    on_emit(e)?;
                    break 'outer;
                }
            }
            let e = emit(self.buf.emitted.len());
            out.extend_from_slice(e.tokens);
            on_emit(e)?;
            pending = *self.buf.emitted.last().expect("a step emits at least one token");
        }
        // The target cache holds the text up to the pending token.
        if self.history.len() >= self.target_cache.len() {
            self.history.truncate(self.target_cache.len());
        } else {
            self.history.clear();
        }
        self.logprobs.truncate(out.len());
        stats.new_tokens = out.len();
        let steps = stats.target_forwards.max(1) as f64;
        stats.tau = out.len() as f64 / steps;
        stats.acceptance_per_depth = stats.accepted_at_depth.iter().map(|&a| a as f64 / steps).collect();
        stats.draft_s = timings[0].as_secs_f64();
        stats.target_s = timings[1].as_secs_f64();
        stats.verify_s = timings[2].as_secs_f64();
        let decode_s = decode_start.elapsed().as_secs_f64();
        stats.total_s = start.elapsed().as_secs_f64();
        stats.tokens_per_s = if decode_s > 0.0 { out.len() as f64 / decode_s } else { 0.0 };
        if let Some(a) = auto {
            stats.auto_tree = a.summary();
            // The costs as the steps refined them, for the generators that start next.
            if let Some(book) = &self.cost_book {
                *book.lock() = (a.target.clone(), a.draft.clone());
            }
            self.auto = Some(a);
        }
        // Between generations a member of a batch asks nothing of it.
        crate::model::post_load(None);
        Ok((out, stats))
    }
}

/// The target's token at `position` of the text from its distribution `p`: the positional race
/// with `noise`, else a draw from the stream `rng`.
fn sample_token(noise: Option<PositionalNoise>, position: u64, p: &[f64], rng: &mut StdRng) -> Result<u32> {
    match noise {
        Some(noise) => noise.sample(position, p).map_err(|e| nan_error(e, "target")),
        None => Ok(samplers::dist::sample(p, rng)),
    }
}

/// Appends `token`'s log-probabilities from its scoring row `logits` when `top` asks for them.
fn record_logprobs(top: Option<usize>, logits: &[f32], token: u32, out: &mut Vec<TokenLogprobs>) -> Result<()> {
    if let Some(top) = top {
        let mut record = TokenLogprobs::default();
        token_logprobs(logits, token, top, &mut record).map_err(Error::Logprobs)?;
        out.push(record);
    }
    Ok(())
}

/// Tokens for a draft whose vocabulary is a prefix of the target's: ids beyond it (which the
/// target may emit) become id 0. The draft then proposes from a slightly different context,
/// which costs acceptance, never exactness.
fn for_draft(tokens: &[u32], draft_vocab: usize) -> Vec<u32> {
    tokens.iter().map(|&t| if (t as usize) < draft_vocab { t } else { 0 }).collect()
}
