//! Shape + strides + offset: how a tensor's elements sit in its storage.
//!
//! Views (transpose, permute, narrow, squeeze, unsqueeze, expand, reshape of
//! contiguous data) only build a new `Layout`; no element moves.

use crate::error::{Error, Result};
use crate::shape::{normalize_dim, Shape};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Shape,
    /// Element strides; 0 for broadcast dimensions.
    strides: Vec<usize>,
    /// Element offset of the first element in the storage.
    offset: usize,
}

impl Layout {
    pub fn contiguous(shape: impl Into<Shape>) -> Self {
        Self::contiguous_with_offset(shape, 0)
    }

    pub fn contiguous_with_offset(shape: impl Into<Shape>, offset: usize) -> Self {
        let shape = shape.into();
        let strides = shape.contiguous_strides();
        Layout { shape, strides, offset }
    }

    /// A layout from explicit parts. The caller guarantees it stays inside
    /// its storage; `max_storage_index` lets it check.
    pub fn from_parts(shape: Shape, strides: Vec<usize>, offset: usize) -> Result<Self> {
        if shape.rank() != strides.len() {
            return Err(Error::invalid(
                "layout",
                format!("{} strides for a shape of rank {}", strides.len(), shape.rank()),
            ));
        }
        Ok(Layout { shape, strides, offset })
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn rank(&self) -> usize {
        self.shape.rank()
    }
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }

    /// Largest storage index this layout touches plus one (the offset when
    /// empty). Saturates at `usize::MAX`, so a layout built from absurd parts
    /// reads as reaching past any storage instead of wrapping around and
    /// passing a bounds check.
    pub fn storage_extent(&self) -> usize {
        if self.numel() == 0 {
            return self.offset;
        }
        self.dims()
            .iter()
            .zip(&self.strides)
            .fold(self.offset, |acc, (&d, &s)| {
                acc.saturating_add((d - 1).saturating_mul(s))
            })
            .saturating_add(1)
    }

    /// Row-major contiguous (the offset may be anything).
    pub fn is_contiguous(&self) -> bool {
        let mut acc = 1;
        for (&d, &s) in self.dims().iter().zip(&self.strides).rev() {
            if d != 1 && s != acc {
                return false;
            }
            acc *= d;
        }
        true
    }

    /// The contiguous element range when the layout is contiguous.
    pub fn contiguous_range(&self) -> Option<std::ops::Range<usize>> {
        self.is_contiguous().then(|| self.offset..self.offset + self.numel())
    }

    pub fn transpose(&self, op: &str, d0: isize, d1: isize) -> Result<Layout> {
        let a = normalize_dim(op, d0, self.rank())?;
        let b = normalize_dim(op, d1, self.rank())?;
        let mut dims = self.dims().to_vec();
        let mut strides = self.strides.clone();
        dims.swap(a, b);
        strides.swap(a, b);
        Ok(Layout {
            shape: Shape::new(dims),
            strides,
            offset: self.offset,
        })
    }

    pub fn permute(&self, op: &str, perm: &[isize]) -> Result<Layout> {
        let rank = self.rank();
        if perm.len() != rank {
            return Err(Error::shape(
                op,
                format!("permutation {perm:?} has {} entries for rank {rank}", perm.len()),
                &[&self.shape],
            ));
        }
        let mut seen = vec![false; rank];
        let mut dims = Vec::with_capacity(rank);
        let mut strides = Vec::with_capacity(rank);
        for &p in perm {
            let d = normalize_dim(op, p, rank)?;
            if seen[d] {
                return Err(Error::invalid(
                    op,
                    format!("permutation {perm:?} repeats dimension {d}"),
                ));
            }
            seen[d] = true;
            dims.push(self.dims()[d]);
            strides.push(self.strides[d]);
        }
        Ok(Layout {
            shape: Shape::new(dims),
            strides,
            offset: self.offset,
        })
    }

