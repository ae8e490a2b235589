//! The study's data, as in the paper: the target generates a response to each prompt, then
//! target and draft distributions are read at every response position.
//!
//! The target decodes `batch` prompts together in one KV cache, as a forest: each sequence
//! attends only to its own entries (an additive bias of -inf elsewhere) at its own
//! positions, so one forward serves `batch` sequences and the quantized matmuls run several
//! rows at once. The draft then reads each prompt + response in one teacher-forced forward; an
//! EAGLE head reads the target's features kept from that decoding (its final hidden states at
//! every position of the prompt and the response), so its q at each position is the root-level
//! q of EAGLE's drafting after that text, at no second target pass.

use super::prompts::PromptText;
use super::store::Positions;
use crate::pair::LoadedDraft;
use crate::run_info::{Interrupt, Progress};
use anyhow::Context;
use candle_core::{Device, Tensor};
use engine::load::LoadedModel;
use engine::model::eagle::EagleHead;
use engine::model::{causal_bias, DecoderModel};
use rand::rngs::StdRng;
use rand::SeedableRng;
use samplers::dist::Warp;

/// How responses are generated and what is kept of each position.
#[derive(Debug, Clone)]
pub struct GenerationOptions {
    /// Sampling temperature of the target's responses.
    pub temperature: f64,
    pub max_new_tokens: usize,
    /// Largest logits kept per model at each position (see [`super::store`]).
    pub keep: usize,
    /// Sequences decoded together.
    pub batch: usize,
    /// Long documents are cut (by words) until the prompt fits in this many tokens; other
    /// prompts that do not fit are left out.
    pub max_prompt_tokens: usize,
    pub seed: u64,
    /// Render prompts with the chat template.
    pub chat: bool,
}

/// Token ids of each prompt (`None`: left out, too long), and how many were cut.
pub fn tokenize_prompts(
    model: &LoadedModel,
    prompts: &[PromptText],
    opts: &GenerationOptions,
) -> anyhow::Result<(Vec<Option<Vec<u32>>>, usize)> {
    let tok = &model.tokenizer;
    let render = |text: &str| -> anyhow::Result<Vec<u32>> {
        let text = if opts.chat { tok.apply_chat_template(text, None)? } else { text.to_string() };
        Ok(tok.encode(&text)?)
    };
    let mut cut = 0;
    let mut out = Vec::with_capacity(prompts.len());
    for p in prompts {
        let mut ids = render(&p.with_words(usize::MAX))?;
        let mut words = p.body_words();
        let mut tries = 0;
        while ids.len() > opts.max_prompt_tokens && words > 0 && tries < 20 {
            let ratio = opts.max_prompt_tokens as f64 / ids.len() as f64;
            words = ((words as f64 * ratio * 0.97) as usize).min(words - 1);
            ids = render(&p.with_words(words))?;
            tries += 1;
        }
        if words < p.body_words() {
            cut += 1;
        }
        out.push((ids.len() <= opts.max_prompt_tokens).then_some(ids));
    }
    Ok((out, cut))
}

/// A sequence of the forest.
struct Sequence {
    index: u32,
    prompt: Vec<u32>,
    response: Vec<u32>,
    /// Target logits before each response token (full vocabulary).
    target_rows: Vec<Vec<f32>>,
    /// The target's final hidden states of the prompt and of each response token fed back
    /// (`[rows, hidden]` pieces in position order), kept only for an EAGLE head.
    features: Vec<Tensor>,
    rng: StdRng,
    done: bool,
}

/// `[rows, cache + rows]` bias: row r sees the cache entries owned by `owner_of_row[r]`, and
/// the new columns `c` with `visible(r, c)`.
fn forest_bias(
    owners: &[u32],
    owner_of_row: &[u32],
    visible: impl Fn(usize, usize) -> bool,
    device: &Device,
) -> anyhow::Result<Tensor> {
    let (rows, past) = (owner_of_row.len(), owners.len());
    let cols = past + rows;
    let mut b = vec![f32::NEG_INFINITY; rows * cols];
    for r in 0..rows {
        let row = &mut b[r * cols..(r + 1) * cols];
        for (c, &o) in owners.iter().enumerate() {
            if o == owner_of_row[r] {
                row[c] = 0.0;
            }
        }
        for c in 0..rows {
            if visible(r, c) {
                row[past + c] = 0.0;
            }
        }
    }
    Ok(Tensor::from_vec(b, (rows, cols), device)?)
}

fn logits_rows(model: &DecoderModel, hidden: &Tensor) -> anyhow::Result<Vec<Vec<f32>>> {
    Ok(model.logits(hidden)?.to_vec2::<f32>()?)
}

