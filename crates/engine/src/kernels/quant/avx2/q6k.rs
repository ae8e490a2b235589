//! Q6_K matrices repacked at load time for our kernel on x86-64 CPUs with AVX2, as
//! [`super::q4k`] does for Q4_K.
//!
//! A Q6_K super-block has 16 sub-blocks of 16 values with signed 8-bit scales. In ggml's layout
//! every 32 products need a shuffle to spread a scale and a `madd` to apply it. Here the same
//! weights, bit for bit, are laid out so that every 32-byte `maddubs` covers 2 values of each
//! of the 16 sub-blocks (16-bit lane `s` is sub-block `s`): two `maddubs` results are summed
//! in 16-bit lanes and one `madd` by the 16 scales applies them, 4 `madd`s per super-block
//! instead of 8, and no shuffles. The `-32` offset is folded in once per super-block through the
//! activations' 16-value sums, in integers.
//!
//! Storage, 210 bytes per block as in ggml: the low 4 bits of two groups per `ql` byte, and the
//! high 2 bits of four groups per `qh` byte, placed so that each group's bits are moved to bits
//! 4-5 by at most one 16-bit shift and one mask.
//!
//! Overflow: a `maddubs` lane is `q0 y0 + q1 y1` with `q < 64` and `|y| <= 128`, at most 16,128
//! in magnitude; two of them sum to at most 32,256 < 2^15.

use super::q4k::{RepackedMatrix, Repacks};
use crate::kernels::quant::{BlockQ6K, BlockQ8K, QK_K};
use candle_core::quantized::GgmlDType;
use candle_core::Result;
use half::f16;

/// A Q6_K super-block with its 6-bit values permuted (see [`source_index`]).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ6KI {
    d: u16,
    scales: [i8; 16],
    /// Byte `32 j + b`: low nibble is the low 4 bits of value `source_index(2 j, b)`, high
    /// nibble those of `source_index(2 j + 1, b)`.
    ql: [u8; 128],
    /// Byte `32 h + b`: the high 2 bits of `source_index(4 h + i, b)` at bits 4, 6, 0 and 2 for
    /// `i` = 0, 1, 2 and 3.
    qh: [u8; 64],
}

const _: () = assert!(std::mem::size_of::<BlockQ6KI>() == 210);

/// A Q8_K activation block permuted like [`BlockQ6KI`]: `qs[32 g + b]` is value
/// `source_index(g, b)`; `bsums` are ggml's (sums of values `16 s .. 16 s + 16`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ8K6I {
    d: f32,
    qs: [i8; QK_K],
    bsums: [i16; 16],
}

impl BlockQ8K6I {
    pub const ZERO: Self = Self { d: 0.0, qs: [0; QK_K], bsums: [0; 16] };
}

/// The value (0..256) of a super-block at byte `b` (0..32) of group `g` (0..8): bytes `2 s`
/// and `2 s + 1` of every group come from sub-block `s` (values `16 s .. 16 s + 16`).
#[inline(always)]
pub const fn source_index(g: usize, b: usize) -> usize {
    16 * (b / 2) + 2 * g + b % 2
}

/// The 256 6-bit values of a ggml Q6_K block in order (ggml's `dequantize_row_q6_K`: in each
/// half of 128 values, part `k` of 32 takes the low or high nibbles of `ql` and bits `2k` of
/// `qh`).
pub(crate) fn six_bit_values(b: &BlockQ6K) -> [u8; QK_K] {
    let mut v = [0u8; QK_K];
    for half in 0..2 {
        for l in 0..32 {
            let (ql0, ql1, qh) = (b.ql[64 * half + l], b.ql[64 * half + l + 32], b.qh[32 * half + l]);
            let base = 128 * half + l;
            v[base] = (ql0 & 0xf) | ((qh & 3) << 4);
            v[base + 32] = (ql1 & 0xf) | (((qh >> 2) & 3) << 4);
            v[base + 64] = (ql0 >> 4) | (((qh >> 4) & 3) << 4);
            v[base + 96] = (ql1 >> 4) | (((qh >> 6) & 3) << 4);
        }
    }
    v
}

