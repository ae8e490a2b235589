//! `mdsd`: multi-draft speculative decoding from the command line.

use anyhow::{bail, Context};
use candle_core::DType;
use clap::{Args, Parser, Subcommand};
use engine::decode::{check_ngram, DraftSource, GenerationConfig, Generator, Randomness, SpecConfig, TreeChoice};
use engine::draft_window::DraftWindow;
use engine::load::{load, parse_device, LoadOptions, LoadedModel};
use engine::model::eagle::EagleHead;
use engine::model::gguf::WeightFormat;
use engine::ngram::NgramFlags;
use engine::provision::{resolve, resolve_cli, FetchOptions, ModelKind, PairManifest};
use engine::tokenizer::{check_vocabularies, TokenStream};
use engine::DraftTree;
use samplers::dist::Warp;
use samplers::{DraftConstruction, Verifier};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

mod report;

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
    /// Read the prompt from a file.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// Wrap the prompt in the model's chat template (one user turn).
    #[arg(long)]
    chat: bool,
    /// System prompt for --chat (default: the template's own).
    #[arg(long, requires = "chat")]
    system: Option<String>,
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy (argmax) decoding.
    #[arg(long, default_value_t = 0.7)]
    temperature: f64,
    /// Keep the k most probable tokens (0: off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Nucleus sampling mass (1: off).
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
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
    /// Draft logits only for the first N token ids (0: all). Byte-level BPE ids follow merge
    /// order, roughly frequency, so a cut vocabulary keeps most drafts at a fraction of the
    /// output-layer cost; other ids get q = 0 (still exact).
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
    /// Tree topology: a preset (chain-D, chain-D-forks-K, drafts-N-depth-D, mc_sim_7b_63), a
    /// TOML file, or `auto` (before each step, the tree with the most expected tokens per
    /// second from measured forward costs and the acceptance so far, by draft rank). Default:
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
    #[arg(long)]
    draft_temperature: Option<f64>,
    /// Confidence pruning of the tree, in [0, 1] (0: off): a node's children are drafted only
    /// while the product of the draft's top probabilities (temperature 1) along the path stays
    /// at least this. Exact for every construction and verifier (it looks at the draft only).
    #[arg(long, default_value_t = 0.0)]
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

