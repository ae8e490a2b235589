//! Model-like probability pairs shared by the criterion benchmarks and the profiling example.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Target and draft distributions shaped like a real model pair: shared Gaussian logits
/// (sd 2.5) plus independent noise (sd 1) and five boosted head tokens, softmax at T = 1.
pub fn model_like_pair(vocab: usize, seed: u64) -> (Vec<f64>, Vec<f64>) {
    let mut r = StdRng::seed_from_u64(seed);
    let mut gauss = move || {
        let (u, v): (f64, f64) = (r.random::<f64>().max(1e-300), r.random());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    };
    let base: Vec<f64> = (0..vocab).map(|_| 2.5 * gauss()).collect();
    let mut t: Vec<f64> = base.iter().map(|b| b + gauss()).collect();
    let mut d: Vec<f64> = base.iter().map(|b| b + gauss()).collect();
    for k in 0..5 {
        let i = (k * 7919 + 13) % vocab;
        t[i] += 12.0;
        d[i] += 11.0;
    }
    let softmax = |x: Vec<f64>| {
        let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.into_iter().map(|v| v / s).collect::<Vec<f64>>()
    };
    (softmax(t), softmax(d))
}
