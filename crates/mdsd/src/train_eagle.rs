//! `mdsd train-eagle`: trains an EAGLE-1 draft head for a target mdsd loads and writes it in
//! EAGLE's checkpoint layout (`OUT/head`: `config.json` + `model.safetensors`, what
//! `generate --eagle DIR` reads). Stages, each resumable (an interrupted run continues where
//! it stopped when started again with the same `--out`):
//! 1. the target's own answers (greedy) to Spec-Bench's prompts without MT-Bench's and to
//!    EAGLE's Alpaca prompts (`OUT/self_answers.jsonl`), and to MT-Bench's first turns, the
//!    held-out evaluation (`OUT/eval_answers.jsonl`); optionally more answers to the same
//!    prompts sampled at a temperature (`OUT/sampled_answers_t{T}.jsonl`);
//! 2. the target's features of every text (`OUT/features`, `OUT/eval_features`), f16, a
//!    prompt's answers one after the other so that its tokens run once;
//! 3. training (`engine::train::Trainer`): `OUT/checkpoint`, `OUT/train_log.jsonl`.
//!
//! A run holds `OUT/.lock`: a second run on the same folder is refused.
//!
//! Part of the `mdsd` binary (`main.rs`), with its stages' modules `answers` and `features`;
//! docs/eagle-training.md.

mod answers;
mod features;

