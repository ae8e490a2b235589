//! Log-probabilities of generated tokens (`Generator::set_logprobs`): they are the target's
//! `ln softmax` at each token's position, whatever drafted it, and they follow the tokens
//! through stops and cuts.

use crate::common;

use common::{load_on_test_device, spec, temp_dir, Tiny};
use engine::decode::draft::ngram::NgramConfig;
use engine::decode::logprobs::TokenLogprobs;
use engine::decode::{DraftSource, GenerationConfig, Generator, Randomness, SpecConfig, TreeChoice};
use engine::model::DecoderModel;
use engine::DraftTree;
use samplers::dist::Warp;
use samplers::{DraftConstruction, Verifier};

/// The target's `ln softmax` after each prefix of `prompt + out` (one row per generated token),
/// from one fresh prompt pass.
fn reference(target: &DecoderModel, prompt: &[u32], out: &[u32]) -> Vec<Vec<f64>> {
    let mut text = prompt.to_vec();
    text.extend_from_slice(&out[..out.len() - 1]);
    log_softmax_rows(target, &text).split_off(prompt.len() - 1)
}

/// The target's `ln softmax` after each prefix of `text` (row `r` scores `text[r + 1]`).
fn log_softmax_rows(target: &DecoderModel, text: &[u32]) -> Vec<Vec<f64>> {
    let mut cache = target.new_cache(text.len() + 1).unwrap();
    let hidden = target.forward_chain(text, &mut cache).unwrap();
    let logits: Vec<Vec<f32>> =
        target.logits(&hidden).unwrap().to_dtype(candle_core::DType::F32).unwrap().to_vec2().unwrap();
    logits
        .iter()
        .map(|row| {
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l)) as f64;
            let z: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln() + max;
            row.iter().map(|&l| l as f64 - z).collect()
        })
        .collect()
}

/// Each record holds its token's log-probability and the `top` most probable tokens in order,
/// as `reference` gives them (within `tol`).
fn assert_matches_reference(records: &[TokenLogprobs], out: &[u32], reference: &[Vec<f64>], top: usize, what: &str) {
    assert_eq!(records.len(), out.len(), "{what}: one record per token");
    for (i, (r, lp)) in records.iter().zip(reference).enumerate() {
        assert_eq!(r.token, out[i], "{what}: token {i}");
        assert!(
            (r.logprob as f64 - lp[r.token as usize]).abs() < 1e-4,
            "{what}: token {i}: {} vs {}",
            r.logprob,
            lp[r.token as usize]
        );
        assert_eq!(r.top.len(), top, "{what}: token {i}: alternatives");
        for (k, &(id, l)) in r.top.iter().enumerate() {
            assert!((l as f64 - lp[id as usize]).abs() < 1e-4, "{what}: token {i}, alternative {k}");
            // Nothing outside the list beats it (up to rounding).
            let beaten = (0..lp.len()).filter(|&j| lp[j] > l as f64 + 1e-4).count();
            assert!(beaten <= k, "{what}: token {i}: alternative {k} ({id}) is beaten by {beaten} tokens");
        }
        assert!(r.top.windows(2).all(|w| w[0].1 >= w[1].1), "{what}: token {i}: sorted");
    }
}

fn model(tiny: Tiny, name: &str) -> DecoderModel {
    load_on_test_device(&tiny.write_hf(&temp_dir(name)))
}

fn configs() -> Vec<(&'static str, Option<SpecConfig>)> {
    let tree = |name| TreeChoice::Fixed(DraftTree::preset(name).unwrap());
    let warp = None;
    let ngram =
        DraftSource::NgramFirst { ngram: NgramConfig { min: 1, max: 3 }, tree: DraftTree::preset("chain-3").unwrap() };
    vec![
        ("plain", None),
        ("chain-4 greedy", Some(spec(tree("chain-4"), DraftConstruction::Greedy, Verifier::Greedy, warp, 0.0))),
        (
            "drafts-2-depth-3 wr",
            Some(spec(tree("drafts-2-depth-3"), DraftConstruction::WithReplacement, Verifier::Rrs, warp, 0.0)),
        ),
        ("mc_sim_7b_63 topk", Some(spec(tree("mc_sim_7b_63"), DraftConstruction::TopK, Verifier::TopK, warp, 0.0))),
        ("auto", Some(spec(TreeChoice::Auto, DraftConstruction::Greedy, Verifier::Greedy, warp, 0.0))),
        (
            "n-gram first",
            Some(SpecConfig {
                source: ngram,
                ..spec(tree("chain-2"), DraftConstruction::Greedy, Verifier::Greedy, warp, 0.0)
            }),
        ),
    ]
}

