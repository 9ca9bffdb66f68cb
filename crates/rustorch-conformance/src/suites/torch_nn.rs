//! layer_norm, rms_norm, batch_norm, rope and scaled dot-product attention
//! against PyTorch (tests/fixtures/torch/nn.json, from
//! tools/torch_fixtures/nn.py), plus error cases and the parallel paths;
//! attention at a position held in a tensor against scaled dot-product
//! attention with the equivalent mask.

use super::torch_common::{assert_close, fixture_tol, load, Case};
use crate::{Case as Check, Target};
use rustorch_core::op::{AttnMask, RopeLayout};
use rustorch_core::{DType, Error, Tensor};
use serde_json::Value;

/// Applies the fixture's view list (see apply_view in index.py) to a tensor.
fn apply_view(case: &str, mut t: Tensor, views: &Value) -> Tensor {
    let Some(list) = views.as_array() else { return t };
    let int = |v: &Value| v.as_i64().unwrap_or_else(|| panic!("{case}: bad view arg {v}"));
    let ints = |v: &Value| {
        v.as_array()
            .expect("list")
            .iter()
            .map(|x| int(x) as isize)
            .collect::<Vec<_>>()
    };
    for v in list {
        t = match v[0].as_str().expect("view kind") {
            "t" => t.transpose(int(&v[1]) as isize, int(&v[2]) as isize),
            "narrow" => t.narrow(int(&v[1]) as isize, int(&v[2]) as usize, int(&v[3]) as usize),
            "expand" => t.expand(&ints(&v[1])),
            "permute" => t.permute(&ints(&v[1])),
            k => panic!("{case}: unknown view {k}"),
        }
        .unwrap_or_else(|e| panic!("{case}: view {v}: {e}"));
    }
    assert!(
        list.is_empty() || !t.is_contiguous(),
        "{case}: the view should be non-contiguous"
    );
    t
}

fn inputs(tg: &Target, case: &Case) -> Vec<Tensor> {
    (0..case.inputs.len())
        .map(|i| apply_view(&case.name, case.input(tg, i), &case.args["views"][i.to_string()]))
        .collect()
}

fn run_case(tg: &Target, case: &Case) -> Vec<Tensor> {
    let x = inputs(tg, case);
    let flag = |k: &str| case.args[k].as_bool().unwrap_or(false);
    let eps = || case.arg_f64("eps");
    let fail = |e: Error| -> ! { panic!("{}: {e}", case.name) };
    match case.arg_str("op") {
        "layer_norm" => {
            let mut rest = x[1..].iter();
            let w = if flag("w") { rest.next() } else { None };
            let b = if flag("b") { rest.next() } else { None };
            vec![x[0]
                .layer_norm(case.arg_i64("k") as usize, w, b, eps())
                .unwrap_or_else(|e| fail(e))]
        }
        "rms_norm" => {
            let w = if flag("w") { x.get(1) } else { None };
            vec![x[0].rms_norm(w, eps()).unwrap_or_else(|e| fail(e))]
        }
        "batch_norm" => {
            let mut rest = x[3..].iter();
            let w = if flag("w") { rest.next() } else { None };
            let b = if flag("b") { rest.next() } else { None };
            vec![x[0].batch_norm(&x[1], &x[2], w, b, eps()).unwrap_or_else(|e| fail(e))]
        }
        "rope" => {
            let layout = match case.arg_str("layout") {
                "neox" => RopeLayout::NeoX,
                "interleaved" => RopeLayout::Interleaved,
                l => panic!("{}: layout {l}", case.name),
            };
            vec![x[0].rope(&x[1], &x[2], layout).unwrap_or_else(|e| fail(e))]
        }
        "rope_cos_sin" => {
            let dtype = DType::parse(case.arg_str("dtype")).expect("dtype");
            let (r, theta) = (case.arg_i64("rot_dims") as usize, case.arg_f64("theta"));
            let (c, s) = if case.has_arg("seq_len") {
                Tensor::rope_cos_sin_seq(case.arg_i64("seq_len") as usize, r, theta, dtype)
            } else {
                let pos: Vec<usize> = case.arg_vec_i64("positions").iter().map(|&p| p as usize).collect();
                Tensor::rope_cos_sin(&pos, r, theta, dtype)
            }
            .unwrap_or_else(|e| fail(e));
            // The tables are made on the host: what the target adds is holding them.
            vec![tg.adopt(Ok(c)).unwrap(), tg.adopt(Ok(s)).unwrap()]
        }
        "sdpa" => {
            let mask = match case.arg_str("mask") {
                "none" => AttnMask::None,
                "causal" => AttnMask::Causal,
                "causal_from_end" => AttnMask::CausalFromEnd,
                "bool" | "float" => AttnMask::Explicit,
                m => panic!("{}: mask {m}", case.name),
            };
            let scale = case.has_arg("scale").then(|| case.arg_f64("scale"));
            vec![
                Tensor::scaled_dot_product_attention(&x[0], &x[1], &x[2], mask, x.get(3), scale)
                    .unwrap_or_else(|e| fail(e)),
            ]
        }
        o => panic!("{}: unknown op {o}", case.name),
    }
}

