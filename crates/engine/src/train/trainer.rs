//! The EAGLE-1 training loop ([`Trainer`]): batches of stored sequences
//! ([`super::features::FeatureStore`]), EAGLE-1's objective, AdamW with warm-up and cosine
//! decay, a validation split and a held-out evaluation set scored every epoch, checkpoints that
//! resume where a run stopped, a JSON-lines log and a time budget.
//!
//! **Objective** (EAGLE-1, `main.py`): for the entries whose next token is in the answer (with
//! `prompt_entries`, also those of the prompt after the prefix all texts share),
//! `L = w_v · SmoothL1(g_j, f_{j+1}) + w_p · CE(p_{j+1}, q_j)`, the regression averaged over the
//! hidden size and the entries, `p_{j+1} = softmax(lm_head(f_{j+1}))` the target's distribution
//! of `x_{j+2}` (soft labels), `q_j = softmax(lm_head(g_j))` the head's, both through the
//! target's frozen output layer cut to its first `draft_vocab` rows (as `--draft-vocab` runs
//! it), `w_v = 1`, `w_p = 0.1`. The input features get uniform noise `U(-a/2, a/2)` (the paper's
//! `U(-0.1, 0.1)` at `a = 0.2`). Top-1 accuracy is the fraction of entries where the head's
//! most probable token is the target's (`acc` over the cut; `acc_full` against the target's
//! whole vocabulary, which the head can only match inside the cut).
//!
//! **Unrolled steps** (`unroll > 1`, EAGLE-3's training-time test, HASS): the head also drafts
//! `unroll` tokens deep from each entry, fed its own outputs as at inference
//! ([`TrainableHead::forward_unrolled`]); step `s` has the same targets as step 1 at its
//! entries, and the loss is `sum_s d^(s-1) L_s / sum_s d^(s-1)` (`d`: `unroll_decay`).
//! Evaluations score `max(unroll, 3)` steps: `acc_steps[s-1]` is step `s`'s top-1 accuracy over
//! the entries that have a step `s`, the head fed the true tokens and its own features: a chain's
//! depth-`s` acceptance given that its drafts above were accepted, except that it averages over
//! all entries, not only those where the shallower drafts matched.

use super::features::{FeatureStore, StoredSequence};
use super::head::{save_safetensors, write_atomically, TrainableHead};
use super::optim::{AdamW, AdamWConfig};
use crate::model::{DecoderModel, Linear};
use crate::{file_error, Result};
use candle_core::{DType, Device, Tensor, D};
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The training settings.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    pub epochs: usize,
    /// Peak learning rate (after warm-up).
    pub lr: f64,
    pub warmup_steps: usize,
    /// A batch takes sequences until it holds at least this many trained entries.
    pub batch_rows: usize,
    /// Width `a` of the uniform noise on input features.
    pub noise: f32,
    pub regression_weight: f64,
    pub token_weight: f64,
    pub seed: u64,
    /// Training stops (with a checkpoint) once this many seconds of training, summed over
    /// resumed runs, have passed.
    pub max_seconds: f64,
    /// This run stops (with a checkpoint) after this many steps; a later run resumes.
    pub max_steps: Option<u64>,
    /// A checkpoint every this many steps (and at each epoch's end).
    pub checkpoint_every: u64,
    /// Rows of the target's output layer the losses use (its first token ids; 0: all).
    pub draft_vocab: usize,
    /// Every `val_every`-th stored sequence is held out as the validation split.
    pub val_every: usize,
    /// Steps the head drafts from each entry in training (1: EAGLE-1's objective).
    pub unroll: usize,
    /// Weight ratio of step `s + 1`'s loss to step `s`'s.
    pub unroll_decay: f64,
    /// Score the validation split and the evaluation set before the first step (a head
    /// trained further starts from a measured point).
    pub eval_first: bool,
    /// Train on the prompts' entries too, not only the answers': every entry after the prefix
    /// that all stored texts share (the chat template's system turn). Their labels are the
    /// target's distributions there, as good as an answer's, and their features are already
    /// stored. Evaluations score answer entries either way.
    pub prompt_entries: bool,
    pub adamw: AdamWConfig,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            epochs: 8,
            lr: 3e-4,
            warmup_steps: 30,
            batch_rows: 1024,
            noise: 0.2,
            regression_weight: 1.0,
            token_weight: 0.1,
            seed: 0,
            max_seconds: 3.0 * 3600.0,
            max_steps: None,
            checkpoint_every: 20,
            draft_vocab: 32768,
            val_every: 20,
            unroll: 1,
            unroll_decay: 0.8,
            eval_first: false,
            prompt_entries: false,
            adamw: AdamWConfig::default(),
        }
    }
}

