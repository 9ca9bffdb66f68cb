//! Devices, what they can do, and what this machine has.

use crate::dtype::DType;
use crate::op::OpClass;
use std::fmt;

/// A place where tensors live and ops run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    Cpu,
    Cuda(usize),
    Metal(usize),
    Vulkan(usize),
    /// A wgpu adapter, whichever API it drives (Vulkan, Metal, DX12: its
    /// capability's `api` says).
    Wgpu(usize),
    OpenCl(usize),
    CoreMl(usize),
    /// A backend registered from outside this workspace (or by a test).
    Plugin(usize),
}

impl Device {
    pub fn is_cpu(self) -> bool {
        self == Device::Cpu
    }

    /// Parses `cpu`, `cuda`, `cuda:1`, `metal:0`, `vulkan`, `wgpu:1`, `opencl`, `coreml`.
    pub fn parse(s: &str) -> Option<Device> {
        let s = s.trim().to_ascii_lowercase();
        let (kind, idx) = match s.split_once(':') {
            Some((k, i)) => (k.to_string(), i.parse().ok()?),
            None => (s, 0),
        };
        Some(match kind.as_str() {
            "cpu" => Device::Cpu,
            "cuda" => Device::Cuda(idx),
            "metal" => Device::Metal(idx),
            "vulkan" => Device::Vulkan(idx),
            "wgpu" => Device::Wgpu(idx),
            "opencl" => Device::OpenCl(idx),
            "coreml" => Device::CoreMl(idx),
            "plugin" => Device::Plugin(idx),
            _ => return None,
        })
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
            Device::Metal(i) => write!(f, "metal:{i}"),
            Device::Vulkan(i) => write!(f, "vulkan:{i}"),
            Device::Wgpu(i) => write!(f, "wgpu:{i}"),
            Device::OpenCl(i) => write!(f, "opencl:{i}"),
            Device::CoreMl(i) => write!(f, "coreml:{i}"),
            Device::Plugin(i) => write!(f, "plugin:{i}"),
        }
    }
}

/// What a device can do, as its backend reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceCapability {
    pub name: String,
    pub dtypes: Vec<DType>,
    pub op_classes: Vec<OpClass>,
    /// Total memory in bytes, when known.
    pub total_memory: Option<u64>,
    /// Free memory in bytes, when known.
    pub free_memory: Option<u64>,
    /// The graphics or compute API the device is driven through, where that
    /// is not the device kind itself (a wgpu adapter: `Vulkan`, `Metal`,
    /// `DX12`, `GL`).
    pub api: Option<String>,
    /// Free-form facts worth showing a user (CPU features, compute capability).
    pub features: Vec<String>,
}

impl DeviceCapability {
    pub fn supports_dtype(&self, dtype: DType) -> bool {
        self.dtypes.contains(&dtype)
    }
    pub fn supports_class(&self, class: OpClass) -> bool {
        self.op_classes.contains(&class)
    }
}

/// Total and available system memory in bytes, from /proc/meminfo when present.
pub fn system_memory() -> (Option<u64>, Option<u64>) {
    let Ok(s) = std::fs::read_to_string("/proc/meminfo") else {
        return (None, None);
    };
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    (field("MemTotal:"), field("MemAvailable:"))
}
