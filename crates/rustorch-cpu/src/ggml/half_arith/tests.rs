use super::*;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A finite f16 with `|x| < 2^max_exp`, of any exponent down to the
    /// subnormals, and often few significant bits (so that sums land on
    /// f16 midpoints, the cases where one or two roundings differ).
    fn half(&mut self, max_exp: i32) -> f32 {
        let r = self.next();
        let sign = if r & 1 == 1 { -1.0 } else { 1.0 };
        let bits = if (r >> 1) & 3 == 0 {
            11
        } else {
            1 + ((r >> 3) % 5) as u32
        };
        let mant = ((r >> 8) & ((1 << bits) - 1)) as f64;
        let exp = -24 + ((r >> 20) % (max_exp + 24) as u64) as i32;
        let v = f16::from_f64(sign * mant * 2f64.powi(exp)).to_f32();
        if v.abs() < 2f32.powi(max_exp) {
            v
        } else {
            0.0
        }
    }
}

/// The correctly rounded f16 of `x * s + y` from exact integer arithmetic:
/// every f16 value is a whole multiple of 2^-24, so in units of 2^-48 the
/// product and the sum are integers.
fn exact_fma(x: f32, s: f32, y: f32) -> f32 {
    let units = |v: f32, shift: i32| -> i128 {
        let scaled = v as f64 * 2f64.powi(shift);
        assert_eq!(scaled.fract(), 0.0, "{v} is not an f16 value");
        scaled as i128
    };
    let sum = units(x, 24) * units(s, 24) + units(y, 48);
    if sum == 0 {
        // IEEE 754: an exact zero sum is +0 when rounding to nearest, unless
        // both terms are zeros of the same sign.
        let p = x as f64 * s as f64;
        if p == 0.0 && y == 0.0 && p.is_sign_negative() == y.is_sign_negative() {
            return p as f32;
        }
        return 0.0;
    }
    round_units(sum)
}

/// An integer number of 2^-48 units rounded to the nearest f16 (ties to an
/// even significand).
fn round_units(sum: i128) -> f32 {
    let a = sum.unsigned_abs();
    let top = 127 - a.leading_zeros() as i32 - 48; // floor(log2 |value|)
                                                   // Spacing of f16 values at this magnitude: 2^(top - 10), at least 2^-24.
    let ulp = (top - 10).max(-24) + 48;
    let mut q = a >> ulp;
    let r = a - (q << ulp);
    let half = 1u128 << (ulp - 1);
    if r > half || (r == half && q & 1 == 1) {
        q += 1;
    }
    let v = (q as f64 * 2f64.powi(ulp - 48)) as f32;
    assert_eq!(f16::from_f32(v).to_f32(), v, "the rounded value is an f16");
    if sum < 0 {
        -v
    } else {
        v
    }
}

#[test]
fn fma_half_is_the_correctly_rounded_half_fma() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..400_000 {
        let (x, s, y) = (rng.half(8), rng.half(1).abs(), rng.half(10));
        let want = exact_fma(x, s, y);
        let got = fma_half(x, s, y);
        assert_eq!(got.to_bits(), want.to_bits(), "fma_half({x:e}, {s:e}, {y:e})");
    }
}

/// Sums just off an f16 midpoint, by less than f32 resolves: an f32 FMA
/// lands on the midpoint and its f16 rounding goes to even, while the
/// half-precision FMA rounds the exact value. Half of these differ between
/// the two, so the test meets the cases that matter.
#[test]
fn fma_half_rounds_sums_next_to_midpoints_correctly() {
    let mut rng = Rng(5);
    let mut double_rounding_differs = 0;
    for _ in 0..20_000 {
        let e = (rng.next() % 12) as i32; // y in [2^e, 2^(e+1))
        let mant = 1024.0 + (rng.next() % 1024) as f32;
        let sign = if rng.next() & 1 == 1 { -1.0 } else { 1.0 };
        let y = sign * mant * 2f32.powi(e - 10);
        // x * s = 2^(e-11) (1 - 2^-20): half an f16 ulp of y, just short.
        let x = sign * (1.0 + 2f32.powi(-10)) * 2f32.powi(e - 11);
        let s = 1.0 - 2f32.powi(-10);
        for (x, y) in [(x, y), (-x, y)] {
            let want = exact_fma(x, s, y);
            assert_eq!(
                fma_half(x, s, y).to_bits(),
                want.to_bits(),
                "fma_half({x:e}, {s:e}, {y:e})"
            );
            if f16::from_f32(x.mul_add(s, y)).to_f32() != want {
                double_rounding_differs += 1;
            }
        }
    }
    assert!(
        double_rounding_differs > 5_000,
        "only {double_rounding_differs} cases differ from f32 FMA + rounding"
    );
}

