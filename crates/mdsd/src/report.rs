//! What `mdsd generate` (and `mdsd chat`) prints after the text: the statistics on stderr, or with `--json` one
//! JSON object.

use crate::cli::{GenerateArgs, NgramMode};
use engine::decode::draft::window::DraftWindow;
use engine::decode::logprobs::TokenLogprobs;
use engine::decode::{PrefillProgress, Stats};
use engine::tokenizer::TextTokenizer;
use samplers::Verifier;
use serde_json::{json, Value};
use std::path::Path;

/// The `--json` object: the statistics, then the text and the settings that produced it.
pub struct Json<'a> {
    pub text: String,
    pub target: &'a Path,
    /// The draft model's or EAGLE head's path (`None`: no draft model).
    pub draft: Option<String>,
    pub tree: &'a str,
    /// The draft window in use (`None`: the whole context, or no draft model).
    pub window: Option<DraftWindow>,
    pub verifier: Verifier,
}

impl Json<'_> {
    pub fn into_value(self, stats: &Stats, args: &GenerateArgs) -> serde_json::Result<Value> {
        let mut obj = serde_json::to_value(stats)?;
        obj["text"] = Value::String(self.text);
        obj["target"] = Value::String(self.target.display().to_string());
        obj["draft"] = match self.draft {
            Some(d) => d.into(),
            None if args.ngram == NgramMode::Only && !args.no_spec => {
                format!("ngram {}-{}", args.ngram_flags.ngram_min, args.ngram_flags.ngram_max).into()
            }
            None => Value::Null,
        };
        obj["tree"] = self.tree.into();
        obj["ngram"] = if args.no_spec { Value::Null } else { args.ngram.name().into() };
        obj["draft_window"] = match self.window {
            Some(w) => serde_json::json!({ "sinks": w.sinks, "recent": w.recent }),
            None => Value::Null,
        };
        let (construction, verifier) = if args.reproducible {
            ("positional".to_string(), "positional".to_string())
        } else {
            (args.construction().to_string(), self.verifier.to_string())
        };
        obj["draft_sampling"] = if args.no_spec { Value::Null } else { construction.into() };
        obj["verifier"] = if args.no_spec { Value::Null } else { verifier.into() };
        obj["randomness"] = args.randomness().name().into();
        obj["seed"] = args.seed.into();
        obj["temperature"] = args.temperature.into();
        obj["device"] = args.device.clone().into();
        Ok(obj)
    }
}

/// `generate --json --logprobs N`'s `logprobs`: per generated token its id, text (the token's
/// bytes, a partial UTF-8 character shown as U+FFFD), log-probability and alternatives.
pub fn logprobs(tok: &TextTokenizer, records: &[TokenLogprobs]) -> Value {
    let text = |id: u32| tok.token_text(id);
    records
        .iter()
        .map(|r| {
            let top: Vec<Value> =
                r.top.iter().map(|&(id, lp)| json!({"token": id, "text": text(id), "logprob": lp})).collect();
            json!({"token": r.token, "text": text(r.token), "logprob": r.logprob, "top": top})
        })
        .collect()
}

