//! BPE pre-tokenizers: the regex lists llama.cpp's `llm_tokenizer_bpe` uses per
//! `tokenizer.ggml.pre`, applied the way its `unicode_regex_split` applies them.
//!
//! Each regex of a list splits every piece the previous ones produced; the text between matches
//! stays a piece of its own. llama.cpp runs three kinds of regex, and so does this module:
//!
//! - hand-written splitters for the GPT-2, LLaMA 3 and Qwen 2 regexes (the ones with
//!   look-ahead), transcribed from unicode.cpp;
//! - regexes using `\p{..}` classes, matched against a "collapsed" text where every code point
//!   of 128 or more becomes one byte naming its category (0xD1 number, 0xD2 letter, 0xD3
//!   punctuation, 0xD4 mark, 0xD5 symbol, 0xD0 other, 0x0B whitespace), each class rewritten
//!   to that byte plus its ASCII members: llama.cpp's own trick, so its category tables decide;
//! - other regexes, matched over code points with non-ASCII whitespace turned into 0x0B.
//!
//! Only lists whose regexes have no look-around outside the hand-written splitters are
//! supported, so that the `regex` crate's leftmost-first matching is exactly ECMAScript's.

use super::unicode::{tolower_for_ascii_compare, CptFlags};
use crate::error::{LlmError, Result};

const GPT2: &str = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const LLAMA3: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/// Regex lists, as llama.cpp writes them.
const RE_DEFAULT: &[&str] = &["[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2, "\\p{N}+", "[0-9][0-9][0-9]"];
const RE_LLAMA3: &[&str] = &[LLAMA3];
const RE_QWEN2: &[&str] = &[QWEN2];
const RE_GPT2: &[&str] = &[GPT2];
const RE_STARCODER: &[&str] = &["\\p{N}", GPT2];
const RE_FALCON: &[&str] = &["[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2, "[0-9][0-9][0-9]"];
const RE_DEEPSEEK_CODER: &[&str] = &["[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"];

/// `tokenizer.ggml.pre` values llama.cpp knows whose regexes (look-around in std::regex, or
/// custom splitters) this module does not reproduce yet.
const KNOWN_UNSUPPORTED: &[&str] = &[
    "minicpm5",
    "deepseek-llm",
    "deepseek-v3",
    "spark2_5",
    "youtu",
    "jais-2",
    "gemma4",
    "granite-embed-multi-311m",
    "sarvam-moe",
    "whitespace",
    "qwen35",
    "poro-chat",
    "viking",
    "tekken",
    "bloom",
    "gpt3-finnish",
    "exaone-moe",
    "chameleon",
    "talkie",
    "granite-embed-multi-97m",
    "tiny_aya",
    "cohere2moe",
    "superbpe",
    "llada-moe",
    "seed-coder",
    "hunyuan-dense",
    "hy_v4",
    "joyai-llm",
    "kimi-k2",
    "ufakzeka",
    "grok-2",
    "afmoe",
    "laguna",
    "minimax-m2",
];

/// One step of a pre-tokenizer.
#[derive(Debug)]
enum Splitter {
    Gpt2,
    Llama3,
    Qwen2,
    /// Over the collapsed text (one byte per code point).
    Collapsed(regex::bytes::Regex),
    /// Over code points (non-ASCII whitespace as 0x0B).
    Codepoints(regex::Regex),
}

/// A BPE pre-tokenizer and the vocabulary flags its `tokenizer.ggml.pre` implies.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    splitters: Vec<Splitter>,
    pub add_bos: bool,
    pub clean_spaces: bool,
    pub ignore_merges: bool,
    /// chatglm: no BOS token by default.
    pub no_bos: bool,
}

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp picks for `tokenizer.ggml.pre` = `name` (empty: default).
    pub fn from_name(name: &str) -> Result<PreTokenizer> {
        // (regexes, clean_spaces, ignore_merges, add_bos, no_bos)
        let (res, clean, ignore, add_bos, no_bos): (&[&str], bool, bool, bool, bool) = match name {
            "" | "default" => (RE_DEFAULT, true, false, false, false),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
            | "jina-v5-nano" => (RE_LLAMA3, true, true, true, false),
            "dbrx" | "smaug-bpe" => (RE_LLAMA3, true, false, false, false),
            "chatglm-bpe" => (RE_LLAMA3, true, false, false, true),
            "glm5" => (RE_LLAMA3, true, true, false, true),
            "deepseek-coder" => (RE_DEEPSEEK_CODER, false, false, false, false),
            "falcon" => (RE_FALCON, true, false, false, false),
            "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
                (RE_STARCODER, true, false, false, false)
            }
            "command-r" | "smollm" => (RE_STARCODER, false, false, false, false),
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0"
            | "mellum" | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo" | "jais"
            | "exaone4" => (RE_GPT2, true, false, false, false),
            "trillion" | "granite-docling" => (RE_GPT2, false, false, false, false),
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open" => {
                (RE_QWEN2, false, false, false, false)
            }
            "stablelm2" | "megrez" => (RE_QWEN2, true, false, false, false),
            other if KNOWN_UNSUPPORTED.contains(&other) => {
                return Err(LlmError::UnsupportedPreTokenizer(other.to_string()))
            }
            other => return Err(LlmError::UnknownPreTokenizer(other.to_string())),
        };
        let splitters = res.iter().map(|r| compile(r)).collect::<Result<Vec<_>>>()?;
        Ok(PreTokenizer {
            splitters,
            add_bos,
            clean_spaces: clean,
            ignore_merges: ignore,
            no_bos,
        })
    }

    /// Splits `text` into words, as code point strings (before any byte encoding).
    pub fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let cpts: Vec<u32> = text.chars().map(|c| c as u32).collect();
        // Byte offset of each code point, plus the end.
        let mut starts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
        starts.push(text.len());
        let mut collapsed: Option<Vec<u8>> = None;
        let mut wide: Option<String> = None;
        let mut offsets = vec![cpts.len()];
        for s in &self.splitters {
            offsets = match s {
                Splitter::Gpt2 => split_gpt2(&cpts, &offsets),
                Splitter::Llama3 => split_llama3_like(&cpts, &offsets, true),
                Splitter::Qwen2 => split_llama3_like(&cpts, &offsets, false),
                Splitter::Collapsed(re) => {
                    let c = collapsed.get_or_insert_with(|| collapse(&cpts));
                    split_regex_bytes(re, c, &offsets)
                }
                Splitter::Codepoints(re) => {
                    let w = wide.get_or_insert_with(|| widen(&cpts));
                    split_regex_chars(re, w, &offsets)
                }
            };
        }
        let mut words = Vec::with_capacity(offsets.len());
        let mut at = 0;
        for len in offsets {
            words.push(&text[starts[at]..starts[at + len]]);
            at += len;
        }
        words
    }
}

