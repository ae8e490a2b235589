//! Logits to the host into a buffer kept across steps.
//!
//! A plain step copies its one row of logits to the host; a speculative step the rows its
//! verification reads ([`HostRows::row`]: the rows on the accepted path and the one after),
//! not the tree's every row (up to 64 x 151,936 f32 values, 39 MB: 0.72 ms through the kept
//! page-locked buffer on an H200, 4.7 ms on a 2-vCPU EPYC, against 0.074 ms for one row,
//! docs/results/README.md#const-host-rows). `Tensor::to_vec1` allocates a
//! fresh `Vec` per step; past glibc's mmap threshold (up to 32 MB) every page of it is then
//! faulted in anew, which on the lent GPU machines (Firecracker VMs) made the copy of 64 rows
//! cost 47 ms against 8.5 ms for the model's blocks (`bench forward-cost --breakdown`,
//! docs/results/README.md#const-host-logits). [`HostLogits`] copies into memory it keeps: on CUDA a
//! page-locked buffer (no staging copy in the driver), on the CPU a `Vec`. The rows read are
//! kept at the buffer's start in the order read, so that a step touches a few rows' worth of
//! it (a `Vec` grows only that far: zero-filling 39 MB for the first step of a generator cost
//! more than the step's verification).
//!
//! [`HostProbs`] does the same for the f64 probabilities of rows warped on the device
//! (`crate::kernels::device::WarpRows`).

use candle_core::{Result, Storage, Tensor};

/// A value type [`HostRows`] copies: f32 (logits) or f64 (probabilities).
#[cfg(not(feature = "cuda"))]
pub trait HostValue: candle_core::WithDType {}
/// A value type [`HostRows`] copies: f32 (logits) or f64 (probabilities).
#[cfg(feature = "cuda")]
pub trait HostValue:
    candle_core::WithDType
    + candle_core::cuda_backend::CudaDType
    + candle_core::cuda_backend::cudarc::driver::DeviceRepr
    + candle_core::cuda_backend::cudarc::driver::ValidAsZeroBits
{
}
impl HostValue for f32 {}
impl HostValue for f64 {}

/// A reusable host buffer for f32 tensors (logits) copied off their device.
pub type HostLogits = HostRows<f32>;
/// The same for f64 tensors (probabilities).
pub type HostProbs = HostRows<f64>;

/// A reusable host buffer for tensors of `T` copied off their device.
pub struct HostRows<T: HostValue> {
    vec: Vec<T>,
    #[cfg(feature = "cuda")]
    pinned: Option<candle_core::cuda_backend::cudarc::driver::PinnedHostSlice<T>>,
    /// Where each row of the tensor of [`Self::rows_of`] is in the buffer: the rows are kept in
    /// the order they were first read (`usize::MAX`: not on the host), so that a step's few
    /// rows sit together at the buffer's start, whatever their places in the tree.
    slot_of: Vec<usize>,
    /// Rows of that tensor on the host.
    slots: usize,
    /// That tensor (contiguous) and its row width.
    lazy: Option<(Tensor, usize)>,
    /// Whether its rows go to the page-locked buffer (a CUDA tensor) rather than `vec`.
    #[cfg(feature = "cuda")]
    rows_pinned: bool,
}

impl<T: HostValue> Default for HostRows<T> {
    fn default() -> Self {
        Self {
            vec: Vec::new(),
            #[cfg(feature = "cuda")]
            pinned: None,
            slot_of: Vec::new(),
            slots: 0,
            lazy: None,
            #[cfg(feature = "cuda")]
            rows_pinned: false,
        }
    }
}

impl<T: HostValue> HostRows<T> {
    /// Starts reading the rows of `t` (`[rows, cols]`, of `T`) one by one: [`Self::row`] copies a
    /// row to the host on its first call. A tree's verification reads only the rows on its
    /// path (about the mean accepted length), so a step copies those rather than every row of
    /// the tree (the 64 rows of `mc_sim_7b_63` are 39 MB at a 152k vocabulary).
    pub fn rows_of(&mut self, t: &Tensor) -> Result<()> {
        if t.dtype() != T::DTYPE || t.rank() != 2 {
            candle_core::bail!(
                "HostRows::rows_of: {:?} [rows, cols] expected, got {:?} {:?}",
                T::DTYPE,
                t.dtype(),
                t.dims()
            );
        }
        let (rows, cols) = t.dims2()?;
        self.slot_of.clear();
        self.slot_of.resize(rows, usize::MAX);
        self.slots = 0;
        self.lazy = Some((t.contiguous()?, cols));
        Ok(())
    }

