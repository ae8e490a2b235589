//! Launchers of `decode.cu` (built to PTX by `build.rs`, loaded once per device through candle's
//! custom-module API). Each checks its inputs as the CPU op does and launches the kernel on the
//! device's stream.

use super::{CacheAttention, RopeIntoCache, RopeRows, RowsIntoCache, Slots, StepAttention};
use crate::kernels::device::reference::{self, AttentionShape, StepLayout, ATTENTION_CHUNK, BLOCK};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
use candle_core::{bail, CudaStorage, Layout, Result, Shape, Storage, Tensor};

/// The kernels' PTX (`nvcc -ptx` of `decode.cu`).
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/decode.ptx"));
/// The module's name in the device's cache of custom modules.
const MODULE: &str = "mdsd_decode";

/// A contiguous view of `s` under `l`.
fn view<'a, T>(s: &'a CudaSlice<T>, l: &Layout, what: &str) -> Result<CudaView<'a, T>> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(s.slice(a..b)),
        None => bail!("{what}: expected a contiguous tensor"),
    }
}

/// The storage guard of the f32 inverse frequencies, checked to be on the GPU.
macro_rules! inv_freq_view {
    ($t:expr, $guard:ident, $layout:ident, $view:ident) => {
        let ($guard, $layout) = $t.storage_and_layout();
        let Storage::Cuda(inv) = &*$guard else { bail!("rope: the inverse frequencies are not on the GPU") };
        let $view = view(inv.as_cuda_slice::<f32>()?, &$layout, "inverse frequencies")?;
    };
}

/// A one-dimensional launch of `n` threads' work (grid-stride loops cover the rest).
fn linear(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 65_535) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

/// The kernel `name_SUFFIX` for the element type of `slice`.
fn kernel_name(name: &str, slice: &CudaStorageSlice) -> Result<String> {
    let suffix = match slice {
        CudaStorageSlice::F32(_) => "f32",
        CudaStorageSlice::BF16(_) => "bf16",
        CudaStorageSlice::F16(_) => "f16",
        _ => bail!("{name}: f32, bf16 or f16 expected"),
    };
    Ok(format!("{name}_{suffix}"))
}

pub(super) fn rope_rows(
    op: &RopeRows,
    x: &CudaStorage,
    xl: &Layout,
    pos: &CudaStorage,
    pl: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let dev = &x.device;
    let positions = view(pos.as_cuda_slice::<u32>()?, pl, "rope positions")?;
    let rows = pl.shape().elem_count();
    let (h, d) = (op.heads, op.head_dim);
    if xl.shape().elem_count() != rows * h * d {
        bail!("rope: {:?} is not {rows} rows of {h} heads of {d}", xl.shape());
    }
    inv_freq_view!(op.inv_freq, inv_guard, inv_layout, inv_freq);
    let func = dev.get_or_load_custom_func(&kernel_name("rope_rows", &x.slice)?, MODULE, PTX)?;
    let (af, interleaved) = (op.attention_factor, op.interleaved as i32);
    let (rows_u, h_u, d_u) = (rows as u32, h as u32, d as u32);
    macro_rules! launch {
        ($s:expr, $t:ty, $variant:ident) => {{
            let x = view($s, xl, "rope")?;
            let out = unsafe { dev.alloc::<$t>(rows * h * d)? };
            let mut b = func.builder();
            b.arg(&x).arg(&positions).arg(&inv_freq).arg(&af).arg(&interleaved).arg(&out);
            b.arg(&rows_u).arg(&h_u).arg(&d_u);
            unsafe { b.launch(linear(rows * h * d / 2)) }.w()?;
            CudaStorageSlice::$variant(out)
        }};
    }
    let slice = match &x.slice {
        CudaStorageSlice::F32(s) => launch!(s, f32, F32),
        CudaStorageSlice::BF16(s) => launch!(s, half::bf16, BF16),
        CudaStorageSlice::F16(s) => launch!(s, half::f16, F16),
        _ => unreachable!("kernel_name checked the dtype"),
    };
    Ok((CudaStorage { slice, device: dev.clone() }, Shape::from((rows, h, d))))
}

