//! Linear algebra: matrix products with PyTorch's shape rules.

use super::Tensor;
use crate::error::{Error, Result};
use crate::op::Op;

impl Tensor {
    /// Matrix product with PyTorch's `torch.matmul` rules: batch dims
    /// broadcast; a 1-D left operand is treated as a row vector and a 1-D
    /// right operand as a column vector, and the added dim is removed from
    /// the result (two 1-D operands give their dot product, a 0-D tensor).
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        match (self.rank(), other.rank()) {
            (0, _) | (_, 0) => Err(Error::shape(
                "matmul",
                "both arguments need at least 1 dimension",
                &[self.shape(), other.shape()],
            )),
            (1, 1) => {
                let r = self.unsqueeze(0)?.matmul_nd(&other.unsqueeze(1)?)?;
                r.reshape(crate::shape::Shape::scalar())
            }
            (1, _) => self.unsqueeze(0)?.matmul_nd(other)?.squeeze(-2),
            (_, 1) => self.matmul_nd(&other.unsqueeze(1)?)?.squeeze(-1),
            _ => self.matmul_nd(other),
        }
    }

    /// Both operands at least 2-D: the op itself.
    fn matmul_nd(&self, other: &Tensor) -> Result<Tensor> {
        self.run1(&Op::MatMul, &[self, other])
    }

    /// Product of two matrices (both exactly 2-D), as `torch.mm`.
    pub fn mm(&self, other: &Tensor) -> Result<Tensor> {
        if self.rank() != 2 || other.rank() != 2 {
            return Err(Error::shape(
                "mm",
                "both operands must be 2-D",
                &[self.shape(), other.shape()],
            ));
        }
        self.matmul_nd(other)
    }

    /// Batched product of [b, m, k] and [b, k, n] (no broadcasting), as
    /// `torch.bmm`.
    pub fn bmm(&self, other: &Tensor) -> Result<Tensor> {
        if self.rank() != 3 || other.rank() != 3 || self.dims()[0] != other.dims()[0] {
            return Err(Error::shape(
                "bmm",
                "operands must be 3-D with the same batch size",
                &[self.shape(), other.shape()],
            ));
        }
        self.matmul_nd(other)
    }
}
