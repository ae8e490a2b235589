//! Positional noise: sampling whose randomness is keyed by `(seed, position, token)`, which
//! makes speculative decoding *drafter-invariant* (Daliri, Musco and Suresh, "Coupling without
//! communication and drafter-invariant speculative decoding", 2024).
//!
//! Every token of the vocabulary gets, at every position of the text, a fixed uniform
//! `u(seed, position, token)` in `(0, 1)`: a counter-based hash, independent across positions
//! and tokens. The token at a position is the winner of an exponential race,
//!
//! ```text
//! y = argmax_i ln u_i / p_i        (equivalently argmin_i E_i / p_i, E_i = -ln u_i ~ Exp(1)),
//! ```
//!
//! which is distributed exactly as `p` (the Gumbel-max trick: `ln(-ln u_i)` is Gumbel), and is
//! a function of `p` and the noise only. Since the noise of a position does not depend on the
//! tokens before it, decoding that samples every position this way draws an exact sample of the
//! target, and the **same** sample whether it is speculative or not, whatever the tree, the
//! draft model, n-gram lookup or `--tree auto`'s choices: the drafts decide only how many
//! tokens one target forward confirms.
//!
//! Drafts use the same noise: the `k` children of a node are the `k` best keys `ln u_i / q_i`
//! of the draft's `q` ([`PositionalNoise::top_k`], the Gumbel-top-k trick: an ordered sample
//! without replacement from `q`), and a draft is accepted when it equals the target's `y`.
//! With one draft the two races agree with probability
//! `sum_i 1 / sum_j max(p_j / p_i, q_j / q_i)` ([`coupled_match_probability`]), which is at
//! least `(1 - TV) / (1 + TV)` and at most the optimal `1 - TV`; [`coupled_acceptance`]
//! computes it for `k` drafts.

use crate::dist::SUBNORMAL_LIFT;
use crate::error::{Result, SamplerError};
use crate::TokenId;

/// The most drafts [`PositionalNoise::top_k`] draws at one node.
pub const MAX_DRAFTS: usize = 64;

/// Entries of `w` at least this heavy are raced first, so that the cut-off that skips the
/// light ones is tight from the start.
const HEAVY: f64 = 1e-2;

/// Tokens per block of the light pass of a race.
const LANES: usize = 16;

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function: a bijection of `u64` whose outputs for consecutive inputs
/// pass BigCrush.
#[inline(always)]
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Noise keyed by `(seed, position, token)`. `Copy` and allocation-free: nothing is stored
/// but the seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PositionalNoise {
    seed: u64,
}

/// The noise of one position: `uniform(token)` for every token.
#[derive(Debug, Clone, Copy)]
struct PositionStream {
    key: u64,
}

impl PositionStream {
    /// A uniform in `(0, 1)` with 53 random bits (never 0 or 1).
    #[inline(always)]
    fn uniform(self, token: usize) -> f64 {
        let h = mix64(self.key.wrapping_add((token as u64).wrapping_add(1).wrapping_mul(GOLDEN)));
        ((h >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
    }
}

impl PositionalNoise {
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }

    pub fn seed(self) -> u64 {
        self.seed
    }

    fn stream(self, position: u64) -> PositionStream {
        PositionStream { key: mix64(mix64(self.seed ^ 0x6A09_E667_F3BC_C909) ^ position.wrapping_mul(GOLDEN)) }
    }

    /// The uniform of `token` at `position`, in `(0, 1)`.
    pub fn uniform(self, position: u64, token: TokenId) -> f64 {
        self.stream(position).uniform(token as usize)
    }

    /// The token at `position` under `p` (normalised or not; entries `>= 0`): the winner of
    /// the exponential race `argmax_i ln u_i / p_i`, distributed as `p / sum(p)`, and a pure
    /// function of the seed, the position and `p`. Errors when no entry is positive.
    pub fn sample(self, position: u64, p: &[f64]) -> Result<TokenId> {
        let mut best = Race::new(1);
        best.run(self.stream(position), p);
        best.tokens().first().copied().ok_or(SamplerError::NoSupport { which: "p" })
    }

    /// The `k` best keys `ln u_i / q_i` at `position`, best first, into `out`: an ordered sample
    /// of `min(k, |support of q|)` tokens without replacement from `q` (Gumbel-top-k), coupled
    /// with [`Self::sample`] at the same position. Errors when `k` is 0 or above
    /// [`MAX_DRAFTS`].
    pub fn top_k(self, position: u64, q: &[f64], k: usize, out: &mut Vec<TokenId>) -> Result<()> {
        if k == 0 {
            return Err(SamplerError::ZeroDrafts);
        }
        if k > MAX_DRAFTS {
            return Err(SamplerError::BadParameter(format!(
                "at most {MAX_DRAFTS} drafts per node with positional noise, asked for {k}"
            )));
        }
        let mut race = Race::new(k);
        race.run(self.stream(position), q);
        out.clear();
        out.extend_from_slice(race.tokens());
        Ok(())
    }
}

/// The `k` best keys of a race so far, best first, on the stack.
struct Race {
    k: usize,
    len: usize,
    keys: [f64; MAX_DRAFTS],
    tokens: [TokenId; MAX_DRAFTS],
}

impl Race {
    fn new(k: usize) -> Self {
        Self { k, len: 0, keys: [0.0; MAX_DRAFTS], tokens: [0; MAX_DRAFTS] }
    }

