//! `bench`: research and benchmark tools of mdsd.
//!
//! - `alpha`: acceptance rates (optimal and of each verifier) for given (p, q) pairs.
//!
//! The MT-Bench speed runs and the acceptance-rate study arrive with the bench issue.

mod alpha_cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "bench", version, about = "mdsd benchmarks and the acceptance-rate calculator")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Acceptance rates of every draft construction and verifier for JSON-lines (p, q) pairs.
    Alpha(alpha_cmd::AlphaArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Alpha(args) => alpha_cmd::run(&args),
    };
    match result {
        Ok(0) => {}
        Ok(bad) => {
            eprintln!("error: {bad} bad line(s); see the messages above");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}
