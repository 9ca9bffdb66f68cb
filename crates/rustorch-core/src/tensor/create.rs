//! Creating tensors: from data, filled, ranges, identity, random.
//!
//! Creation happens in host memory under the default executor
//! (`Executor::global()`); move the result with `to_device` or rebind it to
//! another executor with `with_executor`.

use super::Tensor;
use crate::device::Device;
use crate::dtype::{DType, Scalar, C64};
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::layout::Layout;
use crate::rng::Rng;
use crate::shape::Shape;
use crate::storage::{CpuStorage, StorageElement};
use std::sync::Arc;

impl Tensor {
    /// A tensor over host storage, under the default executor.
    pub fn from_storage(storage: CpuStorage, shape: impl Into<Shape>) -> Result<Tensor> {
        Self::from_storage_in(&Executor::global(), storage, shape)
    }

    /// A tensor over host storage, under the given executor.
    pub fn from_storage_in(exec: &Arc<Executor>, storage: CpuStorage, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if shape.numel() != storage.len() {
            return Err(Error::shape(
                "from_vec",
                format!(
                    "{} elements do not fill a tensor of {} elements",
                    storage.len(),
                    shape.numel()
                ),
                &[&shape],
            ));
        }
        Ok(Tensor::from_parts(
            Arc::new(storage),
            Layout::contiguous(shape),
            exec.clone(),
        ))
    }

    pub fn from_vec<T: StorageElement>(data: Vec<T>, shape: impl Into<Shape>) -> Result<Tensor> {
        Self::from_storage(CpuStorage::from_vec(data), shape)
    }

    pub fn from_slice<T: StorageElement>(data: &[T], shape: impl Into<Shape>) -> Result<Tensor> {
        Self::from_vec(data.to_vec(), shape)
    }

    /// A 0-dimensional tensor holding one value.
    pub fn scalar<T: StorageElement>(value: T) -> Tensor {
        Tensor::from_parts(
            Arc::new(CpuStorage::from_vec(vec![value])),
            Layout::contiguous(Shape::scalar()),
            Executor::global(),
        )
    }

    /// The same tensor, running its ops through another executor.
    pub fn with_executor(&self, exec: &Arc<Executor>) -> Result<Tensor> {
        if exec.backend(self.device()).is_none() {
            return Err(Error::DeviceNotAvailable {
                device: self.device(),
                reason: "the target executor has no backend for this tensor's device".into(),
            });
        }
        Ok(Tensor::from_parts(
            self.buffer.clone(),
            self.layout.clone(),
            exec.clone(),
        ))
    }

    pub fn full(shape: impl Into<Shape>, value: impl Into<Scalar>, dtype: DType) -> Result<Tensor> {
        let shape = shape.into();
        let n = checked_numel("full", &shape, dtype)?;
        let storage = match value.into() {
            Scalar::Complex(re, im) if dtype == DType::C64 => CpuStorage::C64(vec![C64::new(re, im); n]),
            Scalar::Int(i) if dtype == DType::I64 => CpuStorage::I64(vec![i; n]),
            v => CpuStorage::from_f64_iter(dtype, std::iter::repeat_n(v.to_f64(), n)),
        };
        Self::from_storage(storage, shape)
    }

    pub fn zeros(shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        let shape = shape.into();
        let n = checked_numel("zeros", &shape, dtype)?;
        Self::from_storage(CpuStorage::zeros(dtype, n), shape)
    }

    pub fn ones(shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        Self::full(shape, 1.0, dtype)
    }

    pub fn zeros_like(&self) -> Result<Tensor> {
        self.filled_like(Scalar::Float(0.0))
    }

    pub fn ones_like(&self) -> Result<Tensor> {
        self.filled_like(Scalar::Float(1.0))
    }

    pub fn full_like(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        self.filled_like(value.into())
    }

    fn filled_like(&self, value: Scalar) -> Result<Tensor> {
        Tensor::full(self.shape().clone(), value, self.dtype())?
            .with_executor(&self.exec)?
            .to_device(self.device())
    }

