//! The mdsd engine: multi-draft speculative decoding of LLaMA-family, Qwen2 and Qwen3 models on
//! candle.
//!
//! # Layout, and the one-way rule
//!
//! Each top-level module has one job, and imports only from the modules listed before it:
//!
//! | module | job | imports |
//! |---|---|---|
//! | `error` | the library's error type | — |
//! | [`kernels`] | CPU kernels: worker pool, SIMD arithmetic, attention in place, quantized products (hidden: not API) | — |
//! | [`model`] | the architecture and its forward: `DecoderModel`, `Linear`, rotary, the EAGLE head, `KvCache` | `kernels` |
//! | [`formats`] | file containers: GGUF (with integrity checks), PyTorch `.bin` | — |
//! | [`tokenizer`] | tokenizers and chat templates | `formats` |
//! | [`load`] | files to models: GGUF, Hugging Face folders, EAGLE heads, converted drafts, provisioning | `model`, `formats`, `tokenizer` |
//! | [`decode`] | the generator: trees, verification, penalties, stop strings, log-probabilities, and `decode::draft` (draft model, EAGLE head, n-gram lookup, draft window) | `model`, `tokenizer`, `kernels` |
//! | [`train`] | training an EAGLE-1 head: texts, stored features, the differentiable head, its fused loss (on the kernels' worker pool), AdamW, the loop | `model`, `tokenizer`, `kernels` |
//!
//! Below them all, `error` ([`Error`], [`Result`], [`file_error`]) is imported by every module.
//! `crates/samplers` (the mathematics) sits below all of them; the `mdsd` binary and the
//! `bench` crate sit above.
//!
//! # The API
//!
//! A library user loads models with [`load::load`] (or [`load::provision::resolve`] for a
//! manifest's model), builds a [`decode::Generator`] and calls [`decode::Generator::generate`]
//! with a [`decode::GenerationConfig`] whose [`decode::SpecConfig`] names a [`DraftTree`], a
//! construction and a verifier.

pub mod decode;
mod error;
pub mod formats;
#[doc(hidden)]
pub mod kernels;
pub mod load;
pub mod model;
pub mod tokenizer;
pub mod train;

pub use decode::speculative::{speculative_step, NextTokenModel, StepOutcome, StepScratch};
pub use decode::tree::{DraftTree, TreeError};
pub use decode::{GenerationConfig, Generator, SpecConfig};
pub use error::{file_error, plain_error, Error, ProvisionError, Result};
pub use kernels::threads::pin_thread_count;
