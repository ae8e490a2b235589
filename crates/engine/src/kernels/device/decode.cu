// The decode step's CUDA kernels (see mod.rs). Each mirrors reference.rs operation for
// operation: products and sums written out one rounded f32 operation each (`fmaf` exactly where
// the reference calls `mul_add`; the build passes --fmad=false so nothing else fuses), bf16/f16
// values widened to f32 and each operation rounded back, the same key chunks, the same warp
// butterfly and block tree sums, and mdsd_exp = kernels::simd::exp.
//
// Built to PTX by build.rs (nvcc -ptx) under the `cuda` feature and loaded through candle's
// custom-module API.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define ATTENTION_CHUNK 256
#define WARP 32
#define BLOCK 128

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

// kernels::simd::exp: a Cody-Waite reduction and Cephes' polynomial, 2^n as two powers of two.
__device__ __forceinline__ float mdsd_exp(float x) {
    const float UNDERFLOW = -87.33654f;
    const float OVERFLOW = 88.72284f;
    const float LOG2E = 1.44269504088896340736f;
    const float LN2_HI = 0.6933594f;
    const float LN2_LO = -2.1219444e-4f;
    if (isnan(x)) return x;
    float xc = fminf(fmaxf(x, UNDERFLOW), OVERFLOW);
    float n = rintf(__fmul_rn(xc, LOG2E));
    float r = fmaf(n, -LN2_HI, xc);
    r = fmaf(n, -LN2_LO, r);
    float p = 1.9875691e-4f;
    p = fmaf(p, r, 1.3981999e-3f);
    p = fmaf(p, r, 8.333452e-3f);
    p = fmaf(p, r, 4.1665796e-2f);
    p = fmaf(p, r, 1.6666665e-1f);
    p = fmaf(p, r, 0.5f);
    float y = __fadd_rn(fmaf(p, __fmul_rn(r, r), r), 1.0f);
    int ni = (int)n;
    float a = __int_as_float(((ni >> 1) + 127) << 23);
    float b = __int_as_float(((ni - (ni >> 1)) + 127) << 23);
    float v = __fmul_rn(__fmul_rn(y, a), b);
    if (x < UNDERFLOW) return 0.0f;
    if (x > OVERFLOW) return __int_as_float(0x7f800000);
    return v;
}

// cos and sin of pair i at `pos`, in T (RopeParams::cos_sin).
template <typename T>
__device__ __forceinline__ void cos_sin(uint32_t pos, const float* inv_freq, float af, uint32_t i, T* c, T* s) {
    float angle = __fmul_rn((float)pos, inv_freq[i]);
    float cf = cosf(angle), sf = sinf(angle);
    if (af != 1.0f) {
        cf = __fadd_rn(__fmul_rn(cf, af), 0.0f);
        sf = __fadd_rn(__fmul_rn(sf, af), 0.0f);
    }
    *c = from_f32<T>(cf);
    *s = from_f32<T>(sf);
}

// One rotated pair (RopeParams::rotate): each product and the sum rounded to T.
template <typename T>
__device__ __forceinline__ void rotate_pair(const T* x, T* out, uint32_t i, uint32_t hd, int interleaved, T c, T s) {
    uint32_t half = hd / 2;
    uint32_t i1 = interleaved ? 2 * i : i;
    uint32_t i2 = interleaved ? 2 * i + 1 : i + half;
    float x1 = to_f32(x[i1]), x2 = to_f32(x[i2]), cf = to_f32(c), sf = to_f32(s);
    T a = from_f32<T>(__fmul_rn(x1, cf)), b = from_f32<T>(__fmul_rn(x2, sf));
    T e = from_f32<T>(__fmul_rn(x1, sf)), f = from_f32<T>(__fmul_rn(x2, cf));
    out[i1] = from_f32<T>(__fsub_rn(to_f32(a), to_f32(b)));
    out[i2] = from_f32<T>(__fadd_rn(to_f32(e), to_f32(f)));
}

// x [rows, heads, hd] -> out, one thread per (row, head, pair).
template <typename T>
__device__ void rope_rows(const T* x, const uint32_t* pos, const float* inv_freq, float af, int interleaved, T* out,
                          uint32_t rows, uint32_t heads, uint32_t hd) {
    uint32_t half = hd / 2;
    uint64_t n = (uint64_t)rows * heads * half;
    for (uint64_t k = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; k < n; k += (uint64_t)gridDim.x * blockDim.x) {
        uint32_t i = k % half;
        uint64_t rh = k / half;
        uint32_t r = rh / heads;
        T c, s;
        cos_sin(pos[r], inv_freq, af, i, &c, &s);
        rotate_pair(x + rh * hd, out + rh * hd, i, hd, interleaved, c, s);
    }
}

