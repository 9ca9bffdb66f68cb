//! Timing probes (x86-64 only) of the AMX tile unit for `benches/quant_matmul.rs`
//! (`amx_probe`): how fast the host runs the instructions the tile
//! kernels are made of, alone and in the dependency patterns the kernels
//! have. Each probe runs a loop of `iters` steps and returns false (doing
//! nothing) where AMX is not usable; the bench divides its time per step
//! by `Probe::AddChain`'s (three cycles per step) to get cycles.

use super::amx::{self, tdpbssd, tile_load, tile_store, tile_zero, TileConfig};

/// What one step of a probe's loop does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// One dependent 64-bit `imul` (three cycles on current x86 cores;
    /// chains of adds of constants are folded at rename on some): the
    /// clock, a third of its rate.
    AddChain,
    /// Four independent full-size `tdpbssd` (16 x 16 x 64) into tmm4..7:
    /// the tile unit's throughput.
    Products4,
    /// One `tdpbssd` into the same accumulator each step: its latency.
    ProductChain,
    /// Loads of the two source tiles (1 KiB each, from L1), then four
    /// products reading them: a 2x2 kernel's step without stores.
    LoadProducts4,
    /// Four products, then the four result tiles stored to L1.
    Products4Store,
    /// Zero, four products, four stores, and the stored sums read back by
    /// vector loads a step later: `amx2x2`'s tile half.
    KernelStep,
}

impl Probe {
    pub const ALL: [Probe; 6] = [
        Probe::AddChain,
        Probe::Products4,
        Probe::ProductChain,
        Probe::LoadProducts4,
        Probe::Products4Store,
        Probe::KernelStep,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Probe::AddChain => "imul_chain",
            Probe::Products4 => "products4",
            Probe::ProductChain => "product_chain",
            Probe::LoadProducts4 => "load_products4",
            Probe::Products4Store => "products4_store",
            Probe::KernelStep => "kernel_step",
        }
    }
}

/// Whether the probes that use tiles can run here.
pub fn available() -> bool {
    amx::usable()
}

/// Runs `iters` steps of `probe`; false where it needs AMX and AMX is not
/// usable (`AddChain` always runs).
pub fn run(probe: Probe, iters: u64) -> bool {
    if probe == Probe::AddChain {
        // SAFETY: plain integer arithmetic on a register.
        unsafe { add_chain(iters) };
        return true;
    }
    if !amx::usable() {
        return false;
    }
    #[repr(C, align(64))]
    struct Buf([u8; 8192]);
    let mut buf = Box::new(Buf([1; 8192]));
    // SAFETY: AMX is usable; every tile load and store stays within
    // `buf` (sixteen rows of 64 bytes from offsets below 4 KiB).
    unsafe {
        TileConfig::FULL.load();
        let p = buf.0.as_mut_ptr();
        tile_load!(0, p, 64usize);
        tile_load!(1, p.add(1024), 64usize);
        tile_zero!(4);
        tile_zero!(5);
        tile_zero!(6);
        tile_zero!(7);
        for i in 0..iters {
            match probe {
                Probe::Products4 => {
                    tdpbssd!(4, 0, 1);
                    tdpbssd!(5, 0, 1);
                    tdpbssd!(6, 0, 1);
                    tdpbssd!(7, 0, 1);
                }
                Probe::ProductChain => tdpbssd!(4, 0, 1),
                Probe::LoadProducts4 => {
                    tile_load!(0, p, 64usize);
                    tile_load!(1, p.add(1024), 64usize);
                    tdpbssd!(4, 0, 1);
                    tdpbssd!(5, 0, 1);
                    tdpbssd!(6, 0, 1);
                    tdpbssd!(7, 0, 1);
                }
                Probe::Products4Store => {
                    tdpbssd!(4, 0, 1);
                    tdpbssd!(5, 0, 1);
                    tdpbssd!(6, 0, 1);
                    tdpbssd!(7, 0, 1);
                    tile_store!(4, p.add(4096), 64usize);
                    tile_store!(5, p.add(5120), 64usize);
                    tile_store!(6, p.add(6144), 64usize);
                    tile_store!(7, p.add(7168), 64usize);
                }
                Probe::KernelStep => {
                    // Alternate halves of the result area, as the kernels
                    // alternate their sums buffers.
                    let at = p.add(4096 + (i as usize % 2) * 2048);
                    tile_load!(0, p, 64usize);
                    tile_load!(1, p.add(1024), 64usize);
                    tile_zero!(4);
                    tile_zero!(5);
                    tdpbssd!(4, 0, 1);
                    tdpbssd!(5, 0, 1);
                    tile_store!(4, at, 64usize);
                    tile_store!(5, at.add(1024), 64usize);
                    let back = p.add(4096 + ((i as usize + 1) % 2) * 2048);
                    std::hint::black_box(std::ptr::read_volatile(back.cast::<u64>()));
                }
                Probe::AddChain => unreachable!("handled above"),
            }
        }
        tile_store!(4, p.add(4096), 64usize);
        amx::release();
    }
    std::hint::black_box(&buf);
    true
}

/// `iters` dependent multiplies, unrolled by eight.
///
/// # Safety
/// None beyond x86-64.
unsafe fn add_chain(iters: u64) {
    let mut x: u64 = 3;
    let mut n = iters / 8;
    if n == 0 {
        return;
    }
    // SAFETY: register arithmetic only.
    unsafe {
        std::arch::asm!(
            "2:",
            "imul {x}, {x}", "imul {x}, {x}", "imul {x}, {x}", "imul {x}, {x}",
            "imul {x}, {x}", "imul {x}, {x}", "imul {x}, {x}", "imul {x}, {x}",
            "dec {n}",
            "jnz 2b",
            x = inout(reg) x,
            n = inout(reg) n,
            options(nostack, nomem),
        );
    }
    std::hint::black_box((x, n));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_run_exactly_where_they_can() {
        for probe in Probe::ALL {
            let ran = run(probe, 64);
            let can = probe == Probe::AddChain || available();
            assert_eq!(ran, can, "{}", probe.name());
        }
    }
}
