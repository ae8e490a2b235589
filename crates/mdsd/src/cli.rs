//! The flags `generate`, `chat` and `serve` share ([`GenerateArgs`]), their parsers, and the
//! choices they imply (tree, construction, randomness, draft source).

use anyhow::Context;
use candle_core::DType;
use clap::Args;
use engine::decode::draft::ngram::NgramFlags;
use engine::decode::draft::window::DraftWindow;
use engine::decode::penalties::{Penalties, PenaltyFlags};
use engine::decode::{DraftSource, Randomness};
use engine::load::gguf::WeightFormat;
use samplers::{DraftConstruction, Verifier};
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// The prompt.
    #[arg(long, conflicts_with = "prompt_file")]
    pub(crate) prompt: Option<String>,
    /// Read the prompt from a file (`-`: standard input).
    #[arg(long)]
    pub(crate) prompt_file: Option<PathBuf>,
    /// Generate for each line of standard input: a JSON string (a prompt; --chat wraps it in
    /// the chat template) or a conversation (a JSON list of {"role", "content"} messages,
    /// through the chat template). Each answer is one line of JSON on standard output, in
    /// order, as --json prints it, with `line`; a line that fails gives `{"line", "error"}` and
    /// the exit status 1. With --max-batch 1 one generator answers them in turn, reusing the
    /// prefix texts share; with more, that many lines run at once, their forwards batched.
    #[arg(long, conflicts_with_all = ["prompt", "prompt_file"])]
    pub(crate) jsonl: bool,
    /// Generations run at once (--jsonl, serve), each with caches of its own, their forwards
    /// batched into one: at temperature 0 each answer equals its answer alone (default: 1 for
    /// --jsonl, 4 for serve, whose KV memory is --max-batch x --context positions).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub(crate) max_batch: Option<u16>,
    /// Wrap the prompt in the model's chat template (one user turn).
    #[arg(long)]
    pub(crate) chat: bool,
    /// System prompt for --chat (default: the template's own).
    #[arg(long)]
    pub(crate) system: Option<String>,
    /// Extra variables for the chat template, a JSON object (vLLM's `chat_template_kwargs`),
    /// e.g. '{"enable_thinking": false}' for Qwen3.
    #[arg(long, value_name = "JSON", value_parser = engine::tokenizer::parse_chat_template_kwargs)]
    pub(crate) chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    #[arg(long, default_value_t = 256)]
    pub(crate) max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy (argmax) decoding.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.7)]
    pub(crate) temperature: f64,
    /// Keep the k most probable tokens (0: off).
    #[arg(long, default_value_t = 0)]
    pub(crate) top_k: usize,
    /// Nucleus sampling mass (1: off).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    pub(crate) top_p: f64,
    /// Keep only the tokens at least this fraction as probable as the most probable one
    /// (0: off). Applied after the temperature and before top-k and top-p, as vLLM does.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    pub(crate) min_p: f64,
    /// Seed of every random draw. With a fixed --tree the same command gives the same text;
    /// `--tree auto` picks each step's tree from forward times measured as it runs, so at
    /// temperature > 0 its texts can differ between runs (each an exact sample), unless
    /// --reproducible is given.
    #[arg(long, default_value_t = 299792458)]
    pub(crate) seed: u64,
    /// Draw every token from noise keyed by (seed, position, token): the text then depends
    /// only on the seed, the prompt, the target and the sampling flags, and equals
    /// `--no-spec --reproducible`'s token for token whatever the tree, draft, lookup or
    /// `auto` does (where the target computes a tree's rows as it does one row: our Q4_K/Q6_K
    /// CPU kernels, f32 weights). Drafts are the draft's best races on the same noise (Gumbel-top-k) and are
    /// accepted when they equal the target's token, in place of --draft-sampling and
    /// --verifier (at temperature > 0 this accepts somewhat less than the default pair).
    #[arg(long)]
    pub(crate) reproducible: bool,
    /// An EAGLE-1 draft head (a folder with config.json and pytorch_model.bin or
    /// model.safetensors, or a hub id) that drafts from the target's hidden states, instead of a
    /// draft model. Pairs whose manifest names a head (`vicuna-7b-eagle`, `qwen2-7b-eagle`) use
    /// theirs.
    #[arg(long, conflicts_with = "draft")]
    pub(crate) eagle: Option<String>,
    /// Model pair (a manifest in models/), used for whichever of --target/--draft is not given.
    #[arg(long, default_value = "qwen2.5-coder-1.5b-0.5b")]
    pub(crate) pair: String,
    /// Target model: a .gguf file, a Hugging Face model folder, or a hub id (`owner/name`, or
    /// `owner/name:file.gguf` for one GGUF file of a repository).
    #[arg(long)]
    pub(crate) target: Option<String>,
    /// Draft model: same forms as --target.
    #[arg(long)]
    pub(crate) draft: Option<String>,
    /// N-gram (prompt lookup) drafts: the longest suffix of --ngram-min..--ngram-max tokens
    /// that occurred before in the prompt or the text proposes what followed it. `first`: such
    /// drafts (on --ngram-tree) on the steps whose context has a match, the draft model or head
    /// (on --tree) on the others; `only`: lookup drafts alone, no draft model loaded (on --tree,
    /// default chain-4; verifier topk, lossless for deterministic drafts); `off`: the draft
    /// model or head alone. Exact in every mode.
    #[arg(long, value_enum, default_value = "first")]
    pub(crate) ngram: NgramMode,
    #[command(flatten)]
    pub(crate) ngram_flags: NgramFlags,
    /// Draft logits only for the first N token ids (0: all), for a draft model and for an
    /// EAGLE head (which then reads a copy of the target's output layer cut to N rows).
    /// Byte-level BPE ids follow merge order, roughly frequency, so a cut vocabulary keeps most
    /// drafts at a fraction of the output-layer cost; other ids get q = 0 (still exact).
    #[arg(long, default_value_t = 32768)]
    pub(crate) draft_vocab: usize,
    /// Run only the first N blocks of the draft (a cheaper draft from the same file).
    #[arg(long)]
    pub(crate) draft_layers: Option<usize>,
    /// The draft model attends only to the --draft-sinks first tokens and the last N (up to
    /// 1.5 N between slides) of the context; 0: all of it. Cuts the draft's prompt pass and
    /// its attention on long contexts; costs some acceptance, never exactness. Not for EAGLE
    /// heads. Default: 256 with `--ngram first` (lookup does the copying; 700-token Spec-Bench
    /// prompts ran 7-9% faster end to end), 0 with `--ngram off` (docs/results/README.md#const-draft-window).
    #[arg(long)]
    pub(crate) draft_window: Option<usize>,
    /// Sink tokens (the context's first) kept before the --draft-window.
    #[arg(long, default_value_t = DraftWindow::DEFAULT_SINKS)]
    pub(crate) draft_sinks: usize,
    /// How the target's GGUF matrices run: stored (as in the file), fast-cpu (re-quantize
    /// formats without a fast CPU kernel to Q4_K, rows zero-padded to 256 columns; changes the
    /// target's numerics), f32 (dequantized: slow, batch-invariant numerics).
    #[arg(long, value_enum, default_value = "stored")]
    pub(crate) target_weights: WeightFormat,
    /// How the draft's GGUF matrices run (any draft keeps the output exact).
    #[arg(long, value_enum, default_value = "fast-cpu")]
    pub(crate) draft_weights: WeightFormat,
    /// A tokenizer.json overriding the target's (and the draft's) tokenizer.
    #[arg(long)]
    pub(crate) tokenizer: Option<PathBuf>,
    /// Tree topology: a preset (chain-D, chain-D-forks-K, drafts-N-depth-D, mc_sim_7b_63), an
    /// EAGLE path list (`[[0],[1],[0,0]]`), a file (TOML, or a bare path list), or `auto`
    /// (before each step, the tree with the most expected tokens per second from measured
    /// forward costs and the acceptance so far, by draft rank). Default:
    /// `auto`, which adapts to the device and the pair (on a 2-core CPU, within the standard
    /// errors of the best fixed tree at temperature 0 and 0.06-0.08x below it at 0.7,
    /// docs/results/README.md#const-tree-auto-default); with `--draft-sampling spechub`, which needs 2 drafts per node,
    /// `drafts-2-depth-2`.
    #[arg(long)]
    pub(crate) tree: Option<String>,
    /// Draft construction of the draft model's steps: wr, wor, greedy, spechub, topk, cps
    /// (default: greedy; topk with `--ngram only`, whose drafts are deterministic).
    #[arg(long)]
    pub(crate) draft_sampling: Option<DraftConstruction>,
    /// Temperature of the draft's q (default: --temperature). Any q keeps the output exact; at
    /// --temperature 0 a one-hot q gives one draft per node, so multi-draft trees need a draft
    /// temperature (e.g. `--draft-temperature 1 --draft-sampling topk`: the top tokens).
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) draft_temperature: Option<f64>,
    /// Confidence pruning of the tree, in [0, 1] (0: off): a node's children are drafted only
    /// while the product of the draft's top probabilities (temperature 1) along the path stays
    /// at least this. Exact for every construction and verifier (it looks at the draft only).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    pub(crate) draft_confidence: f64,
    /// Verifier of the draft model's steps: rrs, kseq, greedy, spechub, topk (default: the
    /// construction's own; only topk with `--ngram only`). N-gram steps always use topk.
    #[arg(long)]
    pub(crate) verifier: Option<Verifier>,
    /// Plain autoregressive decoding of the target (no draft model is loaded).
    #[arg(long)]
    pub(crate) no_spec: bool,
    /// Keep generating past the end-of-turn token, up to --max-new-tokens (for measurements
    /// at a fixed length).
    #[arg(long)]
    pub(crate) ignore_eos: bool,
    /// End the text before the first occurrence of this string (repeatable; the string is not
    /// part of the text).
    #[arg(long)]
    pub(crate) stop: Vec<String>,
    /// Add BIAS to token ID's logit, the target's and the draft's, before sampling (repeatable;
    /// -100 all but bans a token; the output follows the biased target exactly).
    #[arg(long, value_name = "ID=BIAS", value_parser = parse_logit_bias)]
    pub(crate) logit_bias: Vec<(u32, f32)>,
    #[command(flatten)]
    pub(crate) penalty: PenaltyFlags,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub(crate) device: String,
    /// Activation dtype of unquantized (Hugging Face) weights: f32, bf16 or f16 (default:
    /// f32 on CPU, bf16 on CUDA). f32 on CUDA makes the target's numerics the same for one row
    /// and for a tree, so temperature-0 speculative output equals `--no-spec` output exactly.
    #[arg(long, value_parser = parse_dtype)]
    pub(crate) dtype: Option<DType>,
    /// Print one JSON object (text and statistics) on stdout instead of streaming.
    #[arg(long)]
    pub(crate) json: bool,
    /// With --json: the target's log-probability of every generated token (temperature 1,
    /// before top-k/top-p) and its N most probable alternatives (0-20).
    #[arg(long, value_name = "N")]
    pub(crate) logprobs: Option<usize>,
    /// With --logprobs: also `prompt_logprobs`, the log-probability of every prompt token after
    /// the first, from the prompt's own pass (with --max-new-tokens 0: score a text only).
    #[arg(long)]
    pub(crate) prompt_logprobs: bool,
    /// Folder of the model-pair manifests.
    #[arg(long)]
    pub(crate) models_dir: Option<PathBuf>,
}

