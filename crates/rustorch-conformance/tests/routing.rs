//! The hybrid executor's routing, fallback, strict mode and trace, proven with
//! `FaultyBackend`: a real second device (`Device::Plugin(0)`) that owns its
//! buffers, so data only reaches it through `upload` and only comes back
//! through `download`. It computes with the CPU kernels, which makes its
//! results comparable with the CPU's bit for bit, and it can be told to
//! refuse ops or dtypes, to run out of memory after some work, to fail on an
//! op, to reject an op's input, or to be lost altogether.

use rustorch_conformance::FaultyBackend;
use rustorch_core::backend::{Backend, Buffer};
use rustorch_core::executor::{format_table, DeviceReport, Operand};
use rustorch_core::{BackendError, CpuStorage, DType, Device, Error, Executor, ExecutorConfig, Layout, Op, Tensor};
use rustorch_cpu::CpuBackend;
use std::sync::Arc;

const PLUGIN: Device = Device::Plugin(0);

fn traced(min_offload_elems: usize) -> ExecutorConfig {
    ExecutorConfig {
        trace: true,
        min_offload_elems,
        ..ExecutorConfig::default()
    }
}

/// An executor with `plugin` ahead of the CPU, and a handle to inspect it.
fn exec_with(config: ExecutorConfig, plugin: FaultyBackend) -> (Arc<Executor>, Arc<FaultyBackend>) {
    let plugin = Arc::new(plugin);
    let exec = Executor::with_backends(config, vec![plugin.clone() as Arc<dyn Backend>]).expect("executor");
    (Arc::new(exec), plugin)
}

fn arange_f32(exec: &Arc<Executor>, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
    Tensor::from_storage_in(exec, CpuStorage::from_vec(v), shape).expect("tensor")
}

fn operand(t: &Tensor) -> Operand {
    Operand {
        buffer: t.buffer().clone(),
        layout: t.layout().clone(),
    }
}

/// Runs `Op::Cat` through the executor and returns the output's buffer.
fn cat(exec: &Executor, dim: usize, parts: &[&Tensor]) -> Result<Buffer, Error> {
    let ops: Vec<Operand> = parts.iter().map(|t| operand(t)).collect();
    let mut out = exec.execute(&Op::Cat { dim }, &ops)?;
    assert_eq!(out.len(), 1);
    Ok(out.remove(0).0)
}

fn last_event(exec: &Executor) -> rustorch_core::TraceEvent {
    exec.trace().pop().expect("a trace event")
}

#[test]
fn supported_ops_run_on_the_plugin() {
    let (exec, plugin) = exec_with(traced(0), FaultyBackend::new());
    assert_eq!(exec.devices(), vec![PLUGIN, Device::Cpu]);
    let x = arange_f32(&exec, &[3, 4]).transpose(0, 1).unwrap();
    let y = x.contiguous().unwrap();
    assert_eq!(y.device(), PLUGIN);
    // The input moved up once, and nothing came back yet.
    assert_eq!((plugin.uploads(), plugin.executes(), plugin.downloads()), (1, 1, 0));

    let ev = last_event(&exec);
    assert_eq!(ev.op, "copy");
    assert_eq!(ev.device, PLUGIN);
    assert_eq!(ev.reason, "first capable in chain");
    assert!(ev.fallbacks.is_empty());
    assert_eq!(ev.bytes_moved, 12 * 4);
    assert_eq!(ev.input_shapes, vec![rustorch_core::Shape::from([4, 3])]);
    assert_eq!(ev.dtype, "f32");

    // Reading the result downloads it from the plugin.
    let v = y.to_vec::<f32>().unwrap();
    assert_eq!(plugin.downloads(), 1);
    let expected: Vec<f32> = (0..4)
        .flat_map(|j| (0..3).map(move |i| (i * 4 + j) as f32 * 0.5 - 3.0))
        .collect();
    assert_eq!(v, expected);
}

