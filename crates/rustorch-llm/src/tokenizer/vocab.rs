//! The vocabulary: tokens, scores, attributes, special ids and flags, read from GGUF metadata
//! the way llama.cpp's `llama_vocab::impl::load` reads them.

use super::pretok::PreTokenizer;
use super::table::{KeyTable, PushError, TextTable};
use crate::error::{LlmError, Result};
use rustorch::gguf::{Array, Metadata, Value};
use std::collections::BTreeSet;

/// Which tokenizer algorithm the vocabulary uses (`tokenizer.ggml.model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabType {
    /// `llama`: SentencePiece-style BPE over scores, with byte fallback (LLaMA 1/2, Gemma...).
    Spm,
    /// `gpt2`: byte-level BPE over merge ranks, after a regex pre-tokenizer (GPT-2, LLaMA 3...).
    Bpe,
}

/// Token attributes, llama.cpp's `llama_token_attr` bit set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TokenAttr(pub u32);

impl TokenAttr {
    pub const UNDEFINED: TokenAttr = TokenAttr(0);
    pub const UNKNOWN: TokenAttr = TokenAttr(1 << 0);
    pub const UNUSED: TokenAttr = TokenAttr(1 << 1);
    pub const NORMAL: TokenAttr = TokenAttr(1 << 2);
    pub const CONTROL: TokenAttr = TokenAttr(1 << 3);
    pub const USER_DEFINED: TokenAttr = TokenAttr(1 << 4);
    pub const BYTE: TokenAttr = TokenAttr(1 << 5);
    pub const NORMALIZED: TokenAttr = TokenAttr(1 << 6);
    pub const LSTRIP: TokenAttr = TokenAttr(1 << 7);
    pub const RSTRIP: TokenAttr = TokenAttr(1 << 8);
    pub const SINGLE_WORD: TokenAttr = TokenAttr(1 << 9);

    /// Whether any bit of `other` is set.
    pub fn has(self, other: TokenAttr) -> bool {
        self.0 & other.0 != 0
    }

    /// The attribute of a GGUF `tokenizer.ggml.token_type` value (llama.cpp's
    /// `LLAMA_TOKEN_TYPE_*`: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte;
    /// anything else is undefined).
    pub fn from_token_type(t: i32) -> TokenAttr {
        match t {
            1 => TokenAttr::NORMAL,
            2 => TokenAttr::UNKNOWN,
            3 => TokenAttr::CONTROL,
            4 => TokenAttr::USER_DEFINED,
            5 => TokenAttr::UNUSED,
            6 => TokenAttr::BYTE,
            _ => TokenAttr::UNDEFINED,
        }
    }
}

impl std::ops::BitOr for TokenAttr {
    type Output = TokenAttr;
    fn bitor(self, rhs: TokenAttr) -> TokenAttr {
        TokenAttr(self.0 | rhs.0)
    }
}

/// Everything the tokenizer needs from the metadata.
#[derive(Debug)]
pub(crate) struct Vocab {
    pub vtype: VocabType,
    pub pre_name: String,
    pub pre: Option<PreTokenizer>,
    /// Token texts by id, with the text-to-id index.
    pub texts: TextTable,
    pub scores: Vec<f32>,
    pub attrs: Vec<TokenAttr>,
    /// BPE merge ranks, keyed by [`merge_key`].
    pub merges: KeyTable,
    /// The rank of each merge in `merges`, by its id there.
    pub merge_ranks: Vec<u32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim: [Option<u32>; 6],
    pub eog: BTreeSet<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    pub ignore_merges: bool,
    pub clean_spaces: bool,
    /// Special-token candidates for splitting input text (control, user-defined and unknown
    /// tokens), longest text first.
    pub special_tokens: Vec<u32>,
}

/// The lookup key of a merge `(left, right)`: the length of `left` then both texts, so that
/// pairs never collide whatever characters the tokens hold.
pub(crate) fn merge_key(buf: &mut Vec<u8>, left: &[u8], right: &[u8]) {
    buf.clear();
    buf.extend_from_slice(&(left.len() as u64).to_le_bytes());
    buf.extend_from_slice(left);
    buf.extend_from_slice(right);
}

fn bad(key: &str, reason: impl Into<String>) -> LlmError {
    LlmError::BadMetadata {
        key: key.to_string(),
        reason: reason.into(),
    }
}

