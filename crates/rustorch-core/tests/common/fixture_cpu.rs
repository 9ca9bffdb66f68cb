//! The CPU llama.cpp fixtures were written on, against the CPU running the tests.
//!
//! llama.cpp's CPU backend is compiled for the CPU at hand (-march=native), and what that CPU has
//! changes some of its results: AVX512-FP16 makes flash attention accumulate values in half
//! precision, AMX changes the order of quantized products, AVX512-BF16 the BF16 dot products, the
//! vector width the order of f32 sums. So a fixture is llama.cpp's answer on one kind of CPU, and
//! the generators record which (`cpu`: `arch`, `vendor`, `model`, `flags`, `kind`;
//! tools/cpu_record.py). [`kind`] sums up flags as that script does; where this CPU's kind differs
//! from a fixture's, the tests comparing with it check that RusTorch reproduces the fixture's build
//! (for a build without AVX512-FP16 or AMX, what RusTorch's library computes by default on every
//! CPU), not that it equals llama.cpp built on this CPU, and [`note_if_other_cpu`] says so
//! (tools/llamacpp_diff.py makes that comparison).
//!
//! Shared by the tests of rustorch-core, rustorch-llm and rustorch-cli (`#[path]` includes).
#![allow(dead_code)]

use serde_json::Value;
use std::io::Write;
use std::sync::Mutex;

/// The /proc/cpuinfo flags (Linux's spelling) that select llama.cpp CPU code paths on x86-64, in
/// tools/cpu_record.py's order.
pub const FLAGS: [&str; 14] = [
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx_vnni",
    "avx512vbmi",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
];

fn join(names: &[&str], last: &str) -> String {
    match names {
        [] => String::new(),
        [one] => one.to_string(),
        [head @ .., tail] => format!("{} {last} {tail}", head.join(", ")),
    }
}

/// What of `flags` changes llama.cpp's CPU results, as `kind` in tools/cpu_record.py (keep the
/// two in step): the vector width, and on AVX-512 CPUs AVX512-BF16, AVX512-FP16 and AMX (VNNI and
/// VBMI only speed up integer work whose results are exact).
pub fn kind(arch: &str, flags: &[&str]) -> String {
    if arch != "x86_64" {
        return format!("{arch} (only x86-64 CPUs are summarized)");
    }
    let has = |f: &str| flags.contains(&f);
    if !has("avx512f") {
        return match (has("avx2"), has("fma")) {
            (true, true) => "x86-64 AVX2",
            (true, false) => "x86-64 AVX2 without FMA",
            _ => "x86-64 without AVX2",
        }
        .to_string();
    }
    let extras = [
        ("AVX512-BF16", has("avx512_bf16")),
        ("AVX512-FP16", has("avx512_fp16")),
        ("AMX", has("amx_tile") && has("amx_int8")),
    ];
    let with: Vec<&str> = extras.iter().filter(|e| e.1).map(|e| e.0).collect();
    let without: Vec<&str> = extras.iter().filter(|e| !e.1).map(|e| e.0).collect();
    let mut s = "x86-64 AVX-512".to_string();
    if !with.is_empty() {
        s += &format!(" with {}", join(&with, "and"));
    }
    if !without.is_empty() {
        s += &format!(
            "{} without {}",
            if with.is_empty() { "" } else { "," },
            join(&without, "or")
        );
    }
    s
}

/// The flags of [`FLAGS`] this CPU has.
#[cfg(target_arch = "x86_64")]
pub fn this_cpu_flags() -> Vec<&'static str> {
    use std::arch::is_x86_feature_detected as has;
    // is_x86_feature_detected! cannot name AMX on stable Rust; CPUID leaf 7, sub-leaf 0, EDX
    // has it: bit 22 AMX-BF16, bit 24 AMX-TILE, bit 25 AMX-INT8.
    let leaf7_edx = if std::arch::x86_64::__cpuid(0).eax >= 7 {
        std::arch::x86_64::__cpuid_count(7, 0).edx
    } else {
        0
    };
    let amx = |bit: u32| (leaf7_edx >> bit) & 1 == 1;
    let detected = [
        has!("avx2"),
        has!("fma"),
        has!("f16c"),
        has!("avx512f"),
        has!("avx512bw"),
        has!("avx512vl"),
        has!("avx512vnni"),
        has!("avxvnni"),
        has!("avx512vbmi"),
        has!("avx512bf16"),
        has!("avx512fp16"),
        amx(24),
        amx(25),
        amx(22),
    ];
    FLAGS
        .iter()
        .zip(detected)
        .filter(|(_, on)| *on)
        .map(|(f, _)| *f)
        .collect()
}