fn repack_block(raw: &[u8]) -> BlockQ6KI {
    // SAFETY: `BlockQ6K` is `repr(C)` of byte arrays and a u16, 210 bytes, any bit pattern
    // valid; `read_unaligned` tolerates the alignment of `raw` (checked 210 long).
    assert_eq!(raw.len(), std::mem::size_of::<BlockQ6K>());
    let b: BlockQ6K = unsafe { std::ptr::read_unaligned(raw.as_ptr() as *const BlockQ6K) };
    let v = six_bit_values(&b);
    let mut r = BlockQ6KI { d: b.d, scales: b.scales, ql: [0; 128], qh: [0; 64] };
    for i in 0..32 {
        for j in 0..4 {
            let lo = v[source_index(2 * j, i)] & 0xf;
            let hi = v[source_index(2 * j + 1, i)] & 0xf;
            r.ql[32 * j + i] = lo | (hi << 4);
        }
        for h in 0..2 {
            let mut byte = 0u8;
            for (k, shift) in [4, 6, 0, 2].into_iter().enumerate() {
                byte |= (v[source_index(4 * h + k, i)] >> 4) << shift;
            }
            r.qh[32 * h + i] = byte;
        }
    }
    r
}

/// Repacks ggml Q6_K blocks (the raw bytes of a GGUF tensor) into [`BlockQ6KI`], on all cores.
pub fn repack(bytes: &[u8]) -> Result<Vec<BlockQ6KI>> {
    const SIZE: usize = std::mem::size_of::<BlockQ6K>();
    if !bytes.len().is_multiple_of(SIZE) {
        candle_core::bail!("q6k-repack: {} bytes is not a whole number of Q6_K blocks", bytes.len());
    }
    Ok(super::q4k::repack_parallel(bytes, SIZE, repack_block))
}

/// The weights of a repacked block as `f32` (for tests): `d * scale * (q - 32)`.
pub fn dequantize(b: &BlockQ6KI) -> [f32; QK_K] {
    let d = f16::from_bits(b.d).to_f32();
    let mut out = [0f32; QK_K];
    for g in 0..8 {
        for i in 0..32 {
            let ql = b.ql[32 * (g / 2) + i];
            let low = if g % 2 == 0 { ql & 0xf } else { ql >> 4 };
            let shift = [4, 6, 0, 2][g % 4];
            let high = (b.qh[32 * (g / 4) + i] >> shift) & 3;
            let v = source_index(g, i);
            let q = (low | (high << 4)) as i32 - 32;
            out[v] = d * (b.scales[v / 16] as f32 * q as f32);
        }
    }
    out
}

/// Permutes a Q8_K activation block into the layout of [`BlockQ8K6I`].
pub fn permute_activations(b: &BlockQ8K, out: &mut BlockQ8K6I) {
    out.d = b.d;
    for g in 0..8 {
        for i in 0..32 {
            out.qs[32 * g + i] = b.qs[source_index(g, i)];
        }
    }
    out.bsums = b.bsums;
}

impl Repacks for BlockQ6KI {
    const DTYPE: GgmlDType = GgmlDType::Q6K;
    fn repack(bytes: &[u8]) -> Result<Vec<Self>> {
        repack(bytes)
    }
}

/// A Q6_K matrix in the layout of [`BlockQ6KI`].
pub type Q6KMatrix = RepackedMatrix<BlockQ6KI>;

