//! The token embedding: a dense `[vocab, hidden]` tensor, or, for quantized GGUF files on the
//! CPU, the quantized matrix as stored, whose rows are dequantized when looked up. A 151,936 x
//! 1,536 embedding is 933 MB in f32 and 191 MB in Q6_K; a lookup dequantizes only the rows asked
//! for, with candle's own per-block dequantization (the same values as dequantizing it all).

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Result, Tensor};
use std::sync::Arc;

#[derive(Debug, Clone)]
pub enum TokenEmbedding {
    /// `[vocab, hidden]` in the activation dtype.
    Dense(Tensor),
    /// `[vocab, hidden]` quantized, on the CPU; lookups give f32.
    Quantized(Arc<QTensor>),
}

impl TokenEmbedding {
    /// The embedding of a GGUF matrix: kept quantized on the CPU when its type is quantized,
    /// dequantized otherwise (float types, or another device).
    pub fn from_qtensor(q: Arc<QTensor>, device: &Device) -> Result<Self> {
        let float = matches!(q.dtype(), GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
        if device.is_cpu() && !float && q.shape().dims().len() == 2 {
            Ok(Self::Quantized(q))
        } else {
            Ok(Self::Dense(q.dequantize(device)?))
        }
    }

    /// `[vocab, hidden]`.
    pub fn dims(&self) -> Result<(usize, usize)> {
        match self {
            Self::Dense(t) => t.dims2(),
            Self::Quantized(q) => q.shape().dims2(),
        }
    }

    /// [`Self::lookup`] of ids in a `u32` tensor on the embedding's device: a dense embedding
    /// selects its rows on the device (nothing read back to the host, as a graph capture
    /// needs); a quantized one (on the CPU) reads the ids.
    pub fn lookup_tensor(&self, ids: &Tensor) -> Result<Tensor> {
        match self {
            Self::Dense(t) => t.index_select(&ids.contiguous()?, 0),
            Self::Quantized(_) => self.lookup(&ids.to_vec1::<u32>()?, ids.device()),
        }
    }

    /// The rows of `ids` (each below the vocabulary size, which the caller checks): `[t, hidden]`
    /// on `device` (the dense tensor's own device and dtype, f32 on the CPU when quantized).
    pub fn lookup(&self, ids: &[u32], device: &Device) -> Result<Tensor> {
        match self {
            Self::Dense(t) => t.index_select(&Tensor::from_slice(ids, ids.len(), device)?, 0),
            Self::Quantized(q) => {
                let (vocab, hidden) = q.shape().dims2()?;
                let dtype = q.dtype();
                let row_bytes = hidden / dtype.block_size() * dtype.type_size();
                let data = q.data()?;
                let mut rows = Vec::with_capacity(ids.len() * row_bytes);
                for &id in ids {
                    let id = id as usize;
                    if id >= vocab {
                        candle_core::bail!("token id {id} is outside the embedding of {vocab} rows");
                    }
                    rows.extend_from_slice(&data[id * row_bytes..(id + 1) * row_bytes]);
                }
                let storage = QStorage::from_data(std::borrow::Cow::Owned(rows), &Device::Cpu, dtype)?;
                QTensor::new(storage, (ids.len(), hidden))?.dequantize(&Device::Cpu)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Quantized lookups equal the rows of the whole matrix dequantized, exactly, for several
    /// types; out-of-range ids are an error; float types stay dense.
    #[test]
    fn quantized_lookup_equals_dequantized_rows() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (37, 512), &dev).unwrap();
        let ids = [0u32, 36, 5, 5, 17];
        for dtype in [GgmlDType::Q4K, GgmlDType::Q6K, GgmlDType::Q8_0, GgmlDType::Q4_1] {
            let q = Arc::new(QTensor::quantize(&w, dtype).unwrap());
            let all = q.dequantize(&dev).unwrap();
            let e = TokenEmbedding::from_qtensor(q, &dev).unwrap();
            assert!(matches!(e, TokenEmbedding::Quantized(_)));
            assert_eq!(e.dims().unwrap(), (37, 512));
            let got = e.lookup(&ids, &dev).unwrap();
            let want = all.index_select(&Tensor::from_slice(&ids, 5, &dev).unwrap(), 0).unwrap();
            let diff = (got - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert_eq!(diff, 0.0, "{dtype:?}");
            assert!(e.lookup(&[37], &dev).is_err());
        }
        let f = TokenEmbedding::from_qtensor(Arc::new(QTensor::quantize(&w, GgmlDType::F32).unwrap()), &dev).unwrap();
        assert!(matches!(f, TokenEmbedding::Dense(_)));
    }
}
