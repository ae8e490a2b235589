//! `bench mt-bench`: end-to-end speed of the autoregressive baseline and of speculative
//! methods (draft construction, verifier, tree) at several temperatures, EAGLE's protocol.
//!
//! - Every question is asked turn by turn through the chat template; a later turn carries the
//!   method's own earlier answers in the conversation.
//! - Methods are interleaved question by question (and the order rotates with the question),
//!   so slow drift of a noisy machine hits every method alike; ratios to the baseline and to
//!   RRS with replacement are taken per question, then averaged.
//! - Every finished turn is appended to `<name>.records.jsonl` at once; the summary
//!   (`<name>.json`, `<name>.md`) is written at the end, or after the first Ctrl-C with the
//!   questions finished so far.
//! - Timings are wall time around whole generations; every step reads its logits back to
//!   the host, which synchronises the device.

mod methods;
mod questions;
mod report;

pub use methods::Method;
pub use questions::{read_questions, select_categories, Question};

use crate::pair::{LoadedDraft, PairArgs};
use crate::run_info::{git_revision, output_paths, utc_stamp, Interrupt, Progress};
use anyhow::{bail, Context};
use candle_core::Device;
use clap::Args;
use engine::decode::auto_tree::WIDTHS;
use engine::decode::draft::ngram::NgramFlags;
use engine::decode::draft::window::DraftWindow;
use engine::decode::penalties::PenaltyFlags;
use engine::decode::{GenerationConfig, Generator, Randomness, SpecConfig, TreeChoice};
use engine::load::gguf::WeightFormat;
use engine::load::{parse_device, LoadOptions};
use engine::tokenizer::TextTokenizer;
use engine::DraftTree;
use samplers::dist::Warp;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct MtBenchArgs {
    /// Question file: MT-Bench's or Spec-Bench's JSON lines (`question_id`, `category`,
    /// `turns`).
    #[arg(long, default_value = "../shared/data/mt_bench_question.jsonl")]
    questions: PathBuf,
    /// Number of questions (the first N; with --categories, the first N of each; 0: all).
    #[arg(long, default_value_t = 10)]
    limit: usize,
    /// Comma-separated categories to ask (e.g. Spec-Bench's `summarization,rag`); default: all.
    #[arg(long)]
    categories: Option<String>,
    /// Ask only the first N turns of each question (0: all).
    #[arg(long, default_value_t = 0)]
    turns: usize,
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    /// Comma-separated methods: `baseline`, `rrs-wr`, `rrs-wor`, `kseq`, `greedy`,
    /// `spechub`, `topk`, `construction+verifier` (e.g. `wor+topk`), `ngram` (prompt-lookup
    /// drafts, no draft model; as `mdsd generate --ngram only`), or `ngram+METHOD` (n-gram drafts
    /// where the context has a match, METHOD with the draft model elsewhere; `--ngram first`).
    #[arg(long, default_value = "baseline,rrs-wr,rrs-wor,greedy")]
    methods: String,
    /// Comma-separated trees for the speculative methods: presets (`chain-N`,
    /// `drafts-K-depth-D`, `mc_sim_7b_63`, ...), EAGLE path lists (`[[0],[1],[0,0]]`), tree
    /// files, or `auto`; `TREE@C` prunes the tree by draft confidence C (`mdsd generate
    /// --draft-confidence`), e.g. `chain-4@0.5`; `TREE~W` lets the draft model see only a window
    /// of W recent tokens (after the sinks, `mdsd generate --draft-window`; `~0`: the whole
    /// context), e.g. `chain-2~512`.
    #[arg(long, default_value = "drafts-2-depth-4")]
    trees: String,
    /// Comma-separated sampling temperatures (0: argmax).
    #[arg(long, default_value = "0")]
    temperatures: String,
    /// Top-p of every cell's sampling, target and draft alike, as `mdsd generate --top-p`
    /// (1: off).
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// Top-k of every cell's sampling, target and draft alike, as `mdsd generate --top-k`
    /// (0: off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Min-p of every cell's sampling, target and draft alike, as `mdsd generate --min-p`
    /// (0: off).
    #[arg(long, default_value_t = 0.0)]
    min_p: f64,
    /// Repetition, presence and frequency penalties of every cell, target and draft alike, as
    /// in `mdsd generate`.
    #[command(flatten)]
    penalty: PenaltyFlags,
    /// Temperature of the draft's q for the speculative methods (default: each cell's
    /// temperature), as `mdsd generate --draft-temperature`: at temperature 0 a one-hot q gives
    /// one draft per node, so multi-draft trees need one (e.g. 1, with `topk`).
    #[arg(long)]
    draft_temperature: Option<f64>,
    /// Suffix lengths of the `ngram` methods and the tree of `ngram+METHOD`'s lookup steps, as
    /// in `mdsd generate`.
    #[command(flatten)]
    ngram: NgramFlags,
    /// Base seed; question i, turn t uses `seed + 1000 i + t` for every method.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Comma-separated randomness of every cell: `stream` (one seeded stream, each method's own
    /// construction and verifier) and/or `positional` (`mdsd generate --reproducible`: every
    /// speculative answer must equal the `baseline:positional` answer). Positional cells are
    /// named `METHOD:positional`.
    #[arg(long, default_value = "stream")]
    randomness: String,
    #[command(flatten)]
    models: PairArgs,
    /// The draft model's window of recent tokens for trees without `~W` (0: the whole
    /// context); as `mdsd generate --draft-window`. Default: 256 for `ngram+METHOD`, 0 for a
    /// draft model alone.
    #[arg(long)]
    draft_window: Option<usize>,
    /// Sink tokens kept before a draft window; as `mdsd generate --draft-sinks`.
    #[arg(long, default_value_t = DraftWindow::DEFAULT_SINKS)]
    draft_sinks: usize,
    /// Draft logits only for the first N ids (0: all); as `mdsd generate --draft-vocab`.
    #[arg(long, default_value_t = 32768)]
    draft_vocab: usize,
    #[arg(long, value_enum, default_value = "fast-cpu")]
    draft_weights: WeightFormat,
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Ask the questions without a chat template (turns joined by blank lines).
    #[arg(long)]
    no_chat: bool,
    /// Keep generating past the end-of-turn token, up to --max-new-tokens: every answer then
    /// has that length (as `mdsd generate --ignore-eos`).
    #[arg(long)]
    ignore_eos: bool,
    /// Keep the cached rows a prompt shares with the previous one, as `mdsd chat` and `serve`
    /// do: a second turn then runs only its new text. Off by default, as in EAGLE's protocol,
    /// which runs every prompt whole. It changes the prefill time only, not the answers.
    #[arg(long)]
    prefix_reuse: bool,
    /// Folder of the results (`<name>.records.jsonl`, `<name>.json`, `<name>.md`).
    #[arg(long, default_value = "benches/results")]
    out_dir: PathBuf,
    /// Stem of the result files (default: `mt-bench-<UTC time>`).
    #[arg(long)]
    name: Option<String>,
}

