//! Dot products of two f16 rows in GGML's two accumulation orders.
//!
//! `ggml_mul_mat` with f16 weights converts the other operand to f16 and
//! then takes one of two paths (ggml-cpu.c `ggml_compute_forward_mul_mat`):
//! - llamafile's tinyBLAS (`llamafile_sgemm`, AVX-512: `tinyBLAS<16, __m512,
//!   ..., ggml_fp16_t, ggml_fp16_t, float>`) when the product has at least
//!   two activation rows (`n >= 2`), the weight row count is a multiple of 4
//!   and the row length a multiple of 16: one 16-lane accumulator per
//!   output, one FMA per 16 elements, then `_mm512_reduce_add_ps`;
//! - otherwise `ggml_vec_dot_f16` per output: four 16-lane accumulators
//!   over steps of 64 elements, combined as (a0 + a2) + (a1 + a3), reduced,
//!   widened to f64, plus the elements after the last full step added one
//!   by one in f64.
//!
//! Products of two f16 values are exact in f32 (22 significant bits), so
//! each FMA is one rounding of `acc + x*y`, which `acc + x * y` in f32
//! reproduces exactly without an FMA instruction.

use super::reduce::reduce16;
use half::f16;

/// Which of GGML's two orders an f16 product uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum F16Path {
    TinyBlas,
    VecDot,
}

impl F16Path {
    /// The path `ggml_mul_mat` takes for f16 weights of `rows x k` against
    /// `n_act` activation rows (per batch matrix).
    pub(crate) fn choose(rows: usize, k: usize, n_act: usize) -> F16Path {
        if n_act >= 2 && rows.is_multiple_of(4) && k.is_multiple_of(16) {
            F16Path::TinyBlas
        } else {
            F16Path::VecDot
        }
    }
}

/// The dot product of `w` and `x` (equal lengths) in `path`'s order.
#[inline]
pub(crate) fn dot(path: F16Path, w: &[f16], x: &[f16]) -> f32 {
    dot_rows(path, [w], x)[0]
}

/// `N` dot products of rows `w[r]` with one `x`, each in `path`'s order
/// (the same bits as `N` calls of `dot`).
///
/// One product is a single chain of dependent FMAs, so it runs at the
/// FMA's latency; `N` independent chains run at its throughput, and `x`
/// is loaded and widened once for all of them.
#[inline]
pub(crate) fn dot_rows<const N: usize>(path: F16Path, w: [&[f16]; N], x: &[f16]) -> [f32; N] {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx512() && w.iter().all(|r| r.len() == x.len()) {
        // SAFETY: AVX-512 F, FMA and F16C are present (checked above); every
        // row is as long as `x`.
        return unsafe {
            match path {
                F16Path::TinyBlas => avx512::dot_tiny_rows(w, x),
                F16Path::VecDot => avx512::dot_vec_rows(w, x),
            }
        };
    }
    w.map(|r| match path {
        F16Path::TinyBlas => dot_tiny(r, x),
        F16Path::VecDot => dot_vec(r, x),
    })
}

/// tinyBLAS's order for four rows `w` against four rows `x` (all of one
/// length, a multiple of 16): `out[r][c]` has the bits of
/// `dot(F16Path::TinyBlas, w[r], x[c])`. Each loaded and widened row
/// meets four others, where `dot_rows` reads one shared row per product.
#[inline]
pub(crate) fn dot_tiny_4x4(w: [&[f16]; 4], x: [&[f16]; 4]) -> [[f32; 4]; 4] {
    let n = x[0].len();
    let ok = n.is_multiple_of(16) && w.iter().chain(&x).all(|r| r.len() == n);
    #[cfg(target_arch = "x86_64")]
    if ok && super::has_avx512() {
        // SAFETY: AVX-512 F, FMA and F16C are present (checked above); all
        // rows are `n` long, a multiple of 16.
        return unsafe { avx512::dot_tiny_4x4(w, x) };
    }
    let _ = ok;
    w.map(|wr| x.map(|xr| dot(F16Path::TinyBlas, wr, xr)))
}

