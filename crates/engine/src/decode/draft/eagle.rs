//! Drafting a tree with an EAGLE-1 head ([`EagleHead`]), the feature-level draft source of
//! [`crate::decode::Generator`].
//!
//! The head's cache holds only *true* entries `(f_j, x_{j+1})`, `f_j` being the target's
//! final hidden state at position `j`, entered at position `j`. Between steps the entries the
//! head still owes wait in `pending`: after the prompt, `(f_0 .. f_{n-2}; x_1 .. x_{n-1})`; after
//! a step that accepted drafts `a_1 .. a_k` and emitted `b`, the target's hidden states of the
//! root and of `a_1 .. a_k` (rows of the step's own target forward, no second pass) paired with
//! `a_1 .. a_k, b`. One step:
//! 1. one head forward over the pending entries; the last output `g` gives `q` at the root
//!    (the pending token) through the target's output layer;
//! 2. one head forward per tree depth over the nodes that have children, each node's entry
//!    being (its parent's output, its token) at position `root + depth`, with the tree bias;
//! 3. the tree entries are dropped from the head's cache (their features were the head's own
//!    guesses); the caller then hands over the accepted path ([`EagleDraft::commit`]).
//!
//! Features move between levels with `index_select` on the device; logits go to the host once
//! per level, as for a draft model. On a thread of a [`crate::model::Batcher`] (serving,
//! `generate --jsonl --max-batch`), each head forward and its logits join the other members'
//! ([`EagleHead::forward_batch`]): the members' head forwards waiting at once (at any level)
//! run as one.

use crate::decode::auto_tree::AutoTree;
use crate::decode::buffers::StepBuffers;
use crate::decode::draft::{draw_children, expandable, tree_bias};
use crate::decode::host_copy::HostLogits;
use crate::decode::tree::DraftTree;
use crate::model::eagle::EagleHead;
use crate::model::kv_cache::KvCache;
use crate::model::{causal_bias, chain_masks, DecoderModel, StepGraphs};
use crate::Result;
use candle_core::Tensor;
use rand::rngs::StdRng;
use samplers::dist::Warp;
use samplers::DraftConstruction;
use std::time::Instant;

/// An EAGLE head with its cache and the entries it owes (see the module docs).
pub(crate) struct EagleDraft<'a> {
    head: &'a EagleHead,
    cache: KvCache,
    /// The features the head owes, in the order of `pending_tokens`, as the steps left them:
    /// joined only when a step drafts ([`join`]). Joining them at every step copied the whole
    /// backlog (the prompt's features, then one row per plain step) once per step.
    pending: Vec<Tensor>,
    pending_tokens: Vec<u32>,
    /// The head's forwards replayed from graphs (`crate::decode::Generator::set_graphs`).
    graphs: Option<StepGraphs>,
    /// Forwards run through them since [`Self::take_replays`].
    replays: usize,
}

impl<'a> EagleDraft<'a> {
    pub fn new(head: &'a EagleHead, capacity: usize) -> Result<Self> {
        let cache = head.new_cache(capacity)?;
        Ok(Self { head, cache, pending: Vec::new(), pending_tokens: Vec::new(), graphs: None, replays: 0 })
    }

