//! Several sequences in one forward (`DecoderModel::forward_batch`) and generations batched
//! across threads (`Batcher`): every sequence gets, bit for bit, what it gets alone, so batched
//! generations emit their solo tokens at any temperature (each keeps its own random stream);
//! the same for EAGLE head forwards (`EagleHead::forward_batch`) and generations drafting with a head.

use crate::common::{self, load_cpu, temp_dir, Tiny};
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Tensor};
use engine::decode::{GenerationConfig, Generator, Randomness, TreeChoice};
use engine::model::eagle::HeadItem;
use engine::model::{attention_bias, causal_bias, BatchItem, Batcher, DecoderModel, KvCache};
use engine::DraftTree;
use samplers::dist::Warp;
use samplers::{DraftConstruction, Verifier};

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// A cache holding `prefix` run as a chain.
fn cache_after(model: &DecoderModel, prefix: &[u32]) -> KvCache {
    let mut cache = model.new_cache(64).unwrap();
    model.forward_chain(prefix, &mut cache).unwrap();
    cache
}

/// Three sequences at once (a chain, a draft tree over its own prefix, one token): each one's
/// hidden states and cache equal what its forward alone gives, bit for bit, for a dense model
/// and for Q4_K weights (our few-rows and repacked kernels) and Q8_0.
#[test]
fn a_batched_forward_gives_each_sequence_its_own_forward() {
    let dir = temp_dir("batch-forward");
    let wide = Tiny { hidden: 256, intermediate: 256, scale: 0.1, ..Tiny::qwen2(41) };
    let files = [
        ("f32 hf", Tiny::llama(40).write_hf(&dir.join("hf"))),
        ("q4k gguf", wide.write_gguf(&dir.join("q4k.gguf"), GgmlDType::Q4K, &[])),
        ("q8_0 gguf", Tiny::llama(42).write_gguf(&dir.join("q8.gguf"), GgmlDType::Q8_0, &[])),
    ];
    for (name, path) in files {
        let m = load_cpu(&path);
        let tree = DraftTree::preset("drafts-2-depth-2").unwrap();
        let prefixes: [&[u32]; 3] = [&[1, 2, 3], &[9, 8, 7, 6, 5], &[4]];
        let new: [Vec<u32>; 3] = [vec![11, 12], (0..tree.len() as u32).map(|i| 20 + i).collect(), vec![30]];
        let positions: [Vec<u32>; 3] =
            [vec![3, 4], (0..tree.len()).map(|i| (5 + tree.depth(i)) as u32).collect(), vec![1]];
        let biases = [
            causal_bias(3, 2, m.dtype(), m.device()).unwrap(),
            attention_bias(5, tree.len(), tree.len(), |r, c| tree.is_ancestor_or_self(c, r), m.dtype(), m.device())
                .unwrap(),
            causal_bias(1, 1, m.dtype(), m.device()).unwrap(),
        ];
        let mut alone = Vec::new();
        let mut alone_caches = Vec::new();
        for i in 0..3 {
            let mut cache = cache_after(&m, prefixes[i]);
            alone.push(m.forward(&new[i], &positions[i], &biases[i], &mut cache).unwrap());
            alone_caches.push(cache);
        }
        let mut caches: Vec<KvCache> = prefixes.iter().map(|p| cache_after(&m, p)).collect();
        let mut items: Vec<BatchItem> = caches
            .iter_mut()
            .enumerate()
            .map(|(i, cache)| BatchItem { tokens: &new[i], positions: &positions[i], bias: &biases[i], cache })
            .collect();
        let together = m.forward_batch(&mut items).unwrap();
        for i in 0..3 {
            assert_eq!(bits(&together[i]), bits(&alone[i]), "{name}: sequence {i}'s hidden states");
            assert_eq!(caches[i].len(), alone_caches[i].len());
            for l in 0..m.num_layers() {
                assert_eq!(bits(&caches[i].keys(l).unwrap()), bits(&alone_caches[i].keys(l).unwrap()), "{name}: keys");
                assert_eq!(bits(&caches[i].values(l).unwrap()), bits(&alone_caches[i].values(l).unwrap()), "{name}");
            }
        }
        // A sequence that cannot run is named; the batch does not run at all.
        let mut bad_cache = m.new_cache(2).unwrap();
        let mut ok_cache = m.new_cache(8).unwrap();
        let b = causal_bias(0, 3, m.dtype(), m.device()).unwrap();
        let e = m
            .forward_batch(&mut [
                BatchItem { tokens: &[1, 2, 3], positions: &[0, 1, 2], bias: &b, cache: &mut ok_cache },
                BatchItem { tokens: &[1, 2, 3], positions: &[0, 1, 2], bias: &b, cache: &mut bad_cache },
            ])
            .unwrap_err();
        assert!(e.to_string().contains("capacity"), "{e}");
    }
}

