//! Q4_K matrices repacked at load time for the few-rows product on x86-64 CPUs with AVX2.
//!
//! In ggml's Q4_K block each 32-value sub-block has its own 6-bit scale, so the kernel in
//! [`crate::kernels::quant::qgemv`] (like ggml's `vec_dot_q4_K_q8_K`) spreads a scale over a register with a
//! shuffle and applies it with a `madd` for every 32 products: 16 multiplies and 8 shuffles
//! per 256 values, plus a scalar decode of the packed scales. Here the same weights, bit for
//! bit, are laid out so that every 32-byte `maddubs` covers 4 values of each of the 8
//! sub-blocks: the 8 products of a super-block are summed in 16-bit lanes and one `madd` by
//! the 8 scales (decoded once, at load) finishes it. 9 multiplies, no shuffles, no scale
//! decode per super-block; a second activation row costs about a third of the first.
//!
//! Activations are quantized to Q8_K (as ggml does) and permuted the same way. The sums are
//! exact integers; only the order of the `f32` accumulation differs from [`crate::kernels::quant::qgemv`].
//!
//! Overflow: a `maddubs` lane is `q0 y0 + q1 y1` with `q < 16` and `|y| <= 128`, so at most
//! 3,840 in magnitude, and 8 of them sum to at most 30,720 < 2^15.
//!
//! On CPUs with AVX-512 VNNI ([`super::vnni_enabled`]) the same layout feeds 512-bit `vpdpbusd`s: the
//! 4 bytes of a 32-bit lane all belong to one sub-block, so each lane sums one sub-block's
//! products directly, and the result is bit for bit the AVX2 kernel's
//! ([`RepackedBlock::dots_vnni`]). The activation groups are ordered ([`ACTIVATION_SLOT`]) so
//! that each 512-bit operand is one contiguous load.

#[cfg(target_arch = "x86_64")]
use super::columns::{prefetch_ahead, RepackedBlock};
use super::cpu_supported;
use crate::kernels::quant::{BlockQ4K, BlockQ8K, QK_K};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Result;
use half::f16;

/// A Q4_K super-block with its scales and minimums decoded and its 4-bit values permuted
/// (see [`source_index`]). Same weights as the ggml block; 148 bytes instead of 144.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ4KI {
    d: u16,
    dmin: u16,
    scales: [u8; 8],
    mins: [u8; 8],
    /// Byte `32 j + b`: low nibble is value `source_index(2 j, b)`, high nibble
    /// `source_index(2 j + 1, b)`.
    qs: [u8; 128],
}

/// A Q8_K activation block permuted like the weights: `qs[32 ACTIVATION_SLOT[g] + b]` is value
/// `source_index(g, b)`; `sums[s]` is the sum of the 32 values of sub-block `s`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ8KI {
    d: f32,
    qs: [i8; QK_K],
    sums: [i16; 8],
}

const _: () = assert!(std::mem::size_of::<BlockQ4KI>() == 148);

impl BlockQ8KI {
    pub const ZERO: Self = Self { d: 0.0, qs: [0; QK_K], sums: [0; 8] };
}

/// The value (0..256) of a super-block that goes to byte `b` (0..32) of group `g` (0..8):
/// bytes `4 s .. 4 s + 4` of every group come from sub-block `s`, so 16-bit lanes `2 s` and
/// `2 s + 1` of a `maddubs` belong to sub-block `s`.
#[inline(always)]
pub const fn source_index(g: usize, b: usize) -> usize {
    32 * (b / 4) + 4 * g + b % 4
}

/// Where activation group `g` (the values `source_index(g, ..)`) sits in a [`BlockQ8KI`]: the
/// groups that meet a 64-byte half of the weights' low nibbles (`4 h` and `4 h + 2`), then
/// those of its high nibbles (`4 h + 1`, `4 h + 3`), so that the AVX-512 kernel reads each as
/// one contiguous 64-byte run. Its own inverse.
pub const ACTIVATION_SLOT: [usize; 8] = [0, 2, 1, 3, 4, 6, 5, 7];

/// The value of an activation block that goes to byte `b` of slot `s` of a [`BlockQ8KI`].
#[inline(always)]
pub const fn activation_source(s: usize, b: usize) -> usize {
    source_index(ACTIVATION_SLOT[s], b)
}

