//! Exact integer sums of K-quant super-blocks for the tiled and repacked
//! paths (`ggml_tiled`, `ggml_repack`), which need, per output and
//! super-block, the scaled integer dot product of each 64-value chunk.
//!
//! A weight super-block is unpacked once into 256 unsigned codes in the
//! activations' order plus the scale of each i32 lane of the AVX-512
//! product below (`Unpacked`); every activation row then costs four
//! `vpdpbusd` (u8 x i8, four products per i32 lane), four `vpdpwssd` that
//! multiply each lane by its scale, and one reduction. Sums are exact:
//! with codes below 64 and activations in -127..=127 (what
//! `quantize_row_q8_K` produces) a lane's four products stay below 2^15 in
//! magnitude, so the lane equals its low i16, which `vpdpwssd` multiplies
//! by the scale held in the low i16 of the other operand (the high i16 is
//! zero). The portable version computes the same integers directly.

use rustorch_core::quant::blocks::{
    cast_blocks, f16_to_f32, scale_min_k4, BlockQ2K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K,
};

/// The Q8_K activation rows as blocks (every K-quant path reads them so).
pub(super) fn q8k_rows(act: &super::QuantizedRows) -> Vec<&[BlockQ8K]> {
    (0..act.rows())
        .map(|i| cast_blocks(act.row(i)).expect("Q8_K activation rows are whole blocks"))
        .collect()
}

/// One weight super-block: codes in activation order and the scale of
/// each group of four codes (one i32 lane of the product), plus the f32
/// scales and the integer min/offset terms' factors.
#[repr(C, align(64))]
#[derive(Clone)]
pub(super) struct Unpacked {
    pub codes: [u8; 256],
    /// `lane_scales[l]` scales codes `4l..4l + 4`: the scale as an i16 in
    /// the low half, zero in the high half (`vpdpwssd`'s operand; see
    /// `lane_scale`).
    pub lane_scales: [i32; 64],
    pub d: f32,
    pub dmin: f32,
    /// Per 16-value group: the min (Q2_K; Q4_K and Q5_K repeat each
    /// 32-value group's); zero for Q6_K.
    pub mins: [i16; 16],
    /// Per 16-value group: the scale that multiplies `-BIAS * bsum`
    /// (Q6_K: its scales, BIAS 32); zero for Q4_K and Q5_K.
    pub bias_scales: [i16; 16],
}

impl Unpacked {
    fn blank() -> Unpacked {
        Unpacked {
            codes: [0; 256],
            lane_scales: [0; 64],
            d: 0.0,
            dmin: 0.0,
            mins: [0; 16],
            bias_scales: [0; 16],
        }
    }
}

/// Weight types the SIMD tiles handle.
pub(super) trait Unpack: Sized {
    /// Portable unpacking.
    fn unpack(&self) -> Unpacked;

    /// The same with AVX2 (bytes shifted and masked 32 at a time).
    ///
    /// # Safety
    /// AVX2 must be available.
    #[cfg(target_arch = "x86_64")]
    unsafe fn unpack_avx2(&self) -> Unpacked;

    /// The fastest unpacking this CPU runs at or below `isa`.
    fn unpacker(isa: super::Isa) -> fn(&Self) -> Unpacked {
        #[cfg(target_arch = "x86_64")]
        if isa >= super::Isa::Avx2 && super::Isa::Avx2.is_available() {
            // SAFETY: AVX2 is available (checked just above).
            return |x| unsafe { x.unpack_avx2() };
        }
        let _ = isa;
        Self::unpack
    }
}

/// A scale as `vpdpwssd` needs it: its i16 in the low half, zero above.
fn lane_scale(s: i32) -> i32 {
    (s as i16 as u16) as i32
}

fn unpack_k4(scales: &[u8; 12], d: [u8; 2], dmin: [u8; 2], q: impl Fn(usize, usize) -> u8) -> Unpacked {
    let mut u = Unpacked::blank();
    for g in 0..8 {
        let (sc, mn) = scale_min_k4(g, scales);
        for e in 0..32 {
            u.codes[32 * g + e] = q(g, e);
        }
        u.lane_scales[8 * g..8 * g + 8].fill(lane_scale(sc as i32));
        u.mins[2 * g..2 * g + 2].fill(mn as i16);
    }
    u.d = f16_to_f32(d);
    u.dmin = f16_to_f32(dmin);
    u
}

