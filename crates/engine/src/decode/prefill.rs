//! A prompt's prefill for [`Generator`]: the prefix kept from the last text, the target's
//! forward over the rest but the last token, the prompt's log-probabilities, and what each
//! draft source needs before the first step (the EAGLE head's features, the n-gram index, the
//! draft model's cache or window).

use super::{for_draft, record_logprobs, Generator};
use crate::decode::draft::ngram::NgramConfig;
use crate::decode::logprobs::TokenLogprobs;
use crate::model::DecoderModel;
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
}

impl Generator<'_> {
    /// Runs every token of `prompt` but the last (the pending token) through the target, after
    /// the prefix kept from the last text ([`Self::set_prefix_reuse`]), and readies the draft
    /// sources: the EAGLE head, the n-gram index (`ngram`), and the draft model's cache, which
    /// sees the prompt only when `speculative` and not `ngram_only`, and only when it fits the
    /// draft's context: a longer prompt goes without drafts from it (`draft_fits` then refuses
    /// every step, since the draft has no positions past its context length).
    pub(super) fn prefill_prompt(
        &mut self,
        prompt: &[u32],
        speculative: bool,
        ngram: Option<NgramConfig>,
        ngram_only: bool,
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
            let mut progress = |done| tell(report, "target", done, total);
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
            let report = &mut self.prefill_progress;
            let mut progress = |done, total| tell(report, "draft", done, total);
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
}

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
fn tell(report: &mut Option<Box<dyn FnMut(PrefillProgress) + Send>>, model: &'static str, done: usize, total: usize) {
    if let Some(r) = report.as_mut() {
        r(PrefillProgress { model, done, total })
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