use answers::{answers, AnswerSettings, Ask};
use anyhow::{bail, Context};
use clap::Args;
use engine::load::{load, LoadOptions};
use engine::train::data::{self, SourceLimits};
use engine::train::{HeadShape, TrainConfig, TrainEvent, TrainableHead, Trainer};
use features::{feature_texts, features, FeatureSettings};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct TrainEagleArgs {
    /// The target: a .gguf file, a Hugging Face model folder or a hub id (default: the
    /// --pair's target).
    #[arg(long)]
    target: Option<String>,
    /// Model pair (a manifest in models/) whose target gets the head, unless --target is given.
    #[arg(long, default_value = "qwen2.5-coder-1.5b-0.5b")]
    pair: String,
    /// Folder of the model-pair manifests.
    #[arg(long)]
    models_dir: Option<PathBuf>,
    /// Where everything goes (created; a second run with it resumes).
    #[arg(long)]
    out: PathBuf,
    /// Folder of the prompt sets (alpaca_sample.jsonl, cnndm_frank_test.jsonl,
    /// wmt14_deen_test.jsonl, spec_bench_question.jsonl, eagle_alpaca_question.jsonl,
    /// mt_bench_question.jsonl).
    #[arg(long, default_value = "../shared/data")]
    data: PathBuf,
    /// Alpaca items (instruction and output) to train on.
    #[arg(long, default_value_t = 500)]
    alpaca: usize,
    /// CNN/DailyMail articles (summarised by their highlights) to train on.
    #[arg(long, default_value_t = 250)]
    cnndm: usize,
    /// WMT'14 German-English pairs to train on.
    #[arg(long, default_value_t = 1000)]
    wmt14: usize,
    /// Target's own answers: this many Spec-Bench prompts per category (MT-Bench's categories
    /// left out).
    #[arg(long, default_value_t = 25)]
    self_answers_per_category: usize,
    /// Target's own answers: this many more Spec-Bench prompts per category, the ones after
    /// the first --self-answers-per-category, asked after all the other prompts (so a run's
    /// folder grows: its answers and features are kept, these added).
    #[arg(long, default_value_t = 0)]
    self_answers_more_per_category: usize,
    /// Target's own answers: this many of EAGLE's Alpaca prompts.
    #[arg(long, default_value_t = 60)]
    self_answers_alpaca: usize,
    /// Target's own answers: this many of the Alpaca sample's instructions (the same items
    /// whose fixed outputs --alpaca trains on), asked after the prompts above.
    #[arg(long, default_value_t = 0)]
    self_answers_alpaca_sample: usize,
    /// Longest self answer, in tokens.
    #[arg(long, default_value_t = 160)]
    self_answer_tokens: usize,
    /// Target's own answers, sampled: this many more answers to every self-answer prompt above,
    /// each drawn from the target at --self-answer-temperature with a seed of its own (sample
    /// `s` of prompt `i`: `(s + 1) * 2^32 + i`), kept in `sampled_answers_t{T}.jsonl`. Their
    /// features are stored after their prompt's greedy answer's, so that the target runs each
    /// prompt once (a folder written in the order of earlier versions, or with fewer or no
    /// sampled answers, keeps its order and grows). More of the target's own text at no cost in
    /// prompts; the labels are still the target's distributions.
    #[arg(long, default_value_t = 0)]
    self_answer_samples: usize,
    /// Temperature of the sampled answers (--self-answer-samples).
    #[arg(long, default_value_t = 0.7)]
    self_answer_temperature: f64,
    /// MT-Bench first turns answered by the target for the evaluation (never trained on).
    #[arg(long, default_value_t = 80)]
    eval_answers: usize,
    /// Answers generated at once, their forwards batched (each answer is the one it gets alone:
    /// the setting changes only the time).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=64))]
    answer_batch: u16,
    /// Longest evaluation answer, in tokens.
    #[arg(long, default_value_t = 128)]
    eval_answer_tokens: usize,
    /// Texts are cut to this many tokens.
    #[arg(long, default_value_t = 1024)]
    max_len: usize,
    #[arg(long, default_value_t = 8)]
    epochs: usize,
    /// Peak learning rate (AdamW, after warm-up, then cosine decay to a tenth).
    #[arg(long, default_value_t = 3e-4)]
    lr: f64,
    /// Answer tokens per optimizer step.
    #[arg(long, default_value_t = 1024)]
    batch_rows: usize,
    /// Weight of the token loss (cross-entropy against the target's distribution); EAGLE-1's is
    /// 0.1 beside a regression weight of 1.
    #[arg(long, default_value_t = 0.1)]
    token_weight: f64,
    /// The head's MLP width (default: the target's). A narrower head trains and drafts faster
    /// on a CPU.
    #[arg(long)]
    intermediate_size: Option<usize>,
    /// Rows of the target's output layer the token loss uses (its first ids; 0: all), as
    /// `generate --draft-vocab` drafts with them.
    #[arg(long, default_value_t = 32768)]
    draft_vocab: usize,
    /// Steps the head drafts from each answer entry in training, fed its own outputs as at
    /// inference (EAGLE-3's training-time test); 1 is EAGLE-1's objective. Evaluations score
    /// at least 3 steps either way (top-1 per depth).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=8))]
    unroll: u16,
    /// Weight of each unrolled step's loss relative to the step before it.
    #[arg(long, default_value_t = 0.8)]
    unroll_decay: f64,
    /// Train on the prompts' tokens too, not only the answers': every token after the chat
    /// template's system turn that all texts share. The labels are the target's own
    /// distributions there and the features are stored already, so this adds data at no cost
    /// in the target's time (training time grows with it). --batch-rows then counts them too;
    /// the scores on validation and MT-Bench stay answers only.
    #[arg(long)]
    prompt_entries: bool,
    /// Start from this head (a folder `train-eagle` wrote, `config.json` + `model.safetensors`)
    /// instead of random weights; its scores are measured before the first step. Its MLP width
    /// is taken unless --intermediate-size says otherwise.
    #[arg(long)]
    init_head: Option<PathBuf>,
    /// Read the target's answers and features from this folder (a finished run's `--out`,
    /// given the same data flags) instead of `--out`: nothing is generated or computed, none
    /// are added there, and its lock is held while this run reads it. With --init-head, a head
    /// is trained further on its own data.
    #[arg(long)]
    reuse: Option<PathBuf>,
    /// Seed of the initial weights, the data order and the noise.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Training time budget in hours (summed over resumed runs); the run then stops with a
    /// checkpoint and writes the head.
    #[arg(long, default_value_t = 3.0)]
    max_hours: f64,
    /// Stop this run after this many optimizer steps (with a checkpoint; a later run resumes).
    #[arg(long)]
    max_steps: Option<u64>,
    /// Where the target runs and the head trains: `cpu`, or `cuda` / `cuda:N` in a build with
    /// `--features cuda` (the run is deterministic for its seed on the CPU only).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// The stored head's weight type.
    #[arg(long, value_parser = ["f16", "bf16", "f32"], default_value = "f16")]
    dtype: String,
}

