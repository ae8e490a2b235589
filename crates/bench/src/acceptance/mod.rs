//! `bench acceptance`: the paper's acceptance-rate study (its Table 1 and Figures 1-2) on
//! the models at hand.
//!
//! 1. For each dataset the target answers the first `--samples` prompts (at most
//!    `--max-new-tokens` tokens, sampled at `--generation-temperature`), and the target's and
//!    the draft's logits are kept at every response position ([`generate`], [`store`]). They
//!    are cached in a file, so sweeps and re-runs do not regenerate text.
//! 2. At each (temperature, drafts) setting every position gets the exact optimum `alpha*`
//!    of each construction and the expected acceptance of each verifier ([`evaluate`]).
//! 3. Means with standard errors clustered by response go to a Table-1-shaped Markdown table,
//!    the sweeps to tables and figures, everything to JSON under `--out-dir`.

mod evaluate;
mod generate;
pub(crate) mod plot;
mod prompts;
mod report;
mod store;

use crate::pair::PairArgs;
use crate::run_info::{git_revision, output_paths, utc_stamp, Interrupt, Progress};
use anyhow::{bail, Context};
use clap::Args;
use engine::load::gguf::WeightFormat;
use engine::load::{parse_device, LoadOptions, LoadedModel};
use evaluate::{Metric, Setting};
use generate::GenerationOptions;
pub use prompts::Dataset;
use std::path::{Path, PathBuf};
use store::Positions;

