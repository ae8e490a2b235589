//! Reading a checkpoint's rotary scaling ([`RopeScaling`]) from a Hugging Face `config.json`
//! (transformers v4's and v5's spellings) and from GGUF metadata (llama.cpp's converter's
//! keys and `rope_freqs.weight`). What each scaling does is `crate::model::rope_scaling`'s.

use crate::file_error as err;
use crate::formats::gguf::GgufFile;
pub use crate::model::rope_scaling::RopeScaling;
use serde_json::Value;

/// YaRN's attention factor for `factor` (`get_mscale` in transformers): `0.1 * mscale * ln(factor) + 1`,
/// or 1 when `factor <= 1`.
fn yarn_mscale(factor: f64, mscale: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * mscale * factor.ln() + 1.0
    }
}

/// The rotary base and scaling of a Hugging Face `config.json`, in either of transformers'
/// spellings: v4's `rope_theta` plus `rope_scaling` (`type` or `rope_type`), or v5's
/// `rope_parameters` (`rope_theta` inside it). `max_position_embeddings` stands in for an
/// absent `original_max_position_embeddings`, as in transformers. The error says what is wrong
/// or unsupported; the caller names the file.
pub fn from_hf_config(config: &Value, max_position_embeddings: usize) -> Result<(f64, RopeScaling), String> {
    let params = match (config.get("rope_parameters"), config.get("rope_scaling")) {
        (Some(p), _) if !p.is_null() => Some(("rope_parameters", p)),
        (_, Some(s)) if !s.is_null() => Some(("rope_scaling", s)),
        _ => None,
    };
    let top_theta = match config.get("rope_theta") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_f64().ok_or_else(|| format!("`rope_theta` is {v}, expected a number"))?),
    };
    let Some((key, params)) = params else { return Ok((top_theta.unwrap_or(10_000.0), RopeScaling::None)) };
    let map = params.as_object().ok_or_else(|| format!("`{key}` is {params}, expected an object"))?;
    if map.values().any(|v| v.is_object()) {
        return Err(format!("`{key}` gives rotary parameters per layer type, which is not supported: {params}"));
    }
    let number = |name: &str| -> Result<Option<f64>, String> {
        match map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| format!("`{key}.{name}` is {v}, expected a number")),
        }
    };
    let required = |name: &str, kind: &str| -> Result<f64, String> {
        number(name)?.ok_or_else(|| format!("`{key}` of type `{kind}` has no `{name}`"))
    };
    let theta = number("rope_theta")?.or(top_theta).unwrap_or(10_000.0);
    let partial = number("partial_rotary_factor")?.or(config.get("partial_rotary_factor").and_then(Value::as_f64));
    if let Some(p) = partial.filter(|p| *p != 1.0) {
        return Err(format!("partial_rotary_factor {p}: rotary embeddings over part of each head are not supported"));
    }
    let kind = match map.get("rope_type").or_else(|| map.get("type")) {
        None | Some(Value::Null) => "default",
        Some(Value::String(s)) => s.as_str(),
        Some(v) => return Err(format!("`{key}.rope_type` is {v}, expected a string")),
    };
    let original = || -> Result<f64, String> {
        Ok(number("original_max_position_embeddings")?.unwrap_or(max_position_embeddings as f64))
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: required("factor", kind)? },
        "llama3" => RopeScaling::Llama3 {
            factor: required("factor", kind)?,
            low_freq_factor: required("low_freq_factor", kind)?,
            high_freq_factor: required("high_freq_factor", kind)?,
            original_context: original()?,
        },
        "yarn" => {
            let original_context = original()?;
            let factor = match number("factor")? {
                Some(f) => f,
                None => max_position_embeddings as f64 / original_context,
            };
            let attention_factor = match (number("attention_factor")?, number("mscale")?, number("mscale_all_dim")?) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                    yarn_mscale(factor, m) / yarn_mscale(factor, all)
                }
                _ => yarn_mscale(factor, 1.0),
            };
            let truncate = match map.get("truncate") {
                None | Some(Value::Null) => true,
                Some(Value::Bool(b)) => *b,
                Some(v) => return Err(format!("`{key}.truncate` is {v}, expected true or false")),
            };
            // transformers reads `beta_fast or 32`: a 0 also means the default.
            let beta = |name: &str, default: f64| -> Result<f64, String> {
                Ok(number(name)?.filter(|b| *b != 0.0).unwrap_or(default))
            };
            RopeScaling::Yarn {
                factor,
                original_context,
                beta_fast: beta("beta_fast", 32.0)?,
                beta_slow: beta("beta_slow", 1.0)?,
                attention_factor,
                truncate,
            }
        }
        other => {
            return Err(format!(
                "rope scaling of type `{other}` is not supported (supported: default, linear, llama3, yarn): {params}"
            ))
        }
    };
    Ok((theta, scaling))
}

