//! What `mdsd generate` and `mdsd chat` share: the flags checked before anything loads
//! ([`Plan`]), then the models loaded and a generator built on them ([`Session`]). Part of the
//! `mdsd` binary (`main.rs`), not of the library.

use crate::cli::{draft_source, note, GenerateArgs, NgramMode};
use crate::models::{model_paths, DraftFiles};
use anyhow::{bail, Context};
use engine::decode::draft::window::DraftWindow;
use engine::decode::stop::StopStrings;
use engine::decode::{check_ngram, GenerationConfig, Generator, SpecConfig, TreeChoice};
use engine::load::{load, parse_device, LoadOptions, LoadedModel};
use engine::model::eagle::EagleHead;
use engine::tokenizer::check_vocabularies;
use engine::DraftTree;
use samplers::dist::Warp;
use samplers::{DraftConstruction, Verifier};
use std::time::Instant;

/// The flags, checked: everything that can be refused without loading a model.
pub struct Plan {
    pub spec: Option<SpecConfig>,
    pub warp: Warp,
    pub verifier: Verifier,
    pub tree_name: String,
}

impl Plan {
    pub fn new(args: &GenerateArgs) -> anyhow::Result<Self> {
        let verifier = args.verifier.unwrap_or_else(|| samplers::default_verifier(args.construction()));
        let tree_name = args.tree_name();
        StopStrings::new(args.stop.clone()).map_err(|e| anyhow::anyhow!("--stop: {e}"))?;
        if args.prompt_logprobs && args.logprobs.is_none() {
            bail!("--prompt-logprobs needs --logprobs N (the alternatives per token) and --json");
        }
        if let Some(n) = args.logprobs {
            if !args.json && !args.jsonl {
                bail!("--logprobs is part of the --json output: give --json (or --jsonl) too");
            }
            if n > engine::decode::logprobs::MAX_TOP_LOGPROBS {
                bail!("--logprobs {n}: at most {} alternatives per token", engine::decode::logprobs::MAX_TOP_LOGPROBS);
            }
        }
        if args.system.is_some() && !args.chat {
            bail!("--system applies to the chat template: give --chat too");
        }
        if args.reproducible && !args.no_spec {
            if let Some(flag) =
                [("--draft-sampling", args.draft_sampling.is_some()), ("--verifier", args.verifier.is_some())]
                    .iter()
                    .find_map(|&(flag, given)| given.then_some(flag))
            {
                bail!("{flag} does not apply with --reproducible, whose drafts and verdicts are races on positional noise");
            }
        }
        let spec = if args.no_spec { None } else { Some(spec_config(args, &tree_name, verifier)?) };
        if let Some(s) = &spec {
            // The n-gram checks first: with `--ngram only` they name what its drafts need (the
            // topk verifier) before the pair check would.
            check_ngram(s).context(format!("--ngram {}", args.ngram.name()))?;
            samplers::validate_pair(s.construction, s.verifier)?;
        }
        let warp = Warp { temperature: args.temperature, top_k: args.top_k, top_p: args.top_p, min_p: args.min_p };
        warp.check()?;
        args.penalties()?;
        if spec.as_ref().is_some_and(|s| s.runs_as_chain(warp)) {
            eprintln!(
                "mdsd: warning: --tree {tree_name} branches, but at temperature 0 the draft's q is one-hot: each node \
                 drafts one token and the tree runs as a chain; --draft-temperature 1 (with --draft-sampling greedy or \
                 topk) drafts the draft's top tokens"
            );
        }
        Ok(Self { spec, warp, verifier, tree_name })
    }

