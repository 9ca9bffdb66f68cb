//! AVX-512 VNNI kernels for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights in
//! llama.cpp's exact order (see `ggml_exact` for the order itself), fast.
//!
//! Every output keeps its own eight f32 lanes, lane l taking
//! `fma(d_w * d_a, sum of products 4l..4l+3, lane)` block after block,
//! then llama.cpp's `hsum`. What these kernels change is only how that
//! work is laid out: a 512-bit register holds the eight lanes of *two*
//! outputs (two weight rows against one activation row for matvecs, one
//! weight row against two activation rows for batches), so one
//! `vpdpbusd`, one conversion and one FMA serve two outputs and the two
//! accumulators of a four-output call form independent FMA chains. The
//! per-lane sequence of f32 operations of each output is unchanged, and
//! the integer sums are exact, so the bits equal the scalar kernel's.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes: weights are decoded to
//! unsigned `q + OFF` and `OFF * sum(a)` is taken off per lane (exact in
//! i32); the scales of four outputs are converted by one `vcvtph2ps`.

use super::{blocks, blocks4, Layout, WIq4Nl, W4_0, W4_1, W5_0, W5_1, W8_0};
use crate::qmatmul::kernels::prefetch_rows_ahead;
use std::arch::x86_64::*;

/// A weight type's blocks as unsigned bytes `q + OFF` in element order.
pub(super) trait Unsigned: Layout {
    /// What the decoders add to the signed quants.
    const OFF: u8;

    /// The block at `w`.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL and AVX2 must be available; `w` must point at a
    /// whole weight block.
    unsafe fn one(w: *const u8) -> __m256i;

    /// The blocks at `w0` (bytes 0..32) and `w1` (bytes 32..64).
    ///
    /// # Safety
    /// As `one`, for both pointers.
    unsafe fn two(w0: *const u8, w1: *const u8) -> __m512i;
}

/// The 32 nibbles of the 16 bytes at `q`: low nibbles in bytes 0..16
/// (elements 0..16), high nibbles in bytes 16..32.
#[inline(always)]
unsafe fn nib1(q: *const u8) -> __m256i {
    // SAFETY: 16 readable bytes at `q` (caller); AVX2 in the kernel. The
    // upper 128 bits' dwords shifted right by 4 bring the high nibbles
    // down; the mask drops bits from the neighbouring byte.
    unsafe {
        let x = _mm256_broadcastsi128_si256(_mm_loadu_si128(q.cast()));
        let x = _mm256_srlv_epi32(x, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
        _mm256_and_si256(x, _mm256_set1_epi8(0x0F))
    }
}

/// `nib1` of `q0` in bytes 0..32 and of `q1` in bytes 32..64.
#[inline(always)]
unsafe fn nib2(q0: *const u8, q1: *const u8) -> __m512i {
    // SAFETY: 16 readable bytes at `q0` and `q1` (caller); AVX-512 in the
    // kernel.
    unsafe {
        let x0 = _mm256_broadcastsi128_si256(_mm_loadu_si128(q0.cast()));
        let x1 = _mm256_broadcastsi128_si256(_mm_loadu_si128(q1.cast()));
        let x = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(x0), x1);
        let shift = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4);
        _mm512_and_si512(_mm512_srlv_epi32(x, shift), _mm512_set1_epi8(0x0F))
    }
}

/// The little-endian u32 at `p`.
#[inline(always)]
unsafe fn u32_at(p: *const u8) -> u32 {
    // SAFETY: four readable bytes at `p` (caller).
    unsafe { p.cast::<u32>().read_unaligned() }
}

/// The little-endian u16 at `p`, widened.
#[inline(always)]
unsafe fn u16_at(p: *const u8) -> u64 {
    // SAFETY: two readable bytes at `p` (caller).
    unsafe { p.cast::<u16>().read_unaligned() as u64 }
}

/// A 32-byte block of 4-bit quants: qs at `QS`.
macro_rules! four_bit {
    ($t:ty, $off:expr, $qs:expr) => {
        impl Unsigned for $t {
            const OFF: u8 = $off;

            #[inline(always)]
            unsafe fn one(w: *const u8) -> __m256i {
                // SAFETY: a whole block at `w` (caller).
                unsafe { nib1(w.add($qs)) }
            }

            #[inline(always)]
            unsafe fn two(w0: *const u8, w1: *const u8) -> __m512i {
                // SAFETY: whole blocks at `w0` and `w1` (caller).
                unsafe { nib2(w0.add($qs), w1.add($qs)) }
            }
        }
    };
}

