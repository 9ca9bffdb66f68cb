//! Large contiguous f32 outputs written with non-temporal (streaming)
//! stores: add, sub, mul and div here, and exp, sigmoid, SiLU and GELU
//! through the AVX-512 kernels of `vecmath`.
//!
//! When an op's data does not stay in the last-level cache, every output
//! line is read from memory before it is overwritten (a read-for-ownership),
//! so `c = a + b` moves four bytes for every three it needs. Streaming
//! stores write whole lines straight to memory: on the 2-core EPYC a
//! 4M-element add went from ~1.0 to ~0.75 ms in a raw loop. For outputs
//! well inside the cache they would only evict a result that the next op is
//! about to read, so smaller ops keep the generic path (`worth_streaming`). (Computing blocks
//! into an L1 buffer and streaming that out, which would cover every op,
//! measured ~2x slower than plain stores: the streamed store must come
//! from the loop that computes.)
//!
//! The element results are those of the generic kernel: one IEEE operation
//! per element, whichever instruction computes it.

use super::par::fill_chunks;
use crate::vecmath::{map_f32_avx512_streamed, simd_level, FastFn, SimdLevel};
use crate::{CpuInput, CpuStorage};
use rustorch_core::dtype::DType;
use rustorch_core::op::{BinaryOp, TensorMeta, UnaryOp};
use std::mem::MaybeUninit;
use std::sync::OnceLock;

/// `u` of `x` with a streamed output, when the op qualifies: a function
/// with an AVX-512 kernel, a contiguous f32 input of the output's shape,
/// an output worth streaming, and AVX-512.
pub(super) fn try_unary(u: UnaryOp, x: CpuInput<'_>, out: &TensorMeta) -> Option<Vec<CpuStorage>> {
    let f = match u {
        UnaryOp::Exp => FastFn::Exp,
        UnaryOp::Sigmoid => FastFn::Sigmoid,
        UnaryOp::Silu => FastFn::Silu,
        UnaryOp::Gelu => FastFn::Gelu,
        _ => return None,
    };
    let x = dense_f32(x, out)?;
    unary_f32(f, x).map(|v| vec![CpuStorage::from_vec(v)])
}

/// `a bop b` with a streamed output, when the op qualifies: add, sub, mul
/// or div of contiguous f32 operands of the output's shape, an output
/// worth streaming, and AVX2 or AVX-512.
pub(super) fn try_binary(bop: BinaryOp, a: CpuInput<'_>, b: CpuInput<'_>, out: &TensorMeta) -> Option<Vec<CpuStorage>> {
    let (x, y) = (dense_f32(a, out)?, dense_f32(b, out)?);
    binary_f32(bop, x, y).map(|v| vec![CpuStorage::from_vec(v)])
}

/// The input's values when it is contiguous f32 of the output's shape and
/// the output is large enough to stream.
fn dense_f32<'a>(x: CpuInput<'a>, out: &TensorMeta) -> Option<&'a [f32]> {
    if x.dtype() != DType::F32 || x.layout.dims() != out.shape.dims() || !worth_streaming(4 * out.shape.numel()) {
        return None;
    }
    Some(&x.storage.as_slice::<f32>()?[x.layout.contiguous_range()?])
}

/// The last-level cache's size in bytes (sysfs), or 32 MiB when unknown.
fn llc_bytes() -> usize {
    static LLC: OnceLock<usize> = OnceLock::new();
    *LLC.get_or_init(|| {
        let base = "/sys/devices/system/cpu/cpu0/cache";
        let mut best = 0usize;
        for i in 0..8 {
            let Ok(s) = std::fs::read_to_string(format!("{base}/index{i}/size")) else {
                continue;
            };
            let s = s.trim();
            let (num, mult) = match s.strip_suffix('K') {
                Some(n) => (n, 1 << 10),
                None => match s.strip_suffix('M') {
                    Some(n) => (n, 1 << 20),
                    None => (s, 1),
                },
            };
            if let Ok(v) = num.parse::<usize>() {
                best = best.max(v * mult);
            }
        }
        if best == 0 {
            32 << 20
        } else {
            best
        }
    })
}

