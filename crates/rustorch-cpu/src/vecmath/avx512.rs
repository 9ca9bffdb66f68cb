//! Explicit AVX-512 kernels for the hottest f32 functions: exp, sigmoid,
//! SiLU, exact GELU and the softmax row. (GELU's intrinsics version is no
//! faster than the autovectorized one by itself; it is here so that large
//! outputs can be written with streaming stores, see `map`.)
//!
//! Autovectorized code falls short here for two reasons that intrinsics fix:
//! - division: `vdivps` on 512-bit vectors has a long latency and a low
//!   throughput; these kernels divide with `vrcp14ps` (14 bits) refined by
//!   one FMA correction step, which is accurate to about 1 ulp;
//! - 2^n: `vscalefps` multiplies by 2^n with correct overflow, underflow
//!   and subnormal handling in one instruction, where portable code needs
//!   integer shifts and two multiplies to stay exact over the whole range.
//!
//! Every kernel handles a slice of any length; the tail runs the same
//! vector code on a masked load, so each element's result does not depend
//! on its position (vector body or tail). Callers reach them through the
//! safe wrappers in `vecmath`, which check the CPU first.

use super::special::EXP_S;
use super::FastFn;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 = LN2_HI + LN2_LO; LN2_HI has 9 significant bits, so n * LN2_HI is
/// exact for |n| < 2^15.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// e^x rounds to 0 below this (e^-104.5 < 2^-150), and the range
/// reduction stays exact above it.
const EXP_LO: f32 = -104.5;
/// e^x is +inf above this (e^89 > f32::MAX).
const EXP_HI: f32 = 89.0;

#[inline(always)]
unsafe fn splat(v: f32) -> __m512 {
    _mm512_set1_ps(v)
}

/// Horner evaluation of `c[0] + c[1] x + ...` with FMAs.
#[inline(always)]
unsafe fn horner<const N: usize>(x: __m512, c: &[f32; N]) -> __m512 {
    let mut p = splat(c[N - 1]);
    let mut i = N - 1;
    while i > 0 {
        i -= 1;
        p = _mm512_fmadd_ps(p, x, splat(c[i]));
    }
    p
}

/// e^(a + c) for a in [EXP_LO, EXP_HI] (or NaN) and a small correction
/// |c| < 2^-12: round a log2(e) to n, reduce to r = a - n ln2 + c in
/// [-ln2/2, ln2/2], e^r = 1 + r S(r) (0.8 ulp), then scale by 2^n.
#[inline(always)]
unsafe fn exp_reduced(a: __m512, c: __m512) -> __m512 {
    const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    let n = _mm512_roundscale_ps::<NEAREST>(_mm512_mul_ps(a, splat(LOG2E)));
    let r = _mm512_fnmadd_ps(n, splat(LN2_HI), a);
    let r = _mm512_add_ps(_mm512_fnmadd_ps(n, splat(LN2_LO), r), c);
    let y = _mm512_fmadd_ps(r, horner(r, &EXP_S), splat(1.0));
    _mm512_scalef_ps(y, n)
}

/// Clamps to [lo, hi]; NaN passes through (`vmaxps`/`vminps` return their
/// second operand when either is NaN).
#[inline(always)]
unsafe fn clamp(x: __m512, lo: f32, hi: f32) -> __m512 {
    _mm512_min_ps(splat(hi), _mm512_max_ps(splat(lo), x))
}

/// num / d for d in [1, 2] without `vdivps`: q = num * rcp(d), then one
/// correction q + (num - d q) rcp(d), where num - d q is exact (FMA). The
/// result is within 1 ulp of the quotient.
#[inline(always)]
unsafe fn div_refined(num: __m512, d: __m512) -> __m512 {
    let r = _mm512_rcp14_ps(d);
    let q = _mm512_mul_ps(num, r);
    let e = _mm512_fnmadd_ps(d, q, num);
    _mm512_fmadd_ps(e, r, q)
}

