//! `mdsd`: multi-draft speculative decoding from the command line.

use anyhow::{bail, Context};
use candle_core::DType;
use clap::{Args, Parser, Subcommand};
use engine::decode::{DraftSource, Randomness};
use engine::draft_window::DraftWindow;
use engine::model::gguf::WeightFormat;
use engine::ngram::NgramFlags;
use engine::penalties::{Penalties, PenaltyFlags};
use engine::provision::{resolve, resolve_cli, FetchOptions, ModelKind, ModelSource, PairManifest};
use engine::stop::TextStops;
use samplers::{DraftConstruction, Verifier};
use std::io::Write;
use std::path::{Path, PathBuf};

mod batch;
mod chat;
mod report;
mod serve;
mod session;
mod tokenize;

use session::Plan;

#[derive(Parser)]
#[command(name = "mdsd", version, about = "Multi-draft speculative decoding (lossless) on CPU and CUDA")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text with multi-draft speculative decoding (or plain decoding with --no-spec).
    Generate(Box<GenerateArgs>),
    /// Chat with the model: one line per message, each answer streamed; the models run only the
    /// tokens each turn adds (the conversation's cached prefix is reused).
    #[command(
        mut_arg("chat", |a| a.hide(true)),
        mut_arg("json", |a| a.hide(true)),
        mut_arg("jsonl", |a| a.hide(true)),
        mut_arg("logprobs", |a| a.hide(true)),
        mut_arg("prompt_logprobs", |a| a.hide(true))
    )]
    Chat(Box<chat::ChatArgs>),
    /// Serve OpenAI-compatible completion endpoints over HTTP (/v1/completions,
    /// /v1/chat/completions, streamed or not), one request at a time, with prefix reuse.
    #[command(
        mut_arg("prompt", |a| a.hide(true)),
        mut_arg("prompt_file", |a| a.hide(true)),
        mut_arg("chat", |a| a.hide(true)),
        mut_arg("system", |a| a.hide(true)),
        mut_arg("json", |a| a.hide(true)),
        mut_arg("jsonl", |a| a.hide(true)),
        mut_arg("logprobs", |a| a.hide(true)),
        mut_arg("prompt_logprobs", |a| a.hide(true))
    )]
    Serve(Box<serve::ServeArgs>),
    /// Token ids of a text with the target's tokenizer (--decode: the text of token ids);
    /// reads the tokenizer only, not the weights.
    Tokenize(Box<tokenize::TokenizeArgs>),
    /// Fetch and verify the files of a model pair without generating.
    Fetch {
        /// Model pair name (a manifest `models/NAME.toml`).
        #[arg(default_value = "qwen2.5-coder-1.5b-0.5b")]
        pair: String,
        /// Folder of the model-pair manifests.
        #[arg(long)]
        models_dir: Option<PathBuf>,
    },
}

