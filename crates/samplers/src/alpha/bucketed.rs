//! The prefix scan of section 4.2 without a global sort.
//!
//! Candidates are grouped into 2^14 buckets by the high bits of their `q/p` sort key (f32
//! bits, so the buckets are disjoint ratio ranges in scan order). A pass computes each
//! bucket's contribution to `Q` (its mass, or its elementary symmetric polynomials), a second
//! pass over the buckets gives the exact `f = P - Q` at every bucket end, and since `Q` only
//! grows along the scan, `P(bucket start) - Q(bucket end)` bounds `f` inside a bucket. Only
//! buckets whose bound beats the best exact value are sorted and scanned token by token.
//! The result equals the full sorted scan; the cost is linear plus a few small sorts.

use super::subset_scan::{sort_exact, Candidate};
use std::cell::RefCell;

const BUCKET_BITS: u32 = 14;
const BUCKETS: usize = 1 << BUCKET_BITS;
const NONE: u16 = u16::MAX;
/// Tokens whose keys pass 1 computes before scattering them (in L1).
const KEY_CHUNK: usize = 256;

/// How `Q` of a prefix is built from its tokens.
pub(crate) trait PrefixQ {
    /// Number of f64 in a state (a bucket's accumulator has the same shape).
    fn width(&self) -> usize;
    /// The state of the empty set.
    fn empty(&self, state: &mut [f64]);
    /// Adds one token of probability `q` (normalised); adding `q = 0` must leave the state
    /// unchanged (pass 1 adds zeros for excluded tokens).
    fn add(&self, state: &mut [f64], q: f64);
    /// `state ← state ⊕ acc` where `acc` was built from the empty state by `add`.
    fn merge(&self, state: &mut [f64], acc: &[f64]);
    /// `Q` of the set described by `state`.
    fn value(&self, state: &[f64]) -> f64;
}

#[derive(Default)]
struct Buffers {
    token_bucket: Vec<u16>,
    bucket_p: Vec<f64>,
    bucket_count: Vec<u32>,
    acc: Vec<f64>,
    starts: Vec<f64>,
    /// One byte per bucket plus one for `NONE`: 1 where the bucket is refined.
    refine: Vec<u8>,
    items: Vec<Candidate>,
    spare: Vec<Candidate>,
}

/// `min(0, min_j P(H_j) - Q(H_j))` over the prefixes of the candidates (tokens with `q > 0`
/// and `keep(p, q)`, normalised) in the order of `q/p`, largest first.
pub(crate) fn min_over_prefixes(p: &[f64], q: &[f64], keep: impl Fn(f64, f64) -> bool, model: &impl PrefixQ) -> f64 {
    thread_local! {
        static BUFFERS: RefCell<Buffers> = RefCell::new(Buffers::default());
    }
    BUFFERS.with(|cell| scan(p, q, keep, model, &mut cell.borrow_mut()))
}

