//! Validation and output shape/dtype inference for every op.
//!
//! Runs once per op before any backend sees it, so bad shapes and dtypes
//! become errors that name the op, never panics inside a kernel.

use super::{AttnMask, Op, OpName, ReduceOp, TensorMeta, UnaryOp};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant::QType;
use crate::shape::Shape;

fn expect_inputs(op: &Op, inputs: &[TensorMeta], n: usize) -> Result<()> {
    if inputs.len() != n {
        return Err(Error::invalid(
            op.name(),
            format!("expected {n} inputs, got {}", inputs.len()),
        ));
    }
    Ok(())
}

fn same_dtype(op: &Op, inputs: &[TensorMeta]) -> Result<DType> {
    let d = inputs[0].dtype;
    if inputs.iter().any(|m| m.dtype != d) {
        return Err(Error::dtype(
            op.name(),
            "inputs must share one dtype",
            &inputs.iter().map(|m| m.dtype).collect::<Vec<_>>(),
        ));
    }
    Ok(d)
}

fn need_float(op: &Op, dtype: DType) -> Result<()> {
    if !dtype.is_float() {
        return Err(Error::dtype(op.name(), "needs a floating-point input", &[dtype]));
    }
    Ok(())
}

fn need_index(op: &Op, m: &TensorMeta) -> Result<()> {
    if !matches!(m.dtype, DType::I64 | DType::I32 | DType::U8) {
        return Err(Error::dtype(
            op.name(),
            "index must be an integer tensor (i64, i32 or u8)",
            &[m.dtype],
        ));
    }
    Ok(())
}

/// Columns of a GGML-typed weight passed as raw bytes [rows, row_bytes].
fn qweight_cols(op: &Op, w: &TensorMeta, qtype: crate::quant::QType) -> Result<usize> {
    if w.dtype != DType::U8 {
        return Err(Error::dtype(
            op.name(),
            "GGML-typed weights travel as raw u8 blocks",
            &[w.dtype],
        ));
    }
    need_rank(op, w, 2, "weight")?;
    let row_bytes = w.shape.dims()[1];
    if !row_bytes.is_multiple_of(qtype.type_size()) {
        return Err(Error::shape(
            op.name(),
            format!(
                "weight rows of {row_bytes} bytes are not whole {qtype} blocks of {} bytes",
                qtype.type_size()
            ),
            &[&w.shape],
        ));
    }
    Ok(row_bytes / qtype.type_size() * qtype.block_size())
}

fn need_rank(op: &Op, m: &TensorMeta, rank: usize, what: &str) -> Result<()> {
    if m.shape.rank() != rank {
        return Err(Error::shape(
            op.name(),
            format!("{what} must have rank {rank}"),
            &[&m.shape],
        ));
    }
    Ok(())
}

fn need_dim(op: &Op, m: &TensorMeta, dim: usize) -> Result<()> {
    if dim >= m.shape.rank() {
        return Err(Error::DimOutOfRange {
            op: op.name(),
            dim: dim as isize,
            rank: m.shape.rank(),
        });
    }
    Ok(())
}

fn one(shape: impl Into<Shape>, dtype: DType) -> Result<Vec<TensorMeta>> {
    Ok(vec![TensorMeta::new(shape, dtype)])
}

