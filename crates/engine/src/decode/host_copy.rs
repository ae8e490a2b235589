//! Logits to the host into a buffer kept across steps.
//!
//! Each decoding step copies its logits (up to a tree's rows x the vocabulary: 26 x 151,936
//! f32 values, 16 MB, for EAGLE's sparse tree) to the host once. `Tensor::to_vec1` allocates a
//! fresh `Vec` per step; past glibc's mmap threshold (up to 32 MB) every page of it is then
//! faulted in anew, which on the lent GPU machines (Firecracker VMs) made the copy of 64 rows
//! cost 47 ms against 8.5 ms for the model's blocks (`bench forward-cost --breakdown`,
//! docs/results/README.md#const-host-logits). [`HostLogits`] copies into memory it keeps: on CUDA a
//! page-locked buffer (no staging copy in the driver), on the CPU a `Vec`.

use candle_core::{DType, Result, Storage, Tensor};

/// A reusable host buffer for f32 tensors copied off their device.
#[derive(Default)]
pub struct HostLogits {
    vec: Vec<f32>,
    #[cfg(feature = "cuda")]
    pinned: Option<candle_core::cuda_backend::cudarc::driver::PinnedHostSlice<f32>>,
}

impl HostLogits {
    /// `t`'s values (f32, any shape, flattened in row-major order) on the host, in this
    /// buffer: valid until the next copy. The buffer grows to the largest tensor seen and is
    /// never shrunk or re-allocated below that.
    pub fn copy(&mut self, t: &Tensor) -> Result<&mut [f32]> {
        if t.dtype() != DType::F32 {
            candle_core::bail!("HostLogits::copy: f32 expected, got {:?}", t.dtype());
        }
        let t = t.contiguous()?;
        let n = t.elem_count();
        let (storage, layout) = t.storage_and_layout();
        let start = layout.start_offset();
        match &*storage {
            Storage::Cpu(cpu) => {
                let values = &cpu.as_slice::<f32>()?[start..start + n];
                self.vec.clear();
                self.vec.extend_from_slice(values);
                Ok(&mut self.vec[..])
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(cuda) => {
                use candle_core::cuda_backend::cudarc::driver::PinnedHostSlice;
                let candle_core::Device::Cuda(dev) = t.device() else {
                    candle_core::bail!("HostLogits::copy: CUDA storage on a non-CUDA device");
                };
                let stream = dev.cuda_stream();
                let context = stream.context();
                let reuse =
                    self.pinned.as_ref().is_some_and(|p| p.len() >= n && std::sync::Arc::ptr_eq(p.context(), context));
                if !reuse {
                    // Dropped first: the old buffer's memory goes back before the new one is
                    // taken. Plain page-locked memory (flags 0): the host reads it, which
                    // write-combined memory (cudarc's `alloc_pinned`) makes slow.
                    self.pinned = None;
                    // SAFETY: the buffer is written by the copy below before it is read.
                    let fresh: PinnedHostSlice<f32> =
                        unsafe { context.alloc_pinned_with_flags(n, 0) }.map_err(candle_core::Error::wrap)?;
                    self.pinned = Some(fresh);
                }
                let pinned = self.pinned.as_mut().expect("allocated above");
                let source = cuda.as_cuda_slice::<f32>()?.slice(start..start + n);
                // The first n values of the buffer, as a plain slice: cudarc copies as many
                // bytes as the destination holds, so the destination must be exactly n long.
                // (Nor can its own event order the copy: the engine's devices track no events,
                // `crate::load::parse_device`; the synchronisation below does.)
                // SAFETY: the buffer holds at least n values and lives in `self`, which the
                // returned slice borrows; nothing else refers to it.
                let host: &mut [f32] = unsafe {
                    std::slice::from_raw_parts_mut(pinned.as_mut_ptr().map_err(candle_core::Error::wrap)?, n)
                };
                stream.memcpy_dtoh(&source, host).map_err(candle_core::Error::wrap)?;
                // The copy is asynchronous into page-locked memory: wait for it.
                stream.synchronize().map_err(candle_core::Error::wrap)?;
                Ok(host)
            }
            #[allow(unreachable_patterns)]
            _ => {
                drop(storage);
                self.vec = t.flatten_all()?.to_vec1::<f32>()?;
                Ok(&mut self.vec[..])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The copy holds the tensor's values in row-major order, also for a non-contiguous view
    /// and after a smaller tensor; the buffer is reused, not re-allocated, for a smaller one.
    #[test]
    fn copies_values_in_order_and_reuses_the_buffer() {
        let dev = Device::Cpu;
        let a = Tensor::arange(0f32, 12., &dev).unwrap().reshape((3, 4)).unwrap();
        let mut h = HostLogits::default();
        assert_eq!(h.copy(&a).unwrap(), a.flatten_all().unwrap().to_vec1::<f32>().unwrap().as_slice());
        let ptr = h.vec.as_ptr();
        let t = a.t().unwrap();
        assert_eq!(h.copy(&t).unwrap(), t.flatten_all().unwrap().to_vec1::<f32>().unwrap().as_slice());
        let row = a.narrow(0, 1, 1).unwrap();
        assert_eq!(h.copy(&row).unwrap(), &[4., 5., 6., 7.]);
        assert_eq!(h.vec.as_ptr(), ptr, "a smaller copy re-allocated");
        assert!(h.copy(&a.to_dtype(DType::BF16).unwrap()).is_err());
    }
}