#[test]
fn refused_ops_and_dtypes_fall_back_to_the_cpu() {
    let (exec, plugin) = exec_with(
        traced(0),
        FaultyBackend::new().refuse_op("copy").refuse_dtype(DType::F16),
    );
    let x = arange_f32(&exec, &[2, 3]).transpose(0, 1).unwrap();

    let y = x.contiguous().unwrap();
    assert_eq!(y.device(), Device::Cpu);
    let ev = last_event(&exec);
    assert_eq!(ev.device, Device::Cpu);
    assert_eq!(ev.reason, "first capable in chain (plugin:0 lacks it)");
    // A refusal is not a failed attempt: nothing was tried, nothing moved.
    assert!(ev.fallbacks.is_empty());
    assert_eq!(ev.bytes_moved, 0);
    assert_eq!(plugin.uploads() + plugin.executes(), 0);

    // The plugin has no f16: casting to it stays on the CPU ...
    let h = x.to_dtype(DType::F16).unwrap();
    assert_eq!(h.device(), Device::Cpu);
    assert_eq!(last_event(&exec).reason, "first capable in chain (plugin:0 lacks it)");
    // ... and so does anything reading f16, while other casts go to the plugin.
    let back = h.to_dtype(DType::F32).unwrap();
    assert_eq!(back.device(), Device::Cpu);
    let i = x.to_dtype(DType::I32).unwrap();
    assert_eq!(i.device(), PLUGIN);
    assert_eq!(i.to_vec::<i32>().unwrap(), vec![-3, -1, -2, -1, -2, 0]);
    assert_eq!(back.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
}

#[test]
fn out_of_memory_on_execute_falls_back_with_the_attempt_recorded() {
    // One unit of work: the input upload succeeds, the execution runs out.
    let (exec, plugin) = exec_with(traced(0), FaultyBackend::new().oom_after(1));
    let x = arange_f32(&exec, &[4, 2]).transpose(0, 1).unwrap();
    let y = x.contiguous().unwrap();
    assert_eq!(y.device(), Device::Cpu);
    assert_eq!((plugin.uploads(), plugin.executes()), (1, 0));

    let ev = last_event(&exec);
    assert_eq!(ev.device, Device::Cpu);
    assert_eq!(ev.reason, "next capable in chain");
    assert_eq!(ev.fallbacks.len(), 1);
    assert_eq!(ev.fallbacks[0].0, PLUGIN);
    assert!(ev.fallbacks[0].1.contains("out of memory"), "{:?}", ev.fallbacks);
    // The upload made for the failed attempt counts as moved.
    assert_eq!(ev.bytes_moved, 8 * 4);
    assert_eq!(
        y.to_vec::<f32>().unwrap(),
        vec![-3.0, -2.0, -1.0, 0.0, -2.5, -1.5, -0.5, 0.5]
    );
}

#[test]
fn out_of_memory_on_upload_falls_back_with_the_attempt_recorded() {
    let (exec, plugin) = exec_with(traced(0), FaultyBackend::new().oom_after(0));
    let x = arange_f32(&exec, &[3, 3]);
    let y = x.to_dtype(DType::F64).unwrap();
    assert_eq!(y.device(), Device::Cpu);
    assert_eq!(plugin.uploads(), 0);
    let ev = last_event(&exec);
    assert_eq!(ev.op, "cast_to_f64");
    assert_eq!(ev.fallbacks.len(), 1);
    assert_eq!(ev.fallbacks[0].0, PLUGIN);
    assert!(
        ev.fallbacks[0].1.contains("out of memory (asked for 36 bytes)"),
        "{:?}",
        ev.fallbacks
    );
    // The failed upload moved nothing.
    assert_eq!(ev.bytes_moved, 0);

    // An explicit transfer has no fallback: it reports the error.
    match x.to_device(PLUGIN) {
        Err(Error::Backend {
            device,
            source: BackendError::OutOfMemory { .. },
            ..
        }) => assert_eq!(device, PLUGIN),
        other => panic!("expected an out-of-memory error, got {other:?}"),
    }
}

#[test]
fn device_errors_fall_back_and_inputs_come_back_from_the_plugin() {
    let (exec, plugin) = exec_with(traced(0), FaultyBackend::new().fail_op("copy"));
    let x = arange_f32(&exec, &[2, 5]).to_device(PLUGIN).unwrap();
    assert_eq!(x.device(), PLUGIN);
    let xt = x.transpose(0, 1).unwrap();
    let y = xt.contiguous().unwrap();
    assert_eq!(y.device(), Device::Cpu);

    let ev = last_event(&exec);
    assert_eq!(ev.device, Device::Cpu);
    assert_eq!(ev.reason, "next capable in chain");
    assert_eq!(
        ev.fallbacks,
        vec![(PLUGIN, "plugin:0 failed: kernel copy faulted".to_string())]
    );
    // The CPU had to fetch the input from the plugin.
    assert_eq!(ev.bytes_moved, 10 * 4);
    assert_eq!(plugin.downloads(), 1);
    // Ops the plugin does not fail on still run there.
    assert_eq!(xt.to_dtype(DType::F64).unwrap().device(), PLUGIN);
    assert_eq!(
        y.to_vec::<f32>().unwrap(),
        arange_f32(&exec, &[2, 5])
            .transpose(0, 1)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    );
}

#[test]
fn malformed_outputs_fall_back() {
    let plugin = FaultyBackend::new().short_output("copy").host_output("cast_to_f64");
    let (exec, plugin) = exec_with(traced(0), plugin);
    let x = arange_f32(&exec, &[2, 3]).transpose(0, 1).unwrap();
    let y = x.contiguous().unwrap();
    assert_eq!(y.device(), Device::Cpu);
    let ev = last_event(&exec);
    assert_eq!(
        ev.fallbacks,
        vec![(
            PLUGIN,
            "plugin:0 failed: returned output 0 as 5 elements of f32, expected 6 of f32".to_string()
        )]
    );
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![-3.0, -1.5, -2.5, -1.0, -2.0, -0.5]);

    let z = x.to_dtype(DType::F64).unwrap();
    assert_eq!(z.device(), Device::Cpu);
    assert_eq!(
        last_event(&exec).fallbacks,
        vec![(PLUGIN, "plugin:0 failed: returned output 0 on cpu".to_string())]
    );
    assert_eq!(plugin.executes(), 2);
}

#[test]
fn invalid_input_does_not_fall_back() {
    let (exec, plugin) = exec_with(traced(0), FaultyBackend::new().reject_op("copy"));
    let x = arange_f32(&exec, &[3, 2]).transpose(0, 1).unwrap();
    match x.contiguous() {
        Err(Error::Backend {
            op,
            device,
            source: BackendError::InvalidInput { .. },
        }) => {
            assert_eq!(op, "copy");
            assert_eq!(device, PLUGIN);
        }
        other => panic!("expected the plugin's InvalidInput, got {other:?}"),
    }
    // No device ran it, so there is no event for it.
    assert!(exec.trace().iter().all(|e| e.op != "copy"));
    assert_eq!(plugin.executes(), 0);
}

