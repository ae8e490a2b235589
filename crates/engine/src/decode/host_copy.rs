//! Logits to the host into a buffer kept across steps.
//!
//! A plain step copies its one row of logits to the host; a speculative step the rows its
//! verification reads ([`HostLogits::row`]: the rows on the accepted path and the one after),
//! not the tree's every row (up to 64 x 151,936 f32 values, 39 MB: 0.72 ms through the kept
//! page-locked buffer on an H200, 4.7 ms on a 2-vCPU EPYC, against 0.074 ms for one row,
//! docs/results/README.md#const-host-rows). `Tensor::to_vec1` allocates a
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
    /// Which rows of the tensor of [`Self::rows_of`] are on the host (at their offsets in the
    /// buffer).
    copied: Vec<bool>,
    /// That tensor (contiguous) and its row width.
    lazy: Option<(Tensor, usize)>,
    /// Whether its rows go to the page-locked buffer (a CUDA tensor) rather than `vec`.
    #[cfg(feature = "cuda")]
    rows_pinned: bool,
}

impl HostLogits {
    /// Starts reading the rows of `t` (`[rows, cols]`, f32) one by one: [`Self::row`] copies a
    /// row to the host on its first call. A tree's verification reads only the rows on its
    /// path (about the mean accepted length), so a step copies those rather than every row of
    /// the tree (the 64 rows of `mc_sim_7b_63` are 39 MB at a 152k vocabulary).
    pub fn rows_of(&mut self, t: &Tensor) -> Result<()> {
        if t.dtype() != DType::F32 || t.rank() != 2 {
            candle_core::bail!("HostLogits::rows_of: f32 [rows, cols] expected, got {:?} {:?}", t.dtype(), t.dims());
        }
        let (rows, cols) = t.dims2()?;
        self.copied.clear();
        self.copied.resize(rows, false);
        self.lazy = Some((t.contiguous()?, cols));
        Ok(())
    }

    /// Row `r` of the tensor of [`Self::rows_of`] on the host, copied on the first call for
    /// that row (the same values as a whole copy's). Writes to it last until the next
    /// [`Self::rows_of`]; a [`Self::copy`] in between ends the rows (an error here).
    pub fn row(&mut self, r: usize) -> Result<&mut [f32]> {
        let Some((t, cols)) = &self.lazy else { candle_core::bail!("HostLogits::row: no rows_of before") };
        let (t, cols) = (t.clone(), *cols);
        if r >= self.copied.len() {
            candle_core::bail!("HostLogits::row: row {r} of {}", self.copied.len());
        }
        let n = self.copied.len() * cols;
        if !self.copied[r] {
            self.copy_into(&t, r * cols, cols, n)?;
            self.copied[r] = true;
        }
        let host = self.host_mut(n)?;
        Ok(&mut host[r * cols..(r + 1) * cols])
    }

    /// The page-locked buffer, at least `n` values long and of `stream`'s context: kept when it
    /// is, else dropped first (its memory goes back before the new one is taken) and allocated
    /// anew, unset (every caller copies into it before reading). Plain page-locked memory
    /// (flags 0): the host reads it, which write-combined memory (cudarc's `alloc_pinned`) makes
    /// slow.
    #[cfg(feature = "cuda")]
    fn pinned(
        &mut self,
        n: usize,
        stream: &candle_core::cuda_backend::cudarc::driver::CudaStream,
    ) -> Result<&mut candle_core::cuda_backend::cudarc::driver::PinnedHostSlice<f32>> {
        let context = stream.context();
        let reuse = self.pinned.as_ref().is_some_and(|p| p.len() >= n && std::sync::Arc::ptr_eq(p.context(), context));
        if !reuse {
            self.pinned = None;
            // SAFETY: every caller writes the values it reads (see above).
            self.pinned = Some(unsafe { context.alloc_pinned_with_flags(n, 0) }.map_err(candle_core::Error::wrap)?);
        }
        Ok(self.pinned.as_mut().expect("allocated above"))
    }

    /// The first `n` values of the buffer (which holds at least `n`).
    fn host_mut(&mut self, n: usize) -> Result<&mut [f32]> {
        #[cfg(feature = "cuda")]
        if self.rows_pinned {
            let p = self.pinned.as_mut().filter(|p| p.len() >= n).expect("copy_into allocated it");
            // SAFETY: the buffer holds at least n values; nothing else refers to it.
            return Ok(unsafe { std::slice::from_raw_parts_mut(p.as_mut_ptr().map_err(candle_core::Error::wrap)?, n) });
        }
        Ok(&mut self.vec[..n])
    }