#[derive(Args, Debug)]
struct GenerateArgs {
    /// The prompt.
    #[arg(long, conflicts_with = "prompt_file")]
    prompt: Option<String>,
    /// Read the prompt from a file (`-`: standard input).
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// Generate for each line of standard input: a JSON string (a prompt; --chat wraps it in
    /// the chat template) or a conversation (a JSON list of {"role", "content"} messages,
    /// through the chat template). Each answer is one line of JSON on standard output, in
    /// order, as --json prints it, with `line`; a line that fails gives `{"line", "error"}` and
    /// the exit status 1. One generator serves them all, reusing the prefix texts share.
    #[arg(long, conflicts_with_all = ["prompt", "prompt_file"])]
    jsonl: bool,
    /// Wrap the prompt in the model's chat template (one user turn).
    #[arg(long)]
    chat: bool,
    /// System prompt for --chat (default: the template's own).
    #[arg(long)]
    system: Option<String>,
    /// Extra variables for the chat template, a JSON object (vLLM's `chat_template_kwargs`),
    /// e.g. '{"enable_thinking": false}' for Qwen3.
    #[arg(long, value_name = "JSON", value_parser = engine::tokenizer::parse_chat_template_kwargs)]
    chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy (argmax) decoding.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.7)]
    temperature: f64,
    /// Keep the k most probable tokens (0: off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Nucleus sampling mass (1: off).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    top_p: f64,
    /// Keep only the tokens at least this fraction as probable as the most probable one
    /// (0: off). Applied after the temperature and before top-k and top-p, as vLLM does.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    min_p: f64,
    /// Seed of every random draw. With a fixed --tree the same command gives the same text;
    /// `--tree auto` picks each step's tree from forward times measured as it runs, so at
    /// temperature > 0 its texts can differ between runs (each an exact sample), unless
    /// --reproducible is given.
    #[arg(long, default_value_t = 299792458)]
    seed: u64,
    /// Draw every token from noise keyed by (seed, position, token): the text then depends
    /// only on the seed, the prompt, the target and the sampling flags, and equals
    /// `--no-spec --reproducible`'s token for token whatever the tree, draft, lookup or
    /// `auto` does (where the target computes a tree's rows as it does one row: our Q4_K/Q6_K
    /// CPU kernels, f32 weights). Drafts are the draft's best races on the same noise (Gumbel-top-k) and are
    /// accepted when they equal the target's token, in place of --draft-sampling and
    /// --verifier (at temperature > 0 this accepts somewhat less than the default pair).
    #[arg(long)]
    reproducible: bool,
    /// An EAGLE-1 draft head (a folder with config.json and pytorch_model.bin or
    /// model.safetensors, or a hub id) that drafts from the target's hidden states, instead of a
    /// draft model. Pairs whose manifest names a head (`vicuna-7b-eagle`, `qwen2-7b-eagle`) use
    /// theirs.
    #[arg(long, conflicts_with = "draft")]
    eagle: Option<String>,
    /// Model pair (a manifest in models/), used for whichever of --target/--draft is not given.
    #[arg(long, default_value = "qwen2.5-coder-1.5b-0.5b")]
    pair: String,
    /// Target model: a .gguf file, a Hugging Face model folder, or a hub id (`owner/name`, or
    /// `owner/name:file.gguf` for one GGUF file of a repository).
    #[arg(long)]
    target: Option<String>,
    /// Draft model: same forms as --target.
    #[arg(long)]
    draft: Option<String>,
    /// N-gram (prompt lookup) drafts: the longest suffix of --ngram-min..--ngram-max tokens
    /// that occurred before in the prompt or the text proposes what followed it. `first`: such
    /// drafts (on --ngram-tree) on the steps whose context has a match, the draft model or head
    /// (on --tree) on the others; `only`: lookup drafts alone, no draft model loaded (on --tree,
    /// default chain-4; verifier topk, lossless for deterministic drafts); `off`: the draft
    /// model or head alone. Exact in every mode.
    #[arg(long, value_enum, default_value = "first")]
    ngram: NgramMode,
    #[command(flatten)]
    ngram_flags: NgramFlags,
    /// Draft logits only for the first N token ids (0: all), for a draft model and for an
    /// EAGLE head (which then reads a copy of the target's output layer cut to N rows).
    /// Byte-level BPE ids follow merge order, roughly frequency, so a cut vocabulary keeps most
    /// drafts at a fraction of the output-layer cost; other ids get q = 0 (still exact).
    #[arg(long, default_value_t = 32768)]
    draft_vocab: usize,
    /// Run only the first N blocks of the draft (a cheaper draft from the same file).
    #[arg(long)]
    draft_layers: Option<usize>,
    /// The draft model attends only to the --draft-sinks first tokens and the last N (up to
    /// 1.5 N between slides) of the context; 0: all of it. Cuts the draft's prompt pass and
    /// its attention on long contexts; costs some acceptance, never exactness. Not for EAGLE
    /// heads. Default: 256 with `--ngram first` (lookup does the copying; 700-token Spec-Bench
    /// prompts ran 7-9% faster end to end), 0 with `--ngram off` (benches/RESULTS.md).
    #[arg(long)]
    draft_window: Option<usize>,
    /// Sink tokens (the context's first) kept before the --draft-window.
    #[arg(long, default_value_t = DraftWindow::DEFAULT_SINKS)]
    draft_sinks: usize,
    /// How the target's GGUF matrices run: stored (as in the file), fast-cpu (re-quantize
    /// formats without a fast CPU kernel to Q4_K, rows zero-padded to 256 columns; changes the
    /// target's numerics), f32 (dequantized: slow, batch-invariant numerics).
    #[arg(long, value_enum, default_value = "stored")]
    target_weights: WeightFormat,
    /// How the draft's GGUF matrices run (any draft keeps the output exact).
    #[arg(long, value_enum, default_value = "fast-cpu")]
    draft_weights: WeightFormat,
    /// A tokenizer.json overriding the target's (and the draft's) tokenizer.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Tree topology: a preset (chain-D, chain-D-forks-K, drafts-N-depth-D, mc_sim_7b_63), an
    /// EAGLE path list (`[[0],[1],[0,0]]`), a file (TOML, or a bare path list), or `auto`
    /// (before each step, the tree with the most expected tokens per second from measured
    /// forward costs and the acceptance so far, by draft rank). Default:
    /// `auto`, which adapts to the device and the pair (on a 2-core CPU, within the standard
    /// errors of the best fixed tree at temperature 0 and 0.06-0.08x below it at 0.7,
    /// benches/RESULTS.md); with `--draft-sampling spechub`, which needs 2 drafts per node,
    /// `drafts-2-depth-2`.
    #[arg(long)]
    tree: Option<String>,
    /// Draft construction of the draft model's steps: wr, wor, greedy, spechub, topk, cps
    /// (default: greedy; topk with `--ngram only`, whose drafts are deterministic).
    #[arg(long)]
    draft_sampling: Option<DraftConstruction>,
    /// Temperature of the draft's q (default: --temperature). Any q keeps the output exact; at
    /// --temperature 0 a one-hot q gives one draft per node, so multi-draft trees need a draft
    /// temperature (e.g. `--draft-temperature 1 --draft-sampling topk`: the top tokens).
    #[arg(long, allow_negative_numbers = true)]
    draft_temperature: Option<f64>,
    /// Confidence pruning of the tree, in [0, 1] (0: off): a node's children are drafted only
    /// while the product of the draft's top probabilities (temperature 1) along the path stays
    /// at least this. Exact for every construction and verifier (it looks at the draft only).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    draft_confidence: f64,
    /// Verifier of the draft model's steps: rrs, kseq, greedy, spechub, topk (default: the
    /// construction's own; only topk with `--ngram only`). N-gram steps always use topk.
    #[arg(long)]
    verifier: Option<Verifier>,
    /// Plain autoregressive decoding of the target (no draft model is loaded).
    #[arg(long)]
    no_spec: bool,
    /// Keep generating past the end-of-turn token, up to --max-new-tokens (for measurements
    /// at a fixed length).
    #[arg(long)]
    ignore_eos: bool,
    /// End the text before the first occurrence of this string (repeatable; the string is not
    /// part of the text).
    #[arg(long)]
    stop: Vec<String>,
    /// Add BIAS to token ID's logit, the target's and the draft's, before sampling (repeatable;
    /// -100 all but bans a token; the output follows the biased target exactly).
    #[arg(long, value_name = "ID=BIAS", value_parser = parse_logit_bias)]
    logit_bias: Vec<(u32, f32)>,
    #[command(flatten)]
    penalty: PenaltyFlags,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Activation dtype of unquantized (Hugging Face) weights: f32, bf16 or f16 (default:
    /// f32 on CPU, bf16 on CUDA). f32 on CUDA makes the target's numerics the same for one row
    /// and for a tree, so temperature-0 speculative output equals `--no-spec` output exactly.
    #[arg(long, value_parser = parse_dtype)]
    dtype: Option<DType>,
    /// Print one JSON object (text and statistics) on stdout instead of streaming.
    #[arg(long)]
    json: bool,
    /// With --json: the target's log-probability of every generated token (temperature 1,
    /// before top-k/top-p) and its N most probable alternatives (0-20).
    #[arg(long, value_name = "N")]
    logprobs: Option<usize>,
    /// With --logprobs: also `prompt_logprobs`, the log-probability of every prompt token after
    /// the first, from the prompt's own pass (with --max-new-tokens 0: score a text only).
    #[arg(long)]
    prompt_logprobs: bool,
    /// Folder of the model-pair manifests.
    #[arg(long)]
    models_dir: Option<PathBuf>,
}

