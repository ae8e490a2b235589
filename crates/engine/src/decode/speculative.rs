//! One multi-draft speculative decoding step on a [`DraftTree`], written against a minimal
//! model interface (the paper's appendix pseudocode `multi_draft_speculative_decoding`).
//!
//! For every node with children, level by level, the draft distribution `q` at that node
//! gives the children's tokens through the chosen [`DraftConstruction`]; then, from the root,
//! the [`Verifier`] turns `(p, q, drafts)` at the node into the next token; the walk descends
//! while that token is one of the node's drafted children, and stops at a node without drafts
//! after sampling its target distribution (the bonus token). The output of a step is therefore
//! distributed exactly as autoregressive sampling of the target, whatever the draft model.
//!
//! This is the reference implementation: the engine's batched tree forward must produce the
//! same `p` and `q` per node, and its tests compare against it.

use crate::decode::tree::DraftTree;
use rand::Rng;
use samplers::construction::DraftScratch;
use samplers::{DraftConstruction, SamplerError, TokenId, Verifier, VerifyScratch};

/// A model seen as next-token distributions: `out` receives the normalised distribution of
/// the token after `context`.
pub trait NextTokenModel {
    fn distribution(&self, context: &[TokenId], out: &mut Vec<f64>);
}

/// The result of one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepOutcome {
    /// The new tokens: accepted drafts, then the token sampled at the stopping node.
    pub tokens: Vec<TokenId>,
    /// Number of accepted draft tokens (`tokens.len() - 1`).
    pub accepted_len: usize,
    /// Target-distribution evaluations used (one per node the walk visited).
    pub target_evaluations: usize,
}

/// Reusable buffers of [`speculative_step`].
#[derive(Debug, Default)]
pub struct StepScratch {
    draft: DraftScratch,
    verify: VerifyScratch,
    context: Vec<TokenId>,
    drafts: Vec<TokenId>,
    q: Vec<f64>,
    p: Vec<f64>,
}

/// One speculative step after `context`. `construction` and `verifier` must be a valid pair
/// (see [`samplers::VALID_PAIRS`]).
#[allow(clippy::too_many_arguments)]
pub fn speculative_step<R: Rng + ?Sized>(
    target: &impl NextTokenModel,
    draft: &impl NextTokenModel,
    tree: &DraftTree,
    construction: DraftConstruction,
    verifier: Verifier,
    context: &[TokenId],
    rng: &mut R,
    scratch: &mut StepScratch,
) -> Result<StepOutcome, SamplerError> {
    samplers::validate_pair(construction, verifier)?;
    // Draft tokens of the nodes (None: a child left without a draft because the construction
    // returned fewer distinct tokens than the node has children), and q at each parent.
    let n = tree.len();
    let mut token: Vec<Option<TokenId>> = vec![None; n];
    let mut q_at: Vec<Vec<f64>> = vec![Vec::new(); n];
    for level in tree.levels() {
        for i in level.clone() {
            let kids = tree.children(i);
            if kids.is_empty() || (i > 0 && token[i].is_none()) {
                continue;
            }
            node_context(tree, &token, context, i, &mut scratch.context);
            draft.distribution(&scratch.context, &mut scratch.q);
            construction.sample(&scratch.q, kids.len(), rng, &mut scratch.draft, &mut scratch.drafts)?;
            for (&child, &t) in kids.iter().zip(&scratch.drafts) {
                token[child] = Some(t);
            }
            q_at[i] = scratch.q.clone();
        }
    }
    // Verification from the root.
    let mut out = Vec::new();
    let mut node = 0;
    let mut evaluations = 0;
    loop {
        node_context(tree, &token, context, node, &mut scratch.context);
        target.distribution(&scratch.context, &mut scratch.p);
        evaluations += 1;
        let drafted: Vec<usize> = tree.children(node).iter().copied().filter(|&c| token[c].is_some()).collect();
        if drafted.is_empty() {
            out.push(samplers::dist::sample(&scratch.p, rng));
            break;
        }
        scratch.drafts.clear();
        scratch.drafts.extend(drafted.iter().map(|&c| token[c].expect("drafted")));
        let k = tree.children(node).len();
        let verdict =
            verifier.verify(construction, k, &scratch.p, &q_at[node], &scratch.drafts, rng, &mut scratch.verify)?;
        out.push(verdict.token);
        match verdict.accepted {
            Some(j) => node = drafted[j],
            None => break,
        }
    }
    Ok(StepOutcome { accepted_len: out.len() - 1, tokens: out, target_evaluations: evaluations })
}

