//! Criterion benchmark of the repetition penalties of one row (`engine::decode::penalties`: apply, then
//! restore, what `--repetition-penalty` and friends add per tree node) against the softmax the
//! verifier computes at every node anyway (`Warp::apply` at temperature 0.7), on a row of
//! 151,936 logits (Qwen2.5's vocabulary), after a 1,000-token prompt and 256 generated tokens,
//! with a drafted path of 4.
//!
//! `cargo bench -p engine --bench penalties` (results: docs/results/README.md#const-bench-penalties).

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use engine::decode::penalties::{Penalties, PenaltyState};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use samplers::dist::Warp;
use std::time::Duration;

fn penalties(c: &mut Criterion) {
    const VOCAB: usize = 151_936;
    let mut rng = StdRng::seed_from_u64(1);
    let mut logits: Vec<f32> = (0..VOCAB).map(|_| rng.random::<f32>() * 4.0 - 8.0).collect();
    // Text-like ids: most from a few thousand common tokens.
    let mut token =
        || if rng.random::<f32>() < 0.9 { rng.random_range(0..5_000) } else { rng.random_range(0..VOCAB as u32) };
    let prompt: Vec<u32> = (0..1_000).map(|_| token()).collect();
    let text: Vec<u32> = (0..256).map(|_| token()).collect();
    let path: Vec<u32> = (0..4).map(|_| token()).collect();
    let mut state = PenaltyState::default();
    state.start(Penalties { repetition: 1.1, presence: 0.5, frequency: 0.5 }, VOCAB, &prompt);
    state.push(&text);
    let mut g = c.benchmark_group("penalties/V=151936");
    g.sample_size(30).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
    g.bench_function("apply_restore", |b| {
        b.iter(|| {
            state.apply(black_box(&mut logits), black_box(&path));
            state.restore(&mut logits);
        })
    });
    let mut p = Vec::new();
    g.bench_function("warp_t0.7", |b| b.iter(|| Warp::temperature(0.7).apply(black_box(&logits), &mut p).unwrap()));
    g.finish();
}

criterion_group!(benches, penalties);
criterion_main!(benches);