/// A block layout repacked from a ggml type, bit for bit the same weights.
pub trait Repacks: Sized {
    /// The ggml type it is made from.
    const DTYPE: GgmlDType;
    /// The blocks of the raw bytes of a ggml tensor of that type.
    fn repack(bytes: &[u8]) -> Result<Vec<Self>>;
}

impl Repacks for BlockQ4KI {
    const DTYPE: GgmlDType = GgmlDType::Q4K;
    fn repack(bytes: &[u8]) -> Result<Vec<Self>> {
        repack(bytes)
    }
}

/// A `[rows, cols]` matrix of repacked blocks, row after row.
#[derive(Clone)]
pub struct RepackedMatrix<B> {
    pub(crate) blocks: Vec<B>,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
}

/// A Q4_K matrix in the layout of [`BlockQ4KI`].
pub type Q4KMatrix = RepackedMatrix<BlockQ4KI>;

impl<B: Repacks> std::fmt::Debug for RepackedMatrix<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Repacked{:?}[{}, {}]", B::DTYPE, self.rows, self.cols)
    }
}

impl<B: Repacks> RepackedMatrix<B> {
    /// The repacked copy of `w` when our kernel can take it: a 2-D tensor of type `B::DTYPE` on
    /// the CPU, whole super-blocks per row, on an x86-64 CPU with AVX2, FMA and F16C.
    pub fn from_qtensor(w: &QTensor) -> Result<Option<Self>> {
        if !w.device().is_cpu() {
            return Ok(None);
        }
        Self::from_raw(w.dtype(), w.shape().dims(), &w.data()?)
    }

    /// [`Self::from_qtensor`] from the raw bytes of a ggml tensor of type `dtype` and shape
    /// `dims` (for the CPU; e.g. mapped from a GGUF file, without a `QTensor` copy first).
    pub fn from_raw(dtype: GgmlDType, dims: &[usize], bytes: &[u8]) -> Result<Option<Self>> {
        let fit = dtype == B::DTYPE && dims.len() == 2 && dims[1].is_multiple_of(QK_K);
        if !fit || !cpu_supported() {
            return Ok(None);
        }
        let blocks = B::repack(bytes)?;
        if blocks.len() != dims[0] * dims[1] / QK_K {
            candle_core::bail!("{dtype:?} matrix {dims:?}: {} bytes is not its size", bytes.len());
        }
        Ok(Some(Self { blocks, rows: dims[0], cols: dims[1] }))
    }

    /// A copy of the first `rows` rows (at most all of them).
    pub fn first_rows(&self, rows: usize) -> Self
    where
        B: Clone,
    {
        let rows = rows.min(self.rows);
        let kb = self.cols / QK_K;
        Self { blocks: self.blocks[..rows * kb].to_vec(), rows, cols: self.cols }
    }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and minimum of sub-block `j`.
pub(crate) fn scale_min(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// The 256 4-bit values of a ggml Q4_K block in order: sub-block `2 j` is the low nibbles of
/// bytes `32 j .. 32 j + 32`, sub-block `2 j + 1` their high nibbles.
pub(crate) fn nibbles(b: &BlockQ4K) -> [u8; QK_K] {
    let mut v = [0u8; QK_K];
    for j in 0..4 {
        for i in 0..32 {
            let byte = b.qs[32 * j + i];
            v[64 * j + i] = byte & 0xf;
            v[64 * j + 32 + i] = byte >> 4;
        }
    }
    v
}

fn repack_block(raw: &[u8]) -> BlockQ4KI {
    // SAFETY: `BlockQ4K` is `repr(C)` of byte-sized arrays and two u16s, 144 bytes, any bit
    // pattern valid; `read_unaligned` tolerates the alignment of `raw` (checked 144 long).
    assert_eq!(raw.len(), std::mem::size_of::<BlockQ4K>());
    let b: BlockQ4K = unsafe { std::ptr::read_unaligned(raw.as_ptr() as *const BlockQ4K) };
    let mut r = BlockQ4KI { d: b.d, dmin: b.dmin, scales: [0; 8], mins: [0; 8], qs: [0; 128] };
    for s in 0..8 {
        (r.scales[s], r.mins[s]) = scale_min(s, &b.scales);
    }
    let v = nibbles(&b);
    for j in 0..4 {
        for i in 0..32 {
            r.qs[32 * j + i] = v[source_index(2 * j, i)] | (v[source_index(2 * j + 1, i)] << 4);
        }
    }
    r
}

/// Repacks ggml Q4_K blocks (the raw bytes of a GGUF tensor) into [`BlockQ4KI`], on all cores.
pub fn repack(bytes: &[u8]) -> Result<Vec<BlockQ4KI>> {
    const SIZE: usize = std::mem::size_of::<BlockQ4K>();
    if !bytes.len().is_multiple_of(SIZE) {
        candle_core::bail!("q4k-repack: {} bytes is not a whole number of Q4_K blocks", bytes.len());
    }
    Ok(repack_parallel(bytes, SIZE, repack_block))
}

/// `out[i] = f(bytes[i * size..(i + 1) * size])`, split over the machine's cores (a 1.5B
/// model's matrices are several million blocks: ~1 s on one core).
pub(crate) fn repack_parallel<T: Copy + Send>(bytes: &[u8], size: usize, f: fn(&[u8]) -> T) -> Vec<T> {
    repack_parallel_by(bytes.len() / size, |i| f(&bytes[i * size..(i + 1) * size]))
}

/// `out[i] = f(i)` for `i < n`, split over the machine's cores.
///
/// The output is written once, by the threads, straight into uninitialized memory: no serial
/// zeroing pass first, and the pages are first touched (faulted in) on every core. Chunks are
/// at least [`MIN_BLOCKS_PER_THREAD`] blocks, so every matrix of a small model is split too.
pub(crate) fn repack_parallel_by<T: Copy + Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(n);
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).clamp(1, 16);
    let per = n.div_ceil(threads).max(MIN_BLOCKS_PER_THREAD);
    let f = &f;
    std::thread::scope(|scope| {
        for (c, dst) in out.spare_capacity_mut()[..n].chunks_mut(per).enumerate() {
            scope.spawn(move || {
                for (j, d) in dst.iter_mut().enumerate() {
                    d.write(f(c * per + j));
                }
            });
        }
    });
    // SAFETY: the chunks cover slots 0..n and each thread wrote every slot of its chunk (a
    // panicking thread makes `scope` panic before this line); `T: Copy` has no drop to skip.
    unsafe { out.set_len(n) };
    out
}

