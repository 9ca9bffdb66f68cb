//! Explicit executor configuration, with environment overrides.

use super::profile::ProfileMode;
use crate::device::Device;
use crate::error::{Error, Result};

/// How an `Executor` routes ops. Build one by hand, or start from
/// `ExecutorConfig::from_env()`, which reads:
///
/// - `RUSTORCH_DEVICE=cpu|cuda[:N]|metal[:N]|vulkan[:N]|wgpu[:N]|opencl[:N]`: try this device first.
/// - `RUSTORCH_DISABLE_GPU=1`: register no device but the CPU.
/// - `RUSTORCH_TRACE=1`: record every routing decision and print it to stderr as it happens.
/// - `RUSTORCH_PROFILE=1|shapes`: sum each op's execution time, per op (or per op and input
///   shapes), printed nowhere until asked (`Executor::profile_table`).
/// - `RUSTORCH_MIN_OFFLOAD=N`: ops with fewer output elements stay on the CPU
///   unless their inputs already live on an accelerator.
/// - `RUSTORCH_STRICT=1`: no fallback (see `strict`).
#[derive(Clone, Debug, PartialEq)]
pub struct ExecutorConfig {
    /// Device tried first for every op (fallback still applies).
    pub preferred_device: Option<Device>,
    /// Keep every accelerator out, even when registered.
    pub disable_gpu: bool,
    /// Record a trace event per op.
    pub trace: bool,
    /// Also print each trace event to stderr as it happens.
    pub print_trace: bool,
    /// Sum each op's execution time (`Executor::profile`).
    pub profile: ProfileMode,
    /// Output elements below which the CPU wins over an accelerator that
    /// would first need the inputs copied to it.
    pub min_offload_elems: usize,
    /// No fallback: every op runs on the preferred device (or, without
    /// one, its first candidate) or fails, saying why. For tests that must
    /// prove a backend ran each op, and for users who would rather see an
    /// error than a silent move to another device.
    pub strict: bool,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            preferred_device: None,
            disable_gpu: false,
            trace: false,
            print_trace: false,
            profile: ProfileMode::Off,
            min_offload_elems: 4096,
            strict: false,
        }
    }
}

impl ExecutorConfig {
    /// Defaults, overridden by the `RUSTORCH_*` environment variables.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// Same as `from_env`, reading variables through `get` (testable).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut c = ExecutorConfig::default();
        if let Some(v) = get("RUSTORCH_DEVICE").filter(|v| !v.is_empty() && v != "auto") {
            c.preferred_device = Some(Device::parse(&v).ok_or_else(|| {
                Error::invalid(
                    "RUSTORCH_DEVICE",
                    format!("unknown device {v:?}; expected cpu, cuda[:N], metal[:N], vulkan[:N], wgpu[:N], opencl[:N] or auto"),
                )
            })?);
        }
        c.disable_gpu = flag(&get, "RUSTORCH_DISABLE_GPU")?;
        c.strict = flag(&get, "RUSTORCH_STRICT")?;
        let trace = flag(&get, "RUSTORCH_TRACE")?;
        c.trace = trace;
        c.print_trace = trace;
        if let Some(v) = get("RUSTORCH_PROFILE") {
            c.profile = ProfileMode::parse(&v)
                .ok_or_else(|| Error::invalid("RUSTORCH_PROFILE", format!("expected 1, shapes or 0, got {v:?}")))?;
        }
        if let Some(v) = get("RUSTORCH_MIN_OFFLOAD") {
            c.min_offload_elems = v.trim().parse().map_err(|_| {
                Error::invalid(
                    "RUSTORCH_MIN_OFFLOAD",
                    format!("expected a number of elements, got {v:?}"),
                )
            })?;
        }
        Ok(c)
    }
}

fn flag(get: &impl Fn(&str) -> Option<String>, name: &str) -> Result<bool> {
    match get(name).as_deref().map(str::trim) {
        None | Some("") | Some("0") | Some("false") | Some("no") | Some("off") => Ok(false),
        Some("1") | Some("true") | Some("yes") | Some("on") => Ok(true),
        Some(v) => Err(Error::invalid(name, format!("expected 1 or 0, got {v:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn reads_environment() {
        let c = ExecutorConfig::from_vars(vars(&[
            ("RUSTORCH_DEVICE", "cuda:1"),
            ("RUSTORCH_DISABLE_GPU", "1"),
            ("RUSTORCH_TRACE", "1"),
            ("RUSTORCH_PROFILE", "shapes"),
        ]))
        .unwrap();
        assert_eq!(c.preferred_device, Some(Device::Cuda(1)));
        assert!(c.disable_gpu && c.trace);
        assert_eq!(c.profile, ProfileMode::Shapes);
    }

    #[test]
    fn rejects_bad_values() {
        assert!(ExecutorConfig::from_vars(vars(&[("RUSTORCH_DEVICE", "tpu")])).is_err());
        assert!(ExecutorConfig::from_vars(vars(&[("RUSTORCH_TRACE", "maybe")])).is_err());
        assert!(ExecutorConfig::from_vars(vars(&[("RUSTORCH_PROFILE", "all")])).is_err());
    }
}