// x [rows, kv_heads, hd] rotated into cache [kv_heads, capacity, hd] at start + row (rows past
// the capacity are dropped: a step's start comes from device memory, unchecked by the host).
template <typename T>
__device__ void rope_into_cache(const T* x, const uint32_t* pos, const float* inv_freq, float af, int interleaved,
                                T* cache, uint32_t rows, uint32_t kv_heads, uint32_t hd, uint32_t capacity,
                                uint32_t start) {
    uint32_t half = hd / 2;
    uint64_t n = (uint64_t)rows * kv_heads * half;
    for (uint64_t k = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; k < n; k += (uint64_t)gridDim.x * blockDim.x) {
        uint32_t i = k % half;
        uint64_t rg = k / half;
        uint32_t r = rg / kv_heads, g = rg % kv_heads;
        if ((uint64_t)start + r >= capacity) continue;
        T c, s;
        cos_sin(pos[r], inv_freq, af, i, &c, &s);
        rotate_pair(x + rg * hd, cache + ((uint64_t)g * capacity + start + r) * hd, i, hd, interleaved, c, s);
    }
}

// x [rows, kv_heads, hd] copied into cache [kv_heads, capacity, hd] at start + row.
template <typename T>
__device__ void rows_into_cache(const T* x, T* cache, uint32_t rows, uint32_t kv_heads, uint32_t hd,
                                uint32_t capacity, uint32_t start) {
    uint64_t n = (uint64_t)rows * kv_heads * hd;
    for (uint64_t k = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; k < n; k += (uint64_t)gridDim.x * blockDim.x) {
        uint32_t d = k % hd;
        uint64_t rg = k / hd;
        uint32_t r = rg / kv_heads, g = rg % kv_heads;
        if ((uint64_t)start + r >= capacity) continue;
        cache[((uint64_t)g * capacity + start + r) * hd + d] = x[k];
    }
}

// The kept rows of many cache buffers (reference::compact_rows), all in one launch: buffer b
// ([kv_heads, capacity, hd] words of the element's width) keeps, from position `start` on, the
// rows at offsets kept[0..n_kept] (increasing), moved to start, start + 1, ... One thread per
// (buffer, head, element) walks the kept rows in order, as the reference does: kept[i] >= i, so
// no row is overwritten before it is read. The tables are kernel parameters (no upload).
#define COMPACT_BUFFERS 128
#define COMPACT_KEPT 64
struct BufferTable { unsigned long long at[COMPACT_BUFFERS]; };
struct KeptRows { uint32_t at[COMPACT_KEPT]; };

template <typename W>
__device__ void compact_rows(BufferTable bufs, uint32_t n_bufs, uint32_t kv_heads, uint32_t capacity, uint32_t hd,
                             uint32_t start, KeptRows kept, uint32_t n_kept) {
    uint64_t n = (uint64_t)n_bufs * kv_heads * hd;
    for (uint64_t k = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; k < n; k += (uint64_t)gridDim.x * blockDim.x) {
        uint32_t d = k % hd;
        uint64_t bg = k / hd;
        uint32_t b = bg / kv_heads, g = bg % kv_heads;
        W* head = (W*)bufs.at[b] + ((uint64_t)g * capacity + start) * hd + d;
        for (uint32_t i = 0; i < n_kept; i++) {
            uint32_t from = kept.at[i];
            if (from != i) head[(uint64_t)i * hd] = head[(uint64_t)from * hd];
        }
    }
}

extern "C" __global__ void compact_rows_u32(BufferTable bufs, uint32_t n_bufs, uint32_t kv_heads, uint32_t capacity,
                                            uint32_t hd, uint32_t start, KeptRows kept, uint32_t n_kept) {
    compact_rows<uint32_t>(bufs, n_bufs, kv_heads, capacity, hd, start, kept, n_kept);
}

extern "C" __global__ void compact_rows_u16(BufferTable bufs, uint32_t n_bufs, uint32_t kv_heads, uint32_t capacity,
                                            uint32_t hd, uint32_t start, KeptRows kept, uint32_t n_kept) {
    compact_rows<uint16_t>(bufs, n_bufs, kv_heads, capacity, hd, start, kept, n_kept);
}

// The additive bias of row r for key j: a dense [rows, total] matrix.
template <typename T> struct DenseBias {
    const T* bias;
    uint32_t total;
    __device__ __forceinline__ float operator()(uint32_t r, uint32_t j) const { return to_f32(bias[(uint64_t)r * total + j]); }
};