fn opt_bool(md: &Metadata, key: &str) -> Result<Option<bool>> {
    if !md.contains_key(key) {
        return Ok(None);
    }
    Ok(Some(md.get_bool(key)?))
}

fn opt_str<'a>(md: &'a Metadata, key: &str) -> Result<Option<&'a str>> {
    if !md.contains_key(key) {
        return Ok(None);
    }
    Ok(Some(md.get_str(key)?))
}

/// A special token id key: any integer type (converters differ), as an id.
fn opt_id(md: &Metadata, key: &str) -> Result<Option<u64>> {
    if !md.contains_key(key) {
        return Ok(None);
    }
    match md.get(key)? {
        v @ Value::U8(_)
        | v @ Value::U16(_)
        | v @ Value::U32(_)
        | v @ Value::U64(_)
        | v @ Value::I8(_)
        | v @ Value::I16(_)
        | v @ Value::I32(_)
        | v @ Value::I64(_) => Ok(Some(v.as_u64_lossless().ok_or_else(|| bad(key, "negative token id"))?)),
        v => Err(bad(
            key,
            format!("has type {}, expected an integer token id", v.type_desc()),
        )),
    }
}

const EOT_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_NAMES: &[&str] = &["<|eom_id|>"];
const FIM_PRE_NAMES: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_NAMES: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_NAMES: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_NAMES: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_NAMES: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_NAMES: &[&str] = &["<|file_sep|>"];
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
];

