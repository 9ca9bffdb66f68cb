//! Four weight rows by four activation rows of super-block outputs with
//! AVX2 and FMA, for CPUs without AVX-512 VNNI.
//!
//! `ggml_superblock::outputs::<4, 4>` computes each output's integer sums on
//! their own (every weight and activation vector loaded once per output)
//! and its f32 steps as one scalar chain each. Here a pair of weight rows
//! meets four activation rows: every vector is loaded once for the eight
//! outputs, each chunk's eight sums are reduced together into one vector
//! (an output a lane), and the f32 steps run eight outputs a vector. The
//! bits are the same: the integer sums are exact in any order, and each
//! lane goes through the scalar code's operations in its order (a product
//! rounded, then fused multiply-adds).

use super::ggml_superblock::{Order, Unpacked};
use rustorch_core::quant::blocks::BlockQ8K;
use std::arch::x86_64::*;

/// Lane scales `at[0..8]` (`Unpacked::lane_scales`: each scale's i16 in the
/// low half) with each copied into both halves, `vpmaddwd`'s operand.
///
/// # Safety
/// AVX2 must be available, and `at` valid for reading 8 i32.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn lane_scales_both_halves(at: *const i32) -> __m256i {
    // SAFETY: the caller's; an unaligned load.
    let s = unsafe { _mm256_loadu_si256(at.cast()) };
    _mm256_or_si256(s, _mm256_slli_epi32::<16>(s))
}

/// Eight vectors of i32 lanes to one holding each vector's sum, in order.
#[target_feature(enable = "avx2")]
#[inline]
fn sums_of_8(v: [__m256i; 8]) -> __m256i {
    // [v0 v0 v1 v1 | v0 v0 v1 v1] (partial sums), then four vectors a half.
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h45 = _mm256_hadd_epi32(v[4], v[5]);
    let h67 = _mm256_hadd_epi32(v[6], v[7]);
    let lo = _mm256_hadd_epi32(h01, h23); // [v0 v1 v2 v3 | v0 v1 v2 v3]
    let hi = _mm256_hadd_epi32(h45, h67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(lo, hi),
        _mm256_permute2x128_si256::<0x31>(lo, hi),
    )
}

/// Per chunk c, the i32 terms of eight outputs whose vectors `v[p]` hold
/// chunk c in lanes 2c and 2c + 1 (a `vpmaddwd` of 16 group values):
/// `[chunk 0, 1, 2, 3]`, each an output a lane.
#[target_feature(enable = "avx2")]
#[inline]
fn chunk_pairs_of_8(v: [__m256i; 8]) -> [__m256i; 4] {
    // [p c0 p c1 q c0 q c1 | p c2 p c3 q c2 q c3] -> [p c0 q c0 p c1 q c1 | ...]
    let order = _mm256_setr_epi32(0, 2, 1, 3, 4, 6, 5, 7);
    let x = [
        _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(v[0], v[1]), order),
        _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(v[2], v[3]), order),
        _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(v[4], v[5]), order),
        _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(v[6], v[7]), order),
    ];
    // [0 1 2 3 (c0) | 0 1 2 3 (c2)] and [(c1) | (c3)], for outputs 0-3 and 4-7.
    let c02_lo = _mm256_unpacklo_epi64(x[0], x[1]);
    let c13_lo = _mm256_unpackhi_epi64(x[0], x[1]);
    let c02_hi = _mm256_unpacklo_epi64(x[2], x[3]);
    let c13_hi = _mm256_unpackhi_epi64(x[2], x[3]);
    [
        _mm256_permute2x128_si256::<0x20>(c02_lo, c02_hi),
        _mm256_permute2x128_si256::<0x20>(c13_lo, c13_hi),
        _mm256_permute2x128_si256::<0x31>(c02_lo, c02_hi),
        _mm256_permute2x128_si256::<0x31>(c13_lo, c13_hi),
    ]
}

