//! Property tests for views, reshapes and broadcasting.
//!
//! Random chains of views run on an arange tensor and on an independent
//! model that knows nothing of `Layout`: it keeps, for every element of the
//! current view in row-major order, its value and its position in the
//! storage, and applies each view by plain index arithmetic. The tensor must
//! agree with the model on shapes, values, storage positions, errors (the
//! same inputs must fail) and on when a reshape needs a copy.

use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};
use rustorch_core::layout::StridedBlocks;
use rustorch_core::{Layout, Shape, Tensor};
use rustorch_cpu::CpuStorage;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

// ---------------------------------------------------------------------------
// The model

/// A view as plain lists: its dims, and per element (row-major) the value it
/// shows and the storage position it reads.
#[derive(Clone, Debug, PartialEq)]
struct Model {
    dims: Vec<usize>,
    vals: Vec<i64>,
    pos: Vec<usize>,
}

fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// Row-major multi-index of a flat position.
fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for k in (0..dims.len()).rev() {
        idx[k] = flat % dims[k];
        flat /= dims[k];
    }
    idx
}

fn ravel(idx: &[usize], dims: &[usize]) -> usize {
    idx.iter().zip(dims).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// PyTorch's rule for a possibly negative dim.
fn resolve(dim: isize, rank: usize) -> Option<usize> {
    let r = rank as isize;
    let d = if dim < 0 { dim + r } else { dim };
    (0..r).contains(&d).then_some(d as usize)
}

impl Model {
    fn arange(dims: &[usize]) -> Model {
        let n = numel(dims);
        Model {
            dims: dims.to_vec(),
            vals: (0..n as i64).collect(),
            pos: (0..n).collect(),
        }
    }

    /// A view of shape `dims` whose element at `idx` is this view's element
    /// at `source(idx)`.
    fn map(&self, dims: Vec<usize>, source: impl Fn(&[usize]) -> Vec<usize>) -> Model {
        let n = numel(&dims);
        let (mut vals, mut pos) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for f in 0..n {
            let from = ravel(&source(&unravel(f, &dims)), &self.dims);
            vals.push(self.vals[from]);
            pos.push(self.pos[from]);
        }
        Model { dims, vals, pos }
    }

    fn rank(&self) -> usize {
        self.dims.len()
    }

    fn transpose(&self, a: isize, b: isize) -> Option<Model> {
        let (a, b) = (resolve(a, self.rank())?, resolve(b, self.rank())?);
        let mut dims = self.dims.clone();
        dims.swap(a, b);
        Some(self.map(dims, |i| {
            let mut j = i.to_vec();
            j.swap(a, b);
            j
        }))
    }

    fn permute(&self, perm: &[isize]) -> Option<Model> {
        if perm.len() != self.rank() {
            return None;
        }
        let p: Vec<usize> = perm.iter().map(|&d| resolve(d, self.rank())).collect::<Option<_>>()?;
        let mut sorted = p.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != p.len() {
            return None;
        }
        let dims = p.iter().map(|&d| self.dims[d]).collect();
        Some(self.map(dims, |i| {
            let mut j = vec![0; i.len()];
            for (k, &d) in p.iter().enumerate() {
                j[d] = i[k];
            }
            j
        }))
    }

    fn narrow(&self, dim: isize, start: usize, len: usize) -> Option<Model> {
        let d = resolve(dim, self.rank())?;
        if start.checked_add(len)? > self.dims[d] {
            return None;
        }
        let mut dims = self.dims.clone();
        dims[d] = len;
        Some(self.map(dims, |i| {
            let mut j = i.to_vec();
            j[d] += start;
            j
        }))
    }

    /// Python's `t[start:end:step]` on one dim, bounds clamped.
    fn slice(&self, dim: isize, start: usize, end: usize, step: usize) -> Option<Model> {
        if step == 0 {
            return None;
        }
        let d = resolve(dim, self.rank())?;
        let end = end.min(self.dims[d]);
        let start = start.min(end);
        let mut dims = self.dims.clone();
        dims[d] = (start..end).step_by(step).count();
        Some(self.map(dims, |i| {
            let mut j = i.to_vec();
            j[d] = start + i[d] * step;
            j
        }))
    }

    fn unsqueeze(&self, dim: isize) -> Option<Model> {
        let d = resolve(dim, self.rank() + 1)?;
        let mut dims = self.dims.clone();
        dims.insert(d, 1);
        Some(self.map(dims, |i| {
            let mut j = i.to_vec();
            j.remove(d);
            j
        }))
    }

    fn squeeze(&self, dim: isize) -> Option<Model> {
        let d = resolve(dim, self.rank())?;
        if self.dims[d] != 1 {
            return Some(self.clone());
        }
        let mut dims = self.dims.clone();
        dims.remove(d);
        Some(self.map(dims, |i| {
            let mut j = i.to_vec();
            j.insert(d, 0);
            j
        }))
    }

    /// NumPy broadcasting of this view to `target` (size-1 dims repeat).
    fn broadcast(&self, target: &[usize]) -> Option<Model> {
        let extra = target.len().checked_sub(self.rank())?;
        for (k, &s) in self.dims.iter().enumerate() {
            if s != target[extra + k] && s != 1 {
                return None;
            }
        }
        Some(self.map(target.to_vec(), |i| {
            i[extra..]
                .iter()
                .zip(&self.dims)
                .map(|(&x, &s)| if s == 1 { 0 } else { x })
                .collect()
        }))
    }

    /// PyTorch's `expand`: -1 keeps a size, new leading dims need a size.
    fn expand(&self, sizes: &[isize]) -> Option<Model> {
        let extra = sizes.len().checked_sub(self.rank())?;
        let mut target = Vec::with_capacity(sizes.len());
        for (k, &s) in sizes.iter().enumerate() {
            target.push(match s {
                -1 if k >= extra => self.dims[k - extra],
                s if s >= 0 => s as usize,
                _ => return None,
            });
        }
        self.broadcast(&target)
    }

    /// Same elements in a new shape, in the same storage (a view).
    fn reshaped(&self, dims: &[usize]) -> Model {
        Model {
            dims: dims.to_vec(),
            vals: self.vals.clone(),
            pos: self.pos.clone(),
        }
    }

    /// Same elements copied into fresh contiguous storage.
    fn copied(&self, dims: &[usize]) -> Model {
        Model {
            dims: dims.to_vec(),
            vals: self.vals.clone(),
            pos: (0..self.vals.len()).collect(),
        }
    }

    /// Whether positions are consecutive: the view is row-major contiguous.
    fn is_contiguous(&self) -> bool {
        self.pos.windows(2).all(|w| w[1] == w[0] + 1)
    }

    /// Whether some non-negative strides and an offset reproduce these
    /// storage positions under shape `dims`, i.e. a reshape can be a view.
    fn view_possible(&self, dims: &[usize]) -> bool {
        let n = self.pos.len();
        if n == 0 {
            return true;
        }
        let base = self.pos[0] as i64;
        let mut strides = vec![0i64; dims.len()];
        for k in 0..dims.len() {
            if dims[k] > 1 {
                let mut unit = vec![0; dims.len()];
                unit[k] = 1;
                strides[k] = self.pos[ravel(&unit, dims)] as i64 - base;
                if strides[k] < 0 {
                    return false;
                }
            }
        }
        (0..n).all(|f| {
            let idx = unravel(f, dims);
            let at: i64 = base + idx.iter().zip(&strides).map(|(&i, &s)| i as i64 * s).sum::<i64>();
            at == self.pos[f] as i64
        })
    }

    /// PyTorch's `reshape`: a view when possible, else a copy.
    fn reshape(&self, dims: &[usize]) -> Option<Model> {
        if numel(dims) != self.pos.len() {
            return None;
        }
        Some(if self.view_possible(dims) {
            self.reshaped(dims)
        } else {
            self.copied(dims)
        })
    }

    fn flatten_dims(&self, start: isize, end: isize) -> Option<Vec<usize>> {
        if self.rank() == 0 {
            return Some(vec![1]);
        }
        let (s, e) = (resolve(start, self.rank())?, resolve(end, self.rank())?);
        if s > e {
            return None;
        }
        let mut dims = self.dims[..s].to_vec();
        dims.push(numel(&self.dims[s..=e]));
        dims.extend_from_slice(&self.dims[e + 1..]);
        Some(dims)
    }

    /// PyTorch's `split(size, dim)`: (start, len) of every piece.
    fn split_ranges(&self, size: usize, dim: isize) -> Option<(usize, Vec<(usize, usize)>)> {
        if size == 0 {
            return None;
        }
        let d = resolve(dim, self.rank())?;
        let total = self.dims[d];
        if total == 0 {
            return Some((d, vec![(0, 0)]));
        }
        Some((d, (0..total).step_by(size).map(|s| (s, size.min(total - s))).collect()))
    }

    /// PyTorch's `chunk(chunks, dim)`: (start, len) of every piece.
    fn chunk_ranges(&self, chunks: usize, dim: isize) -> Option<(usize, Vec<(usize, usize)>)> {
        if chunks == 0 {
            return None;
        }
        let d = resolve(dim, self.rank())?;
        let total = self.dims[d];
        if total == 0 {
            return Some((d, vec![(0, 0); chunks]));
        }
        self.split_ranges(total.div_ceil(chunks), dim)
    }
}

// ---------------------------------------------------------------------------
// Random steps

/// A deterministic stream of numbers from a seed (xorshift64*), used to
/// derive arguments that depend on the current shape.
struct Seq(u64);

impl Seq {
    fn new(seed: u64) -> Seq {
        Seq(seed | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    fn coin(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    /// A dim for rank `rank`, sometimes negative, sometimes out of range.
    fn dim(&mut self, rank: usize) -> isize {
        let r = rank as isize;
        if self.coin(8) {
            return if self.coin(50) {
                r + self.below(3) as isize
            } else {
                -r - 1 - self.below(3) as isize
            };
        }
        let d = self.below(rank.max(1)) as isize;
        if self.coin(40) {
            d - r
        } else {
            d
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Transpose,
    Permute,
    Narrow,
    Slice,
    Unsqueeze,
    Squeeze,
    SqueezeAll,
    Broadcast,
    Expand,
    Reshape,
    ReshapeInfer,
    View,
    Flatten,
    Split,
    Chunk,
    Contiguous,
}

const KINDS: [Kind; 16] = [
    Kind::Transpose,
    Kind::Permute,
    Kind::Narrow,
    Kind::Slice,
    Kind::Unsqueeze,
    Kind::Squeeze,
    Kind::SqueezeAll,
    Kind::Broadcast,
    Kind::Expand,
    Kind::Reshape,
    Kind::ReshapeInfer,
    Kind::View,
    Kind::Flatten,
    Kind::Split,
    Kind::Chunk,
    Kind::Contiguous,
];

/// Prime factors of `n`, smallest first.
fn factors(mut n: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut p = 2;
    while p * p <= n {
        while n.is_multiple_of(p) {
            out.push(p);
            n /= p;
        }
        p += 1;
    }
    if n > 1 {
        out.push(n);
    }
    out
}

/// A shape of `dims`' element count: adjacent dims merged, dims split into
/// factors, random regroupings, size-1 dims sprinkled in; for empty views,
/// any shape holding a 0.
fn reshape_target(dims: &[usize], seq: &mut Seq) -> Vec<usize> {
    let n = numel(dims);
    let mut out: Vec<usize> = if n == 0 {
        let mut t: Vec<usize> = (0..seq.below(3)).map(|_| seq.below(4)).collect();
        t.insert(seq.below(t.len() + 1), 0);
        t
    } else {
        match seq.below(4) {
            // Merge a run of two or more adjacent dims.
            0 if dims.len() >= 2 => {
                let s = seq.below(dims.len() - 1);
                let e = s + 1 + seq.below(dims.len() - s - 1);
                let mut t = dims[..s].to_vec();
                t.push(numel(&dims[s..=e]));
                t.extend_from_slice(&dims[e + 1..]);
                t
            }
            // Split one dim into two factors.
            1 if !dims.is_empty() => {
                let k = seq.below(dims.len());
                let f = factors(dims[k]);
                let a: usize = f.iter().filter(|_| seq.coin(50)).product();
                let mut t = dims[..k].to_vec();
                t.push(a);
                t.push(dims[k] / a);
                t.extend_from_slice(&dims[k + 1..]);
                t
            }
            // Any grouping of the prime factors.
            _ => {
                let mut f = factors(n);
                for i in (1..f.len()).rev() {
                    f.swap(i, seq.below(i + 1));
                }
                let mut t = Vec::new();
                for p in f {
                    match t.last_mut() {
                        Some(last) if seq.coin(40) => *last *= p,
                        _ => t.push(p),
                    }
                }
                t
            }
        }
    };
    for _ in 0..seq.below(3) {
        if seq.coin(40) {
            out.insert(seq.below(out.len() + 1), 1);
        }
    }
    out
}

/// A broadcast target for `dims`: new leading dims, size-1 dims grown, and
/// now and then a size that cannot work.
fn broadcast_target(dims: &[usize], seq: &mut Seq) -> Vec<usize> {
    let mut t: Vec<usize> = (0..seq.below(3)).map(|_| 1 + seq.below(3)).collect();
    for &d in dims {
        t.push(if d == 1 && seq.coin(60) {
            if seq.coin(10) {
                0
            } else {
                1 + seq.below(3)
            }
        } else if seq.coin(5) {
            d + 1
        } else {
            d
        });
    }
    if seq.coin(5) && !t.is_empty() {
        t.remove(0);
    }
    t
}

const MAX_ELEMS: usize = 4096;
const MAX_RANK: usize = 7;

/// What the tensor must show after a step.
struct Expect {
    model: Model,
    /// Whether the result must share the input's storage.
    shares: bool,
}

/// Applies one step to the tensor and the model. `None` from the model
/// means the step must fail. Returns the new state, or the old one when the
/// step failed or grew too large.
/// The new state, and whether it shares the old one's storage.
type Stepped = Option<(Tensor, Model, bool)>;

fn step(t: &Tensor, m: &Model, kind: Kind, seed: u64) -> Result<Stepped, TestCaseError> {
    let mut seq = Seq::new(seed);
    let rank = m.rank();
    let view = |model: Option<Model>| model.map(|model| Expect { model, shares: true });
    let (got, want): (rustorch_core::Result<Tensor>, Option<Expect>) = match kind {
        Kind::Transpose => {
            let (a, b) = (seq.dim(rank), seq.dim(rank));
            (t.transpose(a, b), view(m.transpose(a, b)))
        }
        Kind::Permute => {
            let mut p: Vec<isize> = (0..rank as isize).collect();
            for i in (1..p.len()).rev() {
                p.swap(i, seq.below(i + 1));
            }
            for d in p.iter_mut() {
                if seq.coin(30) {
                    *d -= rank as isize;
                }
            }
            match seq.below(10) {
                0 => p.push(0),
                1 if rank >= 2 => p[1] = p[0],
                2 if rank >= 1 => p[0] = rank as isize + seq.below(2) as isize,
                _ => {}
            }
            (t.permute(&p), view(m.permute(&p)))
        }
        Kind::Narrow => {
            let d = seq.dim(rank);
            let size = resolve(d, rank).map_or(3, |d| m.dims[d]);
            let start = seq.below(size + 2);
            let len = seq.below(size + 2 - start.min(size));
            (t.narrow(d, start, len), view(m.narrow(d, start, len)))
        }
        Kind::Slice => {
            let d = seq.dim(rank);
            let size = resolve(d, rank).map_or(3, |d| m.dims[d]);
            let (start, end, step) = (seq.below(size + 2), seq.below(size + 3), seq.below(4));
            (t.slice(d, start, end, step), view(m.slice(d, start, end, step)))
        }
        Kind::Unsqueeze => {
            if rank >= MAX_RANK {
                return Ok(None);
            }
            let d = seq.dim(rank + 1);
            (t.unsqueeze(d), view(m.unsqueeze(d)))
        }
        Kind::Squeeze => {
            // Aim at a size-1 dim when there is one.
            let d = match m.dims.iter().position(|&s| s == 1) {
                Some(k) if seq.coin(70) => k as isize,
                _ => seq.dim(rank),
            };
            (t.squeeze(d), view(m.squeeze(d)))
        }
        Kind::SqueezeAll => {
            let dims: Vec<usize> = m.dims.iter().copied().filter(|&s| s != 1).collect();
            let r = m.reshape(&dims);
            let shares = m.view_possible(&dims);
            (t.squeeze_all(), r.map(|model| Expect { model, shares }))
        }
        Kind::Broadcast => {
            let target = broadcast_target(&m.dims, &mut seq);
            if target.len() > MAX_RANK || numel(&target) > MAX_ELEMS {
                return Ok(None);
            }
            (t.broadcast_as(target.clone()), view(m.broadcast(&target)))
        }
        Kind::Expand => {
            let target = broadcast_target(&m.dims, &mut seq);
            if target.len() > MAX_RANK || numel(&target) > MAX_ELEMS {
                return Ok(None);
            }
            let extra = target.len().saturating_sub(rank);
            let sizes: Vec<isize> = target
                .iter()
                .enumerate()
                .map(|(k, &s)| match seq.below(10) {
                    0..=3 if k >= extra && s == m.dims[k - extra] => -1,
                    // -1 where no size exists to keep, or a negative size.
                    4 if seq.coin(20) => -1 - seq.below(2) as isize,
                    _ => s as isize,
                })
                .collect();
            (t.expand(&sizes), view(m.expand(&sizes)))
        }
        Kind::Reshape | Kind::View | Kind::ReshapeInfer => {
            let mut target = reshape_target(&m.dims, &mut seq);
            if seq.coin(5) {
                target.push(2);
            }
            if target.len() > MAX_RANK {
                return Ok(None);
            }
            let can_view = numel(&target) == m.pos.len() && m.view_possible(&target);
            // The layout's own answer must match the model's.
            let lv = t.layout().reshape_view(&Shape::from(target.clone()));
            prop_assert_eq!(
                lv.is_some(),
                can_view,
                "reshape_view of {:?} to {:?}",
                t.layout(),
                target
            );
            match kind {
                Kind::Reshape => (
                    t.reshape(target.clone()),
                    m.reshape(&target).map(|model| Expect {
                        model,
                        shares: can_view,
                    }),
                ),
                Kind::View => (
                    t.view(target.clone()),
                    can_view.then(|| Expect {
                        model: m.reshaped(&target),
                        shares: true,
                    }),
                ),
                _ => {
                    let mut sizes: Vec<isize> = target.iter().map(|&s| s as isize).collect();
                    if !sizes.is_empty() {
                        sizes[seq.below(target.len())] = -1;
                    }
                    if seq.coin(5) && sizes.len() >= 2 {
                        sizes[0] = -1;
                        sizes[1] = -1;
                    }
                    let want = infer(&sizes, m.pos.len()).and_then(|dims| m.reshape(&dims).map(|model| (dims, model)));
                    let want = want.map(|(dims, model)| Expect {
                        model,
                        shares: m.view_possible(&dims),
                    });
                    (t.reshape_infer(&sizes), want)
                }
            }
        }
        Kind::Flatten => {
            let (s, e) = (seq.dim(rank), seq.dim(rank));
            let want = m.flatten_dims(s, e).and_then(|dims| {
                let shares = m.view_possible(&dims);
                m.reshape(&dims).map(|model| Expect { model, shares })
            });
            (t.flatten(s, e), want)
        }
        Kind::Split | Kind::Chunk => {
            let d = seq.dim(rank);
            let n = seq.below(5);
            let (pieces, ranges) = match kind {
                Kind::Split => (t.split(n, d), m.split_ranges(n, d)),
                _ => (t.chunk(n, d), m.chunk_ranges(n, d)),
            };
            match (pieces, ranges) {
                (Ok(pieces), Some((dim, ranges))) => {
                    prop_assert_eq!(pieces.len(), ranges.len(), "{:?}({}, {}) of {:?}", kind, n, d, m.dims);
                    let k = seq.below(ranges.len());
                    for (p, &(_, len)) in pieces.iter().zip(&ranges) {
                        prop_assert_eq!(p.dims()[dim], len);
                    }
                    let (start, len) = ranges[k];
                    let want = m
                        .narrow(dim as isize, start, len)
                        .map(|model| Expect { model, shares: true });
                    (Ok(pieces[k].clone()), want)
                }
                (Err(_), None) => return Ok(None),
                (got, want) => {
                    return Err(TestCaseError::fail(format!(
                        "{kind:?}({n}, {d}) of {:?}: tensor gave {:?}, model {:?}",
                        m.dims,
                        got.map(|p| p.len()),
                        want.map(|(_, r)| r)
                    )))
                }
            }
        }
        Kind::Contiguous => {
            let shares = m.is_contiguous() && !m.pos.is_empty();
            let want = if shares { m.clone() } else { m.copied(&m.dims) };
            (
                t.contiguous(),
                Some(Expect {
                    model: want,
                    shares: shares || m.pos.is_empty() && t.is_contiguous(),
                }),
            )
        }
    };
    match (got, want) {
        (Ok(out), Some(want)) => {
            check(&out, &want.model)?;
            prop_assert_eq!(
                Arc::ptr_eq(out.buffer(), t.buffer()),
                want.shares,
                "{:?}: shares storage? layout {:?} -> {:?}",
                kind,
                t.layout(),
                out.layout()
            );
            Ok(Some((out, want.model, want.shares)))
        }
        (Err(_), None) => Ok(None),
        (Ok(out), None) => Err(TestCaseError::fail(format!(
            "{kind:?} on {:?} should fail, gave {:?}",
            m.dims,
            out.dims()
        ))),
        (Err(e), Some(w)) => Err(TestCaseError::fail(format!(
            "{kind:?} on {:?} should give {:?}, failed: {e}",
            m.dims, w.model.dims
        ))),
    }
}

/// Resolves one -1 in a reshape's sizes, as PyTorch does.
fn infer(sizes: &[isize], n: usize) -> Option<Vec<usize>> {
    if sizes.iter().filter(|&&s| s == -1).count() > 1 || sizes.iter().any(|&s| s < -1) {
        return None;
    }
    let known: usize = sizes.iter().filter(|&&s| s >= 0).map(|&s| s as usize).product();
    let mut out: Vec<usize> = sizes.iter().map(|&s| s.max(0) as usize).collect();
    if let Some(i) = sizes.iter().position(|&s| s == -1) {
        if known == 0 || !n.is_multiple_of(known) {
            return None;
        }
        out[i] = n / known;
    }
    (numel(&out) == n).then_some(out)
}

/// The tensor shows exactly the model: shape, values, storage positions.
fn check(t: &Tensor, m: &Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(t.dims(), &m.dims[..]);
    let l = t.layout();
    let pos: Vec<usize> = l.indices().collect();
    prop_assert_eq!(&pos, &m.pos, "storage positions of {:?}", l);
    prop_assert_eq!(blocks(l), m.pos.clone(), "blocks of {:?}", l);
    if !m.pos.is_empty() {
        prop_assert_eq!(l.is_contiguous(), m.is_contiguous(), "is_contiguous of {:?}", l);
        prop_assert_eq!(l.storage_extent(), m.pos.iter().max().map_or(0, |&p| p + 1));
        prop_assert!(l.storage_extent() <= t.buffer().len());
    }
    let values = t.contiguous().and_then(|c| c.to_vec::<i64>());
    prop_assert_eq!(values.as_ref().map_err(|e| e.to_string()), Ok(&m.vals));
    Ok(())
}

/// Storage positions as `Layout::blocks` lays them out.
fn blocks(l: &Layout) -> Vec<usize> {
    match l.blocks() {
        StridedBlocks::Single { start, len } => (start..start + len).collect(),
        StridedBlocks::Multiple { starts, run_len } => starts.flat_map(|s| s..s + run_len).collect(),
    }
}

fn base_shape() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(
        prop_oneof![1 => Just(0usize), 2 => Just(1usize), 14 => 2usize..=4],
        0..=4,
    )
}

fn steps() -> impl Strategy<Value = Vec<(usize, u64)>> {
    prop::collection::vec((0..KINDS.len(), any::<u64>()), 1..16)
}

#[test]
fn view_chains_match_the_model() {
    // Per kind of step: how often it succeeded and how often it (rightly)
    // failed, to show the chains exercise both sides of every step.
    let ok: Vec<AtomicUsize> = KINDS.iter().map(|_| AtomicUsize::new(0)).collect();
    let failed: Vec<AtomicUsize> = KINDS.iter().map(|_| AtomicUsize::new(0)).collect();
    let reshape_copies = AtomicUsize::new(0);
    let config = ProptestConfig {
        cases: 2048,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    // A fixed seed keeps the coverage counts below stable from run to run.
    let mut runner = TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let result = runner.run(&(base_shape(), steps()), |(dims, chain)| {
        let n = numel(&dims);
        let data = CpuStorage::from_vec((0..n as i64).collect::<Vec<_>>());
        let mut t = Tensor::from_storage(data, dims.clone()).unwrap();
        let mut m = Model::arange(&dims);
        check(&t, &m)?;
        for (k, seed) in chain {
            match step(&t, &m, KINDS[k], seed)? {
                Some((t2, m2, shared)) => {
                    ok[k].fetch_add(1, Ordering::Relaxed);
                    if matches!(KINDS[k], Kind::Reshape) && !shared {
                        reshape_copies.fetch_add(1, Ordering::Relaxed);
                    }
                    t = t2;
                    m = m2;
                }
                None => {
                    failed[k].fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let copies = reshape_copies.load(Ordering::Relaxed);
    let reshape_at = KINDS.iter().position(|k| matches!(k, Kind::Reshape)).unwrap_or(0);
    let reshapes = ok[reshape_at].load(Ordering::Relaxed);
    eprintln!("Reshape: {copies} of {reshapes} needed a copy");
    assert!(
        copies >= 20 && reshapes - copies >= 20,
        "reshape: {copies} copies of {reshapes}"
    );
    for (k, kind) in KINDS.iter().enumerate() {
        let (ok, failed) = (ok[k].load(Ordering::Relaxed), failed[k].load(Ordering::Relaxed));
        eprintln!("{kind:?}: {ok} applied, {failed} rejected or skipped");
        assert!(ok >= 20, "{kind:?} applied only {ok} times");
        if !matches!(kind, Kind::Unsqueeze | Kind::SqueezeAll | Kind::Contiguous) {
            assert!(failed >= 5, "{kind:?} was rejected only {failed} times");
        }
    }
}

// ---------------------------------------------------------------------------
// Layouts from arbitrary parts

/// Storage positions of a layout, computed naively from its parts.
fn naive_positions(dims: &[usize], strides: &[usize], offset: usize) -> Vec<usize> {
    (0..numel(dims))
        .map(|f| {
            offset
                + unravel(f, dims)
                    .iter()
                    .zip(strides)
                    .map(|(&i, &s)| i * s)
                    .sum::<usize>()
        })
        .collect()
}

fn parts() -> impl Strategy<Value = (Vec<usize>, Vec<usize>, usize)> {
    prop::collection::vec((0usize..=4, 0usize..=40), 0..=5).prop_flat_map(|ds| {
        let (dims, strides): (Vec<usize>, Vec<usize>) = ds.into_iter().unzip();
        (Just(dims), Just(strides), 0usize..=50)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Any strides, overlapping or zero: iteration, blocks, extent and
    /// contiguity agree with the naive positions, and every view method and
    /// reshape either fails or gives what the model gives.
    #[test]
    fn layouts_from_any_parts(p in parts(), seeds in prop::collection::vec(any::<u64>(), 1..6)) {
        let (dims, strides, offset) = p;
        let l = Layout::from_parts(Shape::from(dims.clone()), strides.clone(), offset).unwrap();
        let pos = naive_positions(&dims, &strides, offset);
        prop_assert_eq!(l.indices().collect::<Vec<_>>(), pos.clone());
        prop_assert_eq!(blocks(&l), pos.clone());
        let m = Model { dims: dims.clone(), vals: (0..pos.len() as i64).collect(), pos: pos.clone() };
        if !pos.is_empty() {
            prop_assert_eq!(l.storage_extent(), pos.iter().max().unwrap() + 1);
            prop_assert_eq!(l.is_contiguous(), m.is_contiguous());
            prop_assert_eq!(l.contiguous_range().is_some(), m.is_contiguous());
        }
        for seed in seeds {
            let mut seq = Seq::new(seed);
            let rank = dims.len();
            let got = |r: rustorch_core::Result<Layout>| r.ok().map(|l| naive_positions(l.dims(), l.strides(), l.offset()));
            let want = |m: Option<Model>| m.map(|m| m.pos);
            let (a, b) = (seq.dim(rank), seq.dim(rank));
            prop_assert_eq!(got(l.transpose("t", a, b)), want(m.transpose(a, b)));
            let (start, len) = (seq.below(6), seq.below(6));
            prop_assert_eq!(got(l.narrow("t", a, start, len)), want(m.narrow(a, start, len)));
            let u = seq.dim(rank + 1);
            prop_assert_eq!(got(l.unsqueeze("t", u)), want(m.unsqueeze(u)));
            prop_assert_eq!(got(l.squeeze("t", a)), want(m.squeeze(a)));
            let perm: Vec<isize> = (0..rank).map(|_| seq.dim(rank)).collect();
            prop_assert_eq!(got(l.permute("t", &perm)), want(m.permute(&perm)));
            let target = broadcast_target(&dims, &mut seq);
            prop_assert_eq!(got(l.broadcast_as("t", &Shape::from(target.clone()))), want(m.broadcast(&target)));
            let mut target = reshape_target(&dims, &mut seq);
            if seq.coin(10) {
                target.push(3);
            }
            let rv = l.reshape_view(&Shape::from(target.clone()));
            let possible = numel(&target) == pos.len() && m.view_possible(&target);
            prop_assert_eq!(rv.is_some(), possible, "reshape_view {:?} -> {:?}", l, target);
            if let Some(v) = rv {
                prop_assert_eq!(v.dims(), &target[..]);
                if !pos.is_empty() {
                    prop_assert_eq!(naive_positions(v.dims(), v.strides(), v.offset()), pos.clone());
                }
            }
        }
    }

    /// Absurd strides and offsets: no method panics or wraps around.
    #[test]
    fn huge_layouts_do_not_overflow(
        dims in prop::collection::vec(1usize..=5, 1..=4),
        strides in prop::collection::vec(0usize..=usize::MAX, 4),
        offset in 0usize..=usize::MAX,
        d in -6isize..6,
        start in 0usize..6,
        len in 0usize..6,
    ) {
        let strides = strides[..dims.len()].to_vec();
        prop_assert!(Layout::from_parts(Shape::from(dims.clone()), strides[1..].to_vec(), 0).is_err());
        let l = Layout::from_parts(Shape::from(dims.clone()), strides.clone(), offset).unwrap();
        // The exact extent, in wide arithmetic, saturated.
        let exact: u128 = offset as u128 + dims.iter().zip(&strides).map(|(&n, &s)| (n as u128 - 1) * s as u128).sum::<u128>() + 1;
        prop_assert_eq!(l.storage_extent() as u128, exact.min(usize::MAX as u128));
        let _ = l.is_contiguous();
        let _ = l.transpose("t", d, 0);
        let _ = l.permute("t", &[d, 0]);
        if let Ok(n) = l.narrow("t", d, start, len) {
            prop_assert!(len == 0 || n.offset() >= offset);
        }
        let _ = l.unsqueeze("t", d);
        let _ = l.squeeze("t", d);
        let _ = l.broadcast_as("t", &Shape::from([2, 3]));
        let total = numel(&dims);
        let _ = l.reshape_view(&Shape::from([total]));
        let _ = l.reshape_view(&Shape::from([1, total, 1]));
        let _ = l.reshape_view(&Shape::from([total + 1]));
    }
}

// ---------------------------------------------------------------------------
// Broadcasting

/// NumPy's rule: align from the right; equal sizes stay, a 1 takes the other.
fn naive_broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let pad = |s: &[usize]| {
        let mut v = vec![1; rank - s.len()];
        v.extend_from_slice(s);
        v
    };
    let (a, b) = (pad(a), pad(b));
    a.iter()
        .zip(&b)
        .map(|(&x, &y)| match (x, y) {
            _ if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

fn small_shape() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(
        prop_oneof![1 => Just(0usize), 3 => Just(1usize), 3 => 2usize..=4],
        0..=5,
    )
}

/// Pairs likely to broadcast: `b` is `a` with dims dropped from the front
/// and some sizes set to 1.
fn compatible_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (small_shape(), any::<u64>()).prop_map(|(a, seed)| {
        let mut seq = Seq::new(seed);
        let drop = seq.below(a.len() + 1);
        let b = a[drop..].iter().map(|&d| if seq.coin(40) { 1 } else { d }).collect();
        if seq.coin(50) {
            (a, b)
        } else {
            (b, a)
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn broadcast_matches_numpy_rules(pair in prop_oneof![compatible_pair(), (small_shape(), small_shape())]) {
        let (a, b) = pair;
        let (sa, sb) = (Shape::from(a.clone()), Shape::from(b.clone()));
        let want = naive_broadcast(&a, &b);
        let got = Shape::broadcast("t", &sa, &sb);
        prop_assert_eq!(got.as_ref().ok().map(|s| s.dims().to_vec()), want.clone(), "{:?} with {:?}", a, b);
        if let Err(e) = &got {
            let is_shape_error = matches!(e, rustorch_core::Error::Shape { .. });
            prop_assert!(is_shape_error, "{}", e);
        }
        // Symmetric, and the same through broadcast_all.
        prop_assert_eq!(Shape::broadcast("t", &sb, &sa).ok(), got.clone().ok());
        prop_assert_eq!(Shape::broadcast_all("t", &[&sa, &sb]).ok(), got.clone().ok());
        if let Ok(out) = got {
            // Both operands view as the result, repeating along size-1 dims.
            for (s, dims) in [(&sa, &a), (&sb, &b)] {
                let l = Layout::contiguous(s.clone()).broadcast_as("t", &out).unwrap();
                let m = Model::arange(dims).broadcast(out.dims()).unwrap();
                prop_assert_eq!(l.indices().collect::<Vec<_>>(), m.pos);
            }
        }
    }

    #[test]
    fn broadcast_all_folds_pairwise(shapes in prop::collection::vec(small_shape(), 0..4)) {
        let refs: Vec<Shape> = shapes.iter().map(|s| Shape::from(s.clone())).collect();
        let want = shapes.iter().try_fold(Vec::new(), |acc, s| naive_broadcast(&acc, s));
        let got = Shape::broadcast_all("t", &refs.iter().collect::<Vec<_>>());
        prop_assert_eq!(got.ok().map(|s| s.dims().to_vec()), want);
    }
}

#[test]
fn broadcast_edge_cases() {
    let b = |a: &[usize], c: &[usize]| {
        Shape::broadcast("t", &Shape::from(a), &Shape::from(c))
            .ok()
            .map(|s| s.dims().to_vec())
    };
    assert_eq!(b(&[], &[]), Some(vec![]));
    assert_eq!(b(&[], &[0]), Some(vec![0]));
    assert_eq!(b(&[1], &[0]), Some(vec![0]));
    assert_eq!(b(&[0], &[3]), None);
    assert_eq!(b(&[2, 1, 4], &[3, 1]), Some(vec![2, 3, 4]));
    assert_eq!(b(&[2, 3], &[3, 2]), None);
    assert_eq!(b(&[5, 1, 1], &[1]), Some(vec![5, 1, 1]));
}

/// Cases the properties once found, kept as plain tests.
#[test]
fn view_regressions() {
    // Narrowing a dim of a tensor that is empty through another dim used to
    // move the offset past the end of the (empty) storage, and reading the
    // view panicked.
    let t = Tensor::from_storage(CpuStorage::from_vec(Vec::<i64>::new()), [0, 4]).unwrap();
    let v = t.narrow(1, 3, 1).unwrap();
    assert!(v.layout().storage_extent() <= t.buffer().len());
    assert_eq!(v.to_vec::<i64>().unwrap(), Vec::<i64>::new());
    assert_eq!(t.slice(1, 1, 4, 2).unwrap().dims(), &[0, 2]);

    // A step far past the end leaves one element, without overflowing the stride.
    let t = Tensor::from_storage(CpuStorage::from_vec((0..12i64).collect::<Vec<_>>()), [3, 4]).unwrap();
    let s = t.slice(1, 1, 4, usize::MAX).unwrap();
    assert_eq!(s.dims(), &[3, 1]);
    assert_eq!(s.to_vec::<i64>().unwrap(), vec![1, 5, 9]);

    // PyTorch: an empty dim splits into one empty piece and chunks into
    // `chunks` empty pieces.
    let e = Tensor::from_storage(CpuStorage::from_vec(Vec::<i64>::new()), [0, 3]).unwrap();
    assert_eq!(e.split(2, 0).unwrap().len(), 1);
    assert_eq!(e.chunk(3, 0).unwrap().len(), 3);
    assert!(e.chunk(3, 0).unwrap().iter().all(|p| p.dims() == [0, 3]));
    // And `chunk` may return fewer pieces than asked for, as PyTorch does.
    let t6 = Tensor::from_storage(CpuStorage::from_vec((0..6i64).collect::<Vec<_>>()), [6]).unwrap();
    let sizes: Vec<usize> = t6.chunk(4, 0).unwrap().iter().map(|p| p.dims()[0]).collect();
    assert_eq!(sizes, vec![2, 2, 2]);

    // An empty non-contiguous view can still be viewed in any shape of no
    // elements (PyTorch: torch.empty(0, 3).t().view(-1)).
    let et = e.transpose(0, 1).unwrap();
    assert!(!et.is_contiguous());
    let flat = et.view([0]).unwrap();
    assert!(Arc::ptr_eq(flat.buffer(), e.buffer()));

    // Mismatched element counts are never a view.
    assert!(Layout::contiguous([2, 3]).reshape_view(&Shape::from([7])).is_none());
}
