//! Q4_K matrices repacked at load into tiles of 16 weight rows, for x86-64 CPUs with AVX-512
//! VNNI.
//!
//! [`crate::kernels::quant::avx2::q4k`] keeps each weight row's blocks together: every 512-bit
//! `vpdpbusd` then sums products of *one* weight row, and each (weight row, activation row,
//! super-block) ends in a horizontal fold, a scale multiply and two `f32` updates. With many
//! activation rows (a draft tree, a prompt) that tail costs more than the products.
//!
//! Here a [`Q4KTile`] holds one super-block of 16 consecutive weight rows, its 4-bit values
//! ordered so that 64 bytes hold 4 values of each of the 16 rows: a `vpdpbusd` against 4
//! activation bytes broadcast to every lane gives 16 weight rows' partial sums, one per lane.
//! Sub-block scales are applied in the integer domain (`mullo` of 16 lanes, the sums are exact),
//! the minimums through the activation block sums (`vpdpwssd`), and the super-block's `d` and
//! `dmin` once per 16 rows in `f32`. The tail is shared by 16 weight rows, and the results come
//! out as 16 consecutive output columns. Same bytes per weight as ggml's Q4_K block
//! (2,368 per 16 x 256 values: 0.578).
//!
//! Activations are ggml's Q8_K blocks as they are. Each activation row's result is computed by
//! the same operations whatever the rows beside it ([`columns`] takes 1 to 4 or 8 rows at
//! once), so a row gives the same bits alone or in a batch (tested): speculative decoding at
//! temperature 0 relies on it. The `f32` rounding differs from
//! [`crate::kernels::quant::avx2::q4k`]'s (one conversion per super-block here, eight lanes
//! there); both are within `f32` rounding of the exact product of the quantized values
//! (tested).
//!
//! Overflow: a lane of one sub-block's sum is at most 32 x 15 x 128 = 61,440; times a 6-bit
//! scale and over 8 sub-blocks, under 3.2e7 < 2^31. Minimums: 8 x 63 x 4,096 < 2^21.

use crate::kernels::quant::avx2::q4k::{nibbles, repack_parallel_by, scale_min};
use crate::kernels::quant::avx2::vnni_enabled;
use crate::kernels::quant::{BlockQ4K, BlockQ8K, QK_K};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Result;
use half::f16;

/// Weight rows per tile.
pub const TILE_ROWS: usize = 16;

/// One Q4_K super-block of [`TILE_ROWS`] consecutive weight rows.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub struct Q4KTile {
    /// `qs[64 g + 4 r + j]` (`g` 0..32, `r` a row of the tile, `j` 0..4): low nibble is value
    /// `8 g + j` of row `r`, high nibble value `8 g + 4 + j`. Group `g` lies in sub-block `g / 4`.
    qs: [u8; 2048],
    /// Per row: the super-block scale and minimum scale (f16 bits).
    d: [u16; TILE_ROWS],
    dmin: [u16; TILE_ROWS],
    /// `scales[s][r]`, `mins[s][r]`: the 6-bit scale and minimum of sub-block `s` of row `r`.
    scales: [[u8; TILE_ROWS]; 8],
    mins: [[u8; TILE_ROWS]; 8],
}

const _: () = assert!(std::mem::size_of::<Q4KTile>() == 2368);

impl Q4KTile {
    const ZERO: Self =
        Self { qs: [0; 2048], d: [0; TILE_ROWS], dmin: [0; TILE_ROWS], scales: [[0; 16]; 8], mins: [[0; 16]; 8] };
}

