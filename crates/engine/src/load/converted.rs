//! GGUF files re-quantized for the CPU ([`WeightFormat::FastCpu`]), kept on disk.
//!
//! Re-quantizing a draft's Q5_0/Q8_0 matrices to Q4_K is most of its load time (the default
//! 0.5B draft: about 2.7 of 5.2 seconds of `mdsd generate`'s start). The first load writes the
//! converted matrices, with every other tensor and the metadata, to
//! `$MDSD_CACHE/converted/<file stem>-<id>.gguf`; later loads read that file as stored. `id`
//! hashes the source's canonical path, size and modification time and [`VERSION`], so an edited
//! or replaced source gets a new copy. Deleting the folder is always safe.
//!
//! A converted file holds:
//! - each matmul matrix [`WeightFormat::FastCpu`] converts, converted (rows padded with zero
//!   columns to a multiple of 256), with its original width under `mdsd.fast_cpu.cols.<name>`;
//! - for tied embeddings, the converted output head as `output.weight` (the embedding itself is
//!   kept as stored, for lookups);
//! - everything else byte for byte, and the metadata (without `general.alignment`: the writer
//!   aligns to 32 bytes).

#[cfg(doc)]
use super::weight_format::WeightFormat;
use super::weight_format::{fast_cpu, fast_cpu_converts, fast_cpu_converts_on_cpu};
use crate::formats::gguf::GgufFile;
use crate::{file_error, Error, Result};
use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::QTensor;
use candle_core::Device;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Bumped whenever the conversion changes what it writes.
pub const VERSION: u32 = 1;

/// Metadata key of the format version of a converted file.
const VERSION_KEY: &str = "mdsd.fast_cpu.version";

/// Metadata key prefix: the width before padding of a padded matrix.
const COLS_KEY: &str = "mdsd.fast_cpu.cols.";

/// The matmul matrices of a GGUF model: every block's projections and the output head.
pub fn is_matmul(name: &str) -> bool {
    const BLOCK: [&str; 7] = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"];
    name == "output.weight"
        || name.strip_prefix("blk.").and_then(|r| r.split_once('.')).is_some_and(|(i, rest)| {
            i.parse::<usize>().is_ok() && BLOCK.iter().any(|b| rest.strip_prefix(b) == Some(".weight"))
        })
}

/// Where the converted copy of `source` goes under `cache`.
pub fn path_for(source: &Path, cache: &Path) -> Result<PathBuf> {
    let meta = std::fs::metadata(source).map_err(|e| file_error(source, e))?;
    let canonical = source.canonicalize().unwrap_or_else(|_| source.to_path_buf());
    let mtime =
        meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
    let key = format!("{}|{}|{mtime}|{VERSION}", canonical.display(), meta.len());
    let id: String = Sha256::digest(key.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect();
    let stem = source.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned());
    Ok(cache.join("converted").join(format!("{stem}-{id}.gguf")))
}

/// The copy of `source` under `cache` when one was made before.
pub fn existing(source: &Path, cache: &Path) -> Option<PathBuf> {
    path_for(source, cache).ok().filter(|p| p.exists())
}

/// Whether the conversion changes anything in `file`: a matmul matrix it converts, or a tied
/// head that is one.
pub fn converts_any(file: &GgufFile) -> bool {
    let head = if file.has_tensor("output.weight") { "output.weight" } else { "token_embd.weight" };
    file.tensor_names()
        .filter(|n| is_matmul(n) || *n == head)
        .any(|n| file.tensor_info(n).is_some_and(|(dtype, dims)| fast_cpu_converts_on_cpu(dtype, dims)))
}

/// The converted copy of the opened `source` under `cache`, written first when missing; `None`
/// when the conversion would change nothing (no copy is made). Progress goes to stderr (the
/// conversion takes seconds).
pub fn ensure(source: &mut GgufFile, cache: &Path) -> Result<Option<PathBuf>> {
    if !converts_any(source) {
        return Ok(None);
    }
    let dest = path_for(source.path(), cache)?;
    if dest.exists() {
        return Ok(Some(dest));
    }
    write(source, &dest)?;
    Ok(Some(dest))
}

