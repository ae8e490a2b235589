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

use super::subset_scan::{with_sorted_candidates, Candidate};
use crate::construction::DraftConstruction;
use crate::dist::{fast_sum, rest_mass, top_k_support};
use std::sync::OnceLock;

/// How `Q(H)` is evaluated (`Quadrature` forces the general method even for `m = 2`, which
/// the tests use to check the quadrature against the closed form).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorMethod {
    Auto,
    Quadrature,
}

const NODES: usize = 16;

/// `(P_n(z), P_n'(z))`, the Legendre polynomial of degree `n` and its derivative.
fn legendre(n: usize, z: f64) -> (f64, f64) {
    let (mut p0, mut p1) = (1.0, z);
    for k in 2..=n {
        let p2 = ((2 * k - 1) as f64 * z * p1 - (k - 1) as f64 * p0) / k as f64;
        p0 = p1;
        p1 = p2;
    }
    (p1, n as f64 * (z * p1 - p0) / (z * z - 1.0))
}

/// Gauss-Legendre nodes and weights on `[0, 1]` (Newton's method on `P_16`).
fn gauss_legendre() -> &'static ([f64; NODES], [f64; NODES]) {
    static GL: OnceLock<([f64; NODES], [f64; NODES])> = OnceLock::new();
    GL.get_or_init(|| {
        let (mut x, mut w) = ([0.0; NODES], [0.0; NODES]);
        for i in 0..NODES {
            let mut z = (std::f64::consts::PI * (i as f64 + 0.75) / (NODES as f64 + 0.5)).cos();
            for _ in 0..100 {
                let (pn, dp) = legendre(NODES, z);
                let dz = pn / dp;
                z -= dz;
                if dz.abs() < 1e-16 {
                    break;
                }
            }
            let (_, dp) = legendre(NODES, z);
            x[i] = 0.5 * (z + 1.0);
            w[i] = 0.5 * 2.0 / ((1.0 - z * z) * dp * dp);
        }
        (x, w)
    })
}

/// Quadrature grid: panel 0 is `[0,1]`, panel `k >= 1` is `[2^{k-1}, 2^k]`, up to a horizon
/// of `64 / delta`. For a `delta` below about 2^-1017 (a q whose mass outside its top `m - 1`
/// tokens is subnormal) the horizon is past f64's range, so times and weights are held
/// relative to their panel's `2^{k-1}`, which enters as an exponent ([`ldexp`]).
struct Grid {
    panels: usize,
    /// Gauss-Legendre weight of each node on its panel, before the panel's width.
    weights: Vec<f64>,
    /// `t / t_max` of each node (0 where it underflows: such nodes see no small token arrive).
    relative_times: Vec<f64>,
}

impl Grid {
    fn new(delta: f64) -> Self {
        let horizon_log2 = (6.0 - delta.log2()).max(6.0); // log2(64 / delta), NaN-free for delta = 0
        let panels = 1 + (horizon_log2.ceil() as usize).clamp(1, 1100);
        let (u, w) = gauss_legendre();
        let mut weights = Vec::with_capacity(panels * NODES);
        let mut relative_times = Vec::with_capacity(panels * NODES);
        // t_max = 2^{panels-2} (1 + u_last).
        let last = 1.0 + u[NODES - 1];
        for k in 0..panels {
            weights.extend_from_slice(w);
            // Node t = 2^{k-1} (1 + u) on panel k >= 1, u on panel 0.
            let start = if k == 0 { 0.0 } else { 1.0 };
            let exponent = Self::width_exponent(k) - (panels as i32 - 2);
            relative_times.extend(u.iter().map(|&uj| ldexp((start + uj) / last, exponent)));
        }
        Self { panels, weights, relative_times }
    }

    fn len(&self) -> usize {
        self.panels * NODES
    }

    /// The panel's width `2^{k-1}` (1 for panel 0) as a power of two exponent.
    fn width_exponent(k: usize) -> i32 {
        if k == 0 {
            0
        } else {
            k as i32 - 1
        }
    }

