//! How the weight matrices of a GGUF file become matmuls ([`WeightFormat`]): as stored,
//! dequantized to f32, or, for the CPU, re-quantized to Q4_K where candle has no fast batched
//! kernel for the stored format (`fast-cpu`, the draft's default), with that conversion's
//! row-parallel quantizer.

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{Device, Result, Tensor};
use std::sync::Arc;

/// How the weight matrices of a GGUF file are turned into matmuls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum WeightFormat {
    /// As stored.
    #[default]
    #[cfg_attr(feature = "clap", value(name = "stored"))]
    AsStored,
    /// Matrices stored in formats without a fast batched CPU kernel in candle (Q4_0, Q4_1,
    /// Q5_0, Q5_1, Q8_0) are re-quantized to Q4_K at load time, rows padded with zeros to
    /// 256 columns. Fine for a draft (any draft keeps the output exact; this one only gets
    /// faster); it changes the numerics of a target.
    #[cfg_attr(feature = "clap", value(name = "fast-cpu"))]
    FastCpu,
    /// Every matrix dequantized to f32: slow, but batch-invariant numerics (the quantized
    /// kernels round differently for one row and for many, so `--no-spec` and speculative
    /// decoding at temperature 0 can part at near-ties; dense f32 does not).
    #[cfg_attr(feature = "clap", value(name = "f32"))]
    Dequantized,
}

impl WeightFormat {
    /// The matmul of a stored matrix `[rows, cols]`, and the zero columns its input needs.
    pub(crate) fn matmul(self, t: Arc<QTensor>, device: &Device) -> Result<(QMatMul, usize)> {
        match self {
            Self::AsStored => Ok((QMatMul::from_arc(t)?, 0)),
            Self::Dequantized => Ok((QMatMul::Tensor(t.dequantize(device)?), 0)),
            Self::FastCpu if fast_cpu_converts(&t, device) => {
                let (q, pad) = fast_cpu(&t, device)?;
                Ok((QMatMul::from_qtensor(q)?, pad))
            }
            Self::FastCpu => Ok((QMatMul::from_arc(t)?, 0)),
        }
    }
}

/// Whether [`WeightFormat::FastCpu`] converts `t` on `device`: a 2-D matrix on the CPU in a
/// format without a fast batched CPU kernel, whose rows fill whole Q4_K tiles.
pub(crate) fn fast_cpu_converts(t: &QTensor, device: &Device) -> bool {
    device.is_cpu() && fast_cpu_converts_on_cpu(t.dtype(), t.shape().dims())
}

/// [`fast_cpu_converts`] on the CPU, from a tensor's format and shape.
pub(crate) fn fast_cpu_converts_on_cpu(dtype: candle_core::quantized::GgmlDType, dims: &[usize]) -> bool {
    use candle_core::quantized::GgmlDType as G;
    let slow = matches!(dtype, G::Q4_0 | G::Q4_1 | G::Q5_0 | G::Q5_1 | G::Q8_0 | G::Q8_1);
    slow && dims.len() == 2 && dims[0].is_multiple_of(16)
}

/// [`WeightFormat::FastCpu`]'s conversion of a matrix `[rows, cols]` it converts: to Q4_K,
/// which `Linear` then repacks for our kernel (`q4k_interleaved`; candle's on other CPUs).
/// Q4_K blocks span 256 columns: shorter rows are padded with zero columns, whose count is
/// returned. Q4_0 and Q8_0 were measured too: no faster, and no faster per token in batches.
pub(crate) fn fast_cpu(t: &QTensor, device: &Device) -> Result<(QTensor, usize)> {
    let (rows, cols) = t.shape().dims2()?;
    let pad = cols.next_multiple_of(256) - cols;
    let dense = t.dequantize(device)?;
    let dense = if pad > 0 { dense.pad_with_zeros(1, 0, pad)? } else { dense };
    debug_assert_eq!(dense.dims(), [rows, cols + pad]);
    Ok((quantize_rows_in_parallel(&dense, candle_core::quantized::GgmlDType::Q4K)?, pad))
}

/// `QTensor::quantize` of a 2-D CPU tensor, its rows split over the cores (candle's quantizer
/// is single-threaded; measured 1.4x faster on 2 cores for a [4864, 1024] Q4_K matrix, 0.087
/// against 0.059-0.067 s). Quantization is row by row, so the blocks are the same as in one
/// call (tested).
pub(crate) fn quantize_rows_in_parallel(dense: &Tensor, dtype: candle_core::quantized::GgmlDType) -> Result<QTensor> {
    let (rows, cols) = dense.dims2()?;
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).clamp(1, 16);
    let per = rows.div_ceil(threads).max(1);
    if threads == 1 || rows < 64 || !dense.device().is_cpu() {
        return QTensor::quantize(dense, dtype);
    }
    let parts: Vec<Result<Vec<u8>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..rows)
            .step_by(per)
            .map(|start| {
                // A fresh tensor: `QTensor::quantize` reads the storage from its start,
                // ignoring a view's offset (and `copy` keeps the offset).
                let len = per.min(rows - start);
                let chunk = dense
                    .narrow(0, start, len)
                    .and_then(|c| c.flatten_all()?.to_vec1::<f32>())
                    .and_then(|v| Tensor::from_vec(v, (len, cols), &Device::Cpu));
                scope.spawn(move || -> Result<Vec<u8>> { Ok(QTensor::quantize(&chunk?, dtype)?.data()?.to_vec()) })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| candle_core::bail!("quantizer thread panicked")))
            .collect()
    });
    let mut bytes = Vec::new();
    for part in parts {
        bytes.extend_from_slice(&part?);
    }
    let storage = candle_core::quantized::QStorage::from_data(std::borrow::Cow::Owned(bytes), dense.device(), dtype)?;
    QTensor::new(storage, (rows, cols))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Quantizing rows in parallel gives the blocks of one call, byte for byte.
    #[test]
    fn parallel_quantization_equals_one_call() {
        use candle_core::quantized::GgmlDType;
        let t = Tensor::randn(0f32, 1.0, (203, 512), &Device::Cpu).unwrap();
        for dtype in [GgmlDType::Q4K, GgmlDType::Q8_0] {
            let one = QTensor::quantize(&t, dtype).unwrap();
            let par = quantize_rows_in_parallel(&t, dtype).unwrap();
            assert_eq!(par.shape(), one.shape());
            assert_eq!(par.dtype(), dtype);
            let (a, b) = (par.data().unwrap(), one.data().unwrap());
            let first = a.iter().zip(b.iter()).position(|(x, y)| x != y);
            assert!(
                first.is_none() && a.len() == b.len(),
                "{dtype:?}: {} vs {} bytes, first difference at {first:?}",
                a.len(),
                b.len()
            );
        }
    }
}
