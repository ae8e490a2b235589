//! `bench`'s end-to-end tests, one binary: the real `bench` binary on tiny random models.

mod alpha_cli;
mod bench_cli;
#[path = "../../../engine/tests/it/common/mod.rs"]
mod common;
mod forward_cost_cli;
mod predict_cli;
