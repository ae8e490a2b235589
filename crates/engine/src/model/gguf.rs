//! Loading a [`DecoderModel`] from a GGUF file (llama.cpp's format): LLaMA (`llama`) and
//! Qwen2 (`qwen2`) architectures, any quantization candle's quantized matmul supports.
//!
//! Tensor names follow llama.cpp: `token_embd`, `blk.N.{attn_norm, attn_q, attn_k, attn_v,
//! attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}`, `output_norm`, `output` (absent when
//! the embeddings are tied: the embedding matrix then serves as the output head). Every tensor
//! is checked to lie inside the file before anything is read, so a truncated download is
//! reported as such.
//!
//! The file is mapped read-only: tensors are copied from the page cache with no `read` into a
//! buffer first, and the Q4_K/Q6_K matrices our CPU kernels take are repacked straight from
//! the map, by every core (the default target loads in 0.9-1.0 s instead of 1.4-2.6 s,
//! `benches/RESULTS.md`). Without a map (or for a misaligned tensor) the file is read.

use super::weight_format::fast_cpu_converts_on_cpu;
pub use super::weight_format::WeightFormat;
use super::{Architecture, DecoderModel, Layer, Linear, ModelConfig};
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Result, Tensor};
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An opened GGUF file: its metadata and tensor directory.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    reader: BufReader<File>,
    /// The file mapped read-only, when the system allows: tensors are then copied straight
    /// from the page cache, with no `read` into a buffer first.
    map: Option<memmap2::Mmap>,
}

use crate::file_error as err;

impl GgufFile {
    /// Opens `path`, reads the header and checks that every tensor lies inside the file.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| err(path, format!("cannot open the model file: {e}")))?;
        // SAFETY: the map is read-only and private to this process. A file truncated by
        // another process while mapped would fault on access; the engine replaces the files it
        // writes by renaming (`provision`, `converted`), never truncating them in place.
        let map = unsafe { memmap2::Mmap::map(&file) }.ok();
        let file_len = match &map {
            Some(m) => m.len() as u64,
            None => file.metadata().map_err(|e| err(path, e))?.len(),
        };
        let mut reader = BufReader::new(file);
        // From the map when there is one: candle asks the reader's position before every
        // string, a `lseek` call on a file (600,000 of them for a 151,936-token vocabulary and
        // its merges), free on a `Cursor`.
        let content = match &map {
            Some(m) => super::gguf_integrity::read_content(&mut std::io::Cursor::new(&m[..])),
            None => super::gguf_integrity::read_content(&mut reader),
        }
        .map_err(|e| err(path, format!("not a valid GGUF file: {}", crate::plain_error(&e))))?;
        super::gguf_integrity::check_tensor_extents(&content, file_len).map_err(|e| err(path, e))?;
        Ok(Self { path: path.to_path_buf(), content, reader, map })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The same file, named `path` in messages (a converted copy, named after its source).
    pub fn shown_as(mut self, path: &Path) -> Self {
        self.path = path.to_path_buf();
        self
    }