/// Where a run stands (saved with each checkpoint).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainState {
    pub epoch: usize,
    /// Batches of `epoch` already trained.
    pub batch_in_epoch: usize,
    pub step: u64,
    /// Training seconds so far, over all runs.
    pub seconds: f64,
}

/// Losses and accuracy over some entries.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Scores {
    pub loss: f64,
    pub regression: f64,
    pub token: f64,
    pub acc: f64,
    /// Accuracy against the target's most probable token over its whole vocabulary (set in
    /// evaluations).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acc_full: Option<f64>,
    /// Top-1 accuracy of each unrolled step (step 1's is `acc`); empty for one step.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acc_steps: Vec<f64>,
    pub rows: usize,
}

/// What the loop reports as it runs (the same lines go to `train_log.jsonl`).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TrainEvent {
    Step {
        epoch: usize,
        step: u64,
        batch: usize,
        batches: usize,
        lr: f64,
        grad_norm: f64,
        seconds: f64,
        scores: Scores,
    },
    Eval {
        epoch: usize,
        step: u64,
        split: String,
        scores: Scores,
    },
    Checkpoint {
        step: u64,
        path: PathBuf,
    },
    Stopped {
        step: u64,
        seconds: f64,
        reason: String,
    },
}

/// A training run in folder `out` (see the module docs).
pub struct Trainer<'a> {
    target: &'a DecoderModel,
    head: TrainableHead,
    optimizer: AdamW,
    config: TrainConfig,
    state: TrainState,
    /// The output layer's first `draft_vocab` rows, as our kernels run them (soft labels).
    lm_cut: Linear,
    /// The same rows dense, `[draft_vocab, hidden]` f32 (the head's differentiable logits).
    lm_dense: Tensor,
    out: PathBuf,
    device: Device,
}

/// A batch through the head: each step's outputs (`[rows_s, hidden]`), step 1's regression
/// targets `f_{j+1}` and, for each later step, which of step 1's rows its rows are (their
/// targets).
struct Outputs {
    g: Vec<Tensor>,
    next: Tensor,
    rows_of: Vec<Vec<u32>>,
}

/// A sequence's part of a batch: its index in the store and its entries `from..n`.
struct Item {
    seq: usize,
    from: usize,
    n: usize,
}

impl<'a> Trainer<'a> {
    /// A run for `target` writing into `out`: resumes from `out/checkpoint` when one is there
    /// (the head's shape must match), else starts from `head` (moved to the target's device,
    /// where the run trains: the CPU, or a GPU for a target loaded on one).
    pub fn new(target: &'a DecoderModel, head: TrainableHead, config: TrainConfig, out: &Path) -> Result<Self> {
        if config.unroll == 0 || !(config.unroll_decay > 0.0 && config.unroll_decay.is_finite()) {
            return Err(file_error(
                out,
                format!("unroll {} and unroll_decay {}: 1 or more, and positive", config.unroll, config.unroll_decay),
            ));
        }
        let device = target.device().clone();
        let vocab = match config.draft_vocab {
            0 => target.config().vocab_size,
            rows => rows.min(target.config().vocab_size),
        };
        let lm_cut = target.output_layer_rows(vocab)?;
        let lm_dense = dense_rows(&lm_cut, target.config().hidden_size, vocab, target.dtype(), &device)?;
        let head = head.to_device(&device)?;
        let ckpt = out.join("checkpoint");
        let (head, optimizer, state) = if ckpt.join("state.json").is_file() {
            let state_path = ckpt.join("state.json");
            let text = std::fs::read_to_string(&state_path).map_err(|e| file_error(&state_path, e.to_string()))?;
            let state: TrainState = serde_json::from_str(&text)
                .map_err(|e| file_error(&state_path, format!("not a training state: {e}")))?;
            let shape = head.shape().clone();
            let head = TrainableHead::load(shape, &ckpt.join("head.safetensors"), &device)
                .map_err(|e| file_error(&ckpt, format!("a checkpoint of another head (or a damaged one): {e}")))?;
            let opt_state = candle_core::safetensors::load(ckpt.join("optimizer.safetensors"), &device)?;
            (head, AdamW::from_state(config.adamw, opt_state)?, state)
        } else {
            (head, AdamW::new(config.adamw), TrainState::default())
        };
        Ok(Self { target, head, optimizer, config, state, lm_cut, lm_dense, out: out.to_path_buf(), device })
    }

