//! The GGUF parser: header, metadata and tensor table, fully validated.
//!
//! Layout (all little-endian):
//! ```text
//! "GGUF" | version u32 | tensor_count u64 | kv_count u64
//! kv_count x   { key: string | type u32 | value }
//! tensor_count x { name: string | n_dims u32 | dims u64[n_dims] | ggml_type u32 | offset u64 }
//! zero padding to `general.alignment` (default 32)
//! data section: each tensor at data_start + offset
//! ```
//! A string is a u64 length and that many UTF-8 bytes; an array is an
//! element type u32, a u64 count and the elements.

use super::cursor::{Cursor, Site};
use super::error::{GgufError, Result};
use super::metadata::{check_well_known, Metadata};
use super::tensor::{TensorInfo, MAX_DIMS};
use super::value::{Array, Value, ValueType};
use super::{DEFAULT_ALIGNMENT, MAGIC};
use crate::quant::QType;
use std::collections::HashMap;

/// Deepest array nesting accepted; keeps recursion (and the stack) bounded
/// on hostile input. Real files nest at most once.
pub const MAX_ARRAY_DEPTH: usize = 16;

/// Fewest bytes of one metadata entry: key length, value type, a u8.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Fewest bytes of one tensor info: name length, n_dims, one dim, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// Everything the header describes; tensor data stays in the file bytes.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
    /// Bytes of header, metadata and tensor infos (before the padding).
    pub header_len: u64,
    /// Absolute offset of the data section (may equal or pass the end of
    /// the file when every tensor is empty).
    pub data_offset: u64,
}

pub(crate) fn parse(buf: &[u8]) -> Result<Parsed> {
    let mut c = Cursor::new(buf);
    if buf.len() >= 4 && &buf[..4] != MAGIC || buf.len() < 4 && !MAGIC.starts_with(buf) {
        return Err(GgufError::BadMagic {
            found: buf[..buf.len().min(4)].to_vec(),
        });
    }
    c.bytes(4, Site::Header("magic"))?;
    let version = c.u32(Site::Header("version"))?;
    if version != 2 && version != 3 {
        let swapped = version.swap_bytes();
        if (1..=3).contains(&swapped) {
            return Err(GgufError::BigEndian { version: swapped });
        }
        return Err(GgufError::UnsupportedVersion { version });
    }
    let n_tensors = c.count(MIN_TENSOR_INFO_BYTES, "", Site::Header("tensor count"))?;
    let n_kv = c.count(MIN_KV_BYTES, "", Site::Header("metadata entry count"))?;

    let mut metadata = Metadata::with_capacity(n_kv);
    let mut alignment = DEFAULT_ALIGNMENT;
    for i in 0..n_kv as u64 {
        let key_at = c.pos();
        let key = c.string(Site::KeyName(i))?;
        if metadata.contains_key(&key) {
            return Err(GgufError::DuplicateKey {
                key,
                offset: Some(key_at),
            });
        }
        let ty = value_type(&mut c, Site::KeyType(&key))?;
        let value = read_value(&mut c, ty, Site::Value(&key), 0)?;
        if let Some(a) = check_well_known(&key, &value, Some(key_at))? {
            alignment = a;
        }
        metadata.insert_new(key, value);
    }

    let mut tensors = Vec::with_capacity(n_tensors);
    let mut tensor_index = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors as u64 {
        let info = read_tensor_info(&mut c, i)?;
        if tensor_index.contains_key(&info.name) {
            return Err(GgufError::DuplicateTensor {
                name: info.name,
                offset: Some(info.info_offset),
            });
        }
        tensor_index.insert(info.name.clone(), tensors.len());
        tensors.push(info);
    }

    // The data section starts at the next multiple of the alignment. The
    // position is at most the file length and the alignment at most 2^31,
    // so this cannot overflow a u64.
    let header_len = c.pos();
    let data_offset = header_len.div_ceil(alignment) * alignment;
    check_tensor_ranges(&tensors, data_offset, alignment, buf.len() as u64)?;
    Ok(Parsed {
        version,
        alignment,
        metadata,
        tensors,
        tensor_index,
        header_len,
        data_offset,
    })
}

