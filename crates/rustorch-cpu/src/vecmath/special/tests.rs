//! Accuracy of the f32 special functions against f64 references, in ulps.

use super::*;

/// Distance from `got` to the exact value `want`, in units of the f32
/// spacing at `want` (the smallest subnormal near zero).
fn ulps(got: f32, want: f64) -> f64 {
    if want.is_nan() {
        return if got.is_nan() { 0.0 } else { f64::INFINITY };
    }
    if want.is_infinite() || got.is_infinite() {
        return if got as f64 == want { 0.0 } else { f64::INFINITY };
    }
    let w = (want as f32).abs();
    let spacing = if w == 0.0 || w < f32::MIN_POSITIVE {
        f32::from_bits(1) as f64
    } else if w == f32::MAX {
        (w - f32::from_bits(w.to_bits() - 1)) as f64
    } else {
        (f32::from_bits(w.to_bits() + 1) - w) as f64
    };
    (got as f64 - want).abs() / spacing
}

/// `n` evenly spaced points on [lo, hi], as f32.
fn grid(lo: f64, hi: f64, n: usize) -> impl Iterator<Item = f32> {
    (0..=n).map(move |i| (lo + (hi - lo) * i as f64 / n as f64) as f32)
}

/// Worst error of `f` against `reference` over `xs`, with the argument.
fn worst(xs: impl Iterator<Item = f32>, f: impl Fn(f32) -> f32, reference: impl Fn(f64) -> f64) -> (f64, f32) {
    let mut w = (0.0, 0.0);
    for x in xs {
        let e = ulps(f(x), reference(x as f64));
        if e > w.0 {
            w = (e, x);
        }
    }
    w
}

fn check(name: &str, bound: f64, (err, at): (f64, f32)) {
    assert!(err <= bound, "{name}: {err:.2} ulp at x = {at:e} (bound {bound})");
}

#[test]
fn ln_accuracy() {
    check("ln near 1", 2.0, worst(grid(0.25, 4.0, 400_000), ln_f32, f64::ln));
    // Every binade, subnormals included.
    let wide = (0..200_000u32).map(|i| f32::from_bits(1 + i.wrapping_mul(2_654_435_761) % 0x7f7f_ffff));
    check("ln all binades", 2.0, worst(wide, ln_f32, f64::ln));
    assert!(ln_f32(-1.0).is_nan());
    assert!(ln_f32(f32::NAN).is_nan());
    assert_eq!(ln_f32(0.0), f32::NEG_INFINITY);
    assert_eq!(ln_f32(-0.0), f32::NEG_INFINITY);
    assert_eq!(ln_f32(f32::INFINITY), f32::INFINITY);
    assert_eq!(ln_f32(1.0), 0.0);
}

#[test]
fn tanh_sigmoid_silu_accuracy() {
    check("tanh", 3.0, worst(grid(-12.0, 12.0, 400_000), tanh_f32, f64::tanh));
    check("tanh small", 3.0, worst(grid(-1e-3, 1e-3, 10_000), tanh_f32, f64::tanh));
    check(
        "sigmoid",
        3.0,
        worst(grid(-80.0, 20.0, 400_000), sigmoid_f32, |x| 1.0 / (1.0 + (-x).exp())),
    );
    check(
        "silu",
        3.0,
        worst(grid(-80.0, 80.0, 400_000), silu_f32, |x| x / (1.0 + (-x).exp())),
    );
    assert_eq!(tanh_f32(f32::INFINITY), 1.0);
    assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
    assert!(tanh_f32(f32::NAN).is_nan());
    assert_eq!(sigmoid_f32(f32::NEG_INFINITY), 0.0);
    assert_eq!(sigmoid_f32(f32::INFINITY), 1.0);
    assert!(silu_f32(f32::NAN).is_nan());
}

#[test]
fn softplus_accuracy() {
    let reference = |x: f64| if x > 20.0 { x } else { x.exp().ln_1p() };
    check(
        "softplus",
        3.0,
        worst(grid(-80.0, 40.0, 400_000), softplus_f32, reference),
    );
    assert_eq!(softplus_f32(f32::NEG_INFINITY), 0.0);
    assert_eq!(softplus_f32(f32::INFINITY), f32::INFINITY);
    assert!(softplus_f32(f32::NAN).is_nan());
}