#[test]
fn a_layout_past_its_storage_is_invalid_on_every_device() {
    // The CPU kernels check layouts against storage and call a bad one the
    // caller's fault; the executor must return that, not try elsewhere.
    let (exec, _plugin) = exec_with(traced(0), FaultyBackend::new());
    let buf: Buffer = Arc::new(CpuStorage::from_vec(vec![1.0f32; 4]));
    let bad = Operand {
        buffer: buf,
        layout: Layout::contiguous_with_offset([2, 2], 1),
    };
    match exec.execute(&Op::Copy, &[bad]) {
        Err(Error::Backend {
            device,
            source: BackendError::InvalidInput { .. },
            ..
        }) => assert_eq!(device, PLUGIN),
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    // An empty layout reads nothing, but its offset must still lie inside
    // the storage the kernels slice.
    let buf: Buffer = Arc::new(CpuStorage::from_vec(vec![1.0f32; 4]));
    let empty = Operand {
        buffer: buf,
        layout: Layout::contiguous_with_offset([0, 2], 5),
    };
    assert!(matches!(
        exec.execute(&Op::Copy, &[empty]),
        Err(Error::Backend {
            source: BackendError::InvalidInput { .. },
            ..
        })
    ));
    let cpu_only = Executor::new(traced(0));
    let buf: Buffer = Arc::new(CpuStorage::from_vec(vec![1.0f32; 4]));
    let bad = Operand {
        buffer: buf,
        layout: Layout::contiguous_with_offset([2, 2], 1),
    };
    assert!(matches!(
        cpu_only.execute(&Op::Copy, &[bad]),
        Err(Error::Backend {
            device: Device::Cpu,
            source: BackendError::InvalidInput { .. },
            ..
        })
    ));
}

#[test]
fn resident_inputs_keep_ops_on_their_device_and_moves_are_counted() {
    // A large offload threshold: only residency can put ops on the plugin.
    let (exec, plugin) = exec_with(traced(1 << 20), FaultyBackend::new());
    let a = arange_f32(&exec, &[2, 3]).to_device(PLUGIN).unwrap();
    let ev = last_event(&exec);
    assert_eq!(ev.op, "to_device");
    assert_eq!(ev.reason, "explicit transfer from cpu");
    assert_eq!(ev.bytes_moved, 24);

    let c = a.copy().unwrap();
    assert_eq!(c.device(), PLUGIN);
    let ev = last_event(&exec);
    assert_eq!(ev.reason, "inputs already there");
    assert_eq!(ev.bytes_moved, 0);
    assert_eq!(plugin.uploads(), 1, "a resident input is not uploaded again");

    // Mixed inputs: the plugin holds more bytes, so the CPU part moves up.
    let b = arange_f32(&exec, &[1, 3]);
    let out = cat(&exec, 0, &[&a, &b]).unwrap();
    assert_eq!(out.device(), PLUGIN);
    let ev = last_event(&exec);
    assert_eq!(ev.reason, "inputs already there");
    assert_eq!(ev.bytes_moved, 3 * 4);
    assert_eq!(plugin.uploads(), 2);
    let host = exec.download(&out).unwrap();
    assert_eq!(
        host.as_slice::<f32>().unwrap(),
        &[-3.0, -2.5, -2.0, -1.5, -1.0, -0.5, -3.0, -2.5, -2.0]
    );

    // Even when the CPU holds more bytes, the accelerator already holding
    // data wins (host memory is never "resident"), and the CPU part moves.
    let big = arange_f32(&exec, &[5, 3]);
    let out = cat(&exec, 0, &[&a, &big]).unwrap();
    assert_eq!(out.device(), PLUGIN);
    assert_eq!(last_event(&exec).bytes_moved, 15 * 4);
}

#[test]
fn small_ops_stay_on_the_cpu() {
    let (exec, plugin) = exec_with(traced(100), FaultyBackend::new());
    let small = arange_f32(&exec, &[3, 3]).transpose(0, 1).unwrap();
    assert_eq!(small.contiguous().unwrap().device(), Device::Cpu);
    let ev = last_event(&exec);
    assert_eq!(ev.reason, "first capable in chain (plugin:0: below offload size)");
    assert_eq!(plugin.uploads(), 0);

    // At the threshold the plugin wins.
    let big = arange_f32(&exec, &[10, 10]).transpose(0, 1).unwrap();
    assert_eq!(big.contiguous().unwrap().device(), PLUGIN);
    assert_eq!(last_event(&exec).reason, "first capable in chain");
    assert_eq!(last_event(&exec).bytes_moved, 400);
}

#[test]
fn the_preferred_device_goes_first() {
    // Preferred plugin: even a tiny op goes there.
    let cfg = ExecutorConfig {
        preferred_device: Some(PLUGIN),
        ..traced(1 << 20)
    };
    let (exec, _plugin) = exec_with(cfg, FaultyBackend::new());
    let x = arange_f32(&exec, &[2, 2]).transpose(0, 1).unwrap();
    assert_eq!(x.contiguous().unwrap().device(), PLUGIN);
    assert_eq!(last_event(&exec).reason, "preferred device");

    // Preferred CPU: data on the plugin comes down for it.
    let cfg = ExecutorConfig {
        preferred_device: Some(Device::Cpu),
        ..traced(0)
    };
    let (exec, plugin) = exec_with(cfg, FaultyBackend::new());
    let x = arange_f32(&exec, &[2, 2])
        .to_device(PLUGIN)
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    let y = x.contiguous().unwrap();
    assert_eq!(y.device(), Device::Cpu);
    let ev = last_event(&exec);
    assert_eq!(ev.reason, "preferred device");
    assert_eq!(ev.bytes_moved, 16);
    assert_eq!(plugin.downloads(), 1);

    // A preferred device that cannot run the op is passed over.
    let cfg = ExecutorConfig {
        preferred_device: Some(PLUGIN),
        ..traced(0)
    };
    let (exec, _plugin) = exec_with(cfg, FaultyBackend::new().refuse_op("copy"));
    let x = arange_f32(&exec, &[2, 2]).transpose(0, 1).unwrap();
    assert_eq!(x.contiguous().unwrap().device(), Device::Cpu);
    assert_eq!(last_event(&exec).reason, "first capable in chain (plugin:0 lacks it)");
}

#[test]
fn chain_order_and_skipping_a_refusing_device() {
    let first = Arc::new(FaultyBackend::new().refuse_op("copy"));
    let second = Arc::new(FaultyBackend::new().on(Device::Plugin(1)));
    let exec = Executor::with_backends(
        traced(0),
        vec![first.clone() as Arc<dyn Backend>, second.clone() as Arc<dyn Backend>],
    )
    .unwrap();
    assert_eq!(exec.devices(), vec![Device::Plugin(0), Device::Plugin(1), Device::Cpu]);
    let exec = Arc::new(exec);
    let x = arange_f32(&exec, &[2, 3]).transpose(0, 1).unwrap();
    let y = x.contiguous().unwrap();
    assert_eq!(y.device(), Device::Plugin(1));
    assert_eq!(last_event(&exec).reason, "first capable in chain (plugin:0 lacks it)");
    assert_eq!(x.to_dtype(DType::I64).unwrap().device(), Device::Plugin(0));

    // Moving a tensor between two accelerators goes through the host.
    let z = y.to_device(Device::Plugin(0)).unwrap();
    assert_eq!(z.device(), Device::Plugin(0));
    assert_eq!((second.downloads(), first.uploads()), (1, 2));
    assert_eq!(z.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
}

#[test]
fn registration_rules() {
    let mut exec = Executor::new(ExecutorConfig::default());
    exec.register(Arc::new(FaultyBackend::new())).unwrap();
    assert!(matches!(
        exec.register(Arc::new(FaultyBackend::new())),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        exec.register(Arc::new(CpuBackend::new())),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(exec.devices(), vec![PLUGIN, Device::Cpu]);
}

#[test]
fn disable_gpu_keeps_the_plugin_out() {
    let cfg = ExecutorConfig {
        disable_gpu: true,
        ..traced(0)
    };
    let (exec, plugin) = exec_with(cfg, FaultyBackend::new());
    assert_eq!(exec.devices(), vec![Device::Cpu]);
    let reports: Vec<DeviceReport> = exec.device_reports();
    assert_eq!(reports.len(), 2);
    assert_eq!(reports[0].device, Device::Cpu);
    assert!(reports[0].disabled.is_none());
    assert_eq!(reports[1].device, PLUGIN);
    assert_eq!(reports[1].capability.name, "fault-injecting test device");
    assert!(reports[1]
        .disabled
        .as_deref()
        .unwrap_or("")
        .contains("RUSTORCH_DISABLE_GPU"));

    let x = arange_f32(&exec, &[100, 100]).transpose(0, 1).unwrap();
    assert_eq!(x.contiguous().unwrap().device(), Device::Cpu);
    assert_eq!(plugin.uploads(), 0);
    assert!(matches!(
        x.to_device(PLUGIN),
        Err(Error::DeviceNotAvailable { device: PLUGIN, .. })
    ));

    // Asking for the disabled device says why it is not there.
    let cfg = ExecutorConfig {
        disable_gpu: true,
        preferred_device: Some(PLUGIN),
        ..traced(0)
    };
    match Executor::with_backends(cfg, vec![Arc::new(FaultyBackend::new())]) {
        Err(Error::DeviceNotAvailable { device, reason }) => {
            assert_eq!(device, PLUGIN);
            assert!(reason.contains("RUSTORCH_DISABLE_GPU"), "{reason}");
        }
        other => panic!("expected DeviceNotAvailable, got {other:?}"),
    }
}

#[test]
fn an_unregistered_preferred_device_is_an_error() {
    let cfg = ExecutorConfig {
        preferred_device: Some(Device::Cuda(0)),
        ..traced(0)
    };
    match Executor::with_backends(cfg, vec![Arc::new(FaultyBackend::new())]) {
        Err(Error::DeviceNotAvailable { device, reason }) => {
            assert_eq!(device, Device::Cuda(0));
            assert!(reason.contains("plugin:0") && reason.contains("cpu"), "{reason}");
        }
        other => panic!("expected DeviceNotAvailable, got {other:?}"),
    }
    let cfg = ExecutorConfig {
        preferred_device: Some(Device::Plugin(3)),
        ..traced(0)
    };
    assert!(matches!(
        Executor::with_backends(cfg, vec![]),
        Err(Error::DeviceNotAvailable { .. })
    ));
}

/// The same ops on the plugin and on a CPU-only executor give identical bits.
#[test]
fn plugin_results_equal_cpu_results_exactly() {
    let (pexec, _plugin) = exec_with(traced(0), FaultyBackend::new());
    let cexec = Arc::new(Executor::new(traced(0)));
    let run = |exec: &Arc<Executor>| -> Vec<(DType, Vec<f64>, Device)> {
        let v: Vec<f32> = (0..60).map(|i| ((i * 37 % 61) as f32 - 30.0) * 0.173).collect();
        let x = Tensor::from_storage_in(exec, CpuStorage::from_vec(v), [3, 4, 5]).unwrap();
        let view = x.permute(&[2, 0, 1]).unwrap().narrow(1, 1, 2).unwrap();
        let mut out = Vec::new();
        let c = view.contiguous().unwrap();
        out.push((c.dtype(), c.to_f64_vec().unwrap(), c.device()));
        for d in [
            DType::F16,
            DType::BF16,
            DType::F64,
            DType::I32,
            DType::I64,
            DType::U8,
            DType::Bool,
            DType::C64,
        ] {
            let t = view.to_dtype(d).unwrap();
            out.push((t.dtype(), t.to_f64_vec().unwrap(), t.device()));
        }
        let other = x.narrow(0, 0, 1).unwrap();
        let buf = cat(exec, 0, &[&x, &other, &x.narrow(0, 2, 1).unwrap()]).unwrap();
        out.push((buf.dtype(), exec.download(&buf).unwrap().to_f64_vec(), buf.device()));
        out
    };
    let on_plugin = run(&pexec);
    let on_cpu = run(&cexec);
    assert_eq!(on_plugin.len(), on_cpu.len());
    for ((pd, pv, pdev), (cd, cv, cdev)) in on_plugin.iter().zip(&on_cpu) {
        assert_eq!((*pdev, *cdev), (PLUGIN, Device::Cpu));
        assert_eq!(pd, cd);
        // Bit equality (NaN cannot appear in these inputs).
        assert_eq!(
            pv.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            cv.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
    assert!(pexec
        .trace()
        .iter()
        .filter(|e| e.op != "to_device")
        .all(|e| e.device == PLUGIN));
}

#[test]
fn trace_table_shows_op_device_reason_and_fallback() {
    let (exec, _plugin) = exec_with(traced(0), FaultyBackend::new().fail_op("copy").refuse_op("cat"));
    let x = arange_f32(&exec, &[2, 3]).transpose(0, 1).unwrap();
    x.contiguous().unwrap();
    x.to_dtype(DType::F64).unwrap();
    cat(&exec, 1, &[&x, &x]).unwrap();
    let table = exec.trace_table();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2 + 3, "{table}");
    let header: Vec<&str> = lines[0].split('|').map(str::trim).collect();
    assert_eq!(
        header,
        ["#", "op", "inputs", "dtype", "device", "reason", "fallback", "moved", "time"]
    );
    let cell = |row: usize, col: usize| lines[row].split('|').nth(col).map(str::trim).unwrap_or("").to_string();
    assert_eq!(cell(2, 1), "copy");
    assert_eq!(cell(2, 2), "[3, 2]");
    assert_eq!(cell(2, 4), "cpu");
    // The CPU ran it because the plugin, first in the chain, failed.
    assert_eq!(cell(2, 5), "next capable in chain");
    assert_eq!(cell(2, 6), "plugin:0: plugin:0 failed: kernel copy faulted");
    // The upload for the failed attempt is a real copy and counts.
    assert_eq!(cell(2, 7), "24 B");
    assert_eq!(cell(3, 1), "cast_to_f64");
    assert_eq!(cell(3, 4), "plugin:0");
    assert_eq!(cell(3, 6), "-");
    assert_eq!(cell(4, 1), "cat");
    assert_eq!(cell(4, 2), "[3, 2] [3, 2]");
    assert_eq!(cell(4, 4), "cpu");
    assert_eq!(cell(4, 5), "first capable in chain (plugin:0 lacks it)");
    // Sequence numbers count up.
    assert_eq!([cell(2, 0), cell(3, 0), cell(4, 0)], ["0", "1", "2"]);
    assert_eq!(format_table(&exec.trace()), table);

    exec.clear_trace();
    assert!(exec.trace().is_empty());
    assert_eq!(exec.trace_table().lines().count(), 2);
}

#[test]
fn no_trace_unless_asked() {
    let (exec, _plugin) = exec_with(
        ExecutorConfig {
            min_offload_elems: 0,
            ..ExecutorConfig::default()
        },
        FaultyBackend::new(),
    );
    let x = arange_f32(&exec, &[2, 3]).transpose(0, 1).unwrap();
    assert_eq!(x.contiguous().unwrap().device(), PLUGIN);
    assert!(exec.trace().is_empty());
}

#[test]
fn no_device_could_run_lists_every_attempt() {
    // The data lives on the plugin, which then dies: the plugin's own attempt
    // fails, and the CPU cannot get the input down from it either.
    let (exec, plugin) = exec_with(traced(0), FaultyBackend::new());
    let x = arange_f32(&exec, &[2, 3]).to_device(PLUGIN).unwrap();
    plugin.lose();
    match x.transpose(0, 1).unwrap().contiguous() {
        Err(Error::NoDeviceCouldRun { op, attempts }) => {
            assert_eq!(op, "copy");
            let devices: Vec<Device> = attempts.iter().map(|(d, _)| *d).collect();
            assert_eq!(devices, vec![PLUGIN, Device::Cpu]);
            for (_, e) in &attempts {
                assert_eq!(
                    e,
                    &BackendError::DeviceLost {
                        device: PLUGIN,
                        message: "device lost".into()
                    }
                );
            }
            let msg = Error::NoDeviceCouldRun { op, attempts }.to_string();
            assert!(msg.contains("[plugin:0: plugin:0 is lost: device lost]"), "{msg}");
            assert!(msg.contains("[cpu: plugin:0 is lost: device lost]"), "{msg}");
        }
        other => panic!("expected NoDeviceCouldRun, got {other:?}"),
    }
    // Reading it back is an explicit download, which reports the error as is.
    assert!(matches!(x.to_vec::<f32>(), Err(Error::Backend { device: PLUGIN, .. })));
}

#[test]
fn config_from_vars() {
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    };
    let c = ExecutorConfig::from_vars(vars(&[])).unwrap();
    assert_eq!(c, ExecutorConfig::default());

    let c = ExecutorConfig::from_vars(vars(&[
        ("RUSTORCH_DEVICE", "Plugin:0"),
        ("RUSTORCH_TRACE", " yes "),
        ("RUSTORCH_MIN_OFFLOAD", "17"),
        ("RUSTORCH_DISABLE_GPU", "0"),
    ]))
    .unwrap();
    assert_eq!(c.preferred_device, Some(PLUGIN));
    assert!(c.trace && c.print_trace && !c.disable_gpu);
    assert_eq!(c.min_offload_elems, 17);

    for (name, value, preferred) in [
        ("RUSTORCH_DEVICE", "cpu", Some(Device::Cpu)),
        ("RUSTORCH_DEVICE", "cuda", Some(Device::Cuda(0))),
        ("RUSTORCH_DEVICE", "metal:2", Some(Device::Metal(2))),
        ("RUSTORCH_DEVICE", "wgpu:1", Some(Device::Wgpu(1))),
        ("RUSTORCH_DEVICE", "vulkan:1", Some(Device::Vulkan(1))),
        ("RUSTORCH_DEVICE", "opencl", Some(Device::OpenCl(0))),
        ("RUSTORCH_DEVICE", "auto", None),
        ("RUSTORCH_DEVICE", "", None),
    ] {
        let pairs = [(name, value)];
        let c = ExecutorConfig::from_vars(|k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())).unwrap();
        assert_eq!(c.preferred_device, preferred, "{value}");
    }
    for (name, value) in [
        ("RUSTORCH_DEVICE", "tpu"),
        ("RUSTORCH_DEVICE", "cuda:x"),
        ("RUSTORCH_DEVICE", "cuda:"),
        ("RUSTORCH_DISABLE_GPU", "2"),
        ("RUSTORCH_TRACE", "maybe"),
        ("RUSTORCH_MIN_OFFLOAD", "-1"),
        ("RUSTORCH_MIN_OFFLOAD", "lots"),
    ] {
        let pairs = [(name, value)];
        match ExecutorConfig::from_vars(|k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())) {
            Err(Error::InvalidArgument { op, .. }) => assert_eq!(op, name),
            other => panic!("{name}={value:?} should be rejected, got {other:?}"),
        }
    }

    // A configuration read from variables drives a real executor.
    let c = ExecutorConfig::from_vars(vars(&[("RUSTORCH_DISABLE_GPU", "true")])).unwrap();
    let exec = Executor::with_backends(c, vec![Arc::new(FaultyBackend::new())]).unwrap();
    assert_eq!(exec.devices(), vec![Device::Cpu]);
}

/// Strict mode: an op runs on the preferred device or fails, never moving
/// to another device, whether the device refuses it, runs out of memory or
/// fails; what it does run is traced on that device.
#[test]
fn strict_mode_never_falls_back() {
    let strict = |plugin: FaultyBackend| {
        exec_with(
            ExecutorConfig {
                strict: true,
                preferred_device: Some(PLUGIN),
                ..traced(0)
            },
            plugin,
        )
    };
    let (exec, _) = strict(FaultyBackend::new());
    let x = arange_f32(&exec, &[4, 2]).transpose(0, 1).unwrap();
    let y = x.contiguous().unwrap();
    assert_eq!((y.device(), last_event(&exec).device), (PLUGIN, PLUGIN));
    assert!(last_event(&exec).fallbacks.is_empty());

    let (exec, _) = strict(FaultyBackend::new().refuse_op("copy"));
    let x = arange_f32(&exec, &[4, 2]).transpose(0, 1).unwrap();
    let err = x.contiguous().unwrap_err().to_string();
    assert!(err.contains("strict mode") && err.contains("plugin:0"), "{err}");

    let (exec, _) = strict(FaultyBackend::new().oom_after(1));
    let x = arange_f32(&exec, &[4, 2]).transpose(0, 1).unwrap();
    let err = x.contiguous().unwrap_err().to_string();
    assert!(err.contains("out of memory"), "{err}");
    assert!(exec.trace().iter().all(|e| e.device != Device::Cpu || e.op != "copy"));

    // Without strict mode, the same refusal falls back to the CPU.
    let (exec, _) = exec_with(
        ExecutorConfig {
            preferred_device: Some(PLUGIN),
            ..traced(0)
        },
        FaultyBackend::new().refuse_op("copy"),
    );
    let x = arange_f32(&exec, &[4, 2]).transpose(0, 1).unwrap();
    assert_eq!(x.contiguous().unwrap().device(), Device::Cpu);
}

#[test]
fn a_late_fault_loses_the_device_and_routing_skips_it_from_then_on() {
    // `mul` seems to succeed on the plugin; its fault surfaces at the next
    // call (as a GPU kernel's does), here the download of its result.
    let (exec, plugin) = exec_with(traced(0), FaultyBackend::new().fault_later("mul"));
    let x = arange_f32(&exec, &[4, 8]).to_device(PLUGIN).unwrap();
    let y = x.mul(&x).unwrap();
    assert_eq!(y.device(), PLUGIN);
    match y.to_vec::<f32>() {
        Err(Error::Backend {
            device: PLUGIN,
            source: BackendError::DeviceLost { .. },
            ..
        }) => {}
        other => panic!("expected the late fault as DeviceLost, got {other:?}"),
    }
    let lost = exec.lost_reason(PLUGIN).expect("the plugin is marked lost");
    assert!(lost.contains("lost"), "{lost}");
    let report = exec.device_reports().into_iter().find(|r| r.device == PLUGIN).unwrap();
    assert!(report.disabled.is_some_and(|why| why.starts_with("lost: ")));

    // Host data now goes straight to the CPU: the plugin is not tried again.
    let executes = plugin.executes();
    let a = arange_f32(&exec, &[4, 8]);
    let b = a.add(&a).unwrap();
    assert_eq!(b.device(), Device::Cpu);
    let ev = exec.trace().last().cloned().unwrap();
    assert!(ev.fallbacks.is_empty(), "{:?}", ev.fallbacks);
    assert!(ev.reason.contains("plugin:0 lost"), "{}", ev.reason);
    assert_eq!(plugin.executes(), executes);
    let want: Vec<f32> = (0..32).map(|i| 2.0 * (i as f32 * 0.5 - 3.0)).collect();
    assert_eq!(b.to_vec::<f32>().unwrap(), want);
}

#[test]
fn synchronize_reports_a_late_fault() {
    let (exec, plugin) = exec_with(traced(0), FaultyBackend::new().fault_later("exp"));
    exec.synchronize().expect("nothing queued yet");
    let x = arange_f32(&exec, &[3, 3]).to_device(PLUGIN).unwrap();
    let _ = x.exp().unwrap();
    assert!(plugin.is_lost());
    match exec.synchronize() {
        Err(Error::Backend {
            op,
            device: PLUGIN,
            source: BackendError::DeviceLost { .. },
        }) => assert_eq!(op, "synchronize"),
        other => panic!("expected DeviceLost from synchronize, got {other:?}"),
    }
    assert!(exec.lost_reason(PLUGIN).is_some());
    // A lost device is not synchronized again.
    exec.synchronize().expect("only the lost device had failed");
}

#[test]
fn a_fused_op_the_device_lacks_runs_as_its_parts_there() {
    use rustorch_core::op::GateActivation;
    use rustorch_core::quant::{quantize, QType};
    use rustorch_core::QWeight;
    let (k, n, m) = (64, 48, 3);
    let vals = |seed: usize, len: usize| -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7919 + seed * 104729) % 1000) as f32 / 500.0) - 1.0)
            .collect()
    };
    let gate_bytes = quantize(QType::Q8_0, &vals(1, n * k)).unwrap();
    let up_bytes = quantize(QType::Q8_0, &vals(2, n * k)).unwrap();

    // The CPU's fused kernel: the reference.
    let cpu_exec = Arc::new(Executor::from_backends(
        ExecutorConfig::default(),
        vec![Arc::new(CpuBackend::new()) as Arc<dyn Backend>],
    ));
    let cpu_gate = QWeight::from_bytes_in(&cpu_exec, QType::Q8_0, n, k, gate_bytes.clone()).unwrap();
    let cpu_up = QWeight::from_bytes_in(&cpu_exec, QType::Q8_0, n, k, up_bytes.clone()).unwrap();
    let cpu_x = arange_f32(&cpu_exec, &[m, k]);
    let want = cpu_x
        .qmatmul_gated(&cpu_gate, &cpu_up, GateActivation::SwiGlu)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();

    // The plugin lacks the fused op; its data lives there, so the op runs
    // there as `qmatmul_x2` then `swiglu` instead of moving to the CPU.
    let (exec, plugin) = exec_with(traced(0), FaultyBackend::new().refuse_op("qmatmul_swiglu"));
    let gate = QWeight::from_bytes_in(&exec, QType::Q8_0, n, k, gate_bytes)
        .unwrap()
        .to_device(PLUGIN)
        .unwrap();
    let up = QWeight::from_bytes_in(&exec, QType::Q8_0, n, k, up_bytes)
        .unwrap()
        .to_device(PLUGIN)
        .unwrap();
    let x = arange_f32(&exec, &[m, k]).to_device(PLUGIN).unwrap();
    exec.clear_trace();
    let executes = plugin.executes();
    let y = x.qmatmul_gated(&gate, &up, GateActivation::SwiGlu).unwrap();
    assert_eq!(y.device(), PLUGIN);
    let ops: Vec<(String, Device)> = exec.trace().iter().map(|e| (e.op.clone(), e.device)).collect();
    assert_eq!(
        ops,
        vec![("qmatmul_x2".to_string(), PLUGIN), ("swiglu".to_string(), PLUGIN)]
    );
    assert_eq!(plugin.executes(), executes + 2);
    assert_eq!(y.to_vec::<f32>().unwrap(), want, "the parts give the fused op's values");
}

