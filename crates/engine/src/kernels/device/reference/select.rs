//! The algorithms of the selection kernels of `decode.cu` (`warp_rows_f32`, `sample_row_f64`),
//! step for step: the host warp's exponential, the same sums in the same order, and integer
//! histograms for top-k and top-p.

/// Threads of a block of `warp_rows_f32`, one block per row: thread `t` handles the entries
/// `t, t + 256, ...` of its row.
pub const WARP_THREADS: usize = 256;
/// Bins of each pass of the warp's radix select (8 bits).
const WARP_BINS: usize = 256;

/// What `warp_rows_f32` applies: `samplers::Warp` at a temperature > 0, as the kernel takes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarpParams {
    /// `1 / T`, as the host warp computes it.
    pub inv_t: f64,
    pub min_p: f64,
    /// Top-k, or the row's width when off.
    pub limit: u32,
    /// Top-p in 2^-62 ([`warp_fixed`]; at least 1).
    pub top_p_fixed: u64,
    /// Whether top-k or top-p cut the row (else the softmax with min-p is all).
    pub truncate: bool,
}

impl WarpParams {
    /// The parameters of `warp` (temperature > 0, checked by the caller) for rows of `cols`.
    pub fn of(warp: &samplers::dist::Warp, cols: usize) -> Self {
        let limit = if warp.top_k > 0 { warp.top_k.min(cols) } else { cols };
        Self {
            inv_t: 1.0 / warp.temperature,
            min_p: warp.min_p,
            limit: limit.min(u32::MAX as usize) as u32,
            top_p_fixed: warp_fixed(warp.top_p).max(1),
            truncate: limit < cols || warp.top_p < 1.0,
        }
    }
}

/// `p` in `[0, 1]` as an integer in units of 2^-62: exact but for the truncation (the scaling
/// is a power of two), so that masses add without rounding, in any order.
pub fn warp_fixed(p: f64) -> u64 {
    (p * 4_611_686_018_427_387_904.0) as u64
}

/// The sum of `values` as the kernel's block takes it: thread `t`'s entries `t, t + 256, ...`
/// in order, then the halving tree of the 256 partial sums.
fn warp_block_sum(values: &[f64]) -> f64 {
    let mut partial = [0.0f64; WARP_THREADS];
    for (i, &x) in values.iter().enumerate() {
        partial[i % WARP_THREADS] += x;
    }
    super::tree_sum(&mut partial)
}

/// The warp of `samplers::Warp` at a temperature > 0 on each row of `logits` (`[rows, cols]`),
/// in f64: `p_i = e_i / sum_j e_j` with `e_i = e^((l_i - max) / T)` (0 below `min_p`), then
/// top-k and top-p. Every `e_i` is the host warp's, bit for bit (the same
/// [`samplers::warp::exp_nonpositive`] of the same argument); sums are `warp_block_sum`'s (the
/// host sums in 16 lanes, so `p` may differ from the host's in the last bits).
///
/// Top-k and top-p keep, as the host does, the prefix of the order by probability (descending,
/// ties by ascending id) up to the `limit`-th token or the first whose running mass reaches
/// `top_p`. The last kept token is found by a radix select over the bits of `p` (8 passes of 8
/// bits, each a histogram of counts and of masses in 2^-62 units, [`warp_fixed`]: integer sums,
/// the same in any order), then, among its ties, by id (4 passes). The masses are truncated to
/// 2^-62 each, so a set whose mass is within `cols * 2^-62` (3e-14 at 151,936 tokens) of
/// `top_p` may end one token away from the host's, which has such a margin of its own. A row
/// holding NaN or `+inf`, or only `-inf`, becomes all NaN (the caller reports invalid logits,
/// as the warp does).
pub fn warp_rows(logits: &[f32], cols: usize, w: &WarpParams) -> Vec<f64> {
    let mut out = vec![0.0f64; logits.len()];
    for (row, o) in logits.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        let bad = row.iter().any(|x| x.is_nan() || *x == f32::INFINITY);
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        if bad || max == f32::NEG_INFINITY {
            o.fill(f64::NAN);
            continue;
        }
        let max = max as f64;
        for (x, &l) in o.iter_mut().zip(row) {
            let e = samplers::warp::exp_nonpositive((l as f64 - max) * w.inv_t);
            *x = if e < w.min_p { 0.0 } else { e };
        }
        let sum = warp_block_sum(o);
        o.iter_mut().for_each(|x| *x /= sum);
        if !w.truncate {
            continue;
        }
        let (key, bound) = last_kept(o, w.limit as u64, w.top_p_fixed);
        for (i, x) in o.iter_mut().enumerate() {
            let k = x.to_bits();
            if !(k > key || (k == key && i as u64 <= bound)) {
                *x = 0.0;
            }
        }
        let kept = warp_block_sum(o);
        o.iter_mut().for_each(|x| *x /= kept);
    }
    out
}