impl Unpack for BlockQ4K {
    fn unpack(&self) -> Unpacked {
        unpack_k4(&self.scales, self.d, self.dmin, |g, e| {
            (self.qs[32 * (g / 2) + e] >> (4 * (g % 2))) & 0xF
        })
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn unpack_avx2(&self) -> Unpacked {
        // SAFETY: forwarded from the caller.
        unsafe { simd::k4(self, None) }
    }
}

impl Unpack for BlockQ5K {
    #[cfg(target_arch = "x86_64")]
    unsafe fn unpack_avx2(&self) -> Unpacked {
        let q4 = BlockQ4K {
            d: self.d,
            dmin: self.dmin,
            scales: self.scales,
            qs: self.qs,
        };
        // SAFETY: forwarded from the caller.
        unsafe { simd::k4(&q4, Some(&self.qh)) }
    }

    fn unpack(&self) -> Unpacked {
        unpack_k4(&self.scales, self.d, self.dmin, |g, e| {
            let lo = (self.qs[32 * (g / 2) + e] >> (4 * (g % 2))) & 0xF;
            lo | ((self.qh[e] >> g) & 1) << 4
        })
    }
}

impl Unpack for BlockQ6K {
    #[cfg(target_arch = "x86_64")]
    unsafe fn unpack_avx2(&self) -> Unpacked {
        // SAFETY: forwarded from the caller.
        unsafe { simd::q6k(self) }
    }

    fn unpack(&self) -> Unpacked {
        let mut u = Unpacked::blank();
        for c in 0..8 {
            let (h, k) = (c / 4, c % 4);
            for e in 0..32 {
                let lo = (self.ql[64 * h + 32 * (k % 2) + e] >> (4 * (k / 2))) & 0xF;
                let hi = (self.qh[32 * h + e] >> (2 * k)) & 3;
                u.codes[32 * c + e] = lo | hi << 4;
            }
        }
        for s in 0..16 {
            u.lane_scales[4 * s..4 * s + 4].fill(lane_scale(self.scales[s] as i32));
            u.bias_scales[s] = self.scales[s] as i16;
        }
        u.d = f16_to_f32(self.d);
        u
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{lane_scale, Unpacked};
    use rustorch_core::quant::blocks::{f16_to_f32, scale_min_k4, BlockQ4K, BlockQ6K};
    use std::arch::x86_64::*;

    /// Q4_K, or Q5_K with its `qh`: group `2c` is chunk `c`'s low nibbles
    /// (plus bit `2c` of `qh`), group `2c + 1` its high nibbles (bit `2c + 1`).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn k4(x: &BlockQ4K, qh: Option<&[u8; 32]>) -> Unpacked {
        let mut u = Unpacked::blank();
        let m4 = _mm256_set1_epi8(0xF);
        let one = _mm256_set1_epi8(1);
        // SAFETY: `qh` is 32 bytes.
        let h = qh.map(|q| unsafe { _mm256_loadu_si256(q.as_ptr().cast()) });
        for c in 0..4 {
            // SAFETY: 32 of the 128 quant bytes; 64 of the 256 codes.
            unsafe {
                let v = _mm256_loadu_si256(x.qs.as_ptr().add(32 * c).cast());
                let mut lo = _mm256_and_si256(v, m4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                if let Some(h) = h {
                    // Bit g of each byte to bit 4 (16-bit shifts: the mask
                    // keeps bits that came from the same byte).
                    let b0 = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * c as i32)), one);
                    let b1 = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * c as i32 + 1)), one);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(b0));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16::<4>(b1));
                }
                _mm256_storeu_si256(u.codes.as_mut_ptr().add(64 * c).cast(), lo);
                _mm256_storeu_si256(u.codes.as_mut_ptr().add(64 * c + 32).cast(), hi);
            }
        }
        for g in 0..8 {
            let (sc, mn) = scale_min_k4(g, &x.scales);
            // SAFETY: lanes 8g..8g + 8 of 64.
            unsafe {
                _mm256_storeu_si256(
                    u.lane_scales.as_mut_ptr().add(8 * g).cast(),
                    _mm256_set1_epi32(lane_scale(sc as i32)),
                )
            };
            u.mins[2 * g..2 * g + 2].fill(mn as i16);
        }
        u.d = f16_to_f32(x.d);
        u.dmin = f16_to_f32(x.dmin);
        u
    }

    /// Q6_K: chunk `4h + k` takes the low (k < 2) or high nibbles of
    /// `ql[64h + 32 (k % 2) ..]` and bits `2k..2k + 2` of `qh[32h ..]`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn q6k(x: &BlockQ6K) -> Unpacked {
        let mut u = Unpacked::blank();
        let m4 = _mm256_set1_epi8(0xF);
        let m3 = _mm256_set1_epi8(3);
        for h in 0..2 {
            // SAFETY: 64 of the 128 `ql` bytes, 32 of the 64 `qh` bytes and
            // 128 of the 256 codes.
            unsafe {
                let l0 = _mm256_loadu_si256(x.ql.as_ptr().add(64 * h).cast());
                let l1 = _mm256_loadu_si256(x.ql.as_ptr().add(64 * h + 32).cast());
                let qh = _mm256_loadu_si256(x.qh.as_ptr().add(32 * h).cast());
                let nib = [
                    _mm256_and_si256(l0, m4),
                    _mm256_and_si256(l1, m4),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(l0), m4),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(l1), m4),
                ];
                for (k, n) in nib.into_iter().enumerate() {
                    let hb = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k as i32)), m3);
                    let code = _mm256_or_si256(n, _mm256_slli_epi16::<4>(hb));
                    _mm256_storeu_si256(u.codes.as_mut_ptr().add(128 * h + 32 * k).cast(), code);
                }
            }
        }
        for s in 0..16 {
            let sc = x.scales[s] as i32;
            // SAFETY: lanes 4s..4s + 4 of 64.
            unsafe {
                _mm_storeu_si128(
                    u.lane_scales.as_mut_ptr().add(4 * s).cast(),
                    _mm_set1_epi32(lane_scale(sc)),
                )
            };
            u.bias_scales[s] = sc as i16;
        }
        u.d = f16_to_f32(x.d);
        u
    }
}

