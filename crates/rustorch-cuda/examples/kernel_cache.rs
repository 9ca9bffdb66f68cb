//! Fills the kernel cache (`$RUSTORCH_CUDA_CACHE`, see `compile.rs`) with
//! the machine code of every kernel module for one architecture, without a
//! GPU: a device session then loads them at its first start instead of
//! spending a minute or more of device time in NVRTC. The cache key holds
//! NVRTC's version, so build with the NVRTC the device has (its CUDA
//! toolkit's version, from the `nvidia-cuda-nvrtc` wheel of that version):
//! another version only misses the cache, it never loads wrong code.
//!
//! RUSTORCH_CUDA_CACHE=DIR cargo run -p rustorch-cuda --example kernel_cache -- [sm_90]

use rustorch_cuda::compile::{cache_dir, compile_cubin, nvrtc_version};
use rustorch_cuda::KERNEL_SOURCES;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sm = std::env::args().nth(1).unwrap_or_else(|| "sm_90".into());
    let (major, minor) = nvrtc_version()?;
    let dir = cache_dir().ok_or("no cache folder: set RUSTORCH_CUDA_CACHE")?;
    let t0 = std::time::Instant::now();
    // One thread per module, as the backend's load_all_kernels does.
    let results: Vec<(&str, Result<usize, String>)> = std::thread::scope(|s| {
        let jobs: Vec<_> = KERNEL_SOURCES
            .iter()
            .map(|(name, src)| (*name, s.spawn(|| compile_cubin(name, src, &sm).map(|c| c.len()))))
            .collect();
        jobs.into_iter()
            .map(|(n, j)| (n, j.join().unwrap_or_else(|_| Err("compile thread panicked".into()))))
            .collect()
    });
    let mut failed = false;
    for (name, r) in &results {
        match r {
            Ok(bytes) => println!("{name}: {bytes} bytes"),
            Err(e) => {
                failed = true;
                eprintln!("{name}: {e}");
            }
        }
    }
    println!(
        "NVRTC {major}.{minor}, {sm}: {} modules in {} in {:.1} s",
        results.len(),
        dir.display(),
        t0.elapsed().as_secs_f64()
    );
    if failed {
        return Err("some modules did not compile".into());
    }
    Ok(())
}