/// Whether an op whose output is `out_bytes` long should stream it: from
/// half the last-level cache on, the output and the inputs it is made
/// from cannot all stay cached until the next op reads them (glibc's
/// memcpy switches to streaming stores at a similar size).
fn worth_streaming(out_bytes: usize) -> bool {
    out_bytes >= llc_bytes() / 2
}

/// `f` over `x` by the AVX-512 kernels in streaming mode, or `None` where
/// the CPU lacks AVX-512.
fn unary_f32(f: FastFn, x: &[f32]) -> Option<Vec<f32>> {
    if simd_level() != SimdLevel::Avx512 {
        return None;
    }
    Some(fill_chunks(x.len(), 1, |start, out| {
        let done = map_f32_avx512_streamed(f, &x[start..start + out.len()], out);
        debug_assert!(done, "AVX-512 was detected");
    }))
}

const ADD: u8 = 0;
const SUB: u8 = 1;
const MUL: u8 = 2;
const DIV: u8 = 3;

#[inline(always)]
fn scalar<const OP: u8>(p: f32, q: f32) -> f32 {
    match OP {
        ADD => p + q,
        SUB => p - q,
        MUL => p * q,
        _ => p / q,
    }
}

/// `a op b` elementwise for equal-length slices, or `None` when the op is
/// not one of add/sub/mul/div or this CPU has no streaming path.
fn binary_f32(bop: BinaryOp, a: &[f32], b: &[f32]) -> Option<Vec<f32>> {
    let level = simd_level();
    if level == SimdLevel::Scalar || a.len() != b.len() {
        return None;
    }
    let chunk = match bop {
        BinaryOp::Add => run::<ADD>,
        BinaryOp::Sub => run::<SUB>,
        BinaryOp::Mul => run::<MUL>,
        BinaryOp::Div => run::<DIV>,
        _ => return None,
    };
    Some(fill_chunks(a.len(), 1, |start, out| {
        let end = start + out.len();
        chunk(level, &a[start..end], &b[start..end], out)
    }))
}