/// Builds one splitter from a llama.cpp regex.
fn compile(expr: &str) -> Result<Splitter> {
    if expr == GPT2 {
        return Ok(Splitter::Gpt2);
    }
    if expr == LLAMA3 {
        return Ok(Splitter::Llama3);
    }
    if expr == QWEN2 {
        return Ok(Splitter::Qwen2);
    }
    let err = |e: regex::Error| LlmError::BadMetadata {
        key: "tokenizer.ggml.pre".into(),
        reason: format!("pre-tokenizer regex {expr:?} does not compile: {e}"),
    };
    if CATEGORIES.iter().any(|(p, _, _)| expr.contains(p)) {
        let re = regex::bytes::RegexBuilder::new(&collapse_regex(expr))
            .unicode(false)
            .build()
            .map_err(err)?;
        Ok(Splitter::Collapsed(re))
    } else {
        Ok(Splitter::Codepoints(regex::Regex::new(expr).map_err(err)?))
    }
}

/// Category classes: llama.cpp's `k_ucat_enum` / `k_ucat_cpt` / `k_ucat_map`, with the
/// ASCII members written as `regex` crate class items.
const CATEGORIES: &[(&str, u8, &str)] = &[
    ("\\p{N}", 0xD1, "0-9"),
    ("\\p{L}", 0xD2, "A-Za-z"),
    ("\\p{P}", 0xD3, "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"),
    ("\\p{M}", 0xD4, ""),
    ("\\p{S}", 0xD5, "\\$\\+<->\\^`\\|\\~"),
    ("\\p{Lu}", 0xD2, "A-Za-z"),
    ("\\p{Ll}", 0xD2, "A-Za-z"),
    ("\\p{Lt}", 0xD2, "A-Za-z"),
    ("\\p{Lm}", 0xD2, "A-Za-z"),
    ("\\p{Lo}", 0xD2, "A-Za-z"),
];