/// -|x|, by setting the sign bit.
#[inline(always)]
unsafe fn neg_abs(x: __m512) -> __m512 {
    _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(x), _mm512_set1_epi32(i32::MIN)))
}

#[inline(always)]
unsafe fn exp_v(x: __m512) -> __m512 {
    exp_reduced(clamp(x, EXP_LO, EXP_HI), _mm512_setzero_ps())
}

/// Logistic sigmoid. With t = e^-|x| in [0, 1] and d = 1 + t in [1, 2],
/// sigmoid(x) = 1/d for x >= 0 and t/d for x < 0, so neither the
/// exponential nor the quotient can overflow, and `div_refined` (cheaper
/// than `vdivps` here: sigmoid runs ~1.5x faster with it) applies. Within
/// 3 ulp; sigmoid(-inf) = 0 (e^-104.5 rounds to 0).
#[inline(always)]
unsafe fn sigmoid_v(x: __m512) -> __m512 {
    let t = exp_reduced(_mm512_max_ps(splat(EXP_LO), neg_abs(x)), _mm512_setzero_ps());
    let d = _mm512_add_ps(splat(1.0), t);
    let neg = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_setzero_ps());
    div_refined(_mm512_mask_mov_ps(splat(1.0), neg, t), d)
}

/// SiLU x / (1 + e^-x), as `special::silu_f32` computes it. Here `vdivps`
/// stays: on Zen 4 it beat a reciprocal with a correction step (which also
/// needs the sign split of `sigmoid_v`). Below -88 the result (under
/// 1e-36 in magnitude) is x * 0 = -0 and silu(-inf) is NaN, as in PyTorch.
#[inline(always)]
unsafe fn silu_v(x: __m512) -> __m512 {
    let zero = _mm512_setzero_ps();
    let a = clamp(_mm512_sub_ps(zero, x), -86.0, 88.0);
    let s = _mm512_div_ps(x, _mm512_add_ps(splat(1.0), exp_reduced(a, zero)));
    let tiny = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, splat(-88.0));
    _mm512_mask_mul_ps(s, tiny, x, zero)
}

/// Exact GELU x Φ(x), as `special::gelu_f32` computes it (within 7 ulp
/// where |x Φ(x)| > 1e-17): Φ(-|x|) = e^{-x^2/2} P(|x|) / Q(|x|) with the
/// exponent split exactly, Φ(x) = 1 - Φ(-x) for x >= 0.
#[inline(always)]
unsafe fn gelu_v(x: __m512) -> __m512 {
    use super::special::{GELU_P, GELU_Q, GELU_XMAX};
    let zero = _mm512_setzero_ps();
    let ax = _mm512_abs_ps(x);
    // `vminps` returns its second operand (ax) when it is NaN.
    let xc = _mm512_min_ps(splat(GELU_XMAX), ax);
    let xh = _mm512_mul_ps(splat(-0.5), xc);
    let a = _mm512_mul_ps(xh, xc);
    let c = _mm512_fmsub_ps(xh, xc, a);
    // Q >= 1 on [0, GELU_XMAX]: the refined reciprocal is within 1 ulp.
    let ratio = div_refined(horner(xc, &GELU_P), horner(xc, &GELU_Q));
    let tail = _mm512_mul_ps(exp_reduced(a, c), ratio);
    let neg = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, zero);
    let phi = _mm512_mask_mov_ps(_mm512_sub_ps(splat(1.0), tail), neg, tail);
    // x * 0 keeps the sign of zero and turns -inf into NaN.
    let far = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, splat(-GELU_XMAX));
    _mm512_mul_ps(x, _mm512_mask_mov_ps(phi, far, zero))
}

