use candle_core::{DType, Device};
use engine::decode::{GenerationConfig, Generator, Randomness, SpecConfig};
use engine::load::{load, LoadOptions};
use engine::model::causal_bias;
use samplers::dist::Warp;
fn main() {
    let path = std::path::PathBuf::from(std::env::args().nth(1).unwrap());
    let t = load(&path, &Device::Cpu, &LoadOptions::default()).unwrap();
    let d = load(&path, &Device::Cpu, &LoadOptions { max_layers: Some(12), ..Default::default() }).unwrap();
    let ids = t.tokenizer.encode("The capital of France is").unwrap();
    let base = GenerationConfig {
        max_new_tokens: 30,
        warp: Warp::temperature(0.0),
        seed: 1,
        randomness: Randomness::Stream,
        speculative: None,
    };
    let mut g = Generator::new(&t.model, Some(&d.model), 256).unwrap();
    let (a, _) = g.generate(&ids, &base, |_| false, |_| Ok(())).unwrap();
    let spec = GenerationConfig {
        speculative: Some(SpecConfig {
            tree: engine::DraftTree::preset("chain-4").unwrap().into(),
            construction: samplers::DraftConstruction::Greedy,
            verifier: samplers::Verifier::Greedy,
            draft_warp: None,
            confidence_cutoff: 0.0,
            source: engine::decode::DraftSource::Model,
        }),
        ..base.clone()
    };
    let (b, _) = g.generate(&ids, &spec, |_| false, |_| Ok(())).unwrap();
    let k = a.iter().zip(&b).position(|(x, y)| x != y);
    println!("a={a:?}\nb={b:?}\nfirst diff {k:?}");
    if let Some(k) = k {
        let mut seq = ids.clone();
        seq.extend_from_slice(&a[..k]);
        {
            let mut cache = t.model.new_cache(256).unwrap();
            let mut l = vec![];
            for (i, &tok) in seq.iter().enumerate() {
                let bias = causal_bias(i, 1, DType::F32, &Device::Cpu).unwrap();
                let h = t.model.forward(&[tok], &[i as u32], &bias, &mut cache).unwrap();
                l = t.model.logits(&h).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            }
            println!("incremental: logit[{}]={} logit[{}]={}", a[k], l[a[k] as usize], b[k], l[b[k] as usize]);
        }
        for chunk in [seq.len(), 1] {
            let mut cache = t.model.new_cache(256).unwrap();
            let n = seq.len();
            let (pre, rest) = seq.split_at(n - chunk);
            if !pre.is_empty() {
                let bias = causal_bias(0, pre.len(), DType::F32, &Device::Cpu).unwrap();
                let pos: Vec<u32> = (0..pre.len() as u32).collect();
                t.model.forward(pre, &pos, &bias, &mut cache).unwrap();
            }
            let bias = causal_bias(pre.len(), rest.len(), DType::F32, &Device::Cpu).unwrap();
            let pos: Vec<u32> = (pre.len() as u32..n as u32).collect();
            let h = t.model.forward(rest, &pos, &bias, &mut cache).unwrap();
            let l = t
                .model
                .logits(&h.narrow(0, rest.len() - 1, 1).unwrap())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            println!("chunk {chunk}: logit[{}]={} logit[{}]={}", a[k], l[a[k] as usize], b[k], l[b[k] as usize]);
        }
    }
}
