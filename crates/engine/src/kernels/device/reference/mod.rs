//! The algorithms of the CUDA decode kernels (`decode.cu`), step for step, in Rust: the same
//! operations in the same order, the same rounding to the activation type, the same chunking of
//! the keys and the same reduction trees. The ops of [`super`] run these on the CPU, so the CPU
//! tests check the algorithm (against candle's rope and the KV cache's own writes, and the CPU
//! attention), and a GPU run checks the kernels against them.
//!
//! Floating-point details both sides keep:
//! - every product and sum is one rounded f32 operation, written out (`mul_add` where the kernel
//!   calls `fmaf`; the kernels are built with `--fmad=false`, so nothing else fuses);
//! - values of type bf16/f16 are widened exactly to f32, and each operation on them is done in
//!   f32 and rounded back, as candle's CPU ops (the `half` crate) do;
//! - `exp` is [`crate::kernels::simd::exp`], whose operations the kernel repeats.

use crate::kernels::simd::exp;
use half::{bf16, f16};

mod select;
pub use select::{sample_row, warp_fixed, warp_rows, WarpParams, WARP_THREADS};

/// An activation element type: f32, bf16 or f16.
pub trait Elem: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
}

impl Elem for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Elem for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

impl Elem for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}

/// One operation in `T`: `f` on the f32 values, rounded to `T`.
fn op<T: Elem>(a: T, b: T, f: impl Fn(f32, f32) -> f32) -> T {
    T::from_f32(f(a.to_f32(), b.to_f32()))
}

/// The rotary embedding's parameters: the inverse frequency of each pair (`head_dim / 2`),
/// YaRN's factor on cos and sin (1: none), and the pairing (`interleaved`: `(2i, 2i + 1)`, as
/// GGUF LLaMA files; else `(i, i + head_dim / 2)`).
#[derive(Debug, Clone, Copy)]
pub struct RopeParams<'a> {
    pub inv_freq: &'a [f32],
    pub attention_factor: f32,
    pub interleaved: bool,
}

impl RopeParams<'_> {
    /// cos and sin of pair `i` at `position`, in `T`: the f32 angle `position * inv_freq[i]`,
    /// its cos and sin, times the attention factor, rounded to `T` (as `model::rotary` gives
    /// them to candle's rope).
    pub fn cos_sin<T: Elem>(&self, position: u32, i: usize) -> (T, T) {
        let angle = position as f32 * self.inv_freq[i];
        let (mut c, mut s) = (angle.cos(), angle.sin());
        if self.attention_factor != 1.0 {
            c = c * self.attention_factor + 0.0;
            s = s * self.attention_factor + 0.0;
        }
        (T::from_f32(c), T::from_f32(s))
    }

    /// Rotates one head `x` (`head_dim` values) at `position` into `out`.
    pub fn rotate<T: Elem>(&self, x: &[T], position: u32, out: &mut [T]) {
        let half = x.len() / 2;
        for i in 0..half {
            let (c, s) = self.cos_sin::<T>(position, i);
            let (i1, i2) = if self.interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
            let (x1, x2) = (x[i1], x[i2]);
            out[i1] = op(op(x1, c, |a, b| a * b), op(x2, s, |a, b| a * b), |a, b| a - b);
            out[i2] = op(op(x1, s, |a, b| a * b), op(x2, c, |a, b| a * b), |a, b| a + b);
        }
    }
}

/// Rotary embedding of `rows` rows of `heads` heads (`x`: `[rows, heads, head_dim]`), each row at
/// its own position; the result in the same layout.
pub fn rope_rows<T: Elem>(x: &[T], positions: &[u32], heads: usize, head_dim: usize, p: &RopeParams) -> Vec<T> {
    let mut out = vec![T::from_f32(0.0); x.len()];
    for (r, &pos) in positions.iter().enumerate() {
        for h in 0..heads {
            let at = (r * heads + h) * head_dim;
            p.rotate(&x[at..at + head_dim], pos, &mut out[at..at + head_dim]);
        }
    }
    out
}

