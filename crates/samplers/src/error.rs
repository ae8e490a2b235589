//! Errors of the samplers crate: every one names the problem in words a user can act on.

/// What went wrong with a distribution, a draft tuple or a (construction, verifier) pair.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplerError {
    #[error("the distribution `{which}` is empty")]
    Empty { which: &'static str },
    #[error("p has {p} entries but q has {q}: target and draft distributions must have equal length")]
    LengthMismatch { p: usize, q: usize },
    #[error("`{which}` has an invalid entry {value} at index {index} (entries must be finite and >= 0)")]
    InvalidEntry { which: &'static str, index: usize, value: f64 },
    #[error("`{which}` sums to {sum}, not 1 (tolerance {tolerance})")]
    NotNormalized { which: &'static str, sum: f64, tolerance: f64 },
    #[error("the number of drafts n must be at least 1")]
    ZeroDrafts,
    #[error("{construction} drafts support only n = {supported}, got n = {n}")]
    UnsupportedDraftCount { construction: &'static str, supported: usize, n: usize },
    #[error("verifier `{verifier}` is not valid for `{construction}` drafts; valid verifiers: {valid}")]
    InvalidPair { construction: &'static str, verifier: &'static str, valid: String },
    #[error("malformed draft tuple: {0}")]
    BadDrafts(String),
    #[error("unknown {kind} `{name}`; expected one of: {expected}")]
    UnknownName { kind: &'static str, name: String, expected: &'static str },
    #[error("the distribution `{which}` has no token of positive probability")]
    NoSupport { which: &'static str },
    #[error("invalid sampling parameter: {0}")]
    BadParameter(String),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, SamplerError>;
