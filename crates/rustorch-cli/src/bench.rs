//! `bench -m MODEL -p 512 -n 128 -r 5`: llama-bench's protocol and its
//! markdown table (tools/llama-bench/llama-bench.cpp).
//!
//! Two kinds of test, each run on an emptied context (sized for the longest
//! prompt plus the longest generation; `-p` and `-n` take comma-separated
//! lists, one test per size, as llama-bench's do):
//! - `ppN`: N random tokens (BOS first when the model adds it) run as
//!   prompt batches of up to 512 (llama-bench's default ubatch), logits of
//!   the last position only;
//! - `tgN`: N tokens decoded one at a time from an empty cache, starting
//!   from BOS (or a random token), each next token random (the speed does
//!   not depend on which token comes).
//!
//! Each test runs once to warm up (the whole prompt for pp, one token for
//! tg, as llama-bench does), then `-r` timed repetitions with the cache
//! cleared before each; a repetition ends when the last logits are read
//! back (all of its GPU work done). The figure is tokens/s per repetition, as mean ±
//! sample standard deviation. With `-d D` each repetition first fills D
//! positions as a prompt (untimed), so that the test runs at that depth
//! (`tg128 @ d1024`), as llama-bench's `-d`.

use crate::cli::BenchArgs;
use crate::error::CliError;
use crate::loader;
use crate::token_reads::TokenReads;
use rustorch::gguf::Gguf;
use rustorch_llm::model::{KvCache, Logits};
use rustorch_llm::Model;
use rustorch_quantize::mix::FileType;
use std::time::{Duration, Instant};

/// Prompt tokens per forward pass (llama-bench's default n_ubatch).
const UBATCH: usize = 512;

struct TestResult {
    name: String,
    n_prompt: usize,
    n_gen: usize,
    n_depth: usize,
    samples: Vec<Duration>,
    /// Bytes a generated token reads (generation tests only: a prompt
    /// batch reads each weight once for many tokens).
    bytes_per_token: Option<f64>,
}

/// llama-bench's test name: `pp512`, `tg128`, `tg128 @ d1024`.
fn test_name(kind: &str, n: usize, depth: usize) -> String {
    if depth == 0 {
        format!("{kind}{n}")
    } else {
        format!("{kind}{n} @ d{depth}")
    }
}

impl TestResult {
    fn tokens_per_s(&self) -> Vec<f64> {
        let n = (self.n_prompt + self.n_gen) as f64;
        self.samples.iter().map(|d| n / d.as_secs_f64().max(1e-12)).collect()
    }
}

/// Mean and sample standard deviation, as llama-bench computes them.
fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() <= 1 {
        return (mean, 0.0);
    }
    let sq: f64 = v.iter().map(|x| x * x).sum();
    let var = sq / (n - 1.0) - mean * mean * n / (n - 1.0);
    (mean, var.max(0.0).sqrt())
}

/// A small deterministic generator for the random token ids (llama-bench
/// uses `std::rand`; which ids come has no effect on the speed).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as u32
    }
}

