//! Q4_K and Q6_K matrices repacked at load for x86-64 CPUs with AVX2 and FMA: [`q4k`] and
//! [`q6k`] (blocks of rows interleaved so one register load serves several rows); [`columns`]
//! runs either layout's kernel over a product's columns and rows. The CPU feature checks that
//! choose between them live here, apart from either layout.

pub mod columns;
pub mod q4k;
pub mod q6k;

/// x86-64 with AVX2, FMA and F16C.
pub fn cpu_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// True when [`columns::columns`] takes the AVX-512 VNNI kernels (`vpdpbusd` on 512-bit registers for
/// Q4_K, which needs AVX512F/BW/VL and AVX512-VNNI): on such CPUs unless `MDSD_VNNI=0`. They compute the same
/// integers and the same `f32` operations in the same order as the AVX2 kernels, so a product
/// is the same bit for bit either way (tested); only the speed differs.
pub fn vnni_enabled() -> bool {
    static VALUE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VALUE.get_or_init(|| cpu_supported() && cpu_has_vnni() && std::env::var("MDSD_VNNI").map_or(true, |v| v != "0"))
}

fn cpu_has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
