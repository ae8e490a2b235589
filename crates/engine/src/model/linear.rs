//! [`Linear`]: one matrix product with optional bias, and the routing of its products to our
//! CPU kernels ([`qgemv`], the repacked layouts, [`f32_rows`] for dense f32 matrices) or to
//! candle's.

use crate::kernels::quant::avx2::{q4k as q4k_interleaved, q6k as q6k_interleaved};
use crate::kernels::quant::avx512::{q4k as q4k_tiled, q6k as q6k_tiled};
use crate::kernels::quant::qgemv;
use crate::kernels::{self, f32_rows, ggml_rows, with_host_f32};
use candle_core::quantized::{GgmlDType, QMatMul};
use candle_core::{DType, Module, Result, Tensor, D};

/// A matrix product with optional bias; the matrix is dense or quantized. The matrix may have
/// `pad_input` extra zero columns (re-quantized to a format whose blocks need a longer row):
/// the input then gets as many zeros, which leaves the product unchanged.
#[derive(Debug, Clone)]
pub struct Linear {
    /// The matrix in candle's form; `None` when it lives in `repacked` only.
    weight: Option<QMatMul>,
    /// A Q4_K or Q6_K matrix on an AVX2 CPU, repacked at load for our kernels
    /// ([`q4k_tiled`] and [`q6k_tiled`] with AVX-512 VNNI, else [`q4k_interleaved`] and
    /// [`q6k_interleaved`]), which then run every product with it (one
    /// copy of the weights is kept, not two).
    repacked: Option<Repacked>,
    bias: Option<Tensor>,
    pad_input: usize,
    /// Up to this many input rows go through [`qgemv`] (0: never).
    few_rows_max: usize,
}

/// Input rows up to which ggml-layout Q4_K/Q6_K products on an AVX2 CPU use [`qgemv`] rather
/// than candle's repacked kernels (one row: 43.1 ms per target forward against 64.1; from 5
/// rows candle's is as fast: docs/results/README.md#const-few-rows-max). Q4_K and
/// Q6_K matrices repacked at load ([`q4k_interleaved`], [`q6k_interleaved`]) take our kernels at
/// every row count.
pub const FEW_ROWS_MAX: usize = 4;

impl Linear {
    pub fn new(weight: QMatMul, bias: Option<Tensor>) -> Result<Self> {
        Self::padded(weight, bias, 0)
    }

    /// A matrix whose rows were padded with `pad_input` zero columns.
    pub fn padded(weight: QMatMul, bias: Option<Tensor>, pad_input: usize) -> Result<Self> {
        let few_rows_max = match &weight {
            QMatMul::QTensor(w) if qgemv::supports(w) => {
                let (dtype, dims) = (w.dtype(), w.shape().dims());
                if let Some(l) = Self::repacked_from_raw(dtype, dims, &w.data()?, bias.clone(), pad_input)? {
                    return Ok(l);
                }
                few_rows_max_from_env()
            }
            _ => 0,
        };
        Ok(Self { weight: Some(weight), repacked: None, bias, pad_input, few_rows_max })
    }

    /// The CPU matrix of a stored ggml tensor (`dtype`, `dims`, its raw `bytes`) when our
    /// kernels take it: repacked straight from the bytes (mapped from a GGUF file), with no
    /// `QTensor` copy first; [`Self::padded`] asks it too. `None` when the matrix is kept in
    /// ggml's layout (other types or CPUs, `MDSD_REPACK=0`, `MDSD_FEW_ROWS_MAX=0`); the caller
    /// then builds the `QTensor`.
    pub fn repacked_from_raw(
        dtype: GgmlDType,
        dims: &[usize],
        bytes: &[u8],
        bias: Option<Tensor>,
        pad_input: usize,
    ) -> Result<Option<Self>> {
        if !qgemv::supports_on_cpu(dtype, dims) || !repacking_on() {
            return Ok(None);
        }
        let few_rows_max = few_rows_max_from_env();
        Ok(Repacked::from_raw(dtype, dims, bytes)?.map(|r| Self {
            weight: None,
            repacked: Some(r),
            bias,
            pad_input,
            few_rows_max,
        }))
    }
}

