//! Intel AMX (Advanced Matrix Extensions) for the batched products: run-time
//! detection, the OS permission for the tile state, and the few tile
//! instructions the kernels use, as inline assembly (the AMX intrinsics are
//! not stable in Rust).
//!
//! AMX adds eight tile registers (`tmm0..tmm7`, up to 16 rows of 64 bytes)
//! and a matrix unit: `tdpbsud c, a, b` adds to each i32 `c[m][n]` the dot
//! product of row `m` of `a` (signed bytes) with column `n` of `b`
//! (unsigned bytes, stored four consecutive `k` per i32 column: `b[k / 4][4n
//! + k % 4]`). Integer sums are exact, so a kernel may compute them with
//! tiles and keep llama.cpp's f32 order for the rest (`ggml_panel_amx`).
//!
//! Linux keeps the tile data (8 KiB per thread) out of a process's state
//! until the process asks for it with `arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`; a tile instruction before that is a fault. The
//! request is made once, in `usable`, which every caller checks first (via
//! `Isa::Amx.is_available()`); elsewhere AMX is never used.

#[cfg(target_arch = "x86_64")]
use std::sync::OnceLock;

/// Whether this CPU has AMX-TILE and AMX-INT8 and the OS granted this
/// process the tile state; asked once. `RUSTORCH_NO_AMX=1` says no.
pub(super) fn usable() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        static USABLE: OnceLock<bool> = OnceLock::new();
        *USABLE.get_or_init(|| {
            if std::env::var_os("RUSTORCH_NO_AMX").is_some_and(|v| v != "0") {
                return false;
            }
            // (An absent CPUID leaf reads as zeros.)
            cpu_has_amx_int8() && request_tile_state()
        })
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        false
    }
}

/// Whether this CPU has AMX-TILE and AMX-INT8 (CPUID alone: whatever the
/// OS grants and `RUSTORCH_NO_AMX`, which decide only whether the tiles
/// run). llama.cpp built natively for such a CPU multiplies in its AMX
/// buffer, so this picks the default order (`amx_order::ggml_order`).
pub fn cpu_has_amx_int8() -> bool {
    // CPUID leaf 7, sub-leaf 0: EDX bit 24 AMX-TILE, bit 25 AMX-INT8.
    let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
    (leaf7.edx >> 24) & 3 == 3
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: 0 when granted
/// (also when it already was), a negative errno when the kernel does not
/// support AMX or refuses it.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_state() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: a plain Linux system call with two integer arguments; it
    // reads and writes no memory of ours. `syscall` clobbers rcx and r11.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

/// A tile configuration (palette 1): every tile 16 rows of 64 bytes, the
/// shape of every operand the kernels use.
#[cfg(target_arch = "x86_64")]
#[repr(C, align(64))]
pub(super) struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

#[cfg(target_arch = "x86_64")]
impl TileConfig {
    pub(super) const FULL: TileConfig = {
        let mut colsb = [0u16; 16];
        let mut rows = [0u8; 16];
        let mut t = 0;
        while t < 8 {
            colsb[t] = 64;
            rows[t] = 16;
            t += 1;
        }
        TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb,
            rows,
        }
    };

    /// A configuration with `(rows, bytes per row)` for each of `tmm0..tmm7`
    /// (`(0, 0)` for a tile left unused).
    pub(super) const fn with_shapes(shapes: [(u8, u16); 8]) -> TileConfig {
        let mut colsb = [0u16; 16];
        let mut rows = [0u8; 16];
        let mut t = 0;
        while t < 8 {
            rows[t] = shapes[t].0;
            colsb[t] = shapes[t].1;
            t += 1;
        }
        TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb,
            rows,
        }
    }

    /// Loads this configuration into the calling thread's tile state.
    ///
    /// # Safety
    /// `usable()` must have returned true. The thread must call
    /// `release()` before it runs code that does not expect tile state
    /// (keeping it only costs context-switch time, not correctness).
    #[inline]
    pub(super) unsafe fn load(&self) {
        // SAFETY: a 64-byte configuration the caller may load (above).
        unsafe { std::arch::asm!("ldtilecfg [{0}]", in(reg) self as *const TileConfig, options(nostack)) };
    }
}

/// Returns the tile state to its initial (unused) state.
///
/// # Safety
/// `usable()` must have returned true.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(super) unsafe fn release() {
    // SAFETY: forwarded from the caller.
    unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) };
}

