//! Products of a few activation rows with Q4_K and Q6_K weight matrices on x86-64 CPUs with
//! AVX2 and FMA, read straight from the GGUF block layout.
//!
//! candle 0.11's CPU path for these types repacks the weights into 16-row tiles with `f32`
//! scales (0.75 bytes per weight instead of 0.5625 for Q4_K) and spends its integer work on
//! unit-scale `madd`s; at one row (decoding) the target's forward took 64.1 ms with it against
//! 43.1 ms with this kernel, which is on par with llama.cpp (docs/results/README.md#const-qgemv-few-rows).
//! Here each weight row is read once for up to
//! [`ROW_TILE`] activation rows; the sub-block scales are applied in the integer domain
//! (`maddubs` then `madd` by the 6- or 8-bit scale) and converted to `f32` once per 256-value
//! super-block, and the minimum (Q4_K) and the `-32` offset (Q6_K) are folded in through the
//! activation block sums. This is the arithmetic of ggml's `vec_dot_q4_K_q8_K` and
//! `vec_dot_q6_K_q8_K`: activations are quantized to Q8_K (one `f32` scale per 256 values).
//!
//! Tiles of two rows: AVX2 has 16 vector registers, and a third row's accumulators spill
//! (measured: each row beyond the second cost twice as much with tiles of four). A weight
//! row is decoded once per tile and stays in L1 between tiles.
//!
//! Q4_K and Q6_K matrices on such CPUs are normally repacked at load
//! ([`super::avx2::q4k`], [`super::avx2::q6k`]: the same weights in layouts that
//! need about half the instructions; with AVX-512 VNNI, [`super::avx512::q4k`] and
//! [`super::avx512::q6k`]: tiles of 16 weight rows); [`matmul_many`] takes every form
//! ([`RowsWeight`]) and quantizes the activations once for all of them.
//!
//! The caller (`crate::model::Linear`) routes ggml-layout matrices here only when [`supports`] says
//! so and the number of rows is small; otherwise candle's kernels run. Work is split over output
//! columns on our CPU worker pool ([`crate::kernels::pool`]), which the other products
//! ([`crate::kernels::ggml_rows`], [`crate::kernels::f32_rows`], attention) share, so they never compete for cores.

use candle_core::backend::BackendStorage;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape};
use half::f16;

#[cfg(target_arch = "x86_64")]
use super::avx2::columns as repacked;
use super::avx2::q4k::{self as q4ki, BlockQ8KI, Q4KMatrix};
use super::avx2::q6k::{self as q6ki, BlockQ8K6I, Q6KMatrix};
use super::avx2::{cpu_supported, vnni_enabled};
use super::avx512::q4k::{self as q4k_tiled, Q4KTiledMatrix};
use super::avx512::q6k::Q6KTiledMatrix;
pub use super::q8k::quantize_row_q8k;
use super::{BlockQ4K, BlockQ6K, BlockQ8K, QK_K};

/// Activation rows that share one pass over the weights.
pub const ROW_TILE: usize = 2;

/// True when this CPU and this matrix can take the fast path: x86-64 with AVX2, FMA and F16C, a
/// Q4_K or Q6_K matrix stored on the CPU whose rows are whole super-blocks.
pub fn supports(w: &QTensor) -> bool {
    w.device().is_cpu() && supports_on_cpu(w.dtype(), w.shape().dims())
}

/// [`supports`] for a CPU matrix of type `dtype` and shape `dims`.
pub fn supports_on_cpu(dtype: GgmlDType, dims: &[usize]) -> bool {
    cpu_supported()
        && matches!(dtype, GgmlDType::Q4K | GgmlDType::Q6K)
        && dims.len() == 2
        && dims[1].is_multiple_of(QK_K)
}