fn value_type(c: &mut Cursor<'_>, site: Site<'_>) -> Result<ValueType> {
    let at = c.pos();
    let id = c.u32(site)?;
    ValueType::from_id(id).ok_or_else(|| GgufError::UnknownValueType {
        what: site.to_string(),
        offset: at,
        type_id: id,
    })
}

fn read_value(c: &mut Cursor<'_>, ty: ValueType, site: Site<'_>, depth: usize) -> Result<Value> {
    Ok(match ty {
        ValueType::U8 => Value::U8(u8::from_le_bytes(c.array(site)?)),
        ValueType::I8 => Value::I8(i8::from_le_bytes(c.array(site)?)),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.array(site)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.array(site)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(c.array(site)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.array(site)?)),
        ValueType::U64 => Value::U64(u64::from_le_bytes(c.array(site)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.array(site)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.array(site)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.array(site)?)),
        ValueType::Bool => {
            let at = c.pos();
            Value::Bool(to_bool(c.array::<1>(site)?[0], site, at)?)
        }
        ValueType::String => Value::String(c.string(site)?),
        ValueType::Array => Value::Array(read_array(c, site, depth)?),
    })
}

fn to_bool(b: u8, site: Site<'_>, at: u64) -> Result<bool> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        value => Err(GgufError::InvalidBool {
            what: site.to_string(),
            offset: at,
            value,
        }),
    }
}

/// Fixed-size little-endian elements, decoded in one pass.
fn fixed<const N: usize, T>(c: &mut Cursor<'_>, n: usize, site: Site<'_>, f: impl Fn([u8; N]) -> T) -> Result<Vec<T>> {
    // `count` already checked that n * N bytes remain.
    let bytes = c.bytes((n * N) as u64, site)?;
    let (chunks, _) = bytes.as_chunks::<N>();
    Ok(chunks.iter().map(|b| f(*b)).collect())
}

fn read_array(c: &mut Cursor<'_>, site: Site<'_>, depth: usize) -> Result<Array> {
    let at = c.pos();
    if depth >= MAX_ARRAY_DEPTH {
        return Err(GgufError::NestingTooDeep {
            what: site.to_string(),
            offset: Some(at),
            max: MAX_ARRAY_DEPTH,
        });
    }
    let elem = value_type(c, site)?;
    let n = c.count(elem.min_encoded_size(), "array length", site)?;
    Ok(match elem {
        ValueType::U8 => Array::U8(fixed(c, n, site, u8::from_le_bytes)?),
        ValueType::I8 => Array::I8(fixed(c, n, site, i8::from_le_bytes)?),
        ValueType::U16 => Array::U16(fixed(c, n, site, u16::from_le_bytes)?),
        ValueType::I16 => Array::I16(fixed(c, n, site, i16::from_le_bytes)?),
        ValueType::U32 => Array::U32(fixed(c, n, site, u32::from_le_bytes)?),
        ValueType::I32 => Array::I32(fixed(c, n, site, i32::from_le_bytes)?),
        ValueType::U64 => Array::U64(fixed(c, n, site, u64::from_le_bytes)?),
        ValueType::I64 => Array::I64(fixed(c, n, site, i64::from_le_bytes)?),
        ValueType::F32 => Array::F32(fixed(c, n, site, f32::from_le_bytes)?),
        ValueType::F64 => Array::F64(fixed(c, n, site, f64::from_le_bytes)?),
        ValueType::Bool => {
            let start = c.pos();
            let bytes = c.bytes(n as u64, site)?;
            let mut v = Vec::with_capacity(n);
            for (i, &b) in bytes.iter().enumerate() {
                v.push(to_bool(b, site, start + i as u64)?);
            }
            Array::Bool(v)
        }
        ValueType::String => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(c.string(site)?);
            }
            Array::String(v)
        }
        ValueType::Array => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_array(c, site, depth + 1)?);
            }
            Array::Array(v)
        }
    })
}