#[test]
fn a_norm_feeding_products_runs_as_its_parts_where_the_device_lacks_it() {
    use rustorch_core::quant::{quantize, QType};
    use rustorch_core::QWeight;
    let (k, m) = (64, 1);
    let rows = [48, 16, 16];
    let vals = |seed: usize, len: usize| -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7919 + seed * 104729) % 1000) as f32 / 500.0) - 1.0)
            .collect()
    };
    let bytes: Vec<Vec<u8>> = rows
        .iter()
        .enumerate()
        .map(|(i, &n)| quantize(QType::Q8_0, &vals(i + 1, n * k)).unwrap())
        .collect();
    let weights = |exec: &Arc<Executor>, device: Option<Device>| -> Vec<QWeight> {
        bytes
            .iter()
            .zip(rows)
            .map(|(b, n)| {
                let w = QWeight::from_bytes_in(exec, QType::Q8_0, n, k, b.clone()).unwrap();
                match device {
                    Some(d) => w.to_device(d).unwrap(),
                    None => w,
                }
            })
            .collect()
    };
    let host = |exec: &Arc<Executor>, seed: usize, shape: &[usize]| {
        Tensor::from_vec(vals(seed, shape.iter().product()), shape.to_vec())
            .unwrap()
            .with_executor(exec)
            .unwrap()
    };

    // The CPU, op by op: the reference.
    let cpu_exec = Arc::new(Executor::from_backends(
        ExecutorConfig::default(),
        vec![Arc::new(CpuBackend::new()) as Arc<dyn Backend>],
    ));
    let cw = weights(&cpu_exec, None);
    let (x, a, nw) = (
        host(&cpu_exec, 7, &[m, k]),
        host(&cpu_exec, 8, &[m, k]),
        host(&cpu_exec, 9, &[k]),
    );
    let (s_want, h) = x.add_rms_norm(&a, &nw, 1e-5).unwrap();
    let want: Vec<Vec<f32>> = h
        .qmatmul_many(&[&cw[0], &cw[1], &cw[2]])
        .unwrap()
        .iter()
        .map(|t| t.to_vec::<f32>().unwrap())
        .collect();
    // The CPU's fused op: its parts, the same bits.
    let (s, ys) = x
        .add_rms_norm_qmatmul_many(&a, &nw, 1e-5, &[&cw[0], &cw[1], &cw[2]])
        .unwrap();
    assert_eq!(s.to_vec::<f32>().unwrap(), s_want.to_vec::<f32>().unwrap());
    let got: Vec<Vec<f32>> = ys.iter().map(|t| t.to_vec::<f32>().unwrap()).collect();
    assert_eq!(got, want, "the CPU's fused op gives its parts' values");

    // A device without it runs the parts there (its data stays).
    let (exec, _plugin) = exec_with(traced(0), FaultyBackend::new().refuse_op("add_rms_norm_qmatmul_x3"));
    let pw = weights(&exec, Some(PLUGIN));
    let on = |t: Tensor| t.to_device(PLUGIN).unwrap();
    let (x, a, nw) = (
        on(host(&exec, 7, &[m, k])),
        on(host(&exec, 8, &[m, k])),
        on(host(&exec, 9, &[k])),
    );
    exec.clear_trace();
    let (s, ys) = x
        .add_rms_norm_qmatmul_many(&a, &nw, 1e-5, &[&pw[0], &pw[1], &pw[2]])
        .unwrap();
    let ops: Vec<(String, Device)> = exec.trace().iter().map(|e| (e.op.clone(), e.device)).collect();
    assert_eq!(
        ops,
        vec![("add_rms_norm".to_string(), PLUGIN), ("qmatmul_x3".to_string(), PLUGIN)]
    );
    assert_eq!(s.to_vec::<f32>().unwrap(), s_want.to_vec::<f32>().unwrap());
    let got: Vec<Vec<f32>> = ys.iter().map(|t| t.to_vec::<f32>().unwrap()).collect();
    assert_eq!(got, want, "the parts give the fused op's values");
}

