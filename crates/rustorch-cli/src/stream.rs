//! Turning sampled tokens into printable text as they come: whole UTF-8
//! characters only (a character may span tokens) and stop strings held
//! back until they can no longer match.

use crate::error::CliError;
use rustorch_llm::{StopMatcher, Tokenizer};

pub struct TokenStream {
    pending: Vec<u8>,
    stops: StopMatcher,
}

/// What one token adds to the output.
pub struct Piece {
    /// Text that may be printed now.
    pub text: String,
    /// A stop string was matched: print `text` and end the reply.
    pub stopped: bool,
}

impl TokenStream {
    pub fn new(stops: &[String]) -> Result<TokenStream, CliError> {
        Ok(TokenStream {
            pending: Vec::new(),
            stops: StopMatcher::new(stops)?,
        })
    }

    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Piece {
        self.pending.extend_from_slice(tok.token_to_piece(id));
        let piece = take_printable(&mut self.pending);
        let o = self.stops.push(&piece);
        Piece {
            text: o.text,
            stopped: o.stopped,
        }
    }

    /// Text held back at the end (a partial stop-string match); the bytes
    /// of a cut UTF-8 character are dropped.
    pub fn finish(&mut self) -> String {
        self.pending.clear();
        self.stops.finish()
    }
}

/// The printable text at the front of `pending`, removed from it: whole
/// characters, and U+FFFD for each byte sequence that can never become one
/// (a token of a stray byte, as random or byte-level models make); only an
/// incomplete character at the very end stays, for the next token.
fn take_printable(pending: &mut Vec<u8>) -> String {
    let mut end = 0;
    loop {
        match std::str::from_utf8(&pending[end..]) {
            Ok(s) => {
                end += s.len();
                break;
            }
            Err(e) => match e.error_len() {
                // Invalid whatever follows: printed as U+FFFD, and the
                // scan goes on past it.
                Some(bad) => end += e.valid_up_to() + bad,
                // A character cut at the end: wait for its other bytes.
                None => {
                    end += e.valid_up_to();
                    break;
                }
            },
        }
    }
    let text = String::from_utf8_lossy(&pending[..end]).into_owned();
    pending.drain(..end);
    text
}

#[cfg(test)]
mod tests {
    use super::take_printable;

    #[test]
    fn a_stray_byte_does_not_hold_back_the_text_after_it() {
        // 0xC9 starts a two-byte character; a space cannot continue it.
        let mut pending = vec![b'a', 0xC9];
        assert_eq!(take_printable(&mut pending), "a");
        assert_eq!(pending, [0xC9], "a possible character start waits");
        pending.extend_from_slice(b" tz15");
        assert_eq!(take_printable(&mut pending), "\u{FFFD} tz15");
        assert!(pending.is_empty());
        // A character split over two tokens comes out whole.
        let mut pending = vec![0xC3];
        assert_eq!(take_printable(&mut pending), "");
        pending.push(0xA9);
        assert_eq!(take_printable(&mut pending), "\u{e9}");
    }
}