/// A block type of 16 weight rows that [`columns`] multiplies: Q4_K here, Q6_K in
/// [`super::q6k`].
pub trait Tiled: Sized + Copy + Send {
    /// The ggml type it is made from.
    const DTYPE: GgmlDType;
    /// The tiles of the raw bytes of a `[rows, cols]` ggml tensor of that type.
    fn tile(bytes: &[u8], rows: usize, cols: usize) -> Result<Vec<Self>>;
    /// Dot products of the 16 weight rows of a tile row (`tiles`: its `kb` super-blocks) with
    /// `R` activation rows: lane `j` of result `r` is weight row `j` against activation row `r`.
    /// Each activation row's result must come from the same operations whatever `R`.
    ///
    /// # Safety
    /// AVX512F/BW/VNNI must be available (the caller carries those features, so that this
    /// inlines); every `acts[r]` has at least `tiles.len()` blocks.
    #[cfg(target_arch = "x86_64")]
    unsafe fn dots<const R: usize>(tiles: &[Self], acts: [&[BlockQ8K]; R]) -> [std::arch::x86_64::__m512; R];
}

/// A `[rows, cols]` matrix in tiles of 16 rows: tile `t * kb + i` holds super-block `i` of rows
/// `16 t .. 16 t + 16` (`kb = cols / 256`).
#[derive(Clone)]
pub struct TiledMatrix<T> {
    pub(crate) tiles: Vec<T>,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
}

/// A Q4_K matrix in [`Q4KTile`]s.
pub type Q4KTiledMatrix = TiledMatrix<Q4KTile>;

impl<T: Tiled> std::fmt::Debug for TiledMatrix<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tiled{:?}[{}, {}]", T::DTYPE, self.rows, self.cols)
    }
}

impl<T: Tiled> TiledMatrix<T> {
    /// The tiled copy of `w` when [`columns`] can take it: a 2-D tensor of type `T::DTYPE` on
    /// the CPU, whole super-blocks per row and whole tiles of rows, on a CPU where
    /// [`vnni_enabled`].
    pub fn from_qtensor(w: &QTensor) -> Result<Option<Self>> {
        if !w.device().is_cpu() {
            return Ok(None);
        }
        Self::from_raw(w.dtype(), w.shape().dims(), &w.data()?)
    }

    /// [`Self::from_qtensor`] from the raw bytes of a ggml tensor of type `dtype` and shape
    /// `dims` (for the CPU; e.g. mapped from a GGUF file, without a `QTensor` copy first).
    pub fn from_raw(dtype: GgmlDType, dims: &[usize], bytes: &[u8]) -> Result<Option<Self>> {
        let fit =
            dtype == T::DTYPE && dims.len() == 2 && dims[0].is_multiple_of(TILE_ROWS) && dims[1].is_multiple_of(QK_K);
        if !fit || !vnni_enabled() {
            return Ok(None);
        }
        Ok(Some(Self { tiles: T::tile(bytes, dims[0], dims[1])?, rows: dims[0], cols: dims[1] }))
    }

    /// A copy of the first `rows` rows rounded up to whole tiles of 16 (at most all of them):
    /// the product then has those extra columns too.
    pub fn first_rows(&self, rows: usize) -> Self {
        let rows = rows.next_multiple_of(TILE_ROWS).min(self.rows);
        let kb = self.cols / QK_K;
        Self { tiles: self.tiles[..rows / TILE_ROWS * kb].to_vec(), rows, cols: self.cols }
    }
}

/// Checks that `bytes` is a `[rows, cols]` matrix of `block`-byte super-blocks in whole tiles,
/// and calls `f(t, i, blocks)` for every tile (row tile `t`, super-block `i`) with the tile's 16
/// raw blocks, on all cores.
pub(crate) fn tile_with<T: Copy + Send>(
    name: &str,
    bytes: &[u8],
    (rows, cols): (usize, usize),
    block: usize,
    f: impl Fn([&[u8]; TILE_ROWS]) -> T + Sync,
) -> Result<Vec<T>> {
    let kb = cols / QK_K;
    if !rows.is_multiple_of(TILE_ROWS) || !cols.is_multiple_of(QK_K) || bytes.len() != rows * kb * block {
        candle_core::bail!("{name}: {} bytes is not a [{rows}, {cols}] matrix in tiles of 16 rows", bytes.len());
    }
    Ok(repack_parallel_by(rows / TILE_ROWS * kb, |index| {
        let (t, i) = (index / kb, index % kb);
        f(std::array::from_fn(|r| {
            let at = ((TILE_ROWS * t + r) * kb + i) * block;
            &bytes[at..at + block]
        }))
    }))
}