/// Keeps, of a cache buffer's (`[kv_heads, capacity, head_dim]`) positions from `start` on,
/// those at offsets `kept` (increasing), moved to `start, start + 1, ...`; the rows after them
/// are left as they were. Rows move in increasing order, so `kept[i] >= i` is read before
/// any write reaches it (the CUDA kernel's threads, one per head and element, walk the same
/// order).
pub fn compact_rows<T: Copy>(cache: &mut [T], capacity: usize, head_dim: usize, start: usize, kept: &[u32]) {
    for head in cache.chunks_exact_mut(capacity * head_dim) {
        for (i, &from) in kept.iter().enumerate() {
            let from = from as usize;
            if from != i {
                let at = (start + from) * head_dim;
                head.copy_within(at..at + head_dim, (start + i) * head_dim);
            }
        }
    }
}

/// Threads of the block that normalizes one row ([`add_rms_norm`]).
pub const NORM_BLOCK: usize = 256;

/// The residual sum `x + y` and its RMS norm with weight `w`, per row of `n` values, as the
/// `add_rms_norm` kernel computes them: each sum rounded to `T`; thread `t` of a block of
/// [`NORM_BLOCK`] adds the squares of the row's sums `t, t + NORM_BLOCK, ...` with fused
/// multiply-adds, a tree halves the threads' totals; the row's root mean square is
/// `m = sqrt(total / n + eps)` (each operation rounded once); each output is `s / m * w` in
/// f32 (candle's CPU formula, which in bf16/f16 also rounds `m` and `s / m` to `T`), rounded
/// to `T` once. Returns the sums, then the normed rows.
pub fn add_rms_norm<T: Elem>(x: &[T], y: &[T], w: &[T], n: usize, eps: f32) -> (Vec<T>, Vec<T>) {
    let mut sums = Vec::with_capacity(x.len());
    let mut normed = Vec::with_capacity(x.len());
    for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact(n)) {
        let row: Vec<T> = xr.iter().zip(yr).map(|(&a, &b)| T::from_f32(a.to_f32() + b.to_f32())).collect();
        let mut p = [0f32; NORM_BLOCK];
        for (t, acc) in p.iter_mut().enumerate() {
            let mut j = t;
            while j < n {
                let s = row[j].to_f32();
                *acc = s.mul_add(s, *acc);
                j += NORM_BLOCK;
            }
        }
        let m = (tree_sum(&mut p) / n as f32 + eps).sqrt();
        normed.extend(row.iter().zip(w).map(|(&s, &w)| T::from_f32(s.to_f32() / m * w.to_f32())));
        sums.extend(row);
    }
    (sums, normed)
}

/// The gated MLP's activation of a joined gate/up product: `x` holds rows of `2n` values, the
/// gate's `n` then the up product's `n`; each row gives `g / (1 + e^-g) * u` per column, in f32
/// with [`crate::kernels::simd::exp`] and one rounding per operation (the order of
/// `kernels::activation::silu_gate`), rounded to `T` once at the end.
pub fn silu_mul<T: Elem>(x: &[T], n: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(x.len() / 2);
    for row in x.chunks_exact(2 * n) {
        let (gate, up) = row.split_at(n);
        out.extend(gate.iter().zip(up).map(|(&g, &u)| {
            let g = g.to_f32();
            T::from_f32(g / (1.0 + crate::kernels::simd::exp(-g)) * u.to_f32())
        }));
    }
    out
}

/// The launches of the CUDA `compact_rows` for `kept` from `start`, `per_launch` kept rows
/// each: `(start', kept')` in order, where chunk `c` moves its rows to `start + per_launch *
/// c + i` from `start + kept[per_launch * c + i]`. Applying [`compact_rows`] to each in order
/// equals applying it to the whole (`kept[j] >= j`, so the offsets stay non-negative and a
/// later chunk reads rows no earlier chunk wrote).
pub fn compact_launches(start: usize, kept: &[u32], per_launch: usize) -> impl Iterator<Item = (usize, Vec<u32>)> + '_ {
    kept.chunks(per_launch).enumerate().map(move |(c, chunk)| {
        let first = c * per_launch;
        (start + first, chunk.iter().map(|&k| k - first as u32).collect())
    })
}