#[test]
fn mul_half_is_the_correctly_rounded_half_product() {
    let mut rng = Rng(42);
    for _ in 0..100_000 {
        let (y, s) = (rng.half(10), rng.half(1).abs());
        let want = exact_fma(y, s, -0.0);
        assert_eq!(mul_half(y, s).to_bits(), want.to_bits(), "mul_half({y:e}, {s:e})");
    }
}

#[test]
fn vector_and_scalar_native_steps_agree() {
    let mut rng = Rng(7);
    for _ in 0..200 {
        let v: Vec<f16> = (0..256).map(|_| f16::from_f32(rng.half(6))).collect();
        let acc: Vec<f32> = (0..256).map(|_| rng.half(9)).collect();
        let s = rng.half(1).abs();
        let s16 = f16::from_f32(s).to_f32();
        let mut want = acc.clone();
        mad_native_scalar(&mut want, &v, s16);
        let mut got = acc.clone();
        mad_f16(&mut got, &v, s, GgmlHalf::Native);
        assert_eq!(got, want);
    }
}

#[test]
fn native_steps_cover_whole_steps_of_128_and_the_tail_is_widened() {
    let mut rng = Rng(11);
    for n in [64usize, 128, 200, 256] {
        let v: Vec<f16> = (0..n).map(|_| f16::from_f32(rng.half(6))).collect();
        let acc: Vec<f32> = (0..n).map(|_| rng.half(9)).collect();
        let s = 0.3f32; // not an f16 value: the native steps round it first
        let s16 = f16::from_f32(s).to_f32();
        let native = n / 128 * 128;
        let mut got = acc.clone();
        mad_f16(&mut got, &v, s, GgmlHalf::Native);
        let mut scaled = acc.clone();
        scale_f16(&mut scaled, s, GgmlHalf::Native);
        for i in 0..n {
            let x = v[i].to_f32();
            let (mad, scale) = if i < native {
                (exact_fma(x, s16, acc[i]), exact_fma(acc[i], s16, -0.0))
            } else {
                (
                    f16::from_f32(x.mul_add(s, acc[i])).to_f32(),
                    f16::from_f32(acc[i] * s).to_f32(),
                )
            };
            assert_eq!(got[i].to_bits(), mad.to_bits(), "mad n={n} i={i}");
            assert_eq!(scaled[i].to_bits(), scale.to_bits(), "scale n={n} i={i}");
        }
        let mut widened = acc.clone();
        mad_f16(&mut widened, &v, s, GgmlHalf::Widened);
        for i in 0..n {
            let want = f16::from_f32(v[i].to_f32().mul_add(s, acc[i])).to_f32();
            assert_eq!(widened[i].to_bits(), want.to_bits(), "widened n={n} i={i}");
        }
    }
}

#[test]
fn parse_names_both_and_rejects_others() {
    assert_eq!(GgmlHalf::parse("native"), Some(GgmlHalf::Native));
    assert_eq!(GgmlHalf::parse("Widened"), Some(GgmlHalf::Widened));
    assert_eq!(GgmlHalf::parse("half"), None);
}