// The bias of a step laid out in one u32 buffer (reference::StepLayout): every key before the
// tail visible, and from the tail on the keys of the row's 64-bit mask, below the step's end.
struct StepBias {
    const uint32_t* inputs;
    uint32_t rows;
    uint32_t start;
    uint32_t tail;
    __device__ __forceinline__ float operator()(uint32_t r, uint32_t j) const {
        if (j < tail) return 0.0f;
        uint32_t c = j - tail;
        if (j < start + rows && c < 64 && ((inputs[2 * rows + 2 * r + c / 32] >> (c % 32)) & 1u)) return 0.0f;
        return -INFINITY;
    }
};

// One chunk's partial softmax for one (row, head): grid (chunks, heads, rows), BLOCK threads.
// partials [rows, heads, chunks, hd + 2]: m, l, o[hd] (reference::attention_partial). A chunk
// past `total` gives the empty partial.
template <typename T, typename Bias>
__device__ void attention_partial(const T* q, const T* keys, const T* values, Bias bias, float scale,
                                  uint32_t heads, uint32_t kv_heads, uint32_t hd, uint32_t capacity, uint32_t total,
                                  float* partials) {
    extern __shared__ float shared[];
    float* qs = shared;            // hd
    float* scores = shared + hd;   // ATTENTION_CHUNK
    float* sums = scores + ATTENTION_CHUNK;  // BLOCK
    uint32_t c = blockIdx.x, h = blockIdx.y, r = blockIdx.z;
    uint32_t chunks = gridDim.x;
    uint32_t g = h / (heads / kv_heads);
    uint32_t start = c * ATTENTION_CHUNK;
    uint32_t len = total > start ? min((uint32_t)ATTENTION_CHUNK, total - start) : 0;
    uint32_t t = threadIdx.x, warp = t / WARP, lane = t % WARP;
    for (uint32_t d = t; d < hd; d += BLOCK) qs[d] = to_f32(q[((uint64_t)r * heads + h) * hd + d]);
    __syncthreads();
    // Scores: warp w takes keys w, w + 4, ...; one warp's dot product per key.
    for (uint32_t kk = warp; kk < len; kk += BLOCK / WARP) {
        uint32_t j = start + kk;
        float b = bias(r, j);
        float acc = 0.0f;
        if (b != -INFINITY) {
            const T* k = keys + ((uint64_t)g * capacity + j) * hd;
            for (uint32_t i = lane; i < hd; i += WARP) acc = fmaf(qs[i], to_f32(k[i]), acc);
            for (int off = WARP / 2; off > 0; off /= 2) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, off));
        }
        if (lane == 0) scores[kk] = (b == -INFINITY) ? -INFINITY : __fadd_rn(__fmul_rn(acc, scale), b);
    }
    __syncthreads();
    // The largest score (max is exact in any order).
    float m = -INFINITY;
    if (t < len) m = scores[t];
    if (t + BLOCK < len) m = fmaxf(m, scores[t + BLOCK]);
    sums[t] = m;
    __syncthreads();
    for (uint32_t stride = BLOCK / 2; stride > 0; stride /= 2) {
        if (t < stride) sums[t] = fmaxf(sums[t], sums[t + stride]);
        __syncthreads();
    }
    m = sums[0];
    __syncthreads();
    float* out = partials + (((uint64_t)r * heads + h) * chunks + c) * (hd + 2);
    if (m == -INFINITY) {
        for (uint32_t d = t; d < hd + 2; d += BLOCK) out[d] = (d == 0) ? -INFINITY : 0.0f;
        return;
    }
    // Weights in place of the scores (0 past the chunk), and their block tree sum.
    for (uint32_t kk = t; kk < ATTENTION_CHUNK; kk += BLOCK) scores[kk] = kk < len ? mdsd_exp(__fsub_rn(scores[kk], m)) : 0.0f;
    __syncthreads();
    sums[t] = __fadd_rn(scores[t], scores[t + BLOCK]);
    __syncthreads();
    for (uint32_t stride = BLOCK / 2; stride > 0; stride /= 2) {
        if (t < stride) sums[t] = __fadd_rn(sums[t], sums[t + stride]);
        __syncthreads();
    }
    if (t == 0) {
        out[0] = m;
        out[1] = sums[0];
    }
    // Weighted values, each output element summed over the keys in order.
    for (uint32_t d = t; d < hd; d += BLOCK) {
        float acc = 0.0f;
        for (uint32_t kk = 0; kk < len; kk++) {
            float w = scores[kk];
            if (w != 0.0f) acc = fmaf(w, to_f32(values[((uint64_t)g * capacity + start + kk) * hd + d]), acc);
        }
        out[2 + d] = acc;
    }
}

