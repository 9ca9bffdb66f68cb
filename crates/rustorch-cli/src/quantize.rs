//! `quantize IN OUT TYPE`: converts a model as `llama-quantize` does. The
//! conversion itself is `rustorch_quantize::file::quantize_gguf` (the
//! per-tensor types come from `rustorch_quantize::mix`); this module parses options,
//! drives the progress bar, writes the file and prints the summary.

use crate::cli::QuantizeArgs;
use crate::error::CliError;
use crate::format;
use indicatif::{ProgressBar, ProgressStyle};
use rustorch::gguf::Gguf;
use rustorch::quant::QType;
use rustorch_quantize::file::{self as qfile, QuantizeOptions};
use rustorch_quantize::mix::{FileType, MixOptions};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

pub fn run(args: &QuantizeArgs) -> Result<(), CliError> {
    let ftype = FileType::parse(&args.qtype).ok_or_else(|| {
        let names: Vec<&str> = FileType::ALL.iter().map(|f| f.name()).collect();
        CliError::msg(format!(
            "unknown quantization type {:?}; choose one of {}",
            args.qtype,
            names.join(", ")
        ))
    })?;
    let pool = thread_pool(args.threads)?;
    let input = &args.input;
    if same_file(input, &args.output) {
        return Err(CliError::msg(format!(
            "{}: the output would overwrite the input",
            args.output.display()
        )));
    }
    let g = Gguf::open(input).map_err(|e| in_file(input, e))?;
    let opts = QuantizeOptions {
        mix: MixOptions {
            pure: args.pure,
            quantize_output_tensor: !args.leave_output_tensor,
            ..MixOptions::default()
        },
        allow_requantize: args.allow_requantize,
    };
    // Plan first: a refused conversion fails before the banner and the bar.
    qfile::plan(&g, ftype, &opts).map_err(|e| in_file(input, e))?;

    eprintln!(
        "quantizing {} -> {} as {} (general.file_type {}), {} threads",
        input.display(),
        args.output.display(),
        ftype,
        ftype.id(),
        pool.current_num_threads()
    );
    let start = Instant::now();
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {percent:>3}% {elapsed_precise} {msg}")
            .expect("the template is a valid indicatif template"),
    );
    let out = pool
        .install(|| {
            qfile::quantize_gguf(&g, ftype, &opts, |p| {
                bar.set_length(p.total);
                bar.set_position(p.done);
                bar.set_message(format!("{} -> {}", p.tensor.info.name(), p.tensor.choice.qtype));
            })
        })
        .map_err(|e| in_file(input, e))?;
    bar.set_message(format!("writing {}", args.output.display()));
    let written = out.writer.write_file(&args.output)?;
    bar.finish_and_clear();
    let elapsed = start.elapsed();

    let fallbacks: Vec<_> = out.plan.iter().filter(|p| p.choice.fallback).collect();
    if !fallbacks.is_empty() {
        eprintln!(
            "note: {} tensor(s) have rows that are not whole blocks of the mix's type and took a smaller-block type:",
            fallbacks.len()
        );
        for p in fallbacks {
            eprintln!(
                "  {} (rows of {}) -> {}",
                p.info.name(),
                p.info.dims()[0],
                p.choice.qtype
            );
        }
    }
    let mut in_bytes: BTreeMap<QType, (usize, u64)> = BTreeMap::new();
    for t in g.tensors() {
        let e = in_bytes.entry(t.qtype()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes() as u64;
    }
    let mut out_bytes: BTreeMap<QType, (usize, u64)> = BTreeMap::new();
    for p in &out.plan {
        let e = out_bytes.entry(p.choice.qtype).or_default();
        e.0 += 1;
        e.1 += p
            .choice
            .qtype
            .bytes_for(p.info.numel())
            .expect("the plan only keeps types whose blocks fit the rows") as u64;
    }
    let total_elems: u64 = out.plan.iter().map(|p| p.info.numel() as u64).sum();
    let in_len = g.as_bytes().len() as u64;
    println!("input:  {} {}", format::bytes(in_len), type_counts(&in_bytes));
    println!("output: {} {}", format::bytes(written), type_counts(&out_bytes));
    println!(
        "ratio:  {:.2}x smaller, {:.2} bits per parameter",
        in_len as f64 / written.max(1) as f64,
        out_bytes.values().map(|v| v.1).sum::<u64>() as f64 * 8.0 / total_elems.max(1) as f64
    );
    println!("time:   {:.2} s", elapsed.as_secs_f64());
    Ok(())
}

fn type_counts(m: &BTreeMap<QType, (usize, u64)>) -> String {
    let parts: Vec<String> = m
        .iter()
        .map(|(q, (n, b))| format!("{q} x{n} ({})", format::bytes(*b)))
        .collect();
    format!("[{}]", parts.join(", "))
}

fn thread_pool(threads: Option<usize>) -> Result<rayon::ThreadPool, CliError> {
    if threads == Some(0) {
        return Err(CliError::msg("--threads must be at least 1"));
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or_else(crate::threads::default_threads))
        .build()
        .map_err(|e| CliError::msg(format!("cannot start worker threads: {e}")))
}

fn in_file(path: &Path, e: impl std::fmt::Display) -> CliError {
    let msg = e.to_string();
    // I/O errors already name the file.
    if msg.contains(&path.display().to_string()) {
        CliError::msg(msg)
    } else {
        CliError::msg(format!("{}: {msg}", path.display()))
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}