/// The rotary scaling llama.cpp's converter records: the tensor `rope_freqs.weight`
/// (LLaMA 3.1's frequency divisors), or `{arch}.rope.scaling.type` `linear` or `yarn` with
/// its `factor`, `original_context_length` and YaRN's betas (the older
/// `{arch}.rope.scale_linear` too). Other types, and YaRN factors this engine does not apply
/// (`attn_factor`, `yarn_log_multiplier`, an `ext_factor` or `yarn_attn_factor` other than
/// 1), are refused, naming the file.
pub fn from_gguf(file: &GgufFile, arch_name: &str) -> crate::Result<RopeScaling> {
    let a = |k: &str| format!("{arch_name}.rope.{k}");
    let kind = file.string(&a("scaling.type"))?;
    let factor = file.float(&a("scaling.factor"))?;
    let divisors = file.small_f32_tensor("rope_freqs.weight")?;
    let refuse = |what: String| Err(err(file.path(), what));
    for key in ["scaling.attn_factor", "scaling.yarn_log_multiplier"] {
        if let Some(v) = file.meta(&a(key)) {
            return refuse(format!("`{}` ({v:?}) is not supported", a(key)));
        }
    }
    for key in ["scaling.yarn_ext_factor", "scaling.yarn_attn_factor"] {
        if let Some(v) = file.float(&a(key))?.filter(|v| *v != 1.0 && *v >= 0.0) {
            return refuse(format!("`{}` = {v} is not supported (only 1)", a(key)));
        }
    }
    let scaling = match (kind.as_deref(), factor, divisors) {
        (None | Some("none"), _, None) => match file.float(&a("scale_linear"))? {
            Some(f) if f != 1.0 => RopeScaling::Linear { factor: f },
            _ => RopeScaling::None,
        },
        (None | Some("none"), _, Some(d)) => RopeScaling::FreqFactors(d),
        (Some(_), _, Some(_)) => {
            return refuse(format!("`rope_freqs.weight` together with `{}` is not supported", a("scaling.type")))
        }
        (Some("linear"), Some(f), None) => RopeScaling::Linear { factor: f },
        (Some("yarn"), Some(f), None) => RopeScaling::Yarn {
            factor: f,
            original_context: match file.uint(&a("scaling.original_context_length"))? {
                Some(n) => n as f64,
                None => file.require_uint(&format!("{arch_name}.context_length"))? as f64,
            },
            beta_fast: file.float(&a("scaling.yarn_beta_fast"))?.filter(|b| *b != 0.0).unwrap_or(32.0),
            beta_slow: file.float(&a("scaling.yarn_beta_slow"))?.filter(|b| *b != 0.0).unwrap_or(1.0),
            // llama.cpp: `attn_factor * (1 + 0.1 ln(1 / freq_scale))`, as transformers' `get_mscale`.
            attention_factor: if f > 1.0 { 0.1 * f.ln() + 1.0 } else { 1.0 },
            truncate: true,
        },
        (Some(kind @ ("linear" | "yarn")), None, None) => {
            return refuse(format!("`{}` is `{kind}` but `{}` is missing", a("scaling.type"), a("scaling.factor")))
        }
        (Some(other), _, None) => {
            return refuse(format!(
                "`{}` = `{other}` is not supported (supported: none, linear, yarn)",
                a("scaling.type")
            ))
        }
    };
    Ok(scaling)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The inverse frequencies and attention factors transformers 5.24.0 computes for these
    /// configurations (`benches/transformers_crosscheck.py --print-frequencies`), to 2e-6 relative.
    #[test]
    fn frequencies_equal_transformers() {
        // (config.json, head_dim, transformers' inv_freq, attention factor)
        let cases: Vec<(Value, usize, Vec<f32>, f32)> = reference_cases();
        assert!(!cases.is_empty());
        for (config, head_dim, expect, expect_attention) in cases {
            let max_pos = config["max_position_embeddings"].as_u64().unwrap() as usize;
            let (theta, scaling) = from_hf_config(&config, max_pos).unwrap();
            scaling.validate(head_dim).unwrap();
            let (freqs, attention) = scaling.frequencies(theta, head_dim);
            assert_eq!(freqs.len(), expect.len(), "{config}");
            for (i, (a, b)) in freqs.iter().zip(&expect).enumerate() {
                assert!((a - b).abs() <= 2e-6 * b.abs(), "{config}: frequency {i}: ours {a}, transformers {b}");
            }
            assert!((attention - expect_attention).abs() <= 1e-6, "{config}: attention {attention} {expect_attention}");
        }
    }

    include!("rope_scaling_reference.rs");

    /// llama.cpp's converter stores LLaMA 3.1's scaling as divisors
    /// (`1 / ((1 - smooth) / factor + smooth)` between the two wavelengths, `factor` above, 1
    /// below); dividing by them gives the `llama3` frequencies.
    #[test]
    fn llama_cpp_divisors_give_the_llama3_frequencies() {
        let (factor, low, high, old) = (8.0f64, 1.0f64, 4.0f64, 8192.0f64);
        let llama3 =
            RopeScaling::Llama3 { factor, low_freq_factor: low, high_freq_factor: high, original_context: old };
        let (theta, head_dim) = (500_000.0, 128);
        let (base, _) = RopeScaling::None.frequencies(theta, head_dim);
        let divisors: Vec<f32> = base
            .iter()
            .map(|&f| {
                let wavelen = 2.0 * std::f64::consts::PI / f as f64;
                let (low_wavelen, high_wavelen) = (old / low, old / high);
                if wavelen < high_wavelen {
                    1.0
                } else if wavelen > low_wavelen {
                    factor as f32
                } else {
                    let smooth = (old / wavelen - low) / (high - low);
                    (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
                }
            })
            .collect();
        let factors = RopeScaling::FreqFactors(divisors);
        factors.validate(head_dim).unwrap();
        let (a, _) = factors.frequencies(theta, head_dim);
        let (b, _) = llama3.frequencies(theta, head_dim);
        let changed = a.iter().zip(&base).filter(|(x, y)| x != y).count();
        assert!(changed > 10, "the scaling should change the low frequencies");
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!((x - y).abs() <= 1e-6 * y.abs(), "frequency {i}: divisors {x}, llama3 {y}");
        }
    }

    #[test]
    fn both_spellings_of_config_json_read_alike() {
        let v4 = json!({"rope_theta": 500000.0, "rope_scaling": {"type": "yarn", "factor": 4.0,
            "original_max_position_embeddings": 32768}});
        let v5 = json!({"rope_parameters": {"rope_theta": 500000.0, "rope_type": "yarn", "factor": 4.0,
            "original_max_position_embeddings": 32768}});
        assert_eq!(from_hf_config(&v4, 32768).unwrap(), from_hf_config(&v5, 32768).unwrap());
        let (theta, s) =
            from_hf_config(&json!({"rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}), 8).unwrap();
        assert_eq!((theta, s), (1e6, RopeScaling::None));
        assert_eq!(from_hf_config(&json!({}), 8).unwrap(), (10_000.0, RopeScaling::None));
        assert_eq!(from_hf_config(&json!({"rope_theta": 5.0, "rope_scaling": null}), 8).unwrap().0, 5.0);
        // YaRN without a factor takes the ratio of the two contexts.
        let (_, s) = from_hf_config(
            &json!({"rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 4096}}),
            16384,
        )
        .unwrap();
        assert!(matches!(s, RopeScaling::Yarn { factor, .. } if factor == 4.0));
        assert_eq!(s.context_length(16384), 16384);
    }

    #[test]
    fn unsupported_or_malformed_scalings_are_refused() {
        for (config, needle) in [
            (json!({"rope_scaling": {"type": "dynamic", "factor": 2.0}}), "`dynamic` is not supported"),
            (json!({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0]}}), "`longrope`"),
            (json!({"rope_scaling": {"rope_type": "linear"}}), "has no `factor`"),
            (json!({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}), "has no `low_freq_factor`"),
            (json!({"rope_scaling": {"rope_type": "linear", "factor": "2"}}), "expected a number"),
            (json!({"rope_scaling": [1, 2]}), "expected an object"),
            (json!({"rope_parameters": {"full_attention": {"rope_type": "default"}}}), "per layer type"),
            (json!({"rope_theta": "big"}), "expected a number"),
            (json!({"partial_rotary_factor": 0.5, "rope_parameters": {"rope_type": "default"}}), "part of each head"),
        ] {
            let e = from_hf_config(&config, 64).unwrap_err();
            assert!(e.contains(needle), "{config}: {e}");
        }
        let bad =
            RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 4.0, high_freq_factor: 4.0, original_context: 64.0 };
        assert!(bad.validate(8).unwrap_err().contains("high_freq_factor > low_freq_factor"));
        assert!(RopeScaling::Linear { factor: f64::NAN }.validate(8).is_err());
        assert!(RopeScaling::FreqFactors(vec![1.0; 3]).validate(8).unwrap_err().contains("need 4"));
        assert!(RopeScaling::FreqFactors(vec![1.0, 0.0, 1.0, 1.0]).validate(8).is_err());
    }

    #[test]
    fn scaled_contexts() {
        let yarn = RopeScaling::Yarn {
            factor: 4.0,
            original_context: 32768.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: 1.0,
            truncate: true,
        };
        assert_eq!(yarn.context_length(32768), 131072);
        assert_eq!(RopeScaling::Linear { factor: 2.0 }.context_length(4096), 8192);
        let llama3 =
            RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_context: 8192.0 };
        assert_eq!(llama3.context_length(131072), 131072);
        assert_eq!(RopeScaling::None.context_length(77), 77);
    }
}
