//! Views: new layouts over the same storage, no element copied.

use super::Tensor;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::shape::{normalize_dim, Shape};

impl Tensor {
    /// Same elements in a new shape: a view when the layout allows it, a
    /// copy otherwise (PyTorch's `reshape`).
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        self.check_numel("reshape", &shape)?;
        match self.layout.reshape_view(&shape) {
            Some(l) => Ok(self.with_layout(l)),
            None => Ok(self.contiguous()?.with_layout(Layout::contiguous_with_offset(shape, 0))),
        }
    }

    /// Like `reshape`, but one dimension may be -1 and is inferred.
    pub fn reshape_infer(&self, dims: &[isize]) -> Result<Tensor> {
        let shape = infer_shape(self.shape(), dims)?;
        self.reshape(shape)
    }

    /// A view with a new shape; an error when that would need a copy
    /// (PyTorch's `view`).
    pub fn view(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        self.check_numel("view", &shape)?;
        self.layout
            .reshape_view(&shape)
            .map(|l| self.with_layout(l))
            .ok_or_else(|| {
                Error::shape(
                    "view",
                    "this layout cannot be viewed in the new shape without a copy; use reshape",
                    &[self.shape(), &shape],
                )
            })
    }

    fn check_numel(&self, op: &str, shape: &Shape) -> Result<()> {
        if shape.numel() != self.numel() {
            return Err(Error::shape(
                op,
                format!(
                    "{} elements cannot take a shape of {} elements",
                    self.numel(),
                    shape.numel()
                ),
                &[self.shape(), shape],
            ));
        }
        Ok(())
    }

    /// Merges dims `start..=end` into one.
    pub fn flatten(&self, start: isize, end: isize) -> Result<Tensor> {
        if self.rank() == 0 {
            return self.reshape([1]);
        }
        let s = normalize_dim("flatten", start, self.rank())?;
        let e = normalize_dim("flatten", end, self.rank())?;
        if s > e {
            return Err(Error::invalid(
                "flatten",
                format!("start dim {start} comes after end dim {end}"),
            ));
        }
        let d = self.dims();
        let mut out: Vec<usize> = d[..s].to_vec();
        out.push(d[s..=e].iter().product());
        out.extend_from_slice(&d[e + 1..]);
        self.reshape(out)
    }

    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.transpose("transpose", d0, d1)?))
    }

    /// Transpose of a matrix (rank 2); rank 0 and 1 are returned as is.
    pub fn t(&self) -> Result<Tensor> {
        match self.rank() {
            0 | 1 => Ok(self.clone()),
            2 => self.transpose(0, 1),
            _ => Err(Error::shape(
                "t",
                "expects a tensor of rank <= 2; use transpose",
                &[self.shape()],
            )),
        }
    }

    pub fn permute(&self, perm: &[isize]) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.permute("permute", perm)?))
    }

    /// Elements `start..start + len` of one dimension.
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.narrow("narrow", dim, start, len)?))
    }

    /// Elements `start..end` of one dimension taking every `step`-th one
    /// (Python's `t[start:end:step]`); `end` is clamped to the size.
    pub fn slice(&self, dim: isize, start: usize, end: usize, step: usize) -> Result<Tensor> {
        if step == 0 {
            return Err(Error::invalid("slice", "step must be positive"));
        }
        let d = normalize_dim("slice", dim, self.rank())?;
        let size = self.dims()[d];
        let end = end.min(size);
        let start = start.min(end);
        let n = (end - start).div_ceil(step);
        let narrowed = self.layout.narrow("slice", dim, start, end - start)?;
        let mut dims = narrowed.dims().to_vec();
        let mut strides = narrowed.strides().to_vec();
        dims[d] = n;
        // With fewer than two elements the stride is never used, and
        // multiplying by a huge step could overflow.
        if n > 1 {
            strides[d] *= step;
        }
        Ok(self.with_layout(Layout::from_parts(Shape::new(dims), strides, narrowed.offset())?))
    }

    /// Removes a dimension of size 1 (no-op when its size is not 1).
    pub fn squeeze(&self, dim: isize) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.squeeze("squeeze", dim)?))
    }

    /// Removes every dimension of size 1.
    pub fn squeeze_all(&self) -> Result<Tensor> {
        let dims: Vec<usize> = self.dims().iter().copied().filter(|&d| d != 1).collect();
        self.reshape(dims)
    }

    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.unsqueeze("unsqueeze", dim)?))
    }

    /// Broadcasts to a larger shape without copying (stride 0).
    pub fn broadcast_as(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.broadcast_as("broadcast_as", &shape.into())?))
    }

    /// PyTorch's `expand`: like `broadcast_as`, with -1 keeping a size.
    pub fn expand(&self, dims: &[isize]) -> Result<Tensor> {
        let extra = dims
            .len()
            .checked_sub(self.rank())
            .ok_or_else(|| Error::shape("expand", "cannot expand to fewer dimensions", &[self.shape()]))?;
        let mut target = Vec::with_capacity(dims.len());
        for (i, &d) in dims.iter().enumerate() {
            target.push(match d {
                -1 if i >= extra => self.dims()[i - extra],
                d if d >= 0 => d as usize,
                _ => return Err(Error::invalid("expand", format!("bad size {d} at dim {i}"))),
            });
        }
        self.broadcast_as(target)
    }

    /// Splits into pieces of `size` along `dim` (the last may be smaller).
    pub fn split(&self, size: usize, dim: isize) -> Result<Vec<Tensor>> {
        if size == 0 {
            return Err(Error::invalid("split", "split size must be positive"));
        }
        let d = normalize_dim("split", dim, self.rank())?;
        let total = self.dims()[d];
        if total == 0 {
            // PyTorch returns the empty tensor as the one piece.
            return Ok(vec![self.clone()]);
        }
        let mut out = Vec::new();
        let mut start = 0;
        while start < total {
            let len = size.min(total - start);
            out.push(self.narrow(d as isize, start, len)?);
            start += len;
        }
        Ok(out)
    }

    /// Splits into pieces of the given sizes along `dim`.
    pub fn split_sizes(&self, sizes: &[usize], dim: isize) -> Result<Vec<Tensor>> {
        let d = normalize_dim("split", dim, self.rank())?;
        if sizes.iter().sum::<usize>() != self.dims()[d] {
            return Err(Error::shape(
                "split",
                format!("sizes {sizes:?} do not add up to dimension {d}"),
                &[self.shape()],
            ));
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&len| {
                let t = self.narrow(d as isize, start, len);
                start += len;
                t
            })
            .collect()
    }

    /// `chunks` pieces of (nearly) equal size along `dim`, as PyTorch's `chunk`.
    pub fn chunk(&self, chunks: usize, dim: isize) -> Result<Vec<Tensor>> {
        if chunks == 0 {
            return Err(Error::invalid("chunk", "number of chunks must be positive"));
        }
        let size = self.size(dim)?;
        if size == 0 {
            // PyTorch returns `chunks` empty pieces here.
            let mut out = Vec::new();
            out.try_reserve_exact(chunks)
                .map_err(|_| Error::invalid("chunk", format!("cannot hold {chunks} chunks")))?;
            out.resize(chunks, self.clone());
            return Ok(out);
        }
        self.split(size.div_ceil(chunks), dim)
    }
}

/// Resolves one -1 in a list of dims against the number of elements.
fn infer_shape(from: &Shape, dims: &[isize]) -> Result<Shape> {
    let numel = from.numel();
    let mut infer_at = None;
    let mut known = 1usize;
    for (i, &d) in dims.iter().enumerate() {
        match d {
            -1 if infer_at.is_none() => infer_at = Some(i),
            -1 => return Err(Error::invalid("reshape", "only one dimension can be -1")),
            d if d >= 0 => known *= d as usize,
            d => return Err(Error::invalid("reshape", format!("bad size {d}"))),
        }
    }
    let mut out: Vec<usize> = dims.iter().map(|&d| d.max(0) as usize).collect();
    if let Some(i) = infer_at {
        if known == 0 || !numel.is_multiple_of(known) {
            return Err(Error::shape("reshape", format!("cannot infer -1 in {dims:?}"), &[from]));
        }
        out[i] = numel / known;
    }
    Ok(Shape::new(out))
}
