//! The hot paths' allocation contracts, checked with a counting allocator: once their buffers
//! are warm, drawing drafts (`DraftConstruction::sample` with a [`DraftScratch`]), verifying
//! them ([`Verifier::verify`], [`samplers::verify_deterministic`] with a [`VerifyScratch`]),
//! warping logits ([`Warp::apply`]) and positional draws ([`PositionalNoise`]) allocate
//! nothing. The decoding loop calls these once per tree node, so an allocation here would be
//! one per drafted token.
//!
//! The allocator counts only the allocations of a thread that asked for counting, so the
//! tests of this binary may run in parallel.

use rand::Rng;
use samplers::construction::DraftScratch;
use samplers::warp::Warp;
use samplers::{PositionalNoise, TokenId, VerifyScratch, VALID_PAIRS};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use crate::common;

/// Passes every call to the system allocator and counts, per thread, the allocations and
/// reallocations made while that thread's counting is on.
struct CountingAllocator;

thread_local! {
    /// `Some(count)` while counting on this thread.
    static COUNT: Cell<Option<u64>> = const { Cell::new(None) };
}

fn note_allocation() {
    let _ = COUNT.try_with(|c| {
        if let Some(n) = c.get() {
            c.set(Some(n + 1));
        }
    });
}

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    COUNT.with(|c| c.set(Some(0)));
    f();
    COUNT.with(|c| c.replace(None)).expect("counting was on")
}

/// The counter sees a fresh `Vec`, a growing one, and nothing for work on the stack (so a zero
/// below means no allocation, not a blind counter).
#[test]
fn the_counter_counts() {
    assert_eq!(allocations(|| drop(std::hint::black_box(vec![1u8; 100]))), 1);
    let mut v: Vec<u32> = Vec::new();
    assert!(allocations(|| v.extend(0..1000)) >= 1);
    assert_eq!(allocations(|| assert_eq!(std::hint::black_box([3u64; 8]).iter().sum::<u64>(), 24)), 0);
}

/// Target/draft pairs that exercise every branch of the walks: random pairs (with zeros),
/// disjoint supports (every draft rejected, residual = p), `p = q`, one-hot `p` (temperature
/// 0), a `q` whose support is smaller than the drafts asked for, and that `q` as `p` too
/// (drafts accepted often, whatever the verifier).
fn pairs(v: usize) -> Vec<(Vec<f64>, Vec<f64>)> {
    let mut r = common::rng(7);
    let mut out: Vec<(Vec<f64>, Vec<f64>)> = (0..4)
        .map(|k| (common::random_dist(&mut r, v, k % 2 == 1), common::random_dist(&mut r, v, k % 2 == 0)))
        .collect();
    let half =
        |lo: bool| -> Vec<f64> { (0..v).map(|i| if (i < v / 2) == lo { 2.0 / v as f64 } else { 0.0 }).collect() };
    out.push((half(true), half(false)));
    let same = common::random_dist(&mut r, v, false);
    out.push((same.clone(), same));
    out.push((common::one_hot(v, 3), common::random_dist(&mut r, v, false)));
    let mut narrow = vec![0.0; v];
    narrow[1] = 0.75;
    narrow[v - 1] = 0.25;
    out.push((common::random_dist(&mut r, v, false), narrow.clone()));
    out.push((narrow.clone(), narrow));
    out
}

