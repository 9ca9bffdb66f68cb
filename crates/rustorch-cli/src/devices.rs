//! `devices`: what the executor sees on this machine.

use crate::error::CliError;
use crate::format;
use rustorch::cpu::host::{cpu_features, cpu_name};
use rustorch::cpu::qmatmul::Isa;
use rustorch::Executor;

pub fn run() -> Result<(), CliError> {
    let exec = Executor::global();
    // The backends linked into this build (`rustorch::registry`), and those
    // that found no device here, with why.
    let names: Vec<&str> = rustorch::registry::providers().iter().map(|p| p.name()).collect();
    println!("backends compiled in: {}", names.join(", "));
    for (name, why) in rustorch::registry::enumerate().unavailable {
        println!("{name}: no device ({why})");
    }
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
    println!("{}", build_line());
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

/// Which llama.cpp CPU build the output reproduces (product order, vector
/// ISA, f16 arithmetic), and whether that is the build `-march=native`
/// makes on this CPU.
fn build_line() -> String {
    use rustorch::cpu::qmatmul::{ggml_order, GgmlOrder};
    use rustorch::cpu::{ggml_half, GgmlHalf};
    let (order, half) = (ggml_order(), ggml_half());
    let kind = match order {
        GgmlOrder::Amx => "its AMX build (clang, ggml-cpu/amx)",
        GgmlOrder::Reference => "its plain CPU build (no AMX)",
    };
    let half_name = match half {
        GgmlHalf::Native => "AVX512-FP16 half-precision f16 steps",
        GgmlHalf::Widened => "f16 steps widened to f32 (no AVX512-FP16)",
    };
    let mut differs = Vec::new();
    if order != GgmlOrder::native() {
        differs.push("order set by RUSTORCH_GGML_ORDER");
    }
    if half != GgmlHalf::native() {
        differs.push("f16 steps set by RUSTORCH_GGML_F16");
    }
    if !cpu_has_avx512() {
        differs.push("this CPU lacks AVX-512, whose native build sums in other lanes");
    }
    let whose = if differs.is_empty() {
        "= llama.cpp built natively on this CPU".to_string()
    } else {
        format!("(not this CPU's native build: {})", differs.join("; "))
    };
    format!(
        "llama.cpp build reproduced: {kind}, AVX-512 arithmetic, {half_name}, order {} {whose}",
        match order {
            GgmlOrder::Amx => "amx",
            GgmlOrder::Reference => "reference",
        }
    )
}

/// Whether llama.cpp's native build here would take GGML's AVX-512 paths,
/// which the CPU backend's arithmetic follows on every CPU.
fn cpu_has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn memory(total: Option<u64>, free: Option<u64>) -> String {
    match (total, free) {
        (Some(t), Some(f)) => format!("{} total, {} free", format::bytes(t), format::bytes(f)),
        (Some(t), None) => format!("{} total", format::bytes(t)),
        (None, Some(f)) => format!("{} free", format::bytes(f)),
        (None, None) => "unknown".to_string(),
    }
}