/// Checks a cache destination as `super::cache_dims` does (the rows' room only when the host
/// knows the first slot); returns its capacity.
fn capacity_of(dl: &Layout, kv_heads: usize, head_dim: usize, slots: &Slots, rows: usize) -> Result<usize> {
    let start = match slots {
        Slots::From(s) => Some(*s),
        Slots::Step(_) => None,
    };
    super::cache_dims(dl, kv_heads, head_dim, start, rows)
}

/// The device word holding a step's first slot (`Slots::Step`), checked to be on the GPU.
macro_rules! step_start_view {
    ($t:expr, $guard:ident, $layout:ident, $view:ident) => {
        let ($guard, $layout) = $t.storage_and_layout();
        let Storage::Cuda(words) = &*$guard else { bail!("step inputs are not on the GPU") };
        let all = view(words.as_cuda_slice::<u32>()?, &$layout, "step inputs")?;
        let at = StepLayout::of(all.len()).start();
        let $view = all.slice(at..at + 1);
    };
}

#[allow(clippy::too_many_arguments)]
pub(super) fn rope_into_cache(
    op: &RopeIntoCache,
    dst: &mut CudaStorage,
    dl: &Layout,
    x: &CudaStorage,
    xl: &Layout,
    pos: &CudaStorage,
    pl: &Layout,
) -> Result<()> {
    let dev = x.device.clone();
    let positions = view(pos.as_cuda_slice::<u32>()?, pl, "rope positions")?;
    let rows = pl.shape().elem_count();
    let (g, d) = (op.kv_heads, op.head_dim);
    let capacity = capacity_of(dl, g, d, &op.slots, rows)?;
    if xl.shape().elem_count() != rows * g * d {
        bail!("rope into cache: {:?} is not {rows} rows of {g} heads of {d}", xl.shape());
    }
    inv_freq_view!(op.inv_freq, inv_guard, inv_layout, inv_freq);
    let name = match op.slots {
        Slots::From(_) => "rope_into_cache",
        Slots::Step(_) => "rope_into_cache_at",
    };
    let func = dev.get_or_load_custom_func(&kernel_name(name, &x.slice)?, MODULE, PTX)?;
    let (af, interleaved) = (op.attention_factor, op.interleaved as i32);
    let (rows_u, g_u, d_u, cap_u) = (rows as u32, g as u32, d as u32, capacity as u32);
    macro_rules! launch {
        ($s:expr, $t:ty) => {{
            let x = view($s, xl, "keys")?;
            let cache = dst.as_cuda_slice_mut::<$t>()?;
            let mut b = func.builder();
            b.arg(&x).arg(&positions).arg(&inv_freq).arg(&af).arg(&interleaved).arg(cache);
            b.arg(&rows_u).arg(&g_u).arg(&d_u).arg(&cap_u);
            match op.slots {
                Slots::From(start) => {
                    let start_u = start as u32;
                    b.arg(&start_u);
                    unsafe { b.launch(linear(rows * g * d / 2)) }.w()?;
                }
                Slots::Step(t) => {
                    step_start_view!(t, step_guard, step_layout, start_at);
                    b.arg(&start_at);
                    unsafe { b.launch(linear(rows * g * d / 2)) }.w()?;
                }
            }
        }};
    }
    match &x.slice {
        CudaStorageSlice::F32(s) => launch!(s, f32),
        CudaStorageSlice::BF16(s) => launch!(s, half::bf16),
        CudaStorageSlice::F16(s) => launch!(s, half::f16),
        _ => unreachable!("kernel_name checked the dtype"),
    }
    Ok(())
}

