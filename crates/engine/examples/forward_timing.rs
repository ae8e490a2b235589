//! Times one forward of t new tokens after a 64-token prefix, for t in 1..=32.
//! `forward_timing MODEL.gguf [stored|fast|f32] [T]`: with T, only t = T, 40 repetitions
//! (for profiling). Best of the repetitions per part; the median of the whole forward too;
//! with `EACH` set, every repetition's time on stderr.
use candle_core::{DType, Device};
use engine::load::{load, LoadOptions};
use engine::model::causal_bias;
use std::time::Instant;
fn main() {
    let path = std::path::PathBuf::from(std::env::args().nth(1).expect("model path"));
    let weights = match std::env::args().nth(2).as_deref() {
        Some("fast") => engine::load::gguf::WeightFormat::FastCpu,
        Some("f32") => engine::load::gguf::WeightFormat::Dequantized,
        _ => engine::load::gguf::WeightFormat::AsStored,
    };
    let m = load(&path, &Device::Cpu, &LoadOptions { weights, ..Default::default() }).unwrap().model;
    let prefix: Vec<u32> = (0..64).map(|i| 100 + i).collect();
    let mut cache = m.new_cache(256).unwrap();
    let bias = causal_bias(0, 64, DType::F32, &Device::Cpu).unwrap();
    let pos: Vec<u32> = (0..64).collect();
    m.forward(&prefix, &pos, &bias, &mut cache).unwrap();
    let only: Option<usize> = std::env::args().nth(3).and_then(|s| s.parse().ok());
    let ts: Vec<usize> = match only {
        Some(t) => vec![t],
        None => vec![1, 2, 4, 5, 8, 16, 26, 32],
    };
    for t in ts {
        let toks: Vec<u32> = (0..t as u32).map(|i| 500 + i).collect();
        let pos: Vec<u32> = (64..64 + t as u32).collect();
        let bias = causal_bias(64, t, DType::F32, &Device::Cpu).unwrap();
        let reps =
            if only.is_some() { std::env::var("REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(150) } else { 5 };
        let mut best = f64::MAX;
        let mut best_lm = f64::MAX;
        let mut totals = Vec::with_capacity(reps);
        for _ in 0..reps {
            cache.truncate(64);
            let s = Instant::now();
            let h = m.forward(&toks, &pos, &bias, &mut cache).unwrap();
            let el = s.elapsed().as_secs_f64();
            let s = Instant::now();
            let l = m.logits(&h).unwrap();
            let _ = l.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let lm = s.elapsed().as_secs_f64();
            best_lm = best_lm.min(lm);
            best = best.min(el);
            totals.push(el + lm);
            if std::env::var_os("EACH").is_some() {
                eprintln!("{:.3} ms", (el + lm) * 1e3);
            }
        }
        totals.sort_by(f64::total_cmp);
        println!(
            "t={t:3} body {:7.1} ms  lm_head {:6.1} ms  total/t {:6.1} ms  (median total {:6.1} ms)",
            best * 1e3,
            best_lm * 1e3,
            (best + best_lm) * 1e3 / t as f64,
            totals[totals.len() / 2] * 1e3
        );
    }
}