/// Rewrites `\p{..}` classes for the collapsed text, as llama.cpp does: outside brackets
/// `\p{N}` becomes `[\xD10-9]`, inside it contributes `\xD10-9`.
fn collapse_regex(expr: &str) -> String {
    let b = expr.as_bytes();
    let mut out = String::with_capacity(expr.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'[' && (i == 0 || b[i - 1] != b'\\') {
            out.push('[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && c == b']' && b[i - 1] != b'\\' {
            out.push(']');
            inside = false;
            i += 1;
            continue;
        }
        if let Some(&(pat, byte, ascii)) = CATEGORIES.iter().find(|(p, _, _)| b[i..].starts_with(p.as_bytes())) {
            if !inside {
                out.push('[');
            }
            out.push_str(&format!("\\x{byte:02X}{ascii}"));
            if !inside {
                out.push(']');
            }
            i += pat.len();
            continue;
        }
        // Callers only collapse ASCII regexes (llama.cpp refuses others), so bytes are chars.
        out.push(c as char);
        i += 1;
    }
    out
}

/// One byte per code point: ASCII as is, others their category byte.
fn collapse(cpts: &[u32]) -> Vec<u8> {
    cpts.iter()
        .map(|&c| {
            if c < 128 {
                return c as u8;
            }
            let f = CptFlags::of(c);
            if f.is_whitespace() {
                return 0x0B;
            }
            match f.category() {
                CptFlags::NUMBER => 0xD1,
                CptFlags::LETTER => 0xD2,
                CptFlags::PUNCTUATION => 0xD3,
                CptFlags::ACCENT_MARK => 0xD4,
                CptFlags::SYMBOL => 0xD5,
                _ => 0xD0,
            }
        })
        .collect()
}

/// The code points as a string, non-ASCII whitespace replaced by 0x0B (as llama.cpp does
/// before running std::wregex, whose `\s` is ASCII-only).
fn widen(cpts: &[u32]) -> String {
    cpts.iter()
        .map(|&c| {
            if c > 0x7F && CptFlags::of(c).is_whitespace() {
                '\x0B'
            } else {
                // The code points came from a &str.
                char::from_u32(c).expect("code points of a str are scalar values")
            }
        })
        .collect()
}

/// `unicode_regex_split_stl` over the collapsed text: matches and the gaps between them.
fn split_regex_bytes(re: &regex::bytes::Regex, text: &[u8], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let piece = &text[start..start + len];
        let mut prev = 0;
        for m in re.find_iter(piece) {
            if m.start() > prev {
                out.push(m.start() - prev);
            }
            out.push(m.len());
            prev = m.end();
        }
        if prev < len {
            out.push(len - prev);
        }
        start += len;
    }
    out.retain(|&l| l > 0);
    out
}

/// `unicode_regex_split_stl` over code points (the std::wregex path).
fn split_regex_chars(re: &regex::Regex, text: &str, offsets: &[usize]) -> Vec<usize> {
    let starts: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(text.len()))
        .collect();
    let cpt_at = |byte: usize| starts.partition_point(|&s| s < byte);
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let (b0, b1) = (starts[start], starts[start + len]);
        let mut prev = start;
        for m in re.find_iter(&text[b0..b1]) {
            let (ms, me) = (cpt_at(b0 + m.start()), cpt_at(b0 + m.end()));
            if ms > prev {
                out.push(ms - prev);
            }
            out.push(me - ms);
            prev = me;
        }
        if prev < start + len {
            out.push(start + len - prev);
        }
        start += len;
    }
    out.retain(|&l| l > 0);
    out
}

const OUT_OF_RANGE: u32 = 0xFFFF_FFFF;

/// The state of one custom splitter over one piece `[ini, end)` of the code points.
struct Piece<'a> {
    cpts: &'a [u32],
    ini: usize,
    end: usize,
    prev_end: usize,
    out: &'a mut Vec<usize>,
}