pub(super) fn rows_into_cache(
    op: &RowsIntoCache,
    dst: &mut CudaStorage,
    dl: &Layout,
    x: &CudaStorage,
    xl: &Layout,
) -> Result<()> {
    let dev = x.device.clone();
    let (g, d) = (op.kv_heads, op.head_dim);
    let rows = xl.shape().elem_count() / (g * d);
    let capacity = capacity_of(dl, g, d, &op.slots, rows)?;
    let name = match op.slots {
        Slots::From(_) => "rows_into_cache",
        Slots::Step(_) => "rows_into_cache_at",
    };
    let func = dev.get_or_load_custom_func(&kernel_name(name, &x.slice)?, MODULE, PTX)?;
    let (rows_u, g_u, d_u, cap_u) = (rows as u32, g as u32, d as u32, capacity as u32);
    macro_rules! launch {
        ($s:expr, $t:ty) => {{
            let x = view($s, xl, "values")?;
            let cache = dst.as_cuda_slice_mut::<$t>()?;
            let mut b = func.builder();
            b.arg(&x).arg(cache).arg(&rows_u).arg(&g_u).arg(&d_u).arg(&cap_u);
            match op.slots {
                Slots::From(start) => {
                    let start_u = start as u32;
                    b.arg(&start_u);
                    unsafe { b.launch(linear(rows * g * d)) }.w()?;
                }
                Slots::Step(t) => {
                    step_start_view!(t, step_guard, step_layout, start_at);
                    b.arg(&start_at);
                    unsafe { b.launch(linear(rows * g * d)) }.w()?;
                }
            }
        }};
    }
    match &x.slice {
        CudaStorageSlice::F32(s) => launch!(s, f32),
        CudaStorageSlice::BF16(s) => launch!(s, half::bf16),
        CudaStorageSlice::F16(s) => launch!(s, half::f16),
        _ => unreachable!("kernel_name checked the dtype"),
    }
    Ok(())
}

/// The device slice of a cache buffer of element type `T`.
fn cache_slice<'a, T: candle_core::cuda_backend::CudaDType + DeviceRepr>(
    s: &'a Storage,
    what: &str,
) -> Result<&'a CudaSlice<T>> {
    match s {
        Storage::Cuda(c) => c.as_cuda_slice::<T>(),
        _ => bail!("attention: the {what} cache is not on the GPU"),
    }
}

pub(super) fn cache_attention(
    op: &CacheAttention,
    s: &AttentionShape,
    q: &CudaStorage,
    ql: &Layout,
    bias: &CudaStorage,
    bl: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let rows = ql.shape().elem_count() / (s.heads * s.head_dim);
    if bl.dims() != [rows, s.total] {
        bail!("attention: bias {:?} for {rows} rows of {} positions", bl.dims(), s.total);
    }
    if bias.dtype() != q.dtype() {
        bail!("attention: queries and bias must share one dtype");
    }
    let caches = (op.keys, op.values, op.scale);
    attention(caches, s, (q, ql), Seen::Bias(bias, bl), s.total.div_ceil(ATTENTION_CHUNK))
}

pub(super) fn step_attention(
    op: &StepAttention,
    s: &AttentionShape,
    q: &CudaStorage,
    ql: &Layout,
    inputs: &CudaStorage,
    il: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let rows = ql.shape().elem_count() / (s.heads * s.head_dim);
    let words = view(inputs.as_cuda_slice::<u32>()?, il, "step inputs")?;
    if words.len() != (StepLayout { rows }).len() {
        bail!("step attention: {} input words for {rows} rows", words.len());
    }
    // Chunks over the whole buffer: the launch is the same at every step.
    let chunks = s.capacity.div_ceil(ATTENTION_CHUNK);
    attention((op.keys, op.values, op.scale), s, (q, ql), Seen::Step(words), chunks)
}

/// What attention's rows see: a dense bias `[rows, total]`, or a step's input words.
enum Seen<'a> {
    Bias(&'a CudaStorage, &'a Layout),
    Step(CudaView<'a, u32>),
}