#[test]
fn zeros_on_a_device_are_made_there() {
    let (exec, plugin) = exec_with(traced(0), FaultyBackend::new());
    let uploads = plugin.uploads();
    let z = Tensor::zeros_in(&exec, [2, 5], DType::F32, PLUGIN).unwrap();
    assert_eq!(z.device(), PLUGIN);
    assert_eq!(plugin.uploads(), uploads, "allocated on the device, not uploaded");
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![0.0; 10]);
}

#[test]
fn op_times_come_from_the_device_timer() {
    // A device that queues work times it with its own events; the trace and
    // the profile must report those, not the host's time around `execute`.
    let tick = std::time::Duration::from_millis(250);
    let (exec, _plugin) = exec_with(
        ExecutorConfig {
            profile: rustorch_core::ProfileMode::Ops,
            ..traced(0)
        },
        FaultyBackend::new().timed(tick),
    );
    let x = arange_f32(&exec, &[4, 4]).to_device(PLUGIN).unwrap();
    let _ = x.exp().unwrap();
    let ev = exec.trace().last().cloned().unwrap();
    assert_eq!((ev.op.as_str(), ev.device, ev.elapsed), ("exp", PLUGIN, tick));
    let line = exec.profile().into_iter().find(|l| l.op == "exp").unwrap();
    assert_eq!(line.total, tick);
}