impl Piece<'_> {
    fn cpt(&self, pos: usize) -> u32 {
        if self.ini <= pos && pos < self.end {
            self.cpts[pos]
        } else {
            OUT_OF_RANGE
        }
    }
    fn flags(&self, pos: usize) -> CptFlags {
        if self.ini <= pos && pos < self.end {
            CptFlags::of(self.cpts[pos])
        } else {
            CptFlags(0)
        }
    }
    /// Ends the current word at `end`; returns its length.
    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }
    /// Runs of whitespace at `pos`: (count, end of the last \r or \n in it, or 0).
    fn whitespace_run(&self, pos: usize) -> (usize, usize) {
        let (mut n, mut last_rn) = (0, 0);
        while self.flags(pos + n).is_whitespace() {
            let c = self.cpt(pos + n);
            if c == '\r' as u32 || c == '\n' as u32 {
                last_rn = pos + n + 1;
            }
            n += 1;
        }
        (n, last_rn)
    }
}

/// `'re`, `'ve`, `'ll` after the apostrophe.
fn is_re_ve_ll(a: u32, b: u32) -> bool {
    matches!(
        (char::from_u32(a), char::from_u32(b)),
        (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l'))
    )
}

fn is_other(f: CptFlags) -> bool {
    !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.any()
}

/// unicode.cpp's `unicode_regex_split_custom_gpt2`:
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn split_gpt2(cpts: &[u32], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let mut p = Piece {
            cpts,
            ini: start,
            end: start + len,
            prev_end: start,
            out: &mut out,
        };
        start += len;
        let mut pos = p.ini;
        while pos < p.end {
            let cpt = p.cpt(pos);
            let flags = p.flags(pos);
            if cpt == '\'' as u32 && pos + 1 < p.end {
                let next = p.cpt(pos + 1);
                if [b's', b't', b'm', b'd'].iter().any(|&c| next == c as u32) {
                    pos += p.add(pos + 2);
                    continue;
                }
                if pos + 2 < p.end {
                    let next2 = p.cpt(pos + 2);
                    if is_re_ve_ll(next, next2) {
                        pos += p.add(pos + 3);
                        continue;
                    }
                }
            }
            let space = cpt == ' ' as u32;
            let mut f2 = if space { p.flags(pos + 1) } else { flags };
            if f2.is_letter() {
                pos += space as usize;
                while f2.is_letter() {
                    pos += 1;
                    f2 = p.flags(pos);
                }
                p.add(pos);
                continue;
            }
            if f2.is_number() {
                pos += space as usize;
                while f2.is_number() {
                    pos += 1;
                    f2 = p.flags(pos);
                }
                p.add(pos);
                continue;
            }
            if is_other(f2) {
                pos += space as usize;
                while is_other(f2) {
                    pos += 1;
                    f2 = p.flags(pos);
                }
                p.add(pos);
                continue;
            }
            let (nws, _) = p.whitespace_run(pos);
            if nws > 1 && p.cpt(pos + nws) != OUT_OF_RANGE {
                pos += nws - 1;
                p.add(pos);
                continue;
            }
            if nws > 0 {
                pos += nws;
                p.add(pos);
                continue;
            }
            pos += 1;
            p.add(pos);
        }
    }
    out
}

