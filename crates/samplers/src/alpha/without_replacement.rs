//! Exact `alpha*` for sequential sampling **without replacement**.
//!
//! The paper's generating-function DP, `Q(H) = e_n(q_H)/e_n(q)`, is not the probability that
//! all `n` sequential draws land in `H` (it is exact for conditional-Poisson drafts, see
//! [`super::alpha_star_conditional_poisson`]). The exact value comes from the exponential-clock
//! view: sequential draws without replacement are the first `m = min(n, |supp q|)` arrivals of
//! independent clocks `E_i ~ Exp(q_i)`. All of them fall in `H` iff the `m`-th arrival in `H`
//! precedes the first arrival outside `H`, which is `Exp(r)` with `r = 1 - q(H)`:
//!
//! `1 - Q(H) = ∫_0^∞ r e^{-rt} P(N_H(t) < m) dt`,  `N_H(t) = #{i ∈ H : E_i < t}`.
//!
//! `P(N_H(t) = k)`, `k < m`, is a DP over the tokens of `H` (each arrived with probability
//! `1 - e^{-q_i t}`) that the prefix scan extends one token at a time. For `m = 2` the integral
//! has the closed form `Q(H) = 1 - r - r sum_{i∈H} q_i / (1 - q_i)`; for `m >= 3` it is computed
//! by Gauss-Legendre quadrature (16 nodes per panel) on `[0,1]` and doubling panels
//! `[2^{k-1}, 2^k]`: every exponential rate in the integrand is at most 1, so each panel is
//! smooth on its own scale, and the integrand decays at least like `e^{-δ t}` with
//! `δ = 1 - (mass of the top m-1 tokens)`, which sets the last panel. Node values
//! `e^{-q t}` on panel `k+1` are squares of those on panel `k`, so a token costs 32 `exp`s.
//!
//! To keep the scan short, cheap bounds `prod_k (q(H) - T_k(H))/(1 - T_k(H)) <= Q(H) <= q(H)^m`
//! (`T_k(H)`: mass of the `k` largest tokens of `H`) select the prefixes that can hold the
//! minimum; the quadrature runs only up to the last of them.

use super::subset_scan::sorted_candidates;
use crate::construction::DraftConstruction;
use crate::dist::top_k_support;
use std::sync::OnceLock;

/// How `Q(H)` is evaluated (`Quadrature` forces the general method even for `m = 2`, which
/// the tests use to check the quadrature against the closed form).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorMethod {
    Auto,
    Quadrature,
}

const NODES: usize = 16;

fn gauss_legendre() -> &'static ([f64; NODES], [f64; NODES]) {
    static GL: OnceLock<([f64; NODES], [f64; NODES])> = OnceLock::new();
    GL.get_or_init(|| {
        let n = NODES;
        let (mut x, mut w) = ([0.0; NODES], [0.0; NODES]);
        for i in 0..n {
            let mut z = (std::f64::consts::PI * (i as f64 + 0.75) / (n as f64 + 0.5)).cos();
            for _ in 0..100 {
                let (mut p0, mut p1) = (1.0, z);
                for k in 2..=n {
                    let p2 = ((2 * k - 1) as f64 * z * p1 - (k - 1) as f64 * p0) / k as f64;
                    p0 = p1;
                    p1 = p2;
                }
                let dp = n as f64 * (z * p1 - p0) / (z * z - 1.0);
                let dz = p1 / dp;
                z -= dz;
                if dz.abs() < 1e-16 {
                    let (mut p0, mut p1) = (1.0, z);
                    for k in 2..=n {
                        let p2 = ((2 * k - 1) as f64 * z * p1 - (k - 1) as f64 * p0) / k as f64;
                        p0 = p1;
                        p1 = p2;
                    }
                    let dp = n as f64 * (z * p1 - p0) / (z * z - 1.0);
                    w[i] = 2.0 / ((1.0 - z * z) * dp * dp);
                    break;
                }
            }
            x[i] = z;
        }
        // Map [-1, 1] to [0, 1].
        (x.map(|z| 0.5 * (z + 1.0)), w.map(|v| 0.5 * v))
    })
}

/// Quadrature grid: panel 0 is `[0,1]`, panel `k >= 1` is `[2^{k-1}, 2^k]`.
struct Grid {
    panels: usize,
    weights: Vec<f64>,
}

