//! `mdsd`: multi-draft speculative decoding from the command line.
//!
//! Modules depend one way: [`cli`] (flags) ← [`models`] (model paths) ← [`report`] (what is
//! printed) ← [`session`] (the loaded models) ← the commands ([`generate`], [`jsonl`], [`chat`],
//! [`tokenize`], [`fetch`], [`serve`]) ← `main` (dispatch).

use clap::{Parser, Subcommand};
use std::path::PathBuf;

mod batched;
mod chat;
mod cli;
mod fetch;
mod generate;
mod jsonl;
mod models;
mod report;
mod serve;
mod session;
mod tokenize;
mod train_eagle;

#[derive(Parser)]
#[command(name = "mdsd", version, about = "Multi-draft speculative decoding (lossless) on CPU and CUDA")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text with multi-draft speculative decoding (or plain decoding with --no-spec).
    Generate(Box<cli::GenerateArgs>),
    /// Chat with the model: one line per message, each answer streamed; the models run only the
    /// tokens each turn adds (the conversation's cached prefix is reused).
    #[command(
        mut_arg("chat", |a| a.hide(true)),
        mut_arg("json", |a| a.hide(true)),
        mut_arg("jsonl", |a| a.hide(true)),
        mut_arg("logprobs", |a| a.hide(true)),
        mut_arg("prompt_logprobs", |a| a.hide(true))
    )]
    Chat(Box<chat::ChatArgs>),
    /// Serve OpenAI-compatible completion endpoints over HTTP (/v1/completions,
    /// /v1/chat/completions, streamed or not), one request at a time, with prefix reuse.
    #[command(
        mut_arg("prompt", |a| a.hide(true)),
        mut_arg("prompt_file", |a| a.hide(true)),
        mut_arg("chat", |a| a.hide(true)),
        mut_arg("system", |a| a.hide(true)),
        mut_arg("json", |a| a.hide(true)),
        mut_arg("jsonl", |a| a.hide(true)),
        mut_arg("logprobs", |a| a.hide(true)),
        mut_arg("prompt_logprobs", |a| a.hide(true))
    )]
    Serve(Box<serve::ServeArgs>),
    /// Token ids of a text with the target's tokenizer (--decode: the text of token ids);
    /// reads the tokenizer only, not the weights.
    Tokenize(Box<tokenize::TokenizeArgs>),
    /// Train an EAGLE-1 draft head for a target (its own answers, features, training; each
    /// stage resumable) and write it in EAGLE's layout for `generate --eagle`.
    TrainEagle(Box<train_eagle::TrainEagleArgs>),
    /// Fetch and verify the files of a model pair without generating.
    Fetch {
        /// Model pair name (a manifest `models/NAME.toml`).
        #[arg(default_value = "qwen2.5-coder-1.5b-0.5b")]
        pair: String,
        /// Folder of the model-pair manifests.
        #[arg(long)]
        models_dir: Option<PathBuf>,
    },
}

fn main() {
    // Before any thread starts: set_var is then race-free.
    engine::pin_thread_count();
    // The engine's warnings (a CUDA graph that failed to capture, ...) on standard error;
    // `MDSD_LOG=info` (any `tracing` filter) shows more.
    let filter = tracing_subscriber::EnvFilter::try_from_env("MDSD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(ansi)
        .init();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {}", report::message(&e));
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Generate(args) => generate::generate(*args),
        Command::Chat(args) => chat::chat(*args),
        Command::Serve(args) => serve::serve(*args),
        Command::Tokenize(args) => tokenize::tokenize(*args),
        Command::TrainEagle(args) => train_eagle::train_eagle(*args),
        Command::Fetch { pair, models_dir } => fetch::fetch(&pair, models_dir.as_deref()),
    }
}
