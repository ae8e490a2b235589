//! Decoding methods of a speed run: the autoregressive baseline, a (draft construction,
//! verifier) pair applied on a draft tree, or n-gram lookup drafting (no draft model).

use anyhow::bail;
use samplers::{DraftConstruction as C, Verifier as V};

/// A decoding method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Plain autoregressive decoding of the target.
    Baseline,
    /// Speculative decoding with this construction and verifier.
    Speculative { construction: C, verifier: V },
    /// N-gram (prompt lookup) drafts, verified by membership (`mdsd generate --ngram only`).
    Ngram,
    /// N-gram drafts on the steps where the context has a match, this construction and
    /// verifier with the draft model on the others (`mdsd generate --ngram first`).
    NgramFirst { construction: C, verifier: V },
}

/// The named methods (the paper's): name, construction, verifier.
pub const NAMED: &[(&str, C, V)] = &[
    ("rrs-wr", C::WithReplacement, V::Rrs),
    ("rrs-wor", C::WithoutReplacement, V::Rrs),
    ("kseq", C::WithReplacement, V::KSeq),
    ("greedy", C::Greedy, V::Greedy),
    ("spechub", C::SpecHub, V::SpecHub),
    ("topk", C::TopK, V::TopK),
];

impl Method {
    /// Parses `baseline`, a name of [`NAMED`], or `construction+verifier` (e.g. `wor+topk`);
    /// the pair must be declared valid in `samplers::pairs`.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        let s = s.trim().to_ascii_lowercase();
        if matches!(s.as_str(), "baseline" | "no-spec" | "autoregressive") {
            return Ok(Self::Baseline);
        }
        if matches!(s.as_str(), "ngram" | "prompt-lookup") {
            return Ok(Self::Ngram);
        }
        if let Some(rest) = s.strip_prefix("ngram+") {
            return match Self::parse(rest)? {
                Self::Speculative { construction, verifier } => Ok(Self::NgramFirst { construction, verifier }),
                _ => bail!("`{s}`: after `ngram+` comes a speculative method (e.g. `ngram+greedy`)"),
            };
        }
        if let Some(&(_, construction, verifier)) = NAMED.iter().find(|(n, _, _)| *n == s) {
            return Ok(Self::Speculative { construction, verifier });
        }
        if let Some((c, v)) = s.split_once('+') {
            let construction: C = c.parse()?;
            let verifier: V = v.parse()?;
            samplers::validate_pair(construction, verifier)?;
            return Ok(Self::Speculative { construction, verifier });
        }
        let names: Vec<&str> = NAMED.iter().map(|n| n.0).collect();
        bail!(
            "unknown method `{s}`: expected baseline, ngram, {}, construction+verifier, or ngram+METHOD (constructions: {}; verifiers: {})",
            names.join(", "),
            C::NAMES,
            V::NAMES
        )
    }

    /// The method's name: `baseline`, its [`NAMED`] name, or `construction+verifier`.
    pub fn name(&self) -> String {
        match *self {
            Self::Baseline => "baseline".into(),
            Self::Ngram => "ngram".into(),
            Self::NgramFirst { construction, verifier } => {
                format!("ngram+{}", Self::Speculative { construction, verifier }.name())
            }
            Self::Speculative { construction, verifier } => NAMED
                .iter()
                .find(|(_, c, v)| *c == construction && *v == verifier)
                .map_or_else(|| format!("{}+{}", construction.name(), verifier.name()), |n| n.0.to_string()),
        }
    }
}

/// Parses a comma-separated method list (duplicates dropped, order kept).
pub fn parse_methods(list: &str) -> anyhow::Result<Vec<Method>> {
    let mut out = Vec::new();
    for s in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let m = Method::parse(s)?;
        if !out.contains(&m) {
            out.push(m);
        }
    }
    if out.is_empty() {
        bail!("no methods given");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_names_are_errors() {
        for (name, c, v) in NAMED {
            let m = Method::parse(name).unwrap();
            assert_eq!(m, Method::Speculative { construction: *c, verifier: *v });
            assert_eq!(m.name(), *name);
        }
        assert_eq!(Method::parse("no-spec").unwrap(), Method::Baseline);
        assert_eq!(Method::parse("ngram").unwrap(), Method::Ngram);
        assert_eq!(Method::Ngram.name(), "ngram");
        let m = Method::parse("ngram+greedy").unwrap();
        assert_eq!(m, Method::NgramFirst { construction: C::Greedy, verifier: V::Greedy });
        assert_eq!(m.name(), "ngram+greedy");
        assert_eq!(Method::parse("ngram+wor+topk").unwrap().name(), "ngram+wor+topk");
        assert!(Method::parse("ngram+baseline").unwrap_err().to_string().contains("speculative method"));
        assert!(Method::parse("ngram+ngram").is_err());
        assert_eq!(Method::parse("wor+topk").unwrap().name(), "wor+topk");
        assert_eq!(Method::parse("wr+kseq").unwrap().name(), "kseq");
        let e = Method::parse("fast").unwrap_err().to_string();
        assert!(e.contains("unknown method `fast`") && e.contains("rrs-wor"), "{e}");
        assert!(Method::parse("wor+kseq").unwrap_err().to_string().contains("kseq"));
        assert_eq!(parse_methods("baseline, greedy,greedy").unwrap().len(), 2);
        assert!(parse_methods(" , ").is_err());
    }
}