    /// A metadata value.
    pub fn meta(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    /// A required metadata value.
    pub fn require(&self, key: &str) -> Result<&Value> {
        self.meta(key).ok_or_else(|| err(&self.path, format!("missing GGUF metadata key `{key}`")))
    }

    /// A metadata string.
    pub fn string(&self, key: &str) -> Result<Option<String>> {
        match self.meta(key) {
            None => Ok(None),
            Some(v) => v
                .to_string()
                .map(|s| Some(s.clone()))
                .map_err(|e| err(&self.path, format!("`{key}`: {}", crate::plain_error(&e)))),
        }
    }

    /// A metadata unsigned integer of any width.
    pub fn uint(&self, key: &str) -> Result<Option<u64>> {
        let v = match self.meta(key) {
            None => return Ok(None),
            Some(v) => v,
        };
        let n = match v {
            Value::U8(x) => *x as u64,
            Value::U16(x) => *x as u64,
            Value::U32(x) => *x as u64,
            Value::U64(x) => *x,
            Value::I8(x) if *x >= 0 => *x as u64,
            Value::I16(x) if *x >= 0 => *x as u64,
            Value::I32(x) if *x >= 0 => *x as u64,
            Value::I64(x) if *x >= 0 => *x as u64,
            other => return Err(err(&self.path, format!("`{key}` is {other:?}, expected an unsigned integer"))),
        };
        Ok(Some(n))
    }

    pub(super) fn require_uint(&self, key: &str) -> Result<usize> {
        self.uint(key)?.map(|n| n as usize).ok_or_else(|| err(&self.path, format!("missing GGUF metadata key `{key}`")))
    }

    /// A metadata float.
    pub fn float(&self, key: &str) -> Result<Option<f64>> {
        match self.meta(key) {
            None => Ok(None),
            Some(Value::F32(x)) => Ok(Some(*x as f64)),
            Some(Value::F64(x)) => Ok(Some(*x)),
            Some(other) => Err(err(&self.path, format!("`{key}` is {other:?}, expected a float"))),
        }
    }

    /// A metadata array of strings.
    pub fn strings(&self, key: &str) -> Result<Option<Vec<String>>> {
        match self.meta(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.to_string().cloned().map_err(|e| err(&self.path, format!("`{key}`: {}", crate::plain_error(&e))))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(other) => Err(err(&self.path, format!("`{key}` is {:?}, expected an array", other.value_type()))),
        }
    }

    /// A metadata array of integers.
    pub fn ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
        match self.meta(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::I32(x) => Ok(*x as i64),
                    Value::U32(x) => Ok(*x as i64),
                    Value::I8(x) => Ok(*x as i64),
                    Value::U8(x) => Ok(*x as i64),
                    Value::I64(x) => Ok(*x),
                    other => Err(err(&self.path, format!("`{key}` holds {other:?}, expected integers"))),
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(other) => Err(err(&self.path, format!("`{key}` is {:?}, expected an array", other.value_type()))),
        }
    }

