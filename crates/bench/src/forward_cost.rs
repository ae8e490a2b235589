//! `bench forward-cost`: seconds per forward of k new tokens (after a prefix), the cost curve
//! that decides which draft tree can pay, for the target and the draft of a pair, printed as a
//! markdown table. With `--llama-cpp PYTHON`, llama.cpp (through llama-cpp-python and
//! `benches/llama_cpp_forward.py`) is measured on the same GGUF files in the same run, so the
//! ratios compare like with like on a noisy machine.

use anyhow::{bail, Context};
use candle_core::Device;
use clap::Args;
use engine::load::{load, parse_device, LoadOptions};
use engine::model::causal_bias;
use engine::model::gguf::WeightFormat;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct ForwardCostArgs {
    #[command(flatten)]
    models: crate::pair::PairArgs,
    /// How the target's weights are held (`stored` keeps p exact).
    #[arg(long, value_enum, default_value = "stored")]
    target_weights: WeightFormat,
    /// How the draft's weights are held (as `mdsd generate` does by default).
    #[arg(long, value_enum, default_value = "fast-cpu")]
    draft_weights: WeightFormat,
    /// The draft's logits only for the first N token ids, as `mdsd generate --draft-vocab`
    /// (which defaults to 32768). 0 (the default here): the whole vocabulary, as llama.cpp
    /// computes it and as the earlier tables in benches/RESULTS.md were measured.
    #[arg(long, default_value_t = 0)]
    draft_vocab: usize,
    /// Comma-separated numbers of new tokens per forward.
    #[arg(long, default_value = "1,2,4,8,16,32")]
    ks: String,
    /// Cached tokens before the timed forward.
    #[arg(long, default_value_t = 64)]
    prefix: usize,
    /// Repetitions per k; the best is reported.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Also time llama.cpp with this Python (which must have `llama_cpp` installed).
    #[arg(long)]
    llama_cpp: Option<PathBuf>,
    /// Threads for llama.cpp.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Also split our time into the blocks (device synchronised), the output layer, and
    /// the copy of the logits to the host, per k (best of `--reps` each).
    #[arg(long)]
    breakdown: bool,
}

/// Best-of-reps seconds of one forward split in three parts.
#[derive(Clone, Copy)]
struct Split {
    blocks: f64,
    output_layer: f64,
    to_host: f64,
}

pub fn run(args: &ForwardCostArgs) -> anyhow::Result<()> {
    let ks: Vec<usize> = args
        .ks
        .split(',')
        .map(|s| s.trim().parse::<usize>().with_context(|| format!("--ks: `{s}` is not a number")))
        .collect::<anyhow::Result<_>>()?;
    if ks.is_empty() || ks.contains(&0) || args.reps == 0 {
        bail!("--ks needs positive numbers and --reps at least 1");
    }
    let device = parse_device(&args.device)?;
    let (target, draft) = args.models.files()?;
    println!("Seconds per forward of k new tokens after {} cached, best of {}:\n", args.prefix, args.reps);
    println!("| model | engine | {} |", ks.iter().map(|k| format!("k={k}")).collect::<Vec<_>>().join(" | "));
    println!("|---|---|{}", "---|".repeat(ks.len()));
    let draft_rows = (args.draft_vocab > 0).then_some(args.draft_vocab);
    let roles = [("target", &target, args.target_weights, None), ("draft", &draft, args.draft_weights, draft_rows)];
    for (role, path, weights, output_rows) in roles {
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let opts = LoadOptions { weights, output_rows, ..Default::default() };
        let (secs, splits) = time_ours(path, &device, &opts, &ks, args)?;
        let rows = output_rows.map_or_else(String::new, |n| format!(", logits of the first {n} ids"));
        println!("| {name} ({role}) | mdsd, {}{rows} | {} |", weights_name(weights), cells(&secs));
        if args.breakdown {
            let part = |f: fn(&Split) -> f64| splits.iter().map(f).collect::<Vec<_>>();
            println!("| | blocks | {} |", cells(&part(|s| s.blocks)));
            println!("| | output layer | {} |", cells(&part(|s| s.output_layer)));
            println!("| | logits to host | {} |", cells(&part(|s| s.to_host)));
        }
        if let Some(python) = &args.llama_cpp {
            let secs = time_llama_cpp(python, path, &ks, args)?;
            println!("| | llama.cpp, {} threads | {} |", args.threads, cells(&secs));
        }
    }
    Ok(())
}