/// One configuration measured on every question.
#[derive(Debug, Clone)]
pub struct Cell {
    pub method: Method,
    /// Tree name and topology (`None` for the baseline).
    pub tree: Option<(String, TreeChoice)>,
    pub temperature: f64,
    pub randomness: Randomness,
}

impl Cell {
    /// The method's name, with `:positional` for [`Randomness::Positional`].
    pub fn method_name(&self) -> String {
        match self.randomness {
            Randomness::Stream => self.method.name(),
            Randomness::Positional => format!("{}:{}", self.method.name(), Randomness::Positional.name()),
        }
    }

    pub fn tree_name(&self) -> &str {
        self.tree.as_ref().map_or("-", |t| t.0.as_str())
    }
}

/// One answered turn: the raw record of the JSON output.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TurnRecord {
    pub question_id: String,
    pub category: String,
    /// 1-based turn number.
    pub turn: usize,
    pub method: String,
    pub tree: String,
    pub temperature: f64,
    pub seed: u64,
    /// Position of this generation in the run (interleaving order).
    pub order: usize,
    pub prompt_tokens: usize,
    /// Prompt tokens whose cached rows were kept (`--prefix-reuse`).
    #[serde(default)]
    pub reused_tokens: usize,
    pub new_tokens: usize,
    pub target_forwards: usize,
    /// Tree rows the target ran (see `engine::decode::Stats::target_rows`).
    pub target_rows: usize,
    pub tau: f64,
    /// Fraction of steps that accepted a draft at depth d (index d - 1).
    pub acceptance_per_depth: Vec<f64>,
    pub prefill_s: f64,
    /// Of `prefill_s`, `--tree auto`'s forward-cost measurements (`engine::decode::Stats`).
    #[serde(default)]
    pub auto_costs_s: f64,
    pub decode_s: f64,
    pub tokens_per_s: f64,
    pub draft_s: f64,
    pub target_s: f64,
    pub verify_s: f64,
    /// Steps drafted by n-gram lookup (`ngram` and `ngram+METHOD`).
    #[serde(default)]
    pub ngram_steps: usize,
    /// Tokens emitted by those steps.
    #[serde(default)]
    pub ngram_tokens: usize,
    pub stop_reason: String,
    /// With `--tree auto`: its acceptance estimates at the end and the steps taken with each
    /// tree (`engine::decode::Stats::auto_tree`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub auto_tree: String,
    /// Drafts tried and accepted by their node's number of drafts and their rank
    /// (`engine::decode::Stats::rank_tried`, `rank_accepted`): the acceptance `bench predict`
    /// reads.
    #[serde(default)]
    pub rank_tried: [[u64; WIDTHS]; WIDTHS],
    #[serde(default)]
    pub rank_accepted: [[u64; WIDTHS]; WIDTHS],
    /// The generated text (special tokens left out).
    pub answer: String,
}

