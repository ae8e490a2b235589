//! The arithmetic of [`super::attention`]: query-key dot products sixteen keys at a time,
//! an `exp` that vectorizes, and a softmax sum that does not depend on where the
//! masked columns are.
//!
//! Each function has one definition of its result, written out in scalar code, and the fast
//! paths compute exactly that, bit for bit (the tests compare them). What makes a new row's
//! attention output independent of the other rows in its forward is kept:
//! - a key's dot product is the same whatever its place in a block of sixteen;
//! - [`exp`] is a function of its one input (the SiLU gate uses it too);
//! - the softmax sum adds the visible columns in the order they come, *compacted*: the `k`-th
//!   visible column goes to lane `k % 16` whatever masked columns lie between. A tree row and
//!   the same row decoded alone see the same visible columns in the same order, so they get the
//!   same sum.

/// Keys per block of [`key_dots`], and lanes of [`visible_sum`].
pub const LANES: usize = 16;

/// The dot product of `q` and `k` (equal lengths, a multiple of [`LANES`]) as every kernel here
/// computes it: sixteen lane sums `acc[l] = fma(q[16c + l], k[16c + l], acc[l])` over the
/// chunks `c` in order, then [`reduce_lanes`].
#[inline]
pub fn lane_dot(q: &[f32], k: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    for (qc, kc) in q.chunks_exact(LANES).zip(k.chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] = qc[l].mul_add(kc[l], acc[l]);
        }
    }
    reduce_lanes(&acc)
}

/// The sum of sixteen lanes in a fixed tree: halves added (`x[i] + x[i + 8]`), then quarters,
/// eighths and the last pair. The AVX-512 transposing reduction performs the same additions.
#[inline]
pub fn reduce_lanes(x: &[f32; LANES]) -> f32 {
    let mut s8 = [0f32; 8];
    for i in 0..8 {
        s8[i] = x[i] + x[i + 8];
    }
    let s4 = [s8[0] + s8[4], s8[1] + s8[5], s8[2] + s8[6], s8[3] + s8[7]];
    let s2 = [s4[0] + s4[2], s4[1] + s4[3]];
    s2[0] + s2[1]
}

/// `out[i * LANES + j] = lane_dot(queries[i], keys[j])` for the query rows `queries` (each
/// `hd` long, `queries.len() == n * hd`) and sixteen key rows. Requires `hd % LANES == 0`.
pub fn key_dots(queries: &[f32], hd: usize, keys: &[&[f32]; LANES], out: &mut [f32]) {
    debug_assert!(hd.is_multiple_of(LANES) && queries.len().is_multiple_of(hd));
    debug_assert!(out.len() >= queries.len() / hd * LANES);
    #[cfg(target_arch = "x86_64")]
    if avx512_available() {
        // SAFETY: the features are present; the slice lengths are checked by the callers
        // (debug-asserted above) and every key row is `hd` long.
        unsafe {
            match hd {
                64 => return key_dots_avx512::<4>(queries, keys, out),
                128 => return key_dots_avx512::<8>(queries, keys, out),
                _ => {}
            }
        }
    }
    for (q, o) in queries.chunks_exact(hd).zip(out.chunks_exact_mut(LANES)) {
        for (o, k) in o.iter_mut().zip(keys) {
            *o = lane_dot(q, &k[..hd]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn avx512_available() -> bool {
    static VALUE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VALUE.get_or_init(|| std::is_x86_feature_detected!("avx512f"))
}

/// [`key_dots`] for head size `16 * C`: one query's chunks held in registers, sixteen
/// accumulators (one per key), then a transposing reduction that sums all sixteen at once.
/// Writes key `j`'s dot to lane `j`; each lane's additions are those of [`reduce_lanes`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn key_dots_avx512<const C: usize>(queries: &[f32], keys: &[&[f32]; LANES], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let hd = C * LANES;
    for (q, o) in queries.chunks_exact(hd).zip(out.chunks_exact_mut(LANES)) {
        let mut qv = [_mm512_setzero_ps(); C];
        for (c, v) in qv.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(q.as_ptr().add(c * LANES));
        }
        let mut acc = [_mm512_setzero_ps(); LANES];
        for (a, k) in acc.iter_mut().zip(keys) {
            let kp = k.as_ptr();
            for (c, &v) in qv.iter().enumerate() {
                *a = _mm512_fmadd_ps(v, _mm512_loadu_ps(kp.add(c * LANES)), *a);
            }
        }
        // Halves: pair (a, b) -> [a0..8 + a8..16 | b0..8 + b8..16].
        let mut h = [_mm512_setzero_ps(); 8];
        for (m, h) in h.iter_mut().enumerate() {
            let (a, b) = (acc[2 * m], acc[2 * m + 1]);
            *h = _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(a, b), _mm512_shuffle_f32x4::<0xEE>(a, b));
        }
        // Quarters: 128-bit blocks (0 + 1) and (2 + 3) of each, four keys per vector.
        let mut qt = [_mm512_setzero_ps(); 4];
        for (m, qt) in qt.iter_mut().enumerate() {
            let (a, b) = (h[2 * m], h[2 * m + 1]);
            *qt = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(a, b), _mm512_shuffle_f32x4::<0xDD>(a, b));
        }
        // Eighths and the last pair, inside each 128-bit block.
        let e0 = _mm512_add_ps(_mm512_shuffle_ps::<0x44>(qt[0], qt[1]), _mm512_shuffle_ps::<0xEE>(qt[0], qt[1]));
        let e1 = _mm512_add_ps(_mm512_shuffle_ps::<0x44>(qt[2], qt[3]), _mm512_shuffle_ps::<0xEE>(qt[2], qt[3]));
        let sums = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(e0, e1), _mm512_shuffle_ps::<0xDD>(e0, e1));
        // Lane 4b + m holds key 4m + b; put key j in lane j.
        let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        _mm512_storeu_ps(o.as_mut_ptr(), _mm512_permutexvar_ps(order, sums));
    }
}

