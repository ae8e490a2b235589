//! Temperature-0 exactness of a transformed target (a logit bias, penalties) under every kind
//! of tree and every draft source.

use super::law::spec;
use engine::decode::draft::ngram::NgramConfig;
use engine::decode::{DraftSource, GenerationConfig, Generator, SpecConfig, Stats, TreeChoice};
use engine::model::eagle::EagleHead;
use engine::model::DecoderModel;
use engine::DraftTree;
use samplers::dist::Warp;
use samplers::{DraftConstruction, Verifier};

fn fixed(name: &str) -> TreeChoice {
    TreeChoice::Fixed(DraftTree::preset(name).unwrap())
}

/// The trees and drafts of [`assert_every_source_equals_plain`]: `chain-4` greedy,
/// `drafts-2-depth-3` top-k and `mc_sim_7b_63` WOR+RRS (drafts at temperature 1), `auto`, and
/// lookup first.
pub fn every_kind_of_tree() -> Vec<(&'static str, SpecConfig)> {
    let topk = Some(Warp::temperature(1.0));
    let ngram =
        DraftSource::NgramFirst { ngram: NgramConfig { min: 1, max: 3 }, tree: DraftTree::preset("chain-3").unwrap() };
    vec![
        ("chain-4 greedy", spec(fixed("chain-4"), DraftConstruction::Greedy, Verifier::Greedy, None, 0.0)),
        ("drafts-2-depth-3 topk", spec(fixed("drafts-2-depth-3"), DraftConstruction::TopK, Verifier::TopK, topk, 0.0)),
        (
            "mc_sim_7b_63 wor",
            spec(fixed("mc_sim_7b_63"), DraftConstruction::WithoutReplacement, Verifier::Rrs, topk, 0.0),
        ),
        ("auto", spec(TreeChoice::Auto, DraftConstruction::Greedy, Verifier::Greedy, None, 0.0)),
        (
            "lookup first",
            SpecConfig {
                source: ngram,
                ..spec(fixed("chain-2"), DraftConstruction::Greedy, Verifier::Greedy, None, 0.0)
            },
        ),
    ]
}

/// At temperature 0 (`base`, plain), every tree of [`every_kind_of_tree`] with the target
/// drafting for itself, `draft` and `head`, each generator set up by `setup`, emits `plain`;
/// the target's own drafts keep being accepted (tau > 1.5 on the fixed trees). Returns each
/// run's `(tree, source, stats)`.
pub fn assert_every_source_equals_plain(
    (target, draft, head): (&DecoderModel, &DecoderModel, &EagleHead),
    prompt: &[u32],
    base: &GenerationConfig,
    plain: &[u32],
    setup: impl Fn(&mut Generator),
) -> Vec<(&'static str, &'static str, Stats)> {
    let mut runs = Vec::new();
    for (name, s) in every_kind_of_tree() {
        let config = GenerationConfig { speculative: Some(s.clone()), ..base.clone() };
        for (source, mut g) in [
            ("self", Generator::new(target, Some(target), 200).unwrap()),
            ("1-layer", Generator::new(target, Some(draft), 200).unwrap()),
            ("EAGLE", Generator::with_eagle(target, head, 200).unwrap()),
        ] {
            setup(&mut g);
            let (out, stats) = g.generate(prompt, &config, |_| false, |_| Ok(())).unwrap();
            assert_eq!(out, plain, "{name}, {source}");
            if source == "self" && name != "auto" && name != "lookup first" {
                assert!(stats.tau > 1.5, "{name}: the target's own drafts, tau {}", stats.tau);
            }
            runs.push((name, source, stats));
        }
    }
    runs
}