    /// Loads the target and the draft model or head (explicit paths, else the pair's manifest:
    /// cache, hub, PyPI mirror).
    pub fn load(self, args: &GenerateArgs) -> anyhow::Result<Session> {
        let device = parse_device(&args.device)?;
        let need_draft = self.spec.is_some() && args.ngram != NgramMode::Only;
        let (target_path, draft_path) = model_paths(args, need_draft)?;
        let opts = LoadOptions {
            max_layers: None,
            tokenizer: args.tokenizer.clone(),
            weights: args.target_weights,
            output_rows: None,
            dtype: args.dtype,
        };
        let t0 = Instant::now();
        let mut target = load(&target_path, &device, &opts).context("loading the target model")?;
        if let Some(kwargs) = &args.chat_template_kwargs {
            target.tokenizer.set_chat_template_kwargs(kwargs.clone())?;
        }
        note(
            args,
            &format!(
                "target {} loaded in {:.1} s ({})",
                target_path.display(),
                t0.elapsed().as_secs_f64(),
                model_summary(&target.model)
            ),
        );
        let eagle = match &draft_path {
            Some(DraftFiles::Eagle(p)) => {
                let t0 = Instant::now();
                let mut head = EagleHead::load(p, &target.model).context("loading the EAGLE head")?;
                head.set_output_rows(&target.model, args.draft_vocab)
                    .context("cutting the EAGLE head's output layer")?;
                note(
                    args,
                    &format!("EAGLE head {} loaded in {:.1} s", head.path().display(), t0.elapsed().as_secs_f64()),
                );
                Some(head)
            }
            _ => None,
        };
        let draft = match &draft_path {
            Some(DraftFiles::Model(p)) => {
                let t0 = Instant::now();
                let opts = LoadOptions {
                    max_layers: args.draft_layers,
                    tokenizer: args.tokenizer.clone(),
                    weights: args.draft_weights,
                    output_rows: (args.draft_vocab > 0).then_some(args.draft_vocab),
                    dtype: args.dtype,
                };
                let d = load(p, &device, &opts).context("loading the draft model")?;
                check_vocabularies(target.tokenizer.vocab(), d.tokenizer.vocab(), &target.path, &d.path)?;
                note(
                    args,
                    &format!(
                        "draft {} loaded in {:.1} s ({})",
                        p.display(),
                        t0.elapsed().as_secs_f64(),
                        model_summary(&d.model)
                    ),
                );
                Some(d)
            }
            _ => None,
        };
        // The text may fill the target's context; a draft model with a shorter one drafts only
        // within its own (`Generator` takes plain steps past it).
        let context = target.model.config().context_length;
        if let Some(d) = draft.as_ref().filter(|d| d.model.config().context_length < context) {
            note(
                args,
                &format!(
                    "the draft's context ({} positions) is shorter than the target's ({context}): past it, steps go without its drafts",
                    d.model.config().context_length
                ),
            );
        }
        let config = GenerationConfig {
            max_new_tokens: args.max_new_tokens,
            warp: self.warp,
            seed: args.seed,
            randomness: args.randomness(),
            speculative: self.spec,
        };
        Ok(Session { target, draft, eagle, config, verifier: self.verifier, tree_name: self.tree_name, context })
    }
}

/// The loaded models and the generation settings.
pub struct Session {
    pub target: LoadedModel,
    pub draft: Option<LoadedModel>,
    pub eagle: Option<EagleHead>,
    pub config: GenerationConfig,
    pub verifier: Verifier,
    pub tree_name: String,
    /// Positions a text may fill: the target's context length (a draft model with a shorter
    /// one drafts only within it).
    pub context: usize,
}

impl Session {
    /// Most nodes one step's tree has at the session's warp (1 for plain decoding; `auto`
    /// drafts wider trees at temperature > 0).
    pub fn tree_len(&self) -> usize {
        self.config.speculative.as_ref().map_or(1, |s| s.max_tree_len(self.config.warp))
    }

    /// Cache positions for prompts of up to `prompt_tokens` and `max_new_tokens` new tokens:
    /// with room for two of the largest trees besides, at most the context.
    pub fn capacity(&self, prompt_tokens: usize, max_new_tokens: usize) -> usize {
        prompt_tokens.saturating_add(max_new_tokens).saturating_add(2 * self.tree_len() + 1).min(self.context)
    }