fn read_tensor_info(c: &mut Cursor<'_>, i: u64) -> Result<TensorInfo> {
    let info_offset = c.pos();
    let name = c.string(Site::TensorName(i))?;
    let n_dims = c.u32(Site::Tensor(&name, "dimension count"))?;
    if n_dims == 0 || n_dims as usize > MAX_DIMS {
        return Err(GgufError::BadDimCount {
            name,
            n_dims: n_dims.into(),
            offset: Some(info_offset),
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64(Site::Tensor(&name, "dimensions"))?);
    }
    let type_at = c.pos();
    let type_id = c.u32(Site::Tensor(&name, "type"))?;
    let offset = c.u64(Site::Tensor(&name, "data offset"))?;
    let Some(qtype) = QType::from_ggml_id(type_id) else {
        return Err(GgufError::UnknownTensorType {
            name,
            offset: type_at,
            type_id,
        });
    };
    let n_bytes = tensor_bytes(&name, &dims, qtype, Some(info_offset))?;
    Ok(TensorInfo {
        name,
        dims,
        qtype,
        offset,
        n_bytes,
        info_offset,
    })
}

/// The byte size of a tensor, checking that GGML could hold it: the product
/// of its dims (zeros left out) fits an `i64` (GGML's `ne` type) and a
/// `usize`, and rows are whole blocks.
pub(crate) fn tensor_bytes(name: &str, dims: &[u64], qtype: QType, offset: Option<u64>) -> Result<usize> {
    let overflow = || GgufError::ElementCountOverflow {
        name: name.to_string(),
        dims: dims.to_vec(),
        offset,
    };
    // The product of the non-zero dims must fit, not just the element
    // count: with a 0 among them the count is 0 whatever the others are,
    // but `Shape` and GGML multiply dims in other orders (and into byte
    // strides), where huge ones would overflow first. Found by the fuzzer.
    let nonzero = dims
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(overflow)?;
    usize::try_from(nonzero).map_err(|_| overflow())?;
    let numel = if dims.contains(&0) { 0 } else { nonzero as usize };
    let block = qtype.block_size();
    let row = dims.first().copied().unwrap_or(1);
    if !row.is_multiple_of(block as u64) {
        return Err(GgufError::NotBlockMultiple {
            name: name.to_string(),
            qtype,
            row,
            block,
            offset,
        });
    }
    qtype.bytes_for(numel).ok_or_else(overflow)
}

/// Every tensor is aligned, inside the file, and apart from the others.
fn check_tensor_ranges(tensors: &[TensorInfo], data_offset: u64, alignment: u64, file_len: u64) -> Result<()> {
    let mut ranges = Vec::with_capacity(tensors.len());
    for t in tensors {
        if !t.offset.is_multiple_of(alignment) {
            return Err(GgufError::MisalignedTensor {
                name: t.name.clone(),
                info_offset: t.info_offset,
                data_offset: t.offset,
                alignment,
            });
        }
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes as u64));
        match (start, end) {
            (Some(s), Some(e)) if e <= file_len => {
                // Empty tensors occupy nothing and overlap nothing.
                if e > s {
                    ranges.push((s, e, t));
                }
            }
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    name: t.name.clone(),
                    info_offset: t.info_offset,
                    start: start.unwrap_or(u64::MAX),
                    end: end.unwrap_or(u64::MAX),
                    file_len,
                })
            }
        }
    }
    ranges.sort_unstable_by_key(|&(s, e, _)| (s, e));
    for w in ranges.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        if a.1 > b.0 {
            return Err(GgufError::OverlappingTensors {
                first: a.2.name.clone(),
                first_start: a.0,
                first_end: a.1,
                second: b.2.name.clone(),
                second_start: b.0,
                second_end: b.1,
            });
        }
    }
    Ok(())
}
