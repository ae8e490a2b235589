//! EAGLE-1 draft heads on tiny random targets, written by the test in the checkpoint layouts
//! (`config.json` + `pytorch_model.bin` or `model.safetensors`) and loaded through the real
//! loader.

use crate::common;

use candle_core::Tensor;
use common::{load_on_test_device, max_diff, temp_dir, Tiny, TinyEagle};
use engine::model::eagle::EagleHead;
use engine::model::{attention_bias, causal_bias, DecoderModel};
use engine::DraftTree;

const PROMPT: [u32; 6] = [5, 17, 3, 40, 22, 9];

/// The target's final hidden states of `PROMPT` (`[6, hidden]`).
fn prompt_features(target: &DecoderModel) -> Tensor {
    let mut cache = target.new_cache(64).unwrap();
    let pos: Vec<u32> = (0..PROMPT.len() as u32).collect();
    let bias = causal_bias(0, PROMPT.len(), target.dtype(), target.device()).unwrap();
    target.forward(&PROMPT, &pos, &bias, &mut cache).unwrap()
}

/// Feeds the head the prompt's entries `(f_j, x_{j+1})` at positions `j`; returns the last
/// output (the feature of the tree's root) and the cache.
fn prefill(head: &EagleHead, target: &DecoderModel) -> (Tensor, engine::model::kv_cache::KvCache) {
    let f = prompt_features(target);
    let n = PROMPT.len() - 1;
    let mut cache = head.new_cache(64).unwrap();
    let pos: Vec<u32> = (0..n as u32).collect();
    let bias = causal_bias(0, n, target.dtype(), target.device()).unwrap();
    let out = head.forward(target, &f.narrow(0, 0, n).unwrap(), &PROMPT[1..], &pos, &bias, &mut cache).unwrap();
    (out.narrow(0, n - 1, 1).unwrap(), cache)
}

/// The same head from `pytorch_model.bin` and from `model.safetensors` gives the same outputs,
/// for a LLaMA target and a Qwen2 target (q/k/v biases), with and without its own embedding.
#[test]
fn head_loads_from_torch_bin_and_safetensors_alike() {
    for (arch, own_embedding) in [("llama", false), ("qwen2", true)] {
        let tiny = if arch == "llama" { Tiny::llama(61) } else { Tiny::qwen2(61) };
        let target = load_on_test_device(&tiny.write_hf(&temp_dir(&format!("eagle-target-{arch}"))));
        let spec = TinyEagle { target: tiny, seed: 62, own_embedding, scale: 0.3 };
        let bin = EagleHead::load(&spec.write(&temp_dir(&format!("eagle-bin-{arch}")), true), &target).unwrap();
        let st = EagleHead::load(&spec.write(&temp_dir(&format!("eagle-st-{arch}")), false), &target).unwrap();
        assert!(bin.path().ends_with("pytorch_model.bin") && st.path().ends_with("model.safetensors"));
        assert_eq!(bin.has_embedding(), own_embedding);
        let (a, _) = prefill(&bin, &target);
        let (b, _) = prefill(&st, &target);
        assert_eq!(a.dims(), &[1, tiny.hidden]);
        assert!(max_diff(&a, &b) < 1e-6, "{arch}: {}", max_diff(&a, &b));
        // q through the target's output layer is a distribution over the target's vocabulary.
        let q = target.logits(&a).unwrap();
        assert_eq!(q.dims(), &[1, tiny.vocab]);
    }
}

