//! Selection on the device: which rows of logits a step turns into tokens or probabilities
//! where the model ran (CUDA, or the device-kernel path's reference on the CPU), so that ids or
//! only the probability rows verification reads cross to the host, not logits to be warped
//! there.
//!
//! - Greedy ([`Generator::device_argmax`]): [`ArgmaxRows`], one id per row.
//! - A temperature > 0, with any min-p, top-k and top-p ([`Generator::warp_on_device`]):
//!   [`WarpRows`] gives `p` (and the draft's `q`) in f64, each `e^((l - max) / T)` the host
//!   warp's bit for bit, the sums in the kernel's fixed order and top-k/top-p's kept set by a
//!   radix select; the host then only verifies (and samples), where it warped a 151,936-wide
//!   row per verified node and per drafted node (0.43 ms each at T = 0.7, 1.07 ms with top-p
//!   0.9, on a 2-vCPU EPYC: `cargo bench -p samplers --bench samplers -- warp`). The emitted
//!   tokens follow the same law: verification is exact for whatever `p` and `q` it is given,
//!   and plain steps sample the same device `p`: on the device ([`SampleRow`], one id to the
//!   host) with the stream's next uniform, or on the host for positional randomness.
//!
//! Both need what the host would otherwise apply to whole rows to be off: log-probabilities,
//! penalties, a logit bias. The greedy pick runs on CUDA and on the device-kernel path; the
//! warp, until a lent GPU has checked its kernel, on the device-kernel path only
//! (`MDSD_FUSED_DECODE=1`). `MDSD_DEVICE_WARP=0` (or [`Generator::set_device_warp`]) keeps the
//! warp on the host for A/B runs.

use super::Generator;
use crate::kernels::device::{ArgmaxRows, SampleRow, WarpRows};
use crate::model::DecoderModel;
use crate::{Error, Result};
use samplers::dist::Warp;

/// `MDSD_DEVICE_WARP`: `0`, `off` or `false` keep the warp on the host; on otherwise.
pub(super) fn from_env() -> bool {
    !matches!(std::env::var("MDSD_DEVICE_WARP").as_deref(), Ok("0" | "off" | "false"))
}

impl Generator<'_> {
    /// Whether the target's tokens are picked on the device ([`ArgmaxRows`]): greedy sampling
    /// (temperature 0 or top-k 1) with nothing that reads or changes whole rows on the host
    /// (log-probabilities, penalties, a logit bias), on CUDA or on the device-kernel path
    /// ([`DecoderModel::set_fused_decode`]). At temperature 0 every verifier emits the row's
    /// argmax (its p is one-hot), so the tokens are the host path's.
    pub(super) fn device_argmax(&self, warp: Warp) -> bool {
        (warp.temperature == 0.0 || warp.top_k == 1) && self.rows_untouched_on_host() && self.on_device()
    }

    /// Whether rows warped with `warp` are warped on the device ([`WarpRows`]): a positive
    /// temperature, nothing that reads or changes whole rows on the host, the device-kernel
    /// path ([`DecoderModel::set_fused_decode`], `MDSD_FUSED_DECODE=1`; on CUDA its kernel, on
    /// the CPU its reference), and [`Self::set_device_warp`] on. Like that path, the kernel
    /// waits for a lent GPU's checks (`benches/cuda/gpu_checks.sh`) before CUDA runs use it by
    /// default.
    pub(super) fn warp_on_device(&self, warp: Warp) -> bool {
        // (A temperature whose inverse overflows stays on the host, which reports it.)
        let temperature = warp.temperature > 0.0 && (1.0 / warp.temperature).is_finite();
        self.device_warp && temperature && self.rows_untouched_on_host() && self.target.fused_decode()
    }

    /// Warp on the device where the warp allows it (the default, unless `MDSD_DEVICE_WARP=0`),
    /// or always on the host (`false`: the A/B of the two).
    pub fn set_device_warp(&mut self, on: bool) {
        self.device_warp = on;
    }

    /// Whether [`Self::set_device_warp`] is on.
    pub fn device_warp(&self) -> bool {
        self.device_warp
    }

    fn rows_untouched_on_host(&self) -> bool {
        self.logprobs_top.is_none() && self.buf.penalties.is_off() && self.buf.logit_bias.is_empty()
    }

    fn on_device(&self) -> bool {
        self.target.device().is_cuda() || self.target.fused_decode()
    }
}

/// The greedy token of each row of `target`'s logits for `hidden` (`[rows, hidden]`), picked on
/// the device ([`ArgmaxRows`]): one id per row crosses to the host.
pub(super) fn argmax_ids(target: &DecoderModel, hidden: &candle_core::Tensor) -> Result<Vec<u32>> {
    let ids = target.logits(hidden)?.apply_op1_no_bwd(&ArgmaxRows)?.to_vec1::<u32>()?;
    if ids.contains(&u32::MAX) {
        return Err(invalid("target"));
    }
    Ok(ids)
}

/// The probabilities of each row of `logits` (`[rows, vocab]`, f32) under `warp` (at a
/// positive temperature), computed where `logits` are ([`WarpRows`]).
pub(crate) fn warp_rows(logits: &candle_core::Tensor, warp: Warp) -> Result<candle_core::Tensor> {
    Ok(logits.apply_op1_no_bwd(&WarpRows::new(warp)?)?)
}

/// A token drawn on the device from `probs` (`[1, vocab]`, [`warp_rows`]'s) with the next
/// uniform of `rng`, which the host's draw (`samplers::dist::sample`) would take: one id crosses
/// to the host, not the row ([`SampleRow`]; the host's token but within rounding of a boundary).
pub(crate) fn sample_on_device(probs: &candle_core::Tensor, rng: &mut rand::rngs::StdRng) -> Result<u32> {
    let u = rand::Rng::random::<f64>(rng);
    let id = probs.apply_op1_no_bwd(&SampleRow { u })?.to_vec1::<u32>()?[0];
    if id == u32::MAX {
        return Err(invalid("target"));
    }
    Ok(id)
}

/// A row of [`warp_rows`] on the host, or the error for invalid logits of `which` model (such
/// a row is all NaN).
pub(crate) fn probs_row<'a>(row: &'a [f64], which: &'static str) -> Result<&'a [f64]> {
    if row.first().is_none_or(|x| x.is_nan()) {
        return Err(invalid(which));
    }
    Ok(row)
}

fn invalid(which: &'static str) -> Error {
    Error::InvalidLogits {
        model: which,
        source: samplers::SamplerError::BadParameter("a row of NaN or +inf, or only -inf, logits".into()),
    }
}