impl Tiled for Q4KTile {
    const DTYPE: GgmlDType = GgmlDType::Q4K;
    fn tile(bytes: &[u8], rows: usize, cols: usize) -> Result<Vec<Self>> {
        tile(bytes, rows, cols)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn dots<const R: usize>(tiles: &[Self], acts: [&[BlockQ8K]; R]) -> [std::arch::x86_64::__m512; R] {
        tile_dots(tiles, acts)
    }
}

/// Tiles the raw bytes of a `[rows, cols]` ggml Q4_K tensor, on all cores.
pub fn tile(bytes: &[u8], rows: usize, cols: usize) -> Result<Vec<Q4KTile>> {
    const SIZE: usize = std::mem::size_of::<BlockQ4K>();
    tile_with("q4k-tile", bytes, (rows, cols), SIZE, |raw| {
        let mut out = Q4KTile::ZERO;
        for (r, raw) in raw.into_iter().enumerate() {
            // SAFETY: `BlockQ4K` is `repr(C)` of byte arrays and two u16s, 144 bytes, any bit
            // pattern valid; `read_unaligned` tolerates the alignment (`raw` is 144 long).
            let b: BlockQ4K = unsafe { std::ptr::read_unaligned(raw.as_ptr() as *const BlockQ4K) };
            out.d[r] = b.d;
            out.dmin[r] = b.dmin;
            for s in 0..8 {
                (out.scales[s][r], out.mins[s][r]) = scale_min(s, &b.scales);
            }
            let v = nibbles(&b);
            for g in 0..32 {
                for j in 0..4 {
                    out.qs[64 * g + 4 * r + j] = v[8 * g + j] | (v[8 * g + 4 + j] << 4);
                }
            }
        }
        out
    })
}

/// The weights of row `r` of a tile as `f32` (for tests).
pub fn dequantize(t: &Q4KTile, r: usize) -> [f32; QK_K] {
    let d = f16::from_bits(t.d[r]).to_f32();
    let dmin = f16::from_bits(t.dmin[r]).to_f32();
    let mut out = [0f32; QK_K];
    for g in 0..32 {
        let s = g / 4;
        for j in 0..4 {
            let byte = t.qs[64 * g + 4 * r + j];
            for (v, q) in [(8 * g + j, byte & 0xf), (8 * g + 4 + j, byte >> 4)] {
                out[v] = d * t.scales[s][r] as f32 * q as f32 - dmin * t.mins[s][r] as f32;
            }
        }
    }
    out
}

/// [`Tiled::dots`] for Q4_K.
///
/// # Safety
/// As [`Tiled::dots`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_dots<const R: usize>(tiles: &[Q4KTile], acts: [&[BlockQ8K]; R]) -> [std::arch::x86_64::__m512; R] {
    use std::arch::x86_64::*;
    let m4 = _mm512_set1_epi8(0x0f);
    let defer_mins = R > 4;
    // Each 32-bit lane: sub-block `s`'s minimum twice, as two i16, against the activation's
    // two 16-value sums.
    let min_pairs = |t: &Q4KTile, s: usize| {
        let min = _mm512_cvtepu8_epi32(_mm_loadu_si128(t.mins[s].as_ptr() as *const __m128i));
        _mm512_or_si512(min, _mm512_slli_epi32(min, 16))
    };
    // `total_min` plus sub-block `s`'s minimums (`min2`) times the activation block's sums.
    let add_mins = |total_min: __m512i, block: &BlockQ8K, s: usize, min2: __m512i| {
        let sums = _mm512_set1_epi32((block.bsums.as_ptr().add(2 * s) as *const i32).read_unaligned());
        _mm512_dpwssd_epi32(total_min, min2, sums)
    };
    let mut acc = [_mm512_setzero_ps(); R];
    let mut acc_min = [_mm512_setzero_ps(); R];
    for (i, t) in tiles.iter().enumerate() {
        // Per activation row, 16 lanes: sum over sub-blocks of scale x products, and of
        // minimum x activation sum; exact integers. With 8 rows the minimums' sums come after
        // the sub-blocks (`defer_mins`), so that the loop over them holds two accumulators per
        // row in AVX-512's 32 registers; with fewer they go beside the products, where they
        // hide in the loop's latency. The integers are the same either way.
        let mut total = [_mm512_setzero_si512(); R];
        let mut total_min = [_mm512_setzero_si512(); R];
        // The weights stream from memory once per product: ask for a later tile's lines
        // (37 of them) ahead of use, five per sub-block.
        let ahead = (t as *const Q4KTile).wrapping_add(PREFETCH_TILES) as *const i8;
        for s in 0..8 {
            for l in 0..5 {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * (5 * s + l)));
            }
            let scale = _mm512_cvtepu8_epi32(_mm_loadu_si128(t.scales[s].as_ptr() as *const __m128i));
            if !defer_mins {
                let min2 = min_pairs(t, s);
                for r in 0..R {
                    total_min[r] = add_mins(total_min[r], acts[r].get_unchecked(i), s, min2);
                }
            }
            // With one or two rows, the low and high nibbles' products go in separate chains
            // (the `vpdpbusd` latency would otherwise bound the loop); the sum is the same integer.
            let mut part = [_mm512_setzero_si512(); R];
            let mut part_hi = [_mm512_setzero_si512(); R];
            for g4 in 0..4 {
                let g = 4 * s + g4;
                let q = _mm512_load_si512(t.qs.as_ptr().add(64 * g) as *const __m512i);
                let lo = _mm512_and_si512(q, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                for r in 0..R {
                    let y = acts[r].get_unchecked(i).qs.as_ptr().add(8 * g);
                    let y_lo = _mm512_set1_epi32((y as *const i32).read_unaligned());
                    let y_hi = _mm512_set1_epi32((y.add(4) as *const i32).read_unaligned());
                    part[r] = _mm512_dpbusd_epi32(part[r], lo, y_lo);
                    if R <= 2 {
                        part_hi[r] = _mm512_dpbusd_epi32(part_hi[r], hi, y_hi);
                    } else {
                        part[r] = _mm512_dpbusd_epi32(part[r], hi, y_hi);
                    }
                }
            }
            for r in 0..R {
                if R <= 2 {
                    part[r] = _mm512_add_epi32(part[r], part_hi[r]);
                }
                total[r] = _mm512_add_epi32(total[r], _mm512_mullo_epi32(scale, part[r]));
            }
        }
        if defer_mins {
            let min2: [__m512i; 8] = std::array::from_fn(|s| min_pairs(t, s));
            for r in 0..R {
                for (s, &min2) in min2.iter().enumerate() {
                    total_min[r] = add_mins(total_min[r], acts[r].get_unchecked(i), s, min2);
                }
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(t.d.as_ptr() as *const __m256i));
        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(t.dmin.as_ptr() as *const __m256i));
        for r in 0..R {
            let yd = _mm512_set1_ps(acts[r].get_unchecked(i).d);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, yd), _mm512_cvtepi32_ps(total[r]), acc[r]);
            acc_min[r] = _mm512_fmadd_ps(_mm512_mul_ps(dmin, yd), _mm512_cvtepi32_ps(total_min[r]), acc_min[r]);
        }
    }
    let mut out = acc;
    for r in 0..R {
        out[r] = _mm512_sub_ps(acc[r], acc_min[r]);
    }
    out
}