/// Every valid construction and verifier pair, for every draft count, draws and verifies
/// with no allocation once the scratch buffers have served one round of the same inputs
/// (vocabulary 4,096; 40 draws per case and round).
#[test]
fn drafting_and_verification_allocate_nothing_once_warm() {
    let v = 4096;
    let cases = pairs(v);
    let mut rng = common::rng(11);
    for &(construction, verifier) in VALID_PAIRS {
        for n in 1..=4 {
            if construction.check_n(n).is_err() {
                continue;
            }
            let mut draft_scratch = DraftScratch::default();
            let mut verify_scratch = VerifyScratch::default();
            let mut drafts: Vec<TokenId> = Vec::new();
            let mut round = |rng: &mut rand::rngs::StdRng| {
                let mut accepted = 0usize;
                for (p, q) in &cases {
                    for _ in 0..40 {
                        construction.sample(q, n, rng, &mut draft_scratch, &mut drafts).unwrap();
                        let verdict =
                            verifier.verify(construction, n, p, q, &drafts, rng, &mut verify_scratch).unwrap();
                        accepted += verdict.accepted.is_some() as usize;
                    }
                }
                accepted
            };
            round(&mut rng);
            let mut accepted = 0;
            let count = allocations(|| accepted = round(&mut rng));
            assert_eq!(count, 0, "{construction}+{verifier}, n = {n}: {count} allocations in a warm round");
            assert!(accepted > 0, "{construction}+{verifier}, n = {n}: no draft accepted (the walk was not run)");
        }
    }
}

/// The deterministic-draft verifier (n-gram lookup drafts), warm, allocates nothing.
#[test]
fn deterministic_verification_allocates_nothing_once_warm() {
    let v = 4096;
    let cases = pairs(v);
    let mut rng = common::rng(12);
    let mut scratch = VerifyScratch::default();
    let drafts: Vec<Vec<TokenId>> = vec![vec![3], vec![1, 2, 3, 4], vec![(v - 1) as TokenId, 0]];
    let mut round = |rng: &mut rand::rngs::StdRng| {
        let mut tokens = 0u64;
        for (p, _) in &cases {
            for d in &drafts {
                for _ in 0..40 {
                    tokens += samplers::verify_deterministic(p, d, rng, &mut scratch).unwrap().token as u64;
                }
            }
        }
        tokens
    };
    round(&mut rng);
    let mut tokens = 0;
    let count = allocations(|| tokens = round(&mut rng));
    assert_eq!(count, 0, "verify_deterministic: {count} allocations in a warm round");
    assert!(tokens > 0);
}

/// Warping logits with every truncation, once `out` (and the thread's bucket buffer) have
/// grown, allocates nothing; neither do positional draws (their races live on the stack).
#[test]
fn warping_and_positional_draws_allocate_nothing_once_warm() {
    let v = 151_936;
    let mut r = common::rng(13);
    let logits: Vec<f32> = (0..v).map(|_| r.random::<f32>() * 20.0 - 10.0).collect();
    let warps = [
        Warp::temperature(0.0),
        Warp::temperature(0.7),
        Warp { temperature: 1.0, top_k: 50, top_p: 1.0, min_p: 0.0 },
        Warp { temperature: 0.8, top_k: 0, top_p: 0.9, min_p: 0.0 },
        Warp { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.05 },
        Warp { temperature: 0.6, top_k: 40, top_p: 0.95, min_p: 0.02 },
    ];
    let mut out: Vec<f64> = Vec::new();
    let round = |out: &mut Vec<f64>| {
        let mut mass = 0.0;
        for w in &warps {
            w.apply(&logits, out).unwrap();
            mass += out.iter().sum::<f64>();
        }
        mass
    };
    round(&mut out);
    let mut mass = 0.0;
    let count = allocations(|| mass = round(&mut out));
    assert_eq!(count, 0, "Warp::apply: {count} allocations in a warm round");
    assert!((mass - warps.len() as f64).abs() < 1e-6, "each warped vector sums to 1, total {mass}");

    let noise = PositionalNoise::new(5);
    let q = common::random_dist(&mut r, 4096, true);
    let mut tokens: Vec<TokenId> = Vec::with_capacity(8);
    let mut drawn = 0u64;
    let count = allocations(|| {
        for position in 0..200u64 {
            drawn += noise.sample(position, &q).unwrap() as u64;
            noise.top_k(position, &q, 8, &mut tokens).unwrap();
            drawn += tokens.len() as u64;
        }
    });
    assert_eq!(count, 0, "PositionalNoise: {count} allocations");
    assert!(drawn > 0);
}