/// Writes rows `x` (`[rows, kv_heads, head_dim]`) into a cache buffer `[kv_heads, capacity,
/// head_dim]` at positions `start..start + rows`, rotated at `positions` when `rope` is given.
pub fn rows_into_cache<T: Elem>(
    cache: &mut [T],
    capacity: usize,
    start: usize,
    x: &[T],
    kv_heads: usize,
    head_dim: usize,
    rope: Option<(&RopeParams, &[u32])>,
) {
    let rows = x.len() / (kv_heads * head_dim);
    for r in 0..rows {
        // As the kernels: rows past the capacity are dropped (the ops check before).
        if start + r >= capacity {
            continue;
        }
        for g in 0..kv_heads {
            let src = &x[(r * kv_heads + g) * head_dim..][..head_dim];
            let dst = &mut cache[(g * capacity + start + r) * head_dim..][..head_dim];
            match rope {
                Some((p, positions)) => p.rotate(src, positions[r], dst),
                None => dst.copy_from_slice(src),
            }
        }
    }
}

/// Keys per chunk of the attention: each chunk's partial softmax is computed apart and the
/// chunks are combined in order, so a row's result depends only on its query, its bias row and
/// the cache, never on the other rows of the forward.
pub const ATTENTION_CHUNK: usize = 256;
/// Lanes of one dot product (a CUDA warp).
pub const WARP: usize = 32;
/// Threads of an attention block: its tree sums run over this many partial sums.
pub const BLOCK: usize = 128;

/// `q . k` as one warp computes it: lane `l` accumulates elements `l, l + 32, ...` in order with
/// fused multiply-adds, then a butterfly (xor 16, 8, 4, 2, 1) sums the lanes.
pub fn warp_dot(q: &[f32], k: impl Fn(usize) -> f32) -> f32 {
    let mut lanes = [0f32; WARP];
    for (l, lane) in lanes.iter_mut().enumerate() {
        let mut i = l;
        while i < q.len() {
            *lane = q[i].mul_add(k(i), *lane);
            i += WARP;
        }
    }
    butterfly(&mut lanes);
    lanes[0]
}

/// The xor butterfly of a warp: after it every lane holds the same sum, whose order of
/// additions is fixed.
fn butterfly(lanes: &mut [f32; WARP]) {
    let mut off = WARP / 2;
    while off > 0 {
        let before = *lanes;
        for l in 0..WARP {
            lanes[l] = before[l] + before[l ^ off];
        }
        off /= 2;
    }
}

/// The sum of `values` (at most `2 * BLOCK`) as a block of [`BLOCK`] threads sums them: thread
/// `t` adds values `t` and `t + BLOCK` (absent ones are 0), then a tree halves the threads.
fn block_sum(values: &[f32]) -> f32 {
    let mut p = [0f32; BLOCK];
    for (t, slot) in p.iter_mut().enumerate() {
        let a = values.get(t).copied().unwrap_or(0.0);
        let b = values.get(t + BLOCK).copied().unwrap_or(0.0);
        *slot = a + b;
    }
    tree_sum(&mut p)
}

/// The kernels' block tree over the threads' totals `p` (a power of two of them): thread `t`
/// adds thread `t + stride`'s total for `stride` = half the threads, then a quarter, ... 1;
/// returns thread 0's. Overwrites `p`.
pub(crate) fn tree_sum<T: Copy + std::ops::AddAssign>(p: &mut [T]) -> T {
    debug_assert!(p.len().is_power_of_two());
    let mut stride = p.len() / 2;
    while stride > 0 {
        for t in 0..stride {
            let other = p[t + stride];
            p[t] += other;
        }
        stride /= 2;
    }
    p[0]
}

/// One chunk's partial softmax for one (row, head): the largest score `m` (`-inf` when every
/// key is masked), `l = sum exp(s_j - m)` and `o = sum exp(s_j - m) v_j`.
pub struct Partial {
    pub m: f32,
    pub l: f32,
    pub o: Vec<f32>,
}

/// The geometry of [`cache_attention`]: `heads` query heads sharing `kv_heads` cached heads,
/// `head_dim` wide, a cache buffer of `capacity` positions, `total` of them used.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub capacity: usize,
    pub total: usize,
}