    /// Copies `len` values of the contiguous `t` from `offset` to the same offset of the buffer,
    /// which it makes at least `n` long (keeping what it holds when long enough).
    fn copy_into(&mut self, t: &Tensor, offset: usize, len: usize, n: usize) -> Result<()> {
        let (storage, layout) = t.storage_and_layout();
        let start = layout.start_offset() + offset;
        match &*storage {
            Storage::Cpu(cpu) => {
                #[cfg(feature = "cuda")]
                {
                    self.rows_pinned = false;
                }
                if self.vec.len() < n {
                    self.vec.resize(n, 0.0);
                }
                self.vec[offset..offset + len].copy_from_slice(&cpu.as_slice::<f32>()?[start..start + len]);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(cuda) => {
                let candle_core::Device::Cuda(dev) = t.device() else {
                    candle_core::bail!("HostLogits::row: CUDA storage on a non-CUDA device");
                };
                let stream = dev.cuda_stream();
                self.rows_pinned = true;
                let pinned = self.pinned(n, &stream)?;
                let source = cuda.as_cuda_slice::<f32>()?.slice(start..start + len);
                // The `len` values at `offset`, as a plain slice: cudarc copies as many bytes as
                // the destination holds, so the destination must be exactly `len` long. (Nor can
                // its own event order the copy: the engine's devices track no events,
                // `crate::load::parse_device`; the synchronisation below does.)
                // SAFETY: the buffer holds at least n >= offset + len values and lives in
                // `self`; nothing else refers to it.
                let host: &mut [f32] = unsafe {
                    let base = pinned.as_mut_ptr().map_err(candle_core::Error::wrap)?;
                    std::slice::from_raw_parts_mut(base.add(offset), len)
                };
                stream.memcpy_dtoh(&source, host).map_err(candle_core::Error::wrap)?;
                // The copy is asynchronous into page-locked memory: wait for it.
                stream.synchronize().map_err(candle_core::Error::wrap)
            }
            #[allow(unreachable_patterns)]
            _ => {
                drop(storage);
                #[cfg(feature = "cuda")]
                {
                    self.rows_pinned = false;
                }
                let values = t.flatten_all()?.narrow(0, offset, len)?.to_vec1::<f32>()?;
                if self.vec.len() < n {
                    self.vec.resize(n, 0.0);
                }
                self.vec[offset..offset + len].copy_from_slice(&values);
                Ok(())
            }
        }
    }

    /// `t`'s values (f32, any shape, flattened in row-major order) on the host, in this
    /// buffer: valid until the next copy. The buffer grows to the largest tensor seen and is
    /// never shrunk or re-allocated below that.
    pub fn copy(&mut self, t: &Tensor) -> Result<&mut [f32]> {
        if t.dtype() != DType::F32 {
            candle_core::bail!("HostLogits::copy: f32 expected, got {:?}", t.dtype());
        }
        // The rows of an earlier `rows_of` are overwritten: forget them.
        self.lazy = None;
        self.copied.clear();
        let t = t.contiguous()?;
        let n = t.elem_count();
        self.copy_into(&t, 0, n, n)?;
        self.host_mut(n)
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

    /// Rows read one by one hold the tensor's rows, each copied once (a write to a copied row
    /// stays until the next tensor), also after a whole copy; bad calls are errors.
    #[test]
    fn rows_read_one_by_one_are_the_tensor_s_rows() {
        let dev = Device::Cpu;
        let a = Tensor::arange(0f32, 12., &dev).unwrap().reshape((3, 4)).unwrap();
        let mut h = HostLogits::default();
        assert!(h.row(0).is_err(), "no tensor yet");
        h.copy(&a.t().unwrap()).unwrap();
        h.rows_of(&a).unwrap();
        assert_eq!(h.row(2).unwrap(), &[8., 9., 10., 11.]);
        h.row(2).unwrap()[0] = -1.0;
        assert_eq!(h.row(0).unwrap(), &[0., 1., 2., 3.]);
        assert_eq!(h.row(2).unwrap(), &[-1., 9., 10., 11.], "a row was copied again");
        assert!(h.row(3).is_err());
        h.rows_of(&a).unwrap();
        assert_eq!(h.row(2).unwrap(), &[8., 9., 10., 11.]);
        assert!(h.rows_of(&a.flatten_all().unwrap()).is_err());
        h.copy(&a.narrow(0, 0, 1).unwrap()).unwrap();
        assert!(h.row(0).is_err(), "a whole copy ends the rows of the tensor before");
    }
}
