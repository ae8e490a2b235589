//! Acceptance rates of recursive rejection sampling (appendix A.1).
//!
//! Given that the walk reaches draft `k` with current target `p_k` and draft law `q_k`, the
//! draft is accepted with probability `sum_x q_k(x) min(1, p_k(x)/q_k(x)) = sum min(p_k, q_k)`.
//! - RRS-w: the residual `Res^{p_k - q}` does not depend on the rejected token, so
//!   `alpha = b_1 + (1-b_1)(b_2 + (1-b_2)(...))` is exact in `O(nV)` for any vocabulary.
//! - RRS-wo: `q_{k+1} = q_k` without the rejected token, which is drawn with probability
//!   `(q_k(x) - p_k(x))_+ / (1 - b_k)`; the recursion branches over it. Exact by enumeration for
//!   small supports, else Monte Carlo along sampled rejection paths (unbiased, with its
//!   standard error).

use crate::construction::DraftConstruction;
use rand::Rng;

/// A Monte Carlo estimate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub mean: f64,
    /// Standard error of the mean (0 for exact values).
    pub stderr: f64,
    /// Number of samples (0 for exact values).
    pub samples: usize,
}

impl Estimate {
    pub fn exact(mean: f64) -> Self {
        Self { mean, stderr: 0.0, samples: 0 }
    }

    pub fn from_samples(values: &[f64]) -> Self {
        let k = values.len() as f64;
        let mean = values.iter().sum::<f64>() / k;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (k - 1.0).max(1.0);
        Self { mean, stderr: (var / k).sqrt(), samples: values.len() }
    }
}

fn normalised(v: &[f64]) -> Vec<f64> {
    let s: f64 = v.iter().sum();
    v.iter().map(|&x| x / s).collect()
}

/// `(sum min(p, q), Res^{p-q})` for normalised `p`, `q`.
fn step(p: &[f64], q: &[f64]) -> (f64, Vec<f64>) {
    let b: f64 = p.iter().zip(q).map(|(a, b)| a.min(*b)).sum();
    let mut res: Vec<f64> = p.iter().zip(q).map(|(a, b)| (a - b).max(0.0)).collect();
    let t: f64 = res.iter().sum();
    if t > 0.0 {
        res.iter_mut().for_each(|x| *x /= t);
    } else {
        res.copy_from_slice(q);
    }
    (b.min(1.0), res)
}

/// Exact acceptance of RRS with `n` drafts with replacement, any vocabulary, `O(nV)`.
pub fn alpha_rrs_with_replacement(p: &[f64], q: &[f64], n: usize) -> f64 {
    let q = normalised(q);
    let mut cur = normalised(p);
    let (mut alpha, mut mass) = (0.0, 1.0);
    for _ in 0..n {
        let (b, res) = step(&cur, &q);
        alpha += mass * b;
        mass *= 1.0 - b;
        if mass <= 0.0 {
            break;
        }
        cur = res;
    }
    alpha.min(1.0)
}

/// Exact acceptance of RRS-wo by enumerating rejection paths (cost grows like
/// `|supp q|^(n-1)`; meant for supports of up to about 8 tokens).
pub fn alpha_rrs_without_replacement_exact(p: &[f64], q: &[f64], n: usize) -> f64 {
    let m = DraftConstruction::WithoutReplacement.num_drafts(q, n);
    rrs_wo_rec(&normalised(p), &normalised(q), m)
}

fn rrs_wo_rec(p: &[f64], q: &[f64], left: usize) -> f64 {
    if left == 0 {
        return 0.0;
    }
    let (b, res) = step(p, q);
    if b >= 1.0 || left == 1 {
        return b;
    }
    let mut alpha = b;
    for (x, (&px, &qx)) in p.iter().zip(q).enumerate() {
        let reject = (qx - px).max(0.0);
        if reject <= 0.0 {
            continue;
        }
        // The mass left, summed rather than `1 - q(x)`: that difference cancels for a q(x) near 1
        // (q = [4e-11, 0.25, 0.71, 0.04] with 4 drafts, every token drafted, gave 0.9999998
        // for the exact 1).
        let rest: f64 = q.iter().enumerate().filter(|&(i, _)| i != x).map(|(_, &v)| v).sum();
        if rest <= 0.0 {
            continue;
        }
        let q_next: Vec<f64> = q.iter().enumerate().map(|(i, &v)| if i == x { 0.0 } else { v / rest }).collect();
        alpha += reject * rrs_wo_rec(&res, &q_next, left - 1);
    }
    alpha.min(1.0)
}

/// Monte Carlo acceptance of RRS-wo: each sample follows one rejection path, drawing the
/// rejected token from `(q_k - p_k)_+`, and scores `b_1 + (1-b_1)(b_2 + ...)` exactly along it.
#[allow(clippy::needless_range_loop)] // the loops index p_k, q_k and the residual together
pub fn alpha_rrs_without_replacement_monte_carlo<R: Rng + ?Sized>(
    p: &[f64],
    q: &[f64],
    n: usize,
    samples: usize,
    rng: &mut R,
) -> Estimate {
    let m = DraftConstruction::WithoutReplacement.num_drafts(q, n);
    let (p0, q0) = (normalised(p), normalised(q));
    let mut values = Vec::with_capacity(samples);
    let mut removed = Vec::with_capacity(m);
    let mut cur = p0.clone();
    let mut res = vec![0.0; p.len()];
    for _ in 0..samples.max(2) {
        cur.copy_from_slice(&p0);
        removed.clear();
        let mut zq = 1.0; // q_k(i) = q(i)/zq off the removed tokens
        let (mut alpha, mut mass) = (0.0, 1.0);
        for k in 0..m {
            let qk = |i: usize, removed: &[usize]| if removed.contains(&i) { 0.0 } else { q0[i] / zq };
            let mut b = 0.0;
            let mut t = 0.0;
            for i in 0..cur.len() {
                let qi = qk(i, &removed);
                b += cur[i].min(qi);
                res[i] = (cur[i] - qi).max(0.0);
                t += res[i];
            }
            let b = b.min(1.0);
            alpha += mass * b;
            mass *= 1.0 - b;
            if mass <= 0.0 || k + 1 == m || t <= 0.0 {
                break;
            }
            // The rejected token: weight (q_k - p_k)_+.
            let total_reject: f64 = (0..cur.len()).map(|i| (qk(i, &removed) - cur[i]).max(0.0)).sum();
            let mut u = rng.random::<f64>() * total_reject;
            let mut x = usize::MAX;
            for i in 0..cur.len() {
                let w = (qk(i, &removed) - cur[i]).max(0.0);
                if w > 0.0 {
                    x = i;
                    if u < w {
                        break;
                    }
                    u -= w;
                }
            }
            for i in 0..cur.len() {
                cur[i] = res[i] / t;
            }
            removed.push(x);
            // `zq - q0[x]` loses at most a bit while `q0[x] <= zq / 2`; beyond, it cancels (see
            // `rrs_wo_rec`), and the mass left is summed instead (a vocabulary pass, which the
            // step above makes anyway).
            zq = if q0[x] <= 0.5 * zq {
                zq - q0[x]
            } else {
                q0.iter().enumerate().filter(|(i, _)| !removed.contains(i)).map(|(_, &v)| v).sum()
            };
            if zq <= 0.0 {
                break;
            }
        }
        values.push(alpha);
    }
    Estimate::from_samples(&values)
}