/// A generation of 24 tokens at `temperature` with `seed`, drafting greedily on the preset
/// `tree` (`none`: plain decoding; `auto`: chosen each step, with positional randomness, which
/// makes the text independent of the trees; otherwise stream sampling).
fn tree_config(tree: &str, temperature: f64, seed: u64) -> GenerationConfig {
    let construction = (DraftConstruction::Greedy, Verifier::Greedy);
    let speculative = match tree {
        "none" => None,
        "auto" => Some(common::spec(TreeChoice::Auto, construction.0, construction.1, None, 0.0)),
        _ => Some(common::spec(DraftTree::preset(tree).unwrap(), construction.0, construction.1, None, 0.0)),
    };
    let randomness = if tree == "auto" { Randomness::Positional } else { Randomness::Stream };
    GenerationConfig {
        speculative,
        randomness,
        ..GenerationConfig { warp: Warp::temperature(temperature), ..common::greedy(24, seed) }
    }
}

/// Generations on five threads, members of one batcher, each with its own prompt, tree and
/// seed: each emits what it emits alone, at temperature 0 and at 0.8 (stream sampling: each its
/// own random stream), with a draft model on trees and plain; and the batcher did batch them.
/// The fifth chooses its trees (`auto`, knowing the batch) with
/// positional randomness, which makes its text independent of the trees.
#[test]
fn batched_generations_emit_their_solo_tokens() {
    let (target, draft, _) = common::target_draft_head(43, "batch-generate");
    let prompts: [Vec<u32>; 5] =
        [vec![3, 9, 27], vec![4, 12, 36, 9, 27, 30], vec![1], vec![5, 6, 7, 8, 9, 10, 11], vec![2, 4, 8, 16]];
    for temperature in [0.0, 0.8] {
        let config = |i: usize| {
            let tree = ["chain-3", "drafts-2-depth-2", "mc_sim_7b_63", "none", "auto"][i];
            tree_config(tree, temperature, 100 + i as u64)
        };
        let solo: Vec<Vec<u32>> = (0..5)
            .map(|i| {
                let mut g = Generator::new(&target, Some(&draft), 100).unwrap();
                g.generate(&prompts[i], &config(i), |_| false, |_| Ok(())).unwrap().0
            })
            .collect();
        let batcher = Batcher::new();
        let together: Vec<Vec<u32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..5)
                .map(|i| {
                    let (batcher, target, draft, prompt, config) = (&batcher, &target, &draft, &prompts[i], config(i));
                    s.spawn(move || {
                        let _member = batcher.join();
                        let mut g = Generator::new(target, Some(draft), 100).unwrap();
                        g.generate(prompt, &config, |_| false, |_| Ok(())).unwrap().0
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(together, solo, "temperature {temperature}");
        let stats = batcher.stats();
        assert!(stats.widest >= 2 && stats.requests > stats.batches, "temperature {temperature}: {stats:?}");
    }
}

/// Prompts arriving together are prefilled one at a time, in order (`engine::model::Prefilling`),
/// while their generations are members of one batch: no batch holds two prompts' chunks, every
/// prompt's chunks still run batched beside the others' work, and each generation emits its solo
/// tokens.
#[test]
fn prompts_arriving_together_are_prefilled_one_at_a_time() {
    let (target, draft, _) = common::target_draft_head(44, "batch-prefill");
    // 150 tokens each: several prefill chunks per prompt in a batch.
    let prompts: Vec<Vec<u32>> = (0..4u32).map(|k| (0..150).map(|i| (i * (k + 3) + k) % 40 + 1).collect()).collect();
    let config = |i: usize| {
        let spec = i.is_multiple_of(2).then(|| {
            common::spec(DraftTree::preset("chain-2").unwrap(), DraftConstruction::Greedy, Verifier::Greedy, None, 0.0)
        });
        GenerationConfig { speculative: spec, ..common::greedy(6, 7 + i as u64) }
    };
    let solo: Vec<Vec<u32>> = (0..4)
        .map(|i| {
            Generator::new(&target, Some(&draft), 200)
                .unwrap()
                .generate(&prompts[i], &config(i), |_| false, |_| Ok(()))
                .unwrap()
                .0
        })
        .collect();
    let batcher = Batcher::new();
    let all_joined = std::sync::Barrier::new(4);
    let together: Vec<Vec<u32>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let (batcher, all_joined, target, draft, prompt, config) =
                    (&batcher, &all_joined, &target, &draft, &prompts[i], config(i));
                s.spawn(move || {
                    let _member = batcher.join();
                    let mut g = Generator::new(target, Some(draft), 200).unwrap();
                    all_joined.wait();
                    g.generate(prompt, &config, |_| false, |_| Ok(())).unwrap().0
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, solo);
    let stats = batcher.stats();
    assert_eq!(stats.prefills_together, 1, "{stats:?}");
    assert!(stats.widest >= 2, "nothing ran batched: {stats:?}");
}

/// `f32` features `[n, hidden]` that differ from row to row and with `seed`.
fn features(target: &DecoderModel, n: usize, seed: f64) -> Tensor {
    let h = target.config().hidden_size;
    Tensor::arange(0f32, (n * h) as f32, target.device())
        .unwrap()
        .affine(0.013, seed)
        .unwrap()
        .sin()
        .unwrap()
        .reshape((n, h))
        .unwrap()
        .to_dtype(target.dtype())
        .unwrap()
}

/// Three sequences' entries in one EAGLE head forward (two entries after a prompt's, a tree
/// level of two siblings, one entry), with the target's whole output layer and with a cut of
/// it: each one's outputs, cache and logits equal what it gets alone, bit for bit, whether
/// through `EagleHead::forward_batch` or from threads of one batcher, where the three head
/// forwards ran as one and so did the three logits products, while a fourth member whose
/// cache had no room got its own error.
#[test]
fn a_batched_head_forward_gives_each_sequence_its_own_forward() {
    let (target, _, whole) = common::target_draft_head(45, "batch-head");
    let mut cut = whole.clone();
    cut.set_output_rows(&target, 16).unwrap();
    let (dtype, dev) = (target.dtype(), target.device().clone());
    let prefix = [3usize, 5, 1];
    let new_tokens: [Vec<u32>; 3] = [vec![11, 12], vec![20, 21], vec![30]];
    let positions: [Vec<u32>; 3] = [vec![3, 4], vec![5, 5], vec![1]];
    let biases = [
        causal_bias(3, 2, dtype, &dev).unwrap(),
        attention_bias(5, 2, 2, |r, c| r == c, dtype, &dev).unwrap(),
        causal_bias(1, 1, dtype, &dev).unwrap(),
    ];
    let new_features: Vec<Tensor> = (0..3).map(|i| features(&target, new_tokens[i].len(), 10.0 + i as f64)).collect();
    for (name, head) in [("whole output layer", &whole), ("cut output layer", &cut)] {
        // Sequence `i`'s head cache after its prefix's entries, with room for `room` more.
        let cache_with_room = |i: usize, room: usize| {
            let n = prefix[i];
            let mut cache = head.new_cache(n + room).unwrap();
            let tokens: Vec<u32> = (0..n as u32).map(|j| (j * 7 + i as u32) % 40 + 1).collect();
            let pos: Vec<u32> = (0..n as u32).collect();
            let bias = causal_bias(0, n, dtype, &dev).unwrap();
            head.forward(&target, &features(&target, n, i as f64), &tokens, &pos, &bias, &mut cache).unwrap();
            cache
        };
        let cache_after = |i: usize| cache_with_room(i, 64);
        let mut alone = Vec::new();
        let mut alone_logits = Vec::new();
        let mut alone_caches = Vec::new();
        for i in 0..3 {
            let mut cache = cache_after(i);
            let out =
                head.forward(&target, &new_features[i], &new_tokens[i], &positions[i], &biases[i], &mut cache).unwrap();
            alone_logits.push(head.logits(&target, &out).unwrap());
            alone.push(out);
            alone_caches.push(cache);
        }
        let same_cache = |cache: &KvCache, i: usize, how: &str| {
            assert_eq!(cache.len(), alone_caches[i].len(), "{name}, {how}: sequence {i}'s cache length");
            assert_eq!(bits(&cache.keys(0).unwrap()), bits(&alone_caches[i].keys(0).unwrap()), "{name}, {how}: keys");
            assert_eq!(bits(&cache.values(0).unwrap()), bits(&alone_caches[i].values(0).unwrap()), "{name}, {how}");
        };
        let mut caches: Vec<KvCache> = (0..3).map(cache_after).collect();
        let mut items: Vec<HeadItem> = caches
            .iter_mut()
            .enumerate()
            .map(|(i, cache)| HeadItem {
                features: &new_features[i],
                tokens: &new_tokens[i],
                positions: &positions[i],
                bias: &biases[i],
                cache,
            })
            .collect();
        let together = head.forward_batch(&target, &mut items).unwrap();
        for i in 0..3 {
            assert_eq!(bits(&together[i]), bits(&alone[i]), "{name}: sequence {i}'s outputs");
            same_cache(&caches[i], i, "forward_batch");
        }
        let batcher = Batcher::new();
        // A fourth member, sequence 0 again with no room left in its cache: it gets its own
        // error, and the three others run as one.
        let all_joined = std::sync::Barrier::new(4);
        let mut threads: Vec<Result<(Tensor, Tensor, KvCache), String>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|k| {
                    let (batcher, all_joined, target, head) = (&batcher, &all_joined, &target, head);
                    let i = k % 3;
                    let (f, t, p, b) = (&new_features[i], &new_tokens[i], &positions[i], &biases[i]);
                    let mut cache = if k < 3 { cache_after(i) } else { cache_with_room(i, 0) };
                    s.spawn(move || {
                        let _member = batcher.join();
                        all_joined.wait();
                        let out = head.forward(target, f, t, p, b, &mut cache).map_err(|e| e.to_string())?;
                        let logits = head.logits(target, &out).unwrap();
                        Ok((out, logits, cache))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let Err(full) = threads.pop().unwrap() else { panic!("{name}: a forward into a full cache ran") };
        assert!(full.contains("capacity"), "{name}: {full}");
        let threads: Vec<_> = threads.into_iter().map(|t| t.unwrap()).collect();
        for (i, (out, logits, cache)) in threads.iter().enumerate() {
            assert_eq!(bits(out), bits(&alone[i]), "{name}, batcher: sequence {i}'s outputs");
            assert_eq!(bits(logits), bits(&alone_logits[i]), "{name}, batcher: sequence {i}'s logits");
            same_cache(cache, i, "batcher");
        }
        let stats = batcher.stats();
        assert_eq!(stats.head_widest, 3, "{name}: the head forwards did not run as one: {stats:?}");
        assert_eq!((stats.batches, stats.requests), (2, 6), "{name}: one forward and one logits product: {stats:?}");
    }
}

/// Generations drafting with an EAGLE head on four threads, members of one batcher, each with
/// its own prompt, tree and seed: each emits what it emits alone, at temperature 0 and at 0.8,
/// with the target's whole output layer and with a cut of it; and the head's forwards of
/// several members ran as one. Which members' head forwards meet in a batch depends on the
/// `auto` member's choices, which follow measured times: a run where the two drafting members
/// never met was seen once in CI (beside other tests), so the meeting is asked of the four
/// runs together (a head forward that bypasses the batcher never meets any).
#[test]
fn batched_eagle_generations_emit_their_solo_tokens() {
    let (target, _, whole) = common::target_draft_head(46, "batch-eagle");
    let mut cut = whole.clone();
    cut.set_output_rows(&target, 32).unwrap();
    let prompts: [Vec<u32>; 4] =
        [vec![3, 9, 27], vec![4, 12, 36, 9, 27, 30], vec![5, 6, 7, 8, 9, 10, 11], vec![2, 4, 8]];
    let mut head_widest = Vec::new();
    for (name, head) in [("whole output layer", &whole), ("cut output layer", &cut)] {
        for temperature in [0.0, 0.8] {
            let config = |i: usize| {
                let tree = ["chain-3", "drafts-2-depth-2", "none", "auto"][i];
                tree_config(tree, temperature, 200 + i as u64)
            };
            let solo: Vec<Vec<u32>> = (0..4)
                .map(|i| {
                    let mut g = Generator::with_eagle(&target, head, 100).unwrap();
                    g.generate(&prompts[i], &config(i), |_| false, |_| Ok(())).unwrap().0
                })
                .collect();
            let batcher = Batcher::new();
            let together: Vec<Vec<u32>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..4)
                    .map(|i| {
                        let (batcher, target, prompt, config) = (&batcher, &target, &prompts[i], config(i));
                        s.spawn(move || {
                            let _member = batcher.join();
                            let mut g = Generator::with_eagle(target, head, 100).unwrap();
                            g.generate(prompt, &config, |_| false, |_| Ok(())).unwrap().0
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert_eq!(together, solo, "{name}, temperature {temperature}");
            head_widest.push((name, temperature, batcher.stats()));
        }
    }
    assert!(head_widest.iter().any(|(_, _, s)| s.head_widest >= 2), "no batched head forward: {head_widest:?}");
}