impl Unpack for BlockQ2K {
    fn unpack(&self) -> Unpacked {
        let mut u = Unpacked::blank();
        for c in 0..8 {
            for e in 0..32 {
                u.codes[32 * c + e] = (self.qs[32 * (c / 4) + e] >> (2 * (c % 4))) & 3;
            }
        }
        for s in 0..16 {
            u.lane_scales[4 * s..4 * s + 4].fill(lane_scale((self.scales[s] & 0xF) as i32));
            u.mins[s] = (self.scales[s] >> 4) as i16;
        }
        u.d = f16_to_f32(self.d);
        u.dmin = f16_to_f32(self.dmin);
        u
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn unpack_avx2(&self) -> Unpacked {
        // (Q2_K is rare; the portable unpacking is cheap next to the sums.)
        self.unpack()
    }
}

/// Per 64-value chunk of a super-block against an activation block: the
/// scaled products minus `32 * sum(bias_scales * bsums)` (Q6_K's offset),
/// and the min terms `sum(mins * bsums)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Sums {
    pub sums: [i32; 4],
    pub mins: [i32; 4],
}

/// The `Sums` of `u` with `y`.
pub(super) fn chunk_sums_portable(u: &Unpacked, y: &BlockQ8K) -> Sums {
    let bsum = |s: usize| y.bsum(s) as i32;
    let sums = std::array::from_fn(|c| {
        let products: i32 = (16 * c..16 * c + 16)
            .map(|l| {
                let s: i32 = (4 * l..4 * l + 4).map(|e| u.codes[e] as i32 * y.qs[e] as i32).sum();
                (u.lane_scales[l] as i16) as i32 * s
            })
            .sum();
        let bias: i32 = (4 * c..4 * c + 4).map(|s| u.bias_scales[s] as i32 * bsum(s)).sum();
        products - 32 * bias
    });
    let mins = std::array::from_fn(|c| (4 * c..4 * c + 4).map(|s| u.mins[s] as i32 * bsum(s)).sum());
    Sums { sums, mins }
}

