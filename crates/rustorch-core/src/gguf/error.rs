//! GGUF errors. Each says what was wrong and where: the byte offset in the
//! file, the metadata key or the tensor name.

use crate::quant::QType;
use std::path::PathBuf;

/// Everything that can go wrong reading or writing a GGUF file.
///
/// `kind()` gives a field-less [`ErrorKind`] for matching in tests and
/// callers that only care about the category.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file: it starts with bytes {}, expected \"GGUF\" (47 47 55 46)", fmt_hex(.found))]
    BadMagic { found: Vec<u8> },
    #[error("unsupported GGUF version {version} at offset 4 (this reader handles versions 2 and 3{})",
        if *.version == 1 { "; version 1 used 32-bit counts and is obsolete" } else { "" })]
    UnsupportedVersion { version: u32 },
    #[error(
        "big-endian GGUF file (version field reads {version} byte-swapped); only little-endian files are supported"
    )]
    BigEndian { version: u32 },
    #[error("truncated file: {what} at offset {offset} needs {needed} bytes, only {available} left")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },
    #[error("{what} at offset {offset} is {value}, more than the {available} bytes left in the file can hold")]
    LengthTooLarge {
        what: String,
        offset: u64,
        value: u64,
        available: u64,
    },
    #[error("{what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 { what: String, offset: u64 },
    #[error("{what} at offset {offset} is a bool stored as {value} (must be 0 or 1)")]
    InvalidBool { what: String, offset: u64, value: u8 },
    #[error("{what} at offset {offset} has unknown metadata value type id {type_id} (known: 0..=12)")]
    UnknownValueType { what: String, offset: u64, type_id: u32 },
    #[error("{what}{}: arrays nested more than {max} deep", fmt_at(.offset))]
    NestingTooDeep {
        what: String,
        offset: Option<u64>,
        max: usize,
    },
    #[error("duplicate metadata key {key:?}{}", fmt_at(.offset))]
    DuplicateKey { key: String, offset: Option<u64> },
    #[error("metadata key {key:?}{} has type {actual}, expected {expected}", fmt_at(.offset))]
    WellKnownKeyType {
        key: String,
        offset: Option<u64>,
        expected: String,
        actual: String,
    },
    #[error("general.alignment{} is {value}; it must be a non-zero power of two", fmt_at(.offset))]
    BadAlignment { value: u64, offset: Option<u64> },
    #[error("duplicate tensor name {name:?}{}", fmt_at(.offset))]
    DuplicateTensor { name: String, offset: Option<u64> },
    #[error("tensor {name:?}{} has {n_dims} dimensions; GGML allows 1 to 4", fmt_at(.offset))]
    BadDimCount {
        name: String,
        n_dims: u64,
        offset: Option<u64>,
    },
    #[error("tensor {name:?}{}: the element count of dims {dims:?} overflows", fmt_at(.offset))]
    ElementCountOverflow {
        name: String,
        dims: Vec<u64>,
        offset: Option<u64>,
    },
    #[error("tensor {name:?} at offset {offset} has unknown GGML type id {type_id}")]
    UnknownTensorType { name: String, offset: u64, type_id: u32 },
    #[error("tensor {name:?}{} is {qtype} with rows of {row} elements, not a multiple of its block size {block}",
        fmt_at(.offset))]
    NotBlockMultiple {
        name: String,
        qtype: QType,
        row: u64,
        block: usize,
        offset: Option<u64>,
    },
    #[error("tensor {name:?} (info at offset {info_offset}) has data offset {data_offset}, not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        name: String,
        info_offset: u64,
        data_offset: u64,
        alignment: u64,
    },
    #[error("tensor {name:?} (info at offset {info_offset}) needs bytes {start}..{end} of the file, which has {file_len} bytes")]
    TensorOutOfBounds {
        name: String,
        info_offset: u64,
        start: u64,
        end: u64,
        file_len: u64,
    },
    #[error("tensors {first:?} (bytes {first_start}..{first_end}) and {second:?} (bytes {second_start}..{second_end}) overlap")]
    OverlappingTensors {
        first: String,
        first_start: u64,
        first_end: u64,
        second: String,
        second_start: u64,
        second_end: u64,
    },
    #[error("no metadata key {key:?}")]
    MissingKey { key: String },
    #[error("metadata key {key:?} has type {actual}, asked for {expected}")]
    WrongType {
        key: String,
        expected: String,
        actual: String,
    },
    #[error("metadata key {key:?} is {value}, which does not fit a {target}")]
    ValueOutOfRange {
        key: String,
        value: String,
        target: &'static str,
    },
    #[error("no tensor named {name:?}")]
    TensorNotFound { name: String },
    #[error("tensor {name:?} is {qtype}, which has no dense RusTorch dtype{}",
        if .qtype.is_quantized() { " (use load_tensor for its quantized bytes)" } else { "" })]
    NotDense { name: String, qtype: QType },
    #[error("tensor {name:?}: {message}")]
    InvalidTensor { name: String, message: String },
    #[error(transparent)]
    Tensor(#[from] crate::error::Error),
}

