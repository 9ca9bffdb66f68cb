//! `rustorch-cli tokenize` prints exactly what llama.cpp's `llama-tokenize`
//! prints, byte for byte, for the texts and flags of
//! tests/fixtures/tokenize.json (made by tools/gen_cli_fixtures.py with the
//! llama.cpp build of tools/build_llamacpp.sh) on the real SmolLM2 (BPE, no
//! BOS) and Gemma 3 (SPM-style vocabulary, BOS added) models.

mod common;

use common::{assert_one_line_error, cli, real_model, stderr, TempDir};
use sha2::{Digest, Sha256};

/// Standard base64 (the fixture's encoding of raw stdout bytes).
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let mut out = Vec::new();
    for chunk in s.as_bytes().chunks(4) {
        let data: Vec<u8> = chunk.iter().copied().filter(|&c| c != b'=').collect();
        let mut acc = 0u32;
        for (i, &c) in data.iter().enumerate() {
            acc |= val(c) << (18 - 6 * i);
        }
        out.extend_from_slice(&acc.to_be_bytes()[1..data.len()]);
    }
    out
}

fn check_model(name: &str) {
    let path = real_model(name);
    let fx: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tokenize.json")).unwrap(),
    )
    .unwrap();
    let want_sha = fx["models"][name]["sha256"].as_str().unwrap();
    let got_sha = format!("{:x}", Sha256::digest(std::fs::read(&path).unwrap()));
    assert_eq!(got_sha, want_sha, "{path} is not the file the fixture was made from");
    let mut n = 0;
    for case in fx["cases"].as_array().unwrap().iter().filter(|c| c["model"] == name) {
        let text = case["text"].as_str().unwrap();
        let flags: Vec<&str> = case["flags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        let mut args = vec!["tokenize", "-m", &path, "-p", text];
        args.extend(&flags);
        let o = cli(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let want = base64_decode(case["stdout_b64"].as_str().unwrap());
        assert!(
            o.stdout == want,
            "{name} {text:?} {flags:?}:\nours:\n{}\nllama-tokenize:\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&want)
        );
        n += 1;
    }
    assert_eq!(n, 20, "five texts times four flag sets");
}

#[test]
fn smollm2_matches_llama_tokenize() {
    check_model("smollm2");
}

#[test]
fn gemma3_matches_llama_tokenize() {
    check_model("gemma3");
}

#[test]
fn base64_decoder_round_trips_known_values() {
    // RFC 4648 test vectors.
    assert_eq!(base64_decode("Zm9vYmFy"), b"foobar");
    assert_eq!(base64_decode("Zm9vYg=="), b"foob");
    assert_eq!(base64_decode("Zm9vYmE="), b"fooba");
}

#[test]
fn tokenize_errors_are_one_line() {
    assert_one_line_error(
        &cli(["tokenize", "-m", "/no/such/model.gguf", "-p", "hi"]),
        "/no/such/model.gguf: no such file",
    );
    let dir = TempDir::new("tokenize-err");
    let text = dir.path("notes.txt");
    std::fs::write(&text, "not a model").unwrap();
    assert_one_line_error(
        &cli([
            "tokenize".as_ref(),
            "-m".as_ref(),
            text.as_os_str(),
            "-p".as_ref(),
            "hi".as_ref(),
        ]),
        "not a GGUF file",
    );
}