/// Output shapes and dtypes of `op` on inputs of these shapes and dtypes.
pub fn infer_outputs(op: &Op, inputs: &[TensorMeta]) -> Result<Vec<TensorMeta>> {
    let name = OpName(op);
    match op {
        Op::Copy => {
            expect_inputs(op, inputs, 1)?;
            one(&inputs[0].shape, inputs[0].dtype)
        }
        Op::Cast { to } => {
            expect_inputs(op, inputs, 1)?;
            one(&inputs[0].shape, *to)
        }
        Op::Unary(u) => {
            expect_inputs(op, inputs, 1)?;
            let d = inputs[0].dtype;
            let ok = match u {
                UnaryOp::Neg => d != DType::Bool,
                UnaryOp::Abs | UnaryOp::Relu => d != DType::Bool && d != DType::C64,
                UnaryOp::Exp => d.is_float() || d.is_complex(),
                _ => d.is_float(),
            };
            if !ok {
                return Err(Error::dtype(name, "unsupported input dtype", &[d]));
            }
            one(&inputs[0].shape, d)
        }
        Op::Clamp { .. } => {
            expect_inputs(op, inputs, 1)?;
            let d = inputs[0].dtype;
            if d == DType::Bool || d.is_complex() {
                return Err(Error::dtype(name, "clamp needs a real numeric input", &[d]));
            }
            one(&inputs[0].shape, d)
        }
        Op::Binary(b) => {
            expect_inputs(op, inputs, 2)?;
            let d = same_dtype(op, inputs)?;
            use super::BinaryOp::*;
            let ok = match b {
                Add | Sub | Mul | Div => d != DType::Bool,
                Pow => d.is_float() || d.is_int(),
                Maximum | Minimum => !d.is_complex(),
            };
            if !ok {
                return Err(Error::dtype(name, "unsupported input dtype", &[d]));
            }
            one(Shape::broadcast(name, &inputs[0].shape, &inputs[1].shape)?, d)
        }
        Op::Compare(c) => {
            expect_inputs(op, inputs, 2)?;
            let d = same_dtype(op, inputs)?;
            if d.is_complex() && !matches!(c, super::CmpOp::Eq | super::CmpOp::Ne) {
                return Err(Error::dtype(name, "complex numbers are not ordered", &[d]));
            }
            one(Shape::broadcast(name, &inputs[0].shape, &inputs[1].shape)?, DType::Bool)
        }
        Op::Where => {
            expect_inputs(op, inputs, 3)?;
            if inputs[0].dtype != DType::Bool {
                return Err(Error::dtype(name, "condition must be bool", &[inputs[0].dtype]));
            }
            let d = same_dtype(op, &inputs[1..])?;
            let s = Shape::broadcast_all(name, &[&inputs[0].shape, &inputs[1].shape, &inputs[2].shape])?;
            one(s, d)
        }
        Op::Reduce { op: r, dims, keepdim } => {
            expect_inputs(op, inputs, 1)?;
            let m = &inputs[0];
            for &d in dims {
                need_dim(op, m, d)?;
            }
            let mut sorted = dims.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if sorted.len() != dims.len() {
                return Err(Error::invalid(name, format!("dims {dims:?} repeat a dimension")));
            }
            let dtype = match r {
                ReduceOp::ArgMax | ReduceOp::ArgMin => {
                    if dims.len() != 1 {
                        return Err(Error::invalid(name, "reduces exactly one dimension"));
                    }
                    if m.dtype.is_complex() {
                        return Err(Error::dtype(name, "complex numbers are not ordered", &[m.dtype]));
                    }
                    DType::I64
                }
                ReduceOp::Max | ReduceOp::Min => {
                    if m.dtype.is_complex() {
                        return Err(Error::dtype(name, "complex numbers are not ordered", &[m.dtype]));
                    }
                    m.dtype
                }
                ReduceOp::Mean | ReduceOp::Var { .. } | ReduceOp::Std { .. } => {
                    if !m.dtype.is_float() {
                        return Err(Error::dtype(name, "needs a floating-point input", &[m.dtype]));
                    }
                    m.dtype
                }
                // PyTorch sums and multiplies bools and small ints into i64.
                ReduceOp::Sum | ReduceOp::Prod => match m.dtype {
                    DType::Bool | DType::U8 | DType::I32 => DType::I64,
                    d => d,
                },
            };
            let mut shape = Vec::new();
            for (i, &s) in m.shape.dims().iter().enumerate() {
                if dims.contains(&i) {
                    if *keepdim {
                        shape.push(1);
                    }
                } else {
                    shape.push(s);
                }
            }
            let reduces_empty = dims.iter().any(|&d| m.shape.dims()[d] == 0);
            if reduces_empty && matches!(r, ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin) {
                return Err(Error::shape(name, "cannot reduce an empty dimension", &[&m.shape]));
            }
            one(shape, dtype)
        }
        Op::Softmax { dim } | Op::LogSoftmax { dim } => {
            expect_inputs(op, inputs, 1)?;
            need_dim(op, &inputs[0], *dim)?;
            need_float(op, inputs[0].dtype)?;
            one(&inputs[0].shape, inputs[0].dtype)
        }
        Op::Cumsum { dim } => {
            expect_inputs(op, inputs, 1)?;
            need_dim(op, &inputs[0], *dim)?;
            let d = match inputs[0].dtype {
                DType::Bool | DType::U8 | DType::I32 => DType::I64,
                d => d,
            };
            one(&inputs[0].shape, d)
        }
        Op::TopK { k, dim, .. } => {
            expect_inputs(op, inputs, 1)?;
            let m = &inputs[0];
            need_dim(op, m, *dim)?;
            if m.dtype.is_complex() {
                return Err(Error::dtype(name, "complex numbers are not ordered", &[m.dtype]));
            }
            if *k > m.shape.dims()[*dim] {
                return Err(Error::shape(
                    name,
                    format!("k = {k} is larger than dimension {dim}"),
                    &[&m.shape],
                ));
            }
            let mut s = m.shape.dims().to_vec();
            s[*dim] = *k;
            Ok(vec![
                TensorMeta::new(s.clone(), m.dtype),
                TensorMeta::new(s, DType::I64),
            ])
        }
        Op::Sort { dim, .. } => {
            expect_inputs(op, inputs, 1)?;
            let m = &inputs[0];
            need_dim(op, m, *dim)?;
            if m.dtype.is_complex() {
                return Err(Error::dtype(name, "complex numbers are not ordered", &[m.dtype]));
            }
            Ok(vec![m.clone(), TensorMeta::new(m.shape.clone(), DType::I64)])
        }
        Op::MatMul => {
            expect_inputs(op, inputs, 2)?;
            let d = same_dtype(op, inputs)?;
            if !(d.is_float() || d.is_complex()) {
                return Err(Error::dtype(name, "matmul needs f16, bf16, f32, f64 or c64", &[d]));
            }
            let (a, b) = (&inputs[0].shape, &inputs[1].shape);
            if a.rank() < 2 || b.rank() < 2 {
                return Err(Error::shape(name, "both operands need rank >= 2", &[a, b]));
            }
            let (m, k) = (a.dims()[a.rank() - 2], a.dims()[a.rank() - 1]);
            let (k2, n) = (b.dims()[b.rank() - 2], b.dims()[b.rank() - 1]);
            if k != k2 {
                return Err(Error::shape(
                    name,
                    format!("inner dimensions differ ({k} vs {k2})"),
                    &[a, b],
                ));
            }
            let batch = Shape::broadcast(
                name,
                &Shape::from(&a.dims()[..a.rank() - 2]),
                &Shape::from(&b.dims()[..b.rank() - 2]),
            )?;
            let mut s = batch.dims().to_vec();
            s.extend([m, n]);
            one(s, d)
        }
        Op::QMatMul { qtype, .. } => {
            expect_inputs(op, inputs, 2)?;
            Ok(vec![qmatmul_output(op, &inputs[0], &inputs[1], *qtype)?])
        }
        Op::QMatMuls { qtypes } => {
            if qtypes.is_empty() {
                return Err(Error::invalid(name, "needs at least one weight"));
            }
            expect_inputs(op, inputs, 1 + qtypes.len())?;
            qtypes
                .iter()
                .zip(&inputs[1..])
                .map(|(&qtype, w)| qmatmul_output(op, &inputs[0], w, qtype))
                .collect()
        }
        Op::QMatMulGated { qtypes, .. } => {
            expect_inputs(op, inputs, 3)?;
            let gate = qmatmul_output(op, &inputs[0], &inputs[1], qtypes[0])?;
            let up = qmatmul_output(op, &inputs[0], &inputs[2], qtypes[1])?;
            if gate.shape != up.shape {
                return Err(Error::shape(
                    name,
                    "the gate and up weights must have one row count",
                    &[&gate.shape, &up.shape],
                ));
            }
            Ok(vec![gate])
        }
        Op::QEmbedding { qtype } => {
            expect_inputs(op, inputs, 2)?;
            if !crate::quant::can_dequantize(*qtype) {
                return Err(Error::invalid(name, format!("{qtype} rows cannot be dequantized")));
            }
            let cols = qweight_cols(op, &inputs[0], *qtype)?;
            need_index(op, &inputs[1])?;
            let mut s = inputs[1].shape.dims().to_vec();
            s.push(cols);
            one(s, DType::F32)
        }
        Op::IndexSelect { dim } => {
            expect_inputs(op, inputs, 2)?;
            need_dim(op, &inputs[0], *dim)?;
            need_index(op, &inputs[1])?;
            need_rank(op, &inputs[1], 1, "index")?;
            let mut s = inputs[0].shape.dims().to_vec();
            s[*dim] = inputs[1].shape.numel();
            one(s, inputs[0].dtype)
        }
        Op::Gather { dim } => {
            expect_inputs(op, inputs, 2)?;
            let (src, idx) = (&inputs[0], &inputs[1]);
            need_dim(op, src, *dim)?;
            need_index(op, idx)?;
            check_index_shape(op, src, idx, *dim)?;
            one(&idx.shape, src.dtype)
        }
        Op::ScatterAdd { dim } => {
            expect_inputs(op, inputs, 3)?;
            let (dst, idx, src) = (&inputs[0], &inputs[1], &inputs[2]);
            need_dim(op, dst, *dim)?;
            need_index(op, idx)?;
            if dst.dtype != src.dtype {
                return Err(Error::dtype(
                    name,
                    "destination and source dtypes differ",
                    &[dst.dtype, src.dtype],
                ));
            }
            check_index_shape(op, dst, idx, *dim)?;
            if idx.shape.rank() != src.shape.rank() || idx.shape.dims().iter().zip(src.shape.dims()).any(|(i, s)| i > s)
            {
                return Err(Error::shape(
                    name,
                    "index must not be larger than source",
                    &[&idx.shape, &src.shape],
                ));
            }
            one(&dst.shape, dst.dtype)
        }
        Op::Embedding => {
            expect_inputs(op, inputs, 2)?;
            need_rank(op, &inputs[0], 2, "weight")?;
            need_index(op, &inputs[1])?;
            let mut s = inputs[1].shape.dims().to_vec();
            s.push(inputs[0].shape.dims()[1]);
            one(s, inputs[0].dtype)
        }
        Op::Cat { dim } => {
            if inputs.is_empty() {
                return Err(Error::invalid(name, "needs at least one input"));
            }
            let d = same_dtype(op, inputs)?;
            let first = &inputs[0].shape;
            need_dim(op, &inputs[0], *dim)?;
            let mut total = 0;
            for m in inputs {
                let ok = m.shape.rank() == first.rank()
                    && m.shape
                        .dims()
                        .iter()
                        .zip(first.dims())
                        .enumerate()
                        .all(|(i, (a, b))| i == *dim || a == b);
                if !ok {
                    return Err(Error::shape(
                        name,
                        format!("inputs must match in every dimension but {dim}"),
                        &inputs.iter().map(|m| &m.shape).collect::<Vec<_>>(),
                    ));
                }
                total += m.shape.dims()[*dim];
            }
            let mut s = first.dims().to_vec();
            s[*dim] = total;
            one(s, d)
        }
        Op::LayerNorm {
            normalized_dims,
            has_weight,
            has_bias,
            ..
        } => {
            let n = 1 + *has_weight as usize + *has_bias as usize;
            expect_inputs(op, inputs, n)?;
            let x = &inputs[0];
            need_float(op, x.dtype)?;
            if *normalized_dims == 0 || *normalized_dims > x.shape.rank() {
                return Err(Error::shape(
                    name,
                    format!("cannot normalize the last {normalized_dims} dims"),
                    &[&x.shape],
                ));
            }
            let norm_shape = Shape::from(&x.shape.dims()[x.shape.rank() - normalized_dims..]);
            for p in &inputs[1..] {
                if p.shape != norm_shape {
                    return Err(Error::shape(
                        name,
                        "weight and bias must have the normalized shape",
                        &[&x.shape, &p.shape],
                    ));
                }
            }
            same_dtype(op, inputs)?;
            one(&x.shape, x.dtype)
        }
        Op::RmsNorm { has_weight, .. } => {
            expect_inputs(op, inputs, 1 + *has_weight as usize)?;
            let x = &inputs[0];
            need_float(op, x.dtype)?;
            if x.shape.rank() == 0 {
                return Err(Error::shape(name, "needs rank >= 1", &[&x.shape]));
            }
            if *has_weight {
                let last = *x.shape.dims().last().unwrap_or(&0);
                if inputs[1].shape.dims() != [last] {
                    return Err(Error::shape(
                        name,
                        "weight must be 1-D with the last dim's size",
                        &[&x.shape, &inputs[1].shape],
                    ));
                }
            }
            same_dtype(op, inputs)?;
            one(&x.shape, x.dtype)
        }
        Op::AddRmsNormThen { eps, then } => {
            if !matches!(**then, Op::QMatMuls { .. } | Op::QMatMulGated { .. }) {
                return Err(Error::invalid(
                    name,
                    "the op after the norm must be qmatmul_many or qmatmul_gated",
                ));
            }
            if inputs.len() < 3 {
                return Err(Error::invalid(
                    name,
                    format!("takes at least 3 inputs, got {}", inputs.len()),
                ));
            }
            let mut outs = infer_outputs(&Op::AddRmsNorm { eps: *eps }, &inputs[..3])?;
            let mut then_inputs = vec![outs[1].clone()];
            then_inputs.extend_from_slice(&inputs[3..]);
            let products = infer_outputs(then, &then_inputs)?;
            outs.truncate(1);
            outs.extend(products);
            Ok(outs)
        }
        Op::AddRmsNorm { .. } => {
            expect_inputs(op, inputs, 3)?;
            let (x, a, w) = (&inputs[0], &inputs[1], &inputs[2]);
            if x.dtype != DType::F32 {
                return Err(Error::dtype(name, "takes f32", &[x.dtype]));
            }
            same_dtype(op, inputs)?;
            if x.shape.rank() == 0 || a.shape != x.shape {
                return Err(Error::shape(
                    name,
                    "x and a need one shape of rank >= 1",
                    &[&x.shape, &a.shape],
                ));
            }
            let last = *x.shape.dims().last().unwrap_or(&0);
            if w.shape.dims() != [last] {
                return Err(Error::shape(
                    name,
                    "weight must be 1-D with the last dim's size",
                    &[&x.shape, &w.shape],
                ));
            }
            Ok(vec![
                TensorMeta::new(x.shape.clone(), x.dtype),
                TensorMeta::new(x.shape.clone(), x.dtype),
            ])
        }
        Op::BatchNorm {
            has_weight, has_bias, ..
        } => {
            expect_inputs(op, inputs, 3 + *has_weight as usize + *has_bias as usize)?;
            let x = &inputs[0];
            need_float(op, x.dtype)?;
            if x.shape.rank() < 2 {
                return Err(Error::shape(name, "needs rank >= 2 ([N, C, ...])", &[&x.shape]));
            }
            let c = x.shape.dims()[1];
            for p in &inputs[1..] {
                if p.shape.dims() != [c] {
                    return Err(Error::shape(
                        name,
                        "statistics and affine parameters must be [C]",
                        &[&x.shape, &p.shape],
                    ));
                }
            }
            same_dtype(op, inputs)?;
            one(&x.shape, x.dtype)
        }
        Op::Rope { .. } => {
            expect_inputs(op, inputs, 3)?;
            let (x, cos, sin) = (&inputs[0], &inputs[1], &inputs[2]);
            need_float(op, x.dtype)?;
            same_dtype(op, inputs)?;
            if x.shape.rank() < 2 || cos.shape.rank() != 2 || cos.shape != sin.shape {
                return Err(Error::shape(
                    name,
                    "expects x [.., T, D], cos and sin [T, R/2]",
                    &[&x.shape, &cos.shape, &sin.shape],
                ));
            }
            let r = x.shape.rank();
            let (t, d) = (x.shape.dims()[r - 2], x.shape.dims()[r - 1]);
            let (ct, half) = (cos.shape.dims()[0], cos.shape.dims()[1]);
            if ct != t || 2 * half > d || half == 0 {
                return Err(Error::shape(
                    name,
                    "cos/sin must be [T, R/2] with R <= D",
                    &[&x.shape, &cos.shape],
                ));
            }
            one(&x.shape, x.dtype)
        }
        Op::Sdpa { mask, .. } => {
            let n = 3 + (*mask == AttnMask::Explicit) as usize;
            expect_inputs(op, inputs, n)?;
            let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
            need_float(op, q.dtype)?;
            same_dtype(op, &inputs[..3])?;
            for m in [q, k, v] {
                need_rank(op, m, 4, "q, k and v")?;
            }
            let (qd, kd, vd) = (q.shape.dims(), k.shape.dims(), v.shape.dims());
            let bad = qd[0] != kd[0]
                || kd[0] != vd[0]
                || kd[1] != vd[1]
                || kd[1] == 0
                || !qd[1].is_multiple_of(kd[1])
                || qd[3] != kd[3]
                || kd[2] != vd[2];
            if bad {
                return Err(Error::shape(
                    name,
                    "expects q [B, Hq, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv] with Hq a multiple of Hkv",
                    &[&q.shape, &k.shape, &v.shape],
                ));
            }
            if n == 4 {
                let m = &inputs[3];
                if m.dtype != DType::Bool && m.dtype != q.dtype {
                    return Err(Error::dtype(
                        name,
                        "mask must be bool or the query's dtype",
                        &[m.dtype, q.dtype],
                    ));
                }
                let target = Shape::from([qd[0], qd[1], qd[2], kd[2]]);
                let b = Shape::broadcast(name, &m.shape, &target)?;
                if b != target {
                    return Err(Error::shape(
                        name,
                        "mask must broadcast to [B, Hq, Tq, Tk]",
                        &[&m.shape, &target],
                    ));
                }
            }
            one([qd[0], qd[1], qd[2], vd[3]], q.dtype)
        }
        Op::CachedAttention { .. } => {
            expect_inputs(op, inputs, 4)?;
            let (q, k, vt, m) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3]);
            if q.dtype != DType::F32 || k.dtype != DType::F16 || vt.dtype != DType::F16 || m.dtype != DType::F32 {
                return Err(Error::dtype(
                    name,
                    "expects q f32, k f16, vt f16, mask f32",
                    &[q.dtype, k.dtype, vt.dtype, m.dtype],
                ));
            }
            for t in [q, k, vt] {
                need_rank(op, t, 3, "q, k and vt")?;
            }
            need_rank(op, m, 2, "the mask")?;
            let (qd, kd, vd, md) = (q.shape.dims(), k.shape.dims(), vt.shape.dims(), m.shape.dims());
            let bad = kd[0] == 0
                || !qd[0].is_multiple_of(kd[0])
                || vd[0] != kd[0]
                || qd[2] != kd[2]
                || vd[2] != kd[1]
                || md != [qd[1], kd[1]];
            if bad {
                return Err(Error::shape(
                    name,
                    "expects q [Hq, T, D], k [Hkv, L, D], vt [Hkv, Dv, L], mask [T, L] with Hq a multiple of Hkv",
                    &[&q.shape, &k.shape, &vt.shape, &m.shape],
                ));
            }
            one([qd[0], qd[1], vd[1]], DType::F32)
        }
        Op::FlashAttention { .. } => {
            expect_inputs(op, inputs, 4)?;
            let (q, k, v, m) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3]);
            if q.dtype != DType::F32 || k.dtype != DType::F16 || v.dtype != DType::F16 || m.dtype != DType::F32 {
                return Err(Error::dtype(
                    name,
                    "expects q f32, k f16, v f16, mask f32",
                    &[q.dtype, k.dtype, v.dtype, m.dtype],
                ));
            }
            for t in [q, k, v] {
                need_rank(op, t, 3, "q, k and v")?;
            }
            need_rank(op, m, 2, "the mask")?;
            let (qd, kd, vd, md) = (q.shape.dims(), k.shape.dims(), v.shape.dims(), m.shape.dims());
            let bad = kd[0] == 0
                || !qd[0].is_multiple_of(kd[0])
                || vd[0] != kd[0]
                || qd[2] != kd[2]
                || vd[1] != kd[1]
                || md != [qd[1], kd[1]];
            if bad {
                return Err(Error::shape(
                    name,
                    "expects q [Hq, T, D], k [Hkv, L, D], v [Hkv, L, Dv], mask [T, L] with Hq a multiple of Hkv",
                    &[&q.shape, &k.shape, &v.shape, &m.shape],
                ));
            }
            one([qd[0], qd[1], vd[2]], DType::F32)
        }
        Op::AttentionAt { window, .. } => {
            expect_inputs(op, inputs, 4)?;
            let (q, k, v, pos) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3]);
            let half_or_f32 = |d: DType| matches!(d, DType::F32 | DType::F16 | DType::BF16);
            if !half_or_f32(q.dtype)
                || !half_or_f32(k.dtype)
                || v.dtype != k.dtype
                || !matches!(pos.dtype, DType::I32 | DType::I64)
            {
                return Err(Error::dtype(
                    name,
                    "expects q f32, f16 or bf16, k and v of one of those (the same), pos i32 or i64",
                    &[q.dtype, k.dtype, v.dtype, pos.dtype],
                ));
            }
            for t in [q, k, v] {
                need_rank(op, t, 3, "q, k and v")?;
            }
            if pos.shape.rank() > 1 || pos.shape.numel() != 1 {
                return Err(Error::shape(
                    name,
                    "pos must hold one element (shape [1] or [])",
                    &[&pos.shape],
                ));
            }
            let (qd, kd, vd) = (q.shape.dims(), k.shape.dims(), v.shape.dims());
            let bad = kd[0] == 0 || !qd[0].is_multiple_of(kd[0]) || vd[0] != kd[0] || vd[1] != kd[1] || qd[2] != kd[2];
            if bad {
                return Err(Error::shape(
                    name,
                    "expects q [H, T, D], k [Hkv, N, D], v [Hkv, N, Dv] with H a multiple of Hkv",
                    &[&q.shape, &k.shape, &v.shape],
                ));
            }
            if *window == Some(0) {
                // No key would be visible to any query.
                return Err(Error::invalid(name, "a window must hold at least one position"));
            }
            one([qd[0], qd[1], vd[2]], DType::F32)
        }
        Op::SwiGlu | Op::GeGlu => {
            expect_inputs(op, inputs, 2)?;
            let (x, g) = (&inputs[0], &inputs[1]);
            if x.dtype != DType::F32 || g.dtype != DType::F32 {
                return Err(Error::dtype(name, "expects f32 inputs", &[x.dtype, g.dtype]));
            }
            if x.shape != g.shape {
                return Err(Error::shape(name, "x and g must have one shape", &[&x.shape, &g.shape]));
            }
            one(&x.shape, DType::F32)
        }
        Op::Conv1d {
            stride,
            padding,
            dilation,
            groups,
            has_bias,
        } => {
            expect_inputs(op, inputs, 2 + *has_bias as usize)?;
            let (x, w) = (&inputs[0], &inputs[1]);
            need_float(op, x.dtype)?;
            same_dtype(op, inputs)?;
            need_rank(op, x, 3, "input")?;
            need_rank(op, w, 3, "weight")?;
            let (n, c, l) = (x.shape.dims()[0], x.shape.dims()[1], x.shape.dims()[2]);
            let (o, cg, k) = (w.shape.dims()[0], w.shape.dims()[1], w.shape.dims()[2]);
            check_groups(op, c, o, cg, *groups, &[&x.shape, &w.shape])?;
            check_bias(op, inputs, *has_bias, o)?;
            let ol = conv_out(op, l, k, *stride, *padding, *dilation, &[&x.shape, &w.shape])?;
            one([n, o, ol], x.dtype)
        }
        Op::Conv2d { params: p, has_bias } => {
            expect_inputs(op, inputs, 2 + *has_bias as usize)?;
            let (x, w) = (&inputs[0], &inputs[1]);
            need_float(op, x.dtype)?;
            same_dtype(op, inputs)?;
            need_rank(op, x, 4, "input")?;
            need_rank(op, w, 4, "weight")?;
            let xd = x.shape.dims();
            let wd = w.shape.dims();
            check_groups(op, xd[1], wd[0], wd[1], p.groups, &[&x.shape, &w.shape])?;
            check_bias(op, inputs, *has_bias, wd[0])?;
            let shapes = [&x.shape, &w.shape];
            let oh = conv_out(op, xd[2], wd[2], p.stride[0], p.padding[0], p.dilation[0], &shapes)?;
            let ow = conv_out(op, xd[3], wd[3], p.stride[1], p.padding[1], p.dilation[1], &shapes)?;
            one([xd[0], wd[0], oh, ow], x.dtype)
        }
        Op::ConvTranspose2d {
            params: p,
            output_padding,
            has_bias,
        } => {
            expect_inputs(op, inputs, 2 + *has_bias as usize)?;
            let (x, w) = (&inputs[0], &inputs[1]);
            need_float(op, x.dtype)?;
            same_dtype(op, inputs)?;
            need_rank(op, x, 4, "input")?;
            need_rank(op, w, 4, "weight")?;
            let (xd, wd) = (x.shape.dims(), w.shape.dims());
            let g = p.groups;
            if g == 0 || xd[1] != wd[0] || !wd[0].is_multiple_of(g) {
                return Err(Error::shape(
                    name,
                    format!("weight must be [C_in, C_out/groups, KH, KW] with C_in divisible by groups = {g}"),
                    &[&x.shape, &w.shape],
                ));
            }
            let o = wd[1] * g;
            check_bias(op, inputs, *has_bias, o)?;
            let mut out = [0usize; 2];
            for i in 0..2 {
                if p.stride[i] == 0 || p.dilation[i] == 0 {
                    return Err(Error::invalid(name, "stride and dilation must be positive"));
                }
                if output_padding[i] >= p.stride[i].max(p.dilation[i]) {
                    return Err(Error::invalid(
                        name,
                        "output_padding must be smaller than stride or dilation",
                    ));
                }
                let full = (xd[2 + i].max(1) - 1) * p.stride[i]
                    + p.dilation[i] * (wd[2 + i].max(1) - 1)
                    + 1
                    + output_padding[i];
                if xd[2 + i] == 0 || wd[2 + i] == 0 || full <= 2 * p.padding[i] {
                    return Err(Error::shape(name, "output would be empty", &[&x.shape, &w.shape]));
                }
                out[i] = full - 2 * p.padding[i];
            }
            one([xd[0], o, out[0], out[1]], x.dtype)
        }
        Op::MaxPool2d { params: p } | Op::AvgPool2d { params: p, .. } => {
            expect_inputs(op, inputs, 1)?;
            let x = &inputs[0];
            if !x.dtype.is_float() {
                return Err(Error::dtype(name, "needs a floating-point input", &[x.dtype]));
            }
            need_rank(op, x, 4, "input")?;
            let xd = x.shape.dims();
            let mut out = [0usize; 2];
            for i in 0..2 {
                if p.padding[i] * 2 > p.kernel[i] {
                    return Err(Error::invalid(name, "padding must be at most half the kernel size"));
                }
                out[i] = conv_out(op, xd[2 + i], p.kernel[i], p.stride[i], p.padding[i], 1, &[&x.shape])?;
            }
            one([xd[0], xd[1], out[0], out[1]], x.dtype)
        }
    }
}

