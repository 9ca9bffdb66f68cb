//! Comparisons (bool output) and `where`, with broadcasting.

use super::kernel::{map2, Map2, Plain, Src, ViaF32};
use super::par::fill_chunks;
use super::plan::Plan;
use crate::vecmath::{simd_run, SimdTask};
use crate::{unsupported_dtype, CpuInput, CpuResult, CpuStorage, StorageElement};
use half::{bf16, f16};
use rustorch_core::dtype::{DType, C64};
use rustorch_core::op::{CmpOp, Op, TensorMeta};
use std::mem::MaybeUninit;

macro_rules! cmp_ops {
    ($($name:ident: $bound:ident => $op:tt),*) => {$(
        #[derive(Clone, Copy)]
        pub(super) struct $name;
        impl<T: $bound + Copy + Send + Sync> Map2<T, bool> for $name {
            #[inline(always)]
            fn f(self, a: T, b: T) -> bool { a $op b }
        }
    )*};
}
// IEEE semantics: every comparison with NaN is false except `!=`.
cmp_ops!(Eq: PartialEq => ==, Ne: PartialEq => !=, Lt: PartialOrd => <, Le: PartialOrd => <=,
    Gt: PartialOrd => >, Ge: PartialOrd => >=);

fn run_cmp<T, R>(op: &Op, plan: &Plan<2>, a: CpuInput<'_>, b: CpuInput<'_>, row: R) -> CpuResult
where
    T: StorageElement,
    R: super::kernel::Row2<T, bool>,
{
    let x = a
        .storage
        .as_slice::<T>()
        .ok_or_else(|| unsupported_dtype(op, a.dtype()))?;
    let y = b
        .storage
        .as_slice::<T>()
        .ok_or_else(|| unsupported_dtype(op, b.dtype()))?;
    Ok(vec![CpuStorage::Bool(map2(plan, x, y, row))])
}

macro_rules! with_cmp {
    ($c:expr, $k:ident => $body:expr) => {
        match $c {
            CmpOp::Eq => {
                let $k = Eq;
                $body
            }
            CmpOp::Ne => {
                let $k = Ne;
                $body
            }
            CmpOp::Lt => {
                let $k = Lt;
                $body
            }
            CmpOp::Le => {
                let $k = Le;
                $body
            }
            CmpOp::Gt => {
                let $k = Gt;
                $body
            }
            CmpOp::Ge => {
                let $k = Ge;
                $body
            }
        }
    };
}

pub(super) fn compare(op: &Op, c: CmpOp, a: CpuInput<'_>, b: CpuInput<'_>, out: &TensorMeta) -> CpuResult {
    let plan = Plan::new(op, &out.shape, [a.layout, b.layout])?;
    let p = &plan;
    match a.dtype() {
        DType::F32 => with_cmp!(c, k => run_cmp::<f32, _>(op, p, a, b, Plain(k))),
        DType::F64 => with_cmp!(c, k => run_cmp::<f64, _>(op, p, a, b, Plain(k))),
        DType::F16 => with_cmp!(c, k => run_cmp::<f16, _>(op, p, a, b, ViaF32(k))),
        DType::BF16 => with_cmp!(c, k => run_cmp::<bf16, _>(op, p, a, b, ViaF32(k))),
        DType::I32 => with_cmp!(c, k => run_cmp::<i32, _>(op, p, a, b, Plain(k))),
        DType::I64 => with_cmp!(c, k => run_cmp::<i64, _>(op, p, a, b, Plain(k))),
        DType::U8 => with_cmp!(c, k => run_cmp::<u8, _>(op, p, a, b, Plain(k))),
        DType::Bool => with_cmp!(c, k => run_cmp::<bool, _>(op, p, a, b, Plain(k))),
        DType::C64 => match c {
            CmpOp::Eq => run_cmp::<C64, _>(op, p, a, b, Plain(Eq)),
            CmpOp::Ne => run_cmp::<C64, _>(op, p, a, b, Plain(Ne)),
            _ => Err(unsupported_dtype(op, a.dtype())),
        },
    }
}

/// One chunk of `where`, run under `simd_run`.
struct WhereTask<'a, T> {
    plan: &'a Plan<3>,
    cond: &'a [bool],
    a: &'a [T],
    b: &'a [T],
    start: usize,
    out: &'a mut [MaybeUninit<T>],
}

impl<T: Copy> SimdTask for WhereTask<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let [sc, sa, sb] = self.plan.inner_strides();
        for r in self.plan.rows(self.start, self.start + self.out.len()) {
            let c = Src::new(self.cond, r.offs[0], sc, r.len);
            let a = Src::new(self.a, r.offs[1], sa, r.len);
            let b = Src::new(self.b, r.offs[2], sb, r.len);
            let out = &mut self.out[r.out..r.out + r.len];
            match (c, a, b) {
                (Src::Slice(c), Src::Slice(a), Src::Slice(b)) => {
                    for (((o, &c), &x), &y) in out.iter_mut().zip(c).zip(a).zip(b) {
                        o.write(if c { x } else { y });
                    }
                }
                (Src::Slice(c), Src::Slice(a), Src::Scalar(y)) => {
                    for ((o, &c), &x) in out.iter_mut().zip(c).zip(a) {
                        o.write(if c { x } else { y });
                    }
                }
                (Src::Slice(c), Src::Scalar(x), Src::Slice(b)) => {
                    for ((o, &c), &y) in out.iter_mut().zip(c).zip(b) {
                        o.write(if c { x } else { y });
                    }
                }
                _ => {
                    for (i, o) in out.iter_mut().enumerate() {
                        o.write(if c.get(i) { a.get(i) } else { b.get(i) });
                    }
                }
            }
        }
    }
}

fn run_where<T: StorageElement>(op: &Op, plan: &Plan<3>, inputs: &[CpuInput<'_>]) -> CpuResult {
    let slice = |i: usize| {
        inputs[i]
            .storage
            .as_slice::<T>()
            .ok_or_else(|| unsupported_dtype(op, inputs[i].dtype()))
    };
    let cond = inputs[0]
        .storage
        .as_slice::<bool>()
        .ok_or_else(|| unsupported_dtype(op, inputs[0].dtype()))?;
    let (a, b) = (slice(1)?, slice(2)?);
    let v = fill_chunks(plan.numel(), plan.granule(), |start, out| {
        simd_run(WhereTask {
            plan,
            cond,
            a,
            b,
            start,
            out,
        });
    });
    Ok(vec![CpuStorage::from_vec(v)])
}

pub(super) fn where_(op: &Op, inputs: &[CpuInput<'_>], out: &TensorMeta) -> CpuResult {
    let plan = Plan::new(op, &out.shape, [inputs[0].layout, inputs[1].layout, inputs[2].layout])?;
    rustorch_core::with_dtype!(out.dtype, T => run_where::<T>(op, &plan, inputs))
}