pub fn run(args: &BenchArgs) -> Result<(), CliError> {
    let json = crate::format::wants_json(&args.output)?;
    if args.repetitions == 0 {
        return Err(CliError::msg("--repetitions must be at least 1"));
    }
    let prompts: Vec<usize> = args.n_prompt.iter().copied().filter(|&n| n > 0).collect();
    let gens: Vec<usize> = args.n_gen.iter().copied().filter(|&n| n > 0).collect();
    if prompts.is_empty() && gens.is_empty() {
        return Err(CliError::msg("nothing to measure: -p and -n are both 0"));
    }
    let path = loader::prepare(&args.model)?;
    let threads = args.model.threads.unwrap_or_else(rayon::current_num_threads);
    // The file's description, read before the model loads: parsing the
    // metadata again after would add its token strings to peak memory.
    let (label, size, params, weight_reads) = {
        let g = Gguf::open(&path).map_err(|e| CliError::msg(format!("{}: {e}", path.display())))?;
        let size: u64 = g.tensors().iter().map(|t| t.n_bytes() as u64).sum();
        let params: u64 = g.tensors().iter().map(|t| t.numel() as u64).sum();
        (model_label(&g, params), size, params, TokenReads::weight_bytes(&g))
    };
    let (model, load_time) = loader::load(&path, &args.model)?;
    let reads = TokenReads::new(weight_reads, model.config());
    eprintln!("load: {:.2} ms", load_time.as_secs_f64() * 1e3);
    let depth = args.n_depth;
    let longest = |sizes: &[usize]| sizes.iter().copied().max().unwrap_or(0);
    let n_ctx = depth + longest(&prompts) + longest(&gens);
    if n_ctx > model.config().n_ctx_train {
        eprintln!(
            "note: {n_ctx} positions exceed the model's training context of {}",
            model.config().n_ctx_train
        );
    }

    let mut rng = Lcg(1);
    let mut results = Vec::new();
    // One cache for both tests, as sized for the longer: a second one,
    // allocated after the first is freed, lands on memory the first left
    // resident and is zeroed there, touching pages the prompt test never
    // used (+3 MB of peak memory for SmolLM2).
    let mut cache = loader::new_cache(&model, args.model.flash_attn, n_ctx)?;
    let kv_bytes = cache.n_bytes();
    for &n_prompt in &prompts {
        cache.clear();
        prompt(&model, &mut cache, n_prompt, &mut rng)?; // warm-up
        let mut samples = Vec::with_capacity(args.repetitions);
        let mut profile = Profile::start(&model);
        for _ in 0..args.repetitions {
            cache.clear();
            fill(&model, &mut cache, depth, &mut rng)?;
            profile.resume();
            let t = Instant::now();
            prompt(&model, &mut cache, n_prompt, &mut rng)?;
            samples.push(t.elapsed());
            profile.pause();
        }
        profile.print(&test_name("pp", n_prompt, depth), &samples);
        results.push(TestResult {
            name: test_name("pp", n_prompt, depth),
            n_prompt,
            n_gen: 0,
            n_depth: depth,
            samples,
            bytes_per_token: None,
        });
    }
    for &n_gen in &gens {
        cache.clear();
        generate(&model, &mut cache, 1, &mut rng)?; // warm-up
        let mut samples = Vec::with_capacity(args.repetitions);
        let mut profile = Profile::start(&model);
        for _ in 0..args.repetitions {
            cache.clear();
            fill(&model, &mut cache, depth, &mut rng)?;
            profile.resume();
            let t = Instant::now();
            generate(&model, &mut cache, n_gen, &mut rng)?;
            samples.push(t.elapsed());
            profile.pause();
        }
        profile.print(&test_name("tg", n_gen, depth), &samples);
        let result = TestResult {
            name: test_name("tg", n_gen, depth),
            n_prompt: 0,
            n_gen,
            n_depth: depth,
            samples,
            bytes_per_token: Some(reads.mean_per_token(n_gen, depth)),
        };
        report_reads(&result, &reads);
        results.push(result);
    }

    // llama-bench's names for where the model ran.
    let backend = if model.placement().offloaded_layers() > 0 {
        "CUDA"
    } else {
        "CPU"
    };
    if json {
        print_json(
            &path.display().to_string(),
            &label,
            backend,
            size,
            params,
            threads,
            load_time,
            kv_bytes,
            &results,
        );
    } else {
        print_markdown(&label, backend, size, params, threads, &results);
    }
    Ok(())
}

/// A generation test's memory traffic on stderr (stdout keeps
/// llama-bench's table): the bytes a token reads at least and the rate
/// that makes at the measured speed, to set against `rustorch-cli membw`.
fn report_reads(r: &TestResult, reads: &TokenReads) {
    let Some(bytes) = r.bytes_per_token else {
        return;
    };
    let (tps, _) = mean_sd(&r.tokens_per_s());
    eprintln!(
        "{}: {:.1} MB read per token (weights {:.1} MB, KV cache {:.1} MB) at {:.2} t/s = {:.2} GB/s",
        r.name,
        bytes / 1e6,
        reads.weights as f64 / 1e6,
        (bytes - reads.weights as f64) / 1e6,
        tps,
        bytes * tps / 1e9
    );
}

