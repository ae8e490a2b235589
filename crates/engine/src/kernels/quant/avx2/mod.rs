//! Q4_K and Q6_K matrices repacked at load for x86-64 CPUs with AVX2 and FMA: [`q4k`] and
//! [`q6k`] (blocks of rows interleaved so one register load serves several rows); [`columns`]
//! runs either layout's kernel over a product's columns and rows.

pub mod columns;
pub mod q4k;
pub mod q6k;
