//! Products of activation rows with a dense `f32` weight matrix on the CPU, `x @ w^T`.
//!
//! candle's CPU path (`x.matmul(&w.t())`, gemm) packs the transposed weight on every product;
//! at the few rows of decoding and draft trees that costs more than the arithmetic
//! (SmolLM2 in f32: 2.07 s of target time per generation against 0.94 s with this kernel,
//! docs/results/README.md#const-dense-f32-rows). Here each weight row is read once per block
//! of up to `ROW_BLOCK` activation rows, while tiles of `ROW_TILE` rows take their dot
//! products with it; blocks of output columns are split over the CPU worker pool ([`super::pool`]).
//!
//! Every output element is [`dot`] of its activation row and weight row, written out in scalar
//! code; the AVX2+FMA tiles compute exactly that, bit for bit, whatever rows share the tile, the
//! block or the product, so a row's result does not depend on how many rows share the forward
//! (the tests compare them).

use super::simd::{lane_dot, reduce_lanes, LANES};

/// Activation rows per tile: two 8-lane accumulators per row, eight FMA chains in flight.
const ROW_TILE: usize = 4;
/// Activation rows per block: every weight row passes once per block.
const ROW_BLOCK: usize = 32;
/// The dot product every path computes: the attention kernels' [`lane_dot`] over the whole
/// chunks of sixteen (lane sums `acc[l] = fma(x[16c + l], w[16c + l], acc[l])` in order, then
/// [`reduce_lanes`]), then the remaining elements added in order with `fma`.
pub fn dot(x: &[f32], w: &[f32]) -> f32 {
    let full = w.len() / LANES * LANES;
    add_tail(lane_dot(&x[..full], &w[..full]), &x[full..], &w[full..])
}

/// `s` with the tail products added in order.
#[inline]
fn add_tail(mut s: f32, x_tail: &[f32], w_tail: &[f32]) -> f32 {
    for (a, b) in x_tail.iter().zip(w_tail) {
        s = a.mul_add(*b, s);
    }
    s
}

/// [`dot`] of `R` rows (`xs[r]` points at `k` values) with `w` (`k` values), sharing the loads
/// of `w`.
///
/// # Safety
/// The CPU must have AVX2 and FMA; every pointer must be valid for `k` reads.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2<const R: usize>(xs: [*const f32; R], w: *const f32, k: usize) -> [f32; R] {
    use std::arch::x86_64::*;
    let full = k / LANES * LANES;
    let mut lo = [_mm256_setzero_ps(); R];
    let mut hi = [_mm256_setzero_ps(); R];
    let mut c = 0;
    while c < full {
        let w0 = _mm256_loadu_ps(w.add(c));
        let w1 = _mm256_loadu_ps(w.add(c + 8));
        for r in 0..R {
            lo[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xs[r].add(c)), w0, lo[r]);
            hi[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xs[r].add(c + 8)), w1, hi[r]);
        }
        c += LANES;
    }
    let mut out = [0f32; R];
    let mut acc = [0f32; LANES];
    let w_tail = std::slice::from_raw_parts(w.add(full), k - full);
    for r in 0..R {
        _mm256_storeu_ps(acc.as_mut_ptr(), lo[r]);
        _mm256_storeu_ps(acc.as_mut_ptr().add(8), hi[r]);
        out[r] = add_tail(reduce_lanes(&acc), std::slice::from_raw_parts(xs[r].add(full), k - full), w_tail);
    }
    out
}

fn avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `out[r * n + j] = dot(x[r], w[j])` for the columns `cols`, `x` `[m, k]` and `w` `[n, k]`
/// row-major.
///
/// # Safety
/// `out` must be valid for `m * n` writes, and no other thread may write these columns.
unsafe fn columns(x: &[f32], m: usize, w: &[f32], k: usize, n: usize, cols: std::ops::Range<usize>, out: *mut f32) {
    let row = |r: usize| &x[r * k..(r + 1) * k];
    let fast = avx2_fma();
    for block in (0..m).step_by(ROW_BLOCK) {
        let block_end = (block + ROW_BLOCK).min(m);
        for j in cols.clone() {
            let wj = &w[j * k..(j + 1) * k];
            let mut r = block;
            #[cfg(target_arch = "x86_64")]
            if fast {
                while r + ROW_TILE <= block_end {
                    let xs = [row(r).as_ptr(), row(r + 1).as_ptr(), row(r + 2).as_ptr(), row(r + 3).as_ptr()];
                    // SAFETY: the features were detected; every row and `wj` hold `k` values.
                    let d = unsafe { dots_avx2::<ROW_TILE>(xs, wj.as_ptr(), k) };
                    for (i, v) in d.into_iter().enumerate() {
                        // SAFETY: (r + i, j) is in bounds and column j is this caller's.
                        unsafe { *out.add((r + i) * n + j) = v };
                    }
                    r += ROW_TILE;
                }
                while r < block_end {
                    // SAFETY: as above.
                    unsafe { *out.add(r * n + j) = dots_avx2::<1>([row(r).as_ptr()], wj.as_ptr(), k)[0] };
                    r += 1;
                }
            }
            for r in r..block_end {
                // SAFETY: as above.
                unsafe { *out.add(r * n + j) = dot(row(r), wj) };
            }
        }
    }
}

