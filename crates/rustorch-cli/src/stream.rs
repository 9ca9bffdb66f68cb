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
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(s) => s.len(),
            Err(e) => e.valid_up_to(),
        };
        let piece = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
        self.pending.drain(..valid);
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
