//! GGUF files (llama.cpp's format) as a container: the header, the metadata and the tensor
//! directory, checked before any tensor is read ([`super::gguf_integrity`]: every tensor lies
//! inside the file, so a truncated download is reported as such), and tensors read by name.
//! What the tensors mean (a model's configuration and weights) is `crate::load::gguf`'s job.
//!
//! The file is mapped read-only: tensors are copied from the page cache with no `read` into a
//! buffer first, and the Q4_K/Q6_K matrices our CPU kernels take are repacked straight from
//! the map (see `crate::load::gguf`). Without a map (or for a misaligned tensor) the file is
//! read.

use crate::file_error as err;
use crate::Result;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::QTensor;
use candle_core::Device;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

/// An opened GGUF file: its metadata and tensor directory.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    reader: BufReader<File>,
    /// The file mapped read-only, when the system allows: tensors are then copied straight
    /// from the page cache, with no `read` into a buffer first.
    map: Option<memmap2::Mmap>,
}

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

    pub(crate) fn require_uint(&self, key: &str) -> Result<usize> {
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
}

impl GgufFile {
    /// A small f32 vector tensor (at most 65,536 values), read without `&mut` (from the map, or
    /// through a second handle on the file); `None` when the file has no tensor `name`.
    pub(crate) fn small_f32_tensor(&self, name: &str) -> Result<Option<Vec<f32>>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Tensor;

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
