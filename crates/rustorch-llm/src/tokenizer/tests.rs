//! Unit tests on small hand-made vocabularies, whose expected ids follow from the algorithms
//! by hand (the real-model comparison with llama.cpp is in tests/tokenizer_llamacpp.rs).

use super::*;
use rustorch::gguf::GgufWriter;

/// Token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte.
fn metadata(entries: Vec<(&str, rustorch::gguf::Value)>) -> Metadata {
    let mut w = GgufWriter::new();
    for (k, v) in entries {
        w.add_metadata(k, v).expect("valid metadata");
    }
    w.metadata().clone()
}

/// An SPM vocabulary: <unk> <s> </s>, 256 byte tokens, then `extra` (text, score, type).
fn spm(extra: &[(&str, f32, i32)], more: Vec<(&str, rustorch::gguf::Value)>) -> Tokenizer {
    let mut toks: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut scores = vec![0.0f32; 3];
    let mut types = vec![2i32, 3, 3];
    for b in 0..=255u8 {
        toks.push(format!("<0x{b:02X}>"));
        scores.push(0.0);
        types.push(6);
    }
    for &(t, s, ty) in extra {
        toks.push(t.to_string());
        scores.push(s);
        types.push(ty);
    }
    let mut e: Vec<(&str, rustorch::gguf::Value)> = vec![
        ("tokenizer.ggml.model", "llama".into()),
        (
            "tokenizer.ggml.tokens",
            toks.iter().map(String::as_str).collect::<Vec<_>>().into(),
        ),
        ("tokenizer.ggml.scores", scores.into()),
        ("tokenizer.ggml.token_type", types.into()),
    ];
    e.extend(more);
    Tokenizer::from_metadata(&metadata(e)).expect("SPM tokenizer")
}

fn id(t: &Tokenizer, s: &str) -> u32 {
    t.token_id(s).unwrap_or_else(|| panic!("{s:?} is a token"))
}

#[test]
fn spm_merges_highest_score_first_and_falls_back_to_bytes() {
    let t = spm(
        &[
            ("▁", -1.0, 1),
            ("a", -2.0, 1),
            ("b", -2.0, 1),
            ("c", -2.0, 1),
            ("ab", -5.0, 1),
            ("bc", -3.0, 1),
            ("▁a", -4.0, 1),
        ],
        vec![],
    );
    // " abc" -> "▁abc": bigrams ▁a (-4), ab (-5), bc (-3): bc first, then ▁a; ab is stale.
    assert_eq!(t.encode("abc", false, false), [id(&t, "▁a"), id(&t, "bc")]);
    // BOS per the SPM default add_bos = true.
    assert_eq!(t.encode("abc", true, false)[0], 1);
    // "é" is no token: its UTF-8 bytes C3 A9.
    assert_eq!(
        t.encode("é", false, false),
        [id(&t, "▁"), id(&t, "<0xC3>"), id(&t, "<0xA9>")]
    );
    assert_eq!(t.decode(&t.encode("é abc", false, false)), "é abc");
    // As in llama.cpp: removing a leading BOS also cancels the removal of the prefixed space.
    assert_eq!(t.decode(&t.encode("é abc", true, false)), " é abc");
    // Equal scores: the leftmost pair merges first.
    let t = spm(
        &[("x", -1.0, 1), ("xx", -1.0, 1)],
        vec![("tokenizer.ggml.add_space_prefix", false.into())],
    );
    assert_eq!(t.encode("xxx", false, false), [id(&t, "xx"), id(&t, "x")]);
    assert_eq!(t.encode("", true, false), [1]);
    assert!(t.encode("", false, false).is_empty());
}

#[test]
fn spm_special_tokens_and_space_prefix() {
    let t = spm(
        &[
            ("▁", -1.0, 1),
            ("h", -2.0, 1),
            ("i", -2.0, 1),
            ("▁hi", -1.0, 1),
            ("hi", -1.5, 1),
            ("<sep>", 0.0, 4),
            ("<ctl>", 0.0, 3),
        ],
        vec![],
    );
    let (hi, shi, sep, ctl) = (id(&t, "hi"), id(&t, "▁hi"), id(&t, "<sep>"), id(&t, "<ctl>"));
    // A space is prefixed after a special token (and at the start), not after text.
    assert_eq!(t.encode("hi<ctl>hi", false, true), [shi, ctl, shi]);
    // Control tokens only split with parse_special; user-defined ones always.
    let no_parse = t.encode("hi<ctl>", false, false);
    assert!(!no_parse.contains(&ctl));
    assert_eq!(t.encode("hi<sep>hi", false, false), [shi, sep, shi]);
    assert_eq!(t.encode("<sep>hi", false, false), [sep, shi]);
    // Detokenize removes the prefixed space of the first piece; control pieces need unparse.
    assert_eq!(t.decode(&[shi, ctl, hi]), "hihi");
    assert_eq!(t.detokenize(&[shi, ctl, hi], false, true), b"hi<ctl>hi");
    assert_eq!(t.token_to_piece(shi), b" hi");
    assert_eq!(t.token_to_piece(id(&t, "<0x41>")), b"A");
}