pub fn train_eagle(args: TrainEagleArgs) -> anyhow::Result<()> {
    if !(args.max_hours > 0.0
        && args.lr > 0.0
        && args.lr.is_finite()
        && args.unroll_decay > 0.0
        && args.unroll_decay.is_finite())
        || args.epochs == 0
        || args.batch_rows == 0
    {
        bail!("--max-hours, --lr, --unroll-decay, --epochs and --batch-rows must be positive");
    }
    if !(args.self_answer_temperature > 0.0 && args.self_answer_temperature.is_finite()) {
        bail!("--self-answer-temperature must be positive (the greedy answers are the self answers)");
    }
    let path = crate::models::target_path(args.target.as_deref(), &args.pair, args.models_dir.as_deref())?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let _lock = lock_out(&args.out, Lock::Exclusive)?;
    // The folder the answers and features are in; a run writing it would change them under us.
    let (data_dir, _reuse_lock) = match &args.reuse {
        Some(dir) if dir.canonicalize().ok() == args.out.canonicalize().ok() => {
            bail!("--reuse {} is --out: give the folder of another run", dir.display())
        }
        Some(dir) if dir.is_dir() => (dir.clone(), Some(lock_out(dir, Lock::Shared)?)),
        Some(dir) => bail!("{}: no such folder (--reuse: a finished train-eagle run's --out)", dir.display()),
        None => (args.out.clone(), None),
    };
    let reuse = args.reuse.is_some();
    keep_freed_memory();
    eprintln!("mdsd: loading the target {}", path.display());
    let device = engine::load::parse_device(&args.device)?;
    let loaded = load(&path, &device, &LoadOptions::default())?;
    let (target, tok) = (&loaded.model, &loaded.tokenizer);
    if !tok.has_chat_template() {
        bail!("{}: the target has no chat template; EAGLE training formats texts as chat turns", path.display());
    }

    // The head to train (read first: a wrong --init-head fails before hours of work).
    let head = match &args.init_head {
        Some(dir) => {
            let config = dir.join("config.json");
            let text = std::fs::read_to_string(&config).with_context(|| format!("reading {}", config.display()))?;
            let json: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("{}: not JSON", config.display()))?;
            let width = args.intermediate_size.or(json["intermediate_size"].as_u64().map(|w| w as usize));
            let shape = HeadShape::for_target(target.config(), width);
            TrainableHead::load(shape, &dir.join("model.safetensors"), &device)
                .with_context(|| format!("{}: not a head of this target's sizes (--init-head)", dir.display()))?
        }
        None => {
            TrainableHead::init(HeadShape::for_target(target.config(), args.intermediate_size), args.seed, &device)?
        }
    };

    // 1. The target's own answers.
    let spec_bench = |per_category: std::ops::Range<usize>| -> anyhow::Result<Vec<(String, String)>> {
        let turns =
            data::first_turns(&args.data.join("spec_bench_question.jsonl"), &data::MT_BENCH_CATEGORIES, per_category)?;
        Ok(turns.into_iter().map(|(c, t)| (format!("self/spec_bench/{c}"), t)).collect())
    };
    let first = args.self_answers_per_category;
    let mut prompts = spec_bench(0..first)?;
    let alpaca = data::first_turns(&args.data.join("eagle_alpaca_question.jsonl"), &[], 0..usize::MAX)?;
    prompts
        .extend(alpaca.into_iter().take(args.self_answers_alpaca).map(|(_, t)| ("self/eagle_alpaca".to_string(), t)));
    // Appended after the others, so that a folder of answers to the prompts above is reused.
    let sample = data::alpaca_items(&args.data, args.self_answers_alpaca_sample)?;
    prompts.extend(sample.into_iter().map(|(p, _)| ("self/alpaca_sample".to_string(), p)));
    prompts.extend(spec_bench(first..first.saturating_add(args.self_answers_more_per_category))?);
    let batch = usize::from(args.answer_batch);
    let answers_to = |asks: &[Ask], earlier: &[Vec<usize>], tokens: usize, temperature: f64, file: &str| {
        let how = AnswerSettings { max_tokens: tokens, temperature, batch };
        answers(target, tok, asks, earlier, how, &data_dir.join(file), reuse)
    };
    let greedy = |prompts: Vec<(String, String)>| -> Vec<Ask> {
        prompts.into_iter().map(|(source, prompt)| Ask { source, prompt, seed: 0 }).collect()
    };
    // Prompt by prompt, so that one generation runs a prompt's samples after each other and
    // its prompt once. A file of earlier runs resumes in its order: sample by sample (earlier
    // versions), or prompt by prompt for fewer samples and then the added ones.
    let samples = args.self_answer_samples;
    let sampled: Vec<Ask> = (prompts.iter().enumerate())
        .flat_map(|(i, (source, prompt))| {
            (0..samples).map(move |s| Ask {
                source: format!("sampled/{source}"),
                prompt: prompt.clone(),
                seed: ((s as u64 + 1) << 32) | i as u64,
            })
        })
        .collect();
    let earlier = earlier_orders(prompts.len(), samples);
    let self_answers = answers_to(&greedy(prompts), &[], args.self_answer_tokens, 0.0, "self_answers.jsonl")?;
    let sampled_answers = if sampled.is_empty() {
        Vec::new()
    } else {
        let t = args.self_answer_temperature;
        answers_to(&sampled, &earlier, args.self_answer_tokens, t, &format!("sampled_answers_t{t}.jsonl"))?
    };
    let mt = data::first_turns(&args.data.join("mt_bench_question.jsonl"), &[], 0..usize::MAX)?;
    let mt: Vec<(String, String)> =
        mt.into_iter().take(args.eval_answers).map(|(c, t)| (format!("mt_bench/{c}"), t)).collect();
    let eval_answers = answers_to(&greedy(mt), &[], args.eval_answer_tokens, 0.0, "eval_answers.jsonl")?;

    // 2. Features.
    let limits = SourceLimits { alpaca: args.alpaca, cnndm: args.cnndm, wmt14: args.wmt14, ..Default::default() };
    let fixed = data::fixed_conversations(&args.data, &limits)?;
    let (texts, earlier_orders) = feature_texts(fixed, self_answers, sampled_answers);
    let (train_dir, eval_dir) = (data_dir.join("features"), data_dir.join("eval_features"));
    let how = FeatureSettings { max_len: args.max_len, read_only: reuse };
    let mut store = features(target, tok, &texts, &earlier_orders, how, &train_dir, "features")?;
    let mut eval = features(target, tok, &eval_answers, &[], how, &eval_dir, "eval features")?;

    // 3. Training.
    let config = TrainConfig {
        epochs: args.epochs,
        lr: args.lr,
        batch_rows: args.batch_rows,
        seed: args.seed,
        max_seconds: args.max_hours * 3600.0,
        draft_vocab: args.draft_vocab,
        max_steps: args.max_steps,
        token_weight: args.token_weight,
        unroll: usize::from(args.unroll),
        unroll_decay: args.unroll_decay,
        eval_first: args.init_head.is_some(),
        prompt_entries: args.prompt_entries,
        ..Default::default()
    };
    if args.init_head.is_some() && args.out.join("checkpoint/state.json").is_file() {
        eprintln!(
            "mdsd: resuming the run in {} from its checkpoint (--init-head is read only when a run starts)",
            args.out.display()
        );
    }
    let mut trainer = Trainer::new(target, head, config, &args.out)?;
    eprintln!(
        "mdsd: training a head of {} parameters on {} sequences ({} held out for validation; {} entries an epoch, {}), {} evaluation answers",
        trainer.head().parameter_count(),
        store.sequences().len(),
        trainer.split(&store).1.len(),
        trainer.entries_per_epoch(&store),
        if args.prompt_entries { "the prompts' included" } else { "the answers'" },
        eval.sequences().len()
    );
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{spinner} epoch {msg} [{bar:30}] {pos}/{len} batches, {elapsed}")
            .expect("a valid template"),
    );
    let progress = ProgressLog::new();
    let (epochs, mut stepped) = (args.epochs, false);
    let mut on_event = |e: &TrainEvent| match e {
        TrainEvent::Step { epoch, batch, batches, scores, lr, .. } => {
            bar.set_length(*batches as u64);
            bar.set_position(*batch as u64);
            if *batch <= 1 || !stepped {
                // A new epoch, or this run's first step (a resumed run starts mid-epoch): the
                // rate is estimated from here.
                stepped = true;
                bar.reset_eta();
            }
            bar.set_message(format!(
                "{} loss {:.3} (regression {:.3}, token {:.3}) acc {:.3} lr {:.1e}",
                epoch + 1,
                scores.loss,
                scores.regression,
                scores.token,
                scores.acc,
                lr
            ));
            progress.tick(&bar, || {
                let later = (epochs.saturating_sub(epoch + 1) * batches) as u64;
                let line = progress_line(&format!("training, epoch {} of {epochs}", epoch + 1), &bar, "batches", later);
                format!("{line}; loss {:.3}, top-1 {:.3}", scores.loss, scores.acc)
            });
        }
        TrainEvent::Eval { epoch, step, split, scores } => say(
            &bar,
            format!(
                "{}: {split} loss {:.4} top-1 {:.4} (whole vocabulary {:.4}; per depth {}) over {} tokens",
                if *step == 0 { "before training".to_string() } else { format!("epoch {}", epoch + 1) },
                scores.loss,
                scores.acc,
                scores.acc_full.unwrap_or(f64::NAN),
                scores.acc_steps.iter().map(|a| format!("{a:.3}")).collect::<Vec<_>>().join("/"),
                scores.rows
            ),
        ),
        TrainEvent::Stopped { reason, seconds, .. } => say(&bar, format!("stopped after {seconds:.0} s: {reason}")),
        TrainEvent::Checkpoint { .. } => {}
    };
    trainer.train(&mut store, Some(&mut eval), &mut on_event)?;
    bar.finish_and_clear();
    let dtype = match args.dtype.as_str() {
        "f32" => candle_core::DType::F32,
        "bf16" => candle_core::DType::BF16,
        _ => candle_core::DType::F16,
    };
    let head_dir = args.out.join("head");
    trainer.head().save(&head_dir, dtype)?;
    eprintln!(
        "mdsd: wrote {} ({} s of training); try it: mdsd generate --eagle {}",
        head_dir.display(),
        trainer.state().seconds.round(),
        head_dir.display()
    );
    Ok(())
}

