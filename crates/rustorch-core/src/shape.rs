//! Tensor shapes, dimension arithmetic and NumPy broadcasting.

use crate::error::{Error, Result};
use std::fmt;

#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(Vec<usize>);

impl Shape {
    pub fn new(dims: Vec<usize>) -> Self {
        Shape(dims)
    }

    pub fn scalar() -> Self {
        Shape(Vec::new())
    }

    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    pub fn rank(&self) -> usize {
        self.0.len()
    }

    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }

    /// The element count, or `None` when it does not fit in a `usize`.
    pub fn checked_numel(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// Row-major strides of a contiguous tensor of this shape, in elements.
    pub fn contiguous_strides(&self) -> Vec<usize> {
        let mut strides = vec![0; self.0.len()];
        let mut acc = 1;
        for (s, &d) in strides.iter_mut().zip(&self.0).rev() {
            *s = acc;
            acc *= d;
        }
        strides
    }

    /// Resolves a possibly negative dimension index (PyTorch style).
    pub fn dim(&self, op: &str, dim: isize) -> Result<usize> {
        normalize_dim(op, dim, self.rank())
    }

    /// Size of a (possibly negative) dimension.
    pub fn size(&self, op: &str, dim: isize) -> Result<usize> {
        Ok(self.0[self.dim(op, dim)?])
    }

    /// The shape both operands broadcast to, NumPy rules.
    pub fn broadcast(op: impl std::fmt::Display, a: &Shape, b: &Shape) -> Result<Shape> {
        let rank = a.rank().max(b.rank());
        let mut out = vec![0; rank];
        for (i, o) in out.iter_mut().enumerate() {
            let da = dim_from_end(a, rank - 1 - i);
            let db = dim_from_end(b, rank - 1 - i);
            *o = match (da, db) {
                (x, y) if x == y => x,
                (1, y) => y,
                (x, 1) => x,
                _ => {
                    return Err(Error::shape(
                        op.to_string(),
                        format!("shapes cannot be broadcast together (dim {i} of the result: {da} vs {db})"),
                        &[a, b],
                    ))
                }
            };
        }
        Ok(Shape(out))
    }

    /// Broadcasts any number of shapes.
    pub fn broadcast_all(op: impl std::fmt::Display + Copy, shapes: &[&Shape]) -> Result<Shape> {
        let mut out = Shape::scalar();
        for s in shapes {
            out = Shape::broadcast(op, &out, s)?;
        }
        Ok(out)
    }
}

fn dim_from_end(s: &Shape, i_from_end: usize) -> usize {
    if i_from_end < s.rank() {
        s.0[s.rank() - 1 - i_from_end]
    } else {
        1
    }
}

/// Resolves a possibly negative dimension index against a rank.
pub fn normalize_dim(op: &str, dim: isize, rank: usize) -> Result<usize> {
    let r = rank as isize;
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r.max(0) {
        return Err(Error::DimOutOfRange {
            op: op.to_string(),
            dim,
            rank,
        });
    }
    Ok(d as usize)
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl From<Vec<usize>> for Shape {
    fn from(v: Vec<usize>) -> Self {
        Shape(v)
    }
}
impl From<&[usize]> for Shape {
    fn from(v: &[usize]) -> Self {
        Shape(v.to_vec())
    }
}
impl<const N: usize> From<[usize; N]> for Shape {
    fn from(v: [usize; N]) -> Self {
        Shape(v.to_vec())
    }
}
impl From<&Shape> for Shape {
    fn from(v: &Shape) -> Self {
        v.clone()
    }
}
impl From<()> for Shape {
    fn from(_: ()) -> Self {
        Shape(Vec::new())
    }
}
impl From<usize> for Shape {
    fn from(v: usize) -> Self {
        Shape(vec![v])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting() {
        let a = Shape::from([3, 1, 5]);
        let b = Shape::from([4, 1]);
        assert_eq!(Shape::broadcast("t", &a, &b).unwrap().dims(), &[3, 4, 5]);
        assert!(Shape::broadcast("t", &Shape::from([2, 3]), &Shape::from([4])).is_err());
    }

    #[test]
    fn negative_dims() {
        let s = Shape::from([2, 3, 4]);
        assert_eq!(s.dim("t", -1).unwrap(), 2);
        assert!(s.dim("t", 3).is_err());
        assert!(s.dim("t", -4).is_err());
    }
}
