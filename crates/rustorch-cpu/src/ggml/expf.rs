//! `ggml_v_expf`, GGML's vector exponential (AVX-512 version, vec.h), and
//! the SiLU built on it.
//!
//! The polynomial is ARM's optimized-routines `expf` (max error about 1.5
//! ulp); GGML uses it for every 16-lane block of softmax and SiLU rows and
//! libm's `expf` for the remaining elements. Results must match bit for
//! bit, so the constants, the FMA pattern and the scaling by 2^n
//! (`vscalefps`) are reproduced exactly.

const SHIFT: f32 = f32::from_bits(0x4b40_0000); // 0x1.8p23
const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b); // 0x1.715476p+0
const LN2_HI: f32 = f32::from_bits(0x3f31_7200); // 0x1.62e4p-1
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e); // 0x1.7f7d1cp-20
const C5: f32 = f32::from_bits(0x3c07_2010); // 0x1.0e4020p-7
const C4: f32 = f32::from_bits(0x3d2b_9f17); // 0x1.573e2ep-5
const C3: f32 = f32::from_bits(0x3e2a_af33); // 0x1.555e66p-3
const C2: f32 = f32::from_bits(0x3eff_fedb); // 0x1.fffdb6p-2
const C1: f32 = f32::from_bits(0x3f7f_fff6); // 0x1.ffffecp-1

/// One lane of `ggml_v_expf`.
#[inline]
pub(crate) fn v_expf(x: f32) -> f32 {
    let z = x.mul_add(LOG2E, SHIFT);
    let n = z - SHIFT;
    let b = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let u = b * b;
    let j = C5
        .mul_add(b, C4)
        .mul_add(u, C3.mul_add(b, C2))
        .mul_add(u, C1.mul_add(b, 1.0));
    if n.abs() > 192.0 {
        // Far outside the range: 0 below, +inf above.
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // vscalefps: j * 2^n rounded once. In f64 the product is exact (j has
    // 24 bits, 2^n is a power of two well inside f64's range), so the cast
    // is that one rounding, subnormal results included. 2^n from its
    // exponent bits (|n| <= 192 here): `powi` is a libm call per element.
    let two_n = f64::from_bits(((n as i64 + 1023) as u64) << 52);
    ((j as f64) * two_n) as f32
}

/// One lane of `ggml_v_silu`: x / (1 + e^-x), with `ggml_v_expf`.
#[inline]
pub(crate) fn v_silu(x: f32) -> f32 {
    x / (1.0 + v_expf(0.0 - x))
}

/// GGML's scalar SiLU for the elements after the last 16-lane block:
/// `x / (1.0f + expf(-x))` with libm's `expf` (Rust's `f32::exp` calls the
/// same libm function on Linux).
#[inline]
pub(crate) fn silu_libm(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    /// `ggml_v_expf` on 16 lanes, transcribed from GGML's intrinsics.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F (and FMA).
    #[target_feature(enable = "avx512f,fma")]
    #[inline]
    pub(crate) unsafe fn v_expf(x: __m512) -> __m512 {
        let r = _mm512_set1_ps(SHIFT);
        let z = _mm512_fmadd_ps(x, _mm512_set1_ps(LOG2E), r);
        let n = _mm512_sub_ps(z, r);
        let b = _mm512_fnmadd_ps(
            n,
            _mm512_set1_ps(LN2_LO),
            _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x),
        );
        let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_fmadd_ps(_mm512_set1_ps(C5), b, _mm512_set1_ps(C4)),
                u,
                _mm512_fmadd_ps(_mm512_set1_ps(C3), b, _mm512_set1_ps(C2)),
            ),
            u,
            _mm512_fmadd_ps(_mm512_set1_ps(C1), b, _mm512_set1_ps(1.0)),
        );
        let res = _mm512_scalef_ps(j, n);
        if d == 0 {
            return res;
        }
        let zero = _mm512_setzero_ps();
        let alt = _mm512_mask_blend_ps(
            _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, zero),
            _mm512_set1_ps(f32::INFINITY),
            zero,
        );
        _mm512_mask_blend_ps(d, res, alt)
    }

    /// `ggml_v_silu` on 16 lanes.
    ///
    /// # Safety
    /// As `v_expf`.
    #[target_feature(enable = "avx512f,fma")]
    #[inline]
    pub(crate) unsafe fn v_silu(x: __m512) -> __m512 {
        let one = _mm512_set1_ps(1.0);
        let e = v_expf(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_div_ps(x, _mm512_add_ps(one, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            88.0,
            88.7,
            89.0,
            -87.0,
            -100.0,
            -103.9,
            -104.5,
            -150.0,
            -200.0,
            200.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e-30,
        ];
        let mut seed = 7u64;
        for _ in 0..20000 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            v.push(((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 240.0);
        }
        v
    }

    /// The polynomial is a good exponential (a check of the transcribed
    /// constants, independent of GGML): within 2 ulp of f64's exp in the
    /// normal range.
    #[test]
    fn close_to_the_true_exponential() {
        for x in inputs() {
            let want = (x as f64).exp();
            let got = v_expf(x);
            if !(-87.0..88.0).contains(&x) || !x.is_finite() {
                continue;
            }
            let ulp = (want as f32).abs() * f32::EPSILON;
            assert!(
                ((got as f64) - want).abs() <= 2.0 * ulp as f64,
                "exp({x}) = {got}, want {want}"
            );
        }
        assert_eq!(v_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(v_expf(f32::INFINITY), f32::INFINITY);
        assert_eq!(v_expf(-200.0), 0.0);
    }

    /// The scalar lanes and the AVX-512 version agree bit for bit.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn lanes_match_the_vector_version() {
        if !super::super::has_avx512() {
            eprintln!("skipped: no AVX-512 on this CPU");
            return;
        }
        use std::arch::x86_64::*;
        for chunk in inputs().chunks_exact(16) {
            let mut e = [0f32; 16];
            let mut s = [0f32; 16];
            // SAFETY: AVX-512 checked above; the arrays hold 16 floats.
            unsafe {
                let x = _mm512_loadu_ps(chunk.as_ptr());
                _mm512_storeu_ps(e.as_mut_ptr(), avx512::v_expf(x));
                _mm512_storeu_ps(s.as_mut_ptr(), avx512::v_silu(x));
            }
            for i in 0..16 {
                assert_eq!(e[i].to_bits(), v_expf(chunk[i]).to_bits(), "exp({})", chunk[i]);
                assert_eq!(s[i].to_bits(), v_silu(chunk[i]).to_bits(), "silu({})", chunk[i]);
            }
        }
    }
}
