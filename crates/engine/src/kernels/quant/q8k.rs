//! Activation rows quantized to Q8_K blocks, the input of every few-rows kernel ([`super::qgemv`],
//! the interleaved and tiled layouts).
//!
//! Per 256 values: the value `max` of largest magnitude (the first one, on ties) gives
//! `iscale = -128 / max`; each value becomes `min(round(iscale * x), 127)` (round half away
//! from zero), `d = 1 / iscale`, and `bsums` holds the sums of each 16 quantized values. This
//! is ggml's `quantize_row_q8_K` with a -128 scale.
//!
//! On CPUs with AVX-512 (F and BW) the same arithmetic runs 16 values at a time and gives the
//! same bytes as the scalar code for every input without NaN (tested). The scalar code runs
//! on the calling thread while the pool waits (`perf`: 1.5% of a one-row draft forward, 5.7%
//! of a four-row one before the AVX-512 path: docs/results/README.md#const-q8k-activations).

use super::{BlockQ8K, QK_K};

/// Quantizes one row (`x.len()` a multiple of 256) into `out` (one block per 256 values).
pub fn quantize_row_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    #[cfg(target_arch = "x86_64")]
    if avx512_available() {
        // SAFETY: the CPU has AVX-512 F and BW (checked).
        unsafe { quantize_row_avx512(x, out) };
        return;
    }
    quantize_row_scalar(x, out)
}

/// The reference: one value at a time.
pub(crate) fn quantize_row_scalar(x: &[f32], out: &mut [BlockQ8K]) {
    for (xs, b) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let mut max = 0f32;
        let mut amax = 0f32;
        for &v in xs {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *b = BlockQ8K::ZERO;
            continue;
        }
        let iscale = -128.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            *q = (iscale * v).round().min(127.0) as i8;
        }
        for (s, qs) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = qs.iter().map(|&q| q as i16).sum();
        }
        b.d = 1.0 / iscale;
    }
}

