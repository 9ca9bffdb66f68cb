//! The generic machinery every elementwise op runs on: element functions
//! (`Map1`, `Map2`), row loops specialized by how each input is read
//! (`Src`), f16/bf16 handled by converting blocks to f32, and `map1`/`map2`,
//! which run each chunk of the parallel driver (`par`) under the widest
//! SIMD level.
//!
//! Hot paths avoid closures on purpose: element functions are zero-sized
//! (or small `Copy`) types with `#[inline(always)]` methods, so the whole
//! loop nest is compiled into each `simd_run` copy and vectorized there.

use super::par::fill_chunks;
use super::plan::Plan;
use crate::vecmath::{simd_run, SimdTask};
use half::{bf16, f16};
use rustorch_core::dtype::WithDType;
use std::mem::MaybeUninit;

/// Elements per block when a row is staged through a stack buffer.
pub(super) const BLOCK: usize = 256;

/// How one input of a row is read.
#[derive(Clone, Copy)]
pub(super) enum Src<'a, T> {
    Slice(&'a [T]),
    /// One value for the whole row (a broadcast operand).
    Scalar(T),
    Strided {
        data: &'a [T],
        start: usize,
        stride: usize,
    },
}

impl<'a, T: Copy> Src<'a, T> {
    #[inline(always)]
    pub fn new(data: &'a [T], off: usize, stride: usize, len: usize) -> Self {
        match stride {
            0 => Src::Scalar(data[off]),
            1 => Src::Slice(&data[off..off + len]),
            _ => Src::Strided {
                data,
                start: off,
                stride,
            },
        }
    }

    #[inline(always)]
    pub fn get(self, i: usize) -> T {
        match self {
            Src::Slice(s) => s[i],
            Src::Scalar(v) => v,
            Src::Strided { data, start, stride } => data[start + i * stride],
        }
    }

    /// The part of the row from `from`, `len` long.
    #[inline(always)]
    pub fn sub(self, from: usize, len: usize) -> Self {
        match self {
            Src::Slice(s) => Src::Slice(&s[from..from + len]),
            Src::Scalar(v) => Src::Scalar(v),
            Src::Strided { data, start, stride } => Src::Strided {
                data,
                start: start + from * stride,
                stride,
            },
        }
    }

    /// Copies `out.len()` elements into a buffer.
    #[inline(always)]
    pub fn read(self, out: &mut [T]) {
        match self {
            Src::Slice(s) => out.copy_from_slice(&s[..out.len()]),
            Src::Scalar(v) => out.fill(v),
            Src::Strided { data, start, stride } => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = data[start + i * stride];
                }
            }
        }
    }
}

/// An element function of one input. `slice` may be overridden by ops that
/// need a fix-up pass (sin and cos for huge arguments).
pub(super) trait Map1<T: Copy, U>: Copy + Send + Sync {
    fn f(self, x: T) -> U;

    #[inline(always)]
    fn slice(self, x: &[T], out: &mut [MaybeUninit<U>]) {
        map_slice(self, x, out)
    }
}

/// The default `Map1::slice`: `out[i] = k.f(x[i])` for the common length,
/// as a loop LLVM vectorizes (also the fallback of ops whose `slice` has a
/// hand-written fast path).
#[inline(always)]
pub(super) fn map_slice<T: Copy, U, K: Map1<T, U>>(k: K, x: &[T], out: &mut [MaybeUninit<U>]) {
    // Two vectors' worth per step: independent dependency chains keep
    // the FMA units busy through long polynomial evaluations.
    const STEP: usize = 32;
    let n = out.len().min(x.len());
    let (out, x) = (&mut out[..n], &x[..n]);
    let mut oc = out.chunks_exact_mut(STEP);
    let mut xc = x.chunks_exact(STEP);
    for (o, v) in (&mut oc).zip(&mut xc) {
        for i in 0..STEP {
            o[i].write(k.f(v[i]));
        }
    }
    for (o, &v) in oc.into_remainder().iter_mut().zip(xc.remainder()) {
        o.write(k.f(v));
    }
}

