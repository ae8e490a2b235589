//! The model pair of a benchmark: a manifest in `models/`, or explicit files. The draft is a
//! draft model or an EAGLE head (`--eagle`, or a manifest whose draft has `kind =
//! "eagle-head"`, as `vicuna-7b-eagle`).

use anyhow::Context;
use candle_core::Device;
use clap::Args;
use engine::load::provision::{resolve, FetchOptions, ModelKind, PairManifest};
use engine::load::{load, LoadOptions, LoadedModel};
use engine::model::eagle::EagleHead;
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
    /// An EAGLE-1 head folder as the draft instead of a draft model.
    #[arg(long, conflicts_with = "draft")]
    pub eagle: Option<PathBuf>,
}

/// The draft of a pair, as files.
pub enum DraftFile {
    Model(PathBuf),
    EagleHead(PathBuf),
}

impl DraftFile {
    /// The draft model's file or the head's folder.
    pub fn path(&self) -> &Path {
        match self {
            Self::Model(p) | Self::EagleHead(p) => p,
        }
    }
}

/// The draft of a pair, loaded.
#[allow(clippy::large_enum_variant)] // one per run; both variants are a few hundred bytes
pub enum LoadedDraft {
    Model(LoadedModel),
    EagleHead(EagleHead),
}

impl LoadedDraft {
    /// The draft model's file or the head's weight file.
    pub fn path(&self) -> &Path {
        match self {
            Self::Model(m) => &m.path,
            Self::EagleHead(h) => h.path(),
        }
    }
}

impl PairArgs {
    /// The target file and the draft, a model or an EAGLE head: the explicit paths, else the
    /// pair manifest's (cache, hub, PyPI mirror).
    pub fn draft_files(&self) -> anyhow::Result<(PathBuf, DraftFile)> {
        let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
        let explicit_draft = self.draft.is_some() || self.eagle.is_some();
        let needs_manifest = self.target.is_none() || !explicit_draft;
        let manifest = if needs_manifest { Some(PairManifest::find(&self.pair, &models)?) } else { None };
        let fetch = FetchOptions::default();
        let target = match (&self.target, &manifest) {
            (Some(p), _) => p.clone(),
            (None, Some(m)) => resolve(&m.target, None, &fetch)?,
            (None, None) => unreachable!("a manifest is read when a file is missing"),
        };
        let draft = match (&self.draft, &self.eagle, &manifest) {
            (Some(p), _, _) => DraftFile::Model(p.clone()),
            (None, Some(h), _) => DraftFile::EagleHead(h.clone()),
            (None, None, Some(m)) => {
                let path = resolve(&m.draft, None, &fetch)?;
                if m.draft.kind == ModelKind::EagleHead {
                    DraftFile::EagleHead(path)
                } else {
                    DraftFile::Model(path)
                }
            }
            (None, None, None) => unreachable!("a manifest is read when the draft is not given"),
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
                format!("{} + {}", name(&self.target), name(&self.draft.clone().or_else(|| self.eagle.clone())))
            }
        }
    }

    /// Loads the target and the draft on `device`: a draft model (whose vocabulary must agree
    /// with the target's) or an EAGLE head (whose hidden size and vocabulary are checked
    /// against the target's). A head computes q for the first `draft_opts.output_rows` ids, as
    /// a draft model does (`--draft-vocab`).
    pub fn load(&self, device: &Device, draft_opts: &LoadOptions) -> anyhow::Result<(LoadedModel, LoadedDraft)> {
        let (target_path, draft) = self.draft_files()?;
        let target = load_target(&target_path, device)?;
        let draft = match draft {
            DraftFile::Model(p) => LoadedDraft::Model(load_draft_model(&target, &p, device, draft_opts)?),
            DraftFile::EagleHead(dir) => {
                let mut head = EagleHead::load(&dir, &target.model)
                    .with_context(|| format!("loading the EAGLE head {}", dir.display()))?;
                head.set_output_rows(&target.model, draft_opts.output_rows.unwrap_or(0))?;
                LoadedDraft::EagleHead(head)
            }
        };
        Ok((target, draft))
    }
}

fn load_target(path: &Path, device: &Device) -> anyhow::Result<LoadedModel> {
    load(path, device, &LoadOptions::default()).with_context(|| format!("loading the target {}", path.display()))
}

fn load_draft_model(
    target: &LoadedModel,
    path: &Path,
    device: &Device,
    opts: &LoadOptions,
) -> anyhow::Result<LoadedModel> {
    let draft = load(path, device, opts).with_context(|| format!("loading the draft {}", path.display()))?;
    check_vocabularies(target.tokenizer.vocab(), draft.tokenizer.vocab(), &target.path, path)?;
    Ok(draft)
}