/// `chunk_sums_portable` with AVX-512 VNNI.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
pub(super) unsafe fn chunk_sums_vnni(u: &Unpacked, y: &BlockQ8K) -> Sums {
    use std::arch::x86_64::*;
    let mut v = [_mm512_setzero_si512(); 4];
    for (c, vc) in v.iter_mut().enumerate() {
        // SAFETY: chunk c of the 256 codes, 64 lane scales and 256
        // activations is in bounds; unaligned loads are allowed.
        unsafe {
            let w = _mm512_loadu_si512(u.codes.as_ptr().add(64 * c).cast());
            let a = _mm512_loadu_si512(y.qs.as_ptr().add(64 * c).cast());
            let s = _mm512_loadu_si512(u.lane_scales.as_ptr().add(16 * c).cast());
            let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, a);
            *vc = _mm512_dpwssd_epi32(_mm512_setzero_si512(), p, s);
        }
    }
    // Four 16-lane vectors to four sums (integers: any order is exact).
    let h: [__m256i; 4] = v.map(|x| _mm256_add_epi32(_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64::<1>(x)));
    // SAFETY: AVX2 is enabled here.
    unsafe { with_bsum_terms(h, u, y) }
}

/// `chunk_sums_portable` with AVX2: `vpmaddubsw` multiplies the unsigned
/// codes (at most 63) by the signed activations and adds pairs, which fit
/// an i16 without saturating (2 * 63 * 128 < 32768); `vpmaddwd` then
/// scales each four codes' sums by their lane's scale, copied into both
/// i16 halves of the lane.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn chunk_sums_avx2(u: &Unpacked, y: &BlockQ8K) -> Sums {
    use std::arch::x86_64::*;
    let mut h = [_mm256_setzero_si256(); 4];
    for (c, hc) in h.iter_mut().enumerate() {
        for half in 0..2 {
            let o = 64 * c + 32 * half;
            // SAFETY: codes and activations o..o + 32 and lane scales
            // o / 4..o / 4 + 8 are in bounds; unaligned loads are allowed.
            unsafe {
                let w = _mm256_loadu_si256(u.codes.as_ptr().add(o).cast());
                let a = _mm256_loadu_si256(y.qs.as_ptr().add(o).cast());
                let s = super::ggml_superblock_avx2::lane_scales_both_halves(u.lane_scales.as_ptr().add(o / 4));
                *hc = _mm256_add_epi32(*hc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), s));
            }
        }
    }
    // SAFETY: AVX2 is enabled here.
    unsafe { with_bsum_terms(h, u, y) }
}

/// The `Sums` from each chunk's scaled products (`h[c]`: eight i32 lanes
/// that sum to chunk c's) and the bsums terms.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn with_bsum_terms(h: [std::arch::x86_64::__m256i; 4], u: &Unpacked, y: &BlockQ8K) -> Sums {
    use std::arch::x86_64::*;
    let h01 = _mm256_hadd_epi32(h[0], h[1]);
    let h23 = _mm256_hadd_epi32(h[2], h[3]);
    let hh = _mm256_hadd_epi32(h01, h23);
    let products = _mm_add_epi32(_mm256_castsi256_si128(hh), _mm256_extracti128_si256::<1>(hh));
    // The bsums terms: lanes 2c, 2c + 1 of each `madd` belong to chunk c.
    // SAFETY: `bsums`, `mins` and `bias_scales` are 32 bytes each.
    let (bs, mn, bi) = unsafe {
        (
            _mm256_loadu_si256(y.bsums.as_ptr().cast()),
            _mm256_loadu_si256(u.mins.as_ptr().cast()),
            _mm256_loadu_si256(u.bias_scales.as_ptr().cast()),
        )
    };
    // [m01 m23 b01 b23 | m45 m67 b45 b67] (per chunk: m0 m1 b0 b1 | m2 m3 b2 b3)
    let t = _mm256_hadd_epi32(_mm256_madd_epi16(bs, mn), _mm256_madd_epi16(bs, bi));
    let t = _mm256_permutevar8x32_epi32(t, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
    let mins = _mm256_castsi256_si128(t);
    let bias = _mm256_extracti128_si256::<1>(t);
    let sums = _mm_sub_epi32(products, _mm_slli_epi32::<5>(bias));
    let mut out = Sums {
        sums: [0; 4],
        mins: [0; 4],
    };
    // SAFETY: each array holds four i32 values.
    unsafe {
        _mm_storeu_si128(out.sums.as_mut_ptr().cast(), sums);
        _mm_storeu_si128(out.mins.as_mut_ptr().cast(), mins);
    }
    out
}