/// `--ngram`: where drafts come from (see the flag's help).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum NgramMode {
    Off,
    First,
    Only,
}

/// `--logit-bias ID=BIAS`: a token id and a finite bias in [-100, 100].
fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let (id, bias) = s.split_once('=').ok_or_else(|| format!("`{s}`: expected ID=BIAS, e.g. 151643=-100"))?;
    let id: u32 = id.trim().parse().map_err(|e| format!("`{id}`: not a token id: {e}"))?;
    let bias: f32 = bias.trim().parse().map_err(|e| format!("`{bias}`: not a number: {e}"))?;
    if !(-100.0..=100.0).contains(&bias) {
        return Err(format!("bias {bias}: from -100 to 100"));
    }
    Ok((id, bias))
}

fn main() {
    // Before any thread starts: set_var is then race-free.
    engine::cpu_threads::pin_thread_count();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {}", message(&e));
        std::process::exit(1);
    }
}

/// The error chain on one line, without the backtraces candle attaches when
/// `RUST_BACKTRACE` is set.
fn message(e: &anyhow::Error) -> String {
    e.chain()
        .map(|cause| match cause.downcast_ref::<candle_core::Error>() {
            Some(c) => plain(c),
            None => cause.to_string(),
        })
        .collect::<Vec<_>>()
        .join(": ")
}

