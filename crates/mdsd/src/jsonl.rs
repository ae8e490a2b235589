//! `mdsd generate --jsonl`: a generation for each line of standard input (a prompt, or a
//! conversation through the chat template), each answered by one line of JSON on standard
//! output, in order: on one generator that reuses the prefix the texts share, or with
//! `--max-batch N` on N generators, each on a thread of its own taking the next line, their
//! forwards batched (`crate::batched::in_order`). Part of the `mdsd` binary (`main.rs`).

use crate::cli::GenerateArgs;
use crate::generate::answer_json;
use crate::session::{Plan, Session};
use anyhow::{anyhow, Context};
use engine::decode::stop::TextStops;
use engine::decode::Generator;
use serde_json::json;
use std::io::BufRead;
use std::time::Instant;

/// Reads every line of standard input, then generates for each: `{"line": N, ...}` with what
/// `--json` prints, or `{"line": N, "error": ...}`. Blank lines are skipped (and counted).
/// Fails, after answering every line, when one of them failed.
pub fn generate_lines(args: &GenerateArgs, plan: Plan) -> anyhow::Result<()> {
    let mut lines = Vec::new();
    for (i, line) in std::io::stdin().lock().lines().enumerate() {
        let line = line.with_context(|| format!("reading standard input, line {}", i + 1))?;
        if !line.trim().is_empty() {
            lines.push((i + 1, line));
        }
    }
    let session = plan.load(args)?;
    let started = Instant::now();
    let prompts: Vec<(usize, anyhow::Result<Vec<u32>>)> = lines
        .iter()
        .map(|(n, line)| {
            let ids = prompt_ids(&session, args, line).and_then(|ids| {
                session.check_fits(ids.len(), session.context, "prompt")?;
                Ok(ids)
            });
            (*n, ids)
        })
        .collect();
    let longest = prompts.iter().filter_map(|(_, p)| p.as_ref().ok()).map(Vec::len).max().unwrap_or(1);
    let capacity = session.capacity(longest, args.max_new_tokens);
    let workers = args.max_batch.map_or(1, usize::from).min(prompts.len()).max(1);
    let mut generators = session.generators(args, capacity, workers)?;
    for generator in &mut generators {
        generator.set_logprobs(args.logprobs);
        generator.set_prompt_logprobs(args.prompt_logprobs);
        generator.set_prefix_reuse(!args.prompt_logprobs);
    }
    let mut totals = Totals::default();
    let batches = crate::batched::in_order(
        generators,
        &prompts,
        |generator, (n, ids)| answer_line(&session, args, generator, *n, ids),
        |i, line| {
            // Lines are printed in input order as soon as every earlier one is.
            totals.add(&line);
            let printed = i + 1;
            match &line.stats {
                Some((tokens, tau, rate)) => eprintln!(
                    "mdsd: line {} ({printed} of {}): {tokens} tokens, tau {tau:.2}, {rate:.2} tokens/s",
                    line.number,
                    prompts.len()
                ),
                None => eprintln!("mdsd: line {}: {}", line.number, line.value["error"].as_str().unwrap_or("")),
            }
            println!("{}", line.value);
            Ok(())
        },
    )?;
    let wall = started.elapsed().as_secs_f64();
    let batched = if workers > 1 {
        format!(", {workers} at once (widest forward {} sequences)", batches.widest)
    } else {
        String::new()
    };
    eprintln!(
        "mdsd: {} lines, {} failed; {} tokens in {wall:.1} s ({:.2} tokens/s{batched}), tau {:.2}",
        prompts.len(),
        totals.failed,
        totals.tokens,
        totals.tokens as f64 / wall.max(1e-9),
        totals.tokens as f64 / totals.forwards.max(1) as f64
    );
    if totals.failed > 0 {
        anyhow::bail!("{} of {} lines failed (their answers are `error` lines)", totals.failed, prompts.len());
    }
    Ok(())
}

/// One answered line: its number, its JSON, and (answered) its tokens, tau and tokens/s.
struct Line {
    number: usize,
    value: serde_json::Value,
    stats: Option<(usize, f64, f64)>,
    forwards: usize,
}

#[derive(Default)]
struct Totals {
    failed: usize,
    tokens: usize,
    forwards: usize,
}

impl Totals {
    fn add(&mut self, line: &Line) {
        match line.stats {
            Some((tokens, ..)) => {
                self.tokens += tokens;
                self.forwards += line.forwards;
            }
            None => self.failed += 1,
        }
    }
}

/// Generates line `n`'s answer (or its error) on `generator`.
fn answer_line(
    session: &Session,
    args: &GenerateArgs,
    generator: &mut Generator<'_>,
    n: usize,
    ids: &anyhow::Result<Vec<u32>>,
) -> Line {
    let tok = &session.target.tokenizer;
    let answer = ids.as_ref().map_err(|e| anyhow!("{e:#}")).and_then(|ids| {
        let stops = TextStops::new(tok, args.stop.clone(), args.ignore_eos).map_err(anyhow::Error::msg)?;
        let (out, mut stats) = generator.generate(ids, &session.config, |t| stops.is_stop(t), |_| Ok(()))?;
        if stops.stopped() {
            stats.stop_reason = "stop_string".into();
        }
        let value = answer_json(session, generator, args, &out, &stats, &stops)?;
        Ok((value, (out.len(), stats.tau, stats.tokens_per_s), stats.target_forwards))
    });
    match answer {
        Ok((mut v, stats, forwards)) => {
            let mut line = json!({ "line": n });
            line.as_object_mut().expect("an object").append(v.as_object_mut().expect("an object"));
            Line { number: n, value: line, stats: Some(stats), forwards }
        }
        Err(e) => Line { number: n, value: json!({ "line": n, "error": format!("{e:#}") }), stats: None, forwards: 0 },
    }
}

/// The ids of one input line ([`crate::tokenize::line_text`]: a prompt, or a conversation).
fn prompt_ids(session: &crate::session::Session, args: &GenerateArgs, line: &str) -> anyhow::Result<Vec<u32>> {
    let tok = &session.target.tokenizer;
    let ids = tok.encode(&crate::tokenize::line_text(tok, line, args.chat, args.system.as_deref())?)?;
    if ids.is_empty() {
        anyhow::bail!("the prompt has no tokens");
    }
    Ok(ids)
}
