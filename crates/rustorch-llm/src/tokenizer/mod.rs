//! Tokenizers built from GGUF metadata, token for token like llama.cpp.
//!
//! Supported (`tokenizer.ggml.model`):
//!
//! - `llama`: SentencePiece-style BPE over token scores (LLaMA 1/2, TinyLlama, Mistral v0.1,
//!   Gemma 1-3...): spaces escaped to U+2581, an optional space prefix
//!   (`tokenizer.ggml.add_space_prefix`), byte fallback to `<0xXX>` tokens.
//! - `gpt2`: byte-level BPE over merge ranks, after the pre-tokenizer `tokenizer.ggml.pre` names.
//!   Supported pre-tokenizers: `default` (or none), the LLaMA 3 family (`llama3`, `llama-bpe`,
//!   `llama-v3`, `falcon3`, `falcon-h1`, `pixtral`, `midm-2.0`, `lfm2`, `jina-v5-nano`, `dbrx`,
//!   `smaug-bpe`, `chatglm-bpe`, `glm5`), the Qwen 2 family (`qwen2`, `deepseek-r1-qwen`,
//!   `kormo`, `f2llmv2`, `hunyuan`, `solar-open`, `stablelm2`, `megrez`), the GPT-2 family
//!   (`gpt-2`, `phi-2`, `mpt`, `olmo`, `jais`, `exaone4`, `trillion`, `granite-docling`, jina and
//!   roberta variants...), the StarCoder family (`starcoder`, `smollm`, `refact`, `command-r`,
//!   `codeshell`, `exaone`, `minerva-7b`, `mellum2`), `falcon` and `deepseek-coder`.
//!   Other names llama.cpp knows give [`crate::LlmError::UnsupportedPreTokenizer`], names it does not
//!   know [`crate::LlmError::UnknownPreTokenizer`]; other models [`crate::LlmError::UnknownTokenizerModel`] or
//!   [`crate::LlmError::UnsupportedTokenizerModel`].
//!
//! [`Tokenizer::encode`] is `llama_tokenize(text, add_special, parse_special)`: with
//! `parse_special`, control and unknown-type token texts in the input become those tokens;
//! user-defined tokens (Gemma's `<table>`, runs of spaces...) are always split out, as in
//! llama.cpp. BOS/EOS are added per `tokenizer.ggml.add_bos_token`/`add_eos_token` when
//! `add_special`. [`Tokenizer::detokenize`] is `llama_detokenize`, [`Tokenizer::token_to_piece`]
//! `llama_token_to_piece`.
//!
//! Known differences from llama.cpp, all outside what real vocabularies exercise: when several
//! tokens match an EOT/FIM name list the lowest id wins (llama.cpp: hash order); special tokens
//! of equal length keep id order (llama.cpp's sort is unstable); a byte with no `<0xXX>` token
//! becomes the unknown token (llama.cpp throws).

mod bpe;
mod pretok;
mod spm;
mod table;
mod unicode;
mod unicode_data;
mod vocab;

pub use vocab::{TokenAttr, VocabType};

use crate::error::{LlmError, Result};
use rustorch::gguf::{Gguf, Metadata};
use std::collections::HashMap;
use table::Strings;
use vocab::Vocab;

/// A tokenizer: encoding text to ids and ids back to text.
#[derive(Debug)]
pub struct Tokenizer {
    vocab: Vocab,
    byte_chars: [char; 256],
    /// `token_to_piece(id, special = true)` of every token, as llama.cpp caches it.
    /// Each token's piece (`token_to_piece` with `special`), precomputed.
    pieces: Strings,
}

/// One fragment of the input after special-token splitting.
enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

impl Tokenizer {
    /// The tokenizer of a GGUF model.
    pub fn from_gguf(gguf: &Gguf) -> Result<Tokenizer> {
        Tokenizer::from_metadata(gguf.metadata())
    }

    /// The tokenizer described by `tokenizer.ggml.*` metadata.
    pub fn from_metadata(md: &Metadata) -> Result<Tokenizer> {
        let vocab = Vocab::from_metadata(md)?;
        let byte_chars = unicode::byte_to_char_table();
        let char_bytes: HashMap<char, u8> = byte_chars.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
        let mut pieces = Strings::with_capacity(vocab.n_tokens(), 0);
        for id in 0..vocab.n_tokens() as u32 {
            pieces
                .push(&piece_uncached(&vocab, &char_bytes, id, true))
                .ok_or_else(|| LlmError::BadMetadata {
                    key: "tokenizer.ggml.tokens".into(),
                    reason: "the token pieces pass 4 GiB".into(),
                })?;
        }
        pieces.shrink_to_fit();
        Ok(Tokenizer {
            vocab,
            byte_chars,
            pieces,
        })
    }

    /// Number of tokens in the vocabulary.
    pub fn n_tokens(&self) -> usize {
        self.vocab.n_tokens()
    }