// The chunks of one (row, head) combined in order (reference::combine): grid (heads, rows).
template <typename T>
__device__ void attention_combine(const float* partials, T* out, uint32_t heads, uint32_t hd, uint32_t chunks) {
    uint32_t h = blockIdx.x, r = blockIdx.y, t = threadIdx.x;
    const float* p = partials + ((uint64_t)r * heads + h) * chunks * (hd + 2);
    float m = -INFINITY;
    for (uint32_t c = 0; c < chunks; c++) m = fmaxf(m, p[c * (hd + 2)]);
    float l = 0.0f;
    for (uint32_t c = 0; c < chunks; c++) l = fmaf(mdsd_exp(__fsub_rn(p[c * (hd + 2)], m)), p[c * (hd + 2) + 1], l);
    for (uint32_t d = t; d < hd; d += BLOCK) {
        float o = 0.0f;
        for (uint32_t c = 0; c < chunks; c++) {
            float w = mdsd_exp(__fsub_rn(p[c * (hd + 2)], m));
            o = fmaf(w, p[c * (hd + 2) + 2 + d], o);
        }
        out[((uint64_t)r * heads + h) * hd + d] = from_f32<T>(__fdiv_rn(o, l));
    }
}

// The gated MLP's activation of a joined gate/up product (reference::silu_mul): x [rows, 2n],
// out [rows, n] = g / (1 + e^-g) * u, one rounded f32 operation each.
template <typename T> __device__ void silu_mul(const T* x, T* out, uint32_t rows, uint32_t n) {
    uint64_t total = (uint64_t)rows * n;
    for (uint64_t k = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; k < total;
         k += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t r = k / n, j = k % n;
        float g = to_f32(x[r * 2 * n + j]);
        float u = to_f32(x[r * 2 * n + n + j]);
        float s = __fdiv_rn(g, __fadd_rn(1.0f, mdsd_exp(-g)));
        out[k] = from_f32<T>(__fmul_rn(s, u));
    }
}

// The residual sum x + y and its RMS norm with weight w (reference::add_rms_norm): one block of
// NORM_BLOCK threads per row of n; out holds every row's sum, then every row's normed values.
#define NORM_BLOCK 256
template <typename T>
__device__ void add_rms_norm(const T* x, const T* y, const T* w, T* out, uint32_t rows, uint32_t n, float eps) {
    __shared__ float p[NORM_BLOCK];
    uint32_t r = blockIdx.x, t = threadIdx.x;
    const T* xr = x + (uint64_t)r * n;
    const T* yr = y + (uint64_t)r * n;
    T* sum = out + (uint64_t)r * n;
    T* normed = out + (uint64_t)rows * n + (uint64_t)r * n;
    float acc = 0.0f;
    for (uint32_t j = t; j < n; j += NORM_BLOCK) {
        T s = from_f32<T>(__fadd_rn(to_f32(xr[j]), to_f32(yr[j])));
        sum[j] = s;
        float sf = to_f32(s);
        acc = fmaf(sf, sf, acc);
    }
    p[t] = acc;
    __syncthreads();
    for (uint32_t stride = NORM_BLOCK / 2; stride > 0; stride /= 2) {
        if (t < stride) p[t] = __fadd_rn(p[t], p[t + stride]);
        __syncthreads();
    }
    float m = __fsqrt_rn(__fadd_rn(__fdiv_rn(p[0], (float)n), eps));
    for (uint32_t j = t; j < n; j += NORM_BLOCK) {
        normed[j] = from_f32<T>(__fmul_rn(__fdiv_rn(to_f32(sum[j]), m), to_f32(w[j])));
    }
}