/// Chunk c's scaled products of the pair `u` against the rows `y`: output
/// (r, k) in lane `4 r + k`.
///
/// # Safety
/// AVX2 must be available.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn chunk_products(u: [&Unpacked; 2], y: [&BlockQ8K; 4], c: usize) -> __m256i {
    let mut h = [_mm256_setzero_si256(); 8];
    for half in 0..2 {
        let o = 64 * c + 32 * half;
        // SAFETY: codes o..o + 32, lane scales o / 4..o / 4 + 8 and
        // activations o..o + 32 are in bounds; unaligned loads are allowed.
        unsafe {
            let w0 = _mm256_loadu_si256(u[0].codes.as_ptr().add(o).cast());
            let w1 = _mm256_loadu_si256(u[1].codes.as_ptr().add(o).cast());
            let s0 = lane_scales_both_halves(u[0].lane_scales.as_ptr().add(o / 4));
            let s1 = lane_scales_both_halves(u[1].lane_scales.as_ptr().add(o / 4));
            for k in 0..4 {
                let a = _mm256_loadu_si256(y[k].qs.as_ptr().add(o).cast());
                // Codes (at most 63) times activations, pairs added, fit an
                // i16 (2 * 63 * 128 < 32768); then scaled and paired.
                h[k] = _mm256_add_epi32(h[k], _mm256_madd_epi16(_mm256_maddubs_epi16(w0, a), s0));
                h[4 + k] = _mm256_add_epi32(h[4 + k], _mm256_madd_epi16(_mm256_maddubs_epi16(w1, a), s1));
            }
        }
    }
    sums_of_8(h)
}

/// The pair `u` against the rows `y`, per chunk, output (r, k) in lane
/// `4 r + k`: the scaled products minus `32 x` the bias terms (Q6_K's
/// offset; skipped when `bias` is false, which the caller may say only
/// when every bias scale is zero), and the min terms.
///
/// # Safety
/// AVX2 must be available.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn pair_sums(u: [&Unpacked; 2], y: [&BlockQ8K; 4], bias: bool) -> ([__m256i; 4], [__m256i; 4]) {
    // SAFETY: AVX2 is enabled here.
    let mut sums = unsafe {
        [
            chunk_products(u, y, 0),
            chunk_products(u, y, 1),
            chunk_products(u, y, 2),
            chunk_products(u, y, 3),
        ]
    };
    // SAFETY: `bsums`, `mins` and `bias_scales` are 32 bytes each.
    let (bs, mn, bi) = unsafe {
        (
            [0, 1, 2, 3].map(|k| _mm256_loadu_si256(y[k].bsums.as_ptr().cast())),
            [0, 1].map(|r| _mm256_loadu_si256(u[r].mins.as_ptr().cast())),
            [0, 1].map(|r| _mm256_loadu_si256(u[r].bias_scales.as_ptr().cast())),
        )
    };
    let terms = |by: [__m256i; 2]| {
        let m: [__m256i; 8] = std::array::from_fn(|p| _mm256_madd_epi16(bs[p % 4], by[p / 4]));
        chunk_pairs_of_8(m)
    };
    let mins = terms(mn);
    if bias {
        let b = terms(bi);
        for c in 0..4 {
            sums[c] = _mm256_sub_epi32(sums[c], _mm256_slli_epi32::<5>(b[c]));
        }
    }
    (sums, mins)
}

/// i32 lanes to f32 (rounded to nearest, as `as f32`).
#[target_feature(enable = "avx2")]
#[inline]
fn cvt(x: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(x)
}

/// The whole super-block's sum of the four chunks, in the scalar code's
/// grouping (integers: exact either way).
#[target_feature(enable = "avx2")]
#[inline]
fn whole(v: [__m256i; 4]) -> __m256i {
    _mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]))
}