    /// Row `r` of the tensor of [`Self::rows_of`] on the host, copied on the first call for
    /// that row (the same values as a whole copy's). Writes to it last until the next
    /// [`Self::rows_of`]; a [`Self::copy`] in between ends the rows (an error here).
    pub fn row(&mut self, r: usize) -> Result<&mut [T]> {
        let Some((t, cols)) = &self.lazy else { candle_core::bail!("HostRows::row: no rows_of before") };
        let (t, cols) = (t.clone(), *cols);
        let rows = self.slot_of.len();
        if r >= rows {
            candle_core::bail!("HostRows::row: row {r} of {rows}");
        }
        if self.slot_of[r] == usize::MAX {
            // Page-locked memory is taken for every row at once (its allocation is the cost);
            // a `Vec` grows with the rows read.
            self.copy_into(&t, r * cols, self.slots * cols, cols, rows * cols)?;
            self.slot_of[r] = self.slots;
            self.slots += 1;
        }
        let at = self.slot_of[r] * cols;
        let host = self.host_mut(at + cols)?;
        Ok(&mut host[at..at + cols])
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
    ) -> Result<&mut candle_core::cuda_backend::cudarc::driver::PinnedHostSlice<T>> {
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
    fn host_mut(&mut self, n: usize) -> Result<&mut [T]> {
        #[cfg(feature = "cuda")]
        if self.rows_pinned {
            let p = self.pinned.as_mut().filter(|p| p.len() >= n).expect("copy_into allocated it");
            // SAFETY: the buffer holds at least n values; nothing else refers to it.
            return Ok(unsafe { std::slice::from_raw_parts_mut(p.as_mut_ptr().map_err(candle_core::Error::wrap)?, n) });
        }
        Ok(&mut self.vec[..n])
    }

    /// Copies `len` values of the contiguous `t` from `offset` to `to` in the buffer, which
    /// keeps what it holds before `to`: a `Vec` grows to `to + len` values, page-locked memory
    /// is taken for `capacity` (at least `to + len`) when it holds less.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn copy_into(&mut self, t: &Tensor, offset: usize, to: usize, len: usize, capacity: usize) -> Result<()> {
        let (storage, layout) = t.storage_and_layout();
        let start = layout.start_offset() + offset;
        match &*storage {
            Storage::Cpu(cpu) => {
                #[cfg(feature = "cuda")]
                {
                    self.rows_pinned = false;
                }
                if self.vec.len() < to + len {
                    self.vec.resize(to + len, T::zero());
                }
                self.vec[to..to + len].copy_from_slice(&cpu.as_slice::<T>()?[start..start + len]);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(cuda) => {
                let candle_core::Device::Cuda(dev) = t.device() else {
                    candle_core::bail!("HostRows::row: CUDA storage on a non-CUDA device");
                };
                let stream = dev.cuda_stream();
                self.rows_pinned = true;
                let pinned = self.pinned(capacity.max(to + len), &stream)?;
                let source = cuda.as_cuda_slice::<T>()?.slice(start..start + len);
                // The `len` values at `to`, as a plain slice: cudarc copies as many bytes as
                // the destination holds, so the destination must be exactly `len` long. (Nor can
                // its own event order the copy: the engine's devices track no events,
                // `crate::load::parse_device`; the synchronisation below does.)
                // SAFETY: the buffer holds at least to + len values and lives in `self`;
                // nothing else refers to it.
                let host: &mut [T] = unsafe {
                    let base = pinned.as_mut_ptr().map_err(candle_core::Error::wrap)?;
                    std::slice::from_raw_parts_mut(base.add(to), len)
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
                let values = t.flatten_all()?.narrow(0, offset, len)?.to_vec1::<T>()?;
                if self.vec.len() < to + len {
                    self.vec.resize(to + len, T::zero());
                }
                self.vec[to..to + len].copy_from_slice(&values);
                Ok(())
            }
        }
    }

    /// `t`'s values (of `T`, any shape, flattened in row-major order) on the host, in this
    /// buffer: valid until the next copy. The buffer grows to the largest tensor seen and is
    /// never shrunk or re-allocated below that.
    pub fn copy(&mut self, t: &Tensor) -> Result<&mut [T]> {
        if t.dtype() != T::DTYPE {
            candle_core::bail!("HostRows::copy: {:?} expected, got {:?}", T::DTYPE, t.dtype());
        }
        // The rows of an earlier `rows_of` are overwritten: forget them.
        self.lazy = None;
        self.slot_of.clear();
        let t = t.contiguous()?;
        let n = t.elem_count();
        self.copy_into(&t, 0, 0, n, n)?;
        self.host_mut(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

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
    /// stays until the next tensor), also after a whole copy, kept at the buffer's start in
    /// the order read; bad calls are errors.
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
        // The rows read sit at the buffer's start, in the order read.
        let mut h = HostLogits::default();
        h.rows_of(&a).unwrap();
        assert_eq!(h.row(2).unwrap(), &[8., 9., 10., 11.]);
        assert_eq!(h.vec.len(), 4, "one row read, one row held");
        assert_eq!(h.row(0).unwrap(), &[0., 1., 2., 3.]);
        assert_eq!(h.vec, [8., 9., 10., 11., 0., 1., 2., 3.]);
    }
}