#define INSTANTIATE(T, NAME)                                                                                          \
    extern "C" __global__ void rope_rows_##NAME(const T* x, const uint32_t* pos, const float* inv_freq, float af,     \
                                                int interleaved, T* out, uint32_t rows, uint32_t heads, uint32_t hd) { \
        rope_rows<T>(x, pos, inv_freq, af, interleaved, out, rows, heads, hd);                                         \
    }                                                                                                                  \
    extern "C" __global__ void rope_into_cache_##NAME(const T* x, const uint32_t* pos, const float* inv_freq,         \
                                                      float af, int interleaved, T* cache, uint32_t rows,             \
                                                      uint32_t kv_heads, uint32_t hd, uint32_t capacity,              \
                                                      uint32_t start) {                                               \
        rope_into_cache<T>(x, pos, inv_freq, af, interleaved, cache, rows, kv_heads, hd, capacity, start);            \
    }                                                                                                                  \
    extern "C" __global__ void rows_into_cache_##NAME(const T* x, T* cache, uint32_t rows, uint32_t kv_heads,         \
                                                      uint32_t hd, uint32_t capacity, uint32_t start) {              \
        rows_into_cache<T>(x, cache, rows, kv_heads, hd, capacity, start);                                           \
    }                                                                                                                  \
    extern "C" __global__ void rope_into_cache_at_##NAME(const T* x, const uint32_t* pos, const float* inv_freq,      \
                                                         float af, int interleaved, T* cache, uint32_t rows,          \
                                                         uint32_t kv_heads, uint32_t hd, uint32_t capacity,           \
                                                         const uint32_t* start) {                                     \
        rope_into_cache<T>(x, pos, inv_freq, af, interleaved, cache, rows, kv_heads, hd, capacity, *start);           \
    }                                                                                                                  \
    extern "C" __global__ void rows_into_cache_at_##NAME(const T* x, T* cache, uint32_t rows, uint32_t kv_heads,      \
                                                         uint32_t hd, uint32_t capacity, const uint32_t* start) {    \
        rows_into_cache<T>(x, cache, rows, kv_heads, hd, capacity, *start);                                          \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                                               \
        attention_partial_##NAME(const T* q, const T* keys, const T* values, const T* bias, float scale,             \
                                 uint32_t heads, uint32_t kv_heads, uint32_t hd, uint32_t capacity, uint32_t total,    \
                                 float* partials) {                                                                    \
        DenseBias<T> b = {bias, total};                                                                                \
        attention_partial<T>(q, keys, values, b, scale, heads, kv_heads, hd, capacity, total, partials);              \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                                               \
        attention_partial_step_##NAME(const T* q, const T* keys, const T* values, const uint32_t* inputs,            \
                                      float scale, uint32_t heads, uint32_t kv_heads, uint32_t hd, uint32_t capacity, \
                                      uint32_t rows, float* partials) {                                               \
        StepBias b = {inputs, rows, inputs[4 * rows], inputs[4 * rows + 1]};                                           \
        uint32_t total = min(b.start + rows, capacity);                                                                \
        attention_partial<T>(q, keys, values, b, scale, heads, kv_heads, hd, capacity, total, partials);              \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(NORM_BLOCK)                                                          \
        add_rms_norm_##NAME(const T* x, const T* y, const T* w, T* out, uint32_t rows, uint32_t n, float eps) {       \
        add_rms_norm<T>(x, y, w, out, rows, n, eps);                                                                   \
    }                                                                                                                  \
    extern "C" __global__ void silu_mul_##NAME(const T* x, T* out, uint32_t rows, uint32_t n) {                      \
        silu_mul<T>(x, out, rows, n);                                                                                  \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                                               \
        attention_combine_##NAME(const float* partials, T* out, uint32_t heads, uint32_t hd, uint32_t chunks) {       \
        attention_combine<T>(partials, out, heads, hd, chunks);                                                        \
    }

INSTANTIATE(float, f32)
INSTANTIATE(__nv_bfloat16, bf16)
INSTANTIATE(__half, f16)

// The greedy token of each row: the lowest index among the largest values; u32::MAX for a row
// holding NaN or +inf, or only -inf (reference::argmax_rows). One block of 256 threads per row.
extern "C" __global__ void __launch_bounds__(256) argmax_rows_f32(const float* x, uint32_t cols, uint32_t* out) {
    __shared__ float best[256];
    __shared__ uint32_t at[256];
    __shared__ int bad[256];
    uint32_t r = blockIdx.x, t = threadIdx.x;
    const float* row = x + (uint64_t)r * cols;
    float bv = -INFINITY;
    uint32_t bi = 0xffffffffu;
    int nan = 0;
    for (uint32_t i = t; i < cols; i += 256) {
        float v = row[i];
        if (isnan(v) || v == INFINITY) nan = 1;
        // Strictly greater, or the first index seen: this thread's indices only grow.
        if (bi == 0xffffffffu || v > bv) {
            bv = v;
            bi = i;
        }
    }
    best[t] = bv;
    at[t] = bi;
    bad[t] = nan;
    __syncthreads();
    for (uint32_t stride = 128; stride > 0; stride /= 2) {
        if (t < stride) {
            float v = best[t + stride];
            uint32_t i = at[t + stride];
            bool better = i != 0xffffffffu && (at[t] == 0xffffffffu || v > best[t] || (v == best[t] && i < at[t]));
            if (better) {
                best[t] = v;
                at[t] = i;
            }
            bad[t] |= bad[t + stride];
        }
        __syncthreads();
    }
    if (t == 0) out[r] = (bad[0] || best[0] == -INFINITY) ? 0xffffffffu : at[0];
}

