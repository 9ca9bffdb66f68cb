//! Vectorizable f32 special functions: log, tanh, sigmoid, SiLU, softplus,
//! erf/erfc, GELU (exact and tanh form), sin and cos.
//!
//! Each is branch-free (both sides of a range split are computed and one is
//! selected), so a loop calling it vectorizes; the `*_inplace` wrappers are
//! compiled per SIMD level by `simd_dispatch!`. Polynomials were fitted for
//! these ranges (minimax relative error, then rounded to f32); the unit
//! tests measure the error of every function against f64 references and
//! bound it in ulps.

use super::exp_f32;

/// Horner evaluation of `c[0] + c[1] x + ... + c[N-1] x^(N-1)` with FMAs.
#[inline(always)]
fn horner<const N: usize>(x: f32, c: &[f32; N]) -> f32 {
    let mut p = c[N - 1];
    let mut i = N - 1;
    while i > 0 {
        i -= 1;
        p = p.mul_add(x, c[i]);
    }
    p
}

/// e^r = 1 + r S(r) on [-ln2/2, ln2/2], within 0.8 ulp.
pub(super) const EXP_S: [f32; 6] = [
    1.0,
    0.499_999_97,
    0.166_665_06,
    0.041_667_137,
    0.008_369_093,
    0.001_388_887_4,
];

/// e^(a + c) for a in [-86, 88] and a small correction |c| < 2^-12 (the
/// low half of an exactly split argument), within 1 ulp. Cheaper than
/// `exp_f32`: the caller bounds the range, so 2^n is one exponent-field
/// add. Outside the range the result is garbage, NaN included.
#[inline(always)]
fn exp_bounded(a: f32, c: f32) -> f32 {
    // Adding 1.5 * 2^23 rounds a * log2(e) to the nearest integer n and
    // leaves n in the low mantissa bits of t.
    const SHIFT: f32 = 12_582_912.0;
    let t = a.mul_add(std::f32::consts::LOG2_E, SHIFT);
    let n = t - SHIFT;
    let r = n.mul_add(-0.693_359_4, a);
    let r = n.mul_add(2.121_944_4e-4, r) + c;
    let y = r.mul_add(horner(r, &EXP_S), 1.0);
    // t's bits are 0x4b40_0000 + n; shifted by 23 only n << 23 remains.
    f32::from_bits(y.to_bits().wrapping_add(t.to_bits() << 23))
}

/// log1p(f) = f - f^2/2 + f^3 P(f) for f in [sqrt(1/2) - 1, sqrt(2) - 1].
const LOG_P: [f32; 9] = [
    0.333_333_3,
    -0.249_999_94,
    0.200_007_14,
    -0.166_680_56,
    0.142_493_2,
    -0.124_201_72,
    0.116_770_51,
    -0.115_144_156,
    0.070_373_006,
];
/// ln 2 split so that `e * LN2_HI` is exact for any f32 exponent.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;

/// Natural logarithm, within 2 ulp; NaN below 0, -inf at 0, handles
/// subnormal inputs.
#[inline(always)]
pub fn ln_f32(x: f32) -> f32 {
    // Scale subnormals into the normal range first.
    let tiny = x < f32::MIN_POSITIVE;
    let xs = if tiny { x * 8_388_608.0 } else { x };
    let bits = xs.to_bits();
    let e = ((bits >> 23) & 0xff) as i32 - if tiny { 127 + 23 } else { 127 };
    // Mantissa in [1, 2), then in [sqrt(1/2), sqrt(2)) so f stays small.
    let m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    let big = m > std::f32::consts::SQRT_2;
    let m = if big { m * 0.5 } else { m };
    let e = if big { e + 1 } else { e };
    let f = m - 1.0;
    let f2 = f * f;
    let ef = e as f32;
    let mut y = f * f2 * horner(f, &LOG_P);
    y = ef.mul_add(LN2_LO, y);
    y = (-0.5f32).mul_add(f2, y);
    let r = ef.mul_add(LN2_HI, f + y);
    let r = if x == f32::INFINITY { x } else { r };
    let r = if x == 0.0 { f32::NEG_INFINITY } else { r };
    if x < 0.0 || x.is_nan() {
        f32::NAN
    } else {
        r
    }
}

/// tanh(x) = x + x^3 P(x^2) for |x| < 0.625.
const TANH_P: [f32; 5] = [
    -0.333_333_28,
    0.133_327_71,
    -0.053_851_068,
    0.020_997_744,
    -0.006_097_38,
];