/// The executor's op profile (`RUSTORCH_PROFILE`) of one test's timed
/// repetitions: the depth fill between them is left out.
struct Profile<'a> {
    exec: &'a rustorch::Executor,
    /// Op times summed so far, while the profile is paused.
    kept: Vec<rustorch::OpProfile>,
}

impl<'a> Profile<'a> {
    fn start(model: &'a Model) -> Profile<'a> {
        let exec = model.executor();
        exec.clear_profile();
        Profile { exec, kept: Vec::new() }
    }

    /// Continues after `pause` (ops run meanwhile are dropped).
    fn resume(&self) {
        self.exec.clear_profile();
    }

    /// Adds the ops since `resume` to the kept sums.
    fn pause(&mut self) {
        for line in self.exec.profile() {
            match self.kept.iter_mut().find(|k| k.op == line.op) {
                Some(k) => {
                    k.calls += line.calls;
                    k.total += line.total;
                    k.host += line.host;
                }
                None => self.kept.push(line),
            }
        }
    }

    /// The table for test `name`, whose repetitions took `samples`.
    fn print(mut self, name: &str, samples: &[Duration]) {
        if !self.exec.profiling() {
            return;
        }
        self.kept
            .sort_by(|a, b| b.total.cmp(&a.total).then_with(|| a.op.cmp(&b.op)));
        let wall = samples.iter().sum();
        eprintln!(
            "\nprofile (RUSTORCH_PROFILE) of {name}, {} repetitions:\n{}",
            samples.len(),
            rustorch::executor::format_profile(&self.kept, Some(wall))
        );
    }
}

/// `ARCH SIZE FTYPE`, like llama.cpp's model description (`llama 135M Q4_1`).
fn model_label(g: &Gguf, params: u64) -> String {
    let size = if params < 1_000_000_000 {
        format!("{}M", (params as f64 / 1e6).round())
    } else {
        format!("{:.1}B", params as f64 / 1e9)
    };
    let ftype = g
        .metadata()
        .get_u32("general.file_type")
        .ok()
        .and_then(|id| FileType::ALL.into_iter().find(|f| f.id() == id))
        .map_or("?", |f| f.name());
    let arch = g.get_str("general.architecture").unwrap_or("?");
    format!("{arch} {size} {ftype}")
}

fn prompt(model: &Model, cache: &mut KvCache, n: usize, rng: &mut Lcg) -> Result<(), CliError> {
    let tok = model.tokenizer();
    let n_vocab = model.config().n_vocab;
    let mut done = 0;
    model.run_pass(|| {
        let mut logits = None;
        while done < n {
            let len = (n - done).min(UBATCH);
            let batch: Vec<u32> = (0..len)
                .map(|i| match (done + i, tok.add_bos(), tok.bos()) {
                    (0, true, Some(bos)) => bos,
                    _ => rng.below(n_vocab),
                })
                .collect();
            logits = Some(model.forward(cache, &batch, Logits::Last)?);
            done += len;
        }
        read_back(logits)
    })
}

/// The last logits read back, as a caller samples from them (llama-bench
/// synchronizes after each decode): on a GPU a pass is queued work until
/// then, and the clock would stop before the GPU did.
fn read_back(logits: Option<rustorch::Tensor>) -> Result<(), CliError> {
    if let Some(l) = logits {
        l.to_vec::<f32>()?;
    }
    Ok(())
}

/// The untimed prompt of `-d`: `depth` positions, nothing when 0.
fn fill(model: &Model, cache: &mut KvCache, depth: usize, rng: &mut Lcg) -> Result<(), CliError> {
    if depth == 0 {
        return Ok(());
    }
    prompt(model, cache, depth, rng)
}

fn generate(model: &Model, cache: &mut KvCache, n: usize, rng: &mut Lcg) -> Result<(), CliError> {
    let tok = model.tokenizer();
    let n_vocab = model.config().n_vocab;
    let mut next = match (tok.add_bos(), tok.bos()) {
        (true, Some(bos)) => bos,
        _ => rng.below(n_vocab),
    };
    // One team for all the steps, as for a reply (`Model::run_pass`): woken
    // per step, the workers' wake-ups were part of the time.
    model.run_pass(|| {
        let mut logits = None;
        for _ in 0..n {
            logits = Some(model.forward(cache, &[next], Logits::Last)?);
            next = rng.below(n_vocab);
        }
        read_back(logits)
    })
}

fn size_cell(size: u64) -> String {
    if size < 1 << 30 {
        format!("{:.2} MiB", size as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.2} GiB", size as f64 / (1u64 << 30) as f64)
    }
}

fn params_cell(params: u64) -> String {
    if params < 1_000_000_000 {
        format!("{:.2} M", params as f64 / 1e6)
    } else {
        format!("{:.2} B", params as f64 / 1e9)
    }
}

/// llama-bench's markdown printer: fixed widths, negative = left-aligned.
fn print_markdown(label: &str, backend: &str, size: u64, params: u64, threads: usize, results: &[TestResult]) {
    let fields: [(&str, i32); 7] = [
        ("model", -30),
        ("size", 10),
        ("params", 10),
        ("backend", -10),
        ("threads", 7),
        ("test", 15),
        ("t/s", 20),
    ];
    let cell = |w: i32, v: &str| {
        let width = w.unsigned_abs() as usize;
        if w < 0 {
            format!(" {v:<width$} |")
        } else {
            format!(" {v:>width$} |")
        }
    };
    let mut out = String::from("|");
    for (name, w) in fields {
        out.push_str(&cell(w, name));
    }
    out.push_str("\n|");
    for (_, w) in fields {
        let dashes = "-".repeat(w.unsigned_abs() as usize - 1);
        out.push_str(&format!(" {dashes}{} |", if w > 0 { ":" } else { "-" }));
    }
    out.push('\n');
    for r in results {
        let (mean, sd) = mean_sd(&r.tokens_per_s());
        let values = [
            label.to_string(),
            size_cell(size),
            params_cell(params),
            backend.to_string(),
            threads.to_string(),
            r.name.clone(),
            format!("{mean:.2} ± {sd:.2}"),
        ];
        out.push('|');
        for ((_, w), v) in fields.iter().zip(&values) {
            out.push_str(&cell(*w, v));
        }
        out.push('\n');
    }
    print!("{out}");
}

#[allow(clippy::too_many_arguments)] // one per JSON field group; a struct would only rename them
fn print_json(
    file: &str,
    label: &str,
    backend: &str,
    size: u64,
    params: u64,
    threads: usize,
    load: Duration,
    kv_bytes: usize,
    results: &[TestResult],
) {
    let tests: Vec<serde_json::Value> = results
        .iter()
        .map(|r| {
            let ts = r.tokens_per_s();
            let (avg_ts, stddev_ts) = mean_sd(&ts);
            let ns: Vec<f64> = r.samples.iter().map(|d| d.as_nanos() as f64).collect();
            let (avg_ns, stddev_ns) = mean_sd(&ns);
            let bytes_per_token = r.bytes_per_token.map(|b| b.round() as u64);
            serde_json::json!({
                "model_filename": file,
                "model_type": label,
                "model_size": size,
                "model_n_params": params,
                "backend": backend,
                "n_threads": threads,
                "n_prompt": r.n_prompt,
                "n_gen": r.n_gen,
                "n_depth": r.n_depth,
                "test": r.name,
                "load_ms": load.as_secs_f64() * 1e3,
                "kv_bytes": kv_bytes,
                "bytes_per_token": bytes_per_token,
                "avg_ns": avg_ns.round() as u64,
                "stddev_ns": stddev_ns.round() as u64,
                "avg_ts": avg_ts,
                "stddev_ts": stddev_ts,
                "samples_ns": r.samples.iter().map(|d| d.as_nanos() as u64).collect::<Vec<_>>(),
                "samples_ts": ts,
            })
        })
        .collect();
    println!(
        "{}",
        serde_json::to_string_pretty(&tests).expect("JSON values always serialize")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_sample_sd() {
        let (m, s) = mean_sd(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert!((m - 5.0).abs() < 1e-12);
        // Sample variance: 32 / 7.
        assert!((s - (32.0f64 / 7.0).sqrt()).abs() < 1e-12, "{s}");
        assert_eq!(mean_sd(&[3.0]), (3.0, 0.0));
    }
}
