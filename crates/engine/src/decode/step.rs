//! One speculative step of [`Generator`]: draft the tree level by level, score it with one
//! target forward, verify from the root, keep the accepted path in both caches (the steps
//! 1-4 of the module docs of [`super`]).

use super::device_select::{self, argmax_ids, probs_row};
use super::{for_draft, graphs, record_logprobs, sample_token, DraftSource, Generator, SpecConfig, Stats};
use crate::decode::auto_tree::AutoTree;
use crate::decode::draft::{draw_children, expandable, tree_bias};
use crate::decode::tree::DraftTree;
use crate::{Error, Result};
use rand::rngs::StdRng;
use samplers::dist::Warp;
use samplers::Verdict;
use std::time::{Duration, Instant};

impl Generator<'_> {
    /// Whether a draft model can draft `tree` this step: its positions (up to the deepest
    /// expanded node's) are within its context length, and its cache holds the `pending` tokens
    /// it has not run and the tree's nodes below the root, after its window slides. Always with
    /// an EAGLE head (its cache is the target's size), without a draft model, or for the root
    /// alone.
    pub(super) fn draft_fits(&mut self, tree: &DraftTree, pending: usize) -> Result<bool> {
        let (Some(draft), Some(cache), None) = (self.draft, self.draft_cache.as_mut(), &self.eagle) else {
            return Ok(true);
        };
        if tree.children(0).is_empty() {
            return Ok(true);
        }
        let last_position = self.target_cache.len() + tree.max_depth() - 1;
        self.draft_context.slide(cache)?;
        Ok(last_position < draft.config().context_length && cache.len() + pending + tree.len() - 1 <= cache.capacity())
    }

    /// One speculative step; fills `self.buf.emitted` and returns the accepted draft count.
    /// With `auto`, records the step's forward costs and verifications there.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn spec_step(
        &mut self,
        spec: &SpecConfig,
        step: &StepInput,
        draft_pending: &mut Vec<u32>,
        rng: &mut StdRng,
        stats: &mut Stats,
        timings: &mut [Duration; 3],
        mut auto: Option<&mut AutoTree>,
    ) -> Result<usize> {
        let (tree, warp, pending) = (step.tree, step.warp, step.pending);
        let qwarp = spec.draft_warp.unwrap_or(warp);
        let on_device = self.device_argmax(warp);
        // Probabilities from the device (else logits warped on the host), for the target's rows
        // and the draft's.
        let warp_on_device = !on_device && self.warp_on_device(warp);
        let draft_on_device = self.warp_on_device(qwarp) && spec.confidence_cutoff == 0.0;
        let b = &mut self.buf;
        b.draft_warp_on_device = draft_on_device;
        b.device_warped_rows = 0;
        let nodes = tree.len();
        b.token.clear();
        b.token.resize(nodes, None);
        b.token[0] = Some(pending);
        if b.drawn.len() < nodes {
            b.drawn.resize_with(nodes, Vec::new);
        }
        b.drawn.iter_mut().for_each(Vec::clear);
        b.draft_slot.clear();
        b.draft_slot.resize(nodes, None);
        b.draft_fed.clear();
        b.confidence.clear();
        b.confidence.resize(nodes, 1.0);
        b.confidence_cutoff = spec.confidence_cutoff;
        if b.q_at.len() < nodes {
            b.q_at.resize_with(nodes, Vec::new);
        }
        let root_pos = self.target_cache.len();
        b.root_pos = root_pos;

        // 1. Draft, level by level. (Batched, a forward's cost is its batch's: rows and seconds
        // of the batched run, without the wait for the other members.)
        let batched = crate::model::take_batched_cost;
        let _ = batched();
        let t0 = Instant::now();
        let mut level_nodes: Vec<usize> = Vec::new();
        let mut draft_committed = 0;
        if step.lookup {
            self.ngram.draft_tree(tree, b);
        } else if let Some(e) = self.eagle.as_mut() {
            stats.draft_forwards +=
                e.draft_tree(self.target, tree, spec.construction, qwarp, self.vocab, rng, b, auto.as_deref_mut())?;
            stats.draft_graph_forwards += e.take_replays();
        } else if !tree.children(0).is_empty() {
            let draft = self.draft.expect("checked by generate");
            let dcache = self.draft_cache.as_mut().expect("a draft has a cache");
            // Catch up on the tokens the draft never ran, then the root.
            self.draft_context.slide(dcache)?;
            let m = draft_pending.len();
            let dbase = dcache.len();
            let dpos = dbase + self.draft_context.skipped();
            if dpos + m != root_pos + 1 {
                return Err(Error::Internal(format!(
                    "draft cache at position {dpos} + {m} pending, target at {root_pos}"
                )));
            }
            let bias = || Ok(crate::model::causal_bias(dbase, m, draft.dtype(), draft.device())?);
            let pos: Vec<u32> = (dpos..dpos + m).map(|p| p as u32).collect();
            let fed = for_draft(draft_pending, draft.config().vocab_size);
            let chain = || Ok(crate::model::chain_masks(m));
            let (buckets, replayed) = (&mut self.draft_graphs, &mut stats.draft_graph_forwards);
            let hidden = graphs::step_forward(draft, buckets, dcache, (&fed, &pos), (chain, dbase), bias, replayed)?;
            stats.draft_forwards += 1;
            b.draft_slot[0] = Some(dbase + m - 1);
            level_nodes.push(0);
            let logits = draft.logits(&hidden.narrow(0, m - 1, 1)?)?;
            draw_children(tree, spec.construction, qwarp, &logits, &level_nodes, self.vocab, rng, b)?;
            if let Some(a) = auto.as_deref_mut() {
                let (rows, secs) = batched().unwrap_or((m, t0.elapsed().as_secs_f64()));
                a.draft.record(rows, secs);
            }
            // Draft cache rows up to the root's (its positions may skip part of the context).
            let committed = dbase + m;
            draft_committed = committed;
            for level in tree.levels().iter().skip(1) {
                expandable(tree, level.clone(), &b.token, &mut level_nodes);
                if level_nodes.is_empty() {
                    break;
                }
                for &i in &level_nodes {
                    b.draft_slot[i] = Some(committed + b.draft_fed.len());
                    b.draft_fed.push(i);
                }
                let tokens: Vec<u32> = level_nodes.iter().map(|&i| b.token[i].expect("filtered")).collect();
                let pos: Vec<u32> = level_nodes.iter().map(|&i| (root_pos + tree.depth(i)) as u32).collect();
                // Columns: the committed prefix (all visible), then this step's tree nodes.
                let bias = || tree_bias(tree, committed, &level_nodes, &b.draft_fed, draft.dtype(), draft.device());
                let masks = || Ok(graphs::level_masks(tree, &b.draft_fed, &level_nodes));
                let t_level = Instant::now();
                let _ = batched();
                let (buckets, replayed) = (&mut self.draft_graphs, &mut stats.draft_graph_forwards);
                let hidden =
                    graphs::step_forward(draft, buckets, dcache, (&tokens, &pos), (masks, committed), bias, replayed)?;
                stats.draft_forwards += 1;
                let logits = draft.logits(&hidden)?;
                draw_children(tree, spec.construction, qwarp, &logits, &level_nodes, self.vocab, rng, b)?;
                if let Some(a) = auto.as_deref_mut() {
                    let (rows, secs) = batched().unwrap_or((level_nodes.len(), t_level.elapsed().as_secs_f64()));
                    a.draft.record(rows, secs);
                }
            }
        }
        timings[0] += t0.elapsed();

        // 2. Target: the whole tree in one forward.
        let t1 = Instant::now();
        let _ = batched();
        b.row_of.clear();
        let live: Vec<usize> = (0..nodes).filter(|&i| b.token[i].is_some()).collect();
        b.row_of.resize(nodes, usize::MAX);
        for (r, &i) in live.iter().enumerate() {
            b.row_of[i] = r;
        }
        let tokens: Vec<u32> = live.iter().map(|&i| b.token[i].expect("live")).collect();
        let pos: Vec<u32> = live.iter().map(|&i| (root_pos + tree.depth(i)) as u32).collect();
        let tbase = self.target_cache.len();
        let (dtype, device) = (self.target.dtype(), self.target.device().clone());
        let masks = || graphs::tree_step_masks(tree, &live, &b.row_of);
        let bias = || tree_bias(tree, tbase, &live, &live, dtype, &device);
        let hidden = graphs::step_forward(
            self.target,
            &mut self.graphs,
            &mut self.target_cache,
            (&tokens, &pos),
            (masks, tbase),
            bias,
            &mut stats.graph_forwards,
        )?;
        // Greedy on the device: one id per row crosses to the host, not vocabulary-wide rows.
        let greedy = if on_device { Some(argmax_ids(self.target, &hidden)?) } else { None };
        if greedy.is_none() {
            // Rows reach the host as verification reads them.
            let logits = self.target.logits(&hidden)?;
            if warp_on_device {
                self.target_probs.rows_of(&device_select::warp_rows(&logits, warp)?)?;
            } else {
                self.target_host.rows_of(&logits)?;
            }
        }
        stats.target_forwards += 1;
        stats.target_rows += live.len();
        timings[1] += t1.elapsed();
        if let Some(a) = auto.as_deref_mut() {
            let (rows, secs) = batched().unwrap_or((live.len(), t1.elapsed().as_secs_f64()));
            a.target.record(rows, secs);
        }

        // 3. Verify from the root.
        let t2 = Instant::now();
        let mut node = 0;
        b.path.clear();
        b.path.push(0);
        loop {
            let row = b.row_of[node];
            if let Some(ids) = &greedy {
                // p is one-hot at the row's argmax: every verifier emits it, and accepts the
                // draft equal to it.
                let token = ids[row];
                b.emitted.push(token);
                if b.drawn[node].is_empty() {
                    break;
                }
                let accepted = b.drawn[node].iter().position(|&d| d == token);
                if let Some(a) = auto.as_deref_mut() {
                    a.record_node_at(tree.depth(node), b.drawn[node].len(), accepted);
                }
                if !step.lookup {
                    stats.record_node(b.drawn[node].len(), accepted);
                }
                match tree.children(node).iter().find(|&&c| b.token[c] == Some(token)) {
                    Some(&child) if accepted.is_some() => {
                        node = child;
                        b.path.push(node);
                        continue;
                    }
                    _ => break,
                }
            }
            let p: &[f64] = if warp_on_device {
                stats.device_warped_rows += 1;
                probs_row(self.target_probs.row(row)?, "target")?
            } else {
                // The tokens emitted so far this step are the drafted path to this node.
                b.warp_target_row(self.target_host.row(row)?, warp)?;
                &b.p
            };
            // The position of the token sampled at this node.
            let position = (root_pos + tree.depth(node) + 1) as u64;
            if b.drawn[node].is_empty() {
                b.emitted.push(sample_token(b.noise, position, p, rng)?);
                break;
            }
            b.drafts.clear();
            b.drafts.extend_from_slice(&b.drawn[node]);
            let verdict = if let Some(noise) = b.noise {
                // The target's own race decides; a draft equal to it is accepted.
                noise
                    .sample(position, p)
                    .map(|token| Verdict { token, accepted: b.drafts.iter().position(|&d| d == token) })
            } else if step.lookup {
                samplers::verify_deterministic(p, &b.drafts, rng, &mut b.verify_scratch)
            } else {
                spec.verifier.verify(
                    spec.construction,
                    tree.children(node).len(),
                    p,
                    &b.q_at[node],
                    &b.drafts,
                    rng,
                    &mut b.verify_scratch,
                )
            }
            .map_err(|e| Error::Sampling { during: "verification", source: e })?;
            b.emitted.push(verdict.token);
            if let Some(a) = auto.as_deref_mut() {
                a.record_node_at(tree.depth(node), b.drafts.len(), verdict.accepted);
            }
            if !step.lookup {
                stats.record_node(b.drafts.len(), verdict.accepted);
            }
            match verdict.accepted {
                Some(j) => {
                    // The first sibling holding the accepted token: a repeat's subtree
                    // would be an independent draw given the same path, so the first
                    // copy's serves (see `draw_children`).
                    let t = b.drafts[j];
                    node = *tree
                        .children(node)
                        .iter()
                        .find(|&&c| b.token[c] == Some(t))
                        .expect("every drafted token has a node");
                    b.path.push(node);
                }
                None => break,
            }
        }
        // The token emitted at each node of the path was scored by that node's row (only asked
        // for on the host paths: selection on the device runs without log-probabilities).
        for (&node, &token) in b.path.iter().zip(&b.emitted).filter(|_| self.logprobs_top.is_some()) {
            let row = b.row_of[node];
            record_logprobs(self.logprobs_top, self.target_host.row(row)?, token, &mut self.logprobs)?;
        }
        timings[2] += t2.elapsed();
        stats.device_warped_rows += b.device_warped_rows;

        // 4. Keep the accepted path in both caches.
        let t3 = Instant::now();
        let rows: Vec<usize> = b.path.iter().map(|&i| b.row_of[i]).collect();
        self.target_cache.compact(tbase, &rows)?;
        if spec.source.ngram().is_some() {
            self.ngram.extend(&b.emitted);
        }
        if matches!(spec.source, DraftSource::Ngram(_)) {
            // No draft model or head takes part in this generation.
        } else if let Some(e) = self.eagle.as_mut() {
            let mut tokens: Vec<u32> = b.path[1..].iter().map(|&i| b.token[i].expect("on the path")).collect();
            tokens.push(*b.emitted.last().expect("emitted"));
            e.commit(&hidden, &rows, &tokens)?;
        } else {
            let dcache = self.draft_cache.as_mut().expect("a draft has a cache");
            let committed = draft_committed;
            let fed: Vec<usize> = b.path[1..].iter().map_while(|&i| b.draft_slot[i]).map(|s| s - committed).collect();
            if b.draft_slot[0].is_some() {
                dcache.compact(committed, &fed)?;
                draft_pending.clear();
            }
            // Otherwise the draft ran nothing this step (a tree without drafts): what it owes,
            // the root included, stays in `draft_pending`.
            draft_pending.extend(b.path[1 + fed.len()..].iter().map(|&i| b.token[i].expect("on the path")));
            draft_pending.push(*b.emitted.last().expect("emitted"));
        }
        timings[1] += t3.elapsed();
        Ok(b.path.len() - 1)
    }
}

/// What a speculative step works on.
pub(super) struct StepInput<'t> {
    pub(super) tree: &'t DraftTree,
    /// The last emitted token, not yet run by the target.
    pub(super) pending: u32,
    pub(super) warp: Warp,
    /// Drafted by n-gram lookup (else by the draft model or head).
    pub(super) lookup: bool,
}
