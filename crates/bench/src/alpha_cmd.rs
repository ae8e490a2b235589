//! `bench alpha`: acceptance rates of every draft construction and verifier for (p, q) pairs
//! given as JSON lines. A researcher's calculator, and a check of the samplers crate.

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::SeedableRng;
use samplers::alpha::{self, rrs};
use samplers::dist::{validate_target_and_draft, Warp};
use samplers::positional;
use samplers::{DraftConstruction, PositionalNoise};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::io::{BufRead, Write};
use std::path::PathBuf;

/// Options of `bench alpha`.
#[derive(Debug, Clone, clap::Args)]
pub struct AlphaArgs {
    /// JSON lines, each with `p` and `q` (probability arrays of equal length) or
    /// `target_logits` and `draft_logits`, and optionally its own `n`. `-` reads stdin.
    #[arg(long)]
    pub input: PathBuf,
    /// Number of drafts for lines without their own `n`.
    #[arg(long, default_value_t = 3)]
    pub n: usize,
    /// Temperature applied to logits lines (0 = argmax).
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    /// Top-k applied to logits lines (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Top-p applied to logits lines (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// Min-p applied to logits lines (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f64,
    /// `all`, or `optimal` (alpha* of every construction and K-SEQ's alpha; no RRS).
    #[arg(long, default_value = "all", value_parser = ["all", "optimal"])]
    pub methods: String,
    /// Monte Carlo samples for RRS without replacement on supports over 8 tokens (each sample
    /// scores its whole rejection path exactly, so the standard error is small: about 6e-5 with
    /// 200 samples on a model-like pair at vocabulary 151,936).
    #[arg(long, default_value_t = 200)]
    pub samples: usize,
    /// Seed of the Monte Carlo estimates (also the noise of positional races' estimate, over
    /// 10 x --samples positions).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    p: Option<Vec<f64>>,
    q: Option<Vec<f64>>,
    target_logits: Option<Vec<f32>>,
    draft_logits: Option<Vec<f32>>,
    n: Option<usize>,
    #[serde(default)]
    #[allow(dead_code)]
    id: Option<Value>,
}

/// Largest support on which RRS without replacement is enumerated exactly.
const EXACT_RRS_WOR_SUPPORT: usize = 8;

/// Runs the calculator; returns the number of bad lines (each reported on stderr).
pub fn run(args: &AlphaArgs) -> Result<usize> {
    let warp = Warp { temperature: args.temperature, top_k: args.top_k, top_p: args.top_p, min_p: args.min_p };
    warp.check().context("bad sampling options")?;
    let reader: Box<dyn BufRead> = if args.input.as_os_str() == "-" {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        let f = std::fs::File::open(&args.input)
            .with_context(|| format!("cannot open input file {}", args.input.display()))?;
        Box::new(std::io::BufReader::new(f))
    };
    let mut rng = StdRng::seed_from_u64(args.seed);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut bad = 0;
    for (k, line) in reader.lines().enumerate() {
        let number = k + 1;
        let line = line.with_context(|| format!("{}: cannot read line {number}", args.input.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        match evaluate(&line, args, &warp, &mut rng) {
            Ok(v) => writeln!(out, "{v}")?,
            Err(e) => {
                bad += 1;
                eprintln!("error: {}: line {number}: {e:#}", args.input.display());
            }
        }
    }
    Ok(bad)
}

fn evaluate(text: &str, args: &AlphaArgs, warp: &Warp, rng: &mut StdRng) -> Result<Value> {
    let line: Line = serde_json::from_str(text).context("not a valid JSON object of the expected fields")?;
    let (p, q) = match (line.p, line.q, line.target_logits, line.draft_logits) {
        (Some(p), Some(q), None, None) => (p, q),
        (None, None, Some(t), Some(d)) => {
            if t.len() != d.len() {
                bail!("target_logits has {} entries but draft_logits has {}", t.len(), d.len());
            }
            let (mut p, mut q) = (Vec::new(), Vec::new());
            warp.apply(&t, &mut p).context("target_logits")?;
            warp.apply(&d, &mut q).context("draft_logits")?;
            (p, q)
        }
        _ => bail!("give either `p` and `q`, or `target_logits` and `draft_logits`"),
    };
    let n = line.n.unwrap_or(args.n);
    if n == 0 {
        bail!("n = 0: the number of drafts must be at least 1");
    }
    validate_target_and_draft(&p, &q)?;
    let mut o = Map::new();
    o.insert("n".into(), json!(n));
    o.insert("vocab".into(), json!(p.len()));
    let star = |c: DraftConstruction| alpha::alpha_star(c, &p, &q, n);
    o.insert("alpha_star_wr".into(), json!(star(DraftConstruction::WithReplacement)?));
    o.insert("alpha_star_wor".into(), json!(star(DraftConstruction::WithoutReplacement)?));
    o.insert("alpha_star_greedy".into(), json!(star(DraftConstruction::Greedy)?));
    o.insert("alpha_star_cps".into(), json!(star(DraftConstruction::ConditionalPoisson)?));
    o.insert("alpha_star_topk".into(), json!(star(DraftConstruction::TopK)?));
    o.insert("alpha_star_spechub".into(), if n == 2 { json!(star(DraftConstruction::SpecHub)?) } else { Value::Null });
    o.insert("alpha_kseq".into(), json!(alpha::alpha_kseq(&p, &q, n)));
    if args.methods == "all" {
        o.insert("alpha_rrs_wr".into(), json!(rrs::alpha_rrs_with_replacement(&p, &q, n)));
        o.insert("alpha_rrs_wr_stderr".into(), json!(0.0));
        o.insert("alpha_rrs_wr_method".into(), json!("exact"));
        let support = samplers::dist::support_size(&q);
        if support <= EXACT_RRS_WOR_SUPPORT {
            o.insert("alpha_rrs_wor".into(), json!(rrs::alpha_rrs_without_replacement_exact(&p, &q, n)));
            o.insert("alpha_rrs_wor_stderr".into(), json!(0.0));
            o.insert("alpha_rrs_wor_method".into(), json!("exact"));
        } else {
            let e = rrs::alpha_rrs_without_replacement_monte_carlo(&p, &q, n, args.samples, rng);
            o.insert("alpha_rrs_wor".into(), json!(e.mean));
            o.insert("alpha_rrs_wor_stderr".into(), json!(e.stderr));
            o.insert("alpha_rrs_wor_method".into(), json!(format!("monte-carlo ({} samples)", e.samples)));
        }
        positional(&p, &q, n, args, &mut o)?;
    }
    Ok(Value::Object(o))
}

/// The acceptance of `n` drafts with positional randomness (`mdsd generate --reproducible`:
/// the draft's `n` best races against the target's race on the same noise): exact by
/// quadrature on small supports, else the fraction of `10 × --samples` positions where the
/// target's token is a draft.
fn positional(p: &[f64], q: &[f64], n: usize, args: &AlphaArgs, o: &mut Map<String, Value>) -> Result<()> {
    let positions = 10 * args.samples.max(1);
    let (rate, exact) = positional::estimated_acceptance(p, q, n, PositionalNoise::new(args.seed), positions as u64)?;
    let (stderr, method) = if exact {
        (0.0, "exact".to_string())
    } else {
        ((rate * (1.0 - rate) / positions as f64).sqrt(), format!("monte-carlo ({positions} positions)"))
    };
    o.insert("alpha_positional".into(), json!(rate));
    o.insert("alpha_positional_stderr".into(), json!(stderr));
    o.insert("alpha_positional_method".into(), json!(method));
    Ok(())
}