/// Hyperbolic tangent, within 3 ulp.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let ax = x.abs();
    let z = x * x;
    let small = (x * z).mul_add(horner(z, &TANH_P), x);
    // 1 - 2 / (e^{2|x|} + 1): exp saturates to inf, giving exactly 1.
    let large = (1.0 - 2.0 / (exp_f32(2.0 * ax) + 1.0)).copysign(x);
    if ax < 0.625 {
        small
    } else {
        large
    }
}

/// Logistic sigmoid 1 / (1 + e^-x), within 3 ulp.
#[inline(always)]
pub fn sigmoid_f32(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

/// SiLU x * sigmoid(x), computed as x / (1 + e^-x) like PyTorch, within
/// 3 ulp. Below x = -88 the result (smaller than 1e-36 in magnitude) is
/// -0, and silu(-inf) is NaN, both as in PyTorch.
#[inline(always)]
pub fn silu_f32(x: f32) -> f32 {
    let a = -x;
    let a = if a > 88.0 { 88.0 } else { a };
    let a = if a < -86.0 { -86.0 } else { a };
    let s = x / (1.0 + exp_bounded(a, 0.0));
    // x * 0 keeps the sign of zero and turns -inf into NaN.
    if x < -88.0 {
        x * 0.0
    } else {
        s
    }
}

/// log(1 + t) for t >= 0 through `ln_f32`, with Goldberg's correction:
/// log(u) * t / (u - 1) where u = 1 + t cancels the rounding of u.
#[inline(always)]
fn log1p_pos(t: f32) -> f32 {
    let u = 1.0 + t;
    let d = u - 1.0;
    let l = ln_f32(u) * (t / d);
    if d == 0.0 {
        t
    } else {
        l
    }
}

/// PyTorch's softplus with beta 1 and threshold 20: x above 20, else
/// log(1 + e^x), computed as max(x, 0) + log1p(e^-|x|) to avoid overflow.
#[inline(always)]
pub fn softplus_f32(x: f32) -> f32 {
    let pos = if x > 0.0 { x } else { 0.0 };
    let r = pos + log1p_pos(exp_f32(-x.abs()));
    if x > 20.0 {
        x
    } else {
        r
    }
}

/// erf(x) = x + x Q(x^2) on [0, ERF_SPLIT]; above it, erf = 1 - erfc.
const ERF_SPLIT: f32 = 0.921_875;
/// erfc(z) = e^{-z^2} G(z) from here up; below it, erfc = 1 - erf (where
/// erf < 0.53, so the subtraction does not cancel).
const ERFC_SPLIT: f32 = 0.5;
const ERF_SMALL: [f32; 7] = [
    0.128_379_17,
    -0.376_126_35,
    0.112_836_96,
    -0.026_859_399,
    0.005_201_034_2,
    -0.000_814_272_4,
    8.370_17e-5,
];
/// erfc(z) e^{z^2} = t R(t) with t = 1 / (1 + z), on [ERFC_SPLIT, ERFC_ZMAX].
const ERFC_G: [f32; 10] = [
    0.564_181_9,
    0.564_459_56,
    0.278_540_22,
    -0.263_548_17,
    -0.681_076_65,
    -0.962_650_66,
    6.112_096,
    -9.278_65,
    6.452_596_7,
    -1.793_776_2,
];
/// erfc is below the smallest subnormal from here on; clamping keeps z^2
/// finite (and its FMA error term well defined) for huge and infinite z.
const ERFC_ZMAX: f32 = 10.5;

/// erf(x) for |x| <= ERF_SPLIT.
#[inline(always)]
fn erf_small(x: f32) -> f32 {
    x.mul_add(horner(x * x, &ERF_SMALL), x)
}

/// erfc(z) for z >= ERFC_SPLIT, given z^2 = z2_hi + z2_lo exactly: the
/// split keeps e^{-z^2} accurate where z^2 is large.
#[inline(always)]
fn erfc_tail(z: f32, z2_hi: f32, z2_lo: f32) -> f32 {
    let t = 1.0 / (1.0 + z);
    let g = t * horner(t, &ERFC_G);
    // e^{-(hi + lo)} = e^{-hi} (1 - lo) to first order; |lo| < 2^-17.
    exp_f32(-z2_hi) * (-g).mul_add(z2_lo, g)
}

/// erfc(|x|) for |x| >= ERFC_SPLIT (callers ignore it below).
#[inline(always)]
fn erfc_abs_tail(ax: f32) -> f32 {
    // `>` is false for NaN, so NaN passes through.
    let z = if ax > ERFC_ZMAX { ERFC_ZMAX } else { ax };
    let hi = z * z;
    let lo = z.mul_add(z, -hi);
    erfc_tail(z, hi, lo)
}

/// Error function, within 2 ulp.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    let ax = x.abs();
    let big = 1.0 - erfc_abs_tail(ax);
    let r = if ax < ERF_SPLIT { erf_small(ax) } else { big };
    r.copysign(x)
}