/// Applies `f` to `x` into `out` (the shorter length), 16 lanes at a time
/// and the tail masked. With `STREAM`, whole vectors from the output's
/// first 64-byte boundary on are written with streaming stores (for
/// outputs too large to stay cached: no read-for-ownership of the
/// output's lines), then fenced.
#[inline(always)]
unsafe fn map<const STREAM: bool>(x: &[f32], out: &mut [MaybeUninit<f32>], f: impl Fn(__m512) -> __m512) {
    let n = x.len().min(out.len());
    let (xp, op) = (x.as_ptr(), out.as_mut_ptr() as *mut f32);
    let mut i = 0;
    if STREAM {
        // Streaming stores need aligned lines: an unaligned head first
        // (masked, like the tail).
        let head = ((16 - (op as usize % 64) / 4) % 16).min(n);
        if head > 0 {
            let k: __mmask16 = (1u16 << head) - 1;
            _mm512_mask_storeu_ps(op, k, f(_mm512_maskz_loadu_ps(k, xp)));
            i = head;
        }
    }
    let store = |p: *mut f32, v: __m512| {
        if STREAM {
            _mm512_stream_ps(p, v)
        } else {
            _mm512_storeu_ps(p, v)
        }
    };
    while i + 32 <= n {
        // Two vectors per step: independent chains hide FMA latency.
        let a = f(_mm512_loadu_ps(xp.add(i)));
        let b = f(_mm512_loadu_ps(xp.add(i + 16)));
        store(op.add(i), a);
        store(op.add(i + 16), b);
        i += 32;
    }
    while i < n {
        let k: __mmask16 = if n - i >= 16 { 0xffff } else { (1u16 << (n - i)) - 1 };
        let v = f(_mm512_maskz_loadu_ps(k, xp.add(i)));
        _mm512_mask_storeu_ps(op.add(i), k, v);
        i += 16;
    }
    if STREAM {
        // Streaming stores are weakly ordered: fence them before the
        // caller reports the chunk done.
        _mm_sfence();
    }
}

/// # Safety
/// The CPU must support AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn map_f32(f: FastFn, x: &[f32], out: &mut [MaybeUninit<f32>], stream: bool) {
    // SAFETY (all arms): `map` reads and writes within both slices'
    // common length, and the caller guarantees AVX-512F.
    macro_rules! go {
        ($k:ident) => {
            if stream {
                map::<true>(x, out, |v| $k(v))
            } else {
                map::<false>(x, out, |v| $k(v))
            }
        };
    }
    match f {
        FastFn::Exp => go!(exp_v),
        FastFn::Sigmoid => go!(sigmoid_v),
        FastFn::Silu => go!(silu_v),
        FastFn::Gelu => go!(gelu_v),
    }
}

