//! Q6_K matrices repacked at load into tiles of 16 weight rows for x86-64 CPUs with AVX-512
//! VNNI: the Q6_K counterpart of [`super::q4k`], whose module doc explains the scheme.
//!
//! A [`Q6KTile`] keeps the low 4 bits of each 6-bit value as nibbles in the order of a
//! [`super::q4k::Q4KTile`] (64 bytes: 4 values of each of 16 rows, and as many in the
//! high nibbles), and the high 2 bits of a sub-block's four such registers in one 64-byte run,
//! register `k` in bits `2 k .. 2 k + 2` of each byte: a shift and a mask bring them to bits 4
//! and 5, with no shuffle. `vpdpbusd` then multiplies the unsigned 6-bit values, and each
//! 16-value sub-block's scale is applied in the integer domain; the `-32` offset goes into the
//! same sum through the activation sums (`vpdpwssd` with pairs of `-32` times the signed 8-bit
//! scales, at most 4,096 in magnitude), so one accumulator per row suffices. Same
//! bytes per weight as ggml's block (3,392 per 16 x 256 values with the alignment: 0.83, against
//! 0.82).
//!
//! Overflow: a sub-block's lane sum is at most 16 x 63 x 128 = 129,024; times a scale (at most
//! 128 in magnitude) and over 16 sub-blocks, under 2.7e8; the offset term 32 x 16 x 128 x 2,048
//! under 1.4e8; together under 2^31.

use super::q4k::{tile_with, Tiled, TiledMatrix, PREFETCH_TILES, TILE_ROWS};
use crate::kernels::quant::avx2::q6k::six_bit_values;
use crate::kernels::quant::{BlockQ6K, BlockQ8K, QK_K};
use candle_core::quantized::GgmlDType;
use candle_core::Result;
use half::f16;

/// One Q6_K super-block of [`TILE_ROWS`] consecutive weight rows.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub struct Q6KTile {
    /// `ql[64 g + 4 r + j]` (`g` 0..32, `r` a row, `j` 0..4): low nibble is the low 4 bits of
    /// value `8 g + j` of row `r`, high nibble those of value `8 g + 4 + j`.
    ql: [u8; 2048],
    /// `qh[64 s + p]`, bits `2 k .. 2 k + 2`: the high 2 bits of the value at byte `p` of
    /// register `k` of sub-block `s`, the registers being the low nibbles of group `2 s`, its
    /// high nibbles, then those of group `2 s + 1`.
    qh: [u8; 1024],
    /// `scales[s][r]`: the scale of sub-block `s` (values `16 s .. 16 s + 16`) of row `r`.
    scales: [[i8; TILE_ROWS]; 16],
    /// Per row: the super-block scale (f16 bits).
    d: [u16; TILE_ROWS],
}

const _: () = assert!(std::mem::size_of::<Q6KTile>() == 3392);

impl Q6KTile {
    const ZERO: Self = Self { ql: [0; 2048], qh: [0; 1024], scales: [[0; TILE_ROWS]; 16], d: [0; TILE_ROWS] };
}

/// A Q6_K matrix in [`Q6KTile`]s.
pub type Q6KTiledMatrix = TiledMatrix<Q6KTile>;