impl Vocab {
    pub fn from_metadata(md: &Metadata) -> Result<Vocab> {
        let model = md.get_str("tokenizer.ggml.model")?;
        let pre_name = opt_str(md, "tokenizer.ggml.pre")?.unwrap_or("").to_string();
        let vtype = match model {
            "llama" => VocabType::Spm,
            "gpt2" => VocabType::Bpe,
            "no_vocab" | "none" | "bert" | "t5" | "rwkv" | "plamo2" | "gemma4" | "hybriddna" | "whitespace"
            | "test" => return Err(LlmError::UnsupportedTokenizerModel(model.to_string())),
            other => return Err(LlmError::UnknownTokenizerModel(other.to_string())),
        };

        // Defaults per model type (llama.cpp), overridden by metadata below.
        let (mut bos, mut eos, mut unk): (Option<u64>, Option<u64>, Option<u64>) = match vtype {
            VocabType::Spm => (Some(1), Some(2), Some(0)),
            VocabType::Bpe => (Some(11), Some(11), None),
        };
        let (mut add_bos, mut add_eos, mut add_space_prefix, clean_spaces, ignore_merges);
        let pre;
        match vtype {
            VocabType::Spm => {
                add_bos = true;
                add_eos = false;
                add_space_prefix = true;
                clean_spaces = false;
                ignore_merges = false;
                pre = None;
            }
            VocabType::Bpe => {
                add_space_prefix = false;
                add_eos = false;
                let cfg = PreTokenizer::from_name(&pre_name)?;
                add_bos = cfg.add_bos;
                clean_spaces = cfg.clean_spaces;
                ignore_merges = cfg.ignore_merges;
                if cfg.no_bos {
                    bos = None;
                }
                pre = Some(cfg);
            }
        }
        if let Some(v) = opt_bool(md, "tokenizer.ggml.add_space_prefix")? {
            add_space_prefix = v;
        }

        // Tokens, scores, types.
        let texts = md.get_str_array("tokenizer.ggml.tokens")?;
        let n = texts.len();
        if n > u32::MAX as usize {
            return Err(bad("tokenizer.ggml.tokens", format!("{n} tokens do not fit u32 ids")));
        }
        let scores: Option<Vec<f32>> = if md.contains_key("tokenizer.ggml.scores") {
            let s: Vec<f32> = match md.get_array("tokenizer.ggml.scores")? {
                Array::F32(v) => v.clone(),
                Array::I32(v) => v.iter().map(|&x| x as f32).collect(),
                a => {
                    return Err(bad(
                        "tokenizer.ggml.scores",
                        format!("has type {}, expected f32 or i32 array", a.type_desc()),
                    ))
                }
            };
            if s.len() < n {
                return Err(bad(
                    "tokenizer.ggml.scores",
                    format!("{} scores for {n} tokens", s.len()),
                ));
            }
            Some(s)
        } else {
            None
        };
        let types: Option<&[i32]> = if md.contains_key("tokenizer.ggml.token_type") {
            let t = md.get_i32_array("tokenizer.ggml.token_type")?;
            if t.len() < n {
                return Err(bad(
                    "tokenizer.ggml.token_type",
                    format!("{} types for {n} tokens", t.len()),
                ));
            }
            Some(t)
        } else {
            None
        };
        let text_bytes = texts.iter().map(String::len).sum();
        let mut table = TextTable::with_capacity(n, text_bytes);
        for (i, text) in texts.iter().enumerate() {
            // llama.cpp renames empty tokens so that every text is unique and non-empty.
            let renamed;
            let text = if text.is_empty() {
                renamed = format!("[EMPTY_{i}]");
                renamed.as_str()
            } else {
                text.as_str()
            };
            match table.push(text) {
                Ok(_) => {}
                // llama.cpp asserts on this (id_to_token.size() == token_to_id.size()).
                Err(PushError::Duplicate(_)) => {
                    return Err(bad(
                        "tokenizer.ggml.tokens",
                        format!("token {i} {text:?} appears twice"),
                    ))
                }
                Err(PushError::TooLarge) => {
                    return Err(bad("tokenizer.ggml.tokens", "the token texts pass 4 GiB"));
                }
            }
        }
        table.shrink_to_fit();
        let scores: Vec<f32> = scores.map_or_else(
            || vec![0.0; n],
            |mut s| {
                s.truncate(n);
                s
            },
        );
        let attrs: Vec<TokenAttr> = (0..n)
            .map(|i| types.map_or(TokenAttr::NORMAL, |t| TokenAttr::from_token_type(t[i])))
            .collect();

        // Merges (BPE only).
        let mut merges = KeyTable::default();
        let mut merge_ranks = Vec::new();
        if vtype == VocabType::Bpe {
            let list = md.get_str_array("tokenizer.ggml.merges")?;
            merges = KeyTable::with_capacity(list.len(), list.iter().map(|m| m.len() + 8).sum());
            merge_ranks.reserve(list.len());
            let mut key = Vec::new();
            for (rank, m) in list.iter().enumerate() {
                // llama.cpp splits at the first space after the first byte; a merge without one
                // becomes ("", ""), which can never match.
                let b = m.as_bytes();
                let (l, r) = match b.iter().skip(1).position(|&c| c == b' ') {
                    Some(p) => (&b[..p + 1], &b[p + 2..]),
                    None => (&b[..0], &b[..0]),
                };
                merge_key(&mut key, l, r);
                // emplace: the first rank of a repeated pair wins.
                match merges.push(&key) {
                    Ok(_) => merge_ranks.push(rank as u32),
                    Err(PushError::Duplicate(_)) => {}
                    Err(PushError::TooLarge) => return Err(bad("tokenizer.ggml.merges", "the merges pass 4 GiB")),
                }
            }
            merges.shrink_to_fit();
        }

        // Special ids: defaults out of range are dropped, metadata ids out of range ignored.
        let in_range = |id: Option<u64>| id.filter(|&i| (i as usize) < n);
        bos = in_range(bos);
        eos = in_range(eos);
        unk = in_range(unk);
        let mut ids: [Option<u64>; 14] = [
            bos, eos, None, None, unk, None, None, None, None, None, None, None, None, None,
        ];
        const KEYS: [&str; 14] = [
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
            "tokenizer.ggml.unknown_token_id",
            "tokenizer.ggml.seperator_token_id",
            "tokenizer.ggml.padding_token_id",
            "tokenizer.ggml.mask_token_id",
            "tokenizer.ggml.fim_pre_token_id",
            "tokenizer.ggml.fim_suf_token_id",
            "tokenizer.ggml.fim_mid_token_id",
            "tokenizer.ggml.fim_pad_token_id",
            "tokenizer.ggml.fim_rep_token_id",
            "tokenizer.ggml.fim_sep_token_id",
        ];
        for (slot, key) in ids.iter_mut().zip(KEYS) {
            if let Some(v) = opt_id(md, key)? {
                if (v as usize) < n {
                    *slot = Some(v);
                }
            }
        }
        // Deprecated FIM keys, read after the new ones as llama.cpp does.
        for (slot, key) in [
            (8, "tokenizer.ggml.prefix_token_id"),
            (9, "tokenizer.ggml.suffix_token_id"),
            (10, "tokenizer.ggml.middle_token_id"),
        ] {
            if let Some(v) = opt_id(md, key)? {
                if (v as usize) < n {
                    ids[slot] = Some(v);
                }
            }
        }
        if let Some(v) = opt_bool(md, "tokenizer.ggml.add_bos_token")? {
            add_bos = v;
        }
        if let Some(v) = opt_bool(md, "tokenizer.ggml.add_eos_token")? {
            add_eos = v;
        }
        let ids: Vec<Option<u32>> = ids.iter().map(|o| o.map(|v| v as u32)).collect();
        let mut v = Vocab {
            vtype,
            pre_name,
            pre,
            texts: table,
            scores,
            attrs,
            merges,
            merge_ranks,
            bos: ids[0],
            eos: ids[1],
            eot: ids[2],
            eom: ids[3],
            unk: ids[4],
            sep: ids[5],
            pad: ids[6],
            mask: ids[7],
            fim: [ids[8], ids[9], ids[10], ids[11], ids[12], ids[13]],
            eog: BTreeSet::new(),
            add_bos,
            add_eos,
            add_space_prefix,
            ignore_merges,
            clean_spaces,
            special_tokens: Vec::new(),
        };
        if v.add_bos && v.bos.is_none() {
            return Err(bad(
                "tokenizer.ggml.add_bos_token",
                "BOS is to be added but the vocabulary has no BOS token",
            ));
        }
        if v.add_eos && v.eos.is_none() {
            return Err(bad(
                "tokenizer.ggml.add_eos_token",
                "EOS is to be added but the vocabulary has no EOS token",
            ));
        }
        v.detect_special_by_text();
        v.apply_name_rules(md)?;
        v.build_special_cache();
        Ok(v)
    }