    pub fn state(&self) -> &TrainState {
        &self.state
    }

    pub fn head(&self) -> &TrainableHead {
        &self.head
    }

    /// The training and validation sequences of `store` (indices): every `val_every`-th is
    /// held out; a store with fewer (but two or more) holds out its last.
    pub fn split(&self, store: &FeatureStore) -> (Vec<usize>, Vec<usize>) {
        let (n, every) = (store.sequences().len(), self.config.val_every.max(2));
        if (2..every).contains(&n) {
            return ((0..n - 1).collect(), vec![n - 1]);
        }
        (0..n).partition(|i| i % every != every - 1)
    }

    /// The prefix that training skips in every sequence with `prompt_entries` (see
    /// `first_entry`); `None`: training starts at the answers.
    fn trained_after(&self, store: &FeatureStore) -> Option<usize> {
        self.config.prompt_entries.then(|| store.shared_prefix())
    }

    /// The entries an epoch trains on: those of the training split from `first_entry` on
    /// (the answers', or with `prompt_entries` the prompts' too).
    pub fn entries_per_epoch(&self, store: &FeatureStore) -> usize {
        let (train, _) = self.split(store);
        group(store, &train, usize::MAX, self.trained_after(store))
            .iter()
            .flatten()
            .map(|item| item.n - item.from)
            .sum()
    }

    /// The batches of one epoch: the training sequences shuffled (seeded by the seed and the
    /// epoch), taken in order until a batch holds `batch_rows` trained entries (the answers',
    /// or with `prompt_entries` the prompts' too).
    fn batches(&self, store: &FeatureStore, train: &[usize], epoch: usize) -> Vec<Vec<Item>> {
        let mut order = train.to_vec();
        let mut rng =
            rand::rngs::StdRng::seed_from_u64(self.config.seed ^ (epoch as u64 + 1).wrapping_mul(0x9E37_79B9));
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        group(store, &order, self.config.batch_rows, self.trained_after(store))
    }

