//! `membw [-t N]`: the machine's memory read bandwidth on N threads, the
//! bound of generation speed (see `rustorch::cpu::membw`). `bench` reports
//! the bytes a generated token reads; the two together give the fraction of
//! the bandwidth a generation reaches (bench/compare_llamacpp.sh prints it).

use crate::cli::MembwArgs;
use crate::error::CliError;
use crate::loader;
use rustorch::cpu::membw::measure_read_bandwidth;

pub fn run(args: &MembwArgs) -> Result<(), CliError> {
    let json = crate::format::wants_json(&args.output)?;
    if args.size_mib == 0 {
        return Err(CliError::msg("--size-mib must be at least 1"));
    }
    if args.passes == 0 {
        return Err(CliError::msg("--passes must be at least 1"));
    }
    let bytes = args
        .size_mib
        .checked_mul(1 << 20)
        .ok_or_else(|| CliError::msg(format!("--size-mib {} is too large", args.size_mib)))?;
    loader::set_threads(args.threads.unwrap_or_else(crate::threads::default_threads))?;
    let bw = measure_read_bandwidth(bytes, args.passes).map_err(|e| CliError::msg(e.to_string()))?;
    if json {
        let v = serde_json::json!({
            "threads": bw.threads,
            "bytes": bw.bytes,
            "passes": bw.passes,
            "bytes_per_s": bw.bytes_per_s,
            "gb_per_s": bw.gb_per_s(),
            "prefetch_ahead": bw.prefetch_ahead,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&v).expect("JSON values always serialize")
        );
    } else {
        println!(
            "memory read bandwidth: {:.2} GB/s ({} thread{}, {} MiB buffer, best of {} pass{} at each prefetch distance; best {})",
            bw.gb_per_s(),
            bw.threads,
            if bw.threads == 1 { "" } else { "s" },
            bw.bytes >> 20,
            bw.passes,
            if bw.passes == 1 { "" } else { "es" },
            match bw.prefetch_ahead {
                0 => "with the hardware prefetchers alone".to_string(),
                a => format!("prefetching {} KiB ahead", a >> 10),
            }
        );
    }
    Ok(())
}
