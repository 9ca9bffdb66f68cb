//! The CPU kernels called directly, without the executor's validation.

use rustorch_core::op::ReduceOp;
use rustorch_core::{DType, Layout, Op, TensorMeta};
use rustorch_cpu::{CpuBackend, CpuInput, CpuStorage};

/// The kernels themselves reject what validation would have caught, so a
/// backend caller that skips `infer_outputs` gets an error, not a panic.
#[test]
fn kernels_reject_bad_ops_without_panicking() {
    let storage = CpuStorage::F32((0..6).map(|i| i as f32).collect());
    let layout = Layout::contiguous([2, 3]);
    let input = [CpuInput {
        storage: &storage,
        layout: &layout,
    }];
    let out = [TensorMeta::new([2, 3], DType::F32)];
    let two = [TensorMeta::new([2, 3], DType::F32), TensorMeta::new([2, 3], DType::I64)];
    assert!(CpuBackend::run(&Op::Softmax { dim: 2 }, &input, &out).is_err());
    assert!(CpuBackend::run(&Op::Cumsum { dim: 9 }, &input, &out).is_err());
    assert!(CpuBackend::run(
        &Op::TopK {
            k: 4,
            dim: 1,
            largest: true
        },
        &input,
        &two
    )
    .is_err());
    assert!(CpuBackend::run(
        &Op::Sort {
            dim: 3,
            descending: false
        },
        &input,
        &two
    )
    .is_err());
    assert!(CpuBackend::run(&Op::Softmax { dim: 0 }, &input, &[]).is_err());
    let ints = CpuStorage::I64(vec![1; 6]);
    let input = [CpuInput {
        storage: &ints,
        layout: &layout,
    }];
    assert!(CpuBackend::run(&Op::Softmax { dim: 1 }, &input, &out).is_err());
    let mean = Op::Reduce {
        op: ReduceOp::Mean,
        dims: vec![1],
        keepdim: false,
    };
    assert!(CpuBackend::run(&mean, &input, &[TensorMeta::new([2], DType::F32)]).is_err());
}
