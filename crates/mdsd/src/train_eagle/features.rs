//! `train-eagle`'s second stage: the target's features of every text, in a store that a later
//! run resumes, a prompt's answers one after the other so that its tokens run once.

use super::{other_data_advice, progress_line, ProgressLog};
use anyhow::{bail, Context};
use engine::train::data::{self, Conversation};
use engine::train::features::FeatureStore;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::Path;

/// The texts whose features are stored, in the store's order: the fixed texts, then each
/// self-answer prompt's greedy answer followed by its sampled answers. A prompt's texts are
/// adjacent so that the target runs the prompt once for all of them
/// ([`FeatureStore::append`] reuses the prefix a text shares with the one before it; the
/// prompts are over half of the sampled texts' tokens:
/// docs/results/README.md#const-train-prompt-sharing). `sampled` is prompt by prompt
/// (`sampled[i * samples + s]` is sample `s` of prompt `i` of the `n` greedy answers).
///
/// Also returns the orders that folders of earlier runs hold, as indices into the texts, so
/// that such a folder resumes in its own order ([`super::earlier_orders`], a prompt's greedy
/// answer its first text): a run with `k` samples a prompt (`k` from 0), the added samples then
/// stored prompt by prompt after all of those; and earlier versions' (the greedy answers, then
/// the sampled ones sample by sample).
pub(super) fn feature_texts(
    fixed: Vec<Conversation>,
    greedy: Vec<Conversation>,
    sampled: Vec<Conversation>,
) -> (Vec<Conversation>, Vec<Vec<usize>>) {
    let (f, n) = (fixed.len(), greedy.len());
    if sampled.is_empty() || n == 0 {
        return ([fixed, greedy, sampled].concat(), Vec::new());
    }
    assert_eq!(sampled.len() % n, 0, "every sample answers every prompt");
    let samples = sampled.len() / n;
    let mut per_prompt: Vec<Vec<Conversation>> = greedy.into_iter().map(|g| vec![g]).collect();
    for (k, c) in sampled.into_iter().enumerate() {
        per_prompt[k / samples].push(c);
    }
    // A prompt's greedy answer is its first text; the fixed texts come first in every order.
    let earlier = (super::earlier_orders(n, samples + 1).into_iter())
        .map(|order| (0..f).chain(order.into_iter().map(|k| f + k)).collect())
        .collect();
    (fixed.into_iter().chain(per_prompt.into_iter().flatten()).collect(), earlier)
}

/// How [`features`] treats its texts and folder.
#[derive(Clone, Copy)]
pub(super) struct FeatureSettings {
    /// Texts are cut to this many tokens.
    pub max_len: usize,
    /// A `--reuse` folder: read a finished store, compute nothing.
    pub read_only: bool,
}

/// The feature store in `dir` with every text of `texts` (tokenized, cut to
/// `how.max_len`) computed; texts already stored are skipped. The store holds the texts in
/// their order, or in the first of `earlier_orders` (indices into `texts`, an earlier run's:
/// [`feature_texts`]) that its stored texts follow.
pub(super) fn features(
    target: &engine::model::DecoderModel,
    tok: &engine::tokenizer::TextTokenizer,
    texts: &[Conversation],
    earlier_orders: &[Vec<usize>],
    how: FeatureSettings,
    dir: &Path,
    what: &str,
) -> anyhow::Result<FeatureStore> {
    let (hidden, read_only) = (target.config().hidden_size, how.read_only);
    let mut tokenized = Vec::with_capacity(texts.len());
    for c in texts {
        let skip = c.answer.trim().is_empty();
        tokenized.push(if skip { None } else { data::tokenize(tok, c, how.max_len)? });
    }
    let mut store = if read_only {
        FeatureStore::open_read_only(dir, hidden).context("--reuse reads a finished run's folder")?
    } else {
        FeatureStore::open(dir, hidden)?
    };
    let in_order = |order: &mut dyn Iterator<Item = usize>| -> Vec<&data::TokenizedConversation> {
        order.filter_map(|i| tokenized[i].as_ref()).collect()
    };
    let stored = store.sequences();
    let holds_prefix_of = |list: &[&data::TokenizedConversation]| {
        stored.len() <= list.len() && stored.iter().zip(list).all(|(s, t)| s.tokens == t.tokens)
    };
    let grouped = in_order(&mut (0..texts.len()));
    let earlier =
        earlier_orders.iter().map(|order| in_order(&mut order.iter().copied())).find(|list| holds_prefix_of(list));
    let tokenized = match earlier {
        _ if holds_prefix_of(&grouped) => grouped,
        Some(earlier) => {
            eprintln!("mdsd: {} holds its texts in the order of an earlier run; kept", dir.display());
            earlier
        }
        None => bail!(
            "{}: its features are of other texts than these settings give (or of more samples of each prompt: a folder's --self-answer-samples can grow, not shrink); {}",
            dir.display(),
            other_data_advice(read_only)
        ),
    };
    let have = store.sequences().len();
    if have == tokenized.len() {
        return Ok(store);
    }
    if read_only {
        bail!(
            "{}: holds the features of {have} of the {} texts these settings give (--reuse reads a finished run's folder)",
            dir.display(),
            tokenized.len()
        );
    }
    let total: usize = tokenized[have..].iter().map(|t| t.tokens.len()).sum();
    let bar = ProgressBar::new(total as u64).with_style(
        ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} tokens, {per_sec}, {eta} left")
            .expect("a valid template"),
    );
    bar.set_message(what.to_string());
    let mut cache = target.new_cache(tokenized.iter().map(|t| t.tokens.len()).max().unwrap_or(1))?;
    let started = std::time::Instant::now();
    let mut run = 0;
    let progress = ProgressLog::new();
    for t in &tokenized[have..] {
        run += store.append(target, t, &mut cache)?;
        bar.inc(t.tokens.len() as u64);
        progress.tick(&bar, || progress_line(&format!("{what} -> {}", dir.display()), &bar, "tokens", 0));
    }
    bar.finish_and_clear();
    eprintln!(
        "mdsd: {what}: the target ran {run} of {total} tokens in {:.0} s (the others are prefixes of the text before)",
        started.elapsed().as_secs_f64()
    );
    Ok(store)
}