    fn tokens(&self) -> &[TokenId] {
        &self.tokens[..self.len]
    }

    /// Races every token with `w_i > 0`: the heavy ones first, then the rest.
    ///
    /// The light pass runs in blocks of [`LANES`] tokens: each block's uniforms and cut-off
    /// tests are computed without branches (the compiler vectorizes the hash), and only the
    /// tokens that pass the cut-off of the block's start, usually none, are offered one by one.
    /// The cut-off only tightens, so this offers a superset of what a token-by-token pass would
    /// and keeps exactly the same tokens.
    fn run(&mut self, noise: PositionStream, w: &[f64]) {
        for (i, &wi) in w.iter().enumerate() {
            if wi >= HEAVY {
                self.offer(noise, i, wi);
            }
        }
        let light = |wi: f64| wi > 0.0 && wi < HEAVY;
        let mut start = 0;
        // Until k tokens are in, every light token is offered.
        while self.len < self.k && start < w.len() {
            if light(w[start]) {
                self.offer(noise, start, w[start]);
            }
            start += 1;
        }
        let blocks = w[start..].chunks_exact(LANES);
        let tail = start + blocks.len() * LANES;
        for (b, block) in blocks.enumerate() {
            let base = start + b * LANES;
            // Blocks with no light token (zeros past top-k/top-p, heavy tokens) need no hash.
            if !block.iter().any(|&wi| light(wi)) {
                continue;
            }
            // The cut-off `1 + t w` of `offer`, with w lifted (exact: a power of two; where
            // `t * SUBNORMAL_LIFT` overflows, every light token is offered, a superset).
            let t = self.keys[self.k - 1] * SUBNORMAL_LIFT;
            let mut mask = 0u32;
            for (j, &wi) in block.iter().enumerate() {
                let u = noise.uniform(base + j);
                mask |= ((light(wi) & (u > 1.0 + t * wi)) as u32) << j;
            }
            while mask != 0 {
                let j = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                self.offer(noise, base + j, block[j]);
            }
        }
        for (i, &wi) in w.iter().enumerate().skip(tail) {
            if light(wi) {
                self.offer(noise, i, wi);
            }
        }
    }

    /// Keys are `ln(u) / (w SUBNORMAL_LIFT)`: the same order as `ln(u) / w`, but finite for a
    /// subnormal `w`, where `ln(u) / w` was `-inf` for every such token and the race between
    /// them went to the first offered (q = (1, 1e-320, 2e-320) drew token 1 second every time
    /// instead of one time in three).
    #[inline(always)]
    fn offer(&mut self, noise: PositionStream, i: usize, wi: f64) {
        let u = noise.uniform(i);
        let wi = wi * SUBNORMAL_LIFT;
        if self.len == self.k {
            // The key ln(u)/w beats the k-th best `t` only if ln u > t w; since ln u <= u - 1,
            // a token with u <= 1 + t w cannot, and costs no logarithm.
            let t = self.keys[self.k - 1];
            if u <= 1.0 + t * wi {
                return;
            }
            let key = u.ln() / wi;
            if key > t {
                self.insert(key, i as TokenId);
            }
        } else {
            self.insert(u.ln() / wi, i as TokenId);
        }
    }

