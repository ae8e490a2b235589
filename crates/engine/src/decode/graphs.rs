//! Graph-replayed decoding steps for [`Generator`] ([`Generator::set_graphs`]): the target's
//! and a draft model's step forwards through [`StepGraphs`] buckets when they fit, eagerly
//! otherwise, and the masks of a step's rows that the buckets' inputs hold.

use super::{Generator, Stats};
use crate::decode::tree::DraftTree;
use crate::error::config_bail;
use crate::model::kv_cache::KvCache;
use crate::model::{DecoderModel, StepGraphs};
use crate::Result;
use candle_core::Tensor;

/// Whether `MDSD_CUDA_GRAPHS` asks for graph-replayed steps (`1`, `on`, `true`).
pub(super) fn from_env() -> bool {
    matches!(std::env::var("MDSD_CUDA_GRAPHS").as_deref(), Ok("1" | "on" | "true"))
}

impl Generator<'_> {
    /// Runs the target's decoding steps (not the prompts), and a draft model's steps when it
    /// is on the device-kernel path too, as graph replays, one graph per bucket of 1, 2, 4,
    /// ... 64 rows and model ([`StepGraphs`]): on CUDA one launch per forward in place of its
    /// hundreds; on the CPU the same step forward run directly (what the CPU tests check).
    /// An EAGLE head's steps are replayed too (the head runs attention as its target does).
    /// Needs the device-kernel path ([`DecoderModel::set_fused_decode`]); forwards on a thread
    /// of a [`crate::model::Batcher`] (serving, `--jsonl` workers) and steps that do not fit a
    /// bucket run eagerly.
    /// Default: `MDSD_CUDA_GRAPHS` (`1`, `on`, `true`) with the device-kernel path, else off.
    pub fn set_graphs(&mut self, on: bool) -> Result<()> {
        if on && !self.target.fused_decode() {
            config_bail!(
                "graph-replayed steps run the device kernels: turn on the fused decode path (MDSD_FUSED_DECODE=1)"
            );
        }
        self.graphs = on.then(StepGraphs::default);
        self.draft_graphs = (on && self.draft.is_some_and(|d| d.fused_decode())).then(StepGraphs::default);
        if let Some(e) = self.eagle.as_mut() {
            e.set_graphs(on);
        }
        Ok(())
    }

    /// Whether the target's steps are replayed from graphs ([`Self::set_graphs`]).
    pub fn graphs(&self) -> bool {
        self.graphs.is_some()
    }

    /// A plain step's target forward: the pending token at the cache's end.
    pub(super) fn plain_step(&mut self, pending: u32, stats: &mut Stats) -> Result<Tensor> {
        let position = self.target_cache.len();
        let (dtype, device) = (self.target.dtype(), self.target.device().clone());
        step_forward(
            self.target,
            &mut self.graphs,
            &mut self.target_cache,
            (&[pending], &[position as u32]),
            (|| Ok(vec![1]), position),
            || Ok(crate::model::causal_bias(position, 1, dtype, &device)?),
            &mut stats.graph_forwards,
        )
    }
}

/// A model's forward of a step's rows (`tokens` at `positions` after the cache, row `r` seeing
/// the cache before `tail` and from there the keys of `masks[r]`, which `bias` says as a
/// matrix): through a graph bucket when `graphs` is on ([`Generator::set_graphs`]) and the step
/// fits one (counted in `replayed`), else eagerly. The final hidden states `[rows, hidden]`;
/// the cache advanced by the rows. (A function of the generator's fields, which a step
/// borrows apart.)
pub(super) fn step_forward(
    model: &DecoderModel,
    graphs: &mut Option<StepGraphs>,
    cache: &mut KvCache,
    (tokens, positions): (&[u32], &[u32]),
    (masks, tail): (impl FnOnce() -> Result<Vec<u64>>, usize),
    bias: impl FnOnce() -> Result<Tensor>,
    replayed: &mut usize,
) -> Result<Tensor> {
    if let (Some(graphs), true) = (graphs.as_mut(), alone_on_the_device()) {
        if StepGraphs::fits(tokens.len(), tail, cache) {
            if let Some(hidden) = graphs.forward(model, (tokens, positions), &masks()?, tail, cache)? {
                *replayed += 1;
                return Ok(hidden);
            }
        }
    }
    Ok(model.forward(tokens, positions, &bias()?, cache)?)
}

/// Whether this thread's forwards may run through graphs: not on a thread that belongs to a
/// [`crate::model::Batcher`] (serving, `--jsonl` workers), alone or not, since other threads may
/// queue work on the device's one stream at any moment, and a capture must be alone on it.
pub(crate) fn alone_on_the_device() -> bool {
    crate::model::Batcher::current().is_none()
}

/// The masks ([`crate::model::StepInputs::set`]) of a target's tree step: row `r` (tree node
/// `live[r]`) sees itself and its ancestors among the step's rows (`row_of`: each node's row).
pub(super) fn tree_step_masks(tree: &DraftTree, live: &[usize], row_of: &[usize]) -> Result<Vec<u64>> {
    let parents: Vec<Option<usize>> = live.iter().map(|&i| tree.parent(i).map(|p| row_of[p])).collect();
    Ok(crate::model::tree_masks(&parents)?)
}

/// The masks of a draft's tree level: level node `i` sees those of this step's drafted nodes
/// `fed` (their keys follow the tail in this order) that are `i` or its ancestors. Keys past
/// the 64th get no bit (such a step does not fit a graph bucket and runs eagerly).
pub(crate) fn level_masks(tree: &DraftTree, fed: &[usize], level: &[usize]) -> Vec<u64> {
    level
        .iter()
        .map(|&i| {
            let mut mask = 0u64;
            let mut node = Some(i);
            while let Some(n) = node.filter(|&n| n != 0) {
                if let Some(k) = fed.iter().position(|&f| f == n) {
                    mask |= 1u64.checked_shl(k as u32).unwrap_or(0);
                }
                node = tree.parent(n);
            }
            mask
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A level's masks name the drafted nodes on each node's path (not the root, whose key is
    /// before the tail), in the order they were fed.
    #[test]
    fn level_masks_follow_the_paths() {
        // 0 -> 1, 2; 1 -> 3; 2 -> 4.
        let tree = DraftTree::from_paths(&[vec![0], vec![1], vec![0, 0], vec![1, 0]]).unwrap();
        assert_eq!((1..5).map(|i| tree.parent(i).unwrap()).collect::<Vec<_>>(), [0, 0, 1, 2]);
        let fed = [1, 2, 3, 4];
        assert_eq!(level_masks(&tree, &fed, &[1, 2]), [0b1, 0b10]);
        assert_eq!(level_masks(&tree, &fed, &[3, 4]), [0b101, 0b1010]);
        let masks = tree_step_masks(&tree, &[0, 1, 2, 3, 4], &[0, 1, 2, 3, 4]).unwrap();
        assert_eq!(masks, [0b1, 0b11, 0b101, 0b1011, 0b10101]);
    }
}