impl Grid {
    fn new(delta: f64) -> Self {
        let horizon = (64.0f64).max(64.0 / delta.max(1e-300));
        let panels = 1 + (horizon.log2().ceil() as usize).clamp(1, 1100);
        let (_, w) = gauss_legendre();
        let mut weights = Vec::with_capacity(panels * NODES);
        for k in 0..panels {
            let width = if k == 0 { 1.0 } else { 2f64.powi(k as i32 - 1) };
            weights.extend(w.iter().map(|&wj| width * wj));
        }
        Self { panels, weights }
    }

    fn len(&self) -> usize {
        self.panels * NODES
    }

    /// `e[g] = exp(-rate t_g)` and `s[g] = 1 - e[g]` (computed without cancellation).
    fn fill(&self, rate: f64, e: &mut [f64], s: &mut [f64]) {
        let (u, _) = gauss_legendre();
        for j in 0..NODES {
            let x0 = rate * u[j];
            s[j] = -(-x0).exp_m1();
            e[j] = (-x0).exp();
            let x1 = rate * (1.0 + u[j]);
            s[NODES + j] = -(-x1).exp_m1();
            e[NODES + j] = (-x1).exp();
        }
        for k in 2..self.panels {
            let (done, next) = e.split_at_mut(k * NODES);
            let prev = &done[(k - 1) * NODES..];
            for j in 0..NODES {
                next[j] = prev[j] * prev[j];
            }
            let (done, next) = s.split_at_mut(k * NODES);
            let prev = &done[(k - 1) * NODES..];
            for j in 0..NODES {
                next[j] = prev[j] * (2.0 - prev[j]);
            }
        }
    }
}

/// Incremental `P(N_H(t_g) = k)`, `k < m`, for every node `t_g`.
struct ArrivalDp {
    m: usize,
    grid: Grid,
    probs: Vec<f64>, // probs[k * G + g]
    e: Vec<f64>,
    s: Vec<f64>,
}

impl ArrivalDp {
    fn new(m: usize, delta: f64) -> Self {
        let grid = Grid::new(delta);
        let g = grid.len();
        let mut probs = vec![0.0; m * g];
        probs[..g].iter_mut().for_each(|x| *x = 1.0);
        Self { m, grid, probs, e: vec![0.0; g], s: vec![0.0; g] }
    }

    fn add(&mut self, q: f64) {
        let g = self.grid.len();
        self.grid.fill(q, &mut self.e, &mut self.s);
        for k in (1..self.m).rev() {
            let (lower, upper) = self.probs.split_at_mut(k * g);
            let prev = &lower[(k - 1) * g..];
            let cur = &mut upper[..g];
            for i in 0..g {
                cur[i] = cur[i] * self.e[i] + prev[i] * self.s[i];
            }
        }
        for i in 0..g {
            self.probs[i] *= self.e[i];
        }
    }

    /// `Q(H) = 1 - ∫ r e^{-rt} P(N_H(t) < m) dt` for the tokens added so far, `r = 1 - q(H)`.
    fn q_value(&mut self, r: f64) -> f64 {
        if r <= 0.0 {
            return 1.0;
        }
        let g = self.grid.len();
        self.grid.fill(r, &mut self.e, &mut self.s);
        let mut integral = 0.0;
        for i in 0..g {
            let mut below = 0.0;
            for k in 0..self.m {
                below += self.probs[k * g + i];
            }
            integral += self.grid.weights[i] * self.e[i] * below;
        }
        (1.0 - r * integral).clamp(0.0, 1.0)
    }
}

/// `alpha*` of `n` sequential draws without replacement (exact; see the module doc).
pub fn alpha_star_without_replacement(p: &[f64], q: &[f64], n: usize) -> f64 {
    alpha_star_without_replacement_with(p, q, n, WorMethod::Auto)
}