/// The head's output at every node of a draft tree, run level by level with the tree bias
/// (each node's feature being its parent's output), equals running the head on that node's
/// path alone after the same prefix.
#[test]
fn tree_outputs_equal_each_path_run_alone() {
    let tiny = Tiny::qwen2(63);
    let target = load_on_test_device(&tiny.write_hf(&temp_dir("eagle-tree-target")));
    let head = EagleHead::load(
        &TinyEagle { target: tiny, seed: 64, own_embedding: false, scale: 0.4 }.write(&temp_dir("eagle-tree"), false),
        &target,
    )
    .unwrap();
    let tree = DraftTree::preset("mc_sim_7b_63").unwrap();
    let token = |i: usize| ((i * 7 + 3) % tiny.vocab) as u32;
    let (root_feature, mut cache) = prefill(&head, &target);
    let base = cache.len();
    // The root is the last prompt token x_{n-1}; its entry (f_{n-2}, x_{n-1}) is the
    // prefill's last, at position n - 2.
    let root_pos = PROMPT.len() - 2;
    // Level by level: every node at depth d >= 1 is an entry (feature of its parent, its token).
    let mut out_of: Vec<Option<Tensor>> = vec![None; tree.len()];
    out_of[0] = Some(root_feature.clone());
    let mut fed: Vec<usize> = Vec::new();
    for level in tree.levels().iter().skip(1) {
        let nodes: Vec<usize> = level.clone().collect();
        let feats: Vec<Tensor> = nodes.iter().map(|&i| out_of[tree.parent(i).unwrap()].clone().unwrap()).collect();
        let feats = Tensor::cat(&feats, 0).unwrap();
        let tokens: Vec<u32> = nodes.iter().map(|&i| token(i)).collect();
        let pos: Vec<u32> = nodes.iter().map(|&i| (root_pos + tree.depth(i)) as u32).collect();
        fed.extend(&nodes);
        let bias = attention_bias(
            base,
            nodes.len(),
            fed.len(),
            |r, c| tree.is_ancestor_or_self(fed[c], nodes[r]),
            target.dtype(),
            target.device(),
        )
        .unwrap();
        let out = head.forward(&target, &feats, &tokens, &pos, &bias, &mut cache).unwrap();
        for (r, &i) in nodes.iter().enumerate() {
            out_of[i] = Some(out.narrow(0, r, 1).unwrap());
        }
    }
    let mut worst = 0f32;
    for (i, tree_out) in out_of.iter().enumerate().skip(1) {
        let (_, mut alone) = prefill(&head, &target);
        let mut feature = root_feature.clone();
        let mut last = None;
        for (d, &node) in tree.node_path(i).iter().enumerate().skip(1) {
            let pos = [(root_pos + d) as u32];
            let bias = causal_bias(alone.len(), 1, target.dtype(), target.device()).unwrap();
            let out = head.forward(&target, &feature, &[token(node)], &pos, &bias, &mut alone).unwrap();
            feature = out.clone();
            last = Some(out);
        }
        // Random heads fed their own outputs grow with depth (no norm): compare relatively.
        let last = last.unwrap();
        let scale = last.abs().unwrap().max_all().unwrap().to_dtype(candle_core::DType::F32).unwrap();
        let scale = scale.to_scalar::<f32>().unwrap().max(1.0);
        worst = worst.max(max_diff(&last, tree_out.as_ref().unwrap()) / scale);
    }
    // f32 on the CPU runs the same kernels for a level and for one row; elsewhere (cuBLAS
    // picks kernels by shape) and at bf16 (8 mantissa bits) rounding differs.
    let tol = match (target.dtype(), target.device().is_cpu()) {
        (candle_core::DType::F32, true) => 1e-5,
        (candle_core::DType::F32, false) => 1e-4,
        _ => 3e-2,
    };
    eprintln!("tree vs path alone: worst relative difference {worst:.3e} ({:?}, tolerance {tol:.0e})", target.dtype());
    assert!(worst < tol, "tree vs path-alone outputs differ by {worst} (relative, tolerance {tol})");
}

