//! What this machine offers RusTorch: every device the default executor
//! knows, what each can do, and the order ops try them in.
//!
//!     cargo run -p rustorch --example devices
//!
//! `RUSTORCH_DEVICE`, `RUSTORCH_DISABLE_GPU` and `RUSTORCH_MIN_OFFLOAD`
//! change the answer; a disabled device is listed with the reason.

use rustorch::Executor;

fn main() {
    let exec = Executor::global();
    for report in exec.device_reports() {
        let cap = &report.capability;
        let status = match &report.disabled {
            None => "in use".to_string(),
            Some(why) => format!("disabled: {why}"),
        };
        println!("{}: {} ({status})", report.device, cap.name);
        println!("  memory    {}", memory(cap.total_memory, cap.free_memory));
        println!("  dtypes    {}", list(cap.dtypes.iter()));
        let classes: Vec<String> = cap.op_classes.iter().map(|c| format!("{c:?}")).collect();
        println!("  ops       {}", classes.join(", "));
        if !cap.features.is_empty() {
            println!("  features  {}", cap.features.join(" "));
        }
        println!();
    }

    let chain: Vec<String> = exec.devices().iter().map(|d| d.to_string()).collect();
    println!("chain     {}", chain.join(" -> "));
    let config = exec.config();
    if let Some(d) = config.preferred_device {
        println!("preferred {d} (RUSTORCH_DEVICE)");
    }
    println!(
        "offload   ops under {} output elements stay on the CPU unless their inputs live elsewhere",
        config.min_offload_elems
    );
}

fn list<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    items.map(|x| x.to_string()).collect::<Vec<_>>().join(" ")
}

fn memory(total: Option<u64>, free: Option<u64>) -> String {
    let gib = |b: u64| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64);
    match (total, free) {
        (Some(t), Some(f)) => format!("{} total, {} free", gib(t), gib(f)),
        (Some(t), None) => format!("{} total", gib(t)),
        (None, Some(f)) => format!("{} free", gib(f)),
        (None, None) => "unknown".to_string(),
    }
}
