//! The `rustorch-cli` binary end to end: argument handling, `info`,
//! `devices`, `quantize`, generation and their error messages.

mod common;

use common::{
    assert_one_line_error, cli, cli_with_stdin, note_llamacpp_fixtures_cpu, real_model, stderr, stdout, write_model,
    TempDir,
};
use rustorch::gguf::Gguf;
use rustorch::quant::QType;

#[test]
fn generation_errors_are_one_line() {
    let o = cli::<[&str; 0], &str>([]);
    assert_one_line_error(
        &o,
        "no prompt given: pass -p PROMPT (and -m MODEL.gguf, or nothing for the default model)",
    );
    let o = cli(["-m", "/no/such/model.gguf", "-p", "hello"]);
    assert_one_line_error(&o, "/no/such/model.gguf: no such file");
    let dir = TempDir::new("gen-errors");
    let not_gguf = dir.path("notes.txt");
    std::fs::write(&not_gguf, "hello").unwrap();
    let o = cli(["-m", not_gguf.to_str().unwrap(), "-p", "hello"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not a GGUF file"), "{}", stderr(&o));
    let o = cli(["-m", not_gguf.to_str().unwrap(), "-p", "hello", "-b", "cuda"]);
    assert_one_line_error(
        &o,
        if cfg!(feature = "cuda") {
            "backend 'cuda': no CUDA driver (libcuda.so.1 not found): no NVIDIA GPU here"
        } else {
            "backend 'cuda': this build of rustorch-cli has no CUDA support (build it with its default features, or --features cuda)"
        },
    );
    let o = cli(["-m", not_gguf.to_str().unwrap(), "-p", "hello", "-b", "tpu"]);
    assert_one_line_error(
        &o,
        "unknown backend 'tpu'; choose cpu, cuda, cuda:N, metal, vulkan, opencl or auto",
    );
}

/// Greedy generation on the real SmolLM2 model prints llama.cpp's greedy continuation (the
/// llama.cpp fixture of crates/rustorch-llm, prompt 0, whose 64 tokens the runtime reproduces;
/// llama.cpp's output on the CPU the fixture records, with a note when this one differs).
#[test]
fn greedy_generation_prints_llama_cpp_continuation() {
    let model = real_model("smollm2");
    note_llamacpp_fixtures_cpu();
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../rustorch-llm/tests/fixtures/llamacpp/smollm2-q4_1.json"
    );
    let fx: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    let case = &fx["prompts"][0];
    let prompt = case["text"].as_str().unwrap();
    let n = 16;
    let ids: Vec<u32> = case["greedy"].as_array().unwrap()[..n]
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let tok = rustorch_llm::Tokenizer::from_gguf(&Gguf::open(&model).unwrap()).unwrap();
    assert!(
        ids.iter().all(|&i| !tok.is_eog(i)),
        "the reference continuation must not end early"
    );
    let want = String::from_utf8(tok.detokenize(&ids, false, false)).unwrap();
    // The fixture is llama.cpp without flash attention.
    let o = cli([
        "-m", &model, "-p", prompt, "-n", "16", "--temp", "0", "-t", "2", "-fa", "off",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("{want}\n"));
    let err = stderr(&o);
    assert!(
        err.contains("tokens/s") && err.contains("load"),
        "no timing summary:\n{err}"
    );
}

/// A reply cut short by a full context says so (llama.cpp without context shifting stops the
/// same way), and a prompt that does not fit is a one-line error.
#[test]
fn a_full_context_is_said() {
    let model = real_model("smollm2");
    let o = cli([
        "-m",
        &model,
        "-p",
        "Once upon a time",
        "-n",
        "100",
        "-c",
        "16",
        "--temp",
        "0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the context of 16 tokens is full (raise -c)"),
        "{}",
        stderr(&o)
    );
    let o = cli([
        "-m",
        &model,
        "-p",
        "Once upon a time",
        "-n",
        "4",
        "-c",
        "64",
        "--temp",
        "0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("is full"), "{}", stderr(&o));
    let o = cli([
        "-m",
        &model,
        "-p",
        "Once upon a time there was a prompt longer than its context",
        "-c",
        "8",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("which does not fit a context of 8 (raise -c)"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn help_lists_the_subcommands() {
    let o = cli(["--help"]);
    assert!(o.status.success());
    let out = stdout(&o);
    for word in ["info", "devices", "quantize", "--model", "--prompt"] {
        assert!(out.contains(word), "{word} missing from --help:\n{out}");
    }
    let o = cli(["quantize", "--help"]);
    assert!(stdout(&o).contains("Q4_K_M") && stdout(&o).contains("--threads"));
}

#[test]
fn bad_arguments_are_usage_errors() {
    let o = cli(["info"]);
    assert_eq!(o.status.code(), Some(2), "clap's usage error code");
    assert!(stderr(&o).contains("FILE"));
    let o = cli(["bogus"]);
    assert!(!o.status.success());
}

#[test]
fn info_prints_metadata_tensors_and_type_summary() {
    let dir = TempDir::new("info");
    let path = write_model(&dir, "tiny_tied");
    let o = cli([&path]);
    // A bare path is not a subcommand.
    assert!(!o.status.success());

    let o = cli(["info".as_ref(), path.as_os_str()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let g = Gguf::open(&path).unwrap();
    assert!(out.contains("version 3, alignment 32"), "{out}");
    assert!(out.contains(&format!("data section at offset {}", g.data_offset())));
    assert!(out.contains(&format!("metadata ({} entries)", g.metadata().len())));
    // Long arrays are summarized: type, length, first entries.
    let tokens = out
        .lines()
        .find(|l| l.trim_start().starts_with("tokenizer.ggml.tokens"))
        .unwrap();
    assert!(tokens.contains("string[96]"), "{tokens}");
    assert!(
        tokens.contains(r#"["tok0", "tok1", "tok2", "tok3", "tok4", ... (96 items)]"#),
        "{tokens}"
    );
    assert!(out.contains("llama.block_count"));

    // The tensor table: every tensor, columns aligned under the header.
    let lines: Vec<&str> = out.lines().collect();
    let head = lines.iter().position(|l| l.trim_start().starts_with("name ")).unwrap();
    let type_col = lines[head].find("type").unwrap();
    let shape_col = lines[head].find("shape").unwrap();
    let rows = &lines[head + 1..head + 1 + g.tensors().len()];
    for (row, t) in rows.iter().zip(g.tensors()) {
        assert!(row.trim_start().starts_with(t.name()), "{row}");
        assert!(row[type_col..].starts_with(t.qtype().name()), "{row}");
        let dims = t.dims().iter().map(u64::to_string).collect::<Vec<_>>().join(" x ");
        assert!(row[shape_col..].starts_with(&dims), "{row}");
        assert!(row.trim_end().ends_with(&t.n_bytes().to_string()), "{row}");
        assert!(row.contains(&format!(" {} ", t.offset())), "{row}");
    }

    // Per-type summary: counts and bytes add up to the table's.
    for q in [QType::F32, QType::BF16] {
        let n = g.tensors().iter().filter(|t| t.qtype() == q).count();
        let bytes: usize = g.tensors().iter().filter(|t| t.qtype() == q).map(|t| t.n_bytes()).sum();
        let pct = bytes as f64 * 100.0 / g.as_bytes().len() as f64;
        let row = lines
            .iter()
            .rev()
            .find(|l| l.trim_start().starts_with(&format!("{} ", q.name())))
            .unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[1], n.to_string(), "{row}");
        assert_eq!(cells[3], bytes.to_string(), "{row}");
        assert_eq!(cells.last().unwrap(), &format!("{pct:.2}"), "{row}");
    }
}

#[test]
fn info_errors_are_one_line() {
    let dir = TempDir::new("info-err");
    let missing = dir.path("missing.gguf");
    assert_one_line_error(&cli(["info".as_ref(), missing.as_os_str()]), "missing.gguf");
    let text = dir.path("notes.txt");
    std::fs::write(&text, "hello, not a model").unwrap();
    assert_one_line_error(&cli(["info".as_ref(), text.as_os_str()]), "not a GGUF file");
}

#[test]
fn devices_lists_the_cpu() {
    let o = cli(["devices"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    if cfg!(feature = "cuda") {
        // The default build links the CUDA backend; without a GPU it says why
        // there is no device, and the CPU runs everything.
        assert!(out.contains("backends compiled in: cuda, cpu"), "{out}");
        if !std::path::Path::new("/dev/nvidiactl").exists() {
            assert!(out.contains("cuda: no device ("), "{out}");
        }
    } else {
        assert!(out.contains("backends compiled in: cpu"), "{out}");
    }
    assert!(out.contains("cpu features:"), "{out}");
    // One of the levels of `Isa`, by name.
    let isa = out
        .lines()
        .find_map(|l| l.strip_prefix("quantized kernels: "))
        .unwrap_or_else(|| panic!("no quantized kernels line: {out}"));
    assert!(["scalar", "avx2", "avx512vnni", "amx"].contains(&isa), "{isa}");
    assert!(out.contains("dispatch order:"), "{out}");
    // The llama.cpp build reproduced, in one line: here the fixtures' (set by
    // `cli`), which is the native build only on a CPU without AMX and
    // AVX512-FP16.
    let build = out
        .lines()
        .find(|l| l.starts_with("llama.cpp build reproduced: "))
        .unwrap_or_else(|| panic!("no llama.cpp build line: {out}"));
    assert!(
        build.contains("order reference") && build.contains("widened"),
        "{build}"
    );
    let flags = common::fixture_cpu::this_cpu_flags();
    let other_than_native =
        flags.contains(&"avx512_fp16") || flags.contains(&"amx_int8") || !flags.contains(&"avx512f");
    assert_eq!(
        build.contains("(not this CPU's native build"),
        other_than_native,
        "{build}"
    );
    // The executor always has its CPU backend, in use.
    assert!(
        out.lines().any(|l| l.starts_with("cpu") && l.ends_with("(in use)")),
        "{out}"
    );
}

#[test]
fn an_unknown_f16_arithmetic_is_a_one_line_error() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_rustorch-cli"))
        .args(["-m", "missing.gguf", "-p", "hi"])
        .env("RUSTORCH_GGML_F16", "fast")
        .output()
        .expect("the binary runs");
    assert_one_line_error(&o, "RUSTORCH_GGML_F16");
}

#[test]
fn quantize_writes_a_model_and_a_summary() {
    let dir = TempDir::new("quantize");
    let input = write_model(&dir, "tiny_tied");
    let out = dir.path("out.gguf");
    let o = cli([
        "quantize".as_ref(),
        input.as_os_str(),
        out.as_os_str(),
        "q8_0".as_ref(),
        "--threads".as_ref(),
        "1".as_ref(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for word in ["input:", "output:", "time:", "Q8_0 x"] {
        assert!(text.contains(word), "{word} missing:\n{text}");
    }
    // ffn_down rows of 176 are not whole 32-blocks: the fallback is noted.
    assert!(
        stderr(&o).contains("blk.0.ffn_down.weight (rows of 176) -> F16"),
        "{}",
        stderr(&o)
    );
    let g = Gguf::open(&out).unwrap();
    assert_eq!(g.get_u32("general.file_type").unwrap(), 7);
    assert_eq!(g.get_u32("general.quantization_version").unwrap(), 2);
    assert_eq!(g.tensor_info("blk.1.attn_q.weight").unwrap().qtype(), QType::Q8_0);
    assert_eq!(g.tensor_info("blk.1.attn_norm.weight").unwrap().qtype(), QType::F32);
    // Metadata is carried over.
    assert_eq!(g.get_str_array("tokenizer.ggml.tokens").unwrap().len(), 96);
}

#[test]
fn quantize_errors_are_one_line() {
    let dir = TempDir::new("quantize-err");
    let input = write_model(&dir, "tiny_tied");
    let out = dir.path("out.gguf");
    let run = |args: &[&std::ffi::OsStr]| {
        let mut v = vec!["quantize".as_ref()];
        v.extend_from_slice(args);
        cli(v)
    };
    let missing = dir.path("missing.gguf");
    assert_one_line_error(
        &run(&[missing.as_os_str(), out.as_os_str(), "Q4_0".as_ref()]),
        "missing.gguf",
    );

    let text = dir.path("notes.txt");
    std::fs::write(&text, "not a model at all").unwrap();
    assert_one_line_error(
        &run(&[text.as_os_str(), out.as_os_str(), "Q4_0".as_ref()]),
        "not a GGUF file",
    );

    let o = run(&[input.as_os_str(), out.as_os_str(), "Q9_9".as_ref()]);
    assert_one_line_error(
        &o,
        "unknown quantization type \"Q9_9\"; choose one of F32, F16, BF16, Q4_0",
    );

    let o = run(&[
        input.as_os_str(),
        out.as_os_str(),
        "Q4_0".as_ref(),
        "--threads".as_ref(),
        "0".as_ref(),
    ]);
    assert_one_line_error(&o, "--threads must be at least 1");

    let o = run(&[input.as_os_str(), input.as_os_str(), "Q4_0".as_ref()]);
    assert_one_line_error(&o, "would overwrite the input");

    // Quantize once, then try again from the quantized file.
    assert!(run(&[input.as_os_str(), out.as_os_str(), "Q4_0".as_ref()])
        .status
        .success());
    let again = dir.path("again.gguf");
    let o = run(&[out.as_os_str(), again.as_os_str(), "Q4_K_M".as_ref()]);
    assert_one_line_error(&o, "the model is already quantized (blk.0.attn_k.weight is Q4_0)");
    assert!(!again.exists(), "nothing is written on error");
}

/// A reader that stops early (`rustorch-cli devices | head -1`) ends the output quietly: no
/// panic from a write to the closed pipe.
#[cfg(unix)]
#[test]
fn a_closed_stdout_is_not_a_panic() {
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_rustorch-cli"))
        .arg("devices")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    // Close the read end before the first line is written.
    drop(child.stdout.take());
    let o = child.wait_with_output().expect("the binary ends");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "stderr: {err}");
}

/// `RUSTORCH_PROFILE=shapes` on a generation: one table on stderr after
/// the timing line, a line per op and input shapes.
#[test]
fn generation_prints_the_op_profile() {
    let dir = TempDir::new("gen-profile");
    let path = write_model(&dir, "tiny_tied");
    let args = [
        "-m",
        path.to_str().unwrap(),
        "-p",
        "tok1 tok2",
        "-n",
        "4",
        "--temp",
        "0",
        "-t",
        "2",
    ];
    let o = cli_with_stdin(args, b"", &[("RUSTORCH_PROFILE", "shapes".as_ref())]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let at = err
        .find("profile (RUSTORCH_PROFILE), prompt and generation:")
        .expect(&err);
    assert!(err[..at].contains("generation "), "{err}");
    let table: Vec<&str> = err[at..].lines().skip(1).take_while(|l| !l.is_empty()).collect();
    // Shapes mode: each op line names its operands' shapes.
    assert!(table.iter().any(|l| l.contains("qmatmul") && l.contains(" [")), "{err}");
    assert!(table.last().unwrap().contains("outside ops, of"), "{err}");
}
