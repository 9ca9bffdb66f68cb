//! The flash-attention paths against GGML's loops spelled out one element
//! at a time (ops.cpp), and against exact attention.

// The references follow GGML's indexed loops.
#![allow(clippy::needless_range_loop)]

use super::super::expf::v_expf;
use super::super::floatdot::{dot, FloatOrder};
use super::super::half_arith::{fma_half, mul_half};
use super::super::reduce::reduce16;
use super::*;
use crate::CpuStorage;
use rustorch_core::layout::Layout;
use rustorch_core::shape::Shape;

/// A small deterministic generator (xorshift), values in [-1, 1).
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

struct Case {
    hq: usize,
    hkv: usize,
    t: usize,
    l: usize,
    d: usize,
    dv: usize,
    q: Vec<f32>,
    k: Vec<f16>,
    v: Vec<f16>,
    mask: Vec<f32>,
}

/// Causal attention of `t` new positions after `pos0` cached ones over `l`
/// cache positions; `holes` hides every seventh key as well, and the last
/// row sees nothing when `blind_row`.
#[allow(clippy::too_many_arguments)]
fn case(
    hq: usize,
    hkv: usize,
    t: usize,
    pos0: usize,
    l: usize,
    d: usize,
    dv: usize,
    holes: bool,
    blind_row: bool,
) -> Case {
    let mut g = Gen(0x9e37_79b9_7f4a_7c15 ^ (t * 131 + l) as u64);
    // Scores of a few units: exponentials that under- and overlap.
    let q = (0..hq * t * d).map(|_| 3.0 * g.next()).collect();
    let k = (0..hkv * l * d).map(|_| f16::from_f32(g.next())).collect();
    let v = (0..hkv * l * dv).map(|_| f16::from_f32(g.next())).collect();
    let mut mask = vec![f32::NEG_INFINITY; t * l];
    for i in 0..t {
        for j in 0..l {
            let visible = j <= pos0 + i && !(holes && j % 7 == 3) && !(blind_row && i + 1 == t);
            if visible {
                mask[i * l + j] = 0.0;
            }
        }
    }
    Case {
        hq,
        hkv,
        t,
        l,
        d,
        dv,
        q,
        k,
        v,
        mask,
    }
}

fn run(c: &Case, p: FlashParams) -> Vec<f32> {
    run_rounding(c, p, GgmlHalf::Widened)
}

fn run_rounding(c: &Case, p: FlashParams, half: GgmlHalf) -> Vec<f32> {
    let op = Op::FlashAttention {
        scale: p.scale,
        cpu: rustorch_core::op::CpuHints {
            tiled_rows: p.tiled_rows as u32,
            kv_len: p.kv_len as u32,
            threads: p.threads as u32,
            ..Default::default()
        },
    };
    let stores = [
        CpuStorage::from_vec(c.q.clone()),
        CpuStorage::from_vec(c.k.clone()),
        CpuStorage::from_vec(c.v.clone()),
        CpuStorage::from_vec(c.mask.clone()),
    ];
    let layouts = [
        Layout::contiguous(Shape::from([c.hq, c.t, c.d])),
        Layout::contiguous(Shape::from([c.hkv, c.l, c.d])),
        Layout::contiguous(Shape::from([c.hkv, c.l, c.dv])),
        Layout::contiguous(Shape::from([c.t, c.l])),
    ];
    let inputs: Vec<CpuInput<'_>> = stores
        .iter()
        .zip(&layouts)
        .map(|(s, l)| CpuInput { storage: s, layout: l })
        .collect();
    let out = flash_attention_rounding(&op, &inputs, p, half).unwrap();
    out[0].as_slice::<f32>().unwrap().to_vec()
}

/// `ggml_compute_forward_flash_attn_ext_tiled` for one row, element by
/// element.
fn tiled_reference(c: &Case, scale: f32, h: usize, i: usize) -> Vec<f32> {
    let (d, dv, l) = (c.d, c.dv, c.l);
    let hk = h / (c.hq / c.hkv);
    let q = &c.q[(h * c.t + i) * d..][..d];
    let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
    let mut acc = vec![0f32; dv];
    for ic in (0..l).step_by(TILE) {
        let mut kq = [0f32; TILE];
        for (j, x) in kq.iter_mut().enumerate() {
            if ic + j >= l {
                *x = f32::NEG_INFINITY;
                continue;
            }
            let mut a = 0f32;
            for dk in 0..d {
                a = c.k[(hk * l + ic + j) * d + dk].to_f32().mul_add(q[dk], a);
            }
            *x = a * scale + c.mask[i * l + ic + j];
        }
        let tile_max = kq.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        if tile_max == f32::NEG_INFINITY {
            continue;
        }
        let m_new = m.max(tile_max);
        if m_new > m {
            let ms = (m - m_new).exp();
            acc.iter_mut().for_each(|a| *a *= ms);
            s *= ms;
        }
        m = m_new;
        let mut sum = 0f64;
        for b in kq.chunks_exact_mut(16) {
            for x in b.iter_mut() {
                *x = v_expf(*x - m);
            }
            sum += reduce16(&<[f32; 16]>::try_from(&*b).unwrap()) as f64;
        }
        s = (s as f64 + sum) as f32;
        for (e, a) in acc.iter_mut().enumerate() {
            for (j, &p) in kq.iter().enumerate() {
                let vv = if ic + j < l {
                    c.v[(hk * l + ic + j) * dv + e].to_f32()
                } else {
                    0.0
                };
                *a = vv.mul_add(p, *a);
            }
        }
    }
    let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
    acc.iter().map(|a| a * inv).collect()
}

