//! PyTorch checkpoints (`pytorch_model.bin`: a zip holding a pickle and one entry per storage),
//! read with candle's pickle reader after a check of every tensor's size against its storage.
//!
//! candle allocates a tensor's full size before reading its storage, so a pickle that claims
//! `[2^30, 2^30]` floats over a 64-byte storage asked for 4 EiB and aborted the process
//! (`benches/fuzz`, `tests/corrupt_files.rs`). Here each tensor must fit in its storage entry:
//! the check reads only the pickle and the zip directory.

use candle_core::Tensor;
use std::path::Path;

use crate::file_error as err;
use crate::Result;

/// Every tensor of the checkpoint at `path`, by name; a tensor whose shape needs more bytes
/// than its storage holds is an error naming it and the file.
pub fn read_all(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let cannot = |e: &dyn std::fmt::Display| err(path, format!("cannot read: {e}"));
    // The pickle is parsed once: the checks and the reads below share `PthTensors`.
    let pth = candle_core::pickle::PthTensors::new(path, None).map_err(|e| cannot(&crate::plain_error(&e)))?;
    let file = std::fs::File::open(path).map_err(|e| cannot(&e))?;
    let mut zip = zip::ZipArchive::new(std::io::BufReader::new(file)).map_err(|e| cannot(&e))?;
    for info in pth.tensor_infos().values() {
        let stored = zip.by_name(&info.path).map_err(|e| cannot(&format!("storage `{}`: {e}", info.path)))?.size();
        // What candle reads: `start_offset` bytes skipped, then the whole shape.
        let needed = info
            .layout
            .dims()
            .iter()
            .try_fold(info.dtype.size_in_bytes(), |n, &d| n.checked_mul(d))
            .and_then(|n| n.checked_add(info.layout.start_offset()));
        match needed {
            Some(n) if n as u64 <= stored => {}
            _ => {
                return Err(err(
                    path,
                    format!(
                        "corrupt checkpoint: tensor `{}` of shape {:?} needs more than the {stored} bytes of its storage `{}`",
                        info.name,
                        info.layout.dims(),
                        info.path
                    ),
                ))
            }
        }
    }
    let mut tensors = Vec::with_capacity(pth.tensor_infos().len());
    for name in pth.tensor_infos().keys() {
        if let Some(t) = pth.get(name).map_err(|e| cannot(&crate::plain_error(&e)))? {
            tensors.push((name.clone(), t));
        }
    }
    Ok(tensors)
}