/// The attention kernels of [`cache_attention`] (`attention_partial`) and [`step_attention`]
/// (`attention_partial_step`), whose parameters differ in what the rows see (a bias and the
/// keys' count, or the step's words and its rows), over `chunks` key chunks, then
/// `attention_combine`.
fn attention(
    (keys, values, scale): (&Tensor, &Tensor, f32),
    s: &AttentionShape,
    (q, ql): (&CudaStorage, &Layout),
    seen: Seen,
    chunks: usize,
) -> Result<(CudaStorage, Shape)> {
    let dev = &q.device;
    let rows = ql.shape().elem_count() / (s.heads * s.head_dim);
    let hd = s.head_dim;
    let (name, count) = match &seen {
        Seen::Bias(..) => ("attention_partial", s.total as u32),
        Seen::Step(_) => ("attention_partial_step", rows as u32),
    };
    let partials = unsafe { dev.alloc::<f32>(rows * s.heads * chunks * (hd + 2))? };
    let partial = dev.get_or_load_custom_func(&kernel_name(name, &q.slice)?, MODULE, PTX)?;
    let combine = dev.get_or_load_custom_func(&kernel_name("attention_combine", &q.slice)?, MODULE, PTX)?;
    let (ks, _) = keys.storage_and_layout();
    let (vs, _) = values.storage_and_layout();
    let (heads, kv_heads, hd_u, cap, chunks_u) =
        (s.heads as u32, s.kv_heads as u32, hd as u32, s.capacity as u32, chunks as u32);
    let partial_cfg = LaunchConfig {
        grid_dim: (chunks as u32, heads, rows as u32),
        block_dim: (BLOCK as u32, 1, 1),
        shared_mem_bytes: ((hd + ATTENTION_CHUNK + BLOCK) * 4) as u32,
    };
    let combine_cfg =
        LaunchConfig { grid_dim: (heads, rows as u32, 1), block_dim: (BLOCK as u32, 1, 1), shared_mem_bytes: 0 };
    macro_rules! launch {
        ($qs:expr, $t:ty, $variant:ident) => {{
            let qv = view($qs, ql, "queries")?;
            let keys = cache_slice::<$t>(&ks, "key")?;
            let values = cache_slice::<$t>(&vs, "value")?;
            let bias = match &seen {
                Seen::Bias(b, bl) => Some(view(b.as_cuda_slice::<$t>()?, bl, "bias")?),
                Seen::Step(_) => None,
            };
            let mut b = partial.builder();
            b.arg(&qv).arg(keys).arg(values);
            match (&bias, &seen) {
                (Some(bias), _) => b.arg(bias),
                (None, Seen::Step(words)) => b.arg(words),
                (None, Seen::Bias(..)) => unreachable!("a bias view was made above"),
            };
            b.arg(&scale).arg(&heads).arg(&kv_heads).arg(&hd_u).arg(&cap).arg(&count).arg(&partials);
            unsafe { b.launch(partial_cfg) }.w()?;
            let out = unsafe { dev.alloc::<$t>(rows * s.heads * hd)? };
            let mut b = combine.builder();
            b.arg(&partials).arg(&out).arg(&heads).arg(&hd_u).arg(&chunks_u);
            unsafe { b.launch(combine_cfg) }.w()?;
            CudaStorageSlice::$variant(out)
        }};
    }
    let slice = match &q.slice {
        CudaStorageSlice::F32(qs) => launch!(qs, f32, F32),
        CudaStorageSlice::BF16(qs) => launch!(qs, half::bf16, BF16),
        CudaStorageSlice::F16(qs) => launch!(qs, half::f16, F16),
        _ => bail!("attention: f32, bf16 or f16 queries expected"),
    };
    Ok((CudaStorage { slice, device: dev.clone() }, Shape::from((rows, s.heads * hd))))
}

/// `words` copied into the contiguous extent of `dst` (u32), queued on the device's stream.
pub(super) fn write_words(words: &[u32], dst: &mut CudaStorage, l: &Layout) -> Result<()> {
    let Some((a, b)) = l.contiguous_offsets() else { bail!("write words: the destination is not contiguous") };
    if b - a != words.len() {
        bail!("write words: {} words into {}", words.len(), b - a);
    }
    let dev = dst.device.clone();
    let slice = dst.as_cuda_slice_mut::<u32>()?;
    let mut target = slice.slice_mut(a..b);
    dev.memcpy_htod(words, &mut target)
}

pub(super) fn argmax_rows(s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    let dev = &s.device;
    let (rows, cols) = l.shape().dims2()?;
    let x = view(s.as_cuda_slice::<f32>()?, l, "logits")?;
    let func = dev.get_or_load_custom_func("argmax_rows_f32", MODULE, PTX)?;
    let out = unsafe { dev.alloc::<u32>(rows)? };
    let cols_u = cols as u32;
    let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut b = func.builder();
    b.arg(&x).arg(&cols_u).arg(&out);
    unsafe { b.launch(cfg) }.w()?;
    Ok((CudaStorage { slice: CudaStorageSlice::U32(out), device: dev.clone() }, Shape::from(rows)))
}