// samplers::warp::exp_nonpositive, operation for operation: e^x for x <= 0 in f64 (a Cody-Waite
// reduction, the degree-13 Taylor polynomial, 2^n applied as 2^(n + 54) then 2^-54), so that
// every e_i of warp_rows_f32 is the host warp's, bit for bit.
__device__ __forceinline__ double exp_nonpositive(double x) {
    const double LOG2E = __longlong_as_double(0x3FF71547652B82FEll);
    const double LN2_HI = __longlong_as_double(0x3FE62E42FEE00000ll);
    const double LN2_LO = __longlong_as_double(0x3DEA39EF35793C76ll);
    const double SHIFT = 6755399441055744.0;  // 1.5 * 2^52
    const double LOWEST = -745.2;
    // Rust's clamp, NaN kept.
    double xc = x < LOWEST ? LOWEST : x;
    xc = xc > 0.0 ? 0.0 : xc;
    double shifted = fma(xc, LOG2E, SHIFT);
    double n = shifted - SHIFT;
    double r = fma(n, -LN2_HI, xc);
    r = fma(n, -LN2_LO, r);
    double poly = 1.0 / 6227020800.0;
    poly = fma(poly, r, 1.0 / 479001600.0);
    poly = fma(poly, r, 1.0 / 39916800.0);
    poly = fma(poly, r, 1.0 / 3628800.0);
    poly = fma(poly, r, 1.0 / 362880.0);
    poly = fma(poly, r, 1.0 / 40320.0);
    poly = fma(poly, r, 1.0 / 5040.0);
    poly = fma(poly, r, 1.0 / 720.0);
    poly = fma(poly, r, 1.0 / 120.0);
    poly = fma(poly, r, 1.0 / 24.0);
    poly = fma(poly, r, 1.0 / 6.0);
    poly = fma(poly, r, 0.5);
    double y = fma(__dmul_rn(poly, r), r, r) + 1.0;
    long long n_int = __double_as_longlong(shifted) - __double_as_longlong(SHIFT);
    double pow2 = __longlong_as_double((n_int + 54 + 1023) << 52);
    double v = __dmul_rn(__dmul_rn(y, pow2), __longlong_as_double((long long)(1023 - 54) << 52));
    return x < LOWEST ? 0.0 : v;
}

#define WARP_THREADS 256
#define WARP_BINS 256

// The sum of each thread's `acc` over the block (reference::warp_block_sum): the halving tree of the
// 256 per-thread sums. Every thread gets it.
__device__ double warp_block_sum(double acc, double* part) {
    uint32_t t = threadIdx.x;
    __syncthreads();
    part[t] = acc;
    __syncthreads();
    for (uint32_t stride = WARP_THREADS / 2; stride > 0; stride /= 2) {
        if (t < stride) part[t] += part[t + stride];
        __syncthreads();
    }
    double sum = part[0];
    __syncthreads();
    return sum;
}

// reference::warp_fixed: p in [0, 1] in units of 2^-62 (the scaling is exact, the conversion
// truncates).
__device__ __forceinline__ unsigned long long warp_fixed(double p) { return __double2ull_rz(p * 4611686018427387904.0); }

// Adds each lane's token (bin `b`, WARP_BINS for none; its mass `fixed` when `mass` is given) to
// the shared histogram. Most of a row falls in a few bins of the first passes, so the lanes of a
// warp with the same bin are summed first (one atomic per bin and warp, not 32 on one address);
// counts and masses are integer sums, the same in any order. Every lane of the warp calls it.
__device__ __forceinline__ void warp_bin_add(uint32_t b, unsigned long long fixed, unsigned int* count,
    unsigned long long* mass) {
#if __CUDA_ARCH__ >= 800
    unsigned peers = __match_any_sync(0xffffffffu, b);
    // 22-bit pieces: 32 of them sum within 32 bits (fixed < 2^63).
    unsigned lo = __reduce_add_sync(peers, (unsigned)(fixed & 0x3FFFFFull));
    unsigned mid = __reduce_add_sync(peers, (unsigned)((fixed >> 22) & 0x3FFFFFull));
    unsigned hi = __reduce_add_sync(peers, (unsigned)(fixed >> 44));
    if (b < WARP_BINS && (threadIdx.x & 31) == (unsigned)(__ffs(peers) - 1)) {
        atomicAdd(&count[b], (unsigned)__popc(peers));
        if (mass) atomicAdd(&mass[b], (unsigned long long)lo + ((unsigned long long)mid << 22) + ((unsigned long long)hi << 44));
    }
#else
    if (b < WARP_BINS) {
        atomicAdd(&count[b], 1u);
        if (mass) atomicAdd(&mass[b], fixed);
    }
#endif
}

