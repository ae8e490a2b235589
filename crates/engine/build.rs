//! Under the `cuda` feature: compiles the decode kernels (`src/kernels/device/decode.cu`) to PTX
//! with `nvcc` (from `$NVCC`, `$CUDA_HOME/bin`, `$CUDA_PATH/bin` or `PATH`), for
//! `compute_$CUDA_COMPUTE_CAP` (default 80: bf16 needs it; the driver compiles the PTX for the
//! card at load). `--fmad=false`: the kernels write every fused multiply-add they mean, so that
//! they compute what their Rust reference computes. Without the feature it does nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/kernels/device/decode.cu");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-env-changed=CUDA_PATH");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("decode.ptx");
    let cap = std::env::var("CUDA_COMPUTE_CAP").ok().filter(|c| !c.is_empty()).unwrap_or_else(|| "80".into());
    let cap: String = cap.chars().filter(char::is_ascii_digit).collect();
    let nvcc = nvcc();
    let status = Command::new(&nvcc)
        .args(["-ptx", "-O3", "--fmad=false", "-std=c++17"])
        .arg(format!("-arch=compute_{cap}"))
        .arg("src/kernels/device/decode.cu")
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("running {} for the decode kernels: {e} (set NVCC or CUDA_HOME)", nvcc.display()));
    assert!(status.success(), "nvcc failed on src/kernels/device/decode.cu ({status})");
}

/// The `nvcc` to run.
fn nvcc() -> PathBuf {
    if let Some(p) = std::env::var_os("NVCC") {
        return PathBuf::from(p);
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var) {
            let p = Path::new(&home).join("bin/nvcc");
            if p.is_file() {
                return p;
            }
        }
    }
    PathBuf::from("nvcc")
}