/// The last kept token of `p` ([`warp_rows`]): the bits of its probability and the largest id
/// kept among the tokens of that probability.
fn last_kept(p: &[f64], limit: u64, top_p: u64) -> (u64, u64) {
    let (mut prefix, mut mask, mut above_n, mut above_m, mut ties) = (0u64, 0u64, 0u64, 0u64, 0u64);
    for shift in (0..64).step_by(8).rev() {
        let mut count = [0u64; WARP_BINS];
        let mut mass = [0u64; WARP_BINS];
        for &x in p {
            let key = x.to_bits();
            if key & mask == prefix {
                let b = (key >> shift) as usize & (WARP_BINS - 1);
                count[b] += 1;
                mass[b] += warp_fixed(x);
            }
        }
        // Down from the largest bin: a bin is passed whole while the token after it would still
        // be kept; the first bin where that fails, or the lowest, holds the last kept token.
        let lowest = (0..WARP_BINS).find(|&b| count[b] > 0).expect("the prefix's tokens");
        let mut pick = lowest;
        for b in (lowest..WARP_BINS).rev() {
            if count[b] == 0 {
                continue;
            }
            if b != lowest && above_n + count[b] < limit && above_m + mass[b] < top_p {
                above_n += count[b];
                above_m += mass[b];
            } else {
                pick = b;
                break;
            }
        }
        prefix |= (pick as u64) << shift;
        mask |= 0xFF << shift;
        ties = count[pick];
    }
    // Its ties in id order: the j-th is kept while it is within the limit and the mass before
    // it is short of top-p.
    let v = warp_fixed(f64::from_bits(prefix));
    let mut j = ties.min(limit - above_n);
    if let Some(within) = (top_p - 1 - above_m).checked_div(v) {
        j = j.min(1 + within);
    }
    if j == ties {
        return (prefix, u64::MAX);
    }
    // The j-th smallest id among the ties: 4 passes of 8 bits of the id, from the top.
    let (mut id_prefix, mut id_mask, mut before) = (0u64, 0u64, 0u64);
    for shift in (0..32).step_by(8).rev() {
        let mut count = [0u64; WARP_BINS];
        for (i, x) in p.iter().enumerate() {
            if x.to_bits() == prefix && i as u64 & id_mask == id_prefix {
                count[(i >> shift) & (WARP_BINS - 1)] += 1;
            }
        }
        let mut pick = 0;
        for (b, &n) in count.iter().enumerate() {
            if before + n >= j {
                pick = b;
                break;
            }
            before += n;
        }
        id_prefix |= (pick as u64) << shift;
        id_mask |= 0xFF << shift;
    }
    (prefix, id_prefix)
}

/// A token drawn from one row of probabilities `p` (f64, normalised or not) with the uniform
/// `u` in `[0, 1)`, as `samplers::dist::sample` draws it from `u = rng.random()`: the first
/// index whose running sum of the positive entries exceeds `u` times their total, or the last
/// positive index when rounding leaves the scan short. As `sample_row_f64` runs it: thread `t`
/// of 256 sums its contiguous chunk of `ceil(cols / 256)` entries in order, the total is the
/// chunks' sums added in order, the chunk holding the crossing is found from their running sum
/// and then scanned. The sums are grouped differently from the host's, so a draw within
/// rounding of a boundary may fall one token away from the host's; otherwise it is the host's
/// token. `u32::MAX` when no entry is positive (a row of NaN).
pub fn sample_row(p: &[f64], u: f64) -> u32 {
    let chunk = p.len().div_ceil(WARP_THREADS);
    let mut part = [0.0f64; WARP_THREADS];
    let mut last = [u32::MAX; WARP_THREADS];
    for (t, c) in p.chunks(chunk.max(1)).enumerate() {
        for (j, &w) in c.iter().enumerate() {
            if w > 0.0 {
                part[t] += w;
                last[t] = (t * chunk + j) as u32;
            }
        }
    }
    let total = part.iter().fold(0.0, |acc, &s| acc + s);
    let target = u * total;
    let mut before = 0.0;
    for t in 0..WARP_THREADS {
        if target < before + part[t] {
            let mut acc = before;
            let start = t * chunk;
            for (j, &w) in p[start..(start + chunk).min(p.len())].iter().enumerate() {
                if w > 0.0 {
                    acc += w;
                    if target < acc {
                        return (start + j) as u32;
                    }
                }
            }
            return last[t];
        }
        before += part[t];
    }
    last.iter().copied().filter(|&i| i != u32::MAX).max().unwrap_or(u32::MAX)
}