// The probabilities of each row (reference::warp_rows): p_i = e_i / sum_j e_j with
// e_i = exp_nonpositive((l_i - max) * inv_t), 0 below min_p; then, when `truncate`, top-k
// (`limit`) and top-p (`top_p_fixed`, in 2^-62): the last kept token by a radix select over
// p's bits (8 passes of 8 bits; counts and 2^-62 masses summed as integers), among its ties by
// id (4 passes), and the kept set renormalised. f64 sums are each thread's entries in index
// order, then the halving tree. A row holding NaN or +inf, or only -inf, becomes all NaN. One
// block of 256 threads per row.
extern "C" __global__ void __launch_bounds__(WARP_THREADS) warp_rows_f32(const float* x, uint32_t cols, double inv_t,
    double min_p, uint32_t truncate, uint32_t limit, unsigned long long top_p, double* out) {
    __shared__ float best[WARP_THREADS];
    __shared__ int bad[WARP_THREADS];
    __shared__ double part[WARP_THREADS];
    __shared__ unsigned int count[WARP_BINS];
    __shared__ unsigned long long mass[WARP_BINS];
    // The select's state, written by thread 0: the pick, the ties' count, the count and the
    // mass above.
    __shared__ unsigned long long state[4];
    uint32_t r = blockIdx.x, t = threadIdx.x;
    const float* row = x + (uint64_t)r * cols;
    double* o = out + (uint64_t)r * cols;
    float m = -INFINITY;
    int nan = 0;
    for (uint32_t i = t; i < cols; i += WARP_THREADS) {
        float v = row[i];
        if (isnan(v) || v == INFINITY) nan = 1;
        m = fmaxf(m, v);
    }
    best[t] = m;
    bad[t] = nan;
    __syncthreads();
    for (uint32_t stride = WARP_THREADS / 2; stride > 0; stride /= 2) {
        if (t < stride) {
            best[t] = fmaxf(best[t], best[t + stride]);
            bad[t] |= bad[t + stride];
        }
        __syncthreads();
    }
    float top = best[0];
    if (bad[0] || top == -INFINITY) {
        for (uint32_t i = t; i < cols; i += WARP_THREADS) o[i] = __longlong_as_double(0x7FF8000000000000ll);
        return;
    }
    double dmax = (double)top, acc = 0.0;
    for (uint32_t i = t; i < cols; i += WARP_THREADS) {
        double e = exp_nonpositive(__dmul_rn((double)row[i] - dmax, inv_t));
        if (e < min_p) e = 0.0;
        o[i] = e;
        acc += e;
    }
    double sum = warp_block_sum(acc, part);
    for (uint32_t i = t; i < cols; i += WARP_THREADS) o[i] = __ddiv_rn(o[i], sum);
    if (!truncate) return;
    // The last kept token's probability, 8 bits at a time from the top.
    unsigned long long prefix = 0, mask = 0;
    if (t == 0) {
        state[2] = 0;
        state[3] = 0;
    }
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (uint32_t b = t; b < WARP_BINS; b += WARP_THREADS) {
            count[b] = 0;
            mass[b] = 0;
        }
        __syncthreads();
        // A trip count the same for the whole block: every lane reaches warp_bin_add.
        for (uint32_t base = 0; base < cols; base += WARP_THREADS) {
            uint32_t i = base + t, b = WARP_BINS;
            unsigned long long fixed = 0;
            if (i < cols) {
                unsigned long long key = (unsigned long long)__double_as_longlong(o[i]);
                if ((key & mask) == prefix) {
                    b = (uint32_t)(key >> shift) & (WARP_BINS - 1);
                    fixed = warp_fixed(o[i]);
                }
            }
            // Past the first passes few tokens share the prefix: a warp with none skips the adds.
            if (__any_sync(0xffffffffu, b < WARP_BINS)) warp_bin_add(b, fixed, count, mass);
        }
        __syncthreads();
        if (t == 0) {
            // Down from the largest bin: a bin is passed whole while the token after it would
            // still be kept; the first bin where that fails, or the lowest, holds the last one.
            unsigned long long above_n = state[2], above_m = state[3];
            int lowest = 0;
            while (count[lowest] == 0) lowest++;
            int pick = lowest;
            for (int b = WARP_BINS - 1; b >= lowest; b--) {
                if (count[b] == 0) continue;
                if (b != lowest && above_n + count[b] < limit && above_m + mass[b] < top_p) {
                    above_n += count[b];
                    above_m += mass[b];
                } else {
                    pick = b;
                    break;
                }
            }
            state[0] = (unsigned long long)pick;
            state[1] = count[pick];
            state[2] = above_n;
            state[3] = above_m;
        }
        __syncthreads();
        prefix |= state[0] << shift;
        mask |= 0xFFull << shift;
    }
    // Its ties in id order: the j-th is kept while within the limit and the mass before it is
    // short of top-p.
    unsigned long long ties = state[1], above_n = state[2], above_m = state[3];
    unsigned long long v = warp_fixed(__longlong_as_double((long long)prefix));
    unsigned long long j = min(ties, (unsigned long long)limit - above_n);
    if (v > 0) j = min(j, 1 + (top_p - 1 - above_m) / v);
    unsigned long long bound = 0xFFFFFFFFFFFFFFFFull;
    if (j < ties) {
        // The j-th smallest id among the ties, 8 bits at a time from the top.
        unsigned long long id_prefix = 0, id_mask = 0, before = 0;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (uint32_t b = t; b < WARP_BINS; b += WARP_THREADS) count[b] = 0;
            __syncthreads();
            for (uint32_t base = 0; base < cols; base += WARP_THREADS) {
                uint32_t i = base + t, b = WARP_BINS;
                if (i < cols && (unsigned long long)__double_as_longlong(o[i]) == prefix
                    && ((unsigned long long)i & id_mask) == id_prefix)
                    b = (i >> shift) & (WARP_BINS - 1);
                if (__any_sync(0xffffffffu, b < WARP_BINS)) warp_bin_add(b, 0, count, nullptr);
            }
            __syncthreads();
            if (t == 0) {
                int pick = 0;
                for (int b = 0; b < WARP_BINS; b++) {
                    if (before + count[b] >= j) {
                        pick = b;
                        break;
                    }
                    before += count[b];
                }
                state[0] = (unsigned long long)pick;
            }
            __syncthreads();
            id_prefix |= state[0] << shift;
            id_mask |= 0xFFull << shift;
        }
        bound = id_prefix;
    }
    acc = 0.0;
    for (uint32_t i = t; i < cols; i += WARP_THREADS) {
        unsigned long long key = (unsigned long long)__double_as_longlong(o[i]);
        if (!(key > prefix || (key == prefix && (unsigned long long)i <= bound))) o[i] = 0.0;
        acc += o[i];
    }
    double kept = warp_block_sum(acc, part);
    for (uint32_t i = t; i < cols; i += WARP_THREADS) o[i] = __ddiv_rn(o[i], kept);
}