pub fn nn_ops_match_torch(tg: &Target) {
    let cases = load("nn");
    let mut seen = std::collections::BTreeMap::new();
    for case in &cases {
        let got = run_case(tg, case);
        assert_eq!(got.len(), case.outputs.len(), "{}: outputs", case.name);
        for (g, want) in got.iter().zip(&case.outputs) {
            assert_close(tg, &case.name, g, want, fixture_tol(want.dtype));
        }
        *seen.entry(case.arg_str("op").to_string()).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 6, "{seen:?}");
    assert!(cases.len() > 100);
}

pub fn fully_masked_rows_are_zero(tg: &Target) {
    // PyTorch 2.15 on the CPU returns zeros for a query that sees no key.
    let case = load("nn")
        .into_iter()
        .find(|c| c.name == "sdpa_f32_bool")
        .expect("case");
    let out = run_case(tg, &case).remove(0);
    let v = out.to_vec::<f32>().unwrap();
    // Mask [Tq=3, Tk=7] with row 0 all false; output [2, 2, 3, 4].
    for bh in 0..4 {
        assert!(v[bh * 12..bh * 12 + 4].iter().all(|&x| x == 0.0), "row 0 of head {bh}");
        assert!(v[bh * 12 + 4..bh * 12 + 12].iter().any(|&x| x != 0.0));
    }
}

fn rows_in_pieces(x: &Tensor, piece: usize, f: impl Fn(&Tensor) -> Tensor) -> Tensor {
    let parts: Vec<Tensor> = x.split(piece, 0).unwrap().iter().map(f).collect();
    Tensor::cat(&parts.iter().collect::<Vec<_>>(), 0).unwrap()
}

/// Large inputs take the parallel path; small pieces of them the serial
/// one. Both must give the same bits.
pub fn parallel_norms_match_serial(tg: &Target) {
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let x = tg.randn([320, 257], dtype, 11).unwrap();
        let w = tg.randn([257], dtype, 12).unwrap();
        let b = tg.randn([257], dtype, 13).unwrap();
        let big = x.rms_norm(Some(&w), 1e-6).unwrap();
        let small = rows_in_pieces(&x, 16, |p| p.rms_norm(Some(&w), 1e-6).unwrap());
        assert_eq!(
            big.to_f64_vec().unwrap(),
            small.to_f64_vec().unwrap(),
            "rms_norm {dtype}"
        );
        let big = x.layer_norm(1, Some(&w), Some(&b), 1e-5).unwrap();
        let small = rows_in_pieces(&x, 16, |p| p.layer_norm(1, Some(&w), Some(&b), 1e-5).unwrap());
        assert_eq!(
            big.to_f64_vec().unwrap(),
            small.to_f64_vec().unwrap(),
            "layer_norm {dtype}"
        );
        let xb = x.reshape([20, 16, 257]).unwrap();
        let (m, v) = (tg.randn([16], dtype, 14).unwrap(), tg.rand([16], dtype, 15).unwrap());
        let big = xb.batch_norm(&m, &v, None, None, 1e-3).unwrap();
        let small = rows_in_pieces(&xb, 1, |p| p.batch_norm(&m, &v, None, None, 1e-3).unwrap());
        assert_eq!(
            big.to_f64_vec().unwrap(),
            small.to_f64_vec().unwrap(),
            "batch_norm {dtype}"
        );
    }
}