fn fmt_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

fn fmt_at(offset: &Option<u64>) -> String {
    match offset {
        Some(o) => format!(" at offset {o}"),
        None => String::new(),
    }
}

/// The category of a [`GgufError`], without its details.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    Io,
    BadMagic,
    UnsupportedVersion,
    BigEndian,
    Truncated,
    LengthTooLarge,
    InvalidUtf8,
    InvalidBool,
    UnknownValueType,
    NestingTooDeep,
    DuplicateKey,
    WellKnownKeyType,
    BadAlignment,
    DuplicateTensor,
    BadDimCount,
    ElementCountOverflow,
    UnknownTensorType,
    NotBlockMultiple,
    MisalignedTensor,
    TensorOutOfBounds,
    OverlappingTensors,
    MissingKey,
    WrongType,
    ValueOutOfRange,
    TensorNotFound,
    NotDense,
    InvalidTensor,
    Tensor,
}

impl GgufError {
    pub fn kind(&self) -> ErrorKind {
        use GgufError as E;
        match self {
            E::Io { .. } => ErrorKind::Io,
            E::BadMagic { .. } => ErrorKind::BadMagic,
            E::UnsupportedVersion { .. } => ErrorKind::UnsupportedVersion,
            E::BigEndian { .. } => ErrorKind::BigEndian,
            E::Truncated { .. } => ErrorKind::Truncated,
            E::LengthTooLarge { .. } => ErrorKind::LengthTooLarge,
            E::InvalidUtf8 { .. } => ErrorKind::InvalidUtf8,
            E::InvalidBool { .. } => ErrorKind::InvalidBool,
            E::UnknownValueType { .. } => ErrorKind::UnknownValueType,
            E::NestingTooDeep { .. } => ErrorKind::NestingTooDeep,
            E::DuplicateKey { .. } => ErrorKind::DuplicateKey,
            E::WellKnownKeyType { .. } => ErrorKind::WellKnownKeyType,
            E::BadAlignment { .. } => ErrorKind::BadAlignment,
            E::DuplicateTensor { .. } => ErrorKind::DuplicateTensor,
            E::BadDimCount { .. } => ErrorKind::BadDimCount,
            E::ElementCountOverflow { .. } => ErrorKind::ElementCountOverflow,
            E::UnknownTensorType { .. } => ErrorKind::UnknownTensorType,
            E::NotBlockMultiple { .. } => ErrorKind::NotBlockMultiple,
            E::MisalignedTensor { .. } => ErrorKind::MisalignedTensor,
            E::TensorOutOfBounds { .. } => ErrorKind::TensorOutOfBounds,
            E::OverlappingTensors { .. } => ErrorKind::OverlappingTensors,
            E::MissingKey { .. } => ErrorKind::MissingKey,
            E::WrongType { .. } => ErrorKind::WrongType,
            E::ValueOutOfRange { .. } => ErrorKind::ValueOutOfRange,
            E::TensorNotFound { .. } => ErrorKind::TensorNotFound,
            E::NotDense { .. } => ErrorKind::NotDense,
            E::InvalidTensor { .. } => ErrorKind::InvalidTensor,
            E::Tensor(_) => ErrorKind::Tensor,
        }
    }
}

/// Lets `?` turn a GGUF error into the library's error inside functions
/// that return `crate::Result`.
impl From<GgufError> for crate::error::Error {
    fn from(e: GgufError) -> Self {
        match e {
            GgufError::Tensor(inner) => inner,
            other => crate::error::Error::Msg(format!("gguf: {other}")),
        }
    }
}

pub type Result<T> = std::result::Result<T, GgufError>;
