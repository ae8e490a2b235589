//! `bench forward-cost`: seconds per forward of k new tokens (after a prefix), the cost curve
//! that decides which draft tree can pay, for the target and the draft of a pair, printed as a
//! markdown table. With `--llama-cpp PYTHON`, llama.cpp (through llama-cpp-python and
//! `benches/llama_cpp_forward.py`) is measured on the same GGUF files in the same run, so the
//! ratios compare like with like on a noisy machine. With `--eagle HEAD` the draft row is an
//! EAGLE head's step (k entries through its layer and the target's output layer, or the cut
//! copy of it with `--draft-vocab`): the head's cost against the target's forward.

use crate::pair::DraftFile;
use anyhow::{bail, Context};
use candle_core::{DType, Device, Tensor};
use clap::Args;
use engine::load::gguf::WeightFormat;
use engine::load::{load, parse_device, LoadOptions};
use engine::model::eagle::EagleHead;
use engine::model::{causal_bias, DecoderModel};
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
    /// The draft's logits (a draft model's or an EAGLE head's) only for the first N token ids,
    /// as `mdsd generate --draft-vocab` (which defaults to 32768). 0 (the default here): the
    /// whole vocabulary, as llama.cpp computes it and as the CPU forward costs in
    /// docs/results/README.md#cpu-forward-cost were measured.
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
    /// Also write the costs as JSON (`bench predict --costs` reads it): seconds per forward by
    /// role (`target`, `draft`, `eagle_head`) and k, llama.cpp's apart.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Also capture each timed forward (with its logits) once and time its replays
    /// (`engine::kernels::device::graph`: one CUDA graph launch on a GPU, the calls again on
    /// the CPU), and check that a replay's logits equal the eager forward's bit for bit. A
    /// forward that cannot be captured is reported with candle's or the driver's error.
    #[arg(long)]
    graph: bool,
}

/// A model's timings: best-of-reps seconds per k, their splits (`--breakdown`), and the
/// replays (`--graph`).
struct Timed {
    secs: Vec<f64>,
    splits: Vec<Split>,
    graphs: Vec<GraphProbe>,
}

/// `--graph` for one k: best-of-reps seconds of a replay and the copy of its logits, and
/// whether the replay's logits equal the eager forward's bit for bit; or why the capture failed.
enum GraphProbe {
    Replayed { secs: f64, equal: bool },
    Failed(String),
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
    let (target, draft) = args.models.draft_files()?;
    println!("Seconds per forward of k new tokens after {} cached, best of {}:\n", args.prefix, args.reps);
    println!("| model | engine | {} |", ks.iter().map(|k| format!("k={k}")).collect::<Vec<_>>().join(" | "));
    println!("|---|---|{}", "---|".repeat(ks.len()));
    let draft_rows = (args.draft_vocab > 0).then_some(args.draft_vocab);
    let rows_note = |rows: Option<usize>| rows.map_or_else(String::new, |n| format!(", logits of the first {n} ids"));
    let mut report = CostReport::new(args, &ks);
    let target_model =
        load_model(&target, &device, &LoadOptions { weights: args.target_weights, ..Default::default() })?;
    let timed = time_model(&target_model, &ks, args)?;
    print_rows(&file_name(&target), "target", &format!("mdsd, {}", weights_name(args.target_weights)), &timed, args);
    report.add("target", &target, &timed, target_model.fused_decode());
    report.add_llama_cpp("target", llama_cpp_row(&target, &ks, args)?);
    match draft {
        DraftFile::Model(path) => {
            drop(target_model);
            let opts = LoadOptions { weights: args.draft_weights, output_rows: draft_rows, ..Default::default() };
            let draft_model = load_model(&path, &device, &opts)?;
            let timed = time_model(&draft_model, &ks, args)?;
            let engine = format!("mdsd, {}{}", weights_name(args.draft_weights), rows_note(draft_rows));
            print_rows(&file_name(&path), "draft", &engine, &timed, args);
            report.add("draft", &path, &timed, draft_model.fused_decode());
            report.add_llama_cpp("draft", llama_cpp_row(&path, &ks, args)?);
        }
        DraftFile::EagleHead(dir) => {
            let mut head = EagleHead::load(&dir, &target_model)
                .with_context(|| format!("loading the EAGLE head {}", dir.display()))?;
            head.set_output_rows(&target_model, args.draft_vocab)?;
            let timed = time_head(&target_model, &head, &ks, args)?;
            print_rows(&file_name(&dir), "EAGLE head", &format!("mdsd{}", rows_note(draft_rows)), &timed, args);
            report.add("eagle_head", &dir, &timed, target_model.fused_decode());
        }
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report.value)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The costs as `--json` writes them: `{"device", "prefix", "reps", "ks", "secs": {role: {k:
/// seconds}}, "files": {role: file}, "fused_decode": {role: bool}, "llama_cpp_secs": {role:
/// {k: seconds}}}`.
struct CostReport {
    value: serde_json::Value,
    ks: Vec<usize>,
}

impl CostReport {
    fn new(args: &ForwardCostArgs, ks: &[usize]) -> Self {
        let value = serde_json::json!({
            "device": args.device,
            "prefix": args.prefix,
            "reps": args.reps,
            "ks": ks,
            "draft_vocab": args.draft_vocab,
            "secs": {},
            "files": {},
            "fused_decode": {},
            "llama_cpp_secs": {},
        });
        Self { value, ks: ks.to_vec() }
    }

