//! A forward step whose inputs live in one device buffer ([`StepInputs`]), for forwards that a
//! CUDA graph replays ([`DecoderModel::forward_step`]): the token ids, positions, each row's
//! mask over the step's rows and the cache length are words of the buffer
//! ([`StepLayout`]), written by one copy per step, and the device kernels read them there; no
//! kernel argument changes between steps, and the attention runs over chunks of the whole cache
//! buffer. A step has a fixed number of rows (a bucket); rows past the live ones are padding,
//! each seeing only the cache and itself, their outputs ignored.

use super::{block_residual, DecoderModel, KvCache, Part, Residual, Rope, Visibility};
use crate::kernels::device::graph::DeviceGraph;
use crate::kernels::device::{StepLayout, WriteWords};
use candle_core::{DType, Device, Result, Tensor};

/// The inputs of a step of `rows` rows, on the host and in their device buffer.
pub struct StepInputs {
    layout: StepLayout,
    words: Vec<u32>,
    buffer: Tensor,
    live: usize,
    vocab: usize,
}

impl StepInputs {
    /// Inputs of steps of `rows` rows (1 to [`StepLayout::MAX_ROWS`]) for a model with `vocab`
    /// token ids, in a buffer on `device`.
    pub fn new(rows: usize, vocab: usize, device: &Device) -> Result<Self> {
        if rows == 0 || rows > StepLayout::MAX_ROWS {
            candle_core::bail!("a step has 1 to {} rows, not {rows}", StepLayout::MAX_ROWS);
        }
        let layout = StepLayout { rows };
        let buffer = Tensor::zeros(layout.len(), DType::U32, device)?;
        Ok(Self { layout, words: vec![0; layout.len()], buffer, live: 0, vocab })
    }

    /// Rows of a step, live and padding.
    pub fn rows(&self) -> usize {
        self.layout.rows
    }

    /// Rows of the step set last.
    pub fn live(&self) -> usize {
        self.live
    }

    /// The device buffer (`[4 rows + 1]`, u32) the kernels read.
    pub fn tensor(&self) -> &Tensor {
        &self.buffer
    }

    /// Sets the next step: `tokens` at `positions` after `start` cached positions, row `r`
    /// seeing every cached position before `tail` (at most `start`) and, from there, key
    /// `tail + c` when bit `c` of `masks[r]` is set (its own key, `start - tail + r`, included;
    /// none after it), and writes it to the device buffer (one copy). A target's tree step has
    /// `tail = start` (the masks cover the step's rows); a draft's tree level starts its tail
    /// at the step's first drafted node. Padding rows repeat the last live row's token and
    /// position and see only what is before the tail and themselves.
    pub fn set(&mut self, tokens: &[u32], positions: &[u32], masks: &[u64], start: usize, tail: usize) -> Result<()> {
        let (live, rows) = (tokens.len(), self.layout.rows);
        if live == 0 || live > rows || positions.len() != live || masks.len() != live {
            candle_core::bail!(
                "a step of {rows} rows: {live} tokens, {} positions and {} masks",
                positions.len(),
                masks.len()
            );
        }
        if tail > start || start - tail + rows > StepLayout::MAX_ROWS {
            candle_core::bail!(
                "a step of {rows} rows at {start}: its masks cover at most {} keys, from {tail}",
                StepLayout::MAX_ROWS
            );
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.vocab) {
            candle_core::bail!("token id {bad} is outside the vocabulary of {} tokens", self.vocab);
        }
        let own = |r: usize| start - tail + r;
        let bad_mask = |r: usize| (masks[r] >> own(r)) & 1 == 0 || (own(r) < 63 && masks[r] >> (own(r) + 1) != 0);
        if let Some(r) = (0..live).find(|&r| bad_mask(r)) {
            candle_core::bail!("step row {r}'s mask {:#x} must hold the row itself and no later row", masks[r]);
        }
        let number = |n: usize| u32::try_from(n).map_err(|_| candle_core::Error::Msg(format!("cache position {n}")));
        let l = self.layout;
        for r in 0..rows {
            let (token, position, mask) = if r < live {
                (tokens[r], positions[r], masks[r])
            } else {
                (tokens[live - 1], positions[live - 1], 1u64 << own(r))
            };
            self.words[l.tokens().start + r] = token;
            self.words[l.positions().start + r] = position;
            self.words[l.masks().start + 2 * r] = mask as u32;
            self.words[l.masks().start + 2 * r + 1] = (mask >> 32) as u32;
        }
        self.words[l.start()] = number(start)?;
        self.words[l.tail()] = number(tail)?;
        self.live = live;
        self.buffer.inplace_op1(&WriteWords(&self.words))
    }

