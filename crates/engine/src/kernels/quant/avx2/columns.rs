//! The loop of the few-rows products over output columns and tiles of activation rows, for
//! any repacked block layout ([`RepackedBlock`]: [`super::q4k`], [`super::q6k`]): which rows
//! share a pass over a weight row, and in what order weights and activations meet, so that
//! each comes from the nearest cache. The products of one tile are the layout's own kernel.

#[cfg(target_arch = "x86_64")]
use super::vnni_enabled;

/// A repacked weight block and the activation block layout its kernel reads.
#[cfg(target_arch = "x86_64")]
pub trait RepackedBlock: Sized {
    type Act;
    /// Whether [`columns`] on AVX2, in panels, takes activation rows four at a time while 8 or
    /// more remain (else in pairs): worth it when decoding a block costs much beside the
    /// products it feeds. The row order takes fours either way, as it did before panels.
    const FOURS: bool;
    /// Dot products of one weight row (its blocks) with `R` activation rows.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available; every `acts[r]` has at least `w.len()` blocks.
    unsafe fn dots<const R: usize>(w: &[Self], acts: [&[Self::Act]; R]) -> [f32; R];

    /// [`Self::dots`] with AVX-512 VNNI where the layout allows it, bit for bit the same result.
    /// Implementations carry the VNNI kernels' target features (not a default method calling
    /// `dots`: a body without those features cannot inline a `#[target_feature]` kernel, which
    /// then ran as a call per weight row).
    ///
    /// # Safety
    /// As [`Self::dots`], and AVX512F, AVX512VL and AVX512-VNNI must be available.
    unsafe fn dots_vnni<const R: usize>(w: &[Self], acts: [&[Self::Act]; R]) -> [f32; R];
}

/// Output columns `cols` of the product `p` (see [`Product`]): `out[r * n + c]`, nothing else.
/// Activation rows go in tiles that share each pass over a weight row: pairs (three for an odd
/// remainder: measured 3% cheaper than a pair and a single), and fours while 8 or more remain
/// (in panels on AVX2 only for layouts that ask, [`RepackedBlock::FOURS`]). Few rows meet each
/// weight row in turn; on AVX2 more rows go in panels of weight rows that every tile passes
/// over (the loop's doc says why). A row's result does not depend on the rows beside it (same
/// operations in the same order for every tile size and loop order).
///
/// # Safety
/// As [`RepackedBlock::dots`]; `p.acts` has `m * kb` blocks, `p.w` at least `cols.end * kb`,
/// `out` `m * n` values, and `cols.end <= n`.
#[cfg(target_arch = "x86_64")]
pub unsafe fn columns<B: RepackedBlock>(p: &Product<B>, cols: std::ops::Range<usize>, out: &mut [f32]) {
    if vnni_enabled() {
        columns_vnni(p, cols, out)
    } else {
        columns_avx2(p, cols, out)
    }
}

