//! Per-layer placement (`Placement`, what `--gpu-layers` sets): layers,
//! their KV cache and the output on a second device, the rest on the CPU,
//! with activations moved at each boundary by the executor.
//!
//! The second device is the conformance suite's `FaultyBackend` with no
//! faults: a separate device that owns its buffers (every move between it
//! and the CPU is a real download and upload) and computes with the CPU
//! kernels, so any placement must give the all-CPU model's bits exactly.
//! A GPU backend runs the same placements and is compared by KL divergence
//! instead (issue 33).

#[path = "common/llamacpp.rs"]
mod llamacpp;

use rustorch::{Backend, Device, Executor, ExecutorConfig};
use rustorch_conformance::FaultyBackend;
use rustorch_llm::model::{Logits, Model, Placement};
use std::sync::Arc;

const PLUGIN: Device = Device::Plugin(0);

/// Logits of a prompt and of three greedy steps after it.
fn run(model: &Model) -> Vec<Vec<f32>> {
    let prompt = model.tokenizer().encode("The capital of France is", true, true);
    let mut cache = model.new_flash_cache(64).unwrap();
    model.run_pass(|| {
        let mut out = vec![model
            .forward(&mut cache, &prompt, Logits::Last)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()];
        for _ in 0..3 {
            let next = rustorch_llm::model::argmax(out.last().unwrap());
            out.push(model.forward_last(&mut cache, &[next]).unwrap());
        }
        out
    })
}

#[test]
fn every_offload_split_gives_the_cpu_bits() {
    let path = llamacpp::model_path("smollm2-q4_k_m");
    let cpu = Model::load(&path).unwrap();
    let want = run(&cpu);
    let n_layer = cpu.config().n_layer;
    let plugin = Arc::new(FaultyBackend::new());
    let exec = Arc::new(
        Executor::with_backends(
            ExecutorConfig {
                trace: true,
                // Ops go to the second device only because their data is
                // there (no offloading of host data by size), so what runs
                // there is what the placement put there.
                min_offload_elems: usize::MAX,
                ..ExecutorConfig::default()
            },
            vec![plugin.clone() as Arc<dyn Backend>],
        )
        .unwrap(),
    );
    for n in [0, 1, n_layer / 2, n_layer, n_layer + 1] {
        let model = Model::load_placed(
            &path,
            &exec,
            |cfg| Placement::offload(PLUGIN, n, cfg.n_layer),
            |_, _| {},
        )
        .unwrap();
        assert_eq!(model.placement().offloaded_layers(), n.min(n_layer));
        let cache = model.new_flash_cache(16).unwrap();
        drop(cache);
        exec.clear_trace();
        let downloads = plugin.downloads();
        let got = run(&model);
        assert_eq!(got.len(), want.len());
        for (step, (g, w)) in got.iter().zip(&want).enumerate() {
            let differ = g.iter().zip(w).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(
                differ, 0,
                "-ngl {n}: {differ} logits of step {step} differ from the CPU's"
            );
        }
        let on_plugin = exec.trace().iter().filter(|e| e.device == PLUGIN).count();
        if n == 0 {
            assert_eq!(on_plugin, 0, "-ngl 0 runs nothing on the second device");
        } else {
            assert!(on_plugin > 0, "-ngl {n}: nothing ran on the second device");
            assert!(plugin.downloads() > downloads, "-ngl {n}: activations never came back");
        }
    }
}

#[test]
fn each_layers_cache_lives_with_the_layer() {
    let path = llamacpp::model_path("smollm2-q4_1");
    let exec = Arc::new(
        Executor::with_backends(
            ExecutorConfig::default(),
            vec![Arc::new(FaultyBackend::new()) as Arc<dyn Backend>],
        )
        .unwrap(),
    );
    let model = Model::load_placed(
        &path,
        &exec,
        |cfg| Placement::offload(PLUGIN, 4, cfg.n_layer),
        |_, _| {},
    )
    .unwrap();
    let n_layer = model.config().n_layer;
    let placement = model.placement().clone();
    assert_eq!(placement.layers[..n_layer - 4], vec![Device::Cpu; n_layer - 4][..]);
    assert_eq!(placement.layers[n_layer - 4..], vec![PLUGIN; 4][..]);
    assert_eq!(placement.output, Device::Cpu);
    let w = &model.weights().layers[n_layer - 1];
    assert_eq!(w.wq.data().device(), PLUGIN);
    assert_eq!(w.attn_norm.device(), PLUGIN);
    assert_eq!(model.weights().layers[0].wq.data().device(), Device::Cpu);
    assert_eq!(model.weights().tok_embd.data().device(), Device::Cpu);
    let cache = model.new_cache(32).unwrap();
    for (il, device) in placement.layers.iter().enumerate() {
        assert_eq!(cache.layer_device(il), Some(*device), "layer {il}'s cache");
    }
}