fn parse_list<T>(list: &str, what: &str, f: impl Fn(&str) -> anyhow::Result<T>) -> anyhow::Result<Vec<T>> {
    let out: Vec<T> = split_top_level(list)
        .into_iter()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| f(s).with_context(|| format!("bad {what} `{s}`")))
        .collect::<anyhow::Result<_>>()?;
    if out.is_empty() {
        bail!("no {what} given");
    }
    Ok(out)
}

/// `list` split at the commas outside brackets: an EAGLE path list such as `[[0],[1],[0,0]]`
/// stays one entry.
fn split_top_level(list: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&list[start..]);
    parts
}

/// The cells of a run: the baseline once per temperature, every speculative method on every
/// tree at every temperature. A method that cannot run on a tree (SpecHub needs exactly two
/// drafts per node; n-gram drafts need a fixed tree without a confidence cutoff) is left out
/// with a note.
pub fn cells(
    methods: &[Method],
    trees: &[(String, TreeChoice)],
    temperatures: &[f64],
    randomness: &[Randomness],
) -> (Vec<Cell>, Vec<String>) {
    let (mut out, mut notes) = (Vec::new(), Vec::new());
    for (&temperature, &randomness) in temperatures.iter().flat_map(|t| randomness.iter().map(move |r| (t, r))) {
        for &method in methods {
            if method == Method::Baseline {
                out.push(Cell { method, tree: None, temperature, randomness });
                continue;
            }
            for tree in trees {
                match why_left_out(method, tree) {
                    Some(why) => {
                        let note = format!("{} left out on {}: {why}", method.name(), tree.0);
                        if !notes.contains(&note) {
                            notes.push(note);
                        }
                    }
                    None => out.push(Cell { method, tree: Some(tree.clone()), temperature, randomness }),
                }
            }
        }
    }
    (out, notes)
}