/// Complementary error function 1 - erf(x), within 5 ulp (relative, also
/// deep in the tail where 1 - erf would cancel).
#[inline(always)]
pub fn erfc_f32(x: f32) -> f32 {
    let ax = x.abs();
    let tail = erfc_abs_tail(ax);
    let pos = if ax < ERFC_SPLIT { 1.0 - erf_small(ax) } else { tail };
    if x < 0.0 {
        2.0 - pos
    } else {
        pos
    }
}

/// Φ(-x) e^{x^2/2} = P(x) / Q(x) on [0, GELU_XMAX] (relative error 5e-8).
pub(super) const GELU_P: [f32; 5] = [0.499_999_97, 0.325_602_38, 0.100_313_26, 0.012_790_804, 5.562_681_6e-7];
pub(super) const GELU_Q: [f32; 5] = [1.0, 1.449_086_3, 0.856_858_5, 0.250_567_62, 0.032_114_673];
/// Below -GELU_XMAX, x Φ(x) is smaller than 1e-17 in magnitude and is
/// returned as -0 (PyTorch's f32 GELU already returns -0 below x = -5.9);
/// above GELU_XMAX, Φ(x) rounds to 1.
pub(super) const GELU_XMAX: f32 = 9.0;

/// Exact GELU x Φ(x), within 7 ulp where |x Φ(x)| > 1e-17.
///
/// One formula for both signs: Φ(-|x|) = e^{-x^2/2} P(|x|) / Q(|x|), with
/// e^{-x^2/2} taken from the exact split of x^2, so negative x keep their
/// relative accuracy down to the flush point (no 1 + erf cancellation);
/// Φ(x) = 1 - Φ(-x) for positive x. gelu(+inf) = inf; gelu(-inf) = NaN
/// as in PyTorch.
#[inline(always)]
pub fn gelu_f32(x: f32) -> f32 {
    let ax = x.abs();
    // `>` is false for NaN, so NaN passes through.
    let xc = if ax > GELU_XMAX { GELU_XMAX } else { ax };
    // -x^2/2 = a + c exactly (halving is exact).
    let xh = -0.5 * xc;
    let a = xh * xc;
    let c = xh.mul_add(xc, -a);
    let tail = exp_bounded(a, c) * (horner(xc, &GELU_P) / horner(xc, &GELU_Q));
    let phi = if x < 0.0 { tail } else { 1.0 - tail };
    // x * 0 keeps the sign of zero and turns -inf into NaN.
    let phi = if x < -GELU_XMAX { 0.0 } else { phi };
    x * phi
}

/// GELU with PyTorch's tanh approximation,
/// x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), within 4 ulp.
///
/// Evaluated as x sigmoid(2u) = x / (1 + e^{-2u}) (the same function,
/// without the cancellation of 1 + tanh for negative x). The exponent is
/// formed in f64 and passed to exp as a high and a low f32 part: |2u|
/// reaches ~90, so its f32 rounding alone would cost |2u| ulps. Below
/// x = -10 the result (under 1e-36) is -0; gelu_tanh(-inf) is NaN, as in
/// PyTorch.
#[inline(always)]
pub fn gelu_tanh_f32(x: f32) -> f32 {
    // 2 sqrt(2 / pi)
    const K: f64 = 1.595_769_121_605_730_7;
    let xd = x as f64;
    let a = -K * (0.044_715 * xd * xd).mul_add(xd, xd);
    let ac = if a > 88.0 { 88.0 } else { a };
    let ac = if ac < -86.0 { -86.0 } else { ac };
    let hi = ac as f32;
    let lo = (ac - hi as f64) as f32;
    let r = x / (1.0 + exp_bounded(hi, lo));
    // x * 0 keeps the sign of zero and turns -inf into NaN.
    if a > 88.0 {
        x * 0.0
    } else {
        r
    }
}

/// sin(r) = r + r^3 P(r^2) and cos(r) = 1 - r^2/2 + r^4 Q(r^2) on [-pi/4, pi/4].
const SIN_P: [f32; 3] = [-0.166_666_64, 0.008_332_746, -0.000_195_874_9];
const COS_P: [f32; 3] = [0.041_666_664, -0.001_388_830_2, 2.454_773_9e-5];
/// pi/2 = PIO2_HI + PIO2_LO, PIO2_HI with 33 significant bits so that
/// n * PIO2_HI is exact for |n| < 2^20.
const PIO2_HI: f64 = 1.570_796_326_734_125_6;
const PIO2_LO: f64 = 6.077_100_506_506_192e-11;
/// `sin_fast_f32` and `cos_fast_f32` are accurate for |x| up to this; the
/// slice functions recompute larger inputs with the slow exact path.
pub const TRIG_FAST_MAX: f32 = 1.0e6;

