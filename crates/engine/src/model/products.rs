//! [`Products`]: the several products a block takes of one input (q/k/v of the attention's
//! input, gate/up of the MLP's), kept apart or joined into one matrix.
//!
//! On the CPU they stay apart: [`forward_many`] already quantizes the input once and computes
//! them in one dispatch. On CUDA each candle product is a quantization of the input plus a
//! kernel, and each bias another: joined, q/k/v take one quantization, one product and one bias
//! add instead of three of each, and gate/up one product plus [`SiluMul`] instead of two
//! products, a SiLU and a multiply (issue 40, "fused q/k/v and gate/up products"). Each output
//! column is the same dot product either way (summed in another order where a kernel splits
//! its work by the matrix's size: a rounding).

use super::linear::{forward_many, gated, Linear};
use crate::kernels::device::SiluMul;
use candle_core::{Device, Module, Result, Tensor, D};

/// Products of one input (see the module docs).
#[derive(Debug, Clone)]
pub enum Products {
    /// One matrix per product.
    Apart(Vec<Linear>),
    /// Runs of neighbouring products joined ([`Linear::join`]): each matrix with the output
    /// widths of the products it holds, in order (a run of one where a neighbour's type
    /// differs: a Q4_K_M file's Q6_K value matrices beside Q4_K query and key matrices).
    Joined(Vec<(Linear, Vec<usize>)>),
}

impl Products {
    /// Each product of `x` (`[.., k]`), in order.
    pub fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        match self {
            Self::Apart(parts) => forward_many(parts, x),
            Self::Joined(runs) => {
                let mut out = Vec::new();
                for (matrix, widths) in runs {
                    let y = matrix.forward(x)?;
                    if let [_] = widths[..] {
                        out.push(y);
                        continue;
                    }
                    let mut start = 0;
                    for &w in widths {
                        out.push(y.narrow(D::Minus1, start, w)?);
                        start += w;
                    }
                }
                Ok(out)
            }
        }
    }

    /// The gated MLP's inner activation `silu(x @ gate^T) * (x @ up^T)` of gate/up products:
    /// [`SiluMul`] on a joined pair.
    pub fn gated(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Apart(parts) => match &parts[..] {
                [gate, up] => gated(gate, up, x),
                _ => candle_core::bail!("gated MLP: {} products, expected gate and up", parts.len()),
            },
            Self::Joined(runs) => match &runs[..] {
                [(both, widths)] if matches!(widths[..], [g, u] if g == u) => {
                    both.forward(x)?.apply_op1_no_bwd(&SiluMul)
                }
                _ => match &self.forward(x)?[..] {
                    [g, u] => candle_nn::ops::silu(g)? * u,
                    other => candle_core::bail!("gated MLP: {} products, expected gate and up", other.len()),
                },
            },
        }
    }

    /// The same products with each run of neighbours that [`Linear::joins`] accepts joined
    /// into one matrix; unchanged when no two join (or when already joined).
    pub fn joined(self) -> Result<Self> {
        let Self::Apart(parts) = self else { return Ok(self) };
        if !parts.windows(2).any(|w| w[0].joins(&w[1])) {
            return Ok(Self::Apart(parts));
        }
        let mut runs: Vec<Vec<Linear>> = Vec::new();
        for part in parts {
            match runs.last_mut() {
                Some(run) if run.last().is_some_and(|l| l.joins(&part)) => run.push(part),
                _ => runs.push(vec![part]),
            }
        }
        let joined = runs
            .into_iter()
            .map(|run| {
                let widths = run.iter().map(Linear::output_rows).collect::<Result<Vec<_>>>()?;
                let matrix = match &run[..] {
                    [one] => one.clone(),
                    _ => Linear::join(&run.iter().collect::<Vec<_>>())?.expect("neighbours that join"),
                };
                Ok((matrix, widths))
            })
            .collect::<Result<_>>()?;
        Ok(Self::Joined(joined))
    }

    pub fn is_joined(&self) -> bool {
        matches!(self, Self::Joined(_))
    }

    /// The number of matrices the products take (one per product apart).
    pub fn matrices(&self) -> usize {
        match self {
            Self::Apart(parts) => parts.len(),
            Self::Joined(runs) => runs.len(),
        }
    }
}

/// Whether a model loaded on `device` joins its blocks' products at load
/// ([`DecoderModel::join_products`]): by default on CUDA with the device kernels' path
/// (`fused`); never with `MDSD_JOIN_PRODUCTS=0` (A/B runs); always with `MDSD_JOIN_PRODUCTS=1`
/// (on the CPU only matrices kept in ggml's layout join, `MDSD_REPACK=0`: a check of the
/// joined products on real files without a GPU).
pub(crate) fn joins_products(device: &Device, fused: bool) -> bool {
    match std::env::var("MDSD_JOIN_PRODUCTS").as_deref() {
        Ok("0" | "off" | "false") => false,
        Ok("1" | "on" | "true") => true,
        _ => device.is_cuda() && fused,
    }
}

impl super::Layer {
    /// Joins the block's q/k/v and gate/up products where their types allow ([`Products`]);
    /// returns how many of the two it joined now.
    pub fn join_products(&mut self) -> Result<usize> {
        let mut joined = 0;
        for products in [&mut self.qkv, &mut self.gate_up] {
            if !products.is_joined() {
                *products = std::mem::replace(products, Products::Apart(Vec::new())).joined()?;
                joined += products.is_joined() as usize;
            }
        }
        Ok(joined)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{DType, Device};
    use std::sync::Arc;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        crate::kernels::simd::test_values(n, seed)
    }