#[test]
fn erf_accuracy() {
    check("erf", 2.0, worst(grid(-7.0, 7.0, 400_000), erf_f32, libm::erf));
    check("erf tiny", 2.0, worst(grid(-1e-4, 1e-4, 10_000), erf_f32, libm::erf));
    // Down to where erfc leaves the normal range (~1e-38).
    check("erfc", 5.0, worst(grid(-6.0, 9.1, 400_000), erfc_f32, libm::erfc));
    assert_eq!(erf_f32(f32::INFINITY), 1.0);
    assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
    assert_eq!(erfc_f32(f32::INFINITY), 0.0);
    assert_eq!(erfc_f32(f32::NEG_INFINITY), 2.0);
    assert!(erf_f32(f32::NAN).is_nan() && erfc_f32(f32::NAN).is_nan());
}

#[test]
fn gelu_accuracy() {
    let exact = |x: f64| 0.5 * x * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2);
    check("gelu", 7.0, worst(grid(-9.0, 12.0, 400_000), gelu_f32, exact));
    assert_eq!(gelu_f32(-9.5), 0.0);
    const K: f64 = 1.595_769_121_605_730_7;
    // x/2 (1 + tanh(u)) = x sigmoid(2u), which f64 evaluates without the
    // cancellation of 1 + tanh for negative x.
    let tanh_form = |x: f64| x / (1.0 + (-K * (x + 0.044715 * x * x * x)).exp());
    check(
        "gelu_tanh",
        4.0,
        worst(grid(-9.7, 12.0, 400_000), gelu_tanh_f32, tanh_form),
    );
    assert!(gelu_tanh_f32(f32::NEG_INFINITY).is_nan());
    assert_eq!(gelu_tanh_f32(f32::INFINITY), f32::INFINITY);
    assert_eq!(gelu_tanh_f32(-20.0), 0.0);
    assert_eq!(gelu_f32(f32::INFINITY), f32::INFINITY);
    assert!(gelu_f32(f32::NEG_INFINITY).is_nan());
    assert!(gelu_f32(f32::NAN).is_nan());
    assert_eq!(gelu_f32(0.0), 0.0);
}

#[test]
fn trig_accuracy() {
    check("sin", 2.0, worst(grid(-100.0, 100.0, 400_000), sin_fast_f32, f64::sin));
    check("cos", 2.0, worst(grid(-100.0, 100.0, 400_000), cos_fast_f32, f64::cos));
    // Large arguments and floats right next to multiples of pi/2.
    let big = (0..200_000u32).map(|i| (i as f32 * 4.999_9).min(TRIG_FAST_MAX));
    check("sin large", 2.0, worst(big.clone(), sin_fast_f32, f64::sin));
    check("cos large", 2.0, worst(big, cos_fast_f32, f64::cos));
    let near = (1..20_000).flat_map(|k| {
        let c = (k as f64 * std::f64::consts::FRAC_PI_2) as f32;
        [f32::from_bits(c.to_bits() - 1), c, f32::from_bits(c.to_bits() + 1)]
    });
    check("sin near k pi/2", 2.0, worst(near.clone(), sin_fast_f32, f64::sin));
    check("cos near k pi/2", 2.0, worst(near, cos_fast_f32, f64::cos));
    let mut v = vec![1e7f32, -3e9, 1.0, f32::INFINITY, f32::NAN, 2e6];
    let want: Vec<f64> = v.iter().map(|&x| (x as f64).sin()).collect();
    sin_inplace(&mut v);
    for (g, w) in v.iter().zip(&want) {
        assert!(ulps(*g, *w) <= 2.0, "{g} vs {w}");
    }
}

#[test]
fn inplace_wrappers_match_scalar() {
    let xs: Vec<f32> = (0..1000).map(|i| i as f32 * 0.013 - 6.0).collect();
    type Pair = (fn(&mut [f32]), fn(f32) -> f32);
    let cases: [Pair; 6] = [
        (tanh_inplace, tanh_f32),
        (sigmoid_inplace, sigmoid_f32),
        (silu_inplace, silu_f32),
        (gelu_inplace, gelu_f32),
        (gelu_tanh_inplace, gelu_tanh_f32),
        (ln_inplace, ln_f32),
    ];
    for (inplace, scalar) in cases {
        let mut v = xs.clone();
        inplace(&mut v);
        for (g, &x) in v.iter().zip(&xs) {
            let w = scalar(x);
            assert!(*g == w || (g.is_nan() && w.is_nan()), "{x}: {g} vs {w}");
        }
    }
}
