//! GGML's horizontal sums.

/// `_mm512_reduce_add_ps` as GCC 12 expands it (avx512fintrin.h,
/// `__MM512_REDUCE_OP`): the upper 256 bits added to the lower, then the
/// upper 128 to the lower, then lanes {2, 3} to {0, 1}, then lane 1 to
/// lane 0.
#[inline(always)]
pub(crate) fn reduce16(x: &[f32; 16]) -> f32 {
    let mut t = [0f32; 8];
    for i in 0..8 {
        t[i] = x[i + 8] + x[i];
    }
    let u = [t[4] + t[0], t[5] + t[1], t[6] + t[2], t[7] + t[3]];
    (u[0] + u[2]) + (u[1] + u[3])
}

/// `reduce16` on a register.
///
/// # Safety
/// The CPU must support AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn reduce16_avx512(x: std::arch::x86_64::__m512) -> f32 {
    use std::arch::x86_64::*;
    // The high half through AVX-512 F's 64-bit extract (the same move):
    // `_mm512_extractf32x8_ps` needs AVX-512 DQ, and an intrinsic whose
    // feature the caller lacks is called instead of inlined (4% of decode
    // attention went to that call).
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
    let lo = _mm512_castps512_ps256(x);
    let t = _mm256_add_ps(hi, lo);
    let u = _mm_add_ps(_mm256_extractf128_ps::<1>(t), _mm256_castps256_ps128(t));
    let v = _mm_add_ps(u, _mm_movehl_ps(u, u));
    _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
}

/// `reduce16_avx512` of sixteen registers at once, with the same additions
/// (each pairs the same two partial sums, and f32 addition commutes, so
/// the bits are the same) but shared shuffles: 45 instructions instead of
/// about 110. `out[k]` is the sum of `x[k]`.
///
/// # Safety
/// The CPU must support AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn reduce16x16_avx512(x: [std::arch::x86_64::__m512; 16]) -> [f32; 16] {
    use std::arch::x86_64::*;
    // Lanes i + 8 to i: b[k] holds x[2k]'s eight sums in 128-bit lanes
    // 0, 1 and x[2k + 1]'s in lanes 2, 3.
    let b: [__m512; 8] = std::array::from_fn(|k| {
        let (p, q) = (x[2 * k], x[2 * k + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(p, q),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(p, q),
        )
    });
    // Lanes i + 4 to i: 128-bit lane l of c[m] holds x[4m + l]'s four.
    let c: [__m512; 4] = std::array::from_fn(|m| {
        let (p, q) = (b[2 * m], b[2 * m + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(p, q),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(p, q),
        )
    });
    // Lanes {2, 3} to {0, 1}: lane l of d[0] holds x[l]'s two, then
    // x[4 + l]'s; d[1] the same for x[8 + l], x[12 + l].
    let d: [__m512; 2] = std::array::from_fn(|h| {
        let (p, q) = (c[2 * h], c[2 * h + 1]);
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(p, q),
            _mm512_shuffle_ps::<0b11_10_11_10>(p, q),
        )
    });
    // Lane 1 to lane 0: element 4l + m is x[4m + l]'s sum.
    let e = _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(d[0], d[1]),
        _mm512_shuffle_ps::<0b11_01_11_01>(d[0], d[1]),
    );
    let mut t = [0f32; 16];
    // SAFETY: `t` holds 16 f32 values.
    unsafe { _mm512_storeu_ps(t.as_mut_ptr(), e) };
    std::array::from_fn(|k| t[4 * (k % 4) + k / 4])
}

/// `reduce16` on a 16-lane vector held as two 8-lane halves: `lo` (lanes
/// 0-7) and `hi` (lanes 8-15), the AVX2 versions' layout. The same
/// additions in the same order as `reduce16_avx512` after its first step.
///
/// # Safety
/// The CPU must support AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
pub(crate) unsafe fn reduce16_avx2(lo: std::arch::x86_64::__m256, hi: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let t = _mm256_add_ps(hi, lo);
    let u = _mm_add_ps(_mm256_extractf128_ps::<1>(t), _mm256_castps256_ps128(t));
    let v = _mm_add_ps(u, _mm_movehl_ps(u, u));
    _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The register version against the scalar tree, on values whose sums
    /// round differently in different orders.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn register_reduction_matches_the_tree() {
        if !super::super::has_avx512() {
            eprintln!("skipped: no AVX-512 on this CPU");
            return;
        }
        let mut seed = 12345u64;
        for _ in 0..1000 {
            let mut x = [0f32; 16];
            for v in &mut x {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let e = ((seed >> 40) % 40) as i32 - 20;
                *v = ((seed >> 11) as f32 / (1u64 << 53) as f32 - 0.5) * 2f32.powi(e);
            }
            // SAFETY: AVX-512 F checked above; `x` holds 16 floats.
            let r = unsafe { reduce16_avx512(std::arch::x86_64::_mm512_loadu_ps(x.as_ptr())) };
            assert_eq!(r.to_bits(), reduce16(&x).to_bits(), "{x:?}");
        }
    }

    /// The two-halves version against the scalar tree, on the same kind of
    /// values.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn halves_reduction_matches_the_tree() {
        if !super::super::has_avx2_fma_f16c() {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        let mut seed = 54321u64;
        for _ in 0..1000 {
            let mut x = [0f32; 16];
            for v in &mut x {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let e = ((seed >> 40) % 40) as i32 - 20;
                *v = ((seed >> 11) as f32 / (1u64 << 53) as f32 - 0.5) * 2f32.powi(e);
            }
            // SAFETY: AVX checked above (AVX2 implies it); `x` holds 16 floats.
            let r = unsafe {
                use std::arch::x86_64::_mm256_loadu_ps;
                reduce16_avx2(_mm256_loadu_ps(x.as_ptr()), _mm256_loadu_ps(x.as_ptr().add(8)))
            };
            assert_eq!(r.to_bits(), reduce16(&x).to_bits(), "{x:?}");
        }
    }

    /// The shared sixteen-register reduction gives each register's
    /// `reduce16` bits, on values whose sums round differently in other
    /// orders (mixed magnitudes and signs).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn sixteen_at_once_equal_one_at_a_time() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("SKIPPED: no AVX-512 F on this CPU");
            return;
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let m = ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0;
            m * [1.0, 1e-4, 3e3, 1e-8][(seed & 3) as usize]
        };
        for _ in 0..200 {
            let vals: Vec<[f32; 16]> = (0..16).map(|_| std::array::from_fn(|_| next())).collect();
            // SAFETY: AVX-512 F checked above; each array holds 16 f32.
            let got = unsafe {
                use std::arch::x86_64::_mm512_loadu_ps;
                reduce16x16_avx512(std::array::from_fn(|k| _mm512_loadu_ps(vals[k].as_ptr())))
            };
            for (k, v) in vals.iter().enumerate() {
                assert_eq!(got[k].to_bits(), reduce16(v).to_bits(), "register {k}");
            }
        }
    }
}