/// The flags of [`FLAGS`] this CPU has (none: they are x86-64 flags).
#[cfg(not(target_arch = "x86_64"))]
pub fn this_cpu_flags() -> Vec<&'static str> {
    Vec::new()
}

/// This CPU's kind, as tools/cpu_record.py would record it.
pub fn this_cpu_kind() -> String {
    kind(std::env::consts::ARCH, &this_cpu_flags())
}

/// The `(model, kind)` of a fixture's `cpu` record, after checking the record: every field
/// present, only known flags, and a kind that follows from the flags as [`kind`] sums them up
/// (so the Python and Rust summaries cannot drift apart unnoticed).
pub fn check_record(what: &str, cpu: &Value) -> (String, String) {
    let text = |key: &str| {
        cpu[key]
            .as_str()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| panic!("{what}: the `cpu` record has no {key:?} (tools/cpu_record.py): {cpu}"))
            .to_string()
    };
    let flags: Vec<&str> = cpu["flags"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: the `cpu` record has no flags: {cpu}"))
        .iter()
        .map(|f| f.as_str().expect("flags are strings"))
        .collect();
    for f in &flags {
        assert!(FLAGS.contains(f), "{what}: unknown flag {f:?} in the `cpu` record");
    }
    let (model, recorded) = (text("model"), text("kind"));
    text("vendor");
    assert_eq!(
        recorded,
        kind(&text("arch"), &flags),
        "{what}: the recorded kind does not follow from the recorded flags"
    );
    (model, recorded)
}

/// Checks `cpu`, the record of the fixtures `what` names (for example "rustorch-llm's llama.cpp
/// fixtures"), and when this CPU is of another kind prints, once per process, that the tests check
/// RusTorch's reproduction of that build rather than identity with llama.cpp built on this CPU.
pub fn note_if_other_cpu(what: &str, cpu: &Value) {
    let (model, theirs) = check_record(what, cpu);
    let ours = this_cpu_kind();
    if ours == theirs {
        return;
    }
    let note = format!(
        "note: {what} were written by llama.cpp on {model} ({theirs}); this CPU is {ours}. These tests \
         check that RusTorch reproduces that build, not that it equals llama.cpp built on this CPU \
         (tools/llamacpp_diff.py compares with that)."
    );
    static NOTED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut noted = NOTED.lock().unwrap_or_else(|e| e.into_inner());
    if noted.contains(&note) {
        return;
    }
    // Straight to the process's stderr: the harness keeps eprintln! output of passing tests to
    // itself, and this note qualifies what a pass means.
    let _ = writeln!(std::io::stderr(), "{note}");
    noted.push(note);
}

/// Whether llama.cpp's build on this CPU sums bf16 products in the order of the build that wrote
/// the fixtures `cpu` records: `vdpbf16ps` pairs where the CPU has AVX-512 BF16, f32 lanes where
/// not (rustorch-cpu's ggml/bf16dot.rs follows this CPU's build, as llama.cpp built here would).
/// Where the orders differ, a BF16 fixture's bits cannot be this CPU's: the callers say so in one
/// line and check the other types.
pub fn same_bf16_order(cpu: &Value) -> bool {
    let dp = |flags: &[&str]| flags.contains(&"avx512f") && flags.contains(&"avx512_bf16");
    let theirs: Vec<&str> = cpu["flags"]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f.as_str()).collect())
        .unwrap_or_default();
    dp(&theirs) == dp(&this_cpu_flags())
}

/// Prints, once per process, that `what`'s BF16 fixtures are not checked on this CPU.
pub fn note_bf16_order_differs(what: &str) {
    use std::sync::Once;
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = writeln!(
            std::io::stderr(),
            "note: {what}: BF16 fixtures skipped: llama.cpp's build that wrote them sums bf16 in another \
             order (vdpbf16ps with AVX-512 BF16, f32 lanes without) than its build for this CPU, which \
             RusTorch follows (rustorch-cpu's bf16dot tests check both orders)"
        );
    });
}
