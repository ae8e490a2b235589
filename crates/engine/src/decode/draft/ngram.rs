//! N-gram (prompt lookup) drafting: drafts copied from the context itself, with no draft model.
//!
//! Before a step, the longest suffix of the context, of `min..=max` tokens, that also occurs
//! earlier in the context gives the *matches*: every earlier occurrence of that suffix (the most
//! recent [`MAX_MATCHES`]), each continuing with the tokens that followed it. The tree is filled
//! from the root: a node's children are the distinct next tokens of the matches that agree with
//! the node's path, the most frequent first (ties: the most recent occurrence first), and each
//! child keeps the matches that continue with its token. Nodes beyond what the matches support
//! stay undrafted, so the target runs no row for them; without a match the step is a plain
//! one-row step.
//!
//! The drafts are a deterministic function of the context, so the membership verifier
//! ([`samplers::verify_deterministic`], `--verifier topk`) keeps the output exactly the target's,
//! and its acceptance `p(drafts)` is the most any verifier can reach for deterministic drafts.
//! This is vLLM's `ngram` method and llama.cpp's lookup decoding, with a tree of alternatives.

use crate::decode::buffers::StepBuffers;
use crate::decode::tree::DraftTree;

/// Matches kept per step (the most recent occurrences of the suffix).
pub const MAX_MATCHES: usize = 64;

/// Which suffix lengths are looked up (`--ngram-min`, `--ngram-max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramConfig {
    /// Shortest suffix that counts as a match (at least 1).
    pub min: usize,
    /// Longest suffix tried first.
    pub max: usize,
}

impl Default for NgramConfig {
    fn default() -> Self {
        Self { min: 2, max: 4 }
    }
}

/// The n-gram flags shared by `mdsd generate` and `bench mt-bench`.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct NgramFlags {
    /// Shortest suffix that counts as an n-gram match.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = NgramConfig::default().min))]
    pub ngram_min: usize,
    /// Longest suffix tried first.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = NgramConfig::default().max))]
    pub ngram_max: usize,
    /// Tree of the n-gram steps when they alternate with a draft model's (a fixed tree).
    #[cfg_attr(feature = "clap", arg(long, default_value = "chain-4"))]
    pub ngram_tree: String,
}

impl NgramFlags {
    /// The suffix lengths, checked.
    pub fn config(&self) -> Result<NgramConfig, String> {
        let c = NgramConfig { min: self.ngram_min, max: self.ngram_max };
        c.check().map(|()| c)
    }

    /// `--ngram-tree`, loaded.
    pub fn tree(&self) -> crate::Result<DraftTree> {
        DraftTree::load(&self.ngram_tree).map_err(|e| {
            crate::Error::Config(format!("--ngram-tree `{}` (a preset or a TOML file): {e}", self.ngram_tree))
        })
    }
}

impl NgramConfig {
    /// Errors unless `1 <= min <= max <= 64`.
    pub fn check(&self) -> Result<(), String> {
        if self.min == 0 || self.min > self.max || self.max > 64 {
            return Err(format!(
                "n-gram sizes must satisfy 1 <= min <= max <= 64, got min {} and max {}",
                self.min, self.max
            ));
        }
        Ok(())
    }
}

/// The context seen so far and the per-step buffers of the lookup.
#[derive(Debug, Default)]
pub struct NgramDrafter {
    config: NgramConfig,
    history: Vec<u32>,
    /// Per tree node: positions in `history` of the token each supporting match puts next.
    support: Vec<Vec<usize>>,
    /// `(token, count)` of one node's next tokens, in order of first (most recent) appearance.
    groups: Vec<(u32, usize)>,
    /// The root's matches ([`NgramDrafter::find_matches`]) and the context length they were
    /// found at: [`NgramDrafter::has_match`] and the step's [`NgramDrafter::draft_tree`] share
    /// one scan of the context.
    root: Vec<usize>,
    root_at: Option<usize>,
}

impl NgramDrafter {
    /// Starts a new context (the prompt; its last token is the first step's root).
    pub fn reset(&mut self, config: NgramConfig, prompt: &[u32]) {
        self.config = config;
        self.history.clear();
        self.history.extend_from_slice(prompt);
        self.root_at = None;
    }

