//! `info FILE`: header, metadata, tensor table and per-type summary.

use crate::cli::InfoArgs;
use crate::error::CliError;
use crate::format::{self, Table};
use rustorch::gguf::{Gguf, Value};
use rustorch::quant::QType;
use std::collections::BTreeMap;

/// Array entries shown before the summary cuts them off.
const SHOWN_ITEMS: usize = 5;
/// Longest scalar string shown in full (chat templates run to kilobytes).
const MAX_STRING: usize = 100;

pub fn run(args: &InfoArgs) -> Result<(), CliError> {
    let g = Gguf::open(&args.file)?;
    print!("{}", render(&args.file.display().to_string(), &g, args.all));
    Ok(())
}

/// The whole report as text.
pub fn render(path: &str, g: &Gguf, all: bool) -> String {
    let file_len = g.as_bytes().len() as u64;
    let mut out = String::new();
    out.push_str(&format!("file:      {path} ({})\n", format::bytes(file_len)));
    out.push_str(&format!(
        "gguf:      version {}, alignment {}, data section at offset {}\n",
        g.version(),
        g.alignment(),
        g.data_offset()
    ));

    out.push_str(&format!("\nmetadata ({} entries):\n", g.metadata().len()));
    let mut meta = Table::new(&[("key", false), ("type", false), ("value", false)]);
    for (key, value) in g.metadata().iter() {
        let (ty, shown) = match value {
            Value::Array(a) => {
                let shown = if all { a.to_string() } else { a.summary(SHOWN_ITEMS) };
                (format!("{}[{}]", a.elem_type(), a.len()), shown)
            }
            v => {
                let s = v.to_string();
                let s = if all { s } else { shorten(&s) };
                (v.value_type().to_string(), s)
            }
        };
        meta.row(vec![key.to_string(), ty, shown]);
    }
    out.push_str(&meta.render(2));

    let tensors = g.tensors();
    let data: u64 = tensors.iter().map(|t| t.n_bytes() as u64).sum();
    let params: u64 = tensors.iter().map(|t| t.numel() as u64).sum();
    out.push_str(&format!(
        "\ntensors ({}, {} parameters, {} of data; shapes in GGUF order, row length first):\n",
        tensors.len(),
        params,
        format::bytes(data)
    ));
    let mut table = Table::new(&[
        ("name", false),
        ("type", false),
        ("shape", false),
        ("offset", true),
        ("bytes", true),
    ]);
    for t in tensors {
        let shape = t.dims().iter().map(u64::to_string).collect::<Vec<_>>().join(" x ");
        table.row(vec![
            t.name().to_string(),
            t.qtype().name().to_string(),
            shape,
            t.offset().to_string(),
            t.n_bytes().to_string(),
        ]);
    }
    out.push_str(&table.render(2));

    let mut by_type: BTreeMap<QType, (usize, u64, u64)> = BTreeMap::new();
    for t in tensors {
        let e = by_type.entry(t.qtype()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes() as u64;
        e.2 += t.numel() as u64;
    }
    out.push_str("\nby type:\n");
    let mut summary = Table::new(&[
        ("type", false),
        ("tensors", true),
        ("parameters", true),
        ("bytes", true),
        ("size", true),
        ("% of file", true),
    ]);
    for (q, (n, bytes, numel)) in &by_type {
        summary.row(vec![
            q.name().to_string(),
            n.to_string(),
            numel.to_string(),
            bytes.to_string(),
            format::bytes(*bytes),
            percent(*bytes, file_len),
        ]);
    }
    let header = g.data_offset();
    summary.row(vec![
        "(header)".to_string(),
        String::new(),
        String::new(),
        header.to_string(),
        format::bytes(header),
        percent(header, file_len),
    ]);
    out.push_str(&summary.render(2));
    if params > 0 {
        out.push_str(&format!(
            "\n{:.2} bits per parameter over the tensor data\n",
            data as f64 * 8.0 / params as f64
        ));
    }
    out
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".to_string();
    }
    format!("{:.2}", part as f64 * 100.0 / whole as f64)
}

/// Cuts long strings to their first `MAX_STRING` characters, on one line.
fn shorten(s: &str) -> String {
    let one_line = s.replace('\n', "\\n");
    let n = one_line.chars().count();
    if n <= MAX_STRING {
        return one_line;
    }
    let head: String = one_line.chars().take(MAX_STRING).collect();
    format!("{head}... ({n} characters)")
}