/// Plain f64 attention, straight from the definition.
#[allow(clippy::too_many_arguments)]
fn naive_sdpa(q: &[f64], k: &[f64], v: &[f64], dims: [usize; 7], mask: AttnMask, scale: f64) -> Vec<f64> {
    let [b, hq, hkv, tq, tk, d, dv] = dims;
    let mut out = vec![0.0; b * hq * tq * dv];
    for bi in 0..b {
        for h in 0..hq {
            let g = h / (hq / hkv);
            for i in 0..tq {
                let visible = |j: usize| match mask {
                    AttnMask::Causal => j <= i,
                    AttnMask::CausalFromEnd => j + tq <= i + tk,
                    _ => true,
                };
                let qr = &q[((bi * hq + h) * tq + i) * d..][..d];
                let scores: Vec<Option<f64>> = (0..tk)
                    .map(|j| {
                        let kr = &k[((bi * hkv + g) * tk + j) * d..][..d];
                        visible(j).then(|| qr.iter().zip(kr).map(|(a, b)| a * b).sum::<f64>() * scale)
                    })
                    .collect();
                let m = scores.iter().flatten().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
                if m == f64::NEG_INFINITY {
                    continue;
                }
                let p: Vec<f64> = scores.iter().map(|s| s.map_or(0.0, |s| (s - m).exp())).collect();
                let l: f64 = p.iter().sum();
                let o = &mut out[((bi * hq + h) * tq + i) * dv..][..dv];
                for (j, pj) in p.iter().enumerate() {
                    let vr = &v[((bi * hkv + g) * tk + j) * dv..][..dv];
                    for (x, y) in o.iter_mut().zip(vr) {
                        *x += pj / l * y;
                    }
                }
            }
        }
    }
    out
}

/// Big enough for the parallel path, checked against `naive_sdpa`.
pub fn large_attention_matches_definition(tg: &Target) {
    let dims = [2, 8, 2, 40, 96, 64, 48];
    let [b, hq, hkv, tq, tk, d, dv] = dims;
    let q = tg.randn([b, hq, tq, d], DType::F32, 1).unwrap();
    let k = tg.randn([b, hkv, tk, d], DType::F32, 2).unwrap();
    let v = tg.randn([b, hkv, tk, dv], DType::F32, 3).unwrap();
    let (qv, kv, vv) = (
        q.to_f64_vec().unwrap(),
        k.to_f64_vec().unwrap(),
        v.to_f64_vec().unwrap(),
    );
    for mask in [AttnMask::None, AttnMask::Causal, AttnMask::CausalFromEnd] {
        let got = Tensor::scaled_dot_product_attention(&q, &k, &v, mask, None, None).unwrap();
        assert_eq!(got.dims(), &[b, hq, tq, dv]);
        let want = naive_sdpa(&qv, &kv, &vv, dims, mask, 1.0 / (d as f64).sqrt());
        for (i, (g, w)) in got.to_f64_vec().unwrap().iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 + 1e-5 * w.abs(),
                "{mask:?} element {i}: {g} vs {w}"
            );
        }
    }
    // The same through an explicit bool mask equal to the from-end causal one.
    let keep: Vec<bool> = (0..tq * tk).map(|e| e % tk + tq <= e / tk + tk).collect();
    let m = tg.from_vec(keep, [tq, tk]).unwrap();
    let a = Tensor::scaled_dot_product_attention(&q, &k, &v, AttnMask::Explicit, Some(&m), None).unwrap();
    let c = Tensor::scaled_dot_product_attention(&q, &k, &v, AttnMask::CausalFromEnd, None, None).unwrap();
    // Not bit-identical: masked keys still take part in the (vectorized)
    // maximum and sum with weight 0, which regroups the additions.
    for (x, y) in a.to_vec::<f32>().unwrap().iter().zip(c.to_vec::<f32>().unwrap()) {
        assert!((x - y).abs() <= 1e-6 + 1e-6 * y.abs(), "{x} vs {y}");
    }
}

fn is_invalid_argument(r: rustorch_core::Result<Tensor>) -> bool {
    matches!(r, Err(Error::InvalidArgument { .. }))
}