    /// Appends emitted tokens to the context.
    pub fn extend(&mut self, tokens: &[u32]) {
        self.history.extend_from_slice(tokens);
    }

    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// Whether the context's suffix of at least `min` tokens occurred before (so that
    /// `NgramDrafter::draft_tree` drafts at least the root's first child).
    pub fn has_match(&mut self) -> bool {
        !self.root_matches().is_empty()
    }

    /// The root's matches for the current context, scanned once per context length (the
    /// context only grows between [`NgramDrafter::reset`]s).
    fn root_matches(&mut self) -> &[usize] {
        if self.root_at != Some(self.history.len()) {
            let mut m = std::mem::take(&mut self.root);
            self.find_matches(&mut m);
            self.root = m;
            self.root_at = Some(self.history.len());
        }
        &self.root
    }

    /// The continuation starts (positions in the context, most recent first) of every earlier
    /// occurrence of the longest matching suffix, into `out`; returns that suffix's length
    /// (0 when nothing of at least `min` tokens matches).
    pub fn find_matches(&self, out: &mut Vec<usize>) -> usize {
        out.clear();
        let h = &self.history;
        let len = h.len();
        if len < self.config.min + 1 {
            return 0;
        }
        let mut best = 0;
        // An occurrence ending just before `end` (exclusive, `end < len`) continues at `end`.
        for end in (1..len).rev() {
            let mut m = 0;
            while m < self.config.max && m < end && h[end - 1 - m] == h[len - 1 - m] {
                m += 1;
            }
            if m < self.config.min || m < best {
                continue;
            }
            if m > best {
                best = m;
                out.clear();
            }
            if out.len() < MAX_MATCHES {
                out.push(end);
            }
        }
        best
    }