fn check_index_shape(op: &Op, src: &TensorMeta, idx: &TensorMeta, dim: usize) -> Result<()> {
    let ok = idx.shape.rank() == src.shape.rank()
        && idx
            .shape
            .dims()
            .iter()
            .zip(src.shape.dims())
            .enumerate()
            .all(|(i, (a, b))| i == dim || a <= b);
    if !ok {
        return Err(Error::shape(
            op.name(),
            format!("index must have the input's rank and be no larger outside dim {dim}"),
            &[&src.shape, &idx.shape],
        ));
    }
    Ok(())
}

fn check_groups(op: &Op, c: usize, o: usize, cg: usize, groups: usize, shapes: &[&Shape]) -> Result<()> {
    if groups == 0 || !c.is_multiple_of(groups) || !o.is_multiple_of(groups) || cg * groups != c {
        return Err(Error::shape(
            op.name(),
            format!(
                "channels ({c} in, {o} out) must divide into groups = {groups}, weight must have C_in/groups channels"
            ),
            shapes,
        ));
    }
    Ok(())
}

fn check_bias(op: &Op, inputs: &[TensorMeta], has_bias: bool, o: usize) -> Result<()> {
    if has_bias && inputs[2].shape.dims() != [o] {
        return Err(Error::shape(
            op.name(),
            format!("bias must be [{o}]"),
            &[&inputs[2].shape],
        ));
    }
    Ok(())
}