    pub fn narrow(&self, op: &str, dim: isize, start: usize, len: usize) -> Result<Layout> {
        let d = normalize_dim(op, dim, self.rank())?;
        let size = self.dims()[d];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::shape(
                op,
                format!(
                    "range {start}..{} is outside dimension {d} of size {size}",
                    start.saturating_add(len)
                ),
                &[&self.shape],
            ));
        }
        let mut dims = self.dims().to_vec();
        dims[d] = len;
        Ok(Layout {
            shape: Shape::new(dims),
            strides: self.strides.clone(),
            // An empty view reads nothing: moving its offset could put it
            // past the end of the storage (another dim may be 0).
            offset: if len == 0 || self.numel() == 0 {
                self.offset
            } else {
                self.offset.saturating_add(start.saturating_mul(self.strides[d]))
            },
        })
    }

    /// The same layout `elements` further into its storage: where a write
    /// at a position read at run time lands (`Backend::write_into_at`
    /// moves the region for position 0 by `pos * step`). An empty layout
    /// stays where it is, as `narrow` keeps an empty view's offset: it
    /// reads nothing, and a moved offset could pass the storage's end.
    pub fn shifted(&self, elements: usize) -> Layout {
        Layout {
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            offset: if self.numel() == 0 {
                self.offset
            } else {
                self.offset.saturating_add(elements)
            },
        }
    }

    pub fn unsqueeze(&self, op: &str, dim: isize) -> Result<Layout> {
        let d = normalize_dim(op, dim, self.rank() + 1)?;
        let mut dims = self.dims().to_vec();
        let mut strides = self.strides.clone();
        // Any stride is right for a size-1 dim; this one keeps the layout
        // contiguous when it was.
        let stride = if d < self.rank() {
            self.strides[d].saturating_mul(self.dims()[d])
        } else {
            1
        };
        dims.insert(d, 1);
        strides.insert(d, stride);
        Ok(Layout {
            shape: Shape::new(dims),
            strides,
            offset: self.offset,
        })
    }

    pub fn squeeze(&self, op: &str, dim: isize) -> Result<Layout> {
        let d = normalize_dim(op, dim, self.rank())?;
        if self.dims()[d] != 1 {
            return Ok(self.clone());
        }
        let mut dims = self.dims().to_vec();
        let mut strides = self.strides.clone();
        dims.remove(d);
        strides.remove(d);
        Ok(Layout {
            shape: Shape::new(dims),
            strides,
            offset: self.offset,
        })
    }

    /// Expands size-1 dimensions (and prepends new ones) with stride 0.
    pub fn broadcast_as(&self, op: &str, target: &Shape) -> Result<Layout> {
        let rank = target.rank();
        if rank < self.rank() {
            return Err(Error::shape(
                op,
                "cannot broadcast to a lower rank",
                &[&self.shape, target],
            ));
        }
        let extra = rank - self.rank();
        let mut strides = vec![0; rank];
        for (i, stride) in strides.iter_mut().enumerate().skip(extra) {
            let (src_d, src_s) = (self.dims()[i - extra], self.strides[i - extra]);
            let t = target.dims()[i];
            *stride = if src_d == t {
                src_s
            } else if src_d == 1 {
                0
            } else {
                return Err(Error::shape(
                    op,
                    format!("dimension {i} of size {src_d} cannot expand to {t}"),
                    &[&self.shape, target],
                ));
            };
        }
        Ok(Layout {
            shape: target.clone(),
            strides,
            offset: self.offset,
        })
    }

    /// A view with a new shape when the data allows one without a copy;
    /// `None` when a copy is needed or the element counts differ.
    pub fn reshape_view(&self, target: &Shape) -> Option<Layout> {
        if target.numel() != self.numel() {
            return None;
        }
        // No element is ever read, so any strides do (as PyTorch's `view`).
        if self.is_contiguous() || self.numel() == 0 {
            return Some(Layout::contiguous_with_offset(target.clone(), self.offset));
        }
        // Non-contiguous: merge groups of source dims that are themselves
        // contiguous with each other, then split them into target dims.
        let src: Vec<(usize, usize)> = self
            .dims()
            .iter()
            .zip(&self.strides)
            .filter(|(&d, _)| d != 1)
            .map(|(&d, &s)| (d, s))
            .collect();
        let mut new_strides = vec![0usize; target.rank()];
        let tdims = target.dims();
        let (mut si, mut ti) = (0usize, 0usize);
        while ti < tdims.len() {
            if tdims[ti] == 1 {
                new_strides[ti] = 1;
                ti += 1;
                continue;
            }
            if si >= src.len() {
                return None;
            }
            // Take a chunk of source dims that multiply to the same size as
            // a chunk of target dims.
            let (mut sp, mut tp) = (src[si].0, tdims[ti]);
            let (s_start, t_start) = (si, ti);
            si += 1;
            ti += 1;
            while sp != tp {
                if sp < tp {
                    if si >= src.len() {
                        return None;
                    }
                    sp *= src[si].0;
                    si += 1;
                } else {
                    while ti < tdims.len() && tdims[ti] == 1 {
                        new_strides[ti] = 1;
                        ti += 1;
                    }
                    if ti >= tdims.len() {
                        return None;
                    }
                    tp *= tdims[ti];
                    ti += 1;
                }
            }
            for k in s_start..si - 1 {
                if src[k + 1].1.checked_mul(src[k + 1].0) != Some(src[k].1) {
                    return None;
                }
            }
            let mut stride = src[si - 1].1;
            for k in (t_start..ti).rev() {
                new_strides[k] = stride;
                stride = stride.saturating_mul(tdims[k]);
            }
        }
        if si != src.len() {
            return None;
        }
        Some(Layout {
            shape: target.clone(),
            strides: new_strides,
            offset: self.offset,
        })
    }

    /// Storage index of every element in row-major order.
    pub fn indices(&self) -> StridedIndex<'_> {
        StridedIndex::new(self)
    }

    /// The layout as runs of contiguous elements: a start per run, and the
    /// run length shared by all runs. Kernels copy or map run by run.
    pub fn blocks(&self) -> StridedBlocks<'_> {
        if let Some(r) = self.contiguous_range() {
            return StridedBlocks::Single {
                start: r.start,
                len: r.end - r.start,
            };
        }
        // Fold the innermost contiguous dims into one run.
        let mut run = 1usize;
        let mut inner = self.rank();
        for (&d, &s) in self.dims().iter().zip(&self.strides).rev() {
            if s != run && d != 1 {
                break;
            }
            run *= d;
            inner -= 1;
        }
        StridedBlocks::Multiple {
            starts: StridedIndex::new_prefix(self, inner),
            run_len: run,
        }
    }
}