    fn lr_at(&self, step: u64, total: u64) -> f64 {
        let (peak, warm) = (self.config.lr, self.config.warmup_steps as u64);
        if step < warm {
            return peak * (step + 1) as f64 / warm as f64;
        }
        let progress = (step - warm) as f64 / (total.saturating_sub(warm)).max(1) as f64;
        // Cosine from the peak down to a tenth of it.
        peak * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * progress.min(1.0)).cos()))
    }

    /// A batch through the head, `steps` deep ([`Outputs`]).
    fn outputs(
        &self,
        store: &mut FeatureStore,
        items: &[Item],
        noise_seed: Option<u64>,
        steps: usize,
    ) -> Result<Outputs> {
        let h = self.target.config().hidden_size;
        let mut rng = noise_seed.map(rand::rngs::StdRng::seed_from_u64);
        let mut gs: Vec<Vec<Tensor>> = vec![Vec::new(); steps];
        let mut rows_of: Vec<Vec<u32>> = vec![Vec::new(); steps];
        let mut next = Vec::new();
        let mut first_row = 0u32;
        for item in items {
            let seq = store.sequences()[item.seq].clone();
            let rows = store.rows(seq.first_row, item.n + 1)?;
            let mut input = rows[..item.n * h].to_vec();
            if let Some(rng) = rng.as_mut() {
                let a = self.config.noise;
                for v in &mut input {
                    *v += a * (rng.random::<f32>() - 0.5);
                }
            }
            let features = Tensor::from_vec(input, (item.n, h), &self.device)?;
            let embeds = self.target.embedding().lookup(&seq.tokens[1..=item.n], &self.device)?.to_dtype(DType::F32)?;
            let m = item.n - item.from;
            for (s, g) in self.head.forward_unrolled(&embeds, &features, item.from, steps)?.into_iter().enumerate() {
                // Step s + 1's rows are entries from + s..n: step 1's rows s..m of this item.
                rows_of[s].extend(first_row + s as u32..first_row + m as u32);
                gs[s].push(g);
            }
            next.push(Tensor::from_vec(rows[(item.from + 1) * h..(item.n + 1) * h].to_vec(), (m, h), &self.device)?);
            first_row += m as u32;
        }
        let g = gs
            .into_iter()
            .filter(|g| !g.is_empty())
            .map(|g| Tensor::cat(&g, 0))
            .collect::<candle_core::Result<Vec<_>>>()?;
        rows_of.truncate(g.len());
        Ok(Outputs { g, next: Tensor::cat(&next, 0)?, rows_of })
    }

    /// The objective on a batch's outputs (see the module docs): `(loss, scores, hits)`, the
    /// loss over the first `unroll` steps, the scores' regression, token loss and accuracy step
    /// 1's, `acc_steps` every step's when there are several; `hits[s]`: step `s + 1`'s rows
    /// whose top token is the target's.
    fn objective(&self, out: &Outputs, full: bool) -> Result<(Tensor, Scores, Vec<usize>)> {
        let next = &out.next;
        let rows = next.dim(0)?;
        let vocab = self.lm_dense.dim(0)?;
        // The target's layers take its activation dtype (bf16 for Hugging Face weights on CUDA).
        let next_as_target = next.to_dtype(self.target.dtype())?;
        let target_logits = crate::model::output_logits(&self.lm_cut, &next_as_target)?.narrow(D::Minus1, 0, vocab)?;
        let p = candle_nn::ops::softmax_last_dim(&target_logits.contiguous()?)?.detach();
        let target_top = target_logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
        let (mut loss, mut weights) = (None, 0.0);
        let mut step1 = None;
        let mut hits = Vec::with_capacity(out.g.len());
        for (s, g) in out.g.iter().enumerate() {
            let picked = (s > 0).then(|| Tensor::from_slice(&out.rows_of[s], out.rows_of[s].len(), &self.device));
            let picked = picked.transpose()?;
            let pick = |t: &Tensor| match &picked {
                Some(idx) => t.index_select(idx, 0),
                None => Ok(t.clone()),
            };
            let (next, p) = (pick(next)?, pick(&p)?);
            let diff = (g - next)?;
            let a = diff.abs()?;
            let small = a.minimum(1.0)?;
            // SmoothL1 with beta 1: 0.5 d^2 below 1, |d| - 0.5 above; written as 0.5 m^2 + (|d| - m).
            let regression = ((small.sqr()? * 0.5)? + (a - &small)?)?.mean_all()?;
            let logits = super::frozen::frozen_product(g, &self.lm_dense)?;
            let token = super::soft_ce::soft_cross_entropy(&logits, &p)?.mean_all()?;
            let step_loss = ((&regression * self.config.regression_weight)? + (&token * self.config.token_weight)?)?;
            let head_top = logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
            hits.push(head_top.iter().zip(&out.rows_of[s]).filter(|(a, &r)| **a == target_top[r as usize]).count());
            if s < self.config.unroll.max(1) {
                let w = self.config.unroll_decay.powi(s as i32);
                weights += w;
                let weighted = (step_loss * w)?;
                loss = Some(match loss {
                    None => weighted,
                    Some(l) => (l + weighted)?,
                });
            }
            if s == 0 {
                step1 = Some((regression, token, head_top));
            }
        }
        let (regression, token, head_top) = step1.ok_or_else(|| candle_core::Error::Msg("no outputs".into()))?;
        let loss = (loss.expect("step 1 is always trained") / weights)?;
        let acc_full = if full {
            let top = self.target.logits(&next_as_target)?.argmax(D::Minus1)?.to_vec1::<u32>()?;
            Some(head_top.iter().zip(&top).filter(|(a, b)| a == b).count() as f64 / rows.max(1) as f64)
        } else {
            None
        };
        let acc_steps: Vec<f64> =
            hits.iter().zip(&out.rows_of).map(|(&h, rows)| h as f64 / rows.len().max(1) as f64).collect();
        let scores = Scores {
            loss: loss.to_scalar::<f32>()? as f64,
            regression: regression.to_scalar::<f32>()? as f64,
            token: token.to_scalar::<f32>()? as f64,
            acc: acc_steps[0],
            acc_full,
            acc_steps: if acc_steps.len() > 1 { acc_steps } else { Vec::new() },
            rows,
        };
        Ok((loss, scores, hits))
    }

    /// Scores the head (no noise, no update) on sequences `seqs` of `store`, `max(unroll, 3)`
    /// steps deep.
    pub fn evaluate(&self, store: &mut FeatureStore, seqs: &[usize]) -> Result<Scores> {
        let mut total = Scores { acc_full: Some(0.0), ..Default::default() };
        let steps = self.config.unroll.max(3);
        let (mut step_hits, mut step_rows) = (vec![0usize; steps], vec![0usize; steps]);
        for items in group(store, seqs, self.config.batch_rows, None) {
            let mut out = self.outputs(store, &items, None, steps)?;
            out.g = out.g.iter().map(Tensor::detach).collect();
            let (_, s, hits) = self.objective(&out, true)?;
            for (k, h) in hits.into_iter().enumerate() {
                step_hits[k] += h;
                step_rows[k] += out.rows_of[k].len();
            }
            let w = s.rows as f64;
            total.loss += s.loss * w;
            total.regression += s.regression * w;
            total.token += s.token * w;
            total.acc += s.acc * w;
            total.acc_full = Some(total.acc_full.unwrap_or(0.0) + s.acc_full.unwrap_or(0.0) * w);
            total.rows += s.rows;
        }
        let n = total.rows.max(1) as f64;
        for v in [&mut total.loss, &mut total.regression, &mut total.token, &mut total.acc] {
            *v /= n;
        }
        total.acc_full = total.acc_full.map(|a| a / n);
        total.acc_steps =
            step_hits.iter().zip(&step_rows).filter(|(_, &r)| r > 0).map(|(&h, &r)| h as f64 / r as f64).collect();
        Ok(total)
    }

    /// Trains on `store` until the epochs are done or the time budget is spent, scoring the
    /// validation split and `eval` (a held-out store, e.g. MT-Bench answers) after each epoch.
    /// Every event goes to `on_event` and to `out/train_log.jsonl`. Ends with a checkpoint.
    pub fn train(
        &mut self,
        store: &mut FeatureStore,
        mut eval: Option<&mut FeatureStore>,
        on_event: &mut dyn FnMut(&TrainEvent),
    ) -> Result<()> {
        let (train, val) = self.split(store);
        if train.is_empty() {
            return Err(file_error(&self.out, "no training sequences in the feature store"));
        }
        let per_epoch = self.batches(store, &train, 0).len();
        let total = (per_epoch * self.config.epochs) as u64;
        let log_path = self.out.join("train_log.jsonl");
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| file_error(&log_path, format!("cannot open: {e}")))?;
        let mut emit = |e: TrainEvent, on_event: &mut dyn FnMut(&TrainEvent)| -> Result<()> {
            use std::io::Write;
            writeln!(log, "{}", serde_json::to_string(&e).expect("JSON of a value"))
                .map_err(|err| file_error(&log_path, format!("cannot write: {err}")))?;
            on_event(&e);
            Ok(())
        };
        let started = Instant::now();
        let seconds_before = self.state.seconds;
        let mut steps_this_run = 0u64;
        if self.config.eval_first && self.state.step == 0 {
            for e in self.evaluations(store, &val, eval.as_deref_mut(), 0)? {
                emit(e, on_event)?;
            }
        }
        while self.state.epoch < self.config.epochs {
            let epoch = self.state.epoch;
            let batches = self.batches(store, &train, epoch);
            for (b, items) in batches.iter().enumerate().skip(self.state.batch_in_epoch) {
                let elapsed = seconds_before + started.elapsed().as_secs_f64();
                let out_of_steps = self.config.max_steps.is_some_and(|m| steps_this_run >= m);
                if elapsed >= self.config.max_seconds || out_of_steps {
                    self.state.seconds = elapsed;
                    let path = self.checkpoint()?;
                    emit(TrainEvent::Checkpoint { step: self.state.step, path }, on_event)?;
                    let reason = if out_of_steps {
                        format!("{steps_this_run} steps done (--max-steps)")
                    } else {
                        format!("the time budget of {:.0} s is spent", self.config.max_seconds)
                    };
                    emit(TrainEvent::Stopped { step: self.state.step, seconds: elapsed, reason }, on_event)?;
                    return Ok(());
                }
                let noise_seed = self.config.seed ^ self.state.step.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0xA5A5;
                let out = self.outputs(store, items, Some(noise_seed), self.config.unroll.max(1))?;
                let (loss, scores, _) = self.objective(&out, false)?;
                let grads = loss.backward()?;
                let lr = self.lr_at(self.state.step, total);
                let grad_norm = self.optimizer.step(self.head.vars(), &grads, lr)?;
                self.state.step += 1;
                steps_this_run += 1;
                self.state.batch_in_epoch = b + 1;
                self.state.seconds = seconds_before + started.elapsed().as_secs_f64();
                let step = self.state.step;
                let seconds = self.state.seconds;
                emit(
                    TrainEvent::Step {
                        epoch,
                        step,
                        batch: b + 1,
                        batches: batches.len(),
                        lr,
                        grad_norm,
                        seconds,
                        scores,
                    },
                    on_event,
                )?;
                if step.is_multiple_of(self.config.checkpoint_every.max(1)) {
                    let path = self.checkpoint()?;
                    emit(TrainEvent::Checkpoint { step, path }, on_event)?;
                }
            }
            self.state.epoch += 1;
            self.state.batch_in_epoch = 0;
            for e in self.evaluations(store, &val, eval.as_deref_mut(), epoch)? {
                emit(e, on_event)?;
            }
            let path = self.checkpoint()?;
            emit(TrainEvent::Checkpoint { step: self.state.step, path }, on_event)?;
        }
        let seconds = self.state.seconds;
        emit(TrainEvent::Stopped { step: self.state.step, seconds, reason: "all epochs done".into() }, on_event)?;
        Ok(())
    }

    /// The validation split's and `eval`'s scores (events of `epoch` at the current step).
    fn evaluations(
        &self,
        store: &mut FeatureStore,
        val: &[usize],
        eval: Option<&mut FeatureStore>,
        epoch: usize,
    ) -> Result<Vec<TrainEvent>> {
        let step = self.state.step;
        let mut events = Vec::new();
        if !val.is_empty() {
            let scores = self.evaluate(store, val)?;
            events.push(TrainEvent::Eval { epoch, step, split: "validation".into(), scores });
        }
        if let Some(eval) = eval.filter(|e| !e.sequences().is_empty()) {
            let all: Vec<usize> = (0..eval.sequences().len()).collect();
            let scores = self.evaluate(eval, &all)?;
            events.push(TrainEvent::Eval { epoch, step, split: "eval".into(), scores });
        }
        Ok(events)
    }

    /// Writes `out/checkpoint` (the head in f32, the optimizer, the state), atomically per file.
    fn checkpoint(&self) -> Result<PathBuf> {
        let dir = self.out.join("checkpoint");
        std::fs::create_dir_all(&dir).map_err(|e| file_error(&dir, format!("cannot create: {e}")))?;
        save_safetensors(&dir.join("head.safetensors"), self.head.tensors().into_iter().collect())?;
        save_safetensors(&dir.join("optimizer.safetensors"), self.optimizer.state()?)?;
        let state = serde_json::to_string_pretty(&self.state).expect("JSON of a value");
        write_atomically(&dir.join("state.json"), state.as_bytes())?;
        Ok(dir)
    }
}