    fn floats(t: &Tensor) -> Vec<f32> {
        t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    /// A `[n, k]` matrix as a ggml `dtype` QTensor's product, with a bias or not.
    fn quantized(n: usize, k: usize, dtype: GgmlDType, seed: u32, bias: bool) -> Linear {
        let w = Tensor::from_vec(values(n * k, seed), (n, k), &Device::Cpu).unwrap();
        let q = QMatMul::from_arc(Arc::new(QTensor::quantize(&w, dtype).unwrap())).unwrap();
        let b = bias.then(|| Tensor::from_vec(values(n, seed + 100), n, &Device::Cpu).unwrap());
        Linear::ggml_kept(q, b)
    }

    fn dense(n: usize, k: usize, seed: u32, bias: bool) -> Linear {
        let w = Tensor::from_vec(values(n * k, seed), (n, k), &Device::Cpu).unwrap();
        let b = bias.then(|| Tensor::from_vec(values(n, seed + 100), n, &Device::Cpu).unwrap());
        Linear::new(QMatMul::Tensor(w), b).unwrap()
    }

    /// Joined products give every apart product (q/k/v of unequal widths, with and without
    /// biases, Q8_0 and Q4_K matrices kept in ggml's layout, and dense f32 ones), at 1 and 5
    /// input rows, to within a rounding: the same dot products, but a kernel that splits its
    /// work by the matrix's size may sum them in another order (candle's Q8_0 rows differ in
    /// the last bit). Gate/up joined give candle's `silu(g) * u` within an f32 rounding.
    #[test]
    fn joined_products_equal_the_products_apart() {
        let k = 256;
        let sets: Vec<Vec<Linear>> = vec![
            vec![quantized(64, k, GgmlDType::Q8_0, 1, true), quantized(32, k, GgmlDType::Q8_0, 2, true)],
            vec![
                quantized(64, k, GgmlDType::Q4K, 3, false),
                quantized(16, k, GgmlDType::Q4K, 4, false),
                quantized(16, k, GgmlDType::Q4K, 5, false),
            ],
            vec![dense(48, k, 6, true), dense(16, k, 7, true), dense(16, k, 8, true)],
        ];
        for parts in sets {
            let apart = Products::Apart(parts);
            let joined = apart.clone().joined().unwrap();
            assert!(joined.is_joined(), "not joined");
            for rows in [1, 5] {
                let x = Tensor::from_vec(values(rows * k, 9), (1, rows, k), &Device::Cpu).unwrap();
                let (a, j) = (apart.forward(&x).unwrap(), joined.forward(&x).unwrap());
                assert_eq!(a.len(), j.len());
                for (a, j) in a.iter().zip(&j) {
                    assert_eq!(a.dims(), j.dims());
                    let (a, j) = (floats(a), floats(j));
                    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
                    let diff = a.iter().zip(&j).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                    assert!(scale > 0.0 && diff <= 1e-5 * scale, "{rows} rows: {diff} of {scale}");
                }
            }
        }
        let gate_up = Products::Apart(vec![dense(40, k, 10, false), dense(40, k, 11, false)]);
        let joined = gate_up.clone().joined().unwrap();
        let x = Tensor::from_vec(values(3 * k, 12), (3, k), &Device::Cpu).unwrap();
        let (a, j) = (gate_up.gated(&x).unwrap(), joined.gated(&x).unwrap());
        assert_eq!(a.dims(), &[3, 40]);
        assert_eq!(j.dims(), &[3, 40]);
        let diff = (a - j).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
        assert!(diff < 1e-4, "silu-mul differs by {diff}");
    }

    /// Products that cannot be joined stay apart: different ggml types, a bias on one only, a
    /// single product. Of q and k in Q4_K and v in Q6_K (a Q4_K_M layer), q and k join and v
    /// stays alone, with the outputs of the three apart.
    #[test]
    fn unlike_products_stay_apart() {
        let k = 256;
        let mixed = vec![quantized(32, k, GgmlDType::Q4K, 1, false), quantized(32, k, GgmlDType::Q6K, 2, false)];
        assert!(!Products::Apart(mixed).joined().unwrap().is_joined());
        let qkv = Products::Apart(vec![
            quantized(64, k, GgmlDType::Q4K, 3, false),
            quantized(16, k, GgmlDType::Q4K, 4, false),
            quantized(16, k, GgmlDType::Q6K, 5, false),
        ]);
        let joined = qkv.clone().joined().unwrap();
        assert_eq!((joined.is_joined(), joined.matrices()), (true, 2));
        let x = Tensor::from_vec(values(2 * k, 6), (2, k), &Device::Cpu).unwrap();
        for (a, j) in qkv.forward(&x).unwrap().iter().zip(joined.forward(&x).unwrap()) {
            assert_eq!(floats(a), floats(&j));
        }
        let half_biased = vec![dense(8, k, 3, true), dense(8, k, 4, false)];
        assert!(!Products::Apart(half_biased).joined().unwrap().is_joined());
        assert!(!Products::Apart(vec![dense(8, k, 5, false)]).joined().unwrap().is_joined());
    }
}
