//! Integrity checks of a GGUF file's header, before any tensor is read: candle's parser run so
//! that a panic inside it becomes an error, and the tensor directory checked against the file
//! (each tensor inside it, aligned, a whole number of blocks, and the tensors tiling the data
//! section). Found by fuzzing the SmolLM2 GGUF (`tests/corrupt_files.rs`).

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{Error, Result};

/// candle's GGUF parser, with a panic inside it turned into an error: it divides by the
/// file's `general.alignment`, so a file declaring 0 panics there. The panic's message is kept
/// off stderr for this thread only ([`quietly`]): the process's panic hook is never swapped,
/// so a panic on another thread meanwhile reaches the hook as always.
pub(super) fn read_content<R: std::io::Read + std::io::Seek>(reader: &mut R) -> Result<Content> {
    quietly(|| Content::read(reader)).unwrap_or_else(|why| {
        Err(Error::Msg(format!("the header cannot be parsed ({why}; is `general.alignment` 0?)")))
    })
}

thread_local! {
    /// This thread's panics skip the panic hook (see [`quietly`]).
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, its panic (on this thread) caught and returned as its message, without the panic
/// hook's output. The first call wraps the process's hook once, in a hook that passes every
/// panic on except those of a thread inside `quietly`; a hook set later replaces it, and then
/// the caught panic's message is printed, nothing worse.
fn quietly<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    static WRAPPED: std::sync::Once = std::sync::Once::new();
    WRAPPED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(|q| q.get()) {
                previous(info)
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    result.map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown cause".into())
    })
}

/// Checks that every tensor's data is a whole number of blocks, starts on the file's alignment
/// (GGUF requires it, as llama.cpp checks), lies inside the file (a truncated download), and
/// that the tensors tile the data section without overlap or gap, with overflow-checked
/// arithmetic, so that a corrupt directory is refused here instead of read as other bytes.
pub(super) fn check_tensor_extents(content: &Content, file_len: u64) -> std::result::Result<(), String> {
    // candle's own rule for the alignment (it ignores 64-bit values), so that the offsets are
    // checked against the data section candle computed; not `GgufFile::uint`'s wider one.
    let alignment = match content.metadata.get("general.alignment") {
        Some(Value::U8(v)) => *v as u64,
        Some(Value::U16(v)) => *v as u64,
        Some(Value::U32(v)) => *v as u64,
        Some(Value::I8(v)) if *v > 0 => *v as u64,
        Some(Value::I16(v)) if *v > 0 => *v as u64,
        Some(Value::I32(v)) if *v > 0 => *v as u64,
        _ => 32,
    }
    .max(1);
    // A declared alignment other than GGUF's default that the writer did not use moves the
    // data section by a few bytes: every offset can stay aligned and the tensors still tile,
    // so it shows only as bytes left over at the end (or a last tensor past it).
    let alignment_hint = if alignment != 32 && content.metadata.contains_key("general.alignment") {
        format!(", or the file was not written with the alignment it declares (`general.alignment` = {alignment})")
    } else {
        String::new()
    };
    let mut extents = Vec::with_capacity(content.tensor_infos.len());
    for (name, info) in &content.tensor_infos {
        let dims = info.shape.dims();
        let dtype = info.ggml_dtype;
        let values = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        let bytes = values
            .filter(|v| v % dtype.block_size() == 0)
            .and_then(|v| (v / dtype.block_size()).checked_mul(dtype.type_size()));
        let Some(bytes) = bytes else {
            return Err(format!(
                "tensor `{name}` has shape {dims:?}, which is not a whole number of {dtype:?} blocks of {} values",
                dtype.block_size()
            ));
        };
        if info.offset % alignment != 0 {
            return Err(format!(
                "tensor `{name}` starts at offset {} of the data section, not a multiple of the file's alignment {alignment}",
                info.offset
            ));
        }
        let start = content.tensor_data_offset.checked_add(info.offset);
        let end = start.and_then(|s| s.checked_add(bytes as u64));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => extents.push((start, end, name)),
            _ => {
                return Err(format!(
                    "truncated GGUF file: tensor `{name}` ends at byte {} but the file has {file_len} bytes \
                     (an incomplete download? delete it and fetch again{alignment_hint})",
                    content.tensor_data_offset as u128 + info.offset as u128 + bytes as u128
                ))
            }
        }
    }
    // Sorted by position, the tensors must tile the data section: each starts where the one
    // before ends, rounded up to the alignment (llama.cpp refuses any other layout). A gap means
    // a size in the directory is wrong, and the bytes read would be another tensor's.
    extents.sort_unstable();
    let mut expected = content.tensor_data_offset;
    let mut before: Option<&String> = None;
    for (start, end, name) in extents {
        if start < expected {
            let other = before.map_or(String::new(), |b| format!(" and `{b}`"));
            return Err(format!("tensors `{name}`{other} overlap in the file (bytes {start} to {expected})"));
        }
        if start > expected {
            let after = before.map_or("the start of the data section".into(), |b| format!("the end of `{b}`"));
            return Err(format!(
                "tensor `{name}` starts {} bytes after {after}: a tensor's shape or type in the directory is wrong",
                start - expected
            ));
        }
        expected = end.div_ceil(alignment) * alignment;
        before = Some(name);
    }
    // llama.cpp's and candle's writers end the file with the last tensor (and its padding):
    // bytes beyond it mean a size in the directory shrank, which no later tensor shows.
    if let Some(last) = before.filter(|_| file_len > expected) {
        return Err(format!(
            "the file has {} bytes after the end of its last tensor `{last}`: a tensor's shape or type in the directory is wrong{alignment_hint}",
            file_len - expected
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A GGUF header declaring `general.alignment` = 0 and no tensors.
    fn zero_alignment() -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes()); // tensors
        b.extend_from_slice(&1u64.to_le_bytes()); // metadata entries
        let key = b"general.alignment";
        b.extend_from_slice(&(key.len() as u64).to_le_bytes());
        b.extend_from_slice(key);
        b.extend_from_slice(&4u32.to_le_bytes()); // u32
        b.extend_from_slice(&0u32.to_le_bytes());
        b
    }

    /// The parser's panic becomes an error, and while one thread parses bad headers over and
    /// over, every panic of another thread still reaches the process's hook (swapping the hook
    /// for the parse lost some of them).
    #[test]
    fn parse_panics_are_errors_and_other_threads_keep_the_hook() {
        let e = read_content(&mut std::io::Cursor::new(zero_alignment())).unwrap_err();
        assert!(e.to_string().contains("general.alignment"), "{e}");
        let seen = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&seen);
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() == Some(&"counted") {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        }));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let parsing = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let bytes = zero_alignment();
                while !stop.load(Ordering::SeqCst) {
                    assert!(read_content(&mut std::io::Cursor::new(&bytes)).is_err());
                }
            })
        };
        let panics = 2000;
        for _ in 0..panics {
            let _ = std::panic::catch_unwind(|| std::panic::panic_any("counted"));
        }
        stop.store(true, Ordering::SeqCst);
        parsing.join().unwrap();
        let _ = std::panic::take_hook();
        std::panic::set_hook(previous);
        assert_eq!(seen.load(Ordering::SeqCst), panics);
    }
}