    /// The additive bias `[live, start + live]` (in `dtype`) that says what the live rows see:
    /// what [`DecoderModel::forward`] takes for the same step.
    pub fn bias(&self, dtype: DType, device: &Device) -> Result<Tensor> {
        let total = self.words[self.layout.start()] as usize + self.live;
        let values: Vec<f32> = (0..self.live)
            .flat_map(|r| (0..total).map(move |j| (r, j)))
            .map(|(r, j)| self.layout.bias(&self.words, r, j))
            .collect();
        Tensor::from_vec(values, (self.live, total), device)?.to_dtype(dtype)
    }
}

/// Graph-replayed step forwards of one model on one cache ([`DecoderModel::forward_step`], or
/// an EAGLE head's, [`Self::forward_head`]): a step of `n` live rows runs in the bucket of the
/// next power of two rows (1 to 64), whose graph ([`DeviceGraph`]) is captured at that bucket's
/// first step and replayed at the next ones; on the CPU each replay runs the step forward
/// itself (the twin the CPU tests run). The graphs hold the cache's buffers: keep one
/// `StepGraphs` per cache, and drop it with the cache.
#[derive(Default)]
pub struct StepGraphs {
    buckets: Vec<Option<Bucket>>,
    /// Step forwards run through a bucket (captures included).
    pub replays: usize,
}

/// One bucket's inputs, its features buffer (an EAGLE head's), its graph once captured, and
/// whether its capture failed.
struct Bucket {
    inputs: StepInputs,
    features: Option<Tensor>,
    graph: Option<DeviceGraph>,
    failed: bool,
}

impl StepGraphs {
    /// The final hidden states of a step's live rows (`[n, hidden]`, a copy: a graph's output
    /// is overwritten by its next replay), with `tokens` at `positions` after the cache, row
    /// `r` seeing the cache before `tail` and from there the keys of `masks[r]`
    /// ([`StepInputs::set`]); the cache is advanced by the `n` rows, as
    /// [`DecoderModel::forward`] does. `None` (nothing run) when the step does not fit a bucket
    /// (its masks' keys past 64 with the bucket's padding, or the bucket's rows past the
    /// cache's capacity, or a position past the model's context, which the eager forward
    /// reports): the caller runs the forward eagerly.
    pub fn forward(
        &mut self,
        model: &DecoderModel,
        rows: (&[u32], &[u32]),
        masks: &[u64],
        tail: usize,
        cache: &mut KvCache,
    ) -> Result<Option<Tensor>> {
        let c = model.config();
        self.run(
            model.device(),
            (c.vocab_size, c.context_length),
            rows,
            (masks, tail),
            None,
            cache,
            |inputs, _, cache| model.forward_step(inputs, cache),
        )
    }

