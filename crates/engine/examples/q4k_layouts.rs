//! Times the few-rows Q4_K products on the thread pool: ggml layout against the repacked
//! layout (both on the thread pool), 1 to 4 rows, a [35840, 1536] matrix (50 MB, from DRAM).
//! `cargo run --release -p engine --example q4k_layouts`
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use engine::kernels::quant::avx2::q4k::Q4KMatrix;
use engine::kernels::quant::qgemv::{matmul_many, RowsWeight};
use std::time::Instant;
fn main() {
    let (n, k) = (8960 * 4, 1536);
    let w = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&w, GgmlDType::Q4K).unwrap();
    let r = Q4KMatrix::from_qtensor(&q).unwrap().expect("AVX2 CPU");
    let blocks = (n * k / 256) as f64;
    for m in 1..=4usize {
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0).collect();
        let mut out = vec![0f32; m * n];
        let mut time = |w: RowsWeight| {
            (0..30)
                .map(|_| {
                    let s = Instant::now();
                    matmul_many(&[w], &x, m, &mut [&mut out]).unwrap();
                    s.elapsed().as_secs_f64()
                })
                .fold(f64::MAX, f64::min)
        };
        let (a, b) = (time(RowsWeight::Ggml(&q)), time(RowsWeight::Q4KInterleaved(&r)));
        println!(
            "m={m} ggml {:6.2} ns/block  repacked {:6.2} ns/block  ratio {:.2}",
            a * 1e9 / blocks,
            b * 1e9 / blocks,
            a / b
        );
    }
}
