//! Convolution and pooling against PyTorch (fixtures from tools/torch_fixtures/conv.py).

use super::torch_common::{load, Case};
use crate::{Case as Check, Target};
use rustorch_core::op::{Conv2dParams, Pool2dParams};
use rustorch_core::{DType, Tensor};
use serde_json::Value;

/// Applies the fixture's view ops (the same ones conv.py applied).
fn apply_views(mut t: Tensor, spec: &Value) -> Tensor {
    for v in spec.as_array().expect("view list") {
        let v = v.as_array().expect("view op");
        let int = |i: usize| v[i].as_i64().expect("integer");
        t = match v[0].as_str().expect("view kind") {
            "transpose" => t.transpose(int(1) as isize, int(2) as isize),
            "narrow" => t.narrow(int(1) as isize, int(2) as usize, int(3) as usize),
            "permute" => {
                let p: Vec<isize> = v[1]
                    .as_array()
                    .expect("perm")
                    .iter()
                    .map(|x| x.as_i64().unwrap() as isize)
                    .collect();
                t.permute(&p)
            }
            k => panic!("unknown view {k}"),
        }
        .expect("view");
    }
    t
}

fn pair(c: &Case, key: &str) -> [usize; 2] {
    let v = c.arg_vec_i64(key);
    [v[0] as usize, v[1] as usize]
}

fn conv_params(c: &Case) -> Conv2dParams {
    Conv2dParams::new(
        pair(c, "stride"),
        pair(c, "padding"),
        pair(c, "dilation"),
        c.arg_i64("groups") as usize,
    )
}

fn run(tg: &Target, c: &Case) -> rustorch_core::Result<Tensor> {
    let x = apply_views(c.input(tg, 0), &c.args["views"]);
    let op = c.arg_str("op");
    let (w, bias) = if op.contains("conv") {
        (Some(c.input(tg, 1)), c.arg_bool("has_bias").then(|| c.input(tg, 2)))
    } else {
        (None, None)
    };
    let w = w.as_ref();
    match op {
        "conv2d" => x.conv2d(w.unwrap(), bias.as_ref(), conv_params(c)),
        "conv1d" => x.conv1d(
            w.unwrap(),
            bias.as_ref(),
            c.arg_i64("stride") as usize,
            c.arg_i64("padding") as usize,
            c.arg_i64("dilation") as usize,
            c.arg_i64("groups") as usize,
        ),
        "conv_transpose2d" => x.conv_transpose2d(w.unwrap(), bias.as_ref(), conv_params(c), pair(c, "output_padding")),
        "max_pool2d" | "avg_pool2d" => {
            let p = Pool2dParams::new(pair(c, "kernel"))
                .with_stride(pair(c, "stride"))
                .with_padding(pair(c, "padding"));
            if op == "max_pool2d" {
                x.max_pool2d(p)
            } else {
                x.avg_pool2d(p, c.arg_bool("count_include_pad"))
            }
        }
        _ => panic!("unknown op {op}"),
    }
}

pub fn conv_and_pool_match_torch(tg: &Target) {
    let cases = load("conv");
    assert!(cases.len() > 60);
    for c in &cases {
        let got = run(tg, c).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let want = &c.outputs[0];
        super::torch_common::assert_close(tg, &c.name, &got, want, super::torch_common::fixture_tol(want.dtype));
    }
}

pub fn strided_inputs_stay_strided(tg: &Target) {
    let cases = load("conv");
    let c = cases.iter().find(|c| c.name == "conv2d_nhwc_input").expect("case");
    assert!(!apply_views(c.input(tg, 0), &c.args["views"]).is_contiguous());
}

fn t(tg: &Target, s: &[usize]) -> Tensor {
    tg.randn(s.to_vec(), DType::F32, 3).unwrap()
}