impl Repacked {
    /// The layout our kernels take for a ggml matrix on this CPU: 16-row tiles with AVX-512
    /// VNNI, else interleaved blocks with AVX2; `None` for other types and CPUs.
    fn from_raw(dtype: GgmlDType, dims: &[usize], bytes: &[u8]) -> Result<Option<Self>> {
        use std::sync::Arc;
        Ok(if let Some(m) = q4k_tiled::Q4KTiledMatrix::from_raw(dtype, dims, bytes)? {
            Some(Self::Q4KTiled(Arc::new(m)))
        } else if let Some(m) = q4k_interleaved::Q4KMatrix::from_raw(dtype, dims, bytes)? {
            Some(Self::Q4K(Arc::new(m)))
        } else if let Some(m) = q6k_tiled::Q6KTiledMatrix::from_raw(dtype, dims, bytes)? {
            Some(Self::Q6KTiled(Arc::new(m)))
        } else {
            q6k_interleaved::Q6KMatrix::from_raw(dtype, dims, bytes)?.map(|m| Self::Q6K(Arc::new(m)))
        })
    }
}

/// [`FEW_ROWS_MAX`], or `MDSD_FEW_ROWS_MAX` when set (0 turns the fast path off; for
/// measuring one kernel against the other).
fn few_rows_max_from_env() -> usize {
    static VALUE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *VALUE.get_or_init(|| std::env::var("MDSD_FEW_ROWS_MAX").ok().and_then(|v| v.parse().ok()).unwrap_or(FEW_ROWS_MAX))
}

/// False when `MDSD_REPACK=0`: Q4_K and Q6_K matrices then run in ggml's layout (for
/// measuring one kernel against the other). Up to [`FEW_ROWS_MAX`] rows then go to [`qgemv`]
/// and more to candle, whose results differ by the activations' rounding: a row's result then
/// depends on the batch (`tree_nodes_match_their_paths_and_compaction_keeps_a_path` and
/// `quantized_models_at_temperature_zero_equal_plain_decoding` fail under it).
fn repack_from_env() -> bool {
    static VALUE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VALUE.get_or_init(|| std::env::var("MDSD_REPACK").map_or(true, |v| v != "0"))
}

/// Whether matrices that our kernels take are repacked at load: unless `MDSD_REPACK=0` or
/// `MDSD_FEW_ROWS_MAX=0` turns our kernels off for them.
fn repacking_on() -> bool {
    few_rows_max_from_env() != 0 && repack_from_env()
}

/// A matrix repacked at load for our CPU kernels.
#[derive(Debug, Clone)]
enum Repacked {
    Q4KTiled(std::sync::Arc<q4k_tiled::Q4KTiledMatrix>),
    Q4K(std::sync::Arc<q4k_interleaved::Q4KMatrix>),
    Q6K(std::sync::Arc<q6k_interleaved::Q6KMatrix>),
    Q6KTiled(std::sync::Arc<q6k_tiled::Q6KTiledMatrix>),
}

impl Repacked {
    /// The first `rows` rows (rounded up to whole tiles for the tiled layouts).
    fn first_rows(&self, rows: usize) -> Self {
        use std::sync::Arc;
        match self {
            Self::Q4KTiled(m) => Self::Q4KTiled(Arc::new(m.first_rows(rows))),
            Self::Q4K(m) => Self::Q4K(Arc::new(m.first_rows(rows))),
            Self::Q6K(m) => Self::Q6K(Arc::new(m.first_rows(rows))),
            Self::Q6KTiled(m) => Self::Q6KTiled(Arc::new(m.first_rows(rows))),
        }
    }

    fn rows(&self) -> usize {
        match self {
            Self::Q4KTiled(m) => m.rows,
            Self::Q4K(m) => m.rows,
            Self::Q6K(m) => m.rows,
            Self::Q6KTiled(m) => m.rows,
        }
    }

    fn rows_weight(&self) -> qgemv::RowsWeight<'_> {
        match self {
            Self::Q4KTiled(m) => qgemv::RowsWeight::Q4KTiled(m),
            Self::Q4K(m) => qgemv::RowsWeight::Q4KInterleaved(m),
            Self::Q6K(m) => qgemv::RowsWeight::Q6KInterleaved(m),
            Self::Q6KTiled(m) => qgemv::RowsWeight::Q6KTiled(m),
        }
    }
}