#[cfg(target_arch = "x86_64")]
fn avx512_available() -> bool {
    static VALUE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VALUE.get_or_init(|| std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw"))
}

/// [`quantize_row_scalar`] 16 values at a time. Each step is the scalar one's:
/// - the largest magnitude is a lane-wise maximum that, like the scalar `>`, skips NaN, and
///   `max` is the first value of that magnitude;
/// - `iscale * x` is the same `f32` product; rounding half away from zero is `trunc(y)` plus
///   the sign of `y` where the fraction `y - trunc(y)` (exact in `f32`) is at least 0.5 in
///   magnitude;
/// - the clamp to 127 and the saturating conversion to `i8` match `min(127.0) as i8`;
/// - each `bsum` is the sum of one vector's 16 integers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_row_avx512(x: &[f32], out: &mut [BlockQ8K]) {
    use std::arch::x86_64::*;
    let sign_bit = _mm512_set1_ps(-0.0);
    for (xs, b) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let p = xs.as_ptr();
        let mut vmax = _mm512_setzero_ps();
        for j in 0..QK_K / 16 {
            let a = _mm512_andnot_ps(sign_bit, _mm512_loadu_ps(p.add(16 * j)));
            // `max_ps` returns its second operand when either is NaN: NaN lanes keep `vmax`.
            vmax = _mm512_max_ps(a, vmax);
        }
        let amax = _mm512_reduce_max_ps(vmax);
        if amax == 0.0 {
            *b = BlockQ8K::ZERO;
            continue;
        }
        let target = _mm512_set1_ps(amax);
        let mut max = 0f32;
        for j in 0..QK_K / 16 {
            let v = _mm512_loadu_ps(p.add(16 * j));
            let hit = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_andnot_ps(sign_bit, v), target);
            if hit != 0 {
                max = xs[16 * j + hit.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -128.0 / max;
        let scale = _mm512_set1_ps(iscale);
        let half = _mm512_set1_ps(0.5);
        let one = _mm512_set1_ps(1.0);
        let cap = _mm512_set1_ps(127.0);
        for j in 0..QK_K / 16 {
            let y = _mm512_mul_ps(scale, _mm512_loadu_ps(p.add(16 * j)));
            let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
            let frac = _mm512_andnot_ps(sign_bit, _mm512_sub_ps(y, t));
            let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, half);
            let step = _mm512_or_ps(one, _mm512_and_ps(y, sign_bit));
            let r = _mm512_min_ps(_mm512_mask_add_ps(t, up, t, step), cap);
            let q = _mm512_cvtps_epi32(r);
            _mm_storeu_si128(b.qs.as_mut_ptr().add(16 * j) as *mut __m128i, _mm512_cvtsepi32_epi8(q));
            b.bsums[j] = _mm512_reduce_add_epi32(q) as i16;
        }
        b.d = 1.0 / iscale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The dispatched quantizer (AVX-512 where the CPU has it) gives the scalar reference's
    /// bytes on random rows of five magnitudes, rows of exact halves (rounding ties) with the
    /// largest magnitude negative or positive, a largest magnitude repeated at both signs,
    /// all-zero rows, a row zero but for its last value, and (scale only) rows with NaN.
    #[test]
    fn every_path_gives_the_reference_bytes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut rows: Vec<Vec<f32>> = Vec::new();
        for scale in [1e-6f32, 0.03, 1.0, 40.0, 3e4] {
            rows.push((0..QK_K * 3).map(|_| rng.random_range(-1.0f32..1.0) * scale).collect());
        }
        // Ties: max = -128 gives iscale = 1, so every value k + 0.5 is a rounding tie.
        let mut ties: Vec<f32> = (0..QK_K).map(|i| (i as f32 - 128.0) + 0.5).collect();
        ties[5] = -128.0;
        rows.push(ties.clone());
        ties[5] = 128.0;
        rows.push(ties);
        // The largest magnitude at both signs and repeated: the first one decides the sign.
        let mut both: Vec<f32> = (0..QK_K).map(|i| (i % 7) as f32 - 3.0).collect();
        both[40] = 9.0;
        both[41] = -9.0;
        both[200] = 9.0;
        rows.push(both.clone());
        both[40] = -9.0;
        both[41] = 9.0;
        rows.push(both);
        rows.push(vec![0.0; QK_K]);
        let mut last_only = vec![0.0; QK_K];
        last_only[255] = -0.25;
        rows.push(last_only);
        let mut with_nan: Vec<f32> = (0..QK_K).map(|i| (i as f32).sin()).collect();
        with_nan[3] = f32::NAN;
        rows.push(with_nan);
        for (n, row) in rows.iter().enumerate() {
            let blocks = row.len() / QK_K;
            let mut want = vec![BlockQ8K::ZERO; blocks];
            let mut got = vec![BlockQ8K::ZERO; blocks];
            quantize_row_scalar(row, &mut want);
            quantize_row_q8k(row, &mut got);
            for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                assert_eq!(w.d.to_bits(), g.d.to_bits(), "row {n} block {i}: scale");
                if row[i * QK_K..(i + 1) * QK_K].iter().any(|v| v.is_nan()) {
                    continue; // a NaN value quantizes to garbage on either path
                }
                assert_eq!(w.qs, g.qs, "row {n} block {i}: values");
                assert_eq!(w.bsums, g.bsums, "row {n} block {i}: block sums");
            }
        }
        // The reference itself: max = -128 gives iscale = 1; ties round away from zero; 127.5
        // rounds to 128 and clamps to 127; each bsum adds its 16 values.
        let mut b = [BlockQ8K::ZERO];
        let mut ties: Vec<f32> = (0..QK_K).map(|i| (i as f32 - 128.0) + 0.5).collect();
        ties[0] = -128.0;
        quantize_row_scalar(&ties, &mut b);
        let b = &b[0];
        assert_eq!(b.d, 1.0);
        assert_eq!((b.qs[0], b.qs[1], b.qs[127], b.qs[128], b.qs[255]), (-128, -127, -1, 1, 127));
        for (g, s) in b.bsums.iter().enumerate() {
            assert_eq!(*s, b.qs[16 * g..16 * g + 16].iter().map(|&q| q as i16).sum::<i16>());
        }
    }
}