pub fn bad_shapes_are_errors(tg: &Target) {
    let p = Conv2dParams::default();
    assert!(
        t(tg, &[1, 3, 5, 5]).conv2d(&t(tg, &[2, 4, 3, 3]), None, p).is_err(),
        "channel mismatch"
    );
    assert!(
        t(tg, &[1, 3, 2, 2]).conv2d(&t(tg, &[2, 3, 3, 3]), None, p).is_err(),
        "kernel larger than input"
    );
    assert!(
        t(tg, &[1, 4, 5, 5])
            .conv2d(&t(tg, &[3, 2, 3, 3]), None, p.with_groups(2))
            .is_err(),
        "out channels not divisible"
    );
    assert!(
        t(tg, &[1, 4, 5, 5])
            .conv2d(&t(tg, &[4, 4, 3, 3]), None, p.with_groups(0))
            .is_err(),
        "zero groups"
    );
    assert!(
        t(tg, &[1, 3, 5, 5])
            .conv2d(&t(tg, &[2, 3, 3, 3]), Some(&t(tg, &[3])), p)
            .is_err(),
        "bias size"
    );
    assert!(
        t(tg, &[1, 3, 5, 5])
            .conv2d(&t(tg, &[2, 3, 3, 3]), None, p.with_stride([0, 1]))
            .is_err(),
        "zero stride"
    );
    assert!(
        t(tg, &[3, 5, 5]).conv2d(&t(tg, &[2, 3, 3, 3]), None, p).is_err(),
        "rank-3 input"
    );
    let half = tg.zeros([2, 3, 3, 3], DType::F16).unwrap();
    assert!(t(tg, &[1, 3, 5, 5]).conv2d(&half, None, p).is_err(), "mixed dtypes");
    let ints = tg.zeros([1, 3, 5, 5], DType::I64).unwrap();
    assert!(ints.max_pool2d(Pool2dParams::new([2, 2])).is_err(), "integer pooling");

    assert!(
        t(tg, &[1, 3, 8]).conv1d(&t(tg, &[2, 4, 3]), None, 1, 0, 1, 1).is_err(),
        "conv1d channel mismatch"
    );
    assert!(
        t(tg, &[1, 3, 2]).conv1d(&t(tg, &[2, 3, 5]), None, 1, 0, 1, 1).is_err(),
        "conv1d kernel too long"
    );

    let tp = Conv2dParams::default().with_stride([2, 2]);
    assert!(
        t(tg, &[1, 3, 4, 4])
            .conv_transpose2d(&t(tg, &[2, 3, 3, 3]), None, tp, [0, 0])
            .is_err(),
        "convT channel mismatch"
    );
    assert!(
        t(tg, &[1, 3, 4, 4])
            .conv_transpose2d(&t(tg, &[3, 2, 3, 3]), None, tp, [2, 0])
            .is_err(),
        "output_padding >= stride"
    );
    assert!(
        t(tg, &[1, 3, 4, 4])
            .conv_transpose2d(&t(tg, &[3, 2, 3, 3]), None, tp.with_padding([5, 5]), [0, 0])
            .is_err(),
        "convT empty output"
    );

    assert!(
        t(tg, &[1, 2, 3, 3]).max_pool2d(Pool2dParams::new([4, 4])).is_err(),
        "window larger than input"
    );
    assert!(
        t(tg, &[1, 2, 6, 6])
            .avg_pool2d(Pool2dParams::new([2, 2]).with_padding([2, 0]), true)
            .is_err(),
        "padding > kernel / 2"
    );
    assert!(
        t(tg, &[1, 2, 6, 6])
            .max_pool2d(Pool2dParams::new([2, 2]).with_stride([0, 1]))
            .is_err(),
        "zero stride"
    );
}

/// Direct (loop) convolution in f64, as the reference for sizes too large
/// for fixtures: these take the tiled, multi-threaded paths.
#[allow(clippy::too_many_arguments)]
fn conv_ref(x: &[f32], xd: [usize; 4], w: &[f32], wd: [usize; 4], p: Conv2dParams, od: [usize; 4]) -> Vec<f64> {
    let [n, c, h, wi] = xd;
    let [o, cg, kh, kw] = wd;
    let og = o / p.groups;
    let mut out = vec![0.0; od.iter().product()];
    for ni in 0..n {
        for oi in 0..o {
            let g = oi / og;
            for y in 0..od[2] {
                for xo in 0..od[3] {
                    let mut s = 0.0f64;
                    for ci in 0..cg {
                        for i in 0..kh {
                            for j in 0..kw {
                                let iy = (y * p.stride[0] + i * p.dilation[0]) as isize - p.padding[0] as isize;
                                let ix = (xo * p.stride[1] + j * p.dilation[1]) as isize - p.padding[1] as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wi as isize {
                                    continue;
                                }
                                let xv = x[((ni * c + g * cg + ci) * h + iy as usize) * wi + ix as usize] as f64;
                                s += xv * w[((oi * cg + ci) * kh + i) * kw + j] as f64;
                            }
                        }
                    }
                    out[((ni * o + oi) * od[2] + y) * od[3] + xo] = s;
                }
            }
        }
    }
    out
}