    /// [`Self::forward`] for an EAGLE head drafting for `target`: the entries' `features`
    /// (`[n, hidden]`) are copied into the bucket's own buffer (padding rows keep what they
    /// held), which its graph reads; the head's outputs `[n, hidden]`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_head(
        &mut self,
        target: &DecoderModel,
        head: &super::eagle::EagleHead,
        features: &Tensor,
        rows: (&[u32], &[u32]),
        masks: &[u64],
        tail: usize,
        cache: &mut KvCache,
    ) -> Result<Option<Tensor>> {
        let c = head.config();
        let sizes = (c.vocab_size.min(target.config().vocab_size), c.context_length);
        self.run(target.device(), sizes, rows, (masks, tail), Some(features), cache, |inputs, buffer, cache| {
            head.forward_step(target, buffer.expect("a head's bucket has features"), inputs, cache)
        })
    }

    /// Whether a step of `n` rows after `cache`, its masks covering keys from `tail` on, fits a
    /// bucket: at most 64 keys from the tail to the bucket's last row, and the bucket's rows
    /// inside the cache. Callers check it before building the masks (which hold 64 bits).
    pub fn fits(n: usize, tail: usize, cache: &KvCache) -> bool {
        let (rows, start) = (n.next_power_of_two(), cache.len());
        n > 0 && tail <= start && start - tail + rows <= StepLayout::MAX_ROWS && start + rows <= cache.capacity()
    }

    /// The bucket logic of [`Self::forward`] and [`Self::forward_head`] for a model of
    /// `(vocab, context)` token ids and positions: `step` runs a bucket's forward on its inputs
    /// and features buffer. A bucket whose capture fails runs
    /// eagerly from then on (`Ok(None)`: the caller's eager forward), with a warning.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        device: &Device,
        (vocab, context): (usize, usize),
        (tokens, positions): (&[u32], &[u32]),
        (masks, tail): (&[u64], usize),
        features: Option<&Tensor>,
        cache: &mut KvCache,
        step: impl Fn(&StepInputs, Option<&Tensor>, &mut KvCache) -> Result<Tensor>,
    ) -> Result<Option<Tensor>> {
        let n = tokens.len();
        if !Self::fits(n, tail, cache) || positions.iter().any(|&p| p as usize >= context) {
            return Ok(None);
        }
        let (rows, start) = (n.next_power_of_two(), cache.len());
        let index = rows.trailing_zeros() as usize;
        if self.buckets.len() <= index {
            self.buckets.resize_with(index + 1, || None);
        }
        if self.buckets[index].is_none() {
            let inputs = StepInputs::new(rows, vocab, device)?;
            let buffer = match features {
                Some(f) => Some(Tensor::zeros((rows, f.dim(1)?), f.dtype(), device)?),
                None => None,
            };
            self.buckets[index] = Some(Bucket { inputs, features: buffer, graph: None, failed: false });
        }
        let bucket = self.buckets[index].as_mut().expect("made above");
        bucket.inputs.set(tokens, positions, masks, start, tail)?;
        if let (Some(f), Some(buffer)) = (features, &bucket.features) {
            buffer.slice_set(&f.contiguous()?, 0, 0)?;
        }
        let Bucket { inputs, features: buffer, graph, failed } = bucket;
        if *failed {
            return Ok(None);
        }
        let graph = match graph {
            Some(g) => g,
            None => match DeviceGraph::capture(device, || step(inputs, buffer.as_ref(), cache)) {
                Ok(g) => graph.insert(g),
                Err(e) => {
                    tracing::warn!("steps of {rows} rows run without a CUDA graph: the capture failed: {e}");
                    *failed = true;
                    return Ok(None);
                }
            },
        };
        let hidden = graph.replay(|| step(inputs, buffer.as_ref(), cache))?;
        self.replays += 1;
        cache.advance(n)?;
        Ok(Some(hidden.narrow(0, 0, n)?.copy()?))
    }
}

/// Masks of a chain of `n` rows: row `r` sees rows `0..=r` (rows past the 64th see the first
/// 64: such a step fits no bucket, [`StepGraphs::fits`]).
pub fn chain_masks(n: usize) -> Vec<u64> {
    (0..n).map(|r| if r >= 63 { u64::MAX } else { (1u64 << (r + 1)) - 1 }).collect()
}

/// Masks of a tree given by each row's parent (`None`: a root; parents come before their
/// children): row `r` sees itself and its ancestors.
pub fn tree_masks(parents: &[Option<usize>]) -> Result<Vec<u64>> {
    let mut masks: Vec<u64> = Vec::with_capacity(parents.len());
    for (r, p) in parents.iter().enumerate() {
        let above = match *p {
            None => 0,
            Some(p) if p < r => masks[p],
            Some(p) => candle_core::bail!("tree row {r}'s parent {p} does not come before it"),
        };
        masks.push(above | 1u64.checked_shl(r as u32).unwrap_or(0));
    }
    Ok(masks)
}