/// [`alpha_star_without_replacement`] with a choice of method for `Q(H)`.
pub fn alpha_star_without_replacement_with(p: &[f64], q: &[f64], n: usize, method: WorMethod) -> f64 {
    let m = DraftConstruction::WithoutReplacement.num_drafts(q, n);
    let sq: f64 = q.iter().sum();
    let mut top = Vec::new();
    top_k_support(q, m - 1, &mut top);
    let top_mass: f64 = top.iter().map(|&t| q[t as usize] / sq).sum();
    let delta = (1.0 - top_mass).max(0.0);
    // pi_x <= m q_x / (1 - T_{m-1}): each draw picks x with probability <= q_x / (1 - T_{m-1}).
    let bound_scale = m as f64 / delta.max(1e-300);
    let tokens = sorted_candidates(p, q, |px, qx| px < (bound_scale * qx).min(1.0));
    if m == 1 {
        let (mut pp, mut qq, mut best) = (0.0f64, 0.0f64, 0.0f64);
        for (px, qx) in tokens {
            pp += px;
            qq += qx;
            best = best.min(pp - qq.min(1.0));
        }
        return (1.0 + best).clamp(0.0, 1.0);
    }
    if m == 2 && method == WorMethod::Auto {
        let (mut pp, mut qq, mut acc, mut best) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        for (px, qx) in tokens {
            pp += px;
            qq += qx;
            acc += qx / (1.0 - qx);
            let r = (1.0 - qq).max(0.0);
            let big_q = (1.0 - r - r * acc).clamp(0.0, 1.0);
            best = best.min(pp - big_q);
        }
        return (1.0 + best).clamp(0.0, 1.0);
    }
    // Bounds on Q for every prefix, to find the prefixes that can hold the minimum.
    let len = tokens.len();
    let (mut f_lo, mut f_hi) = (Vec::with_capacity(len), Vec::with_capacity(len));
    let mut largest: Vec<f64> = Vec::with_capacity(m); // the m-1 largest q in H, descending
    let (mut pp, mut qq) = (0.0f64, 0.0f64);
    for &(px, qx) in &tokens {
        pp += px;
        qq += qx;
        let pos = largest.iter().position(|&v| v < qx).unwrap_or(largest.len());
        if pos < m - 1 {
            largest.insert(pos, qx);
            largest.truncate(m - 1);
        }
        let s = qq.min(1.0);
        let upper = s.powi(m as i32);
        let mut lower = 1.0;
        let mut used = 0.0;
        for k in 0..m {
            let num = s - used;
            if num <= 0.0 {
                lower = 0.0;
                break;
            }
            lower *= num / (1.0 - used);
            if k < largest.len() {
                used += largest[k];
            }
        }
        f_lo.push(pp - upper);
        f_hi.push(pp - lower);
    }
    let bound = f_hi.iter().cloned().fold(0.0f64, f64::min);
    let Some(last) = f_lo.iter().rposition(|&v| v <= bound + 1e-12) else {
        return (1.0 + bound).clamp(0.0, 1.0);
    };
    let mut dp = ArrivalDp::new(m, delta);
    let (mut pp, mut qq, mut best) = (0.0f64, 0.0f64, 0.0f64);
    for (j, &(px, qx)) in tokens[..=last].iter().enumerate() {
        dp.add(qx);
        pp += px;
        qq += qx;
        if f_lo[j] <= bound + 1e-12 {
            best = best.min(pp - dp.q_value((1.0 - qq).max(0.0)));
        }
    }
    (1.0 + best).clamp(0.0, 1.0)
}

/// Exact `Q(H)`: the probability that all `m = min(n, |supp q|)` sequential draws without
/// replacement from `q` lie in `H` (`in_h(i)` says whether token `i` is in `H`).
pub fn q_without_replacement(q: &[f64], n: usize, in_h: impl Fn(usize) -> bool, method: WorMethod) -> f64 {
    let m = DraftConstruction::WithoutReplacement.num_drafts(q, n);
    let sq: f64 = q.iter().sum();
    let members: Vec<f64> = q.iter().enumerate().filter(|&(i, &x)| x > 0.0 && in_h(i)).map(|(_, &x)| x / sq).collect();
    let s: f64 = members.iter().sum();
    let r = (1.0 - s).max(0.0);
    if m == 1 {
        return s.min(1.0);
    }
    if m == 2 && method == WorMethod::Auto {
        return (1.0 - r - r * members.iter().map(|&x| x / (1.0 - x)).sum::<f64>()).clamp(0.0, 1.0);
    }
    let mut top = Vec::new();
    top_k_support(q, m - 1, &mut top);
    let delta = (1.0 - top.iter().map(|&t| q[t as usize] / sq).sum::<f64>()).max(0.0);
    let mut dp = ArrivalDp::new(m, delta);
    for &x in &members {
        dp.add(x);
    }
    dp.q_value(r)
}
