//! The target's features for EAGLE training, computed once and kept on disk: for each
//! tokenized conversation, the final (normed) hidden state of every token, as the EAGLE draft
//! reads them at inference ([`crate::model::DecoderModel::forward`]'s output).
//!
//! A store is a folder with `hidden.f16` (every sequence's rows, one after the other,
//! `hidden` f16 values per row, little-endian) and `sequences.jsonl` (one line per sequence:
//! its tokens, the answer's first index and its first row). A sequence's line is written after
//! its rows are synced, so an interrupted run resumes after the last whole sequence
//! ([`FeatureStore::open`] cuts `hidden.f16` back to it). Reading maps `hidden.f16` in memory;
//! [`FeatureStore::open_read_only`] reads a finished store and writes nothing.

use super::data::TokenizedConversation;
use crate::model::DecoderModel;
use crate::{file_error, Result};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

/// One stored sequence.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StoredSequence {
    pub tokens: Vec<u32>,
    pub answer_start: usize,
    /// Index of its first row in `hidden.f16`.
    pub first_row: usize,
}

/// A folder of stored features (see the module docs).
pub struct FeatureStore {
    dir: PathBuf,
    hidden: usize,
    sequences: Vec<StoredSequence>,
    map: Option<memmap2::Mmap>,
    /// Whether the cache given to the last [`Self::append`] holds the keys and values of the
    /// last stored sequence (it ran whole), so that the next append reuses their shared prefix.
    cache_holds_last: bool,
    /// Opened with [`Self::open_read_only`]: appends are refused.
    read_only: bool,
}

/// The rows of `hidden.f16` that an index's sequences hold (the next sequence's first row).
fn listed_rows(sequences: &[StoredSequence]) -> usize {
    sequences.last().map_or(0, |l| l.first_row + l.tokens.len())
}

/// The whole sequences of a store's index, in order, and whether a torn last line (a crash
/// while it was written) ended it. A line out of order is an error naming the file.
fn read_index(index: &Path) -> Result<(Vec<StoredSequence>, bool)> {
    let mut sequences: Vec<StoredSequence> = Vec::new();
    if !index.is_file() {
        return Ok((sequences, false));
    }
    let f = std::fs::File::open(index).map_err(|e| file_error(index, format!("cannot read: {e}")))?;
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| file_error(index, format!("cannot read: {e}")))?;
        match serde_json::from_str::<StoredSequence>(&line) {
            Ok(s) if s.first_row == listed_rows(&sequences) => sequences.push(s),
            // A line cut by a crash ends the store (the rows after it are redone).
            _ if line.trim().is_empty() || !line.ends_with('}') => return Ok((sequences, true)),
            _ => return Err(file_error(index, format!("line {}: not a stored sequence in order", i + 1))),
        }
    }
    Ok((sequences, false))
}

