//! Our forward on real quantized weights against candle-transformers' own quantized models
//! (`quantized_llama`, `quantized_qwen2`) on the same GGUF file. Included by the tests on real
//! models (`#[path]`), not by `common` (the bench crate's tests share that and have no
//! candle-transformers).

use candle_core::{DType, Device, Tensor};
use candle_transformers::models::{quantized_llama, quantized_qwen2};
use engine::model::{causal_bias, DecoderModel};

/// A reference model: the last row's logits of running `ids` from position `index_pos` on its
/// own KV cache.
pub trait ReferenceModel {
    fn last_logits(&mut self, ids: &[u32], index_pos: usize) -> Vec<f32>;
    fn clear(&mut self);
}

macro_rules! reference_model {
    ($t:ty) => {
        impl ReferenceModel for $t {
            fn last_logits(&mut self, ids: &[u32], index_pos: usize) -> Vec<f32> {
                let x = Tensor::new(ids, &Device::Cpu).unwrap().unsqueeze(0).unwrap();
                self.forward(&x, index_pos).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
            }
            fn clear(&mut self) {
                self.clear_kv_cache();
            }
        }
    };
}
reference_model!(quantized_llama::ModelWeights);
reference_model!(quantized_qwen2::ModelWeights);

/// How our last-row logits of a prompt compare with the reference's.
#[derive(Debug)]
pub struct Agreement {
    /// Largest difference from the reference's prompt pass.
    pub ours_off: f32,
    /// Largest difference between the reference's prompt pass and its token-by-token pass: how
    /// far its own quantized kernels move the logits.
    pub own_spread: f32,
    /// Mean difference from the reference's prompt pass over the vocabulary.
    pub mean: f32,
    /// The reference's top logit less its logit of our top token (0 when the tops agree).
    pub top_gap: f32,
}

/// Runs `ids` through `ours` (one prompt pass) and through `reference` (a prompt pass, then token
/// by token) and compares the last rows.
pub fn agreement(ours: &DecoderModel, reference: &mut dyn ReferenceModel, ids: &[u32]) -> Agreement {
    let mut cache = ours.new_cache(ids.len()).unwrap();
    let bias = causal_bias(0, ids.len(), DType::F32, &Device::Cpu).unwrap();
    let pos: Vec<u32> = (0..ids.len() as u32).collect();
    let h = ours.forward(ids, &pos, &bias, &mut cache).unwrap();
    let a =
        ours.logits(&h.narrow(0, ids.len() - 1, 1).unwrap()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    reference.clear();
    let b = reference.last_logits(ids, 0);
    reference.clear();
    let mut c = Vec::new();
    for (i, t) in ids.iter().enumerate() {
        c = reference.last_logits(std::slice::from_ref(t), i);
    }
    let max_diff = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(u, v)| (u - v).abs()).fold(0f32, f32::max);
    let argmax = |v: &[f32]| (0..v.len()).max_by(|&i, &j| v[i].total_cmp(&v[j])).unwrap();
    Agreement {
        ours_off: max_diff(&a, &b),
        own_spread: max_diff(&b, &c),
        mean: a.iter().zip(&b).map(|(u, v)| (u - v).abs()).sum::<f32>() / a.len() as f32,
        top_gap: b[argmax(&b)] - b[argmax(&a)],
    }
}

/// Ours within twice the reference's own spread (at least 0.5) of its prompt pass, within 0.5
/// on average, and our top token a near-tie at most (0.25) of the reference's.
pub fn assert_agrees(ours: &DecoderModel, reference: &mut dyn ReferenceModel, ids: &[u32], what: &str) -> Agreement {
    let g = agreement(ours, reference, ids);
    assert!(g.ours_off <= 2.0 * g.own_spread.max(0.5), "{what}: {g:?}");
    assert!(g.mean < 0.5, "{what}: {g:?}");
    assert!(g.top_gap <= 0.25, "{what}: {g:?}");
    g
}
