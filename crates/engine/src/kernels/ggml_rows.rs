//! Products with the ggml block types that have no kernel of ours (Q4_0, Q4_1, Q5_0, Q5_1,
//! Q8_0, Q2_K, Q3_K, Q5_K), on our CPU worker pool.
//!
//! The arithmetic is candle's generic quantized product (`k_quants::matmul`, which is what
//! `QMatMul::forward` runs for these types on x86-64; Q4_K and Q6_K, which candle repacks, and
//! Q8_0 on CPUs with VNNI, where it does too, are left to candle): each activation row is quantized to the
//! type's `VecDotType`, and every output is the type's `vec_dot_4` over a quad of weight rows
//! (`vec_dot_2` and `vec_dot` for the last 0-3). The same calls on the same data, so the
//! results are bit for bit candle's; only the scheduling differs. candle splits the quads over
//! its own barrier pool, whose dispatch waits for every worker even when the machine is busy
//! with other work ([`crate::kernels::pool`]); here they go to [`crate::kernels::pool::pool`].

use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ8_0, GgmlType,
};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Result, Tensor};
use std::cell::RefCell;

/// `x @ w^T` for a CPU f32 `x` whose last dimension is `w`'s width, or `None` when `w`'s type
/// is not one of this module's (candle's own path then runs).
pub fn matmul(w: &QTensor, x: &Tensor) -> Result<Option<Tensor>> {
    match w.dtype() {
        GgmlDType::Q4_0 => rows::<BlockQ4_0>(w, x),
        GgmlDType::Q4_1 => rows::<BlockQ4_1>(w, x),
        GgmlDType::Q5_0 => rows::<BlockQ5_0>(w, x),
        GgmlDType::Q5_1 => rows::<BlockQ5_1>(w, x),
        GgmlDType::Q8_0 if !candle_repacks_q8_0() => rows::<BlockQ8_0>(w, x),
        GgmlDType::Q2K => rows::<BlockQ2K>(w, x),
        GgmlDType::Q3K => rows::<BlockQ3K>(w, x),
        GgmlDType::Q5K => rows::<BlockQ5K>(w, x),
        _ => Ok(None),
    }
}

/// Whether candle 0.11 takes its repacked Q8_0 kernels here (x86-64 with AVX-512 VNNI or AVX
/// VNNI: `repack_x86::select`); they are faster than the generic product, so candle keeps them.
fn candle_repacks_q8_0() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *VNNI.get_or_init(|| {
            (is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vnni"))
                || is_x86_feature_detected!("avxvnni")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The rows that candle's own product of `w` computes as one tile on this CPU: 16 where candle
/// 0.11 takes its repacked x86 kernels for this matrix (`repack_x86::select`: Q4_K, Q6_K for
/// several input rows, and Q8_0 with VNNI; 16-row tiles, 256-wide blocks), else 1. Those kernels
/// quantize the activations as Q8_K, the generic ones per block of the type, so the same rows
/// can round differently in the two. A matrix cut to a multiple of this many rows takes the same
/// kernel as the whole (`crate::model::Linear::first_rows`).
pub fn candle_row_tile(w: &QTensor) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        const TILE: usize = 16;
        let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        let tiled_type = match w.dtype() {
            GgmlDType::Q4K | GgmlDType::Q6K => true,
            GgmlDType::Q8_0 => candle_repacks_q8_0(),
            _ => false,
        };
        match w.shape().dims2() {
            Ok((n, k))
                if avx2 && tiled_type && w.device().is_cpu() && n.is_multiple_of(TILE) && k.is_multiple_of(256) =>
            {
                TILE
            }
            _ => 1,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = w;
        1
    }
}

fn rows<T: GgmlType>(w: &QTensor, x: &Tensor) -> Result<Option<Tensor>> {
    // (`w.data()` of a matrix on a GPU would copy it to the host: CPU only.)
    if !(x.device().is_cpu() && w.device().is_cpu() && x.dtype() == candle_core::DType::F32) {
        return Ok(None);
    }
    let (n, k) = w.shape().dims2()?;
    let mut dims = x.dims().to_vec();
    if k == 0 || dims.last() != Some(&k) || k % T::BLCK_SIZE != 0 {
        return Ok(None);
    }
    let kb = k / T::BLCK_SIZE;
    let bytes = w.data()?;
    // The CPU storage is candle's `Vec<T>`; anything else (not expected) takes candle's path.
    if bytes.len() != n * kb * std::mem::size_of::<T>() || bytes.as_ptr().align_offset(std::mem::align_of::<T>()) != 0 {
        return Ok(None);
    }
    // SAFETY: length and alignment checked; `T` is a plain-old-data block type.
    let weights = unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, n * kb) };
    let m = x.elem_count() / k;
    let out = super::with_host_f32(x, |xs| product(weights, xs, m, n, k))?;
    *dims.last_mut().expect("non-empty dims") = n;
    Ok(Some(Tensor::from_vec(out, dims, x.device())?))
}

