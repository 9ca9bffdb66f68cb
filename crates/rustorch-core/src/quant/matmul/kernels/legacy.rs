//! 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, IQ4_NL)
//! against Q8_0 or Q8_1 activations.

use super::DotFn;
use crate::quant::blocks::{cast_blocks, f16_to_f32, BlockQ8_0};
use crate::quant::matmul::Isa;
use crate::quant::QType;

pub(super) fn kernel(qtype: QType, isa: Isa) -> Option<DotFn> {
    match (qtype, isa) {
        (QType::Q8_0, Isa::Scalar) => Some(dot_q8_0_q8_0_scalar),
        _ => None,
    }
}

/// sum over blocks of d_w * d_a * sum(q_w * q_a), as llama.cpp's generic
/// `ggml_vec_dot_q8_0_q8_0`.
unsafe fn dot_q8_0_q8_0_scalar(w: &[u8], a: &[u8]) -> f32 {
    let (Some(w), Some(a)) = (cast_blocks::<BlockQ8_0>(w), cast_blocks::<BlockQ8_0>(a)) else {
        return f32::NAN;
    };
    let mut sum = 0f32;
    for (wb, ab) in w.iter().zip(a) {
        let dot: i32 = wb.qs.iter().zip(&ab.qs).map(|(&x, &y)| x as i32 * y as i32).sum();
        sum += dot as f32 * (f16_to_f32(wb.d) * f16_to_f32(ab.d));
    }
    sum
}
