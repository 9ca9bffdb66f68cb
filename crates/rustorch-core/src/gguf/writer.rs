//! `GgufWriter`: builds a GGUF v3 file from metadata and tensors.

use super::error::{GgufError, Result};
use super::metadata::{check_well_known, Metadata};
use super::parse::{tensor_bytes, MAX_ARRAY_DEPTH};
use super::tensor::{encode_dense, MAX_DIMS};
use super::value::{Array, Value};
use super::{DEFAULT_ALIGNMENT, MAGIC};
use crate::quant::QType;
use crate::tensor::Tensor;
use std::borrow::Cow;
use std::io::{self, Write};
use std::path::Path;

struct PendingTensor<'a> {
    name: String,
    /// GGUF order (`ne[0]` first).
    dims: Vec<u64>,
    qtype: QType,
    data: Cow<'a, [u8]>,
}

/// Collects metadata and tensors, then writes a GGUF v3 file: header,
/// metadata, tensor infos, zero padding to the alignment, and each tensor's
/// bytes padded to the alignment (as llama.cpp and the `gguf` package do).
///
/// Tensor bytes may be borrowed (`Cow::Borrowed`), e.g. from a `Gguf` being
/// rewritten, so copying a model does not load it into memory.
pub struct GgufWriter<'a> {
    metadata: Metadata,
    alignment: u64,
    tensors: Vec<PendingTensor<'a>>,
}

impl Default for GgufWriter<'_> {
    fn default() -> Self {
        GgufWriter::new()
    }
}

impl<'a> GgufWriter<'a> {
    pub fn new() -> GgufWriter<'a> {
        GgufWriter {
            metadata: Metadata::new(),
            alignment: DEFAULT_ALIGNMENT,
            tensors: Vec::new(),
        }
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Sets the data alignment and records it as `general.alignment` (u32).
    pub fn set_alignment(&mut self, alignment: u32) -> Result<()> {
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(GgufError::BadAlignment {
                value: alignment.into(),
                offset: None,
            });
        }
        self.alignment = alignment.into();
        self.metadata
            .set("general.alignment".to_string(), Value::U32(alignment));
        Ok(())
    }

    /// Adds a metadata entry. Keys must be new; well-known keys must have
    /// their spec type (`general.alignment` also sets the alignment).
    pub fn add_metadata(&mut self, key: impl Into<String>, value: impl Into<Value>) -> Result<()> {
        let key = key.into();
        let value = value.into();
        if self.metadata.contains_key(&key) {
            return Err(GgufError::DuplicateKey { key, offset: None });
        }
        if let Value::Array(a) = &value {
            if a.depth() > MAX_ARRAY_DEPTH {
                return Err(GgufError::NestingTooDeep {
                    what: format!("value of metadata key {key:?}"),
                    offset: None,
                    max: MAX_ARRAY_DEPTH,
                });
            }
        }
        if let Some(a) = check_well_known(&key, &value, None)? {
            self.alignment = a;
        }
        self.metadata.insert_new(key, value);
        Ok(())
    }

    /// Adds a tensor from raw bytes in GGML layout. `shape` is row-major
    /// (outermost first, as `Tensor` uses); the innermost dimension must be
    /// a whole number of `qtype` blocks and `data` exactly the right size.
    pub fn add_tensor_bytes(
        &mut self,
        name: impl Into<String>,
        qtype: QType,
        shape: &[usize],
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<()> {
        let name = name.into();
        let data = data.into();
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::DuplicateTensor { name, offset: None });
        }
        if shape.is_empty() || shape.len() > MAX_DIMS {
            return Err(GgufError::BadDimCount {
                name,
                n_dims: shape.len() as u64,
                offset: None,
            });
        }
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        let n_bytes = tensor_bytes(&name, &dims, qtype, None)?;
        if data.len() != n_bytes {
            return Err(GgufError::InvalidTensor {
                message: format!(
                    "{qtype} data of shape {shape:?} takes {n_bytes} bytes, got {}",
                    data.len()
                ),
                name,
            });
        }
        self.tensors.push(PendingTensor {
            name,
            dims,
            qtype,
            data,
        });
        Ok(())
    }

    /// Adds a tensor's elements (f32, f16, bf16, f64, i32 or i64), in its
    /// row-major shape. A 0-dimensional tensor is stored with shape `[1]`,
    /// since GGUF tensors have 1 to 4 dimensions.
    pub fn add_tensor(&mut self, name: impl Into<String>, t: &Tensor) -> Result<()> {
        let name = name.into();
        let storage = t.to_cpu_storage()?;
        let (qtype, bytes) = encode_dense(&name, &storage)?;
        let shape: Vec<usize> = if t.rank() == 0 { vec![1] } else { t.dims().to_vec() };
        self.add_tensor_bytes(name, qtype, &shape, bytes)
    }

    /// Writes the file; returns the number of bytes written.
    pub fn write_to<W: Write>(&self, w: W) -> io::Result<u64> {
        let mut w = Counting { inner: w, n: 0 };
        // Header, metadata and tensor infos are small: build them in memory.
        let mut head = Vec::new();
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in self.metadata.iter() {
            put_string(&mut head, k);
            head.extend_from_slice(&v.value_type().id().to_le_bytes());
            put_value(&mut head, v);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_string(&mut head, &t.name);
            head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.qtype.ggml_id().to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            offset += (t.data.len() as u64).div_ceil(self.alignment) * self.alignment;
        }
        w.write_all(&head)?;
        w.pad(padding(head.len() as u64, self.alignment))?;
        for t in &self.tensors {
            w.write_all(&t.data)?;
            w.pad(padding(t.data.len() as u64, self.alignment))?;
        }
        w.flush()?;
        Ok(w.n)
    }

    /// The file as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        // Writing into a Vec cannot fail.
        let _ = self.write_to(&mut v);
        v
    }

    /// Writes the file at `path` (created or truncated).
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<u64> {
        let path = path.as_ref();
        let io = |action, source| GgufError::Io {
            action,
            path: path.to_path_buf(),
            source,
        };
        let f = std::fs::File::create(path).map_err(|e| io("create", e))?;
        self.write_to(io::BufWriter::new(f)).map_err(|e| io("write", e))
    }
}

