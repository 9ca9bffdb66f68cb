//! The SentencePiece-style tokenizer (llama.cpp's `llm_tokenizer_spm_session`).
//!
//! The text (spaces already escaped to U+2581) starts as one symbol per UTF-8 character; the
//! adjacent pair whose concatenation is the vocabulary token with the highest score is merged,
//! repeatedly (ties: leftmost first). Symbols that end up as no token fall back to their bytes'
//! `<0xXX>` tokens.

use super::vocab::Vocab;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    n: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair (llama.cpp's comparator;
    /// scores compare with `<`, so -0.0 == 0.0 as in C++).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

struct Session<'a> {
    vocab: &'a Vocab,
    text: &'a str,
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
    rev_merge: HashMap<&'a str, (usize, usize)>,
}

/// Appends the SPM tokens of `text` (already whitespace-escaped) to `out`.
pub(crate) fn tokenize(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut symbols = Vec::with_capacity(text.len());
    let mut chars = text.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        let idx = symbols.len();
        symbols.push(Symbol {
            start,
            n: c.len_utf8(),
            prev: idx.checked_sub(1),
            next: chars.peek().map(|_| idx + 1),
        });
    }
    let mut s = Session {
        vocab,
        text,
        symbols,
        queue: BinaryHeap::new(),
        rev_merge: HashMap::new(),
    };
    for i in 1..s.symbols.len() {
        s.try_add_bigram(Some(i - 1), Some(i));
    }
    while let Some(b) = s.queue.pop() {
        let (l, r) = (s.symbols[b.left], s.symbols[b.right]);
        // Skip pairs that a previous merge changed.
        if l.n == 0 || r.n == 0 || l.n + r.n != b.size {
            continue;
        }
        s.symbols[b.left].n += r.n;
        s.symbols[b.right].n = 0;
        s.symbols[b.left].next = r.next;
        if let Some(nx) = r.next {
            s.symbols[nx].prev = Some(b.left);
        }
        s.try_add_bigram(l.prev, Some(b.left));
        s.try_add_bigram(Some(b.left), r.next);
    }
    let mut i = if s.symbols.is_empty() { None } else { Some(0) };
    while let Some(k) = i {
        s.resegment(k, out);
        i = s.symbols[k].next;
    }
}

impl<'a> Session<'a> {
    fn sym_text(&self, i: usize) -> &'a str {
        let s = self.symbols[i];
        &self.text[s.start..s.start + s.n]
    }

    fn try_add_bigram(&mut self, left: Option<usize>, right: Option<usize>) {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let (l, r) = (self.symbols[left], self.symbols[right]);
        // Neighbours are contiguous, so the pair's text is one slice.
        let text = &self.text[l.start..l.start + l.n + r.n];
        let Some(id) = self.vocab.text_to_token(text) else {
            return;
        };
        self.queue.push(Bigram {
            left,
            right,
            score: self.vocab.scores[id as usize],
            size: text.len(),
        });
        self.rev_merge.insert(text, (left, right));
    }

    fn resegment(&self, i: usize, out: &mut Vec<u32>) {
        let text = self.sym_text(i);
        if let Some(id) = self.vocab.text_to_token(text) {
            out.push(id);
            return;
        }
        match self.rev_merge.get(text) {
            Some(&(l, r)) => {
                self.resegment(l, out);
                self.resegment(r, out);
            }
            None => {
                for &b in text.as_bytes() {
                    if let Some(id) = byte_to_token(self.vocab, b) {
                        out.push(id);
                    }
                }
            }
        }
    }
}

/// The token of one byte: `<0xXX>`, else the one-byte text. llama.cpp throws when neither
/// exists; here the unknown token stands in (and nothing if there is none).
pub(crate) fn byte_to_token(vocab: &Vocab, b: u8) -> Option<u32> {
    let hex = format!("<0x{b:02X}>");
    vocab
        .text_to_token(&hex)
        .or_else(|| {
            if b < 0x80 {
                vocab.text_to_token(&(b as char).to_string())
            } else {
                None
            }
        })
        .or(vocab.unk)
}
