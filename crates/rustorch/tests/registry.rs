//! The facade alone brings the CPU backend: a program that names nothing
//! but `rustorch` gets it through the registry (the CPU crate registers
//! itself at link time), and an executor with no backend says so.

use rustorch::{DType, Device, Executor, ExecutorConfig, Tensor};
use std::sync::Arc;

#[test]
fn the_facade_links_the_cpu_backend() {
    let names: Vec<&str> = rustorch::registry::providers().iter().map(|p| p.name()).collect();
    assert!(names.contains(&"cpu"), "{names:?}");
    assert_eq!(Executor::global().devices().last(), Some(&Device::Cpu));
    let a = Tensor::from_vec(vec![1f32, 2.0, 3.0], [3]).unwrap();
    let b = a.add(&a).unwrap();
    assert_eq!(b.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
}

#[test]
fn an_executor_without_backends_says_so() {
    let empty = Arc::new(Executor::from_backends(ExecutorConfig::default(), Vec::new()));
    assert!(empty.devices().is_empty());
    let a = Tensor::zeros([2], DType::F32).unwrap();
    // Rebinding checks that the executor has the tensor's device.
    let err = a.with_executor(&empty).unwrap_err().to_string();
    assert!(err.contains("no backend"), "{err}");
    let input = rustorch::executor::Operand {
        buffer: a.buffer().clone(),
        layout: a.layout().clone(),
    };
    let err = empty.execute(&rustorch::Op::Copy, &[input]).unwrap_err().to_string();
    assert!(err.contains("links no backend crate"), "{err}");
}
