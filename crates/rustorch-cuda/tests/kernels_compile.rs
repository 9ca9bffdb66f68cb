//! Every kernel source compiles with NVRTC for sm_80 (A100) and sm_90
//! (H100/H200): a kernel that does not compile fails here, on a machine
//! without a GPU, not in a device session. NVRTC comes from the CUDA
//! toolkit or the `nvidia-cuda-nvrtc` wheel (tools/test.sh installs it and
//! puts its lib/ on LD_LIBRARY_PATH). Where NVRTC is missing the test says
//! so in one line, and fails when `CI` or `RUSTORCH_REQUIRE_NVRTC` is set.

use rustorch_cuda::compile::{compile_uncached, full_source, nvrtc_version};
use rustorch_cuda::KERNEL_SOURCES;

/// NVRTC's version, or `None` after one line saying why the test did not
/// run; where `CI` or `RUSTORCH_REQUIRE_NVRTC` is set, a missing NVRTC fails.
fn nvrtc_or_skip() -> Option<(i32, i32)> {
    match nvrtc_version() {
        Ok(v) => Some(v),
        Err(why) => {
            let required = std::env::var_os("CI").is_some_and(|v| v == "true" || v == "1")
                || std::env::var_os("RUSTORCH_REQUIRE_NVRTC").is_some();
            assert!(!required, "NVRTC is required here: {why}");
            eprintln!("kernels_compile: skipped: {why}");
            None
        }
    }
}

#[test]
fn every_kernel_compiles_for_sm80_and_sm90() {
    let Some(version) = nvrtc_or_skip() else { return };
    let mut failures = Vec::new();
    let mut kernels = 0;
    for (name, src) in KERNEL_SOURCES {
        for arch in ["compute_80", "compute_90"] {
            match compile_uncached(name, &full_source(src), arch) {
                Ok(ptx) => {
                    let ptx = ptx.to_src();
                    kernels += ptx.matches(".entry ").count();
                    if arch == "compute_90" {
                        failures.extend(entries_touching_memory_before_the_wait(name, &ptx));
                    }
                }
                Err(e) => failures.push(e),
            }
        }
    }
    eprintln!(
        "kernels_compile: NVRTC {}.{}: {} modules x 2 architectures, {kernels} kernels",
        version.0,
        version.1,
        KERNEL_SOURCES.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(kernels > 0, "no kernel entry points in the PTX");
}

/// Kernels are launched so that they may start while the kernel before
/// them still runs (src/launch.rs): each must wait for it
/// (`griddepcontrol.wait`, kernels/common.cuh's `rt_kernel_entry`) before
/// it reads or writes global memory. Only reads of weights, which no kernel
/// writes, may come first: prefetches, and loads through the read-only
/// path (`ld.global.nc`: the float products' first weights) or by cp.async into
/// the block's own shared memory (the fused float products'); and, in the
/// decode attention with its RoPE only (`attention_rope_at_joined_*`), the
/// position's load through L2 only (`ld.global.cg`, which leaves nothing in
/// L1 for the read after the wait): a guess, clamped, that aims prefetches
/// and loads whose results are used only where the read after the wait
/// agrees. The entries of `ptx` that break this, one message each.
fn entries_touching_memory_before_the_wait(module: &str, ptx: &str) -> Vec<String> {
    let mut bad = Vec::new();
    for entry in ptx.split(".entry ").skip(1) {
        let name = &entry[..entry.find('(').unwrap_or(0)];
        let Some(wait) = entry.find("griddepcontrol.wait") else {
            bad.push(format!("{module}: kernel {name} never runs rt_kernel_entry"));
            continue;
        };
        let before = &entry[..wait];
        let guesses_position = name.starts_with("attention_rope_at_joined_");
        for access in ["ld.global", "st.global", "atom.", "red.", "ld.shared", "st.shared"] {
            // An instruction, not a substring of another (`cp.async.cg.shared.global`, the
            // weights copied into the block's own shared memory, holds "red.").
            let found = before.lines().any(|l| {
                l.split_whitespace().any(|t| {
                    t.starts_with(access)
                        && !(access == "ld.global"
                            && (t.starts_with("ld.global.nc") || (guesses_position && t.starts_with("ld.global.cg"))))
                })
            });
            if found {
                bad.push(format!("{module}: kernel {name} has {access} before rt_kernel_entry"));
            }
        }
    }
    bad
}

/// NVRTC also makes machine code (what the backend loads, so that the
/// driver need not translate PTX at each start): two small modules to
/// CUBIN for sm_90, checked to be ELF images.
#[test]
fn small_modules_compile_to_machine_code_for_sm90() {
    if nvrtc_or_skip().is_none() {
        return;
    }
    for (name, src) in KERNEL_SOURCES.iter().filter(|(n, _)| ["rope", "index"].contains(n)) {
        let cubin = rustorch_cuda::compile::compile_cubin_uncached(name, &full_source(src), "sm_90")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&cubin[..4], b"\x7fELF", "{name}: not an ELF image");
    }
}