    /// Replays the head's forwards from graphs, one per bucket of rows
    /// ([`StepGraphs::forward_head`]), or not.
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs = on.then(StepGraphs::default);
    }

    /// The head's forwards replayed since the last call.
    pub fn take_replays(&mut self) -> usize {
        std::mem::take(&mut self.replays)
    }

    /// A head forward ([`EagleHead::forward`]) of entries `(features, tokens)` at `positions`,
    /// each seeing the cache before `tail` and from there the keys of its mask (`masks`, which
    /// `bias` says as a matrix): through a graph bucket when on and the step fits one.
    #[allow(clippy::too_many_arguments)]
    fn head_forward(
        &mut self,
        target: &DecoderModel,
        features: &Tensor,
        (tokens, positions): (&[u32], &[u32]),
        (masks, tail): (impl FnOnce() -> Vec<u64>, usize),
        bias: impl FnOnce() -> Result<Tensor>,
    ) -> Result<Tensor> {
        let alone = crate::decode::graphs::alone_on_the_device();
        if let (Some(graphs), true) = (self.graphs.as_mut(), alone) {
            if StepGraphs::fits(tokens.len(), tail, &self.cache) {
                let rows = (tokens, positions);
                let (head, cache) = (self.head, &mut self.cache);
                if let Some(out) = graphs.forward_head(target, head, features, rows, &masks(), tail, cache)? {
                    self.replays += 1;
                    return Ok(out);
                }
            }
        }
        Ok(self.head.forward(target, features, tokens, positions, &bias()?, &mut self.cache)?)
    }

    /// How many of the `shared` first positions of the last text the target may keep for the
    /// head to follow ([`Self::start`]). An entry pairs a position's feature with the next
    /// token, so the head keeps its entries before the last shared position and needs the
    /// features of every position after them: its pending ones reach so far; past them, and
    /// where the head's cache reaches as far as the shared text, the target runs again from the
    /// head's last kept entry on (one position more than a draft model needs).
    pub fn reusable(&self, shared: usize) -> usize {
        let (h, m) = (self.cache.len(), self.pending_tokens.len());
        let covered = if self.pending.is_empty() { h } else { h + m };
        let r = shared.min(covered);
        if r > h {
            r
        } else {
            r.saturating_sub(1)
        }
    }

    /// Starts a generation on a prompt whose first `reused` tokens the target kept
    /// ([`Self::reusable`]; 0: none), `features` being the target's hidden states of the others
    /// but the last (`[n - 1 - reused, hidden]`, none when there are none): the head keeps its
    /// entries before `reused` and its pending features up to `reused - 1`, then takes
    /// `features`, paired with the prompt's tokens from the one after its last entry on. With
    /// nothing reused that is the prompt's features `f_0 .. f_{n-2}` with `x_1 .. x_{n-1}`.
    pub fn start(&mut self, reused: usize, features: Option<Tensor>, prompt: &[u32]) -> Result<()> {
        let h = self.cache.len();
        let old = std::mem::take(&mut self.pending);
        if reused > h && !old.is_empty() {
            self.pending.push(join(old)?.narrow(0, 0, reused - h)?);
        }
        self.cache.truncate(h.min(reused));
        self.pending.extend(features);
        self.pending_tokens = prompt[h.min(reused) + 1..].to_vec();
        Ok(())
    }

    /// Drafts `tree`'s tokens into `b` (steps 1-3 of the module docs); returns the number of
    /// head forwards (0 when nothing could be drafted: a tree without drafts, or no feature
    /// yet). With `auto` (`--tree auto`), each head forward's time (with its logits and
    /// draws) goes into its draft cost curve, by this text's rows. In a
    /// [`crate::model::Batcher`] that is the level's wall time as this member sees it: the
    /// batched run and the wait for the members in it, which every member of the batch pays.
    /// Recording only the batched run's seconds at the batch's rows, as a draft model's
    /// forwards do, made `auto` draft in batches of 4 on a 2-vCPU AVX-512 VM where drafting
    /// steps lose to plain ones there (44-52 tokens/s against `--no-spec`'s 57.5); with the
    /// wall time it kept to plain steps, as fast as `--no-spec`
    /// (docs/results/README.md#serving-eagle-batched).
    #[allow(clippy::too_many_arguments)]
    pub fn draft_tree(
        &mut self,
        target: &DecoderModel,
        tree: &DraftTree,
        construction: DraftConstruction,
        qwarp: Warp,
        vocab: usize,
        rng: &mut StdRng,
        b: &mut StepBuffers,
        mut auto: Option<&mut AutoTree>,
    ) -> Result<usize> {
        if self.pending.is_empty() || tree.children(0).is_empty() {
            return Ok(0);
        }
        let features = join(std::mem::take(&mut self.pending))?;
        let t_root = Instant::now();
        let m = self.pending_tokens.len();
        let base = self.cache.len();
        let pos: Vec<u32> = (base..base + m).map(|p| p as u32).collect();
        let bias = || Ok(causal_bias(base, m, target.dtype(), target.device())?);
        let tokens = std::mem::take(&mut self.pending_tokens);
        let out = self.head_forward(target, &features, (&tokens, &pos), (|| chain_masks(m), base), bias)?;
        let committed = self.cache.len();
        let root_pos = committed - 1;
        let mut prev = out.narrow(0, m - 1, 1)?;
        let mut forwards = 1;
        let mut level_nodes = vec![0usize];
        draw_children(tree, construction, qwarp, &self.head.logits(target, &prev)?, &level_nodes, vocab, rng, b)?;
        if let Some(a) = auto.as_deref_mut() {
            a.draft.record(m, t_root.elapsed().as_secs_f64());
        }
        // Row of each node's output in `prev` (the previous level's outputs).
        let mut prev_row = vec![usize::MAX; tree.len()];
        prev_row[0] = 0;
        let mut fed: Vec<usize> = Vec::new();
        for level in tree.levels().iter().skip(1) {
            expandable(tree, level.clone(), &b.token, &mut level_nodes);
            if level_nodes.is_empty() {
                break;
            }
            let t_level = Instant::now();
            let parent_rows: Vec<u32> =
                level_nodes.iter().map(|&i| prev_row[tree.parent(i).expect("non-root")] as u32).collect();
            let parent_rows = Tensor::from_vec(parent_rows, level_nodes.len(), target.device())?;
            let feats = prev.index_select(&parent_rows, 0)?;
            let tokens: Vec<u32> = level_nodes.iter().map(|&i| b.token[i].expect("filtered")).collect();
            let pos: Vec<u32> = level_nodes.iter().map(|&i| (root_pos + tree.depth(i)) as u32).collect();
            fed.extend(&level_nodes);
            let bias = || tree_bias(tree, committed, &level_nodes, &fed, target.dtype(), target.device());
            let masks = || crate::decode::graphs::level_masks(tree, &fed, &level_nodes);
            let out = self.head_forward(target, &feats, (&tokens, &pos), (masks, committed), bias)?;
            forwards += 1;
            draw_children(tree, construction, qwarp, &self.head.logits(target, &out)?, &level_nodes, vocab, rng, b)?;
            if let Some(a) = auto.as_deref_mut() {
                a.draft.record(level_nodes.len(), t_level.elapsed().as_secs_f64());
            }
            for (r, &i) in level_nodes.iter().enumerate() {
                prev_row[i] = r;
            }
            prev = out;
        }
        self.cache.truncate(committed);
        Ok(forwards)
    }

    /// Seconds of one head forward of `rows` entries (zero features, `token` repeated) after
    /// the cached entries, logits of every row to the host included (copied into `host`, as a
    /// step copies a level's); the cache is truncated back, so it is left as it was (the
    /// `--tree auto` calibration). `None` (and no forward) when `rows` more entries do not fit
    /// the cache.
    pub fn time_forward(
        &mut self,
        target: &DecoderModel,
        host: &mut HostLogits,
        rows: usize,
        token: u32,
    ) -> Result<Option<f64>> {
        let base = self.cache.len();
        if base + rows > self.cache.capacity() {
            return Ok(None);
        }
        let device = target.device();
        let features = Tensor::zeros((rows, self.head.config().hidden_size), target.dtype(), device)?;
        let tokens = vec![token; rows];
        let pos: Vec<u32> = (base..base + rows).map(|p| p as u32).collect();
        let bias = causal_bias(base, rows, target.dtype(), device)?;
        let t0 = Instant::now();
        let out = self.head.forward(target, &features, &tokens, &pos, &bias, &mut self.cache)?;
        std::hint::black_box(host.copy(&self.head.logits(target, &out)?)?);
        let s = t0.elapsed().as_secs_f64();
        self.cache.truncate(base);
        Ok(Some(s))
    }

    /// After verification: the target's hidden states `hidden` at rows `path_rows` (the root
    /// and the accepted drafts) become pending features, paired with `tokens` (the accepted
    /// drafts and the emitted token). Entries still pending from a step without drafting come
    /// first.
    pub fn commit(&mut self, hidden: &Tensor, path_rows: &[usize], tokens: &[u32]) -> Result<()> {
        let rows: Vec<u32> = path_rows.iter().map(|&r| r as u32).collect();
        let rows = Tensor::from_vec(rows, path_rows.len(), hidden.device())?;
        let feats = hidden.index_select(&rows, 0)?;
        self.pending.push(feats);
        self.pending_tokens.extend_from_slice(tokens);
        Ok(())
    }
}

/// The pending feature chunks as one `[rows, hidden]` tensor (`chunks` is not empty).
fn join(mut chunks: Vec<Tensor>) -> Result<Tensor> {
    Ok(if chunks.len() == 1 { chunks.pop().expect("one chunk") } else { Tensor::cat(&chunks, 0)? })
}