    fn set_control(&mut self, id: u32) {
        let a = &mut self.attrs[id as usize];
        *a = *a | TokenAttr::CONTROL;
    }

    /// llama.cpp's text-based detection of EOT/EOM/FIM tokens, unused tokens and the EOG set.
    ///
    /// llama.cpp walks its token hash map, so when several texts of one list exist its pick
    /// depends on hash order; here the lowest id wins (it agrees with llama.cpp on SmolLM2 and
    /// Gemma 3, whose EOT ids are 0 and 106).
    fn detect_special_by_text(&mut self) {
        let n = self.n_tokens() as u32;
        let lists: [(usize, &[&str]); 8] = [
            (0, EOT_NAMES),
            (1, EOM_NAMES),
            (2, FIM_PRE_NAMES),
            (3, FIM_SUF_NAMES),
            (4, FIM_MID_NAMES),
            (5, FIM_PAD_NAMES),
            (6, FIM_REP_NAMES),
            (7, FIM_SEP_NAMES),
        ];
        for id in 0..n {
            let text = self.texts.get(id).expect("id below n_tokens");
            for (which, names) in lists {
                let slot = match which {
                    0 => &mut self.eot,
                    1 => &mut self.eom,
                    k => &mut self.fim[k - 2],
                };
                if slot.is_none() && names.contains(&text) {
                    *slot = Some(id);
                    self.attrs[id as usize] = self.attrs[id as usize] | TokenAttr::CONTROL;
                }
            }
        }
        // Control tokens named "unused" are unused.
        for id in 0..n {
            let a = self.attrs[id as usize];
            if a.has(TokenAttr::CONTROL) && self.text(id).contains("unused") {
                self.attrs[id as usize] = a | TokenAttr::UNUSED;
            }
        }
        // End-of-generation tokens.
        let mut eog = BTreeSet::new();
        for id in [self.fim[3], self.fim[4], self.fim[5]].into_iter().flatten() {
            eog.insert(id);
        }
        for id in 0..n {
            if EOG_NAMES.contains(&self.text(id)) {
                eog.insert(id);
                self.set_control(id);
            }
        }
        // gpt-oss: these are always rendered.
        for id in 0..n {
            if matches!(
                self.text(id),
                "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>"
            ) {
                self.attrs[id as usize] = TokenAttr::USER_DEFINED;
            }
        }
        for id in [self.eos, self.eot, self.eom].into_iter().flatten() {
            eog.insert(id);
        }
        fn find(texts: &TextTable, eog: &BTreeSet<u32>, names: &[&str]) -> Option<u32> {
            eog.iter()
                .copied()
                .find(|&id| texts.get(id).is_some_and(|t| names.contains(&t)))
        }
        // o200k_harmony / solar-open: "<|end|>" is not an end of generation there.
        let has_return = find(&self.texts, &eog, &["<|return|>"]).is_some();
        let has_call = find(&self.texts, &eog, &["<|call|>", "<|calls|>"]).is_some();
        let has_flush = find(&self.texts, &eog, &["<|flush|>"]).is_some();
        if let Some(end) = find(&self.texts, &eog, &["<|end|>"]) {
            if has_call && (has_return || has_flush) {
                eog.remove(&end);
                self.attrs[end as usize] = TokenAttr::USER_DEFINED;
            }
        }
        // gemma4 / plamo: "</s>" is a normal token there.
        if find(&self.texts, &eog, &["<|tool_response>", "<|plamo:eos|>"]).is_some() {
            if let Some(s) = find(&self.texts, &eog, &["</s>"]) {
                eog.remove(&s);
                self.attrs[s as usize] = TokenAttr::NORMAL;
            }
        }
        self.eog = eog;
    }

