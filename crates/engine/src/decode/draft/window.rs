//! A bounded context for the draft model: the first tokens ("attention sinks") and the most
//! recent ones, as StreamingLLM keeps them and as MagicDec drafts long contexts with.
//!
//! The target always attends to the whole context; only the draft's view shrinks. A draft
//! that sees less proposes worse tokens, which costs acceptance, never exactness: the
//! verifier checks every draft against the target's p and the q it was drawn from. What it
//! saves grows with the context: the draft's prompt pass covers `sinks + recent` tokens
//! instead of the whole prompt, and each draft forward attends to at most
//! `sinks + recent + slack` cached rows.
//!
//! The cached rows keep their real positions (rotary embeddings are applied at the position
//! each token has in the full context), so a row's position is its cache index plus the
//! number of tokens skipped between the sinks and the recent rows.

use crate::model::kv_cache::KvCache;
use crate::model::DecoderModel;
use crate::Result;

/// Which part of the context the draft model attends to: the first `sinks` tokens and the
/// last `recent` ones (at least; up to `recent + slack()` between slides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftWindow {
    pub sinks: usize,
    pub recent: usize,
}

impl DraftWindow {
    /// Sinks kept by default: StreamingLLM finds four enough.
    pub const DEFAULT_SINKS: usize = 4;

    /// Recent tokens `mdsd generate` keeps by default when n-gram lookup drafts the steps
    /// whose context repeats itself (`--ngram first`). Lookup then does the copying a draft
    /// needs the far context for: on 600-800-token Spec-Bench prompts this window took 7-9%
    /// off the time to answer. A draft model alone keeps the whole context: there the window
    /// dropped τ on summaries from 2.32 to 1.55 (docs/results/README.md#const-draft-window).
    pub const DEFAULT_WITH_LOOKUP: usize = 256;

    /// The recent tokens kept by default (0: the whole context): [`Self::DEFAULT_WITH_LOOKUP`]
    /// when n-gram lookup drafts first (`--ngram first`, `bench mt-bench`'s `ngram+METHOD`),
    /// else none.
    pub fn default_recent(lookup_first: bool) -> usize {
        if lookup_first {
            Self::DEFAULT_WITH_LOOKUP
        } else {
            0
        }
    }

    /// A window of `recent` tokens (at least 1) after `sinks` sink tokens.
    pub fn new(sinks: usize, recent: usize) -> Result<Self> {
        if recent == 0 {
            return Err(crate::Error::Config("the draft window needs at least one recent token".into()));
        }
        Ok(Self { sinks, recent })
    }

    /// Rows the cache may hold before [`DraftContext::slide`] drops the middle:
    /// `sinks + recent + slack`.
    pub fn max_rows(&self) -> usize {
        self.sinks.saturating_add(self.recent).saturating_add(self.slack())
    }

    /// Rows the cache may grow by past `sinks + recent` before the middle is dropped: half
    /// the window (at least 16), so that sliding (one copy of the recent rows) happens once
    /// per that many tokens.
    pub fn slack(&self) -> usize {
        (self.recent / 2).max(16)
    }
}

/// The draft cache's rows against the context's positions.
#[derive(Debug, Clone, Default)]
pub struct DraftContext {
    window: Option<DraftWindow>,
    /// Context tokens between the sinks and the first recent row, not in the cache.
    skipped: usize,
}

impl DraftContext {
    pub fn new(window: Option<DraftWindow>) -> Self {
        Self { window, skipped: 0 }
    }

    pub fn window(&self) -> Option<DraftWindow> {
        self.window
    }

    /// Context positions not in the cache: a cached row `r` past the sinks holds position
    /// `r + skipped()`.
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// Empties `cache` and runs `tokens` (context positions `0..tokens.len()`) through the
    /// draft: all of them, or with a window only the sinks and the last `recent`.
    pub fn prefill(&mut self, draft: &DecoderModel, cache: &mut KvCache, tokens: &[u32]) -> Result<()> {
        self.prefill_reporting(draft, cache, tokens, &mut |_| {})
    }