/// Softmax of one row: the maximum, then e^(x - max) written once into
/// the output and summed, then the output scaled by 1/sum (a pass over
/// the row that is still in L1/L2). NaN anywhere gives an all-NaN row.
///
/// # Safety
/// The CPU must support AVX-512F, and `out` must be as long as `x`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn softmax_row(x: &[f32], out: &mut [MaybeUninit<f32>]) {
    let n = x.len().min(out.len());
    let (xp, op) = (x.as_ptr(), out.as_mut_ptr() as *mut f32);
    let mask = |i: usize| -> __mmask16 {
        if n - i >= 16 {
            0xffff
        } else {
            (1u16 << (n - i)) - 1
        }
    };
    // `vmaxps` returns its second operand when the first is NaN, so the
    // maximum skips NaNs; a NaN element still makes the sum, and with it
    // every output, NaN.
    let ninf = splat(f32::NEG_INFINITY);
    let (mut m0, mut m1) = (ninf, ninf);
    let mut i = 0;
    while i + 32 <= n {
        m0 = _mm512_max_ps(_mm512_loadu_ps(xp.add(i)), m0);
        m1 = _mm512_max_ps(_mm512_loadu_ps(xp.add(i + 16)), m1);
        i += 32;
    }
    while i < n {
        m0 = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, mask(i), xp.add(i)), m0);
        i += 16;
    }
    let m = splat(_mm512_reduce_max_ps(_mm512_max_ps(m0, m1)));
    // x - m <= 0, so only the lower clamp is needed (NaN passes through).
    let e = |v: __m512| exp_reduced(_mm512_max_ps(splat(EXP_LO), _mm512_sub_ps(v, m)), _mm512_setzero_ps());
    let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    i = 0;
    while i + 32 <= n {
        let a = e(_mm512_loadu_ps(xp.add(i)));
        let b = e(_mm512_loadu_ps(xp.add(i + 16)));
        _mm512_storeu_ps(op.add(i), a);
        _mm512_storeu_ps(op.add(i + 16), b);
        s0 = _mm512_add_ps(s0, a);
        s1 = _mm512_add_ps(s1, b);
        i += 32;
    }
    while i < n {
        let k = mask(i);
        let a = _mm512_maskz_mov_ps(k, e(_mm512_maskz_loadu_ps(k, xp.add(i))));
        _mm512_mask_storeu_ps(op.add(i), k, a);
        s0 = _mm512_add_ps(s0, a);
        i += 16;
    }
    let inv = splat(1.0 / _mm512_reduce_add_ps(_mm512_add_ps(s0, s1)));
    i = 0;
    while i + 16 <= n {
        _mm512_storeu_ps(op.add(i), _mm512_mul_ps(_mm512_loadu_ps(op.add(i)), inv));
        i += 16;
    }
    if i < n {
        let k = mask(i);
        let v = _mm512_maskz_loadu_ps(k, op.add(i));
        _mm512_mask_storeu_ps(op.add(i), k, _mm512_mul_ps(v, inv));
    }
}

#[cfg(test)]
mod tests {
    use super::super::{map_f32_avx512, simd_level, softmax_row_avx512, FastFn, SimdLevel};
    use std::mem::MaybeUninit;

    /// |got - want| in units of the f32 spacing at `want` (the smallest
    /// subnormal near zero).
    fn ulps(got: f32, want: f64) -> f64 {
        if want.is_nan() || got.is_nan() {
            return if want.is_nan() && got.is_nan() {
                0.0
            } else {
                f64::INFINITY
            };
        }
        if want.is_infinite() || got.is_infinite() {
            return if got as f64 == want { 0.0 } else { f64::INFINITY };
        }
        let w = (want as f32).abs();
        let spacing = if w < f32::MIN_POSITIVE {
            f32::from_bits(1) as f64
        } else if w == f32::MAX {
            (w - f32::from_bits(w.to_bits() - 1)) as f64
        } else {
            (f32::from_bits(w.to_bits() + 1) - w) as f64
        };
        (got as f64 - want).abs() / spacing
    }

    fn run(f: FastFn, xs: &[f32]) -> Option<Vec<f32>> {
        let mut out = vec![MaybeUninit::<f32>::uninit(); xs.len()];
        if !map_f32_avx512(f, xs, &mut out) {
            assert_ne!(simd_level(), SimdLevel::Avx512, "the kernel must run where AVX-512 is");
            return None;
        }
        // SAFETY: the kernel wrote every element (it returned true).
        Some(out.into_iter().map(|v| unsafe { v.assume_init() }).collect())
    }

    /// Worst ulp error of `f` over `n + 1` points of [lo, hi] against an f64
    /// reference; the odd length also exercises the masked tail.
    fn worst(f: FastFn, lo: f64, hi: f64, n: usize, reference: impl Fn(f64) -> f64) -> Option<(f64, f32)> {
        let xs: Vec<f32> = (0..=n).map(|i| (lo + (hi - lo) * i as f64 / n as f64) as f32).collect();
        let got = run(f, &xs)?;
        let mut w = (0.0, 0.0);
        for (&g, &x) in got.iter().zip(&xs) {
            let e = ulps(g, reference(x as f64));
            if e > w.0 {
                w = (e, x);
            }
        }
        Some(w)
    }