/// Why a speculative `method` cannot run on `tree` (`None`: it can).
fn why_left_out(method: Method, tree: &(String, TreeChoice)) -> Option<String> {
    match method {
        Method::Baseline => None,
        Method::Ngram => (matches!(tree.1, TreeChoice::Auto) || tree.0.contains('@') || tree.0.contains('~'))
            .then(|| "it needs a fixed tree, unpruned, and no draft model".to_string()),
        Method::Speculative { construction, .. } | Method::NgramFirst { construction, .. } => {
            let TreeChoice::Fixed(t) = &tree.1 else { return None };
            (0..t.len())
                .map(|i| t.children(i).len())
                .find(|&n| n > 0 && construction.check_n(n).is_err())
                .map(|n| format!("a node has {n} drafts"))
        }
    }
}

/// The prompt of `turn` (0-based) of `question`, with the earlier `answers` in the
/// conversation.
fn turn_prompt(
    tok: &TextTokenizer,
    q: &Question,
    turn: usize,
    answers: &[String],
    chat: bool,
) -> anyhow::Result<String> {
    if !chat {
        let mut text = String::new();
        for (question, answer) in q.turns[..turn].iter().zip(answers) {
            text.push_str(question);
            text.push_str("\n\n");
            text.push_str(answer);
            text.push_str("\n\n");
        }
        text.push_str(&q.turns[turn]);
        return Ok(text);
    }
    let mut conv: Vec<(&str, &str)> = Vec::with_capacity(2 * turn + 1);
    for (question, answer) in q.turns[..turn].iter().zip(answers) {
        conv.push(("user", question));
        conv.push(("assistant", answer));
    }
    conv.push(("user", &q.turns[turn]));
    Ok(tok.apply_chat_conversation(&conv, None)?)
}

/// A `--trees` entry: `TREE[@C][~W]`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct TreeSpec<'a> {
    name: &'a str,
    /// Confidence cutoff C (0 without `@`).
    cutoff: f64,
    /// Draft window W (`None` without `~`: the run's `--draft-window`).
    window: Option<usize>,
}

fn parse_tree_spec(s: &str) -> anyhow::Result<TreeSpec<'_>> {
    // A `~` followed by anything but digits belongs to a file name.
    let (rest, window) = match s.rsplit_once('~') {
        Some((rest, w)) if !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit()) => {
            let w: usize = w.parse().with_context(|| format!("draft window of `{s}` is too large"))?;
            (rest, Some(w))
        }
        _ => (s, None),
    };
    let (name, cutoff) = match rest.rsplit_once('@') {
        None => (rest, 0.0),
        Some((name, c)) => {
            let c: f64 = c.parse().with_context(|| format!("confidence cutoff of `{s}` is not a number"))?;
            if !(0.0..=1.0).contains(&c) {
                anyhow::bail!("confidence cutoff of `{s}` must be in [0, 1]");
            }
            (name, c)
        }
    };
    Ok(TreeSpec { name, cutoff, window })
}

