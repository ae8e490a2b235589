//! Helpers shared by the tests of the repacked layouts ([`super::avx2::q4k`],
//! [`super::avx2::q6k`]).

use super::qgemv::quantize_row_q8k;
use super::{BlockQ8K, QK_K};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

/// Deterministic values in [-1, 1) (xorshift).
pub fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// `source_index` maps the 8 groups of 32 bytes onto the 256 values one to one, and byte `b` of
/// every group comes from sub-block `b / bytes_per_sub_block` (sub-blocks of `sub_block_len`).
pub fn assert_permutation(source_index: fn(usize, usize) -> usize, bytes_per_sub_block: usize, sub_block_len: usize) {
    let mut seen = [false; QK_K];
    for g in 0..8 {
        for b in 0..32 {
            let v = source_index(g, b);
            assert_eq!(v / sub_block_len, b / bytes_per_sub_block, "group {g} byte {b}: value {v}");
            assert!(!std::mem::replace(&mut seen[v], true), "value {v} taken twice");
        }
    }
    assert!(seen.iter().all(|&s| s));
}

/// A `[5, 1024]` matrix quantized to `dtype`: candle's dequantization of it must equal
/// `dequantize` of every block of `repack` of its bytes, bit for bit; a partial block is
/// refused. Also checks that the Q8_K activations of one block permute as `source_index` says,
/// and returns that block for checks of its sums.
pub fn assert_repack_keeps_weights<B>(
    dtype: GgmlDType,
    repack: fn(&[u8]) -> candle_core::Result<Vec<B>>,
    dequantize: fn(&B) -> [f32; QK_K],
    block_bytes: usize,
) {
    let dev = Device::Cpu;
    let (n, k) = (5, 1024);
    let w = Tensor::from_vec(values(n * k, 3), (n, k), &dev).unwrap();
    let q = QTensor::quantize(&w, dtype).unwrap();
    let want: Vec<f32> = q.dequantize(&dev).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    let blocks = repack(&q.data().unwrap()).unwrap();
    assert_eq!(blocks.len(), n * k / QK_K);
    let got: Vec<f32> = blocks.iter().flat_map(dequantize).collect();
    assert_eq!(got, want, "{dtype:?}");
    assert!(repack(&vec![0u8; block_bytes + 1]).is_err(), "a partial block is refused");
}

/// One Q8_K activation block of deterministic values, and `permute` of it: its values must sit
/// where `source_index` says.
pub fn permuted_activations<A>(
    permute: fn(&BlockQ8K, &mut A),
    zero: A,
    qs: fn(&A) -> &[i8; QK_K],
    source_index: fn(usize, usize) -> usize,
) -> (BlockQ8K, A) {
    let x = values(QK_K, 9);
    let mut a = [BlockQ8K::ZERO];
    quantize_row_q8k(&x, &mut a);
    let mut p = zero;
    permute(&a[0], &mut p);
    for g in 0..8 {
        for b in 0..32 {
            assert_eq!(qs(&p)[32 * g + b], a[0].qs[source_index(g, b)], "group {g} byte {b}");
        }
    }
    (a[0], p)
}

/// Each row of a product is the same, bit for bit, alone or among 2 to 9 rows: `product(x, m)`
/// is `x` (`m` rows of `k`) times a `[n, k]` matrix, `[m, n]`. Speculative decoding at
/// temperature 0 relies on it.
pub fn assert_rows_do_not_depend_on_the_batch(n: usize, k: usize, product: impl Fn(&[f32], usize) -> Vec<f32>) {
    let x = values(9 * k, 6);
    let alone: Vec<Vec<f32>> = (0..9).map(|r| product(&x[r * k..(r + 1) * k], 1)).collect();
    for m in 2..=9 {
        let out = product(&x[..m * k], m);
        for (r, a) in alone.iter().enumerate().take(m) {
            assert_eq!(&out[r * n..(r + 1) * n], &a[..], "row {r} alone and among {m}");
        }
    }
}

/// True when the tiled kernels ([`super::avx512::q4k`], [`super::avx512::q6k`]) are taken on this
/// CPU; otherwise says so (their tests then have nothing to check).
pub fn tiled_kernels_available() -> bool {
    let ok = super::avx2::vnni_enabled();
    if !ok {
        eprintln!("no AVX-512 VNNI (or MDSD_VNNI=0): the tiled kernels are never taken, nothing to check");
    }
    ok
}