/// The operands of [`columns`]: `m` activation rows (`acts`, `kb` blocks each) against the
/// repacked matrix `w` of `n` rows.
#[cfg(target_arch = "x86_64")]
pub struct Product<'a, B: RepackedBlock> {
    pub w: &'a [B],
    pub acts: &'a [B::Act],
    pub m: usize,
    pub n: usize,
    pub kb: usize,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn columns_avx2<B: RepackedBlock>(p: &Product<B>, cols: std::ops::Range<usize>, out: &mut [f32]) {
    columns_with::<B, false>(p, cols, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn columns_vnni<B: RepackedBlock>(p: &Product<B>, cols: std::ops::Range<usize>, out: &mut [f32]) {
    columns_with::<B, true>(p, cols, out)
}

/// The body of [`columns`], inlined into each kernel family's entry.
///
/// Below [`PANEL_MIN_ROWS`] rows (decoding, trees, batches of streams), and always with VNNI,
/// every weight row meets all the tiles in turn while it sits in L1, so the matrix streams from
/// memory while the products run. Otherwise (AVX2, prompts) the columns go in panels of about
/// [`PANEL_BYTES`] of weights, and every tile of rows passes over a whole panel before the next
/// tile: the tile's activations stay in L1 (in L2 for four rows of the 8,960-wide inputs, 40
/// KiB) while the panel is read from L2. The row
/// order there, every tile of a 32-row chunk against one weight row before the next, read the
/// chunk's activations (up to 320 KiB) from L2 for every weight row: the target's gate and up
/// product of 256 rows ran at 88.7 GMAC/s on 2 cores against 106.8 in panels, 32 rows at 89.3
/// against 109.5 (docs/results/README.md#const-qgemv-panels). With VNNI the row order stays
/// (measured on those CPUs; the panels were not).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn columns_with<B: RepackedBlock, const VNNI: bool>(
    p: &Product<B>,
    cols: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let (m, kb) = (p.m, p.kb);
    let tile = |left: usize, fours: bool| match left {
        1 => 1,
        3 => 3,
        l if l >= 8 && fours => 4,
        _ => 2,
    };
    if VNNI || m < PANEL_MIN_ROWS {
        // Many rows (a prompt, with VNNI) go in chunks whose activations stay in L2.
        for chunk in (0..m).step_by(ROW_CHUNK) {
            let end = m.min(chunk + ROW_CHUNK);
            for c in cols.clone() {
                let mut r0 = chunk;
                while r0 < end {
                    let r = tile(end - r0, true);
                    tile_dots::<B, VNNI>(p, c, r0, r, out);
                    r0 += r;
                }
            }
        }
        return;
    }
    let panel = (PANEL_BYTES / (kb * std::mem::size_of::<B>())).max(1);
    let mut c0 = cols.start;
    while c0 < cols.end {
        let c1 = cols.end.min(c0 + panel);
        let mut r0 = 0;
        while r0 < m {
            let r = tile(m - r0, B::FOURS);
            for c in c0..c1 {
                tile_dots::<B, VNNI>(p, c, r0, r, out);
            }
            r0 += r;
        }
        c0 = c1;
    }
}

/// `out[(r0 + i) * n + c]` for `i < rows` (1 to 4): weight row `c` against activation rows
/// `r0 .. r0 + rows` in one pass.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_dots<B: RepackedBlock, const VNNI: bool>(
    p: &Product<B>,
    c: usize,
    r0: usize,
    rows: usize,
    out: &mut [f32],
) {
    #[inline(always)]
    unsafe fn dots<B: RepackedBlock, const VNNI: bool, const R: usize>(w: &[B], acts: [&[B::Act]; R]) -> [f32; R] {
        if VNNI {
            B::dots_vnni(w, acts)
        } else {
            B::dots(w, acts)
        }
    }
    let (kb, n) = (p.kb, p.n);
    let row = &p.w[c * kb..(c + 1) * kb];
    let act = |r: usize| &p.acts[r * kb..(r + 1) * kb];
    let mut put = |d: &[f32]| {
        for (i, &v) in d.iter().enumerate() {
            out[(r0 + i) * n + c] = v;
        }
    };
    match rows {
        4 => put(&dots::<B, VNNI, _>(row, [act(r0), act(r0 + 1), act(r0 + 2), act(r0 + 3)])),
        3 => put(&dots::<B, VNNI, _>(row, [act(r0), act(r0 + 1), act(r0 + 2)])),
        2 => put(&dots::<B, VNNI, _>(row, [act(r0), act(r0 + 1)])),
        _ => put(&dots::<B, VNNI, _>(row, [act(r0)])),
    }
}

/// How far ahead of the block in use [`prefetch_ahead`] asks for weights: the matrices stream
/// from memory once per product, and the hardware prefetcher alone left the one-row product
/// short of the memory's speed (measured with the tiled layout, [`crate::kernels::quant::avx512::q4k`]).
#[cfg(target_arch = "x86_64")]
pub(crate) const PREFETCH_BYTES: usize = 8192;

/// Asks for `LINES` cache lines from [`PREFETCH_BYTES`] after `p` (a hint: addresses past the
/// matrix are harmless).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_ahead<const LINES: usize>(p: *const u8) {
    use std::arch::x86_64::*;
    for l in 0..LINES {
        // SAFETY: a prefetch never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_BYTES + 64 * l) as *const i8) };
    }
}

/// Fewest rows that [`columns_with`] runs in panels on AVX2. Below it the row order stays, as it
/// was: with 8 rows and the matrices read from memory it was faster (the gate and up product:
/// 115.0 GMAC/s against 104.5 in panels), and `mdsd serve` with 4 clients, whose forwards are a
/// few rows per stream, gave 25.9-30.1 tokens/s with panels from 10 rows against 28.1-30.3
/// without (noisy; docs/results/README.md#const-qgemv-panels). From 32 rows (one
/// [`ROW_CHUNK`]: prompts) the panels won in every measurement.
#[cfg(target_arch = "x86_64")]
const PANEL_MIN_ROWS: usize = ROW_CHUNK;

/// Bytes of weight rows per panel in [`columns_with`] (AVX2): well within a 512 KiB L2 beside
/// the activations. 32, 64 and 128 KiB measured alike on `zen3-2c`
/// (docs/results/README.md#const-qgemv-panels).
#[cfg(target_arch = "x86_64")]
const PANEL_BYTES: usize = 64 * 1024;

