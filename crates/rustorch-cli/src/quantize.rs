//! `quantize IN OUT TYPE`: converts an F32/F16/BF16 model as
//! `llama-quantize` does. The per-tensor types come from
//! `rustorch_core::quant::mix`; this module reads, converts and writes.

use crate::cli::QuantizeArgs;
use crate::error::CliError;
use crate::format;
use indicatif::{ProgressBar, ProgressStyle};
use rustorch_core::gguf::{Gguf, GgufWriter, TensorInfo, Value};
use rustorch_core::quant::mix::{
    self, FileType, MixOptions, ModelParams, TensorDesc, TypeChoice, QUANTIZATION_VERSION,
};
use rustorch_core::quant::{self, QType};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// Keys llama.cpp drops or rewrites: the quantization keys are set anew
/// (appended last, as `gguf_set_val_u32` does), split keys are removed.
const DROPPED_KEYS: [&str; 5] = [
    "general.quantization_version",
    "general.file_type",
    "split.no",
    "split.count",
    "split.tensors.count",
];

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
    let params = model_params(&g).map_err(|e| in_file(input, e))?;
    let opts = MixOptions {
        pure: args.pure,
        quantize_output_tensor: !args.leave_output_tensor,
        ..MixOptions::default()
    };
    let plan = plan(&g, ftype, &params, &opts).map_err(|e| in_file(input, e))?;

    let total_elems: u64 = plan.iter().map(|(t, _)| t.numel() as u64).sum();
    eprintln!(
        "quantizing {} -> {} as {} (general.file_type {}), {} threads",
        input.display(),
        args.output.display(),
        ftype,
        ftype.id(),
        pool.current_num_threads()
    );
    let start = Instant::now();
    let bar = ProgressBar::new(total_elems);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {percent:>3}% {elapsed_precise} {msg}")
            .expect("the template is a valid indicatif template"),
    );

    let mut w = GgufWriter::new();
    for (key, value) in g.metadata().iter() {
        if !DROPPED_KEYS.contains(&key) {
            w.add_metadata(key, value.clone())?;
        }
    }
    w.add_metadata("general.quantization_version", Value::U32(QUANTIZATION_VERSION))?;
    w.add_metadata("general.file_type", Value::U32(ftype.id()))?;

    let mut out_bytes: BTreeMap<QType, (usize, u64)> = BTreeMap::new();
    for (info, choice) in &plan {
        bar.set_message(format!("{} -> {}", info.name(), choice.qtype));
        let src = g.data_of(info);
        let data: Cow<'_, [u8]> = if choice.qtype == info.qtype() {
            Cow::Borrowed(src)
        } else {
            Cow::Owned(pool.install(|| convert(info, src, choice.qtype))?)
        };
        let e = out_bytes.entry(choice.qtype).or_default();
        e.0 += 1;
        e.1 += data.len() as u64;
        w.add_tensor_bytes(info.name(), choice.qtype, &info.shape(), data)?;
        bar.inc(info.numel() as u64);
    }
    bar.set_message(format!("writing {}", args.output.display()));
    let written = w.write_file(&args.output)?;
    bar.finish_and_clear();
    let elapsed = start.elapsed();

    let fallbacks: Vec<_> = plan.iter().filter(|(_, c)| c.fallback).collect();
    if !fallbacks.is_empty() {
        eprintln!(
            "note: {} tensor(s) have rows that are not whole blocks of the mix's type and took a smaller-block type:",
            fallbacks.len()
        );
        for (t, c) in fallbacks {
            eprintln!("  {} (rows of {}) -> {}", t.name(), t.dims()[0], c.qtype);
        }
    }
    let mut in_bytes: BTreeMap<QType, (usize, u64)> = BTreeMap::new();
    for t in g.tensors() {
        let e = in_bytes.entry(t.qtype()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes() as u64;
    }
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

/// `(tensor, chosen type)` in the order llama.cpp writes tensors, after
/// checking that every conversion is possible.
fn plan<'g>(
    g: &'g Gguf,
    ftype: FileType,
    params: &ModelParams,
    opts: &MixOptions,
) -> Result<Vec<(&'g TensorInfo, TypeChoice)>, CliError> {
    let descs: Vec<TensorDesc<'_>> = g
        .tensors()
        .iter()
        .map(|t| TensorDesc {
            name: t.name(),
            dims: t.dims(),
            qtype: t.qtype(),
        })
        .collect();
    let choices = mix::choose_types(ftype, params, &descs, opts)?;
    let mut plan: Vec<_> = g.tensors().iter().zip(choices).collect();
    plan.sort_by(|a, b| mix::llama_order(a.0.name(), b.0.name()));
    for (t, c) in &plan {
        if c.qtype == t.qtype() {
            continue;
        }
        if t.qtype().is_quantized() {
            return Err(CliError::msg(format!(
                "the model is already quantized ({} is {}); quantize from an F32, F16 or BF16 model",
                t.name(),
                t.qtype()
            )));
        }
        if !matches!(t.qtype(), QType::F32 | QType::F16 | QType::BF16) {
            return Err(CliError::msg(format!(
                "tensor {} is {}, which cannot be converted to {} (only F32, F16 and BF16 can)",
                t.name(),
                t.qtype(),
                c.qtype
            )));
        }
        if !quant::can_quantize(c.qtype) {
            return Err(CliError::msg(format!(
                "tensor {} would need type {}, which this library cannot quantize to",
                t.name(),
                c.qtype
            )));
        }
    }
    Ok(plan)
}

