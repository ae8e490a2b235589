//! Criterion benchmark of the log-probabilities of one generated token
//! (`engine::decode::logprobs::token_logprobs`, what `--logprobs N` adds per token) against the softmax
//! the verifier computes at every tree node anyway (`Warp::apply` at temperature 0.7), on a
//! row of 151,936 logits (Qwen2.5's vocabulary).
//!
//! `cargo bench -p engine --bench logprobs` (results: docs/results/README.md#const-bench-logprobs).

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use engine::decode::logprobs::{token_logprobs, TokenLogprobs};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use samplers::dist::Warp;
use std::time::Duration;

/// Logits shaped like a language model's: most tokens far below a few likely ones.
fn row(vocab: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(1);
    (0..vocab)
        .map(|i| {
            let base: f32 = rng.random::<f32>() * 4.0 - 8.0;
            if i % 9973 == 0 {
                base + 14.0
            } else {
                base
            }
        })
        .collect()
}

fn logprobs(c: &mut Criterion) {
    let logits = row(151_936);
    let mut g = c.benchmark_group("logprobs/V=151936");
    g.sample_size(30).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
    let mut out = TokenLogprobs::default();
    for top in [0usize, 5, 20] {
        g.bench_with_input(BenchmarkId::new("token_logprobs", top), &top, |b, &top| {
            b.iter(|| token_logprobs(black_box(&logits), 17, top, &mut out).unwrap())
        });
    }
    let mut p = Vec::new();
    g.bench_function("warp_apply_t0.7", |b| {
        b.iter(|| Warp::temperature(0.7).apply(black_box(&logits), &mut p).unwrap())
    });
    g.finish();
}

criterion_group!(benches, logprobs);
criterion_main!(benches);
