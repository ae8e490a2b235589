//! `bench`'s end-to-end tests, one binary: the real `bench` binary on tiny random models.

mod alpha_cli;
mod bench_cli;
#[path = "../../../engine/tests/it/common/mod.rs"]
mod common;
mod predict_cli;