/// A head for another model (wrong hidden size), a head without `fc.weight`, and truncated
/// weight files are refused with a message naming the file and the problem.
#[test]
fn bad_heads_give_clear_errors() {
    let tiny = Tiny::llama(65);
    let target = load_on_test_device(&tiny.write_hf(&temp_dir("eagle-bad-target")));
    let err = |dir: &std::path::Path| EagleHead::load(dir, &target).unwrap_err().to_string();

    let other = TinyEagle {
        target: Tiny { hidden: 16, heads: 2, kv_heads: 1, ..tiny },
        seed: 1,
        own_embedding: false,
        scale: 0.3,
    };
    let e = err(&other.write(&temp_dir("eagle-bad-hidden"), false));
    assert!(e.contains("hidden size 16") && e.contains("32") && e.contains("config.json"), "{e}");

    let good = TinyEagle { target: tiny, seed: 2, own_embedding: false, scale: 0.3 };
    for torch_bin in [false, true] {
        let dir = temp_dir(&format!("eagle-no-fc-{torch_bin}"));
        good.write(&dir, torch_bin);
        let w: Vec<(String, Tensor)> = good.weights().into_iter().filter(|(n, _)| n != "fc.weight").collect();
        if torch_bin {
            common::write_torch_bin(&dir.join("pytorch_model.bin"), &w);
        } else {
            candle_core::safetensors::save(&w.into_iter().collect(), dir.join("model.safetensors")).unwrap();
        }
        let e = err(&dir);
        assert!(
            e.contains("fc.weight") && e.contains(if torch_bin { "pytorch_model.bin" } else { "model.safetensors" }),
            "{e}"
        );
    }

    for (torch_bin, file) in [(false, "model.safetensors"), (true, "pytorch_model.bin")] {
        let dir = good.write(&temp_dir(&format!("eagle-truncated-{torch_bin}")), torch_bin);
        let bytes = std::fs::read(dir.join(file)).unwrap();
        std::fs::write(dir.join(file), &bytes[..bytes.len() / 2]).unwrap();
        let e = err(&dir);
        assert!(e.contains(file), "{e}");
        assert!(e.contains("truncated") || e.contains("cannot read"), "{e}");
    }

    let dir = temp_dir("eagle-empty");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), good.config_json().to_string()).unwrap();
    assert!(err(&dir).contains("no EAGLE head weights"));
}

mod decoding {
    use super::*;
    use engine::decode::{GenerationConfig, Generator, SpecConfig, TreeChoice};
    use samplers::dist::Warp;
    use samplers::{DraftConstruction, Verifier, VALID_PAIRS};

    /// Temperature 0: EAGLE speculative output equals plain decoding token for token, for
    /// every preset tree and every valid construction/verifier pair, with q one-hot and with q
    /// at temperature 1 (distinct drafts on every branch); some configuration accepts drafts.
    #[test]
    fn temperature_zero_equals_plain_decoding() {
        let tiny = Tiny { vocab: 12, scale: 0.8, ..Tiny::llama(71) };
        let target = load_on_test_device(&tiny.write_hf(&temp_dir("eagle-t0-target")));
        let spec = TinyEagle { target: tiny, seed: 72, own_embedding: false, scale: 0.5 };
        let head = EagleHead::load(&spec.write(&temp_dir("eagle-t0-head"), true), &target).unwrap();
        let base = common::greedy(30, 3);
        let prompt = [5u32, 1, 7, 3];
        let (reference, _) =
            Generator::new(&target, None, 128).unwrap().generate(&prompt, &base, |_| false, |_| Ok(())).unwrap();
        let mut g = Generator::with_eagle(&target, &head, 128).unwrap();
        let mut accepted = 0;
        for draft_warp in [None, Some(Warp::temperature(1.0))] {
            for name in ["chain-3", "drafts-2-depth-3", "drafts-3-depth-2", "mc_sim_7b_63"] {
                let tree = DraftTree::preset(name).unwrap();
                for &(c, v) in VALID_PAIRS {
                    if c == DraftConstruction::SpecHub
                        && (0..tree.len()).any(|i| ![0, 2].contains(&tree.children(i).len()))
                    {
                        continue;
                    }
                    let spec = common::spec(tree.clone(), c, v, draft_warp, 0.0);
                    let config = GenerationConfig { speculative: Some(spec), ..base.clone() };
                    let (out, stats) = g.generate(&prompt, &config, |_| false, |_| Ok(())).unwrap();
                    assert_eq!(out, reference, "{name} {c}+{v} (draft warp {draft_warp:?})");
                    assert!(stats.draft_forwards > 0);
                    accepted += (stats.tau > 1.0) as usize;
                }
            }
        }
        assert!(accepted > 0, "no EAGLE configuration ever accepted a draft");
        // `--tree auto` with the head: whatever tree each step picks from the measured costs,
        // the output is the plain one.
        let drafted = common::assert_auto_equals_plain(&mut g, &prompt, &base, &reference);
        assert!(drafted > 0, "no EAGLE generation with --tree auto ever drafted");
        // A one-token prompt: the first step has no feature yet and drafts nothing.
        let (one, _) =
            Generator::new(&target, None, 128).unwrap().generate(&[5], &base, |_| false, |_| Ok(())).unwrap();
        let config = GenerationConfig {
            speculative: Some(SpecConfig {
                tree: DraftTree::preset("chain-2").unwrap().into(),
                construction: DraftConstruction::Greedy,
                verifier: Verifier::Greedy,
                draft_warp: None,
                confidence_cutoff: 0.0,
                source: engine::decode::DraftSource::Model,
            }),
            ..base.clone()
        };
        assert_eq!(g.generate(&[5], &config, |_| false, |_| Ok(())).unwrap().0, one);
    }