fn plain(e: &candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => plain(inner),
        other => other.to_string(),
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Generate(args) => generate(*args),
        Command::Chat(args) => chat::chat(*args),
        Command::Serve(args) => serve::serve(*args),
        Command::Tokenize(args) => tokenize::tokenize(*args),
        Command::Fetch { pair, models_dir } => {
            let manifest = pair_manifest(&pair, models_dir.as_deref())?;
            for (role, source) in [("target", &manifest.target), ("draft", &manifest.draft)] {
                let path = manifest_model(source, role, &pair)?;
                println!("{role}: {}", path.display());
                // A GGUF draft is loaded `fast-cpu` by default: convert it now, not at the
                // first `generate` (see `engine::model::converted`).
                if role == "draft" && source.kind == ModelKind::Model && engine::load::is_gguf_file(&path) {
                    let mut file = engine::model::gguf::GgufFile::open(&path)?;
                    if let Some(copy) = engine::model::converted::ensure(&mut file, &engine::provision::cache_dir())
                        .with_context(|| format!("converting the draft {} for the CPU", path.display()))?
                    {
                        println!("draft, converted for the CPU: {}", copy.display());
                    }
                }
            }
            Ok(())
        }
    }
}

fn generate(args: GenerateArgs) -> anyhow::Result<()> {
    // Everything that can be checked without loading a model comes first.
    let plan = Plan::new(&args)?;
    if args.jsonl {
        return batch::generate_lines(&args, plan);
    }
    let prompt = match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => read_prompt_file(f)?,
        (None, None) => bail!("give a prompt with --prompt TEXT or --prompt-file FILE"),
    };
    let session = plan.load(&args)?;
    let tok = &session.target.tokenizer;
    let text = if args.chat { tok.apply_chat_template(&prompt, args.system.as_deref())? } else { prompt };
    let ids = tok.encode(&text)?;
    session.check_fits(ids.len(), session.context, "prompt")?;
    let capacity = session.capacity(ids.len(), args.max_new_tokens);
    let mut generator = session.generator(&args, capacity)?;
    generator.set_logprobs(args.logprobs);
    generator.set_prompt_logprobs(args.prompt_logprobs);
    generator.set_prefill_progress(report::prefill_display(args.json));
    let json = args.json;
    let stops = TextStops::new(tok, args.stop.clone(), args.ignore_eos).expect("--stop checked by Plan::new");
    let (out, mut stats) = generator.generate(
        &ids,
        &session.config,
        |t| stops.is_stop(t),
        |_| {
            if !json {
                print_flushed(&stops.ready(false));
            }
            Ok(())
        },
    )?;
    if stops.stopped() {
        stats.stop_reason = "stop_string".into();
    }
    if json {
        println!("{}", answer_json(&session, &generator, &args, &out, &stats, &stops)?);
    } else {
        print_flushed(&stops.ready(true));
        println!();
        report::print_stats(&stats, &args, session.verifier, session.window(&generator, &args));
    }
    // The process ends here: its memory goes back to the OS at once, instead of being freed
    // piece by piece (the tokenizers' hundreds of thousands of strings among it).
    std::mem::forget(generator);
    std::mem::forget(session);
    Ok(())
}

