//! Dot products of two bf16 rows in the orders of the llama.cpp build for
//! this CPU.
//!
//! A llama.cpp built for a CPU with AVX-512 BF16 sums bf16 products with
//! `vdpbf16ps`, which adds two products to each f32 lane per instruction
//! (sgemm.cpp `tinyBLAS<32, __m512, __m512bh, ...>`, vec.cpp
//! `ggml_vec_dot_bf16`); builds without it widen bf16 to f32 lanes. So the
//! bits of a bf16 product depend on the CPU, and these functions follow the
//! build for the CPU they run on (`has_dpbf16`):
//!
//! - with AVX-512 BF16: tinyBLAS steps over 32 elements, lane `l` taking
//!   the pair `2l, 2l + 1` of each step, one accumulator per output, then
//!   `_mm512_reduce_add_ps`; `ggml_vec_dot_bf16` keeps two accumulators,
//!   for elements `0..32` and `32..64` of each 64-element step, reduces
//!   each, and adds both and the tail's products in f64;
//! - without it: tinyBLAS is `floatdot`'s 16-lane order; the vec order has
//!   two 16-lane accumulators over 32-element steps, then the same f64 sum.
//!
//! Each has a portable version; the `vdpbf16ps` orders an AVX-512 BF16 one
//! (module `avx512`). Without AVX-512 BF16, tinyBLAS runs `floatdot`'s
//! versions (AVX-512 or AVX2 by the CPU) and the vec order an AVX2 one
//! (module `avx2`: each 16-lane accumulator as two `__m256` halves, the
//! same additions lane by lane, the same `reduce16`, so the same bits),
//! on CPUs with AVX-512 F but not BF16 as well. A CPU with only AVX2 never
//! has AVX-512 BF16, so the `vdpbf16ps` orders need no AVX2 version.
//!
//! `vdpbf16ps` computes, per lane, `acc += w[2l+1] * x[2l+1]`, then
//! `acc += w[2l] * x[2l]`, each an FMA rounded to nearest even, reading
//! denormal inputs as zero and flushing denormal results to zero (Intel
//! SDM). `dp_lane` emulates that on other CPUs and in the tests.

use super::floatdot::{self, FloatOrder};
use super::reduce::reduce16;
use half::bf16;