impl Linear {
    fn matmul(&self, x: &Tensor) -> Result<Tensor> {
        // Our kernels are CPU-only: on CUDA candle's own quantized matmul runs.
        if let Some(w) = self.few_rows_weight(x) {
            return x.contiguous()?.apply_op1_no_bwd(&qgemv::QuantizedRowsMatmul(w));
        }
        match (&self.weight, &self.repacked) {
            (Some(QMatMul::Tensor(w)), _) if dense_rows_apply(w, x) => dense_rows(w, x),
            // ggml types without a kernel of ours: candle's arithmetic on our worker pool.
            (Some(w @ QMatMul::QTensor(q)), _) => match ggml_rows::matmul(q, x)? {
                Some(y) => Ok(y),
                None => w.forward(x),
            },
            (Some(w), _) => w.forward(x),
            // Repacked matrices are CPU-only and take f32 activations.
            (None, Some(r)) => x
                .to_dtype(DType::F32)?
                .to_device(&candle_core::Device::Cpu)?
                .contiguous()?
                .apply_op1_no_bwd(&qgemv::QuantizedRowsMatmul(r.rows_weight())),
            (None, None) => unreachable!("a Linear holds its matrix in one of the two forms"),
        }
    }
}

impl Linear {
    /// The matrix when a product with `x` takes a few-rows kernel ([`qgemv`]).
    /// A repacked matrix takes every row count; a ggml one up to `few_rows_max` rows.
    fn few_rows_weight(&self, x: &Tensor) -> Option<qgemv::RowsWeight<'_>> {
        if !(x.dtype() == DType::F32 && x.device().is_cpu()) {
            return None;
        }
        if let Some(r) = &self.repacked {
            return Some(r.rows_weight());
        }
        let Some(QMatMul::QTensor(w)) = &self.weight else { return None };
        let k = x.dims().last().copied().unwrap_or(0);
        let fits = k > 0 && x.elem_count() / k <= self.few_rows_max;
        fits.then_some(qgemv::RowsWeight::Ggml(w))
    }
}

/// Whether `x @ w^T` takes [`f32_rows`]: both `f32` on the CPU, widths equal.
fn dense_rows_apply(w: &Tensor, x: &Tensor) -> bool {
    let cpu_f32 = |t: &Tensor| t.dtype() == DType::F32 && t.device().is_cpu();
    cpu_f32(w) && cpu_f32(x) && w.rank() == 2 && x.dims().last() == w.dims().last()
}

/// `x @ w^T` by [`f32_rows`] for a dense `[n, k]` matrix: every row's result is the same
/// whatever rows share the product.
fn dense_rows(w: &Tensor, x: &Tensor) -> Result<Tensor> {
    let (n, k) = w.dims2()?;
    let mut dims = x.dims().to_vec();
    let m = x.elem_count() / k.max(1);
    let y = with_host_f32(x, |xs| with_host_f32(w, |ws| f32_rows::matmul(xs, m, ws, n, k)))??;
    *dims.last_mut().expect("non-empty dims") = n;
    Tensor::from_vec(y, dims, x.device())
}

/// `x @ w_i^T + b_i` for several products of the same input (q/k/v). When every one takes
/// the few-rows kernel, the input is quantized once and one dispatch computes them all;
/// otherwise each runs alone. Same results either way.
pub fn forward_many(lins: &[Linear], x: &Tensor) -> Result<Vec<Tensor>> {
    let ws: Option<Vec<_>> = lins.iter().map(|l| l.few_rows_weight(x)).collect();
    let Some(ws) = ws.filter(|ws| ws.len() > 1) else {
        return lins.iter().map(|l| l.forward(x)).collect();
    };
    let (outs, dims) = many_rows(&ws, x)?;
    lins.iter()
        .zip(outs)
        .zip(&ws)
        .map(|((l, out), w)| {
            let mut d = dims.clone();
            *d.last_mut().expect("non-empty dims") = w.dims()?.0;
            let y = Tensor::from_vec(out, d, x.device())?;
            match &l.bias {
                Some(b) => y.broadcast_add(b),
                None => Ok(y),
            }
        })
        .collect()
}

