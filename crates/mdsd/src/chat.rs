//! `mdsd chat`: a conversation with the target, one line per user message, each answer
//! streamed as it is accepted. Every turn renders the whole conversation with the chat
//! template; with prefix reuse (the default) the models run only the tokens a turn adds to the
//! cached text (`Generator::set_prefix_reuse`). Part of the `mdsd` binary (`main.rs`).

use crate::cli::GenerateArgs;
use crate::report::{self, message, print_flushed};
use crate::session::{Plan, Session};
use anyhow::{bail, Context};
use clap::Args;
use engine::decode::stop::TextStops;
use engine::decode::Generator;
use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// The models, tree and sampling, as for `generate` (`--prompt` or `--prompt-file`, when
    /// given, is the first message; `--chat` is implied; `--json` does not apply).
    #[command(flatten)]
    pub run: GenerateArgs,
    /// Run the whole conversation through both models every turn, instead of only the tokens
    /// the turn adds to the cached text.
    #[arg(long)]
    pub no_prefix_reuse: bool,
    /// Positions of the caches: the longest conversation, answers included (at most the
    /// target's context length).
    #[arg(long, default_value_t = 4096)]
    pub context: usize,
}

const HELP: &str = "one line per message, or several between \"\"\" and \"\"\"; /clear forgets the conversation, Ctrl-C stops an answer, /quit (or end of input) ends it";

/// Opens and closes a message of several lines.
const QUOTES: &str = "\"\"\"";

/// The message of several lines that began with `first` after the opening quotes: up to the line
/// ending with the closing quotes (or the end of input).
fn block(
    first: &str,
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    interactive: bool,
) -> anyhow::Result<String> {
    let mut text = first.to_string();
    loop {
        if let Some(body) = text.trim_end().strip_suffix(QUOTES) {
            return Ok(body.to_string());
        }
        if interactive {
            eprint!(". ");
            let _ = std::io::stderr().flush();
        }
        match lines.next() {
            Some(line) => {
                text.push('\n');
                text.push_str(&line.context("reading the next message from the standard input")?);
            }
            None => return Ok(text),
        }
    }
}

pub fn chat(mut args: ChatArgs) -> anyhow::Result<()> {
    let run = &mut args.run;
    let json_only = [
        ("--json", run.json),
        ("--jsonl", run.jsonl),
        ("--logprobs", run.logprobs.is_some()),
        ("--prompt-logprobs", run.prompt_logprobs),
        ("--max-batch", run.max_batch.is_some()),
    ];
    if let Some((flag, _)) = json_only.iter().find(|(_, given)| *given) {
        bail!("{flag} does not apply to chat (it streams every answer); use generate --json");
    }
    run.chat = true;
    let plan = Plan::new(run)?;
    let first = match (&run.prompt, &run.prompt_file) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(f)) if f.as_os_str() == "-" => {
            bail!("--prompt-file -: chat reads its messages from standard input; give the first one in a file or with --prompt")
        }
        (None, Some(f)) => Some(crate::cli::read_prompt_file(f)?),
        (None, None) => None,
    };
    let session = plan.load(run)?;
    if !session.target.tokenizer.has_chat_template() {
        bail!(
            "{} has no chat template, which mdsd chat needs (generate without --chat runs plain text)",
            session.target.path.display()
        );
    }
    let capacity = args.context.min(session.context);
    // Trees need no room of their own: near the end of the context steps go without drafts.
    if capacity < 3 {
        bail!("--context {} leaves no room for a message and an answer", args.context);
    }
    let mut generator = session.generator(run, capacity)?;
    generator.set_prefix_reuse(!args.no_prefix_reuse);
    generator.set_prefill_progress(report::prefill_display(run.json));
    let window = session.window(&generator, run);
    let interactive = std::io::stdin().is_terminal();
    eprintln!("--- {}", report::mode(run, session.verifier, window));
    eprintln!("--- context {capacity} positions · {HELP}");

    let interrupt = Interrupt::install();
    let mut conversation = Conversation::default();
    let stdin = std::io::stdin();
    let mut lines = first.into_iter().map(Ok).chain(stdin.lock().lines());
    loop {
        if interactive {
            eprint!("> ");
            let _ = std::io::stderr().flush();
        }
        let Some(line) = lines.next() else { break };
        let mut line = line.context("reading the next message from the standard input")?;
        if let Some(first) = line.trim_start().strip_prefix(QUOTES) {
            line = block(first, &mut lines, interactive)?;
        }
        let text = line.trim();
        match text {
            "" => continue,
            "/quit" | "/exit" => break,
            "/clear" => {
                conversation.turns.clear();
                eprintln!("(conversation cleared)");
                continue;
            }
            "/help" => {
                eprintln!("{HELP}");
                continue;
            }
            _ if text.starts_with('/') => {
                eprintln!("unknown command `{text}`: {HELP}");
                continue;
            }
            _ => {}
        }
        // A failed turn (a conversation outgrowing the context, say) leaves the conversation
        // as it was; the next message continues it.
        match conversation.answer(text, &session, &mut generator, run, capacity, &interrupt) {
            Ok(answer) => conversation.turns.push((text.to_string(), answer)),
            Err(e) => eprintln!("error: {}", message(&e)),
        }
    }
    Ok(())
}