    /// Temperature 1: the first two tokens after the prompt follow the exact autoregressive law
    /// of the target, with EAGLE drafts on a 2 x 2 tree, for every draft construction with its
    /// own verifier (RRS with and without replacement, K-SEQ, Greedy, SpecHub, top-k, and
    /// conditional Poisson drafts with the top-k verifier).
    /// Pearson chi-square over the 25 cells of a 5-token vocabulary, 4,000 generations per
    /// configuration, cells expecting fewer than 5 pooled; fails below a p-value of 1e-4. Each catches any error of 0.059 or more in total variation (probability 0.9,
    /// `common::detectable_tv`; fewer cells, less), and drafts must be accepted in at least 1% of
    /// the generations (`common::two_token_counts`).
    #[test]
    fn first_two_tokens_follow_the_target_law() {
        let tiny = Tiny { vocab: 5, scale: 1.0, ..Tiny::qwen2(73) };
        let target = load_on_test_device(&tiny.write_hf(&temp_dir("eagle-chi-target")));
        let spec = TinyEagle { target: tiny, seed: 74, own_embedding: true, scale: 0.1 };
        let head = EagleHead::load(&spec.write(&temp_dir("eagle-chi-head"), false), &target).unwrap();
        let prompt = [1u32, 4, 0];
        let mut g = Generator::with_eagle(&target, &head, 32).unwrap();
        let pairs = [
            (DraftConstruction::WithReplacement, Verifier::Rrs),
            (DraftConstruction::WithoutReplacement, Verifier::Rrs),
            (DraftConstruction::WithReplacement, Verifier::KSeq),
            (DraftConstruction::Greedy, Verifier::Greedy),
            (DraftConstruction::SpecHub, Verifier::SpecHub),
            (DraftConstruction::TopK, Verifier::TopK),
            (DraftConstruction::ConditionalPoisson, Verifier::TopK),
        ];
        assert_two_tokens_follow(&mut g, &target, &prompt, Warp::temperature(1.0), &pairs, "");
    }

    /// For each pair, 4,000 generations of two tokens at `warp` on a 2 x 2 tree: drafts accepted
    /// for both tokens more than 50 times, and the counts follow `target`'s exact law of the
    /// 5-token vocabulary (chi-square over 25 cells, p-value at least 1e-4).
    fn assert_two_tokens_follow(
        g: &mut Generator,
        target: &DecoderModel,
        prompt: &[u32],
        warp: Warp,
        pairs: &[(DraftConstruction, Verifier)],
        what: &str,
    ) {
        let law = common::two_token_law(target, prompt, warp);
        let tree = DraftTree::preset("drafts-2-depth-2").unwrap();
        for &(c, v) in pairs {
            let draws = 4000u64;
            let config = |seed| common::two_tokens(seed, warp, tree.clone().into(), c, v, None);
            let mut accepted = 0;
            let counts = common::two_token_counts(g, prompt, 5, draws, config, |stats| {
                accepted += (stats.target_forwards == 1) as usize;
            });
            // Only rules out a vacuous test (no drafts accepted). The cut head's `wr+rrs` sits near
            // 100 (85 to 97 at four of ten seed offsets, where a bound of 100 failed; the binomial
            // standard deviation is about 10), so 50 is four to five of them below.
            assert!(accepted > 50, "{what}{c}+{v}: both tokens from one target forward only {accepted} times");
            common::assert_follows_law(&counts, &law, draws, Some(25), &format!("{what}{c}+{v}"));
        }
    }