    /// Inserts in order, dropping the k-th best when full.
    fn insert(&mut self, key: f64, token: TokenId) {
        let mut at = self.len.min(self.k - 1);
        if self.len < self.k {
            self.len += 1;
        }
        while at > 0 && self.keys[at - 1] < key {
            self.keys[at] = self.keys[at - 1];
            self.tokens[at] = self.tokens[at - 1];
            at -= 1;
        }
        self.keys[at] = key;
        self.tokens[at] = token;
    }
}

/// The probability that the exponential races of `p` and `q` on the same noise pick the same
/// token: `sum_i 1 / sum_j max(p_j / p_i, q_j / q_i)` over the tokens in both supports.
///
/// Derivation: both pick `i` iff `E_j > E_i max(p_j / p_i, q_j / q_i)` for every `j != i`; given
/// `E_i = e` that has probability `exp(-e (m_i - 1))` with `m_i = sum_j max(...)` (the `j = i`
/// term is 1), and `E[exp(-E_i (m_i - 1))] = 1 / m_i`. O(V^2): for small vocabularies.
pub fn coupled_match_probability(p: &[f64], q: &[f64]) -> f64 {
    (0..p.len())
        .filter(|&i| p[i] > 0.0 && q[i] > 0.0)
        .map(|i| 1.0 / p.iter().zip(q).map(|(&pj, &qj)| (pj / p[i]).max(qj / q[i])).sum::<f64>())
        .sum()
}

/// The acceptance of `k` positional drafts: the probability that the target's token
/// ([`PositionalNoise::sample`] of `p`) is among the draft's `k` best keys
/// ([`PositionalNoise::top_k`] of `q`), for normalised `p` and `q`.
///
/// Given `E_i = e`, token `i` wins the `p` race with probability `prod_{j != i} exp(-e p_j / p_i)`
/// and, independently per `j`, `j` outranks `i` in the `q` race (while losing to it in `p`'s)
/// with probability `max(0, 1 - exp(-e (q_j / q_i - p_j / p_i)))`; `i` is a draft when fewer than
/// `k` do (a Poisson-binomial count). With `e = p_i s` the integral over `e` becomes
/// `p_i ∫ exp(-s) P(count < k | s) ds`, taken by Simpson's rule in `ln s` on `[1e-13, 60]`
/// (4,000 panels; within 1e-9 of the closed form for `k = 1` in the tests). O(V^2 k) per
/// abscissa: for small vocabularies (tests, the `alpha` calculator).
pub fn coupled_acceptance(p: &[f64], q: &[f64], k: usize) -> f64 {
    if k == 0 {
        return 0.0;
    }
    let v = p.len();
    // s = exp(t): every rate's rise (on the scale 1/r) is smooth in t; the cut at s = 1e-13
    // loses at most 1e-13, and exp(-60) nothing.
    let panels = 4000;
    let (lo, hi) = ((1e-13f64).ln(), 60f64.ln());
    let h = (hi - lo) / panels as f64;
    let mut total = 0.0;
    let mut count = vec![0.0f64; k];
    for i in (0..v).filter(|&i| p[i] > 0.0 && q[i] > 0.0) {
        // Rates c_j = q_j / q_i - p_j / p_i, per unit of e; e = p_i s.
        let rates: Vec<f64> = (0..v).filter(|&j| j != i).map(|j| (q[j] / q[i] - p[j] / p[i]).max(0.0) * p[i]).collect();
        let mut integral = 0.0;
        for n in 0..=panels {
            let s = (lo + n as f64 * h).exp();
            // P(fewer than k of the j outrank i): Poisson-binomial, truncated at k - 1.
            count.iter_mut().for_each(|c| *c = 0.0);
            count[0] = 1.0;
            for &r in &rates {
                if r == 0.0 {
                    continue;
                }
                let pj = if r.is_infinite() { 1.0 } else { -(-r * s).exp_m1() };
                for m in (0..k).rev() {
                    count[m] = count[m] * (1.0 - pj) + if m > 0 { count[m - 1] * pj } else { 0.0 };
                }
            }
            let f = s * (-s).exp() * count.iter().sum::<f64>();
            let w = if n == 0 || n == panels {
                1.0
            } else if n % 2 == 1 {
                4.0
            } else {
                2.0
            };
            integral += w * f;
        }
        total += p[i] * integral * h / 3.0;
    }
    total
}

/// Largest union of the supports of `p` and `q` on which [`estimated_acceptance`] integrates.
pub const EXACT_ACCEPTANCE_SUPPORT: usize = 64;

/// The acceptance of `k` positional drafts at any vocabulary size: [`coupled_acceptance`] on the
/// union of the supports of `p` and `q` when it holds at most [`EXACT_ACCEPTANCE_SUPPORT`]
/// tokens, else the fraction of the positions `0..positions` (at least one) of `noise` at which
/// the target's race winner is among the draft's `k` best races, an unbiased estimate. Returns
/// the rate and whether it is exact.
pub fn estimated_acceptance(
    p: &[f64],
    q: &[f64],
    k: usize,
    noise: PositionalNoise,
    positions: u64,
) -> Result<(f64, bool)> {
    let keep: Vec<usize> = (0..p.len()).filter(|&i| p[i] > 0.0 || q[i] > 0.0).collect();
    if keep.len() <= EXACT_ACCEPTANCE_SUPPORT {
        let pk: Vec<f64> = keep.iter().map(|&i| p[i]).collect();
        let qk: Vec<f64> = keep.iter().map(|&i| q[i]).collect();
        return Ok((coupled_acceptance(&pk, &qk, k), true));
    }
    let positions = positions.max(1);
    let mut drafts = Vec::with_capacity(k);
    let mut hits = 0u64;
    for pos in 0..positions {
        noise.top_k(pos, q, k, &mut drafts)?;
        hits += drafts.contains(&noise.sample(pos, p)?) as u64;
    }
    Ok((hits as f64 / positions as f64, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniforms_are_in_the_open_interval_and_keyed() {
        let n = PositionalNoise::new(7);
        for pos in 0..50 {
            for t in 0..200 {
                let u = n.uniform(pos, t);
                assert!(u > 0.0 && u < 1.0);
            }
        }
        assert_eq!(n.uniform(3, 4), PositionalNoise::new(7).uniform(3, 4));
        assert_ne!(n.uniform(3, 4), n.uniform(4, 3));
        assert_ne!(n.uniform(3, 4), PositionalNoise::new(8).uniform(3, 4));
    }

    /// The blocked, cut-off race keeps exactly the tokens of a naive race that computes every
    /// key `ln u_i / w_i` and sorts them: 600 positions of vocabularies of 1 to 5,000 tokens,
    /// flat, peaked, and with zeros, for k = 1, 2, 5 and more than the support.
    #[test]
    fn the_race_equals_a_naive_race() {
        let noise = PositionalNoise::new(5);
        let mut out = Vec::new();
        let mut state = 1u64;
        let mut next = || {
            state = mix64(state.wrapping_add(GOLDEN));
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for pos in 0..600u64 {
            let v = [1usize, 7, 17, 40, 1000, 5000][pos as usize % 6];
            let sharp = 1 + (pos as i32 / 6) % 4 * 3;
            let mut w: Vec<f64> =
                (0..v).map(|_| if next() < 0.2 { 0.0 } else { next().powi(sharp) * next().powi(sharp) }).collect();
            if w.iter().all(|&x| x == 0.0) {
                w[v / 2] = 1.0;
            }
            let total: f64 = w.iter().sum();
            w.iter_mut().for_each(|x| *x /= total);
            let mut keys: Vec<(f64, TokenId)> = (0..v)
                .filter(|&i| w[i] > 0.0)
                .map(|i| (noise.uniform(pos, i as TokenId).ln() / w[i], i as TokenId))
                .collect();
            keys.sort_by(|a, b| b.0.total_cmp(&a.0));
            assert_eq!(noise.sample(pos, &w).unwrap(), keys[0].1, "position {pos}, {v} tokens");
            for k in [1usize, 2, 5, v + 1] {
                noise.top_k(pos, &w, k.min(MAX_DRAFTS), &mut out).unwrap();
                let want: Vec<TokenId> = keys.iter().take(k.min(MAX_DRAFTS)).map(|x| x.1).collect();
                assert_eq!(out, want, "position {pos}, {v} tokens, k {k}");
            }
        }
    }

    #[test]
    fn top_k_lists_distinct_tokens_of_the_support_best_first() {
        let n = PositionalNoise::new(1);
        let q = [0.0, 0.5, 0.2, 0.0, 0.3];
        let mut out = Vec::new();
        for pos in 0..100 {
            n.top_k(pos, &q, 5, &mut out).unwrap();
            let mut sorted = out.clone();
            sorted.sort();
            assert_eq!(sorted, vec![1, 2, 4]);
            // The first is the race's winner.
            assert_eq!(out[0], n.sample(pos, &q).unwrap());
            n.top_k(pos, &q, 2, &mut out).unwrap();
            assert_eq!(out.len(), 2);
        }
        assert!(n.top_k(0, &q, 0, &mut out).is_err());
        assert!(n.top_k(0, &q, MAX_DRAFTS + 1, &mut out).is_err());
        // A one-hot distribution (temperature 0) gives its token.
        assert_eq!(n.sample(9, &[0.0, 0.0, 1.0]).unwrap(), 2);
        // No support: an error, not a panic; drafts: none.
        assert_eq!(n.sample(9, &[0.0, 0.0]), Err(SamplerError::NoSupport { which: "p" }));
        n.top_k(9, &[0.0, 0.0], 2, &mut out).unwrap();
        assert!(out.is_empty());
    }
}