/// A byte-level BPE vocabulary with the 256 GPT-2 byte characters, then `extra` tokens.
fn bpe(pre: &str, extra: &[(&str, i32)], merges: &[&str]) -> Tokenizer {
    let chars = unicode::byte_to_char_table();
    let mut toks: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
    let mut types = vec![1i32; 256];
    for &(t, ty) in extra {
        toks.push(t.to_string());
        types.push(ty);
    }
    let e = vec![
        ("tokenizer.ggml.model", "gpt2".into()),
        ("tokenizer.ggml.pre", pre.into()),
        (
            "tokenizer.ggml.tokens",
            toks.iter().map(String::as_str).collect::<Vec<_>>().into(),
        ),
        ("tokenizer.ggml.token_type", types.into()),
        ("tokenizer.ggml.merges", merges.to_vec().into()),
        ("tokenizer.ggml.eos_token_id", 256u32.into()),
    ];
    Tokenizer::from_metadata(&metadata(e)).expect("BPE tokenizer")
}

#[test]
fn bpe_merges_by_rank() {
    let t = bpe(
        "gpt-2",
        &[
            ("<|endoftext|>", 3),
            ("he", 1),
            ("ll", 1),
            ("hell", 1),
            ("hello", 1),
            ("Ġhello", 1),
            ("Ġh", 1),
        ],
        &["l l", "h e", "he ll", "hell o", "Ġ h", "Ġh ello"],
    );
    let ch = |c: char| id(&t, &c.to_string());
    assert_eq!(t.encode("hello", false, false), [id(&t, "hello")]);
    // " hello": ll (rank 0), he (1), hell (2), hello (3) all come before Ġh (4), which is
    // stale by then: Ġ + hello.
    assert_eq!(t.encode(" hello", false, false), [ch('Ġ'), id(&t, "hello")]);
    // " he": Ġh (4) and he (1) compete for h: he wins.
    assert_eq!(t.encode(" he", false, false), [ch('Ġ'), id(&t, "he")]);
    // " hx": Ġh merges.
    assert_eq!(t.encode(" hx", false, false), [id(&t, "Ġh"), ch('x')]);
    // Special token text, and bytes of multi-byte characters.
    assert_eq!(t.encode("<|endoftext|>", false, true), [256]);
    assert_eq!(t.encode("é", false, false), [ch('Ã'), ch('©')]);
    assert!(t.is_eog(256), "<|endoftext|> is end of generation");
    assert_eq!(t.decode(&t.encode("hello héllo\n", false, false)), "hello héllo\n");
}

#[test]
fn gpt2_clean_spaces_on_decode() {
    // gpt-2 pre-tokenizer: clean_spaces is on.
    let t = bpe("gpt-2", &[], &[]);
    let ids = t.encode("a , b ' c 's d 're e 't", false, false);
    assert_eq!(t.decode(&ids), "a, b'c's d're e 't");
}

#[test]
fn clean_spaces_port() {
    let run = |s: &str| {
        let mut v = s.as_bytes().to_vec();
        clean_spaces(&mut v);
        String::from_utf8(v).unwrap()
    };
    assert_eq!(run("Hello , world !"), "Hello, world!");
    assert_eq!(run("it ' s"), "it's");
    // The NUL pass 2 writes hides the dropped space from the next step: " ' ' x" keeps " x".
    assert_eq!(run("a ' ' x"), "a'' x");
    assert_eq!(run("I 'm you 'll we 've"), "I'm you 'll we've");
    assert_eq!(run(""), "");
}

#[test]
fn errors_name_the_problem() {
    let md = metadata(vec![("tokenizer.ggml.model", "wordpiece-2000".into())]);
    let e = Tokenizer::from_metadata(&md).unwrap_err();
    assert!(
        e.to_string().contains("unknown tokenizer model 'wordpiece-2000'"),
        "{e}"
    );
    let md = metadata(vec![("tokenizer.ggml.model", "t5".into())]);
    assert!(matches!(
        Tokenizer::from_metadata(&md),
        Err(crate::LlmError::UnsupportedTokenizerModel(_))
    ));
    let md = metadata(vec![("tokenizer.ggml.model", "llama".into())]);
    let e = Tokenizer::from_metadata(&md).unwrap_err();
    assert!(e.to_string().contains("tokenizer.ggml.tokens"), "{e}");
    let md = metadata(vec![
        ("tokenizer.ggml.model", "gpt2".into()),
        ("tokenizer.ggml.pre", "no-such-pre".into()),
        ("tokenizer.ggml.tokens", vec!["a"].into()),
    ]);
    let e = Tokenizer::from_metadata(&md).unwrap_err();
    assert!(
        e.to_string().contains("unknown pre-tokenizer type 'no-such-pre'"),
        "{e}"
    );
    let md = metadata(vec![
        ("tokenizer.ggml.model", "llama".into()),
        ("tokenizer.ggml.tokens", vec!["a", "a"].into()),
    ]);
    let e = Tokenizer::from_metadata(&md).unwrap_err();
    assert!(e.to_string().contains("appears twice"), "{e}");
}

#[test]
fn out_of_range_ids_do_not_panic() {
    let t = spm(&[("▁", -1.0, 1)], vec![]);
    assert_eq!(t.token_to_piece(1_000_000), b"");
    assert_eq!(t.decode(&[1_000_000, u32::MAX]), "");
    assert!(!t.is_eog(u32::MAX));
}
