//! Indexing and joining: index_select, gather, scatter_add, embedding, cat
//! and stack.

use super::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::Op;

impl Tensor {
    /// The entries of `index` (a 1-D i64, i32 or u8 tensor; a scalar counts
    /// as one entry) along `dim`, in order, repeats allowed. An index that
    /// is negative or not below the dimension's size is an error.
    pub fn index_select(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        let d = self.shape().dim("index_select", dim)?;
        let index = if index.rank() == 0 {
            index.reshape([1])?
        } else {
            index.clone()
        };
        self.run1(&Op::IndexSelect { dim: d }, &[self, &index])
    }

    /// `out[i][j][k] = self[index[i][j][k]][j][k]` for `dim = 0` (and so on
    /// for other dims), as `torch.gather`. `index` has this tensor's rank and
    /// is no larger outside `dim`; the output has the index's shape.
    pub fn gather(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        let d = self.shape().dim("gather", dim)?;
        self.run1(&Op::Gather { dim: d }, &[self, index])
    }

    /// A copy of this tensor with `src[i][j][k]` added at
    /// `[index[i][j][k]][j][k]` for `dim = 0` (and so on), as the
    /// out-of-place `torch.scatter_add`. Repeated indices accumulate, in the
    /// index's row-major order; half types accumulate in f32.
    pub fn scatter_add(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        let d = self.shape().dim("scatter_add", dim)?;
        self.run1(&Op::ScatterAdd { dim: d }, &[self, index, src])
    }

    /// Looks up rows of this [vocab, dim] table: the output has the ids'
    /// shape plus a last dim of size `dim` (`torch.nn.functional.embedding`).
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        self.run1(&Op::Embedding, &[self, ids])
    }

    /// Concatenates along `dim` (negative counts from the end), as
    /// `torch.cat`: inputs are promoted to a common dtype, and 1-D empty
    /// tensors are skipped, as PyTorch still allows for legacy code.
    pub fn cat(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| Error::invalid("cat", "needs at least one tensor"))?;
        let dtype = tensors
            .iter()
            .skip(1)
            .fold(first.dtype(), |d, t| DType::promote(d, t.dtype()));
        // Only skip legacy empties when something else gives the rank.
        let keep: Vec<&Tensor> = if tensors.iter().any(|t| !is_legacy_empty(t)) {
            tensors.iter().copied().filter(|t| !is_legacy_empty(t)).collect()
        } else {
            tensors.to_vec()
        };
        let rank = keep[0].rank();
        let d = crate::shape::normalize_dim("cat", dim, rank)?;
        let cast: Vec<Tensor> = keep.iter().map(|t| t.to_dtype(dtype)).collect::<Result<_>>()?;
        let refs: Vec<&Tensor> = cast.iter().collect();
        if refs.len() == 1 {
            return refs[0].contiguous();
        }
        refs[0].run1(&Op::Cat { dim: d }, &refs)
    }

    /// Stacks equally shaped tensors along a new dimension `dim` (in
    /// `-(rank + 1)..=rank`), as `torch.stack`.
    pub fn stack(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| Error::invalid("stack", "needs at least one tensor"))?;
        if let Some(t) = tensors.iter().find(|t| t.shape() != first.shape()) {
            return Err(Error::shape(
                "stack",
                "every tensor must have the same shape",
                &[first.shape(), t.shape()],
            ));
        }
        let d = crate::shape::normalize_dim("stack", dim, first.rank() + 1)?;
        let parts: Vec<Tensor> = tensors.iter().map(|t| t.unsqueeze(d as isize)).collect::<Result<_>>()?;
        let refs: Vec<&Tensor> = parts.iter().collect();
        Tensor::cat(&refs, d as isize)
    }
}

fn is_legacy_empty(t: &Tensor) -> bool {
    t.rank() == 1 && t.numel() == 0
}