/// F32/F16/BF16 bytes to `to`, through f32 as llama.cpp does. Rows are
/// whole blocks of `to` (the mix's fallback sees to it), so the tensor can
/// be quantized as one run of blocks.
fn convert(info: &TensorInfo, src: &[u8], to: QType) -> Result<Vec<u8>, CliError> {
    let n = info.numel();
    let f32s: Cow<'_, [f32]> = match info.qtype() {
        QType::F32 => {
            let (chunks, _) = src.as_chunks::<4>();
            Cow::Owned(chunks.iter().map(|c| f32::from_le_bytes(*c)).collect())
        }
        from => Cow::Owned(quant::dequantize(from, src, n)?),
    };
    Ok(mix::quantize_like_llama_cpp(to, &f32s)?)
}

/// The hyperparameters the mix rules read, from `{arch}.*` metadata.
pub fn model_params(g: &Gguf) -> Result<ModelParams, CliError> {
    let arch = g
        .get_str("general.architecture")
        .map_err(|_| CliError::msg("no general.architecture in the metadata; is this a model?"))?
        .to_string();
    let n_layer = g.get_usize(&format!("{arch}.block_count"))?;
    let n_head = first_usize(g, &format!("{arch}.attention.head_count"))?.unwrap_or(0);
    let n_head_kv = first_usize(g, &format!("{arch}.attention.head_count_kv"))?.unwrap_or(n_head);
    let n_expert = first_usize(g, &format!("{arch}.expert_count"))?.unwrap_or(0);
    Ok(ModelParams {
        arch,
        n_layer,
        n_head,
        n_head_kv,
        n_expert,
    })
}

/// A count stored as any integer, or per layer as an array (then layer
/// 0's, as llama.cpp's `n_gqa()` reads it). `None` when absent.
fn first_usize(g: &Gguf, key: &str) -> Result<Option<usize>, CliError> {
    let Ok(v) = g.get(key) else {
        return Ok(None);
    };
    let first = match v {
        Value::Array(a) => a.get(0),
        v => Some(v.clone()),
    };
    match first.as_ref().and_then(Value::as_u64_lossless) {
        Some(x) => Ok(Some(x as usize)),
        None => Err(CliError::msg(format!(
            "metadata key {key} is {}, expected a non-negative integer",
            v.type_desc()
        ))),
    }
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
        .num_threads(threads.unwrap_or(0))
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
