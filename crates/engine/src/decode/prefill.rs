//! A prompt's prefill for [`Generator`]: the prefix kept from the last text, the target's
//! forward over the rest but the last token, the prompt's log-probabilities, and what each
//! draft source needs before the first step (the EAGLE head's features, the n-gram index, the
//! draft model's cache or window); and a draft model's catch-up when its prefill was put off.

use super::{for_draft, record_logprobs, Generator, Stats};
use crate::decode::auto_tree::AutoTree;
use crate::decode::draft::ngram::NgramConfig;
use crate::decode::logprobs::TokenLogprobs;
use crate::model::{DecoderModel, SharedLoad};
use crate::Result;

/// How far a prompt's prefill has come, as [`Generator::set_prefill_progress`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillProgress {
    /// The model being prefilled: `"target"`, then `"draft"` when a draft model runs.
    pub model: &'static str,
    /// Prompt tokens this model has run so far.
    pub done: usize,
    /// Prompt tokens this model runs in all (cached and windowed-out tokens excluded).
    pub total: usize,
    /// A draft model catching up after the text's first tokens were emitted (its prefill was
    /// put off: [`Generator::set_deferred_draft_prefill`]); `total` then counts the text's tokens
    /// it runs, not only the prompt's. A display on the terminal the text streams to may leave
    /// these out.
    pub catch_up: bool,
}

impl Generator<'_> {
    /// Runs every token of `prompt` but the last (the pending token) through the target, after
    /// the prefix kept from the last text ([`Self::set_prefix_reuse`]), and readies the draft
    /// sources: the EAGLE head, the n-gram index (`ngram`), and the draft model's cache, which
    /// sees the prompt only when `speculative` and not `ngram_only`, and only when it fits the
    /// draft's context: a longer prompt goes without drafts from it (`draft_fits` then refuses
    /// every step, since the draft has no positions past its context length). With
    /// `defer_draft` the draft model runs nothing here: it keeps its rows of the shared prefix
    /// and owes the rest ([`Self::catch_up_draft`]).
    pub(super) fn prefill_prompt(
        &mut self,
        prompt: &[u32],
        speculative: bool,
        ngram: Option<NgramConfig>,
        ngram_only: bool,
        defer_draft: bool,
    ) -> Result<Prefilled> {
        // In a batch, prompts are prefilled one at a time, in order of arrival.
        let _prefilling = crate::model::Prefilling::enter();
        let n = prompt.len();
        // The cached prefix this prompt shares with the last text (`set_prefix_reuse`).
        let mut reused = if self.prefix_reuse {
            self.history.iter().zip(&prompt[..n - 1]).take_while(|(a, b)| a == b).count()
        } else {
            0
        };
        let score_prompt = self.score_prompt && self.logprobs_top.is_some();
        if score_prompt {
            reused = 0;
        }
        if let Some(e) = &self.eagle {
            reused = e.reusable(reused);
        }
        self.history.clear();
        self.history.extend_from_slice(prompt);
        // Prefill every prompt token but the last, which becomes the pending token.
        self.target_cache.truncate(reused);
        let prompt_hidden = if n - 1 > reused {
            let (report, total) = (&mut self.prefill_progress, n - 1 - reused);
            let mut progress = |done| tell(report, "target", done, total, false);
            Some(self.target.forward_chain_reporting(
                &prompt[reused..n - 1],
                reused,
                &mut self.target_cache,
                &mut progress,
            )?)
        } else {
            None
        };
        if let (true, Some(hidden), Some(top)) = (score_prompt, &prompt_hidden, self.logprobs_top) {
            score_rows(self.target, hidden, &prompt[1..], top, &mut self.prompt_logprobs)?;
        }
        if let Some(e) = self.eagle.as_mut() {
            e.start(reused, prompt_hidden, prompt)?;
        }
        if let Some(c) = ngram {
            self.ngram.reset(c, prompt);
        }
        let mut done = Prefilled { reused, draft_prefill_tokens: 0, draft_ran: n - 1 };
        if let (Some(d), Some(cache)) = (self.draft, self.draft_cache.as_mut()) {
            let wanted = speculative && !ngram_only;
            // A draft model with a shorter context than the target's: past its end mid-text,
            // steps go without drafts (`draft_fits`). Its positions end at its context length,
            // with a window too, so a prompt beyond it leaves the draft out of the whole text.
            let kept = self.draft_context.window().map_or(n - 1, |w| (n - 1).min(w.sinks.saturating_add(w.recent)));
            let fits = n - 1 <= d.config().context_length && kept <= cache.capacity();
            let context = if wanted && fits { &prompt[..n - 1] } else { &[] };
            let reusable = reused.min(context.len());
            if defer_draft && !context.is_empty() {
                // Put off: the draft keeps what it holds of the shared prefix and owes the rest
                // (`catch_up_draft`), so the first token does not wait for it.
                done.draft_ran = self.draft_context.keep_shared(cache, reusable);
                return Ok(done);
            }
            let report = &mut self.prefill_progress;
            let mut progress = |done, total| tell(report, "draft", done, total, false);
            done.draft_prefill_tokens = self.draft_context.prefill_reusing_reporting(
                d,
                cache,
                &for_draft(context, d.config().vocab_size),
                reusable,
                &mut progress,
            )?;
            done.draft_ran = context.len();
        }
        Ok(done)
    }

    /// Before `auto` chooses a step's tree: a draft model that owes more than
    /// [`MERGED_CATCH_UP_MAX`] tokens (its prefill put off, or plain steps in a batch) catches
    /// up in a forward of its own ([`Self::catch_up_draft`]) when drafting the rest pays
    /// ([`AutoTree::catch_up_pays`] over the `remaining` tokens, beside the batch's `others`),
    /// or alone to explore ([`AutoTree::explores_lagging`]); never on the text's first step
    /// (`first`), so the first token does not wait for it. Sets `auto`'s `draft_lag` (the rows of
    /// the step's first draft forward) and returns whether the draft still owes too many tokens
    /// to draft this step.
    pub(super) fn settle_draft_lag(
        &mut self,
        auto: &mut AutoTree,
        draft_pending: &mut Vec<u32>,
        (first, remaining, others): (bool, usize, &SharedLoad),
        stats: &mut Stats,
    ) -> Result<bool> {
        if self.eagle.is_some() {
            auto.draft_lag = 1;
            return Ok(false);
        }
        if draft_pending.len() > MERGED_CATCH_UP_MAX && !first {
            let explore = others.target_rows == 0 && auto.explores_lagging();
            if explore || auto.catch_up_pays(draft_pending.len() - 1, remaining, others) {
                self.catch_up_draft(draft_pending, stats)?;
            }
        }
        // A draft model runs the few tokens it owes in its first draft forward.
        auto.draft_lag = draft_pending.len().max(1);
        Ok(draft_pending.len() > MERGED_CATCH_UP_MAX)
    }

    /// Runs the tokens a draft model owes before the pending one (`draft_pending` but its last)
    /// through it, as its prompt's prefill would have (a window keeps its sinks and recent
    /// tokens: [`DraftContext::extend_reporting`]), and as a prefill in a batch (one at a time,
    /// reported as the `"draft"` model's progress). Runs nothing when they would not fit the
    /// draft's cache or context: the draft then keeps owing them, and its steps go without
    /// drafts, as before.
    ///
    /// [`DraftContext::extend_reporting`]: crate::decode::draft::window::DraftContext::extend_reporting
    pub(super) fn catch_up_draft(&mut self, draft_pending: &mut Vec<u32>, stats: &mut Stats) -> Result<()> {
        let (Some(d), Some(cache)) = (self.draft, self.draft_cache.as_mut()) else { return Ok(()) };
        let owed = draft_pending.len().saturating_sub(1);
        if owed == 0 {
            return Ok(());
        }
        let end = cache.len() + self.draft_context.skipped() + owed;
        let rows_after = match self.draft_context.window() {
            Some(w) => (cache.len() + owed).min(w.max_rows()),
            None => cache.len() + owed,
        };
        // Room for the pending token and a tree after it, in positions and in rows.
        if end + 2 > d.config().context_length || rows_after + 2 > cache.capacity() {
            return Ok(());
        }
        let _prefilling = crate::model::Prefilling::enter();
        let report = &mut self.prefill_progress;
        let mut progress = |done, total| tell(report, "draft", done, total, true);
        let tokens = for_draft(&draft_pending[..owed], d.config().vocab_size);
        let ran = self.draft_context.extend_reporting(d, cache, &tokens, &mut progress)?;
        stats.draft_catch_up_tokens += ran;
        draft_pending.drain(..owed);
        Ok(())
    }
}