/// The first entry of `s` that a batch holds: its answer's first (`answer_start - 1`: the
/// entry that predicts the answer's second token's feature), or, given the prefix `shared` that
/// all stored texts share, the first entry after it, the prompt's included.
fn first_entry(s: &StoredSequence, shared: Option<usize>) -> usize {
    shared.map_or(s.answer_start, |p| p.min(s.answer_start)).saturating_sub(1)
}

/// Sequences `order` of `store` in batches of at least `rows` entries each (the last may hold
/// fewer), each sequence's from `first_entry` on.
fn group(store: &FeatureStore, order: &[usize], rows: usize, shared: Option<usize>) -> Vec<Vec<Item>> {
    let mut out = Vec::new();
    let (mut batch, mut held) = (Vec::new(), 0);
    for &seq in order {
        let s = &store.sequences()[seq];
        let n = s.tokens.len() - 1;
        let from = first_entry(s, shared).min(n.saturating_sub(1));
        if n == 0 {
            continue;
        }
        held += n - from;
        batch.push(Item { seq, from, n });
        if held >= rows {
            out.push(std::mem::take(&mut batch));
            held = 0;
        }
    }
    if !batch.is_empty() {
        out.push(batch);
    }
    out
}

/// The matrix of an output layer's first `rows` outputs as a dense `[rows, hidden]` f32
/// tensor, read through the layer itself: its product with the identity is `W^T`, whatever
/// layout (quantized, repacked) holds it. One-hot rows are exact in the kernels' 8-bit
/// quantized activations, so this is the dequantized matrix (and exact in bf16 too). `dtype` and
/// `device`: the layer's activations'.
fn dense_rows(layer: &Linear, hidden: usize, rows: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    let eye = Tensor::eye(hidden, dtype, device)?;
    let product = crate::model::output_logits(layer, &eye)?;
    Ok(product.narrow(1, 0, rows)?.t()?.contiguous()?)
}
