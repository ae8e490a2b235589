//! The mdsd engine: LLaMA/Qwen2 models with a tree-capable forward ([`model`]), the external
//! KV cache ([`kv_cache`]), loaders ([`load`], GGUF and Hugging Face folders), tokenizers and
//! chat templates ([`tokenizer`]), draft trees ([`tree`]) and their automatic choice
//! ([`auto_tree`]), the decoding loop ([`decode`]),
//! model provisioning ([`provision`]) and the reference speculative step ([`speculative`]).

pub mod auto_tree;
pub mod cpu_pool;
pub mod cpu_threads;
pub mod decode;
pub mod draft_window;
mod drafting;
mod eagle_draft;
pub mod host_copy;
pub mod kv_cache;
pub mod load;
pub mod logprobs;
pub mod model;
pub mod ngram;
pub mod penalties;
pub mod provision;
pub mod speculative;
pub mod stop;
pub mod tokenizer;
pub mod tree;

pub use speculative::{speculative_step, NextTokenModel, StepOutcome, StepScratch};
pub use tree::{DraftTree, TreeError};

/// An error naming the file it is about: `PATH: what`. The model loaders and the tokenizer
/// report every problem with a file this way.
pub fn file_error(path: &std::path::Path, what: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!("{}: {what}", path.display()))
}

/// The message of a candle error without the backtrace candle attaches when
/// `RUST_BACKTRACE` is set (for errors that wrap it in a message of ours).
pub fn plain_error(e: &candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => plain_error(inner),
        other => other.to_string(),
    }
}
