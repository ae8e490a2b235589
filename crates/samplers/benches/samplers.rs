//! Criterion benchmarks of the samplers crate (single thread):
//! alpha* of each construction, K-SEQ's rho, one verification of each verifier, and the
//! positional races of `--reproducible`, on
//! LLM-like distributions of vocabulary 151,936 (Qwen) and 32,000 (LLaMA), n in {2, 3, 4, 8}.
//!
//! `cargo bench -p samplers --bench samplers` (results: docs/results/README.md#const-bench-samplers).

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use rand::rngs::StdRng;
use rand::SeedableRng;
use samplers::construction::DraftScratch;
use samplers::{alpha, DraftConstruction as C, Verifier as V, VerifyScratch};
use std::time::Duration;

#[path = "common/pairs.rs"]
mod pairs;
use pairs::model_like_pair;

fn alpha_star(c: &mut Criterion) {
    for vocab in [151_936usize, 32_000] {
        let (p, q) = model_like_pair(vocab, 1);
        let mut g = c.benchmark_group(format!("alpha_star/V={vocab}"));
        g.sample_size(20).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
        for n in [2usize, 3, 4, 8] {
            for (name, cons) in [
                ("wr", C::WithReplacement),
                ("greedy", C::Greedy),
                ("cps", C::ConditionalPoisson),
                ("wor", C::WithoutReplacement),
            ] {
                g.bench_with_input(BenchmarkId::new(name, n), &n, |b, &n| {
                    b.iter(|| alpha::alpha_star(cons, black_box(&p), black_box(&q), n).unwrap())
                });
            }
            g.bench_with_input(BenchmarkId::new("kseq", n), &n, |b, &n| {
                b.iter(|| alpha::alpha_kseq(black_box(&p), black_box(&q), n))
            });
        }
        g.finish();
    }
}

fn verification(c: &mut Criterion) {
    let pairs = [
        ("rrs-wr", C::WithReplacement, V::Rrs),
        ("kseq", C::WithReplacement, V::KSeq),
        ("rrs-wor", C::WithoutReplacement, V::Rrs),
        ("greedy", C::Greedy, V::Greedy),
        ("spechub", C::SpecHub, V::SpecHub),
        ("topk", C::TopK, V::TopK),
    ];
    for vocab in [151_936usize, 32_000] {
        let (p, q) = model_like_pair(vocab, 2);
        let mut g = c.benchmark_group(format!("verify/V={vocab}"));
        g.sample_size(20).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
        for n in [2usize, 3, 4, 8] {
            for (name, cons, ver) in pairs {
                if cons.check_n(n).is_err() {
                    continue;
                }
                // 64 draft tuples from the construction, verified in turn.
                let mut r = StdRng::seed_from_u64(n as u64);
                let mut ds = DraftScratch::default();
                let tuples: Vec<Vec<u32>> = (0..64)
                    .map(|_| {
                        let mut t = Vec::new();
                        cons.sample(&q, n, &mut r, &mut ds, &mut t).unwrap();
                        t
                    })
                    .collect();
                let mut vs = VerifyScratch::default();
                let mut k = 0;
                g.bench_with_input(BenchmarkId::new(name, n), &n, |b, &n| {
                    b.iter(|| {
                        k = (k + 1) % tuples.len();
                        ver.verify(cons, n, black_box(&p), black_box(&q), &tuples[k], &mut r, &mut vs).unwrap()
                    })
                });
            }
        }
        g.finish();
    }
}