/// Samples the next token of `s` from `row` and records the row.
fn advance(
    s: &mut Sequence,
    row: Vec<f32>,
    warp: &Warp,
    probs: &mut Vec<f64>,
    is_stop: &dyn Fn(u32) -> bool,
    max_new: usize,
) -> anyhow::Result<()> {
    warp.apply(&row, probs).with_context(|| format!("target logits of prompt {}", s.index))?;
    let t = samplers::dist::sample(probs, &mut s.rng);
    s.target_rows.push(row);
    s.response.push(t);
    if is_stop(t) || s.response.len() >= max_new {
        s.done = true;
    }
    Ok(())
}

/// Indices of the `k` largest values (any order).
fn top_indices(v: &[f32], k: usize, out: &mut Vec<u32>) {
    out.clear();
    out.extend(0..v.len() as u32);
    if k < v.len() {
        out.select_nth_unstable_by(k, |&a, &b| v[b as usize].total_cmp(&v[a as usize]));
        out.truncate(k);
    }
}

fn log_sum_exp(v: &[f32]) -> f64 {
    let m = v.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    m + v.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln()
}

/// Generates the responses of `prompts` and returns every response position's distributions.
/// Stops early (keeping finished prompts) when `interrupt` is set.
pub fn generate_positions(
    target: &LoadedModel,
    draft: &LoadedDraft,
    prompts: &[Option<Vec<u32>>],
    opts: &GenerationOptions,
    meta: serde_json::Value,
    progress: &Progress,
    interrupt: &Interrupt,
) -> anyhow::Result<Positions> {
    let tm = &target.model;
    let device = tm.device().clone();
    let warp = Warp::temperature(opts.temperature);
    let vocab = tm.config().vocab_size;
    let is_stop = |t: u32| target.tokenizer.is_stop(t);
    let mut out = Positions::new(meta);
    let batch = opts.batch.max(1);
    let longest = prompts.iter().flatten().map(Vec::len).max().unwrap_or(0);
    let mut cache = tm.new_cache(batch * (longest + opts.max_new_tokens + 1))?;
    let mut draft_reader = DraftReader::new(draft, tm, longest + opts.max_new_tokens + 1)?;
    let keep_features = draft_reader.reads_features();
    let mut probs = Vec::new();
    let (mut top_t, mut top_d, mut union) = (Vec::new(), Vec::new(), Vec::new());
    let live: Vec<(u32, &Vec<u32>)> =
        prompts.iter().enumerate().filter_map(|(i, p)| p.as_ref().map(|p| (i as u32, p))).collect();
    for chunk in live.chunks(batch) {
        if interrupt.requested() {
            break;
        }
        cache.truncate(0);
        let mut owners: Vec<u32> = Vec::new();
        let mut seqs: Vec<Sequence> = chunk
            .iter()
            .map(|&(index, p)| Sequence {
                index,
                prompt: p.clone(),
                response: Vec::new(),
                target_rows: Vec::new(),
                features: Vec::new(),
                rng: StdRng::seed_from_u64(opts.seed.wrapping_add(index as u64)),
                done: false,
            })
            .collect();
        // Prefill each prompt after the others, blind to them.
        for (k, s) in seqs.iter_mut().enumerate() {
            let n = s.prompt.len();
            let pos: Vec<u32> = (0..n as u32).collect();
            let rows = vec![k as u32; n];
            let bias = forest_bias(&owners, &rows, |r, c| c <= r, &device)?;
            let hidden = tm.forward(&s.prompt, &pos, &bias, &mut cache)?;
            owners.extend_from_slice(&rows);
            if keep_features {
                s.features.push(hidden.clone());
            }
            let row = logits_rows(tm, &hidden.narrow(0, n - 1, 1)?)?.pop().expect("one row");
            advance(s, row, &warp, &mut probs, &is_stop, opts.max_new_tokens)?;
        }
        // Decode all unfinished sequences together, one token each per forward.
        loop {
            let active: Vec<usize> = (0..seqs.len()).filter(|&k| !seqs[k].done).collect();
            if active.is_empty() {
                break;
            }
            let tokens: Vec<u32> = active.iter().map(|&k| *seqs[k].response.last().expect("one token")).collect();
            let pos: Vec<u32> =
                active.iter().map(|&k| (seqs[k].prompt.len() + seqs[k].response.len() - 1) as u32).collect();
            let rows: Vec<u32> = active.iter().map(|&k| k as u32).collect();
            let bias = forest_bias(&owners, &rows, |r, c| r == c, &device)?;
            let hidden = tm.forward(&tokens, &pos, &bias, &mut cache)?;
            owners.extend_from_slice(&rows);
            if keep_features {
                for (i, &k) in active.iter().enumerate() {
                    seqs[k].features.push(hidden.narrow(0, i, 1)?);
                }
            }
            for (row, &k) in logits_rows(tm, &hidden)?.into_iter().zip(&active) {
                advance(&mut seqs[k], row, &warp, &mut probs, &is_stop, opts.max_new_tokens)?;
            }
        }
        // The draft reads prompt + response; its row before response token j is q_j.
        for s in &seqs {
            let mut tokens = s.prompt.clone();
            tokens.extend_from_slice(&s.response[..s.response.len() - 1]);
            let drows = draft_reader.rows(&tokens, s.prompt.len(), s.response.len(), &s.features)?;
            let dvocab = drows.first().map_or(0, Vec::len);
            for (trow, drow) in s.target_rows.iter().zip(&drows) {
                top_indices(trow, opts.keep, &mut top_t);
                top_indices(drow, opts.keep.min(dvocab), &mut top_d);
                union.clear();
                union.extend_from_slice(&top_t);
                union.extend_from_slice(&top_d);
                union.sort_unstable();
                union.dedup();
                let tl: Vec<f32> = union.iter().map(|&i| trow[i as usize]).collect();
                let dl: Vec<f32> = union
                    .iter()
                    .map(|&i| if (i as usize) < dvocab { drow[i as usize] } else { f32::NEG_INFINITY })
                    .collect();
                let kept = |row: &[f32], kept_logits: &[f32]| {
                    let lse = log_sum_exp(row);
                    kept_logits.iter().map(|&l| (l as f64 - lse).exp()).sum::<f64>() as f32
                };
                let masses = (kept(trow, &tl), kept(drow, &dl));
                out.push(s.index, &union, &tl, &dl, masses);
            }
            debug_assert!(drows.iter().all(|d| d.len() <= vocab));
            progress.inc();
        }
    }
    Ok(out)
}