/// A writer that counts bytes and writes zero padding.
struct Counting<W> {
    inner: W,
    n: u64,
}

impl<W: Write> Counting<W> {
    fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        self.n += b.len() as u64;
        self.inner.write_all(b)
    }

    /// Padding is below the alignment, which may be up to 2^31: it is
    /// written in pieces rather than allocated.
    fn pad(&mut self, mut len: usize) -> io::Result<()> {
        const ZEROS: [u8; 4096] = [0; 4096];
        while len > 0 {
            let k = len.min(ZEROS.len());
            self.write_all(&ZEROS[..k])?;
            len -= k;
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn padding(len: u64, alignment: u64) -> usize {
    (len.div_ceil(alignment) * alignment - len) as usize
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_string(out, s),
        Value::Array(a) => put_array(out, a),
    }
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    fn each<T>(out: &mut Vec<u8>, v: &[T], f: impl Fn(&mut Vec<u8>, &T)) {
        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for x in v {
            f(out, x);
        }
    }
    out.extend_from_slice(&a.elem_type().id().to_le_bytes());
    match a {
        Array::U8(v) => each(out, v, |o, x| o.push(*x)),
        Array::I8(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        Array::U16(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        Array::I16(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        Array::U32(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        Array::I32(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        Array::U64(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        Array::I64(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        Array::F32(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        Array::F64(v) => each(out, v, |o, x| o.extend_from_slice(&x.to_le_bytes())),
        Array::Bool(v) => each(out, v, |o, x| o.push(u8::from(*x))),
        Array::String(v) => each(out, v, |o, x| put_string(o, x)),
        Array::Array(v) => each(out, v, put_array),
    }
}