impl DecoderModel {
    /// The forward of a step set in `step` ([`StepInputs::set`]), every row of the bucket
    /// (padding included), through the device kernels ([`Self::set_fused_decode`] must be on):
    /// the final hidden states `[rows, hidden]`. The rows' keys and values go to the cache at
    /// the step's start, which must equal `cache.len()`; the cache is not advanced (the caller
    /// advances it by the rows it keeps), so that the host does nothing a replay would skip
    /// (`crate::kernels::device::graph`).
    pub fn forward_step(&self, step: &StepInputs, cache: &mut KvCache) -> Result<Tensor> {
        if !self.fused {
            candle_core::bail!("forward_step runs the device kernels: turn on set_fused_decode");
        }
        let rows = step.rows();
        cache.reserve(rows)?;
        let inputs = step.tensor();
        let tokens = inputs.narrow(0, 0, rows)?;
        let positions = inputs.narrow(0, rows, rows)?;
        let mut x = Residual::Sum(self.embed.lookup_tensor(&tokens)?.to_dtype(self.dtype)?.unsqueeze(0)?);
        let rope = Rope::Fused { rotary: &self.rotary, positions: &positions };
        for (l, layer) in self.layers.iter().enumerate() {
            let part = Part { rows, rope: &rope, visibility: Visibility::Step(inputs), cache: &mut *cache };
            x = block_residual(&self.config, l, layer, &x, &mut [part])?;
        }
        x.normed(Some(&self.norm), self.config.rms_norm_eps as f32)?.1.squeeze(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_of_chains_and_trees() {
        assert_eq!(chain_masks(3), [0b1, 0b11, 0b111]);
        assert_eq!(chain_masks(64)[63], u64::MAX);
        assert_eq!(tree_masks(&[None, Some(0), Some(0), Some(1)]).unwrap(), [0b1, 0b11, 0b101, 0b1011]);
        assert!(tree_masks(&[Some(1), None]).is_err());
        // Past 64 rows the masks stop growing (no overflow); such steps fit no bucket.
        assert_eq!(chain_masks(70)[69], u64::MAX);
        let parents: Vec<Option<usize>> = (0..70usize).map(|r| r.checked_sub(1)).collect();
        assert_eq!(tree_masks(&parents).unwrap()[69], u64::MAX);
    }

    /// A step fits a bucket when its keys from the tail to the bucket's last row are at most
    /// 64 and the bucket's rows are inside the cache.
    #[test]
    fn steps_fit_buckets_by_their_keys_and_the_cache() {
        let mut cache = KvCache::new(1, 1, 4, 100, DType::F32, &Device::Cpu).unwrap();
        cache.advance(40).unwrap();
        assert!(StepGraphs::fits(1, 40, &cache) && StepGraphs::fits(32, 40, &cache));
        assert!(!StepGraphs::fits(33, 40, &cache), "a bucket of 64 rows at 40 ends at 104 > 100");
        assert!(!StepGraphs::fits(0, 40, &cache) && !StepGraphs::fits(65, 40, &cache));
        assert!(StepGraphs::fits(32, 8, &cache) && !StepGraphs::fits(33, 8, &cache), "a tail 32 keys back");
        assert!(!StepGraphs::fits(1, 41, &cache), "a tail past the cache");
        cache.advance(30).unwrap();
        assert!(StepGraphs::fits(16, 70, &cache) && !StepGraphs::fits(17, 70, &cache), "the cache's end");
    }

    /// `set` writes the layout's words (padding repeats the last row and sees itself) and
    /// refuses a step that does not fit, a token past the vocabulary and a mask that misses
    /// its own row or names a later one.
    #[test]
    fn set_writes_the_layout_and_refuses_bad_steps() {
        let dev = Device::Cpu;
        let mut s = StepInputs::new(4, 10, &dev).unwrap();
        s.set(&[7, 8], &[20, 21], &[0b1, 0b11], 20, 20).unwrap();
        let words = s.tensor().to_vec1::<u32>().unwrap();
        assert_eq!(words, [7, 8, 8, 8, 20, 21, 21, 21, 0b1, 0, 0b11, 0, 0b100, 0, 0b1000, 0, 20, 20]);
        assert_eq!(s.live(), 2);
        let bias = s.bias(DType::F32, &dev).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(bias.len(), 2);
        assert!(bias[0][..21].iter().all(|b| *b == 0.0) && bias[0][21] == f32::NEG_INFINITY);
        assert!(bias[1].iter().all(|b| *b == 0.0));
        // A tail two keys before the step: the masks' own bits move up by two.
        s.set(&[7], &[20], &[0b101], 20, 18).unwrap();
        let words = s.tensor().to_vec1::<u32>().unwrap();
        assert_eq!(&words[8..], [0b101, 0, 0b1000, 0, 0b10000, 0, 0b100000, 0, 20, 18]);
        let bias = s.bias(DType::F32, &dev).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(&bias[0][17..], [0.0, 0.0, f32::NEG_INFINITY, 0.0]);
        assert!(s.set(&[1; 5], &[0; 5], &chain_masks(5), 0, 0).is_err());
        assert!(s.set(&[10], &[0], &[1], 0, 0).unwrap_err().to_string().contains("outside the vocabulary"));
        assert!(s.set(&[1, 2], &[0, 1], &[0b1, 0b10 | 0b100], 0, 0).unwrap_err().to_string().contains("no later row"));
        assert!(s.set(&[1, 2], &[0, 1], &[0b1, 0b01], 0, 0).unwrap_err().to_string().contains("the row itself"));
        assert!(s.set(&[1], &[70], &[1], 70, 6).unwrap_err().to_string().contains("at most 64 keys"));
        assert!(s.set(&[1], &[7], &[1], 5, 6).is_err());
        assert!(StepInputs::new(65, 10, &dev).is_err());
    }
}