/// Writes streamed text to stdout at once (a reader that went away does not stop generation).
fn print_flushed(text: &str) {
    if !text.is_empty() {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    }
}

/// The draft source of `--ngram`.
fn draft_source(args: &GenerateArgs) -> anyhow::Result<DraftSource> {
    let flags = &args.ngram_flags;
    let ngram = || flags.config().map_err(|e| anyhow::anyhow!("--ngram {}: {e}", args.ngram.name()));
    Ok(match args.ngram {
        NgramMode::Only => DraftSource::Ngram(ngram()?),
        NgramMode::First => DraftSource::NgramFirst { ngram: ngram()?, tree: flags.tree()? },
        NgramMode::Off => DraftSource::Model,
    })
}

impl NgramMode {
    fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::First => "first",
            Self::Only => "only",
        }
    }
}

/// The draft's files: a draft model, or an EAGLE head folder.
enum DraftFiles {
    Model(PathBuf),
    Eagle(PathBuf),
}

/// The target and draft files: explicit paths (or hub ids) first, the pair's manifest for
/// the rest.
fn model_paths(args: &GenerateArgs, need_draft: bool) -> anyhow::Result<(PathBuf, Option<DraftFiles>)> {
    let explicit_draft = args.draft.is_some() || args.eagle.is_some();
    let manifest = if args.target.is_none() || (need_draft && !explicit_draft) {
        Some(pair_manifest(&args.pair, args.models_dir.as_deref())?)
    } else {
        None
    };
    let target = match (&args.target, &manifest) {
        (Some(t), _) => cli_model(t)?,
        (None, Some(m)) => manifest_model(&m.target, "target", &args.pair)?,
        (None, None) => unreachable!("a manifest is read when --target is missing"),
    };
    let draft = match (need_draft, &args.draft, &args.eagle, &manifest) {
        (false, ..) => None,
        (true, Some(d), _, _) => Some(DraftFiles::Model(cli_model(d)?)),
        (true, None, Some(e), _) => Some(DraftFiles::Eagle(cli_model(e)?)),
        (true, None, None, Some(m)) => {
            let path = manifest_model(&m.draft, "draft", &args.pair)?;
            Some(if m.draft.kind == ModelKind::EagleHead { DraftFiles::Eagle(path) } else { DraftFiles::Model(path) })
        }
        (true, None, None, None) => unreachable!("a manifest is read when no draft is given"),
    };
    Ok((target, draft))
}

/// A model given on the command line: a path, or a hub id fetched ([`resolve_cli`]).
fn cli_model(spec: &str) -> anyhow::Result<PathBuf> {
    resolve_cli(spec, &FetchOptions::default()).with_context(|| format!("resolving `{spec}`"))
}