/// Runs of contiguous storage covering a layout in row-major order.
pub enum StridedBlocks<'a> {
    Single { start: usize, len: usize },
    Multiple { starts: StridedIndex<'a>, run_len: usize },
}

/// Iterates storage indices of a layout (or of its first `rank` dims).
pub struct StridedIndex<'a> {
    dims: &'a [usize],
    strides: &'a [usize],
    index: Vec<usize>,
    next: Option<usize>,
}

impl<'a> StridedIndex<'a> {
    fn new(l: &'a Layout) -> Self {
        Self::new_prefix(l, l.rank())
    }

    fn new_prefix(l: &'a Layout, rank: usize) -> Self {
        let dims = &l.dims()[..rank];
        let next = if l.numel() == 0 { None } else { Some(l.offset) };
        StridedIndex {
            dims,
            strides: &l.strides[..rank],
            index: vec![0; rank],
            next,
        }
    }
}

impl Iterator for StridedIndex<'_> {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        let cur = self.next?;
        let mut pos = cur;
        let mut done = true;
        for d in (0..self.dims.len()).rev() {
            self.index[d] += 1;
            if self.index[d] < self.dims[d] {
                pos += self.strides[d];
                done = false;
                break;
            }
            pos -= (self.index[d] - 1) * self.strides[d];
            self.index[d] = 0;
        }
        self.next = if done { None } else { Some(pos) };
        Some(cur)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposed_indices() {
        let l = Layout::contiguous([2, 3]).transpose("t", 0, 1).unwrap();
        assert_eq!(l.indices().collect::<Vec<_>>(), vec![0, 3, 1, 4, 2, 5]);
        assert!(!l.is_contiguous());
    }

    #[test]
    fn narrowed_blocks() {
        let l = Layout::contiguous([3, 4]).narrow("t", 1, 1, 2).unwrap();
        match l.blocks() {
            StridedBlocks::Multiple { starts, run_len } => {
                assert_eq!(run_len, 2);
                assert_eq!(starts.collect::<Vec<_>>(), vec![1, 5, 9]);
            }
            _ => panic!("expected runs"),
        }
    }

    #[test]
    fn reshape_of_transposed_needs_copy() {
        let l = Layout::contiguous([2, 3]).transpose("t", 0, 1).unwrap();
        assert!(l.reshape_view(&Shape::from([6])).is_none());
        // Splitting a dimension of a permuted tensor is still a view.
        let l = Layout::contiguous([4, 6]).transpose("t", 0, 1).unwrap();
        let v = l.reshape_view(&Shape::from([2, 3, 4])).unwrap();
        assert_eq!(v.strides(), &[3, 1, 6]);
    }
}
