//! CUDA errors as the executor's `BackendError`s.

use cudarc::driver::sys::CUresult;
use cudarc::driver::DriverError;
use rustorch_core::{BackendError, Device};

/// Maps a driver error: out of memory lets the executor fall back; the
/// errors after which a CUDA context is unusable (a kernel's illegal
/// address, a launch failure, ECC, a lost device) mean the device is lost;
/// the rest are plain device errors.
pub(crate) fn driver(device: Device, what: &str, e: DriverError, bytes: usize) -> BackendError {
    use CUresult::*;
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let text = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let message = format!("{what}: {name} ({text})");
    match e.0 {
        CUDA_ERROR_OUT_OF_MEMORY => BackendError::OutOfMemory {
            device,
            requested_bytes: bytes,
        },
        CUDA_ERROR_ILLEGAL_ADDRESS
        | CUDA_ERROR_LAUNCH_FAILED
        | CUDA_ERROR_HARDWARE_STACK_ERROR
        | CUDA_ERROR_ILLEGAL_INSTRUCTION
        | CUDA_ERROR_MISALIGNED_ADDRESS
        | CUDA_ERROR_INVALID_ADDRESS_SPACE
        | CUDA_ERROR_INVALID_PC
        | CUDA_ERROR_ECC_UNCORRECTABLE
        | CUDA_ERROR_ASSERT
        | CUDA_ERROR_DEVICE_UNAVAILABLE
        | CUDA_ERROR_CONTEXT_IS_DESTROYED
        | CUDA_ERROR_LAUNCH_TIMEOUT => BackendError::DeviceLost { device, message },
        _ => BackendError::Device { device, message },
    }
}