#[test]
fn a_placement_for_another_layer_count_is_an_error() {
    let path = llamacpp::model_path("smollm2-q4_1");
    let err = Model::load_placed(
        &path,
        &Executor::global(),
        |_| Placement::all_on(Device::Cpu, 3),
        |_, _| {},
    )
    .err()
    .expect("3 layers for a 30-layer model");
    assert!(err.to_string().contains("placement names 3 layers"), "{err}");
}

/// A device that runs out of memory in the middle of generation (within
/// the greedy steps after the prompt). The weights live there in its own
/// layout, so the products cannot fall back to the CPU: the step fails
/// with an error that says so (no panic, no hang), the steps before it
/// gave the all-CPU model's bits, and the KV cache keeps its length (the
/// failed token is not in it, so a retry or the next chat turn starts from
/// a consistent cache).
#[test]
fn out_of_memory_mid_generation_is_an_error_and_the_cache_stays_consistent() {
    let path = llamacpp::model_path("smollm2-q4_k_m");
    let want = run(&Model::load(&path).unwrap());
    let exec_with = |plugin: &Arc<FaultyBackend>| {
        Arc::new(
            Executor::with_backends(
                ExecutorConfig {
                    // Tracing also keeps decode steps op by op (no recorded
                    // steps), whose bits are the CPU's.
                    trace: true,
                    min_offload_elems: usize::MAX,
                    ..ExecutorConfig::default()
                },
                vec![plugin.clone() as Arc<dyn Backend>],
            )
            .unwrap(),
        )
    };
    let load = |exec: &Arc<Executor>| {
        Model::load_placed(
            &path,
            exec,
            |cfg| Placement::offload(PLUGIN, cfg.n_layer + 1, cfg.n_layer),
            |_, _| {},
        )
        .unwrap()
    };
    // The device's units of work for loading and for the prompt + 3 steps.
    let probe = Arc::new(FaultyBackend::new());
    let model = load(&exec_with(&probe));
    let loaded = probe.uploads() + probe.executes();
    run(&model);
    let whole = probe.uploads() + probe.executes() - loaded;
    drop(model);
    // Out of memory two thirds of the way through: within the third step.
    let plugin = Arc::new(FaultyBackend::new().oom_after(loaded + 2 * whole / 3));
    let model = load(&exec_with(&plugin));
    let prompt = model.tokenizer().encode("The capital of France is", true, true);
    let mut cache = model.new_flash_cache(64).unwrap();
    let (steps, err, len_before, len_after) = model.run_pass(|| {
        let mut steps = vec![model
            .forward(&mut cache, &prompt, Logits::Last)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()];
        loop {
            let next = rustorch_llm::model::argmax(steps.last().unwrap());
            let before = cache.len();
            match model.forward_last(&mut cache, &[next]) {
                Ok(l) => steps.push(l),
                Err(e) => return (steps, e.to_string(), before, cache.len()),
            }
            assert!(steps.len() <= want.len(), "the device never ran out of memory");
        }
    });
    assert!(err.contains("out of memory"), "the error does not say why: {err}");
    assert_eq!(len_after, len_before, "the failed step left a token in the cache");
    assert!(steps.len() >= 2, "the failure came before the steps: {err}");
    for (step, (g, w)) in steps.iter().zip(&want).enumerate() {
        let differ = g.iter().zip(w).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "{differ} logits of step {step} differ from the CPU's");
    }
}