    fn by_k(&self, secs: &[f64]) -> serde_json::Value {
        self.ks.iter().zip(secs).map(|(k, s)| (k.to_string(), serde_json::json!(s))).collect()
    }

    fn add(&mut self, role: &str, file: &Path, timed: &Timed, fused: bool) {
        self.value["secs"][role] = self.by_k(&timed.secs);
        self.value["files"][role] = file.display().to_string().into();
        self.value["fused_decode"][role] = fused.into();
        if !timed.graphs.is_empty() {
            let probes = |f: fn(&GraphProbe) -> serde_json::Value| -> serde_json::Value {
                self.ks.iter().zip(&timed.graphs).map(|(k, g)| (k.to_string(), f(g))).collect()
            };
            let graph_secs = probes(|g| match g {
                GraphProbe::Replayed { secs, .. } => serde_json::json!(secs),
                GraphProbe::Failed(_) => serde_json::Value::Null,
            });
            let graph_equal = probes(|g| match g {
                GraphProbe::Replayed { equal, .. } => serde_json::json!(equal),
                GraphProbe::Failed(_) => serde_json::Value::Null,
            });
            let graph_errors = probes(|g| match g {
                GraphProbe::Replayed { .. } => serde_json::Value::Null,
                GraphProbe::Failed(e) => serde_json::json!(e),
            });
            self.value["graph_secs"][role] = graph_secs;
            self.value["graph_equal"][role] = graph_equal;
            self.value["graph_errors"][role] = graph_errors;
        }
    }

