//! This machine's CPU as a user sees it: its name and SIMD features.

/// SIMD features of this CPU, detected at run time.
pub fn cpu_features() -> Vec<String> {
    #[allow(unused_mut)]
    let mut f: Vec<String> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($name:tt),*) => {
                $( if std::arch::is_x86_feature_detected!($name) { f.push($name.to_string()); } )*
            };
        }
        probe!(
            "sse4.2",
            "avx",
            "avx2",
            "fma",
            "f16c",
            "avx512f",
            "avx512bw",
            "avx512vl",
            "avx512vnni",
            "avx512bf16"
        );
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            f.push("neon".to_string());
        }
        if std::arch::is_aarch64_feature_detected!("fp16") {
            f.push("fp16".to_string());
        }
    }
    f
}

/// Name of the CPU model, best effort.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}