/// How an output sums its super-blocks (see `ggml_tiled`, `ggml_repack`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Order {
    /// `acc = fma(f32(s1) * d_w - dmin_w * f32(s2), d_a, acc)` per block.
    Tiled,
    /// Repacked gemv: one FMA per block for the products and the mins.
    RepackGemv,
    /// Repacked Q4_K gemm: one FMA per 64-value chunk for each.
    RepackGemm,
    /// Repacked Q2_K gemm: one FMA per 128-value half for each.
    RepackGemmHalves,
    /// llama.cpp's AMX build (`amx_order_k`): per block `acc = fma(f32(s),
    /// d_w * d_a, acc)`, then `acc = fma(-f32(m), dmin_w * d_a, acc)`.
    Amx,
}

impl Order {
    /// Whether a row in this order needs the integer sums of each 64- or
    /// 128-value part of a super-block (an f32 step per part), not only the
    /// whole block's.
    pub(super) fn sums_per_chunk(self) -> bool {
        matches!(self, Order::RepackGemm | Order::RepackGemmHalves)
    }
}

/// `W x A` outputs: weight rows `us[r]` (super-blocks) against activation
/// rows `a[k]`, each summed in `orders[k]`. Every output's f32 operations
/// form one dependent chain; running several side by side hides the FMA
/// latency, and each unpacked weight block is loaded once for `A` rows.
#[inline(always)]
pub(super) fn outputs<const W: usize, const A: usize>(
    orders: [Order; A],
    us: [&[Unpacked]; W],
    a: [&[BlockQ8K]; A],
    sums: impl Fn(&Unpacked, &BlockQ8K) -> Sums,
) -> [[f32; A]; W] {
    let mut acc = [[0f32; A]; W];
    let mut acc_min = [[0f32; A]; W];
    for b in 0..a[0].len() {
        for r in 0..W {
            let u = &us[r][b];
            for k in 0..A {
                let y = &a[k][b];
                let Sums { sums: s, mins: mp } = sums(u, y);
                let (acc, acc_min) = (&mut acc[r][k], &mut acc_min[r][k]);
                match orders[k] {
                    Order::Tiled => {
                        let s1 = (s[0] + s[1]) + (s[2] + s[3]);
                        let mins = (mp[0] + mp[1]) + (mp[2] + mp[3]);
                        // Types without mins have dmin = 0 and mins = 0, and
                        // fma(-0, 0, x) = x.
                        let t = (-u.dmin).mul_add(mins as f32, s1 as f32 * u.d);
                        *acc = t.mul_add(y.scale(), *acc);
                    }
                    Order::RepackGemm => {
                        let (d, dmin) = (u.d * y.scale(), u.dmin * y.scale());
                        for sb in 0..4 {
                            *acc = (s[sb] as f32).mul_add(d, *acc);
                            *acc_min = (mp[sb] as f32).mul_add(dmin, *acc_min);
                        }
                    }
                    Order::RepackGemmHalves => {
                        let (d, dmin) = (u.d * y.scale(), u.dmin * y.scale());
                        for h in 0..2 {
                            *acc = ((s[2 * h] + s[2 * h + 1]) as f32).mul_add(d, *acc);
                            *acc_min = ((mp[2 * h] + mp[2 * h + 1]) as f32).mul_add(dmin, *acc_min);
                        }
                    }
                    Order::RepackGemv => {
                        let (d, dmin) = (u.d * y.scale(), u.dmin * y.scale());
                        let (s, mp) = ((s[0] + s[1]) + (s[2] + s[3]), (mp[0] + mp[1]) + (mp[2] + mp[3]));
                        *acc = (s as f32).mul_add(d, *acc);
                        *acc_min = (mp as f32).mul_add(dmin, *acc_min);
                    }
                    Order::Amx => {
                        let (d, dmin) = (u.d * y.scale(), u.dmin * y.scale());
                        let (s, mp) = ((s[0] + s[1]) + (s[2] + s[3]), (mp[0] + mp[1]) + (mp[2] + mp[3]));
                        *acc = (s as f32).mul_add(d, *acc);
                        *acc = (-(mp as f32)).mul_add(dmin, *acc);
                    }
                }
            }
        }
    }
    std::array::from_fn(|r| {
        std::array::from_fn(|k| {
            if matches!(orders[k], Order::Tiled | Order::Amx) {
                acc[r][k]
            } else {
                acc[r][k] - acc_min[r][k]
            }
        })
    })
}