/// Activation rows per pass over the weights in the row order of [`columns`]: 32 rows of an
/// 8,960-wide input are 302 KiB of permuted Q8_K blocks (319 KiB for Q6_K's), within a 512 KiB
/// L2.
#[cfg(target_arch = "x86_64")]
const ROW_CHUNK: usize = 32;

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::kernels::quant::avx2::cpu_supported;
    use crate::kernels::quant::avx2::q4k::{permute_activations, BlockQ8KI, Q4KMatrix};
    use crate::kernels::quant::repack_test_support::values;
    use crate::kernels::quant::{BlockQ8K, QK_K};
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    /// The AVX2 loop over ranges of several [`PANEL_BYTES`] panels (the pool's chunks are
    /// smaller than a panel at this size, so products through it would not split one), Q4_K and
    /// Q6_K, against 32 to 41 rows (every tile size at the end, fours and pairs): every output
    /// in the range equals the exact product of the quantized weights and activations (f64),
    /// the others are left alone, and each row equals its product alone (and the VNNI loop's,
    /// where it runs), bit for bit.
    #[test]
    fn panels_cover_every_column_and_row() {
        use crate::kernels::quant::avx2::q4k::BlockQ4KI;
        use crate::kernels::quant::avx2::q6k::{self, BlockQ8K6I, Q6KMatrix};
        use std::ops::Range;
        if !cpu_supported() {
            eprintln!("no AVX2/FMA/F16C on this CPU: the kernel is never taken, nothing to check");
            return;
        }
        /// `x @ w^T` for columns `cols` (others NaN) through the AVX2 loop.
        fn product<B: RepackedBlock>(w: &[B], acts: &[B::Act], m: usize, n: usize, cols: Range<usize>) -> Vec<f32> {
            let mut out = vec![f32::NAN; m * n];
            let p = Product { w, acts, m, n, kb: acts.len() / m };
            // SAFETY: AVX2/FMA/F16C checked above; `acts` has m * kb blocks, `w` n * kb, `out`
            // m * n values, cols.end <= n.
            unsafe { columns_avx2(&p, cols.clone(), &mut out) };
            if vnni_enabled() {
                let mut v = vec![f32::NAN; m * n];
                // SAFETY: as above, and AVX-512 VNNI is there.
                unsafe { columns_vnni(&p, cols, &mut v) };
                assert_eq!(
                    out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                );
            }
            out
        }
        // Every product of `ms` runs in panels, over at least 4 of them for either layout (Q4_K's
        // smaller blocks make the wider panels); one row alone runs in the row order (which
        // `rows_do_not_depend_on_the_batch` covers in both layouts' tests).
        let (n, kb, ms) = (60, 32, [32, 33, 34, 35, 38, 41]);
        assert!(n > 3 * PANEL_BYTES / (kb * std::mem::size_of::<BlockQ4KI>()), "fewer than 4 panels");
        assert!(ms.iter().all(|&m| m >= PANEL_MIN_ROWS), "rows in the row order");
        let dev = Device::Cpu;
        let k = kb * QK_K;
        let rows = ms.iter().copied().max().unwrap();
        let w = Tensor::from_vec(values(n * k, 21), (n, k), &dev).unwrap();
        let x = values(rows * k, 22);
        let mut xq = vec![BlockQ8K::ZERO; rows * kb];
        for (row, b) in x.chunks_exact(k).zip(xq.chunks_exact_mut(kb)) {
            crate::kernels::quant::qgemv::quantize_row_q8k(row, b);
        }
        let xd: Vec<f64> = xq.iter().flat_map(|b| b.qs.iter().map(move |&v| b.d as f64 * v as f64)).collect();
        let mut acts4 = vec![BlockQ8KI::ZERO; rows * kb];
        xq.iter().zip(&mut acts4).for_each(|(a, b)| permute_activations(a, b));
        let mut acts6 = vec![BlockQ8K6I::ZERO; rows * kb];
        xq.iter().zip(&mut acts6).for_each(|(a, b)| q6k::permute_activations(a, b));
        for dtype in [GgmlDType::Q4K, GgmlDType::Q6K] {
            let q = QTensor::quantize(&w, dtype).unwrap();
            let wd: Vec<f32> = q.dequantize(&dev).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let (q4, q6) = (Q4KMatrix::from_qtensor(&q).unwrap(), Q6KMatrix::from_qtensor(&q).unwrap());
            // Rows `first .. first + m` against the matrix, columns `cols`.
            let run = |m: usize, first: usize, cols: Range<usize>| match (&q4, &q6) {
                (Some(mat), _) => product(&mat.blocks, &acts4[first * kb..(first + m) * kb], m, n, cols),
                (_, Some(mat)) => product(&mat.blocks, &acts6[first * kb..(first + m) * kb], m, n, cols),
                _ => unreachable!("both types repack on an AVX2 CPU"),
            };
            let alone: Vec<Vec<f32>> = (0..rows).map(|r| run(1, r, 0..n)).collect();
            for m in ms {
                for cols in [0..n, 7..n - 5] {
                    let out = run(m, 0, cols.clone());
                    for r in 0..m {
                        for c in 0..n {
                            let got = out[r * n + c];
                            if !cols.contains(&c) {
                                assert!(got.is_nan(), "{dtype:?}, {m} rows: ({r}, {c}) outside {cols:?} written");
                                continue;
                            }
                            assert_eq!(
                                got.to_bits(),
                                alone[r][c].to_bits(),
                                "{dtype:?}: ({r}, {c}) alone and among {m}"
                            );
                            let terms = (0..k).map(|j| xd[r * k + j] * wd[c * k + j] as f64);
                            let (want, size) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
                            // f32 sums of exact block products: within a few ulps of their size.
                            assert!(
                                (got as f64 - want).abs() <= 1e-6 * size,
                                "{dtype:?}, {m} rows: ({r}, {c}) {got} against {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