#[derive(Args, Debug)]
pub struct AcceptanceArgs {
    #[command(flatten)]
    models: PairArgs,
    /// Comma-separated datasets: alpaca, wmt14, cnndm.
    #[arg(long, value_delimiter = ',', default_value = "alpaca")]
    dataset: Vec<Dataset>,
    /// Folder of the prompt files (`alpaca_sample.jsonl`, `wmt14_deen_test.jsonl`,
    /// `cnndm_frank_test.jsonl`).
    #[arg(long, default_value = "../shared/data")]
    data_dir: PathBuf,
    /// Prompts per dataset (the first N; fewer when the file has fewer).
    #[arg(long, default_value_t = 1024)]
    samples: usize,
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Temperature of the table (and of the drafts sweep).
    #[arg(long, default_value_t = 0.7)]
    temperature: f64,
    /// Number of drafts of the table (and of the temperature sweep).
    #[arg(long, default_value_t = 3)]
    num_drafts: usize,
    /// Temperature sweep (Figure 1), e.g. 0,0.1,...,1; empty: none.
    #[arg(long, value_delimiter = ',')]
    temperatures: Vec<f64>,
    /// Number-of-drafts sweep (Figure 2), e.g. 1,2,...,10; empty: none.
    #[arg(long, value_delimiter = ',')]
    drafts: Vec<usize>,
    /// Dataset of the sweeps (default: the first of --dataset).
    #[arg(long)]
    sweep_dataset: Option<Dataset>,
    /// Temperature at which the target samples its responses (0: argmax responses).
    #[arg(long, default_value_t = 0.7)]
    generation_temperature: f64,
    /// Largest logits kept per model at each position (their union is stored).
    #[arg(long, default_value_t = 64)]
    keep: usize,
    /// Prompts decoded together by the target.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Long articles are cut until the prompt fits in this many tokens.
    #[arg(long, default_value_t = 1024)]
    max_prompt_tokens: usize,
    /// Monte Carlo samples per position (RRS without replacement, K-SEQ, positional races).
    #[arg(long, default_value_t = 32)]
    mc_samples: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Folder of the cached distributions (default: `$MDSD_CACHE/acceptance`, else
    /// `~/.cache/mdsd/acceptance`).
    #[arg(long)]
    distributions: Option<PathBuf>,
    /// Generate again even when cached distributions match.
    #[arg(long)]
    regenerate: bool,
    /// Prompts without the chat template.
    #[arg(long)]
    no_chat: bool,
    /// How the draft's GGUF matrices run. `f32` (dequantized once) keeps the stored weights'
    /// values exactly and makes the teacher-forced draft pass one dense matmul per layer;
    /// `fast-cpu` re-quantizes some formats to Q4_K, which changes q slightly.
    #[arg(long, value_enum, default_value = "f32")]
    draft_weights: WeightFormat,
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Folder of the results.
    #[arg(long, default_value = "benches/results")]
    out_dir: PathBuf,
    /// Stem of the result files (default: `acceptance-<UTC time>`).
    #[arg(long)]
    name: Option<String>,
}

/// What identifies a dataset's distributions: a cached file is reused only if they match.
fn generation_key(args: &AcceptanceArgs, dataset: Dataset, target: &Path, draft: &Path) -> serde_json::Value {
    serde_json::json!({
        "dataset": dataset.name(),
        "target": target.file_name().map(|f| f.to_string_lossy().into_owned()),
        "draft": draft.file_name().map(|f| f.to_string_lossy().into_owned()),
        "samples": args.samples,
        "max_new_tokens": args.max_new_tokens,
        "generation_temperature": args.generation_temperature,
        "keep": args.keep,
        "max_prompt_tokens": args.max_prompt_tokens,
        "seed": args.seed,
        "chat": !args.no_chat,
        "draft_weights": format!("{:?}", args.draft_weights),
    })
}

fn cache_dir(args: &AcceptanceArgs) -> PathBuf {
    args.distributions
        .clone()
        .unwrap_or_else(|| engine::load::provision::FetchOptions::default().cache.join("acceptance"))
}

fn check_args(args: &AcceptanceArgs) -> anyhow::Result<()> {
    for &t in args.temperatures.iter().chain([&args.temperature, &args.generation_temperature]) {
        if !t.is_finite() || !(0.0..=100.0).contains(&t) {
            bail!("temperature {t} is out of range (0 to 100)");
        }
    }
    for &n in args.drafts.iter().chain([&args.num_drafts]) {
        if n == 0 || n > 64 {
            bail!("{n} drafts: the number of drafts must be 1 to 64");
        }
    }
    if args.samples == 0 || args.max_new_tokens == 0 || args.keep == 0 || args.mc_samples == 0 {
        bail!("--samples, --max-new-tokens, --keep and --mc-samples must be at least 1");
    }
    if args.dataset.is_empty() {
        bail!("no dataset given");
    }
    Ok(())
}

pub fn run(args: &AcceptanceArgs) -> anyhow::Result<()> {
    check_args(args)?;
    let datasets = {
        let mut d = args.dataset.clone();
        d.dedup();
        d
    };
    let sweep_dataset = args.sweep_dataset.unwrap_or(datasets[0]);
    if !datasets.contains(&sweep_dataset) && (!args.temperatures.is_empty() || !args.drafts.is_empty()) {
        bail!("--sweep-dataset {} is not among --dataset", sweep_dataset.name());
    }
    // Read every prompt file first: a missing or malformed file fails before any model work.
    let mut prompt_sets = Vec::new();
    for &d in &datasets {
        prompt_sets.push(prompts::read_prompts(d, &d.path(&args.data_dir), args.samples)?);
    }
    let (target_path, draft_file) = args.models.draft_files()?;
    let draft_path = draft_file.path();
    let interrupt = Interrupt::install();
    let stem = args.name.clone().unwrap_or_else(|| format!("acceptance-{}", utc_stamp()));
    let path = output_paths(&args.out_dir, &stem)?;
    let cache = cache_dir(args);
    let mut models: Option<(LoadedModel, crate::pair::LoadedDraft)> = None;
    let mut data: Vec<(Dataset, Positions, serde_json::Value)> = Vec::new();
    let mut interrupted = false;
    for (&dataset, prompts) in datasets.iter().zip(&prompt_sets) {
        let key = generation_key(args, dataset, &target_path, draft_path);
        let file = cache.join(format!("{}-{}.safetensors", dataset.name(), short_hash(&key.to_string())));
        if !args.regenerate && file.exists() {
            match Positions::load(&file) {
                Ok(p) if p.meta["key"] == key => {
                    eprintln!("bench: {}: {} positions from {}", dataset.name(), p.len(), file.display());
                    let info = serde_json::json!({"file": file, "cached": true});
                    data.push((dataset, p, info));
                    continue;
                }
                Ok(_) => eprintln!(
                    "bench: {}: {} was made with other settings; generating again",
                    dataset.name(),
                    file.display()
                ),
                Err(e) => eprintln!("bench: warning: {e:#}; generating again"),
            }
        }
        if models.is_none() {
            let device = parse_device(&args.device)?;
            let opts = LoadOptions { weights: args.draft_weights, ..Default::default() };
            models = Some(args.models.load(&device, &opts)?);
        }
        let (target, draft) = models.as_ref().expect("loaded above");
        let gen = GenerationOptions {
            temperature: args.generation_temperature,
            max_new_tokens: args.max_new_tokens,
            keep: args.keep,
            batch: args.batch,
            max_prompt_tokens: args.max_prompt_tokens,
            seed: args.seed,
            chat: !args.no_chat,
        };
        if gen.chat && !target.tokenizer.has_chat_template() {
            bail!("{}: the target has no chat template; pass --no-chat", target.path.display());
        }
        let (ids, cut) = generate::tokenize_prompts(target, prompts, &gen)?;
        let skipped = ids.iter().filter(|i| i.is_none()).count();
        if skipped > 0 {
            eprintln!(
                "bench: {}: {skipped} prompts are longer than --max-prompt-tokens and are left out",
                dataset.name()
            );
        }
        let todo = (ids.len() - skipped) as u64;
        let progress = Progress::new(todo, &format!("generating {}", dataset.name()));
        let meta = serde_json::json!({"key": key, "revision": git_revision(), "date_utc": utc_stamp()});
        let started = std::time::Instant::now();
        let positions = generate::generate_positions(target, draft, &ids, &gen, meta, &progress, &interrupt)?;
        progress.finish();
        let secs = started.elapsed().as_secs_f64();
        let done = positions.prompts();
        let info = serde_json::json!({
            "file": file, "cached": false, "prompts_cut": cut, "prompts_too_long": skipped,
            "generation_s": secs, "responses": done,
        });
        eprintln!(
            "bench: {}: {} positions from {} responses in {secs:.0} s ({cut} articles cut to fit)",
            dataset.name(),
            positions.len(),
            done,
        );
        if interrupt.requested() {
            let partial = path(&format!("{}.partial.safetensors", dataset.name()));
            positions.save(&partial)?;
            eprintln!("bench: interrupted: the distributions so far are in {}", partial.display());
            data.push((dataset, positions, info));
            interrupted = true;
            break;
        }
        positions.save(&file)?;
        data.push((dataset, positions, info));
    }
    if data.iter().all(|d| d.1.len() == 0) {
        bail!("no response positions to evaluate");
    }

    // Settings: the table's at every dataset; the sweeps on one.
    let table = Setting { temperature: args.temperature, drafts: args.num_drafts };
    let mut jobs: Vec<(usize, Setting)> = (0..data.len()).map(|i| (i, table)).collect();
    if let Some(si) = data.iter().position(|d| d.0 == sweep_dataset) {
        for &t in &args.temperatures {
            jobs.push((si, Setting { temperature: t, drafts: args.num_drafts }));
        }
        for &n in &args.drafts {
            jobs.push((si, Setting { temperature: args.temperature, drafts: n }));
        }
    }
    let mut seen = Vec::new();
    jobs.retain(|j| {
        let new = !seen.contains(j);
        seen.push(*j);
        new
    });
    let units: u64 = jobs.iter().map(|(i, _)| evaluate::progress_units(&data[*i].1)).sum();
    let progress = Progress::new(units, "evaluating");
    let mut cells: Vec<report::Cell> = Vec::new();
    for &(i, setting) in &jobs {
        if interrupt.requested() && !interrupted {
            interrupted = true;
        }
        if interrupted && !cells.is_empty() && interrupt.requested() {
            break;
        }
        let (dataset, positions, _) = &data[i];
        progress.set_message(format!("{} T={} n={}", dataset.name(), setting.temperature, setting.drafts));
        let values = evaluate::evaluate(positions, setting, args.mc_samples, args.seed, &progress)
            .with_context(|| format!("{} at T={} n={}", dataset.name(), setting.temperature, setting.drafts))?;
        cells.push(report::Cell {
            dataset: *dataset,
            setting,
            positions: positions.len(),
            prompts: positions.prompts(),
            metrics: evaluate::summarize(positions, &values),
        });
    }
    progress.finish();
    write_outputs(args, &path, &data, &cells, table, sweep_dataset, interrupted)
}

/// 12 hex digits of a stable hash (FNV-1a) of `s`.
fn short_hash(s: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:012x}", h & 0xffff_ffff_ffff)
}