/// One chunk: elements before the output's first 64-byte boundary, then
/// whole vectors streamed, then the rest.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn run<const OP: u8>(level: SimdLevel, x: &[f32], y: &[f32], out: &mut [MaybeUninit<f32>]) {
    let misalign = (out.as_ptr() as usize % 64) / 4;
    let head = ((16 - misalign) % 16).min(out.len());
    for i in 0..head {
        out[i].write(scalar::<OP>(x[i], y[i]));
    }
    let (xs, ys, os) = (&x[head..], &y[head..], &mut out[head..]);
    let streamed = match level {
        // SAFETY: the level was detected at run time; the slices are equally
        // long and the output from `head` on is 64-byte aligned.
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => unsafe { x86::stream512::<OP>(xs, ys, os) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx2 => unsafe { x86::stream256::<OP>(xs, ys, os) },
        _ => 0,
    };
    for i in head + streamed..out.len() {
        out[i].write(scalar::<OP>(x[i], y[i]));
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{ADD, MUL, SUB};
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    /// Streams whole 16-lane vectors; returns how many elements it wrote.
    ///
    /// # Safety
    /// AVX-512 F; `x`, `y` at least `out.len()` long; `out` 64-byte aligned.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn stream512<const OP: u8>(x: &[f32], y: &[f32], out: &mut [MaybeUninit<f32>]) -> usize {
        let n = out.len() / 16 * 16;
        let o = out.as_mut_ptr().cast::<f32>();
        let mut i = 0;
        while i < n {
            // SAFETY: i + 16 <= n <= every slice's length; `o + i` is
            // 64-byte aligned (caller) as `i` is a multiple of 16.
            unsafe {
                let (p, q) = (_mm512_loadu_ps(x.as_ptr().add(i)), _mm512_loadu_ps(y.as_ptr().add(i)));
                let v = match OP {
                    ADD => _mm512_add_ps(p, q),
                    SUB => _mm512_sub_ps(p, q),
                    MUL => _mm512_mul_ps(p, q),
                    _ => _mm512_div_ps(p, q),
                };
                _mm512_stream_ps(o.add(i), v);
            }
            i += 16;
        }
        // Streaming stores are weakly ordered: fence them before the chunk
        // is reported done to the thread that returns the vector.
        _mm_sfence();
        n
    }

    /// Streams whole 8-lane vectors; returns how many elements it wrote.
    ///
    /// # Safety
    /// AVX2; `x`, `y` at least `out.len()` long; `out` 32-byte aligned.
    #[target_feature(enable = "avx2")]
    pub unsafe fn stream256<const OP: u8>(x: &[f32], y: &[f32], out: &mut [MaybeUninit<f32>]) -> usize {
        let n = out.len() / 8 * 8;
        let o = out.as_mut_ptr().cast::<f32>();
        let mut i = 0;
        while i < n {
            // SAFETY: i + 8 <= n <= every slice's length; `o + i` is 32-byte
            // aligned (caller) as `i` is a multiple of 8.
            unsafe {
                let (p, q) = (_mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(y.as_ptr().add(i)));
                let v = match OP {
                    ADD => _mm256_add_ps(p, q),
                    SUB => _mm256_sub_ps(p, q),
                    MUL => _mm256_mul_ps(p, q),
                    _ => _mm256_div_ps(p, q),
                };
                _mm256_stream_ps(o.add(i), v);
            }
            i += 8;
        }
        _mm_sfence();
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every op, at lengths and offsets that exercise the unaligned head,
    /// the streamed body and the tail, against the plain operators.
    #[test]
    fn matches_the_scalar_ops() {
        if simd_level() == SimdLevel::Scalar {
            eprintln!("skipped: no streaming path on this CPU");
            return;
        }
        let a: Vec<f32> = (0..300_000).map(|i| (i as f32 * 0.37).sin() * 100.0).collect();
        let b: Vec<f32> = (0..300_000).map(|i| (i as f32 * 0.11).cos() + 1.5).collect();
        for (bop, f) in [
            (BinaryOp::Add, (|p, q| p + q) as fn(f32, f32) -> f32),
            (BinaryOp::Sub, |p, q| p - q),
            (BinaryOp::Mul, |p, q| p * q),
            (BinaryOp::Div, |p, q| p / q),
        ] {
            for (off, len) in [(0, 300_000 - 3), (3, 299_990), (1, 5), (7, 140_001)] {
                let (x, y) = (&a[off..off + len], &b[..len]);
                let got = binary_f32(bop, x, y).unwrap();
                for i in 0..len {
                    assert_eq!(got[i].to_bits(), f(x[i], y[i]).to_bits(), "{bop:?} at {i}");
                }
            }
        }
        assert!(binary_f32(BinaryOp::Pow, &a, &b).is_none());
    }

    /// The streamed unary kernels give the bits of the plain ones, on an
    /// input whose alignment differs from the output's.
    #[test]
    fn unary_matches_the_plain_kernels() {
        let x: Vec<f32> = (0..300_001).map(|i| (i as f32 * 0.013).sin() * 12.0).collect();
        for f in [FastFn::Exp, FastFn::Sigmoid, FastFn::Silu, FastFn::Gelu] {
            let Some(got) = unary_f32(f, &x[1..]) else {
                eprintln!("skipped: no AVX-512 on this CPU");
                return;
            };
            let mut want = vec![MaybeUninit::<f32>::uninit(); x.len() - 1];
            assert!(crate::vecmath::map_f32_avx512(f, &x[1..], &mut want));
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                // SAFETY: the kernel wrote every element (it returned true).
                let w = unsafe { w.assume_init() };
                assert_eq!(g.to_bits(), w.to_bits(), "{f:?} at {i}");
            }
        }
    }
}
