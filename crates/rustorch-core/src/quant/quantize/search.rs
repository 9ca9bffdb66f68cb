//! The scale searches of llama.cpp's reference quantizers (ggml-quants.c):
//! `nearest_int`, `make_qx_quants`, `make_q3_quants`, `make_qkx2_quants`
//! and `best_index_int8`.
//!
//! They are written with the same float operations in the same order as
//! the C code (which the reference build compiles without FMA), so the
//! chosen quants and scales are the same.

/// Groups whose largest magnitude is below this are all zero.
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// Round to nearest, ties to even, for |x| < 2^22: adding 1.5 * 2^23 puts
/// the integer in the low mantissa bits. Outside that range (and for NaN)
/// the result is meaningless but defined, as in C.
#[inline(always)]
pub(super) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Signed quants `l` in [-nmax, nmax) for `x`, with the scale that
/// minimizes the error weighted by x^2 (llama.cpp's `make_qx_quants` with
/// `rmse_type = 1` and no importance weights). Writes `l + nmax` to `out`
/// and returns the scale.
pub(super) fn make_qx_quants(nmax: i32, x: &[f32], out: &mut [u8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        out.fill(0);
        return 0.0;
    }
    let quant = |iscale: f32, xi: f32| nearest_int(iscale * xi).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &xi in x {
            let l = quant(iscale, xi) as f32;
            let w = xi * xi;
            sumlx += w * xi * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let mut iscale = -nmax as f32 / max;
    for (o, &xi) in out.iter_mut().zip(x) {
        *o = (quant(iscale, xi) + nmax) as u8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (o, &xi) in out.iter_mut().zip(x) {
                *o = (quant(iscale, xi) + nmax) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Signed quants in [-nmax, nmax) refined coordinate-wise to minimize the
/// x^2-weighted error (llama.cpp's `make_q3_quants` with `do_rmse`).
/// Writes `l + nmax` to `out` and returns the scale.
pub(super) fn make_q3_quants(nmax: i32, x: &[f32; 16], out: &mut [u8; 16]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        out.fill(0);
        return 0.0;
    }
    let iscale = -nmax as f32 / max;
    let mut l = [0i32; 16];
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (li, &xi) in l.iter_mut().zip(x) {
        *li = nearest_int(iscale * xi).clamp(-nmax, nmax - 1);
        let w = xi * xi;
        sumlx += w * xi * *li as f32;
        suml2 += w * *li as f32 * *li as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (li, &xi) in l.iter_mut().zip(x) {
            let w = xi * xi;
            let mut slx = sumlx - w * xi * *li as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * *li as f32 * *li as f32;
                let new_l = nearest_int(xi * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *li {
                    slx += w * xi * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *li = new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for (o, &li) in out.iter_mut().zip(l.iter()) {
        *o = (li + nmax) as u8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Unsigned quants in [0, nmax] with a scale and a min (`x ~ scale * l -
/// min`), searching `nstep + 1` candidate scales around the range and
/// keeping the weighted least-squares fit with the lowest error
/// (llama.cpp's `make_qkx2_quants`). Returns `(scale, min)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    out: &mut [u8],
    aux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        out.fill(0);
        return (0.0, -min);
    }
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        out[i] = l as u8;
        best_error += weights[i] * err(scale * l as f32 + min - x[i]);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            aux[i] = l as u8;
            let (w, l) = (weights[i], l as f32);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                cur_error += weights[i] * err(this_scale * aux[i] as f32 + this_min - x[i]);
            }
            if cur_error < best_error {
                out[..n].copy_from_slice(&aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The index of the level of `values` (sorted, length a power of two)
/// nearest to `x`; a tie goes to the upper level. Compares `2x` with the
/// exact sums of neighbouring levels, as current llama.cpp does.
#[inline]
pub(super) fn best_index_int8(values: &[i8; 16], x: f32) -> usize {
    let x2 = x + x;
    let mut idx = 0;
    let mut step = values.len() >> 1;
    while step > 0 {
        let j = idx + step;
        if x2 >= (values[j - 1] as i32 + values[j] as i32) as f32 {
            idx = j;
        }
        step >>= 1;
    }
    idx
}

/// The value of largest magnitude (the first one on ties) and its
/// magnitude.
#[inline]
pub(super) fn signed_max(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        let a = v.abs();
        if a > amax {
            amax = a;
            max = v;
        }
    }
    (max, amax)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        for (x, want) in [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (3.49, 3),
            (-7.6, -8),
        ] {
            assert_eq!(nearest_int(x), want, "{x}");
        }
    }

    #[test]
    fn best_index_picks_the_nearest_level() {
        let v = crate::quant::blocks::KVALUES_IQ4NL;
        for x in [
            -300.0, -127.0, -115.6, -115.4, -9.0, -4.5, 0.0, 1.0, 100.0, 101.0, 500.0f32,
        ] {
            let got = best_index_int8(&v, x);
            let best = (0..16)
                .min_by(|&a, &b| {
                    let (da, db) = ((v[a] as f32 - x).abs(), (v[b] as f32 - x).abs());
                    // Ties go up.
                    da.partial_cmp(&db).unwrap_or(std::cmp::Ordering::Equal).then(b.cmp(&a))
                })
                .unwrap_or(0);
            assert_eq!(got, best, "x = {x}");
        }
    }
}
