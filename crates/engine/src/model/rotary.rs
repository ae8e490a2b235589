//! Rotary position embedding (RoPE): the cos and sin of each new position's angles, computed
//! for the positions of a forward rather than looked up in a table of the whole context.
//!
//! A table of `context_length x head_dim / 2` angles costs memory in proportion to the context
//! the checkpoint declares: 256 MB per table for a 1M-token model with 128-wide heads, and a
//! corrupt file declaring 2^31 positions asked for 256 GB and was killed. Computing a forward's
//! `t x head_dim / 2` angles costs microseconds and gives the same values bit for bit: the
//! angle is the same f32 product `pos * inv_freq[i]` either way.

use super::ModelConfig;
use candle_core::{DType, Device, Result, Tensor};

/// The inverse frequencies of one model: `theta^(-2i / head_dim)`, `i < head_dim / 2`, as its
/// rotary scaling changes them ([`super::rope_scaling`]).
#[derive(Debug, Clone)]
pub struct Rotary {
    /// `[1, head_dim / 2]`, f32.
    inv_freq: Tensor,
    /// YaRN's factor on cos and sin (1: none).
    attention_factor: f32,
    /// The dtype cos and sin are returned in (the model's activations).
    dtype: DType,
}

impl Rotary {
    pub fn new(c: &ModelConfig, dtype: DType, device: &Device) -> Result<Self> {
        let half = c.head_dim / 2;
        let (inv_freq, attention_factor) = c.rope_scaling.frequencies(c.rope_theta, c.head_dim);
        Ok(Self { inv_freq: Tensor::from_vec(inv_freq, (1, half), device)?, attention_factor, dtype })
    }

    /// The inverse frequencies `[1, head_dim / 2]` (f32, on the model's device).
    pub fn inv_freq(&self) -> &Tensor {
        &self.inv_freq
    }

    /// YaRN's factor on cos and sin (1: none).
    pub fn attention_factor(&self) -> f32 {
        self.attention_factor
    }

    /// cos and sin `[t, head_dim / 2]` of the angles `positions[r] * inv_freq[i]`, for the u32
    /// position ids `positions` (`[t]`, on the model's device).
    pub fn at(&self, positions: &Tensor) -> Result<(Tensor, Tensor)> {
        let t = positions.dim(0)?;
        let angles = positions.to_dtype(DType::F32)?.reshape((t, 1))?.broadcast_mul(&self.inv_freq)?;
        let (cos, sin) = (angles.cos()?, angles.sin()?);
        let (cos, sin) = if self.attention_factor == 1.0 {
            (cos, sin)
        } else {
            let a = self.attention_factor as f64;
            ((cos * a)?, (sin * a)?)
        };
        Ok((cos.to_dtype(self.dtype)?, sin.to_dtype(self.dtype)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Architecture;

    /// The angles computed per forward equal the whole-context table's rows bit for bit (the
    /// table this replaced: `arange(0, context) * inv_freq`, then cos and sin).
    #[test]
    fn computed_angles_equal_the_table_rows() {
        let c = ModelConfig {
            architecture: Architecture::Llama,
            vocab_size: 8,
            hidden_size: 64,
            intermediate_size: 8,
            num_layers: 1,
            num_heads: 1,
            num_kv_heads: 1,
            head_dim: 64,
            rms_norm_eps: 1e-5,
            rope_theta: 1_000_000.0,
            rope_scaling: Default::default(),
            context_length: 40_000,
            rope_interleaved: false,
        };
        let dev = Device::Cpu;
        let rotary = Rotary::new(&c, DType::F32, &dev).unwrap();
        let table = Tensor::arange(0u32, c.context_length as u32, &dev).unwrap().to_dtype(DType::F32).unwrap();
        let table = table.reshape((c.context_length, 1)).unwrap().broadcast_mul(&rotary.inv_freq).unwrap();
        let (cos_table, sin_table) = (table.cos().unwrap(), table.sin().unwrap());
        let positions = [0u32, 1, 7, 4095, 4096, 31_999, 39_999, 12];
        let pos = Tensor::from_slice(&positions, positions.len(), &dev).unwrap();
        let (cos, sin) = rotary.at(&pos).unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()
        };
        assert_eq!(bits(&cos), bits(&cos_table.index_select(&pos, 0).unwrap()));
        assert_eq!(bits(&sin), bits(&sin_table.index_select(&pos, 0).unwrap()));
        assert_eq!(cos.dims(), [positions.len(), 32]);
    }
}
