//! Times, on one model, a forward of one sequence of t rows against `forward_batch` of t
//! sequences of one row each (after 64-token prefixes), and the logits of t rows.
//! `batch_timing MODEL.gguf [T...]` (default T = 1 2 4 8 16). Median of 20 repetitions.
use candle_core::{DType, Device};
use engine::load::{load, LoadOptions};
use engine::model::{causal_bias, BatchItem};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let path = std::path::PathBuf::from(std::env::args().nth(1).expect("model path"));
    let ts: Vec<usize> = std::env::args().skip(2).filter_map(|s| s.parse().ok()).collect();
    let ts = if ts.is_empty() { vec![1, 2, 4, 8, 16] } else { ts };
    let opts = LoadOptions { weights: engine::load::gguf::WeightFormat::FastCpu, ..Default::default() };
    let m = load(&path, &Device::Cpu, &opts).unwrap().model;
    let prefix: Vec<u32> = (0..64).map(|i| 100 + i).collect();
    let pos: Vec<u32> = (0..64).collect();
    let pbias = causal_bias(0, 64, DType::F32, &Device::Cpu).unwrap();
    let max_t = *ts.iter().max().unwrap();
    let mut caches: Vec<_> = (0..max_t)
        .map(|_| {
            let mut c = m.new_cache(256).unwrap();
            m.forward(&prefix, &pos, &pbias, &mut c).unwrap();
            c
        })
        .collect();
    for &t in &ts {
        let toks: Vec<u32> = (0..t as u32).map(|i| 500 + i).collect();
        let tpos: Vec<u32> = (64..64 + t as u32).collect();
        let bias = causal_bias(64, t, DType::F32, &Device::Cpu).unwrap();
        let one_bias = causal_bias(64, 1, DType::F32, &Device::Cpu).unwrap();
        let (mut chain, mut batch, mut logits) = (vec![], vec![], vec![]);
        for _ in 0..20 {
            let c = &mut caches[0];
            let s = Instant::now();
            let h = m.forward(&toks, &tpos, &bias, c).unwrap();
            chain.push(s.elapsed().as_secs_f64());
            c.truncate(64);
            let s = Instant::now();
            m.logits(&h).unwrap();
            logits.push(s.elapsed().as_secs_f64());
            let one_tok = [500u32];
            let one_pos = [64u32];
            let mut items: Vec<BatchItem> = caches[..t]
                .iter_mut()
                .map(|cache| BatchItem { tokens: &one_tok, positions: &one_pos, bias: &one_bias, cache })
                .collect();
            let s = Instant::now();
            m.forward_batch(&mut items).unwrap();
            batch.push(s.elapsed().as_secs_f64());
            drop(items);
            caches[..t].iter_mut().for_each(|c| c.truncate(64));
        }
        println!(
            "t={t:2}: one sequence of t rows {:.2} ms, t sequences of one row {:.2} ms, logits of t rows {:.2} ms",
            1e3 * median(chain),
            1e3 * median(batch),
            1e3 * median(logits)
        );
    }
}
