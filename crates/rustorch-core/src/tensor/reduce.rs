//! Reductions and ops along one dimension: sum, mean, max, min, prod,
//! argmax, argmin, var, std, softmax, log_softmax, cumsum, topk, sort.
//!
//! Dimensions may be negative (counted from the end). An empty list of
//! dims reduces over every dimension, like PyTorch's `sum()` without `dim`.
//! A 0-dimensional tensor accepts dim 0 or -1 where one dim is named, as
//! in PyTorch.

use super::Tensor;
use crate::error::{Error, Result};
use crate::op::{Op, ReduceOp};
use crate::shape::normalize_dim;

impl Tensor {
    /// Resolves a list of dims (empty = all), rejecting repeats.
    fn reduce_dims(&self, op: &str, dims: &[isize]) -> Result<Vec<usize>> {
        if dims.is_empty() {
            return Ok((0..self.rank()).collect());
        }
        if self.rank() == 0 {
            // A 0-d tensor has nothing to reduce but accepts dim 0 or -1.
            for &d in dims {
                normalize_dim(op, d, 1)?;
            }
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity(dims.len());
        for &d in dims {
            let d = self.shape().dim(op, d)?;
            if out.contains(&d) {
                return Err(Error::invalid(
                    op,
                    format!("dimension {d} appears more than once in {dims:?}"),
                ));
            }
            out.push(d);
        }
        Ok(out)
    }

    fn reduce(&self, op: ReduceOp, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let dims = self.reduce_dims(op.name(), dims)?;
        self.run1(&Op::Reduce { op, dims, keepdim }, &[self])
    }

    /// Runs a one-dim op; a 0-d tensor runs as shape [1] (dim 0 or -1)
    /// and its outputs get their 0-d shape back.
    fn along_dim(&self, name: &str, dim: isize, op: impl Fn(usize) -> Op) -> Result<Vec<Tensor>> {
        if self.rank() == 0 {
            normalize_dim(name, dim, 1)?;
            let one = self.reshape([1])?;
            let outs = one.run_op(&op(0), &[&one])?;
            return outs.iter().map(|t| t.reshape(())).collect();
        }
        let d = self.shape().dim(name, dim)?;
        self.run_op(&op(d), &[self])
    }

    fn along_dim1(&self, name: &str, dim: isize, op: impl Fn(usize) -> Op) -> Result<Tensor> {
        let mut outs = self.along_dim(name, dim, op)?;
        outs.pop().ok_or_else(|| Error::invalid(name, "op produced no output"))
    }

    fn along_dim2(&self, name: &str, dim: isize, op: impl Fn(usize) -> Op) -> Result<(Tensor, Tensor)> {
        let mut outs = self.along_dim(name, dim, op)?.into_iter();
        match (outs.next(), outs.next()) {
            (Some(a), Some(b)) => Ok((a, b)),
            _ => Err(Error::invalid(name, "op produced fewer than two outputs")),
        }
    }

    /// Sum over `dims` (all when empty). Bools and integers narrower than
    /// i64 sum into i64.
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, dims, keepdim)
    }

    /// Sum of every element, as a 0-d tensor.
    pub fn sum_all(&self) -> Result<Tensor> {
        self.sum(&[], false)
    }

    /// Mean over `dims` (all when empty); floating dtypes only.
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Mean, dims, keepdim)
    }

    pub fn mean_all(&self) -> Result<Tensor> {
        self.mean(&[], false)
    }

    /// Maximum over `dims` (all when empty), PyTorch's `amax`: NaN if any
    /// reduced element is NaN.
    pub fn max(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, dims, keepdim)
    }

    /// Minimum over `dims` (all when empty), PyTorch's `amin`.
    pub fn min(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, dims, keepdim)
    }

    pub fn max_all(&self) -> Result<Tensor> {
        self.max(&[], false)
    }

    pub fn min_all(&self) -> Result<Tensor> {
        self.min(&[], false)
    }

    /// Product over `dims` (all when empty); small integers multiply into i64.
    pub fn prod(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Prod, dims, keepdim)
    }

    /// Index (i64) of the first maximum along `dim`; NaN counts as the maximum.
    pub fn argmax(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.arg(ReduceOp::ArgMax, dim, keepdim)
    }

    /// Index (i64) of the first minimum along `dim`; NaN counts as the minimum.
    pub fn argmin(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.arg(ReduceOp::ArgMin, dim, keepdim)
    }

    fn arg(&self, op: ReduceOp, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.along_dim1(op.name(), dim, |d| Op::Reduce {
            op,
            dims: vec![d],
            keepdim,
        })
    }

    /// Variance over `dims` (all when empty), dividing by
    /// `max(0, n - correction)`; `correction = 1` is the unbiased estimate.
    pub fn var(&self, dims: &[isize], correction: u32, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Var { correction }, dims, keepdim)
    }

    /// Standard deviation: the square root of `var`.
    pub fn std(&self, dims: &[isize], correction: u32, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Std { correction }, dims, keepdim)
    }

    /// `exp(x) / sum(exp(x))` along `dim`, computed stably.
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        self.along_dim1("softmax", dim, |dim| Op::Softmax { dim })
    }

    /// `x - log(sum(exp(x)))` along `dim`, computed stably.
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        self.along_dim1("log_softmax", dim, |dim| Op::LogSoftmax { dim })
    }

    /// Running sums along `dim`; bools and small integers sum into i64.
    pub fn cumsum(&self, dim: isize) -> Result<Tensor> {
        self.along_dim1("cumsum", dim, |dim| Op::Cumsum { dim })
    }

    /// The `k` largest (or smallest) elements along `dim`, sorted, with
    /// their i64 indices. Among equal values the earlier index comes first.
    pub fn topk(&self, k: usize, dim: isize, largest: bool) -> Result<(Tensor, Tensor)> {
        self.along_dim2("topk", dim, |dim| Op::TopK { k, dim, largest })
    }

    /// Stable sort along `dim`, with the i64 indices of the sorted elements
    /// in the input. NaN sorts as the largest value.
    pub fn sort(&self, dim: isize, descending: bool) -> Result<(Tensor, Tensor)> {
        self.along_dim2("sort", dim, |dim| Op::Sort { dim, descending })
    }
}