/// Reads q along a text with the draft: a draft model's rows, or an EAGLE head's (from the
/// target's features kept from the decoding), in caches kept across texts.
enum DraftReader<'a> {
    Model { model: &'a DecoderModel, cache: engine::model::kv_cache::KvCache },
    Eagle { head: &'a EagleHead, target: &'a DecoderModel, cache: engine::model::kv_cache::KvCache },
}

impl<'a> DraftReader<'a> {
    fn new(draft: &'a LoadedDraft, target: &'a DecoderModel, capacity: usize) -> anyhow::Result<Self> {
        Ok(match draft {
            LoadedDraft::Model(m) => Self::Model { model: &m.model, cache: m.model.new_cache(capacity)? },
            LoadedDraft::EagleHead(head) => Self::Eagle { head, target, cache: head.new_cache(capacity)? },
        })
    }

    /// Whether [`Self::rows`] needs the target's features of the text.
    fn reads_features(&self) -> bool {
        matches!(self, Self::Eagle { .. })
    }

    /// The draft's logits before each of the `r` response tokens of `tokens` (the prompt of
    /// `prompt_len` tokens, then the response without its last token). `features`: the
    /// target's final hidden states at the positions of `tokens`, in pieces in order (read
    /// only by an EAGLE head).
    fn rows(
        &mut self,
        tokens: &[u32],
        prompt_len: usize,
        r: usize,
        features: &[Tensor],
    ) -> anyhow::Result<Vec<Vec<f32>>> {
        let n = tokens.len();
        match self {
            Self::Model { model, cache } => {
                cache.truncate(0);
                let pos: Vec<u32> = (0..n as u32).collect();
                let bias = causal_bias(0, n, model.dtype(), model.device())?;
                let hidden = model.forward(tokens, &pos, &bias, cache)?;
                logits_rows(model, &hidden.narrow(0, prompt_len - 1, r)?)
            }
            Self::Eagle { head, target, cache } => {
                // Entry e pairs the target's feature at position e with token e + 1; its output
                // gives q for token e + 2. Response token j sits at position prompt_len + j, so
                // its q comes from entry prompt_len + j - 2.
                anyhow::ensure!(prompt_len >= 2, "an EAGLE head needs prompts of at least 2 tokens");
                let features = Tensor::cat(features, 0)?;
                anyhow::ensure!(
                    features.dim(0)? == n,
                    "{} target features kept for a text of {n} tokens",
                    features.dim(0)?
                );
                let m = n - 1;
                cache.truncate(0);
                let pos: Vec<u32> = (0..m as u32).collect();
                let bias = causal_bias(0, m, target.dtype(), target.device())?;
                let out = head.forward(target, &features.narrow(0, 0, m)?, &tokens[1..], &pos, &bias, cache)?;
                Ok(head.logits(target, &out.narrow(0, prompt_len - 2, r)?)?.to_vec2::<f32>()?)
            }
        }
    }
}
