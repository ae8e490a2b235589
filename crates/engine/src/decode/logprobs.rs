//! Log-probabilities of generated tokens (OpenAI's `logprobs`, `generate --logprobs`).
//!
//! They are the target's own: `ln softmax(logits)` of the row that scored the token, at
//! temperature 1, before top-k/top-p and any logit bias (vLLM's default "raw" log-probabilities).
//! Speculative decoding does not change them: every emitted token is scored by the target's row
//! at its position, the one the verifier sampled from, whether the token was an accepted draft or
//! the bonus token; where the target computes a row the same alone and in a tree (our Q4_K/Q6_K
//! CPU kernels, f32 weights) they are the very numbers plain decoding reports.

use crate::kernels::simd::exp;

/// The target's log-probability of one generated token and of its most probable alternatives.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct TokenLogprobs {
    pub token: u32,
    /// `ln p(token)` under the target's distribution at temperature 1.
    pub logprob: f32,
    /// The most probable tokens with their log-probabilities, most probable first (ties by
    /// smaller id); as many as asked for, fewer only when the vocabulary is smaller.
    pub top: Vec<(u32, f32)>,
}

/// The largest number of alternatives per token (OpenAI's limit for `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Fills `out` for `token` from its scoring row `logits` (`ln softmax`, summed in f64) with the
/// `top` most probable tokens. Reuses `out.top`'s storage; one read of the row for the
/// normaliser and one for the top tokens. A row with a NaN or +inf, or no finite logit, is an
/// error.
pub fn token_logprobs(logits: &[f32], token: u32, top: usize, out: &mut TokenLogprobs) -> Result<(), String> {
    let Some(&chosen) = logits.get(token as usize) else {
        return Err(format!("token {token} is outside the vocabulary of {} logits", logits.len()));
    };
    let (max, bad) = samplers::warp::max_and_bad(logits);
    if bad {
        return Err("the target's logits contain NaN or +inf".into());
    }
    if !max.is_finite() {
        return Err("the target's logits have no finite maximum".into());
    }
    let log_z = max as f64 + sum_exp(logits, max).ln();
    out.token = token;
    out.logprob = (chosen as f64 - log_z) as f32;
    out.top.clear();
    let top = top.min(logits.len());
    if top > 0 {
        // Insertion into a short sorted list; a logit below the list's last is rejected in one
        // comparison, which is almost every logit.
        for (i, &l) in logits.iter().enumerate() {
            if out.top.len() == top && l <= out.top[top - 1].1 {
                continue;
            }
            let at = out.top.iter().position(|&(_, t)| l > t).unwrap_or(out.top.len());
            if out.top.len() == top {
                out.top.pop();
            }
            out.top.insert(at, (i as u32, l));
        }
        for t in &mut out.top {
            t.1 = (t.1 as f64 - log_z) as f32;
        }
    }
    Ok(())
}

/// `sum_i e^(l_i - max)`: the vectorizing `f32` exponential (2 ulp) in sixteen lanes, each
/// block of 1,024 logits summed in `f32` and the blocks in `f64` (relative error about 1e-6).
fn sum_exp(logits: &[f32], max: f32) -> f64 {
    let mut total = 0.0f64;
    for block in logits.chunks(1024) {
        let mut lanes = [0.0f32; LANES];
        let mut groups = block.chunks_exact(LANES);
        for g in &mut groups {
            for j in 0..LANES {
                lanes[j] += exp(g[j] - max);
            }
        }
        let rest: f64 = groups.remainder().iter().map(|&l| exp(l - max) as f64).sum();
        total += lanes.iter().map(|&x| x as f64).sum::<f64>() + rest;
    }
    total
}

const LANES: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(logits: &[f32]) -> Vec<f64> {
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        logits.iter().map(|&l| (l as f64).exp() / z).collect()
    }

    #[test]
    fn logprobs_are_the_log_softmax_and_top_is_sorted() {
        let logits = [0.5f32, 2.0, -1.0, 2.0, 0.0, 3.25];
        let p = reference(&logits);
        let mut out = TokenLogprobs::default();
        for token in 0..logits.len() as u32 {
            token_logprobs(&logits, token, 3, &mut out).unwrap();
            assert!((out.logprob as f64 - p[token as usize].ln()).abs() < 1e-6);
            // Ties keep the smaller id first.
            let ids: Vec<u32> = out.top.iter().map(|t| t.0).collect();
            assert_eq!(ids, [5, 1, 3]);
            for &(id, lp) in &out.top {
                assert!((lp as f64 - p[id as usize].ln()).abs() < 1e-6);
            }
        }
        let total: f64 = (0..logits.len() as u32)
            .map(|t| {
                token_logprobs(&logits, t, 0, &mut out).unwrap();
                (out.logprob as f64).exp()
            })
            .sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!(out.top.is_empty());
        token_logprobs(&logits, 0, 50, &mut out).unwrap();
        assert_eq!(out.top.len(), logits.len());
    }

    #[test]
    fn large_logits_do_not_overflow_and_masked_tokens_are_minus_infinity() {
        let logits = [1000.0f32, 999.0, f32::NEG_INFINITY];
        let mut out = TokenLogprobs::default();
        token_logprobs(&logits, 1, 3, &mut out).unwrap();
        let expect = -1.0 - (1.0 + (-1.0f64).exp()).ln();
        assert!((out.logprob as f64 - expect).abs() < 1e-5, "{}", out.logprob);
        assert_eq!(out.top[2], (2, f32::NEG_INFINITY));
        token_logprobs(&logits, 2, 0, &mut out).unwrap();
        assert_eq!(out.logprob, f32::NEG_INFINITY);
    }

    #[test]
    fn bad_rows_are_errors() {
        let mut out = TokenLogprobs::default();
        assert!(token_logprobs(&[0.0, f32::NAN], 0, 1, &mut out).unwrap_err().contains("NaN"));
        assert!(token_logprobs(&[f32::NEG_INFINITY; 2], 0, 1, &mut out).is_err());
        assert!(token_logprobs(&[0.0; 2], 2, 1, &mut out).unwrap_err().contains("outside"));
    }
}