fn main() {
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
        Command::Fetch { pair, models_dir } => {
            let dir = models_dir.unwrap_or_else(default_models_dir);
            let manifest = PairManifest::find(&pair, &dir)?;
            let opts = FetchOptions::default();
            for (role, source) in [("target", &manifest.target), ("draft", &manifest.draft)] {
                let path = resolve(source, None, &opts).with_context(|| format!("fetching the {role} of {pair}"))?;
                println!("{role}: {}", path.display());
                // A GGUF draft is loaded `fast-cpu` by default: convert it now, not at the
                // first `generate` (see `engine::model::converted`).
                if role == "draft" && source.kind == ModelKind::Model && engine::load::is_gguf_file(&path) {
                    let mut file = engine::model::gguf::GgufFile::open(&path)?;
                    if let Some(copy) = engine::model::converted::ensure(&mut file, &opts.cache)
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
    let verifier = args.verifier.unwrap_or_else(|| samplers::default_verifier(args.construction()));
    let tree_name = args.tree_name();
    if args.reproducible && !args.no_spec {
        if let Some(flag) =
            [("--draft-sampling", args.draft_sampling.is_some()), ("--verifier", args.verifier.is_some())]
                .iter()
                .find_map(|&(flag, given)| given.then_some(flag))
        {
            bail!("{flag} does not apply with --reproducible, whose drafts and verdicts are races on positional noise");
        }
    }
    let spec = if args.no_spec {
        None
    } else {
        if args.ngram == NgramMode::Only {
            let model_flags = [
                ("--draft", args.draft.is_some()),
                ("--eagle", args.eagle.is_some()),
                ("--draft-sampling", args.draft_sampling.is_some()),
                ("--draft-temperature", args.draft_temperature.is_some()),
                ("--draft-layers", args.draft_layers.is_some()),
            ];
            if let Some((flag, _)) = model_flags.iter().find(|f| f.1) {
                bail!("{flag} does not apply to --ngram only, which drafts without a draft model");
            }
        }
        let tree = if tree_name == "auto" {
            if args.construction() == DraftConstruction::SpecHub {
                bail!("--tree auto picks among chains and trees that --draft-sampling spechub (2 drafts per node) cannot draw; give a tree");
            }
            TreeChoice::Auto
        } else {
            let tree = DraftTree::load(&tree_name).with_context(|| {
                format!("--tree `{tree_name}` (it takes a preset, `auto`, or a TOML file as in configs/trees/)")
            })?;
            if args.construction() == DraftConstruction::SpecHub {
                if let Some(i) = (0..tree.len()).find(|&i| ![0, 2].contains(&tree.children(i).len())) {
                    bail!(
                        "--draft-sampling spechub draws exactly 2 drafts per node, but node {i} of tree `{}` has {} (chain-D-forks-D and drafts-2-depth-D fit)",
                        tree_name,
                        match tree.children(i).len() {
                            1 => "1 child".to_string(),
                            n => format!("{n} children"),
                        }
                    );
                }
            }
            TreeChoice::Fixed(tree)
        };
        let draft_warp = args.draft_temperature.map(|t| Warp { temperature: t, top_k: args.top_k, top_p: args.top_p });
        if !(0.0..=1.0).contains(&args.draft_confidence) {
            anyhow::bail!("--draft-confidence must be in [0, 1], got {}", args.draft_confidence);
        }
        Some(SpecConfig {
            tree,
            construction: args.construction(),
            verifier,
            draft_warp,
            confidence_cutoff: args.draft_confidence,
            source: draft_source(&args)?,
        })
    };
    if let Some(s) = &spec {
        // The n-gram checks first: with `--ngram only` they name what its drafts need (the
        // topk verifier) before the pair check would.
        check_ngram(s).context(format!("--ngram {}", args.ngram.name()))?;
        samplers::validate_pair(s.construction, s.verifier)?;
    }
    let warp = Warp { temperature: args.temperature, top_k: args.top_k, top_p: args.top_p };
    warp.check()?;
    let prompt = match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("reading the prompt file {}", f.display()))?
        }
        (None, None) => bail!("give a prompt with --prompt TEXT or --prompt-file FILE"),
    };
    let device = parse_device(&args.device)?;

    // Model files: explicit paths, else the pair's manifest (cache, hub, PyPI mirror).
    let need_draft = spec.is_some() && args.ngram != NgramMode::Only;
    let (target_path, draft_path) = model_paths(&args, need_draft)?;
    let opts = LoadOptions {
        max_layers: None,
        tokenizer: args.tokenizer.clone(),
        weights: args.target_weights,
        output_rows: None,
        dtype: args.dtype,
    };
    let t0 = Instant::now();
    let target = load(&target_path, &device, &opts).context("loading the target model")?;
    note(
        &args,
        &format!(
            "target {} loaded in {:.1} s ({} layers)",
            target_path.display(),
            t0.elapsed().as_secs_f64(),
            target.model.num_layers()
        ),
    );
    let eagle = match &draft_path {
        Some(DraftFiles::Eagle(p)) => {
            let t0 = Instant::now();
            let head = EagleHead::load(p, &target.model).context("loading the EAGLE head")?;
            note(&args, &format!("EAGLE head {} loaded in {:.1} s", head.path().display(), t0.elapsed().as_secs_f64()));
            Some(head)
        }
        _ => None,
    };
    let draft = match &draft_path {
        Some(DraftFiles::Model(p)) => {
            let t0 = Instant::now();
            let opts = LoadOptions {
                max_layers: args.draft_layers,
                tokenizer: args.tokenizer.clone(),
                weights: args.draft_weights,
                output_rows: (args.draft_vocab > 0).then_some(args.draft_vocab),
                dtype: args.dtype,
            };
            let d = load(p, &device, &opts).context("loading the draft model")?;
            check_vocabularies(target.tokenizer.vocab(), d.tokenizer.vocab(), &target.path, &d.path)?;
            note(
                &args,
                &format!(
                    "draft {} loaded in {:.1} s ({} layers)",
                    p.display(),
                    t0.elapsed().as_secs_f64(),
                    d.model.num_layers()
                ),
            );
            Some(d)
        }
        _ => None,
    };

    let text = if args.chat { target.tokenizer.apply_chat_template(&prompt, args.system.as_deref())? } else { prompt };
    let ids = target.tokenizer.encode(&text)?;
    let context = target
        .model
        .config()
        .context_length
        .min(draft.as_ref().map_or(usize::MAX, |d| d.model.config().context_length));
    let tree_len = spec.as_ref().map_or(1, |s| s.max_tree_len(warp));
    if ids.len() + tree_len >= context {
        bail!(
            "the prompt has {} tokens, too long for the context of {context} positions of {}",
            ids.len(),
            target.path.display()
        );
    }
    let capacity = (ids.len() + args.max_new_tokens + 2 * tree_len + 1).min(context);
    let config = GenerationConfig {
        max_new_tokens: args.max_new_tokens,
        warp,
        seed: args.seed,
        randomness: args.randomness(),
        speculative: spec,
    };
    let mut generator = match &eagle {
        Some(head) => Generator::with_eagle(&target.model, head, capacity)?,
        None => Generator::new(&target.model, draft.as_ref().map(|d: &LoadedModel| &d.model), capacity)?,
    };
    let window = args.draft_window.unwrap_or(DraftWindow::default_recent(args.ngram == NgramMode::First));
    if window > 0 {
        generator.set_draft_window(Some(DraftWindow::new(args.draft_sinks, window)?));
    }
    let tok = &target.tokenizer;
    let mut stream = TokenStream::default();
    let stdout = std::io::stdout();
    let json = args.json;
    let (out, stats) = generator.generate(
        &ids,
        &config,
        |t| !args.ignore_eos && tok.is_stop(t),
        |new| {
            if !json {
                let mut lock = stdout.lock();
                for &t in new {
                    if let Some(piece) = stream.push(tok, t)? {
                        let _ = lock.write_all(piece.as_bytes());
                    }
                }
                let _ = lock.flush();
            }
            Ok(())
        },
    )?;
    let window = generator.draft_window().filter(|_| draft.is_some() && !args.no_spec);
    if json {
        let draft_name = match (&draft, &eagle) {
            (Some(d), _) => Some(d.path.display().to_string()),
            (None, Some(h)) => Some(h.path().display().to_string()),
            (None, None) => None,
        };
        let report = report::Json {
            text: tok.decode(&out)?,
            target: &target.path,
            draft: draft_name,
            tree: &tree_name,
            window,
            verifier,
        };
        println!("{}", report.into_value(&stats, &args)?);
    } else {
        println!();
        report::print_stats(&stats, &args, verifier, window);
    }
    Ok(())
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
    let fetch = FetchOptions::default();
    let cli = |spec: &str| resolve_cli(spec, &fetch).with_context(|| format!("resolving `{spec}`"));
    let explicit_draft = args.draft.is_some() || args.eagle.is_some();
    let manifest = if args.target.is_none() || (need_draft && !explicit_draft) {
        let dir = args.models_dir.clone().unwrap_or_else(default_models_dir);
        Some(PairManifest::find(&args.pair, &dir)?)
    } else {
        None
    };
    let from_manifest = |source: &engine::provision::ModelSource, role: &str| -> anyhow::Result<PathBuf> {
        resolve(source, None, &fetch).with_context(|| format!("fetching the {role} of {}", args.pair))
    };
    let target = match (&args.target, &manifest) {
        (Some(t), _) => cli(t)?,
        (None, Some(m)) => from_manifest(&m.target, "target")?,
        (None, None) => unreachable!("a manifest is read when --target is missing"),
    };
    let draft = match (need_draft, &args.draft, &args.eagle, &manifest) {
        (false, ..) => None,
        (true, Some(d), _, _) => Some(DraftFiles::Model(cli(d)?)),
        (true, None, Some(e), _) => Some(DraftFiles::Eagle(cli(e)?)),
        (true, None, None, Some(m)) => {
            let path = from_manifest(&m.draft, "draft")?;
            Some(if m.draft.kind == ModelKind::EagleHead { DraftFiles::Eagle(path) } else { DraftFiles::Model(path) })
        }
        (true, None, None, None) => unreachable!("a manifest is read when no draft is given"),
    };
    Ok((target, draft))
}

impl GenerateArgs {
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