/// Converts `source` into `dest` (through a temporary file renamed into place, so a reader
/// never sees half a file).
pub fn write(file: &mut GgufFile, dest: &Path) -> Result<()> {
    // The temporary file first: a cache that cannot be written fails before seconds of work.
    let parent = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let tmp = parent.join(format!(
        ".{}.{}.tmp",
        dest.file_name().map_or("x".into(), |n| n.to_string_lossy()),
        std::process::id()
    ));
    let out = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    eprintln!("mdsd: converting {} for the CPU (once; kept as {})", file.path().display(), dest.display());
    let result = convert_into(file, out, &tmp).and_then(|()| std::fs::rename(&tmp, dest).map_err(io(dest)));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The converted tensors and metadata of `file`, written as GGUF to `out` (at `path`).
fn convert_into(file: &mut GgufFile, out: std::fs::File, path: &Path) -> Result<()> {
    let mut names: Vec<String> = file.tensor_names().map(String::from).collect();
    names.sort();
    let tied = !file.has_tensor("output.weight") && file.has_tensor("token_embd.weight");
    let mut tensors: Vec<(String, QTensor)> = Vec::with_capacity(names.len() + 1);
    let mut cols: Vec<(String, Value)> = Vec::new();
    let mut convert = |name: &str, t: QTensor, tensors: &mut Vec<(String, QTensor)>| -> Result<()> {
        let width = t.shape().dims().last().copied().unwrap_or(0);
        let (converted, pad) = if fast_cpu_converts(&t, &Device::Cpu) { fast_cpu(&t, &Device::Cpu)? } else { (t, 0) };
        if pad > 0 {
            cols.push((format!("{COLS_KEY}{name}"), Value::U64(width as u64)));
        }
        tensors.push((name.to_string(), converted));
        Ok(())
    };
    for name in &names {
        let t = file.tensor(name, &Device::Cpu)?;
        if is_matmul(name) {
            convert(name, t, &mut tensors)?;
        } else {
            if tied && name == "token_embd.weight" {
                convert("output.weight", file.tensor(name, &Device::Cpu)?, &mut tensors)?;
            }
            tensors.push((name.clone(), t));
        }
    }
    let mut metadata: Vec<(String, Value)> = file
        .metadata()
        .iter()
        .filter(|(k, _)| k.as_str() != "general.alignment" && !k.starts_with("mdsd."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.push((VERSION_KEY.into(), Value::U32(VERSION)));
    metadata.extend(cols);
    let mut out = std::io::BufWriter::new(out);
    let meta_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    candle_core::quantized::gguf_file::write(&mut out, &meta_refs, &tensor_refs)
        .map_err(|e| file_error(path, format!("writing the converted model: {}", crate::plain_error(&e))))?;
    use std::io::Write;
    out.flush().map_err(io(path))
}

fn io(p: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| file_error(p, e)
}

/// The zero columns a converted file added to matrix `name` (0 when none).
pub fn padding(file: &GgufFile, name: &str, stored_cols: usize) -> Result<usize> {
    match file.uint(&format!("{COLS_KEY}{name}"))? {
        Some(c) if (c as usize) <= stored_cols => Ok(stored_cols - c as usize),
        Some(c) => Err(file_error(
            file.path(),
            format!("`{name}` is {stored_cols} columns wide but the conversion recorded {c}"),
        )),
        None => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_names() {
        for n in ["blk.0.attn_q.weight", "blk.23.ffn_down.weight", "output.weight", "blk.1.attn_output.weight"] {
            assert!(is_matmul(n), "{n}");
        }
        for n in [
            "blk.0.attn_q.bias",
            "blk.0.attn_norm.weight",
            "token_embd.weight",
            "blk.x.attn_q.weight",
            "output_norm.weight",
        ] {
            assert!(!is_matmul(n), "{n}");
        }
    }
}