/// Tiling a `[32, 768]` matrix of type `T::DTYPE` keeps every weight: candle's dequantization of
/// the ggml blocks equals `dequantize(tile, row)` bit for bit; a row count that is not a whole
/// number of tiles and a short buffer are refused.
pub fn assert_tiling_keeps_every_weight<T: super::avx512::q4k::Tiled>(dequantize: fn(&T, usize) -> [f32; QK_K]) {
    use super::avx512::q4k::TILE_ROWS;
    let (n, k) = (32, 768);
    let w = Tensor::from_vec(values(n * k, 3), (n, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&w, T::DTYPE).unwrap();
    let want: Vec<f32> = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    let tiles = T::tile(&q.data().unwrap(), n, k).unwrap();
    let kb = k / QK_K;
    for row in 0..n {
        for i in 0..kb {
            let got = dequantize(&tiles[(row / TILE_ROWS) * kb + i], row % TILE_ROWS);
            assert_eq!(&got[..], &want[row * k + i * QK_K..row * k + (i + 1) * QK_K], "row {row} block {i}");
        }
    }
    assert!(T::tile(&q.data().unwrap(), n - 1, k).is_err(), "rows not a whole number of tiles");
    assert!(T::tile(&q.data().unwrap()[1..], n, k).is_err(), "a short buffer");
}

/// `x @ w^T` by the tiled kernel for `T` against the exact product of the quantized values (the
/// dequantized weights times the dequantized Q8_K activations, in f64): within f32 rounding
/// (1e-5 of the sum of |terms|), for 1-9, 33 and 38 rows, with two column ranges that split a
/// tile (each column written once).
#[cfg(target_arch = "x86_64")]
pub fn assert_tiled_products_match_the_exact_quantized_product<T: super::avx512::q4k::Tiled>() {
    use super::avx512::q4k::{columns, TiledMatrix};
    let (n, k) = (48, 3 * QK_K);
    let kb = k / QK_K;
    let w = Tensor::from_vec(values(n * k, 11), (n, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&w, T::DTYPE).unwrap();
    let wq: Vec<f32> = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    let mat = TiledMatrix::<T>::from_qtensor(&q).unwrap().expect("VNNI checked by the caller");
    for m in [1, 2, 3, 4, 5, 7, 9, 33, 38] {
        let x = values(m * k, 20 + m as u64);
        let mut acts = vec![BlockQ8K::ZERO; m * kb];
        for (row, blocks) in x.chunks_exact(k).zip(acts.chunks_exact_mut(kb)) {
            quantize_row_q8k(row, blocks);
        }
        let mut out = vec![f32::NAN; m * n];
        // SAFETY: the caller checked AVX-512 VNNI; `acts` has `m * kb` blocks, `out` `m * n`.
        unsafe {
            columns(&mat, &acts, m, 0..21, &mut out);
            columns(&mat, &acts, m, 21..n, &mut out);
        }
        for r in 0..m {
            for c in 0..n {
                let (mut exact, mut scale) = (0f64, 0f64);
                for i in 0..kb {
                    let a = &acts[r * kb + i];
                    for j in 0..QK_K {
                        let term = wq[c * k + i * QK_K + j] as f64 * a.d as f64 * a.qs[j] as f64;
                        exact += term;
                        scale += term.abs();
                    }
                }
                let got = out[r * n + c] as f64;
                assert!((got - exact).abs() <= 1e-5 * scale, "{:?} row {r} col {c}: {got} against {exact}", T::DTYPE);
            }
        }
    }
}

/// [`assert_rows_do_not_depend_on_the_batch`] for the tiled kernel of `T` through
/// [`super::qgemv::matmul_many`], as the model calls it; `weight` wraps the tiled matrix.
pub fn assert_tiled_rows_do_not_depend_on_the_batch<T: super::avx512::q4k::Tiled>(
    weight: fn(&super::avx512::q4k::TiledMatrix<T>) -> super::qgemv::RowsWeight<'_>,
) {
    let (n, k) = (32, 512);
    let w = Tensor::from_vec(values(n * k, 4), (n, k), &Device::Cpu).unwrap();
    let mat = super::avx512::q4k::TiledMatrix::<T>::from_qtensor(&QTensor::quantize(&w, T::DTYPE).unwrap())
        .unwrap()
        .expect("VNNI checked by the caller");
    assert_rows_do_not_depend_on_the_batch(n, k, |rows, m| {
        let mut out = vec![0f32; m * n];
        super::qgemv::matmul_many(&[weight(&mat)], rows, m, &mut [&mut out[..]]).unwrap();
        out
    });
}