/// The products of [`forward_many`] as host vectors, with the output dims of the first.
fn many_rows(ws: &[qgemv::RowsWeight], x: &Tensor) -> Result<(Vec<Vec<f32>>, Vec<usize>)> {
    let dims = x.dims().to_vec();
    let k = *dims.last().expect("non-empty dims");
    let m = x.elem_count() / k;
    let mut outs = Vec::with_capacity(ws.len());
    for w in ws {
        outs.push(vec![0f32; m * w.dims()?.0]);
    }
    // Matrices re-quantized with zero-padded rows ([`Linear::padded`]) take as many zeros.
    let kw = ws[0].dims()?.1;
    if kw < k {
        candle_core::bail!("quantized-rows-matmul: {k} inputs against matrices of width {kw}");
    }
    with_host_f32(x, |xs| {
        let mut slices: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
        if kw == k {
            return qgemv::matmul_many(ws, xs, m, &mut slices);
        }
        let mut padded = vec![0f32; m * kw];
        for (dst, src) in padded.chunks_exact_mut(kw).zip(xs.chunks_exact(k)) {
            dst[..k].copy_from_slice(src);
        }
        qgemv::matmul_many(ws, &padded, m, &mut slices)
    })??;
    Ok((outs, dims))
}

/// The gated MLP's inner activation `silu(x @ gate^T) * (x @ up^T)`; on the few-rows path both
/// products run in one dispatch and the gating is applied on the host without temporaries.
pub fn gated(gate: &Linear, up: &Linear, x: &Tensor) -> Result<Tensor> {
    if let (Some(gw), Some(uw), None, None) = (gate.few_rows_weight(x), up.few_rows_weight(x), &gate.bias, &up.bias) {
        let (mut outs, mut dims) = many_rows(&[gw, uw], x)?;
        let u = outs.pop().expect("two outputs");
        let mut g = outs.pop().expect("two outputs");
        kernels::activation::silu_gate(&mut g, &u);
        *dims.last_mut().expect("non-empty dims") = gw.dims()?.0;
        return Tensor::from_vec(g, dims, x.device());
    }
    candle_nn::ops::silu(&gate.forward(x)?)? * up.forward(x)?
}

impl Linear {
    /// A copy of this product restricted to its first `rows` outputs (rows of the matrix),
    /// which computes what the whole product computes in those columns: a cheaper output
    /// layer for the first token ids. Matrices in 16-row tiles (ours, or candle's repacked x86
    /// kernels: [`ggml_rows::candle_row_tile`]) keep whole tiles, so the copy may have up to 15
    /// more outputs; its own output count is [`Self::output_rows`]. `rows` at or above the
    /// matrix's keeps all of it.
    pub fn first_rows(&self, rows: usize) -> Result<Self> {
        let (weight, repacked) = match (&self.weight, &self.repacked) {
            (_, Some(r)) => (None, Some(r.first_rows(rows))),
            (Some(QMatMul::Tensor(w)), None) => {
                (Some(QMatMul::Tensor(w.narrow(0, 0, rows.min(w.dim(0)?))?.contiguous()?)), None)
            }
            (Some(QMatMul::TensorF16(w)), None) => {
                (Some(QMatMul::TensorF16(w.narrow(0, 0, rows.min(w.dim(0)?))?.contiguous()?)), None)
            }
            (Some(QMatMul::QTensor(w)), None) => {
                let (n, k) = w.shape().dims2()?;
                // Whole tiles of candle's repacked kernels, so the cut takes the whole's kernel.
                let tile = ggml_rows::candle_row_tile(w);
                let rows = rows.min(n).div_ceil(tile).saturating_mul(tile).min(n);
                let bytes = w.data()?;
                let row_bytes = k / w.dtype().block_size() * w.dtype().type_size();
                if bytes.len() < n * row_bytes {
                    candle_core::bail!(
                        "{:?} matrix [{n}, {k}]: {} bytes is less than its size",
                        w.dtype(),
                        bytes.len()
                    );
                }
                let storage = candle_core::quantized::QStorage::from_data(
                    std::borrow::Cow::Owned(bytes[..rows * row_bytes].to_vec()),
                    &w.device(),
                    w.dtype(),
                )?;
                let q = std::sync::Arc::new(candle_core::quantized::QTensor::new(storage, (rows, k))?);
                (Some(QMatMul::from_arc(q)?), None)
            }
            (None, None) => unreachable!("a Linear holds its matrix in one of the two forms"),
        };
        let mut out = Self { weight, repacked, bias: None, pad_input: self.pad_input, few_rows_max: self.few_rows_max };
        out.bias = match &self.bias {
            Some(b) => Some(b.narrow(0, 0, out.output_rows()?)?.contiguous()?),
            None => None,
        };
        Ok(out)
    }

