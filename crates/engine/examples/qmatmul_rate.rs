//! Multiply-adds per second of the repacked Q4_K and Q6_K products at 1 to 64 activation rows
//! on the thread pool (`RAYON_NUM_THREADS=1` for one core), for the default target's matrix
//! shapes, each product reading its matrix from memory (copies beyond the last-level cache):
//! where the CPU products stand against the core's integer peak.
//! `cargo run --release -p engine --example qmatmul_rate [ROWS,ROWS..]`; with `TILED=1` the
//! AVX-512 VNNI tiles ([`engine::kernels::quant::avx512`]) instead of the AVX2 layouts, with
//! `HOT=1` one copy (read from the caches: the kernel's arithmetic alone), with `ONLY=down` one
//! shape.
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use engine::kernels::quant::avx2::q4k::Q4KMatrix;
use engine::kernels::quant::avx2::q6k::Q6KMatrix;
use engine::kernels::quant::avx512::q4k::Q4KTiledMatrix;
use engine::kernels::quant::avx512::q6k::Q6KTiledMatrix;
use engine::kernels::quant::qgemv::{matmul_many, RowsWeight};
use std::time::Instant;
fn main() {
    let ms: Vec<usize> = std::env::args()
        .nth(1)
        .map_or(vec![1, 2, 4, 8, 16, 64], |a| a.split(',').map(|v| v.parse().expect("rows")).collect());
    // (name, n, k, type): gate and up joined, down, q/k/v joined, output layer (Q6_K).
    let shapes = [
        ("gate+up", 17920, 1536, GgmlDType::Q4K),
        ("down", 1536, 8960, GgmlDType::Q6K),
        ("qkv", 2048, 1536, GgmlDType::Q4K),
        ("output", 151936, 1536, GgmlDType::Q6K),
    ];
    let only = std::env::var("ONLY").ok();
    for (name, n, k, dtype) in shapes {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let w = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, dtype).unwrap();
        // Enough copies to exceed the last-level cache: each product reads its matrix from
        // memory, as a forward does.
        let bytes = q.storage_size_in_bytes();
        let hot = std::env::var("HOT").is_ok();
        let copies = if hot { 1 } else { (96 << 20) / bytes + 1 };
        let tiled = std::env::var("TILED").is_ok();
        let r4: Vec<Q4KMatrix> = (0..copies).filter_map(|_| Q4KMatrix::from_qtensor(&q).unwrap()).collect();
        let r6: Vec<Q6KMatrix> = (0..copies).filter_map(|_| Q6KMatrix::from_qtensor(&q).unwrap()).collect();
        let t4: Vec<Q4KTiledMatrix> = (0..copies).filter_map(|_| Q4KTiledMatrix::from_qtensor(&q).unwrap()).collect();
        let t6: Vec<Q6KTiledMatrix> = (0..copies).filter_map(|_| Q6KTiledMatrix::from_qtensor(&q).unwrap()).collect();
        let weights: Vec<RowsWeight> = if tiled {
            t4.iter().map(RowsWeight::Q4KTiled).chain(t6.iter().map(RowsWeight::Q6KTiled)).collect()
        } else {
            r4.iter().map(RowsWeight::Q4KInterleaved).chain(r6.iter().map(RowsWeight::Q6KInterleaved)).collect()
        };
        assert!(!weights.is_empty(), "no AVX2 on this CPU");
        let mut line = format!("{name:8} [{n}, {k}] {dtype:?}:");
        for &m in &ms {
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0).collect();
            let mut out = vec![0f32; m * n];
            let reps = (4_000_000_000 / (m * n * k)).clamp(3, 200);
            let best = (0..reps)
                .map(|i| {
                    let s = Instant::now();
                    matmul_many(&[weights[i % weights.len()]], &x, m, &mut [&mut out]).unwrap();
                    s.elapsed().as_secs_f64()
                })
                .fold(f64::MAX, f64::min);
            line += &format!("  m={m} {:.1}", (m * n * k) as f64 / best / 1e9);
        }
        println!("{line}  GMAC/s");
    }
}
