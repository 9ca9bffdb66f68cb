//! `rustorch-cli bench`: llama-bench's table shape (its header and rule
//! lines are copied from a llama-bench run on this build) and figures that
//! agree with the run's own timings in JSON.

mod common;

use common::{assert_one_line_error, cli, cli_with_stdin, real_model, stderr, stdout, write_model, TempDir};

/// llama-bench's header and rule lines for the default CPU columns
/// (`llama-bench -m SmolLM2 -p 64 -n 16 -r 2 -t 2`, llama.cpp 0.3.36).
const HEADER: &str = "| model                          |       size |     params | backend    | threads |            test |                  t/s |";
const RULE: &str = "| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: |";

#[test]
fn markdown_table_has_llama_bench_shape() {
    let model = real_model("smollm2");
    let o = cli(["bench", "-m", &model, "-p", "8", "-n", "4", "-r", "2", "-t", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert_eq!(lines[0], HEADER);
    assert_eq!(lines[1], RULE);
    // llama-bench's row for this file starts `| llama ... Q4_1 | 92.10 MiB | 134.52 M | CPU | 2 |`
    // (its size and params are the tensors' bytes and elements).
    for (line, test) in lines[2..].iter().zip(["pp8", "tg4"]) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert_eq!(line.chars().count(), HEADER.chars().count(), "{line}");
        assert_eq!(&cells[2..6], ["92.10 MiB", "134.52 M", "CPU", "2"], "{line}");
        assert!(cells[1].starts_with("llama ") && cells[1].ends_with(" Q4_1"), "{line}");
        assert_eq!(cells[6], test);
        let (mean, sd) = cells[7].split_once(" ± ").expect(line);
        let mean: f64 = mean.parse().unwrap();
        let sd: f64 = sd.parse().unwrap();
        assert!(mean > 0.0 && sd >= 0.0, "{line}");
    }
    assert!(stderr(&o).contains("load: "), "{}", stderr(&o));
}

/// Comma-separated sizes, as llama-bench takes them: one row per size, the
/// prompt tests first, in the order given.
#[test]
fn size_lists_give_one_test_each() {
    let model = real_model("smollm2");
    let o = cli(["bench", "-m", &model, "-p", "16,8", "-n", "2,4", "-r", "1", "-t", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let tests: Vec<String> = out
        .lines()
        .skip(2)
        .map(|l| l.split('|').map(str::trim).nth(6).unwrap_or_default().to_string())
        .collect();
    assert_eq!(tests, ["pp16", "pp8", "tg2", "tg4"], "{out}");
}

#[test]
fn json_figures_follow_from_the_samples() {
    let model = real_model("smollm2");
    let o = cli([
        "bench", "-m", &model, "-p", "8", "-n", "4", "-r", "3", "-t", "2", "-o", "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let tests = v.as_array().unwrap();
    assert_eq!(tests.len(), 2);
    for t in tests {
        let n = (t["n_prompt"].as_u64().unwrap() + t["n_gen"].as_u64().unwrap()) as f64;
        let ns: Vec<f64> = t["samples_ns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(ns.len(), 3);
        // Tokens/s per repetition, their mean and sample standard deviation, recomputed here.
        let ts: Vec<f64> = ns.iter().map(|x| n * 1e9 / x).collect();
        let mean = ts.iter().sum::<f64>() / 3.0;
        let sd = (ts.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 2.0).sqrt();
        let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-9);
        // Nanosecond samples are integers: 1e-6 covers their rounding.
        assert!(rel(t["avg_ts"].as_f64().unwrap(), mean) < 1e-6, "{t}");
        assert!((t["stddev_ts"].as_f64().unwrap() - sd).abs() < 1e-6 * mean, "{t}");
        // The tensors' bytes and elements, as the gguf package counts them.
        assert_eq!(t["model_size"], 96_576_768u64);
        assert_eq!(t["model_n_params"], 134_515_008u64);
        assert_eq!(t["n_threads"], 2);
    }
    assert_eq!(tests[0]["test"], "pp8");
    assert_eq!(tests[1]["test"], "tg4");
    // Bytes a generated token reads: every tensor (the embedding is the
    // output matrix too) plus the f16 cache of 30 layers x 3 key/value heads
    // x (64 + 64) at the 1 + 2 + 3 + 4 positions the four steps attend.
    assert!(tests[0]["bytes_per_token"].is_null(), "{}", tests[0]);
    assert_eq!(tests[1]["bytes_per_token"], 96_576_768u64 + 30 * 3 * 128 * 2 * 10 / 4);
    let rate = stderr(&o);
    assert!(
        rate.contains("tg4: 96.6 MB read per token (weights 96.6 MB, KV cache 0.1 MB) at "),
        "{rate}"
    );
}

/// `membw`: the read bandwidth as JSON, and one-line errors.
#[test]
fn membw_measures_and_rejects_bad_flags() {
    let o = cli(["membw", "-t", "1", "--size-mib", "8", "-r", "2", "-o", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["threads"], 1);
    assert_eq!(v["bytes"], 8u64 << 20);
    assert_eq!(v["passes"], 2);
    let gb = v["gb_per_s"].as_f64().unwrap();
    assert!(
        gb > 0.0 && (gb * 1e9 - v["bytes_per_s"].as_f64().unwrap()).abs() < 1.0,
        "{v}"
    );
    let o = cli(["membw", "-t", "1", "--size-mib", "8", "-r", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let line = stdout(&o);
    assert!(
        line.starts_with("memory read bandwidth: ")
            && line.contains("(1 thread, 8 MiB buffer, best of 1 pass at each prefetch distance; best "),
        "{line}"
    );
    assert_one_line_error(&cli(["membw", "--size-mib", "0"]), "--size-mib must be at least 1");
    assert_one_line_error(&cli(["membw", "-r", "0"]), "--passes must be at least 1");
    assert_one_line_error(&cli(["membw", "-o", "xml"]), "unknown output format 'xml'");
}

/// `-d`: each test runs after that many positions, named as llama-bench
/// names it (`llama-bench -d 16 -o json` gives `n_depth`, and its table
/// `pp8 @ d16`).
#[test]
fn depth_runs_carry_llama_bench_names() {
    let model = real_model("smollm2");
    let o = cli([
        "bench", "-m", &model, "-p", "8", "-n", "4", "-d", "16", "-r", "1", "-t", "2", "-o", "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let tests = v.as_array().unwrap();
    let names: Vec<&str> = tests.iter().map(|t| t["test"].as_str().unwrap()).collect();
    assert_eq!(names, ["pp8 @ d16", "tg4 @ d16"]);
    assert!(tests.iter().all(|t| t["n_depth"] == 16), "{v}");
    let o = cli([
        "bench", "-m", &model, "-p", "0", "-n", "4", "-d", "16", "-r", "1", "-t", "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let row = out.lines().nth(2).expect("a table row");
    assert_eq!(row.split('|').map(str::trim).nth(6), Some("tg4 @ d16"), "{out}");
}

#[test]
fn bench_errors_are_one_line() {
    let o = cli(["bench", "-m", "/no/model.gguf", "-o", "xml"]);
    assert_one_line_error(&o, "unknown output format 'xml'; choose md or json");
    let o = cli(["bench", "-m", "/no/model.gguf", "-r", "0"]);
    assert_one_line_error(&o, "--repetitions must be at least 1");
    let o = cli(["bench", "-m", "/no/model.gguf", "-p", "0", "-n", "0"]);
    assert_one_line_error(&o, "nothing to measure");
    let o = cli(["bench", "-m", "/no/model.gguf"]);
    assert_one_line_error(&o, "/no/model.gguf: no such file");
}

/// `RUSTORCH_PROFILE=1`: after each test, a table of its repetitions' op
/// times on stderr (per op, with the time outside ops); the results table
/// on stdout stays as it is.
#[test]
fn profile_tables_follow_each_test() {
    let dir = TempDir::new("bench-profile");
    let model = write_model(&dir, "tiny_tied");
    let model = model.to_str().unwrap();
    let args = ["bench", "-m", model, "-p", "8", "-n", "4", "-r", "2", "-t", "2"];
    let o = cli_with_stdin(args, b"", &[("RUSTORCH_PROFILE", "1".as_ref())]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 4, "{}", stdout(&o));
    let err = stderr(&o);
    for test in ["pp8", "tg4"] {
        let head = format!("profile (RUSTORCH_PROFILE) of {test}, 2 repetitions:");
        let at = err.find(&head).unwrap_or_else(|| panic!("{head:?} not in {err}"));
        let table: Vec<&str> = err[at..].lines().skip(1).take_while(|l| !l.is_empty()).collect();
        assert!(table[0].ends_with("  op"), "{err}");
        assert!(table.iter().any(|l| l.contains("qmatmul")), "{err}");
        assert!(table.iter().any(|l| l.ends_with("all ops")), "{err}");
        assert!(table.last().unwrap().contains("outside ops, of"), "{err}");
    }
    // Without the variable, no table.
    let o = cli(args);
    assert!(
        o.status.success() && !stderr(&o).contains("RUSTORCH_PROFILE"),
        "{}",
        stderr(&o)
    );
    // A value it does not know: a warning naming it, as for the other
    // executor variables, and the run goes on without a profile.
    let o = cli_with_stdin(args, b"", &[("RUSTORCH_PROFILE", "everything".as_ref())]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("RUSTORCH_PROFILE: invalid argument") && err.contains("\"everything\""),
        "{err}"
    );
    assert!(!err.contains("profile (RUSTORCH_PROFILE)"), "{err}");
}