/// The manifest of model pair `pair` in `models_dir` (default: [`default_models_dir`]).
fn pair_manifest(pair: &str, models_dir: Option<&Path>) -> anyhow::Result<PairManifest> {
    Ok(PairManifest::find(pair, &models_dir.map_or_else(default_models_dir, Path::to_path_buf))?)
}

/// The `role` model of pair `pair`'s manifest: from the cache, else fetched ([`resolve`]).
fn manifest_model(source: &ModelSource, role: &str, pair: &str) -> anyhow::Result<PathBuf> {
    resolve(source, None, &FetchOptions::default()).with_context(|| format!("fetching the {role} of {pair}"))
}

impl GenerateArgs {
    /// `--repetition-penalty`, `--presence-penalty` and `--frequency-penalty`, checked.
    fn penalties(&self) -> anyhow::Result<Penalties> {
        self.penalty.penalties().map_err(anyhow::Error::msg)
    }

    /// The randomness `--reproducible` asks for.
    fn randomness(&self) -> Randomness {
        if self.reproducible {
            Randomness::Positional
        } else {
            Randomness::Stream
        }
    }

    /// `--tree`, or its default: `auto`, `drafts-2-depth-2` for SpecHub drafts, `chain-4` for
    /// n-gram drafts.
    fn tree_name(&self) -> String {
        match &self.tree {
            Some(t) => t.clone(),
            None if self.ngram == NgramMode::Only => "chain-4".into(),
            None if self.construction() == DraftConstruction::SpecHub => "drafts-2-depth-2".into(),
            None => "auto".into(),
        }
    }

    /// `--draft-sampling`, or its default: greedy, or topk (deterministic) for n-gram drafts.
    fn construction(&self) -> DraftConstruction {
        match self.draft_sampling {
            Some(c) => c,
            None if self.ngram == NgramMode::Only => DraftConstruction::TopK,
            None => DraftConstruction::Greedy,
        }
    }
}

/// What `--json` prints for a generation: the text `out` (cut at a stop string), the settings
/// and `stats`, and the log-probabilities asked for.
fn answer_json(
    session: &session::Session,
    generator: &engine::decode::Generator,
    args: &GenerateArgs,
    out: &[u32],
    stats: &engine::decode::Stats,
    stops: &TextStops,
) -> anyhow::Result<serde_json::Value> {
    let tok = &session.target.tokenizer;
    let report = report::Json {
        text: if args.stop.is_empty() { tok.decode(out)? } else { stops.answer() },
        target: &session.target.path,
        draft: session.draft_name(),
        tree: &session.tree_name,
        window: session.window(generator, args),
        verifier: session.verifier,
    };
    let mut value = report.into_value(stats, args)?;
    if args.logprobs.is_some() {
        value["logprobs"] = report::logprobs(tok, generator.logprobs());
    }
    if args.prompt_logprobs {
        value["prompt_logprobs"] = report::logprobs(tok, generator.prompt_logprobs());
    }
    Ok(value)
}

/// The text of `--prompt-file`: the file's, or standard input's for `-`.
fn read_prompt_file(f: &Path) -> anyhow::Result<String> {
    if f == Path::new("-") {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin().lock(), &mut text)
            .context("reading the prompt from standard input")?;
        return Ok(text);
    }
    std::fs::read_to_string(f).with_context(|| format!("reading the prompt file {}", f.display()))
}

fn note(args: &GenerateArgs, msg: &str) {
    if !args.json {
        eprintln!("mdsd: {msg}");
    }
}

/// `./models` when it exists, else the repository's `models/` (for `cargo run`).
fn default_models_dir() -> PathBuf {
    let local = PathBuf::from("models");
    if local.is_dir() {
        local
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
    }
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    match s {
        "f32" => Ok(DType::F32),
        "bf16" => Ok(DType::BF16),
        "f16" => Ok(DType::F16),
        other => Err(format!("unknown dtype `{other}` (expected f32, bf16 or f16)")),
    }
}