fn conv_out(op: &Op, len: usize, k: usize, stride: usize, pad: usize, dil: usize, shapes: &[&Shape]) -> Result<usize> {
    if stride == 0 || dil == 0 || k == 0 {
        return Err(Error::invalid(
            op.name(),
            "kernel size, stride and dilation must be positive",
        ));
    }
    let span = dil * (k - 1) + 1;
    let padded = len + 2 * pad;
    if padded < span {
        return Err(Error::shape(
            op.name(),
            format!("kernel span {span} is larger than the padded input {padded}"),
            shapes,
        ));
    }
    Ok((padded - span) / stride + 1)
}

/// The output of `x @ w^T` for a `qtype` weight `w` (u8 blocks `[n, row_bytes]`).
fn qmatmul_output(op: &Op, x: &TensorMeta, w: &TensorMeta, qtype: QType) -> Result<TensorMeta> {
    let name = OpName(op);
    if x.dtype != DType::F32 {
        return Err(Error::dtype(name, "activations must be f32", &[x.dtype]));
    }
    let cols = qweight_cols(op, w, qtype)?;
    let rows = w.shape.dims()[0];
    if x.shape.rank() == 0 || x.shape.dims()[x.shape.rank() - 1] != cols {
        return Err(Error::shape(
            name,
            format!("activations need a last dim of {cols} (the weight's columns)"),
            &[&x.shape, &w.shape],
        ));
    }
    let mut s = x.shape.dims().to_vec();
    *s.last_mut().expect("rank checked above") = rows;
    Ok(TensorMeta {
        shape: Shape::from(s),
        dtype: DType::F32,
    })
}
