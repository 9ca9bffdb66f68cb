//! The byte-level BPE tokenizer (llama.cpp's `llm_tokenizer_bpe_session`).
//!
//! Each pre-tokenized word, its bytes mapped to GPT-2's printable characters, starts as one
//! symbol per character; the adjacent pair with the lowest merge rank is merged, repeatedly
//! (ties: leftmost first). Final symbols are looked up in the vocabulary.

use super::vocab::{merge_key, Vocab};
use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    n: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

#[derive(PartialEq, Eq)]
struct Bigram {
    rank: u32,
    left: usize,
    right: usize,
    left_n: usize,
    right_n: usize,
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: lowest rank first, then the leftmost pair (llama.cpp's comparator).
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.left.cmp(&self.left))
            .then_with(|| (self.right, self.left_n, self.right_n).cmp(&(other.right, other.left_n, other.right_n)))
    }
}

/// Reused buffers for one `encode` call.
#[derive(Default)]
pub(crate) struct BpeScratch {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
    key: Vec<u8>,
    word: String,
}

/// Appends the BPE tokens of `text` to `out`.
pub(crate) fn tokenize(vocab: &Vocab, byte_chars: &[char; 256], text: &str, s: &mut BpeScratch, out: &mut Vec<u32>) {
    let pre = vocab
        .pre
        .as_ref()
        .expect("BPE vocabularies always have a pre-tokenizer");
    for raw in pre.split(text) {
        // GPT-2 byte encoding of the word.
        s.word.clear();
        s.word.extend(raw.bytes().map(|b| byte_chars[b as usize]));
        let word = s.word.as_str();
        s.symbols.clear();
        s.queue.clear();
        if vocab.ignore_merges && vocab.text_to_token(word).is_some() {
            s.symbols.push(Symbol {
                start: 0,
                n: word.len(),
                prev: None,
                next: None,
            });
        } else {
            let mut it = word.char_indices().peekable();
            while let Some((start, c)) = it.next() {
                let idx = s.symbols.len();
                s.symbols.push(Symbol {
                    start,
                    n: c.len_utf8(),
                    prev: idx.checked_sub(1),
                    next: it.peek().map(|_| idx + 1),
                });
            }
        }
        for i in 1..s.symbols.len() {
            add_bigram(vocab, word, &s.symbols, &mut s.key, &mut s.queue, Some(i - 1), Some(i));
        }
        while let Some(b) = s.queue.pop() {
            let (l, r) = (s.symbols[b.left], s.symbols[b.right]);
            // Outdated pair: either side has changed since it was queued.
            if l.n == 0 || r.n == 0 || l.n != b.left_n || r.n != b.right_n {
                continue;
            }
            s.symbols[b.left].n += r.n;
            s.symbols[b.right].n = 0;
            s.symbols[b.left].next = r.next;
            if let Some(nx) = r.next {
                s.symbols[nx].prev = Some(b.left);
            }
            add_bigram(vocab, word, &s.symbols, &mut s.key, &mut s.queue, l.prev, Some(b.left));
            add_bigram(vocab, word, &s.symbols, &mut s.key, &mut s.queue, Some(b.left), r.next);
        }
        for sym in s.symbols.iter().filter(|sym| sym.n > 0) {
            let piece = &word[sym.start..sym.start + sym.n];
            match vocab.text_to_token(piece) {
                Some(id) => out.push(id),
                None => {
                    // llama.cpp looks each byte of the encoded piece up as a one-byte string;
                    // only ASCII bytes can be (valid UTF-8) token texts.
                    for &b in piece.as_bytes() {
                        if b < 0x80 {
                            let mut tmp = [0u8; 4];
                            if let Some(id) = vocab.text_to_token((b as char).encode_utf8(&mut tmp)) {
                                out.push(id);
                            }
                        }
                    }
                }
            }
        }
    }
}

fn add_bigram(
    vocab: &Vocab,
    word: &str,
    symbols: &[Symbol],
    key: &mut Vec<u8>,
    queue: &mut BinaryHeap<Bigram>,
    left: Option<usize>,
    right: Option<usize>,
) {
    let (Some(left), Some(right)) = (left, right) else {
        return;
    };
    let (l, r) = (symbols[left], symbols[right]);
    let lt = &word.as_bytes()[l.start..l.start + l.n];
    let rt = &word.as_bytes()[r.start..r.start + r.n];
    merge_key(key, lt, rt);
    if let Some(rank) = vocab.merge_rank(key) {
        queue.push(Bigram {
            rank,
            left,
            right,
            left_n: l.n,
            right_n: r.n,
        });
    }
}
