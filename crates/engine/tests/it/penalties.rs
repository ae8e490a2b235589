//! Repetition, presence and frequency penalties (`Generator::set_penalties`): plain decoding
//! applies them as written out below, and speculative decoding emits exactly what plain
//! decoding of the penalised target emits, at temperature 0 token for token and at temperature 1
//! in law (chi-square of the first two tokens, the second drawn at a drafted node whose row is
//! penalised for the token on its path).

use crate::common;

use common::{load_on_test_device, temp_dir, Tiny};
use engine::decode::penalties::Penalties;
use engine::decode::{GenerationConfig, Generator, Randomness};
use engine::model::DecoderModel;
use engine::DraftTree;
use samplers::dist::Warp;
use samplers::{DraftConstruction, Verifier};

/// The target's last logits row after `context`, run alone.
fn last_row(target: &DecoderModel, context: &[u32]) -> Vec<f32> {
    let mut cache = target.new_cache(context.len() + 1).unwrap();
    let h = target.forward_chain(context, &mut cache).unwrap();
    let logits = target.logits(&h.narrow(0, context.len() - 1, 1).unwrap()).unwrap();
    logits.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// The penalties written out: repetition on the tokens of the prompt or the text, then
/// frequency and presence on the text's.
fn penalise(p: Penalties, row: &mut [f32], prompt: &[u32], text: &[u32]) {
    for (t, l) in row.iter_mut().enumerate() {
        let count = text.iter().filter(|&&x| x as usize == t).count() as f32;
        if count > 0.0 || prompt.contains(&(t as u32)) {
            *l = if *l > 0.0 { *l / p.repetition } else { *l * p.repetition };
        }
        if count > 0.0 {
            *l -= p.frequency * count + p.presence;
        }
    }
}

const STRONG: Penalties = Penalties { repetition: 1.4, presence: 0.6, frequency: 0.5 };

/// Temperature 0: plain decoding with penalties is the argmax of the written-out penalties at
/// every position (each row from a fresh pass over the text), and differs from decoding without
/// them; every tree and draft source (a draft model, an EAGLE head, lookup, `auto`) emits plain
/// decoding's tokens. The target drafting for itself keeps accepting (tau > 1.5), and accepts
/// every argmax draft: its drafts' rows are penalised for their paths as the target's are.
#[test]
fn penalised_speculative_output_equals_penalised_plain_decoding() {
    let (target, draft, head) = common::target_draft_head(151, "penalties");
    let prompt: Vec<u32> = (0..10u32).map(|i| (i * 7 + 3) % 48).collect();
    let base = common::greedy(30, 3);
    let (unpenalised, _) =
        Generator::new(&target, None, 200).unwrap().generate(&prompt, &base, |_| false, |_| Ok(())).unwrap();
    let mut plain_generator = Generator::new(&target, None, 200).unwrap();
    plain_generator.set_penalties(STRONG);
    let (plain, _) = plain_generator.generate(&prompt, &base, |_| false, |_| Ok(())).unwrap();
    assert_ne!(plain, unpenalised, "the penalties changed nothing");
    // The reference: one fresh pass per position.
    let mut text: Vec<u32> = Vec::new();
    while text.len() < 30 {
        let context: Vec<u32> = prompt.iter().chain(&text).copied().collect();
        let mut row = last_row(&target, &context);
        penalise(STRONG, &mut row, &prompt, &text);
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        text.push(row.iter().position(|&l| l == max).unwrap() as u32);
    }
    assert_eq!(plain, text, "plain decoding against the written-out penalties");

    let runs = common::assert_every_source_equals_plain((&target, &draft, &head), &prompt, &base, &plain, |g| {
        g.set_penalties(STRONG)
    });
    // The target's own argmax drafts, penalised for their paths, are all accepted: tau is the
    // depth plus one (30 tokens: the last step of drafts-2-depth-3 is cut).
    for (name, full) in [("chain-4 greedy", 5.0), ("drafts-2-depth-3 topk", 3.75)] {
        let (_, _, stats) = runs.iter().find(|(n, source, _)| *n == name && *source == "self").unwrap();
        assert!(stats.tau >= full, "{name}: the target's own drafts, tau {} < {full}", stats.tau);
    }
    // Out-of-range penalties are errors naming the penalty.
    let mut g = Generator::new(&target, None, 200).unwrap();
    g.set_penalties(Penalties { frequency: 3.0, ..Penalties::default() });
    let err = g.generate(&prompt, &base, |_| false, |_| Ok(())).unwrap_err().to_string();
    assert!(err.contains("frequency penalty must be in [-2, 2], got 3"), "{err}");
}

/// Temperature 1: the first two tokens follow the exact law of the penalised target, the
/// second token's row penalised for the first, under multi-draft trees (where the second token
/// is drawn at a drafted node whenever the first draft is accepted), with stream sampling and
/// with positional races. Pearson chi-square, 4,000 generations per configuration with seeds
/// 0..3999, cells expecting fewer than 5 pooled, fails below a p-value of 1e-4. Each catches any error of 0.059 or more in total variation (probability 0.9,
/// `common::detectable_tv`; fewer cells, less), and drafts must be accepted in at least 1% of
/// the generations (`common::two_token_counts`).
#[test]
fn penalised_first_two_tokens_follow_the_penalised_law() {
    let small = |seed, layers| Tiny { vocab: 5, scale: 1.0, layers, ..Tiny::qwen2(seed) };
    let target = load_on_test_device(&small(153, 2).write_hf(&temp_dir("penalties-chi-target")));
    let draft = load_on_test_device(&small(154, 1).write_hf(&temp_dir("penalties-chi-draft")));
    let prompt = [1u32, 4, 1];
    let warp = Warp::temperature(1.0);
    let law_with = |p: Penalties| -> Vec<f64> {
        let probs = |text: &[u32]| {
            let context: Vec<u32> = prompt.iter().chain(text).copied().collect();
            let mut row = last_row(&target, &context);
            penalise(p, &mut row, &prompt, text);
            let mut probs = Vec::new();
            warp.apply(&row, &mut probs).unwrap();
            probs
        };
        let p1 = probs(&[]);
        let mut law = vec![0.0; 25];
        for a in 0..5u32 {
            let p2 = probs(&[a]);
            for b in 0..5 {
                law[a as usize * 5 + b] = p1[a as usize] * p2[b];
            }
        }
        law
    };
    let law = law_with(STRONG);
    // The penalties move the law well beyond what 4,000 draws resolve.
    let tv: f64 = law.iter().zip(law_with(Penalties::default())).map(|(a, b)| (a - b).abs()).sum::<f64>() / 2.0;
    assert!(tv > 0.1, "total variation {tv} between the penalised and the plain law");
    let configs = [
        ("drafts-2-depth-2", DraftConstruction::WithReplacement, Verifier::Rrs, Randomness::Stream),
        ("drafts-3-depth-1", DraftConstruction::Greedy, Verifier::Greedy, Randomness::Stream),
        ("drafts-2-depth-2", DraftConstruction::WithoutReplacement, Verifier::Rrs, Randomness::Positional),
    ];
    let mut generator = Generator::new(&target, Some(&draft), 64).unwrap();
    generator.set_penalties(STRONG);
    for (name, c, v, randomness) in configs {
        let tree = DraftTree::preset(name).unwrap();
        let config =
            |seed| GenerationConfig { randomness, ..common::two_tokens(seed, warp, tree.clone().into(), c, v, None) };
        let draws = 4000;
        let mut accepted = 0;
        let counts = common::two_token_counts(&mut generator, &prompt, 5, draws, config, |stats| {
            accepted += stats.accepted_at_depth.first().copied().unwrap_or(0);
        });
        // The second token came from a drafted node's row in many generations.
        assert!(accepted > draws as usize / 4, "{name}: a first draft was accepted {accepted} times");
        common::assert_follows_law(&counts, &law, draws, Some(25), &format!("{name} {c}+{v} {randomness:?}"));
    }
}