#[cfg(target_arch = "x86_64")]
impl super::columns::RepackedBlock for BlockQ6KI {
    type Act = BlockQ8K6I;
    /// Fours: the 6-bit values take 34 operations per block to decode, so sharing them over 4
    /// rows pays for the spills. The output layer's product in panels, 2 cores, same run: 64
    /// rows 67.4 GMAC/s in pairs, 87.7 in fours; 16 rows 65.5 and 79.7
    /// (docs/results/README.md#const-qgemv-panels).
    const FOURS: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dots<const R: usize>(w: &[Self], acts: [&[BlockQ8K6I]; R]) -> [f32; R] {
        dots_avx2(w, acts)
    }

    /// The AVX2 kernel (this layout pairs two sub-blocks in every 4 bytes, which `vpdpbusd`
    /// would sum together), compiled inside the VNNI kernels' feature set so that it inlines
    /// into their column loop.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    unsafe fn dots_vnni<const R: usize>(w: &[Self], acts: [&[BlockQ8K6I]; R]) -> [f32; R] {
        dots_avx2(w, acts)
    }
}

/// The Q6_K kernel body, inlined into both entries of `RepackedBlock` for this layout.
///
/// # Safety
/// AVX2, FMA and F16C must be available; every `acts[r]` has at least `w.len()` blocks.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dots_avx2<const R: usize>(w: &[BlockQ6KI], acts: [&[BlockQ8K6I]; R]) -> [f32; R] {
    use std::arch::x86_64::*;
    let m4 = _mm256_set1_epi8(0x0f);
    let m30 = _mm256_set1_epi8(0x30);
    let mut acc = [_mm256_setzero_ps(); R];
    for (i, b) in w.iter().enumerate() {
        super::columns::prefetch_ahead::<4>(b as *const BlockQ6KI as *const u8);
        let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(b.d as i32)));
        // The 16 scales as i16: lane s scales sub-block s.
        let scale = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.scales.as_ptr() as *const __m128i));
        let mut sum = [_mm256_setzero_si256(); R];
        for h in 0..2 {
            let qh = _mm256_loadu_si256(b.qh.as_ptr().add(32 * h) as *const __m256i);
            let ql0 = _mm256_loadu_si256(b.ql.as_ptr().add(64 * h) as *const __m256i);
            let ql1 = _mm256_loadu_si256(b.ql.as_ptr().add(64 * h + 32) as *const __m256i);
            let q = [
                _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(qh, m30)),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                    _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30),
                ),
                _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                    _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30),
                ),
            ];
            for r in 0..R {
                let y = acts[r].get_unchecked(i).qs.as_ptr().add(128 * h) as *const __m256i;
                let p01 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(q[0], _mm256_loadu_si256(y)),
                    _mm256_maddubs_epi16(q[1], _mm256_loadu_si256(y.add(1))),
                );
                let p23 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(q[2], _mm256_loadu_si256(y.add(2))),
                    _mm256_maddubs_epi16(q[3], _mm256_loadu_si256(y.add(3))),
                );
                sum[r] = _mm256_add_epi32(
                    sum[r],
                    _mm256_add_epi32(_mm256_madd_epi16(scale, p01), _mm256_madd_epi16(scale, p23)),
                );
            }
        }
        for r in 0..R {
            let y = acts[r].get_unchecked(i);
            // The -32 offset: 32 * sum over sub-blocks of scale * (sum of its activations).
            let off = _mm256_madd_epi16(scale, _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i));
            let total = _mm256_sub_epi32(sum[r], _mm256_slli_epi32(off, 5));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(total), acc[r]);
        }
    }
    let mut out = [0f32; R];
    for r in 0..R {
        let v = acc[r];
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        out[r] = _mm_cvtss_f32(s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::quant::avx2::cpu_supported;
    use crate::kernels::quant::qgemv::{matmul_many, quantize_row_q8k, RowsWeight};
    use crate::kernels::quant::repack_test_support::{self as support, values};
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};

    #[test]
    fn the_permutation_is_a_bijection_by_sub_block() {
        // Each group holds 2 values of each 16-value sub-block.
        support::assert_permutation(source_index, 2, 16);
    }

    /// Same weights, bit for bit, as candle's dequantization of the ggml blocks; activations
    /// permute without loss and keep ggml's 16-value sums.
    #[test]
    fn repacking_keeps_every_weight_and_activation() {
        support::assert_repack_keeps_weights(GgmlDType::Q6K, repack, dequantize, 210);
        let (a, p) = support::permuted_activations(permute_activations, BlockQ8K6I::ZERO, |b| &b.qs, source_index);
        assert_eq!(p.bsums, a.bsums);
    }

    /// Our product from 1 to 9 rows (every tile size) equals exact arithmetic on the same
    /// quantized operands (f64 sums of dequantized weights times Q8_K activations) up to f32
    /// rounding, and each row is the same, bit for bit, whatever the number of rows beside it.
    #[test]
    fn products_match_exact_arithmetic_and_do_not_depend_on_the_batch() {
        if !cpu_supported() {
            eprintln!("no AVX2/FMA/F16C on this CPU: the kernel is never taken, nothing to check");
            return;
        }
        let dev = Device::Cpu;
        let (n, k) = (37, 768);
        let w = Tensor::from_vec(values(n * k, 7), (n, k), &dev).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q6K).unwrap();
        let mat = Q6KMatrix::from_qtensor(&q).unwrap().expect("Q6_K on an AVX2 CPU");
        let wd: Vec<f32> = q.dequantize(&dev).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let x = values(9 * k, 8);
        let mut xq = vec![BlockQ8K::ZERO; 9 * k / QK_K];
        for (row, b) in x.chunks_exact(k).zip(xq.chunks_exact_mut(k / QK_K)) {
            quantize_row_q8k(row, b);
        }
        let xd: Vec<f64> = xq.iter().flat_map(|b| b.qs.iter().map(move |&v| b.d as f64 * v as f64)).collect();
        let alone: Vec<Vec<f32>> = (0..9)
            .map(|r| {
                let mut out = vec![0f32; n];
                matmul_many(&[RowsWeight::Q6KInterleaved(&mat)], &x[r * k..(r + 1) * k], 1, &mut [&mut out[..]])
                    .unwrap();
                out
            })
            .collect();
        for m in 1..=9 {
            let mut out = vec![0f32; m * n];
            matmul_many(&[RowsWeight::Q6KInterleaved(&mat)], &x[..m * k], m, &mut [&mut out[..]]).unwrap();
            for r in 0..m {
                for c in 0..n {
                    let want: f64 = (0..k).map(|j| xd[r * k + j] * wd[c * k + j] as f64).sum();
                    let got = out[r * n + c] as f64;
                    assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0), "m={m} ({r},{c}): {got} vs {want}");
                }
            }
            for (r, alone) in alone.iter().enumerate().take(m) {
                assert_eq!(&out[r * n..(r + 1) * n], &alone[..], "row {r} alone and among {m}");
            }
        }
    }

    /// The 16-bit sums at their extreme: every value 63 (weight 31 d s), activations -128.
    #[test]
    fn extreme_values_do_not_overflow() {
        if !cpu_supported() {
            eprintln!("no AVX2/FMA/F16C on this CPU: the kernel is never taken, nothing to check");
            return;
        }
        let one = f16::from_f32(1.0).to_bits();
        for scale in [127i8, -128] {
            let block = BlockQ6KI { d: one, scales: [scale; 16], ql: [0xff; 128], qh: [0xff; 64] };
            let w = Q6KMatrix { blocks: vec![block; 2], rows: 1, cols: 2 * QK_K };
            let x = vec![-1f32; 2 * QK_K];
            let mut out = [0f32; 1];
            matmul_many(&[RowsWeight::Q6KInterleaved(&w)], &x, 1, &mut [&mut out[..]]).unwrap();
            let want = -((2 * QK_K) as f64 * scale as f64 * 31.0);
            assert!((out[0] as f64 - want).abs() <= 1e-6 * want.abs(), "scale {scale}: {} against {want}", out[0]);
        }
    }
}
