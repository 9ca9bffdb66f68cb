//! Vectorizable f32 math with SIMD chosen at run time.
//!
//! Hot loops are written once as plain Rust over slices and compiled several
//! times by `simd_dispatch!`: for AVX-512, for AVX2+FMA, and a portable
//! baseline. At run time the widest version this CPU supports is called, so
//! one binary runs on any x86-64 and is fast where it runs. On other
//! architectures the baseline (which LLVM still vectorizes for NEON) runs.

use std::mem::MaybeUninit;
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
mod avx512;
mod special;
pub use special::*;

/// A function with a hand-written AVX-512 kernel (see `map_f32_avx512`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FastFn {
    Exp,
    Sigmoid,
    Silu,
    /// Exact (erf) GELU.
    Gelu,
}

/// Writes `f(x[i])` into `out[i]` for the common length with explicit
/// AVX-512 kernels (faster than the autovectorized `*_f32` functions:
/// `vscalefps` for 2^n, a refined reciprocal for sigmoid; accuracy within
/// the same ulp bounds, tested in `vecmath::tests`).
/// Returns false, writing nothing, where the CPU lacks AVX-512 (or it is
/// disabled by `RUSTORCH_NO_SIMD=1`): the caller then runs the portable
/// code.
#[inline]
pub fn map_f32_avx512(f: FastFn, x: &[f32], out: &mut [MaybeUninit<f32>]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if simd_level() == SimdLevel::Avx512 {
        // SAFETY: the CPU supports AVX-512F (checked above); the kernel
        // stays within both slices.
        unsafe { avx512::map_f32(f, x, out, false) };
        return true;
    }
    let _ = (f, x, out);
    false
}

/// `map_f32_avx512` writing the output with streaming stores, for outputs
/// too large to stay in the cache (see `cpu/elementwise/stream.rs`).
#[inline]
pub fn map_f32_avx512_streamed(f: FastFn, x: &[f32], out: &mut [MaybeUninit<f32>]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if simd_level() == SimdLevel::Avx512 {
        // SAFETY: as in `map_f32_avx512`.
        unsafe { avx512::map_f32(f, x, out, true) };
        return true;
    }
    let _ = (f, x, out);
    false
}

/// Softmax of one contiguous f32 row into `out` (same length) with the
/// AVX-512 kernel: returns false, writing nothing, where the CPU lacks
/// AVX-512 or the lengths differ.
#[inline]
pub fn softmax_row_avx512(x: &[f32], out: &mut [MaybeUninit<f32>]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if simd_level() == SimdLevel::Avx512 && x.len() == out.len() {
        // SAFETY: AVX-512F is available (checked above) and the lengths
        // match, as the kernel requires.
        unsafe { avx512::softmax_row(x, out) };
        return true;
    }
    let _ = (x, out);
    false
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    Scalar,
    Avx2,
    Avx512,
}

/// The widest SIMD level this CPU supports (detected once).
pub fn simd_level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::env::var("RUSTORCH_NO_SIMD").is_ok_and(|v| v == "1") {
                return SimdLevel::Scalar;
            }
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
                return SimdLevel::Avx512;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return SimdLevel::Avx2;
            }
        }
        SimdLevel::Scalar
    })
}

/// Defines `pub fn $name(args) -> ret` that calls the body compiled for the
/// widest SIMD level available. The body must be safe Rust; it is inlined
/// into `#[target_feature]` copies so LLVM vectorizes it for each level.
#[macro_export]
macro_rules! simd_dispatch {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident : $t:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name($($arg: $t),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $t),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
                unsafe fn avx512($($arg: $t),*) $(-> $ret)? { body($($arg),*) }
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn avx2($($arg: $t),*) $(-> $ret)? { body($($arg),*) }
                match $crate::vecmath::simd_level() {
                    // SAFETY: the CPU was checked for these features.
                    $crate::vecmath::SimdLevel::Avx512 => return unsafe { avx512($($arg),*) },
                    $crate::vecmath::SimdLevel::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::vecmath::SimdLevel::Scalar => {}
                }
            }
            body($($arg),*)
        }
    };
}

/// Work to run under the widest SIMD level, for code that is generic over
/// element types or kernels (which `simd_dispatch!` cannot express).
///
/// `run` must be `#[inline(always)]`, and so must everything its hot loops
/// call, so that the whole body is compiled into each `#[target_feature]`
/// copy made by `simd_run`. Closures are avoided on purpose: a closure body is
/// a separate function that LLVM may leave un-inlined and thus unvectorized.
pub trait SimdTask {
    type Output;
    fn run(self) -> Self::Output;
}

/// Runs a task compiled for the widest SIMD level this CPU supports.
#[inline]
pub fn simd_run<T: SimdTask>(task: T) -> T::Output {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
        unsafe fn avx512<T: SimdTask>(t: T) -> T::Output {
            t.run()
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn avx2<T: SimdTask>(t: T) -> T::Output {
            t.run()
        }
        match simd_level() {
            // SAFETY: the CPU was checked for these features.
            SimdLevel::Avx512 => return unsafe { avx512(task) },
            SimdLevel::Avx2 => return unsafe { avx2(task) },
            SimdLevel::Scalar => {}
        }
    }
    task.run()
}

