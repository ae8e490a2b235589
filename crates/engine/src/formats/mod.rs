//! File containers read without model knowledge: GGUF ([`gguf`]: header, metadata, tensor
//! directory, integrity checks in [`gguf_integrity`]) and PyTorch's zip checkpoints
//! ([`torch_bin`]). What the tensors mean is `crate::load`'s job.

pub mod gguf;
mod gguf_integrity;
pub(crate) mod torch_bin;
