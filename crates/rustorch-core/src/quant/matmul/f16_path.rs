//! F16 weights, as llama.cpp multiplies them: the activations converted to
//! f16 (`QuantizedRows`), then tinyBLAS's order from two activation rows on
//! (when the weight rows are a multiple of 4 and the row length of 16) or
//! `ggml_vec_dot_f16`'s otherwise: `crate::cpu::ggml::f16dot` has both
//! (shared with the attention products, which take the same paths).

use super::{OutPtr, QMatRef, QuantizedRows};
use crate::cpu::ggml::f16dot::{self, F16Path};
use half::f16;
use rayon::prelude::*;

/// `bytes` as f16 values: borrowed when aligned (GGUF tensors and `Vec`
/// buffers are), else copied.
fn halves(bytes: &[u8]) -> std::borrow::Cow<'_, [f16]> {
    // SAFETY: every bit pattern is a valid f16; `align_to` only yields
    // the aligned middle part.
    let (pre, mid, post) = unsafe { bytes.align_to::<f16>() };
    if pre.is_empty() && post.is_empty() {
        std::borrow::Cow::Borrowed(mid)
    } else {
        std::borrow::Cow::Owned(
            bytes
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]))
                .collect(),
        )
    }
}

/// `out = act @ w^T` for F16 weights and F16 activations (shapes checked
/// by the caller).
pub(super) fn product(w: &QMatRef<'_>, act: &QuantizedRows, out: &mut [f32]) {
    let (m, n, k) = (act.rows(), w.rows(), w.cols());
    let path = F16Path::choose(n, k, m);
    let wv = halves(w.bytes());
    let av = halves(act.bytes());
    let out_ptr = OutPtr(out.as_mut_ptr());
    const JB: usize = 16;
    (0..n.div_ceil(JB)).into_par_iter().for_each(|jb| {
        for j in jb * JB..((jb + 1) * JB).min(n) {
            let wr = &wv[j * k..(j + 1) * k];
            for i in 0..m {
                let v = f16dot::dot(path, wr, &av[i * k..(i + 1) * k]);
                // SAFETY: each task writes the outputs of its own weight
                // rows j (column j of every output row); see `OutPtr`.
                unsafe { out_ptr.write(i * n + j, v) };
            }
        }
    });
}