/// A block of 5-bit quants: the fifth bits (u32 at `QH`) add 16 to the
/// bytes they mark (AVX-512BW masked add), nibbles at `QS`.
macro_rules! five_bit {
    ($t:ty, $off:expr, $qh:expr, $qs:expr) => {
        impl Unsigned for $t {
            const OFF: u8 = $off;

            #[inline(always)]
            unsafe fn one(w: *const u8) -> __m256i {
                // SAFETY: a whole block at `w` (caller); AVX-512 BW/VL in
                // the kernel.
                unsafe {
                    let u = nib1(w.add($qs));
                    _mm256_mask_add_epi8(u, u32_at(w.add($qh)), u, _mm256_set1_epi8(16))
                }
            }

            #[inline(always)]
            unsafe fn two(w0: *const u8, w1: *const u8) -> __m512i {
                // SAFETY: whole blocks at `w0` and `w1` (caller).
                unsafe {
                    let u = nib2(w0.add($qs), w1.add($qs));
                    let bits = u32_at(w0.add($qh)) as u64 | (u32_at(w1.add($qh)) as u64) << 32;
                    _mm512_mask_add_epi8(u, bits, u, _mm512_set1_epi8(16))
                }
            }
        }
    };
}

four_bit!(W4_0, 8, 2);
four_bit!(W4_1, 0, 4);
five_bit!(W5_0, 16, 2, 6);
five_bit!(W5_1, 0, 4, 8);

impl Unsigned for W8_0 {
    const OFF: u8 = 128;

    #[inline(always)]
    unsafe fn one(w: *const u8) -> __m256i {
        // SAFETY: a whole block at `w` (caller): qs at 2..34. XOR 0x80 is
        // `q + 128` for signed bytes.
        unsafe { _mm256_xor_si256(_mm256_loadu_si256(w.add(2).cast()), _mm256_set1_epi8(i8::MIN)) }
    }

    #[inline(always)]
    unsafe fn two(w0: *const u8, w1: *const u8) -> __m512i {
        // SAFETY: whole blocks at `w0` and `w1` (caller).
        unsafe {
            let x = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_loadu_si256(w0.add(2).cast())),
                _mm256_loadu_si256(w1.add(2).cast()),
            );
            _mm512_xor_si512(x, _mm512_set1_epi8(i8::MIN))
        }
    }
}

/// IQ4_NL's levels plus 128 (1..=241), for `vpshufb` in each 128-bit lane.
#[inline(always)]
pub(super) unsafe fn iq4nl_table() -> __m512i {
    let t = rustorch_core::quant::blocks::KVALUES_IQ4NL.map(|v| (v as i16 + 128) as u8);
    // SAFETY: 16 bytes; AVX-512F in the kernel.
    unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(t.as_ptr().cast())) }
}

impl Unsigned for WIq4Nl {
    const OFF: u8 = 128;

    #[inline(always)]
    unsafe fn one(w: *const u8) -> __m256i {
        // SAFETY: a whole block at `w` (caller): qs at 2..18; AVX-512 in
        // the kernel. Nibbles to levels + 128 by table lookup.
        unsafe { _mm256_shuffle_epi8(_mm512_castsi512_si256(iq4nl_table()), nib1(w.add(2))) }
    }

    #[inline(always)]
    unsafe fn two(w0: *const u8, w1: *const u8) -> __m512i {
        // SAFETY: whole blocks at `w0` and `w1` (caller).
        unsafe { _mm512_shuffle_epi8(iq4nl_table(), nib2(w0.add(2), w1.add(2))) }
    }
}

/// Four f16 values (one per pointer, at byte `at`) packed as 16-bit words.
#[inline(always)]
unsafe fn pack4(p: [*const u8; 4], at: usize) -> i64 {
    // SAFETY: two readable bytes at `p[k] + at` (caller).
    unsafe {
        (u16_at(p[0].add(at)) | u16_at(p[1].add(at)) << 16 | u16_at(p[2].add(at)) << 32 | u16_at(p[3].add(at)) << 48)
            as i64
    }
}

/// The f16 at `p` repeated in four 16-bit words.
#[inline(always)]
unsafe fn splat4(p: *const u8) -> i64 {
    // SAFETY: two readable bytes at `p` (caller).
    unsafe { (u16_at(p).wrapping_mul(0x0001_0001_0001_0001)) as i64 }
}

