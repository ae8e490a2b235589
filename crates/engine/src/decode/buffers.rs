//! The buffers one speculative step reuses ([`StepBuffers`]), shared by the generator and the
//! draft sources (`crate::decode::draft`), and the row helpers both apply (logit bias, the
//! error for invalid logits). A leaf of `crate::decode`: it imports no other part of it but
//! the host copies and the penalties.

use crate::decode::host_copy::{HostLogits, HostProbs};
use crate::decode::penalties::{Penalties, PenaltyState};
use crate::{Error, Result};
use samplers::construction::DraftScratch;
use samplers::dist::Warp;
use samplers::{PositionalNoise, VerifyScratch};

/// Per-step buffers, reused across steps.
#[derive(Default)]
pub(crate) struct StepBuffers {
    /// Token of each tree node; `None` for nodes not drafted this step, and for a node whose
    /// token repeats an earlier sibling's (see [`draw_children`](crate::decode::draft::draw_children)).
    pub(crate) token: Vec<Option<u32>>,
    /// The draft tuple drawn at each node, in order, repeats included: what its verifier sees.
    pub(crate) drawn: Vec<Vec<u32>>,
    pub(crate) q_at: Vec<Vec<f64>>,
    pub(crate) p: Vec<f64>,
    pub(crate) row_of: Vec<usize>,
    pub(crate) draft_slot: Vec<Option<usize>>,
    /// Tree nodes the draft ran this step after the root, in cache order.
    pub(crate) draft_fed: Vec<usize>,
    pub(crate) drafts: Vec<u32>,
    /// Product of the draft's top probabilities (temperature 1) from the root to each node.
    pub(crate) confidence: Vec<f64>,
    /// [`SpecConfig::confidence_cutoff`] of the running step.
    pub(crate) confidence_cutoff: f64,
    pub(crate) path: Vec<usize>,
    pub(crate) emitted: Vec<u32>,
    pub(crate) draft_scratch: DraftScratch,
    pub(crate) verify_scratch: VerifyScratch,
    /// [`Randomness::Positional`]'s noise for the running generation (`None`: the stream).
    pub(crate) noise: Option<PositionalNoise>,
    /// Position of the running step's root (the pending token) in the text.
    pub(crate) root_pos: usize,
    /// Added to the target's and the draft's logits before the warp ([`Generator::set_logit_bias`]).
    pub(crate) logit_bias: Vec<(u32, f32)>,
    /// The target row's entries under the bias, kept to put the row back ([`with_bias`]).
    pub(crate) bias_saved: Vec<f32>,
    /// Repetition penalties of the next generations ([`Generator::set_penalties`]).
    pub(crate) penalties: Penalties,
    /// The running generation's counts for the penalties.
    pub(crate) penalty: PenaltyState,
    /// A node's drafted path, for its row's penalties.
    pub(crate) path_tokens: Vec<u32>,
    /// The draft's logits of a tree level on the host
    /// ([`draw_children`](crate::decode::draft::draw_children)).
    pub(crate) draft_host: HostLogits,
    /// Whether the running step warps the draft's rows on the device (then their
    /// probabilities reach the host, in `draft_probs`).
    pub(crate) draft_warp_on_device: bool,
    pub(crate) draft_probs: HostProbs,
    /// The draft rows the running step warped on the device.
    pub(crate) device_warped_rows: usize,
}

impl StepBuffers {
    /// Turns a target row into `p`: the logit bias and the penalties (for the text so far and
    /// the tokens this step emitted before the row's node, its drafted path), then `warp`. The
    /// row comes back as it was, for the log-probabilities.
    pub(crate) fn warp_target_row(&mut self, row: &mut [f32], warp: Warp) -> Result<()> {
        let Self { logit_bias, bias_saved, penalty, emitted, p, .. } = self;
        with_bias(row, logit_bias, bias_saved, |r| {
            penalty.apply(r, emitted);
            let warped = warp.apply(r, p);
            penalty.restore(r);
            warped
        })
        .map_err(|e| nan_error(e, "target"))
    }
}

/// Runs `f` on `row` with `bias` added to its entries (OpenAI's `logit_bias`; ids past the row,
/// beyond a draft's shorter vocabulary, are skipped), then puts the row back as it was (the
/// entries are saved in `saved`, so that log-probabilities read the raw row). `f` may change
/// the row if it puts it back.
pub(crate) fn with_bias<T>(
    row: &mut [f32],
    bias: &[(u32, f32)],
    saved: &mut Vec<f32>,
    f: impl FnOnce(&mut [f32]) -> T,
) -> T {
    if bias.is_empty() {
        return f(row);
    }
    saved.clear();
    saved.extend(bias.iter().filter_map(|&(id, _)| row.get(id as usize).copied()));
    add_bias(row, bias);
    let out = f(row);
    // Back in reverse order, so that an id listed twice gets its first saved value.
    let mut s = saved.len();
    for &(id, _) in bias.iter().rev() {
        if let Some(x) = row.get_mut(id as usize) {
            s -= 1;
            *x = saved[s];
        }
    }
    out
}

/// Adds `bias` to `row`'s entries; ids past the row (beyond a draft's shorter vocabulary) are
/// skipped.
pub(crate) fn add_bias(row: &mut [f32], bias: &[(u32, f32)]) {
    for &(id, b) in bias {
        if let Some(x) = row.get_mut(id as usize) {
            *x += b;
        }
    }
}

/// The error for a row of logits the sampler refuses (NaN, all `-inf`), naming the model.
pub(crate) fn nan_error(e: samplers::SamplerError, which: &'static str) -> Error {
    Error::InvalidLogits { model: which, source: e }
}

#[cfg(test)]
mod tests {
    use super::with_bias;

    #[test]
    fn the_bias_is_seen_inside_and_the_row_comes_back_exactly() {
        let mut row = vec![0.1f32, 1e8, -3.3, 7.0];
        let original = row.clone();
        let mut saved = Vec::new();
        // Token 1 twice (its biases add up), an id past the row skipped.
        let bias = [(1u32, 0.7f32), (3, -100.0), (1, 0.2), (9, 5.0)];
        let seen = with_bias(&mut row, &bias, &mut saved, |r| r.to_vec());
        assert_eq!(seen, [0.1, 1e8 + 0.7 + 0.2, -3.3, 7.0 - 100.0]);
        assert_eq!(row, original, "bit for bit, though 1e8 + 0.7 - 0.7 is not 1e8 in f32");
        assert_eq!(with_bias(&mut row, &[], &mut saved, |r| r.to_vec()), original);
    }
}
