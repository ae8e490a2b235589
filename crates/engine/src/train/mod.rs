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
pub use trainer::{Scores, TrainConfig, TrainEvent, TrainState, Trainer};