/// The partial of keys `chunk * ATTENTION_CHUNK ..` (below `s.total`; none for a chunk past it)
/// for query `q` (f32 values) against cache head `g`, with the additive bias of key `j`,
/// `bias(j)` (`-inf`: masked), and `scale`.
#[allow(clippy::too_many_arguments)]
pub fn attention_partial<T: Elem>(
    q: &[f32],
    keys: &[T],
    values: &[T],
    bias: impl Fn(usize) -> f32,
    g: usize,
    chunk: usize,
    scale: f32,
    s: &AttentionShape,
) -> Partial {
    let hd = s.head_dim;
    let first = (chunk * ATTENTION_CHUNK).min(s.total);
    let keys_range = first..((chunk + 1) * ATTENTION_CHUNK).min(s.total);
    let row = |buf: &[T], j: usize| -> Vec<f32> {
        buf[(g * s.capacity + j) * hd..][..hd].iter().map(|x| x.to_f32()).collect()
    };
    // Scores, in key order (the kernel's warps take keys j = start + 4k + warp; each score is
    // one warp's dot product, so the order in which they are computed does not matter).
    let scores: Vec<f32> = keys_range
        .clone()
        .map(|j| {
            let b = bias(j);
            if b == f32::NEG_INFINITY {
                return f32::NEG_INFINITY;
            }
            let k = row(keys, j);
            warp_dot(q, |i| k[i]) * scale + b
        })
        .collect();
    let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return Partial { m, l: 0.0, o: vec![0.0; hd] };
    }
    let weights: Vec<f32> = scores.iter().map(|&x| exp(x - m)).collect();
    let l = block_sum(&weights);
    let mut o = vec![0f32; hd];
    for (w, j) in weights.iter().zip(keys_range) {
        if *w == 0.0 {
            continue;
        }
        for (o, v) in o.iter_mut().zip(row(values, j)) {
            *o = w.mul_add(v, *o);
        }
    }
    Partial { m, l, o }
}

/// Combines the partials of one (row, head) in chunk order into its attention output.
pub fn combine(partials: &[Partial], hd: usize) -> Vec<f32> {
    let m = partials.iter().map(|p| p.m).fold(f32::NEG_INFINITY, f32::max);
    let mut l = 0f32;
    let mut o = vec![0f32; hd];
    for p in partials {
        let w = exp(p.m - m);
        l = w.mul_add(p.l, l);
        for (o, po) in o.iter_mut().zip(&p.o) {
            *o = w.mul_add(*po, *o);
        }
    }
    o.iter().map(|x| x / l).collect()
}

/// Attention of `rows` new rows (`q`: `[rows, heads, head_dim]`, rotated) against the cache
/// buffers (`[kv_heads, capacity, head_dim]`, the first `total` positions), with the additive
/// `bias` (`[rows, total]`) and `scale`: `[rows, heads * head_dim]`. Query head `h` reads cache
/// head `h / (heads / kv_heads)`.
pub fn cache_attention<T: Elem>(
    q: &[T],
    keys: &[T],
    values: &[T],
    bias: &[T],
    scale: f32,
    s: &AttentionShape,
) -> Vec<T> {
    let chunks = s.total.div_ceil(ATTENTION_CHUNK);
    attention_with(q, keys, values, |r, j| bias[r * s.total + j].to_f32(), chunks, scale, s)
}

/// [`cache_attention`] of a step laid out in `inputs` ([`StepLayout`]): the step's `rows` rows
/// see every cached position before the layout's tail and, from there, the keys their masks
/// name; the chunks run over the whole cache buffer (those past the step's keys give nothing),
/// so that the launch does not depend on the step.
pub fn step_attention<T: Elem>(
    q: &[T],
    keys: &[T],
    values: &[T],
    inputs: &[u32],
    scale: f32,
    s: &AttentionShape,
) -> Vec<T> {
    let layout = StepLayout::of(inputs.len());
    let chunks = s.capacity.div_ceil(ATTENTION_CHUNK);
    let s = AttentionShape { total: layout.total(inputs).min(s.capacity), ..*s };
    attention_with(q, keys, values, |r, j| layout.bias(inputs, r, j), chunks, scale, &s)
}

