//! `bench`: research and benchmark tools of mdsd.
//!
//! - `alpha`: acceptance rates (optimal and of each verifier) for given (p, q) pairs.
//!
//! - `mt-bench`: end-to-end speed of the baseline and speculative methods on MT-Bench
//!   (both turns, methods x trees x temperatures interleaved per question).
//!
//! - `acceptance`: the paper's acceptance-rate study on real text (Table 1, Figures 1-2).
//!
//! - `forward-cost`: seconds per forward of k new tokens, ours beside llama.cpp's.
//!
//! - `random-gguf`: a real checkpoint's layout with random weights, for timing where the
//!   real file cannot go.
//!
mod acceptance;
mod alpha_cmd;
mod forward_cost;
mod mt_bench;
mod pair;
mod predict;
mod random_eagle;
mod random_gguf;
mod run_info;
mod stats;
mod train_plot;

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
    /// End-to-end speed of the baseline and speculative methods on MT-Bench (both turns).
    MtBench(mt_bench::MtBenchArgs),
    /// The acceptance-rate study: alpha of every method against alpha* on generated text.
    Acceptance(acceptance::AcceptanceArgs),
    /// Seconds per forward of k new tokens for the target and the draft (and llama.cpp's).
    ForwardCost(forward_cost::ForwardCostArgs),
    /// Tokens per second and speedup of each tree from a cost curve (`forward-cost --json`) and
    /// the acceptance of `mt-bench` records (or a τ): the measured speedups beside them.
    Predict(predict::PredictArgs),
    /// A GGUF with a real checkpoint's layout and random weights (for machines that cannot
    /// hold the real file), or that checkpoint's header alone (`--skeleton`).
    RandomGguf(random_gguf::RandomGgufArgs),
    /// An EAGLE-1 head with random weights for a target (its sizes, the checkpoint layout),
    /// to time head steps where no real head exists.
    RandomEagle(random_eagle::RandomEagleArgs),
    /// The loss and top-1 accuracy curves of an EAGLE training run (`mdsd train-eagle`'s
    /// train_log.jsonl), as PNG and SVG.
    TrainPlot(train_plot::TrainPlotArgs),
}

fn main() {
    // Before any thread starts: set_var is then race-free.
    engine::pin_thread_count();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Alpha(args) => alpha_cmd::run(&args),
        Command::MtBench(args) => mt_bench::run(&args).map(|()| 0),
        Command::Acceptance(args) => acceptance::run(&args).map(|()| 0),
        Command::ForwardCost(args) => forward_cost::run(&args).map(|()| 0),
        Command::Predict(args) => predict::run(&args).map(|()| 0),
        Command::RandomGguf(args) => random_gguf::run(&args).map(|()| 0),
        Command::RandomEagle(args) => random_eagle::run(&args).map(|()| 0),
        Command::TrainPlot(args) => train_plot::run(&args).map(|()| 0),
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