    /// The names of every tensor in the file.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.content.tensor_infos.keys().map(String::as_str)
    }

    /// The format and shape (`[rows, cols]` for a matrix) of a tensor.
    pub fn tensor_info(&self, name: &str) -> Option<(candle_core::quantized::GgmlDType, &[usize])> {
        self.content.tensor_infos.get(name).map(|i| (i.ggml_dtype, i.shape.dims()))
    }

    /// Every metadata entry.
    pub fn metadata(&self) -> &std::collections::HashMap<String, Value> {
        &self.content.metadata
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Checks that tensor `name` exists with shape `want` (`[rows, cols]` for a matrix, as
    /// candle orders dimensions), naming the tensor and the file otherwise.
    /// A matrix that a converted copy widened with zero columns ([`super::converted`]) is
    /// compared at its recorded width.
    pub fn expect_shape(&self, name: &str, want: &[usize]) -> Result<()> {
        let Some((_, dims)) = self.tensor_info(name) else {
            return Err(err(&self.path, format!("missing tensor `{name}`")));
        };
        let mut logical = dims.to_vec();
        if let [_, cols] = &mut logical[..] {
            *cols -= super::converted::padding(self, name, *cols)?;
        }
        if logical == want {
            return Ok(());
        }
        Err(err(&self.path, format!("`{name}` has shape {logical:?}, but the metadata's sizes make it {want:?}")))
    }

    /// Reads a tensor; a missing one is an error naming it and the file.
    pub fn tensor(&mut self, name: &str, device: &Device) -> Result<QTensor> {
        if !self.has_tensor(name) {
            return Err(err(&self.path, format!("missing tensor `{name}`")));
        }
        let info = &self.content.tensor_infos[name];
        let (dtype, dims, offset) = (info.ggml_dtype, info.shape.dims().to_vec(), info.offset);
        self.read(name, dtype, dims, offset, device)
    }

    /// Tensor `name`'s format, shape and bytes in the mapped file (`None` when the file is not
    /// mapped, or the tensor is missing or misaligned): for repacking without a copy first.
    pub fn mapped(&self, name: &str) -> Option<(candle_core::quantized::GgmlDType, &[usize], &[u8])> {
        let info = self.content.tensor_infos.get(name)?;
        let (dtype, dims) = (info.ggml_dtype, info.shape.dims());
        Some((dtype, dims, self.mapped_bytes(dtype, dims, info.offset)?))
    }

    /// The bytes of a `dtype` tensor of shape `dims` at `offset` in the data section, in the
    /// map. `None` without a map, or when misaligned: candle views the bytes as blocks
    /// (alignment 4 at most), and a file whose `general.alignment` leaves a tensor misaligned
    /// is read into an aligned buffer instead.
    fn mapped_bytes(&self, dtype: candle_core::quantized::GgmlDType, dims: &[usize], offset: u64) -> Option<&[u8]> {
        let start = (self.content.tensor_data_offset + offset) as usize;
        let bytes = dims.iter().product::<usize>() / dtype.block_size() * dtype.type_size();
        let raw = self.map.as_ref()?.get(start..start + bytes)?;
        (raw.as_ptr() as usize).is_multiple_of(8).then_some(raw)
    }

    /// Tensor `name`'s data as `dtype` and `dims` from `offset` in the data section: from the
    /// map when there is one (the bounds were checked at [`Self::open`]), else read.
    fn read(
        &mut self,
        name: &str,
        dtype: candle_core::quantized::GgmlDType,
        dims: Vec<usize>,
        offset: u64,
        device: &Device,
    ) -> Result<QTensor> {
        let result = match self.mapped_bytes(dtype, &dims, offset) {
            Some(raw) => candle_core::quantized::ggml_file::qtensor_from_ggml(dtype, raw, dims, device),
            None => {
                let info = candle_core::quantized::gguf_file::TensorInfo {
                    ggml_dtype: dtype,
                    shape: candle_core::Shape::from(dims),
                    offset,
                };
                info.read(&mut self.reader, self.content.tensor_data_offset, device)
            }
        };
        result.map_err(|e| err(&self.path, format!("tensor `{name}`: {}", crate::plain_error(&e))))
    }

    /// The first `rows` rows of a 2-D tensor `[rows_total, cols]` (rows are stored
    /// contiguously, so this reads a prefix of the tensor's data).
    pub fn tensor_rows(&mut self, name: &str, rows: usize, device: &Device) -> Result<QTensor> {
        let info =
            self.content.tensor_infos.get(name).ok_or_else(|| err(&self.path, format!("missing tensor `{name}`")))?;
        let dims = info.shape.dims().to_vec();
        if dims.len() != 2 || rows == 0 || rows > dims[0] {
            return Err(err(&self.path, format!("cannot take {rows} rows of `{name}` with shape {dims:?}")));
        }
        let (dtype, offset) = (info.ggml_dtype, info.offset);
        self.read(name, dtype, vec![rows, dims[1]], offset, device)
    }

    /// The architecture string (`general.architecture`).
    pub fn architecture(&self) -> Result<String> {
        self.string("general.architecture")?.ok_or_else(|| err(&self.path, "missing `general.architecture`"))
    }

    /// The model hyper-parameters from the metadata.
    pub fn config(&self) -> Result<ModelConfig> {
        let arch_name = self.architecture()?;
        let architecture = match arch_name.as_str() {
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            other => {
                return Err(err(
                    &self.path,
                    format!("unsupported GGUF architecture `{other}` (supported: llama, qwen2, qwen3)"),
                ))
            }
        };
        let a = |k: &str| format!("{arch_name}.{k}");
        let hidden_size = self.require_uint(&a("embedding_length"))?;
        let num_heads = self.require_uint(&a("attention.head_count"))?;
        let num_kv_heads = self.uint(&a("attention.head_count_kv"))?.map(|n| n as usize).unwrap_or(num_heads);
        let head_dim = match self.uint(&a("attention.key_length"))? {
            Some(n) => n as usize,
            None if num_heads > 0 => hidden_size / num_heads,
            None => 0,
        };
        if let Some(v) = self.uint(&a("attention.value_length"))?.filter(|&v| v as usize != head_dim) {
            return Err(err(
                &self.path,
                format!("`{arch_name}.attention.value_length` is {v}, but the keys are {head_dim} wide: value heads of another width are not supported"),
            ));
        }
        // LLaMA and Qwen rotate the whole head; a file rotating part of it is another model.
        if let Some(d) = self.uint(&a("rope.dimension_count"))? {
            if d as usize != head_dim {
                return Err(err(
                    &self.path,
                    format!("`{arch_name}.rope.dimension_count` is {d}, but the heads are {head_dim} wide: partial rotary embeddings are not supported"),
                ));
            }
        }
        let vocab_size = match self.strings("tokenizer.ggml.tokens")? {
            Some(t) => t.len(),
            None => match self.content.tensor_infos.get("token_embd.weight") {
                Some(info) => info.shape.dims().iter().copied().max().unwrap_or(0),
                None => return Err(err(&self.path, "missing tensor `token_embd.weight`")),
            },
        };
        let rope_scaling = super::rope_scaling::from_gguf(self, &arch_name)?;
        let declared_context = self.uint(&a("context_length"))?.map(|n| n as usize).unwrap_or(4096);
        let config = ModelConfig {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size: self.require_uint(&a("feed_forward_length"))?,
            num_layers: self.require_uint(&a("block_count"))?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: self.float(&a("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
            rope_theta: self.float(&a("rope.freq_base"))?.unwrap_or(10_000.0),
            context_length: rope_scaling.context_length(declared_context),
            rope_scaling,
            // llama.cpp's converter permutes LLaMA's q/k rows into interleaved pairs; Qwen2
            // keeps the Hugging Face (NeoX) layout.
            rope_interleaved: architecture == Architecture::Llama,
        };
        config.validate(&self.path.display().to_string())?;
        Ok(config)
    }
}

impl GgufFile {
    /// A small f32 vector tensor (at most 65,536 values), read without `&mut` (from the map, or
    /// through a second handle on the file); `None` when the file has no tensor `name`.
    pub(super) fn small_f32_tensor(&self, name: &str) -> Result<Option<Vec<f32>>> {
        use candle_core::quantized::GgmlDType;
        use std::io::{Read, Seek, SeekFrom};
        let Some(info) = self.content.tensor_infos.get(name) else { return Ok(None) };
        let dims = info.shape.dims();
        let n: usize = dims.iter().product();
        if info.ggml_dtype != GgmlDType::F32 || dims.len() != 1 || n > 65_536 {
            return Err(err(
                &self.path,
                format!("`{name}` is {:?} of shape {dims:?}, expected a vector of f32", info.ggml_dtype),
            ));
        }
        let bytes = match self.mapped_bytes(info.ggml_dtype, dims, info.offset) {
            Some(raw) => raw.to_vec(),
            None => {
                let mut f = File::open(&self.path).map_err(|e| err(&self.path, e))?;
                let mut raw = vec![0u8; 4 * n];
                f.seek(SeekFrom::Start(self.content.tensor_data_offset + info.offset))
                    .and_then(|_| f.read_exact(&mut raw))
                    .map_err(|e| err(&self.path, format!("tensor `{name}`: {e}")))?;
                raw
            }
        };
        Ok(Some(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()))
    }
}

/// The first `rows` rows (all: `None`) of matrix `name` repacked for our CPU kernels straight
/// from the mapped file, when `format` keeps it as stored and the kernels take it; `None`
/// otherwise (the caller then reads a `QTensor`, which reports any problem with the tensor).
fn repacked_from_map(
    file: &GgufFile,
    name: &str,
    rows: Option<usize>,
    format: WeightFormat,
    device: &Device,
    bias: Option<Tensor>,
) -> Result<Option<Linear>> {
    let Some((dtype, dims, raw)) = file.mapped(name).filter(|_| device.is_cpu()) else { return Ok(None) };
    let as_stored = match format {
        WeightFormat::AsStored => true,
        WeightFormat::FastCpu => !fast_cpu_converts_on_cpu(dtype, dims),
        WeightFormat::Dequantized => false,
    };
    if !as_stored || dims.len() != 2 || dims[0] == 0 {
        return Ok(None);
    }
    let rows = rows.unwrap_or(dims[0]);
    if rows == 0 || rows > dims[0] {
        return Ok(None);
    }
    let row_bytes = raw.len() / dims[0];
    let pad = super::converted::padding(file, name, dims[1])?;
    Linear::repacked_from_raw(dtype, &[rows, dims[1]], &raw[..rows * row_bytes], bias, pad)
}

/// Loads the model in `path`. `max_layers` keeps only the first blocks (a cheaper draft from
/// the same file); `output_rows` keeps only the logits of the first token ids (a cheaper draft
/// head: byte-level BPE ids follow merge order, roughly frequency; the other ids get q = 0,
/// which keeps speculative decoding exact). Activations are f32 (the quantized matmul takes
/// f32 inputs).
///
/// [`WeightFormat::FastCpu`] on the CPU loads the file's converted copy
/// ([`super::converted`]), converting and keeping it first when there is none; when the copy
/// cannot be written or read, the conversion is done in memory.
pub fn load(
    path: &Path,
    device: &Device,
    max_layers: Option<usize>,
    output_rows: Option<usize>,
    format: WeightFormat,
) -> Result<(DecoderModel, GgufFile)> {
    load_in(path, device, max_layers, output_rows, format, Some(&crate::provision::cache_dir()))
}

/// [`load`] with converted copies kept under `cache` (`None`: converted in memory, every time).
pub fn load_in(
    path: &Path,
    device: &Device,
    max_layers: Option<usize>,
    output_rows: Option<usize>,
    format: WeightFormat,
    cache: Option<&Path>,
) -> Result<(DecoderModel, GgufFile)> {
    if let (WeightFormat::FastCpu, true, Some(cache)) = (format, device.is_cpu(), cache) {
        // The copy as stored; a copy that does not load is deleted (`None`), and this load
        // converts in memory.
        let from_copy = |copy: &Path| match load_file(
            GgufFile::open(copy),
            device,
            max_layers,
            output_rows,
            WeightFormat::AsStored,
        ) {
            Ok((model, file)) => Some((model, file.shown_as(path))),
            Err(e) => {
                eprintln!(
                    "mdsd: the converted copy {} is unusable ({}); deleting it and converting in memory",
                    copy.display(),
                    crate::plain_error(&e)
                );
                let _ = std::fs::remove_file(copy);
                None
            }
        };
        // A copy made earlier is read without parsing the source's header as well.
        if let Some(copy) = super::converted::existing(path, cache) {
            return match from_copy(&copy) {
                Some(loaded) => Ok(loaded),
                None => load_file(GgufFile::open(path), device, max_layers, output_rows, format),
            };
        }
        // Problems of the source itself are reported as such, before any conversion.
        let mut source = GgufFile::open(path)?;
        match super::converted::ensure(&mut source, cache) {
            // Nothing to convert: the file as stored is what `FastCpu` would load.
            Ok(None) => return load_file(Ok(source), device, max_layers, output_rows, WeightFormat::AsStored),
            Ok(Some(copy)) => {
                if let Some(loaded) = from_copy(&copy) {
                    return Ok(loaded);
                }
            }
            Err(e) => eprintln!("mdsd: {}; converting {} in memory instead", crate::plain_error(&e), path.display()),
        }
        return load_file(Ok(source), device, max_layers, output_rows, format);
    }
    load_file(GgufFile::open(path), device, max_layers, output_rows, format)
}

fn load_file(
    file: Result<GgufFile>,
    device: &Device,
    max_layers: Option<usize>,
    output_rows: Option<usize>,
    format: WeightFormat,
) -> Result<(DecoderModel, GgufFile)> {
    let mut file = file?;
    let mut config = file.config()?;
    if let Some(n) = max_layers {
        config.num_layers = config.num_layers.min(n.max(1));
    }
    let c = &config;
    let (q_rows, kv_rows) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let (vocab, hidden) = (c.vocab_size, c.hidden_size);
    // Every tensor's shape is checked against the metadata before anything is read, so that a
    // file whose directory and metadata disagree is refused by name here, not by a matmul later.
    file.expect_shape("token_embd.weight", &[vocab, hidden])?;
    file.expect_shape("output_norm.weight", &[hidden])?;
    if file.has_tensor("output.weight") {
        file.expect_shape("output.weight", &[vocab, hidden])?;
    }
    for i in 0..c.num_layers {
        for (name, shape) in [
            ("attn_norm.weight", vec![hidden]),
            ("attn_q.weight", vec![q_rows, hidden]),
            ("attn_k.weight", vec![kv_rows, hidden]),
            ("attn_v.weight", vec![kv_rows, hidden]),
            ("attn_output.weight", vec![hidden, q_rows]),
            ("ffn_norm.weight", vec![hidden]),
            ("ffn_gate.weight", vec![c.intermediate_size, hidden]),
            ("ffn_up.weight", vec![c.intermediate_size, hidden]),
            ("ffn_down.weight", vec![hidden, c.intermediate_size]),
        ] {
            file.expect_shape(&format!("blk.{i}.{name}"), &shape)?;
        }
        if c.architecture == Architecture::Qwen3 {
            for name in ["attn_q_norm.weight", "attn_k_norm.weight"] {
                file.expect_shape(&format!("blk.{i}.{name}"), &[c.head_dim])?;
            }
        }
        for (name, rows) in [
            ("attn_q.bias", q_rows),
            ("attn_k.bias", kv_rows),
            ("attn_v.bias", kv_rows),
            ("attn_output.bias", hidden),
            ("ffn_gate.bias", c.intermediate_size),
            ("ffn_up.bias", c.intermediate_size),
            ("ffn_down.bias", hidden),
        ] {
            let name = format!("blk.{i}.{name}");
            if file.has_tensor(&name) {
                file.expect_shape(&name, &[rows])?;
            }
        }
    }
    let dtype = DType::F32;
    let embed_q = Arc::new(file.tensor("token_embd.weight", device)?);
    let dense = |file: &mut GgufFile, name: &str| -> Result<Tensor> { file.tensor(name, device)?.dequantize(device) };
    let mut layers = Vec::with_capacity(config.num_layers);
    let qwen3 = config.architecture == Architecture::Qwen3;
    for i in 0..config.num_layers {
        let p = |s: &str| format!("blk.{i}.{s}");
        // A bias is applied wherever the file has one, as llama.cpp does (Qwen2's q, k and v;
        // a LLaMA's with `attention_bias` or `mlp_bias`).
        let linear = |file: &mut GgufFile, name: &str| -> Result<Linear> {
            let weight_name = p(&format!("{name}.weight"));
            let bias_name = p(&format!("{name}.bias"));
            let b = if file.has_tensor(&bias_name) {
                Some(file.tensor(&bias_name, device)?.dequantize(device)?)
            } else {
                None
            };
            if let Some(l) = repacked_from_map(file, &weight_name, None, format, device, b.clone())? {
                return Ok(l);
            }
            let w = Arc::new(file.tensor(&weight_name, device)?);
            stored_linear(file, &weight_name, w, b, format, device)
        };
        layers.push(Layer {
            attn_norm: Some(dense(&mut file, &p("attn_norm.weight"))?),
            q: linear(&mut file, "attn_q")?,
            k: linear(&mut file, "attn_k")?,
            v: linear(&mut file, "attn_v")?,
            o: linear(&mut file, "attn_output")?,
            q_norm: if qwen3 { Some(dense(&mut file, &p("attn_q_norm.weight"))?) } else { None },
            k_norm: if qwen3 { Some(dense(&mut file, &p("attn_k_norm.weight"))?) } else { None },
            mlp_norm: dense(&mut file, &p("ffn_norm.weight"))?,
            gate: linear(&mut file, "ffn_gate")?,
            up: linear(&mut file, "ffn_up")?,
            down: linear(&mut file, "ffn_down")?,
        });
    }
    let norm = dense(&mut file, "output_norm.weight")?;
    // Tied embeddings (SmolLM2) use the embedding matrix as the output head.
    let head_name = if file.has_tensor("output.weight") { "output.weight" } else { "token_embd.weight" };
    let head_rows = output_rows.filter(|&rows| rows < config.vocab_size);
    // The tied head at full size shares the embedding's matrix instead of a repacked copy.
    let repacked = if head_name == "output.weight" || head_rows.is_some() {
        repacked_from_map(&file, head_name, head_rows, format, device, None)?
    } else {
        None
    };
    let lm_head = match repacked {
        Some(l) => l,
        None => {
            let head = match head_rows {
                Some(rows) => Arc::new(file.tensor_rows(head_name, rows, device)?),
                // Tied: the embedding's own matrix, shared (a repacked head keeps its own layout).
                _ if head_name == "token_embd.weight" => embed_q.clone(),
                _ => Arc::new(file.tensor(head_name, device)?),
            };
            stored_linear(&file, head_name, head, None, format, device)?
        }
    };
    let embed = super::embedding::TokenEmbedding::from_qtensor(embed_q, device)?;
    let model = DecoderModel::new(config, embed, layers, norm, lm_head, dtype, device)?;
    Ok((model, file))
}

/// Matrix `name` of `file`, read as `w`, as a layer with `bias` in `format` (converted, or kept
/// as stored): its padding is the conversion's plus any a converted file records for it.
fn stored_linear(
    file: &GgufFile,
    name: &str,
    w: Arc<QTensor>,
    bias: Option<Tensor>,
    format: WeightFormat,
    device: &Device,
) -> Result<Linear> {
    let converted_pad = super::converted::padding(file, name, w.shape().dims().last().copied().unwrap_or(0))?;
    let (w, pad) = format.matmul(w, device)?;
    Linear::padded(w, bias, pad + converted_pad)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tensors read from the mapped file equal those read with `read` (the path without a
    /// map), byte for byte: whole tensors, a prefix of rows, and the bytes `mapped` exposes
    /// for repacking.
    #[test]
    fn mapped_tensors_equal_read_ones() {
        use candle_core::quantized::GgmlDType;
        let dir = std::env::temp_dir().join(format!("mdsd-gguf-map-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.gguf");
        let values: Vec<f32> = (0..64 * 512).map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.8).collect();
        let w = Tensor::from_vec(values, (64, 512), &Device::Cpu).unwrap();
        let tensors: Vec<(String, QTensor)> = [GgmlDType::Q4K, GgmlDType::Q6K, GgmlDType::Q8_0, GgmlDType::F32]
            .iter()
            .map(|&d| (format!("{d:?}"), QTensor::quantize(&w, d).unwrap()))
            .collect();
        let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let mut f = std::fs::File::create(&path).unwrap();
        candle_core::quantized::gguf_file::write(&mut f, &[], &refs).unwrap();
        drop(f);
        let mut mapped = GgufFile::open(&path).unwrap();
        assert!(mapped.map.is_some(), "the file was not mapped");
        let mut unmapped = GgufFile::open(&path).unwrap();
        unmapped.map = None;
        for (name, t) in &tensors {
            let want = t.data().unwrap();
            let (dtype, dims, raw) = mapped.mapped(name).expect("mapped bytes");
            assert_eq!((dtype, dims), (t.dtype(), &[64usize, 512][..]));
            assert_eq!(raw, &want[..], "{name}: mapped bytes");
            assert!(unmapped.mapped(name).is_none());
            for file in [&mut mapped, &mut unmapped] {
                let got = file.tensor(name, &Device::Cpu).unwrap();
                assert_eq!(got.data().unwrap(), want, "{name}");
                let rows = file.tensor_rows(name, 16, &Device::Cpu).unwrap();
                assert_eq!(rows.shape().dims(), [16, 512]);
                assert_eq!(rows.data().unwrap()[..], want[..want.len() / 4], "{name}: 16 rows");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