/// The orders in which earlier runs may have written `prompts * per_prompt` items that this one
/// lays out prompt by prompt (item `i * per_prompt + s` is the `s`-th of prompt `i`), so that
/// their folders resume in their own order: the first `k` of each prompt (`k` from 1) prompt by
/// prompt, then the others prompt by prompt (a folder whose count per prompt grew); and `s` by
/// `s` across the prompts (earlier versions). The sampled answers use it, and the feature store
/// with a prompt's greedy answer as its first item ([`features::feature_texts`]).
fn earlier_orders(prompts: usize, per_prompt: usize) -> Vec<Vec<usize>> {
    let items = |s: std::ops::Range<usize>| (0..prompts).flat_map(move |i| s.clone().map(move |s| i * per_prompt + s));
    let mut orders: Vec<Vec<usize>> =
        (1..per_prompt).map(|k| items(0..k).chain(items(k..per_prompt)).collect()).collect();
    orders.push((0..per_prompt).flat_map(|s| (0..prompts).map(move |i| i * per_prompt + s)).collect());
    orders
}

/// What to do about answers or features of other texts than the settings give: in the run's
/// own folder they may go; in a `--reuse` folder they are another run's.
fn other_data_advice(read_only: bool) -> &'static str {
    if read_only {
        "give --reuse the data flags of the run that wrote it"
    } else {
        "remove it or use another --out"
    }
}