    /// Fills the tree's nodes from the matches (see the module docs): `b.token` for drafted
    /// nodes, `b.drawn` with each node's children's tokens in order. Returns the number of
    /// drafted nodes after the root.
    pub(crate) fn draft_tree(&mut self, tree: &DraftTree, b: &mut StepBuffers) -> usize {
        let n = tree.len();
        if self.support.len() < n {
            self.support.resize_with(n, Vec::new);
        }
        self.support.iter_mut().for_each(Vec::clear);
        self.root_matches();
        self.support[0].extend_from_slice(&self.root);
        let len = self.history.len();
        let mut drafted = 0;
        for level in tree.levels() {
            for i in level.clone() {
                let kids = tree.children(i);
                if kids.is_empty() || b.token[i].is_none() || self.support[i].is_empty() {
                    continue;
                }
                self.groups.clear();
                for &s in &self.support[i] {
                    let t = self.history[s];
                    match self.groups.iter_mut().find(|g| g.0 == t) {
                        Some(g) => g.1 += 1,
                        None => self.groups.push((t, 1)),
                    }
                }
                // Most frequent first; the stable sort keeps recency among equals.
                self.groups.sort_by_key(|g| std::cmp::Reverse(g.1));
                for (&child, &(t, _)) in kids.iter().zip(&self.groups) {
                    b.token[child] = Some(t);
                    b.drawn[i].push(t);
                    drafted += 1;
                    let (before, after) = self.support.split_at_mut(child);
                    let next = &mut after[0];
                    next.extend(before[i].iter().filter(|&&s| self.history[s] == t && s + 1 < len).map(|&s| s + 1));
                }
            }
        }
        drafted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drafter(min: usize, max: usize, history: &[u32]) -> NgramDrafter {
        let mut d = NgramDrafter::default();
        d.reset(NgramConfig { min, max }, history);
        d
    }

    fn fill(d: &mut NgramDrafter, tree: &DraftTree) -> (Vec<Option<u32>>, Vec<Vec<u32>>, usize) {
        let mut b =
            StepBuffers { token: vec![None; tree.len()], drawn: vec![Vec::new(); tree.len()], ..Default::default() };
        b.token[0] = Some(*d.history().last().unwrap());
        let k = d.draft_tree(tree, &mut b);
        (b.token, b.drawn, k)
    }

    #[test]
    fn the_longest_suffix_wins_and_matches_are_most_recent_first() {
        // 1 2 3 | 9 5 2 3 | 7 5 1 2 3 | 8 5 1 2 3: the suffix `5 1 2 3` occurred once before
        // (continuing at 12), `1 2 3` twice (12, 3), `2 3` three times (12, 7, 3).
        let h = [1, 2, 3, 9, 5, 2, 3, 7, 5, 1, 2, 3, 8, 5, 1, 2, 3];
        let mut m = Vec::new();
        assert_eq!(drafter(1, 4, &h).find_matches(&mut m), 4);
        assert_eq!(m, vec![12]);
        assert_eq!(drafter(1, 3, &h).find_matches(&mut m), 3);
        assert_eq!(m, vec![12, 3]);
        let d = drafter(1, 2, &h);
        assert_eq!(d.find_matches(&mut m), 2);
        assert_eq!(m, vec![12, 7, 3]);
        // min above the longest match: nothing.
        let d = drafter(4, 4, &[1, 2, 3, 4, 9, 2, 3, 4]);
        assert_eq!(d.find_matches(&mut m), 0);
        assert!(m.is_empty());
        // Too short a context, or no repeat.
        assert_eq!(drafter(1, 3, &[5]).find_matches(&mut m), 0);
        assert_eq!(drafter(1, 3, &[1, 2, 3, 4]).find_matches(&mut m), 0);
        assert!(m.is_empty());
    }

    #[test]
    fn a_chain_follows_the_most_frequent_continuation() {
        // After `4 5`: 6 7 twice, 6 8 once (the most recent).
        let h = [4, 5, 6, 7, 0, 4, 5, 6, 7, 0, 4, 5, 6, 8, 0, 4, 5];
        let mut d = drafter(2, 2, &h);
        let tree = DraftTree::load("chain-3").unwrap();
        let (token, drawn, k) = fill(&mut d, &tree);
        assert_eq!(token, vec![Some(5), Some(6), Some(7), Some(0)]);
        assert_eq!(drawn[0], vec![6]);
        assert_eq!(drawn[1], vec![7]);
        assert_eq!(k, 3);
    }

    #[test]
    fn a_tree_gets_the_alternatives_and_stops_where_matches_end() {
        let h = [4, 5, 6, 7, 0, 4, 5, 6, 7, 0, 4, 5, 6, 8, 0, 4, 5];
        let mut d = drafter(2, 2, &h);
        let tree = DraftTree::load("drafts-2-depth-3").unwrap();
        let (token, drawn, _) = fill(&mut d, &tree);
        // Root: only 6 follows `4 5`, so one child; under 6: 7 (twice) then 8.
        assert_eq!(drawn[0], vec![6]);
        let six = tree.children(0)[0];
        assert_eq!(token[six], Some(6));
        assert_eq!(token[tree.children(0)[1]], None);
        assert_eq!(drawn[six], vec![7, 8]);
        for &c in tree.children(six) {
            // Both continue with 0.
            assert_eq!(drawn[c], vec![0], "node {c}");
        }
        // A continuation that reaches the end of the context stops there.
        let mut d = drafter(1, 1, &[3, 9, 3]);
        let (token, _, k) = fill(&mut d, &DraftTree::load("chain-4").unwrap());
        assert_eq!(token, vec![Some(3), Some(9), Some(3), None, None]);
        assert_eq!(k, 2);
    }

    #[test]
    fn no_match_drafts_nothing_and_sizes_are_checked() {
        let mut d = drafter(2, 3, &[1, 2, 3, 4, 5]);
        let (token, drawn, k) = fill(&mut d, &DraftTree::load("chain-3").unwrap());
        assert_eq!(k, 0);
        assert!(token[1..].iter().all(Option::is_none));
        assert!(drawn.iter().all(Vec::is_empty));
        assert!(!d.has_match());
        // The context grows: the next lookup sees the new suffix `1 2`.
        d.extend(&[1, 2]);
        assert!(d.has_match());
        let (token, _, k) = fill(&mut d, &DraftTree::load("chain-3").unwrap());
        assert_eq!(token, vec![Some(2), Some(3), Some(4), Some(5)]);
        assert_eq!(k, 3);
        assert!(NgramConfig { min: 0, max: 2 }.check().is_err());
        assert!(NgramConfig { min: 3, max: 2 }.check().is_err());
        assert!(NgramConfig { min: 1, max: 65 }.check().is_err());
        assert!(NgramConfig::default().check().is_ok());
    }
}