    /// Values `start, start + step, ...` below `end` (above, for a negative step).
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType) -> Result<Tensor> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            return Err(Error::invalid(
                "arange",
                format!("bad range {start}..{end} step {step}"),
            ));
        }
        let n = ((end - start) / step).ceil();
        if n > (usize::MAX >> 4) as f64 {
            return Err(Error::invalid("arange", "range too large"));
        }
        let n = n.max(0.0) as usize;
        let it = (0..n).map(|i| start + i as f64 * step);
        Self::from_storage(CpuStorage::from_f64_iter(dtype, it), Shape::from([n]))
    }

    /// `steps` values evenly spaced from `start` to `end` inclusive, computed
    /// from both ends as PyTorch does so the last value is exactly `end`.
    pub fn linspace(start: f64, end: f64, steps: usize, dtype: DType) -> Result<Tensor> {
        let step = if steps > 1 {
            (end - start) / (steps - 1) as f64
        } else {
            0.0
        };
        let half = steps / 2;
        let it = (0..steps).map(|i| {
            if i < half || steps == 1 {
                start + step * i as f64
            } else {
                end - step * (steps - 1 - i) as f64
            }
        });
        Self::from_storage(CpuStorage::from_f64_iter(dtype, it), Shape::from([steps]))
    }

    /// The n x n identity matrix.
    pub fn eye(n: usize, dtype: DType) -> Result<Tensor> {
        checked_numel("eye", &Shape::from([n, n]), dtype)?;
        let it = (0..n * n).map(|i| if i / n == i % n { 1.0 } else { 0.0 });
        Self::from_storage(CpuStorage::from_f64_iter(dtype, it), Shape::from([n, n]))
    }

    /// Uniform values in [0, 1), reproducible for a given seed.
    pub fn rand(shape: impl Into<Shape>, dtype: DType, seed: u64) -> Result<Tensor> {
        let shape = shape.into();
        need_float("rand", dtype)?;
        checked_numel("rand", &shape, dtype)?;
        let mut rng = Rng::new(seed);
        let it = (0..shape.numel()).map(|_| rng.uniform());
        Self::from_storage(CpuStorage::from_f64_iter(dtype, it), shape)
    }

    /// Standard normal values, reproducible for a given seed.
    pub fn randn(shape: impl Into<Shape>, dtype: DType, seed: u64) -> Result<Tensor> {
        let shape = shape.into();
        need_float("randn", dtype)?;
        let n = checked_numel("randn", &shape, dtype)?;
        let mut rng = Rng::new(seed);
        let mut vals = Vec::with_capacity(n + 1);
        while vals.len() < n {
            let (a, b) = rng.normal_pair();
            vals.push(a);
            vals.push(b);
        }
        vals.truncate(n);
        Self::from_storage(CpuStorage::from_f64_iter(dtype, vals.into_iter()), shape)
    }

    /// Zeros made on `device` by its backend (`Backend::alloc_zeroed`),
    /// under the global executor.
    pub fn zeros_on(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        Self::zeros_in(&Executor::global(), shape, dtype, device)
    }

    /// Zeros made on `device` by `exec`'s backend for it: a KV cache or an
    /// accumulator is never built on the host and copied over.
    pub fn zeros_in(exec: &Arc<Executor>, shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        let shape = shape.into();
        let n = checked_numel("zeros", &shape, dtype)?;
        let buffer = exec.alloc_zeroed(device, dtype, n)?;
        Ok(Tensor::from_parts(buffer, Layout::contiguous(shape), exec.clone()))
    }

    /// A tensor on `device` whose values the host reads back without a
    /// device copy where the device allows it (`Backend::alloc_host_readable`:
    /// on a GPU, mapped host memory), zeros on another device; its values
    /// are unspecified until written (`write_slice`). For small results
    /// read after every step.
    pub fn host_readable_in(
        exec: &Arc<Executor>,
        shape: impl Into<Shape>,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let n = checked_numel("host_readable", &shape, dtype)?;
        let buffer = exec.alloc_host_readable(device, dtype, n)?;
        Ok(Tensor::from_parts(buffer, Layout::contiguous(shape), exec.clone()))
    }
}

/// The element count of a shape to allocate, or an error when the byte
/// size would overflow (the allocation itself then fails loudly on its own).
fn checked_numel(op: &str, shape: &Shape, dtype: DType) -> Result<usize> {
    shape
        .checked_numel()
        .filter(|n| {
            n.checked_mul(dtype.size_in_bytes())
                .is_some_and(|b| b <= isize::MAX as usize)
        })
        .ok_or_else(|| Error::shape(op, "the tensor would have more bytes than memory can address", &[shape]))
}

fn need_float(op: &str, dtype: DType) -> Result<()> {
    if !dtype.is_float() {
        return Err(Error::dtype(op, "random values need a floating dtype", &[dtype]));
    }
    Ok(())
}
