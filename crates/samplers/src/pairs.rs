//! The one place that declares which verifier is valid (lossless) for which draft
//! construction. Every pair listed here is proven lossless by the exact enumeration and the
//! chi-square tests in `tests/`.

use crate::construction::DraftConstruction;
use crate::construction::DraftConstruction as C;
use crate::error::{Result, SamplerError};
use crate::verify::Verifier;
use crate::verify::Verifier as V;

/// `(construction, verifier)` pairs whose output is distributed exactly as `p`. The first
/// verifier listed for a construction is its default.
pub const VALID_PAIRS: &[(DraftConstruction, Verifier)] = &[
    (C::WithReplacement, V::Rrs),
    (C::WithReplacement, V::KSeq),
    (C::WithReplacement, V::TopK),
    (C::WithoutReplacement, V::Rrs),
    (C::WithoutReplacement, V::TopK),
    (C::Greedy, V::Greedy),
    (C::Greedy, V::TopK),
    (C::SpecHub, V::SpecHub),
    (C::SpecHub, V::TopK),
    (C::TopK, V::TopK),
    (C::ConditionalPoisson, V::TopK),
];

/// The default verifier of a construction.
pub fn default_verifier(construction: DraftConstruction) -> Verifier {
    VALID_PAIRS.iter().find(|(c, _)| *c == construction).map(|(_, v)| *v).expect("every construction has a verifier")
}

/// The verifiers valid for a construction.
pub fn valid_verifiers(construction: DraftConstruction) -> impl Iterator<Item = Verifier> {
    VALID_PAIRS.iter().filter(move |(c, _)| *c == construction).map(|(_, v)| *v)
}

/// Errors unless `(construction, verifier)` is declared in [`VALID_PAIRS`].
pub fn validate_pair(construction: DraftConstruction, verifier: Verifier) -> Result<()> {
    if VALID_PAIRS.contains(&(construction, verifier)) {
        Ok(())
    } else {
        Err(SamplerError::InvalidPair {
            construction: construction.name(),
            verifier: verifier.name(),
            valid: valid_verifiers(construction).map(|v| v.name()).collect::<Vec<_>>().join(", "),
        })
    }
}
