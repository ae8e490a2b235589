//! The prefix scan of section 4.2: when `Q` is q-convex and monotone, an optimal `H` of
//! `min_H P(H) - Q(H)` is a prefix of the tokens sorted by `q/p`, largest first (Theorem
//! 4.4), so `alpha* = 1 + min_j (P(H_j) - Q(H_j))` over those prefixes (and the empty set).
//!
//! Two exact prunings keep the sort short:
//! - tokens with `q = 0` never increase `Q`, so adding them never lowers `P - Q`;
//! - a token `x` whose `p(x)` is at least its inclusion probability `pi_x = P(x is drafted)`
//!   has marginal `p(x) - Q(x|H) >= 0` for every `H` (supermodularity of `Q` gives
//!   `Q(x|H) <= Q(x|Σ\x) = pi_x`). Removing such tokens from an optimal prefix keeps it
//!   optimal and leaves a prefix of the pruned order, so they can be dropped.

use super::bucketed::{min_over_prefixes, PrefixQ};
use crate::construction::{
    add_to_elementary_symmetric, add_to_poisson_ratios, elementary_symmetric_scaled, poisson_ratios, truncated_product,
    DraftConstruction,
};
use crate::dist::{fast_sum, FAR_FROM_UNDERFLOW, SUBNORMAL_LIFT};
use std::cell::RefCell;

/// Normalised `(p, q)` of the candidate tokens sorted by `q/p` descending, and the normalised
/// `q` mass of the tokens left out (summed, so that it stays exact when the candidates' mass is
/// close to 1). `keep(p_x, q_x)` decides which tokens with `q > 0` stay.
///
/// Ties in `q/p` may come in any order: by Theorem 4.4 a whole tie class can be added to an
/// optimal prefix, so the minimum over prefixes does not depend on their order.
pub(crate) fn with_sorted_candidates<R>(
    p: &[f64],
    q: &[f64],
    keep: impl Fn(f64, f64) -> bool,
    scan: impl FnOnce(&[Candidate], f64) -> R,
) -> R {
    thread_local! {
        static BUFFERS: RefCell<(Vec<Candidate>, Vec<Candidate>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    }
    BUFFERS.with(|cell| {
        let mut guard = cell.borrow_mut();
        let (items, buf) = &mut *guard;
        let left_out = fill_sorted(p, q, keep, items, buf);
        scan(items, left_out)
    })
}

fn fill_sorted(
    p: &[f64],
    q: &[f64],
    keep: impl Fn(f64, f64) -> bool,
    items: &mut Vec<Candidate>,
    buf: &mut Vec<Candidate>,
) -> f64 {
    let (sp, sq): (f64, f64) = (fast_sum(p), fast_sum(q));
    let (ip, iq) = (1.0 / sp, 1.0 / sq);
    items.clear();
    let mut left_out = 0.0;
    for (&pi, &qi) in p.iter().zip(q) {
        let (pn, qn) = (pi * ip, qi * iq);
        if qi > 0.0 {
            if keep(pn, qn) {
                items.push(Candidate::new(pn, qn));
            } else {
                left_out += qn;
            }
        }
    }
    sort_exact(items, buf);
    left_out
}

/// Sorts candidates by `q/p` descending: radix sort on the f32 key, then an exact f64
/// fix-up inside runs of equal keys.
pub(crate) fn sort_exact(items: &mut Vec<Candidate>, buf: &mut Vec<Candidate>) {
    radix_sort(items, buf);
    let ratio = |r: &Candidate| if r.p > 0.0 { r.q / r.p } else { f64::INFINITY };
    // Exact order inside runs that share an f32 key: insertion sort on the f64 ratio
    // (the array is sorted up to f32 rounding, so this pass is linear in practice).
    for j in 1..items.len() {
        if items[j - 1].key != items[j].key || ratio(&items[j - 1]) >= ratio(&items[j]) {
            continue;
        }
        let x = items[j];
        let rx = ratio(&x);
        let mut k = j;
        while k > 0 && items[k - 1].key == x.key && ratio(&items[k - 1]) < rx {
            items[k] = items[k - 1];
            k -= 1;
        }
        items[k] = x;
    }
}

/// A candidate token of the scan: normalised `p` and `q`, and its sort key.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct Candidate {
    key: u32,
    pub p: f64,
    pub q: f64,
}

impl Candidate {
    pub(crate) fn new(p: f64, q: f64) -> Self {
        Self { key: Self::key_of(p, q), p, q }
    }