/// Lane k: `f32(f16 word k of many) * f32(f16 word k of one)` (lanes 0..4),
/// and the two converted operands.
#[inline(always)]
unsafe fn cvt_pair(many: i64, one: i64) -> (__m128, __m128) {
    // SAFETY: F16C and AVX in the kernel.
    unsafe {
        let f = _mm256_cvtph_ps(_mm_set_epi64x(one, many));
        (_mm256_castps256_ps128(f), _mm256_extractf128_ps::<1>(f))
    }
}

/// `hsum` (llama.cpp's `hsum_float_8`) of each 256-bit half of `v`.
#[inline(always)]
unsafe fn hsum_halves(v: __m512) -> [f32; 2] {
    let mut lanes = [0f32; 16];
    // SAFETY: `lanes` holds 16 f32 values; AVX-512F in the kernel.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), v) };
    let r = |h: &[f32]| {
        let s: [f32; 4] = std::array::from_fn(|i| h[4 + i] + h[i]);
        (s[0] + s[2]) + (s[1] + s[3])
    };
    [r(&lanes[..8]), r(&lanes[8..])]
}

/// The per-call state of four outputs: two accumulators of two outputs
/// each, and the `summs` of the offset types.
struct Acc4 {
    acc01: __m512,
    acc23: __m512,
    summs: __m128,
}

impl Acc4 {
    #[inline(always)]
    fn new() -> Self {
        // SAFETY: AVX-512F in every kernel that builds one (these are
        // register zeroings).
        unsafe {
            Acc4 {
                acc01: _mm512_setzero_ps(),
                acc23: _mm512_setzero_ps(),
                summs: _mm_setzero_ps(),
            }
        }
    }

    /// One block for the four outputs: `p01`/`p23` hold the exact integer
    /// lane sums of outputs 0, 1 / 2, 3 (each output in a 256-bit half),
    /// `d4` lane k output k's scale `d_w * d_a`.
    #[inline(always)]
    unsafe fn step(&mut self, d4: __m128, p01: __m512i, p23: __m512i) {
        // SAFETY: AVX-512F in the kernel.
        unsafe {
            let idx01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
            let idx23 = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
            let dz = _mm512_castps128_ps512(d4);
            let s01 = _mm512_permutexvar_ps(idx01, dz);
            let s23 = _mm512_permutexvar_ps(idx23, dz);
            self.acc01 = _mm512_fmadd_ps(s01, _mm512_cvtepi32_ps(p01), self.acc01);
            self.acc23 = _mm512_fmadd_ps(s23, _mm512_cvtepi32_ps(p23), self.acc23);
        }
    }

    #[inline(always)]
    unsafe fn finish<T: Layout>(self, out: &mut [f32; 4]) {
        // SAFETY: AVX-512F in the kernel.
        let ([h0, h1], [h2, h3]) = unsafe { (hsum_halves(self.acc01), hsum_halves(self.acc23)) };
        let mut summs = [0f32; 4];
        // SAFETY: `summs` holds four f32 values.
        unsafe { _mm_storeu_ps(summs.as_mut_ptr(), self.summs) };
        *out = [h0, h1, h2, h3];
        if T::MIN {
            for (o, s) in out.iter_mut().zip(summs) {
                *o += s;
            }
        }
    }
}

/// The exact lane sums of the unsigned weights `u` (= q + OFF) with the
/// signed activations `a`, given `neg_corr` = `-OFF * sum(a)` per lane.
#[inline(always)]
unsafe fn dot_lanes(neg_corr: __m512i, u: __m512i, a: __m512i) -> __m512i {
    // SAFETY: AVX-512 VNNI in the kernel.
    unsafe { _mm512_dpbusd_epi32(neg_corr, u, a) }
}

/// `-OFF * sum(a)` per four-byte lane (zero for OFF = 0).
#[inline(always)]
unsafe fn neg_corr<T: Unsigned>(a: __m512i) -> __m512i {
    // SAFETY: AVX-512 VNNI in the kernel.
    unsafe {
        let zero = _mm512_setzero_si512();
        if T::OFF == 0 {
            zero
        } else {
            _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(T::OFF as i8), a))
        }
    }
}