/// Output columns `cols` of `x @ w^T` for `m` activation rows (`acts`, `kb` Q8_K blocks each):
/// `out[r * n + c]`, `n = w.rows`. A column range computes the tiles whose first column it
/// holds (so that ranges splitting a tile still write each column once); activation rows go in
/// chunks that stay in L2, eights within a chunk, then a four and a 3, 2 or 1 tail. Eight rows
/// share each unpacked weight register: their two accumulators each (16 registers) fit the 32.
///
/// # Safety
/// AVX512F/BW/VNNI must be available (see [`vnni_enabled`]); `acts` has `m * kb` blocks,
/// `out` `m * n` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn columns<T: Tiled>(
    w: &TiledMatrix<T>,
    acts: &[BlockQ8K],
    m: usize,
    cols: std::ops::Range<usize>,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let (n, kb) = (w.rows, w.cols / QK_K);
    let act = |r: usize| &acts[r * kb..(r + 1) * kb];
    let first = cols.start.div_ceil(TILE_ROWS);
    let end = cols.end.div_ceil(TILE_ROWS).min(n / TILE_ROWS);
    for chunk in (0..m).step_by(ROW_CHUNK) {
        let chunk_end = m.min(chunk + ROW_CHUNK);
        for t in first..end {
            let tiles = &w.tiles[t * kb..(t + 1) * kb];
            let c = TILE_ROWS * t;
            let mut r0 = chunk;
            while r0 < chunk_end {
                let left = chunk_end - r0;
                macro_rules! tile_of {
                    ($($i:literal),+) => {{
                        let d = T::dots(tiles, [$(act(r0 + $i)),+]);
                        for (i, v) in d.into_iter().enumerate() {
                            _mm512_storeu_ps(out.as_mut_ptr().add((r0 + i) * n + c), v);
                        }
                        r0 += d.len();
                    }};
                }
                match left {
                    1 => tile_of!(0),
                    2 => tile_of!(0, 1),
                    3 => tile_of!(0, 1, 2),
                    4..8 => tile_of!(0, 1, 2, 3),
                    _ => tile_of!(0, 1, 2, 3, 4, 5, 6, 7),
                }
            }
        }
    }
}