/// `super::WarpRows` on CUDA: `[rows, cols]` f32 logits to f64 probabilities, one block per row.
pub(super) fn warp_rows(s: &CudaStorage, l: &Layout, w: &reference::WarpParams) -> Result<(CudaStorage, Shape)> {
    let dev = &s.device;
    let (rows, cols) = l.shape().dims2()?;
    let x = view(s.as_cuda_slice::<f32>()?, l, "logits")?;
    let func = dev.get_or_load_custom_func("warp_rows_f32", MODULE, PTX)?;
    // SAFETY: the kernel writes every entry.
    let out = unsafe { dev.alloc::<f64>(rows * cols)? };
    let (cols_u, truncate) = (cols as u32, w.truncate as u32);
    let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut b = func.builder();
    b.arg(&x).arg(&cols_u).arg(&w.inv_t).arg(&w.min_p).arg(&truncate).arg(&w.limit).arg(&w.top_p_fixed).arg(&out);
    unsafe { b.launch(cfg) }.w()?;
    Ok((CudaStorage { slice: CudaStorageSlice::F64(out), device: dev.clone() }, Shape::from((rows, cols))))
}

/// `super::SampleRow` on CUDA: one token drawn from one row of f64 probabilities.
pub(super) fn sample_row(s: &CudaStorage, l: &Layout, cols: usize, u: f64) -> Result<(CudaStorage, Shape)> {
    let dev = &s.device;
    let p = view(s.as_cuda_slice::<f64>()?, l, "probabilities")?;
    let func = dev.get_or_load_custom_func("sample_row_f64", MODULE, PTX)?;
    // SAFETY: the kernel writes the one entry.
    let out = unsafe { dev.alloc::<u32>(1)? };
    let cols_u = cols as u32;
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut b = func.builder();
    b.arg(&p).arg(&cols_u).arg(&u).arg(&out);
    unsafe { b.launch(cfg) }.w()?;
    Ok((CudaStorage { slice: CudaStorageSlice::U32(out), device: dev.clone() }, Shape::from(1)))
}

/// Buffers per launch of `compact_rows_*` (its pointer table, a kernel parameter).
const COMPACT_BUFFERS: usize = 128;
/// Kept rows per launch of `compact_rows_*` (a kernel parameter too).
const COMPACT_KEPT: usize = 64;

/// `super::compact_rows` on CUDA: one launch per 128 buffers and 64 kept rows (the usual path
/// of a tree fits one); more rows take the launches of [`reference::compact_launches`], in
/// order on the one stream. Checked by the caller: equal shapes and dtypes,
/// contiguous, increasing offsets within the capacity.
pub(super) fn compact_rows(
    buffers: &[Tensor],
    kv_heads: usize,
    capacity: usize,
    head_dim: usize,
    start: usize,
    kept: &[u32],
) -> Result<()> {
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    let candle_core::Device::Cuda(dev) = buffers[0].device() else { bail!("compact rows: not a CUDA buffer") };
    let stream = dev.cuda_stream();
    for group in buffers.chunks(COMPACT_BUFFERS) {
        let mut table = [0u64; COMPACT_BUFFERS];
        let mut width = 0;
        for (slot, t) in table.iter_mut().zip(group) {
            let (storage, layout) = t.storage_and_layout();
            let Storage::Cuda(cs) = &*storage else { bail!("compact rows: a buffer is not on the GPU") };
            let (ptr, w) = match &cs.slice {
                CudaStorageSlice::F32(s) => (s.device_ptr(&stream).0, 4),
                CudaStorageSlice::BF16(s) => (s.device_ptr(&stream).0, 2),
                CudaStorageSlice::F16(s) => (s.device_ptr(&stream).0, 2),
                _ => bail!("compact rows: f32, bf16 or f16 buffers expected"),
            };
            *slot = ptr + (layout.start_offset() * w) as u64;
            width = w;
        }
        let name = if width == 4 { "compact_rows_u32" } else { "compact_rows_u16" };
        let func = dev.get_or_load_custom_func(name, MODULE, PTX)?;
        let (n_bufs, g, cap, hd) = (group.len() as u32, kv_heads as u32, capacity as u32, head_dim as u32);
        for (at, chunk) in reference::compact_launches(start, kept, COMPACT_KEPT) {
            let mut rows = [0u32; COMPACT_KEPT];
            rows[..chunk.len()].copy_from_slice(&chunk);
            let (at, n_kept) = (at as u32, chunk.len() as u32);
            let mut b = func.builder();
            b.arg(&table).arg(&n_bufs).arg(&g).arg(&cap).arg(&hd).arg(&at).arg(&rows).arg(&n_kept);
            unsafe { b.launch(linear(group.len() * kv_heads * head_dim)) }.w()?;
        }
    }
    Ok(())
}