/// A matrix for the few-rows products: a ggml Q4_K/Q6_K tensor as stored (see [`supports`]),
/// or a Q4_K or Q6_K matrix repacked at load ([`super::avx2::q4k`],
/// [`super::avx2::q6k`]).
#[derive(Clone, Copy)]
pub enum RowsWeight<'a> {
    Ggml(&'a QTensor),
    Q4KInterleaved(&'a Q4KMatrix),
    Q4KTiled(&'a Q4KTiledMatrix),
    Q6KInterleaved(&'a Q6KMatrix),
    Q6KTiled(&'a Q6KTiledMatrix),
}

impl RowsWeight<'_> {
    /// `(rows, columns)` of the matrix.
    pub fn dims(&self) -> Result<(usize, usize)> {
        match self {
            Self::Ggml(w) => w.shape().dims2(),
            Self::Q4KInterleaved(w) => Ok((w.rows, w.cols)),
            Self::Q4KTiled(w) => Ok((w.rows, w.cols)),
            Self::Q6KTiled(w) => Ok((w.rows, w.cols)),
            Self::Q6KInterleaved(w) => Ok((w.rows, w.cols)),
        }
    }
}

/// `x @ w^T` as a candle op: `x` is `[.., k]` f32 on the CPU, `w` is `[n, k]` Q4_K or Q6_K
/// (check [`supports`] first); the result is `[.., n]`.
pub struct QuantizedRowsMatmul<'a>(pub RowsWeight<'a>);

impl CustomOp1 for QuantizedRowsMatmul<'_> {
    fn name(&self) -> &'static str {
        "quantized-rows-matmul"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = match storage {
            CpuStorage::F32(x) => x,
            other => candle_core::bail!("quantized-rows-matmul: f32 activations expected, got {:?}", other.dtype()),
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("quantized-rows-matmul: contiguous activations expected");
        };
        let (n, k) = self.0.dims()?;
        let dims = layout.shape().dims();
        if dims.last() != Some(&k) {
            candle_core::bail!("quantized-rows-matmul: activations {:?} against a [{n}, {k}] matrix", dims);
        }
        let x = &x[start..end];
        let m = x.len() / k;
        let mut out = vec![0f32; m * n];
        matmul_many(&[self.0], x, m, &mut [&mut out])?;
        let mut out_dims = dims.to_vec();
        *out_dims.last_mut().expect("non-empty dims") = n;
        Ok((CpuStorage::F32(out), Shape::from(out_dims)))
    }
}

