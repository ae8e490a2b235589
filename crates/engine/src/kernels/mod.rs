//! CPU kernels: the products, attention and element-wise work of a forward, on host memory,
//! without model knowledge. Models call them through `crate::model` (which routes each
//! product); nothing here is the library's API (the module is public, hidden from the docs,
//! for the kernel examples and the bench crate's timings).
//!
//! - [`threads`]: candle's CPU thread count, pinned once per process.
//! - [`pool`]: the worker pool every kernel here shares, so they never compete for cores.
//! - [`simd`]: lane arithmetic (dot products sixteen keys at a time, `exp`).
//! - [`attention`]: attention of a few new rows against the KV cache, read in place.
//! - [`f32_rows`]: dense `f32` products, batch-invariant.
//! - [`ggml_rows`]: products with the ggml block types that have no kernel of ours.
//! - [`quant`]: Q4_K/Q6_K few-rows products, ggml layout and repacked layouts by instruction set.
//! - [`activation`]: the gated MLP's activation.
//! - [`device`]: the decode step's device kernels (CUDA, with a Rust reference of each that also
//!   runs them on the CPU).

pub mod activation;
pub mod attention;
pub mod device;
pub mod f32_rows;
pub mod ggml_rows;
pub mod pool;
pub mod quant;
pub mod simd;
pub mod threads;

use candle_core::{Result, Tensor};

/// Runs `f` on the elements of a CPU f32 tensor in row-major order (copying only when it is
/// not contiguous).
pub(crate) fn with_host_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(data)), Some((a, b))) => Ok(f(&data[a..b])),
        _ => candle_core::bail!("expected contiguous f32 CPU data, got {:?} on {:?}", t.dtype(), t.device()),
    }
}