/// unicode.cpp's `unicode_regex_split_custom_llama3` (`digits3`: `\p{N}{1,3}`) and
/// `unicode_regex_split_custom_qwen2` (`\p{N}`), which differ only in the digit rule.
fn split_llama3_like(cpts: &[u32], offsets: &[usize], digits3: bool) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let mut p = Piece {
            cpts,
            ini: start,
            end: start + len,
            prev_end: start,
            out: &mut out,
        };
        start += len;
        let mut pos = p.ini;
        while pos < p.end {
            let cpt = p.cpt(pos);
            let flags = p.flags(pos);
            // (?i:'s|'t|'re|'ve|'m|'ll|'d)
            if cpt == '\'' as u32 && pos + 1 < p.end {
                let next = tolower_for_ascii_compare(p.cpt(pos + 1));
                if [b's', b't', b'm', b'd'].iter().any(|&c| next == c as u32) {
                    pos += p.add(pos + 2);
                    continue;
                }
                if pos + 2 < p.end {
                    let next2 = tolower_for_ascii_compare(p.cpt(pos + 2));
                    if is_re_ve_ll(next, next2) {
                        pos += p.add(pos + 3);
                        continue;
                    }
                }
            }
            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(cpt == '\r' as u32 || cpt == '\n' as u32 || flags.is_number())
                && (flags.is_letter() || p.flags(pos + 1).is_letter())
            {
                pos += 1;
                while p.flags(pos).is_letter() {
                    pos += 1;
                }
                p.add(pos);
                continue;
            }
            // \p{N}{1,3} or \p{N}
            if flags.is_number() {
                if digits3 {
                    let mut ini = pos;
                    while p.flags(pos).is_number() {
                        pos += 1;
                        if pos - ini >= 3 {
                            p.add(pos);
                            ini = pos;
                        }
                    }
                } else {
                    pos += 1;
                }
                p.add(pos);
                continue;
            }
            // <space>?[^\s\p{L}\p{N}]+[\r\n]*  (llama.cpp tests `flags`, not `flags2`, for "any")
            let space = cpt == ' ' as u32;
            let mut f2 = if space { p.flags(pos + 1) } else { flags };
            if !(f2.is_whitespace() || f2.is_letter() || f2.is_number()) && flags.any() {
                pos += space as usize;
                while is_other(f2) {
                    pos += 1;
                    f2 = p.flags(pos);
                }
                let mut c2 = p.cpt(pos);
                while c2 == '\r' as u32 || c2 == '\n' as u32 {
                    pos += 1;
                    c2 = p.cpt(pos);
                }
                p.add(pos);
                continue;
            }
            let (nws, last_rn) = p.whitespace_run(pos);
            // \s*[\r\n]+
            if last_rn > 0 {
                pos = last_rn;
                p.add(pos);
                continue;
            }
            // \s+(?!\S)
            if nws > 1 && p.cpt(pos + nws) != OUT_OF_RANGE {
                pos += nws - 1;
                p.add(pos);
                continue;
            }
            if nws > 0 {
                pos += nws;
                p.add(pos);
                continue;
            }
            pos += 1;
            p.add(pos);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: &str, text: &str) -> Vec<String> {
        PreTokenizer::from_name(pre)
            .unwrap()
            .split(text)
            .into_iter()
            .map(String::from)
            .collect()
    }

    #[test]
    fn gpt2_regex_semantics() {
        // Checked by hand against the GPT-2 regex: a run of spaces gives all but the last to
        // the whitespace rule, the last one prefixes the next word.
        assert_eq!(
            words("gpt-2", "Hello world's  end!!\n"),
            ["Hello", " world", "'s", " ", " end", "!!", "\n"]
        );
        assert_eq!(words("gpt-2", "a   b"), ["a", "  ", " b"]);
    }

    #[test]
    fn smollm_splits_digits() {
        assert_eq!(words("smollm", "x 1234 y"), ["x", " ", "1", "2", "3", "4", " y"]);
    }

    #[test]
    fn llama3_digit_groups_and_newlines() {
        assert_eq!(
            words("llama-bpe", "1234567 ab\n\n  c"),
            ["123", "456", "7", " ab", "\n\n", " ", " c"]
        );
        assert_eq!(words("llama-bpe", "I'M here"), ["I", "'M", " here"]);
        assert_eq!(words("qwen2", "12 ab"), ["1", "2", " ab"]);
    }

    #[test]
    fn default_splits() {
        // Punctuation runs first, then GPT-2, then digit runs, then groups of three digits.
        assert_eq!(words("default", "a+b=12345"), ["a", "+", "b", "=", "123", "45"]);
    }

    #[test]
    fn collapsed_regex_rewrite() {
        assert_eq!(collapse_regex("\\p{N}"), "[\\xD10-9]");
        assert_eq!(
            collapse_regex("[\\p{P}\\$]+"),
            "[\\xD3!-#%-*,-/:-;?-@\\[-\\]_\\{\\}\\$]+"
        );
        // ASCII \s in the regex crate includes \x0B, which stands for non-ASCII whitespace.
        let re = regex::bytes::RegexBuilder::new("\\s").unicode(false).build().unwrap();
        assert!(re.is_match(b"\x0B"));
    }

    #[test]
    fn unknown_and_unsupported_names() {
        assert!(matches!(
            PreTokenizer::from_name("nonsense"),
            Err(LlmError::UnknownPreTokenizer(_))
        ));
        assert!(matches!(
            PreTokenizer::from_name("tekken"),
            Err(LlmError::UnsupportedPreTokenizer(_))
        ));
    }
}