/// Tiles the raw bytes of a `[rows, cols]` ggml Q6_K tensor, on all cores.
pub fn tile(bytes: &[u8], rows: usize, cols: usize) -> Result<Vec<Q6KTile>> {
    const SIZE: usize = std::mem::size_of::<BlockQ6K>();
    tile_with("q6k-tile", bytes, (rows, cols), SIZE, |raw| {
        let mut out = Q6KTile::ZERO;
        for (r, raw) in raw.into_iter().enumerate() {
            // SAFETY: `BlockQ6K` is `repr(C)` of byte arrays and a u16, 210 bytes, any bit
            // pattern valid; `read_unaligned` tolerates the alignment (`raw` is 210 long).
            let b: BlockQ6K = unsafe { std::ptr::read_unaligned(raw.as_ptr() as *const BlockQ6K) };
            out.d[r] = b.d;
            for s in 0..16 {
                out.scales[s][r] = b.scales[s];
            }
            let v = six_bit_values(&b);
            for g in 0..32 {
                for (h, base) in [(0, 8 * g), (1, 8 * g + 4)] {
                    for j in 0..4 {
                        let value = v[base + j];
                        let byte = 4 * r + j;
                        let k = 2 * (g % 2) + h;
                        out.ql[64 * g + byte] |= (value & 0xf) << (4 * h);
                        out.qh[64 * (g / 2) + byte] |= (value >> 4) << (2 * k);
                    }
                }
            }
        }
        out
    })
}

/// The weights of row `r` of a tile as `f32` (for tests): `d * (scale * (q - 32))`, as candle
/// dequantizes them.
pub fn dequantize(t: &Q6KTile, r: usize) -> [f32; QK_K] {
    let d = f16::from_bits(t.d[r]).to_f32();
    let mut out = [0f32; QK_K];
    for g in 0..32 {
        for (h, base) in [(0, 8 * g), (1, 8 * g + 4)] {
            for j in 0..4 {
                let byte = 4 * r + j;
                let low = (t.ql[64 * g + byte] >> (4 * h)) & 0xf;
                let high = (t.qh[64 * (g / 2) + byte] >> (2 * (2 * (g % 2) + h))) & 3;
                let v = base + j;
                let q = (low | (high << 4)) as i32 - 32;
                out[v] = d * (t.scales[v / 16][r] as f32 * q as f32);
            }
        }
    }
    out
}

impl Tiled for Q6KTile {
    const DTYPE: GgmlDType = GgmlDType::Q6K;

