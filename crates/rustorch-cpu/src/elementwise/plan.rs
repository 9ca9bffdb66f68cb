//! Walking N broadcast inputs and one contiguous output row by row.
//!
//! Every input is broadcast to the output shape (stride 0 on expanded
//! dims), then dims that are contiguous with each other in *every* input are
//! merged. A contiguous same-shape op collapses to one dim (one long row); an
//! `[N, D] + [D]` op stays `[N, D]` with rows of D; a 0-d operand becomes a
//! stride-0 row. Kernels then see rows whose inputs are slices, single
//! values or (rarely) strided runs, and pick a loop for each.
//!
//! When an input runs across the output's rows (a transposed operand: large
//! stride along the output's last dim, small along the one before), rows
//! are walked in TILE x TILE tiles, so each cache line of that input is
//! read once while it is in cache instead of once per element.

use rustorch_core::error::BackendError;
use rustorch_core::layout::Layout;
use rustorch_core::op::Op;
use rustorch_core::shape::Shape;

/// Output dims after merging, with each input's strides and offset.
pub(super) struct Plan<const N: usize> {
    dims: Vec<usize>,
    strides: [Vec<usize>; N],
    offsets: [usize; N],
    numel: usize,
    /// Walk the last two dims in tiles (see the module docs).
    tiled: bool,
}

/// Tile side, in elements, for the tiled walk.
const TILE: usize = 32;

/// One run of the innermost dim: `len` output elements starting at output
/// index `out` (relative to the chunk), input `k` starting at storage index
/// `offs[k]` and advancing by `Plan::inner_strides()[k]`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Row<const N: usize> {
    pub offs: [usize; N],
    pub len: usize,
    pub out: usize,
}

impl<const N: usize> Plan<N> {
    pub fn new(op: &Op, out: &Shape, layouts: [&Layout; N]) -> Result<Self, BackendError> {
        let mut full: [Vec<usize>; N] = std::array::from_fn(|_| Vec::new());
        let mut offsets = [0usize; N];
        for k in 0..N {
            // The op's name only on failure: formatting it allocates.
            let l = layouts[k]
                .broadcast_as("broadcast", out)
                .map_err(|e| BackendError::invalid(op.name(), e.to_string()))?;
            full[k] = l.strides().to_vec();
            offsets[k] = l.offset();
        }
        let mut dims: Vec<usize> = Vec::with_capacity(out.rank());
        let mut strides: [Vec<usize>; N] = std::array::from_fn(|_| Vec::with_capacity(out.rank()));
        for (d, &size) in out.dims().iter().enumerate() {
            if size == 1 {
                continue;
            }
            // Merge into the previous (outer) dim when, for every input, one
            // step of it equals `size` steps of this one.
            let mergeable = !dims.is_empty() && (0..N).all(|k| strides[k].last() == Some(&(full[k][d] * size)));
            if mergeable {
                if let Some(last) = dims.last_mut() {
                    *last *= size;
                }
                for k in 0..N {
                    if let Some(s) = strides[k].last_mut() {
                        *s = full[k][d];
                    }
                }
            } else {
                dims.push(size);
                for k in 0..N {
                    strides[k].push(full[k][d]);
                }
            }
        }
        if dims.is_empty() {
            dims.push(1);
            for s in strides.iter_mut() {
                s.push(0);
            }
        }
        let rank = dims.len();
        let tiled = rank >= 2
            && dims[rank - 1] > 1
            && dims[rank - 2] > 1
            && (0..N).any(|k| {
                let (row, col) = (strides[k][rank - 2], strides[k][rank - 1]);
                col >= 2 && row < col
            });
        Ok(Plan {
            dims,
            strides,
            offsets,
            numel: out.numel(),
            tiled,
        })
    }

    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Stride of each input along the innermost (row) dim.
    pub fn inner_strides(&self) -> [usize; N] {
        std::array::from_fn(|k| self.strides[k][self.dims.len() - 1])
    }

    /// Whether input `k` is one value repeated over the whole output.
    pub fn is_uniform(&self, k: usize) -> bool {
        self.strides[k].iter().all(|&s| s == 0)
    }

