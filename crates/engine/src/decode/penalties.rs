//! Repetition penalties: OpenAI's presence and frequency penalties and the repetition penalty of
//! Hugging Face and vLLM ([`Penalties`]), applied to a logits row after any logit bias and
//! before the warp, as vLLM orders them.
//!
//! For a token `t` with `c(t)` occurrences among the generated tokens, and `seen(t)` whether it
//! occurs in the prompt or among them:
//!
//! - repetition `r`: if `seen(t)`, `l(t) / r` where `l(t) > 0`, else `l(t) * r`;
//! - then frequency `f` and presence `a`: `l(t) - f c(t) - a [c(t) > 0]`.
//!
//! A row depends on the text before its position, so speculative decoding stays exact when each
//! tree node's row is penalised with the generated text extended by the drafted tokens on the
//! node's path ([`PenaltyState::apply`]): the target's row at a node is then the row plain
//! decoding would penalise at that position, and the verifier sees it. The draft's rows get the
//! same treatment, so that `q` stays close to `p`.

/// Penalty strengths; the default is none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Penalties {
    /// Divides positive logits and multiplies negative ones of the tokens in the prompt or the
    /// generated text (1 = off; > 0).
    pub repetition: f32,
    /// Subtracted once from the logit of each token the generated text holds (0 = off; -2 to 2).
    pub presence: f32,
    /// Subtracted from each token's logit per occurrence in the generated text (0 = off; -2 to 2).
    pub frequency: f32,
}

impl Default for Penalties {
    fn default() -> Self {
        Self { repetition: 1.0, presence: 0.0, frequency: 0.0 }
    }
}

impl Penalties {
    /// Whether every penalty is at its neutral value.
    pub fn is_off(&self) -> bool {
        *self == Self::default()
    }

    /// Checks the ranges: repetition finite and > 0 (at most 100), presence and frequency from
    /// -2 to 2 (OpenAI's range).
    pub fn check(&self) -> Result<(), String> {
        if !(self.repetition.is_finite() && self.repetition > 0.0 && self.repetition <= 100.0) {
            return Err(format!("repetition penalty must be in (0, 100], got {}", self.repetition));
        }
        for (name, v) in [("presence", self.presence), ("frequency", self.frequency)] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(format!("{name} penalty must be in [-2, 2], got {v}"));
            }
        }
        Ok(())
    }
}

/// The penalty flags shared by `mdsd generate`, `chat`, `serve` (its defaults) and
/// `bench mt-bench`.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct PenaltyFlags {
    /// Divide the positive logits, and multiply the negative ones, of the tokens in the prompt
    /// or the text by this (1: off; Hugging Face's and vLLM's repetition penalty).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1.0))]
    pub repetition_penalty: f32,
    /// Subtract this from the logit of every token the generated text holds (0: off; -2 to 2).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0.0, allow_negative_numbers = true))]
    pub presence_penalty: f32,
    /// Subtract this times its count in the generated text from each token's logit (0: off; -2
    /// to 2).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0.0, allow_negative_numbers = true))]
    pub frequency_penalty: f32,
}

impl PenaltyFlags {
    /// The penalties, checked; the error names the flags.
    pub fn penalties(&self) -> Result<Penalties, String> {
        let p = Penalties {
            repetition: self.repetition_penalty,
            presence: self.presence_penalty,
            frequency: self.frequency_penalty,
        };
        p.check()
            .map(|()| p)
            .map_err(|e| format!("{e} (--repetition-penalty, --presence-penalty, --frequency-penalty)"))
    }
}

/// The running generation's counts, and the row entries a penalty changed (to put them back).
/// Sized to the vocabulary once; a generation resets only the entries it touched.
#[derive(Debug, Default)]
pub struct PenaltyState {
    penalties: Penalties,
    /// Occurrences of each token among the generated tokens (and the path being scored).
    counts: Vec<u32>,
    /// Whether each token occurs in the prompt.
    in_prompt: Vec<bool>,
    /// The distinct tokens of the prompt and the generated text: the entries a row changes.
    touched: Vec<u32>,
    /// `(id, value)` of the entries [`Self::apply`] changed, for [`Self::restore`].
    saved: Vec<(u32, f32)>,
}

impl PenaltyState {
    /// Starts a generation of `prompt` with `penalties` over a `vocab`-token vocabulary.
    pub fn start(&mut self, penalties: Penalties, vocab: usize, prompt: &[u32]) {
        for &t in &self.touched {
            self.counts[t as usize] = 0;
            self.in_prompt[t as usize] = false;
        }
        self.touched.clear();
        self.saved.clear();
        self.penalties = penalties;
        if penalties.is_off() {
            return;
        }
        if self.counts.len() != vocab {
            self.counts = vec![0; vocab];
            self.in_prompt = vec![false; vocab];
        }
        for &t in prompt.iter().filter(|&&t| (t as usize) < vocab) {
            if !self.in_prompt[t as usize] {
                self.in_prompt[t as usize] = true;
                self.touched.push(t);
            }
        }
    }