    pub fn vocab_type(&self) -> VocabType {
        self.vocab.vtype
    }

    /// `tokenizer.ggml.pre` (empty when absent).
    pub fn pre_tokenizer(&self) -> &str {
        &self.vocab.pre_name
    }

    pub fn bos(&self) -> Option<u32> {
        self.vocab.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.vocab.eos
    }
    /// End of turn: from metadata, else found by text (`<|im_end|>`, `<end_of_turn>`...).
    pub fn eot(&self) -> Option<u32> {
        self.vocab.eot
    }
    pub fn unk(&self) -> Option<u32> {
        self.vocab.unk
    }
    pub fn pad(&self) -> Option<u32> {
        self.vocab.pad
    }
    pub fn sep(&self) -> Option<u32> {
        self.vocab.sep
    }
    pub fn mask(&self) -> Option<u32> {
        self.vocab.mask
    }
    /// Whether `encode(.., add_special = true, ..)` prepends BOS / appends EOS.
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos
    }
    pub fn add_eos(&self) -> bool {
        self.vocab.add_eos
    }
    /// Whether a token ends generation (EOS, EOT, EOM and llama.cpp's list of such texts).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }
    /// All end-of-generation tokens, ascending.
    pub fn eog_tokens(&self) -> Vec<u32> {
        self.vocab.eog.iter().copied().collect()
    }

    /// The token's text as stored in the vocabulary (`None` when out of range).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.texts.get(id)
    }
    pub fn token_score(&self, id: u32) -> Option<f32> {
        self.vocab.scores.get(id as usize).copied()
    }
    pub fn token_attr(&self, id: u32) -> Option<TokenAttr> {
        self.vocab.attrs.get(id as usize).copied()
    }
    /// The id of a token text, if it is one.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.text_to_token(text)
    }

    /// `llama_tokenize(text, add_special, parse_special)`.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let frags = if text.is_empty() {
            Vec::new()
        } else {
            self.partition(text, parse_special)
        };
        let v = &self.vocab;
        let mut out = Vec::new();
        let bos = if add_special && v.add_bos { v.bos } else { None };
        let eos = if add_special && v.add_eos { v.eos } else { None };
        out.extend(bos);
        match v.vtype {
            VocabType::Spm => {
                let mut prev_special = true;
                let mut buf = String::new();
                for f in frags {
                    match f {
                        Fragment::Text(t) => {
                            buf.clear();
                            if v.add_space_prefix && prev_special {
                                buf.push(' ');
                            }
                            buf.push_str(t);
                            let escaped = buf.replace(' ', "\u{2581}");
                            spm::tokenize(v, &escaped, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            VocabType::Bpe => {
                let mut scratch = bpe::BpeScratch::default();
                for f in frags {
                    match f {
                        Fragment::Text(t) => bpe::tokenize(v, &self.byte_chars, t, &mut scratch, &mut out),
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        out.extend(eos);
        out
    }

    /// llama.cpp's `tokenizer_st_partition`: splits the text on special-token texts, longest
    /// token first. Without `parse_special` only user-defined tokens split.
    fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let mut frags = vec![Fragment::Text(text)];
        for &id in &self.vocab.special_tokens {
            let attr = self.vocab.attrs[id as usize];
            if !parse_special && attr.has(TokenAttr::CONTROL | TokenAttr::UNKNOWN) {
                continue;
            }
            let needle = self.vocab.text(id);
            if !frags
                .iter()
                .any(|f| matches!(f, Fragment::Text(t) if t.contains(needle)))
            {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(mut rest) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(pos) = rest.find(needle) {
                    let mut left = &rest[..pos];
                    if attr.has(TokenAttr::LSTRIP) {
                        left = left.trim_end_matches(is_c_space);
                    }
                    if !left.is_empty() {
                        next.push(Fragment::Text(left));
                    }
                    next.push(Fragment::Token(id));
                    rest = &rest[pos + needle.len()..];
                    if attr.has(TokenAttr::RSTRIP) {
                        rest = rest.trim_start_matches(is_c_space);
                    }
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            frags = next;
        }
        frags
    }

    /// `llama_token_to_piece(id, special = true)`, bytes as llama.cpp caches them; empty for
    /// ids out of range. A byte token's piece is its single byte, so pieces are not
    /// necessarily UTF-8.
    pub fn token_to_piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).unwrap_or(&[])
    }

    /// `llama_token_to_piece(id, lstrip, special)`: control and unknown tokens are empty unless
    /// `special`; up to `lstrip` leading spaces are removed.
    pub fn token_to_piece_with(&self, id: u32, lstrip: usize, special: bool) -> &[u8] {
        let (Some(attr), Some(p)) = (self.vocab.attrs.get(id as usize), self.pieces.get(id as usize)) else {
            return &[];
        };
        if !special && attr.has(TokenAttr::UNKNOWN | TokenAttr::CONTROL) {
            return &[];
        }
        let skip = p.iter().take(lstrip).take_while(|&&c| c == b' ').count();
        &p[skip..]
    }

    /// `llama_detokenize(ids, remove_special, unparse_special)` as bytes.
    ///
    /// `remove_special` drops a leading BOS / trailing EOS the vocabulary adds;
    /// `unparse_special` renders control tokens as their text (otherwise they are empty).
    /// The space an SPM encoder prefixed is removed from the first piece.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let v = &self.vocab;
        let mut ids = ids;
        let mut remove_space = v.add_space_prefix;
        if remove_special && v.add_bos {
            if let (Some(&first), Some(bos)) = (ids.first(), v.bos) {
                if first == bos {
                    remove_space = false;
                    ids = &ids[1..];
                }
            }
        }
        if remove_special && v.add_eos {
            if let (Some(&last), Some(eos)) = (ids.last(), v.eos) {
                if last == eos {
                    ids = &ids[..ids.len() - 1];
                }
            }
        }
        let mut text = Vec::new();
        for &id in ids {
            text.extend_from_slice(self.token_to_piece_with(id, remove_space as usize, unparse_special));
            remove_space = false;
        }
        if v.clean_spaces {
            clean_spaces(&mut text);
        }
        text
    }

    /// Text of `ids`: `detokenize(ids, remove_special = true, unparse_special = false)`, so
    /// that `decode(encode(text, false, false)) == text` (byte tokens are reassembled; invalid
    /// UTF-8 left by a cut sequence becomes U+FFFD). Exactly like llama.cpp, an SPM vocabulary
    /// with a space prefix keeps that space when a leading BOS is removed.
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.detokenize(ids, true, false)).into_owned()
    }
}

/// C `isspace` in the "C" locale.
fn is_c_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r')
}

/// `llama_vocab::impl::token_to_piece` without the cache.
fn piece_uncached(v: &Vocab, char_bytes: &HashMap<char, u8>, id: u32, special: bool) -> Vec<u8> {
    let text = v.text(id);
    let a = v.attrs[id as usize];
    if !special && a.has(TokenAttr::UNKNOWN | TokenAttr::CONTROL) {
        return Vec::new();
    }
    if a.has(TokenAttr::UNKNOWN | TokenAttr::CONTROL | TokenAttr::USER_DEFINED) {
        return text.as_bytes().to_vec();
    }
    if a.has(TokenAttr::NORMAL) {
        return match v.vtype {
            VocabType::Spm => text.replace('\u{2581}', " ").into_bytes(),
            VocabType::Bpe => decode_gpt2_text(char_bytes, text),
        };
    }
    if a.has(TokenAttr::BYTE) {
        return vec![parse_byte_token(text)];
    }
    Vec::new()
}

/// `llama_decode_text`: GPT-2 characters back to bytes; a character outside the map becomes
/// `[UNK_BYTE_0x..<text>]` as in llama.cpp.
fn decode_gpt2_text(char_bytes: &HashMap<char, u8>, text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match char_bytes.get(&c) {
            Some(&b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut tmp = [0u8; 4];
                for b in c.encode_utf8(&mut tmp).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// `token_to_byte`: `strtol(text.substr(3, 2), 16)`, leading hex digits only, 0 if none.
fn parse_byte_token(text: &str) -> u8 {
    let hex = text.as_bytes().get(3..).unwrap_or(&[]);
    let mut v = 0u32;
    for &c in hex.iter().take(2) {
        match (c as char).to_digit(16) {
            Some(d) => v = v * 16 + d,
            None => break,
        }
    }
    v as u8
}

/// llama.cpp's `clean_spaces` passes over detokenized text (HF's
/// `clean_up_tokenization_spaces`): " ?", " !", " .", " ," lose the space, " ' " loses both,
/// " 's", " 'm", " 're", " 've" lose the space. A literal port of the in-place C loops,
/// including pass 2 writing a NUL over the space it drops (which the next step then sees).
fn clean_spaces(text: &mut Vec<u8>) {
    // Pass 1: " ?", " !", " .", " ,".
    let n1 = text.len();
    let mut total = usize::from(n1 > 0);
    for i in 1..n1 {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    // Pass 2: " ' ".
    let n2 = total;
    total = usize::from(n2 > 0);
    let mut i = 1;
    while i < n2 {
        let x = text[i];
        if x == b'\'' && i + 1 < n2 && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    // Pass 3: " 's", " 'm", " 're", " 've".
    let n3 = total;
    total = usize::from(n3 > 0);
    for i in 1..n3 {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n3 {
            let x1 = text[i + 1];
            if x1 == b's' || x1 == b'm' {
                total -= 1;
            } else if x1 != b't' && x1 != b'd' && i + 2 < n3 {
                let x2 = text[i + 2];
                if (x1 == b'r' || x1 == b'v') && x2 == b'e' {
                    total -= 1;
                }
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

#[cfg(test)]
mod tests;
