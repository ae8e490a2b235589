//! `mdsd`: multi-draft speculative decoding from the command line.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "mdsd", version, about = "Multi-draft speculative decoding (lossless) on CPU and CUDA")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text with speculative decoding (not built yet).
    Generate {
        /// The prompt.
        #[arg(long)]
        prompt: Option<String>,
        /// Any further options are accepted and ignored until the engine exists.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        rest: Vec<String>,
    },
    /// Fetch the files of a model pair without generating (not built yet).
    Fetch {
        /// Model pair name (a manifest in `models/`).
        pair: Option<String>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Generate { .. } | Command::Fetch { .. } => {
            eprintln!("mdsd: {}", engine::NOT_BUILT);
            std::process::exit(2);
        }
    }
}