/// On a CPU with AVX512-FP16, the emulation against the hardware's own
/// half-precision FMA and product (the instructions llama.cpp's build for
/// that CPU runs). Elsewhere the test says it had nothing to compare with.
#[cfg(target_arch = "x86_64")]
#[test]
fn emulation_matches_avx512fp16_hardware() {
    if !is_x86_feature_detected!("avx512fp16") {
        eprintln!(
            "emulation_matches_avx512fp16_hardware: this CPU has no AVX512-FP16; compared with exact arithmetic only"
        );
        return;
    }
    let mut rng = Rng(3);
    for _ in 0..200_000 {
        let (x, s, y) = (rng.half(8), rng.half(1).abs(), rng.half(10));
        let bits = |v: f32| f16::from_f32(v).to_bits();
        // SAFETY: the CPU has AVX512-FP16 (checked above).
        let hw = f16::from_bits(unsafe { hw::fma(bits(x), bits(s), bits(y)) }).to_f32();
        assert_eq!(
            fma_half(x, s, y).to_bits(),
            hw.to_bits(),
            "vfmadd231sh({x:e}, {s:e}, {y:e})"
        );
        // SAFETY: as above.
        let hw = f16::from_bits(unsafe { hw::mul(bits(y), bits(s)) }).to_f32();
        assert_eq!(mul_half(y, s).to_bits(), hw.to_bits(), "vmulsh({y:e}, {s:e})");
    }
}

#[cfg(target_arch = "x86_64")]
mod hw {
    use std::arch::asm;

    /// `x * s + y` by `vfmadd231sh`, on f16 bit patterns.
    #[target_feature(enable = "avx512fp16")]
    pub(super) unsafe fn fma(x: u16, s: u16, y: u16) -> u16 {
        let mut r = u32::from(y);
        // SAFETY: register-only instructions of AVX512-FP16 (the caller
        // checked it is present).
        unsafe {
            asm!(
                "vmovw {a}, {ra:e}",
                "vmovw {b}, {rb:e}",
                "vmovw {c}, {rc:e}",
                "vfmadd231sh {c}, {a}, {b}",
                "vmovw {rc:e}, {c}",
                a = out(xmm_reg) _, b = out(xmm_reg) _, c = out(xmm_reg) _,
                ra = in(reg) u32::from(x), rb = in(reg) u32::from(s), rc = inout(reg) r,
                options(pure, nomem, nostack),
            );
        }
        r as u16
    }

    /// `y * s` by `vmulsh`.
    #[target_feature(enable = "avx512fp16")]
    pub(super) unsafe fn mul(y: u16, s: u16) -> u16 {
        let mut r = u32::from(y);
        // SAFETY: as in `fma`.
        unsafe {
            asm!(
                "vmovw {a}, {ra:e}",
                "vmovw {b}, {rb:e}",
                "vmulsh {a}, {a}, {b}",
                "vmovw {ra:e}, {a}",
                a = out(xmm_reg) _, b = out(xmm_reg) _,
                ra = inout(reg) r, rb = in(reg) u32::from(s),
                options(pure, nomem, nostack),
            );
        }
        r as u16
    }
}

#[test]
fn widened_vector_steps_round_as_the_scalar_steps() {
    // Every length the vector paths take (multiples of 8 and 16) and one
    // they leave to the scalar loop; values past f16's range (infinities),
    // subnormals, NaN and signed zeros included.
    let mut rng = Rng(23);
    for n in [8usize, 16, 24, 64, 72, 13] {
        for _ in 0..300 {
            let v: Vec<f16> = (0..n).map(|_| f16::from_f32(rng.half(15))).collect();
            let mut acc: Vec<f32> = (0..n).map(|_| rng.half(16)).collect();
            acc[0] = f32::NAN;
            if n > 2 {
                acc[1] = -0.0;
                acc[2] = f32::INFINITY;
            }
            let s = rng.half(3) * 1.37;
            let mut got = acc.clone();
            mad_f16(&mut got, &v, s, GgmlHalf::Widened);
            let mut scaled = acc.clone();
            scale_f16(&mut scaled, s, GgmlHalf::Widened);
            for i in 0..n {
                let mad = f16::from_f32(v[i].to_f32().mul_add(s, acc[i])).to_f32();
                let scale = f16::from_f32(acc[i] * s).to_f32();
                assert!(
                    got[i].to_bits() == mad.to_bits() || (got[i].is_nan() && mad.is_nan()),
                    "mad n={n} i={i}: {} vs {mad}",
                    got[i]
                );
                assert!(
                    scaled[i].to_bits() == scale.to_bits() || (scaled[i].is_nan() && scale.is_nan()),
                    "scale n={n} i={i}: {} vs {scale}",
                    scaled[i]
                );
            }
        }
    }
}