    /// `0.0625 / t_max`: tokens of `q` at most this arrive with `q t <= 1/16` at every node
    /// (0 when it underflows, and then every token is added on its own).
    fn small_rate(&self) -> f64 {
        let (u, _) = gauss_legendre();
        ldexp(0.0625 / (1.0 + u[NODES - 1]), -(self.panels as i32 - 2))
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
        // A subnormal rate has fewer significant bits than its products need: `rate * u` rounds
        // to a multiple of 2^-1074 (for a rate of 2^-1074, to 0 or 2^-1074), and doubling
        // keeps that error. Such a rate is scaled exactly by `2^shift` to a normal number, the
        // panel of width `2^shift` is computed from it, and the panels before it by halving
        // back (`s = s'/(1 + sqrt(1 - s'))`, `e = sqrt(e')`; their `s` are subnormal, so they
        // hardly matter, but they stay consistent with the doubling).
        let mut first = 2;
        if rate > 0.0 && rate < f64::MIN_POSITIVE {
            let shift = -1021 - rate.log2().floor() as i32;
            let k0 = shift as usize + 1;
            if k0 < self.panels {
                let scaled = ldexp(rate, shift);
                for j in 0..NODES {
                    let x = scaled * (1.0 + u[j]);
                    s[k0 * NODES + j] = -(-x).exp_m1();
                    e[k0 * NODES + j] = (-x).exp();
                }
                for k in (1..k0).rev() {
                    for j in 0..NODES {
                        let (sn, en) = (s[(k + 1) * NODES + j], e[(k + 1) * NODES + j]);
                        s[k * NODES + j] = sn / (1.0 + (1.0 - sn).sqrt());
                        e[k * NODES + j] = en.sqrt();
                    }
                }
                first = k0 + 1;
            }
        }
        // Doubling: `s' = s (2 - s)` keeps the relative precision of a small `s`; `e' = e^2`
        // that of a small `e`. While `e > 1/2` it is taken as `1 - s'` instead: for a rate
        // below 2^-53 the first panels' `e` rounds to exactly 1, and squaring 1 would keep it
        // there however long the panel (a token of q = 1e-17 would never arrive).
        for k in first..self.panels {
            let (done, next) = s.split_at_mut(k * NODES);
            let prev = &done[(k - 1) * NODES..];
            for j in 0..NODES {
                next[j] = prev[j] * (2.0 - prev[j]);
            }
            let (done, next) = e.split_at_mut(k * NODES);
            let prev = &done[(k - 1) * NODES..];
            for j in 0..NODES {
                next[j] = if prev[j] > 0.5 { 1.0 - s[k * NODES + j] } else { prev[j] * prev[j] };
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

    /// Adds one token of probability `q` to `H`.
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

    /// Adds a block of small tokens at once from their scaled power sums
    /// `sums[k] = sum_i (q_i/theta)^k`, `k = 1..=L`, `theta` = [`Grid::small_rate`] (every
    /// `q_i t <= theta t_max = 1/16`).
    ///
    /// With `x_i = e^{q_i t} - 1`, `prod_i (e^{-q_i t} + (1 - e^{-q_i t}) z)
    /// = e^{-q(B) t} exp(sum_j (-1)^{j+1} X_j z^j / j)` where `X_j = sum_i x_i^j
    /// = sum_k a_{j,k} t^k sum_i q_i^k` and `(e^y - 1)^j = sum_k a_{j,k} y^k`.
    fn add_small_block(&mut self, mass: f64, sums: &[f64], series: &[Vec<f64>]) {
        let (m, g) = (self.m, self.grid.len());
        self.grid.fill(mass, &mut self.e, &mut self.s);
        let mut lambda = [0.0f64; MAX_M];
        let mut poly = [0.0f64; MAX_M];
        for i in 0..g {
            let u = self.grid.relative_times[i] * 0.0625; // t theta <= 1/16
            for j in 1..m {
                let a = &series[j];
                let mut x = 0.0;
                let mut uk = u.powi(j as i32);
                for k in j..a.len() {
                    x += a[k] * uk * sums[k];
                    uk *= u;
                }
                lambda[j] = if j % 2 == 1 { x } else { -x } / j as f64;
            }
            // poly = exp(sum_j lambda_j z^j) mod z^m: k e_k = sum_j j lambda_j e_{k-j}.
            poly[0] = 1.0;
            for k in 1..m {
                let mut acc = 0.0;
                for j in 1..=k {
                    acc += j as f64 * lambda[j] * poly[k - j];
                }
                poly[k] = acc / k as f64;
            }
            let scale = self.e[i];
            for k in (0..m).rev() {
                let mut acc = 0.0;
                for a in 0..=k {
                    acc += self.probs[a * g + i] * poly[k - a];
                }
                self.probs[k * g + i] = acc * scale;
            }
        }
    }

    /// `Q(H) = 1 - ∫ r e^{-rt} P(N_H(t) < m) dt` for the tokens added so far, `r = 1 - q(H)`.
    fn q_value(&mut self, r: f64) -> f64 {
        if r <= 0.0 {
            return 1.0;
        }
        let g = self.grid.len();
        self.grid.fill(r, &mut self.e, &mut self.s);
        // `r * integral`, with each panel's width folded into `r` (finite wherever
        // `e^{-r t}` is not 0).
        let mut integral = 0.0;
        for panel in 0..self.grid.panels {
            let r_width = ldexp(r, Grid::width_exponent(panel));
            for i in panel * NODES..(panel + 1) * NODES {
                if self.e[i] == 0.0 {
                    continue;
                }
                let mut below = 0.0;
                for k in 0..self.m {
                    below += self.probs[k * g + i];
                }
                integral += r_width * self.grid.weights[i] * self.e[i] * below;
            }
        }
        (1.0 - integral).clamp(0.0, 1.0)
    }
}

/// `x 2^e` for any `e` (two steps, so that neither power of two overflows).
fn ldexp(x: f64, e: i32) -> f64 {
    let half = e / 2;
    x * 2f64.powi(half) * 2f64.powi(e - half)
}

/// Largest `m` handled by the block update (drafts per node); larger `n` is capped by the
/// support anyway and falls back to token-by-token updates.
const MAX_M: usize = 16;
/// Terms of the `(e^y - 1)^j` series: with `y <= 1/16` and `j < 16` the remainder is below
/// `(15/16)^20 / 20! < 1e-19` relative.
const SERIES_TERMS: usize = 20;
/// Tokens per block of the coarse pass.
const BLOCK: usize = 1024;

/// `series[j][k]` = coefficient of `y^k` in `(e^y - 1)^j`.
fn power_series(m: usize) -> Vec<Vec<f64>> {
    let mut base = [0.0; SERIES_TERMS];
    let mut fact = 1.0;
    for (k, b) in base.iter_mut().enumerate().skip(1) {
        fact *= k as f64;
        *b = 1.0 / fact;
    }
    let mut out = vec![vec![0.0; SERIES_TERMS]; m];
    out[0][0] = 1.0;
    for j in 1..m {
        for a in 0..SERIES_TERMS {
            for b in 1..SERIES_TERMS - a {
                out[j][a + b] += out[j - 1][a] * base[b];
            }
        }
    }
    out
}

/// `alpha*` of `n` sequential draws without replacement (exact; see the module doc).
pub fn alpha_star_without_replacement(p: &[f64], q: &[f64], n: usize) -> f64 {
    alpha_star_without_replacement_with(p, q, n, WorMethod::Auto)
}

/// [`alpha_star_without_replacement`] with a choice of method for `Q(H)`.
pub fn alpha_star_without_replacement_with(p: &[f64], q: &[f64], n: usize, method: WorMethod) -> f64 {
    let m = DraftConstruction::WithoutReplacement.num_drafts(q, n);
    let sq: f64 = fast_sum(q);
    let mut top = Vec::new();
    top_k_support(q, m - 1, &mut top);
    // The mass outside the top m-1 tokens, summed rather than `1 - T_{m-1}`: for a nearly
    // one-hot q the subtraction cancels to 0 or to round-off.
    let delta = rest_mass(q, &top, sq, top.iter().map(|&t| q[t as usize]).sum()) / sq;
    // pi_x <= m q_x / (1 - T_{m-1}): each draw picks x with probability <= q_x / (1 - T_{m-1}).
    // (Not clamped: a subnormal `delta` gives a large or infinite scale, which only keeps more
    // candidates; clamping `delta` up to 1e-300 had pruned tokens of the optimal set.)
    let bound_scale = m as f64 / delta;
    // `r = 1 - q(H)` is the mass of the pruned tokens (never added to H) plus the candidates
    // after the prefix, both summed for the same reason.
    with_sorted_candidates(
        p,
        q,
        |px, qx| px < (bound_scale * qx).min(1.0),
        |tokens, pruned| {
            let outside = outside_masses(tokens, pruned);
            if m == 1 {
                scan_closed_form(tokens, &outside, delta, |qq, _, _| qq)
            } else if m == 2 && method == WorMethod::Auto {
                // For m = 2, `delta` is the mass outside the largest token.
                scan_closed_form(tokens, &outside, delta, |_, r, r_odds| 1.0 - r - r_odds)
            } else {
                (1.0 + min_f_by_blocks(tokens, &outside, m, delta)).clamp(0.0, 1.0)
            }
        },
    )
}

/// `outside[j]`: the mass outside the prefix of `j` candidates, `pruned` plus the candidates
/// from `j` on, summed from the end (no cancellation when q(H) is close to 1).
fn outside_masses(tokens: &[Candidate], pruned: f64) -> Vec<f64> {
    let mut out = vec![pruned; tokens.len() + 1];
    for j in (0..tokens.len()).rev() {
        out[j] = out[j + 1] + tokens[j].q;
    }
    out
}

/// `1 + min_j (P_j - Q_j)` where `Q_j = big_q(q(H_j), r_j, r_j sum_{H_j} q/(1-q))`, `r_j` the
/// mass outside `H_j` (`outside[j + 1]`, see [`outside_masses`]); `rest_of_top` is the mass
/// outside the largest token (the product through [`Odds`]).
fn scan_closed_form(
    tokens: &[Candidate],
    outside: &[f64],
    rest_of_top: f64,
    big_q: impl Fn(f64, f64, f64) -> f64,
) -> f64 {
    let (mut pp, mut qq, mut best) = (0.0f64, 0.0f64, 0.0f64);
    let mut odds = Odds::default();
    for (j, c) in tokens.iter().enumerate() {
        pp += c.p;
        qq += c.q;
        odds.add(c.q);
        let r = outside[j + 1];
        let big = big_q(qq.min(1.0), r, odds.times(r, rest_of_top));
        debug_assert!(!big.is_nan(), "Q(H) is NaN at prefix {j}");
        best = best.min(pp - big.clamp(0.0, 1.0));
    }
    (1.0 + best).clamp(0.0, 1.0)
}

/// `sum_{H} q / (1 - q)` of a set of normalised token masses, for the closed form of m = 2: the
/// odds of its tokens of at most 1/2, summed, and the mass of its largest token (`q > 1/2`; 0
/// while `H` lacks it), whose `1 - q` is taken as `rest_of_top`, the summed mass of every other
/// token (a nearly one-hot q rounds its top token to 1.0 in f64, where `1 - q` is 0).
#[derive(Default)]
struct Odds {
    small: f64,
    top: f64,
}

impl Odds {
    #[inline]
    fn add(&mut self, q: f64) {
        if q > 0.5 {
            self.top = q;
        } else {
            self.small += q / (1.0 - q);
        }
    }

    /// `r sum_{H} q / (1 - q)` for the mass `r` outside `H`. The largest token's term is
    /// `(r / rest_of_top) q`: its odds `q / rest_of_top` alone overflow for a subnormal
    /// `rest_of_top` (`r * inf` had made `Q` 0 for a prefix that held half the draws, and `0 *
    /// inf` NaN, which `min` passed over: q = [0, 1e-321, 0, 1] with 2 drafts gave `alpha*` 1
    /// for 0.76). `r <= rest_of_top` once the largest token is in `H` (the `min` absorbs
    /// rounding), and `r = 0` gives 0, also for `rest_of_top = 0`.
    #[inline]
    fn times(&self, r: f64, rest_of_top: f64) -> f64 {
        let top = if self.top > 0.0 && r > 0.0 { (r / rest_of_top).min(1.0) * self.top } else { 0.0 };
        r * self.small + top
    }
}

/// `min(0, min_j P(H_j) - Q(H_j))` over the prefixes of `tokens` (sorted), for `m >= 2`.
///
/// Coarse pass: blocks of [`BLOCK`] tokens enter the DP at once (small tokens through power
/// sums, the few tokens with `q t_max > 1/16` one by one), giving exact `Q` at block ends.
/// Inside a block `Q` is convex in the cumulative mass `s = q(H)` (q-convexity), so it lies
/// under the chord between the block's ends and `P_j - chord(s_j)` bounds `f` from below;
/// only blocks whose bound beats the best exact value are replayed token by token.
fn min_f_by_blocks(tokens: &[Candidate], outside: &[f64], m: usize, delta: f64) -> f64 {
    let mut dp = ArrivalDp::new(m, delta);
    if tokens.is_empty() {
        return 0.0;
    }
    let theta = dp.grid.small_rate();
    let series = power_series(m.min(MAX_M));
    let blocks = tokens.len().div_ceil(BLOCK);
    let g = dp.grid.len();
    let mut snapshots: Vec<f64> = Vec::with_capacity(blocks * m * g);
    // Cumulative (P, s) at every block end, and Q there.
    let mut ends: Vec<(f64, f64, f64)> = Vec::with_capacity(blocks + 1);
    ends.push((0.0, 0.0, 0.0));
    let (mut pp, mut qq) = (0.0f64, 0.0f64);
    let mut sums = vec![0.0; SERIES_TERMS];
    let mut best = 0.0f64;
    for block in tokens.chunks(BLOCK) {
        snapshots.extend_from_slice(&dp.probs);
        sums.iter_mut().for_each(|x| *x = 0.0);
        let mut small_mass = 0.0;
        let mut small_count = 0;
        for &Candidate { p: px, q: qx, .. } in block {
            pp += px;
            qq += qx;
            if qx <= theta && m <= MAX_M {
                let ratio = qx / theta;
                let mut pw = ratio;
                for s in sums.iter_mut().skip(1) {
                    *s += pw;
                    pw *= ratio;
                }
                small_mass += qx;
                small_count += 1;
            } else {
                dp.add(qx);
            }
        }
        if small_count > 0 {
            dp.add_small_block(small_mass, &sums, &series);
        }
        let len = ends.len() * BLOCK - BLOCK + block.len();
        let big_q = q_of_prefix(&mut dp, len, m, outside[len]);
        best = best.min(pp - big_q);
        ends.push((pp, qq, big_q));
    }
    // Refinement of the blocks whose chord bound can beat `best`.
    let mut refine = Vec::new();
    for (b, block) in tokens.chunks(BLOCK).enumerate() {
        let (p0, s0, q0) = ends[b];
        let (_, s1, q1) = ends[b + 1];
        let slope = if s1 > s0 { (q1 - q0) / (s1 - s0) } else { 0.0 };
        let (mut pp, mut qq, mut lower) = (p0, s0, f64::INFINITY);
        for &Candidate { p: px, q: qx, .. } in block {
            pp += px;
            qq += qx;
            lower = lower.min(pp - (q0 + slope * (qq - s0)).min(1.0));
        }
        if lower < best - 1e-15 {
            refine.push(b);
        }
    }
    for b in refine {
        dp.probs.copy_from_slice(&snapshots[b * m * g..(b + 1) * m * g]);
        let (mut pp, _, _) = ends[b];
        let start = b * BLOCK;
        for (j, &Candidate { p: px, q: qx, .. }) in
            tokens[start..((b + 1) * BLOCK).min(tokens.len())].iter().enumerate()
        {
            dp.add(qx);
            pp += px;
            best = best.min(pp - q_of_prefix(&mut dp, start + j + 1, m, outside[start + j + 1]));
        }
    }
    best
}

/// `Q` of a prefix of `len` tokens: exactly 0 below `m` tokens (m distinct draws cannot all
/// land in fewer), the quadrature's value otherwise. Where the mass outside the top `m - 1`
/// tokens is subnormal the quadrature's horizon spans some 1,070 doublings, and it gave 4.2e-6
/// for such a set (q = [1.5e-33, 6.1e-247, 0, 4.6e-321, 1], 4 drafts, p = 1 on the subnormal
/// token: `alpha*` 0.9999958 for 1).
fn q_of_prefix(dp: &mut ArrivalDp, len: usize, m: usize, outside: f64) -> f64 {
    if len < m {
        0.0
    } else {
        dp.q_value(outside)
    }
}

/// Exact `Q(H)`: the probability that all `m = min(n, |supp q|)` sequential draws without
/// replacement from `q` lie in `H` (`in_h(i)` says whether token `i` is in `H`).
pub fn q_without_replacement(q: &[f64], n: usize, in_h: impl Fn(usize) -> bool, method: WorMethod) -> f64 {
    let m = DraftConstruction::WithoutReplacement.num_drafts(q, n);
    let sq: f64 = fast_sum(q);
    let members: Vec<f64> = q.iter().enumerate().filter(|&(i, &x)| x > 0.0 && in_h(i)).map(|(_, &x)| x / sq).collect();
    let s: f64 = members.iter().sum();
    // The mass outside H, summed (not `1 - q(H)`, which cancels when q(H) is close to 1).
    let r: f64 = q.iter().enumerate().filter(|&(i, &x)| x > 0.0 && !in_h(i)).map(|(_, &x)| x / sq).sum();
    if m == 1 {
        return s.min(1.0);
    }
    let mut top = Vec::new();
    top_k_support(q, m - 1, &mut top);
    let delta = rest_mass(q, &top, sq, top.iter().map(|&t| q[t as usize]).sum()) / sq;
    if m == 2 && method == WorMethod::Auto {
        // `delta`: the mass outside the largest token.
        let mut odds = Odds::default();
        members.iter().for_each(|&x| odds.add(x));
        return (1.0 - r - odds.times(r, delta)).clamp(0.0, 1.0);
    }
    let mut dp = ArrivalDp::new(m, delta);
    for &x in &members {
        dp.add(x);
    }
    q_of_prefix(&mut dp, members.len(), m, r)
}
