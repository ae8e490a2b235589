//! Rotary-embedding scaling: how a checkpoint stretches its rotary frequencies beyond the
//! context it was pre-trained on (LLaMA 3.1/3.2, Qwen2.5 with YaRN, position interpolation).
//!
//! The default rotary embedding rotates pair `i` of a head of width `d` at position `m` by the
//! angle `m * theta^(-2i/d)`. Each scaling changes those inverse frequencies, and YaRN also
//! multiplies cos and sin by an attention factor. The formulas are those of transformers'
//! `modeling_rope_utils.py` (`_compute_linear_scaling_rope_parameters`,
//! `_compute_llama3_parameters`, `_compute_yarn_parameters`) and llama.cpp's `rope_freqs`
//! tensor and `ggml_rope_yarn_corr_dims`; `benches/transformers_crosscheck.py` checks them against
//! transformers.
//!
//! A checkpoint asking for a scaling this module does not know (`dynamic`, `longrope`, ...) is
//! refused when it loads (`crate::load::rope_scaling`), naming the file: run with the default frequencies, it would give
//! plausible but wrong logits.

/// A resolved rotary scaling (see the module docs).
#[derive(Debug, Clone, PartialEq, Default)]
pub enum RopeScaling {
    /// The default frequencies `theta^(-2i/d)`.
    #[default]
    None,
    /// Position interpolation: every inverse frequency divided by `factor`.
    Linear { factor: f64 },
    /// LLaMA 3.1's smooth interpolation: frequencies whose wavelength exceeds
    /// `original_context / low_freq_factor` are divided by `factor`, those under
    /// `original_context / high_freq_factor` are kept, and those between are blended.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_context: f64 },
    /// YaRN (Peng et al. 2023): interpolation by `factor` below the correction range, none above
    /// it, a linear ramp between; cos and sin are multiplied by `attention_factor`.
    Yarn { factor: f64, original_context: f64, beta_fast: f64, beta_slow: f64, attention_factor: f64, truncate: bool },
    /// One divisor per frequency, as llama.cpp's GGUF files store LLaMA 3.1's scaling (the
    /// tensor `rope_freqs.weight`: `head_dim / 2` floats).
    FreqFactors(Vec<f32>),
}

impl RopeScaling {
    /// The inverse frequencies of a head of width `head_dim` with base `theta`, and the factor
    /// that multiplies cos and sin (1 but for YaRN). `head_dim` must be even, `theta` positive.
    pub fn frequencies(&self, theta: f64, head_dim: usize) -> (Vec<f32>, f32) {
        let half = head_dim / 2;
        // The default frequencies, in f32 as transformers computes them.
        let base: Vec<f32> = (0..half).map(|i| (1.0 / theta.powf(2.0 * i as f64 / head_dim as f64)) as f32).collect();
        match self {
            Self::None => (base, 1.0),
            Self::Linear { factor } => (base.iter().map(|f| f / *factor as f32).collect(), 1.0),
            Self::Llama3 { factor, low_freq_factor, high_freq_factor, original_context } => {
                let (factor, low, high, old) =
                    (*factor as f32, *low_freq_factor as f32, *high_freq_factor as f32, *original_context as f32);
                let (low_freq_wavelen, high_freq_wavelen) = (old / low, old / high);
                let freqs = base
                    .iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f32::consts::PI / f;
                        if wavelen < high_freq_wavelen {
                            f
                        } else if wavelen > low_freq_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low) / (high - low);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect();
                (freqs, 1.0)
            }
            Self::Yarn { factor, original_context, beta_fast, beta_slow, attention_factor, truncate } => {
                let d = head_dim as f64;
                // The pair index at which a wavelength makes `rotations` turns over the original context.
                let correction_dim = |rotations: f64| {
                    d * (original_context / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln())
                };
                let (mut low, mut high) = (correction_dim(*beta_fast), correction_dim(*beta_slow));
                if *truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, mut high) = (low.max(0.0) as f32, high.min(d - 1.0) as f32);
                if low == high {
                    high += 0.001;
                }
                let freqs = base
                    .iter()
                    .enumerate()
                    .map(|(i, &f)| {
                        let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrapolation = 1.0 - ramp;
                        let interpolated = 1.0 / (*factor as f32 * (1.0 / f));
                        interpolated * (1.0 - extrapolation) + f * extrapolation
                    })
                    .collect();
                (freqs, *attention_factor as f32)
            }
            Self::FreqFactors(divisors) => (base.iter().zip(divisors).map(|(f, d)| f / d).collect(), 1.0),
        }
    }

    /// A few words for the load message (`None` without scaling).
    pub fn describe(&self) -> Option<String> {
        match self {
            Self::None => None,
            Self::Linear { factor } => Some(format!("linear rotary scaling x{factor}")),
            Self::Llama3 { factor, .. } => Some(format!("llama3 rotary scaling x{factor}")),
            Self::Yarn { factor, .. } => Some(format!("YaRN rotary scaling x{factor}")),
            Self::FreqFactors(_) => Some("rotary frequency factors (rope_freqs)".into()),
        }
    }

    /// The context the scaled model supports, from the one its file declares: YaRN's is
    /// `factor` times the original context, linear scaling's `factor` times the declared one
    /// (vLLM's rule), and the others keep the declared one.
    pub fn context_length(&self, declared: usize) -> usize {
        let scaled = |n: f64| if n.is_finite() && n >= 1.0 { (n as usize).max(declared) } else { declared };
        match self {
            Self::Yarn { factor, original_context, .. } => scaled(factor * original_context),
            Self::Linear { factor } => scaled(factor * declared as f64),
            _ => declared,
        }
    }

    /// Checks the parameters (finite, positive, one divisor per frequency) for a head of width
    /// `head_dim`; the error says what is wrong.
    pub fn validate(&self, head_dim: usize) -> Result<(), String> {
        let positive = |name: &str, x: f64| {
            if x.is_finite() && x > 0.0 {
                Ok(())
            } else {
                Err(format!("rope scaling `{name}` must be a positive number, got {x}"))
            }
        };
        match self {
            Self::None => Ok(()),
            Self::Linear { factor } => positive("factor", *factor),
            Self::Llama3 { factor, low_freq_factor, high_freq_factor, original_context } => {
                positive("factor", *factor)?;
                positive("low_freq_factor", *low_freq_factor)?;
                positive("high_freq_factor", *high_freq_factor)?;
                positive("original_max_position_embeddings", *original_context)?;
                if high_freq_factor <= low_freq_factor {
                    return Err(format!(
                        "llama3 rope scaling needs high_freq_factor > low_freq_factor, got {high_freq_factor} and {low_freq_factor}"
                    ));
                }
                Ok(())
            }
            Self::Yarn { factor, original_context, beta_fast, beta_slow, attention_factor, .. } => {
                positive("factor", *factor)?;
                positive("original_max_position_embeddings", *original_context)?;
                positive("beta_fast", *beta_fast)?;
                positive("beta_slow", *beta_slow)?;
                positive("attention_factor", *attention_factor)
            }
            Self::FreqFactors(divisors) => {
                if divisors.len() != head_dim / 2 {
                    return Err(format!(
                        "`rope_freqs.weight` has {} values; heads of {head_dim} need {}",
                        divisors.len(),
                        head_dim / 2
                    ));
                }
                match divisors.iter().find(|d| !(d.is_finite() && **d > 0.0)) {
                    Some(d) => Err(format!("`rope_freqs.weight` holds {d}; its values must be positive")),
                    None => Ok(()),
                }
            }
        }
    }
}