// A token drawn from one row of probabilities with the uniform u (reference::sample_row): thread
// t sums its contiguous chunk of ceil(cols / 256) entries (the positive ones) in order; thread 0
// adds the chunks' sums in order for the total, finds the chunk where the running sum passes
// u * total, and that chunk's thread scans it. The last positive index when rounding leaves the
// scan short; u32::MAX when no entry is positive. One block of 256 threads.
extern "C" __global__ void __launch_bounds__(WARP_THREADS) sample_row_f64(const double* p, uint32_t cols, double u,
    uint32_t* out) {
    __shared__ double part[WARP_THREADS];
    __shared__ uint32_t last[WARP_THREADS];
    __shared__ int found;
    __shared__ double before, target;
    uint32_t t = threadIdx.x;
    uint32_t chunk = (cols + WARP_THREADS - 1) / WARP_THREADS;
    uint32_t start = min(t * chunk, cols);
    uint32_t end = min(start + chunk, cols);
    double s = 0.0;
    uint32_t l = 0xffffffffu;
    for (uint32_t i = start; i < end; i++) {
        double w = p[i];
        if (w > 0.0) {
            s += w;
            l = i;
        }
    }
    part[t] = s;
    last[t] = l;
    __syncthreads();
    if (t == 0) {
        double total = 0.0;
        for (int k = 0; k < WARP_THREADS; k++) total += part[k];
        double goal = __dmul_rn(u, total), acc = 0.0;
        target = goal;
        found = -1;
        for (int k = 0; k < WARP_THREADS; k++) {
            if (goal < acc + part[k]) {
                found = k;
                before = acc;
                break;
            }
            acc += part[k];
        }
        if (found < 0) {
            uint32_t best = 0xffffffffu;
            for (int k = 0; k < WARP_THREADS; k++)
                if (last[k] != 0xffffffffu && (best == 0xffffffffu || last[k] > best)) best = last[k];
            out[0] = best;
        }
    }
    __syncthreads();
    if ((int)t == found) {
        double acc = before;
        for (uint32_t i = start; i < end; i++) {
            double w = p[i];
            if (w > 0.0) {
                acc += w;
                if (target < acc) {
                    out[0] = i;
                    return;
                }
            }
        }
        out[0] = l;
    }
}
