//! Typed errors. Each names the op, the shapes, dtypes and devices involved.

use crate::device::Device;
use crate::dtype::DType;
use crate::shape::Shape;

/// What a backend reports when it cannot run an op.
///
/// The executor falls back to the next device on `Unsupported`,
/// `OutOfMemory`, `Device` and `DeviceLost`; `InvalidInput` is the caller's
/// fault and is returned as is, since another device would reject it as
/// well. `DeviceLost` also takes the device out of routing for good.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum BackendError {
    #[error("{device} does not support {op}: {reason}")]
    Unsupported { device: Device, op: String, reason: String },
    #[error("{device} is out of memory (asked for {requested_bytes} bytes)")]
    OutOfMemory { device: Device, requested_bytes: usize },
    #[error("{device} failed: {message}")]
    Device { device: Device, message: String },
    /// The device can run nothing more: a fault that surfaced after the
    /// call that caused it (a kernel's illegal address, found at the next
    /// synchronization), or a device that is gone. Its buffers are lost.
    #[error("{device} is lost: {message}")]
    DeviceLost { device: Device, message: String },
    #[error("invalid input to {op}: {message}")]
    InvalidInput { op: String, message: String },
}

impl BackendError {
    /// Whether another device may succeed where this one failed.
    pub fn allows_fallback(&self) -> bool {
        !matches!(self, BackendError::InvalidInput { .. })
    }

    /// The device this error takes out of routing, when it is `DeviceLost`.
    pub fn lost_device(&self) -> Option<Device> {
        match self {
            BackendError::DeviceLost { device, .. } => Some(*device),
            _ => None,
        }
    }

    pub fn unsupported(device: Device, op: impl Into<String>, reason: impl Into<String>) -> Self {
        BackendError::Unsupported {
            device,
            op: op.into(),
            reason: reason.into(),
        }
    }

    pub fn invalid(op: impl Into<String>, message: impl Into<String>) -> Self {
        BackendError::InvalidInput {
            op: op.into(),
            message: message.into(),
        }
    }
}

/// Every error the library returns.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum Error {
    #[error("{op}: shape error: {message} (shapes: {})", fmt_shapes(.shapes))]
    Shape {
        op: String,
        message: String,
        shapes: Vec<Shape>,
    },
    #[error("{op}: dtype error: {message} (dtypes: {})", fmt_list(.dtypes))]
    DType {
        op: String,
        message: String,
        dtypes: Vec<DType>,
    },
    #[error("{op}: dimension {dim} out of range for a tensor of rank {rank}")]
    DimOutOfRange { op: String, dim: isize, rank: usize },
    #[error("{op}: invalid argument: {message}")]
    InvalidArgument { op: String, message: String },
    #[error("{op}: inputs live on different devices: {}", fmt_list(.devices))]
    DeviceMismatch { op: String, devices: Vec<Device> },
    #[error("device {device} is not available: {reason}")]
    DeviceNotAvailable { device: Device, reason: String },
    #[error("{op} on {device}: {source}")]
    Backend {
        op: String,
        device: Device,
        #[source]
        source: BackendError,
    },
    #[error("{op}: no device could run it: {}", fmt_attempts(.attempts))]
    NoDeviceCouldRun {
        op: String,
        attempts: Vec<(Device, BackendError)>,
    },
    #[error("{0}")]
    Msg(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn shape(op: impl Into<String>, message: impl Into<String>, shapes: &[&Shape]) -> Self {
        Error::Shape {
            op: op.into(),
            message: message.into(),
            shapes: shapes.iter().map(|s| (*s).clone()).collect(),
        }
    }

    pub fn dtype(op: impl Into<String>, message: impl Into<String>, dtypes: &[DType]) -> Self {
        Error::DType {
            op: op.into(),
            message: message.into(),
            dtypes: dtypes.to_vec(),
        }
    }

    pub fn invalid(op: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            op: op.into(),
            message: message.into(),
        }
    }
}

fn fmt_list<T: std::fmt::Display>(items: &[T]) -> String {
    items.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
}

fn fmt_shapes(shapes: &[Shape]) -> String {
    fmt_list(shapes)
}

fn fmt_attempts(attempts: &[(Device, BackendError)]) -> String {
    attempts
        .iter()
        .map(|(d, e)| format!("[{d}: {e}]"))
        .collect::<Vec<_>>()
        .join(" ")
}