/// An element function of two inputs.
pub(super) trait Map2<T: Copy, U>: Copy + Send + Sync {
    fn f(self, a: T, b: T) -> U;
}

/// A way to compute one output row from its input rows.
pub(super) trait Row1<T, U>: Copy + Send + Sync {
    fn row(self, x: Src<'_, T>, out: &mut [MaybeUninit<U>]);
}
pub(super) trait Row2<T, U>: Copy + Send + Sync {
    fn row(self, a: Src<'_, T>, b: Src<'_, T>, out: &mut [MaybeUninit<U>]);
}

/// Applies an element function in the input's own type.
#[derive(Clone, Copy)]
pub(super) struct Plain<K>(pub K);

impl<T: Copy + Default + Send + Sync, U: Copy, K: Map1<T, U>> Row1<T, U> for Plain<K> {
    #[inline(always)]
    fn row(self, x: Src<'_, T>, out: &mut [MaybeUninit<U>]) {
        match x {
            Src::Slice(s) => self.0.slice(s, out),
            Src::Scalar(v) => {
                // Through `slice`, so that a broadcast value gets the same
                // result as the same value in a contiguous row (ops with a
                // hand-written `slice` may differ from `f` by an ulp).
                let mut y = [MaybeUninit::<U>::uninit()];
                self.0.slice(&[v], &mut y);
                // SAFETY: `slice` writes every element of its output.
                let y = unsafe { y[0].assume_init() };
                for o in out.iter_mut() {
                    o.write(y);
                }
            }
            Src::Strided { .. } => {
                // Gather a block, then run the same vectorized slice loop.
                let mut buf = [T::default(); BLOCK];
                let mut i = 0;
                for o in out.chunks_mut(BLOCK) {
                    let b = &mut buf[..o.len()];
                    x.sub(i, o.len()).read(b);
                    self.0.slice(b, o);
                    i += o.len();
                }
            }
        }
    }
}

/// A binary row whose inputs are slices or single values (no strides).
#[inline(always)]
fn row2_dense<T: Copy, U: Copy, K: Map2<T, U>>(k: K, a: Src<'_, T>, b: Src<'_, T>, out: &mut [MaybeUninit<U>]) {
    match (a, b) {
        (Src::Slice(x), Src::Slice(y)) => {
            for ((o, &p), &q) in out.iter_mut().zip(x).zip(y) {
                o.write(k.f(p, q));
            }
        }
        (Src::Slice(x), Src::Scalar(q)) => {
            for (o, &p) in out.iter_mut().zip(x) {
                o.write(k.f(p, q));
            }
        }
        (Src::Scalar(p), Src::Slice(y)) => {
            for (o, &q) in out.iter_mut().zip(y) {
                o.write(k.f(p, q));
            }
        }
        _ => {
            for (i, o) in out.iter_mut().enumerate() {
                o.write(k.f(a.get(i), b.get(i)));
            }
        }
    }
}

impl<T: Copy + Default + Send + Sync, U: Copy, K: Map2<T, U>> Row2<T, U> for Plain<K> {
    #[inline(always)]
    fn row(self, a: Src<'_, T>, b: Src<'_, T>, out: &mut [MaybeUninit<U>]) {
        let strided = |s: &Src<'_, T>| matches!(s, Src::Strided { .. });
        if !strided(&a) && !strided(&b) {
            return row2_dense(self.0, a, b, out);
        }
        // Gather strided operands a block at a time, then run the dense
        // (vectorized) loop on the blocks.
        let mut ab = [T::default(); BLOCK];
        let mut bb = [T::default(); BLOCK];
        let mut i = 0;
        for o in out.chunks_mut(BLOCK) {
            let n = o.len();
            let (pa, pb) = (a.sub(i, n), b.sub(i, n));
            if strided(&pa) {
                pa.read(&mut ab[..n]);
            }
            if strided(&pb) {
                pb.read(&mut bb[..n]);
            }
            let xa = if strided(&pa) { Src::Slice(&ab[..n]) } else { pa };
            let xb = if strided(&pb) { Src::Slice(&bb[..n]) } else { pb };
            row2_dense(self.0, xa, xb, o);
            i += n;
        }
    }
}

/// f16 and bf16: the element function runs in f32 on blocks converted from
/// the inputs, and results are rounded once when stored.
#[derive(Clone, Copy)]
pub(super) struct ViaF32<K>(pub K);

/// A 16-bit float type with block conversions to and from f32.
pub(super) trait Half: WithDType + Default {
    fn to_f32_block(src: &[Self], dst: &mut [f32]);
    fn from_f32_block(src: &[f32], dst: &mut [Self]);
}

impl Half for f16 {
    #[inline(always)]
    fn to_f32_block(src: &[Self], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
    #[inline(always)]
    fn from_f32_block(src: &[f32], dst: &mut [Self]) {
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src);
    }
}

impl Half for bf16 {
    #[inline(always)]
    fn to_f32_block(src: &[Self], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32::from_bits((s.to_bits() as u32) << 16);
        }
    }
    #[inline(always)]
    fn from_f32_block(src: &[f32], dst: &mut [Self]) {
        // Round to nearest even; NaNs stay (quiet) NaNs.
        for (d, &s) in dst.iter_mut().zip(src) {
            let b = s.to_bits();
            let rounded = ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16;
            let nan = ((b >> 16) as u16) | 0x0040;
            *d = bf16::from_bits(if s.is_nan() { nan } else { rounded });
        }
    }
}