pub fn invalid_inputs_are_errors(tg: &Target) {
    let x = tg.randn([4, 8], DType::F32, 1).unwrap();
    let w7 = tg.randn([7], DType::F32, 2).unwrap();
    let w8 = tg.randn([8], DType::F32, 2).unwrap();
    assert!(x.rms_norm(Some(&w7), 1e-6).is_err(), "rms weight length");
    assert!(
        x.rms_norm(Some(&w8.to_dtype(DType::F64).unwrap()), 1e-6).is_err(),
        "rms weight dtype"
    );
    assert!(x.layer_norm(1, Some(&w7), None, 1e-5).is_err(), "layer weight shape");
    assert!(x.layer_norm(3, None, None, 1e-5).is_err(), "too many normalized dims");
    assert!(x.layer_norm(0, None, None, 1e-5).is_err(), "zero normalized dims");
    assert!(
        x.layer_norm(2, Some(&w8), None, 1e-5).is_err(),
        "weight not of the normalized shape"
    );
    let xi = tg.zeros([4, 8], DType::I64).unwrap();
    assert!(xi.rms_norm(None, 1e-6).is_err(), "integer input");
    let c4 = tg.ones([4], DType::F32).unwrap();
    assert!(
        x.batch_norm(&c4, &c4, None, None, 1e-5).is_err(),
        "batch stats of the wrong size"
    );
    // rope: tables of the wrong length or too wide.
    let (c, s) = Tensor::rope_cos_sin_seq(3, 8, 1e4, DType::F32).unwrap();
    assert!(x.rope(&c, &s, RopeLayout::NeoX).is_err(), "T mismatch");
    let (c, s) = Tensor::rope_cos_sin_seq(4, 10, 1e4, DType::F32).unwrap();
    assert!(x.rope(&c, &s, RopeLayout::Interleaved).is_err(), "R > D");
    assert!(Tensor::rope_cos_sin_seq(4, 7, 1e4, DType::F32).is_err(), "odd rot_dims");
    assert!(
        Tensor::rope_cos_sin_seq(4, 8, -1.0, DType::F32).is_err(),
        "negative theta"
    );
    assert!(
        Tensor::rope_cos_sin_seq(4, 8, 1e4, DType::I32).is_err(),
        "integer tables"
    );
    // sdpa: mask mode and tensor must agree; heads must group.
    let q = tg.randn([1, 4, 3, 8], DType::F32, 3).unwrap();
    let k = tg.randn([1, 2, 5, 8], DType::F32, 4).unwrap();
    let m = tg.ones([3, 5], DType::Bool).unwrap();
    assert!(is_invalid_argument(Tensor::scaled_dot_product_attention(
        &q,
        &k,
        &k,
        AttnMask::Explicit,
        None,
        None
    )));
    assert!(is_invalid_argument(Tensor::scaled_dot_product_attention(
        &q,
        &k,
        &k,
        AttnMask::Causal,
        Some(&m),
        None
    )));
    assert!(Tensor::scaled_dot_product_attention(&q, &k, &k, AttnMask::Explicit, Some(&m), None).is_ok());
    let k3 = tg.randn([1, 3, 5, 8], DType::F32, 5).unwrap();
    assert!(
        Tensor::scaled_dot_product_attention(&q, &k3, &k3, AttnMask::None, None, None).is_err(),
        "4 heads over 3"
    );
    let bad = tg.ones([3, 4], DType::Bool).unwrap();
    assert!(
        Tensor::scaled_dot_product_attention(&q, &k, &k, AttnMask::Explicit, Some(&bad), None).is_err(),
        "mask shape"
    );
    let m64 = tg.ones([3, 5], DType::F64).unwrap();
    assert!(
        Tensor::scaled_dot_product_attention(&q, &k, &k, AttnMask::Explicit, Some(&m64), None).is_err(),
        "mask dtype"
    );
}

/// One `attention_at` case: heads, query rows, cache capacity, head dims,
/// position, window, cache dtype, and whether q is a transposed view.
struct AtCase {
    h: usize,
    hkv: usize,
    t: usize,
    n: usize,
    d: usize,
    dv: usize,
    pos: usize,
    window: Option<usize>,
    cache: DType,
    q_transposed: bool,
    pos_i32: bool,
}