/// A tile of weight rows `rows` (of `n`), each unpacked into `nb`
/// super-blocks of `us`, against every activation row: output (i, j) goes
/// to `out` at `i * n + j` in the order `order(i)`.
pub(super) struct Tile<'a> {
    pub us: &'a [Unpacked],
    pub nb: usize,
    pub rows: std::ops::Range<usize>,
    pub n: usize,
}

#[inline(always)]
fn run_tile_with(
    tile: &Tile<'_>,
    acts: &[&[BlockQ8K]],
    order: &dyn Fn(usize) -> Order,
    out: &super::OutPtr,
    sums: impl Fn(&Unpacked, &BlockQ8K) -> Sums + Copy,
    block4x4: impl Fn([Order; 4], [&[Unpacked]; 4], [&[BlockQ8K]; 4]) -> [[f32; 4]; 4],
) {
    let nb = tile.nb.max(1);
    let j0 = tile.rows.start;
    let rows: Vec<&[Unpacked]> = tile.us.chunks_exact(nb).collect();
    // Activation rows four at a time, weight rows four at a time within.
    let mut i = 0;
    while i < acts.len() {
        let quad = i + 4 <= acts.len();
        let mut j = 0;
        while j < rows.len() {
            let wq = j + 4 <= rows.len();
            let put = |r: usize, k: usize, v: f32| {
                // SAFETY: the caller's task owns weight rows `tile.rows`, so
                // column j0 + j + r of every output row (see `OutPtr`).
                unsafe { out.write((i + k) * tile.n + j0 + j + r, v) };
            };
            match (wq, quad) {
                (true, true) => {
                    let o = std::array::from_fn(|k| order(i + k));
                    let v = block4x4(
                        o,
                        std::array::from_fn(|r| rows[j + r]),
                        std::array::from_fn(|k| acts[i + k]),
                    );
                    for (r, vr) in v.iter().enumerate() {
                        for (k, &x) in vr.iter().enumerate() {
                            put(r, k, x);
                        }
                    }
                }
                (true, false) => {
                    let v = outputs::<4, 1>([order(i)], std::array::from_fn(|r| rows[j + r]), [acts[i]], sums);
                    for (r, vr) in v.iter().enumerate() {
                        put(r, 0, vr[0]);
                    }
                }
                (false, true) => {
                    let o = std::array::from_fn(|k| order(i + k));
                    let [v] = outputs::<1, 4>(o, [rows[j]], std::array::from_fn(|k| acts[i + k]), sums);
                    for (k, &x) in v.iter().enumerate() {
                        put(0, k, x);
                    }
                }
                (false, false) => {
                    let [[v]] = outputs::<1, 1>([order(i)], [rows[j]], [acts[i]], sums);
                    put(0, 0, v);
                }
            }
            j += if wq { 4 } else { 1 };
        }
        i += if quad { 4 } else { 1 };
    }
}