/// Four weight rows against one activation row (matvecs): `out[r]` equals
/// `ggml_exact::dot_scalar(w[r], a)` bit for bit.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C must be available
/// (`Isa::Avx512Vnni`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot_cols<T: Unsigned>(a: &[u8], w: [&[u8]; 4], out: &mut [f32; 4]) {
    let Some(nb) = blocks::<T>(w[0], a) else {
        *out = [f32::NAN; 4];
        return;
    };
    if w[1..].iter().any(|r| r.len() != w[0].len()) {
        *out = [f32::NAN; 4];
        return;
    }
    let ap = a.as_ptr();
    let wp = w.map(|r| r.as_ptr());
    let mut acc = Acc4::new();
    // Block i's share of the rows after these four (the drivers pass
    // consecutive rows, so they follow in memory) is prefetched into L2: one
    // sequential stream ahead of the four interleaved ones read here, which
    // the hardware prefetchers follow badly from DRAM. The next four rows
    // for long rows; at least 4 KiB ahead for short ones, where the next
    // call's rows are too close to arrive in time (SmolLM2's 576-column
    // rows: generation -7% with the next four; Gemma 3's 262144 x 640
    // output matrix: qmatvec/Q8_0_262144x640 10.5 -> 5.0 ms with 4 KiB).
    let ahead = (4 * nb * T::W_BYTES).max(4096);
    for i in 0..nb {
        // SAFETY (pointer reads): block i < nb of the activation row and
        // of every weight row, which the checks above established.
        unsafe {
            let ab = ap.add(i * T::A_BYTES);
            let wb = wp.map(|p| p.add(i * T::W_BYTES));
            prefetch_rows_ahead(wp[0], ahead, i, 4 * T::W_BYTES);
            let av = _mm512_broadcast_i64x4(_mm256_loadu_si256(ab.add(T::A_QS).cast()));
            let nc = neg_corr::<T>(av);
            let p01 = dot_lanes(nc, T::two(wb[0], wb[1]), av);
            let p23 = dot_lanes(nc, T::two(wb[2], wb[3]), av);
            let (dw, da) = cvt_pair(pack4(wb, 0), splat4(ab));
            acc.step(_mm_mul_ps(dw, da), p01, p23);
            if T::MIN {
                let (m, s) = cvt_pair(pack4(wb, 2), splat4(ab.add(2)));
                acc.summs = _mm_fmadd_ps(m, s, acc.summs);
            }
        }
    }
    // SAFETY: AVX-512F enabled above.
    unsafe { acc.finish::<T>(out) };
}

/// One weight row against four activation rows (batches): `out[r]`
/// equals `ggml_exact::dot_scalar(w, a[r])` bit for bit.
///
/// # Safety
/// As `dot_cols`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot_rows<T: Unsigned>(w: &[u8], a: [&[u8]; 4], out: &mut [f32; 4]) {
    let Some(nb) = blocks4::<T>(w, &a) else {
        *out = [f32::NAN; 4];
        return;
    };
    let wp = w.as_ptr();
    let ap = a.map(|r| r.as_ptr());
    let mut acc = Acc4::new();
    let load2 = |p: *const u8, q: *const u8| {
        // SAFETY: whole activation blocks at `p` and `q` (the loop below).
        unsafe {
            _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_loadu_si256(p.add(T::A_QS).cast())),
                _mm256_loadu_si256(q.add(T::A_QS).cast()),
            )
        }
    };
    for i in 0..nb {
        // SAFETY (pointer reads): block i < nb of the weight row and of
        // every activation row (`blocks4`).
        unsafe {
            let wb = wp.add(i * T::W_BYTES);
            let ab = ap.map(|p| p.add(i * T::A_BYTES));
            let u = _mm512_broadcast_i64x4(T::one(wb));
            let (a01, a23) = (load2(ab[0], ab[1]), load2(ab[2], ab[3]));
            let p01 = dot_lanes(neg_corr::<T>(a01), u, a01);
            let p23 = dot_lanes(neg_corr::<T>(a23), u, a23);
            let (da, dw) = cvt_pair(pack4(ab, 0), splat4(wb));
            acc.step(_mm_mul_ps(dw, da), p01, p23);
            if T::MIN {
                let (s, m) = cvt_pair(pack4(ab, 2), splat4(wb.add(2)));
                acc.summs = _mm_fmadd_ps(m, s, acc.summs);
            }
        }
    }
    // SAFETY: AVX-512F enabled above.
    unsafe { acc.finish::<T>(out) };
}
