//! Dot products of two float rows (f16, f32, or bf16 on CPUs without
//! AVX-512 BF16) in GGML's two accumulation orders.
//!
//! `ggml_mul_mat` with float weights brings the other operand to the
//! weight type (f32 stays f32) and then takes one of two paths (ggml-cpu.c
//! `ggml_compute_forward_mul_mat`):
//! - llamafile's tinyBLAS (`llamafile_sgemm`, AVX-512: `tinyBLAS<16,
//!   __m512, __m512, T, T, float>`) when the product has at least two
//!   activation rows (`n >= 2`), the weight row count is a multiple of 4
//!   and the row length a multiple of 16: one 16-lane accumulator per
//!   output, one FMA per 16 elements, then `_mm512_reduce_add_ps`;
//! - otherwise `ggml_vec_dot_f16` / `ggml_vec_dot_f32` per output: four
//!   16-lane accumulators over steps of 64 elements, combined as
//!   (a0 + a2) + (a1 + a3) and reduced; the elements after the last full
//!   step are added one by one, in f64 for f16 (`ggml_float`) and with an
//!   f32 FMA for f32 (`sumf += x[i]*y[i]`, contracted by GCC).
//!
//! Products of two f16 values are exact in f32, so for them an FMA is one
//! rounding of `acc + x*y`, which `acc + x * y` reproduces without an FMA
//! instruction; f32 products need `mul_add`, and so do bf16 products,
//! which have f32's exponent range and so can underflow (or overflow) f32.
//!
//! bf16 on CPUs with AVX-512 BF16 takes other orders (`bf16dot`).
//!
//! Each order has a portable version (`dot_tiny`, `dot_vec`), an AVX-512
//! one (one `__m512` per 16-lane vector) and an AVX2 one for CPUs with
//! AVX2, FMA and F16C but no AVX-512 (module `avx2`): it holds every
//! 16-lane vector as two `__m256` halves, lanes 0-7 and 8-15, and does the
//! same FMAs lane by lane, the same additions and the same reduction
//! (`reduce16`), so all three give the same bits. The dispatch functions
//! below pick the fastest the CPU has.

use super::reduce::reduce16;
use half::{bf16, f16};

/// Which of GGML's two orders a float product uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FloatOrder {
    TinyBlas,
    VecDot,
}

impl FloatOrder {
    /// The path `ggml_mul_mat` takes for weights of `rows x k` against
    /// `n_act` activation rows (per batch matrix), where tinyBLAS steps
    /// over `kn` elements at a time (16, or 32 for bf16 with AVX-512 BF16).
    pub(crate) fn choose(rows: usize, k: usize, n_act: usize, kn: usize) -> FloatOrder {
        if n_act >= 2 && rows.is_multiple_of(4) && k.is_multiple_of(kn) {
            FloatOrder::TinyBlas
        } else {
            FloatOrder::VecDot
        }
    }
}

/// An element type whose rows these orders multiply.
pub(crate) trait Elem: Copy + Send + Sync + 'static {
    /// `acc + w * x` with one rounding (GGML's FMA).
    fn madd(acc: f32, w: Self, x: Self) -> f32;
    /// `ggml_vec_dot`'s sum of the reduced vector lanes and the elements
    /// after the last 64-element step.
    fn vec_tail(reduced: f32, w: &[Self], x: &[Self]) -> f32;
    /// Sixteen elements from `p` widened to f32 lanes.
    ///
    /// # Safety
    /// AVX-512 F and F16C; `p` points at 16 readable elements.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
    /// Eight elements from `p` widened to f32 lanes (half of `load16`).
    ///
    /// # Safety
    /// AVX2 and F16C; `p` points at 8 readable elements.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8_avx2(p: *const Self) -> std::arch::x86_64::__m256;
}

/// `start` plus each product `w[i] * x[i]` (exact in f32 for 16-bit
/// floats) added in f64, rounded to f32 at the end: GGML's `ggml_float`
/// tails.
pub(crate) fn f64_tail<E: Copy>(start: f64, w: &[E], x: &[E], to_f32: fn(E) -> f32) -> f32 {
    let mut sum = start;
    for (a, b) in w.iter().zip(x) {
        sum += (to_f32(*a) * to_f32(*b)) as f64;
    }
    sum as f32
}

