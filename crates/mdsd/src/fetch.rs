//! `mdsd fetch`: the files of a model pair fetched and verified, without generating.

use crate::models::{manifest_model, pair_manifest};
use anyhow::Context;
use engine::load::provision::ModelKind;
use std::path::Path;

/// Fetches pair `pair`'s target and draft (manifests in `models_dir`) and prints their paths.
pub fn fetch(pair: &str, models_dir: Option<&Path>) -> anyhow::Result<()> {
    let manifest = pair_manifest(pair, models_dir)?;
    for (role, source) in [("target", &manifest.target), ("draft", &manifest.draft)] {
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
