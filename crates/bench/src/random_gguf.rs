//! `bench random-gguf`: a GGUF file with a real checkpoint's layout (metadata, tokenizer, chat
//! template, tensor names, shapes and quantization types) and random weights, for timing and
//! exactness checks on machines that cannot hold the real file (a lent GPU here takes 64 MiB
//! per call; the default pair is 1.6 GB).
//!
//! The layout comes from `--like`: the real file, or its *skeleton* (the header alone, written
//! by `--skeleton`; a few MB, since the header holds the tokenizer). Every tensor of the
//! skeleton is filled with independent uniform noise of a chosen standard deviation and
//! quantized to the skeleton's type for that tensor; norms are ones. The output is a
//! well-formed GGUF that `mdsd` loads like the real one. Only timings mean something on it: its
//! next-token distributions are those of noise.

use anyhow::{bail, Context};
use candle_core::quantized::gguf_file::{self, Content, TensorInfo};
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};
use clap::Args;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use std::borrow::Cow;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct RandomGgufArgs {
    /// The GGUF whose layout is copied: a real file or a skeleton.
    #[arg(long)]
    like: PathBuf,
    /// Where to write the random-weight GGUF.
    #[arg(long, required_unless_present = "skeleton")]
    out: Option<PathBuf>,
    /// Instead: write only the header of `--like` (metadata and tensor table) to this file.
    #[arg(long, conflicts_with = "out")]
    skeleton: Option<PathBuf>,
    /// Seed of the weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Standard deviation of the token embedding and the output layer (0.1: logits peaked
    /// enough that temperature-0 runs do not sit on near-ties).
    #[arg(long, default_value_t = 0.1)]
    embed_std: f32,
    /// Standard deviation of the other matrices and biases.
    #[arg(long, default_value_t = 0.02)]
    std: f32,
    /// Standard deviation of `attn_output` and `ffn_down` (what each block adds to the
    /// residual stream). Small values make the first blocks predict like the whole model, so
    /// `--draft-layers N` on the same file drafts well.
    #[arg(long, default_value_t = 0.02)]
    out_std: f32,
    /// Give `output.weight` the values of `token_embd.weight` (quantized to the output's own
    /// type), as tied embeddings do. With small `--out-std` the model then mostly repeats
    /// its input, and `--draft-layers N` on the same file agrees with it; untied random
    /// outputs make the argmax hang on tiny margins, so any change of depth changes it.
    #[arg(long)]
    tie_output: bool,
}

pub fn run(args: &RandomGgufArgs) -> anyhow::Result<()> {
    let mut file = std::fs::File::open(&args.like).with_context(|| format!("opening {}", args.like.display()))?;
    let content = Content::read(&mut file).with_context(|| format!("{}: not a GGUF file", args.like.display()))?;
    if let Some(out) = &args.skeleton {
        return write_skeleton(&mut file, content.tensor_data_offset, &args.like, out);
    }
    let out = args.out.as_ref().expect("clap requires --out without --skeleton");
    let mut infos: Vec<(&String, &TensorInfo)> = content.tensor_infos.iter().collect();
    infos.sort_by_key(|(_, info)| info.offset);
    let started = std::time::Instant::now();
    let seed_of = |i: usize| args.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64);
    // With --tie-output, the output layer takes the embedding's seed, so its values.
    let output_seed_from = if args.tie_output { embedding_for_output(&infos)? } else { None };
    let tensors: Vec<(String, QTensor)> = infos
        .iter()
        .enumerate()
        .map(|(i, (name, info))| {
            let std = std_for(name, args);
            let seed = seed_of(match output_seed_from {
                Some(e) if name.as_str() == "output.weight" => e,
                _ => i,
            });
            random_tensor(info, std, seed)
                .with_context(|| format!("tensor `{name}` ({:?})", info.ggml_dtype))
                .map(|t| (name.to_string(), t))
        })
        .collect::<anyhow::Result<_>>()?;
    let metadata: Vec<(&str, &gguf_file::Value)> = content.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut w = BufWriter::new(std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?);
    gguf_file::write(&mut w, &metadata, &refs).with_context(|| format!("writing {}", out.display()))?;
    w.flush().with_context(|| format!("writing {}", out.display()))?;
    let bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "wrote {} ({} tensors, {:.1} MB) in {:.1} s",
        out.display(),
        tensors.len(),
        bytes as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Copies the first `header_len` bytes of `src` (everything before the tensor data) to `out`.
fn write_skeleton(src: &mut std::fs::File, header_len: u64, like: &Path, out: &Path) -> anyhow::Result<()> {
    let mut header = vec![0u8; header_len as usize];
    src.seek(SeekFrom::Start(0))?;
    src.read_exact(&mut header).with_context(|| format!("reading the header of {}", like.display()))?;
    std::fs::write(out, &header).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("wrote the header of {} ({header_len} bytes) to {}", like.display(), out.display());
    Ok(())
}

/// The index in `infos` of `token_embd.weight` when `output.weight` exists (`None` when it does
/// not: the model's output is tied already); an error when the two differ in shape.
fn embedding_for_output(infos: &[(&String, &TensorInfo)]) -> anyhow::Result<Option<usize>> {
    let index_of = |wanted: &str| infos.iter().position(|(n, _)| n.as_str() == wanted);
    let Some(output) = index_of("output.weight") else { return Ok(None) };
    match index_of("token_embd.weight") {
        Some(e) if infos[e].1.shape.dims() == infos[output].1.shape.dims() => Ok(Some(e)),
        _ => bail!("--tie-output: `output.weight` and `token_embd.weight` differ in shape (or the latter is missing)"),
    }
}