    /// A generator with caches of `capacity` positions and the `--draft-window`.
    pub fn generator(&self, args: &GenerateArgs, capacity: usize) -> anyhow::Result<Generator<'_>> {
        let mut generator = match &self.eagle {
            Some(head) => Generator::with_eagle(&self.target.model, head, capacity)?,
            None => Generator::new(&self.target.model, self.draft.as_ref().map(|d| &d.model), capacity)?,
        };
        let window = args.draft_window.unwrap_or(DraftWindow::default_recent(args.ngram == NgramMode::First));
        if window > 0 {
            generator.set_draft_window(Some(DraftWindow::new(args.draft_sinks, window)?));
        }
        let vocab = self.target.model.config().vocab_size;
        if let Some((id, _)) = args.logit_bias.iter().find(|(id, _)| *id as usize >= vocab) {
            bail!("--logit-bias {id}=...: the target's vocabulary has {vocab} tokens");
        }
        generator.set_logit_bias(args.logit_bias.clone());
        generator.set_penalties(args.penalties()?);
        Ok(generator)
    }

    /// `n` generators as [`Self::generator`] makes them, for generations that run at once
    /// (`serve`'s slots, `--jsonl --max-batch`): they run the same models, so `--tree auto`
    /// times them once for all (`engine::decode::auto_tree::CostBook`).
    pub fn generators(&self, args: &GenerateArgs, capacity: usize, n: usize) -> anyhow::Result<Vec<Generator<'_>>> {
        let costs = engine::decode::auto_tree::CostBook::new();
        (0..n)
            .map(|_| {
                let mut generator = self.generator(args, capacity)?;
                generator.share_costs(costs.clone());
                Ok(generator)
            })
            .collect()
    }

    /// The draft window a generator of this session uses (`None`: none, or no draft model).
    pub fn window(&self, generator: &Generator, args: &GenerateArgs) -> Option<DraftWindow> {
        generator.draft_window().filter(|_| self.draft.is_some() && !args.no_spec)
    }

    /// The draft model's or EAGLE head's path.
    pub fn draft_name(&self) -> Option<String> {
        match (&self.draft, &self.eagle) {
            (Some(d), _) => Some(d.path.display().to_string()),
            (None, Some(h)) => Some(h.path().display().to_string()),
            (None, None) => None,
        }
    }

    /// Refuses a prompt of `tokens` that leaves no room for a new token in `capacity` positions.
    /// Trees need no more: near the end of the context the decoding loop takes plain steps
    /// (`Generator::generate`).
    pub fn check_fits(&self, tokens: usize, capacity: usize, what: &str) -> anyhow::Result<()> {
        if tokens + 1 >= capacity {
            bail!(
                "the {what} has {tokens} tokens, too long for the context of {capacity} positions of {}",
                self.target.path.display()
            );
        }
        Ok(())
    }
}

/// `--tree`, `--draft-sampling`, `--verifier` and the draft flags as one configuration.
fn spec_config(args: &GenerateArgs, tree_name: &str, verifier: Verifier) -> anyhow::Result<SpecConfig> {
    if args.ngram == NgramMode::Only {
        let model_flags = [
            ("--draft", args.draft.is_some()),
            ("--eagle", args.eagle.is_some()),
            ("--draft-sampling", args.draft_sampling.is_some()),
            ("--draft-temperature", args.draft_temperature.is_some()),
            ("--draft-layers", args.draft_layers.is_some()),
        ];
        if let Some((flag, _)) = model_flags.iter().find(|f| f.1) {
            bail!("{flag} does not apply to --ngram only, which drafts without a draft model");
        }
    }
    let tree = if tree_name == "auto" {
        if args.construction() == DraftConstruction::SpecHub {
            bail!("--tree auto picks among chains and trees that --draft-sampling spechub (2 drafts per node) cannot draw; give a tree");
        }
        TreeChoice::Auto
    } else {
        let tree = DraftTree::load(tree_name).with_context(|| {
            format!("--tree `{tree_name}` (it takes a preset, `auto`, an EAGLE path list such as `[[0],[1],[0,0]]`, or a TOML file as in configs/trees/)")
        })?;
        if args.construction() == DraftConstruction::SpecHub {
            if let Some(i) = (0..tree.len()).find(|&i| ![0, 2].contains(&tree.children(i).len())) {
                bail!(
                    "--draft-sampling spechub draws exactly 2 drafts per node, but node {i} of tree `{}` has {} (chain-D-forks-D and drafts-2-depth-D fit)",
                    tree_name,
                    match tree.children(i).len() {
                        1 => "1 child".to_string(),
                        n => format!("{n} children"),
                    }
                );
            }
        }
        TreeChoice::Fixed(tree)
    };
    let draft_warp = args.draft_temperature.map(|t| Warp {
        temperature: t,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
    });
    if !(0.0..=1.0).contains(&args.draft_confidence) {
        bail!("--draft-confidence must be in [0, 1], got {}", args.draft_confidence);
    }
    Ok(SpecConfig {
        tree,
        construction: args.construction(),
        verifier,
        draft_warp,
        confidence_cutoff: args.draft_confidence,
        source: draft_source(args)?,
    })
}

/// `N layers`, and the context and rotary scaling when the model scales its rotary embedding.
fn model_summary(model: &engine::model::DecoderModel) -> String {
    let c = model.config();
    let layers = match model.num_layers() {
        1 => "1 layer".to_string(),
        n => format!("{n} layers"),
    };
    match c.rope_scaling.describe() {
        Some(scaling) => format!("{layers}, {scaling}, context {}", c.context_length),
        None => layers,
    }
}
