//! Training an EAGLE-1 draft head for a target this engine loads, on the CPU (or CUDA), with
//! candle's autograd: the texts ([`data`]), the target's features computed once and kept on
//! disk ([`features`]), the head with a differentiable forward written in EAGLE's checkpoint
//! layout ([`head`]), its logits through the frozen output layer ([`frozen`]) and its token
//! loss ([`soft_ce`]), AdamW ([`optim`]) and the loop ([`trainer`]). `mdsd train-eagle`
//! drives it (docs/eagle-training.md).

pub mod data;
pub mod features;
pub mod frozen;
pub mod head;
pub mod optim;
pub mod soft_ce;
pub mod trainer;

pub use head::{HeadShape, TrainableHead};

/// The values of a contiguous `f32` CPU storage: the input the custom ops of [`frozen`] and
/// [`soft_ce`] take (`op` names the one asking, for the error).
fn contiguous_f32<'a>(
    storage: &'a candle_core::CpuStorage,
    layout: &candle_core::Layout,
    op: &str,
) -> candle_core::Result<&'a [f32]> {
    match (storage, layout.contiguous_offsets()) {
        (candle_core::CpuStorage::F32(v), Some((a, b))) => Ok(&v[a..b]),
        _ => candle_core::bail!("{op}: a contiguous f32 CPU tensor is required"),
    }
}
pub use trainer::{Scores, TrainConfig, TrainEvent, TrainState, Trainer};