    fn add_llama_cpp(&mut self, role: &str, secs: Option<Vec<f64>>) {
        if let Some(secs) = secs {
            self.value["llama_cpp_secs"][role] = self.by_k(&secs);
        }
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
}

fn load_model(path: &Path, device: &Device, opts: &LoadOptions) -> anyhow::Result<DecoderModel> {
    Ok(load(path, device, opts).with_context(|| format!("loading {}", path.display()))?.model)
}

/// The table's rows of one model: the whole forward per k, and with `--breakdown` its parts.
fn print_rows(name: &str, role: &str, engine: &str, timed: &Timed, args: &ForwardCostArgs) {
    let Timed { secs, splits, graphs } = timed;
    println!("| {name} ({role}) | {engine} | {} |", cells(secs));
    if !graphs.is_empty() {
        let replays: Vec<String> = graphs
            .iter()
            .map(|g| match g {
                GraphProbe::Replayed { secs, equal: true } => cells(&[*secs]),
                GraphProbe::Replayed { secs, equal: false } => format!("{} (logits differ)", cells(&[*secs])),
                GraphProbe::Failed(_) => "capture failed".into(),
            })
            .collect();
        println!("| | replayed | {} |", replays.join(" | "));
        for (k, g) in args.ks.split(',').zip(graphs) {
            if let GraphProbe::Failed(e) = g {
                eprintln!("k={}: the capture failed: {e}", k.trim());
            }
        }
    }
    if args.breakdown {
        let part = |f: fn(&Split) -> f64| splits.iter().map(f).collect::<Vec<_>>();
        let body = if role == "EAGLE head" { "head layer" } else { "blocks" };
        println!("| | {body} | {} |", cells(&part(|s| s.blocks)));
        println!("| | output layer | {} |", cells(&part(|s| s.output_layer)));
        println!("| | logits to host | {} |", cells(&part(|s| s.to_host)));
    }
}

fn llama_cpp_row(path: &Path, ks: &[usize], args: &ForwardCostArgs) -> anyhow::Result<Option<Vec<f64>>> {
    let Some(python) = &args.llama_cpp else { return Ok(None) };
    let secs = time_llama_cpp(python, path, ks, args)?;
    println!("| | llama.cpp, {} threads | {} |", args.threads, cells(&secs));
    Ok(Some(secs))
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

/// Best-of-`reps` seconds of one forward of `m` plus the logits of every new row, per k, after
/// `--prefix` cached tokens.
fn time_model(m: &DecoderModel, ks: &[usize], args: &ForwardCostArgs) -> anyhow::Result<Timed> {
    let kmax = *ks.iter().max().expect("non-empty");
    let mut cache = m.new_cache(args.prefix + kmax + 1)?;
    // Token ids of no meaning, kept inside the model's vocabulary (tiny test models have 48).
    let vocab = m.config().vocab_size as u32;
    let prefix: Vec<u32> = (0..args.prefix as u32).map(|i| (100 + i) % vocab).collect();
    if !prefix.is_empty() {
        m.forward_chain(&prefix, &mut cache)?;
    }
    let inputs = timed_inputs(ks, args, vocab, m.dtype(), m.device())?;
    time_forwards(
        ks,
        args,
        m.device(),
        |i| {
            let (toks, pos, bias) = &inputs[i];
            cache.truncate(args.prefix);
            m.forward(toks, pos, bias, &mut cache)
        },
        |hidden| m.logits(hidden),
    )
}

/// [`time_model`] for an EAGLE head drafting for `target`: `k` entries (zero features, the
/// target's output layer or its cut copy) after `--prefix` cached entries.
fn time_head(target: &DecoderModel, head: &EagleHead, ks: &[usize], args: &ForwardCostArgs) -> anyhow::Result<Timed> {
    let (device, dtype) = (target.device(), target.dtype());
    let kmax = *ks.iter().max().expect("non-empty");
    let mut cache = head.new_cache(args.prefix + kmax + 1)?;
    let vocab = target.config().vocab_size as u32;
    let hidden = head.config().hidden_size;
    if args.prefix > 0 {
        let n = args.prefix;
        let tokens: Vec<u32> = (0..n as u32).map(|i| (100 + i) % vocab).collect();
        let pos: Vec<u32> = (0..n as u32).collect();
        let features = Tensor::zeros((n, hidden), dtype, device)?;
        head.forward(target, &features, &tokens, &pos, &causal_bias(0, n, dtype, device)?, &mut cache)?;
    }
    let inputs = timed_inputs(ks, args, vocab, dtype, device)?;
    let features: Vec<Tensor> =
        ks.iter().map(|&k| Tensor::zeros((k, hidden), dtype, device)).collect::<Result<_, _>>()?;
    time_forwards(
        ks,
        args,
        device,
        |i| {
            let (toks, pos, bias) = &inputs[i];
            cache.truncate(args.prefix);
            head.forward(target, &features[i], toks, pos, bias, &mut cache)
        },
        |out| head.logits(target, out),
    )
}

type Inputs = (Vec<u32>, Vec<u32>, Tensor);

/// Per k: token ids (inside the vocabulary), positions after the prefix, and the causal bias.
fn timed_inputs(
    ks: &[usize],
    args: &ForwardCostArgs,
    vocab: u32,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<Vec<Inputs>> {
    ks.iter()
        .map(|&k| {
            let toks: Vec<u32> = (0..k as u32).map(|i| (500 + i) % vocab).collect();
            let pos: Vec<u32> = (args.prefix as u32..(args.prefix + k) as u32).collect();
            Ok((toks, pos, causal_bias(args.prefix, k, dtype, device)?))
        })
        .collect()
}

/// Best-of-`reps` seconds per k (index `i` into `ks`) of `forward(i)` (which resets its cache
/// to the prefix and runs the k rows) plus `logits` of its output copied to the host, as the
/// engine's steps copy them (into a kept buffer); with `--breakdown`, the three parts apart;
/// with `--graph`, the replays.
fn time_forwards(
    ks: &[usize],
    args: &ForwardCostArgs,
    device: &Device,
    mut forward: impl FnMut(usize) -> candle_core::Result<Tensor>,
    logits: impl Fn(&Tensor) -> candle_core::Result<Tensor>,
) -> anyhow::Result<Timed> {
    let mut out = Vec::with_capacity(ks.len());
    let mut splits = Vec::with_capacity(ks.len());
    let mut host = engine::decode::host_copy::HostLogits::default();
    for i in 0..ks.len() {
        let mut best = f64::INFINITY;
        for _ in 0..args.reps {
            let t0 = Instant::now();
            let hidden = forward(i)?;
            let copied = host.copy(&logits(&hidden)?)?;
            best = best.min(t0.elapsed().as_secs_f64());
            std::hint::black_box(copied);
        }
        out.push(best);
        let mut split = Split { blocks: f64::INFINITY, output_layer: f64::INFINITY, to_host: f64::INFINITY };
        for _ in 0..if args.breakdown { args.reps } else { 0 } {
            let t0 = Instant::now();
            let hidden = forward(i)?;
            device.synchronize()?;
            let t1 = Instant::now();
            let l = logits(&hidden)?;
            device.synchronize()?;
            let t2 = Instant::now();
            std::hint::black_box(host.copy(&l)?);
            let t3 = Instant::now();
            split.blocks = split.blocks.min((t1 - t0).as_secs_f64());
            split.output_layer = split.output_layer.min((t2 - t1).as_secs_f64());
            split.to_host = split.to_host.min((t3 - t2).as_secs_f64());
        }
        splits.push(split);
    }
    let mut graphs = Vec::new();
    for i in 0..if args.graph { ks.len() } else { 0 } {
        graphs.push(probe_graph(args.reps, device, &mut host, || logits(&forward(i)?))?);
    }
    Ok(Timed { secs: out, splits, graphs })
}

/// `--graph` for one forward (`run`: the forward and its logits): its eager logits, then its
/// capture, the first replay's logits against them, and the best of `reps` replays with the
/// copy of their logits to the host (what [`time_forwards`] times of the eager forward).
fn probe_graph(
    reps: usize,
    device: &Device,
    host: &mut engine::decode::host_copy::HostLogits,
    mut run: impl FnMut() -> candle_core::Result<Tensor>,
) -> anyhow::Result<GraphProbe> {
    let want: Vec<u32> = host.copy(&run()?)?.iter().map(|x| x.to_bits()).collect();
    let mut replayed = match engine::kernels::device::graph::ReplayedForward::capture(device, run) {
        Ok(r) => r,
        Err(e) => return Ok(GraphProbe::Failed(e.to_string())),
    };
    let first = replayed.replay()?;
    let equal = host.copy(&first)?.iter().map(|x| x.to_bits()).eq(want.iter().copied());
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t0 = Instant::now();
        let out = replayed.replay()?;
        std::hint::black_box(host.copy(&out)?);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    Ok(GraphProbe::Replayed { secs: best, equal })
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