    /// Chunk boundaries for parallel work must be multiples of this (whole
    /// tile bands when tiled, so that a chunk walks whole tiles).
    pub fn granule(&self) -> usize {
        if !self.tiled {
            return 1;
        }
        let rank = self.dims.len();
        let (r, c) = (self.dims[rank - 2], self.dims[rank - 1]);
        if rank > 2 {
            r * c
        } else {
            TILE * c
        }
    }

    /// The rows covering output elements `start..end`; `start` must be a
    /// multiple of `granule()`, and `end` too unless it is `numel()`.
    pub fn rows(&self, start: usize, end: usize) -> RowIter<'_, N> {
        if self.tiled {
            RowIter::Tiled(self.tile_rows(start, end))
        } else {
            RowIter::Linear(self.linear_rows(start, end))
        }
    }

    fn linear_rows(&self, start: usize, end: usize) -> Rows<'_, N> {
        let rank = self.dims.len();
        let mut idx = vec![0usize; rank];
        let mut rem = start.min(self.numel);
        // An empty output has a zero dim; there is nothing to walk.
        for d in (0..rank).rev().filter(|_| self.numel > 0) {
            idx[d] = rem % self.dims[d];
            rem /= self.dims[d];
        }
        // Offsets of the current row's first element (inner index 0).
        let base = std::array::from_fn(|k| {
            self.offsets[k] + (0..rank - 1).map(|d| idx[d] * self.strides[k][d]).sum::<usize>()
        });
        Rows {
            plan: self,
            idx,
            base,
            pos: start,
            start,
            end: end.min(self.numel),
        }
    }

    fn tile_rows(&self, start: usize, end: usize) -> TileRows<'_, N> {
        let rank = self.dims.len();
        let (r, c) = (self.dims[rank - 2], self.dims[rank - 1]);
        let panel = r * c;
        let mut outer = vec![0usize; rank - 2];
        let mut rem = start.min(self.numel) / panel;
        for d in (0..rank - 2).rev() {
            outer[d] = rem % self.dims[d];
            rem /= self.dims[d];
        }
        let base = std::array::from_fn(|k| {
            self.offsets[k] + (0..rank - 2).map(|d| outer[d] * self.strides[k][d]).sum::<usize>()
        });
        let r0 = (start % panel) / c;
        TileRows {
            plan: self,
            outer,
            base,
            r0,
            r: r0,
            c0: 0,
            pos: start,
            start,
            end: end.min(self.numel),
        }
    }
}

/// Rows of either walk.
pub(super) enum RowIter<'a, const N: usize> {
    Linear(Rows<'a, N>),
    Tiled(TileRows<'a, N>),
}

impl<const N: usize> Iterator for RowIter<'_, N> {
    type Item = Row<N>;

    #[inline(always)]
    fn next(&mut self) -> Option<Row<N>> {
        match self {
            RowIter::Linear(r) => r.next(),
            RowIter::Tiled(t) => t.next(),
        }
    }
}

/// The tiled walk: for each band of TILE rows (of the last-but-one dim), for
/// each TILE-wide column block, the band's rows in that block.
pub(super) struct TileRows<'a, const N: usize> {
    plan: &'a Plan<N>,
    /// Index over the dims before the last two, and their offsets.
    outer: Vec<usize>,
    base: [usize; N],
    /// First row of the current band, current row, first column of the block.
    r0: usize,
    r: usize,
    c0: usize,
    /// Output index of the band's first element.
    pos: usize,
    start: usize,
    end: usize,
}

