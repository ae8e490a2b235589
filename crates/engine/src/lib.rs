//! The mdsd engine. Models, KV cache, tree attention and the decoding loop are built by the
//! engine issue; today the crate holds the `mdsd` command-line front end.

/// Message printed by commands whose engine is not built yet.
pub const NOT_BUILT: &str = "the decoding engine is not built yet: `generate` arrives with the \
engine issue. `mdsd fetch PAIR`, the samplers crate and `cargo run --release -p bench -- alpha` \
work today.";

pub mod decode;
pub mod kv_cache;
pub mod load;
pub mod model;
pub mod provision;
pub mod speculative;
pub mod tokenizer;
pub mod tree;

pub use speculative::{speculative_step, NextTokenModel, StepOutcome, StepScratch};
pub use tree::{DraftTree, TreeError};

/// The message of a candle error without the backtrace candle attaches when
/// `RUST_BACKTRACE` is set (for errors that wrap it in a message of ours).
pub fn plain_error(e: &candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => plain_error(inner),
        other => other.to_string(),
    }
}