    /// `--tree auto` with an EAGLE head at temperature 1, costs seeded so that multi-draft
    /// trees win (cheap head, flat target cost): the first two tokens follow the exact law.
    /// Chi-square as above: 4,000 generations, fails below a p-value of 1e-4. Each catches any error of 0.059 or more in total variation (probability 0.9,
    /// `common::detectable_tv`; fewer cells, less), and drafts must be accepted in at least 1% of
    /// the generations (`common::two_token_counts`).
    #[test]
    fn auto_tree_follows_the_target_law() {
        let tiny = Tiny { vocab: 5, scale: 1.0, ..Tiny::qwen2(75) };
        let target = load_on_test_device(&tiny.write_hf(&temp_dir("eagle-auto-target")));
        let spec = TinyEagle { target: tiny, seed: 76, own_embedding: false, scale: 0.1 };
        let head = EagleHead::load(&spec.write(&temp_dir("eagle-auto-head"), true), &target).unwrap();
        let prompt = [2u32, 0, 3];
        let warp = Warp::temperature(1.0);
        let law = common::two_token_law(&target, &prompt, warp);
        let mut g = Generator::with_eagle(&target, &head, 32).unwrap();
        *g.auto_tree_mut() = Some(common::auto_favouring_wide_trees());
        let draws = 4000u64;
        let config = |seed| {
            common::two_tokens(seed, warp, TreeChoice::Auto, DraftConstruction::WithoutReplacement, Verifier::Rrs, None)
        };
        let mut multi_draft = 0;
        let counts = common::two_token_counts(&mut g, &prompt, 5, draws, config, |stats| {
            multi_draft += stats.auto_tree.contains("drafts-") as usize;
        });
        assert!(multi_draft > draws as usize / 2, "multi-draft trees were picked in only {multi_draft} generations");
        common::assert_follows_law(&counts, &law, draws, Some(25), "EAGLE auto wor+rrs");
    }

    /// A head whose output layer is cut to the target's first 3 of 5 token ids
    /// (`EagleHead::set_output_rows`, `--draft-vocab`): its logits are the first 3 columns of
    /// the whole layer's, bit for bit; with q = 0 on ids 3 and 4, the first two tokens still
    /// follow the exact law at temperature 1 (chi-square as above,
    /// 4,000 generations per pair, p-value at least 1e-4, catching any error of 0.059 or more in
    /// total variation with probability 0.9), with drafts accepted; at
    /// temperature 0 the output is the plain one. A cut at or above the vocabulary keeps it
    /// whole.
    #[test]
    fn a_cut_output_layer_keeps_the_target_law() {
        let tiny = Tiny { vocab: 5, scale: 1.0, ..Tiny::qwen2(77) };
        let target = load_on_test_device(&tiny.write_hf(&temp_dir("eagle-cut-target")));
        let spec = TinyEagle { target: tiny, seed: 78, own_embedding: false, scale: 0.1 };
        let mut head = EagleHead::load(&spec.write(&temp_dir("eagle-cut-head"), false), &target).unwrap();
        let out =
            Tensor::randn(0f32, 1.0, (4, tiny.hidden), target.device()).unwrap().to_dtype(target.dtype()).unwrap();
        let whole = head.logits(&target, &out).unwrap();
        head.set_output_rows(&target, 5).unwrap();
        assert_eq!(head.logits(&target, &out).unwrap().dims(), [4, 5]);
        head.set_output_rows(&target, 3).unwrap();
        let cut = head.logits(&target, &out).unwrap();
        assert_eq!(cut.dims(), [4, 3]);
        assert_eq!(max_diff(&cut, &whole.narrow(1, 0, 3).unwrap()), 0.0);

        let prompt = [1u32, 4, 0];
        let mut g = Generator::with_eagle(&target, &head, 32).unwrap();
        let pairs = [
            (DraftConstruction::WithReplacement, Verifier::Rrs),
            (DraftConstruction::WithoutReplacement, Verifier::Rrs),
        ];
        assert_two_tokens_follow(&mut g, &target, &prompt, Warp::temperature(1.0), &pairs, "cut head ");
        let base = common::greedy(20, 3);
        let (reference, _) =
            Generator::new(&target, None, 64).unwrap().generate(&prompt, &base, |_| false, |_| Ok(())).unwrap();
        let tree = DraftTree::preset("chain-3").unwrap();
        let spec = common::spec(tree, DraftConstruction::Greedy, Verifier::Greedy, None, 0.0);
        let config = GenerationConfig { speculative: Some(spec), ..base };
        assert_eq!(g.generate(&prompt, &config, |_| false, |_| Ok(())).unwrap().0, reference);
    }

