//! Quantized matrix products on the CPU, organised as ggml-cpu is: this module owns ggml's block
//! types ([`BlockQ4K`], [`BlockQ6K`], [`BlockQ8K`]); [`q8k`] quantizes activation rows to Q8_K;
//! [`qgemv`] runs the few-rows products on matrices as stored in the GGUF block layout (AVX2)
//! and dispatches every layout ([`qgemv::matmul_many`], [`qgemv::RowsWeight`]); the repacked
//! layouts are split by instruction set: [`avx2`] (blocks of 4 rows interleaved, AVX2 + FMA)
//! and [`avx512`] (tiles of 16 rows, AVX-512 VNNI).

pub mod avx2;
pub mod avx512;
pub mod q8k;
pub mod qgemv;
#[cfg(test)]
mod repack_test_support;

/// Values per super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// ggml's `block_q4_K`: `w = d * scale[s] * q - dmin * min[s]`, 8 sub-blocks of 32 values.
#[repr(C)]
pub(crate) struct BlockQ4K {
    pub(crate) d: u16,
    pub(crate) dmin: u16,
    pub(crate) scales: [u8; 12],
    pub(crate) qs: [u8; 128],
}

/// ggml's `block_q6_K`: `w = d * scale[s] * (q - 32)`, 16 sub-blocks of 16 values, 6-bit q.
#[repr(C)]
pub(crate) struct BlockQ6K {
    pub(crate) ql: [u8; 128],
    pub(crate) qh: [u8; 64],
    pub(crate) scales: [i8; 16],
    pub(crate) d: u16,
}

/// ggml's `block_q8_K`: `x ≈ d * q`, with the sum of each 16 values of q.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ8K {
    pub(crate) d: f32,
    pub(crate) qs: [i8; QK_K],
    pub(crate) bsums: [i16; 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

impl BlockQ8K {
    pub(crate) const ZERO: Self = Self { d: 0.0, qs: [0; QK_K], bsums: [0; 16] };
}
