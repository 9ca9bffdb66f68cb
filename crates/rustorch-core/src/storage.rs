//! Host memory: one typed vector per dtype.

use crate::backend::DeviceBuffer;
use crate::device::Device;
use crate::dtype::{DType, WithDType, C64};
use half::{bf16, f16};
use std::any::Any;

/// `n` zero halves (`T` is f16 or bf16) from a zeroed allocation.
/// `vec![f16::ZERO; n]` writes every element (only primitive types take
/// `vec!`'s `alloc_zeroed` path), so a large buffer, such as a KV cache
/// sized for the whole context, was resident from the start; from `calloc`,
/// pages that are never written (cache positions not reached yet) stay
/// unbacked.
fn zeroed_halves<T: Copy>(n: usize) -> Vec<T> {
    const { assert!(std::mem::size_of::<T>() == 2 && std::mem::align_of::<T>() == 2) };
    let mut bits = std::mem::ManuallyDrop::new(vec![0u16; n]);
    let (ptr, len, cap) = (bits.as_mut_ptr(), bits.len(), bits.capacity());
    // SAFETY: the callers' f16 and bf16 are `repr(transparent)` over u16
    // (same size and alignment, so the allocation's layout is unchanged),
    // every bit pattern is a valid value, and all-zero bits are +0.0.
    unsafe { Vec::from_raw_parts(ptr.cast::<T>(), len, cap) }
}

#[derive(Clone, Debug, PartialEq)]
pub enum CpuStorage {
    Bool(Vec<bool>),
    U8(Vec<u8>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    C64(Vec<C64>),
}

/// Runs `$body` with `$v` bound to the typed vector inside a `CpuStorage`
/// (by reference), whatever its dtype. `$T` names the element type.
#[macro_export]
macro_rules! with_cpu_storage {
    ($s:expr, $v:ident, $T:ident => $body:expr) => {
        match $s {
            $crate::storage::CpuStorage::Bool($v) => {
                #[allow(unused)]
                type $T = bool;
                $body
            }
            $crate::storage::CpuStorage::U8($v) => {
                #[allow(unused)]
                type $T = u8;
                $body
            }
            $crate::storage::CpuStorage::I32($v) => {
                #[allow(unused)]
                type $T = i32;
                $body
            }
            $crate::storage::CpuStorage::I64($v) => {
                #[allow(unused)]
                type $T = i64;
                $body
            }
            $crate::storage::CpuStorage::F16($v) => {
                #[allow(unused)]
                type $T = half::f16;
                $body
            }
            $crate::storage::CpuStorage::BF16($v) => {
                #[allow(unused)]
                type $T = half::bf16;
                $body
            }
            $crate::storage::CpuStorage::F32($v) => {
                #[allow(unused)]
                type $T = f32;
                $body
            }
            $crate::storage::CpuStorage::F64($v) => {
                #[allow(unused)]
                type $T = f64;
                $body
            }
            $crate::storage::CpuStorage::C64($v) => {
                #[allow(unused)]
                type $T = $crate::dtype::C64;
                $body
            }
        }
    };
}

/// Runs `$body` with `$T` bound to the Rust element type of a `DType`.
#[macro_export]
macro_rules! with_dtype {
    ($d:expr, $T:ident => $body:expr) => {
        match $d {
            $crate::dtype::DType::Bool => {
                #[allow(unused)]
                type $T = bool;
                $body
            }
            $crate::dtype::DType::U8 => {
                #[allow(unused)]
                type $T = u8;
                $body
            }
            $crate::dtype::DType::I32 => {
                #[allow(unused)]
                type $T = i32;
                $body
            }
            $crate::dtype::DType::I64 => {
                #[allow(unused)]
                type $T = i64;
                $body
            }
            $crate::dtype::DType::F16 => {
                #[allow(unused)]
                type $T = half::f16;
                $body
            }
            $crate::dtype::DType::BF16 => {
                #[allow(unused)]
                type $T = half::bf16;
                $body
            }
            $crate::dtype::DType::F32 => {
                #[allow(unused)]
                type $T = f32;
                $body
            }
            $crate::dtype::DType::F64 => {
                #[allow(unused)]
                type $T = f64;
                $body
            }
            $crate::dtype::DType::C64 => {
                #[allow(unused)]
                type $T = $crate::dtype::C64;
                $body
            }
        }
    };
}

impl CpuStorage {
    pub fn dtype(&self) -> DType {
        match self {
            CpuStorage::Bool(_) => DType::Bool,
            CpuStorage::U8(_) => DType::U8,
            CpuStorage::I32(_) => DType::I32,
            CpuStorage::I64(_) => DType::I64,
            CpuStorage::F16(_) => DType::F16,
            CpuStorage::BF16(_) => DType::BF16,
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F64(_) => DType::F64,
            CpuStorage::C64(_) => DType::C64,
        }
    }