/// `super::SiluMul`: `[.., 2n]` to `shape` (`[.., n]`), one launch.
pub(super) fn silu_mul(x: &CudaStorage, l: &Layout, n: usize, shape: Shape) -> Result<(CudaStorage, Shape)> {
    let dev = &x.device;
    let total = shape.elem_count();
    let func = dev.get_or_load_custom_func(&kernel_name("silu_mul", &x.slice)?, MODULE, PTX)?;
    let (rows, n_u) = ((total / n.max(1)) as u32, n as u32);
    macro_rules! launch {
        ($s:expr, $t:ty, $variant:ident) => {{
            let xv = view($s, l, "silu-mul")?;
            let out = unsafe { dev.alloc::<$t>(total)? };
            let mut b = func.builder();
            b.arg(&xv).arg(&out).arg(&rows).arg(&n_u);
            unsafe { b.launch(linear(total)) }.w()?;
            CudaStorageSlice::$variant(out)
        }};
    }
    let slice = match &x.slice {
        CudaStorageSlice::F32(s) => launch!(s, f32, F32),
        CudaStorageSlice::BF16(s) => launch!(s, half::bf16, BF16),
        CudaStorageSlice::F16(s) => launch!(s, half::f16, F16),
        _ => bail!("silu-mul: f32, bf16 or f16 expected"),
    };
    Ok((CudaStorage { slice, device: dev.clone() }, shape))
}

/// `super::AddRmsNorm`: one block of `NORM_BLOCK` threads per row.
pub(super) fn add_rms_norm(
    eps: f32,
    (x, xl): (&CudaStorage, &Layout),
    (y, yl): (&CudaStorage, &Layout),
    (w, wl): (&CudaStorage, &Layout),
    n: usize,
    rows: usize,
    shape: Shape,
) -> Result<(CudaStorage, Shape)> {
    let dev = &x.device;
    if rows == 0 {
        bail!("add-rms-norm: no rows");
    }
    let func = dev.get_or_load_custom_func(&kernel_name("add_rms_norm", &x.slice)?, MODULE, PTX)?;
    let (rows_u, n_u) = (rows as u32, n as u32);
    let cfg =
        LaunchConfig { grid_dim: (rows_u, 1, 1), block_dim: (reference::NORM_BLOCK as u32, 1, 1), shared_mem_bytes: 0 };
    macro_rules! launch {
        ($xs:expr, $t:ty, $variant:ident) => {{
            let xv = view($xs, xl, "x")?;
            let yv = view(y.as_cuda_slice::<$t>()?, yl, "y")?;
            let wv = view(w.as_cuda_slice::<$t>()?, wl, "w")?;
            let out = unsafe { dev.alloc::<$t>(2 * rows * n)? };
            let mut b = func.builder();
            b.arg(&xv).arg(&yv).arg(&wv).arg(&out).arg(&rows_u).arg(&n_u).arg(&eps);
            unsafe { b.launch(cfg) }.w()?;
            CudaStorageSlice::$variant(out)
        }};
    }
    let slice = match &x.slice {
        CudaStorageSlice::F32(s) => launch!(s, f32, F32),
        CudaStorageSlice::BF16(s) => launch!(s, half::bf16, BF16),
        CudaStorageSlice::F16(s) => launch!(s, half::f16, F16),
        _ => bail!("add-rms-norm: f32, bf16 or f16 expected"),
    };
    Ok((CudaStorage { slice, device: dev.clone() }, shape))
}
