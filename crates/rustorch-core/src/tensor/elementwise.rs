//! Elementwise math: unary functions and activations, clamp, arithmetic with
//! broadcasting and PyTorch's type promotion, comparisons, `where`, and the
//! `+ - * /` and unary `-` operators on `&Tensor` (returning `Result`).

use super::Tensor;
use crate::device::Device;
use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::op::{BinaryOp, CmpOp, Op, UnaryOp};
use crate::shape::Shape;

impl Tensor {
    fn unary(&self, u: UnaryOp) -> Result<Tensor> {
        self.run1(&Op::Unary(u), &[self])
    }

    /// Math functions with real results: PyTorch computes them on integer
    /// and bool tensors too, in the default float dtype (f32).
    fn unary_float(&self, u: UnaryOp) -> Result<Tensor> {
        let x = self.to_dtype(self.dtype().to_float())?;
        x.run1(&Op::Unary(u), &[&x])
    }

    pub fn neg(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg)
    }
    pub fn abs(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Abs)
    }
    pub fn exp(&self) -> Result<Tensor> {
        self.unary_float(UnaryOp::Exp)
    }
    /// Natural logarithm.
    pub fn log(&self) -> Result<Tensor> {
        self.unary_float(UnaryOp::Log)
    }
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary_float(UnaryOp::Sqrt)
    }
    /// 1 / sqrt(x).
    pub fn rsqrt(&self) -> Result<Tensor> {
        self.unary_float(UnaryOp::Rsqrt)
    }
    pub fn sin(&self) -> Result<Tensor> {
        self.unary_float(UnaryOp::Sin)
    }
    pub fn cos(&self) -> Result<Tensor> {
        self.unary_float(UnaryOp::Cos)
    }
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary_float(UnaryOp::Tanh)
    }
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary_float(UnaryOp::Sigmoid)
    }
    /// max(x, 0); keeps integer dtypes.
    pub fn relu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Relu)
    }
    /// Exact GELU, x Φ(x) (PyTorch's `gelu` with `approximate="none"`).
    pub fn gelu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Gelu)
    }
    /// GELU with the tanh approximation (`approximate="tanh"`).
    pub fn gelu_tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::GeluTanh)
    }
    /// x * sigmoid(x).
    pub fn silu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Silu)
    }
    /// log(1 + e^x) with PyTorch's defaults: beta 1, and x itself above 20.
    pub fn softplus(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Softplus)
    }

    /// Clamps to `[min, max]`; either bound may be absent, not both. NaN
    /// propagates; with min > max every element becomes max. Integer
    /// tensors keep their dtype when the bounds are whole numbers and, as
    /// with a Python float bound in PyTorch, become f32 otherwise.
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
        if min.is_none() && max.is_none() {
            return Err(Error::invalid("clamp", "at least one of min and max must be given"));
        }
        let whole = |b: Option<f64>| b.is_none_or(|v| v.fract() == 0.0 || v.is_infinite());
        let x = if self.dtype().is_int() && !(whole(min) && whole(max)) {
            self.to_dtype(DType::F32)?
        } else {
            self.clone()
        };
        x.run1(&Op::Clamp { min, max }, &[&x])
    }

    /// Promotes both operands to a common dtype and runs a binary op.
    fn binary(&self, other: &Tensor, op: BinaryOp) -> Result<Tensor> {
        let mut dtype = DType::promote(self.dtype(), other.dtype());
        let mut op = op;
        if op == BinaryOp::Div {
            // True division, as torch.div: integers and bools give f32.
            dtype = dtype.to_float();
        }
        if dtype == DType::Bool {
            // PyTorch: bool + bool is logical or, bool * bool logical and.
            op = match op {
                BinaryOp::Add => BinaryOp::Maximum,
                BinaryOp::Mul => BinaryOp::Minimum,
                o => o,
            };
        }
        let a = self.to_dtype(dtype)?;
        let b = other.to_dtype(dtype)?;
        a.run1(&Op::Binary(op), &[&a, &b])
    }

    /// Elementwise sum with broadcasting and type promotion.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Add)
    }
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Sub)
    }
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Mul)
    }
    /// True division: integer and bool operands give f32, as `torch.div`.
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Div)
    }
    /// self ** other. Integer tensors raise an error for negative exponents.
    pub fn pow(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Pow)
    }
    /// Elementwise maximum; NaN wins.
    pub fn maximum(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Maximum)
    }
    /// Elementwise minimum; NaN wins.
    pub fn minimum(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Minimum)
    }

    /// The dtype PyTorch gives `tensor op scalar`: the scalar only raises
    /// the category (bool < integer < float < complex); a float scalar with
    /// an integer or bool tensor gives f32, an int scalar with a bool
    /// tensor gives i64.
    fn scalar_result_dtype(&self, s: Scalar) -> DType {
        let d = self.dtype();
        match s {
            Scalar::Bool(_) => d,
            Scalar::Int(_) if d == DType::Bool => DType::I64,
            Scalar::Int(_) => d,
            Scalar::Float(_) if d.is_float() || d.is_complex() => d,
            Scalar::Float(_) => DType::F32,
            Scalar::Complex(..) => DType::C64,
        }
    }

    /// A 0-d tensor holding `s` in `dtype`, on this tensor's device and
    /// executor, so it broadcasts against this tensor.
    fn scalar_like(&self, s: Scalar, dtype: DType) -> Result<Tensor> {
        let on_host = || Tensor::full(Shape::scalar(), s, dtype)?.with_executor(self.executor());
        let device = self.device();
        if device == Device::Cpu {
            return on_host();
        }
        // Copied to the device once per value (the executor keeps it).
        let buffer = self
            .executor()
            .device_scalar(device, dtype, s, || Ok(on_host()?.to_device(device)?.buffer().clone()))?;
        Ok(Tensor::from_parts(
            buffer,
            Layout::contiguous(Shape::scalar()),
            self.executor().clone(),
        ))
    }

    fn binary_scalar(&self, s: Scalar, op: BinaryOp) -> Result<Tensor> {
        let dtype = self.scalar_result_dtype(s);
        let a = self.to_dtype(dtype)?;
        a.binary(&self.scalar_like(s, dtype)?, op)
    }

    /// self + s. The result dtype follows PyTorch (see `scalar_result_dtype`):
    /// `int_tensor.add_scalar(2.5)` is f32, `f16_tensor.add_scalar(2.5)` f16.
    pub fn add_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(s.into(), BinaryOp::Add)
    }
    pub fn sub_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(s.into(), BinaryOp::Sub)
    }
    pub fn mul_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(s.into(), BinaryOp::Mul)
    }
    /// True division by a scalar (integer tensors give f32).
    pub fn div_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(s.into(), BinaryOp::Div)
    }
    /// self ** s; exponents 2, 3, 0.5, -0.5, -1 and -2 take exact fast paths.
    pub fn pow_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(s.into(), BinaryOp::Pow)
    }

    fn compare(&self, other: &Tensor, c: CmpOp) -> Result<Tensor> {
        let dtype = DType::promote(self.dtype(), other.dtype());
        let a = self.to_dtype(dtype)?;
        let b = other.to_dtype(dtype)?;
        a.run1(&Op::Compare(c), &[&a, &b])
    }

    fn compare_scalar(&self, s: Scalar, c: CmpOp) -> Result<Tensor> {
        let dtype = self.scalar_result_dtype(s);
        let a = self.to_dtype(dtype)?;
        a.compare(&self.scalar_like(s, dtype)?, c)
    }

    /// Elementwise ==, as a bool tensor.
    pub fn eq(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(other, CmpOp::Eq)
    }
    pub fn ne(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(other, CmpOp::Ne)
    }
    pub fn lt(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(other, CmpOp::Lt)
    }
    pub fn le(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(other, CmpOp::Le)
    }
    pub fn gt(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(other, CmpOp::Gt)
    }
    pub fn ge(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(other, CmpOp::Ge)
    }
    pub fn eq_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.compare_scalar(s.into(), CmpOp::Eq)
    }
    pub fn ne_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.compare_scalar(s.into(), CmpOp::Ne)
    }
    pub fn lt_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.compare_scalar(s.into(), CmpOp::Lt)
    }
    pub fn le_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.compare_scalar(s.into(), CmpOp::Le)
    }
    pub fn gt_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.compare_scalar(s.into(), CmpOp::Gt)
    }
    pub fn ge_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.compare_scalar(s.into(), CmpOp::Ge)
    }

    /// `torch.where(cond, a, b)`: a where cond is true, else b. `cond` must
    /// be bool; a and b are promoted to a common dtype; all three broadcast.
    pub fn where_cond(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let dtype = DType::promote(a.dtype(), b.dtype());
        let a = a.to_dtype(dtype)?;
        let b = b.to_dtype(dtype)?;
        a.run1(&Op::Where, &[cond, &a, &b])
    }
}

macro_rules! binary_operator {
    ($Trait:ident, $method:ident, $scalar:ident) => {
        impl std::ops::$Trait<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::$method(self, rhs)
            }
        }
        impl std::ops::$Trait<f64> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: f64) -> Result<Tensor> {
                Tensor::$scalar(self, rhs)
            }
        }
    };
}
binary_operator!(Add, add, add_scalar);
binary_operator!(Sub, sub, sub_scalar);
binary_operator!(Mul, mul, mul_scalar);
binary_operator!(Div, div, div_scalar);

impl std::ops::Neg for &Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(self)
    }
}
