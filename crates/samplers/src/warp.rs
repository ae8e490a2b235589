//! Logits to a probability vector: temperature, min-p, top-k and top-p ([`Warp`]), applied
//! identically to the target's and the draft's logits.
//!
//! The order is vLLM's: softmax at the temperature; min-p drops the tokens less probable than
//! `min_p` times the most probable one (a ratio, so it is the same before or after top-k);
//! top-k and top-p then act on what min-p kept, top-p's mass counted after renormalising it.
//!
//! The work is a few vectorising passes over the vocabulary: the maximum (and NaN / +inf
//! check), `e^((l - max) / T)` with an `f64` exponential that vectorizes ([`exp_nonpositive`]),
//! the sum, and, for top-k / top-p, one pass filing the tokens into buckets by probability,
//! after which only the tokens of the bucket where the kept set ends are sorted. The kept set
//! is that of sorting the whole vocabulary by probability (ties: the lower id first) and
//! keeping the first `top_k`, or fewer, up to the first whose running mass reaches `top_p`;
//! the running mass adds the buckets above by bucket (a different order of the same sum, so a
//! set whose mass equals `top_p` to within 1e-15 may end one token apart).

use crate::dist::fast_sum;
use crate::error::{Result, SamplerError};
use crate::TokenId;

/// Sampling parameters applied identically to target and draft logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Warp {
    /// 0 means argmax (a one-hot distribution); must be finite and >= 0.
    pub temperature: f64,
    /// Keep only the `top_k` most probable tokens (0 = off).
    pub top_k: usize,
    /// Keep the smallest set of most probable tokens whose mass reaches `top_p` (1 = off).
    pub top_p: f64,
    /// Keep only the tokens at least `min_p` times as probable as the most probable one, at
    /// the temperature (0 = off; in `[0, 1]`).
    pub min_p: f64,
}

impl Default for Warp {
    fn default() -> Self {
        Self { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0 }
    }
}

impl Warp {
    pub fn temperature(temperature: f64) -> Self {
        Self { temperature, ..Self::default() }
    }