/// A position tensor (`write_slice_at`) of one i64, in host memory under `exec`.
fn position(exec: &Arc<Executor>, value: i64) -> Tensor {
    Tensor::from_storage_in(exec, CpuStorage::from_vec(vec![value]), [1]).unwrap()
}

#[test]
fn write_slice_at_reads_the_position_on_the_device_or_else_on_the_host() {
    // With the method the device reads the position itself: no download, so
    // nothing waits for it (what a replayed CUDA graph needs). A device
    // without it (the trait's default) still gets the write: the executor
    // downloads the position and calls its `write_into` at the moved region.
    for without_method in [false, true] {
        let plugin = if without_method {
            FaultyBackend::new().refuse_op("write_into_at")
        } else {
            FaultyBackend::new()
        };
        let (exec, plugin) = exec_with(traced(0), plugin);
        let mut cache = Tensor::zeros_in(&exec, [2, 5, 3], DType::F16, PLUGIN).unwrap();
        let mut want = Tensor::zeros_in(&exec, [2, 5, 3], DType::F16, Device::Cpu).unwrap();
        for start in 0..=4 {
            let token = arange_f32(&exec, &[2, 1, 3]).mul_scalar(start as f64 + 1.0).unwrap();
            want.write_slice(1, start, &token).unwrap();
            let (token, pos) = (
                token.to_device(PLUGIN).unwrap(),
                position(&exec, start as i64).to_device(PLUGIN).unwrap(),
            );
            let downloads = plugin.downloads();
            cache.write_slice_at(1, &pos, &token).unwrap();
            assert_eq!(
                plugin.downloads() - downloads,
                usize::from(without_method),
                "without the method: {without_method}"
            );
            let ev = last_event(&exec);
            assert_eq!(
                (ev.op.as_str(), ev.device, ev.bytes_moved),
                ("write_into_at", PLUGIN, 0)
            );
            assert_eq!(ev.reason.contains("on the host"), without_method, "{}", ev.reason);
        }
        assert_eq!(cache.device(), PLUGIN);
        assert_eq!(cache.to_cpu_storage().unwrap(), want.to_cpu_storage().unwrap());
        // A position in host memory moves to the device (counted), and one
        // out of range writes nothing on either path.
        let before = cache.to_cpu_storage().unwrap();
        let token = arange_f32(&exec, &[2, 1, 3]).to_device(PLUGIN).unwrap();
        let err = cache.write_slice_at(1, &position(&exec, 5), &token).unwrap_err();
        assert!(err.to_string().contains("outside 0..=4"), "{err}");
        assert_eq!(cache.to_cpu_storage().unwrap(), before);
        cache.write_slice_at(1, &position(&exec, 0), &token).unwrap();
        assert_eq!(last_event(&exec).bytes_moved, 8);
    }
}

