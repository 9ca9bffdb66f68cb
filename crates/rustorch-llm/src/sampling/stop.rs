//! Stop strings over streamed text.

use crate::error::{LlmError, Result};

/// What [`StopMatcher::push`] lets through.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopOutput {
    /// Text safe to show now: it cannot be the start of a stop string.
    pub text: String,
    /// A stop string was found; `text` ends right before it and generation should end.
    pub stopped: bool,
}

/// Finds user stop strings in generated text that arrives in pieces (one per token), holding
/// back the end of the text while it could still be the start of a stop string, and never
/// letting through anything from a stop string on.
///
/// ```
/// use rustorch_llm::sampling::StopMatcher;
///
/// let mut m = StopMatcher::new(["\nUser:"])?;
/// let mut shown = String::new();
/// for piece in ["Sure", ".\n", "Use", "r: next"] {
///     let out = m.push(piece);
///     shown += &out.text;
///     if out.stopped {
///         break;
///     }
/// }
/// assert_eq!(shown, "Sure.");
/// assert_eq!(m.matched(), Some("\nUser:"));
/// # Ok::<(), rustorch_llm::LlmError>(())
/// ```
#[derive(Clone, Debug)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    matched: Option<usize>,
}

impl StopMatcher {
    /// A matcher for `stops`; an empty stop string is an error (it would match at once).
    pub fn new<S: AsRef<str>>(stops: impl IntoIterator<Item = S>) -> Result<StopMatcher> {
        let stops: Vec<String> = stops.into_iter().map(|s| s.as_ref().to_string()).collect();
        if stops.iter().any(|s| s.is_empty()) {
            return Err(LlmError::BadSamplerConfig {
                field: "stop",
                reason: "stop strings must not be empty".into(),
            });
        }
        Ok(StopMatcher {
            stops,
            held: String::new(),
            matched: None,
        })
    }

    /// The stop string that ended generation, if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Whether a stop string was found (later pushes let nothing through).
    pub fn is_stopped(&self) -> bool {
        self.matched.is_some()
    }

    /// Text currently held back as a possible stop-string start.
    pub fn held(&self) -> &str {
        &self.held
    }

    /// Adds the next piece of generated text.
    pub fn push(&mut self, piece: &str) -> StopOutput {
        if self.matched.is_some() {
            return StopOutput {
                text: String::new(),
                stopped: true,
            };
        }
        self.held.push_str(piece);
        // The earliest stop string in the text (the held part was no full match before, but a
        // match may span it and the new piece). At equal positions the longer string wins.
        let found = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                self.held
                    .find(s.as_str())
                    .map(|pos| (pos, std::cmp::Reverse(s.len()), i))
            })
            .min();
        if let Some((pos, _, i)) = found {
            self.matched = Some(i);
            let text = self.held[..pos].to_string();
            self.held.clear();
            return StopOutput { text, stopped: true };
        }
        // Hold back the longest tail that is a proper prefix of some stop string.
        let hold = self
            .stops
            .iter()
            .map(|s| {
                (1..s.len().min(self.held.len() + 1))
                    .rev()
                    .find(|&n| s.is_char_boundary(n) && self.held.ends_with(&s[..n]))
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - hold;
        let text = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopOutput { text, stopped: false }
    }

    /// Ends the stream: the held-back text, which turned out not to start a stop string.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces`, returns (text let through, whether stopped, the final flush).
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool, String) {
        let mut m = StopMatcher::new(stops).unwrap();
        let mut out = String::new();
        for p in pieces {
            let o = m.push(p);
            // Never anything from a stop string on: checked on every step.
            for s in stops {
                assert!(!out.contains(s) && !o.text.contains(s));
            }
            out += &o.text;
            if o.stopped {
                return (out, true, m.finish());
            }
        }
        let rest = m.finish();
        (out, false, rest)
    }

    /// Reference: the text up to the earliest stop string of the joined stream.
    fn reference(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let all: String = pieces.concat();
        match stops.iter().filter_map(|s| all.find(s)).min() {
            Some(pos) => (all[..pos].to_string(), true),
            None => (all, false),
        }
    }

    #[test]
    fn split_across_pieces() {
        let stops = ["</s>", "\n\nUser:"];
        let cases: &[&[&str]] = &[
            &["Hello", " world", "<", "/", "s", ">", "tail"],
            &["Hello</", "s>"],
            &["a\n", "\nUs", "er", ":x"],
            &["a\n\nUse", "d to"],
            &["<", "<", "/s>"],
            &["no stop ", "here <", "/"],
            &["x</s", "</s>"],
        ];
        for pieces in cases {
            let (out, stopped, rest) = run(&stops, pieces);
            let (want, want_stopped) = reference(&stops, pieces);
            assert_eq!(stopped, want_stopped, "{pieces:?}");
            if stopped {
                assert_eq!(out, want, "{pieces:?}");
                assert_eq!(rest, "", "{pieces:?}");
            } else {
                assert_eq!(out.clone() + &rest, want, "{pieces:?}");
            }
        }
    }

    #[test]
    fn holds_back_only_possible_prefixes() {
        let mut m = StopMatcher::new(["STOP"]).unwrap();
        assert_eq!(m.push("abcST").text, "abc");
        assert_eq!(m.held(), "ST");
        assert_eq!(m.push("x").text, "STx");
        assert_eq!(m.push("S").text, "");
        let o = m.push("TOP and more");
        assert_eq!(
            o,
            StopOutput {
                text: String::new(),
                stopped: true
            }
        );
        assert_eq!(m.push("later").text, "");
        assert!(m.is_stopped());
    }

    #[test]
    fn earliest_and_multibyte() {
        // Two stops in one piece: the earlier wins.
        let (out, stopped, _) = run(&["B", "A"], &["xxAyyB"]);
        assert_eq!((out.as_str(), stopped), ("xx", true));
        // Multi-byte stop strings: held-back prefixes end on char boundaries.
        let mut m = StopMatcher::new(["ééé"]).unwrap();
        assert_eq!(m.push("aé").text, "a");
        assert_eq!(m.push("é").text, "");
        assert!(m.push("é!").stopped);
        assert!(StopMatcher::new([""]).is_err());
    }

    #[test]
    fn random_splits_match_reference() {
        // Every split of a few strings into pieces at every pair of char positions.
        let stops = ["<|im_end|>", "\n###", "aa"];
        let texts = [
            "hi there<|im_end|>more",
            "x\n##\n###y",
            "baab",
            "<|im_<|im_end|",
            "plain text",
        ];
        for t in texts {
            let b: Vec<usize> = t.char_indices().map(|(i, _)| i).chain([t.len()]).collect();
            for &i in &b {
                for &j in b.iter().filter(|&&j| j >= i) {
                    let pieces = [&t[..i], &t[i..j], &t[j..]];
                    let (out, stopped, rest) = run(&stops, &pieces);
                    let (want, want_stopped) = reference(&stops, &pieces);
                    assert_eq!(stopped, want_stopped, "{pieces:?}");
                    let got = if stopped { out } else { out + &rest };
                    assert_eq!(got, want, "{pieces:?}");
                }
            }
        }
    }
}