    /// A product whose ggml matrix stays in ggml's layout (what `MDSD_REPACK=0` loads).
    #[cfg(test)]
    pub(crate) fn ggml_kept(weight: QMatMul, bias: Option<Tensor>) -> Self {
        let few_rows_max = match &weight {
            QMatMul::QTensor(w) if qgemv::supports(w) => FEW_ROWS_MAX,
            _ => 0,
        };
        Self { weight: Some(weight), repacked: None, bias, pad_input: 0, few_rows_max }
    }

    /// Whether [`Self::join`] can join this product with `other`: both matrices in candle's
    /// form (not repacked), ggml matrices of one type or dense ones of one dtype, one input
    /// width and padding, both with a bias or neither.
    pub fn joins(&self, other: &Linear) -> bool {
        let plain = |l: &Linear| l.repacked.is_none() && l.pad_input == other.pad_input;
        let like = match (&self.weight, &other.weight) {
            (Some(QMatMul::QTensor(a)), Some(QMatMul::QTensor(b))) => {
                a.dtype() == b.dtype() && a.shape().dims().get(1) == b.shape().dims().get(1)
            }
            (Some(QMatMul::Tensor(a)), Some(QMatMul::Tensor(b)))
            | (Some(QMatMul::TensorF16(a)), Some(QMatMul::TensorF16(b))) => {
                a.dtype() == b.dtype() && a.rank() == 2 && b.rank() == 2 && a.dims()[1] == b.dims()[1]
            }
            _ => false,
        };
        plain(self) && plain(other) && like && self.bias.is_some() == other.bias.is_some()
    }

    /// One product computing what `parts` compute, their outputs side by side in order (the
    /// matrices' rows stacked): ggml matrices of one type stacked block row by block row, dense
    /// ones of one dtype concatenated, biases (all or none) concatenated. `None` when they
    /// cannot be: fewer than two, or two neighbours that [`Self::joins`] refuses.
    pub fn join(parts: &[&Linear]) -> Result<Option<Self>> {
        if parts.len() < 2 || parts.windows(2).any(|w| !w[0].joins(w[1])) {
            return Ok(None);
        }
        let bias = match parts.iter().map(|l| l.bias.as_ref()).collect::<Option<Vec<_>>>() {
            Some(b) => Some(Tensor::cat(&b, D::Minus1)?),
            None => None,
        };
        let matrix = |l: &Linear| l.weight.clone().expect("joins: in candle's form");
        let weights: Vec<QMatMul> = parts.iter().map(|l| matrix(l)).collect();
        let weight = match &weights[0] {
            QMatMul::QTensor(first) => {
                let (dtype, k) = (first.dtype(), first.shape().dims2()?.1);
                let row_bytes = k / dtype.block_size() * dtype.type_size();
                let mut bytes = Vec::new();
                let mut rows = 0;
                for w in &weights {
                    let QMatMul::QTensor(w) = w else { unreachable!("joins: one form") };
                    let n = w.shape().dims2()?.0;
                    let data = w.data()?;
                    if data.len() < n * row_bytes {
                        candle_core::bail!("{dtype:?} matrix [{n}, {k}]: {} bytes is less than its size", data.len());
                    }
                    bytes.extend_from_slice(&data[..n * row_bytes]);
                    rows += n;
                }
                let storage = candle_core::quantized::QStorage::from_data(
                    std::borrow::Cow::Owned(bytes),
                    &first.device(),
                    dtype,
                )?;
                QMatMul::from_arc(std::sync::Arc::new(candle_core::quantized::QTensor::new(storage, (rows, k))?))?
            }
            QMatMul::Tensor(_) | QMatMul::TensorF16(_) => {
                let dense: Vec<&Tensor> = weights
                    .iter()
                    .map(|w| match w {
                        QMatMul::Tensor(t) | QMatMul::TensorF16(t) => t,
                        QMatMul::QTensor(_) => unreachable!("joins: one form"),
                    })
                    .collect();
                let all = Tensor::cat(&dense, 0)?;
                match &weights[0] {
                    QMatMul::TensorF16(_) => QMatMul::TensorF16(all),
                    _ => QMatMul::Tensor(all),
                }
            }
        };
        // The parts' own routing (none is repacked: see above), so the joined product takes
        // their kernels.
        let (pad_input, few_rows_max) = (parts[0].pad_input, parts[0].few_rows_max);
        Ok(Some(Self { weight: Some(weight), repacked: None, bias, pad_input, few_rows_max }))
    }

