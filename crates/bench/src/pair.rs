//! The model pair of a benchmark: a manifest in `models/`, or explicit files.

use anyhow::Context;
use candle_core::Device;
use clap::Args;
use engine::load::{load, LoadOptions, LoadedModel};
use engine::provision::{resolve, FetchOptions, PairManifest};
use engine::tokenizer::check_vocabularies;
use std::path::{Path, PathBuf};

#[derive(Args, Debug, Clone)]
pub struct PairArgs {
    /// Model pair manifest (a name in `models/` or a TOML file).
    #[arg(long, default_value = "qwen2.5-coder-1.5b-0.5b")]
    pub pair: String,
    /// Target model file (default: the pair's).
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// Draft model file (default: the pair's).
    #[arg(long)]
    pub draft: Option<PathBuf>,
}

impl PairArgs {
    /// The target and draft files: the explicit paths, else the pair manifest's (cache, hub,
    /// PyPI mirror).
    pub fn files(&self) -> anyhow::Result<(PathBuf, PathBuf)> {
        let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
        let needs_manifest = self.target.is_none() || self.draft.is_none();
        let manifest = if needs_manifest { Some(PairManifest::find(&self.pair, &models)?) } else { None };
        let fetch = FetchOptions::default();
        let target = match (&self.target, &manifest) {
            (Some(p), _) => p.clone(),
            (None, Some(m)) => resolve(&m.target, None, &fetch)?,
            (None, None) => unreachable!("a manifest is read when a file is missing"),
        };
        let draft = match (&self.draft, &manifest) {
            (Some(p), _) => p.clone(),
            (None, Some(m)) => resolve(&m.draft, None, &fetch)?,
            (None, None) => unreachable!("a manifest is read when a file is missing"),
        };
        Ok((target, draft))
    }

    /// A short label of the pair for reports: the manifest name, or the two file names.
    pub fn label(&self) -> String {
        match (&self.target, &self.draft) {
            (None, None) => self.pair.clone(),
            _ => {
                let name = |p: &Option<PathBuf>| {
                    p.as_ref()
                        .and_then(|p| p.file_name())
                        .map_or_else(|| self.pair.clone(), |n| n.to_string_lossy().into_owned())
                };
                format!("{} + {}", name(&self.target), name(&self.draft))
            }
        }
    }

    /// Loads both models on `device` and checks that their vocabularies agree.
    pub fn load(&self, device: &Device, draft_opts: &LoadOptions) -> anyhow::Result<(LoadedModel, LoadedModel)> {
        let (target_path, draft_path) = self.files()?;
        let target = load(&target_path, device, &LoadOptions::default())
            .with_context(|| format!("loading the target {}", target_path.display()))?;
        let draft = load(&draft_path, device, draft_opts)
            .with_context(|| format!("loading the draft {}", draft_path.display()))?;
        check_vocabularies(target.tokenizer.vocab(), draft.tokenizer.vocab(), &target_path, &draft_path)?;
        Ok((target, draft))
    }
}