    /// Records generated tokens.
    pub fn push(&mut self, tokens: &[u32]) {
        if self.penalties.is_off() {
            return;
        }
        let vocab = self.counts.len();
        for &t in tokens.iter().filter(|&&t| (t as usize) < vocab) {
            let i = t as usize;
            if self.counts[i] == 0 && !self.in_prompt[i] {
                self.touched.push(t);
            }
            self.counts[i] += 1;
        }
    }

    /// Penalises `row` (a target row, or a draft's, which may be shorter) for the generated text
    /// followed by `path`, the drafted tokens between it and the row's position, saving the
    /// entries it changes for [`Self::restore`]. Costs one pass over the distinct tokens of the
    /// prompt and the text.
    pub fn apply(&mut self, row: &mut [f32], path: &[u32]) {
        self.saved.clear();
        if self.penalties.is_off() {
            return;
        }
        let before = self.touched.len();
        self.push(path);
        let Penalties { repetition, presence, frequency } = self.penalties;
        for &t in &self.touched {
            let Some(l) = row.get_mut(t as usize) else { continue };
            self.saved.push((t, *l));
            let mut v = *l;
            if repetition != 1.0 {
                v = if v > 0.0 { v / repetition } else { v * repetition };
            }
            let c = self.counts[t as usize];
            if c > 0 {
                v -= frequency * c as f32 + presence;
            }
            *l = v;
        }
        // Take the path back out.
        let vocab = self.counts.len();
        for &t in path.iter().filter(|&&t| (t as usize) < vocab) {
            self.counts[t as usize] -= 1;
        }
        self.touched.truncate(before);
    }

    /// Puts back the entries the last [`Self::apply`] changed.
    pub fn restore(&mut self, row: &mut [f32]) {
        for &(t, v) in &self.saved {
            row[t as usize] = v;
        }
        self.saved.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The penalties written out for one row: repetition on prompt and text tokens, frequency
    /// and presence on the text's.
    fn reference(p: Penalties, row: &[f32], prompt: &[u32], text: &[u32]) -> Vec<f32> {
        (0..row.len())
            .map(|t| {
                let c = text.iter().filter(|&&x| x as usize == t).count() as f32;
                let seen = c > 0.0 || prompt.contains(&(t as u32));
                let mut v = row[t];
                if seen {
                    v = if v > 0.0 { v / p.repetition } else { v * p.repetition };
                }
                if c > 0.0 {
                    v -= p.frequency * c + p.presence;
                }
                v
            })
            .collect()
    }

    #[test]
    fn rows_are_penalised_for_the_text_and_path_and_put_back() {
        let row: Vec<f32> = vec![2.0, -1.0, 0.5, 3.0, -0.25, 1.5, f32::NEG_INFINITY, 0.0];
        let prompt = [1u32, 2, 2, 9];
        let text = [3u32, 3, 4];
        let path = [3u32, 5, 0];
        for p in [
            Penalties { repetition: 1.3, ..Penalties::default() },
            Penalties { presence: 0.5, frequency: 0.25, ..Penalties::default() },
            Penalties { repetition: 0.8, presence: -0.5, frequency: 1.5 },
        ] {
            let mut state = PenaltyState::default();
            state.start(p, 8, &prompt);
            state.push(&text);
            for (path, shorter) in [(&[][..], false), (&path[..], false), (&path[..], true)] {
                let full: Vec<u32> = text.iter().chain(path).copied().collect();
                let mut want = reference(p, &row, &prompt, &full);
                let mut got = row.clone();
                if shorter {
                    // A draft's shorter row: the ids past it are skipped.
                    got.truncate(5);
                    want.truncate(5);
                }
                let original = got.clone();
                state.apply(&mut got, path);
                assert_eq!(got, want, "{p:?}, path {path:?}");
                state.restore(&mut got);
                assert_eq!(got, original);
            }
            // The path was taken back out: the text alone again.
            let mut got = row.clone();
            state.apply(&mut got, &[]);
            assert_eq!(got, reference(p, &row, &prompt, &text));
            // A new generation forgets the last one's counts.
            state.start(p, 8, &[7]);
            let mut got = row.clone();
            state.apply(&mut got, &[]);
            assert_eq!(got, reference(p, &row, &[7], &[]));
        }
        // Off: nothing changes.
        let mut state = PenaltyState::default();
        state.start(Penalties::default(), 8, &prompt);
        state.push(&text);
        let mut got = row.clone();
        state.apply(&mut got, &path);
        assert_eq!(got, row);
    }

    #[test]
    fn ranges_are_checked() {
        assert!(Penalties::default().check().is_ok());
        for (bad, what) in [
            (Penalties { repetition: 0.0, ..Penalties::default() }, "repetition penalty must be in (0, 100], got 0"),
            (Penalties { repetition: f32::NAN, ..Penalties::default() }, "repetition"),
            (Penalties { presence: 2.5, ..Penalties::default() }, "presence penalty must be in [-2, 2], got 2.5"),
            (Penalties { frequency: -3.0, ..Penalties::default() }, "frequency penalty"),
        ] {
            let e = bad.check().unwrap_err();
            assert!(e.contains(what), "{e}");
        }
    }
}