fn scan(p: &[f64], q: &[f64], keep: impl Fn(f64, f64) -> bool, model: &impl PrefixQ, b: &mut Buffers) -> f64 {
    let w = model.width();
    let (ip, iq) = (1.0 / crate::dist::fast_sum(p), 1.0 / crate::dist::fast_sum(q));
    b.token_bucket.clear();
    // Excluded tokens (about half on real distributions) add zeros to their key's bucket, so
    // that pass 1 has no unpredictable branch and no chain of updates to one shared slot.
    b.bucket_p.clear();
    b.bucket_p.resize(BUCKETS, 0.0);
    b.bucket_count.clear();
    b.bucket_count.resize(BUCKETS, 0);
    b.acc.resize((BUCKETS) * w, 0.0);
    for bucket in b.acc.chunks_mut(w) {
        model.empty(bucket);
    }
    b.token_bucket.resize(p.len(), NONE);
    // Pass 1: bucket sums, a chunk of tokens at a time. The keys, masks and normalised values
    // of a chunk are computed first in a loop without stores to the buckets, which vectorises
    // (the division of the key included); the scatter into the buckets follows.
    let mut qm = [0.0f64; KEY_CHUNK];
    let mut pm = [0.0f64; KEY_CHUNK];
    let mut keys = [0u16; KEY_CHUNK];
    for (start, (pc, qc)) in p.chunks(KEY_CHUNK).zip(q.chunks(KEY_CHUNK)).enumerate() {
        let len = pc.len();
        for i in 0..len {
            let (pn, qn) = (pc[i] * ip, qc[i] * iq);
            let kept = (qc[i] > 0.0) & keep(pn, qn);
            keys[i] = (Candidate::key_of(pn, qn) >> (32 - BUCKET_BITS)) as u16;
            qm[i] = if kept { qn } else { 0.0 };
            pm[i] = if kept { pn } else { 0.0 };
        }
        let token_bucket = &mut b.token_bucket[start * KEY_CHUNK..start * KEY_CHUNK + len];
        for i in 0..len {
            let bucket = keys[i] as usize;
            model.add(&mut b.acc[bucket * w..(bucket + 1) * w], qm[i]);
            b.bucket_p[bucket] += pm[i];
            // A kept token has q > 0 (and so a positive masked q).
            let kept = qm[i] > 0.0;
            b.bucket_count[bucket] += kept as u32;
            token_bucket[i] = if kept { bucket as u16 } else { NONE };
        }
    }
    // Pass 2: exact f at bucket ends, the start state of each bucket, and the bound inside.
    let mut state = vec![0.0; w];
    model.empty(&mut state);
    b.starts.resize(BUCKETS * w, 0.0);
    let mut pp = 0.0f64;
    let mut best = 0.0f64;
    let mut bounds: Vec<(usize, f64, f64)> = Vec::new(); // (bucket, P at start, lower bound)
    for bucket in 0..BUCKETS {
        if b.bucket_count[bucket] == 0 {
            continue;
        }
        b.starts[bucket * w..(bucket + 1) * w].copy_from_slice(&state);
        let p_start = pp;
        model.merge(&mut state, &b.acc[bucket * w..(bucket + 1) * w]);
        pp += b.bucket_p[bucket];
        let q_end = model.value(&state);
        best = best.min(pp - q_end);
        bounds.push((bucket, p_start, p_start - q_end));
    }
    // Pass 3: refine the buckets that can hold a smaller value.
    b.refine.clear();
    b.refine.resize(NONE as usize + 1, 0);
    let mut any = false;
    for &(bucket, _, lower) in &bounds {
        if lower < best - 1e-15 {
            b.refine[bucket] = 1;
            any = true;
        }
    }
    if !any {
        return best;
    }
    b.items.clear();
    for (i, &bucket) in b.token_bucket.iter().enumerate() {
        // `NONE` (excluded tokens) indexes a byte that stays 0: one table look-up per token.
        if b.refine[bucket as usize] != 0 {
            let (pn, qn) = (p[i] * ip, q[i] * iq);
            b.items.push(Candidate::new(pn, qn));
        }
    }
    sort_exact(&mut b.items, &mut b.spare);
    // `items` holds the tokens of every marked bucket, in bucket order: each marked bucket
    // takes the next `bucket_count` of them. A marked bucket whose bound no longer beats `best`
    // (lowered by the buckets before it) is skipped, but its tokens are still stepped over.
    let mut start = 0;
    for &(bucket, p_start, lower) in &bounds {
        if b.refine[bucket] == 0 {
            continue;
        }
        let end = start + b.bucket_count[bucket] as usize;
        if lower >= best - 1e-15 {
            start = end;
            continue;
        }
        state.copy_from_slice(&b.starts[bucket * w..(bucket + 1) * w]);
        let mut pp = p_start;
        for c in &b.items[start..end] {
            model.add(&mut state, c.q);
            pp += c.p;
            best = best.min(pp - model.value(&state));
        }
        start = end;
    }
    best
}