    /// On the CPU a head's matrices whose input widths are whole 256-value blocks are
    /// re-quantized to Q6_K (`EagleHead::load` does it where our kernels run, unless
    /// `MDSD_EAGLE_DENSE=1`): all eight here (hidden and MLP width 256). The quantized head's
    /// outputs stay within 5% of the dense head's largest (1.7% measured: 6-bit weights and the
    /// kernels' 8-bit activations; they differ, so the matrices did change), and the
    /// target's law holds with it: at temperature 0 its drafts give the plain output, some
    /// accepted; at temperature 1 the first two tokens follow the target's (chi-square as
    /// `first_two_tokens_follow_the_target_law`).
    #[test]
    fn a_quantized_head_is_close_and_keeps_the_target_law() {
        use candle_core::quantized::GgmlDType;
        let tiny = Tiny { vocab: 5, hidden: 256, intermediate: 256, layers: 1, scale: 1.0, ..Tiny::qwen2(83) };
        let target = load_on_test_device(&tiny.write_hf(&temp_dir("eagle-q6k-target")));
        let dir = TinyEagle { target: tiny, seed: 84, own_embedding: false, scale: 0.02 }
            .write(&temp_dir("eagle-q6k-head"), false);
        let dense = EagleHead::load_dense(&dir, &target).unwrap();
        assert_eq!(dense.dense_matrices(), 8);
        let mut head = EagleHead::load_dense(&dir, &target).unwrap();
        let quantized = head.quantize_matrices(GgmlDType::Q6K).unwrap();
        let on_cpu = target.device().is_cpu();
        // Only dense matrices on the CPU are re-quantized (on a GPU the head keeps its dtype).
        assert_eq!((quantized, head.dense_matrices()), if on_cpu { (8, 0) } else { (0, 8) });
        let by_default = EagleHead::load(&dir, &target).unwrap().dense_matrices();
        let ours = on_cpu
            && engine::kernels::quant::avx2::cpu_supported()
            && std::env::var("MDSD_EAGLE_DENSE").map_or(true, |v| v != "1");
        assert_eq!(by_default, if ours { 0 } else { 8 });

        // Every entry of a prompt's prefill (ids inside the vocabulary of 5).
        let ids = [1u32, 4, 0, 2, 3, 3, 1, 0];
        let n = ids.len();
        let bias = |t| causal_bias(0, t, target.dtype(), target.device()).unwrap();
        let pos: Vec<u32> = (0..n as u32).collect();
        let f = target.forward(&ids, &pos, &bias(n), &mut target.new_cache(16).unwrap()).unwrap();
        let outputs = |h: &EagleHead| {
            let f = f.narrow(0, 0, n - 1).unwrap();
            h.forward(&target, &f, &ids[1..], &pos[..n - 1], &bias(n - 1), &mut h.new_cache(16).unwrap()).unwrap()
        };
        let (a, b) = (outputs(&dense), outputs(&head));
        let scale = a.abs().unwrap().max_all().unwrap().to_dtype(candle_core::DType::F32).unwrap();
        let relative = max_diff(&a, &b) / scale.to_scalar::<f32>().unwrap();
        eprintln!("Q6_K head against the dense head: largest difference {relative:.2e} of the largest output");
        assert!(relative < 0.05, "{relative}");
        assert!(!on_cpu || relative > 0.0, "the quantized head computes exactly the dense one's outputs");

        let prompt = [1u32, 4, 0];
        let mut g = Generator::with_eagle(&target, &head, 64).unwrap();
        let base = common::greedy(20, 3);
        let (reference, _) =
            Generator::new(&target, None, 64).unwrap().generate(&prompt, &base, |_| false, |_| Ok(())).unwrap();
        let mut accepted = 0;
        for name in ["chain-3", "mc_sim_7b_63"] {
            let spec =
                common::spec(DraftTree::preset(name).unwrap(), DraftConstruction::Greedy, Verifier::Greedy, None, 0.0);
            let config = GenerationConfig { speculative: Some(spec), ..base.clone() };
            let (out, stats) = g.generate(&prompt, &config, |_| false, |_| Ok(())).unwrap();
            assert_eq!(out, reference, "{name}");
            accepted += (stats.tau > 1.0) as usize;
        }
        assert!(accepted > 0, "the quantized head's drafts were never accepted");
        let pairs = [(DraftConstruction::WithReplacement, Verifier::Rrs)];
        assert_two_tokens_follow(&mut g, &target, &prompt, Warp::temperature(1.0), &pairs, "Q6_K head ");
    }
}