/// The statistics on stderr: the settings, tokens, tau and speed, lookup steps, acceptance per
/// depth, `auto`'s summary and the time split.
pub fn print_stats(s: &Stats, args: &GenerateArgs, verifier: Verifier, window: Option<DraftWindow>) {
    eprintln!("--- {}", mode(args, verifier, window));
    eprintln!(
        "new tokens {} (prompt {}) · target forwards {} · tau {:.2} · {:.2} tokens/s · stop: {}",
        s.new_tokens, s.prompt_tokens, s.target_forwards, s.tau, s.tokens_per_s, s.stop_reason
    );
    if args.ngram == NgramMode::First && !args.no_spec {
        eprintln!("n-gram steps: {} of {}, {} tokens", s.ngram_steps, s.target_forwards, s.ngram_tokens);
    }
    if s.undrafted_steps > 0 {
        eprintln!(
            "steps without drafts at the end of the context (or of the draft's): {} of {}",
            s.undrafted_steps, s.target_forwards
        );
    }
    if !s.acceptance_per_depth.is_empty() {
        let per: Vec<String> =
            s.acceptance_per_depth.iter().enumerate().map(|(d, a)| format!("d{}={:.2}", d + 1, a)).collect();
        eprintln!("acceptance per depth: {}", per.join(" "));
    }
    if !s.auto_tree.is_empty() {
        eprintln!("tree auto: {}", s.auto_tree);
    }
    let costs = if s.auto_costs_s > 0.0 {
        format!(" (auto's cost measurements {:.2} s)", s.auto_costs_s)
    } else {
        String::new()
    };
    eprintln!(
        "time: prefill {:.2} s{costs} · draft {:.2} s · target {:.2} s · verify {:.3} s · total {:.2} s",
        s.prefill_s, s.draft_s, s.target_s, s.verify_s, s.total_s
    );
}

/// The settings in one line: tree, draft source, construction and verifier, window,
/// randomness, temperature and device.
pub fn mode(args: &GenerateArgs, verifier: Verifier, window: Option<DraftWindow>) -> String {
    let mode = if args.no_spec {
        "no-spec".to_string()
    } else {
        let drafts = if args.reproducible { "positional races".to_string() } else { args.construction().to_string() };
        let source = if args.ngram == NgramMode::Only {
            format!("ngram {}-{}", args.ngram_flags.ngram_min, args.ngram_flags.ngram_max)
        } else if args.ngram == NgramMode::First {
            format!(
                "ngram {}-{} on {} first, then {}",
                args.ngram_flags.ngram_min, args.ngram_flags.ngram_max, args.ngram_flags.ngram_tree, drafts
            )
        } else {
            drafts
        };
        let window = window.map_or(String::new(), |w| format!(" · draft window {}+{}", w.sinks, w.recent));
        let verifier = if args.reproducible { String::new() } else { format!(" + {verifier}") };
        format!("tree {} · {source}{verifier}{window}", args.tree_name())
    };
    let mode = if args.reproducible { format!("{mode} · reproducible (seed {})", args.seed) } else { mode };
    format!("{mode} · temperature {} · {}", args.temperature, args.device)
}

/// A one-line display of a long prompt's prefill on stderr ([`Generator::set_prefill_progress`]),
/// or `None` when stderr is not a terminal or `--json` is on. Prompts of one CPU prefill chunk
/// or less are not shown, nor a draft's catch-up once the text streams (its line would overwrite
/// the text's); the line is cleared when each model's prefill ends.
///
/// [`Generator::set_prefill_progress`]: engine::decode::Generator::set_prefill_progress
pub fn prefill_display(json: bool) -> Option<Box<dyn FnMut(PrefillProgress) + Send>> {
    use std::io::{IsTerminal, Write};
    if json || !std::io::stderr().is_terminal() {
        return None;
    }
    let mut start = std::time::Instant::now();
    Some(Box::new(move |p: PrefillProgress| {
        if p.total <= engine::model::PREFILL_CHUNK_CPU || p.catch_up {
            return;
        }
        if p.done == 0 {
            start = std::time::Instant::now();
        }
        let mut err = std::io::stderr().lock();
        // `\r` and erase-line: the line is rewritten in place, then erased.
        let _ = if p.done < p.total {
            let secs = start.elapsed().as_secs_f64();
            write!(err, "\r\x1b[Kmdsd: prefill of the {}: {}/{} prompt tokens ({secs:.0} s)", p.model, p.done, p.total)
        } else {
            write!(err, "\r\x1b[K")
        };
        let _ = err.flush();
    }))
}

/// Writes streamed text to stdout at once (a reader that went away does not stop generation).
pub fn print_flushed(text: &str) {
    use std::io::Write;
    if !text.is_empty() {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    }
}

/// The error chain on one line, without the backtraces candle attaches when
/// `RUST_BACKTRACE` is set.
pub fn message(e: &anyhow::Error) -> String {
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
