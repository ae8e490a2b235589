//! `mdsd fetch`: the files of a model pair fetched and verified, without generating.

use crate::models::{manifest_model, pair_manifest};
use anyhow::Context;
use clap::Parser;
use engine::load::provision::ModelKind;
use engine::load::provision::TrainRecipe;
use std::path::Path;

/// `mdsd train-eagle`'s flags, parsed from a manifest's recipe.
#[derive(Parser)]
struct RecipeArgs {
    #[command(flatten)]
    args: crate::train_eagle::TrainEagleArgs,
}

/// Trains pair `pair`'s EAGLE head for `target` by its recipe into the cache, unless it is
/// there (an interrupted run resumes), saying first how long it takes: `args`, then `then`'s
/// stage when the recipe has one.
fn train_head(pair: &str, recipe: &TrainRecipe, target: &Path) -> anyhow::Result<()> {
    let out = crate::models::trained_head_dir(pair);
    if crate::models::recipe_head(pair, recipe).join("model.safetensors").is_file() {
        return Ok(());
    }
    let stages = match &recipe.then {
        Some(then) => format!("`mdsd train-eagle {}`, then `{}`", recipe.args.join(" "), then.join(" ")),
        None => format!("`mdsd train-eagle {}`", recipe.args.join(" ")),
    };
    eprintln!(
        "mdsd: {pair}'s EAGLE head is trained here, not downloaded: {stages} into {} \
         (about {:.1} hours on {}; stop it any time, `mdsd fetch {pair}` resumes)",
        out.display(),
        recipe.hours,
        recipe.measured_on
    );
    let run = |args: &[String], extra: Vec<String>| -> anyhow::Result<()> {
        let mut argv: Vec<String> = vec!["train-eagle".into(), "--target".into(), target.display().to_string()];
        argv.extend(args.iter().cloned());
        argv.extend(extra);
        let parsed =
            RecipeArgs::try_parse_from(&argv).with_context(|| format!("the recipe of {pair}: {}", argv.join(" ")))?;
        crate::train_eagle::train_eagle(parsed.args)
    };
    let path = |p: &Path| p.display().to_string();
    if !out.join("head/model.safetensors").is_file() {
        run(&recipe.args, vec!["--out".into(), path(&out)])?;
    }
    if let Some(then) = &recipe.then {
        let refined = out.join("refined");
        let extra = ["--out", &path(&refined), "--reuse", &path(&out), "--init-head", &path(&out.join("head"))];
        run(then, extra.iter().map(|s| s.to_string()).collect())?;
    }
    Ok(())
}

/// Fetches pair `pair`'s target and draft (manifests in `models_dir`) and prints their paths.
pub fn fetch(pair: &str, models_dir: Option<&Path>) -> anyhow::Result<()> {
    let manifest = pair_manifest(pair, models_dir)?;
    for (role, source) in [("target", &manifest.target), ("draft", &manifest.draft)] {
        if let Some(recipe) = &source.train_eagle {
            train_head(pair, recipe, &manifest_model(&manifest.target, "target", pair)?)?;
        }
        let path = manifest_model(source, role, pair)?;
        println!("{role}: {}", path.display());
        // A GGUF draft is loaded `fast-cpu` by default: convert it now, not at the
        // first `generate` (see `engine::load::converted`).
        if role == "draft" && source.kind == ModelKind::Model && engine::load::is_gguf_file(&path) {
            let mut file = engine::load::gguf::GgufFile::open(&path)?;
            if let Some(copy) = engine::load::converted::ensure(&mut file, &engine::load::provision::cache_dir())
                .with_context(|| format!("converting the draft {} for the CPU", path.display()))?
            {
                println!("draft, converted for the CPU: {}", copy.display());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::RecipeArgs;
    use clap::Parser;
    use engine::load::provision::PairManifest;

    /// Every recipe in `models/` is flags `train-eagle` takes (both stages): a typo there would
    /// otherwise surface only when a user fetches the pair, hours before training.
    #[test]
    fn every_manifest_recipe_parses_as_train_eagle_flags() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
        let mut recipes = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "toml") {
                continue;
            }
            let manifest = PairManifest::load(&path).unwrap();
            let Some(recipe) = manifest.draft.train_eagle else { continue };
            for stage in std::iter::once(&recipe.args).chain(recipe.then.as_ref()) {
                let argv = ["train-eagle", "--target", "t.gguf", "--out", "o"].map(String::from);
                let parsed = RecipeArgs::try_parse_from(argv.iter().chain(stage));
                assert!(parsed.is_ok(), "{}: {stage:?}: {}", path.display(), parsed.err().unwrap());
            }
            assert!(recipe.hours > 0.0 && !recipe.measured_on.is_empty(), "{}", path.display());
            recipes += 1;
        }
        assert!(recipes >= 1, "no manifest in {} has a recipe", dir.display());
    }
}
