//! The key/value cache, kept outside the model weights.
//!
//! Each layer owns two preallocated buffers `[1, kv_heads, capacity, head_dim]`; new keys and
//! values are written in place (`slice_set`), so appending allocates nothing per token. A
//! speculative step appends the whole draft tree, then [`KvCache::compact`] keeps the
//! accepted root-to-node path and drops the rest: on CUDA one kernel launch for every layer,
//! with nothing uploaded ([`compact_rows`]).

use crate::kernels::device::{compact_rows, RopeIntoCache, RowsIntoCache, Slots};
use candle_core::{DType, Device, Result, Tensor};

/// Keys and values of every layer of one model, for one sequence.
#[derive(Debug, Clone)]
pub struct KvCache {
    /// Every layer's keys, then every layer's values (one slice for [`compact_rows`]).
    buffers: Vec<Tensor>,
    len: usize,
    capacity: usize,
}

impl KvCache {
    /// An empty cache for `layers` layers holding up to `capacity` positions.
    pub fn new(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let shape = (1, kv_heads, capacity, head_dim);
        let buffers = (0..2 * layers).map(|_| Tensor::zeros(shape, dtype, device)).collect::<Result<_>>()?;
        Ok(Self { buffers, len: 0, capacity })
    }

    /// The index of `layer`'s values in `buffers` (after every layer's keys).
    fn value_index(&self, layer: usize) -> usize {
        self.buffers.len() / 2 + layer
    }

    /// Number of cached positions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Checks that `new` more positions fit.
    pub fn reserve(&self, new: usize) -> Result<()> {
        if self.len + new > self.capacity {
            candle_core::bail!(
                "the KV cache holds {} positions and {} more do not fit in its capacity of {} \
                 (prompt plus new tokens exceed the context length)",
                self.len,
                new,
                self.capacity
            );
        }
        Ok(())
    }

    /// Writes `k`, `v` (`[1, kv_heads, t, head_dim]`) of `layer` after the cached positions and
    /// returns every cached key and value of that layer, new ones included. The cache length
    /// advances once all layers have appended: call [`KvCache::advance`] after the forward.
    pub fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let t = k.dim(2)?;
        self.reserve(t)?;
        self.buffers[layer].slice_set(&k.contiguous()?, 2, self.len)?;
        self.buffers[self.value_index(layer)].slice_set(&v.contiguous()?, 2, self.len)?;
        let total = self.len + t;
        Ok((self.buffers[layer].narrow(2, 0, total)?, self.buffers[self.value_index(layer)].narrow(2, 0, total)?))
    }

    /// Writes the new rows of `layer` after the cached positions, in place, as the device
    /// kernels do: the keys `k` (`[t, kv_heads, head_dim]`) rotated at `positions` (`[t]`, u32)
    /// by `rotary`, the values `v` copied. Nothing is returned: [`crate::kernels::device::CacheAttention`]
    /// reads the buffers ([`Self::buffers`]). As with [`Self::append`], call [`Self::advance`]
    /// after the forward. With `step` (a step's inputs, `crate::kernels::device::StepLayout`)
    /// the rows go to the slot its start word holds when the kernels run (a graph replay reads
    /// it anew), which the caller keeps equal to [`Self::len`].
    #[allow(clippy::too_many_arguments)]
    pub fn write_rotated(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
        positions: &Tensor,
        rotary: &super::rotary::Rotary,
        interleaved: bool,
        step: Option<&Tensor>,
    ) -> Result<()> {
        let (t, kv_heads, head_dim) = k.dims3()?;
        self.reserve(t)?;
        let slots = match step {
            Some(inputs) => Slots::Step(inputs),
            None => Slots::From(self.len),
        };
        let rope = RopeIntoCache {
            inv_freq: rotary.inv_freq(),
            attention_factor: rotary.attention_factor(),
            interleaved,
            kv_heads,
            head_dim,
            slots,
        };
        self.buffers[layer].inplace_op3(&k.contiguous()?, positions, &rope)?;
        let copy = RowsIntoCache { kv_heads, head_dim, slots };
        self.buffers[self.value_index(layer)].inplace_op2(&v.contiguous()?, &copy)
    }

    /// The whole key and value buffers of `layer` (`[1, kv_heads, capacity, head_dim]`), every
    /// position, cached or not.
    pub fn buffers(&self, layer: usize) -> (&Tensor, &Tensor) {
        (&self.buffers[layer], &self.buffers[self.value_index(layer)])
    }

    /// Counts `t` appended positions as cached (after every layer appended them).
    pub fn advance(&mut self, t: usize) -> Result<()> {
        self.reserve(t)?;
        self.len += t;
        Ok(())
    }

    /// Forgets every position from `len` on.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Keeps, of the positions from `start` on, only those at offsets `kept` (increasing,
    /// relative to `start`), moved to `start, start + 1, ...`; drops the others.
    pub fn compact(&mut self, start: usize, kept: &[usize]) -> Result<()> {
        if start > self.len || kept.iter().any(|&k| start + k >= self.len) || kept.windows(2).any(|w| w[0] >= w[1]) {
            candle_core::bail!("KV cache compact: offsets {kept:?} from {start} out of range (length {})", self.len);
        }
        let is_prefix = kept.iter().enumerate().all(|(i, &k)| i == k);
        if !is_prefix {
            let kept: Vec<u32> = kept.iter().map(|&k| k as u32).collect();
            compact_rows(&self.buffers, start, &kept)?;
        }
        self.len = start + kept.len();
        Ok(())
    }

    /// Cached keys of `layer` (for tests).
    pub fn keys(&self, layer: usize) -> Result<Tensor> {
        self.buffers[layer].narrow(2, 0, self.len)
    }

    /// Cached values of `layer` (for tests).
    pub fn values(&self, layer: usize) -> Result<Tensor> {
        self.buffers[self.value_index(layer)].narrow(2, 0, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(start: f32, t: usize) -> Tensor {
        let data: Vec<f32> = (0..2 * t * 3).map(|i| start + i as f32).collect();
        Tensor::from_vec(data, (1, 2, t, 3), &Device::Cpu).unwrap()
    }

    #[test]
    fn append_truncate_and_compact() {
        let mut c = KvCache::new(1, 2, 3, 8, DType::F32, &Device::Cpu).unwrap();
        let a = block(0.0, 2);
        let (k, _) = c.append(0, &a, &a).unwrap();
        c.advance(2).unwrap();
        assert_eq!(k.dims(), &[1, 2, 2, 3]);
        let b = block(100.0, 4);
        c.append(0, &b, &b).unwrap();
        c.advance(4).unwrap();
        assert_eq!(c.len(), 6);
        // Keep offsets 1 and 3 of the four new positions.
        c.compact(2, &[1, 3]).unwrap();
        assert_eq!(c.len(), 4);
        let got = c.keys(0).unwrap();
        let expect = Tensor::cat(&[a.clone(), b.narrow(2, 1, 1).unwrap(), b.narrow(2, 3, 1).unwrap()], 2).unwrap();
        let diff = (got - expect).unwrap().abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
        assert_eq!(diff, 0.0);
        c.truncate(1);
        assert_eq!(c.len(), 1);
        assert!(c.compact(0, &[3]).is_err());
        let big = block(0.0, 8);
        assert!(c.append(0, &big, &big).unwrap_err().to_string().contains("capacity"));
    }
}
