//! Where the model files come from: paths and hub ids given on the command line, else the
//! pair's manifest in `models/` (fetched into the cache when missing).

use crate::cli::GenerateArgs;
use anyhow::Context;
use engine::load::provision::{resolve, resolve_cli, FetchOptions, ModelKind, ModelSource, PairManifest};
use std::path::{Path, PathBuf};

/// The draft's files: a draft model, or an EAGLE head folder.
pub enum DraftFiles {
    Model(PathBuf),
    Eagle(PathBuf),
}

/// The target and draft files: explicit paths (or hub ids) first, the pair's manifest for
/// the rest.
pub fn model_paths(args: &GenerateArgs, need_draft: bool) -> anyhow::Result<(PathBuf, Option<DraftFiles>)> {
    let explicit_draft = args.draft.is_some() || args.eagle.is_some();
    let manifest = if args.target.is_none() || (need_draft && !explicit_draft) {
        Some(pair_manifest(&args.pair, args.models_dir.as_deref())?)
    } else {
        None
    };
    let target = match (&args.target, &manifest) {
        (Some(t), _) => cli_model(t)?,
        (None, Some(m)) => manifest_model(&m.target, "target", &args.pair)?,
        (None, None) => unreachable!("a manifest is read when --target is missing"),
    };
    let draft = match (need_draft, &args.draft, &args.eagle, &manifest) {
        (false, ..) => None,
        (true, Some(d), _, _) => Some(DraftFiles::Model(cli_model(d)?)),
        (true, None, Some(e), _) => Some(DraftFiles::Eagle(cli_model(e)?)),
        (true, None, None, Some(m)) => {
            let path = manifest_model(&m.draft, "draft", &args.pair)?;
            Some(if m.draft.kind == ModelKind::EagleHead { DraftFiles::Eagle(path) } else { DraftFiles::Model(path) })
        }
        (true, None, None, None) => unreachable!("a manifest is read when no draft is given"),
    };
    Ok((target, draft))
}

/// A model given on the command line: a path, or a hub id fetched ([`resolve_cli`]).
pub fn cli_model(spec: &str) -> anyhow::Result<PathBuf> {
    resolve_cli(spec, &FetchOptions::default()).with_context(|| format!("resolving `{spec}`"))
}

/// The target a command names: `--target` (a path or hub id) if given, else pair `pair`'s
/// (its manifest in `models_dir`).
pub fn target_path(target: Option<&str>, pair: &str, models_dir: Option<&Path>) -> anyhow::Result<PathBuf> {
    match target {
        Some(t) => cli_model(t),
        None => manifest_model(&pair_manifest(pair, models_dir)?.target, "target", pair),
    }
}

/// The manifest of model pair `pair` in `models_dir` (default: [`default_models_dir`]).
pub fn pair_manifest(pair: &str, models_dir: Option<&Path>) -> anyhow::Result<PairManifest> {
    Ok(PairManifest::find(pair, &models_dir.map_or_else(default_models_dir, Path::to_path_buf))?)
}

/// The `role` model of pair `pair`'s manifest: from the cache, else fetched ([`resolve`]). A
/// head trained here ([`ModelSource::train_eagle`]) must have been trained by `mdsd fetch`.
pub fn manifest_model(source: &ModelSource, role: &str, pair: &str) -> anyhow::Result<PathBuf> {
    if let Some(recipe) = &source.train_eagle {
        let head = recipe_head(pair, recipe);
        if head.join("config.json").is_file() && head.join("model.safetensors").is_file() {
            return Ok(head);
        }
        anyhow::bail!(
            "the {role} of {pair} is an EAGLE head trained on this machine, not downloaded: run `mdsd fetch {pair}` \
             first (it trains it: about {:.1} hours on {}, resumable)",
            recipe.hours,
            recipe.measured_on
        );
    }
    resolve(source, None, &FetchOptions::default()).with_context(|| format!("fetching the {role} of {pair}"))
}

/// Where `mdsd fetch` trains pair `pair`'s EAGLE head (`head/` inside it when done; a second
/// stage's in `refined/head`: [`recipe_head`]).
pub fn trained_head_dir(pair: &str) -> PathBuf {
    engine::load::provision::cache_dir().join("trained").join(pair)
}

/// The head pair `pair`'s recipe ends with: `head/` of [`trained_head_dir`], or `refined/head`
/// for a recipe with a second stage.
pub fn recipe_head(pair: &str, recipe: &engine::load::provision::TrainRecipe) -> PathBuf {
    match recipe.then {
        Some(_) => trained_head_dir(pair).join("refined").join("head"),
        None => trained_head_dir(pair).join("head"),
    }
}

/// `./models` when it exists, else the repository's `models/` (for `cargo run`).
pub fn default_models_dir() -> PathBuf {
    let local = PathBuf::from("models");
    if local.is_dir() {
        local
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
    }
}