/// Ctrl-C: during an answer, ends it at the next token (the conversation keeps what came);
/// at the prompt, quits.
struct Interrupt {
    state: Arc<AtomicU8>,
}

const IDLE: u8 = 0;
const GENERATING: u8 = 1;
const REQUESTED: u8 = 2;

impl Interrupt {
    fn install() -> Self {
        let state = Arc::new(AtomicU8::new(IDLE));
        let seen = Arc::clone(&state);
        let handler = move || {
            if seen.compare_exchange(GENERATING, REQUESTED, Ordering::SeqCst, Ordering::SeqCst).is_err() {
                eprintln!();
                std::process::exit(130);
            }
        };
        if let Err(e) = ctrlc::set_handler(handler) {
            eprintln!("mdsd chat: warning: cannot catch Ctrl-C ({e}); it will end the chat");
        }
        Self { state }
    }

    /// Marks an answer as running or over; returns whether it was interrupted.
    fn generating(&self, on: bool) -> bool {
        self.state.swap(if on { GENERATING } else { IDLE }, Ordering::SeqCst) == REQUESTED
    }

    fn requested(&self) -> bool {
        self.state.load(Ordering::SeqCst) == REQUESTED
    }
}

/// The turns so far: (user message, answer).
#[derive(Default)]
struct Conversation {
    turns: Vec<(String, String)>,
}

impl Conversation {
    /// Answers `text` after the turns so far, streaming the answer to stdout and a summary of the
    /// turn to stderr.
    fn answer(
        &self,
        text: &str,
        session: &Session,
        generator: &mut Generator,
        run: &GenerateArgs,
        capacity: usize,
        interrupt: &Interrupt,
    ) -> anyhow::Result<String> {
        let tok = &session.target.tokenizer;
        let mut messages: Vec<(&str, &str)> =
            self.turns.iter().flat_map(|(u, a)| [("user", u.as_str()), ("assistant", a.as_str())]).collect();
        messages.push(("user", text));
        let rendered = tok.apply_chat_conversation(&messages, run.system.as_deref())?;
        let ids = tok.encode(&rendered)?;
        if let Err(e) = session.check_fits(ids.len(), capacity, "conversation") {
            bail!("{e} (/clear starts a new conversation; --context gives a longer one)");
        }
        let stops = TextStops::new(tok, run.stop.clone(), run.ignore_eos).expect("--stop checked by Plan::new");
        interrupt.generating(true);
        let result = generator.generate(
            &ids,
            &session.config,
            |t| interrupt.requested() || stops.is_stop(t),
            |_| {
                print_flushed(&stops.ready(false));
                Ok(())
            },
        );
        let stopped = interrupt.generating(false);
        let (out, mut stats) = result?;
        print_flushed(&stops.ready(true));
        println!();
        if stops.stopped() {
            stats.stop_reason = "stop_string".into();
        }
        if stopped {
            stats.stop_reason = "interrupted".into();
        }
        if stopped {
            eprintln!("(interrupted: the answer so far stays in the conversation)");
        }
        eprintln!(
            "[{} tokens · tau {:.2} · {:.2} tokens/s · prompt {} tokens, {} reused, {:.2} s · stop: {}]",
            stats.new_tokens,
            stats.tau,
            stats.tokens_per_s,
            stats.prompt_tokens,
            stats.reused_tokens,
            stats.prefill_s,
            stats.stop_reason
        );
        Ok(if run.stop.is_empty() { tok.decode(&out)? } else { stops.answer() })
    }
}