/// `ggml_compute_forward_flash_attn_ext_f16_one_chunk` for one row over
/// keys `keys`: (M, S, VKQ) before normalization.
fn one_chunk_reference(c: &Case, scale: f32, h: usize, i: usize, keys: Range<usize>) -> (f32, f32, Vec<f32>) {
    one_chunk_reference_rounding(c, scale, h, i, keys, GgmlHalf::Widened)
}

/// `one_chunk_reference` for a build whose f16 steps round as `half` says:
/// with AVX512-FP16, elements of whole 128-element steps take the scalar
/// rounded to f16 and one half-precision FMA or product (`fma_half` and
/// `mul_half`, themselves checked against exact arithmetic), the rest the
/// widened steps.
fn one_chunk_reference_rounding(
    c: &Case,
    scale: f32,
    h: usize,
    i: usize,
    keys: Range<usize>,
    half: GgmlHalf,
) -> (f32, f32, Vec<f32>) {
    let native = match half {
        GgmlHalf::Native => c.dv / 128 * 128,
        GgmlHalf::Widened => 0,
    };
    let r16 = |x: f32| f16::from_f32(x).to_f32();
    let (d, dv, l) = (c.d, c.dv, c.l);
    let hk = h / (c.hq / c.hkv);
    let q16: Vec<f16> = c.q[(h * c.t + i) * d..][..d]
        .iter()
        .map(|&x| f16::from_f32(x))
        .collect();
    let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
    let mut acc = vec![f16::ZERO; dv];
    for j in keys.start..keys.end.min(l) {
        let mv = c.mask[i * l + j];
        if mv == f32::NEG_INFINITY {
            continue;
        }
        let x = dot(FloatOrder::VecDot, &c.k[(hk * l + j) * d..][..d], &q16) * scale + mv;
        let (mut ms, mut vs) = (1f32, 1f32);
        if x > m {
            ms = (m - x).exp();
            m = x;
            for (e, a) in acc.iter_mut().enumerate() {
                *a = if e < native {
                    f16::from_f32(mul_half(a.to_f32(), r16(ms)))
                } else {
                    f16::from_f32(a.to_f32() * ms)
                };
            }
        } else {
            vs = (x - m).exp();
        }
        for (e, a) in acc.iter_mut().enumerate() {
            let x = c.v[(hk * l + j) * dv + e].to_f32();
            *a = if e < native {
                f16::from_f32(fma_half(x, r16(vs), a.to_f32()))
            } else {
                f16::from_f32(x.mul_add(vs, a.to_f32()))
            };
        }
        s = s.mul_add(ms, vs);
    }
    (m, s, acc.iter().map(|a| a.to_f32()).collect())
}

fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len());
    for (n, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(a.to_bits() == b.to_bits(), "{what}: element {n}: {a} != {b}");
    }
}

fn params(scale: f32, tiled_rows: usize) -> FlashParams {
    FlashParams {
        scale,
        tiled_rows,
        kv_len: 256,
        threads: 2,
    }
}

#[test]
fn tiled_path_has_ggml_bits() {
    // 70 rows after 100 cached positions (two partial groups of four, a
    // diagonal across tiles), a partial last tile, holes, a blind row;
    // SmolLM2's head size and Gemma 3's.
    for (d, dv, l) in [(64, 64, 200), (256, 256, 192)] {
        let c = case(6, 2, 70, 100, l, d, dv, true, true);
        let out = run(&c, params(0.125, c.t));
        for h in 0..c.hq {
            for i in 0..c.t {
                let want = tiled_reference(&c, 0.125, h, i);
                assert_bits(
                    &out[(h * c.t + i) * dv..][..dv],
                    &want,
                    &format!("d {d} head {h} row {i}"),
                );
            }
        }
        let blind = &out[(c.t - 1) * dv..][..dv];
        assert!(blind.iter().all(|&x| x == 0.0), "a row that sees no key gives zeros");
    }
}

