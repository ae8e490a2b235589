//! Helpers shared by the tests of the repacked layouts ([`super::q4k_interleaved`],
//! [`super::q6k_interleaved`]).

use super::qgemv::{quantize_row_q8k, BlockQ8K, QK_K};
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