/// A line above the progress bar; on standard error when the bar is hidden (not a terminal:
/// a run in the background, or `mdsd fetch`'s log), where `println` would drop it.
fn say(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

/// Lines of progress where the bar draws nothing: when standard error is not a terminal (a run
/// in the background, `mdsd fetch`'s log), a stage would otherwise say nothing for up to an
/// hour. Every `MDSD_PROGRESS_SECONDS` (60 by default) at most, [`Self::tick`] writes its line;
/// on a terminal it writes nothing (the bar shows the same).
struct ProgressLog {
    every: std::time::Duration,
    last: std::cell::Cell<std::time::Instant>,
}

impl ProgressLog {
    fn new() -> Self {
        let seconds = std::env::var("MDSD_PROGRESS_SECONDS").ok().and_then(|s| s.parse::<f64>().ok());
        let every = seconds.and_then(|s| std::time::Duration::try_from_secs_f64(s).ok());
        let every = every.unwrap_or(std::time::Duration::from_secs(60));
        Self { every, last: std::cell::Cell::new(std::time::Instant::now()) }
    }

    /// `line()` on standard error when `bar` is hidden and the last line is `every` old.
    fn tick(&self, bar: &ProgressBar, line: impl FnOnce() -> String) {
        if bar.is_hidden() && self.last.get().elapsed() >= self.every {
            self.last.set(std::time::Instant::now());
            eprintln!("{}", line());
        }
    }
}

/// `what: pos/len unit (p%), elapsed, about T left`: a hidden bar's state as a line. `T` is
/// the time the bar's remaining units and `more` units after them (later epochs) take at the
/// bar's rate; before the bar has a rate (its first unit, or just after `reset_eta`) the line
/// says so instead of guessing.
fn progress_line(what: &str, bar: &ProgressBar, unit: &str, more: u64) -> String {
    let (pos, len) = (bar.position(), bar.length().unwrap_or(0));
    let percent = (100 * pos).checked_div(len).unwrap_or(0);
    let rate = bar.per_sec();
    let left = if rate > 0.0 && rate.is_finite() {
        let seconds = (len.saturating_sub(pos) + more) as f64 / rate;
        format!("about {} left", indicatif::HumanDuration(std::time::Duration::from_secs_f64(seconds.min(1e9))))
    } else {
        "the time left not yet known".to_string()
    };
    format!("mdsd: {what}: {pos}/{len} {unit} ({percent}%), {} so far, {left}", indicatif::HumanDuration(bar.elapsed()))
}

/// How a run holds a folder's lock.
#[derive(Clone, Copy, PartialEq)]
enum Lock {
    /// Its `--out`: the run writes answers, features and checkpoints there.
    Exclusive,
    /// A `--reuse` folder: the run only reads it, beside other runs reading it too.
    Shared,
}

/// Holds `out/.lock` for the run: two runs writing one folder would append to the same answer
/// and feature files and corrupt them, and a run reading a folder (`--reuse`) must not see it
/// written. Released when the file is dropped, or when the process ends however it ends.
fn lock_out(out: &Path, how: Lock) -> anyhow::Result<std::fs::File> {
    let path = out.join(".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        // A folder this user may only read can still be read (flock takes any descriptor).
        .or_else(|e| if how == Lock::Shared && path.is_file() { std::fs::File::open(&path) } else { Err(e) })
        .with_context(|| format!("opening {}", path.display()))?;
    let locked = match how {
        Lock::Exclusive => file.try_lock(),
        Lock::Shared => file.try_lock_shared(),
    };
    match locked {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => bail!(
            "{}: another train-eagle run is {} this folder (it holds {}); wait for it to end, or use another folder",
            out.display(),
            if how == Lock::Shared { "writing" } else { "using" },
            path.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => Err(e).with_context(|| format!("locking {}", path.display())),
    }
}

/// A training step allocates and frees tensors of tens of MB (a batch's logits); glibc gives
/// blocks that large back to the system when freed, and the next step's page faults and page
/// zeroing then took 30% of its time (`perf`, 512-row batches). Keeping them in the heap
/// removes that cost.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator thresholds; called before the training threads
    // allocate.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}