/// `--ngram`: where drafts come from (see the flag's help).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NgramMode {
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

/// The draft source of `--ngram`.
pub fn draft_source(args: &GenerateArgs) -> anyhow::Result<DraftSource> {
    let flags = &args.ngram_flags;
    let ngram = || flags.config().map_err(|e| anyhow::anyhow!("--ngram {}: {e}", args.ngram.name()));
    Ok(match args.ngram {
        NgramMode::Only => DraftSource::Ngram(ngram()?),
        NgramMode::First => DraftSource::NgramFirst { ngram: ngram()?, tree: flags.tree()? },
        NgramMode::Off => DraftSource::Model,
    })
}

impl NgramMode {
    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::First => "first",
            Self::Only => "only",
        }
    }
}

impl GenerateArgs {
    /// `--repetition-penalty`, `--presence-penalty` and `--frequency-penalty`, checked.
    pub(crate) fn penalties(&self) -> anyhow::Result<Penalties> {
        self.penalty.penalties().map_err(anyhow::Error::msg)
    }

    /// The randomness `--reproducible` asks for.
    pub(crate) fn randomness(&self) -> Randomness {
        if self.reproducible {
            Randomness::Positional
        } else {
            Randomness::Stream
        }
    }

    /// `--tree`, or its default: `auto`, `drafts-2-depth-2` for SpecHub drafts, `chain-4` for
    /// n-gram drafts.
    pub(crate) fn tree_name(&self) -> String {
        match &self.tree {
            Some(t) => t.clone(),
            None if self.ngram == NgramMode::Only => "chain-4".into(),
            None if self.construction() == DraftConstruction::SpecHub => "drafts-2-depth-2".into(),
            None => "auto".into(),
        }
    }

    /// `--draft-sampling`, or its default: greedy, or topk (deterministic) for n-gram drafts.
    pub(crate) fn construction(&self) -> DraftConstruction {
        match self.draft_sampling {
            Some(c) => c,
            None if self.ngram == NgramMode::Only => DraftConstruction::TopK,
            None => DraftConstruction::Greedy,
        }
    }
}

/// The text of `--prompt-file`: the file's, or standard input's for `-`.
pub fn read_prompt_file(f: &Path) -> anyhow::Result<String> {
    if f == Path::new("-") {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin().lock(), &mut text)
            .context("reading the prompt from standard input")?;
        return Ok(text);
    }
    std::fs::read_to_string(f).with_context(|| format!("reading the prompt file {}", f.display()))
}

pub fn note(args: &GenerateArgs, msg: &str) {
    if !args.json {
        eprintln!("mdsd: {msg}");
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
