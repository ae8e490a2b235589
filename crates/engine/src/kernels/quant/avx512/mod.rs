//! Q4_K and Q6_K matrices repacked at load into tiles of 16 weight rows for x86-64 CPUs with
//! AVX-512 VNNI: [`q4k`] and [`q6k`].

pub mod q4k;
pub mod q6k;