/// Mean and largest probability mass dropped by the truncation, per model.
fn truncation(p: &Positions) -> serde_json::Value {
    let stat = |v: &[f32]| {
        let dropped: Vec<f64> = v.iter().map(|&k| (1.0 - k as f64).max(0.0)).collect();
        let mean = dropped.iter().sum::<f64>() / dropped.len().max(1) as f64;
        let max = dropped.iter().copied().fold(0.0, f64::max);
        serde_json::json!({"mean": mean, "max": max})
    };
    serde_json::json!({"target": stat(&p.target_kept), "draft": stat(&p.draft_kept)})
}

const FIGURE_METRICS: [Metric; 8] = [
    Metric::RrsWr,
    Metric::KSeq,
    Metric::StarWr,
    Metric::RrsWor,
    Metric::Positional,
    Metric::StarWor,
    Metric::GreedyVerify,
    Metric::StarGreedy,
];

/// A sweep: file name, axis label, its cells, and the x value of a setting.
type Sweep<'a> = (&'static str, &'static str, Vec<&'a report::Cell>, fn(&Setting) -> f64);

#[allow(clippy::too_many_arguments)]
fn write_outputs(
    args: &AcceptanceArgs,
    path: &impl Fn(&str) -> PathBuf,
    data: &[(Dataset, Positions, serde_json::Value)],
    cells: &[report::Cell],
    table: Setting,
    sweep_dataset: Dataset,
    interrupted: bool,
) -> anyhow::Result<()> {
    let datasets: Vec<Dataset> = data.iter().map(|d| d.0).collect();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let mut md = format!("# Acceptance rates: {}\n\n- command: `{command}`\n", args.models.label());
    md.push_str(&format!("- revision {}, {} UTC\n", git_revision(), utc_stamp()));
    if interrupted {
        md.push_str("- **interrupted**: the figures below cover the work finished before Ctrl-C\n");
    }
    md.push_str(&format!(
        "- responses: the target answers each prompt (chat template: {}), at most {} tokens sampled at T = {}; \
         p and q are read at every response position; {} largest logits kept per model\n",
        !args.no_chat, args.max_new_tokens, args.generation_temperature, args.keep
    ));
    for (d, p, info) in data {
        let t = truncation(p);
        md.push_str(&format!(
            "- {}: {} responses, {} positions; mass outside the kept tokens at T = 1: target mean {:.2e} (max {:.2e}), draft mean {:.2e} (max {:.2e}){}\n",
            d.title(),
            p.prompts(),
            p.len(),
            t["target"]["mean"].as_f64().unwrap_or(0.0),
            t["target"]["max"].as_f64().unwrap_or(0.0),
            t["draft"]["mean"].as_f64().unwrap_or(0.0),
            t["draft"]["max"].as_f64().unwrap_or(0.0),
            match info["prompts_cut"].as_u64() {
                Some(c) if c > 0 => format!("; {c} articles cut to fit {} prompt tokens", args.max_prompt_tokens),
                _ => String::new(),
            }
        ));
    }
    md.push_str(&format!(
        "- Monte Carlo: RRS without replacement and K-SEQ with {0} samples per position (Rao-Blackwellized), \
         positional races with {0} positions of noise per position where p and q hold more than 64 tokens \
         together (else integrated); everything else exact\n\nMean ± standard error in %, clustered by response. Δα: the gap to α* of the same \
         draft sampling, ↓/↑ where it exceeds twice its standard error. The generating-function row is the paper's \
         formula for α* without replacement, next to the exact value.\n",
        args.mc_samples
    ));
    md.push_str(&format!("\n## Table 1: T = {}, {} drafts\n\n", table.temperature, table.drafts));
    md.push_str(&report::table(cells, table, &datasets));
    let mut figures = Vec::new();
    let mut notes = Vec::new();
    let sweeps: [Sweep<'_>; 2] = [
        (
            "temperature",
            "temperature",
            cells
                .iter()
                .filter(|c| {
                    c.dataset == sweep_dataset
                        && c.setting.drafts == table.drafts
                        && args.temperatures.contains(&c.setting.temperature)
                })
                .collect(),
            |s| s.temperature,
        ),
        (
            "drafts",
            "number of drafts",
            cells
                .iter()
                .filter(|c| {
                    c.dataset == sweep_dataset
                        && c.setting.temperature == table.temperature
                        && args.drafts.contains(&c.setting.drafts)
                })
                .collect(),
            |s| s.drafts as f64,
        ),
    ];
    for (name, x_label, mut sweep, x) in sweeps {
        if sweep.len() < 2 {
            continue;
        }
        sweep.sort_by(|a, b| x(&a.setting).total_cmp(&x(&b.setting)));
        let fixed = if name == "temperature" {
            format!("{} drafts", table.drafts)
        } else {
            format!("T = {}", table.temperature)
        };
        md.push_str(&format!("\n## Acceptance against the {x_label}: {}, {fixed}\n\n", sweep_dataset.title()));
        md.push_str(&report::sweep_table(&sweep, x_label, |s| format!("{}", x(s)), &FIGURE_METRICS));
        let fig = plot::Figure {
            title: format!("{}: acceptance vs {x_label} ({fixed})", sweep_dataset.title()),
            x_label,
            xs: sweep.iter().map(|c| x(&c.setting)).collect(),
            cells: sweep.clone(),
            metrics: &FIGURE_METRICS,
        };
        let stem = path(name);
        match plot::write(&fig, &stem) {
            Ok(files) => {
                let png = files[0].file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
                md.push_str(&format!("\n![acceptance vs {x_label}]({png})\n"));
                figures.extend(files);
            }
            Err(e) => notes.push(format!("figure `{name}` not drawn: {e}")),
        }
    }
    for n in &notes {
        eprintln!("bench: note: {n}");
        md.push_str(&format!("\n- note: {n}\n"));
    }
    let doc = serde_json::json!({
        "config": {
            "command": command,
            "revision": git_revision(),
            "date_utc": utc_stamp(),
            "pair": args.models.label(),
            "datasets": datasets,
            "samples": args.samples,
            "max_new_tokens": args.max_new_tokens,
            "generation_temperature": args.generation_temperature,
            "table": table,
            "temperatures": args.temperatures,
            "drafts": args.drafts,
            "sweep_dataset": sweep_dataset,
            "keep": args.keep,
            "mc_samples": args.mc_samples,
            "max_prompt_tokens": args.max_prompt_tokens,
            "seed": args.seed,
            "interrupted": interrupted,
        },
        "data": data.iter().map(|(d, p, info)| serde_json::json!({
            "dataset": d, "responses": p.prompts(), "positions": p.len(), "truncation": truncation(p), "source": info,
        })).collect::<Vec<_>>(),
        "cells": cells,
        "figures": figures,
        "notes": notes,
    });
    let (json_path, md_path) = (path("json"), path("md"));
    std::fs::write(&json_path, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", json_path.display()))?;
    std::fs::write(&md_path, &md).with_context(|| format!("writing {}", md_path.display()))?;
    println!("{md}");
    eprintln!("bench: wrote {} and {}", json_path.display(), md_path.display());
    Ok(())
}