/// Inputs below this give [`exp`] 0 (`e^x` would be below `f32`'s normal range).
const EXP_UNDERFLOW: f32 = -87.33654;

/// Inputs above this give [`exp`] +inf (`e^x` would be above `f32::MAX`).
const EXP_OVERFLOW: f32 = 88.72284;

/// `e^x` in `f32`, to within 2 ulp, for softmax (`score - max <= 0`) and the SiLU gate: 0 below
/// -87.34 and at `-inf` (no subnormals), +inf above 88.72, NaN stays NaN. A Cody-Waite reduction
/// `x = n ln 2 + r` with `|r| <= ln 2 / 2`, a degree-6 polynomial for `e^r` (Cephes' `expf`
/// coefficients; the last, 0.50000001, is 0.5 in `f32`), and `2^n` applied as two exact powers
/// of two, `2^(n >> 1)` then `2^(n - (n >> 1))`, so that `n = 128` does not overflow the exponent
/// bits early. Branch-free, so loops over it vectorize; a function of `x` alone.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Outside the range the final selects decide; the clamp keeps `n` small there (`clamp`, not
    // `max`/`min`, keeps NaN).
    let xc = x.clamp(EXP_UNDERFLOW, EXP_OVERFLOW);
    let n = (xc * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_HI, xc);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let y = p.mul_add(r * r, r) + 1.0;
    // n is in [-126, 128]; NaN converts to 0 and y is NaN.
    let n = n as i32;
    let pow2 = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    let v = y * pow2(n >> 1) * pow2(n - (n >> 1));
    if x < EXP_UNDERFLOW {
        0.0
    } else if x > EXP_OVERFLOW {
        f32::INFINITY
    } else {
        v
    }
}

/// Sixteen lane sums of the visible (unmasked) columns of a row, added in order with the
/// `k`-th visible column in lane `k % 16`, then [`reduce_lanes`]. The result depends only on
/// the sequence of visible values, not on where masked columns sit between them.
pub fn visible_sum(values: &[f32], visible_prefix: usize, visible: impl Fn(usize) -> bool) -> f32 {
    let mut acc = [0f32; LANES];
    // The first `visible_prefix` columns are all visible: column j is the j-th visible one.
    let whole = visible_prefix / LANES * LANES;
    for chunk in values[..whole].chunks_exact(LANES) {
        for l in 0..LANES {
            acc[l] += chunk[l];
        }
    }
    let mut k = whole;
    for (j, &v) in values.iter().enumerate().skip(whole) {
        if visible(j) {
            acc[k % LANES] += v;
            k += 1;
        }
    }
    reduce_lanes(&acc)
}

