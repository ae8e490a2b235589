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

use crate::dist::fast_sum;
use crate::construction::{elementary_symmetric, DraftConstruction};
use std::cell::RefCell;

/// Normalised `(p, q)` of the candidate tokens sorted by `q/p` descending.
/// `keep(p_x, q_x)` decides which tokens with `q > 0` stay.
///
/// Ties in `q/p` may come in any order: by Theorem 4.4 a whole tie class can be added to an
/// optimal prefix, so the minimum over prefixes does not depend on their order.
pub(crate) fn with_sorted_candidates<R>(
    p: &[f64],
    q: &[f64],
    keep: impl Fn(f64, f64) -> bool,
    scan: impl FnOnce(&[Candidate]) -> R,
) -> R {
    thread_local! {
        static BUFFERS: RefCell<(Vec<Candidate>, Vec<Candidate>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    }
    BUFFERS.with(|cell| {
        let mut guard = cell.borrow_mut();
        let (items, buf) = &mut *guard;
        fill_sorted(p, q, keep, items, buf);
        scan(items)
    })
}

fn fill_sorted(p: &[f64], q: &[f64], keep: impl Fn(f64, f64) -> bool, items: &mut Vec<Candidate>, buf: &mut Vec<Candidate>) {
    let (sp, sq): (f64, f64) = (fast_sum(p), fast_sum(q));
    let (ip, iq) = (1.0 / sp, 1.0 / sq);
    // Key: the ratio rounded to f32, bits inverted so that ascending keys = descending ratios
    // (ratios are >= 0, so their bit patterns order like the values).
    items.clear();
    for (&pi, &qi) in p.iter().zip(q) {
        let (pn, qn) = (pi * ip, qi * iq);
        if qi > 0.0 && keep(pn, qn) {
            let ratio = if pn > 0.0 { (qn / pn) as f32 } else { f32::INFINITY };
            items.push(Candidate { key: !ratio.to_bits(), p: pn, q: qn });
        }
    }
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
    // Inclusion probability 1 - (1-q)^n.
    with_sorted_candidates(p, q, |px, qx| px < 1.0 - ipow(1.0 - qx, n), |tokens| {
        let (mut pp, mut qq, mut best) = (0.0f64, 0.0f64, 0.0f64);
        for c in tokens {
            pp += c.p;
            qq += c.q;
            best = best.min(pp - ipow(qq.min(1.0), n));
        }
        (1.0 + best).clamp(0.0, 1.0)
    })
}

/// `alpha*` of conditional-Poisson drafts: `Q(H) = e_m(q_H) / e_m(q)` with
/// `m = min(n, |supp q|)` (the paper's generating-function formula, exact for this law).
pub fn alpha_star_conditional_poisson(p: &[f64], q: &[f64], n: usize) -> f64 {
    let m = DraftConstruction::ConditionalPoisson.num_drafts(q, n);
    let sq: f64 = fast_sum(q);
    let e = elementary_symmetric(q.iter().map(|&x| x / sq), m);
    let total = e[m];
    // pi_x = q_x e_{m-1}(q without x) / e_m(q) <= q_x e_{m-1}(q) / e_m(q).
    let scale = e[m - 1] / total;
    with_sorted_candidates(p, q, |px, qx| px < (scale * qx).min(1.0), |tokens| {
        let mut e = vec![0.0; m + 1];
        e[0] = 1.0;
        let (mut pp, mut best) = (0.0f64, 0.0f64);
        for c in tokens {
            for k in (1..=m).rev() {
                e[k] += c.q * e[k - 1];
            }
            pp += c.p;
            best = best.min(pp - (e[m] / total).min(1.0));
        }
        (1.0 + best).clamp(0.0, 1.0)
    })
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