/// Tile instructions on fixed registers (tile numbers are part of the
/// encoding). Each is a macro so that the register is a literal.
///
/// `tile_load!(t, ptr, stride)`: rows of 64 bytes from `ptr`, `stride`
/// bytes apart, into `tmm<t>`; `tile_store!(t, ptr, stride)` the reverse;
/// `tile_zero!(t)`; `tdpbsud!(c, a, b)` and `tdpbssd!(c, a, b)`.
///
/// Safety (of each expansion, which must be inside `unsafe`): a
/// configuration from `TileConfig::load` is active on this thread, and the
/// 16 rows of 64 bytes at `ptr + i * stride` are readable (load) or
/// writable (store).
#[cfg(target_arch = "x86_64")]
macro_rules! tile_load {
    ($t:literal, $ptr:expr, $stride:expr) => {
        std::arch::asm!(
            concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"),
            p = in(reg) $ptr,
            s = in(reg) $stride,
            options(nostack, readonly),
        )
    };
}

#[cfg(target_arch = "x86_64")]
macro_rules! tile_store {
    ($t:literal, $ptr:expr, $stride:expr) => {
        std::arch::asm!(
            concat!("tilestored [{p} + {s}*1], tmm", $t),
            p = in(reg) $ptr,
            s = in(reg) $stride,
            options(nostack),
        )
    };
}

#[cfg(target_arch = "x86_64")]
macro_rules! tile_zero {
    ($t:literal) => {
        std::arch::asm!(concat!("tilezero tmm", $t), options(nostack, nomem))
    };
}

/// `c += a (signed bytes) . b (unsigned bytes)`.
#[cfg(target_arch = "x86_64")]
macro_rules! tdpbsud {
    ($c:literal, $a:literal, $b:literal) => {
        std::arch::asm!(
            concat!("tdpbsud tmm", $c, ", tmm", $a, ", tmm", $b),
            options(nostack, nomem)
        )
    };
}

/// `c += a (signed bytes) . b (signed bytes)`.
#[cfg(target_arch = "x86_64")]
macro_rules! tdpbssd {
    ($c:literal, $a:literal, $b:literal) => {
        std::arch::asm!(
            concat!("tdpbssd tmm", $c, ", tmm", $a, ", tmm", $b),
            options(nostack, nomem)
        )
    };
}

#[cfg(target_arch = "x86_64")]
pub(super) use {tdpbssd, tdpbsud, tile_load, tile_store, tile_zero};

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// One tile product against the plain integer sum, both instructions.
    #[test]
    #[allow(clippy::needless_range_loop)]
    fn tile_products_equal_integer_sums() {
        if !usable() {
            eprintln!("skipped: no AMX on this CPU (or the OS did not grant the tile state)");
            return;
        }
        #[repr(C, align(64))]
        struct Tile([[u8; 64]; 16]);
        let mut a = Tile([[0; 64]; 16]);
        let mut b = Tile([[0; 64]; 16]);
        for i in 0..16 {
            for j in 0..64 {
                a.0[i][j] = (i as i32 * 37 - j as i32 * 11) as i8 as u8;
                b.0[i][j] = (i * 7 + j * 13) as u8;
            }
        }
        let mut c = [[[0i32; 16]; 16]; 2];
        // SAFETY: `usable()` said yes; every pointer covers 16 rows of 64 bytes.
        unsafe {
            TileConfig::FULL.load();
            tile_load!(0, a.0.as_ptr(), 64usize);
            tile_load!(1, b.0.as_ptr(), 64usize);
            tile_zero!(4);
            tile_zero!(5);
            tdpbsud!(4, 0, 1);
            tdpbssd!(5, 0, 1);
            tile_store!(4, c[0].as_mut_ptr(), 64usize);
            tile_store!(5, c[1].as_mut_ptr(), 64usize);
            release();
        }
        for m in 0..16 {
            for n in 0..16 {
                let (mut su, mut ss) = (0i32, 0i32);
                for k in 0..64 {
                    let av = a.0[m][k] as i8 as i32;
                    let bv = b.0[k / 4][4 * n + k % 4];
                    su += av * bv as i32;
                    ss += av * bv as i8 as i32;
                }
                assert_eq!((c[0][m][n], c[1][m][n]), (su, ss), "c[{m}][{n}]");
            }
        }
    }
}