/// Activation rows per work item in a product of several rows: a tile of quantized rows stays
/// in L1 while a weight quad is read once for all of them (candle's `MATMUL_ROW_TILE`).
const ROW_TILE: usize = 16;

fn product<T: GgmlType>(weights: &[T], xs: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    thread_local! {
        /// The quantized activations, reused across calls (as `u64`s for their alignment).
        static ACTS: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    }
    let kb = k / T::BLCK_SIZE;
    ACTS.with(|cell| {
        let mut scratch = cell.borrow_mut();
        let words = (m * kb * std::mem::size_of::<T::VecDotType>()).div_ceil(8);
        if scratch.len() < words {
            scratch.resize(words, 0);
        }
        // SAFETY: the buffer is large enough and 8-byte aligned; the block types are plain old
        // data, and every block is written by `from_float` below before it is read.
        let acts = unsafe { std::slice::from_raw_parts_mut(scratch.as_mut_ptr() as *mut T::VecDotType, m * kb) };
        for (row, blocks) in xs.chunks_exact(k).zip(acts.chunks_exact_mut(kb)) {
            T::VecDotType::from_float(row, blocks);
        }
        dot_products(weights, acts, m, n, k)
    })
}

fn dot_products<T: GgmlType>(weights: &[T], acts: &[T::VecDotType], m: usize, n: usize, k: usize) -> Vec<f32> {
    let kb = k / T::BLCK_SIZE;
    let mut out = vec![0f32; m * n];
    let out_addr = out.as_mut_ptr() as usize;
    let quads = n / 4;
    let w_row = |c: usize| &weights[c * kb..(c + 1) * kb];
    let a_row = |r: usize| &acts[r * kb..(r + 1) * kb];
    // SAFETY (every write below): each (row, column) is written by exactly one work item, and
    // `out` outlives the dispatch.
    let put = |r: usize, c: usize, v: f32| unsafe { *(out_addr as *mut f32).add(r * n + c) = v };
    let row_tiles = m.div_ceil(ROW_TILE);
    let tail_items = if n.is_multiple_of(4) { 0 } else { m };
    let items = row_tiles * quads + tail_items;
    // Items `0..row_tiles * quads`: (row tile, quad), tile-major; then, when `n` is not a
    // multiple of 4, one per row for the 1-3 columns after the last quad.
    let work = |range: std::ops::Range<usize>| {
        for item in range {
            if item < row_tiles * quads {
                let (tile, q) = (item / quads, item % quads);
                let c = q * 4;
                for r in tile * ROW_TILE..(tile * ROW_TILE + ROW_TILE).min(m) {
                    let (d0, d1, d2, d3) =
                        T::vec_dot_4(k, w_row(c), w_row(c + 1), w_row(c + 2), w_row(c + 3), a_row(r));
                    put(r, c, d0);
                    put(r, c + 1, d1);
                    put(r, c + 2, d2);
                    put(r, c + 3, d3);
                }
            } else {
                let r = item - row_tiles * quads;
                let mut c = quads * 4;
                if n - c >= 2 {
                    let (d0, d1) = T::vec_dot_2(k, w_row(c), w_row(c + 1), a_row(r));
                    put(r, c, d0);
                    put(r, c + 1, d1);
                    c += 2;
                }
                if c < n {
                    put(r, c, T::vec_dot(k, w_row(c), a_row(r)));
                }
            }
        }
    };
    crate::kernels::pool::chunked(m * n * k, items, work);
    out
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};

    /// Bit for bit candle's `QMatMul` for every type, at one to many rows and widths that
    /// leave 0-3 columns after the quads.
    #[test]
    fn equals_candles_product_bit_for_bit() {
        let dev = Device::Cpu;
        let types = [
            GgmlDType::Q4_0,
            GgmlDType::Q4_1,
            GgmlDType::Q5_0,
            GgmlDType::Q5_1,
            GgmlDType::Q8_0,
            GgmlDType::Q2K,
            GgmlDType::Q3K,
            GgmlDType::Q5K,
        ];
        for dtype in types {
            for (n, m) in [(37usize, 1usize), (64, 3), (18, 17), (5, 40)] {
                let k = 512;
                let w = Tensor::randn(0f32, 1f32, (n, k), &dev).unwrap();
                let q = QTensor::quantize(&w, dtype).unwrap();
                let x = Tensor::randn(0f32, 1f32, (1, m, k), &dev).unwrap();
                let Some(ours) = super::matmul(&q, &x).unwrap() else {
                    assert!(dtype == GgmlDType::Q8_0 && super::candle_repacks_q8_0(), "{dtype:?} not taken");
                    continue;
                };
                let candle = QMatMul::from_qtensor(q).unwrap().forward(&x).unwrap();
                assert_eq!(ours.dims(), candle.dims());
                let (a, b) = (
                    ours.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    candle.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                );
                for (i, (u, v)) in a.iter().zip(&b).enumerate() {
                    assert_eq!(u.to_bits(), v.to_bits(), "{dtype:?} n={n} m={m} element {i}: {u} vs {v}");
                }
            }
        }
    }
}
