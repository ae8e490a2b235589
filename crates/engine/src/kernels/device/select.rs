//! The ops that turn rows of logits into tokens or probabilities on the device (the decoding
//! loop's `decode::device_select`): the greedy token of each row ([`ArgmaxRows`]), each row's
//! probabilities under a warp ([`WarpRows`]) and a token drawn from one row of probabilities
//! ([`SampleRow`]). On CUDA each runs its kernel of `decode.cu`; on the CPU its reference.

use super::{contiguous, reference};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp1, Layout, Result, Shape};

/// The greedy token of each row of f32 logits `[rows, cols]`: `[rows]` u32, the lowest index
/// among the largest values; `u32::MAX` for a row with NaN or `+inf`, or only `-inf`.
pub struct ArgmaxRows;

impl CustomOp1 for ArgmaxRows {
    fn name(&self) -> &'static str {
        "mdsd-argmax-rows"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, cols) = l.shape().dims2()?;
        let CpuStorage::F32(x) = s else { bail!("argmax: f32 logits expected, got {:?}", s.dtype()) };
        let ids = reference::argmax_rows(contiguous(x, l, "logits")?, cols);
        Ok((CpuStorage::U32(ids), Shape::from(rows)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        super::cuda::argmax_rows(s, l)
    }
}

/// The probabilities of each row of f32 logits `[rows, cols]` under a [`samplers::dist::Warp`]
/// at a positive temperature (min-p, top-k, top-p): `[rows, cols]` f64, as
/// [`reference::warp_rows`] computes them (each `e_i` the host warp's bit for bit, sums in the
/// kernel's order, the kept set of top-k and top-p the host's but within 3e-14 of top-p's
/// mass); a row with NaN or `+inf`, or only `-inf`, comes back all NaN.
pub struct WarpRows {
    warp: samplers::dist::Warp,
}

impl WarpRows {
    /// The op for `warp`, which must be valid and at a positive temperature (temperature 0 is
    /// [`ArgmaxRows`]).
    pub fn new(warp: samplers::dist::Warp) -> Result<Self> {
        warp.check().map_err(|e| candle_core::Error::Msg(format!("warp rows: {e}")))?;
        if warp.temperature <= 0.0 || !(1.0 / warp.temperature).is_finite() {
            bail!(
                "warp rows: temperature {} must be > 0 with a finite inverse (0 picks the argmax: ArgmaxRows)",
                warp.temperature
            );
        }
        Ok(Self { warp })
    }

    /// The kernel's parameters for `l`'s rows, checked to be `[rows, cols]` with both > 0.
    fn params(&self, l: &Layout) -> Result<reference::WarpParams> {
        let (rows, cols) = l.shape().dims2()?;
        // The kernel's indices are u32, stepped by 256.
        if rows == 0 || cols == 0 || cols > i32::MAX as usize {
            bail!("warp rows: {rows} rows of {cols} logits");
        }
        Ok(reference::WarpParams::of(&self.warp, cols))
    }
}

impl CustomOp1 for WarpRows {
    fn name(&self) -> &'static str {
        "mdsd-warp-rows"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let params = self.params(l)?;
        let CpuStorage::F32(x) = s else { bail!("warp rows: f32 logits expected, got {:?}", s.dtype()) };
        let p = reference::warp_rows(contiguous(x, l, "logits")?, l.dims()[1], &params);
        Ok((CpuStorage::F64(p), l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        let params = self.params(l)?;
        super::cuda::warp_rows(s, l, &params)
    }
}

/// A token drawn from one row of probabilities (`[1, cols]` f64, as [`WarpRows`] gives them)
/// with the uniform `u` in `[0, 1)`: `[1]` u32, as [`reference::sample_row`] draws it (the
/// host's `samplers::dist::sample` token for the same `u` but within rounding of a boundary);
/// `u32::MAX` when no entry is positive.
pub struct SampleRow {
    pub u: f64,
}

impl SampleRow {
    fn check(&self, l: &Layout) -> Result<usize> {
        let (rows, cols) = l.shape().dims2()?;
        if rows != 1 || cols == 0 || cols > i32::MAX as usize || !(0.0..1.0).contains(&self.u) {
            bail!("sample row: one row of probabilities and u in [0, 1) expected, got {rows} x {cols}, u {}", self.u);
        }
        Ok(cols)
    }
}

impl CustomOp1 for SampleRow {
    fn name(&self) -> &'static str {
        "mdsd-sample-row"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        self.check(l)?;
        let CpuStorage::F64(p) = s else { bail!("sample row: f64 probabilities expected, got {:?}", s.dtype()) };
        let id = reference::sample_row(contiguous(p, l, "probabilities")?, self.u);
        Ok((CpuStorage::U32(vec![id]), Shape::from(1)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        let cols = self.check(l)?;
        super::cuda::sample_row(s, l, cols, self.u)
    }
}