/// Output types a block of f32-computed results (`V`) can be stored into.
pub(super) trait StoreFrom<V>: Sized {
    fn store(src: &[V], dst: &mut [MaybeUninit<Self>]);
}

impl<H: Half> StoreFrom<f32> for H {
    #[inline(always)]
    fn store(src: &[f32], dst: &mut [MaybeUninit<Self>]) {
        let mut tmp = [H::default(); BLOCK];
        let t = &mut tmp[..src.len()];
        H::from_f32_block(src, t);
        for (d, &v) in dst.iter_mut().zip(t.iter()) {
            d.write(v);
        }
    }
}

impl StoreFrom<bool> for bool {
    #[inline(always)]
    fn store(src: &[bool], dst: &mut [MaybeUninit<Self>]) {
        for (d, &v) in dst.iter_mut().zip(src) {
            d.write(v);
        }
    }
}

/// Reads `len` elements of a half-precision row into f32.
#[inline(always)]
fn load_f32<H: Half>(src: Src<'_, H>, from: usize, dst: &mut [f32]) {
    match src.sub(from, dst.len()) {
        Src::Slice(s) => H::to_f32_block(s, dst),
        Src::Scalar(v) => dst.fill(v.to_f32()),
        s @ Src::Strided { .. } => {
            let mut tmp = [H::default(); BLOCK];
            let t = &mut tmp[..dst.len()];
            s.read(t);
            H::to_f32_block(t, dst);
        }
    }
}

impl<H: Half, K: Map1<f32, f32>> Row1<H, H> for ViaF32<K> {
    #[inline(always)]
    fn row(self, x: Src<'_, H>, out: &mut [MaybeUninit<H>]) {
        let mut xf = [0f32; BLOCK];
        let mut yf = [MaybeUninit::<f32>::uninit(); BLOCK];
        let mut y = [0f32; BLOCK];
        let mut i = 0;
        for o in out.chunks_mut(BLOCK) {
            let n = o.len();
            load_f32(x, i, &mut xf[..n]);
            self.0.slice(&xf[..n], &mut yf[..n]);
            for (d, s) in y[..n].iter_mut().zip(&yf[..n]) {
                // SAFETY: `slice` writes every element of its output.
                *d = unsafe { s.assume_init() };
            }
            H::store(&y[..n], o);
            i += n;
        }
    }
}