/// With a draft model, an EAGLE head or lookup, at temperature 0 and with positional races at
/// temperature 1 (both give plain decoding's tokens), every token's record is the target's
/// log-softmax at its position, as one prompt pass over the text computes it.
#[test]
fn speculative_logprobs_are_the_targets_at_each_position() {
    let (target, draft, head) = common::target_draft_head(131, "logprobs");
    let prompt: Vec<u32> = (0..12u32).map(|i| (i * 7 + 3) % 48).collect();
    for (warp, randomness) in
        [(Warp::temperature(0.0), Randomness::Stream), (Warp::temperature(1.0), Randomness::Positional)]
    {
        let mut plain: Option<(Vec<u32>, Vec<TokenLogprobs>)> = None;
        for (name, s) in configs() {
            // The target drafting for itself (long accepted paths), a one-layer draft, a head.
            for (source, draft, eagle) in
                [("self", Some(&target), false), ("1-layer", Some(&draft), false), ("EAGLE", None, true)]
            {
                let model_drafts = s.as_ref().is_some_and(|s| matches!(s.source, DraftSource::Model));
                if source != "self" && !model_drafts {
                    continue;
                }
                let what = format!("{name}, {source}, {warp:?}, {randomness:?}");
                let config = GenerationConfig { max_new_tokens: 24, warp, seed: 5, randomness, speculative: s.clone() };
                let mut g = if eagle {
                    Generator::with_eagle(&target, &head, 200).unwrap()
                } else {
                    Generator::new(&target, s.as_ref().and(draft), 200).unwrap()
                };
                g.set_logprobs(Some(3));
                let (out, stats) = g.generate(&prompt, &config, |_| false, |_| Ok(())).unwrap();
                assert_eq!(out.len(), 24, "{what}");
                if source == "self" && model_drafts && name != "auto" {
                    assert!(stats.tau > 1.5, "{what}: tau {}", stats.tau);
                }
                assert_matches_reference(g.logprobs(), &out, &reference(&target, &prompt, &out), 3, &what);
                // The same tokens as plain decoding, so the same records.
                match &plain {
                    None => plain = Some((out, g.logprobs().to_vec())),
                    Some((tokens, records)) => {
                        assert_eq!(&out, tokens, "{what}: plain decoding's tokens");
                        for (a, b) in g.logprobs().iter().zip(records) {
                            assert!((a.logprob - b.logprob).abs() < 1e-4, "{what}: {a:?} vs {b:?}");
                        }
                    }
                }
            }
        }
    }
}

/// The records follow the tokens: the batches `generate_emitting` hands out carry one record
/// per token, cut where a stop token or `max_new_tokens` cuts a step; `logprobs()` holds the
/// returned tokens' records; without `set_logprobs` there are none, and `None` turns them off.
#[test]
fn records_follow_the_tokens_through_cuts() {
    let tiny = Tiny { scale: 0.8, ..Tiny::llama(133) };
    let target = model(tiny, "logprobs-cut-target");
    let prompt: Vec<u32> = (0..10u32).map(|i| (i * 5 + 1) % 48).collect();
    let chain = TreeChoice::Fixed(DraftTree::preset("chain-4").unwrap());
    // The target drafting for itself: whole chains are accepted, so cuts fall inside steps.
    let s = spec(chain, DraftConstruction::Greedy, Verifier::Greedy, None, 0.0);
    let config = |max_new_tokens| GenerationConfig {
        max_new_tokens,
        warp: Warp::temperature(0.0),
        seed: 1,
        randomness: Randomness::Stream,
        speculative: Some(s.clone()),
    };
    let mut g = Generator::new(&target, Some(&target), 200).unwrap();
    g.set_logprobs(Some(2));
    let (full, stats) = g.generate(&prompt, &config(30), |_| false, |_| Ok(())).unwrap();
    assert!(stats.tau > 2.0, "cuts must fall inside steps (tau {})", stats.tau);
    let full_records = g.logprobs().to_vec();
    assert_eq!(full_records.len(), 30);
    // Cut by max_new_tokens inside a step, and by a stop token (the 12th token, not emitted).
    for (max, stop_at) in [(7usize, None), (30, Some(11usize))] {
        let stop_token = stop_at.map(|i| full[i]);
        let first = stop_token.map(|t| full.iter().position(|&x| x == t).unwrap());
        let mut batches: Vec<(Vec<u32>, Vec<TokenLogprobs>)> = Vec::new();
        let (out, _) = g
            .generate_emitting(
                &prompt,
                &config(max),
                |t| Some(t) == stop_token,
                |e| {
                    batches.push((e.tokens.to_vec(), e.logprobs.to_vec()));
                    Ok(())
                },
            )
            .unwrap();
        let expect = first.unwrap_or(max);
        assert_eq!(out, full[..expect], "max {max}, stop {stop_at:?}");
        for (tokens, records) in &batches {
            assert_eq!(tokens.len(), records.len(), "max {max}: a batch's records");
            assert!(tokens.iter().zip(records).all(|(t, r)| *t == r.token));
        }
        let streamed: Vec<TokenLogprobs> = batches.into_iter().flat_map(|b| b.1).collect();
        assert_eq!(streamed, g.logprobs(), "max {max}: streamed records");
        assert_eq!(g.logprobs(), &full_records[..expect], "max {max}: the longer run's records");
    }
    g.set_logprobs(None);
    let mut any = false;
    g.generate_emitting(
        &prompt,
        &config(8),
        |_| false,
        |e| {
            any |= !e.logprobs.is_empty() || !e.prompt_logprobs.is_empty();
            Ok(())
        },
    )
    .unwrap();
    assert!(!any && g.logprobs().is_empty(), "records without set_logprobs");
    let mut fresh = Generator::new(&target, Some(&target), 200).unwrap();
    fresh.generate(&prompt, &config(5), |_| false, |_| Ok(())).unwrap();
    assert!(fresh.logprobs().is_empty(), "off by default");
}