impl Elem for f16 {
    #[inline(always)]
    fn madd(acc: f32, w: f16, x: f16) -> f32 {
        acc + w.to_f32() * x.to_f32()
    }
    fn vec_tail(reduced: f32, w: &[f16], x: &[f16]) -> f32 {
        f64_tail(reduced as f64, w, x, f16::to_f32)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: forwarded from the caller.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8_avx2(p: *const f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: forwarded from the caller.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
}

impl Elem for f32 {
    #[inline(always)]
    fn madd(acc: f32, w: f32, x: f32) -> f32 {
        w.mul_add(x, acc)
    }
    fn vec_tail(reduced: f32, w: &[f32], x: &[f32]) -> f32 {
        let mut sum = reduced;
        for (a, b) in w.iter().zip(x) {
            sum = a.mul_add(*b, sum);
        }
        sum
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        // SAFETY: forwarded from the caller.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8_avx2(p: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: forwarded from the caller.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
}

/// bf16 in the orders of llama.cpp builds without AVX-512 BF16 (tinyBLAS
/// only: their `ggml_vec_dot_bf16` differs, see `bf16dot`).
impl Elem for bf16 {
    /// tinyBLAS's `_mm512_fmadd_ps` on the widened values. Unlike f16, a
    /// bf16 product can fall below f32's normal range (or above its
    /// largest value), where rounding it before the addition would give
    /// other bits than the FMA, so this needs `mul_add`.
    #[inline(always)]
    fn madd(acc: f32, w: bf16, x: bf16) -> f32 {
        w.to_f32().mul_add(x.to_f32(), acc)
    }
    fn vec_tail(reduced: f32, w: &[bf16], x: &[bf16]) -> f32 {
        f64_tail(reduced as f64, w, x, bf16::to_f32)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const bf16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: forwarded from the caller.
        unsafe {
            let h = _mm256_loadu_si256(p as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8_avx2(p: *const bf16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: forwarded from the caller.
        unsafe {
            let h = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
}

/// The dot product of `w` and `x` (equal lengths) in `order`.
#[inline]
pub(crate) fn dot<E: Elem>(order: FloatOrder, w: &[E], x: &[E]) -> f32 {
    dot_rows(order, [w], x)[0]
}

/// `N` dot products of rows `w[r]` with one `x`, each in `order` (the
/// same bits as `N` calls of `dot`).
///
/// One product is a single chain of dependent FMAs, so it runs at the
/// FMA's latency; `N` independent chains run at its throughput, and `x`
/// is loaded and widened once for all of them.
#[inline]
pub(crate) fn dot_rows<E: Elem, const N: usize>(order: FloatOrder, w: [&[E]; N], x: &[E]) -> [f32; N] {
    #[cfg(target_arch = "x86_64")]
    if w.iter().all(|r| r.len() == x.len()) {
        if super::has_avx512() {
            // SAFETY: AVX-512 F, FMA and F16C are present (checked above);
            // every row is as long as `x`.
            return unsafe {
                match order {
                    FloatOrder::TinyBlas => avx512::dot_tiny_rows(w, x),
                    FloatOrder::VecDot => avx512::dot_vec_rows(w, x),
                }
            };
        }
        if super::has_avx2_fma_f16c() {
            // SAFETY: AVX2, FMA and F16C are present (checked above); every
            // row is as long as `x`.
            return unsafe {
                match order {
                    FloatOrder::TinyBlas => avx2::dot_tiny_rows(w, x),
                    FloatOrder::VecDot => avx2::dot_vec_rows(w, x),
                }
            };
        }
    }
    w.map(|r| match order {
        FloatOrder::TinyBlas => dot_tiny(r, x),
        FloatOrder::VecDot => dot_vec(r, x),
    })
}

/// `dot_rows(FloatOrder::VecDot, w, x)` with `x_f32`, `x` widened to
/// f32 (the same bits): loads of `x` then need no conversion. For
/// matvecs, which widen their one activation row once for every row of
/// the weights.
#[inline]
pub(crate) fn dot_vec_rows_widened<E: Elem, const N: usize>(w: [&[E]; N], x: &[E], x_f32: &[f32]) -> [f32; N] {
    #[cfg(target_arch = "x86_64")]
    if x_f32.len() == x.len() && w.iter().all(|r| r.len() == x.len()) {
        if super::has_avx512() {
            // SAFETY: AVX-512 F, FMA and F16C are present (checked above);
            // every row, `x` and `x_f32` are of one length.
            return unsafe { avx512::dot_vec_rows_loading(w, x, x_f32) };
        }
        if super::has_avx2_fma_f16c() {
            // SAFETY: AVX2, FMA and F16C are present (checked above); every
            // row, `x` and `x_f32` are of one length.
            return unsafe { avx2::dot_vec_rows_loading(w, x, x_f32) };
        }
    }
    let _ = x_f32;
    w.map(|r| dot_vec(r, x))
}

/// `dot(FloatOrder::VecDot, w16[r], x)` for `N` f16 rows `w16[r]` given
/// widened to f32 (`w[r]`; widening is exact) against one shared f16 row
/// `x`: the shared row is loaded and widened once per step for all `N`
/// products and the rows need no conversion. For attention, where each key
/// or value row meets every query head of its group. The products are
/// the same (multiplication commutes), in the same order, so the bits are
/// those of `dot`. `None` unless every row is as long as `x`, a multiple of
/// 64 (no tail after the last step), and this CPU has a SIMD version.
#[inline]
pub(crate) fn dot_vec_shared<const N: usize>(w: [&[f32]; N], x: &[f16]) -> Option<[f32; N]> {
    if !x.len().is_multiple_of(64) || w.iter().any(|r| r.len() != x.len()) {
        return None;
    }
    // With no tail, `dot_vec_rows_loading`'s own `x` only gives the length.
    let len_of = w.first().map_or(&[][..], |r| *r);
    #[cfg(target_arch = "x86_64")]
    {
        if super::has_avx512() {
            // SAFETY: AVX-512 F, FMA and F16C are present (checked above);
            // every row, `len_of` and `x` are of one length.
            return Some(unsafe { avx512::dot_vec_rows_loading(w, len_of, x) });
        }
        if super::has_avx2_fma_f16c() {
            // SAFETY: AVX2, FMA and F16C are present (checked above); as above.
            return Some(unsafe { avx2::dot_vec_rows_loading(w, len_of, x) });
        }
    }
    let _ = len_of;
    None
}

/// tinyBLAS's order for four rows `w` against four rows `x` (all of one
/// length, a multiple of 16): `out[r][c]` has the bits of
/// `dot(FloatOrder::TinyBlas, w[r], x[c])`. Each loaded and widened row
/// meets four others, where `dot_rows` reads one shared row per product.
#[inline]
pub(crate) fn dot_tiny_4x4<E: Elem>(w: [&[E]; 4], x: [&[E]; 4]) -> [[f32; 4]; 4] {
    dot_tiny_tile(w, x)
}

/// `dot_tiny_4x4` for `R` rows `w` against `C` rows `x`.
#[inline]
pub(crate) fn dot_tiny_tile<E: Elem, const R: usize, const C: usize>(w: [&[E]; R], x: [&[E]; C]) -> [[f32; C]; R] {
    let n = x.first().map_or(0, |r| r.len());
    let ok = n.is_multiple_of(16) && w.iter().chain(&x).all(|r| r.len() == n);
    #[cfg(target_arch = "x86_64")]
    if ok && C > 0 {
        if super::has_avx512() {
            // SAFETY: AVX-512 F, FMA and F16C are present (checked above);
            // all rows are `n` long, a multiple of 16, and there is at least
            // one x.
            return unsafe { avx512::dot_tiny_tile(w, x) };
        }
        if super::has_avx2_fma_f16c() {
            // SAFETY: AVX2, FMA and F16C are present (checked above); all
            // rows are `n` long, a multiple of 16, and there is at least one
            // x.
            return unsafe { avx2::dot_tiny_tile(w, x) };
        }
    }
    let _ = ok;
    w.map(|wr| x.map(|xr| dot(FloatOrder::TinyBlas, wr, xr)))
}

/// tinyBLAS's order (portable). `w.len()` must be a multiple of 16.
pub(crate) fn dot_tiny<E: Elem>(w: &[E], x: &[E]) -> f32 {
    debug_assert!(w.len().is_multiple_of(16) && w.len() == x.len());
    let mut acc = [0f32; 16];
    for (wc, xc) in w.chunks_exact(16).zip(x.chunks_exact(16)) {
        for l in 0..16 {
            acc[l] = E::madd(acc[l], wc[l], xc[l]);
        }
    }
    reduce16(&acc)
}

/// `ggml_vec_dot_f16`'s / `ggml_vec_dot_f32`'s order (portable).
pub(crate) fn dot_vec<E: Elem>(w: &[E], x: &[E]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let n = w.len();
    let np = n & !63;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            let o = i + 16 * j;
            for l in 0..16 {
                a[l] = E::madd(a[l], w[o + l], x[o + l]);
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
    E::vec_tail(reduce16(&a0), &w[np..], &x[np..])
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use super::super::reduce::reduce16_avx512;
    use super::super::{prefetch_ahead, PREFETCH_MIN_ROW_BYTES};
    use super::Elem;
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn load<E: Elem>(p: &[E], at: usize) -> __m512 {
        // SAFETY: the callers keep `at + 16 <= p.len()` and enable AVX-512.
        unsafe { E::load16(p.as_ptr().add(at)) }
    }

    /// `dot_tiny` of `N` rows against one `x`.
    ///
    /// # Safety
    /// AVX-512 F and FMA; every row as long as `x`, a multiple of 16.
    #[target_feature(enable = "avx512f,avx512vl,fma,f16c")]
    pub(super) unsafe fn dot_tiny_rows<E: Elem, const N: usize>(w: [&[E]; N], x: &[E]) -> [f32; N] {
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

    /// `dot_tiny` of `R` rows against `C` rows.
    ///
    /// # Safety
    /// AVX-512 F and FMA; all rows of one length, a multiple of 16.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512vl,fma,f16c")]
    pub(super) unsafe fn dot_tiny_tile<E: Elem, const R: usize, const C: usize>(
        w: [&[E]; R],
        x: [&[E]; C],
    ) -> [[f32; C]; R] {
        // Plain loops, no closures: a closure is not compiled with this
        // function's target features, so its body would not be inlined.
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let mut l = 0;
        while l + 16 <= x[0].len() {
            // SAFETY: l + 16 <= the common length.
            unsafe {
                let mut xv = [_mm512_setzero_ps(); C];
                for c in 0..C {
                    xv[c] = load(x[c], l);
                }
                for r in 0..R {
                    let wv = load(w[r], l);
                    for c in 0..C {
                        acc[r][c] = _mm512_fmadd_ps(wv, xv[c], acc[r][c]);
                    }
                }
            }
            l += 16;
        }
        let mut out = [[0f32; C]; R];
        if R * C == 16 {
            // Sixteen outputs: one shared reduction (the same additions).
            // SAFETY: AVX-512 F is enabled for this function.
            let s = unsafe { super::super::reduce::reduce16x16_avx512(std::array::from_fn(|k| acc[k / C][k % C])) };
            for (k, v) in s.into_iter().enumerate() {
                out[k / C][k % C] = v;
            }
            return out;
        }
        for r in 0..R {
            for c in 0..C {
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
    #[target_feature(enable = "avx512f,avx512vl,fma,f16c")]
    pub(super) unsafe fn dot_vec_rows<E: Elem, const N: usize>(w: [&[E]; N], x: &[E]) -> [f32; N] {
        // SAFETY: forwarded from the caller.
        unsafe { dot_vec_rows_loading(w, x, x) }
    }

    /// `dot_vec_rows`, loading `x` from `xl`: the same values as `x` in
    /// another type (`x` widened to f32 once, which saves a conversion
    /// per load; widening a 16-bit float is exact, so the bits are the
    /// same). The tail after the last 64-element step reads `x`.
    ///
    /// # Safety
    /// AVX-512 F and FMA; every row, `x` and `xl` of one length.
    #[target_feature(enable = "avx512f,avx512vl,fma,f16c")]
    pub(crate) unsafe fn dot_vec_rows_loading<E: Elem, X: Elem, const N: usize>(
        w: [&[E]; N],
        x: &[E],
        xl: &[X],
    ) -> [f32; N] {
        let n = x.len();
        let np = n & !63;
        // a[j][r]: accumulator j (elements 16 j.. of each 64-element step)
        // of row r.
        let mut a = [[_mm512_setzero_ps(); N]; 4];
        let mut i = 0;
        let step_bytes = 64 * std::mem::size_of::<E>();
        // 16-bit rows only: F32 matvecs with two threads (weights past the
        // L3, the bandwidth of both cores taken) measured slower with it.
        let prefetch = std::mem::size_of::<E>() == 2 && std::mem::size_of_val(x) >= PREFETCH_MIN_ROW_BYTES;
        while i < np {
            if prefetch {
                for row in w.iter() {
                    // SAFETY: a prefetch reads nothing.
                    unsafe { prefetch_ahead(row.as_ptr().wrapping_add(i) as *const u8, step_bytes) };
                }
            }
            for (j, acc) in a.iter_mut().enumerate() {
                // SAFETY: i + 16 j + 16 <= np <= every row's length.
                unsafe {
                    let xv = load(xl, i + 16 * j);
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
            let reduced = unsafe { reduce16_avx512(s) };
            out[r] = E::vec_tail(reduced, &w[r][np..], &x[np..]);
        }
        out
    }
}

/// The AVX-512 versions' arithmetic for CPUs with AVX2, FMA and F16C but
/// no AVX-512. A 16-lane vector is two `__m256` halves (lanes 0-7 and
/// 8-15); each lane gets the same FMAs in the same order, and the final
/// sums are `reduce16`'s, so the bits are those of the portable versions.
/// With half the lanes per register, the register tiles are smaller: the
/// AVX-512 versions' accumulators would not fit in 16 `ymm` registers.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::super::reduce::{reduce16, reduce16_avx2};
    use super::super::{prefetch_ahead, PREFETCH_MIN_ROW_BYTES};
    use super::Elem;
    use std::arch::x86_64::*;

    /// Eight elements of `p` from `at`, widened to f32.
    #[inline(always)]
    unsafe fn load<E: Elem>(p: &[E], at: usize) -> __m256 {
        // SAFETY: the callers keep `at + 8 <= p.len()` and enable AVX2 and
        // F16C.
        unsafe { E::load8_avx2(p.as_ptr().add(at)) }
    }

    /// `dot_tiny` of `N` rows against one `x`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; every row as long as `x`, a multiple of 16.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_tiny_rows<E: Elem, const N: usize>(w: [&[E]; N], x: &[E]) -> [f32; N] {
        // acc[r][h]: lanes 8h..8h + 8 of row r's accumulator (four rows
        // take 8 registers, plus two for `x` and one for a row).
        let mut acc = [[_mm256_setzero_ps(); 2]; N];
        let mut l = 0;
        while l + 16 <= x.len() {
            // SAFETY: l + 16 <= x.len() == every row's length.
            unsafe {
                let (x0, x1) = (load(x, l), load(x, l + 8));
                for r in 0..N {
                    acc[r][0] = _mm256_fmadd_ps(load(w[r], l), x0, acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(load(w[r], l + 8), x1, acc[r][1]);
                }
            }
            l += 16;
        }
        let mut out = [0f32; N];
        for (o, [lo, hi]) in out.iter_mut().zip(acc) {
            // SAFETY: AVX is enabled for this function.
            *o = unsafe { reduce16_avx2(lo, hi) };
        }
        out
    }

    /// Elements of each row that `dot_tiny_tile` takes per block: all its
    /// passes over a block run before the next block, so the rows' block
    /// (2 KiB per f32 row) stays in L1 between passes.
    const TILE_BLOCK: usize = 512;
    /// Activation rows per pass of `dot_tiny_tile`: four weight rows by
    /// three activation rows are 12 accumulators, plus three registers for
    /// the activations and one for a weight row: all 16 `ymm` registers
    /// (tinyBLAS's AVX2 build uses 4 x 3 tiles of 8 lanes too).
    const TILE_COLS: usize = 3;

    /// `dot_tiny` of `R` rows against `C` rows.
    ///
    /// The 16 lanes of all `R x C` outputs would take `2 R C` registers (48
    /// for 4 x 6), so this makes passes over one 8-lane half and up to
    /// `TILE_COLS` rows of `x` at a time, keeping the accumulators in
    /// memory between passes. Lanes are independent, and each still gets
    /// its FMAs in element order, so the bits do not change.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; all rows of one length, a multiple of 16; `C > 0`.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_tiny_tile<E: Elem, const R: usize, const C: usize>(
        w: [&[E]; R],
        x: [&[E]; C],
    ) -> [[f32; C]; R] {
        // Plain loops, no closures: a closure is not compiled with this
        // function's target features, so its body would not be inlined.
        let n = x[0].len();
        // lanes[r][c]: the 16 accumulator lanes of output (r, c).
        let mut lanes = [[[0f32; 16]; C]; R];
        let mut start = 0;
        while start < n {
            let end = (start + TILE_BLOCK).min(n);
            let mut c0 = 0;
            while c0 < C {
                for half in [0, 8] {
                    // SAFETY: start and end are multiples of 16 within the
                    // rows, c0 < C, and AVX2, FMA and F16C are enabled.
                    unsafe {
                        match C - c0 {
                            1 => tile_pass::<E, R, C, 1>(&w, &x, &mut lanes, c0, half, start, end),
                            2 => tile_pass::<E, R, C, 2>(&w, &x, &mut lanes, c0, half, start, end),
                            _ => tile_pass::<E, R, C, TILE_COLS>(&w, &x, &mut lanes, c0, half, start, end),
                        }
                    }
                }
                c0 += TILE_COLS;
            }
            start = end;
        }
        let mut out = [[0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                out[r][c] = reduce16(&lanes[r][c]);
            }
        }
        out
    }

    /// One pass of `dot_tiny_tile`: lanes `half..half + 8` of the outputs
    /// `(r, c0 + c)` for `c < CB`, over the elements `start..end`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `c0 + CB <= C`; `start` and `end` multiples of
    /// 16, `end` at most the rows' length; `half` 0 or 8.
    #[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile_pass<E: Elem, const R: usize, const C: usize, const CB: usize>(
        w: &[&[E]; R],
        x: &[&[E]; C],
        lanes: &mut [[[f32; 16]; C]; R],
        c0: usize,
        half: usize,
        start: usize,
        end: usize,
    ) {
        let x = &x[c0..c0 + CB];
        let mut acc = [[_mm256_setzero_ps(); CB]; R];
        // SAFETY (all blocks below): `lanes[r][c0 + c]` holds 16 floats
        // and half + 8 <= 16; l + 8 <= end <= every row's length.
        for r in 0..R {
            for c in 0..CB {
                acc[r][c] = unsafe { _mm256_loadu_ps(lanes[r][c0 + c].as_ptr().add(half)) };
            }
        }
        let mut l = start + half;
        while l < end {
            unsafe {
                let mut xv = [_mm256_setzero_ps(); CB];
                for c in 0..CB {
                    xv[c] = load(x[c], l);
                }
                for r in 0..R {
                    let wv = load(w[r], l);
                    for c in 0..CB {
                        acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
                    }
                }
            }
            l += 16;
        }
        for r in 0..R {
            for c in 0..CB {
                unsafe { _mm256_storeu_ps(lanes[r][c0 + c].as_mut_ptr().add(half), acc[r][c]) };
            }
        }
    }

    /// `dot_vec` of `N` rows against one `x`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; every row as long as `x`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_vec_rows<E: Elem, const N: usize>(w: [&[E]; N], x: &[E]) -> [f32; N] {
        // SAFETY: forwarded from the caller.
        unsafe { dot_vec_rows_loading(w, x, x) }
    }

    /// `dot_vec_rows`, loading `x` from `xl`: the same values as `x` in
    /// another type (see `avx512::dot_vec_rows_loading`). The tail after
    /// the last 64-element step reads `x`.
    ///
    /// One row at a time: a row's four 16-lane accumulators are eight
    /// independent 8-lane FMA chains, enough to keep both FMA units busy,
    /// and those of four rows (32 registers) would not fit in 16.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; every row, `x` and `xl` of one length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_vec_rows_loading<E: Elem, X: Elem, const N: usize>(
        w: [&[E]; N],
        x: &[E],
        xl: &[X],
    ) -> [f32; N] {
        let n = x.len();
        let np = n & !63;
        let step_bytes = 64 * std::mem::size_of::<E>();
        // 16-bit rows only, as in `avx512::dot_vec_rows_loading`.
        let prefetch = std::mem::size_of::<E>() == 2 && std::mem::size_of_val(x) >= PREFETCH_MIN_ROW_BYTES;
        let mut out = [0f32; N];
        for (o, row) in out.iter_mut().zip(w) {
            // a[q]: elements 8q..8q + 8 of each 64-element step, i.e. lanes
            // 8 (q % 2).. of 16-lane accumulator q / 2.
            let mut a = [_mm256_setzero_ps(); 8];
            let mut i = 0;
            while i < np {
                if prefetch {
                    // SAFETY: a prefetch reads nothing.
                    unsafe { prefetch_ahead(row.as_ptr().wrapping_add(i) as *const u8, step_bytes) };
                }
                for (q, acc) in a.iter_mut().enumerate() {
                    // SAFETY: i + 8 q + 8 <= np <= every row's length.
                    *acc = unsafe { _mm256_fmadd_ps(load(row, i + 8 * q), load(xl, i + 8 * q), *acc) };
                }
                i += 64;
            }
            // (a0 + a2) + (a1 + a3) on each half of the 16-lane accumulators.
            let lo = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
            let hi = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
            // SAFETY: AVX is enabled for this function.
            let reduced = unsafe { reduce16_avx2(lo, hi) };
            *o = E::vec_tail(reduced, &row[np..], &x[np..]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);

    impl Rng {
        fn unit(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
        }
    }

    fn row<E: Elem>(rng: &mut Rng, n: usize, from: fn(f32) -> E) -> Vec<E> {
        (0..n).map(|_| from(rng.unit())).collect()
    }

    /// Both orders against an f64 sum (they differ from it only by f32
    /// rounding of partial sums), and the AVX-512 versions against the
    /// portable ones bit for bit.
    fn check_type<E: Elem>(from: fn(f32) -> E) {
        let mut rng = Rng(99);
        for n in [16, 48, 64, 100, 256, 576, 1000] {
            let (w, x) = (row(&mut rng, n, from), row(&mut rng, n, from));
            // Products as f32 (exact for f16 and bf16), summed in f64.
            let prod = |(a, b): (&E, &E)| E::madd(0.0, *a, *b) as f64;
            let exact: f64 = w.iter().zip(&x).map(prod).sum();
            let mag: f64 = w.iter().zip(&x).map(|p| prod(p).abs()).sum();
            let v = dot_vec(&w, &x);
            let (w2, w3, w4) = (row(&mut rng, n, from), row(&mut rng, n, from), row(&mut rng, n, from));
            let rows = [&w[..], &w2, &w3, &w4];
            for order in [FloatOrder::VecDot, FloatOrder::TinyBlas] {
                if order == FloatOrder::TinyBlas && n % 16 != 0 {
                    continue;
                }
                if order == FloatOrder::TinyBlas {
                    let xs: Vec<Vec<E>> = (0..6).map(|_| row(&mut rng, n, from)).collect();
                    let t = dot_tiny_4x4(rows, [&xs[0][..], &xs[1], &xs[2], &xs[3]]);
                    let t6 = dot_tiny_tile(rows, [&xs[0][..], &xs[1], &xs[2], &xs[3], &xs[4], &xs[5]]);
                    for (r, wr) in rows.iter().enumerate() {
                        for (c, xr) in xs.iter().enumerate() {
                            let want = dot_tiny(wr, xr).to_bits();
                            if c < 4 {
                                assert_eq!(t[r][c].to_bits(), want, "4x4 n={n}");
                            }
                            assert_eq!(t6[r][c].to_bits(), want, "4x6 n={n}");
                        }
                    }
                }
                let many = dot_rows(order, rows, &x);
                for (r, m) in rows.iter().zip(many) {
                    let one = match order {
                        FloatOrder::TinyBlas => dot_tiny(r, &x),
                        FloatOrder::VecDot => dot_vec(r, &x),
                    };
                    assert_eq!(m.to_bits(), one.to_bits(), "{order:?} rows n={n}");
                }
            }
            assert!((v as f64 - exact).abs() <= mag * 1e-6, "vec n={n}");
            assert_eq!(dot(FloatOrder::VecDot, &w, &x).to_bits(), v.to_bits(), "vec n={n}");
            if n % 16 == 0 {
                let t = dot_tiny(&w, &x);
                assert!((t as f64 - exact).abs() <= mag * 1e-6, "tiny n={n}");
                assert_eq!(dot(FloatOrder::TinyBlas, &w, &x).to_bits(), t.to_bits(), "tiny n={n}");
            }
        }
    }

    #[test]
    fn orders_are_accurate_and_vector_versions_match() {
        check_type::<f16>(f16::from_f32);
        check_type::<f32>(|v| v);
        check_type::<bf16>(bf16::from_f32);
    }

    /// A row whose values take each magnitude of `scales` in turn at
    /// random: unit values, tiny ones, denormal ones (as values, or as
    /// products in f32) and large ones.
    #[cfg(target_arch = "x86_64")]
    fn mixed_row<E: Elem>(rng: &mut Rng, n: usize, from: fn(f32) -> E, scales: &[f32]) -> Vec<E> {
        (0..n)
            .map(|_| {
                let pick = ((rng.unit() / 8.0 + 0.5) * scales.len() as f32) as usize;
                from(rng.unit() * scales[pick.min(scales.len() - 1)])
            })
            .collect()
    }

    /// The AVX2 versions (called directly: on a CPU with AVX-512 the
    /// dispatch never picks them) and the dispatched ones against the
    /// portable ones, bit for bit. Rows mix every magnitude of `scales`
    /// ([unit, tiny, denormal, large]), then hold only tiny and denormal
    /// values, whose products and sums are denormal for f32 and bf16.
    /// Returns how many results were subnormal.
    #[cfg(target_arch = "x86_64")]
    fn check_avx2<E: Elem>(from: fn(f32) -> E, to: fn(E) -> f32, scales: [f32; 4]) -> usize {
        let mut rng = Rng(2024);
        let mut subnormal = 0;
        let mut count = |v: f32| subnormal += v.is_subnormal() as usize;
        for mix in [&scales[..], &scales[1..3]] {
            for n in [1, 7, 16, 32, 48, 63, 64, 80, 100, 128, 192, 528, 576, 1000, 1040] {
                let rows: Vec<Vec<E>> = (0..4).map(|_| mixed_row(&mut rng, n, from, mix)).collect();
                let xs: Vec<Vec<E>> = (0..6).map(|_| mixed_row(&mut rng, n, from, mix)).collect();
                let w = [&rows[0][..], &rows[1], &rows[2], &rows[3]];
                let x = &xs[0][..];
                let xf: Vec<f32> = x.iter().map(|v| to(*v)).collect();
                let eq = |got: f32, want: f32, what: &str| {
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{what} n={n}: {got:e} vs portable {want:e}"
                    );
                };
                // SAFETY (all calls below): AVX2, FMA and F16C are checked by
                // the caller; all rows are `n` long, a multiple of 16 for
                // the tinyBLAS order, and every tile has rows of `x`.
                let (v1, v4, vw1, vw4) = unsafe {
                    (
                        avx2::dot_vec_rows([w[0]], x),
                        avx2::dot_vec_rows(w, x),
                        avx2::dot_vec_rows_loading([w[0]], x, &xf[..]),
                        avx2::dot_vec_rows_loading(w, x, &xf[..]),
                    )
                };
                let (d4, dw4) = (dot_rows(FloatOrder::VecDot, w, x), dot_vec_rows_widened(w, x, &xf));
                eq(v1[0], dot_vec(w[0], x), "vec N=1");
                eq(vw1[0], dot_vec(w[0], x), "vec widened N=1");
                for r in 0..4 {
                    let want = dot_vec(w[r], x);
                    eq(v4[r], want, "vec N=4");
                    eq(vw4[r], want, "vec widened N=4");
                    eq(d4[r], want, "dispatched vec N=4");
                    eq(dw4[r], want, "dispatched vec widened N=4");
                    count(want);
                }
                if n % 16 != 0 {
                    continue;
                }
                let (t1, t4, c1, c2, c4, c5, c6) = unsafe {
                    (
                        avx2::dot_tiny_rows([w[0]], x),
                        avx2::dot_tiny_rows(w, x),
                        avx2::dot_tiny_tile(w, [x]),
                        avx2::dot_tiny_tile(w, [x, &xs[1]]),
                        avx2::dot_tiny_tile(w, [x, &xs[1], &xs[2], &xs[3]]),
                        avx2::dot_tiny_tile(w, [x, &xs[1], &xs[2], &xs[3], &xs[4]]),
                        avx2::dot_tiny_tile(w, [x, &xs[1], &xs[2], &xs[3], &xs[4], &xs[5]]),
                    )
                };
                let d4 = dot_rows(FloatOrder::TinyBlas, w, x);
                let d6 = dot_tiny_tile(w, [x, &xs[1], &xs[2], &xs[3], &xs[4], &xs[5]]);
                eq(t1[0], dot_tiny(w[0], x), "tiny N=1");
                for r in 0..4 {
                    eq(t4[r], dot_tiny(w[r], x), "tiny N=4");
                    eq(d4[r], dot_tiny(w[r], x), "dispatched tiny N=4");
                    for (c, xc) in xs.iter().enumerate() {
                        let want = dot_tiny(w[r], xc);
                        count(want);
                        if c < 1 {
                            eq(c1[r][c], want, "tile 4x1");
                        }
                        if c < 2 {
                            eq(c2[r][c], want, "tile 4x2");
                        }
                        if c < 4 {
                            eq(c4[r][c], want, "tile 4x4");
                        }
                        if c < 5 {
                            eq(c5[r][c], want, "tile 4x5");
                        }
                        eq(c6[r][c], want, "tile 4x6");
                        eq(d6[r][c], want, "dispatched tile 4x6");
                    }
                }
            }
        }
        subnormal
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_versions_match_the_portable_ones() {
        if !crate::ggml::has_avx2_fma_f16c() {
            eprintln!("skipped: this CPU has no AVX2, FMA and F16C");
            return;
        }
        // f16: 1e-6 is an f16 denormal; products of f16 stay normal in f32.
        check_avx2::<f16>(f16::from_f32, f16::to_f32, [1.0, 1e-3, 1e-6, 1e4]);
        // f32 and bf16: tiny values whose products are denormal in f32
        // (rounded by the FMA only), denormal values, large values whose
        // sums stay finite.
        let f32_sub = check_avx2::<f32>(|v| v, |v| v, [1.0, 1e-20, 1e-39, 1e15]);
        let bf16_sub = check_avx2::<bf16>(bf16::from_f32, bf16::to_f32, [1.0, 1e-20, 1e-39, 1e15]);
        // The tiny rows must reach the denormal range, or they test nothing
        // that the unit values do not.
        assert!(
            f32_sub > 0 && bf16_sub > 0,
            "no subnormal results: {f32_sub}, {bf16_sub}"
        );
    }

    #[test]
    fn order_rules() {
        assert_eq!(FloatOrder::choose(256, 64, 5, 16), FloatOrder::TinyBlas);
        assert_eq!(FloatOrder::choose(256, 64, 1, 16), FloatOrder::VecDot);
        assert_eq!(FloatOrder::choose(255, 64, 5, 16), FloatOrder::VecDot);
        assert_eq!(FloatOrder::choose(256, 40, 5, 16), FloatOrder::VecDot);
        assert_eq!(FloatOrder::choose(256, 48, 5, 32), FloatOrder::VecDot);
    }
}