/// `outputs::<4, 4>` for four activation rows that all sum in `order`:
/// `[r][k]` is weight row `us[r]` against activation row `a[k]`. `bias`:
/// as `pair_sums`.
///
/// # Safety
/// AVX2 and FMA must be available; the rows must have equally many blocks.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn outputs_4x4(order: Order, us: [&[Unpacked]; 4], a: [&[BlockQ8K]; 4], bias: bool) -> [[f32; 4]; 4] {
    // Per weight row pair, eight outputs: lane 4 ri + k is row 2 pair + ri
    // against activation row k.
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut acc_min = [_mm256_setzero_ps(); 2];
    for b in 0..a[0].len() {
        let y = [&a[0][b], &a[1][b], &a[2][b], &a[3][b]];
        let ys = [y[0].scale(), y[1].scale(), y[2].scale(), y[3].scale()];
        let y_scale = _mm256_setr_ps(ys[0], ys[1], ys[2], ys[3], ys[0], ys[1], ys[2], ys[3]);
        for pair in 0..2 {
            let u = [&us[2 * pair][b], &us[2 * pair + 1][b]];
            // SAFETY: AVX2 is enabled here.
            let (s, m) = unsafe { pair_sums(u, y, bias) };
            let per_row = |x: [f32; 2]| _mm256_setr_ps(x[0], x[0], x[0], x[0], x[1], x[1], x[1], x[1]);
            let ud = per_row([u[0].d, u[1].d]);
            let udmin = per_row([u[0].dmin, u[1].dmin]);
            let (acc, acc_min) = (&mut acc[pair], &mut acc_min[pair]);
            match order {
                Order::Tiled => {
                    let t = _mm256_fmadd_ps(
                        per_row([-u[0].dmin, -u[1].dmin]),
                        cvt(whole(m)),
                        _mm256_mul_ps(cvt(whole(s)), ud),
                    );
                    *acc = _mm256_fmadd_ps(t, y_scale, *acc);
                }
                Order::RepackGemm => {
                    let (d, dmin) = (_mm256_mul_ps(ud, y_scale), _mm256_mul_ps(udmin, y_scale));
                    for sb in 0..4 {
                        *acc = _mm256_fmadd_ps(cvt(s[sb]), d, *acc);
                        *acc_min = _mm256_fmadd_ps(cvt(m[sb]), dmin, *acc_min);
                    }
                }
                Order::RepackGemmHalves => {
                    let (d, dmin) = (_mm256_mul_ps(ud, y_scale), _mm256_mul_ps(udmin, y_scale));
                    for h in 0..2 {
                        *acc = _mm256_fmadd_ps(cvt(_mm256_add_epi32(s[2 * h], s[2 * h + 1])), d, *acc);
                        *acc_min = _mm256_fmadd_ps(cvt(_mm256_add_epi32(m[2 * h], m[2 * h + 1])), dmin, *acc_min);
                    }
                }
                Order::RepackGemv => {
                    let (d, dmin) = (_mm256_mul_ps(ud, y_scale), _mm256_mul_ps(udmin, y_scale));
                    *acc = _mm256_fmadd_ps(cvt(whole(s)), d, *acc);
                    *acc_min = _mm256_fmadd_ps(cvt(whole(m)), dmin, *acc_min);
                }
                Order::Amx => {
                    let (d, dmin) = (_mm256_mul_ps(ud, y_scale), _mm256_mul_ps(udmin, y_scale));
                    *acc = _mm256_fmadd_ps(cvt(whole(s)), d, *acc);
                    // fma(-m, dmin, acc): the negation is exact.
                    *acc = _mm256_fnmadd_ps(cvt(whole(m)), dmin, *acc);
                }
            }
        }
    }
    let mut lanes = [[0f32; 8]; 2];
    for pair in 0..2 {
        let v = if matches!(order, Order::Tiled | Order::Amx) {
            acc[pair]
        } else {
            _mm256_sub_ps(acc[pair], acc_min[pair])
        };
        // SAFETY: `lanes[pair]` holds eight f32 values.
        unsafe { _mm256_storeu_ps(lanes[pair].as_mut_ptr(), v) };
    }
    std::array::from_fn(|r| std::array::from_fn(|k| lanes[r / 2][4 * (r % 2) + k]))
}