impl<const N: usize> Iterator for TileRows<'_, N> {
    type Item = Row<N>;

    #[inline(always)]
    fn next(&mut self) -> Option<Row<N>> {
        if self.pos >= self.end {
            return None;
        }
        let plan = self.plan;
        let rank = plan.dims.len();
        let (rows, cols) = (plan.dims[rank - 2], plan.dims[rank - 1]);
        let len = TILE.min(cols - self.c0);
        let offs = std::array::from_fn(|k| {
            self.base[k] + self.r * plan.strides[k][rank - 2] + self.c0 * plan.strides[k][rank - 1]
        });
        let row = Row {
            offs,
            len,
            out: self.pos + (self.r - self.r0) * cols + self.c0 - self.start,
        };
        let band = TILE.min(rows - self.r0);
        self.r += 1;
        if self.r == self.r0 + band {
            self.r = self.r0;
            self.c0 += TILE;
            if self.c0 >= cols {
                self.c0 = 0;
                self.pos += band * cols;
                self.r0 += band;
                if self.r0 >= rows {
                    self.r0 = 0;
                    // Carry into the outer dims.
                    for d in (0..rank - 2).rev() {
                        self.outer[d] += 1;
                        for k in 0..N {
                            self.base[k] += plan.strides[k][d];
                        }
                        if self.outer[d] < plan.dims[d] {
                            break;
                        }
                        for k in 0..N {
                            self.base[k] -= plan.dims[d] * plan.strides[k][d];
                        }
                        self.outer[d] = 0;
                    }
                }
                self.r = self.r0;
            }
        }
        Some(row)
    }
}

pub(super) struct Rows<'a, const N: usize> {
    plan: &'a Plan<N>,
    /// Multi-index of the next element.
    idx: Vec<usize>,
    base: [usize; N],
    pos: usize,
    start: usize,
    end: usize,
}