/// A binary row through f32 blocks; `V` is the f32 kernel's result type.
#[inline(always)]
fn via_f32_row2<H: Half, V: Copy + Default, U: StoreFrom<V>, K: Map2<f32, V>>(
    k: K,
    a: Src<'_, H>,
    b: Src<'_, H>,
    out: &mut [MaybeUninit<U>],
) {
    let mut af = [0f32; BLOCK];
    let mut bf = [0f32; BLOCK];
    let mut y = [V::default(); BLOCK];
    let mut i = 0;
    for o in out.chunks_mut(BLOCK) {
        let n = o.len();
        load_f32(a, i, &mut af[..n]);
        load_f32(b, i, &mut bf[..n]);
        for ((d, &p), &q) in y[..n].iter_mut().zip(&af[..n]).zip(&bf[..n]) {
            *d = k.f(p, q);
        }
        U::store(&y[..n], o);
        i += n;
    }
}

impl<H: Half, K: Map2<f32, f32>> Row2<H, H> for ViaF32<K> {
    #[inline(always)]
    fn row(self, a: Src<'_, H>, b: Src<'_, H>, out: &mut [MaybeUninit<H>]) {
        via_f32_row2::<H, f32, H, K>(self.0, a, b, out)
    }
}

impl<H: Half, K: Map2<f32, bool>> Row2<H, bool> for ViaF32<K> {
    #[inline(always)]
    fn row(self, a: Src<'_, H>, b: Src<'_, H>, out: &mut [MaybeUninit<bool>]) {
        via_f32_row2::<H, bool, bool, K>(self.0, a, b, out)
    }
}

/// One chunk of a one-input op, run under `simd_run`.
pub(super) struct Task1<'a, T, U, R> {
    pub plan: &'a Plan<1>,
    pub x: &'a [T],
    pub start: usize,
    pub out: &'a mut [MaybeUninit<U>],
    pub row: R,
}

impl<T: Copy, U, R: Row1<T, U>> SimdTask for Task1<'_, T, U, R> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let [s] = self.plan.inner_strides();
        for r in self.plan.rows(self.start, self.start + self.out.len()) {
            let x = Src::new(self.x, r.offs[0], s, r.len);
            self.row.row(x, &mut self.out[r.out..r.out + r.len]);
        }
    }
}

/// One chunk of a two-input op, run under `simd_run`.
pub(super) struct Task2<'a, T, U, R> {
    pub plan: &'a Plan<2>,
    pub a: &'a [T],
    pub b: &'a [T],
    pub start: usize,
    pub out: &'a mut [MaybeUninit<U>],
    pub row: R,
}

impl<T: Copy, U, R: Row2<T, U>> SimdTask for Task2<'_, T, U, R> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let [sa, sb] = self.plan.inner_strides();
        for r in self.plan.rows(self.start, self.start + self.out.len()) {
            let a = Src::new(self.a, r.offs[0], sa, r.len);
            let b = Src::new(self.b, r.offs[1], sb, r.len);
            self.row.row(a, b, &mut self.out[r.out..r.out + r.len]);
        }
    }
}

/// Runs a one-input row function over a whole plan.
pub(super) fn map1<T: Copy + Sync, U: Send, R: Row1<T, U>>(plan: &Plan<1>, x: &[T], row: R) -> Vec<U> {
    fill_chunks(plan.numel(), plan.granule(), |start, out| {
        simd_run(Task1 {
            plan,
            x,
            start,
            out,
            row,
        });
    })
}

/// Runs a two-input row function over a whole plan.
pub(super) fn map2<T: Copy + Sync, U: Send, R: Row2<T, U>>(plan: &Plan<2>, a: &[T], b: &[T], row: R) -> Vec<U> {
    fill_chunks(plan.numel(), plan.granule(), |start, out| {
        simd_run(Task2 {
            plan,
            a,
            b,
            start,
            out,
            row,
        });
    })
}