/// e^x for f32, accurate to about 2 ulp over the whole range, written
/// without branches so it vectorizes (Cephes' range reduction and
/// polynomial). Overflows to inf above ~88.72, underflows to 0 below ~-103.9.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let xc = x.clamp(-104.0, 89.0);
    let n = (xc * LOG2E).round();
    let r = xc - n * LN2_HI - n * LN2_LO;
    let r2 = r * r;
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 5e-1);
    let y = p.mul_add(r2, r) + 1.0;
    // 2^n split in two factors so n down to -150 and up to 128 stay exact.
    // n is a whole number in [-150, 128] (or NaN, whose result is replaced
    // below): adding 1.5 * 2^23 puts it in the low mantissa bits, a bit
    // cast that vectorizes where the saturating `n as i32` would not.
    let n = ((n + 12_582_912.0).to_bits() as i32).wrapping_sub(0x4b40_0000);
    let n1 = n / 2;
    let n2 = n - n1;
    let s1 = f32::from_bits(((n1 + 127) as u32) << 23);
    let s2 = f32::from_bits(((n2 + 127) as u32) << 23);
    let out = y * s1 * s2;
    if x.is_nan() {
        x
    } else {
        out
    }
}

simd_dispatch! {
    /// Replaces every element by its exponential.
    pub fn exp_inplace(xs: &mut [f32]) {
        for x in xs.iter_mut() {
            *x = exp_f32(*x);
        }
    }
}

simd_dispatch! {
    /// Sum with 16 independent accumulators (vectorizes; the order of
    /// additions differs from a sequential sum, as in every BLAS).
    pub fn sum_f32(xs: &[f32]) -> f32 {
        let mut acc = [0f32; 16];
        let chunks = xs.chunks_exact(16);
        let rest = chunks.remainder();
        for c in chunks {
            for i in 0..16 {
                acc[i] += c[i];
            }
        }
        let mut s = acc.iter().sum::<f32>();
        for &x in rest {
            s += x;
        }
        s
    }
}

simd_dispatch! {
    /// Maximum (NaN if any element is NaN, -inf for an empty slice).
    pub fn max_f32(xs: &[f32]) -> f32 {
        let mut acc = [f32::NEG_INFINITY; 16];
        let mut nan = false;
        let chunks = xs.chunks_exact(16);
        let rest = chunks.remainder();
        for c in chunks {
            for i in 0..16 {
                acc[i] = if c[i] > acc[i] { c[i] } else { acc[i] };
                nan |= c[i].is_nan();
            }
        }
        let mut m = acc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for &x in rest {
            m = if x > m { x } else { m };
            nan |= x.is_nan();
        }
        if nan { f32::NAN } else { m }
    }
}

simd_dispatch! {
    /// Sum of squares, with 16 accumulators.
    pub fn sum_sq_f32(xs: &[f32]) -> f32 {
        let mut acc = [0f32; 16];
        let chunks = xs.chunks_exact(16);
        let rest = chunks.remainder();
        for c in chunks {
            for i in 0..16 {
                acc[i] = c[i].mul_add(c[i], acc[i]);
            }
        }
        let mut s = acc.iter().sum::<f32>();
        for &x in rest {
            s = x.mul_add(x, s);
        }
        s
    }
}

simd_dispatch! {
    /// Dot product with 16 accumulators.
    pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let mut acc = [0f32; 16];
        let ca = a.chunks_exact(16);
        let cb = b.chunks_exact(16);
        let (ra, rb) = (ca.remainder(), cb.remainder());
        for (x, y) in ca.zip(cb) {
            for i in 0..16 {
                acc[i] = x[i].mul_add(y[i], acc[i]);
            }
        }
        let mut s = acc.iter().sum::<f32>();
        for (x, y) in ra.iter().zip(rb) {
            s = x.mul_add(*y, s);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_std() {
        let mut worst = 0f64;
        let mut x = -103.0f32;
        while x < 88.7 {
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            if want > 1e-37 {
                worst = worst.max(((got - want) / want).abs());
            }
            x += 0.0137;
        }
        assert!(worst < 4e-7, "max relative error {worst}");
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        let mut v: Vec<f32> = (0..100).map(|i| i as f32 * 0.1 - 5.0).collect();
        exp_inplace(&mut v);
        for (i, y) in v.iter().enumerate() {
            assert_eq!(*y, exp_f32(i as f32 * 0.1 - 5.0));
        }
    }

    #[test]
    fn reductions() {
        let v: Vec<f32> = (0..1000).map(|i| (i % 17) as f32 - 8.0).collect();
        let s: f32 = v.iter().sum();
        assert_eq!(sum_f32(&v), s);
        assert_eq!(max_f32(&v), 8.0);
        assert!(max_f32(&[1.0, f32::NAN, 2.0]).is_nan());
        assert_eq!(dot_f32(&v, &v), sum_sq_f32(&v));
    }
}