fn weights_name(w: WeightFormat) -> &'static str {
    match w {
        WeightFormat::AsStored => "weights as stored",
        WeightFormat::FastCpu => "fast-cpu weights",
        WeightFormat::Dequantized => "f32 weights",
    }
}

/// Seconds to four decimals, or in scientific notation below a millisecond (tiny models).
fn cells(secs: &[f64]) -> String {
    let cell = |s: f64| if s >= 1e-3 || s == 0.0 { format!("{s:.4}") } else { format!("{s:.3e}") };
    secs.iter().map(|&s| cell(s)).collect::<Vec<_>>().join(" | ")
}

/// Best-of-`reps` seconds of one forward plus the logits of every new row, per k.
fn time_ours(
    path: &Path,
    device: &Device,
    opts: &LoadOptions,
    ks: &[usize],
    args: &ForwardCostArgs,
) -> anyhow::Result<(Vec<f64>, Vec<Split>)> {
    let m = load(path, device, opts).with_context(|| format!("loading {}", path.display()))?.model;
    let kmax = *ks.iter().max().expect("non-empty");
    let mut cache = m.new_cache(args.prefix + kmax + 1)?;
    // Token ids of no meaning, kept inside the model's vocabulary (tiny test models have 48).
    let vocab = m.config().vocab_size as u32;
    let prefix: Vec<u32> = (0..args.prefix as u32).map(|i| (100 + i) % vocab).collect();
    if !prefix.is_empty() {
        m.forward_chain(&prefix, &mut cache)?;
    }
    let mut out = Vec::with_capacity(ks.len());
    let mut splits = Vec::with_capacity(ks.len());
    // The logits reach the host as the engine's steps copy them: into a kept buffer.
    let mut host = engine::host_copy::HostLogits::default();
    for &k in ks {
        let toks: Vec<u32> = (0..k as u32).map(|i| (500 + i) % vocab).collect();
        let pos: Vec<u32> = (args.prefix as u32..(args.prefix + k) as u32).collect();
        let bias = causal_bias(args.prefix, k, m.dtype(), device)?;
        let mut best = f64::INFINITY;
        for _ in 0..args.reps {
            cache.truncate(args.prefix);
            let t0 = Instant::now();
            let hidden = m.forward(&toks, &pos, &bias, &mut cache)?;
            let logits = host.copy(&m.logits(&hidden)?)?;
            best = best.min(t0.elapsed().as_secs_f64());
            std::hint::black_box(logits);
        }
        out.push(best);
        let mut split = Split { blocks: f64::INFINITY, output_layer: f64::INFINITY, to_host: f64::INFINITY };
        for _ in 0..if args.breakdown { args.reps } else { 0 } {
            cache.truncate(args.prefix);
            let t0 = Instant::now();
            let hidden = m.forward(&toks, &pos, &bias, &mut cache)?;
            device.synchronize()?;
            let t1 = Instant::now();
            let logits = m.logits(&hidden)?;
            device.synchronize()?;
            let t2 = Instant::now();
            std::hint::black_box(host.copy(&logits)?);
            let t3 = Instant::now();
            split.blocks = split.blocks.min((t1 - t0).as_secs_f64());
            split.output_layer = split.output_layer.min((t2 - t1).as_secs_f64());
            split.to_host = split.to_host.min((t3 - t2).as_secs_f64());
        }
        splits.push(split);
    }
    Ok((out, splits))
}

/// Runs `benches/llama_cpp_forward.py` and reads the seconds from its last table row.
fn time_llama_cpp(python: &Path, model: &Path, ks: &[usize], args: &ForwardCostArgs) -> anyhow::Result<Vec<f64>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/llama_cpp_forward.py");
    let ks_arg = ks.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let out = std::process::Command::new(python)
        .arg(&script)
        .arg(model)
        .args(["--threads", &args.threads.to_string(), "--reps", &args.reps.to_string(), "--ks", &ks_arg])
        .args(["--prefix", &args.prefix.to_string()])
        .output()
        .with_context(|| format!("running {} {}", python.display(), script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("llama.cpp timing failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    let last = stdout.lines().rev().find(|l| l.starts_with('|')).context("llama.cpp timing printed no table")?;
    let secs: Vec<f64> = last.split('|').map(str::trim).filter_map(|c| c.parse().ok()).collect();
    if secs.len() != ks.len() {
        bail!("llama.cpp timing: expected {} figures in `{last}`", ks.len());
    }
    Ok(secs)
}