    pub fn len(&self) -> usize {
        with_cpu_storage!(self, v, T => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A vector of `n` zeros (false, 0, 0.0) of the given dtype.
    pub fn zeros(dtype: DType, n: usize) -> CpuStorage {
        match dtype {
            DType::Bool => CpuStorage::Bool(vec![false; n]),
            DType::U8 => CpuStorage::U8(vec![0; n]),
            DType::I32 => CpuStorage::I32(vec![0; n]),
            DType::I64 => CpuStorage::I64(vec![0; n]),
            DType::F16 => CpuStorage::F16(zeroed_halves::<f16>(n)),
            DType::BF16 => CpuStorage::BF16(zeroed_halves::<bf16>(n)),
            DType::F32 => CpuStorage::F32(vec![0.0; n]),
            DType::F64 => CpuStorage::F64(vec![0.0; n]),
            DType::C64 => CpuStorage::C64(vec![C64::new(0.0, 0.0); n]),
        }
    }

    /// Builds storage of `dtype` from f64 values (complex gets zero imaginary parts).
    pub fn from_f64_iter(dtype: DType, it: impl Iterator<Item = f64>) -> CpuStorage {
        fn conv<T: WithDType>(it: impl Iterator<Item = f64>) -> Vec<T> {
            it.map(T::from_f64).collect()
        }
        match dtype {
            DType::Bool => CpuStorage::Bool(conv(it)),
            DType::U8 => CpuStorage::U8(conv(it)),
            DType::I32 => CpuStorage::I32(conv(it)),
            DType::I64 => CpuStorage::I64(conv(it)),
            DType::F16 => CpuStorage::F16(conv(it)),
            DType::BF16 => CpuStorage::BF16(conv(it)),
            DType::F32 => CpuStorage::F32(conv(it)),
            DType::F64 => CpuStorage::F64(conv(it)),
            DType::C64 => CpuStorage::C64(conv(it)),
        }
    }

    /// Typed view of the elements, `None` when `T` is not this dtype.
    pub fn as_slice<T: StorageElement>(&self) -> Option<&[T]> {
        T::slice(self)
    }

    pub fn from_vec<T: StorageElement>(v: Vec<T>) -> CpuStorage {
        T::wrap(v)
    }

    /// The elements, borrowed, as a backend's `upload` takes them.
    pub fn as_host(&self) -> HostSlice<'_> {
        with_cpu_storage!(self, v, T => StorageElement::host(&v[..]))
    }

    /// `len` elements of `dtype` from their bytes in memory order (what a
    /// device download returns); bool bytes other than 0 read as true.
    pub fn from_bytes(dtype: DType, bytes: &[u8]) -> Result<CpuStorage, String> {
        let size = dtype.size_in_bytes();
        if !bytes.len().is_multiple_of(size) {
            return Err(format!(
                "{} bytes are not a whole number of {dtype} elements",
                bytes.len()
            ));
        }
        if dtype == DType::Bool {
            return Ok(CpuStorage::Bool(bytes.iter().map(|&b| b != 0).collect()));
        }
        // One pass over the bytes (zeroing a vector first and copying over
        // it was two: a tenth of a 135M model's replayed decode step went
        // to the logits' copy).
        Ok(match dtype {
            DType::Bool => unreachable!("handled above"),
            DType::U8 => CpuStorage::U8(bytes.to_vec()),
            DType::I32 => CpuStorage::I32(copied_numbers(bytes)),
            DType::I64 => CpuStorage::I64(copied_numbers(bytes)),
            DType::F16 => CpuStorage::F16(copied_numbers(bytes)),
            DType::BF16 => CpuStorage::BF16(copied_numbers(bytes)),
            DType::F32 => CpuStorage::F32(copied_numbers(bytes)),
            DType::F64 => CpuStorage::F64(copied_numbers(bytes)),
            DType::C64 => CpuStorage::C64(copied_numbers(bytes)),
        })
    }

    /// Elements as f64 (complex: real part), for tests and printing.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        with_cpu_storage!(self, v, T => v.iter().map(|x| WithDType::to_f64(*x)).collect())
    }
}

/// Numbers of type `T` from their bytes in memory order (whole elements:
/// the caller checked the length), copied once into a new vector.
fn copied_numbers<T: StorageElement + Copy>(bytes: &[u8]) -> Vec<T> {
    let n = bytes.len() / std::mem::size_of::<T>();
    let mut v = Vec::<T>::with_capacity(n);
    // SAFETY: callers pass numbers without padding (i32, i64, f16, bf16,
    // f32, f64, C64 = two f32), for which every bit pattern is a valid
    // value; the vector has room for n of them, all n written before the
    // length is set.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            v.as_mut_ptr().cast::<u8>(),
            n * std::mem::size_of::<T>(),
        );
        v.set_len(n);
    }
    v
}