pub fn large_convolutions_match_reference(tg: &Target) {
    let cases: [([usize; 4], [usize; 4], Conv2dParams); 4] = [
        // Many images: one thread per image, im2col in L2-sized tiles.
        (
            [4, 64, 20, 30],
            [16, 64, 3, 3],
            Conv2dParams::default().with_padding([1, 1]),
        ),
        // One image: threads split each gemm instead.
        (
            [1, 32, 24, 24],
            [24, 32, 3, 3],
            Conv2dParams::default().with_padding([1, 1]),
        ),
        (
            [2, 32, 12, 12],
            [24, 16, 3, 3],
            Conv2dParams::default().with_padding([1, 1]).with_groups(2),
        ),
        (
            [3, 48, 17, 19],
            [20, 48, 3, 2],
            Conv2dParams::new([2, 1], [1, 0], [1, 2], 1),
        ),
    ];
    for (xd, wd, p) in cases {
        let x = t(tg, &xd);
        let w = tg.randn(wd.to_vec(), DType::F32, 4).unwrap();
        let got = x.conv2d(&w, None, p).unwrap();
        let od: [usize; 4] = got.dims().try_into().unwrap();
        let want = conv_ref(&x.to_vec().unwrap(), xd, &w.to_vec().unwrap(), wd, p, od);
        for (g, w) in got.to_vec::<f32>().unwrap().iter().zip(&want) {
            assert!(
                (*g as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()),
                "{xd:?} * {wd:?}: {g} vs {w}"
            );
        }
    }
}

pub fn conv_transpose_is_the_adjoint_of_conv(tg: &Target) {
    // <conv(x), y> == <x, conv_transpose(y)> for the same weight: checks
    // the transposed convolution on sizes that take its tiled paths.
    // Many images in groups (one thread each, tiled col2im) and a single
    // image (threads inside each gemm).
    for (xd, wd, p) in [
        (
            [2, 64, 40, 41],
            [64, 64, 3, 3],
            Conv2dParams::new([2, 2], [1, 1], [1, 1], 1),
        ),
        (
            [3, 32, 21, 22],
            [16, 16, 3, 3],
            Conv2dParams::new([2, 2], [1, 1], [1, 1], 2),
        ),
        (
            [1, 48, 30, 30],
            [40, 48, 3, 3],
            Conv2dParams::new([2, 2], [1, 1], [2, 1], 1),
        ),
    ] {
        let x = t(tg, &xd);
        let w = tg.randn(wd.to_vec(), DType::F32, 5).unwrap();
        let y = x.conv2d(&w, None, p).unwrap();
        let r = tg.randn(y.dims().to_vec(), DType::F32, 6).unwrap();
        // output_padding recovers the input size where the stride dropped columns.
        let op = [0, 1].map(|i| {
            let full = (y.dims()[2 + i] - 1) * p.stride[i] + p.dilation[i] * (wd[2 + i] - 1) + 1 - 2 * p.padding[i];
            xd[2 + i] - full
        });
        let xt = r.conv_transpose2d(&w, None, p, op).unwrap();
        assert_eq!(xt.dims(), x.dims());
        let (l, rr) = (dot(&y, &r), dot(&x, &xt));
        assert!((l - rr).abs() <= 1e-4 * l.abs().max(1.0), "{xd:?}: {l} vs {rr}");
    }
}

fn dot(a: &Tensor, b: &Tensor) -> f64 {
    a.to_vec::<f32>()
        .unwrap()
        .iter()
        .zip(b.to_vec::<f32>().unwrap())
        .map(|(u, v)| *u as f64 * v as f64)
        .sum()
}

/// The checks of this group, in file order.
pub const CASES: &[Check] = &[
    ("conv_and_pool_match_torch", conv_and_pool_match_torch),
    ("strided_inputs_stay_strided", strided_inputs_stay_strided),
    ("bad_shapes_are_errors", bad_shapes_are_errors),
    ("large_convolutions_match_reference", large_convolutions_match_reference),
    (
        "conv_transpose_is_the_adjoint_of_conv",
        conv_transpose_is_the_adjoint_of_conv,
    ),
];