    /// The ratio `q/p` rounded to f32, bits inverted so that ascending keys are descending
    /// ratios (ratios are >= 0, so their bit patterns order like the values).
    #[inline]
    pub(crate) fn key_of(p: f64, q: f64) -> u32 {
        let ratio = if p > 0.0 { (q / p) as f32 } else { f32::INFINITY };
        !ratio.to_bits()
    }
}

/// LSD radix sort of candidates by `key` (three passes of 11 bits).
fn radix_sort(items: &mut Vec<Candidate>, buf: &mut Vec<Candidate>) {
    if items.len() < 256 {
        items.sort_unstable_by_key(|r| r.key);
        return;
    }
    buf.clear();
    buf.resize(items.len(), Candidate::default());
    let mut counts = [[0usize; 2048]; 3];
    for r in items.iter() {
        for (pass, c) in counts.iter_mut().enumerate() {
            c[((r.key >> (11 * pass)) & 0x7ff) as usize] += 1;
        }
    }
    for (pass, count) in counts.iter_mut().enumerate() {
        let mut sum = 0;
        for c in count.iter_mut() {
            let v = *c;
            *c = sum;
            sum += v;
        }
        let shift = 11 * pass;
        for r in items.iter() {
            let b = ((r.key >> shift) & 0x7ff) as usize;
            buf[count[b]] = *r;
            count[b] += 1;
        }
        std::mem::swap(items, buf);
    }
}

/// `alpha*` for `n` drafts with replacement: `Q(H) = q(H)^n`.
pub fn alpha_star_with_replacement(p: &[f64], q: &[f64], n: usize) -> f64 {
    struct WithReplacement(usize);
    impl PrefixQ for WithReplacement {
        fn width(&self) -> usize {
            1
        }
        fn empty(&self, s: &mut [f64]) {
            s[0] = 0.0;
        }
        fn add(&self, s: &mut [f64], q: f64) {
            s[0] += q;
        }
        fn merge(&self, s: &mut [f64], acc: &[f64]) {
            s[0] += acc[0];
        }
        fn value(&self, s: &[f64]) -> f64 {
            ipow(s[0].min(1.0), self.0)
        }
    }
    // Inclusion probability 1 - (1-q)^n.
    let best = min_over_prefixes(p, q, |px, qx| px < 1.0 - ipow(1.0 - qx, n), &WithReplacement(n));
    (1.0 + best).clamp(0.0, 1.0)
}

/// `alpha*` of conditional-Poisson drafts: `Q(H) = e_m(q_H) / e_m(q)` with
/// `m = min(n, |supp q|)` (the paper's generating-function formula, exact for this law).
///
/// Where `e_m(q)` is below [`FAR_FROM_UNDERFLOW`] (it underflows f64 for a q whose top `m` tokens span
/// hundreds of orders of magnitude, and had made every `Q(H)` 0/0) the prefixes are scanned
/// by `normalised_poisson_scan` instead. Otherwise the `e_m` of a set can underflow only far
/// below `e_m(q)`, an absolute error in `Q(H)` below 2^-170.
pub fn alpha_star_conditional_poisson(p: &[f64], q: &[f64], n: usize) -> f64 {
    let m = DraftConstruction::ConditionalPoisson.num_drafts(q, n);
    let sq: f64 = fast_sum(q);
    let e = elementary_symmetric_scaled(q, 1.0 / sq, m);
    if !(e[m] >= FAR_FROM_UNDERFLOW && e.iter().all(|x| x.is_finite())) {
        // `e_m(q)` underflows (or nearly): the top m tokens span some 900 orders of magnitude.
        let rho = poisson_ratios(q, SUBNORMAL_LIFT / sq, m);
        // pi_x <= q_x / rho_m, as below (an infinite scale keeps every candidate, which is safe).
        let scale = SUBNORMAL_LIFT / rho[m - 1];
        return normalised_poisson_scan(p, q, &rho, |px, qx| px < (scale * qx).min(1.0));
    }
    // pi_x = q_x e_{m-1}(q without x) / e_m(q) <= q_x e_{m-1}(q) / e_m(q).
    let scale = e[m - 1] / e[m];
    let keep = |px: f64, qx: f64| px < (scale * qx).min(1.0);
    let total = e[m];
    // A compile-time state width for the usual draft counts: a token's update then loads and
    // stores the whole state at once, so the next token of the same bucket reads it back by
    // store forwarding (a shifted, partly overlapping load had made pass 1 wait on each store).
    let best = match m {
        1 => min_over_prefixes(p, q, keep, &FixedPoisson::<2> { total }),
        2 => min_over_prefixes(p, q, keep, &FixedPoisson::<3> { total }),
        3 => min_over_prefixes(p, q, keep, &FixedPoisson::<4> { total }),
        4 => min_over_prefixes(p, q, keep, &FixedPoisson::<5> { total }),
        5 => min_over_prefixes(p, q, keep, &FixedPoisson::<6> { total }),
        6 => min_over_prefixes(p, q, keep, &FixedPoisson::<7> { total }),
        7 => min_over_prefixes(p, q, keep, &FixedPoisson::<8> { total }),
        8 => min_over_prefixes(p, q, keep, &FixedPoisson::<9> { total }),
        _ => min_over_prefixes(p, q, keep, &AnyPoisson { m, total }),
    };
    (1.0 + best).clamp(0.0, 1.0)
}