pub fn run(args: &MtBenchArgs) -> anyhow::Result<()> {
    let methods = methods::parse_methods(&args.methods)?;
    let trees = parse_list(&args.trees, "tree", |s| {
        let name = parse_tree_spec(s)?.name;
        Ok((s.to_string(), if name == "auto" { TreeChoice::Auto } else { DraftTree::load(name)?.into() }))
    })?;
    let ngram = args.ngram.config().map_err(|e| anyhow::anyhow!("--ngram-min/--ngram-max: {e}"))?;
    let ngram_tree = args.ngram.tree()?;
    let warp = |temperature| Warp { temperature, top_k: args.top_k, top_p: args.top_p, min_p: args.min_p };
    let temperatures = parse_list(&args.temperatures, "temperature", |s| {
        let t: f64 = s.parse().context("not a number")?;
        warp(t).check()?;
        Ok(t)
    })?;
    let penalties = args.penalty.penalties().map_err(anyhow::Error::msg)?;
    if let Some(t) = args.draft_temperature {
        warp(t).check().context("--draft-temperature")?;
    }
    let mut questions = match &args.categories {
        None => read_questions(&args.questions, args.limit)?,
        Some(list) => {
            let cats = parse_list(list, "category", |s| Ok(s.to_string()))?;
            select_categories(read_questions(&args.questions, 0)?, &cats, args.limit, &args.questions)?
        }
    };
    if args.turns > 0 {
        questions.iter_mut().for_each(|q| q.turns.truncate(args.turns));
    }
    let randomness = parse_list(&args.randomness, "randomness", |s| s.parse().map_err(anyhow::Error::msg))?;
    let (cells, notes) = cells(&methods, &trees, &temperatures, &randomness);
    for n in &notes {
        eprintln!("bench: note: {n}");
    }
    if cells.is_empty() {
        bail!("no method can run on the trees given");
    }
    let spec_of = |cell: &Cell| -> Option<SpecConfig> {
        cell.tree.as_ref().map(|(name, tree)| match cell.method {
            Method::Speculative { construction, verifier } | Method::NgramFirst { construction, verifier } => {
                SpecConfig {
                    tree: tree.clone(),
                    construction,
                    verifier,
                    draft_warp: args.draft_temperature.map(warp),
                    confidence_cutoff: parse_tree_spec(name).map_or(0.0, |t| t.cutoff),
                    source: match cell.method {
                        Method::NgramFirst { .. } => {
                            engine::decode::DraftSource::NgramFirst { ngram, tree: ngram_tree.clone() }
                        }
                        _ => engine::decode::DraftSource::Model,
                    },
                }
            }
            Method::Ngram => SpecConfig {
                tree: tree.clone(),
                construction: samplers::DraftConstruction::TopK,
                verifier: samplers::Verifier::TopK,
                draft_warp: None,
                confidence_cutoff: 0.0,
                source: engine::decode::DraftSource::Ngram(ngram),
            },
            Method::Baseline => unreachable!("the baseline has no tree"),
        })
    };
    // A branching tree at temperature 0 with a one-hot q drafts one token per node: say so, or
    // its figures read as the tree's when they are its deepest chain's.
    let mut chains: Vec<&str> = Vec::new();
    for cell in &cells {
        if let (Some(spec), Some((name, _))) = (spec_of(cell), &cell.tree) {
            if spec.runs_as_chain(warp(cell.temperature)) && !chains.contains(&name.as_str()) {
                chains.push(name);
                eprintln!(
                    "bench: note: {name} at T = {} runs as a chain (the draft's q is one-hot: one token per node); --draft-temperature 1 drafts the top tokens",
                    cell.temperature
                );
            }
        }
    }
    let device: Device = parse_device(&args.device)?;
    let draft_opts = LoadOptions {
        weights: args.draft_weights,
        output_rows: (args.draft_vocab > 0).then_some(args.draft_vocab),
        ..Default::default()
    };
    let (target, draft) = args.models.load(&device, &draft_opts)?;
    let tok = &target.tokenizer;
    let chat = !args.no_chat;
    if chat && !tok.has_chat_template() {
        bail!(
            "{}: the target has no chat template; pass --no-chat to join turns with blank lines",
            target.path.display()
        );
    }
    // Room for every turn of the longest conversation, its answers and one tree.
    let mut longest = 0;
    for q in &questions {
        let answers: Vec<String> = vec![String::new(); q.turns.len()];
        let text = turn_prompt(tok, q, q.turns.len() - 1, &answers, chat)?;
        longest = longest.max(tok.encode(&text)?.len());
    }
    let most_turns = questions.iter().map(|q| q.turns.len()).max().unwrap_or(1);
    let capacity = longest + most_turns * (args.max_new_tokens + 16) + 512;
    let mut generator = match &draft {
        LoadedDraft::Model(d) => Generator::new(&target.model, Some(&d.model), capacity)?,
        LoadedDraft::EagleHead(head) => Generator::with_eagle(&target.model, head, capacity)?,
    };
    generator.set_penalties(penalties);
    generator.set_prefix_reuse(args.prefix_reuse);

    let stem = args.name.clone().unwrap_or_else(|| format!("mt-bench-{}", utc_stamp()));
    let path = output_paths(&args.out_dir, &stem)?;
    let records_path = path("records.jsonl");
    let mut records_file =
        std::fs::File::create(&records_path).with_context(|| format!("creating {}", records_path.display()))?;
    let interrupt = Interrupt::install();
    let total_turns: usize = questions.iter().map(|q| q.turns.len()).sum();
    let progress = Progress::new((total_turns * cells.len()) as u64, "mt-bench");
    let mut records: Vec<TurnRecord> = Vec::new();
    let mut done_questions = 0;
    let started = std::time::Instant::now();
    'questions: for (qi, q) in questions.iter().enumerate() {
        let mut question_records = Vec::new();
        for k in 0..cells.len() {
            let cell = &cells[(qi + k) % cells.len()];
            let speculative = spec_of(cell);
            let window = cell.tree.as_ref().and_then(|(name, _)| parse_tree_spec(name).ok()?.window);
            let lookup_first = matches!(cell.method, Method::NgramFirst { .. });
            let window = window.or(args.draft_window).unwrap_or(DraftWindow::default_recent(lookup_first));
            generator.set_draft_window(if window > 0 {
                Some(DraftWindow::new(args.draft_sinks, window)?)
            } else {
                None
            });
            let mut answers: Vec<String> = Vec::with_capacity(q.turns.len());
            for turn in 0..q.turns.len() {
                progress.set_message(format!(
                    "q{} {} {} T={}",
                    q.id,
                    cell.method.name(),
                    cell.tree_name(),
                    cell.temperature
                ));
                let prompt = tok.encode(&turn_prompt(tok, q, turn, &answers, chat)?)?;
                let seed = args.seed + 1000 * qi as u64 + turn as u64;
                let config = GenerationConfig {
                    max_new_tokens: args.max_new_tokens,
                    warp: warp(cell.temperature),
                    seed,
                    randomness: cell.randomness,
                    speculative: speculative.clone(),
                };
                let (ids, stats) = generator
                    .generate(&prompt, &config, |t| !args.ignore_eos && tok.is_stop(t), |_| Ok(()))
                    .with_context(|| format!("question {} turn {}: {}", q.id, turn + 1, cell.method.name()))?;
                let answer = tok.decode(&ids)?;
                let rec = TurnRecord {
                    question_id: q.id.clone(),
                    category: q.category.clone(),
                    turn: turn + 1,
                    method: cell.method_name(),
                    tree: cell.tree_name().to_string(),
                    temperature: cell.temperature,
                    seed,
                    order: records.len() + question_records.len(),
                    prompt_tokens: stats.prompt_tokens,
                    reused_tokens: stats.reused_tokens,
                    new_tokens: stats.new_tokens,
                    target_forwards: stats.target_forwards,
                    target_rows: stats.target_rows,
                    tau: stats.tau,
                    acceptance_per_depth: stats.acceptance_per_depth.clone(),
                    prefill_s: stats.prefill_s,
                    auto_costs_s: stats.auto_costs_s,
                    decode_s: stats.total_s - stats.prefill_s,
                    tokens_per_s: stats.tokens_per_s,
                    draft_s: stats.draft_s,
                    target_s: stats.target_s,
                    verify_s: stats.verify_s,
                    ngram_steps: stats.ngram_steps,
                    ngram_tokens: stats.ngram_tokens,
                    stop_reason: stats.stop_reason.clone(),
                    auto_tree: stats.auto_tree.clone(),
                    rank_tried: stats.rank_tried,
                    rank_accepted: stats.rank_accepted,
                    answer: answer.clone(),
                };
                answers.push(answer);
                writeln!(records_file, "{}", serde_json::to_string(&rec)?)?;
                records_file.flush()?;
                question_records.push(rec);
                progress.inc();
            }
            if interrupt.requested() {
                progress.println(format!("bench: stopped during question {}; it is left out of the summary", q.id));
                break 'questions;
            }
        }
        // Only whole questions enter the summary (every cell measured on them).
        records.extend(question_records);
        done_questions += 1;
        progress.println(format!(
            "bench: question {} done ({}/{}, {:.0} s)",
            q.id,
            qi + 1,
            questions.len(),
            started.elapsed().as_secs_f64()
        ));
    }
    progress.finish();
    if done_questions == 0 {
        bail!("no question finished; the raw records are in {}", records_path.display());
    }
    let summary = report::summarize(&cells, &records);
    let meta = serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "revision": git_revision(),
        "date_utc": utc_stamp(),
        "pair": args.models.label(),
        "target": target.path,
        "draft": draft.path(),
        "device": args.device,
        "questions_file": args.questions,
        "categories": args.categories,
        "questions": done_questions,
        "questions_asked": questions.len(),
        "interrupted": done_questions < questions.len(),
        "max_new_tokens": args.max_new_tokens,
        "draft_vocab": args.draft_vocab,
        "draft_temperature": args.draft_temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
        "repetition_penalty": penalties.repetition,
        "presence_penalty": penalties.presence,
        "frequency_penalty": penalties.frequency,
        "ngram": [args.ngram.ngram_min, args.ngram.ngram_max],
        "ngram_tree": args.ngram.ngram_tree,
        "chat": chat,
        "ignore_eos": args.ignore_eos,
        "prefix_reuse": args.prefix_reuse,
        "seed": args.seed,
        "randomness": args.randomness,
        "methods": methods.iter().map(Method::name).collect::<Vec<_>>(),
        "trees": trees.iter().map(|t| &t.0).collect::<Vec<_>>(),
        "draft_window": args.draft_window,
        "draft_sinks": args.draft_sinks,
        "temperatures": temperatures,
        "notes": notes,
    });
    let json_path = path("json");
    let doc = serde_json::json!({ "config": meta, "summary": summary, "records": records });
    std::fs::write(&json_path, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", json_path.display()))?;
    let md = report::markdown(&meta, &summary);
    let md_path = path("md");
    std::fs::write(&md_path, &md).with_context(|| format!("writing {}", md_path.display()))?;
    println!("{md}");
    eprintln!("bench: wrote {}, {} and {}", records_path.display(), json_path.display(), md_path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{parse_tree_spec, split_top_level, TreeSpec};

    #[test]
    fn tree_names_take_an_optional_confidence_cutoff_and_draft_window() {
        let spec = |name, cutoff, window| TreeSpec { name, cutoff, window };
        assert_eq!(parse_tree_spec("chain-4").unwrap(), spec("chain-4", 0.0, None));
        assert_eq!(parse_tree_spec("chain-4@0.6").unwrap(), spec("chain-4", 0.6, None));
        assert_eq!(parse_tree_spec("configs/trees/x.toml@1").unwrap(), spec("configs/trees/x.toml", 1.0, None));
        assert_eq!(parse_tree_spec("[[0],[1],[0,0]]@0.5~64").unwrap(), spec("[[0],[1],[0,0]]", 0.5, Some(64)));
        assert_eq!(
            split_top_level("chain-2, [[0],[1],[0,0]]@0.5,[[0]],auto"),
            ["chain-2", " [[0],[1],[0,0]]@0.5", "[[0]]", "auto"]
        );
        assert_eq!(parse_tree_spec("chain-2~512").unwrap(), spec("chain-2", 0.0, Some(512)));
        assert_eq!(parse_tree_spec("chain-4@0.5~0").unwrap(), spec("chain-4", 0.5, Some(0)));
        assert_eq!(parse_tree_spec("a~b/x.toml").unwrap(), spec("a~b/x.toml", 0.0, None));
        for bad in ["chain-2@x", "chain-2@1.5", "chain-2@-0.1", "chain-2@NaN", "chain-2@x~5"] {
            let e = parse_tree_spec(bad).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains("confidence cutoff"), "{bad}: {e}");
        }
        let e = parse_tree_spec("chain-2~99999999999999999999999").unwrap_err().to_string();
        assert!(e.contains("draft window"), "{e}");
    }
}