/// `context` followed by the draft tokens on the path from the root to `node`.
fn node_context(tree: &DraftTree, token: &[Option<TokenId>], context: &[TokenId], node: usize, out: &mut Vec<TokenId>) {
    out.clear();
    out.extend_from_slice(context);
    let start = out.len();
    let mut a = node;
    while let Some(p) = tree.parent(a) {
        out.push(token[a].expect("a node on a drafted path has a token"));
        a = p;
    }
    out[start..].reverse();
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use samplers::VALID_PAIRS;

    /// A toy model over `vocab` tokens: the distribution after a context is a fixed random
    /// function of the context (hashed), sharpened by `power` and warped by `temperature`.
    struct Toy {
        vocab: usize,
        seed: u64,
        temperature: f64,
    }

    impl NextTokenModel for Toy {
        fn distribution(&self, context: &[TokenId], out: &mut Vec<f64>) {
            let mut h = self.seed ^ 0x9E37_79B9_7F4A_7C15;
            for &t in context {
                h = (h ^ t as u64).wrapping_mul(0x100_0000_01B3).rotate_left(17);
            }
            let mut r = StdRng::seed_from_u64(h);
            let logits: Vec<f32> = (0..self.vocab).map(|_| 3.0 * rand::Rng::random::<f32>(&mut r)).collect();
            samplers::dist::Warp::temperature(self.temperature).apply(&logits, out).unwrap();
        }
    }

    fn two_tokens(
        target: &Toy,
        draft: &Toy,
        tree: &DraftTree,
        c: DraftConstruction,
        v: Verifier,
        rng: &mut StdRng,
        scratch: &mut StepScratch,
    ) -> (TokenId, TokenId) {
        let context = vec![1, 2];
        let first = speculative_step(target, draft, tree, c, v, &context, rng, scratch).unwrap();
        if first.tokens.len() >= 2 {
            return (first.tokens[0], first.tokens[1]);
        }
        let mut ctx = context.clone();
        ctx.push(first.tokens[0]);
        let second = speculative_step(target, draft, tree, c, v, &ctx, rng, scratch).unwrap();
        (first.tokens[0], second.tokens[0])
    }

    /// Temperature > 0: the first two generated tokens follow the exact autoregressive law
    /// `p(t1 | c) p(t2 | c, t1)`. Pearson chi-square over the 16 cells of a 4-token vocabulary,
    /// 40,000 steps per (pair, tree), fails below a p-value of 1e-4.
    #[test]
    fn first_two_tokens_follow_the_target_exactly() {
        let vocab = 4;
        let target = Toy { vocab, seed: 1, temperature: 1.0 };
        let draft = Toy { vocab, seed: 2, temperature: 1.3 };
        let mut p1 = Vec::new();
        target.distribution(&[1, 2], &mut p1);
        let mut expect = vec![0.0; vocab * vocab];
        for a in 0..vocab {
            let mut p2 = Vec::new();
            target.distribution(&[1, 2, a as TokenId], &mut p2);
            for b in 0..vocab {
                expect[a * vocab + b] = p1[a] * p2[b];
            }
        }
        // Depth-1 trees put the bonus token (sampled at the node where the walk stops) second.
        let trees = ["chain-1", "drafts-3-depth-1", "chain-2", "drafts-2-depth-2", "mc_sim_7b_63"];
        for (ti, tree_name) in trees.iter().enumerate() {
            let tree = DraftTree::preset(tree_name).unwrap();
            for (k, &(c, v)) in VALID_PAIRS.iter().enumerate() {
                // SpecHub needs exactly two children per drafting node.
                if c == DraftConstruction::SpecHub && (0..tree.len()).any(|i| ![0, 2].contains(&tree.children(i).len()))
                {
                    continue;
                }
                let mut rng = StdRng::seed_from_u64(1000 * ti as u64 + k as u64);
                let mut scratch = StepScratch::default();
                let mut counts = vec![0u64; vocab * vocab];
                let draws = 40_000;
                for _ in 0..draws {
                    let (a, b) = two_tokens(&target, &draft, &tree, c, v, &mut rng, &mut scratch);
                    counts[a as usize * vocab + b as usize] += 1;
                }
                let stat: f64 = counts
                    .iter()
                    .zip(&expect)
                    .map(|(&o, &e)| (o as f64 - e * draws as f64).powi(2) / (e * draws as f64))
                    .sum();
                let p_value = samplers::stats::chi_square_p_value(stat, vocab * vocab - 1);
                assert!(p_value > 1e-4, "{tree_name} {c}+{v}: chi2 = {stat:.1}, p {p_value:.1e} (counts {counts:?})");
            }
        }
    }

    /// Temperature 0: speculative output equals greedy autoregressive output token for token,
    /// for every preset tree and valid pair.
    #[test]
    fn temperature_zero_matches_greedy_decoding() {
        let vocab = 6;
        let target = Toy { vocab, seed: 3, temperature: 0.0 };
        let draft = Toy { vocab, seed: 4, temperature: 0.0 };
        let mut reference = vec![0, 1];
        let mut p = Vec::new();
        for _ in 0..24 {
            target.distribution(&reference, &mut p);
            reference.push(samplers::dist::argmax(&p));
        }
        for tree_name in ["chain-4", "drafts-2-depth-4", "drafts-3-depth-2", "mc_sim_7b_63"] {
            let tree = DraftTree::preset(tree_name).unwrap();
            for &(c, v) in VALID_PAIRS {
                if c == DraftConstruction::SpecHub && (0..tree.len()).any(|i| ![0, 2].contains(&tree.children(i).len()))
                {
                    continue;
                }
                let mut rng = StdRng::seed_from_u64(7);
                let mut scratch = StepScratch::default();
                let mut out = vec![0, 1];
                while out.len() < reference.len() {
                    let step = speculative_step(&target, &draft, &tree, c, v, &out, &mut rng, &mut scratch).unwrap();
                    out.extend(step.tokens);
                }
                assert_eq!(out[..reference.len()], reference[..], "{tree_name} {c}+{v}");
            }
        }
    }

    /// With the draft equal to the target at temperature 0, every step accepts a whole path.
    #[test]
    fn identical_models_accept_full_depth_at_temperature_zero() {
        let model = Toy { vocab: 5, seed: 9, temperature: 0.0 };
        let tree = DraftTree::preset("chain-4").unwrap();
        let mut rng = StdRng::seed_from_u64(0);
        let step = speculative_step(
            &model,
            &model,
            &tree,
            DraftConstruction::WithReplacement,
            Verifier::Rrs,
            &[3],
            &mut rng,
            &mut StepScratch::default(),
        )
        .unwrap();
        assert_eq!((step.accepted_len, step.tokens.len(), step.target_evaluations), (4, 5, 5));
    }
}
