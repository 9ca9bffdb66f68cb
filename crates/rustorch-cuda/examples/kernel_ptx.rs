//! Writes the PTX of every kernel module (NVRTC, no GPU needed) into a
//! folder, for tools/ptxas_report.sh (registers, spills, shared memory per
//! kernel from `ptxas -v`).
//!
//! cargo run -p rustorch-cuda --example kernel_ptx -- OUT_DIR [compute_90 [MODULE]]

use rustorch_cuda::compile::{compile_uncached, full_source};
use rustorch_cuda::KERNEL_SOURCES;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = std::path::PathBuf::from(args.next().ok_or("usage: kernel_ptx OUT_DIR [ARCH]")?);
    let arch = args.next().unwrap_or_else(|| "compute_90".into());
    // An optional module name: that module only.
    let only = args.next();
    std::fs::create_dir_all(&out)?;
    for (name, src) in KERNEL_SOURCES {
        if only.as_deref().is_some_and(|m| m != *name) {
            continue;
        }
        let ptx = compile_uncached(name, &full_source(src), &arch)?;
        std::fs::write(out.join(format!("{name}.ptx")), ptx.to_src())?;
    }
    Ok(())
}