    /// This product with its dense matrix quantized to `dtype` (candle's quantizer, ggml's
    /// rounding), routed as [`Self::new`] routes a stored matrix of that type (a Q4_K or Q6_K
    /// one on an AVX2 CPU to our repacked kernels); the bias is kept. `None` when the matrix is
    /// not a dense one on the CPU, or its input width is not a whole number of `dtype`'s blocks.
    pub fn quantized(&self, dtype: GgmlDType) -> Result<Option<Self>> {
        let w = match (&self.weight, &self.repacked) {
            (Some(QMatMul::Tensor(w) | QMatMul::TensorF16(w)), None) if w.device().is_cpu() && w.rank() == 2 => w,
            _ => return Ok(None),
        };
        if self.pad_input != 0 || !w.dim(1)?.is_multiple_of(dtype.block_size()) {
            return Ok(None);
        }
        let q = candle_core::quantized::QTensor::quantize(&w.to_dtype(DType::F32)?, dtype)?;
        Ok(Some(Self::new(QMatMul::from_arc(std::sync::Arc::new(q))?, self.bias.clone())?))
    }

    /// Whether the matrix is dense (f32, f16 or bf16), not quantized.
    pub fn is_dense(&self) -> bool {
        matches!(self.weight, Some(QMatMul::Tensor(_) | QMatMul::TensorF16(_))) && self.repacked.is_none()
    }

