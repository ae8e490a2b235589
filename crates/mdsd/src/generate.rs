//! `mdsd generate`: one prompt (or `--jsonl`, one per line) through the speculative decoder,
//! streamed or as one JSON object.

use crate::cli::{read_prompt_file, GenerateArgs};
use crate::report::print_flushed;
use crate::session::{self, Plan};
use crate::{jsonl, report};
use anyhow::bail;
use engine::decode::stop::TextStops;

pub fn generate(args: GenerateArgs) -> anyhow::Result<()> {
    // Everything that can be checked without loading a model comes first.
    let plan = Plan::new(&args)?;
    if args.jsonl {
        return jsonl::generate_lines(&args, plan);
    }
    if args.max_batch.is_some() {
        bail!("--max-batch applies to --jsonl (and serve): one prompt is one generation");
    }
    let prompt = match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => read_prompt_file(f)?,
        (None, None) => bail!("give a prompt with --prompt TEXT or --prompt-file FILE"),
    };
    let session = plan.load(&args)?;
    let tok = &session.target.tokenizer;
    let text = if args.chat { tok.apply_chat_template(&prompt, args.system.as_deref())? } else { prompt };
    let ids = tok.encode(&text)?;
    session.check_fits(ids.len(), session.context, "prompt")?;
    let capacity = session.capacity(ids.len(), args.max_new_tokens);
    let mut generator = session.generator(&args, capacity)?;
    generator.set_logprobs(args.logprobs);
    generator.set_prompt_logprobs(args.prompt_logprobs);
    generator.set_prefill_progress(report::prefill_display(args.json));
    let json = args.json;
    let stops = TextStops::new(tok, args.stop.clone(), args.ignore_eos).expect("--stop checked by Plan::new");
    let (out, mut stats) = generator.generate(
        &ids,
        &session.config,
        |t| stops.is_stop(t),
        |_| {
            if !json {
                print_flushed(&stops.ready(false));
            }
            Ok(())
        },
    )?;
    if stops.stopped() {
        stats.stop_reason = "stop_string".into();
    }
    if json {
        println!("{}", answer_json(&session, &generator, &args, &out, &stats, &stops)?);
    } else {
        print_flushed(&stops.ready(true));
        println!();
        report::print_stats(&stats, &args, session.verifier, session.window(&generator, &args));
    }
    // The process ends here: its memory goes back to the OS at once, instead of being freed
    // piece by piece (the tokenizers' hundreds of thousands of strings among it).
    std::mem::forget(generator);
    std::mem::forget(session);
    Ok(())
}

/// What `--json` prints for a generation: the text `out` (cut at a stop string), the settings
/// and `stats`, and the log-probabilities asked for.
pub fn answer_json(
    session: &session::Session,
    generator: &engine::decode::Generator,
    args: &GenerateArgs,
    out: &[u32],
    stats: &engine::decode::Stats,
    stops: &TextStops,
) -> anyhow::Result<serde_json::Value> {
    let tok = &session.target.tokenizer;
    let report = report::Json {
        text: if args.stop.is_empty() { tok.decode(out)? } else { stops.answer() },
        target: &session.target.path,
        draft: session.draft_name(),
        tree: &session.tree_name,
        window: session.window(generator, args),
        verifier: session.verifier,
    };
    let mut value = report.into_value(stats, args)?;
    if args.logprobs.is_some() {
        value["logprobs"] = report::logprobs(tok, generator.logprobs());
    }
    if args.prompt_logprobs {
        value["prompt_logprobs"] = report::logprobs(tok, generator.prompt_logprobs());
    }
    Ok(value)
}
