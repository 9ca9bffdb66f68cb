//! `Tensor`: shared storage + layout, tied to the executor that runs its ops.
//!
//! The API follows PyTorch's names. Each op family lives in its own file:
//! creation, views, elementwise math, reductions, linear algebra, indexing,
//! and neural-network ops.

mod conv;
mod create;
mod elementwise;
mod index;
mod inplace;
mod linalg;
mod nn;
mod quant;
mod reduce;
mod view;

use crate::backend::Buffer;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::executor::{Executor, Operand};
use crate::layout::Layout;
use crate::op::Op;
use crate::shape::Shape;
use crate::storage::{CpuStorage, StorageElement};
pub use nn::FlashPaths;
pub use quant::QWeight;
use std::fmt;
use std::sync::Arc;

/// An n-dimensional array. Cloning is cheap: clones and views share storage.
#[derive(Clone)]
pub struct Tensor {
    buffer: Buffer,
    layout: Layout,
    exec: Arc<Executor>,
}

impl Tensor {
    pub(crate) fn from_parts(buffer: Buffer, layout: Layout, exec: Arc<Executor>) -> Tensor {
        Tensor { buffer, layout, exec }
    }

    /// A tensor with the same storage and executor but another layout.
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor {
            buffer: self.buffer.clone(),
            layout,
            exec: self.exec.clone(),
        }
    }

    pub fn shape(&self) -> &Shape {
        self.layout.shape()
    }
    pub fn dims(&self) -> &[usize] {
        self.layout.dims()
    }
    pub fn rank(&self) -> usize {
        self.layout.rank()
    }
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }
    pub fn dtype(&self) -> DType {
        self.buffer.dtype()
    }
    pub fn device(&self) -> Device {
        self.buffer.device()
    }
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    pub fn strides(&self) -> &[usize] {
        self.layout.strides()
    }
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }
    pub fn executor(&self) -> &Arc<Executor> {
        &self.exec
    }
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    /// Size of one dimension; negative indices count from the end.
    pub fn size(&self, dim: isize) -> Result<usize> {
        self.shape().size("size", dim)
    }

    pub(crate) fn operand(&self) -> Operand {
        Operand {
            buffer: self.buffer.clone(),
            layout: self.layout.clone(),
        }
    }

    /// Runs an op through this tensor's executor.
    pub(crate) fn run_op(&self, op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let ops: Vec<Operand> = inputs.iter().map(|t| t.operand()).collect();
        let outs = self.exec.execute(op, &ops)?;
        Ok(outs
            .into_iter()
            .map(|(buf, meta)| Tensor::from_parts(buf, Layout::contiguous(meta.shape), self.exec.clone()))
            .collect())
    }

    /// Runs a single-output op.
    pub(crate) fn run1(&self, op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
        let mut v = self.run_op(op, inputs)?;
        v.pop()
            .ok_or_else(|| Error::invalid(op.name(), "op produced no output"))
    }

    /// The elements, row-major, as host storage.
    pub fn to_cpu_storage(&self) -> Result<CpuStorage> {
        let t = self.to_device(Device::Cpu)?.contiguous()?;
        let host = t.exec.download(&t.buffer)?;
        let r = t.layout.contiguous_range().unwrap_or(0..0);
        if r.start == 0 && r.end == host.len() {
            return Ok(host);
        }
        Ok(crate::with_cpu_storage!(&host, v, T => CpuStorage::from_vec(v[r].to_vec())))
    }

    /// The elements, row-major, as a `Vec<T>`; `T` must match the dtype.
    pub fn to_vec<T: StorageElement>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::dtype(
                "to_vec",
                format!(
                    "asked for {} elements from a {} tensor (use to_dtype first)",
                    T::DTYPE,
                    self.dtype()
                ),
                &[T::DTYPE, self.dtype()],
            ));
        }
        let s = self.to_cpu_storage()?;
        Ok(T::slice(&s).map(|v| v.to_vec()).unwrap_or_default())
    }

    /// Elements converted to f64 (complex: real part), whatever the dtype.
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        Ok(self.to_cpu_storage()?.to_f64_vec())
    }

    /// The value of a one-element tensor.
    pub fn to_scalar<T: StorageElement>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(Error::shape("to_scalar", "needs exactly one element", &[self.shape()]));
        }
        Ok(self.to_vec::<T>()?[0])
    }

    /// The same data on another device (shares storage when already there).
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if self.device() == device {
            return Ok(self.clone());
        }
        let buffer = self.exec.transfer(&self.buffer, device)?;
        Ok(Tensor::from_parts(buffer, self.layout.clone(), self.exec.clone()))
    }

    /// Converts every element to `dtype` (a cheap clone when it already is).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        self.run1(&Op::Cast { to: dtype }, &[self])
    }

    /// A contiguous tensor with these elements; copies only when needed.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        self.run1(&Op::Copy, &[self])
    }

    /// A new tensor with its own copy of the elements.
    pub fn copy(&self) -> Result<Tensor> {
        self.run1(&Op::Copy, &[self])
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor[{}, {}, {}]", self.shape(), self.dtype(), self.device())
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{self:?}")?;
        match self.to_f64_vec() {
            Ok(v) => {
                let shown: Vec<String> = v.iter().take(32).map(|x| format!("{x:.4}")).collect();
                write!(f, "[{}{}]", shown.join(", "), if v.len() > 32 { ", ..." } else { "" })
            }
            Err(e) => write!(f, "<unreadable: {e}>"),
        }
    }
}