/// Reduces x to r in [-pi/4, pi/4] and the quadrant n mod 4, in f64 so the
/// reduction stays exact for |x| < TRIG_FAST_MAX.
#[inline(always)]
fn trig_reduce(x: f32) -> (f32, i32) {
    let xd = x as f64;
    let n = (xd * std::f64::consts::FRAC_2_PI).round();
    let r = n.mul_add(-PIO2_LO, n.mul_add(-PIO2_HI, xd));
    // The quadrant's low bits, read from the mantissa after adding
    // 1.5 * 2^52 (a bit cast that vectorizes, unlike `n as i32`).
    let q = (n + 6_755_399_441_055_744.0).to_bits() as i32;
    (r as f32, q)
}

#[inline(always)]
fn sin_poly(r: f32, r2: f32) -> f32 {
    (r * r2).mul_add(horner(r2, &SIN_P), r)
}

#[inline(always)]
fn cos_poly(r2: f32) -> f32 {
    (r2 * r2).mul_add(horner(r2, &COS_P), (-0.5f32).mul_add(r2, 1.0))
}

/// Sine within 2 ulp for |x| <= TRIG_FAST_MAX (NaN for inf and NaN).
#[inline(always)]
pub fn sin_fast_f32(x: f32) -> f32 {
    let (r, q) = trig_reduce(x);
    let r2 = r * r;
    let v = if q & 1 == 0 { sin_poly(r, r2) } else { cos_poly(r2) };
    if q & 2 == 0 {
        v
    } else {
        -v
    }
}

/// Cosine within 2 ulp for |x| <= TRIG_FAST_MAX (NaN for inf and NaN).
#[inline(always)]
pub fn cos_fast_f32(x: f32) -> f32 {
    let (r, q) = trig_reduce(x);
    let r2 = r * r;
    let v = if q & 1 == 0 { cos_poly(r2) } else { sin_poly(r, r2) };
    if (q + 1) & 2 == 0 {
        v
    } else {
        -v
    }
}

/// Recomputes the elements a fast trig pass got wrong (|x| beyond
/// TRIG_FAST_MAX) with the f64 library function. A scan, not a hot loop.
#[inline(always)]
pub fn trig_fixup(x: &[f32], out: &mut [f32], f: fn(f64) -> f64) {
    for (o, &v) in out.iter_mut().zip(x) {
        if v.abs() > TRIG_FAST_MAX && v.is_finite() {
            *o = f(v as f64) as f32;
        }
    }
}

macro_rules! inplace {
    ($(#[$m:meta])* $name:ident, $f:ident) => {
        $crate::simd_dispatch! {
            $(#[$m])*
            pub fn $name(xs: &mut [f32]) {
                for x in xs.iter_mut() {
                    *x = $f(*x);
                }
            }
        }
    };
}
inplace!(
    /// Replaces every element by its natural logarithm.
    ln_inplace,
    ln_f32
);
inplace!(
    /// Replaces every element by its hyperbolic tangent.
    tanh_inplace,
    tanh_f32
);
inplace!(
    /// Replaces every element by its logistic sigmoid.
    sigmoid_inplace,
    sigmoid_f32
);
inplace!(
    /// Applies SiLU to every element.
    silu_inplace,
    silu_f32
);
inplace!(
    /// Applies exact (erf) GELU to every element.
    gelu_inplace,
    gelu_f32
);
inplace!(
    /// Applies tanh-approximated GELU to every element.
    gelu_tanh_inplace,
    gelu_tanh_f32
);

macro_rules! simd_dispatch_trig {
    ($name:ident, $fast:ident, $exact:path, $what:literal) => {
        $crate::simd_dispatch! {
            #[doc = concat!("Replaces every element by its ", $what, " (any magnitude).")]
            pub fn $name(xs: &mut [f32]) {
                // Keep the inputs a block at a time for the fix-up pass.
                let mut keep = [0f32; 256];
                for c in xs.chunks_mut(256) {
                    let k = &mut keep[..c.len()];
                    k.copy_from_slice(c);
                    for x in c.iter_mut() {
                        *x = $fast(*x);
                    }
                    trig_fixup(k, c, $exact);
                }
            }
        }
    };
}
simd_dispatch_trig!(sin_inplace, sin_fast_f32, f64::sin, "sine");
simd_dispatch_trig!(cos_inplace, cos_fast_f32, f64::cos, "cosine");

#[cfg(test)]
mod tests;