/// `attention_at` equals `sdpa` over the cache's first pos + T positions
/// with the keep-mask of the same positions (j <= p, p - j < w), the
/// cache rounded to its dtype first (both then see the same values). The
/// cache holds NaN from pos + T on: a read of a key or value there would
/// make the output NaN. Head dims are multiples of 32 (the GPU's kernels).
pub fn attention_at_matches_sdpa(tg: &Target) {
    let base = AtCase {
        h: 6,
        hkv: 2,
        t: 3,
        n: 40,
        d: 64,
        dv: 32,
        pos: 17,
        window: None,
        cache: DType::F32,
        q_transposed: false,
        pos_i32: false,
    };
    let cases = [
        AtCase { t: 1, ..base },
        AtCase { ..base },
        AtCase { pos: 0, ..base },
        AtCase { pos: 0, t: 1, ..base },
        AtCase { pos: 37, ..base },
        AtCase { pos: 39, t: 1, ..base },
        AtCase {
            window: Some(5),
            pos: 30,
            ..base
        },
        AtCase {
            window: Some(1),
            t: 1,
            pos: 20,
            ..base
        },
        AtCase {
            window: Some(4),
            pos: 2,
            ..base
        },
        AtCase {
            window: Some(100),
            pos: 37,
            pos_i32: true,
            ..base
        },
        AtCase {
            cache: DType::F16,
            ..base
        },
        AtCase {
            cache: DType::F16,
            window: Some(8),
            pos: 25,
            t: 1,
            ..base
        },
        AtCase {
            cache: DType::BF16,
            pos: 9,
            ..base
        },
        AtCase {
            q_transposed: true,
            ..base
        },
        AtCase {
            q_transposed: true,
            cache: DType::F16,
            t: 1,
            pos: 33,
            pos_i32: true,
            ..base
        },
        // One kv head for all, wide heads, a cache the GPU splits over
        // several blocks (600 positions: 3 splits), a window across splits.
        AtCase {
            h: 4,
            hkv: 1,
            t: 2,
            n: 600,
            d: 128,
            dv: 128,
            pos: 550,
            ..base
        },
        AtCase {
            h: 4,
            hkv: 4,
            t: 1,
            n: 600,
            d: 128,
            dv: 64,
            pos: 599,
            window: Some(300),
            cache: DType::F16,
            ..base
        },
    ];
    let (mut max_abs, mut max_rel) = (0.0f64, 0.0f64);
    for (ci, c) in cases.iter().enumerate() {
        let what = format!(
            "attention_at case {ci}: H {} Hkv {} T {} N {} D {} Dv {} pos {} window {:?} cache {} q transposed {}",
            c.h, c.hkv, c.t, c.n, c.d, c.dv, c.pos, c.window, c.cache, c.q_transposed
        );
        let seed = 100 + 10 * ci as u64;
        let q = if c.q_transposed {
            tg.randn([c.h, c.d, c.t], DType::F32, seed)
                .unwrap()
                .transpose(1, 2)
                .unwrap()
        } else {
            tg.randn([c.h, c.t, c.d], DType::F32, seed).unwrap()
        };
        let end = c.pos + c.t;
        let cache = |dims: [usize; 3], seed: u64| {
            let mut x = Tensor::randn(dims, DType::F32, seed).unwrap().to_vec::<f32>().unwrap();
            for (e, x) in x.iter_mut().enumerate() {
                if (e / dims[2]) % dims[1] >= end {
                    *x = f32::NAN;
                }
            }
            tg.from_vec(x, dims).unwrap().to_dtype(c.cache).unwrap()
        };
        let k = cache([c.hkv, c.n, c.d], seed + 1);
        let v = cache([c.hkv, c.n, c.dv], seed + 2);
        let pos = if c.pos_i32 {
            tg.scalar(c.pos as i32)
        } else {
            tg.from_vec(vec![c.pos as i64], [1]).unwrap()
        };
        let scale = 1.0 / (c.d as f32).sqrt();
        let got = Tensor::attention_at(&q, &k, &v, &pos, scale, c.window).unwrap();
        assert_eq!(got.dims(), &[c.h, c.t, c.dv], "{what}");
        assert_eq!(got.dtype(), DType::F32, "{what}");
        tg.check_ran_here(&what, Some(&got));
        let keep: Vec<bool> = (0..c.t * end)
            .map(|e| {
                let (p, j) = (c.pos + e / end, e % end);
                j <= p && c.window.is_none_or(|w| p - j < w)
            })
            .collect();
        let mask = tg.from_vec(keep, [c.t, end]).unwrap();
        let seen = |x: &Tensor| {
            x.narrow(1, 0, end)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .unsqueeze(0)
                .unwrap()
        };
        let want = Tensor::scaled_dot_product_attention(
            &q.unsqueeze(0).unwrap(),
            &seen(&k),
            &seen(&v),
            AttnMask::Explicit,
            Some(&mask),
            Some(scale as f64),
        )
        .unwrap();
        let (g, w) = (got.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
        assert_eq!(g.len(), w.len(), "{what}");
        for (i, (g, w)) in g.iter().zip(&w).enumerate() {
            let err = (g - w).abs();
            assert!(
                err <= 1e-5 + 1e-5 * w.abs(),
                "{what}: element {i} is {g}, sdpa gives {w}"
            );
            max_abs = max_abs.max(err);
            if w.abs() >= 1e-2 {
                max_rel = max_rel.max(err / w.abs());
            }
        }
    }
    tg.note(format!(
        "attention_at vs sdpa: {} cases, largest difference {max_abs:.2e} (relative, on outputs of at least 0.01: {max_rel:.2e})",
        cases.len()
    ));
}

/// Shapes, dtypes and windows are refused when the op is built; a position
/// outside 0..=N-T when it runs (on a GPU through its error flag).
pub fn attention_at_rejects_bad_inputs(tg: &Target) {
    let q = tg.randn([4, 2, 64], DType::F32, 1).unwrap();
    let k = tg.randn([2, 16, 64], DType::F16, 2).unwrap();
    let v = tg.randn([2, 16, 32], DType::F16, 3).unwrap();
    let at = |q: &Tensor, k: &Tensor, v: &Tensor, pos: &Tensor, window: Option<usize>| {
        Tensor::attention_at(q, k, v, pos, 0.125, window)
    };
    let pos = |p: i64| tg.from_vec(vec![p], [1]).unwrap();
    for p in [0, 7, 14] {
        let out = at(&q, &k, &v, &pos(p), None).unwrap();
        assert_eq!(out.dims(), &[4, 2, 32]);
    }
    assert!(at(&q, &k, &v, &pos(14), Some(3)).is_ok());
    // Positions: negative, one past the end, far past it, as i32 too.
    for p in [-1, 15, 16, 1 << 40, i64::MIN] {
        let err = at(&q, &k, &v, &pos(p), None).unwrap_err();
        assert!(err.to_string().contains("does not fit"), "pos {p}: {err}");
    }
    let err = at(&q, &k, &v, &tg.scalar(-3i32), Some(4)).unwrap_err();
    assert!(err.to_string().contains("does not fit"), "{err}");
    // Shapes: 4 query heads over 3 kv heads, D apart, N apart, rank 4.
    let k3 = tg.randn([3, 16, 64], DType::F16, 4).unwrap();
    let v3 = tg.randn([3, 16, 32], DType::F16, 5).unwrap();
    assert!(at(&q, &k3, &v3, &pos(0), None).is_err(), "4 heads over 3");
    let k48 = tg.randn([2, 16, 48], DType::F16, 6).unwrap();
    assert!(at(&q, &k48, &v, &pos(0), None).is_err(), "D of q and k");
    let v15 = tg.randn([2, 15, 32], DType::F16, 7).unwrap();
    assert!(at(&q, &k, &v15, &pos(0), None).is_err(), "N of k and v");
    let q4 = tg.randn([1, 4, 2, 64], DType::F32, 8).unwrap();
    assert!(at(&q4, &k, &v, &pos(0), None).is_err(), "rank 4");
    // Dtypes: k and v apart, f64 queries, a float position; pos of 2 elements.
    let v32 = tg.randn([2, 16, 32], DType::F32, 9).unwrap();
    assert!(at(&q, &k, &v32, &pos(0), None).is_err(), "k f16, v f32");
    let q64 = tg.randn([4, 2, 64], DType::F64, 10).unwrap();
    assert!(at(&q64, &k, &v, &pos(0), None).is_err(), "f64 queries");
    assert!(at(&q, &k, &v, &tg.scalar(0.0f32), None).is_err(), "f32 position");
    let two = tg.from_vec(vec![0i64, 1], [2]).unwrap();
    assert!(at(&q, &k, &v, &two, None).is_err(), "two positions");
    assert!(at(&q, &k, &v, &pos(0), Some(0)).is_err(), "empty window");
}

/// The checks of this group, in file order.
pub const CASES: &[Check] = &[
    ("nn_ops_match_torch", nn_ops_match_torch),
    ("fully_masked_rows_are_zero", fully_masked_rows_are_zero),
    ("parallel_norms_match_serial", parallel_norms_match_serial),
    ("large_attention_matches_definition", large_attention_matches_definition),
    ("invalid_inputs_are_errors", invalid_inputs_are_errors),
    ("attention_at_matches_sdpa", attention_at_matches_sdpa),
    ("attention_at_rejects_bad_inputs", attention_at_rejects_bad_inputs),
];