impl<const N: usize> Iterator for Rows<'_, N> {
    type Item = Row<N>;

    #[inline(always)]
    fn next(&mut self) -> Option<Row<N>> {
        if self.pos >= self.end {
            return None;
        }
        let plan = self.plan;
        let last = plan.dims.len() - 1;
        let inner = plan.dims[last];
        let i = self.idx[last];
        let len = (inner - i).min(self.end - self.pos);
        let offs = std::array::from_fn(|k| self.base[k] + i * plan.strides[k][last]);
        let row = Row {
            offs,
            len,
            out: self.pos - self.start,
        };
        self.pos += len;
        self.idx[last] += len;
        if self.idx[last] == inner {
            self.idx[last] = 0;
            // Carry into the outer dims.
            for d in (0..last).rev() {
                self.idx[d] += 1;
                for k in 0..N {
                    self.base[k] += plan.strides[k][d];
                }
                if self.idx[d] < plan.dims[d] {
                    break;
                }
                for k in 0..N {
                    self.base[k] -= plan.dims[d] * plan.strides[k][d];
                }
                self.idx[d] = 0;
            }
        }
        Some(row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows<const N: usize>(p: &Plan<N>, start: usize, end: usize) -> Vec<([usize; N], usize, usize)> {
        p.rows(start, end).map(|r| (r.offs, r.len, r.out)).collect()
    }

    #[test]
    fn contiguous_collapses_to_one_row() {
        let l = Layout::contiguous([4, 5, 6]);
        let p = Plan::new(&Op::Copy, &Shape::from([4, 5, 6]), [&l, &l]).unwrap();
        assert_eq!(p.dims, vec![120]);
        assert_eq!(rows(&p, 0, 120), vec![([0, 0], 120, 0)]);
        assert_eq!(rows(&p, 50, 70), vec![([50, 50], 20, 0)]);
    }

    #[test]
    fn row_broadcast_and_scalar() {
        let a = Layout::contiguous([3, 4]);
        let b = Layout::contiguous([4]);
        let s = Layout::contiguous(Shape::scalar());
        let p = Plan::new(&Op::Copy, &Shape::from([3, 4]), [&a, &b, &s]).unwrap();
        assert_eq!(p.inner_strides(), [1, 1, 0]);
        assert!(p.is_uniform(2) && !p.is_uniform(1));
        // A chunk starting mid-row: the partial row, then whole ones.
        assert_eq!(
            rows(&p, 2, 12),
            vec![([2, 2, 0], 2, 0), ([4, 0, 0], 4, 2), ([8, 0, 0], 4, 6)]
        );
    }

    #[test]
    fn transposed_and_offset_inputs() {
        let t = Layout::contiguous([3, 2]).transpose("t", 0, 1).unwrap(); // [2, 3], strides [1, 2]
        let n = Layout::contiguous([2, 5]).narrow("n", 1, 1, 3).unwrap(); // [2, 3], offset 1
        let p = Plan::new(&Op::Copy, &Shape::from([2, 3]), [&t, &n]).unwrap();
        assert_eq!(p.inner_strides(), [2, 1]);
        assert_eq!(rows(&p, 0, 6), vec![([0, 1], 3, 0), ([1, 6], 3, 3)]);
    }

    /// Walks `out` in chunks of `granule` multiples and checks that every
    /// element is produced once, reading the right storage index of each
    /// input (from its broadcast layout).
    fn check_walk<const N: usize>(out: &Shape, layouts: [&Layout; N], chunk_granules: usize) -> bool {
        let p = Plan::new(&Op::Copy, out, layouts).unwrap();
        let full: Vec<Layout> = layouts.iter().map(|l| l.broadcast_as("t", out).unwrap()).collect();
        let inner = p.inner_strides();
        let n = out.numel();
        let step = p.granule() * chunk_granules;
        let mut seen = vec![false; n];
        let mut start = 0;
        while start < n {
            let end = (start + step).min(n);
            for r in p.rows(start, end) {
                for j in 0..r.len {
                    let o = start + r.out + j;
                    assert!(o < end && !seen[o], "output {o} twice or outside its chunk");
                    seen[o] = true;
                    // Row-major multi-index of o.
                    let mut rem = o;
                    let mut idx = vec![0; out.rank()];
                    for d in (0..out.rank()).rev() {
                        idx[d] = rem % out.dims()[d];
                        rem /= out.dims()[d];
                    }
                    for k in 0..N {
                        let want =
                            full[k].offset() + idx.iter().zip(full[k].strides()).map(|(i, s)| i * s).sum::<usize>();
                        assert_eq!(r.offs[k] + j * inner[k], want, "input {k} at output {o}");
                    }
                }
            }
            start = end;
        }
        assert!(seen.iter().all(|&s| s), "some outputs were not produced");
        p.tiled
    }

    #[test]
    fn tiled_walk_covers_transposed_inputs() {
        // 2-D: a transposed operand against a contiguous one, sizes that are
        // no multiple of the tile.
        let t = Layout::contiguous([45, 70]).transpose("t", 0, 1).unwrap();
        let c = Layout::contiguous([70, 45]);
        for g in [1, 2, 5] {
            assert!(check_walk(&Shape::from([70, 45]), [&t, &c], g));
        }
        // 3-D with a broadcast operand, and a batch of transposed matrices.
        let t3 = Layout::contiguous([3, 37, 50]).transpose("t", 1, 2).unwrap();
        let row = Layout::contiguous([37]);
        for g in [1, 2] {
            assert!(check_walk(&Shape::from([3, 50, 37]), [&t3, &row], g));
        }
        // Contiguous and row-broadcast walks stay linear.
        assert!(!check_walk(&Shape::from([70, 45]), [&c, &Layout::contiguous([45])], 3));
    }

    #[test]
    fn size_one_dims_and_empty() {
        let a = Layout::contiguous([4, 1, 5]);
        let b = Layout::contiguous([3, 1]);
        let p = Plan::new(&Op::Copy, &Shape::from([4, 3, 5]), [&a, &b]).unwrap();
        assert_eq!(p.numel(), 60);
        let r = rows(&p, 0, 60);
        assert_eq!(r.len(), 12);
        assert_eq!(r[1], ([0, 1], 5, 5));
        assert_eq!(r[3], ([5, 0], 5, 15));
        let e = Layout::contiguous([0, 3]);
        let p = Plan::new(&Op::Copy, &Shape::from([0, 3]), [&e]).unwrap();
        assert_eq!(rows(&p, 0, 0), vec![]);
        let one = Layout::contiguous([1, 1]);
        let p = Plan::new(&Op::Copy, &Shape::from([1, 1]), [&one]).unwrap();
        assert_eq!(rows(&p, 0, 1), vec![([0], 1, 0)]);
    }
}