/// tinyBLAS's order (portable). `w.len()` must be a multiple of 16.
pub(crate) fn dot_tiny(w: &[f16], x: &[f16]) -> f32 {
    debug_assert!(w.len().is_multiple_of(16) && w.len() == x.len());
    let mut acc = [0f32; 16];
    for (wc, xc) in w.chunks_exact(16).zip(x.chunks_exact(16)) {
        for l in 0..16 {
            acc[l] += wc[l].to_f32() * xc[l].to_f32();
        }
    }
    reduce16(&acc)
}

/// `ggml_vec_dot_f16`'s order (portable).
pub(crate) fn dot_vec(w: &[f16], x: &[f16]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let n = w.len();
    let np = n & !63;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            let o = i + 16 * j;
            for l in 0..16 {
                a[l] += w[o + l].to_f32() * x[o + l].to_f32();
            }
        }
    }
    let [mut a0, mut a1, a2, a3] = acc;
    for l in 0..16 {
        a0[l] += a2[l];
        a1[l] += a3[l];
    }
    for l in 0..16 {
        a0[l] += a1[l];
    }
    let mut sum = reduce16(&a0) as f64;
    for i in np..n {
        sum += (w[i].to_f32() * x[i].to_f32()) as f64;
    }
    sum as f32
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::super::reduce::reduce16_avx512;
    use half::f16;
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn load(p: &[f16], at: usize) -> __m512 {
        // SAFETY: the callers keep `at + 16 <= p.len()`.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.as_ptr().add(at) as *const __m256i)) }
    }

    /// `dot_tiny` of `N` rows against one `x`.
    ///
    /// # Safety
    /// AVX-512 F and FMA; every row as long as `x`, a multiple of 16.
    #[target_feature(enable = "avx512f,fma,f16c")]
    pub(super) unsafe fn dot_tiny_rows<const N: usize>(w: [&[f16]; N], x: &[f16]) -> [f32; N] {
        let mut acc = [_mm512_setzero_ps(); N];
        let mut l = 0;
        while l + 16 <= x.len() {
            // SAFETY: l + 16 <= x.len() == every row's length.
            unsafe {
                let xv = load(x, l);
                for r in 0..N {
                    acc[r] = _mm512_fmadd_ps(load(w[r], l), xv, acc[r]);
                }
            }
            l += 16;
        }
        let mut out = [0f32; N];
        for (o, a) in out.iter_mut().zip(acc) {
            // SAFETY: AVX-512 F is enabled for this function.
            *o = unsafe { reduce16_avx512(a) };
        }
        out
    }

    /// `dot_tiny` of four rows against four rows.
    ///
    /// # Safety
    /// AVX-512 F and FMA; all eight rows of one length, a multiple of 16.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,fma,f16c")]
    pub(super) unsafe fn dot_tiny_4x4(w: [&[f16]; 4], x: [&[f16]; 4]) -> [[f32; 4]; 4] {
        // Plain loops, no closures: a closure is not compiled with this
        // function's target features, so its body would not be inlined.
        let mut acc = [[_mm512_setzero_ps(); 4]; 4];
        let mut l = 0;
        while l + 16 <= x[0].len() {
            // SAFETY: l + 16 <= the common length.
            unsafe {
                let xv = [load(x[0], l), load(x[1], l), load(x[2], l), load(x[3], l)];
                for r in 0..4 {
                    let wv = load(w[r], l);
                    for c in 0..4 {
                        acc[r][c] = _mm512_fmadd_ps(wv, xv[c], acc[r][c]);
                    }
                }
            }
            l += 16;
        }
        let mut out = [[0f32; 4]; 4];
        for r in 0..4 {
            for c in 0..4 {
                // SAFETY: AVX-512 F is enabled for this function.
                out[r][c] = unsafe { reduce16_avx512(acc[r][c]) };
            }
        }
        out
    }

    /// `dot_vec` of `N` rows against one `x`.
    ///
    /// # Safety
    /// AVX-512 F and FMA; every row as long as `x`.
    #[target_feature(enable = "avx512f,fma,f16c")]
    pub(super) unsafe fn dot_vec_rows<const N: usize>(w: [&[f16]; N], x: &[f16]) -> [f32; N] {
        let n = x.len();
        let np = n & !63;
        // a[j][r]: accumulator j (elements 16 j.. of each 64-element step)
        // of row r.
        let mut a = [[_mm512_setzero_ps(); N]; 4];
        let mut i = 0;
        while i < np {
            for (j, acc) in a.iter_mut().enumerate() {
                // SAFETY: i + 16 j + 16 <= np <= every row's length.
                unsafe {
                    let xv = load(x, i + 16 * j);
                    for (r, row_acc) in acc.iter_mut().enumerate() {
                        *row_acc = _mm512_fmadd_ps(load(w[r], i + 16 * j), xv, *row_acc);
                    }
                }
            }
            i += 64;
        }
        let mut out = [0f32; N];
        for r in 0..N {
            let s = _mm512_add_ps(_mm512_add_ps(a[0][r], a[2][r]), _mm512_add_ps(a[1][r], a[3][r]));
            // SAFETY: AVX-512 F is enabled for this function.
            let mut sum = unsafe { reduce16_avx512(s) } as f64;
            for k in np..n {
                sum += (w[r][k].to_f32() * x[k].to_f32()) as f64;
            }
            out[r] = sum as f32;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seed: &mut u64, n: usize) -> Vec<f16> {
        (0..n)
            .map(|_| {
                *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                f16::from_f32(((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0)
            })
            .collect()
    }

    /// Both orders against an f64 sum (they differ from it only by f32
    /// rounding of partial sums), and the AVX-512 versions against the
    /// portable ones bit for bit.
    #[test]
    fn orders_are_accurate_and_vector_versions_match() {
        let mut seed = 99;
        for n in [16, 48, 64, 100, 256, 576, 1000] {
            let (w, x) = (row(&mut seed, n), row(&mut seed, n));
            let exact: f64 = w.iter().zip(&x).map(|(a, b)| a.to_f64() * b.to_f64()).sum();
            let mag: f64 = w.iter().zip(&x).map(|(a, b)| (a.to_f64() * b.to_f64()).abs()).sum();
            let v = dot_vec(&w, &x);
            let (w2, w3, w4) = (row(&mut seed, n), row(&mut seed, n), row(&mut seed, n));
            let rows = [&w[..], &w2, &w3, &w4];
            for path in [F16Path::VecDot, F16Path::TinyBlas] {
                if path == F16Path::TinyBlas && n % 16 != 0 {
                    continue;
                }
                if path == F16Path::TinyBlas {
                    let xs: Vec<Vec<f16>> = (0..4).map(|_| row(&mut seed, n)).collect();
                    let t = dot_tiny_4x4(rows, [&xs[0][..], &xs[1], &xs[2], &xs[3]]);
                    for (r, wr) in rows.iter().enumerate() {
                        for (c, xr) in xs.iter().enumerate() {
                            assert_eq!(t[r][c].to_bits(), dot(path, wr, xr).to_bits(), "4x4 n={n}");
                        }
                    }
                }
                let many = dot_rows(path, rows, &x);
                for (r, m) in rows.iter().zip(many) {
                    assert_eq!(m.to_bits(), dot(path, r, &x).to_bits(), "{path:?} rows n={n}");
                }
            }
            assert!((v as f64 - exact).abs() <= mag * 1e-6, "vec n={n}");
            assert_eq!(dot(F16Path::VecDot, &w, &x).to_bits(), v.to_bits(), "vec n={n}");
            if n % 16 == 0 {
                let t = dot_tiny(&w, &x);
                assert!((t as f64 - exact).abs() <= mag * 1e-6, "tiny n={n}");
                assert_eq!(dot(F16Path::TinyBlas, &w, &x).to_bits(), t.to_bits(), "tiny n={n}");
            }
        }
    }

    #[test]
    fn path_rules() {
        assert_eq!(F16Path::choose(256, 64, 5), F16Path::TinyBlas);
        assert_eq!(F16Path::choose(256, 64, 1), F16Path::VecDot);
        assert_eq!(F16Path::choose(255, 64, 5), F16Path::VecDot);
        assert_eq!(F16Path::choose(256, 40, 5), F16Path::VecDot);
    }
}