/// [`alpha_star_conditional_poisson`] for any range of q: the prefixes in order, one token at
/// a time. The state is the prefix's own ratios `sigma_k = e_k(q_H) / e_{k-1}(q_H)` of the lifted
/// q (see `SUBNORMAL_LIFT`), updated by [`add_to_poisson_ratios`] (no subtraction, no
/// underflow), and `Q(H) = e_m(q_H) / e_m(q) = prod_k sigma_k / rho_k`. Each factor is in
/// `[0, 1]` (a set's ratios only grow as tokens join it: `rho_{k-1} >= rho_k`), so the product
/// can underflow only where `Q(H)` is itself below 2^-1022.
///
/// An earlier state, `s_k = e_k(q_H) / e_k(q)` updated by `s_k += q_x s_{k-1} / rho_k`, formed
/// `q_x s_{k-1}` first: that product underflowed where `s_{k-1}` is tiny but is later multiplied
/// by a huge `q_x / rho_k` (a q spanning 350 orders of magnitude gave `alpha*` 1 for 4e-16).
fn normalised_poisson_scan(p: &[f64], q: &[f64], rho: &[f64], keep: impl Fn(f64, f64) -> bool) -> f64 {
    let m = rho.len();
    with_sorted_candidates(p, q, keep, |tokens, _| {
        let mut sigma = vec![0.0f64; m];
        let (mut pp, mut best) = (0.0f64, 0.0f64);
        for c in tokens {
            add_to_poisson_ratios(&mut sigma, c.q * SUBNORMAL_LIFT);
            pp += c.p;
            let big_q = sigma.iter().zip(rho).fold(1.0f64, |acc, (s, r)| acc * (s / r));
            best = best.min(pp - big_q.min(1.0));
        }
        (1.0 + best).clamp(0.0, 1.0)
    })
}

/// `Q(H) = e_m(q_H) / e_m(q)` of conditional Poisson drafts: the state is `e_0..=e_m` of the
/// set's `q`, a truncated generating polynomial `prod (1 + q_i t)`.
struct AnyPoisson {
    m: usize,
    total: f64,
}

impl PrefixQ for AnyPoisson {
    fn width(&self) -> usize {
        self.m + 1
    }
    fn empty(&self, s: &mut [f64]) {
        s.iter_mut().for_each(|x| *x = 0.0);
        s[0] = 1.0;
    }
    fn add(&self, s: &mut [f64], q: f64) {
        add_to_elementary_symmetric(&mut s[..=self.m], q);
    }
    fn merge(&self, s: &mut [f64], acc: &[f64]) {
        truncated_product(s, acc);
    }
    fn value(&self, s: &[f64]) -> f64 {
        (s[self.m] / self.total).min(1.0)
    }
}

/// [`AnyPoisson`] with the state width `W = m + 1` known at compile time.
struct FixedPoisson<const W: usize> {
    total: f64,
}

impl<const W: usize> PrefixQ for FixedPoisson<W> {
    fn width(&self) -> usize {
        W
    }
    fn empty(&self, s: &mut [f64]) {
        s.iter_mut().for_each(|x| *x = 0.0);
        s[0] = 1.0;
    }
    #[inline(always)]
    fn add(&self, s: &mut [f64], q: f64) {
        let s: &mut [f64; W] = s.try_into().expect("state width");
        let old = *s;
        for k in 1..W {
            s[k] = old[k] + q * old[k - 1];
        }
    }
    fn merge(&self, s: &mut [f64], acc: &[f64]) {
        truncated_product(s, acc);
    }
    fn value(&self, s: &[f64]) -> f64 {
        (s[W - 1] / self.total).min(1.0)
    }
}

/// `x^n` by binary exponentiation, inlined (the scans call it once per token).
#[inline]
pub(crate) fn ipow(mut x: f64, mut n: usize) -> f64 {
    let mut acc = 1.0;
    while n > 0 {
        if n & 1 == 1 {
            acc *= x;
        }
        x *= x;
        n >>= 1;
    }
    acc
}