/// Fewest blocks a repacking thread takes (64 Q4_K tiles are 148 KiB).
const MIN_BLOCKS_PER_THREAD: usize = 64;

/// The weights of a repacked block as `f32` (for tests).
pub fn dequantize(b: &BlockQ4KI) -> [f32; QK_K] {
    let d = f16::from_bits(b.d).to_f32();
    let dmin = f16::from_bits(b.dmin).to_f32();
    let mut out = [0f32; QK_K];
    for j in 0..4 {
        for i in 0..32 {
            let byte = b.qs[32 * j + i];
            for (g, q) in [(2 * j, byte & 0xf), (2 * j + 1, byte >> 4)] {
                let v = source_index(g, i);
                let s = v / 32;
                out[v] = d * b.scales[s] as f32 * q as f32 - dmin * b.mins[s] as f32;
            }
        }
    }
    out
}

/// Permutes a Q8_K activation block into the layout of [`BlockQ8KI`].
pub fn permute_activations(b: &BlockQ8K, out: &mut BlockQ8KI) {
    out.d = b.d;
    for (g, slot) in ACTIVATION_SLOT.into_iter().enumerate() {
        for i in 0..32 {
            out.qs[32 * slot + i] = b.qs[source_index(g, i)];
        }
    }
    for s in 0..8 {
        out.sums[s] = b.bsums[2 * s] + b.bsums[2 * s + 1];
    }
}

#[cfg(target_arch = "x86_64")]
impl RepackedBlock for BlockQ4KI {
    type Act = BlockQ8KI;
    /// Pairs: a fourth row's accumulators spill AVX2's 16 registers, and the nibbles cost only
    /// 3 operations per 32 bytes. The target's gate and up product in panels, 2 cores, same
    /// run: 64 rows 94.8 GMAC/s in fours, 98.3 in pairs; 16 rows 95.3 and 108.7
    /// (docs/results/README.md#const-qgemv-panels).
    const FOURS: bool = false;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dots<const R: usize>(w: &[Self], acts: [&[BlockQ8KI]; R]) -> [f32; R] {
        q4k_dots::<R, false>(w, acts)
    }

