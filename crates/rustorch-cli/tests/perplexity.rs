//! `rustorch-cli perplexity` against llama-perplexity's figure for the real
//! SmolLM2 Q4_1 model on the GPL-3 text at c=128 (the fixture of
//! crates/rustorch-llm/tests/fixtures/llamacpp, made by
//! tools/gen_llamacpp_fixtures.py; it records the running estimate after
//! each of 16 chunks, so a run over the first 4 chunks compares with its
//! fourth value).

mod common;

use common::{assert_one_line_error, cli, note_llamacpp_fixtures_cpu, real_model, stderr, stdout, TempDir};

const LLAMACPP: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../rustorch-llm/tests/fixtures/llamacpp/smollm2-q4_1.json"
);
const TEXT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../rustorch-llm/tests/fixtures/GPL-3");

/// Relative bound on the perplexity: the 0.5% that tests/llamacpp_model.rs
/// (rustorch-llm) allows the quantized files over 16 chunks. Our quantized
/// kernels do not sum in llama.cpp's exact order, so single chunks differ
/// more (chunk 1 alone: 1.9% today) but the estimate settles as chunks
/// accumulate: 0.15% after 4 chunks, 0.25% after 16.
const PPL_REL: f64 = 0.005;

#[test]
fn smollm2_matches_llama_perplexity() {
    let model = real_model("smollm2");
    note_llamacpp_fixtures_cpu();
    let fx: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(LLAMACPP).unwrap()).unwrap();
    let pp = &fx["perplexity"];
    assert_eq!(pp["ctx"], 128);
    let chunks = 4;
    let theirs = pp["running"][chunks - 1].as_f64().unwrap();

    let o = cli([
        "perplexity",
        "-m",
        &model,
        "-f",
        TEXT,
        "-c",
        "128",
        "--chunks",
        "4",
        "-t",
        "2",
        // The fixture is llama-perplexity with -fa off (tests/flash_attn.rs covers both).
        "-fa",
        "off",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    // llama-perplexity's progress line: `[1]27.6415,[2]29.7164,...`.
    let running: Vec<f64> = lines[0]
        .strip_suffix(',')
        .unwrap()
        .split(',')
        .enumerate()
        .map(|(i, cell)| {
            let (idx, v) = cell.strip_prefix('[').unwrap().split_once(']').unwrap();
            assert_eq!(idx, (i + 1).to_string());
            v.parse().unwrap()
        })
        .collect();
    assert_eq!(running.len(), chunks);
    let rest = lines[1].strip_prefix("Final estimate: PPL = ").expect(lines[1]);
    let (ppl, err) = rest.split_once(" +/- ").unwrap();
    let ppl: f64 = ppl.parse().unwrap();
    let err: f64 = err.parse().unwrap();
    assert_eq!(format!("{ppl:.4}"), format!("{:.4}", running[chunks - 1]));
    assert!(
        (ppl / theirs - 1.0).abs() < PPL_REL,
        "PPL {ppl} is not within {PPL_REL} of llama-perplexity's {theirs}"
    );
    // The uncertainty of 4 x 63 scored tokens: positive and well under the value.
    assert!(err > 0.0 && err < ppl / 2.0, "{err}");
}

#[test]
fn perplexity_errors_are_one_line() {
    let dir = TempDir::new("ppl-err");
    let missing = dir.path("missing.txt");
    let o = cli([
        "perplexity".as_ref(),
        "-m".as_ref(),
        "/no/model.gguf".as_ref(),
        "-f".as_ref(),
        missing.as_os_str(),
    ]);
    assert_one_line_error(&o, "missing.txt");
    let text = dir.path("short.txt");
    std::fs::write(&text, "only a few words").unwrap();
    let o = cli([
        "perplexity".as_ref(),
        "-m".as_ref(),
        "/no/model.gguf".as_ref(),
        "-f".as_ref(),
        text.as_os_str(),
    ]);
    assert_one_line_error(&o, "/no/model.gguf: no such file");
    let o = cli([
        "perplexity".as_ref(),
        "-f".as_ref(),
        text.as_os_str(),
        "-c".as_ref(),
        "2".as_ref(),
    ]);
    assert_one_line_error(&o, "--ctx-size must be at least 4, got 2");
    let o = cli([
        "perplexity".as_ref(),
        "-f".as_ref(),
        text.as_os_str(),
        "-ub".as_ref(),
        "0".as_ref(),
    ]);
    assert_one_line_error(&o, "--batch-size and --ubatch-size must be at least 1");
    let model = real_model("smollm2");
    let o = cli([
        "perplexity".as_ref(),
        "-m".as_ref(),
        model.as_ref(),
        "-f".as_ref(),
        text.as_os_str(),
    ]);
    let err = stderr(&o);
    assert!(!o.status.success());
    let last = err.lines().last().unwrap();
    assert!(
        last.starts_with("error: you need at least 1024 tokens to evaluate perplexity with a context of 512"),
        "{err}"
    );
    assert_eq!(err.lines().filter(|l| l.starts_with("error")).count(), 1, "{err}");
}

/// `--kl-divergence-base` writes llama-perplexity's log-probability file
/// (header, the text's tokens, one 16-bit record per scored position), and
/// `--kl-divergence` reads it back: the same model against its own file
/// differs only by the file's 16-bit rounding, with the same top token
/// everywhere. (Against llama.cpp itself: tools/kld_vs_llamacpp.sh, which
/// found the files byte-identical and the statistics equal.)
#[test]
fn kl_divergence_base_files_round_trip() {
    let model = real_model("smollm2");
    let dir = TempDir::new("kld");
    let base = dir.path("base.kld");
    let common = ["-m", &model, "-c", "128", "-t", "2", "-fa", "off", "-b", "cpu"];
    let mut write = vec!["perplexity", "-f", TEXT, "--chunks", "2", "--kl-divergence-base"];
    write.push(base.to_str().unwrap());
    write.extend(common);
    let o = cli(write);
    assert!(o.status.success(), "{}", stderr(&o));
    let n_vocab = 49152usize;
    let record = 2 * n_vocab.div_ceil(2) + 4;
    let size = std::fs::metadata(&base).unwrap().len() as usize;
    assert_eq!(size, 8 + 12 + 2 * 128 * 4 + 2 * 63 * record * 2);

    let mut read = vec!["perplexity", "--kl-divergence", "--kl-divergence-base"];
    read.push(base.to_str().unwrap());
    read.extend(common);
    let o = cli(read);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let mean_kld: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("Mean    KLD:"))
        .and_then(|v| v.split('±').next())
        .map(|v| v.trim().parse().unwrap())
        .expect(&out);
    assert!(mean_kld.abs() < 1e-4, "{out}");
    assert!(out.contains("Same top p: 100.000 ± 0.000 %"), "{out}");

    // A file that is not one is a one-line error.
    let bad = dir.path("bad.kld");
    std::fs::write(&bad, b"not logits").unwrap();
    let mut read = vec!["perplexity", "--kl-divergence", "--kl-divergence-base"];
    read.push(bad.to_str().unwrap());
    read.extend(common);
    let o = cli(read);
    assert_one_line_error(
        &o,
        &format!(
            "{}: not a llama-perplexity log-probability file: it does not start with _logits_",
            bad.display()
        ),
    );
}
