//! `bench`: research and benchmark tools of mdsd.
//!
//! - `alpha`: acceptance rates (optimal and of each verifier) for given (p, q) pairs.
//!
//! - `mt-bench`: end-to-end tokens/s of plain and speculative decoding on MT-Bench.
//!
//! - `forward-cost`: seconds per forward of k new tokens, ours beside llama.cpp's.
//!
//! The acceptance-rate study arrives with the bench issue.

mod alpha_cmd;
mod forward_cost;
mod mt_bench;

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
    /// End-to-end speed of plain and speculative decoding on MT-Bench first turns.
    MtBench(mt_bench::MtBenchArgs),
    /// Seconds per forward of k new tokens for the target and the draft (and llama.cpp's).
    ForwardCost(forward_cost::ForwardCostArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Alpha(args) => alpha_cmd::run(&args),
        Command::MtBench(args) => mt_bench::run(&args).map(|()| 0),
        Command::ForwardCost(args) => forward_cost::run(&args).map(|()| 0),
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
