//! Runtime element types and the static types that back them.

use half::{bf16, f16};
use num_complex::Complex32;
use std::fmt;

/// Complex number with two `f32` parts (PyTorch's `complex64`).
pub type C64 = Complex32;

/// The element type of a tensor, chosen at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    Bool,
    U8,
    I32,
    I64,
    F16,
    BF16,
    F32,
    F64,
    C64,
}

impl DType {
    /// Every dtype, in promotion order.
    pub const ALL: [DType; 9] = [
        DType::Bool,
        DType::U8,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::C64,
    ];

    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::Bool | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 | DType::C64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::U8 | DType::I32 | DType::I64)
    }

    pub fn is_complex(self) -> bool {
        self == DType::C64
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::C64 => "c64",
        }
    }

    /// Parses the names `name()` prints, plus PyTorch's spellings.
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s {
            "bool" => DType::Bool,
            "u8" | "uint8" => DType::U8,
            "i32" | "int32" => DType::I32,
            "i64" | "int64" => DType::I64,
            "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "f32" | "float32" | "float" => DType::F32,
            "f64" | "float64" | "double" => DType::F64,
            "c64" | "complex64" => DType::C64,
            _ => return None,
        })
    }

    /// The dtype both operands of a binary op are cast to, following PyTorch's
    /// promotion lattice for tensors of equal rank category.
    pub fn promote(a: DType, b: DType) -> DType {
        use DType::*;
        if a == b {
            return a;
        }
        match (a, b) {
            (C64, _) | (_, C64) => C64,
            (F16, BF16) | (BF16, F16) => F32,
            _ => a.max(b),
        }
    }

    /// The floating dtype an op with a real-valued result (mean, sqrt, true
    /// division) produces for this input, as PyTorch does: integers and bools
    /// become the default float type, f32.
    pub fn to_float(self) -> DType {
        if self.is_float() || self.is_complex() {
            self
        } else {
            DType::F32
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust element type that a `DType` stands for.
///
/// Every kernel that is generic over element types goes through this trait,
/// so the conversions are written once.
pub trait WithDType: Copy + Clone + Send + Sync + fmt::Debug + PartialEq + Default + 'static {
    const DTYPE: DType;
    fn from_f64(v: f64) -> Self;
    /// The value as f64; complex numbers give their real part.
    fn to_f64(self) -> f64;
    fn from_f32(v: f32) -> Self {
        Self::from_f64(v as f64)
    }
    fn to_f32(self) -> f32 {
        self.to_f64() as f32
    }
    fn zero() -> Self {
        Self::default()
    }
    fn one() -> Self {
        Self::from_f64(1.0)
    }
}

macro_rules! with_dtype_prim {
    ($t:ty, $d:ident) => {
        impl WithDType for $t {
            const DTYPE: DType = DType::$d;
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    };
}
with_dtype_prim!(u8, U8);
with_dtype_prim!(i32, I32);
with_dtype_prim!(i64, I64);
with_dtype_prim!(f64, F64);

impl WithDType for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl WithDType for bool {
    const DTYPE: DType = DType::Bool;
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        if self {
            1.0
        } else {
            0.0
        }
    }
}

impl WithDType for f16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

impl WithDType for bf16 {
    const DTYPE: DType = DType::BF16;
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

impl WithDType for C64 {
    const DTYPE: DType = DType::C64;
    fn from_f64(v: f64) -> Self {
        C64::new(v as f32, 0.0)
    }
    fn to_f64(self) -> f64 {
        self.re as f64
    }
}

/// A single value of any dtype, used for fill values and scalar operands.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    Bool(bool),
    Int(i64),
    Float(f64),
    Complex(f32, f32),
}

impl Scalar {
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b as i64 as f64,
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
            Scalar::Complex(re, _) => re as f64,
        }
    }

    /// The dtype PyTorch gives a tensor made from this scalar alone.
    pub fn default_dtype(self) -> DType {
        match self {
            Scalar::Bool(_) => DType::Bool,
            Scalar::Int(_) => DType::I64,
            Scalar::Float(_) => DType::F32,
            Scalar::Complex(..) => DType::C64,
        }
    }
}

impl From<f64> for Scalar {
    fn from(v: f64) -> Self {
        Scalar::Float(v)
    }
}
impl From<f32> for Scalar {
    fn from(v: f32) -> Self {
        Scalar::Float(v as f64)
    }
}
impl From<i64> for Scalar {
    fn from(v: i64) -> Self {
        Scalar::Int(v)
    }
}
impl From<i32> for Scalar {
    fn from(v: i32) -> Self {
        Scalar::Int(v as i64)
    }
}
impl From<bool> for Scalar {
    fn from(v: bool) -> Self {
        Scalar::Bool(v)
    }
}
impl From<C64> for Scalar {
    fn from(v: C64) -> Self {
        Scalar::Complex(v.re, v.im)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_follows_pytorch() {
        assert_eq!(DType::promote(DType::I64, DType::F16), DType::F16);
        assert_eq!(DType::promote(DType::F16, DType::BF16), DType::F32);
        assert_eq!(DType::promote(DType::U8, DType::I32), DType::I32);
        assert_eq!(DType::promote(DType::Bool, DType::U8), DType::U8);
        assert_eq!(DType::promote(DType::F64, DType::C64), DType::C64);
        assert_eq!(DType::I32.to_float(), DType::F32);
    }
}