/// Prompt log-probabilities (`set_prompt_logprobs`): every prompt token after the first, as one
/// prompt pass scores it (a 200-token prompt: several blocks of 64 rows), with no tokens
/// generated or before generated ones; the prompt then runs whole although prefix reuse is on;
/// off, nothing is scored and the cache is reused again.
#[test]
fn prompt_logprobs_score_every_prompt_token() {
    let target = model(Tiny { scale: 0.8, ..Tiny::llama(134) }, "logprobs-prompt-target");
    let prompt: Vec<u32> = (0..200u32).map(|i| (i * 13 + 7) % 48).collect();
    let config = |max_new_tokens| GenerationConfig {
        max_new_tokens,
        warp: Warp::temperature(0.0),
        seed: 1,
        randomness: Randomness::Stream,
        speculative: Some(spec(
            TreeChoice::Fixed(DraftTree::preset("chain-2").unwrap()),
            DraftConstruction::Greedy,
            Verifier::Greedy,
            None,
            0.0,
        )),
    };
    let mut g = Generator::new(&target, Some(&target), 256).unwrap();
    g.set_prefix_reuse(true);
    g.set_prompt_logprobs(true);
    // Without set_logprobs: nothing scored.
    g.generate(&prompt, &config(2), |_| false, |_| Ok(())).unwrap();
    assert!(g.prompt_logprobs().is_empty());
    g.set_logprobs(Some(2));
    let (out, stats) = g.generate(&prompt, &config(0), |_| false, |_| Ok(())).unwrap();
    assert!(out.is_empty() && g.logprobs().is_empty());
    assert_eq!(stats.reused_tokens, 0, "a scored prompt runs whole");
    let scored = g.prompt_logprobs().to_vec();
    assert_matches_reference(&scored, &prompt[1..], &log_softmax_rows(&target, &prompt), 2, "prompt");
    let (out, stats) = g.generate(&prompt, &config(6), |_| false, |_| Ok(())).unwrap();
    assert_eq!((out.len(), stats.reused_tokens), (6, 0));
    assert_eq!(g.prompt_logprobs(), &scored[..], "the same prompt, scored again");
    assert_matches_reference(g.logprobs(), &out, &reference(&target, &prompt, &out), 2, "after the prompt");
    // Streamed: the prompt's records come with the first batch only.
    let mut batches = Vec::new();
    g.generate_emitting(
        &prompt,
        &config(6),
        |_| false,
        |e| {
            batches.push(e.prompt_logprobs.to_vec());
            Ok(())
        },
    )
    .unwrap();
    assert!(batches.len() > 1 && batches[0] == scored && batches[1..].iter().all(Vec::is_empty));
    g.set_prompt_logprobs(false);
    let (_, stats) = g.generate(&prompt, &config(2), |_| false, |_| Ok(())).unwrap();
    assert!(stats.reused_tokens > 0 && g.prompt_logprobs().is_empty());
}