/// The attention of [`cache_attention`] with the bias of row `r` and key `j`, `bias(r, j)`,
/// over `chunks` key chunks.
fn attention_with<T: Elem>(
    q: &[T],
    keys: &[T],
    values: &[T],
    bias: impl Fn(usize, usize) -> f32,
    chunks: usize,
    scale: f32,
    s: &AttentionShape,
) -> Vec<T> {
    let hd = s.head_dim;
    let rows = q.len() / (s.heads * hd);
    let groups = s.heads / s.kv_heads;
    let mut out = vec![T::from_f32(0.0); rows * s.heads * hd];
    for r in 0..rows {
        for h in 0..s.heads {
            let qh: Vec<f32> = q[(r * s.heads + h) * hd..][..hd].iter().map(|x| x.to_f32()).collect();
            let partials: Vec<Partial> = (0..chunks)
                .map(|c| attention_partial(&qh, keys, values, |j| bias(r, j), h / groups, c, scale, s))
                .collect();
            for (d, x) in combine(&partials, hd).into_iter().enumerate() {
                out[(r * s.heads + h) * hd + d] = T::from_f32(x);
            }
        }
    }
    out
}

/// Where a step's inputs sit in its one `u32` buffer (a graph-replayed forward reads them
/// there, so that a replay needs no kernel argument that changes between steps): for `rows`
/// rows, their token ids, their positions, each row's mask (two words: bit `c` of word `c / 32`
/// set when the row sees key `tail + c`, so at most 64 keys), the cache length before the step
/// (the slot of the step's first row) and `tail`, the first key the masks cover: every key
/// before it is visible to every row. A target's tree step has `tail` = its start (the masks
/// cover the step's own rows); a draft model's tree level has `tail` at the step's first
/// drafted node, so its masks also cover the levels cached before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepLayout {
    pub rows: usize,
}

impl StepLayout {
    /// The most keys a step's masks cover (64 bits), so the most rows a step holds.
    pub const MAX_ROWS: usize = 64;

    /// The layout of a buffer of `len` words.
    pub fn of(len: usize) -> Self {
        Self { rows: len.saturating_sub(2) / 4 }
    }

    /// Words of the buffer.
    pub fn len(&self) -> usize {
        4 * self.rows + 2
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    pub fn tokens(&self) -> std::ops::Range<usize> {
        0..self.rows
    }

    pub fn positions(&self) -> std::ops::Range<usize> {
        self.rows..2 * self.rows
    }

    pub fn masks(&self) -> std::ops::Range<usize> {
        2 * self.rows..4 * self.rows
    }

    /// The index of the cache length before the step.
    pub fn start(&self) -> usize {
        4 * self.rows
    }

    /// The index of the first key the masks cover.
    pub fn tail(&self) -> usize {
        4 * self.rows + 1
    }

    /// The keys the step's rows attend over: the cache before the step and the step's rows.
    pub fn total(&self, inputs: &[u32]) -> usize {
        inputs[self.start()] as usize + self.rows
    }

    /// The additive bias of row `r` for key `j`: 0 before the tail and for the keys in `r`'s
    /// mask (below the step's last row), `-inf` otherwise.
    pub fn bias(&self, inputs: &[u32], r: usize, j: usize) -> f32 {
        let tail = inputs[self.tail()] as usize;
        if j < tail {
            return 0.0;
        }
        let c = j - tail;
        let seen = j < self.total(inputs)
            && c < Self::MAX_ROWS
            && (inputs[self.masks().start + 2 * r + c / 32] >> (c % 32)) & 1 == 1;
        if seen {
            0.0
        } else {
            f32::NEG_INFINITY
        }
    }
}

/// The greedy token of each row of `logits` (`[rows, cols]`): the lowest index among the
/// largest values, as `samplers::Warp` picks at temperature 0; `u32::MAX` for a row holding
/// NaN or `+inf`, or only `-inf` (the caller reports invalid logits, as the warp does).
pub fn argmax_rows(logits: &[f32], cols: usize) -> Vec<u32> {
    logits
        .chunks_exact(cols)
        .map(|row| {
            if row.iter().any(|x| x.is_nan() || *x == f32::INFINITY) {
                return u32::MAX;
            }
            let mut best = 0;
            for (i, &x) in row.iter().enumerate() {
                if x > row[best] {
                    best = i;
                }
            }
            if row[best] == f32::NEG_INFINITY {
                return u32::MAX;
            }
            best as u32
        })
        .collect()
}
