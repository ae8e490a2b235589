//! Files to models: opening a model and its tokenizer from a path ([`load`]: a GGUF file,
//! [`gguf`], or a Hugging Face model folder, [`hf`]: `config.json`, safetensors or PyTorch
//! weights, `tokenizer.json`), EAGLE head folders (`EagleHead::load`), GGUF drafts converted
//! for the CPU ([`converted`], [`weight_format`]), rotary scaling read from either format
//! ([`rope_scaling`]), and model provisioning: manifests, the cache, the hub and the PyPI
//! mirror ([`provision`]).

pub mod converted;
pub(crate) mod eagle;
pub mod gguf;
pub mod hf;
pub mod provision;
pub mod rope_scaling;
pub mod weight_format;

use crate::error::config_bail;
use crate::model::DecoderModel;
use crate::tokenizer::TextTokenizer;
use crate::{file_error, Error, Result};
use candle_core::{DType, Device};
use std::path::{Path, PathBuf};
pub use weight_format::WeightFormat;

/// A model ready to run, with the tokenizer found beside it.
pub struct LoadedModel {
    pub model: DecoderModel,
    pub tokenizer: TextTokenizer,
    pub path: PathBuf,
}

/// Options of [`load`].
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Keep only the first blocks (a cheaper draft from the same file).
    pub max_layers: Option<usize>,
    /// A `tokenizer.json` to use instead of the one found with the model.
    pub tokenizer: Option<PathBuf>,
    /// How GGUF weight matrices become matmuls.
    pub weights: WeightFormat,
    /// Compute logits only for the first N token ids (GGUF drafts; see [`gguf::load`]).
    pub output_rows: Option<usize>,
    /// Activation dtype for unquantized (Hugging Face) weights instead of
    /// [`default_dtype`]: f32 on CUDA gives batch-invariant numerics for exactness checks.
    pub dtype: Option<DType>,
}

/// The activation dtype for unquantized weights: f32 on CPU, bf16 on CUDA.
pub fn default_dtype(device: &Device) -> DType {
    if device.is_cuda() {
        DType::BF16
    } else {
        DType::F32
    }
}

/// Loads the model at `path` (a `.gguf` file or a model folder) on `device`.
pub fn load(path: &Path, device: &Device, opts: &LoadOptions) -> Result<LoadedModel> {
    if !path.exists() {
        return Err(file_error(path, "no such model file or folder"));
    }
    if path.is_dir() {
        let model = hf::load(path, opts.dtype.unwrap_or_else(|| default_dtype(device)), device, opts.max_layers)?;
        let tokenizer = folder_tokenizer(path, opts.tokenizer.as_deref())?;
        return Ok(LoadedModel { model, tokenizer, path: path.to_path_buf() });
    }
    check_gguf(path)?;
    let (model, file) = gguf::load(path, device, opts.max_layers, opts.output_rows, opts.weights)?;
    let tokenizer = match opts.tokenizer.as_deref() {
        Some(t) => TextTokenizer::from_file(t)?,
        None => TextTokenizer::from_gguf(&file)?,
    };
    Ok(LoadedModel { model, tokenizer, path: path.to_path_buf() })
}

/// The tokenizer [`load`] would give the model at `path` (or `tokenizer`, a `tokenizer.json`,
/// in its place), without loading the weights: from a GGUF file's header, or the folder's
/// `tokenizer.json`.
pub fn load_tokenizer(path: &Path, tokenizer: Option<&Path>) -> Result<TextTokenizer> {
    if !path.exists() {
        return Err(file_error(path, "no such model file or folder"));
    }
    if path.is_dir() {
        return folder_tokenizer(path, tokenizer);
    }
    check_gguf(path)?;
    match tokenizer {
        Some(t) => TextTokenizer::from_file(t),
        None => TextTokenizer::from_gguf(&gguf::GgufFile::open(path)?),
    }
}

/// `tokenizer`, else the `tokenizer.json` in the model folder `dir`.
fn folder_tokenizer(dir: &Path, tokenizer: Option<&Path>) -> Result<TextTokenizer> {
    let found = dir.join("tokenizer.json");
    let path = match tokenizer {
        Some(t) => t.to_path_buf(),
        None if found.is_file() => found,
        None => return Err(file_error(dir, "no tokenizer.json in the model folder (pass --tokenizer)")),
    };
    TextTokenizer::from_file(&path)
}

/// Refuses a path that is neither a GGUF file nor a model folder.
fn check_gguf(path: &Path) -> Result<()> {
    if is_gguf_file(path) {
        return Ok(());
    }
    Err(file_error(path, "not a GGUF file nor a model folder (expected a .gguf file, or a folder with config.json)"))
}

/// Whether `path` is a GGUF file: by its extension, or else by its magic bytes.
pub fn is_gguf_file(path: &Path) -> bool {
    path.is_file() && (path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) || has_gguf_magic(path))
}

fn has_gguf_magic(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == b"GGUF"
}

/// Parses `cpu`, `cuda` or `cuda:N`.
pub fn parse_device(s: &str) -> Result<Device> {
    let ordinal = match s {
        "cpu" => return Ok(Device::Cpu),
        "cuda" => 0,
        _ => match s.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()) {
            Some(n) => n,
            None => config_bail!("unknown device `{s}` (expected cpu, cuda or cuda:N)"),
        },
    };
    if !candle_core::utils::cuda_is_available() {
        config_bail!(
            "device `{s}`: this build has no CUDA support; rebuild with `cargo build --release --features cuda` \
             (or use --device cpu)"
        );
    }
    cuda_device(ordinal).map_err(|e| Error::Config(format!("device `{s}`: {}", crate::plain_error(&e))))
}

/// The CUDA device `ordinal` as the engine runs it: every thread's work on one stream, and
/// cudarc's per-allocation event tracking off (two events created and destroyed with each of
/// a forward's ~1,000 allocations, which only orders work across streams: with one stream,
/// the stream orders it). One stream is also what a CUDA graph capture records
/// ([`crate::kernels::device::graph`]). `MDSD_CUDA_STREAM=per-thread` gives candle's default
/// instead (each host thread on its own default stream, events tracked), for A/B runs.
fn cuda_device(ordinal: usize) -> candle_core::Result<Device> {
    if std::env::var("MDSD_CUDA_STREAM").as_deref() == Ok("per-thread") {
        return Device::new_cuda(ordinal);
    }
    let device = Device::new_cuda_with_stream(ordinal)?;
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = &device {
        // SAFETY: no tensor exists on this device yet, and all of its work goes to its one
        // stream, so no slice is used on a stream other than the one it was made on.
        unsafe { d.disable_event_tracking() };
    }
    Ok(device)
}