    /// [`Self::prefill`], calling `progress(done)` after each forward chunk with the number of
    /// tokens run so far.
    fn prefill_reporting(
        &mut self,
        draft: &DecoderModel,
        cache: &mut KvCache,
        tokens: &[u32],
        progress: &mut dyn FnMut(usize),
    ) -> Result<()> {
        cache.truncate(0);
        self.skipped = 0;
        let n = tokens.len();
        match self.window {
            Some(w) if n > w.sinks.saturating_add(w.recent) => {
                if w.sinks > 0 {
                    draft.forward_chain_reporting(&tokens[..w.sinks], 0, cache, progress)?;
                }
                let first = n - w.recent;
                // The sinks' chain has reported `w.sinks` done; the second chain's first report
                // (0 of its own) would repeat it.
                let mut after_sinks = |d| {
                    if d > 0 || w.sinks == 0 {
                        progress(w.sinks + d)
                    }
                };
                draft.forward_chain_reporting(&tokens[first..], first, cache, &mut after_sinks)?;
                self.skipped = first - w.sinks;
            }
            _ if n > 0 => {
                draft.forward_chain_reporting(tokens, 0, cache, progress)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// [`Self::prefill`] for `tokens` whose first `reusable` the cache's text begins with (the
    /// caller's word): the cached rows among them stay, and only the tokens after the last kept
    /// row run, where that is fewer than a fresh prefill runs. A row sits at its index below the
    /// sinks and `skipped` positions later above, so a window that skipped tokens keeps its rows
    /// only while the shared text reaches past the sinks' part. Returns the tokens run.
    pub fn prefill_reusing(
        &mut self,
        draft: &DecoderModel,
        cache: &mut KvCache,
        tokens: &[u32],
        reusable: usize,
    ) -> Result<usize> {
        self.prefill_reusing_reporting(draft, cache, tokens, reusable, &mut |_, _| {})
    }

    /// [`Self::prefill_reusing`], calling `progress(done, total)` after each forward chunk with
    /// the tokens run so far and the number it runs in all.
    pub fn prefill_reusing_reporting(
        &mut self,
        draft: &DecoderModel,
        cache: &mut KvCache,
        tokens: &[u32],
        reusable: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<usize> {
        let n = tokens.len();
        let keep = self.shared_rows(cache, reusable);
        let fresh = match self.window {
            Some(w) if n > w.sinks.saturating_add(w.recent) => w.sinks + w.recent,
            _ => n,
        };
        match keep.map(|k| (k, self.skipped + k)) {
            Some((keep, next)) if n.saturating_sub(next) <= fresh => {
                cache.truncate(keep);
                if next < n {
                    draft.forward_chain_reporting(&tokens[next..], next, cache, &mut |d| progress(d, n - next))?;
                }
                Ok(n.saturating_sub(next))
            }
            _ => {
                self.prefill_reporting(draft, cache, tokens, &mut |d| progress(d, fresh))?;
                Ok(fresh)
            }
        }
    }

    /// Rows of `cache` that a new text whose first `reusable` tokens it shares can keep: below
    /// the sinks a row sits at its index, past them `skipped` positions later, so a window that
    /// skipped tokens keeps its rows only while the shared text reaches past the sinks' part
    /// (`None`: none).
    fn shared_rows(&self, cache: &KvCache, reusable: usize) -> Option<usize> {
        match self.window {
            _ if reusable == 0 => None,
            _ if self.skipped == 0 => Some(reusable.min(cache.len())),
            Some(w) if reusable >= self.skipped + w.sinks => Some((reusable - self.skipped).min(cache.len())),
            _ => None,
        }
    }

    /// The part of a new text's prompt that `cache` holds already, for a draft whose prefill is
    /// put off ([`Self::extend_reporting`] runs the rest later): as [`Self::prefill_reusing`]
    /// keeps rows, the cache keeps the rows of the text's first `reusable` tokens where their
    /// positions allow, and forgets everything otherwise. Returns the context tokens it then
    /// covers: the next token to run is at that position.
    pub fn keep_shared(&mut self, cache: &mut KvCache, reusable: usize) -> usize {
        let keep = self.shared_rows(cache, reusable);
        match keep {
            Some(keep) => {
                cache.truncate(keep);
                self.skipped + keep
            }
            None => {
                cache.truncate(0);
                self.skipped = 0;
                0
            }
        }
    }

    /// Runs `tokens`, the context's next tokens after those the cache covers, through the draft,
    /// calling `progress(done, total)` after each forward chunk. Without a window, or while the
    /// cache stays within `sinks + recent + slack` rows, every token runs. Past that the cache
    /// ends as a fresh prefill of the whole context leaves it: the sinks and the last `recent`
    /// tokens, at their positions; the tokens between are never run, and cached rows among them
    /// are dropped. Returns the tokens run. A draft that put off its prompt's prefill catches up
    /// so, at the cost of the tokens it keeps, however long the text has grown meanwhile.
    pub fn extend_reporting(
        &mut self,
        draft: &DecoderModel,
        cache: &mut KvCache,
        tokens: &[u32],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<usize> {
        let n = tokens.len();
        let first = cache.len() + self.skipped;
        let limit = self.window.map_or(usize::MAX, |w| w.max_rows());
        let Some(w) = self.window.filter(|_| cache.len() + n > limit) else {
            if n > 0 {
                draft.forward_chain_reporting(tokens, first, cache, &mut |d| progress(d, n))?;
            }
            return Ok(n);
        };
        // The context then ends past `sinks + recent` tokens: keep positions `0..sinks` and
        // `recent_from..end`, which lies past the sinks and past every skipped position
        // (`cache.len() + n > sinks + recent + slack`).
        let end = first + n;
        let recent_from = end - w.recent;
        // A cache shorter than the sinks has skipped nothing: the first tokens fill the sinks.
        let fill = w.sinks.saturating_sub(cache.len()).min(n);
        let total = fill + w.recent.min(n - fill);
        if fill > 0 {
            draft.forward_chain_reporting(&tokens[..fill], first, cache, &mut |d| progress(d, total))?;
        }
        if recent_from >= first + fill {
            // Every cached row past the sinks is older than the recent part.
            cache.truncate(w.sinks);
        } else {
            // The cached rows at positions `recent_from..first` stay (row `r` past the sinks
            // holds position `r + skipped`).
            let from = recent_from - self.skipped;
            let kept: Vec<usize> = (from - w.sinks..cache.len() - w.sinks).collect();
            cache.compact(w.sinks, &kept)?;
        }
        self.skipped = recent_from - w.sinks;
        let run = recent_from.max(first + fill) - first;
        if run < n {
            draft.forward_chain_reporting(&tokens[run..], first + run, cache, &mut |d| progress(fill + d, total))?;
        }
        Ok(fill + (n - run))
    }

    /// Drops the rows between the sinks and the last `recent` once the cache holds more than
    /// `sinks + recent + slack` rows. Call between steps (every cached row committed).
    pub fn slide(&mut self, cache: &mut KvCache) -> Result<()> {
        let Some(w) = self.window else { return Ok(()) };
        let len = cache.len();
        if len <= w.max_rows() {
            return Ok(());
        }
        let drop = len - w.sinks - w.recent;
        let kept: Vec<usize> = (drop..len - w.sinks).collect();
        cache.compact(w.sinks, &kept)?;
        self.skipped += drop;
        Ok(())
    }
}