/// Positional races (`--reproducible`): the target's token (one race over the vocabulary) and a
/// node's `n` drafts (the `n` best races), and for scale one inverse-CDF draw of the stream
/// sampler on the same `p`.
fn positional(c: &mut Criterion) {
    for vocab in [151_936usize, 32_000] {
        let (p, q) = model_like_pair(vocab, 3);
        let noise = samplers::PositionalNoise::new(1);
        let mut g = c.benchmark_group(format!("positional/V={vocab}"));
        g.sample_size(20).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
        let mut pos = 0u64;
        g.bench_function("sample", |b| {
            b.iter(|| {
                pos += 1;
                noise.sample(pos, black_box(&p)).unwrap()
            })
        });
        let mut out = Vec::new();
        for n in [1usize, 2, 4, 8] {
            g.bench_with_input(BenchmarkId::new("top_k", n), &n, |b, &n| {
                b.iter(|| {
                    pos += 1;
                    noise.top_k(pos, black_box(&q), n, &mut out).unwrap()
                })
            });
        }
        let mut r = StdRng::seed_from_u64(4);
        g.bench_function("stream_sample", |b| b.iter(|| samplers::dist::sample(black_box(&p), &mut r)));
        // After top-p: the 64 most probable tokens, renormalised, the rest zero.
        let mut top = Vec::new();
        samplers::dist::top_k_support(&p, 64, &mut top);
        let mut sparse = vec![0.0; vocab];
        top.iter().for_each(|&t| sparse[t as usize] = p[t as usize]);
        let total: f64 = sparse.iter().sum();
        sparse.iter_mut().for_each(|x| *x /= total);
        g.bench_function("sample_64_tokens", |b| {
            b.iter(|| {
                pos += 1;
                noise.sample(pos, black_box(&sparse)).unwrap()
            })
        });
        g.bench_function("stream_sample_64_tokens", |b| b.iter(|| samplers::dist::sample(black_box(&sparse), &mut r)));
        g.finish();
    }
}

/// `Warp::apply`: logits to the warped target distribution, what verification does at every
/// node on the accepted path and drafting at every expanded node: temperature alone, with
/// top-p 0.9 and 0.95, with top-k 50, and temperature 0 (an argmax).
fn warp(c: &mut Criterion) {
    for vocab in [151_936usize, 32_000] {
        let (p, _) = model_like_pair(vocab, 4);
        let logits: Vec<f32> = p.iter().map(|&x| x.ln() as f32).collect();
        let mut g = c.benchmark_group(format!("warp/V={vocab}"));
        g.sample_size(20).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
        let mut out = Vec::new();
        let warps = [
            ("t0.7", samplers::dist::Warp::temperature(0.7)),
            ("t0.7_top_p0.9", samplers::dist::Warp { top_p: 0.9, ..samplers::dist::Warp::temperature(0.7) }),
            ("t1_top_p0.95", samplers::dist::Warp { top_p: 0.95, ..samplers::dist::Warp::temperature(1.0) }),
            ("t0.7_top_k50", samplers::dist::Warp { top_k: 50, ..samplers::dist::Warp::temperature(0.7) }),
            ("t0", samplers::dist::Warp::temperature(0.0)),
        ];
        for (name, w) in warps {
            g.bench_function(name, |b| b.iter(|| w.apply(black_box(&logits), &mut out).unwrap()));
        }
        g.finish();
    }
}

/// One draft tuple from each construction (the drafting of one tree node).
fn drafting(c: &mut Criterion) {
    for vocab in [151_936usize, 32_000] {
        let (_, q) = model_like_pair(vocab, 4);
        let mut g = c.benchmark_group(format!("draft/V={vocab}"));
        g.sample_size(20).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
        for n in [2usize, 4] {
            for (name, cons) in [
                ("wr", C::WithReplacement),
                ("wor", C::WithoutReplacement),
                ("greedy", C::Greedy),
                ("cps", C::ConditionalPoisson),
            ] {
                let mut r = StdRng::seed_from_u64(n as u64);
                let (mut ds, mut out) = (DraftScratch::default(), Vec::new());
                g.bench_with_input(BenchmarkId::new(name, n), &n, |b, &n| {
                    b.iter(|| cons.sample(black_box(&q), n, &mut r, &mut ds, &mut out).unwrap())
                });
            }
        }
        g.finish();
    }
}

criterion_group!(benches, alpha_star, verification, positional, warp, drafting);
criterion_main!(benches);
