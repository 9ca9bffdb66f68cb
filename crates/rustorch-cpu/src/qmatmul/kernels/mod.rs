//! Dot products of one weight row with one activation row, per weight type
//! and instruction-set level.
//!
//! A kernel takes the bytes of one weight row (whole blocks of the weight
//! type) and the bytes of one activation row in the type's dot type
//! (`super::vec_dot_type`) covering the same number of values, and returns
//! their dot product. Each family module answers `kernel(qtype, isa)` for
//! the exact level it implements; `find` falls back to the next lower
//! level, down to the scalar kernel that every type has. Float weights
//! (F32, F16, BF16) take `super::float_path` instead.

use super::Isa;
use rustorch_core::quant::QType;

pub(super) mod kquants;
mod legacy;

pub(crate) use legacy::ActPair;

/// Prefetches into L2 the `step` bytes at `rows + ahead + i * step`: block
/// `i`'s share of the weight rows that follow the ones a matvec kernel is
/// reading (`rows` is the first one's start; the drivers pass consecutive
/// rows, so the following ones lie `ahead` bytes further, one group or
/// more). One sequential stream ahead of the four or eight interleaved row
/// streams read at once, which the hardware prefetchers follow badly from
/// DRAM (generation nearly twice as fast with it; docs/BENCHMARKS.md, issue 5,
/// "What moved these figures"); each call then finds its rows in L2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn prefetch_rows_ahead(rows: *const u8, ahead: usize, i: usize, step: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    let next = rows.wrapping_add(ahead + i * step);
    let mut off = 0;
    while off < step {
        // SAFETY: a prefetch never faults and reads nothing; the address is
        // formed with wrapping arithmetic, so past the matrix's end is fine.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(off).cast()) };
        off += 64;
    }
}

/// # Safety
/// The CPU must support the kernel's instruction-set level, and `w` and `a`
/// must be matching rows: `w` whole blocks of the weight type, `a` the same
/// number of values in the dot type. The driver checks both before calling.
pub(crate) type DotFn = unsafe fn(w: &[u8], a: &[u8]) -> f32;

/// One weight row against four activation rows: `out[r]` is the dot
/// product of `w` with `a[r]`, equal bit for bit to the `DotFn` of the
/// same type and level on that pair. Decoding each weight block once for
/// four rows is what makes batched products faster than matvecs.
///
/// # Safety
/// As `DotFn`, for each of the four activation rows.
pub(crate) type DotRowsFn = unsafe fn(w: &[u8], a: [&[u8]; 4], out: &mut [f32; 4]);

/// Four weight rows against one activation row: `out[r]` is the dot
/// product of `w[r]` with `a`, equal bit for bit to the `DotFn` of the
/// same type and level on that pair (matvecs stream four weight rows at
/// once).
///
/// # Safety
/// As `DotFn`, for each of the four weight rows.
pub(crate) type DotColsFn = unsafe fn(a: &[u8], w: [&[u8]; 4], out: &mut [f32; 4]);

/// Four weight rows against four activation rows: `out[r][i]` is the dot
/// product of `w[r]` with `a[i]`, equal bit for bit to the `DotFn` of the
/// same type and level on that pair (batches). `pairs[k]` holds rows
/// `a[2k]` and `a[2k + 1]` as the level's `PackPairFn` packed them, one
/// `ActPair` per block.
///
/// # Safety
/// As `DotFn`, for each of the sixteen pairs.
pub(crate) type DotTileFn = unsafe fn(w: [&[u8]; 4], a: [&[u8]; 4], pairs: [&[ActPair]; 2], out: &mut [[f32; 4]; 4]);

/// `DotTileFn` for eight activation rows: `out[r][i]` for `a[i]`.
///
/// # Safety
/// As `DotFn`, for each of the 32 pairs.
pub(crate) type DotTile8Fn = unsafe fn(w: [&[u8]; 4], a: [&[u8]; 8], pairs: [&[ActPair]; 4], out: &mut [[f32; 8]; 4]);

/// Packs two activation rows of the same length into `out`, one `ActPair`
/// per block (at most `out.len()` blocks).
///
/// # Safety
/// The CPU must support the level of the tiles it came with.
pub(crate) type PackPairFn = unsafe fn(r0: &[u8], r1: &[u8], out: &mut [ActPair]);

/// A level's batch tiles and the packer of their activation pairs.
#[derive(Clone, Copy)]
pub(crate) struct Tiles {
    pub(crate) tile4: DotTileFn,
    pub(crate) tile8: DotTile8Fn,
    pub(crate) pack: PackPairFn,
}

/// The four-by-four and four-by-eight kernels implemented at exactly this
/// level, if any.
pub(crate) fn exact_tiles(qtype: QType, isa: Isa) -> Option<Tiles> {
    legacy::tile_kernels(qtype, isa)
}

/// The four-weight-row kernel implemented at exactly this level, if any.
pub(crate) fn exact_cols(qtype: QType, isa: Isa) -> Option<DotColsFn> {
    legacy::cols_kernel(qtype, isa).or_else(|| kquants::cols_kernel(qtype, isa))
}

/// The best kernel for `qtype` at or below `isa`, with its level.
pub(crate) fn find(qtype: QType, isa: Isa) -> Option<(Isa, DotFn)> {
    Isa::ALL
        .into_iter()
        .rev()
        .filter(|&level| level <= isa)
        .find_map(|level| exact(qtype, level).map(|k| (level, k)))
}

/// The four-row kernel implemented at exactly this level, if any (the
/// driver pairs it with the `DotFn` that `find` returns at that level).
pub(crate) fn exact_rows(qtype: QType, isa: Isa) -> Option<DotRowsFn> {
    legacy::rows_kernel(qtype, isa).or_else(|| kquants::rows_kernel(qtype, isa))
}

/// The kernel for products of two or more activation rows at exactly this
/// level where llama.cpp uses another order for those than for matvecs
/// (IQ4_NL: tinyBLAS); `None` where the `DotFn` of `find` serves both.
pub(crate) fn batch(qtype: QType, isa: Isa) -> Option<DotFn> {
    legacy::batch_kernel(qtype, isa)
}

/// The kernel implemented at exactly this level, if any.
pub(crate) fn exact(qtype: QType, isa: Isa) -> Option<DotFn> {
    legacy::kernel(qtype, isa).or_else(|| kquants::kernel(qtype, isa))
}
