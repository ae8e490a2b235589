//! # samplers: the mathematics of multi-draft speculative decoding
//!
//! Pure math on probability vectors (`&[f64]` indexed by token id), no model code:
//!
//! - [`construction`]: how `n` draft tokens are drawn from the draft distribution `q`
//!   ([`DraftConstruction`]): with replacement, without replacement, Greedy, SpecHub,
//!   top-k and conditional Poisson; each also gives the exact probability of any tuple.
//! - [`verify`]: how the target distribution `p` accepts one draft (or none) so that the
//!   output token is distributed exactly as `p` ([`Verifier`]); [`pairs`] declares which
//!   verifier is valid for which construction.
//! - [`alpha`]: acceptance rates: the optimal `alpha*` of each construction (the subset
//!   selection problem of the paper, eq. (subset)), K-SEQ's theoretical rate, and exact or
//!   Monte Carlo rates of recursive rejection sampling.
//! - [`positional`]: noise keyed by `(seed, position, token)`: exponential-race sampling
//!   and Gumbel-top-k drafts on the same noise, whose speculative output equals plain
//!   sampling's token for token (drafter-invariant decoding).
//! - [`dist`]: validation and sampling primitives; [`warp`]: temperature, min-p, top-k and
//!   top-p.
//! - [`stats`]: the chi-square p-value the lossless tests compute their thresholds with.
//!
//! Equation names refer to "Towards Optimal Multi-draft Speculative Decoding" (ICLR 2025).

pub mod alpha;
pub mod construction;
pub mod dist;
pub mod error;
pub mod pairs;
pub mod positional;
pub mod stats;
pub mod verify;
pub mod warp;

pub use construction::DraftConstruction;
pub use error::{Result, SamplerError};
pub use pairs::{default_verifier, validate_pair, VALID_PAIRS};
pub use positional::PositionalNoise;
pub use verify::{deterministic_output_distribution, verify_deterministic, Verdict, Verifier, VerifyScratch};

/// A token id (index into a probability vector).
pub type TokenId = u32;