/// How many tiles ahead the tiled kernels prefetch the weights.
pub(crate) const PREFETCH_TILES: usize = 4;

/// Activation rows per pass over the weights in [`columns`]: 32 rows of an 8,960-wide input are
/// 300 KiB of Q8_K blocks, within L2.
const ROW_CHUNK: usize = 32;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::quant::qgemv::RowsWeight;
    use crate::kernels::quant::repack_test_support as support;

    #[test]
    fn tiling_keeps_every_weight() {
        support::assert_tiling_keeps_every_weight::<Q4KTile>(dequantize);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn products_match_the_exact_quantized_product() {
        if support::tiled_kernels_available() {
            support::assert_tiled_products_match_the_exact_quantized_product::<Q4KTile>();
        }
    }

    #[test]
    fn rows_do_not_depend_on_the_batch() {
        if support::tiled_kernels_available() {
            support::assert_tiled_rows_do_not_depend_on_the_batch::<Q4KTile>(|m| RowsWeight::Q4KTiled(m));
        }
    }

    /// The integer sums at their extreme: every 4-bit value 15, every activation -128, largest
    /// scales and minimums. Exact arithmetic gives the reference.
    #[test]
    fn extreme_values_do_not_overflow() {
        if !support::tiled_kernels_available() {
            return;
        }
        let one = f16::from_f32(1.0).to_bits();
        let tile =
            Q4KTile { qs: [0xff; 2048], d: [one; 16], dmin: [one; 16], scales: [[63; 16]; 8], mins: [[63; 16]; 8] };
        let w = Q4KTiledMatrix { tiles: vec![tile; 2], rows: 16, cols: 2 * QK_K };
        let act = BlockQ8K { d: 1.0, qs: [-128; QK_K], bsums: [-128 * 16; 16] };
        let mut out = [0f32; 16];
        unsafe { columns(&w, &[act, act], 1, 0..16, &mut out) };
        let want = 2.0 * (-(256.0 * 63.0 * 15.0 * 128.0) + 8.0 * 63.0 * 128.0 * 32.0);
        assert!(out.iter().all(|&v| v as f64 == want), "{out:?} against {want}");
    }
}