/// Deterministic test inputs in [-1, 1): `n` values from `seed` (this module's tests and
/// [`super::attention`]'s).
#[cfg(test)]
pub(crate) fn test_values(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0).collect()
}

#[cfg(test)]
mod tests {
    use super::test_values as values;
    use super::*;

    /// Every key's dot equals `lane_dot` bit for bit at every place in the block, for the head
    /// sizes with a fast path (64, 128) and others (48, 80).
    #[test]
    fn key_dots_equal_lane_dot_at_every_place_in_the_block() {
        for hd in [48usize, 64, 80, 128] {
            let n = 7;
            let queries = values(n * hd, 11);
            let keys_data = values(40 * hd, 12);
            for shift in 0..LANES {
                let rows: Vec<&[f32]> = (0..LANES).map(|j| &keys_data[((j + shift) % 40) * hd..][..hd]).collect();
                let keys: &[&[f32]; LANES] = rows.as_slice().try_into().unwrap();
                let mut out = vec![0f32; n * LANES];
                key_dots(&queries, hd, keys, &mut out);
                for i in 0..n {
                    for j in 0..LANES {
                        let want = lane_dot(&queries[i * hd..][..hd], keys[j]);
                        assert_eq!(out[i * LANES + j].to_bits(), want.to_bits(), "hd {hd}, query {i}, key {j}");
                    }
                }
            }
            // And close to the exact dot product.
            let exact: f64 = queries[..hd].iter().zip(&keys_data[..hd]).map(|(&a, &b)| a as f64 * b as f64).sum();
            assert!((lane_dot(&queries[..hd], &keys_data[..hd]) as f64 - exact).abs() < 1e-4);
        }
    }

    #[test]
    fn exp_is_within_two_ulp_and_handles_the_edges() {
        let mut worst = 0f64;
        let mut x = EXP_OVERFLOW;
        while x > EXP_UNDERFLOW {
            let got = exp(x) as f64;
            let want = (x as f64).exp();
            let ulp = (want as f32).next_up() as f64 - want as f32 as f64;
            worst = worst.max((got - want).abs() / ulp);
            x -= 0.000_731;
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert_eq!(exp(-88.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(88.8), f32::INFINITY);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert!(exp(88.72).is_finite() && exp(88.72) > 3.3e38);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(-87.3).is_normal());
    }

    /// The sum depends on the visible values only: holes anywhere (before, inside and after
    /// the all-visible prefix's whole lanes) give the sum of the compacted row, bit for bit.
    #[test]
    fn visible_sum_ignores_where_the_masked_columns_are() {
        let dense: Vec<f32> = values(70, 3).iter().map(|v| (v + 1.5) * 1e3).collect();
        let plain = visible_sum(&dense, dense.len(), |_| true);
        for holes in [vec![0usize], vec![15, 16], vec![33, 34, 35, 50], vec![69], vec![40, 70, 71]] {
            let mut row = Vec::new();
            let mut mask = Vec::new();
            let mut it = dense.iter();
            while mask.len() < dense.len() + holes.len() {
                if holes.contains(&mask.len()) {
                    row.push(f32::NAN);
                    mask.push(false);
                } else {
                    row.push(*it.next().unwrap());
                    mask.push(true);
                }
            }
            let prefix = mask.iter().position(|&v| !v).unwrap_or(mask.len());
            let got = visible_sum(&row, prefix, |j| mask[j]);
            assert_eq!(got.to_bits(), plain.to_bits(), "holes {holes:?}");
        }
        let exact: f64 = dense.iter().map(|&v| v as f64).sum();
        assert!((plain as f64 - exact).abs() < 1e-6 * exact);
    }
}
