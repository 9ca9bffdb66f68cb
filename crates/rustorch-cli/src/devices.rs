//! `devices`: what the executor sees on this machine.

use crate::error::CliError;
use crate::format;
use rustorch_core::device::{cpu_features, cpu_name};
use rustorch_core::quant::matmul::Isa;
use rustorch_core::Executor;

/// Backends this build contains. The CPU backend is always built; GPU
/// backends will be listed here as cargo features add them.
const COMPILED_BACKENDS: &[&str] = &["cpu"];

pub fn run() -> Result<(), CliError> {
    let exec = Executor::global();
    println!("backends compiled in: {}", COMPILED_BACKENDS.join(", "));
    println!("cpu: {}", cpu_name());
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let physical = crate::threads::physical_cores().map_or("unknown".to_string(), |p| p.to_string());
    println!(
        "cpu threads: {logical} logical, {physical} physical cores; default -t {}",
        crate::threads::default_threads()
    );
    let features = cpu_features();
    println!(
        "cpu features: {}",
        if features.is_empty() {
            "(none detected)".to_string()
        } else {
            features.join(" ")
        }
    );
    // The level the quantized products run at: AMX only where the CPU has
    // it and the OS granted the tile state (RUSTORCH_QUANT_ISA caps it).
    println!("quantized kernels: {}", Isa::detected());
    println!("{}", order_line());
    println!();
    for report in exec.device_reports() {
        let cap = &report.capability;
        let status = match &report.disabled {
            None => "in use".to_string(),
            Some(why) => format!("disabled: {why}"),
        };
        println!("{}: {} ({status})", report.device, cap.name);
        println!("  memory    {}", memory(cap.total_memory, cap.free_memory));
        let dtypes: Vec<String> = cap.dtypes.iter().map(|d| d.to_string()).collect();
        println!("  dtypes    {}", dtypes.join(" "));
        let classes: Vec<String> = cap.op_classes.iter().map(|c| format!("{c:?}")).collect();
        println!("  ops       {}", classes.join(", "));
        if !cap.features.is_empty() {
            println!("  features  {}", cap.features.join(" "));
        }
        println!();
    }
    let chain: Vec<String> = exec.devices().iter().map(|d| d.to_string()).collect();
    println!("dispatch order: {}", chain.join(" -> "));
    let config = exec.config();
    if let Some(d) = config.preferred_device {
        println!("preferred device: {d} (RUSTORCH_DEVICE)");
    }
    println!(
        "offload threshold: ops under {} output elements stay on the CPU unless their inputs live elsewhere",
        config.min_offload_elems
    );
    Ok(())
}

/// Whose arithmetic the quantized products reproduce, and why.
fn order_line() -> String {
    use rustorch_core::quant::matmul::{ggml_order, GgmlOrder};
    let order = ggml_order();
    let name = match order {
        GgmlOrder::Amx => "amx (llama.cpp built with AMX)",
        GgmlOrder::Reference => "reference (llama.cpp's plain CPU build)",
    };
    let why = if std::env::var_os("RUSTORCH_GGML_ORDER").is_some() {
        "set by RUSTORCH_GGML_ORDER"
    } else if order == GgmlOrder::Amx {
        "this CPU has AMX-INT8, as a native llama.cpp build there uses; RUSTORCH_GGML_ORDER=reference for the plain build's"
    } else {
        "this CPU has no AMX; RUSTORCH_GGML_ORDER=amx for that build's"
    };
    format!("llama.cpp order: {name}: {why}")
}

fn memory(total: Option<u64>, free: Option<u64>) -> String {
    match (total, free) {
        (Some(t), Some(f)) => format!("{} total, {} free", format::bytes(t), format::bytes(f)),
        (Some(t), None) => format!("{} total", format::bytes(t)),
        (None, Some(f)) => format!("{} free", format::bytes(f)),
        (None, None) => "unknown".to_string(),
    }
}