#[test]
fn write_into_at_checks_its_bounds_before_any_device_sees_them() {
    let (exec, plugin) = exec_with(traced(0), FaultyBackend::new().refuse_op("write_into_at"));
    let mut dst = exec
        .upload(CpuStorage::zeros(DType::F32, 12).as_host(), PLUGIN)
        .unwrap();
    let src = Operand {
        buffer: exec
            .upload(CpuStorage::from_vec(vec![1f32, 2.0]).as_host(), PLUGIN)
            .unwrap(),
        layout: Layout::contiguous([2]),
    };
    let pos = |v: i64| Operand {
        buffer: exec.upload(CpuStorage::from_vec(vec![v]).as_host(), PLUGIN).unwrap(),
        layout: Layout::contiguous([1]),
    };
    let region = Layout::contiguous([2]);
    // Positions 0..=5 in steps of 2 reach element 11: inside. One more
    // position would reach past the 12 elements, whatever `pos` holds.
    exec.write_into_at(&mut dst, &region, 2, 5, &pos(5), &src).unwrap();
    let downloads = plugin.downloads();
    let err = exec.write_into_at(&mut dst, &region, 2, 6, &pos(0), &src).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument { message, .. } if message.contains("reaches past")),
        "{err}"
    );
    // A position that is not one integer element.
    let floats = Operand {
        buffer: exec.upload(CpuStorage::from_vec(vec![0f32]).as_host(), PLUGIN).unwrap(),
        layout: Layout::contiguous([1]),
    };
    let two = Operand {
        buffer: exec
            .upload(CpuStorage::from_vec(vec![0i32, 1]).as_host(), PLUGIN)
            .unwrap(),
        layout: Layout::contiguous([2]),
    };
    for bad in [&floats, &two] {
        let err = exec.write_into_at(&mut dst, &region, 2, 5, bad, &src).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    }
    // Refused before the position was read (the fallback downloads it).
    assert_eq!(plugin.downloads(), downloads);
    let host = exec.download(&dst).unwrap();
    let mut want = [0f32; 12];
    want[10..].copy_from_slice(&[1.0, 2.0]);
    assert_eq!(host.as_slice::<f32>().unwrap(), &want[..]);
}