/// `x @ w^T` for `x` `[m, k]` and `w` `[n, k]` (row-major `f32`): returns `[m, n]` row-major.
/// Columns are split over the CPU worker pool (`cpu_pool`) when the product is large enough; each element
/// is [`dot`] whatever the split and the number of rows.
pub fn matmul(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
    assert_eq!(x.len(), m * k, "f32 rows matmul: {} activations for {m} rows of {k}", x.len());
    assert_eq!(w.len(), n * k, "f32 rows matmul: {} weights for {n} rows of {k}", w.len());
    let mut out = vec![0f32; m * n];
    let addr = out.as_mut_ptr() as usize;
    // Blocks of 16 columns: a task's weight rows are adjacent in memory.
    const COLS: usize = 16;
    crate::kernels::pool::chunked(m * n * k, n.div_ceil(COLS), |blocks| {
        let cols = blocks.start * COLS..(blocks.end * COLS).min(n);
        // SAFETY: the blocks are disjoint column ranges, `out` (m * n elements) outlives the
        // dispatch, and every block is run exactly once.
        unsafe { columns(x, m, w, k, n, cols, addr as *mut f32) };
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        crate::kernels::simd::test_values(n, seed)
    }

    /// The scalar definition, written out once more: lane sums over whole chunks, the fixed
    /// reduction, then the tail.
    fn reference(x: &[f32], w: &[f32]) -> f32 {
        let full = w.len() / LANES * LANES;
        let mut acc = [0f32; LANES];
        for i in 0..full {
            acc[i % LANES] = x[i].mul_add(w[i], acc[i % LANES]);
        }
        let mut s = reduce_lanes(&acc);
        for i in full..w.len() {
            s = x[i].mul_add(w[i], s);
        }
        s
    }

    /// Every element equals the scalar definition bit for bit, for row counts that fill tiles
    /// and blocks partly, widths with and without a tail, and products below and above the
    /// inline threshold; and each row alone gives the same numbers as inside the batch.
    #[test]
    fn elements_are_the_scalar_dot_whatever_the_batch() {
        for (m, n, k) in [(1, 7, 16), (3, 5, 33), (5, 64, 96), (26, 300, 64), (37, 130, 200), (70, 40, 576)] {
            let x = values(m * k, 1);
            let w = values(n * k, 2);
            let got = matmul(&x, m, &w, n, k);
            for r in 0..m {
                let xr = &x[r * k..(r + 1) * k];
                for j in 0..n {
                    let want = reference(xr, &w[j * k..(j + 1) * k]);
                    assert_eq!(got[r * n + j].to_bits(), want.to_bits(), "({r}, {j}) of {m}x{n}x{k}");
                }
                let alone = matmul(xr, 1, &w, n, k);
                assert_eq!(alone, got[r * n..(r + 1) * n], "row {r} alone, {m}x{n}x{k}");
            }
        }
    }

    /// Against a plain f64 product: the f32 sums are close.
    #[test]
    fn products_are_close_to_f64() {
        let (m, n, k) = (6, 50, 300);
        let (x, w) = (values(m * k, 3), values(n * k, 4));
        let got = matmul(&x, m, &w, n, k);
        for r in 0..m {
            for j in 0..n {
                let want: f64 = (0..k).map(|i| x[r * k + i] as f64 * w[j * k + i] as f64).sum();
                assert!((got[r * n + j] as f64 - want).abs() < 1e-4 * (1.0 + want.abs()), "({r}, {j})");
            }
        }
    }
}