/// The standard deviation for a tensor by its llama.cpp name; `None` for norms (all ones).
fn std_for(name: &str, args: &RandomGgufArgs) -> Option<f32> {
    if name.ends_with("norm.weight") {
        None
    } else if name.starts_with("token_embd") || name.starts_with("output.") {
        Some(args.embed_std)
    } else if name.contains("attn_output") || name.contains("ffn_down") {
        Some(args.out_std)
    } else {
        Some(args.std)
    }
}

/// Rows per quantization job: a few MB of f32 each.
const ROWS_PER_CHUNK: usize = 256;

/// Uniform noise with standard deviation `std` (ones when `None`) in `info`'s shape, quantized
/// to its type.
fn random_tensor(info: &TensorInfo, std: Option<f32>, seed: u64) -> anyhow::Result<QTensor> {
    quantize_in_chunks(info.shape.dims(), info.ggml_dtype, |chunk, values| {
        fill_uniform(values, std, seed ^ ((chunk as u64) << 32))
    })
}

/// Fills `values` with uniform noise of standard deviation `std` drawn from `seed`, or with
/// ones when `std` is `None` (norms).
pub(crate) fn fill_uniform(values: &mut [f32], std: Option<f32>, seed: u64) {
    match std {
        None => values.fill(1.0),
        Some(s) => {
            let half_width = s * 3f32.sqrt();
            let mut rng = SmallRng::seed_from_u64(seed);
            values.iter_mut().for_each(|v| *v = rng.random_range(-half_width..=half_width));
        }
    }
}

/// A tensor of shape `dims` and type `dtype`, seen as rows of its last dimension, whose chunk
/// `c` (rows `c * ROWS_PER_CHUNK ..`) holds the values `fill(c, ..)` writes, quantized chunk by
/// chunk in parallel. A block never spans two rows, so the chunks' bytes concatenate into those
/// of the whole tensor quantized at once.
fn quantize_in_chunks(
    dims: &[usize],
    dtype: GgmlDType,
    fill: impl Fn(usize, &mut [f32]) + Sync,
) -> anyhow::Result<QTensor> {
    let cols = *dims.last().context("a tensor with no dimensions")?;
    let rows = dims.iter().product::<usize>() / cols.max(1);
    if !cols.is_multiple_of(dtype.block_size()) {
        bail!("rows of {cols} values do not split into blocks of {}", dtype.block_size());
    }
    let chunks: Vec<Vec<u8>> = (0..rows.div_ceil(ROWS_PER_CHUNK))
        .into_par_iter()
        .map(|c| -> candle_core::Result<Vec<u8>> {
            let n = ROWS_PER_CHUNK.min(rows - c * ROWS_PER_CHUNK);
            let mut values = vec![0f32; n * cols];
            fill(c, &mut values);
            let t = Tensor::from_vec(values, (n, cols), &Device::Cpu)?;
            Ok(QTensor::quantize(&t, dtype)?.data()?.into_owned())
        })
        .collect::<candle_core::Result<_>>()?;
    let storage = QStorage::from_data(Cow::Owned(chunks.concat()), &Device::Cpu, dtype)?;
    Ok(QTensor::new(storage, dims)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Quantizing chunk by chunk gives exactly the bytes of quantizing the whole tensor.
    #[test]
    fn chunked_quantization_equals_whole_tensor_quantization() {
        let (rows, cols) = (ROWS_PER_CHUNK * 2 + 3, 512);
        let mut rng = SmallRng::seed_from_u64(3);
        let values: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-1f32..1.0)).collect();
        let whole_tensor = Tensor::from_vec(values.clone(), (rows, cols), &Device::Cpu).unwrap();
        for dtype in [GgmlDType::Q4K, GgmlDType::Q6K, GgmlDType::Q5_0, GgmlDType::Q8_0, GgmlDType::F16] {
            let chunked = quantize_in_chunks(&[rows, cols], dtype, |c, out| {
                let start = c * ROWS_PER_CHUNK * cols;
                out.copy_from_slice(&values[start..start + out.len()]);
            })
            .unwrap();
            let whole = QTensor::quantize(&whole_tensor, dtype).unwrap();
            assert_eq!(chunked.shape().dims(), &[rows, cols]);
            assert!(chunked.data().unwrap() == whole.data().unwrap(), "{dtype:?}: bytes differ");
        }
    }

    /// The noise has the asked standard deviation, and norms are ones.
    #[test]
    fn random_tensors_have_the_asked_spread() {
        let info = TensorInfo { ggml_dtype: GgmlDType::Q8_0, shape: (300, 64).into(), offset: 0 };
        let vector = TensorInfo { ggml_dtype: GgmlDType::F32, shape: 64.into(), offset: 0 };
        assert_eq!(random_tensor(&vector, None, 1).unwrap().shape().dims(), &[64]);
        let values = |std| -> Vec<f32> {
            let t = random_tensor(&info, std, 5).unwrap();
            t.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1().unwrap()
        };
        let v = values(Some(0.05));
        let sd = (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
        assert!((sd - 0.05).abs() < 0.002, "standard deviation {sd}");
        // Ones, up to Q8_0's f16 scale.
        assert!(values(None).iter().all(|&x| (x - 1.0).abs() < 1e-3));
    }
}