    /// llama.cpp's per-model attribute fixes (by `general.name` / `tokenizer.ggml.pre`).
    fn apply_name_rules(&mut self, md: &Metadata) -> Result<()> {
        let name = opt_str(md, "general.name")?.unwrap_or("").to_ascii_lowercase();
        let arch = opt_str(md, "general.architecture")?.unwrap_or("");
        let pre = self.pre_name.clone();
        let set = |v: &mut Vocab, text: &str, attr: TokenAttr, on: bool| {
            if let Some(id) = v.texts.id_of(text) {
                let a = &mut v.attrs[id as usize];
                a.0 = if on { a.0 | attr.0 } else { a.0 & !attr.0 };
            }
        };
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
            .iter()
            .any(|s| pre.contains(s))
            || ["nomic-bert-moe", "jina-bert-v3"].iter().any(|s| arch.contains(s))
        {
            set(self, "<mask>", TokenAttr::LSTRIP, true);
        } else if name.contains("phi-3") || name.contains("phi3") {
            let special: Vec<u32> = (0..self.n_tokens() as u32)
                .filter(|&i| self.is_special_candidate(i))
                .collect();
            for id in special {
                let a = &mut self.attrs[id as usize];
                *a = *a | TokenAttr::RSTRIP;
            }
            set(self, "</s>", TokenAttr::RSTRIP, true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set(self, t, TokenAttr::RSTRIP, false);
            }
        } else if name.contains("modern-bert") {
            set(self, "[MASK]", TokenAttr::LSTRIP, true);
        }
        Ok(())
    }

    fn is_special_candidate(&self, id: u32) -> bool {
        self.attrs[id as usize].has(TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN)
    }

    /// Control, user-defined and unknown tokens, longest text first (llama.cpp's
    /// `cache_special_tokens`). llama.cpp's sort is not stable; equal lengths keep id order here,
    /// which can only matter for two different texts of one length overlapping in the input.
    fn build_special_cache(&mut self) {
        let mut ids: Vec<u32> = (0..self.n_tokens() as u32)
            .filter(|&i| self.is_special_candidate(i))
            .collect();
        ids.sort_by_key(|&id| std::cmp::Reverse(self.text(id).len()));
        self.special_tokens = ids;
    }

    pub fn text_to_token(&self, text: &str) -> Option<u32> {
        self.texts.id_of(text)
    }

    /// The rank of the merge with this [`merge_key`].
    pub fn merge_rank(&self, key: &[u8]) -> Option<u32> {
        self.merges.id_of(key).map(|id| self.merge_ranks[id as usize])
    }

    pub fn n_tokens(&self) -> usize {
        self.texts.len()
    }

    /// The text of token `id`, which must be below `n_tokens()` (callers check ids from
    /// outside; ids made here are in range by construction).
    pub fn text(&self, id: u32) -> &str {
        self.texts.get(id).expect("token id below n_tokens")
    }
}