    /// The same integers as [`Self::dots`]: bytes `4 s .. 4 s + 4` of every group belong to
    /// sub-block `s`, so a 512-bit `vpdpbusd` lane accumulates exactly sub-block `s`'s products
    /// of two groups (no 16-bit intermediate), the two 256-bit halves add up to the sub-block's
    /// sum, and `mullo` by its scale gives what `madd` gave there. The `f32` operations are the
    /// same, in the same order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn dots_vnni<const R: usize>(w: &[Self], acts: [&[BlockQ8KI]; R]) -> [f32; R] {
        q4k_dots::<R, true>(w, acts)
    }
}

/// The Q4_K kernel body for both entries of [`RepackedBlock`].
///
/// Without `VNNI` (AVX2), per 32-byte group `j` of the weights, `maddubs` multiplies the low
/// nibbles by activation group `2 j` and the high nibbles by group `2 j + 1`, summing each
/// sub-block's products in two 16-bit lanes, and one `madd` by the scales finishes the
/// super-block. With `VNNI` (AVX-512), each 64-byte half `h` of the weights meets two 64-byte
/// runs of activations (groups `4 h, 4 h + 2` for the low nibbles, `4 h + 1, 4 h + 3` for the
/// high ones: [`ACTIVATION_SLOT`] puts them side by side) in 512-bit `vpdpbusd`s, whose 32-bit
/// lane `L` sums sub-block `L mod 8`; folding the two 256-bit halves and `mullo` by the scales
/// give the same exact integers as the AVX2 path. The `f32` operations are the same, in the
/// same order, so both give the same result bit for bit.
///
/// # Safety
/// AVX2, FMA and F16C (and with `VNNI`, AVX512F/BW/VL/VNNI) must be available; every `acts[r]`
/// has at least `w.len()` blocks.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn q4k_dots<const R: usize, const VNNI: bool>(w: &[BlockQ4KI], acts: [&[BlockQ8KI]; R]) -> [f32; R] {
    use std::arch::x86_64::*;
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut acc_min = [_mm_setzero_ps(); R];
    for (i, b) in w.iter().enumerate() {
        prefetch_ahead::<3>(b as *const BlockQ4KI as *const u8);
        // [d, dmin] as f32.
        let ds = _mm_cvtph_ps(_mm_cvtsi32_si128((b.d as u32 | (b.dmin as u32) << 16) as i32));
        let s8 = _mm_loadl_epi64(b.scales.as_ptr() as *const __m128i);
        let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(b.mins.as_ptr() as *const __m128i));
        // Lane s (8 x i32): the sum of sub-block s's products, unscaled with VNNI and scaled
        // without.
        let mut sums = [_mm256_setzero_si256(); R];
        if VNNI {
            let m4 = _mm512_set1_epi8(0x0f);
            let mut wide = [_mm512_setzero_si512(); R];
            for h in 0..2 {
                let q4 = _mm512_loadu_si512(b.qs.as_ptr().add(64 * h) as *const __m512i);
                let lo = _mm512_and_si512(q4, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16(q4, 4), m4);
                for r in 0..R {
                    let y = acts[r].get_unchecked(i).qs.as_ptr().add(128 * h);
                    wide[r] = _mm512_dpbusd_epi32(wide[r], lo, _mm512_loadu_si512(y as *const __m512i));
                    wide[r] = _mm512_dpbusd_epi32(wide[r], hi, _mm512_loadu_si512(y.add(64) as *const __m512i));
                }
            }
            // Lane s: the scale of sub-block s, as i32.
            let scale = _mm256_cvtepu8_epi32(s8);
            for r in 0..R {
                let folded = _mm256_add_epi32(_mm512_castsi512_si256(wide[r]), _mm512_extracti64x4_epi64(wide[r], 1));
                sums[r] = _mm256_mullo_epi32(scale, folded);
            }
        } else {
            // [s0, s0, s1, s1, ..., s7, s7]: 16-bit lanes 2s and 2s + 1 belong to sub-block s.
            let s16 = _mm_cvtepu8_epi16(s8);
            let scale = _mm256_set_m128i(_mm_unpackhi_epi16(s16, s16), _mm_unpacklo_epi16(s16, s16));
            let mut pairs = [_mm256_setzero_si256(); R];
            for j in 0..4 {
                let q4 = _mm256_loadu_si256(b.qs.as_ptr().add(32 * j) as *const __m256i);
                let lo = _mm256_and_si256(q4, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
                let (g0, g1) = (ACTIVATION_SLOT[2 * j], ACTIVATION_SLOT[2 * j + 1]);
                for r in 0..R {
                    let y = acts[r].get_unchecked(i).qs.as_ptr();
                    let y0 = _mm256_loadu_si256(y.add(32 * g0) as *const __m256i);
                    let y1 = _mm256_loadu_si256(y.add(32 * g1) as *const __m256i);
                    let pair = _mm256_add_epi16(_mm256_maddubs_epi16(lo, y0), _mm256_maddubs_epi16(hi, y1));
                    pairs[r] = _mm256_add_epi16(pairs[r], pair);
                }
            }
            for r in 0..R {
                sums[r] = _mm256_madd_epi16(scale, pairs[r]);
            }
        }
        for r in 0..R {
            let y = acts[r].get_unchecked(i);
            let f = _mm_mul_ps(ds, _mm_set1_ps(y.d));
            let dy = _mm256_broadcastss_ps(f);
            acc[r] = _mm256_fmadd_ps(dy, _mm256_cvtepi32_ps(sums[r]), acc[r]);
            let pm = _mm_madd_epi16(mins, _mm_loadu_si128(y.sums.as_ptr() as *const __m128i));
            acc_min[r] = _mm_fmadd_ps(_mm_permute_ps(f, 0b01_01_01_01), _mm_cvtepi32_ps(pm), acc_min[r]);
        }
    }
    let mut out = [0f32; R];
    for r in 0..R {
        let v = acc[r];
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_sub_ps(s, acc_min[r]);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        out[r] = _mm_cvtss_f32(s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::quant::qgemv::{matmul_many, RowsWeight};
    use crate::kernels::quant::repack_test_support::{self as support, values};
    use candle_core::{Device, Tensor};

    #[test]
    fn the_permutation_is_a_bijection() {
        // Each group holds 4 values of each 32-value sub-block.
        support::assert_permutation(source_index, 4, 32);
    }

    /// The repacked blocks hold the same weights, bit for bit, as candle's dequantization of the
    /// ggml blocks; and activations permute without loss, with the sub-block sums.
    #[test]
    fn repacking_keeps_every_weight_and_activation() {
        support::assert_repack_keeps_weights(GgmlDType::Q4K, repack, dequantize, 144);
        let (a, p) = support::permuted_activations(permute_activations, BlockQ8KI::ZERO, |b| &b.qs, activation_source);
        for s in 0..8 {
            assert_eq!(p.sums[s] as i32, a.qs[32 * s..32 * s + 32].iter().map(|&v| v as i32).sum::<i32>());
        }
    }

    /// Each row of a product is the same, bit for bit, alone or among 2 to 9 rows (every tile
    /// size of [`super::columns::columns`]): speculative decoding at temperature 0 relies on it.
    #[test]
    fn rows_do_not_depend_on_the_batch() {
        if !cpu_supported() {
            eprintln!("no AVX2/FMA/F16C on this CPU: the kernel is never taken, nothing to check");
            return;
        }
        let (n, k) = (21, 512);
        let w = Tensor::from_vec(values(n * k, 4), (n, k), &Device::Cpu).unwrap();
        let mat = Q4KMatrix::from_qtensor(&QTensor::quantize(&w, GgmlDType::Q4K).unwrap()).unwrap().unwrap();
        support::assert_rows_do_not_depend_on_the_batch(n, k, |rows, m| {
            let mut out = vec![0f32; m * n];
            matmul_many(&[RowsWeight::Q4KInterleaved(&mat)], rows, m, &mut [&mut out[..]]).unwrap();
            out
        });
    }

    /// The parallel repacking keeps the block order across its chunks.
    #[test]
    fn parallel_repacking_keeps_the_order() {
        let n = 3 * 4096 + 17; // several chunks on any machine with more than one core
        let bytes: Vec<u8> = (0..n * 2).map(|i| (i / 2 % 251) as u8).collect();
        let out = repack_parallel(&bytes, 2, |raw| raw[0]);
        assert_eq!(out, (0..n).map(|i| (i % 251) as u8).collect::<Vec<_>>());
    }

    /// The 16-bit sums at their extreme: every 4-bit value 15, every activation -128, largest
    /// scales. Exact integer arithmetic gives the reference.
    #[test]
    fn extreme_values_do_not_overflow() {
        if !cpu_supported() {
            eprintln!("no AVX2/FMA/F16C on this CPU: the kernel is never taken, nothing to check");
            return;
        }
        let one = half::f16::from_f32(1.0).to_bits();
        let block = BlockQ4KI { d: one, dmin: 0, scales: [63; 8], mins: [0; 8], qs: [0xff; 128] };
        let w = Q4KMatrix { blocks: vec![block; 2], rows: 1, cols: 2 * QK_K };
        // Activations all -1: ggml's Q8_K rounds them to -128 with d = 1/128.
        let x = vec![-1f32; 2 * QK_K];
        let mut out = [0f32; 1];
        matmul_many(&[RowsWeight::Q4KInterleaved(&w)], &x, 1, &mut [&mut out[..]]).unwrap();
        let want = -((2 * QK_K) as f64 * 63.0 * 15.0);
        assert!((out[0] as f64 - want).abs() <= 1e-6 * want.abs(), "{} against {want}", out[0]);
    }

    /// The AVX-512 VNNI kernels give the AVX2 kernels' products bit for bit, for every tile
    /// size and both repacked types, including the 4-bit extremes (all 15 against -128).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vnni_kernels_match_the_avx2_kernels_bit_for_bit() {
        if !(cpu_supported() && crate::kernels::quant::avx2::cpu_has_vnni()) {
            eprintln!("no AVX-512 VNNI on this CPU: its kernels are never taken, nothing to check");
            return;
        }
        use crate::kernels::quant::avx2::columns::{columns_avx2, columns_vnni, Product};
        fn both<B: RepackedBlock>(w: &[B], acts: &[B::Act], m: usize, n: usize, kb: usize) -> (Vec<f32>, Vec<f32>) {
            let (mut a, mut v) = (vec![0f32; m * n], vec![0f32; m * n]);
            // SAFETY: AVX2/FMA/F16C and AVX-512 VNNI/VL checked above; sizes as documented.
            let p = Product { w, acts, m, n, kb };
            unsafe {
                columns_avx2(&p, 0..n, &mut a);
                columns_vnni(&p, 0..n, &mut v);
            }
            (a, v)
        }
        let (n, k) = (19, 3 * QK_K);
        let kb = k / QK_K;
        let w = Tensor::from_vec(values(n * k, 11), (n, k), &Device::Cpu).unwrap();
        let q4 = Q4KMatrix::from_qtensor(&QTensor::quantize(&w, GgmlDType::Q4K).unwrap()).unwrap().unwrap();
        let q6 =
            crate::kernels::quant::avx2::q6k::Q6KMatrix::from_qtensor(&QTensor::quantize(&w, GgmlDType::Q6K).unwrap())
                .unwrap()
                .unwrap();
        for m in 1..=9 {
            let x = values(m * k, 12 + m as u64);
            let mut q8 = vec![BlockQ8K::ZERO; m * kb];
            for (row, blocks) in x.chunks_exact(k).zip(q8.chunks_exact_mut(kb)) {
                crate::kernels::quant::qgemv::quantize_row_q8k(row, blocks);
            }
            let mut acts4 = vec![BlockQ8KI::ZERO; m * kb];
            q8.iter().zip(&mut acts4).for_each(|(a, b)| permute_activations(a, b));
            let (a, v) = both(&q4.blocks, &acts4, m, n, kb);
            assert_eq!(a, v, "Q4_K, {m} rows");
            let mut acts6 = vec![crate::kernels::quant::avx2::q6k::BlockQ8K6I::ZERO; m * kb];
            q8.iter().zip(&mut acts6).for_each(|(a, b)| crate::kernels::quant::avx2::q6k::permute_activations(a, b));
            let (a, v) = both(&q6.blocks, &acts6, m, n, kb);
            assert_eq!(a, v, "Q6_K, {m} rows");
        }
        let one = half::f16::from_f32(1.0).to_bits();
        let block = BlockQ4KI { d: one, dmin: one, scales: [63; 8], mins: [63; 8], qs: [0xff; 128] };
        let mut act = BlockQ8KI { d: 1.0, qs: [-128; QK_K], sums: [-128 * 32; 8] };
        let (a, v) = both(&[block; 2], &[act, act], 1, 1, 2);
        assert_eq!(a, v, "extremes");
        assert_eq!(v[0] as f64, 2.0 * (-(256.0 * 63.0 * 15.0 * 128.0) + 8.0 * 63.0 * 128.0 * 32.0));
        act.qs = [127; QK_K];
        let (a, v) = both(&[block], &[act], 1, 1, 1);
        assert_eq!(a, v, "extremes, positive activations");
    }
}