/// Whether this CPU has AVX-512 BF16 (and so llama.cpp's build for it
/// sums with `vdpbf16ps`).
pub(crate) fn has_dpbf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| super::has_avx512() && is_x86_feature_detected!("avx512bf16"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The elements tinyBLAS steps over on this CPU (its `KN`).
pub(crate) fn tiny_step() -> usize {
    if has_dpbf16() {
        32
    } else {
        16
    }
}

/// `N` dot products of rows `w[r]` with one `x` (equal lengths) in
/// `order`, as this CPU's llama.cpp build computes them.
pub(crate) fn dot_rows<const N: usize>(order: FloatOrder, w: [&[bf16]; N], x: &[bf16]) -> [f32; N] {
    if !has_dpbf16() {
        return match order {
            // floatdot picks its AVX-512 or AVX2 version.
            FloatOrder::TinyBlas => floatdot::dot_rows(order, w, x),
            FloatOrder::VecDot => dot_vec_f_rows(w, x),
        };
    }
    #[cfg(target_arch = "x86_64")]
    if w.iter().all(|r| r.len() == x.len()) {
        // SAFETY: AVX-512 F and BF16 are present (`has_dpbf16`); every row
        // is as long as `x`.
        return unsafe {
            match order {
                FloatOrder::TinyBlas => avx512::dot_tiny_rows(w, x),
                FloatOrder::VecDot => avx512::dot_vec_rows(w, x),
            }
        };
    }
    w.map(|r| match order {
        FloatOrder::TinyBlas => dot_tiny_dp(r, x),
        FloatOrder::VecDot => dot_vec_dp(r, x),
    })
}

/// tinyBLAS's order for `R` rows against `C` rows (all of one length, a
/// multiple of `tiny_step()`): `out[r][c]` has the bits of
/// `dot_rows(FloatOrder::TinyBlas, [w[r]], x[c])`.
pub(crate) fn dot_tiny_tile<const R: usize, const C: usize>(w: [&[bf16]; R], x: [&[bf16]; C]) -> [[f32; C]; R] {
    if !has_dpbf16() {
        // floatdot picks its AVX-512 or AVX2 version.
        return floatdot::dot_tiny_tile(w, x);
    }
    let n = x.first().map_or(0, |r| r.len());
    #[cfg(target_arch = "x86_64")]
    if C > 0 && n.is_multiple_of(32) && w.iter().chain(&x).all(|r| r.len() == n) {
        // SAFETY: AVX-512 F and BF16 are present; all rows are `n` long, a
        // multiple of 32, and there is at least one x.
        return unsafe { avx512::dot_tiny_tile(w, x) };
    }
    let _ = n;
    w.map(|wr| x.map(|xr| dot_tiny_dp(wr, xr)))
}

/// A denormal read as a zero of the same sign (DAZ), or flushed to one (FTZ).
fn flush(v: f32) -> f32 {
    if v.is_subnormal() {
        f32::from_bits(v.to_bits() & 0x8000_0000)
    } else {
        v
    }
}

/// One lane of `vdpbf16ps`: `acc` plus the products of the pairs `w`, `x`,
/// the odd element first.
fn dp_lane(acc: f32, w: [bf16; 2], x: [bf16; 2]) -> f32 {
    let t = flush(flush(w[1].to_f32()).mul_add(flush(x[1].to_f32()), flush(acc)));
    flush(flush(w[0].to_f32()).mul_add(flush(x[0].to_f32()), t))
}

/// Sixteen `vdpbf16ps` lanes over 32 elements.
fn dp_step(acc: &mut [f32; 16], w: &[bf16], x: &[bf16]) {
    for l in 0..16 {
        acc[l] = dp_lane(acc[l], [w[2 * l], w[2 * l + 1]], [x[2 * l], x[2 * l + 1]]);
    }
}

/// tinyBLAS with `vdpbf16ps` (portable). The length must be a multiple of 32.
fn dot_tiny_dp(w: &[bf16], x: &[bf16]) -> f32 {
    let mut acc = [0f32; 16];
    for (wc, xc) in w.chunks_exact(32).zip(x.chunks_exact(32)) {
        dp_step(&mut acc, wc, xc);
    }
    reduce16(&acc)
}

/// The f64 sum `ggml_vec_dot_bf16` ends with: two reduced accumulators,
/// then each product after the last full step.
fn vec_finish(r1: f32, r2: f32, w: &[bf16], x: &[bf16]) -> f32 {
    floatdot::f64_tail(r1 as f64 + r2 as f64, w, x, bf16::to_f32)
}

/// `ggml_vec_dot_bf16` with `vdpbf16ps` (portable).
fn dot_vec_dp(w: &[bf16], x: &[bf16]) -> f32 {
    let np = w.len() & !63;
    let (mut c1, mut c2) = ([0f32; 16], [0f32; 16]);
    for i in (0..np).step_by(64) {
        dp_step(&mut c1, &w[i..i + 32], &x[i..i + 32]);
        dp_step(&mut c2, &w[i + 32..i + 64], &x[i + 32..i + 64]);
    }
    vec_finish(reduce16(&c1), reduce16(&c2), &w[np..], &x[np..])
}

/// `dot_vec_f` of `N` rows `w[r]` against one `x`, with the AVX2 version
/// where the CPU has it.
fn dot_vec_f_rows<const N: usize>(w: [&[bf16]; N], x: &[bf16]) -> [f32; N] {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2_fma_f16c() && w.iter().all(|r| r.len() == x.len()) {
        // SAFETY: AVX2, FMA and F16C are present (checked above); every row
        // is as long as `x`.
        return unsafe { avx2::dot_vec_f_rows(w, x) };
    }
    w.map(|r| dot_vec_f(r, x))
}

/// `ggml_vec_dot_bf16` of builds with AVX-512 F but not BF16: the products
/// (rounded to f32: a multiplication, then an addition) added to two
/// 16-lane accumulators.
fn dot_vec_f(w: &[bf16], x: &[bf16]) -> f32 {
    let np = w.len() & !31;
    let (mut c1, mut c2) = ([0f32; 16], [0f32; 16]);
    for i in (0..np).step_by(32) {
        for l in 0..16 {
            c1[l] += w[i + l].to_f32() * x[i + l].to_f32();
            c2[l] += w[i + 16 + l].to_f32() * x[i + 16 + l].to_f32();
        }
    }
    vec_finish(reduce16(&c1), reduce16(&c2), &w[np..], &x[np..])
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::super::reduce::reduce16_avx512;
    use super::super::{prefetch_ahead, PREFETCH_MIN_ROW_BYTES};
    use half::bf16;
    use std::arch::x86_64::*;

    /// 32 bf16 values from `p[at..]`.
    #[inline(always)]
    unsafe fn load(p: &[bf16], at: usize) -> __m512bh {
        // SAFETY: the callers keep `at + 32 <= p.len()`; __m512bh is 32
        // bf16 values, the same 64 bytes as __m512i.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p.as_ptr().add(at) as *const _)) }
    }

    /// `dot_tiny_dp` of `N` rows against one `x`.
    ///
    /// # Safety
    /// AVX-512 F and BF16; every row as long as `x`, a multiple of 32.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn dot_tiny_rows<const N: usize>(w: [&[bf16]; N], x: &[bf16]) -> [f32; N] {
        let mut acc = [_mm512_setzero_ps(); N];
        let mut l = 0;
        while l + 32 <= x.len() {
            // SAFETY: l + 32 <= x.len() == every row's length.
            unsafe {
                let xv = load(x, l);
                for r in 0..N {
                    acc[r] = _mm512_dpbf16_ps(acc[r], load(w[r], l), xv);
                }
            }
            l += 32;
        }
        let mut out = [0f32; N];
        for (o, a) in out.iter_mut().zip(acc) {
            // SAFETY: AVX-512 F is enabled for this function.
            *o = unsafe { reduce16_avx512(a) };
        }
        out
    }

    /// `dot_tiny_dp` of `R` rows against `C` rows.
    ///
    /// # Safety
    /// AVX-512 F and BF16; all rows of one length, a multiple of 32.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn dot_tiny_tile<const R: usize, const C: usize>(
        w: [&[bf16]; R],
        x: [&[bf16]; C],
    ) -> [[f32; C]; R] {
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let mut l = 0;
        while l + 32 <= x[0].len() {
            // SAFETY: l + 32 <= the common length.
            unsafe {
                let mut xv = [load(x[0], l); C];
                for c in 1..C {
                    xv[c] = load(x[c], l);
                }
                for r in 0..R {
                    let wv = load(w[r], l);
                    for c in 0..C {
                        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], wv, xv[c]);
                    }
                }
            }
            l += 32;
        }
        let mut out = [[0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                // SAFETY: AVX-512 F is enabled for this function.
                out[r][c] = unsafe { reduce16_avx512(acc[r][c]) };
            }
        }
        out
    }

    /// `dot_vec_dp` of `N` rows against one `x`.
    ///
    /// # Safety
    /// AVX-512 F and BF16; every row as long as `x`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn dot_vec_rows<const N: usize>(w: [&[bf16]; N], x: &[bf16]) -> [f32; N] {
        let n = x.len();
        let np = n & !63;
        let mut c = [[_mm512_setzero_ps(); N]; 2];
        let mut i = 0;
        let prefetch = n * 2 >= PREFETCH_MIN_ROW_BYTES;
        while i < np {
            if prefetch {
                for row in w.iter() {
                    // SAFETY: a prefetch reads nothing.
                    unsafe { prefetch_ahead(row.as_ptr().wrapping_add(i) as *const u8, 128) };
                }
            }
            // SAFETY: i + 64 <= np <= every row's length.
            unsafe {
                let (x1, x2) = (load(x, i), load(x, i + 32));
                for r in 0..N {
                    c[0][r] = _mm512_dpbf16_ps(c[0][r], load(w[r], i), x1);
                    c[1][r] = _mm512_dpbf16_ps(c[1][r], load(w[r], i + 32), x2);
                }
            }
            i += 64;
        }
        let mut out = [0f32; N];
        for r in 0..N {
            // SAFETY: AVX-512 F is enabled for this function.
            let (r1, r2) = unsafe { (reduce16_avx512(c[0][r]), reduce16_avx512(c[1][r])) };
            out[r] = super::vec_finish(r1, r2, &w[r][np..], &x[np..]);
        }
        out
    }
}