#[test]
fn one_row_path_has_ggml_bits_and_rows_split_between_paths() {
    let c = case(6, 2, 9, 120, 192, 64, 64, true, false);
    // Rows 0..5 tiled, 5..9 one at a time.
    let out = run(&c, params(0.125, 5));
    for h in 0..c.hq {
        for i in 0..c.t {
            let want = if i < 5 {
                tiled_reference(&c, 0.125, h, i)
            } else {
                let (_, s, acc) = one_chunk_reference(&c, 0.125, h, i, 0..c.l);
                acc.iter().map(|a| a * if s == 0.0 { 0.0 } else { 1.0 / s }).collect()
            };
            assert_bits(&out[(h * c.t + i) * 64..][..64], &want, &format!("head {h} row {i}"));
        }
    }
    // The paths round differently (else this test could not tell them
    // apart).
    let all_one = run(&c, params(0.125, 0));
    assert_ne!(out, all_one);
}

/// Gemma 3's heads of 256 on the one-row path, rounded as llama.cpp's
/// builds with and without AVX512-FP16 round them (heads of 64 round alike
/// in both), and a head of 200 whose last 72 values are the scalar tail.
#[test]
fn one_row_path_has_the_bits_of_builds_with_and_without_avx512fp16() {
    for dv in [256, 200, 64] {
        let c = case(4, 1, 5, 150, 160, 256, dv, true, false);
        let widened = run_rounding(&c, params(0.0625, 0), GgmlHalf::Widened);
        let native = run_rounding(&c, params(0.0625, 0), GgmlHalf::Native);
        for (half, out) in [(GgmlHalf::Widened, &widened), (GgmlHalf::Native, &native)] {
            for h in 0..c.hq {
                for i in 0..c.t {
                    let (_, s, acc) = one_chunk_reference_rounding(&c, 0.0625, h, i, 0..c.l, half);
                    let want: Vec<f32> = acc.iter().map(|a| a * if s == 0.0 { 0.0 } else { 1.0 / s }).collect();
                    assert_bits(
                        &out[(h * c.t + i) * dv..][..dv],
                        &want,
                        &format!("{half:?} dv {dv} head {h} row {i}"),
                    );
                }
            }
        }
        if dv == 64 {
            assert_eq!(widened, native, "rows shorter than one native step round alike");
        } else {
            assert_ne!(widened, native, "the two builds round differently");
        }
    }
}

#[test]
fn split_keys_path_combines_ggml_chunks_in_order() {
    // One position over a 600-key cache that llama.cpp pads to 768, in
    // three threads' chunks of 256 (the last past the used keys).
    let c = case(4, 2, 1, 599, 640, 64, 64, false, false);
    let p = FlashParams {
        scale: 0.125,
        tiled_rows: 0,
        kv_len: 768,
        threads: 3,
    };
    let out = run(&c, p);
    for h in 0..c.hq {
        let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
        let mut acc = vec![0f32; 64];
        for start in [0, 256, 512] {
            let (mc, sc, ac) = one_chunk_reference(&c, 0.125, h, 0, start..start + 256);
            if sc == 0.0 {
                continue;
            }
            let m_new = m.max(mc);
            let (so, sn) = ((m - m_new).exp(), (mc - m_new).exp());
            for (a, &b) in acc.iter_mut().zip(&ac) {
                *a = a.mul_add(so, b * sn);
            }
            s = s.mul_add(so, sc * sn);
            m = m_new;
        }
        let want: Vec<f32> = acc.iter().map(|a| a * (1.0 / s)).collect();
        assert_bits(&out[h * 64..][..64], &want, &format!("head {h}"));
    }
    let unsplit = run(&c, FlashParams { threads: 1, ..p });
    assert_ne!(out, unsplit, "the split changes the rounding");
}

#[test]
fn every_path_is_close_to_exact_attention() {
    let c = case(4, 2, 66, 10, 128, 64, 64, true, false);
    let exact = |h: usize, i: usize| -> Vec<f64> {
        let hk = h / 2;
        let q = &c.q[(h * c.t + i) * 64..][..64];
        let s: Vec<f64> = (0..c.l)
            .map(|j| {
                if c.mask[i * c.l + j] == f32::NEG_INFINITY {
                    return f64::NEG_INFINITY;
                }
                let k = &c.k[(hk * c.l + j) * 64..][..64];
                0.125 * q.iter().zip(k).map(|(&a, &b)| a as f64 * b.to_f64()).sum::<f64>()
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        (0..64)
            .map(|dd| {
                (0..c.l)
                    .map(|j| e[j] * c.v[(hk * c.l + j) * 64 + dd].to_f64())
                    .sum::<f64>()
                    / z
            })
            .collect()
    };
    for tiled_rows in [66, 0] {
        let out = run(&c, params(0.125, tiled_rows));
        for h in 0..c.hq {
            for i in 0..c.t {
                let want = exact(h, i);
                for (a, b) in out[(h * c.t + i) * 64..][..64].iter().zip(&want) {
                    // The one-row path accumulates in f16.
                    assert!((*a as f64 - b).abs() < 4e-3, "tiled rows {tiled_rows}: {a} vs {b}");
                }
            }
        }
    }
}
