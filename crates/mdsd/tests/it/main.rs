//! The `mdsd` binary's end-to-end tests, one binary: `generate`, `chat`, `tokenize`, `serve` on
//! tiny random models (and SmolLM2 where the cache has it). `common` is the engine tests' model writer.

mod chat;
mod checkpoints;
mod cli;
#[path = "../../../engine/tests/it/common/mod.rs"]
mod common;
mod corrupt_files;
mod serve;
mod smollm2;
mod train_eagle;