/// `dot_vec_f` for CPUs with AVX2 (and those with AVX-512 F but not
/// BF16, which have no other vector version of it).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::super::reduce::reduce16_avx2;
    use super::super::{prefetch_ahead, PREFETCH_MIN_ROW_BYTES};
    use half::bf16;
    use std::arch::x86_64::*;

    /// Eight bf16 values from `p[at..]` widened to f32 (exact: the bf16
    /// bits are the upper half of the f32's).
    #[inline(always)]
    unsafe fn load(p: &[bf16], at: usize) -> __m256 {
        // SAFETY: the callers keep `at + 8 <= p.len()` and enable AVX2.
        unsafe {
            let h = _mm_loadu_si128(p.as_ptr().add(at) as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }

    /// `dot_vec_f` of `N` rows against one `x`, one row at a time (its two
    /// 16-lane accumulators are four 8-lane registers).
    ///
    /// # Safety
    /// AVX2; every row as long as `x`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_vec_f_rows<const N: usize>(w: [&[bf16]; N], x: &[bf16]) -> [f32; N] {
        let n = x.len();
        let np = n & !31;
        let prefetch = n * 2 >= PREFETCH_MIN_ROW_BYTES;
        let mut out = [0f32; N];
        for (o, row) in out.iter_mut().zip(w) {
            // c[q]: elements 8q..8q + 8 of each 32-element step: c[0], c[1]
            // are the halves of `dot_vec_f`'s c1, c[2], c[3] those of c2.
            let mut c = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i < np {
                if prefetch {
                    // SAFETY: a prefetch reads nothing.
                    unsafe { prefetch_ahead(row.as_ptr().wrapping_add(i) as *const u8, 64) };
                }
                for (q, acc) in c.iter_mut().enumerate() {
                    // SAFETY: i + 8 q + 8 <= np <= every row's length. A
                    // multiplication, then an addition, not an FMA: the
                    // portable version rounds the product first (it can
                    // underflow f32).
                    *acc = unsafe { _mm256_add_ps(*acc, _mm256_mul_ps(load(row, i + 8 * q), load(x, i + 8 * q))) };
                }
                i += 32;
            }
            // SAFETY: AVX is enabled for this function.
            let (r1, r2) = unsafe { (reduce16_avx2(c[0], c[1]), reduce16_avx2(c[2], c[3])) };
            *o = super::vec_finish(r1, r2, &row[np..], &x[np..]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random bf16 values, with every 13th an arbitrary non-NaN bit
    /// pattern (denormals, tiny and huge values).
    fn row(seed: &mut u64, n: usize) -> Vec<bf16> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                let b = if seed.is_multiple_of(13) {
                    let b = (*seed >> 20) as u16;
                    if b & 0x7f80 == 0x7f80 {
                        b & 0x807f
                    } else {
                        b
                    }
                } else {
                    bf16::from_f32(((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0).to_bits()
                };
                bf16::from_bits(b)
            })
            .collect()
    }

    /// The emulated `vdpbf16ps` against the instruction, lane by lane, on
    /// values that include denormal inputs and results.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn emulated_dpbf16_matches_the_instruction() {
        if !has_dpbf16() {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return;
        }
        let mut seed = 7u64;
        for _ in 0..2000 {
            let (w, x) = (row(&mut seed, 32), row(&mut seed, 32));
            let mut acc = [0f32; 16];
            for (l, a) in acc.iter_mut().enumerate() {
                // Accumulators from products of small values: some denormal.
                *a = w[l].to_f32() * x[l].to_f32() * if l % 3 == 0 { 1e-38 } else { 1.0 };
            }
            let mut want = acc;
            dp_step(&mut want, &w, &x);
            // SAFETY: AVX-512 F and BF16 checked above; 32 values each.
            let got = unsafe {
                use std::arch::x86_64::{
                    __m512bh, _mm512_dpbf16_ps, _mm512_loadu_ps, _mm512_loadu_si512, _mm512_storeu_ps,
                };
                #[target_feature(enable = "avx512f,avx512bf16")]
                unsafe fn one(acc: &[f32; 16], w: &[bf16], x: &[bf16]) -> [f32; 16] {
                    // SAFETY: forwarded from the caller.
                    unsafe {
                        let a = _mm512_loadu_ps(acc.as_ptr());
                        let wv: __m512bh = std::mem::transmute(_mm512_loadu_si512(w.as_ptr() as *const _));
                        let xv: __m512bh = std::mem::transmute(_mm512_loadu_si512(x.as_ptr() as *const _));
                        let mut o = [0f32; 16];
                        _mm512_storeu_ps(o.as_mut_ptr(), _mm512_dpbf16_ps(a, wv, xv));
                        o
                    }
                }
                one(&acc, &w, &x)
            };
            for l in 0..16 {
                assert!(
                    got[l].to_bits() == want[l].to_bits() || (got[l].is_nan() && want[l].is_nan()),
                    "lane {l}: {:e} vs emulated {:e}",
                    got[l],
                    want[l]
                );
            }
        }
    }

    /// bf16 values of one of four magnitudes at random: unit, tiny (their
    /// products are denormal in f32), denormal, large (sums stay finite).
    #[cfg(target_arch = "x86_64")]
    fn mixed_row(seed: &mut u64, n: usize, scales: &[f32]) -> Vec<bf16> {
        (0..n)
            .map(|_| {
                *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let scale = scales[(*seed >> 61) as usize % scales.len()];
                bf16::from_f32(((*seed >> 20) as u32 as f32 / 4294967296.0 - 0.5) * 8.0 * scale)
            })
            .collect()
    }

    /// The AVX2 vec order against `dot_vec_f`, called directly (on a CPU
    /// with AVX-512 BF16 the dispatch never picks it), for one and four
    /// rows, on lengths with and without a tail: bit for bit on rows of
    /// every magnitude, then of tiny and denormal values only (results in
    /// f32's denormal range, where a fused multiply-add would round
    /// differently), then on `row`'s arbitrary bit patterns (which can
    /// overflow to infinities and NaNs).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_vec_order_matches_the_portable_one() {
        if !crate::ggml::has_avx2_fma_f16c() {
            eprintln!("skipped: this CPU has no AVX2, FMA and F16C");
            return;
        }
        let mut seed = 5u64;
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        let scales = [1.0, 1e-20, 1e-39, 1e15];
        let mut subnormal = 0;
        for n in [1, 16, 31, 32, 33, 63, 64, 96, 100, 576, 1000, 1040, 1536] {
            for source in 0..3 {
                let rows: Vec<Vec<bf16>> = (0..5)
                    .map(|_| match source {
                        0 => mixed_row(&mut seed, n, &scales),
                        1 => mixed_row(&mut seed, n, &scales[1..3]),
                        _ => row(&mut seed, n),
                    })
                    .collect();
                let (w, x) = ([&rows[0][..], &rows[1], &rows[2], &rows[3]], &rows[4][..]);
                // SAFETY: AVX2, FMA and F16C checked above; all rows `n` long.
                let (v1, v4) = unsafe { (avx2::dot_vec_f_rows([w[0]], x), avx2::dot_vec_f_rows(w, x)) };
                let check = |got: f32, want: f32, what: &str| {
                    if source < 2 {
                        assert_eq!(got.to_bits(), want.to_bits(), "{what} n={n}: {got:e} vs {want:e}");
                    } else {
                        assert!(same(got, want), "{what} n={n} (bit patterns): {got:e} vs {want:e}");
                    }
                };
                check(v1[0], dot_vec_f(w[0], x), "N=1");
                for r in 0..4 {
                    let want = dot_vec_f(w[r], x);
                    check(v4[r], want, "N=4");
                    subnormal += want.is_subnormal() as usize;
                }
            }
        }
        // The tiny rows must reach the denormal range to test it.
        assert!(subnormal > 0, "no subnormal results");
    }

    /// The vector versions against the portable ones, bit for bit.
    #[test]
    fn vector_versions_match_the_portable_ones() {
        let mut seed = 11u64;
        for n in [32, 64, 96, 100, 576, 1536] {
            let rows: Vec<Vec<bf16>> = (0..4).map(|_| row(&mut seed, n)).collect();
            let xs: Vec<Vec<bf16>> = (0..4).map(|_| row(&mut seed, n)).collect();
            let w = [&rows[0][..], &rows[1], &rows[2], &rows[3]];
            type Dot = fn(&[bf16], &[bf16]) -> f32;
            let (vec1, tiny1): (Dot, Dot) = if has_dpbf16() {
                (dot_vec_dp, dot_tiny_dp)
            } else {
                (dot_vec_f, floatdot::dot_tiny)
            };
            let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
            let v = dot_rows(FloatOrder::VecDot, w, &xs[0]);
            for r in 0..4 {
                assert!(same(v[r], vec1(w[r], &xs[0])), "vec n={n}");
            }
            if n % tiny_step() == 0 {
                let t = dot_rows(FloatOrder::TinyBlas, w, &xs[0]);
                let t4 = dot_tiny_tile(w, [&xs[0][..], &xs[1], &xs[2], &xs[3]]);
                let t6 = dot_tiny_tile(w, [&xs[0][..], &xs[1], &xs[2], &xs[3], &xs[0], &xs[1]]);
                for r in 0..4 {
                    assert!(same(t[r], tiny1(w[r], &xs[0])), "tiny n={n}");
                    for c in 0..4 {
                        assert!(same(t4[r][c], tiny1(w[r], &xs[c])), "4x4 n={n}");
                        assert!(same(t6[r][c], tiny1(w[r], &xs[c])), "4x6 n={n}");
                    }
                }
            }
        }
    }
}
