//! Prints a GGUF file's metadata and tensor table.
//!
//! cargo run --example gguf_info -- FILE [--all]
//!
//! Long arrays show their first entries and their length (`--all` prints
//! them whole). Tensor dims are in GGUF order (ne0, the row length, first),
//! as llama.cpp's tools print them.

use rustorch_core::gguf::{Gguf, Value};
use std::process::ExitCode;

const SHOWN_ITEMS: usize = 8;
const MAX_STRING: usize = 120;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let all = args.iter().any(|a| a == "--all");
    let files: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    if files.is_empty() {
        eprintln!("usage: gguf_info FILE... [--all]");
        return ExitCode::from(2);
    }
    let mut status = ExitCode::SUCCESS;
    for path in files {
        match Gguf::open(path) {
            Ok(g) => print_file(path, &g, all),
            Err(e) => {
                eprintln!("gguf_info: {path}: {e}");
                status = ExitCode::FAILURE;
            }
        }
    }
    status
}

fn print_file(path: &str, g: &Gguf, all: bool) {
    println!(
        "{path}: GGUF v{}, {} bytes, alignment {}, data section at offset {}",
        g.version(),
        g.as_bytes().len(),
        g.alignment(),
        g.data_offset()
    );
    println!("\nmetadata ({} entries):", g.metadata().len());
    let width = g.metadata().keys().map(str::len).max().unwrap_or(0);
    for (key, value) in g.metadata().iter() {
        let shown = match value {
            _ if all => value.to_string(),
            // Arrays are already cut to their first entries.
            Value::Array(a) => a.summary(SHOWN_ITEMS),
            v => shorten(&v.to_string()),
        };
        let ty = match value {
            Value::Array(a) => format!("{}[{}]", a.elem_type(), a.len()),
            v => v.value_type().to_string(),
        };
        println!("  {key:<width$}  {ty:<12} {shown}");
    }

    let tensors = g.tensors();
    let total: usize = tensors.iter().map(|t| t.n_bytes()).sum();
    println!("\ntensors ({}, {} bytes of data):", tensors.len(), total);
    let width = tensors.iter().map(|t| t.name().len()).max().unwrap_or(4).max(4);
    println!(
        "  {:<width$}  {:<7} {:<24} {:>12} {:>12}",
        "name", "type", "dims", "bytes", "offset"
    );
    for t in tensors {
        let dims = t.dims().iter().map(u64::to_string).collect::<Vec<_>>().join(" x ");
        println!(
            "  {:<width$}  {:<7} {:<24} {:>12} {:>12}",
            t.name(),
            t.qtype().name(),
            dims,
            t.n_bytes(),
            t.offset()
        );
    }
}

/// Cuts very long single values (a chat template) to one readable line.
fn shorten(s: &str) -> String {
    if s.chars().count() <= MAX_STRING {
        return s.to_string();
    }
    let head: String = s.chars().take(MAX_STRING).collect();
    format!("{head}... ({} chars)", s.chars().count())
}
