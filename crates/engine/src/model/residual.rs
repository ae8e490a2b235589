//! [`Residual`]: the residual stream between a model's blocks. On the device-kernel path a
//! block's last residual add is left pending and done by the next norm in the same launch
//! ([`AddRmsNorm`]: one launch instead of an add and a norm); elsewhere the stream is summed as
//! it goes, operation for operation as before.

use crate::kernels::device::AddRmsNorm;
use candle_core::{Result, Tensor};

/// The residual stream: a tensor, or a tensor and an output still to add to it.
pub(crate) enum Residual {
    Sum(Tensor),
    Pending(Tensor, Tensor),
}

impl Residual {
    /// The stream (summed) and its RMS norm with weight `w` (`None`: no norm, the sum twice):
    /// a pending add and the norm as one [`AddRmsNorm`], a sum through candle's `rms_norm`.
    pub(crate) fn normed(&self, w: Option<&Tensor>, eps: f32) -> Result<(Tensor, Tensor)> {
        match (self, w) {
            (Self::Sum(x), Some(w)) => Ok((x.clone(), candle_nn::ops::rms_norm(x, w, eps)?)),
            (Self::Pending(x, d), Some(w)) => {
                let both = x.apply_op3_no_bwd(d, w, &AddRmsNorm { eps })?;
                Ok((both.get(0)?, both.get(1)?))
            }
            (s, None) => {
                let x = s.sum()?;
                Ok((x.clone(), x))
            }
        }
    }

    /// The stream with any pending add done.
    pub(crate) fn sum(&self) -> Result<Tensor> {
        match self {
            Self::Sum(x) => Ok(x.clone()),
            Self::Pending(x, d) => x + d,
        }
    }
}
