//! Logit bias (`Generator::set_logit_bias`, OpenAI's `logit_bias`): speculative decoding with a
//! bias emits exactly what plain decoding of the biased target emits, at temperature 0 token for
//! token and at temperature 1 in law (chi-square of the first two tokens).

use crate::common;

use common::{load_on_test_device, temp_dir, Tiny};
use engine::decode::{GenerationConfig, Generator, Randomness};
use engine::model::DecoderModel;
use engine::DraftTree;
use samplers::dist::Warp;
use samplers::{DraftConstruction, Verifier};

fn model(tiny: Tiny, name: &str) -> DecoderModel {
    load_on_test_device(&tiny.write_hf(&temp_dir(name)))
}

/// Temperature 0: with a bias that bans plain decoding's most frequent token and favours
/// another, every tree and draft source (a draft model, an EAGLE head, lookup, `auto`) emits
/// plain biased decoding's tokens; the banned token never comes, and the bias changed the text.
#[test]
fn biased_speculative_output_equals_biased_plain_decoding() {
    let (target, draft, head) = common::target_draft_head(141, "bias");
    let prompt: Vec<u32> = (0..10u32).map(|i| (i * 11 + 4) % 48).collect();
    let base = common::greedy(30, 3);
    let (unbiased, _) =
        Generator::new(&target, None, 200).unwrap().generate(&prompt, &base, |_| false, |_| Ok(())).unwrap();
    let mut counts = [0usize; 48];
    unbiased.iter().for_each(|&t| counts[t as usize] += 1);
    let banned = (0..48u32).max_by_key(|&t| counts[t as usize]).unwrap();
    let bias = vec![(banned, -100.0), ((banned + 7) % 48, 2.5)];
    let mut plain_generator = Generator::new(&target, None, 200).unwrap();
    plain_generator.set_logit_bias(bias.clone());
    let (plain, _) = plain_generator.generate(&prompt, &base, |_| false, |_| Ok(())).unwrap();
    assert!(!plain.contains(&banned) && plain != unbiased, "the bias changed nothing: {plain:?}");

    common::assert_every_source_equals_plain((&target, &draft, &head), &prompt, &base, &plain, |g| {
        g.set_logit_bias(bias.clone())
    });
    // Bad biases are errors naming the token.
    let mut g = Generator::new(&target, None, 200).unwrap();
    for bad in [vec![(48u32, 1.0f32)], vec![(3, f32::NAN)]] {
        g.set_logit_bias(bad);
        let err = g.generate(&prompt, &base, |_| false, |_| Ok(())).unwrap_err().to_string();
        assert!(err.contains("logit bias"), "{err}");
    }
}

/// Temperature 1: the first two tokens follow the exact law of the biased target (token 3 at
/// -100, about e^-100 of its odds, never drawn; token 1 favoured) under multi-draft trees, with
/// stream sampling and with positional races. Pearson chi-square, 4,000 generations per
/// configuration with seeds 0..3999, cells expecting fewer than 5 pooled, fails below a p-value
/// of 1e-4. Each catches any error of 0.059 or more in total variation (probability 0.9,
/// `common::detectable_tv`; fewer cells, less), and drafts must be accepted in at least 1% of
/// the generations (`common::two_token_counts`).
#[test]
fn biased_first_two_tokens_follow_the_biased_law() {
    let small = |seed, layers| Tiny { vocab: 5, scale: 1.0, layers, ..Tiny::qwen2(seed) };
    let target = model(small(143, 2), "bias-chi-target");
    let draft = model(small(144, 1), "bias-chi-draft");
    let bias = vec![(3u32, -100.0f32), (1, 1.0)];
    let prompt = [1u32, 4, 2];
    let warp = Warp::temperature(1.0);
    // The exact law: p(a) p(b | a) under the biased, warped target.
    let probs = |tokens: &[u32]| -> Vec<f64> {
        let mut cache = target.new_cache(tokens.len() + 1).unwrap();
        let h = target.forward_chain(tokens, &mut cache).unwrap();
        let logits = target.logits(&h.narrow(0, tokens.len() - 1, 1).unwrap()).unwrap();
        let mut row = logits.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for &(id, b) in &bias {
            row[id as usize] += b;
        }
        let mut p = Vec::new();
        warp.apply(&row, &mut p).unwrap();
        p
    };
    let p1 = probs(&prompt);
    let mut law = vec![0.0; 25];
    for a in 0..5u32 {
        let p2 = probs(&[&prompt[..], &[a]].concat());
        for b in 0..5 {
            law[a as usize * 5 + b] = p1[a as usize] * p2[b];
        }
    }
    let configs = [
        ("drafts-2-depth-2", DraftConstruction::WithReplacement, Verifier::Rrs, Randomness::Stream),
        ("drafts-3-depth-1", DraftConstruction::Greedy, Verifier::Greedy, Randomness::Stream),
        ("drafts-2-depth-2", DraftConstruction::WithoutReplacement, Verifier::Rrs, Randomness::Positional),
    ];
    let mut generator = Generator::new(&target, Some(&draft), 64).unwrap();
    generator.set_logit_bias(bias.clone());
    for (name, c, v, randomness) in configs {
        let tree = DraftTree::preset(name).unwrap();
        let config =
            |seed| GenerationConfig { randomness, ..common::two_tokens(seed, warp, tree.clone().into(), c, v, None) };
        let draws = 4000;
        let counts = common::two_token_counts(&mut generator, &prompt, 5, draws, config, |_| {});
        let banned: u64 = (0..5).map(|a| counts[a * 5 + 3] + counts[3 * 5 + a]).sum();
        assert_eq!(banned, 0, "{name}: token 3 was drawn");
        common::assert_follows_law(&counts, &law, draws, Some(25), &format!("{name} {c}+{v} {randomness:?}"));
    }
}
