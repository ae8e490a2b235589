//! Draft sources: a draft model (driven by [`crate::decode`]), an EAGLE head ([`eagle`]),
//! n-gram lookup in the context ([`ngram`]), and the draft model's bounded context
//! ([`window`]). This module holds what the model and the head share to draft a tree level by
//! level. Each level's expandable nodes run
//! in one forward with [`tree_bias`]; [`draw_children`] turns each node's draft logits into `q`
//! and draws its children with the [`DraftConstruction`].

pub(crate) mod eagle;
pub mod ngram;
pub mod window;

use crate::decode::buffers::{add_bias, nan_error, StepBuffers};
use crate::decode::tree::DraftTree;
use crate::model::attention_bias;
use crate::{Error, Result};
use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use samplers::dist::Warp;
use samplers::DraftConstruction;
use std::ops::Range;

/// The nodes of `level` that were drafted and have children (the ones a draft runs), into
/// `out`.
pub(crate) fn expandable(tree: &DraftTree, level: Range<usize>, token: &[Option<u32>], out: &mut Vec<usize>) {
    out.clear();
    out.extend(level.filter(|&i| token[i].is_some() && !tree.children(i).is_empty()));
}

/// Attention bias of tree nodes `rows` against `prefix` committed positions (all visible) and
/// then the tree nodes `cols` in cache order: visible where the column is an ancestor of the
/// row or the row itself.
pub(crate) fn tree_bias(
    tree: &DraftTree,
    prefix: usize,
    rows: &[usize],
    cols: &[usize],
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    Ok(attention_bias(
        prefix,
        rows.len(),
        cols.len(),
        |r, c| tree.is_ancestor_or_self(cols[c], rows[r]),
        dtype,
        device,
    )?)
}

/// Warps the draft logits of `level_nodes` (one row each) into `q`, padded with zeros to the
/// target vocabulary, and draws each node's children: with `construction`, or with
/// [`StepBuffers::noise`] the `k` best positional races of `q` (Gumbel-top-k).
///
/// A token drawn twice at one node (drafts with replacement, K-SEQ) gets one child: the repeat
/// stays in the node's tuple, which the verifier sees whole, but gets no tree node, target
/// row or subtree. This is lossless: the verifier's choice at the node depends only on the
/// tuple, and if it accepts the repeat, the first copy's subtree is a draw with the same law
/// (the same path, drafted independently of the choice). At low temperatures, where drafts
/// with replacement mostly repeat, this saves most of the tree.
#[allow(clippy::too_many_arguments)]
pub(crate) fn draw_children(
    tree: &DraftTree,
    construction: DraftConstruction,
    warp: Warp,
    logits: &Tensor,
    level_nodes: &[usize],
    vocab: usize,
    rng: &mut StdRng,
    b: &mut StepBuffers,
) -> Result<()> {
    let (rows, dv) = logits.dims2()?;
    // Borrowed beside `b`'s other fields, which the loop uses: the logits on the host, or the
    // probabilities warped on the device (`Generator::warp_on_device`: no bias, penalties or
    // confidence cutoff to apply then).
    let (host, probs): (&mut [f32], &[f64]) = if b.draft_warp_on_device {
        (&mut [], b.draft_probs.copy(&crate::decode::device_select::warp_rows(logits, warp)?)?)
    } else {
        (b.draft_host.copy(logits)?, &[])
    };
    for (r, &i) in level_nodes.iter().enumerate().take(rows) {
        b.drawn[i].clear();
        let q = &mut b.q_at[i];
        if b.draft_warp_on_device {
            let row = crate::decode::device_select::probs_row(&probs[r * dv..(r + 1) * dv], "draft")?;
            q.clear();
            q.extend_from_slice(row);
            b.device_warped_rows += 1;
        } else {
            let row = &mut host[r * dv..(r + 1) * dv];
            // The draft's row is not read again: the bias and penalties stay.
            add_bias(row, &b.logit_bias);
            // The drafted tokens from the root (exclusive) to this node: the row's text past
            // the committed one, for the penalties.
            b.path_tokens.clear();
            let mut at = i;
            while let Some(parent) = tree.parent(at) {
                b.path_tokens.extend(b.token[at]);
                at = parent;
            }
            b.penalty.apply(row, &b.path_tokens);
            let row = &*row;
            if b.confidence_cutoff > 0.0 {
                let parent = tree.parent(i).map_or(1.0, |p| b.confidence[p]);
                b.confidence[i] = parent * top_probability(row);
                if b.confidence[i] < b.confidence_cutoff {
                    continue;
                }
            }
            warp.apply(row, q).map_err(|e| nan_error(e, "draft"))?;
        }
        q.resize(vocab, 0.0);
        let kids = tree.children(i);
        match b.noise {
            // The children's tokens sit one position past the node.
            // Only the draft's own ids can win (the padding is zero): race those.
            Some(noise) => {
                noise.top_k((b.root_pos + tree.depth(i) + 1) as u64, &q[..dv.min(vocab)], kids.len(), &mut b.drafts)
            }
            None => construction.sample(q, kids.len(), rng, &mut b.draft_scratch, &mut b.drafts),
        }
        .map_err(|e| Error::Sampling { during: "drafting", source: e })?;
        for (k, (&child, &t)) in kids.iter().zip(&b.drafts).enumerate() {
            if !b.drafts[..k].contains(&t) {
                b.token[child] = Some(t);
            }
        }
        b.drawn[i].extend_from_slice(&b.drafts);
    }
    Ok(())
}

/// The largest probability of `softmax(logits)` (temperature 1): `1 / sum_j exp(l_j - max)`.
/// Logits that are not finite give 1 (no pruning; the warp then reports them).
fn top_probability(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    if max.is_finite() && sum.is_finite() && sum >= 1.0 {
        1.0 / sum as f64
    } else {
        1.0
    }
}
