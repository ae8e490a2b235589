//! `mdsd`: multi-draft speculative decoding from the command line.

use anyhow::Context;
use clap::{Parser, Subcommand};
use engine::provision::{resolve, FetchOptions, PairManifest};

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
    /// Fetch and verify the files of a model pair without generating.
    Fetch {
        /// Model pair name (a manifest `models/NAME.toml`).
        #[arg(default_value = "qwen2.5-coder-1.5b-0.5b")]
        pair: String,
        /// Folder of the model-pair manifests.
        #[arg(long)]
        models_dir: Option<std::path::PathBuf>,
    },
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Generate { .. } => {
            eprintln!("mdsd: {}", engine::NOT_BUILT);
            std::process::exit(2);
        }
        Command::Fetch { pair, models_dir } => {
            let dir = models_dir.unwrap_or_else(default_models_dir);
            let manifest = PairManifest::find(&pair, &dir)?;
            let opts = FetchOptions::default();
            for (role, source) in [("target", &manifest.target), ("draft", &manifest.draft)] {
                let path = resolve(source, None, &opts).with_context(|| format!("fetching the {role} of {pair}"))?;
                println!("{role}: {}", path.display());
            }
        }
    }
    Ok(())
}

/// `./models` when it exists, else the repository's `models/` (for `cargo run`).
fn default_models_dir() -> std::path::PathBuf {
    let local = std::path::PathBuf::from("models");
    if local.is_dir() {
        local
    } else {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
    }
}