thread_local! {
    static ACTIVATIONS: std::cell::RefCell<Vec<BlockQ8K>> = const { std::cell::RefCell::new(Vec::new()) };
    static ACTIVATIONS_INTERLEAVED: std::cell::RefCell<(Vec<BlockQ8KI>, Vec<BlockQ8K6I>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// `out[r * n + c] = sum_j x[r * k + j] * w[c, j]` for `m` rows of `x`.
pub fn matmul(w: &QTensor, x: &[f32], m: usize, out: &mut [f32]) -> Result<()> {
    matmul_many(&[RowsWeight::Ggml(w)], x, m, &mut [out])
}

/// [`matmul`] of the same activation rows with several matrices sharing the input width `k`
/// (q/k/v, or gate/up): `outs[i]` gets `x @ ws[i]^T` (`[m, n_i]`). The activations are
/// quantized once and all output columns are split over the thread pool in one dispatch, so a
/// block pays one synchronisation where separate products pay one each.
pub fn matmul_many(ws: &[RowsWeight], x: &[f32], m: usize, outs: &mut [&mut [f32]]) -> Result<()> {
    let Some(first) = ws.first() else { return Ok(()) };
    let k = first.dims()?.1;
    if ws.len() != outs.len() || x.len() != m * k {
        candle_core::bail!(
            "quantized-rows-matmul: {} matrices, {} outputs, {} inputs for {m} rows",
            ws.len(),
            outs.len(),
            x.len()
        );
    }
    enum Kind<'a> {
        Ggml(&'a [u8], GgmlDType),
        Q4KInterleaved(&'a [q4ki::BlockQ4KI]),
        Q4KTiled(&'a Q4KTiledMatrix),
        Q6KTiled(&'a Q6KTiledMatrix),
        Q6KInterleaved(&'a [q6ki::BlockQ6KI]),
    }
    struct Part<'a> {
        kind: Kind<'a>,
        n: usize,
        /// First column of this matrix among all matrices' columns.
        offset: usize,
        out: usize,
    }
    let mut datas = Vec::with_capacity(ws.len());
    for (w, out) in ws.iter().zip(outs.iter()) {
        let (n, kw) = w.dims()?;
        let ok = match w {
            RowsWeight::Ggml(w) => supports(w),
            RowsWeight::Q4KInterleaved(_) | RowsWeight::Q6KInterleaved(_) => cpu_supported(),
            RowsWeight::Q4KTiled(_) | RowsWeight::Q6KTiled(_) => vnni_enabled(),
        };
        if !ok || kw != k || out.len() != m * n {
            candle_core::bail!("quantized-rows-matmul: unsupported matrix [{n}, {kw}] with {m} rows of {k}");
        }
        datas.push(match w {
            RowsWeight::Ggml(w) => Some(w.data()?),
            RowsWeight::Q4KInterleaved(_)
            | RowsWeight::Q4KTiled(_)
            | RowsWeight::Q6KInterleaved(_)
            | RowsWeight::Q6KTiled(_) => None,
        });
    }
    let mut parts = Vec::with_capacity(ws.len());
    let mut total = 0;
    let (mut interleaved4, mut interleaved6) = (false, false);
    for ((w, data), out) in ws.iter().zip(&datas).zip(outs.iter_mut()) {
        let (n, _) = w.dims()?;
        let kind = match (w, data) {
            (RowsWeight::Ggml(w), Some(data)) => Kind::Ggml(data, w.dtype()),
            (RowsWeight::Q4KInterleaved(w), _) => {
                interleaved4 = true;
                Kind::Q4KInterleaved(&w.blocks)
            }
            (RowsWeight::Q4KTiled(w), _) => Kind::Q4KTiled(w),
            (RowsWeight::Q6KTiled(w), _) => Kind::Q6KTiled(w),
            (RowsWeight::Q6KInterleaved(w), _) => {
                interleaved6 = true;
                Kind::Q6KInterleaved(&w.blocks)
            }
            (RowsWeight::Ggml(_), None) => unreachable!("data read above"),
        };
        parts.push(Part { kind, n, offset: total, out: out.as_mut_ptr() as usize });
        total += n;
    }
    let kb = k / QK_K;
    ACTIVATIONS.with(|cell| {
        ACTIVATIONS_INTERLEAVED.with(|cell_i| {
            let mut acts = cell.borrow_mut();
            acts.clear();
            acts.resize(m * kb, BlockQ8K::ZERO);
            for (row, blocks) in x.chunks_exact(k).zip(acts.chunks_exact_mut(kb)) {
                quantize_row_q8k(row, blocks);
            }
            let mut bufs = cell_i.borrow_mut();
            let (acts_i, acts_6) = &mut *bufs;
            acts_i.clear();
            acts_6.clear();
            if interleaved4 {
                acts_i.resize(m * kb, BlockQ8KI::ZERO);
                for (a, b) in acts.iter().zip(acts_i.iter_mut()) {
                    q4ki::permute_activations(a, b);
                }
            }
            if interleaved6 {
                acts_6.resize(m * kb, BlockQ8K6I::ZERO);
                for (a, b) in acts.iter().zip(acts_6.iter_mut()) {
                    q6ki::permute_activations(a, b);
                }
            }
            let acts: &[BlockQ8K] = &acts;
            let acts_i: &[BlockQ8KI] = acts_i;
            let acts_6: &[BlockQ8K6I] = acts_6;
            let parts: &[Part] = &parts;
            crate::kernels::pool::pool().execute_chunked(total, |cols| {
                for p in parts {
                    let lo = cols.start.max(p.offset);
                    let hi = cols.end.min(p.offset + p.n);
                    if lo >= hi {
                        continue;
                    }
                    // SAFETY: every (row, column) of every output is written by exactly one work
                    // range, and the outputs outlive the dispatch.
                    let out = unsafe { std::slice::from_raw_parts_mut(p.out as *mut f32, m * p.n) };
                    let cols = lo - p.offset..hi - p.offset;
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        match p.kind {
                            Kind::Ggml(bytes, GgmlDType::Q4K) => {
                                columns::<BlockQ4K>(bytes, acts, m, p.n, kb, cols, out)
                            }
                            Kind::Ggml(bytes, _) => columns::<BlockQ6K>(bytes, acts, m, p.n, kb, cols, out),
                            Kind::Q4KInterleaved(w) => {
                                repacked::columns(&repacked::Product { w, acts: acts_i, m, n: p.n, kb }, cols, out)
                            }
                            Kind::Q4KTiled(w) => q4k_tiled::columns(w, acts, m, cols, out),
                            Kind::Q6KTiled(w) => q4k_tiled::columns(w, acts, m, cols, out),
                            Kind::Q6KInterleaved(w) => {
                                repacked::columns(&repacked::Product { w, acts: acts_6, m, n: p.n, kb }, cols, out)
                            }
                        }
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    let _ = (acts, acts_i, acts_6, kb, cols, out);
                }
            });
        })
    });
    Ok(())
}

#[cfg(target_arch = "x86_64")]
trait SuperBlock: Sized {
    /// Dot products of one weight row (its `kb` blocks) with up to [`ROW_TILE`] activation rows.
    unsafe fn dots<const R: usize>(w: &[Self], acts: [&[BlockQ8K]; R]) -> [f32; R];
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn columns<B: SuperBlock>(
    bytes: &[u8],
    acts: &[BlockQ8K],
    m: usize,
    n: usize,
    kb: usize,
    cols: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let blocks = std::slice::from_raw_parts(bytes.as_ptr() as *const B, n * kb);
    let act = |r: usize| &acts[r * kb..(r + 1) * kb];
    // One weight row at a time (it stays in L1), its activation rows in tiles.
    for c in cols {
        let w = &blocks[c * kb..(c + 1) * kb];
        let mut r0 = 0;
        while r0 < m {
            if m - r0 >= ROW_TILE {
                let d = B::dots(w, [act(r0), act(r0 + 1)]);
                out[r0 * n + c] = d[0];
                out[(r0 + 1) * n + c] = d[1];
                r0 += ROW_TILE;
            } else {
                out[r0 * n + c] = B::dots(w, [act(r0)])[0];
                r0 += 1;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        hsum128(s)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum128(s: __m128) -> f32 {
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// Unpacks the 12 bytes of 6-bit scales and mins of a Q4_K block into 8 scales and 8 mins
    /// (ggml's `get_scale_min_k4`, four bytes at a time).
    #[inline(always)]
    fn scales_mins_q4k(s: &[u8; 12]) -> (u64, u64) {
        const K1: u32 = 0x3f3f_3f3f;
        const K2: u32 = 0x0f0f_0f0f;
        const K3: u32 = 0x0303_0303;
        let u0 = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        let u1 = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
        let u2 = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
        let sc_lo = u0 & K1;
        let sc_hi = (u2 & K2) | (((u0 >> 6) & K3) << 4);
        let mn_lo = u1 & K1;
        let mn_hi = ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4);
        (sc_lo as u64 | (sc_hi as u64) << 32, mn_lo as u64 | (mn_hi as u64) << 32)
    }

    /// `_mm256_shuffle_epi8` masks: mask k copies i16 lane k to every i16 lane.
    const SCALE_SPREAD: [__m256i; 8] = {
        let mut masks = [[0u8; 32]; 8];
        let mut k = 0;
        while k < 8 {
            let mut b = 0;
            while b < 32 {
                masks[k][b] = (2 * k + b % 2) as u8;
                b += 1;
            }
            k += 1;
        }
        unsafe { std::mem::transmute::<[[u8; 32]; 8], [__m256i; 8]>(masks) }
    };

    impl SuperBlock for BlockQ4K {
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn dots<const R: usize>(w: &[Self], acts: [&[BlockQ8K]; R]) -> [f32; R] {
            let m4 = _mm256_set1_epi8(0x0f);
            // Through `black_box` so that the shuffles stay one `vpshufb` each (LLVM otherwise
            // rewrites each constant mask into a shift plus a broadcast: two shuffle-port ops).
            let spread: &[__m256i; 8] = std::hint::black_box(&SCALE_SPREAD);
            let mut acc = [_mm256_setzero_ps(); R];
            let mut acc_min = [_mm_setzero_ps(); R];
            for (i, b) in w.iter().enumerate() {
                let d = f16::from_bits(b.d).to_f32();
                let dmin = f16::from_bits(b.dmin).to_f32();
                let (sc, mn) = scales_mins_q4k(&b.scales);
                let mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
                // The 8 sub-block scales as i16 in both lanes; each is spread with one shuffle.
                let scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
                let mut sumi = [_mm256_setzero_si256(); R];
                for j in 0..4 {
                    let s_lo = _mm256_shuffle_epi8(scales, spread[2 * j]);
                    let s_hi = _mm256_shuffle_epi8(scales, spread[2 * j + 1]);
                    let q4 = _mm256_loadu_si256(b.qs.as_ptr().add(32 * j) as *const __m256i);
                    let lo = _mm256_and_si256(q4, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
                    for r in 0..R {
                        let y = acts[r].get_unchecked(i).qs.as_ptr().add(64 * j);
                        let yl = _mm256_loadu_si256(y as *const __m256i);
                        let yh = _mm256_loadu_si256(y.add(32) as *const __m256i);
                        let pl = _mm256_madd_epi16(s_lo, _mm256_maddubs_epi16(lo, yl));
                        let ph = _mm256_madd_epi16(s_hi, _mm256_maddubs_epi16(hi, yh));
                        sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(pl, ph));
                    }
                }
                for r in 0..R {
                    let y = acts[r].get_unchecked(i);
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
                    // Sum of each 32 activations = two adjacent 16-value sums.
                    let bs = y.bsums.as_ptr() as *const __m128i;
                    let pairs = _mm_hadd_epi16(_mm_loadu_si128(bs), _mm_loadu_si128(bs.add(1)));
                    let pm = _mm_madd_epi16(mins, pairs);
                    acc_min[r] = _mm_fmadd_ps(_mm_set1_ps(dmin * y.d), _mm_cvtepi32_ps(pm), acc_min[r]);
                }
            }
            let mut out = [0f32; R];
            for r in 0..R {
                out[r] = hsum256(acc[r]) - hsum128(acc_min[r]);
            }
            out
        }
    }

    /// `_mm256_shuffle_epi8` masks: for group g, i16 lane 2g to all of the low half and
    /// lane 2g + 1 to all of the high half.
    #[allow(clippy::identity_op)]
    const SCALE_PAIRS: [__m256i; 4] = {
        let mut masks = [[0u8; 32]; 4];
        let mut g = 0;
        while g < 4 {
            let mut b = 0;
            while b < 16 {
                masks[g][b] = (4 * g + b % 2) as u8;
                masks[g][16 + b] = (4 * g + 2 + b % 2) as u8;
                b += 1;
            }
            g += 1;
        }
        unsafe { std::mem::transmute::<[[u8; 32]; 4], [__m256i; 4]>(masks) }
    };

    impl SuperBlock for BlockQ6K {
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn dots<const R: usize>(w: &[Self], acts: [&[BlockQ8K]; R]) -> [f32; R] {
            let m4 = _mm256_set1_epi8(0x0f);
            let m2 = _mm256_set1_epi8(0x03);
            let mut acc = [_mm256_setzero_ps(); R];
            let mut acc_off = [_mm_setzero_ps(); R];
            for (i, b) in w.iter().enumerate() {
                let d = f16::from_bits(b.d).to_f32();
                let sc = &b.scales;
                let mut sumi = [_mm256_setzero_si256(); R];
                for h in 0..2 {
                    let ql0 = _mm256_loadu_si256(b.ql.as_ptr().add(64 * h) as *const __m256i);
                    let ql1 = _mm256_loadu_si256(b.ql.as_ptr().add(64 * h + 32) as *const __m256i);
                    let qh = _mm256_loadu_si256(b.qh.as_ptr().add(32 * h) as *const __m256i);
                    let high = |shift: i32| -> __m256i {
                        let v = match shift {
                            0 => qh,
                            2 => _mm256_srli_epi16(qh, 2),
                            4 => _mm256_srli_epi16(qh, 4),
                            _ => _mm256_srli_epi16(qh, 6),
                        };
                        _mm256_slli_epi16(_mm256_and_si256(v, m2), 4)
                    };
                    // Values 128h + 32g .. + 32, with scales 8h + 2g (first 16) and 8h + 2g + 1;
                    // decoded one group at a time to keep registers free.
                    let group = |g: usize| match g {
                        0 => _mm256_or_si256(_mm256_and_si256(ql0, m4), high(0)),
                        1 => _mm256_or_si256(_mm256_and_si256(ql1, m4), high(2)),
                        2 => _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), high(4)),
                        _ => _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), high(6)),
                    };
                    // Scales 8h..8h+8 as i16 in both 128-bit halves; group g takes lane 2g into
                    // the low half and lane 2g + 1 into the high half.
                    let sc8 = _mm_cvtepi8_epi16(_mm_loadl_epi64(sc.as_ptr().add(8 * h) as *const __m128i));
                    let sc8 = _mm256_broadcastsi128_si256(sc8);
                    for (g, &pairs) in SCALE_PAIRS.iter().enumerate() {
                        let qg = group(g);
                        let scale = _mm256_shuffle_epi8(sc8, pairs);
                        for r in 0..R {
                            let y = acts[r].get_unchecked(i).qs.as_ptr().add(128 * h + 32 * g);
                            let p = _mm256_maddubs_epi16(qg, _mm256_loadu_si256(y as *const __m256i));
                            sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(scale, p));
                        }
                    }
                }
                // The -32 offset: 32 * sum over sub-blocks of scale * (sum of its activations).
                let sc_lo = _mm_cvtepi8_epi16(_mm_loadl_epi64(sc.as_ptr() as *const __m128i));
                let sc_hi = _mm_cvtepi8_epi16(_mm_loadl_epi64(sc.as_ptr().add(8) as *const __m128i));
                for r in 0..R {
                    let y = acts[r].get_unchecked(i);
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
                    let bs = y.bsums.as_ptr() as *const __m128i;
                    let off = _mm_add_epi32(
                        _mm_madd_epi16(sc_lo, _mm_loadu_si128(bs)),
                        _mm_madd_epi16(sc_hi, _mm_loadu_si128(bs.add(1))),
                    );
                    acc_off[r] = _mm_fmadd_ps(_mm_set1_ps(32.0 * d * y.d), _mm_cvtepi32_ps(off), acc_off[r]);
                }
            }
            let mut out = [0f32; R];
            for r in 0..R {
                out[r] = hsum256(acc[r]) - hsum128(acc_off[r]);
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QMatMul;
    use candle_core::{Device, Module, Tensor};

    /// Deterministic values in [-1, 1) with a few large outliers, as activations have.
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..len)
            .map(|i| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let v = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
                if i % 97 == 0 {
                    v * 8.0
                } else {
                    v
                }
            })
            .collect()
    }

    /// Our product against exact arithmetic on the same quantized operands (f64 sums of the
    /// dequantized weights times the Q8_K activations: equal up to f32 rounding), and, within
    /// the error of quantizing activations to 8 bits (4% of the largest output), against the
    /// dequantized matrix in f32 and against candle's own quantized matmul (whose CPU kernels
    /// land about as far from the f32 product as ours, but not on the same side).
    fn check(dtype: GgmlDType) {
        if !cpu_supported() {
            eprintln!("no AVX2 on this CPU: the fast path is never taken, nothing to check");
            return;
        }
        let dev = Device::Cpu;
        let (n, k) = (37, 768);
        let w = Tensor::from_vec(values(n * k, 1), (n, k), &dev).unwrap();
        let q = QTensor::quantize(&w, dtype).unwrap();
        assert!(supports(&q));
        let deq = q.dequantize(&dev).unwrap();
        let reference = QMatMul::from_qtensor(QTensor::quantize(&w, dtype).unwrap()).unwrap();
        for m in 1..=9 {
            let mut x = values(m * k, 100 + m as u64);
            if m == 3 {
                x[k..2 * k].fill(0.0); // an all-zero row quantizes to d = 0
            }
            let xt = Tensor::from_vec(x.clone(), (m, k), &dev).unwrap();
            let ours = xt.apply_op1_no_bwd(&QuantizedRowsMatmul(RowsWeight::Ggml(&q))).unwrap();
            assert_eq!(ours.dims(), &[m, n]);
            let ours: Vec<f32> = ours.flatten_all().unwrap().to_vec1().unwrap();
            // Q4_K also in the repacked layout: the same integer sums, another f32 order.
            let repacked = Q4KMatrix::from_qtensor(&q).unwrap();
            assert_eq!(repacked.is_some(), dtype == GgmlDType::Q4K && cpu_supported());
            let ours_repacked: Option<Vec<f32>> = repacked.map(|r| {
                let y = xt.apply_op1_no_bwd(&QuantizedRowsMatmul(RowsWeight::Q4KInterleaved(&r))).unwrap();
                assert_eq!(y.dims(), &[m, n]);
                y.flatten_all().unwrap().to_vec1().unwrap()
            });
            let candle: Vec<f32> = reference.forward(&xt).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let exact: Vec<f32> = xt.matmul(&deq.t().unwrap()).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let scale = exact.iter().fold(0f32, |a, v| a.max(v.abs())).max(1.0);
            // The same products in f64 on the dequantized weights and Q8_K activations: what
            // both kernels compute, up to f32 rounding.
            let wd: Vec<f32> = deq.flatten_all().unwrap().to_vec1().unwrap();
            let mut xq = vec![BlockQ8K::ZERO; m * k / QK_K];
            for (row, b) in x.chunks_exact(k).zip(xq.chunks_exact_mut(k / QK_K)) {
                quantize_row_q8k(row, b);
            }
            let xd: Vec<f64> = xq.iter().flat_map(|b| b.qs.iter().map(move |&q| b.d as f64 * q as f64)).collect();
            for r in 0..m {
                for c in 0..n {
                    let want: f64 = (0..k).map(|j| xd[r * k + j] * wd[c * k + j] as f64).sum();
                    let got = ours[r * n + c] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * scale as f64,
                        "{dtype:?} m={m} ({r},{c}): ours {got} f64 {want}"
                    );
                    if let Some(rep) = &ours_repacked {
                        let got = rep[r * n + c] as f64;
                        assert!(
                            (got - want).abs() <= 1e-5 * scale as f64,
                            "{dtype:?} repacked m={m} ({r},{c}): ours {got} f64 {want}"
                        );
                    }
                }
            }
            for i in 0..m * n {
                assert!(
                    (ours[i] - candle[i]).abs() <= 4e-2 * scale,
                    "{dtype:?} m={m} [{i}]: ours {} candle {} f32 {}",
                    ours[i],
                    candle[i],
                    exact[i]
                );
                assert!(
                    (ours[i] - exact[i]).abs() <= 4e-2 * scale,
                    "{dtype:?} m={m} [{i}]: ours {} f32 {}",
                    ours[i],
                    exact[i]
                );
            }
            if m == 3 {
                assert!(ours[n..2 * n].iter().all(|&v| v == 0.0));
            }
        }
    }

    #[test]
    fn q4k_rows_match_candle_and_f32() {
        check(GgmlDType::Q4K);
    }

    #[test]
    fn q6k_rows_match_candle_and_f32() {
        check(GgmlDType::Q6K);
    }

    #[test]
    fn other_types_are_not_taken() {
        let w = Tensor::zeros((4, 256), candle_core::DType::F32, &Device::Cpu).unwrap();
        assert!(!supports(&QTensor::quantize(&w, GgmlDType::Q8_0).unwrap()));
        let w = Tensor::zeros((4, 32), candle_core::DType::F32, &Device::Cpu).unwrap();
        assert!(!supports(&QTensor::quantize(&w, GgmlDType::Q4_0).unwrap()));
    }
}