    fn tile(bytes: &[u8], rows: usize, cols: usize) -> Result<Vec<Self>> {
        tile(bytes, rows, cols)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn dots<const R: usize>(tiles: &[Self], acts: [&[BlockQ8K]; R]) -> [std::arch::x86_64::__m512; R] {
        use std::arch::x86_64::*;
        let m4 = _mm512_set1_epi8(0x0f);
        let m30 = _mm512_set1_epi8(0x30);
        let low16 = _mm512_set1_epi32(0xffff);
        let mut acc = [_mm512_setzero_ps(); R];
        for (i, t) in tiles.iter().enumerate() {
            let ahead = (t as *const Q6KTile).wrapping_add(PREFETCH_TILES) as *const i8;
            // Per activation row, 16 lanes: sum over sub-blocks of scale x products of the
            // unsigned values, less 32 x scale x activation sum (the offset); exact integers.
            // One accumulator per row: a second would spill on AVX-512's 32 registers.
            let mut total = [_mm512_setzero_si512(); R];
            for s in 0..16 {
                for l in 0..4 {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * (4 * s + l)));
                }
                let scale = _mm512_cvtepi8_epi32(_mm_loadu_si128(t.scales[s].as_ptr() as *const __m128i));
                let mut part = [_mm512_setzero_si512(); R];
                // Register k's high 2 bits, moved to bits 4 and 5 of each byte (16-bit shifts:
                // what crosses into a neighbouring byte is masked off).
                let qh = _mm512_load_si512(t.qh.as_ptr().add(64 * s) as *const __m512i);
                let high = [
                    _mm512_and_si512(_mm512_slli_epi16(qh, 4), m30),
                    _mm512_and_si512(_mm512_slli_epi16(qh, 2), m30),
                    _mm512_and_si512(qh, m30),
                    _mm512_and_si512(_mm512_srli_epi16(qh, 2), m30),
                ];
                for (h2, g) in (2 * s..2 * s + 2).enumerate() {
                    let nib = _mm512_load_si512(t.ql.as_ptr().add(64 * g) as *const __m512i);
                    let lo = _mm512_or_si512(_mm512_and_si512(nib, m4), high[2 * h2]);
                    let hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(nib, 4), m4), high[2 * h2 + 1]);
                    for r in 0..R {
                        let y = acts[r].get_unchecked(i).qs.as_ptr().add(8 * g);
                        let y_lo = _mm512_set1_epi32((y as *const i32).read_unaligned());
                        let y_hi = _mm512_set1_epi32((y.add(4) as *const i32).read_unaligned());
                        part[r] = _mm512_dpbusd_epi32(part[r], lo, y_lo);
                        part[r] = _mm512_dpbusd_epi32(part[r], hi, y_hi);
                    }
                }
                for r in 0..R {
                    total[r] = _mm512_add_epi32(total[r], _mm512_mullo_epi32(scale, part[r]));
                }
                if s % 2 == 1 {
                    // Lanes of i16 pairs (-32 x scale of s - 1, -32 x scale of s; at most
                    // 4,096 in magnitude) against the two sums.
                    let pair = _mm512_or_si512(
                        _mm512_and_si512(
                            _mm512_cvtepi8_epi32(_mm_loadu_si128(t.scales[s - 1].as_ptr() as *const __m128i)),
                            low16,
                        ),
                        _mm512_slli_epi32(scale, 16),
                    );
                    let pair = _mm512_sub_epi16(_mm512_setzero_si512(), _mm512_slli_epi16(pair, 5));
                    for r in 0..R {
                        let sums = acts[r].get_unchecked(i).bsums.as_ptr().add(s - 1);
                        let sums = _mm512_set1_epi32((sums as *const i32).read_unaligned());
                        total[r] = _mm512_dpwssd_epi32(total[r], pair, sums);
                    }
                }
            }
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(t.d.as_ptr() as *const __m256i));
            for r in 0..R {
                let yd = _mm512_set1_ps(acts[r].get_unchecked(i).d);
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, yd), _mm512_cvtepi32_ps(total[r]), acc[r]);
            }
        }
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::quant::avx512::q4k::columns;
    use crate::kernels::quant::qgemv::RowsWeight;
    use crate::kernels::quant::repack_test_support as support;

    #[test]
    fn tiling_keeps_every_weight() {
        support::assert_tiling_keeps_every_weight::<Q6KTile>(dequantize);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn products_match_the_exact_quantized_product() {
        if support::tiled_kernels_available() {
            support::assert_tiled_products_match_the_exact_quantized_product::<Q6KTile>();
        }
    }

    #[test]
    fn rows_do_not_depend_on_the_batch() {
        if support::tiled_kernels_available() {
            support::assert_tiled_rows_do_not_depend_on_the_batch::<Q6KTile>(|m| RowsWeight::Q6KTiled(m));
        }
    }

    /// The integer sums at their extremes: every 6-bit value 63 or 0, scales 127 and -128,
    /// activations -128. Exact arithmetic gives the reference.
    #[test]
    fn extreme_values_do_not_overflow() {
        if !support::tiled_kernels_available() {
            return;
        }
        let one = f16::from_f32(1.0).to_bits();
        let act = BlockQ8K { d: 1.0, qs: [-128; QK_K], bsums: [-128 * 16; 16] };
        for (ql, qh, scale, q) in [(0xff, 0xff, 127i8, 63.0), (0xff, 0xff, -128, 63.0), (0, 0, -128, 0.0)] {
            let tile = Q6KTile { ql: [ql; 2048], qh: [qh; 1024], scales: [[scale; 16]; 16], d: [one; 16] };
            let w = Q6KTiledMatrix { tiles: vec![tile; 2], rows: 16, cols: 2 * QK_K };
            let mut out = [0f32; 16];
            unsafe { columns(&w, &[act, act], 1, 0..16, &mut out) };
            let want = 2.0 * 256.0 * scale as f64 * (q - 32.0) * -128.0;
            assert!(out.iter().all(|&v| v as f64 == want), "{out:?} against {want}");
        }
    }
}
