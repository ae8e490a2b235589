//! Stop strings (OpenAI's `stop`): the answer ends where its text first contains one of them,
//! and excludes it. Text arrives in pieces (detokenized tokens); what may still turn out to
//! begin a stop string is held back from streaming until the next pieces settle it.

use crate::tokenizer::{TextTokenizer, TokenStream};
use std::cell::RefCell;

/// A generation's tokens as text, matched against stop strings: [`Self::is_stop`] serves as
/// `Generator::generate`'s `is_stop` (which sees every token once, in order), and
/// [`Self::ready`] gives the text to stream.
pub struct TextStops<'t> {
    tok: &'t TextTokenizer,
    ignore_eos: bool,
    state: RefCell<TextState>,
}

struct TextState {
    stream: TokenStream,
    stops: StopStrings,
    /// Characters of `stops`' text.
    chars: usize,
    /// Where each token [`TextStops::is_stop`] saw begins in the text: (byte, character).
    starts: Vec<(usize, usize)>,
}

impl<'t> TextStops<'t> {
    /// Stops at the end-of-turn token (unless `ignore_eos`) or before the first of `stops`.
    pub fn new(tok: &'t TextTokenizer, stops: Vec<String>, ignore_eos: bool) -> Result<Self, String> {
        let stops = StopStrings::new(stops)?;
        let state = TextState { stream: TokenStream::default(), stops, chars: 0, starts: Vec::new() };
        Ok(Self { tok, ignore_eos, state: RefCell::new(state) })
    }

    /// Whether generation ends at token `id`: the end of turn, or a stop string its text
    /// completes (the token is then not part of the answer, nor is the stop string).
    pub fn is_stop(&self, id: u32) -> bool {
        if !self.ignore_eos && self.tok.is_stop(id) {
            return true;
        }
        let s = &mut *self.state.borrow_mut();
        s.starts.push((s.stops.text.len(), s.chars));
        match s.stream.push(self.tok, id) {
            Ok(Some(piece)) => {
                s.chars += piece.chars().count();
                s.stops.push(&piece)
            }
            _ => s.stops.stopped(),
        }
    }

    /// How many of the generated tokens so far have text in what [`Self::ready`] handed out,
    /// or, with `finished`, in the answer: those whose text begins before its end (a token
    /// whose text runs into a stop string counts; all of them count when no stop string
    /// occurred). With `finished`, `generated` (the tokens generation returned) bounds it.
    pub fn tokens_shown(&self, generated: usize, finished: bool) -> usize {
        let s = self.state.borrow();
        let shown = |end: usize| s.starts.iter().take(generated).take_while(|&&(b, _)| b < end).count();
        match s.stops.hit {
            None if finished => generated.min(s.starts.len()),
            Some(hit) if finished => shown(hit),
            _ => shown(s.stops.given),
        }
    }

    /// Where the `i`-th generated token's text begins in the answer, in characters.
    pub fn char_offset(&self, i: usize) -> usize {
        let s = self.state.borrow();
        s.starts.get(i).map_or(s.chars, |&(_, c)| c)
    }

    /// The text to stream now ([`StopStrings::ready`]).
    pub fn ready(&self, finished: bool) -> String {
        self.state.borrow_mut().stops.ready(finished).to_string()
    }

    /// Whether a stop string ended the text.
    pub fn stopped(&self) -> bool {
        self.state.borrow().stops.stopped()
    }

    /// The answer: the text before the first stop string (all of it if none occurred).
    pub fn answer(&self) -> String {
        self.state.borrow().stops.answer().to_string()
    }
}

/// The answer's text so far, matched against the stop strings.
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    text: String,
    /// Where the first stop string begins, once one occurred.
    hit: Option<usize>,
    /// Bytes of `text` already handed out by [`Self::ready`].
    given: usize,
}

impl StopStrings {
    /// Matches `stops`; refuses an empty one (it would stop before the first token).
    pub fn new(stops: Vec<String>) -> Result<Self, String> {
        if stops.iter().any(String::is_empty) {
            return Err("an empty stop string".into());
        }
        Ok(Self { stops, ..Self::default() })
    }