#[test]
fn a_scalar_goes_to_the_device_once_per_value() {
    let (exec, plugin) = exec_with(traced(0), FaultyBackend::new());
    let a = arange_f32(&exec, &[2, 3]).to_device(PLUGIN).unwrap();
    assert_eq!(plugin.uploads(), 1);
    let x = a.mul_scalar(0.5).unwrap();
    assert_eq!(x.device(), PLUGIN);
    assert_eq!(plugin.uploads(), 2, "the scalar is uploaded the first time");
    let y = x.mul_scalar(0.5).unwrap().add_scalar(1.0).unwrap();
    assert_eq!(plugin.uploads(), 3, "0.5 is on the device already; 1.0 is new");
    let z = y.mul_scalar(0.5).unwrap().add_scalar(1.0).unwrap();
    assert_eq!(plugin.uploads(), 3, "both scalars are reused");
    // The shared scalars are read, never written: results stay right.
    let want: Vec<f32> = (0..6)
        .map(|i| ((i as f32 * 0.5 - 3.0) * 0.25 + 1.0) * 0.5 + 1.0)
        .collect();
    assert_eq!(z.to_vec::<f32>().unwrap(), want);
    // Another dtype is another scalar.
    let h = a.to_dtype(DType::F16).unwrap().mul_scalar(0.5).unwrap();
    assert_eq!(h.dtype(), DType::F16);
    assert_eq!(plugin.uploads(), 4);
}