    /// The same bounds as the portable functions' (special/tests.rs, and
    /// `exp_f32`'s 4e-7 relative, about 3 ulp).
    #[test]
    fn kernels_accuracy() {
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        type Case<'a> = (FastFn, f64, f64, f64, &'a dyn Fn(f64) -> f64);
        let gelu = |x: f64| 0.5 * x * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2);
        let cases: [Case; 5] = [
            (FastFn::Exp, -87.0, 88.7, 2.0, &f64::exp),
            (FastFn::Exp, -103.9, -87.0, 1.0, &f64::exp),
            (FastFn::Sigmoid, -103.0, 30.0, 3.0, &sig),
            (FastFn::Silu, -88.0, 88.0, 3.0, &|x| x * sig(x)),
            (FastFn::Gelu, -9.0, 12.0, 7.0, &gelu),
        ];
        for (f, lo, hi, bound, reference) in cases {
            let Some((err, at)) = worst(f, lo, hi, 400_001, reference) else {
                return;
            };
            assert!(err <= bound, "{f:?}: {err:.2} ulp at {at:e} (bound {bound})");
        }
    }

    #[test]
    fn kernels_special_values() {
        let xs = [
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            0.0,
            -0.0,
            -200.0,
            200.0,
            -89.0,
        ];
        let Some(e) = run(FastFn::Exp, &xs) else { return };
        assert_eq!(&e[..2], &[0.0, f32::INFINITY]);
        assert!(e[2].is_nan());
        assert_eq!(&e[3..], &[1.0, 1.0, 0.0, f32::INFINITY, (-89f64).exp() as f32]);
        let s = run(FastFn::Sigmoid, &xs).expect("AVX-512 present");
        assert_eq!(&s[..2], &[0.0, 1.0]);
        assert!(s[2].is_nan());
        assert_eq!(&s[3..7], &[0.5, 0.5, 0.0, 1.0]);
        let u = run(FastFn::Silu, &xs).expect("AVX-512 present");
        assert!(u[0].is_nan() && u[2].is_nan(), "silu(-inf) and silu(NaN) are NaN");
        assert_eq!(u[1], f32::INFINITY);
        assert_eq!(u[3].to_bits(), 0f32.to_bits());
        assert_eq!(u[5].to_bits(), (-0f32).to_bits(), "flushed to -0 below -88");
        assert_eq!(u[6], 200.0);
    }

    /// Rows of many lengths (tails of every size) against an f64 softmax.
    #[test]
    fn softmax_row_matches_f64() {
        for len in [1usize, 2, 15, 16, 17, 31, 32, 33, 100, 1024, 1031] {
            let x: Vec<f32> = (0..len).map(|i| ((i * 7919) % 1000) as f32 * 0.02 - 10.0).collect();
            let mut out = vec![MaybeUninit::<f32>::uninit(); len];
            if !softmax_row_avx512(&x, &mut out) {
                return;
            }
            // The reference exponentiates the f32 difference x - max, as
            // any f32 softmax does (its rounding alone is ~|x - max| ulp).
            let m = x.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            let e = |v: f32| ((v - m) as f64).exp();
            let sum: f64 = x.iter().map(|&v| e(v)).sum();
            for (o, &v) in out.iter().zip(&x) {
                // SAFETY: the kernel wrote the whole row.
                let got = unsafe { o.assume_init() } as f64;
                let want = e(v) / sum;
                // exp within 1 ulp, then an f32 sum of `len` terms and a
                // multiply: a few ulp plus the sum's relative rounding.
                assert!(
                    (got - want).abs() <= want * (4e-7 + 1e-7 * (len as f64).sqrt()),
                    "len {len}: {got} vs {want}"
                );
            }
        }
        let x = [1.0, f32::NAN, 2.0];
        let mut out = [MaybeUninit::<f32>::uninit(); 3];
        if softmax_row_avx512(&x, &mut out) {
            // SAFETY: written by the kernel.
            assert!(
                out.iter().all(|v| unsafe { v.assume_init() }.is_nan()),
                "NaN poisons the row"
            );
        }
    }
}
