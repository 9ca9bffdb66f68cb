//! In-place writes (the one mutable corner of the tensor API).

use super::Tensor;
use crate::error::{Error, Result};

impl Tensor {
    /// Writes `src` into this tensor at `start` along `dim` (the region
    /// `self.narrow(dim, start, src.size(dim))`), in place, like PyTorch's
    /// `self.narrow(dim, start, n).copy_(src)`: a source of another dtype is
    /// converted as `src.to_dtype(self.dtype())` would convert it.
    ///
    /// The storage must belong to this tensor alone: views and clones share
    /// storage, and a write must not change what they see, so a shared
    /// storage gives an error instead. This is how a KV cache grows without
    /// copying itself on every token.
    pub fn write_slice(&mut self, dim: isize, start: usize, src: &Tensor) -> Result<()> {
        let d = self.shape().dim("write_slice", dim)?;
        if src.rank() != self.rank() {
            return Err(Error::shape(
                "write_slice",
                "source and destination ranks differ",
                &[self.shape(), src.shape()],
            ));
        }
        let region = self.layout.narrow("write_slice", d as isize, start, src.dims()[d])?;
        let exec = self.exec.clone();
        exec.write_into(&mut self.buffer, &region, &src.operand())
    }
}
