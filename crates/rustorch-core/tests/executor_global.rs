//! The global executor and the op profile, which need no second backend (routing, fallback and
//! strict mode are proven with a fault-injecting second device in rustorch-conformance's
//! tests/routing.rs).

use rustorch_core::{Device, Executor, ExecutorConfig, Tensor};
use rustorch_cpu::CpuStorage;
use std::collections::HashSet;
use std::sync::Arc;

fn arange_f32(exec: &Arc<Executor>, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
    Tensor::from_storage_in(exec, CpuStorage::from_vec(v), shape).expect("tensor")
}

#[test]
fn the_global_executor_works() {
    let g = Executor::global();
    assert!(Arc::ptr_eq(&g, &Executor::global()));
    assert_eq!(g.devices().last(), Some(&Device::Cpu));
    assert!(g
        .device_reports()
        .iter()
        .any(|r| r.device == Device::Cpu && r.disabled.is_none()));
    let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]).unwrap();
    assert!(Arc::ptr_eq(t.executor(), &g));
    assert_eq!(
        t.t().unwrap().contiguous().unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 3.0, 2.0, 4.0]
    );
}

/// `ExecutorConfig::profile`: each op's calls and time summed per op name
/// (or per name and input shapes), nothing recorded when it is off.
#[test]
fn profile_sums_ops_per_name_or_shapes() {
    use rustorch_core::ProfileMode;
    let run = |mode: ProfileMode| {
        let exec = Arc::new(Executor::new(ExecutorConfig {
            profile: mode,
            ..ExecutorConfig::default()
        }));
        let a = arange_f32(&exec, &[2, 3]);
        let b = arange_f32(&exec, &[3]);
        a.add(&a).unwrap();
        a.add(&b).unwrap();
        a.mul(&a).unwrap();
        exec
    };
    let exec = run(ProfileMode::Ops);
    assert!(exec.profiling());
    let lines = exec.profile();
    let calls = |op: &str| lines.iter().find(|l| l.op == op).map(|l| l.calls);
    assert_eq!(calls("add"), Some(2), "{lines:?}");
    assert_eq!(calls("mul"), Some(1), "{lines:?}");
    assert!(
        lines.windows(2).all(|w| w[0].total >= w[1].total),
        "most time first: {lines:?}"
    );
    let table = exec.profile_table(None);
    assert!(table.lines().any(|l| l.ends_with("  add")), "{table}");
    exec.clear_profile();
    assert!(exec.profile().is_empty());

    let exec = run(ProfileMode::Shapes);
    let ops: HashSet<String> = exec.profile().into_iter().map(|l| l.op).collect();
    assert!(
        ops.contains("add [2, 3] [2, 3]") && ops.contains("add [2, 3] [3]"),
        "{ops:?}"
    );

    let exec = run(ProfileMode::Off);
    assert!(!exec.profiling() && exec.profile().is_empty());
}
