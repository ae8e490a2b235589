//! The engine's integration tests, one binary (candle is linked once, not once per file).
//! Modules by subject; `common` writes tiny random models in the real on-disk layouts.

mod batching;
mod checkpoint_configs;
mod chi_square;
mod common;
mod decode;
mod default_pair;
mod draft_catch_up;
mod eagle;
mod fused_decode;
mod layout;
mod logit_bias;
mod logprobs;
mod model_forward;
mod ngram;
mod penalties;
mod positional;
mod prefix_reuse;
mod provision;
#[path = "common/reference.rs"]
mod reference;
mod smollm2;
mod train_eagle;