    /// Appends the next piece of text; true once the text contains a stop string (the answer
    /// then ends before it, and later pieces are ignored).
    pub fn push(&mut self, piece: &str) -> bool {
        if self.hit.is_some() {
            return true;
        }
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        // A stop string new text completes starts at most `longest - 1` bytes before it.
        let mut from = self.text.len().saturating_sub(longest.saturating_sub(1));
        self.text.push_str(piece);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        self.hit = self.stops.iter().filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i)).min();
        self.hit.is_some()
    }

    /// Whether a stop string occurred.
    pub fn stopped(&self) -> bool {
        self.hit.is_some()
    }

    /// The answer: the text before the first stop string (all of it if none occurred).
    pub fn answer(&self) -> &str {
        &self.text[..self.hit.unwrap_or(self.text.len())]
    }

    /// The answer's text not handed out yet that no later piece can take back: up to the stop
    /// string once one occurred; otherwise all but the longest end that begins a stop string.
    /// With `finished`, everything left.
    pub fn ready(&mut self, finished: bool) -> &str {
        let end = match self.hit {
            Some(hit) => hit,
            None if finished => self.text.len(),
            None => self.text.len() - self.held_back(),
        };
        let start = self.given.min(end);
        self.given = self.given.max(end);
        &self.text[start..end]
    }

    /// Length of the longest end of the unsent text that is a proper beginning of a stop string.
    fn held_back(&self) -> usize {
        let open = &self.text[self.given..];
        self.stops
            .iter()
            .flat_map(|s| (1..s.len()).filter(|&k| s.is_char_boundary(k) && open.ends_with(&s[..k])))
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(s: &[&str]) -> StopStrings {
        StopStrings::new(s.iter().map(|s| s.to_string()).collect()).unwrap()
    }

    /// Feeds `pieces`; returns what streaming would show after each and the answer.
    fn run(m: &mut StopStrings, pieces: &[&str]) -> (Vec<String>, String) {
        let mut shown = Vec::new();
        for p in pieces {
            let stop = m.push(p);
            shown.push(m.ready(false).to_string());
            if stop {
                break;
            }
        }
        shown.push(m.ready(true).to_string());
        (shown, m.answer().to_string())
    }

    #[test]
    fn a_stop_string_across_pieces_ends_the_answer_before_it() {
        let mut m = stops(&["\n\nUser:", "###"]);
        let (shown, answer) = run(&mut m, &["Hello", " world.\n", "\nUs", "er: more", " ignored"]);
        assert_eq!(answer, "Hello world.");
        assert!(m.stopped());
        // "\n" could begin the first stop string: held back until the pieces settle it.
        assert_eq!(shown, ["Hello", " world.", "", "", ""]);
        assert_eq!(shown.concat(), answer);
    }

    #[test]
    fn a_false_start_is_released() {
        let mut m = stops(&["STOP"]);
        let (shown, answer) = run(&mut m, &["a S", "T", "x", "y"]);
        assert_eq!((answer.as_str(), m.stopped()), ("a STxy", false));
        assert_eq!(shown, ["a ", "", "STx", "y", ""]);
    }

    #[test]
    fn the_earliest_of_several_stops_wins_and_multibyte_text_is_cut_on_boundaries() {
        let mut m = stops(&["ß!", "é"]);
        let (shown, answer) = run(&mut m, &["naïve ", "caf", "é au ß!"]);
        assert_eq!(answer, "naïve caf");
        assert_eq!(shown.concat(), answer);
        let mut m = stops(&["ß!"]);
        assert_eq!(run(&mut m, &["Gruß", "!", "x"]).1, "Gru");
    }

    #[test]
    fn no_stops_hold_nothing_back_and_empty_stops_are_refused() {
        let mut m = stops(&[]);
        assert_eq!(run(&mut m, &["a", "b"]).0, ["a", "b", ""]);
        assert!(StopStrings::new(vec!["x".into(), String::new()]).is_err());
    }
}