impl FeatureStore {
    /// Opens (or creates) the store in `dir` for features of `hidden` values, keeping the whole
    /// sequences already written and cutting off a partly written one.
    pub fn open(dir: &Path, hidden: usize) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| file_error(dir, format!("cannot create: {e}")))?;
        let index = dir.join("sequences.jsonl");
        let (sequences, _) = read_index(&index)?;
        let rows = listed_rows(&sequences);
        let data = dir.join("hidden.f16");
        let bytes = (rows * hidden * 2) as u64;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&data)
            .map_err(|e| file_error(&data, format!("cannot open: {e}")))?;
        let len = f.metadata().map_err(|e| file_error(&data, e.to_string()))?.len();
        if len < bytes {
            return Err(file_error(&data, format!("{len} bytes, but its index lists {rows} rows of {hidden}")));
        }
        if len > bytes {
            f.set_len(bytes).map_err(|e| file_error(&data, format!("cannot cut back: {e}")))?;
        }
        // The index without a torn last line.
        let text: String =
            sequences.iter().map(|s| serde_json::to_string(s).expect("JSON of a value") + "\n").collect();
        super::head::write_atomically(&index, text.as_bytes())?;
        Ok(Self { dir: dir.to_path_buf(), hidden, sequences, map: None, cache_holds_last: false, read_only: false })
    }

    /// Opens a finished store in `dir` for reading only: nothing in the folder is created,
    /// cut or rewritten (several runs may read it at once), and [`Self::append`] is refused. A
    /// torn index line or fewer rows than the index lists is an error naming the file: another
    /// run is writing the store, or one was cut off (open it with [`Self::open`] to resume).
    pub fn open_read_only(dir: &Path, hidden: usize) -> Result<Self> {
        let index = dir.join("sequences.jsonl");
        if !index.is_file() {
            return Err(file_error(&index, "no feature store here"));
        }
        let (sequences, torn) = read_index(&index)?;
        if torn {
            return Err(file_error(&index, "its last line is cut: the store is being written, or its run was cut off"));
        }
        let rows = listed_rows(&sequences);
        let data = dir.join("hidden.f16");
        let len = std::fs::metadata(&data).map_err(|e| file_error(&data, format!("cannot read: {e}")))?.len();
        if len != (rows * hidden * 2) as u64 {
            return Err(file_error(
                &data,
                format!("{len} bytes, but its index lists {rows} rows of {hidden}: the store is being written, or its run was cut off"),
            ));
        }
        Ok(Self { dir: dir.to_path_buf(), hidden, sequences, map: None, cache_holds_last: false, read_only: true })
    }

    /// The length of the longest token prefix that every stored sequence shares (0 when none
    /// is stored; a single sequence's whole length).
    pub fn shared_prefix(&self) -> usize {
        let Some((first, rest)) = self.sequences.split_first() else { return 0 };
        rest.iter().fold(first.tokens.len(), |n, s| {
            first.tokens[..n].iter().zip(&s.tokens).take_while(|(a, b)| a == b).count()
        })
    }

    pub fn sequences(&self) -> &[StoredSequence] {
        &self.sequences
    }

    /// Runs `target` over `seq` and appends its features (whole sequences only: see the module
    /// docs); returns the number of tokens run. `cache` must hold `seq.tokens.len()` rows. When
    /// it is the cache of the previous append (the chat template's system prompt and user header
    /// start every text), the tokens `seq` shares with the last stored sequence are not run
    /// again: their rows are copied and the rest runs after their cached keys and values. A
    /// row's features do not depend on the rows run beside it (test
    /// `features_of_a_shared_prefix_are_reused_and_equal`), so the store is the same either way.
    pub fn append(
        &mut self,
        target: &DecoderModel,
        seq: &TokenizedConversation,
        cache: &mut crate::model::kv_cache::KvCache,
    ) -> Result<usize> {
        if self.read_only {
            return Err(file_error(&self.dir, "opened for reading only: no features are added to it"));
        }
        let n = seq.tokens.len();
        let (shared, first_row) = match self.sequences.last() {
            Some(last) if self.cache_holds_last && cache.len() == last.tokens.len() => {
                let shared = last.tokens.iter().zip(&seq.tokens).take_while(|(a, b)| a == b).count();
                (shared.min(n.saturating_sub(1)), last.first_row)
            }
            _ => (0, 0),
        };
        let mut values = if shared == 0 { Vec::with_capacity(n * self.hidden) } else { self.rows(first_row, shared)? };
        self.cache_holds_last = false;
        cache.truncate(shared);
        let hidden = target.forward_chain(&seq.tokens[shared..], cache)?;
        if hidden.dims() != [n - shared, self.hidden] {
            return Err(file_error(&self.dir, format!("features {:?} for {} tokens", hidden.dims(), n - shared)));
        }
        values.extend(hidden.to_dtype(candle_core::DType::F32)?.flatten_all()?.to_vec1::<f32>()?);
        if let Some(bad) = values.iter().find(|v| !v.is_finite()) {
            return Err(file_error(&self.dir, format!("the target's features hold {bad}")));
        }
        let bytes: Vec<u8> = values.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
        let data = self.dir.join("hidden.f16");
        let io = |p: &Path, e: std::io::Error| file_error(p, format!("cannot write: {e}"));
        let mut f = std::fs::OpenOptions::new().append(true).open(&data).map_err(|e| io(&data, e))?;
        f.write_all(&bytes).map_err(|e| io(&data, e))?;
        f.sync_data().map_err(|e| io(&data, e))?;
        let first_row = listed_rows(&self.sequences);
        let stored = StoredSequence { tokens: seq.tokens.clone(), answer_start: seq.answer_start, first_row };
        let index = self.dir.join("sequences.jsonl");
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&index).map_err(|e| io(&index, e))?;
        writeln!(f, "{}", serde_json::to_string(&stored).expect("JSON of a value")).map_err(|e| io(&index, e))?;
        self.sequences.push(stored);
        self.map = None;
        self.cache_holds_last = true;
        Ok(n - shared)
    }

    /// The rows `first..first + count` of the store as f32 (`count * hidden` values).
    pub fn rows(&mut self, first: usize, count: usize) -> Result<Vec<f32>> {
        if self.map.is_none() {
            let data = self.dir.join("hidden.f16");
            let f = std::fs::File::open(&data).map_err(|e| file_error(&data, format!("cannot read: {e}")))?;
            // SAFETY: the file is only appended to by a store opened for writing, which drops the
            // map first; `mdsd train-eagle` locks a folder so that no writer runs beside readers.
            self.map =
                Some(unsafe { memmap2::Mmap::map(&f) }.map_err(|e| file_error(&data, format!("cannot map: {e}")))?);
        }
        let map = self.map.as_ref().expect("mapped above");
        let (start, end) = (first * self.hidden * 2, (first + count) * self.hidden * 2);
        if end > map.len() {
            return Err(file_error(&self.dir, format!("rows {first}..{} beyond the store", first + count)));
        }
        Ok(map[start..end].chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A torn last index line and rows after the last whole sequence are cut off on open.
    #[test]
    fn reopening_keeps_whole_sequences_only() {
        let dir = tempfile::tempdir().unwrap();
        let a = StoredSequence { tokens: vec![1, 2, 3], answer_start: 1, first_row: 0 };
        let text = serde_json::to_string(&a).unwrap() + "\n{\"tokens\":[4,";
        std::fs::write(dir.path().join("sequences.jsonl"), text).unwrap();
        // Three rows of hidden 2, plus half of another sequence's rows.
        let rows: Vec<u8> = (0..10).flat_map(|i| half::f16::from_f32(i as f32).to_le_bytes()).collect();
        std::fs::write(dir.path().join("hidden.f16"), rows).unwrap();
        let mut store = FeatureStore::open(dir.path(), 2).unwrap();
        assert_eq!(store.sequences(), &[a]);
        assert_eq!(std::fs::metadata(dir.path().join("hidden.f16")).unwrap().len(), 12);
        assert_eq!(store.rows(1, 2).unwrap(), vec![2.0, 3.0, 4.0, 5.0]);
        assert!(store.rows(2, 2).is_err());
        // Fewer bytes than the index lists is an error naming the file.
        std::fs::write(dir.path().join("hidden.f16"), [0u8; 4]).unwrap();
        let e = FeatureStore::open(dir.path(), 2).err().unwrap().to_string();
        assert!(e.contains("hidden.f16") && e.contains("3 rows"), "{e}");
    }
}