/// Host data borrowed from anywhere (a `CpuStorage`, a memory-mapped file,
/// a caller's slice), typed, as `Backend::upload` takes it: the executor
/// never copies host data only to hand it to a device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum HostSlice<'a> {
    Bool(&'a [bool]),
    U8(&'a [u8]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    F32(&'a [f32]),
    F64(&'a [f64]),
    C64(&'a [C64]),
}

/// `$body` with `$v` bound to the slice inside a `HostSlice`, whatever its dtype.
macro_rules! with_host_slice {
    ($s:expr, $v:ident => $body:expr) => {
        match $s {
            HostSlice::Bool($v) => $body,
            HostSlice::U8($v) => $body,
            HostSlice::I32($v) => $body,
            HostSlice::I64($v) => $body,
            HostSlice::F16($v) => $body,
            HostSlice::BF16($v) => $body,
            HostSlice::F32($v) => $body,
            HostSlice::F64($v) => $body,
            HostSlice::C64($v) => $body,
        }
    };
}

impl<'a> HostSlice<'a> {
    pub fn dtype(&self) -> DType {
        match self {
            HostSlice::Bool(_) => DType::Bool,
            HostSlice::U8(_) => DType::U8,
            HostSlice::I32(_) => DType::I32,
            HostSlice::I64(_) => DType::I64,
            HostSlice::F16(_) => DType::F16,
            HostSlice::BF16(_) => DType::BF16,
            HostSlice::F32(_) => DType::F32,
            HostSlice::F64(_) => DType::F64,
            HostSlice::C64(_) => DType::C64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_host_slice!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements' bytes in memory order (little-endian on every host
    /// RusTorch runs on), as a device copy takes them.
    pub fn as_bytes(&self) -> &'a [u8] {
        fn bytes<T>(v: &[T]) -> &[u8] {
            // SAFETY: every element type here is plain data without padding
            // (bool is one byte, 0 or 1; C64 is two f32s, `repr(C)`), so
            // each of the slice's `size_of_val` bytes is initialized; u8
            // has alignment 1 and the borrow keeps the lifetime.
            unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
        }
        with_host_slice!(*self, v => bytes(v))
    }

    /// An owned copy.
    pub fn to_storage(&self) -> CpuStorage {
        with_host_slice!(*self, v => StorageElement::wrap(v.to_vec()))
    }
}

impl<'a, T: StorageElement> From<&'a [T]> for HostSlice<'a> {
    fn from(v: &'a [T]) -> Self {
        T::host(v)
    }
}

/// Element types that a `CpuStorage` can hold.
pub trait StorageElement: WithDType {
    fn slice(s: &CpuStorage) -> Option<&[Self]>;
    fn slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]>;
    fn wrap(v: Vec<Self>) -> CpuStorage;
    fn host(v: &[Self]) -> HostSlice<'_>;
}

macro_rules! storage_element {
    ($t:ty, $variant:ident) => {
        impl StorageElement for $t {
            fn slice(s: &CpuStorage) -> Option<&[Self]> {
                match s {
                    CpuStorage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]> {
                match s {
                    CpuStorage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn wrap(v: Vec<Self>) -> CpuStorage {
                CpuStorage::$variant(v)
            }
            fn host(v: &[Self]) -> HostSlice<'_> {
                HostSlice::$variant(v)
            }
        }
    };
}
storage_element!(bool, Bool);
storage_element!(u8, U8);
storage_element!(i32, I32);
storage_element!(i64, I64);
storage_element!(f16, F16);
storage_element!(bf16, BF16);
storage_element!(f32, F32);
storage_element!(f64, F64);
storage_element!(C64, C64);

impl DeviceBuffer for CpuStorage {
    fn device(&self) -> Device {
        Device::Cpu
    }
    fn dtype(&self) -> DType {
        CpuStorage::dtype(self)
    }
    fn len(&self) -> usize {
        CpuStorage::len(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> Option<&mut dyn Any> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_of_half_types_are_positive_zero_and_growable() {
        for n in [0usize, 1, 7, 300_000] {
            let CpuStorage::F16(mut h) = CpuStorage::zeros(DType::F16, n) else {
                panic!("f16 storage")
            };
            assert_eq!(h.len(), n);
            assert!(h.iter().all(|v| v.to_bits() == 0));
            h.push(f16::ONE);
            assert_eq!(h[n], f16::ONE);
            let CpuStorage::BF16(mut b) = CpuStorage::zeros(DType::BF16, n) else {
                panic!("bf16 storage")
            };
            assert_eq!(b.len(), n);
            assert!(b.iter().all(|v| v.to_bits() == 0));
            b.push(bf16::ONE);
            assert_eq!(b[n], bf16::ONE);
        }
    }
}
