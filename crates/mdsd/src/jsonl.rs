//! `mdsd generate --jsonl`: a generation for each line of standard input (a prompt, or a
//! conversation through the chat template), each answered by one line of JSON on standard
//! output, in order, on one generator that reuses the prefix the texts share. Part of the
//! `mdsd` binary (`main.rs`).

use crate::cli::GenerateArgs;
use crate::generate::answer_json;
use crate::session::Plan;
use anyhow::{anyhow, Context};
use engine::decode::stop::TextStops;
use serde_json::json;
use std::io::BufRead;

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
    let tok = &session.target.tokenizer;
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
    let mut generator = session.generator(args, capacity)?;
    generator.set_logprobs(args.logprobs);
    generator.set_prompt_logprobs(args.prompt_logprobs);
    generator.set_prefix_reuse(!args.prompt_logprobs);
    let (mut failed, mut tokens, mut forwards, mut seconds) = (0, 0, 0, 0.0);
    for (i, (n, ids)) in prompts.iter().enumerate() {
        let answer = ids.as_ref().map_err(|e| anyhow!("{e:#}")).and_then(|ids| {
            let stops = TextStops::new(tok, args.stop.clone(), args.ignore_eos).map_err(anyhow::Error::msg)?;
            let (out, mut stats) = generator.generate(ids, &session.config, |t| stops.is_stop(t), |_| Ok(()))?;
            if stops.stopped() {
                stats.stop_reason = "stop_string".into();
            }
            (tokens, forwards, seconds) =
                (tokens + out.len(), forwards + stats.target_forwards, seconds + stats.total_s);
            eprintln!(
                "mdsd: line {n} ({} of {}): {} tokens, tau {:.2}, {:.2} tokens/s",
                i + 1,
                prompts.len(),
                out.len(),
                stats.tau,
                stats.tokens_per_s
            );
            answer_json(&session, &generator, args, &out, &stats, &stops)
        });
        let value = match answer {
            Ok(mut v) => {
                let mut line = json!({ "line": n });
                line.as_object_mut().expect("an object").append(v.as_object_mut().expect("an object"));
                line
            }
            Err(e) => {
                failed += 1;
                eprintln!("mdsd: line {n}: {e:#}");
                json!({ "line": n, "error": format!("{e:#}") })
            }
        };
        println!("{value}");
    }
    eprintln!(
        "mdsd: {} lines, {failed} failed; {tokens} tokens in {seconds:.1} s, tau {:.2}",
        prompts.len(),
        tokens as f64 / forwards.max(1) as f64
    );
    if failed > 0 {
        anyhow::bail!("{failed} of {} lines failed (their answers are `error` lines)", prompts.len());
    }
    Ok(())
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