    pub fn check(&self) -> Result<()> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(SamplerError::BadParameter(format!(
                "temperature must be finite and >= 0, got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplerError::BadParameter(format!("top-p must be in (0, 1], got {}", self.top_p)));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(SamplerError::BadParameter(format!("min-p must be in [0, 1], got {}", self.min_p)));
        }
        Ok(())
    }

    /// Turns logits into a probability vector written to `out`: softmax(logits / T), then
    /// min-p, top-k and top-p truncation (in that order) and renormalisation. Temperature 0 gives the one-hot
    /// vector of the argmax (the lowest id among equal maxima). NaN or +inf logits are an error
    /// naming the index. Allocates nothing once `out` and a thread's bucket buffer have grown.
    pub fn apply(&self, logits: &[f32], out: &mut Vec<f64>) -> Result<()> {
        self.check()?;
        if logits.is_empty() {
            return Err(SamplerError::Empty { which: "logits" });
        }
        let (max, bad) = max_and_bad(logits);
        if bad {
            let (index, &v) = logits
                .iter()
                .enumerate()
                .find(|(_, v)| v.is_nan() || **v == f32::INFINITY)
                .expect("a bad entry was seen");
            return Err(SamplerError::InvalidEntry { which: "logits", index, value: v as f64 });
        }
        if max == f32::NEG_INFINITY {
            return Err(SamplerError::BadParameter("all logits are -inf".into()));
        }
        out.clear();
        if self.temperature == 0.0 || self.top_k == 1 {
            let best = logits.iter().position(|&v| v == max).expect("the maximum is an entry");
            out.resize(logits.len(), 0.0);
            out[best] = 1.0;
            return Ok(());
        }
        let (max, inv_t) = (max as f64, 1.0 / self.temperature);
        out.extend(logits.iter().map(|&l| exp_nonpositive((l as f64 - max) * inv_t)));
        if self.min_p > 0.0 {
            // Before normalising, the most probable token's value is e^0 = 1: the others' are
            // their probability ratios to it.
            let min_p = self.min_p;
            out.iter_mut().for_each(|x| *x = if *x >= min_p { *x } else { 0.0 });
        }
        let sum = fast_sum(out);
        out.iter_mut().for_each(|x| *x /= sum);
        let limit = if self.top_k > 0 { self.top_k.min(out.len()) } else { out.len() };
        if limit < out.len() || self.top_p < 1.0 {
            let (p_last, id_last) = last_kept(out, limit, self.top_p);
            // Keep the prefix of the order (probability descending, id ascending) up to it.
            for (i, x) in out.iter_mut().enumerate() {
                let kept = *x > p_last || (*x == p_last && i as TokenId <= id_last);
                *x = if kept { *x } else { 0.0 };
            }
            let kept = fast_sum(out);
            out.iter_mut().for_each(|x| *x /= kept);
        }
        Ok(())
    }
}

/// The last token kept, `(probability, id)`, of the order by probability (descending, ties by
/// ascending id): the `limit`-th token, or earlier the first whose running mass reaches `top_p`.
///
/// One pass files every token into a bucket by the leading bits of its probability (the bits
/// of a non-negative `f64` order it like its value), with each bucket's count and mass. The
/// buckets above the one where the counts reach `limit` or the masses reach `top_p` hold a
/// prefix of the order; only that bucket's tokens are sorted and walked (the next buckets' too
/// if rounding left the walk short of `top_p`).
fn last_kept(p: &[f64], limit: usize, top_p: f64) -> (f64, TokenId) {
    let mut count = [0u32; BUCKETS];
    let mut mass = [0.0f64; BUCKETS];
    for &x in p {
        let b = bucket(x);
        count[b] += 1;
        mass[b] += x;
    }
    CANDIDATES.with_borrow_mut(|candidates| walk_buckets(p, &count, &mass, limit, top_p, candidates))
}

thread_local! {
    /// The sorted tokens of a bucket ([`last_kept`]), kept between calls.
    static CANDIDATES: std::cell::RefCell<Vec<(f64, TokenId)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`last_kept`]'s walk from the top bucket down.
fn walk_buckets(
    p: &[f64],
    count: &[u32; BUCKETS],
    mass: &[f64; BUCKETS],
    limit: usize,
    top_p: f64,
    candidates: &mut Vec<(f64, TokenId)>,
) -> (f64, TokenId) {
    let (mut rank, mut acc) = (0usize, 0.0f64);
    let mut last = None;
    for b in (0..BUCKETS).rev() {
        if count[b] == 0 {
            continue;
        }
        let n = count[b] as usize;
        if rank + n < limit && acc + mass[b] < top_p - 1e-12 {
            // The whole bucket is kept, and more.
            rank += n;
            acc += mass[b];
            continue;
        }
        candidates.clear();
        candidates.extend(p.iter().enumerate().filter(|(_, &x)| bucket(x) == b).map(|(i, &x)| (x, i as TokenId)));
        candidates.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        for &(x, i) in candidates.iter() {
            acc += x;
            rank += 1;
            if rank == limit || acc >= top_p {
                return (x, i);
            }
        }
        last = candidates.last().copied();
    }
    last.expect("a non-empty vocabulary")
}

/// Buckets of [`last_kept`]: eight per octave from 2^-64 to 1, and one for everything below.
const BUCKETS: usize = 64 * 8 + 1;

/// The bucket of a probability in `[0, 1]`: its exponent and three leading mantissa bits, from
/// 2^-64 up (monotone in `x`).
#[inline(always)]
fn bucket(x: f64) -> usize {
    const BASE: u64 = (1023 - 64) << 3;
    let top = x.to_bits() >> 49;
    (top.saturating_sub(BASE) as usize).min(BUCKETS - 1)
}

/// The largest logit (NaN aside) and whether any logit is NaN or +inf, in sixteen lanes (one
/// vectorizing pass).
pub fn max_and_bad(logits: &[f32]) -> (f32, bool) {
    const LANES: usize = 16;
    let mut max = [f32::NEG_INFINITY; LANES];
    let mut bad = [false; LANES];
    let mut blocks = logits.chunks_exact(LANES);
    for b in &mut blocks {
        for j in 0..LANES {
            max[j] = max[j].max(b[j]);
            bad[j] |= b[j].is_nan() | (b[j] == f32::INFINITY);
        }
    }
    let rest = blocks.remainder();
    let m = rest.iter().chain(&max).fold(f32::NEG_INFINITY, |m, &l| m.max(l));
    (m, bad.iter().any(|&b| b) || rest.iter().any(|l| l.is_nan() || *l == f32::INFINITY))
}

/// `e^x` for `x <= 0` (softmax's arguments) in `f64`, within 2 ulp of the exact value for
/// normal results, correctly scaled into the subnormal range, 0 below -745.2 and at `-inf`;
/// larger `x` are taken as 0. Branch-free, so loops over it vectorize (std's `exp` does not):
/// a Cody-Waite reduction `x = n ln 2 + r`, `|r| <= ln 2 / 2`, with `n` rounded by the
/// 1.5 * 2^52 shift; the degree-13 Taylor polynomial of `e^r` (truncation below 5e-18); and
/// `2^n` applied as `2^(n + 54)` then the exact `2^-54`, so that results down to 2^-1074
/// round once.
#[inline(always)]
pub fn exp_nonpositive(x: f64) -> f64 {
    const LOG2E: f64 = std::f64::consts::LOG2_E;
    // ln 2 split so that `n * LN2_HI` is exact for |n| < 2^11.
    const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76);
    const SHIFT: f64 = 6_755_399_441_055_744.0; // 1.5 * 2^52
    const LOWEST: f64 = -745.2;
    let xc = x.clamp(LOWEST, 0.0);
    let shifted = xc.mul_add(LOG2E, SHIFT);
    let n = shifted - SHIFT;
    let r = n.mul_add(-LN2_HI, xc);
    let r = n.mul_add(-LN2_LO, r);
    // 1/k! for k = 13 down to 2.
    const C: [f64; 12] = [
        1.0 / 6_227_020_800.0,
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
    ];
    let mut poly = C[0];
    for &c in &C[1..] {
        poly = poly.mul_add(r, c);
    }
    let y = (poly * r).mul_add(r, r) + 1.0;
    // n is an integer in [-1075, 0]: the shift left it in the low bits of `shifted`.
    let n_int = shifted.to_bits().wrapping_sub(SHIFT.to_bits()) as i64;
    let pow2 = f64::from_bits(((n_int + 54 + 1023) as u64) << 52);
    let v = y * pow2 * f64::from_bits((1023u64 - 54) << 52);
    if x < LOWEST {
        0.0
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// The warp as first written: std's `exp`, the whole vocabulary sorted; min-p as vLLM
    /// writes it, on the normalised probabilities against `min_p` times the largest.
    fn reference(w: &Warp, logits: &[f32]) -> Vec<f64> {
        let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let mut out: Vec<f64> = logits.iter().map(|&l| ((l as f64 - max) / w.temperature).exp()).collect();
        let sum: f64 = out.iter().sum();
        out.iter_mut().for_each(|x| *x /= sum);
        let threshold = w.min_p * out.iter().cloned().fold(0.0, f64::max);
        out.iter_mut().filter(|x| **x < threshold).for_each(|x| *x = 0.0);
        let sum: f64 = out.iter().sum();
        out.iter_mut().for_each(|x| *x /= sum);
        let mut order: Vec<usize> = (0..out.len()).collect();
        order.sort_by(|&a, &b| out[b].total_cmp(&out[a]).then(a.cmp(&b)));
        let mut keep = if w.top_k > 0 { w.top_k.min(out.len()) } else { out.len() };
        let mut acc = 0.0;
        for (rank, &i) in order.iter().enumerate().take(keep) {
            acc += out[i];
            if acc >= w.top_p {
                keep = rank + 1;
                break;
            }
        }
        for &i in &order[keep..] {
            out[i] = 0.0;
        }
        let kept: f64 = out.iter().sum();
        out.iter_mut().for_each(|x| *x /= kept);
        out
    }

    #[test]
    fn exp_is_within_two_ulp_of_std() {
        let mut rng = StdRng::seed_from_u64(1);
        let ulp = |v: f64| f64::from_bits(v.to_bits() + 1) - v;
        let mut xs: Vec<f64> = (0..200_000).map(|_| -rng.random::<f64>() * 745.0).collect();
        xs.extend((0..100_000).map(|_| -rng.random::<f64>() * 2.0));
        xs.extend([0.0, -0.0, -1e-300, -0.5 * std::f64::consts::LN_2, -708.39, -709.0, -744.0, -745.1]);
        for x in xs {
            let (got, want) = (exp_nonpositive(x), x.exp());
            let tol = if want >= f64::MIN_POSITIVE { 2.0 * ulp(want) } else { f64::from_bits(1) };
            assert!((got - want).abs() <= tol, "e^{x}: {got:e} vs {want:e}");
        }
        assert_eq!(exp_nonpositive(f64::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpositive(-746.0), 0.0);
        assert_eq!(exp_nonpositive(0.0), 1.0);
    }

    /// The kept set is the full sort's, token for token, and the values agree to 1e-10, on
    /// random logits with ties, masked (-inf) entries and flat or peaked shapes, for every
    /// threshold stage (nuclei of 1 to all tokens). The values differ by summation order (the
    /// reference sums 40,000 terms one by one: relative error up to about 4e-12).
    #[test]
    fn warp_keeps_what_sorting_the_vocabulary_keeps() {
        let mut rng = StdRng::seed_from_u64(2);
        let mut out = Vec::new();
        let mut cases = 0;
        for vocab in [1usize, 2, 5, 17, 100, 1000, 40_000] {
            for shape in 0..4 {
                let logits: Vec<f32> = (0..vocab)
                    .map(|i| match shape {
                        // Peaked: a few large logits.
                        0 => rng.random::<f32>() * 3.0 + if i % 97 == 3 { 9.0 } else { 0.0 },
                        // Flat.
                        1 => rng.random::<f32>() * 0.01,
                        // Ties: few distinct values, some masked.
                        2 if i % 11 == 5 && i > 0 => f32::NEG_INFINITY,
                        2 => (rng.random_range(0..4) as f32) * 0.5,
                        _ => rng.random::<f32>() * 8.0 - 4.0,
                    })
                    .collect();
                for (t, top_k, top_p, min_p) in [
                    (1.0, 0, 1.0, 0.0),
                    (0.7, 0, 0.9, 0.0),
                    (1.0, 0, 0.95, 0.0),
                    (1.3, 0, 0.3, 0.0),
                    (0.7, 50, 1.0, 0.0),
                    (1.0, 3, 0.8, 0.0),
                    (0.5, 2000, 0.999, 0.0),
                    (1.0, 0, 0.999_999, 0.0),
                    (2.0, 20_000, 1.0, 0.0),
                    (1.0, 0, 1.0, 0.05),
                    (0.7, 0, 0.9, 0.1),
                    (1.5, 40, 1.0, 0.02),
                    (1.0, 0, 0.5, 0.3),
                    (1.0, 0, 1.0, 1.0),
                ] {
                    let w = Warp { temperature: t, top_k, top_p, min_p };
                    w.apply(&logits, &mut out).unwrap();
                    let want = reference(&w, &logits);
                    for (i, (&a, &b)) in out.iter().zip(&want).enumerate() {
                        assert_eq!(a > 0.0, b > 0.0, "{w:?}, vocab {vocab}, shape {shape}: token {i} kept");
                        assert!((a - b).abs() <= 1e-10 * b.max(1e-300), "{w:?}: token {i}: {a} vs {b}");
                    }
                    cases += 1;
                }
            }
        }
        assert_eq!(cases, 7 * 4 * 14);
    }

    #[test]
    fn temperature_zero_is_the_first_argmax_and_bad_logits_are_named() {
        let mut out = Vec::new();
        Warp::temperature(0.0).apply(&[1.0, 3.0, 3.0, f32::NEG_INFINITY], &mut out).unwrap();
        assert_eq!(out, [0.0, 1.0, 0.0, 0.0]);
        Warp { top_k: 1, ..Warp::temperature(1.0) }.apply(&[1.0, 3.0, 3.5], &mut out).unwrap();
        assert_eq!(out, [0.0, 0.0, 1.0]);
        // Bad entries anywhere in the sixteen-lane pass or the remainder.
        for len in [3usize, 16, 40] {
            for at in [0, len / 2, len - 1] {
                for bad in [f32::NAN, f32::INFINITY] {
                    let mut logits = vec![0.5f32; len];
                    logits[at] = bad;
                    match Warp::temperature(1.0).apply(&logits, &mut out) {
                        Err(SamplerError::InvalidEntry { index, .. }) => assert_eq!(index, at),
                        other => panic!("{bad} at {at} of {len}: {other:?}"),
                    }
                }
            }
        }
        assert!(Warp::temperature(1.0).apply(&[f32::NEG_INFINITY; 3], &mut out).is_err());
        assert!(Warp::temperature(1.0).apply(&[], &mut out).is_err());
    }
}
