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
//! Products of two f16 (or bf16) values are exact in f32, so for them an
//! FMA is one rounding of `acc + x*y`, which `acc + x * y` reproduces
//! without an FMA instruction; f32 products need `mul_add`.
//!
//! bf16 on CPUs with AVX-512 BF16 takes other orders (`bf16dot`).

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
}

/// bf16 in the orders of llama.cpp builds without AVX-512 BF16 (tinyBLAS
/// only: their `ggml_vec_dot_bf16` differs, see `bf16dot`).
impl Elem for bf16 {
    #[inline(always)]
    fn madd(acc: f32, w: bf16, x: bf16) -> f32 {
        acc + w.to_f32() * x.to_f32()
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
    if super::has_avx512() && w.iter().all(|r| r.len() == x.len()) {
        // SAFETY: AVX-512 F, FMA and F16C are present (checked above); every
        // row is as long as `x`.
        return unsafe {
            match order {
                FloatOrder::TinyBlas => avx512::dot_tiny_rows(w, x),
                FloatOrder::VecDot => avx512::dot_vec_rows(w, x),
            }
        };
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
    if super::has_avx512() && x_f32.len() == x.len() && w.iter().all(|r| r.len() == x.len()) {
        // SAFETY: AVX-512 F, FMA and F16C are present (checked above); every
        // row, `x` and `x_f32` are of one length.
        return unsafe { avx512::dot_vec_rows_loading(w, x, x_f32) };
    }
    let _ = x_f32;
    w.map(|r| dot_vec(r, x))
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
    if ok && C > 0 && super::has_avx512() {
        // SAFETY: AVX-512 F, FMA and F16C are present (checked above); all
        // rows are `n` long, a multiple of 16, and there is at least one x.
        return unsafe { avx512::dot_tiny_tile(w, x) };
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
mod avx512 {
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
    #[target_feature(enable = "avx512f,fma,f16c")]
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
    #[target_feature(enable = "avx512f,fma,f16c")]
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
    #[target_feature(enable = "avx512f,fma,f16c")]
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
    #[target_feature(enable = "avx512f,fma,f16c")]
    pub(super) unsafe fn dot_vec_rows_loading<E: Elem, X: Elem, const N: usize>(
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

    #[test]
    fn order_rules() {
        assert_eq!(FloatOrder::choose(256, 64, 5, 16), FloatOrder::TinyBlas);
        assert_eq!(FloatOrder::choose(256, 64, 1, 16), FloatOrder::VecDot);
        assert_eq!(FloatOrder::choose(255, 64, 5, 16), FloatOrder::VecDot);
        assert_eq!(FloatOrder::choose(256, 40, 5, 16), FloatOrder::VecDot);
        assert_eq!(FloatOrder::choose(256, 48, 5, 32), FloatOrder::VecDot);
    }
}