    /// The number of outputs (rows of the matrix).
    pub fn output_rows(&self) -> Result<usize> {
        match (&self.weight, &self.repacked) {
            (_, Some(r)) => Ok(r.rows()),
            (Some(QMatMul::Tensor(w) | QMatMul::TensorF16(w)), None) => w.dim(0),
            (Some(QMatMul::QTensor(w)), None) => w.shape().dims2().map(|(n, _)| n),
            (None, None) => unreachable!("a Linear holds its matrix in one of the two forms"),
        }
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = if self.pad_input > 0 {
            self.matmul(&x.pad_with_zeros(D::Minus1, 0, self.pad_input)?)?
        } else {
            self.matmul(x)?
        };
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

#[cfg(test)]
mod raw_repack_tests {
    use super::*;
    use candle_core::quantized::QTensor;
    use candle_core::Device;

    const ROWS: usize = 48;
    const COLS: usize = 512;

    /// A `[ROWS, COLS]` matrix's values, the matrix, and 5 input rows `[1, 5, COLS]`.
    fn operands() -> (Vec<f32>, Tensor, Tensor) {
        let dev = Device::Cpu;
        let values: Vec<f32> = (0..ROWS * COLS).map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.8).collect();
        let w = Tensor::from_vec(values.clone(), (ROWS, COLS), &dev).unwrap();
        let x: Vec<f32> = (0..5 * COLS).map(|i| ((i * 613 % 211) as f32 / 211.0 - 0.5) * 2.0).collect();
        (values, w, Tensor::from_vec(x, (1, 5, COLS), &dev).unwrap())
    }

    /// A matrix repacked straight from its bytes (how GGUF matrices load from the mapped file)
    /// computes what the same matrix built from a `QTensor` does, bit for bit: Q4_K and Q6_K,
    /// 1 and 5 input rows, all rows and a prefix of rows (a cut output head). A byte count that
    /// does not fit the shape is an error. On CPUs without our kernels (or with `MDSD_REPACK=0`
    /// or `MDSD_FEW_ROWS_MAX=0`) both keep candle's form and `repacked_from_raw` declines.
    #[test]
    fn repacked_from_raw_equals_the_qtensor_path() {
        let dev = Device::Cpu;
        let (values, w, x) = operands();
        let (rows, cols) = (ROWS, COLS);
        for dtype in [GgmlDType::Q4K, GgmlDType::Q6K] {
            let q = QTensor::quantize(&w, dtype).unwrap();
            let bytes = q.data().unwrap().to_vec();
            let row_bytes = bytes.len() / rows;
            for kept in [rows, 32] {
                let raw = Linear::repacked_from_raw(dtype, &[kept, cols], &bytes[..kept * row_bytes], None, 0).unwrap();
                let Some(raw) = raw else {
                    assert!(
                        !crate::kernels::quant::avx2::cpu_supported() || !repacking_on(),
                        "{dtype:?}: our kernels exist but were not used"
                    );
                    continue;
                };
                // A fresh tensor: candle's quantizer reads a narrowed view's whole storage.
                let prefix = Tensor::from_vec(values[..kept * cols].to_vec(), (kept, cols), &dev).unwrap();
                let prefix = QTensor::quantize(&prefix, dtype).unwrap();
                let via = Linear::padded(QMatMul::from_qtensor(prefix).unwrap(), None, 0).unwrap();
                assert!(via.repacked.is_some(), "{dtype:?}: the QTensor path was not repacked");
                for n in [1, 5] {
                    let xs = x.narrow(1, 0, n).unwrap();
                    let a = raw.forward(&xs).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    let b = via.forward(&xs).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    assert_eq!(a.len(), n * kept);
                    assert!(
                        a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{dtype:?}, {kept} rows, {n} inputs"
                    );
                }
            }
            if crate::kernels::quant::avx2::cpu_supported() && repacking_on() {
                assert!(Linear::repacked_from_raw(dtype, &[rows, cols], &bytes[..bytes.len() - 1], None, 0).is_err());
            }
        }
    }

    /// A product cut to its first rows (`Linear::first_rows`, an EAGLE head's cut output layer)
    /// gives the first columns of the whole product, bit for bit, for 1 and 5 input rows: dense
    /// f32 with a bias, Q8_0 in candle's form, and Q4_K and Q6_K (repacked for our kernels where
    /// the CPU has them; tiled layouts keep whole tiles of 16 rows). A cut at or above the
    /// matrix keeps all of it.
    #[test]
    fn first_rows_give_the_first_columns() {
        let (_, w, x) = operands();
        let rows = ROWS;
        let bias = Tensor::arange(0f32, rows as f32, &Device::Cpu).unwrap();
        let mut cases = vec![("dense", Linear::new(QMatMul::Tensor(w.clone()), Some(bias)).unwrap())];
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q4K, GgmlDType::Q6K] {
            let q = QMatMul::from_qtensor(QTensor::quantize(&w, dtype).unwrap()).unwrap();
            cases.push((dtype_name(dtype), Linear::new(q, None).unwrap()));
        }
        for (what, whole) in &cases {
            assert_eq!(whole.output_rows().unwrap(), rows);
            assert_eq!(whole.first_rows(rows + 7).unwrap().output_rows().unwrap(), rows, "{what}");
            let cut = whole.first_rows(20).unwrap();
            let kept = cut.output_rows().unwrap();
            // Our tiled layouts, and candle's repacked kernels where they take the matrix, keep
            // whole tiles of 16 rows.
            let tiled = matches!(cut.repacked, Some(Repacked::Q4KTiled(_) | Repacked::Q6KTiled(_)))
                || matches!(&whole.weight, Some(QMatMul::QTensor(q)) if ggml_rows::candle_row_tile(q) == 16);
            assert_eq!(kept, if tiled { 32 } else { 20 }, "{what}");
            for n in [1, 5] {
                let xs = x.narrow(1, 0, n).unwrap();
                let a = cut.forward(&xs).unwrap();
                assert_eq!(a.dims(), [1, n, kept], "{what}");
                let b = whole.forward(&xs).unwrap().narrow(2, 0, kept).unwrap();
                let (a, b) = (
                    a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                );
                assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}, {n} inputs");
            }
        }
    }

    fn dtype_name(d: GgmlDType) -> &'static str {
        match d {
            GgmlDType::Q8_0 => "q8_0",
            GgmlDType::Q4K => "q4_k",
            _ => "q6_k",
        }
    }
}