/// Tokens a draft model may owe and still run them in its first draft forward of a step, with
/// the step's root (`auto` counts them in that forward's cost). More run first in a forward of
/// their own (chunked, windowed) when that pays ([`AutoTree::catch_up_pays`]), never before a
/// text's first token; until then the steps go without the draft model.
const MERGED_CATCH_UP_MAX: usize = 16;

/// What [`Generator::prefill_prompt`] did.
pub(super) struct Prefilled {
    /// Prompt tokens whose target rows were kept from the last text.
    pub reused: usize,
    /// Prompt tokens the draft model ran (0 without one).
    pub draft_prefill_tokens: usize,
    /// The prompt's first tokens that the draft model's cache covers (all but the pending
    /// token when it drafts this text; 0 when it does not). The rest it owes the first step.
    pub draft_ran: usize,
}

/// Tells `report`, when there is one, that `model` has run `done` of its `total` prompt tokens.
fn tell(
    report: &mut Option<Box<dyn FnMut(PrefillProgress) + Send>>,
    model: &'static str,
    done: usize,
    total: usize,
    catch_up: bool,
) {
    if let Some(r) = report.as_mut() {
        r(PrefillProgress { model, done, total, catch_up })
    }
}

/// Appends the records of `next[r]`, the token after hidden row `r`, for every row of `hidden`,
/// computing the output layer 64 rows at a time.
fn score_rows(
    target: &DecoderModel,
    hidden: &candle_core::Tensor,
    next: &[u32],
    top: usize,
    out: &mut Vec<TokenLogprobs>,
) -> Result<()> {
    const ROWS: usize = 64;
    let rows = hidden.dim(0)?;
    for start in (0..rows).step_by(ROWS) {
        let len = ROWS.min(rows - start);
        let logits = target.logits(&hidden.narrow(0, start, len)?)?.to_vec2::<f32>()?;
        for (row, &token) in logits.iter().zip(&next[start..start + len]) {
            record_logprobs(Some(top), row, token, out)?;
        }
    }
    Ok(())
}
