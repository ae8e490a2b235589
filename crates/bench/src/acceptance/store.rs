//! The target and draft distributions at every response position, kept on the tokens that
//! matter, and their file format (safetensors).
//!
//! Full-vocabulary rows (151,936 floats each) would take gigabytes per dataset, so each
//! position keeps the union of the `keep` largest target logits and the `keep` largest draft
//! logits, both models' logits on that union, and the probability mass (at temperature 1)
//! that the union holds for each model. Below temperature 1 the dropped tokens hold even less
//! mass (the dropped set is a lower set of logits, whose mass shrinks as the temperature
//! falls), so the stored mass bounds the truncation at every temperature of the study.

use anyhow::{bail, Context};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::Path;

/// Distributions of one dataset, position by position (flattened, with offsets).
#[derive(Debug, Clone, Default)]
pub struct Positions {
    /// How they were made (pair, dataset, prompts, temperature, keep, revision).
    pub meta: serde_json::Value,
    /// Position `i` owns entries `offsets[i]..offsets[i + 1]`.
    pub offsets: Vec<u32>,
    pub ids: Vec<u32>,
    pub target_logits: Vec<f32>,
    pub draft_logits: Vec<f32>,
    /// Mass of the kept tokens under softmax(logits) over the full vocabulary.
    pub target_kept: Vec<f32>,
    pub draft_kept: Vec<f32>,
    /// Index of the prompt (the response) the position belongs to.
    pub prompt: Vec<u32>,
}

/// One position's kept tokens and logits.
pub struct Position<'a> {
    pub target: &'a [f32],
    pub draft: &'a [f32],
}

impl Positions {
    pub fn new(meta: serde_json::Value) -> Self {
        Self { meta, offsets: vec![0], ..Self::default() }
    }

    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn get(&self, i: usize) -> Position<'_> {
        let (a, b) = (self.offsets[i] as usize, self.offsets[i + 1] as usize);
        Position { target: &self.target_logits[a..b], draft: &self.draft_logits[a..b] }
    }

    /// Appends one position.
    pub fn push(&mut self, prompt: u32, ids: &[u32], target: &[f32], draft: &[f32], kept: (f32, f32)) {
        debug_assert!(ids.len() == target.len() && ids.len() == draft.len());
        self.ids.extend_from_slice(ids);
        self.target_logits.extend_from_slice(target);
        self.draft_logits.extend_from_slice(draft);
        self.offsets.push(self.ids.len() as u32);
        self.target_kept.push(kept.0);
        self.draft_kept.push(kept.1);
        self.prompt.push(prompt);
    }

    /// Number of distinct prompts (responses).
    pub fn prompts(&self) -> usize {
        self.prompt.iter().max().map_or(0, |&m| m as usize + 1)
    }

    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let cpu = &Device::Cpu;
        let meta = serde_json::to_vec(&self.meta)?;
        let mut t: HashMap<String, Tensor> = HashMap::new();
        let n = meta.len();
        t.insert("meta_json".into(), Tensor::from_vec(meta, n, cpu)?);
        let put = |t: &mut HashMap<String, Tensor>, k: &str, v: Tensor| t.insert(k.to_string(), v);
        put(&mut t, "offsets", Tensor::from_slice(&self.offsets, self.offsets.len(), cpu)?);
        put(&mut t, "ids", Tensor::from_slice(&self.ids, self.ids.len(), cpu)?);
        put(&mut t, "target_logits", Tensor::from_slice(&self.target_logits, self.ids.len(), cpu)?);
        put(&mut t, "draft_logits", Tensor::from_slice(&self.draft_logits, self.ids.len(), cpu)?);
        put(&mut t, "target_kept", Tensor::from_slice(&self.target_kept, self.len(), cpu)?);
        put(&mut t, "draft_kept", Tensor::from_slice(&self.draft_kept, self.len(), cpu)?);
        put(&mut t, "prompt", Tensor::from_slice(&self.prompt, self.len(), cpu)?);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        // Written beside, then renamed: an interrupted save never leaves a half file.
        let tmp = path.with_extension("partial");
        candle_core::safetensors::save(&t, &tmp).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
        Ok(())
    }

    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let bad = |what: String| {
            anyhow::anyhow!("{}: not a distributions file of `bench acceptance`: {what}", path.display())
        };
        let t = candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| bad(e.to_string()))?;
        let get = |k: &str| t.get(k).ok_or_else(|| bad(format!("no tensor `{k}`")));
        let u32s =
            |k: &str| -> anyhow::Result<Vec<u32>> { get(k)?.to_vec1::<u32>().map_err(|e| bad(format!("`{k}`: {e}"))) };
        let f32s =
            |k: &str| -> anyhow::Result<Vec<f32>> { get(k)?.to_vec1::<f32>().map_err(|e| bad(format!("`{k}`: {e}"))) };
        let meta_bytes = get("meta_json")?.to_vec1::<u8>().map_err(|e| bad(e.to_string()))?;
        let p = Self {
            meta: serde_json::from_slice(&meta_bytes).map_err(|e| bad(format!("metadata: {e}")))?,
            offsets: u32s("offsets")?,
            ids: u32s("ids")?,
            target_logits: f32s("target_logits")?,
            draft_logits: f32s("draft_logits")?,
            target_kept: f32s("target_kept")?,
            draft_kept: f32s("draft_kept")?,
            prompt: u32s("prompt")?,
        };
        let n = p.offsets.len().saturating_sub(1);
        let total = p.ids.len();
        let consistent = !p.offsets.is_empty()
            && p.offsets[0] == 0
            && p.offsets.windows(2).all(|w| w[0] <= w[1])
            && p.offsets[n] as usize == total
            && p.target_logits.len() == total
            && p.draft_logits.len() == total
            && [p.target_kept.len(), p.draft_kept.len(), p.prompt.len()].iter().all(|&l| l == n);
        if !consistent {
            bail!(bad("the tensors' lengths disagree".into()));
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_and_load_round_trip_and_reject_garbage() {
        let mut p = Positions::new(serde_json::json!({"dataset": "alpaca"}));
        p.push(0, &[3, 1], &[0.5, -1.0], &[0.1, 0.2], (0.9, 0.8));
        p.push(1, &[7], &[2.0], &[-3.0], (1.0, 0.5));
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let path = dir.join("d.safetensors");
        p.save(&path).unwrap();
        let q = Positions::load(&path).unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(q.meta["dataset"], "alpaca");
        let x = q.get(0);
        assert_eq!((x.target, x.draft), (&[0.5f32, -1.0][..], &[0.1f32, 0.2][..]));
        assert_eq!((&q.ids[..], &q.prompt[..], &q.offsets[..]), (&[3u32, 1, 7][..], &[0u32, 1][..], &[0u32, 2, 3][..]));
        assert_eq!(q.prompts(), 2);
        std::fs::write(dir.join("bad.safetensors"), b"not a file").unwrap();
        let e = Positions::load(&dir.join("bad.safetensors")).unwrap_err().to_string();
        assert!(e.contains("bad.safetensors") && e.contains("not a distributions file"), "{e}");
    }
}