/// `run_tile_with` compiled for AVX-512 VNNI (and FMA, so that `mul_add`
/// is one instruction).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2 and FMA must be available; as `run_tile`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn run_tile_vnni(tile: &Tile<'_>, acts: &[&[BlockQ8K]], order: &dyn Fn(usize) -> Order, out: &super::OutPtr) {
    // SAFETY: the features `chunk_sums_vnni` needs are enabled here.
    let sums = |u: &Unpacked, y: &BlockQ8K| unsafe { chunk_sums_vnni(u, y) };
    run_tile_with(tile, acts, order, out, sums, |o, us, a| outputs::<4, 4>(o, us, a, sums))
}

/// `run_tile_with` compiled for AVX2 and FMA.
///
/// # Safety
/// AVX2 and FMA must be available; as `run_tile`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_tile_fma(tile: &Tile<'_>, acts: &[&[BlockQ8K]], order: &dyn Fn(usize) -> Order, out: &super::OutPtr) {
    // SAFETY: the features `chunk_sums_avx2` needs are enabled here.
    let sums = |u: &Unpacked, y: &BlockQ8K| unsafe { chunk_sums_avx2(u, y) };
    // Bias terms (Q6_K's offset) only where a bias scale is not zero.
    let bias = tile.us.iter().any(|u| u.bias_scales != [0; 16]);
    run_tile_with(tile, acts, order, out, sums, |o, us, a| {
        if o.iter().all(|&x| x == o[0]) {
            // SAFETY: AVX2 and FMA are enabled here; a tile's rows have
            // equally many blocks, and so do the activation rows.
            unsafe { super::ggml_superblock_avx2::outputs_4x4(o[0], us, a, bias) }
        } else {
            outputs::<4, 4>(o, us, a, sums)
        }
    })
}

/// Every output of `tile` with the widest code this CPU runs at or below
/// `isa` (all give the same bits). The caller's task must own the tile's
/// weight rows, and `out` must hold `acts.len() * tile.n` values.
pub(super) fn run_tile(
    isa: super::Isa,
    tile: &Tile<'_>,
    acts: &[&[BlockQ8K]],
    order: &dyn Fn(usize) -> Order,
    out: &super::OutPtr,
) {
    #[cfg(target_arch = "x86_64")]
    {
        use super::Isa;
        if isa >= Isa::Avx512Vnni && Isa::Avx512Vnni.is_available() {
            // SAFETY: the features are available (checked just above).
            return unsafe { run_tile_vnni(tile, acts, order, out) };
        }
        if isa >= Isa::Avx2 && Isa::Avx2.is_available() {
            // SAFETY: as above (`Isa::Avx2` includes FMA).
            return unsafe { run_tile_fma(tile, acts, order, out) };
        }
    }
    let _ = isa;
    run_tile_with(tile, acts, order, out, chunk_sums_portable, |o, us, a| {
        outputs::<4, 4>(o, us, a, chunk_sums_portable)
    })
}

/// `out = acts @ w^T` with `w` of type `W`, in tiles of weight rows that
/// are unpacked once and met by every activation row, in `order(i)`.
pub(super) fn run_tiles<W: Unpack + rustorch_core::quant::blocks::Block>(
    isa: super::Isa,
    w: &super::QMatRef<'_>,
    acts: &[&[BlockQ8K]],
    order: &(dyn Fn(usize) -> Order + Sync),
    out: &mut [f32],
) {
    use rayon::prelude::*;
    let n = w.rows();
    let unpack = W::unpacker(isa);
    let out_ptr = super::OutPtr(out.as_mut_ptr());
    // Tiles of JB weight rows, unpacked once (about 10 KB per row of 4096
    // values: a tile stays in L2), met by each activation row in turn (which
    // stays in L1 while it goes past the tile's rows).
    const JB: usize = 16;
    (0..n.div_ceil(JB)).into_par_iter().for_each(|jb| {
        let rows = jb * JB..((jb + 1) * JB).min(n);
        let us: Vec<Unpacked> = rows
            .clone()
            .flat_map(|j| w.row_blocks::<W>(j).map(|x| unpack(&x)))
            .collect();
        let nb = us.len() / rows.len();
        let tile = Tile { us: &us, nb, rows, n };
        run_tile(isa, &tile, acts, order, &out_ptr);
    });
}
