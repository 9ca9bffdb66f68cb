//! The metadata table: ordered key/value pairs with typed accessors.

use super::error::{GgufError, Result};
use super::value::{Array, Value, ValueType};
use std::collections::HashMap;

/// Keys whose type the GGUF spec fixes. A file that stores one of them with
/// another type is rejected when read (and refused by the writer), since
/// every consumer would misread it. `general.alignment` also changes how the
/// file is laid out, so its value is checked too.
pub const WELL_KNOWN_KEYS: &[(&str, ValueType)] = &[
    ("general.alignment", ValueType::U32),
    ("general.architecture", ValueType::String),
    ("general.name", ValueType::String),
    ("general.file_type", ValueType::U32),
    ("general.quantization_version", ValueType::U32),
];

/// The type a well-known key must have, if `key` is one.
pub fn well_known_type(key: &str) -> Option<ValueType> {
    WELL_KNOWN_KEYS.iter().find(|(k, _)| *k == key).map(|&(_, t)| t)
}

/// Checks a value against the well-known key table and, for
/// `general.alignment`, that it is a power of two. Returns the alignment
/// when `key` is `general.alignment`.
pub(crate) fn check_well_known(key: &str, value: &Value, offset: Option<u64>) -> Result<Option<u64>> {
    let Some(expected) = well_known_type(key) else {
        return Ok(None);
    };
    if value.value_type() != expected {
        return Err(GgufError::WellKnownKeyType {
            key: key.to_string(),
            offset,
            expected: expected.name().to_string(),
            actual: value.type_desc(),
        });
    }
    if key == "general.alignment" {
        let a = value.as_u64_lossless().unwrap_or(0);
        if a == 0 || !a.is_power_of_two() {
            return Err(GgufError::BadAlignment { value: a, offset });
        }
        return Ok(Some(a));
    }
    Ok(None)
}

/// Metadata in file order, with lookup by key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

macro_rules! scalar_getters {
    ($($name:ident => $variant:ident: $t:ty),* $(,)?) => {$(
        #[doc = concat!("The value of `key`, which must be a ", stringify!($t), ".")]
        pub fn $name(&self, key: &str) -> Result<$t> {
            match self.get(key)? {
                Value::$variant(v) => Ok(*v),
                other => Err(wrong_type(key, ValueType::$variant.name(), other)),
            }
        }
    )*};
}

macro_rules! array_getters {
    ($($name:ident => $variant:ident: $t:ty),* $(,)?) => {$(
        #[doc = concat!("The elements of `key`, which must be an array of ", stringify!($t), ".")]
        pub fn $name(&self, key: &str) -> Result<&[$t]> {
            match self.get(key)? {
                Value::Array(Array::$variant(v)) => Ok(v),
                other => Err(wrong_type(
                    key,
                    &format!("array of {}", ValueType::$variant.name()),
                    other,
                )),
            }
        }
    )*};
}

fn wrong_type(key: &str, expected: &str, actual: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected: expected.to_string(),
        actual: actual.type_desc(),
    }
}

impl Metadata {
    pub fn new() -> Metadata {
        Metadata::default()
    }

    pub(crate) fn with_capacity(n: usize) -> Metadata {
        Metadata {
            entries: Vec::with_capacity(n),
            index: HashMap::with_capacity(n),
        }
    }

    /// Adds an entry; `false` (and no change) when the key exists.
    pub(crate) fn insert_new(&mut self, key: String, value: Value) -> bool {
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        true
    }

    /// Adds or replaces an entry (a replaced entry keeps its position).
    pub(crate) fn set(&mut self, key: String, value: Value) {
        match self.index.get(&key) {
            Some(&i) => self.entries[i].1 = value,
            None => {
                self.index.insert(key.clone(), self.entries.len());
                self.entries.push((key, value));
            }
        }
    }

    /// Removes an entry, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let i = self.index.remove(key)?;
        let (_, value) = self.entries.remove(i);
        for slot in self.index.values_mut() {
            if *slot > i {
                *slot -= 1;
            }
        }
        Some(value)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Key/value pairs in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    /// The value of `key`, or `MissingKey`.
    pub fn get(&self, key: &str) -> Result<&Value> {
        self.index
            .get(key)
            .map(|&i| &self.entries[i].1)
            .ok_or_else(|| GgufError::MissingKey { key: key.to_string() })
    }

    scalar_getters!(
        get_u8 => U8: u8, get_i8 => I8: i8, get_u16 => U16: u16, get_i16 => I16: i16,
        get_u32 => U32: u32, get_i32 => I32: i32, get_u64 => U64: u64, get_i64 => I64: i64,
        get_f32 => F32: f32, get_f64 => F64: f64, get_bool => Bool: bool,
    );

    array_getters!(
        get_u8_array => U8: u8, get_i8_array => I8: i8, get_u16_array => U16: u16,
        get_i16_array => I16: i16, get_u32_array => U32: u32, get_i32_array => I32: i32,
        get_u64_array => U64: u64, get_i64_array => I64: i64, get_f32_array => F32: f32,
        get_f64_array => F64: f64, get_bool_array => Bool: bool, get_str_array => String: String,
    );

    /// The value of `key`, which must be a string.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.get(key)? {
            Value::String(s) => Ok(s),
            other => Err(wrong_type(key, "string", other)),
        }
    }

    /// The value of `key`, which must be an array (of any element type).
    pub fn get_array(&self, key: &str) -> Result<&Array> {
        match self.get(key)? {
            Value::Array(a) => Ok(a),
            other => Err(wrong_type(key, "array", other)),
        }
    }

    /// Any integer type, as long as the value is non-negative and fits a
    /// `usize`. Converters disagree on u32 versus u64 for sizes such as
    /// `llama.context_length`; this accepts both.
    pub fn get_usize(&self, key: &str) -> Result<usize> {
        let v = self.get(key)?;
        let Some(u) = v.as_u64_lossless() else {
            return Err(match v {
                Value::I8(_) | Value::I16(_) | Value::I32(_) | Value::I64(_) => GgufError::ValueOutOfRange {
                    key: key.to_string(),
                    value: v.to_string(),
                    target: "usize",
                },
                other => wrong_type(key, "integer", other),
            });
        };
        usize::try_from(u).map_err(|_| GgufError::ValueOutOfRange {
            key: key.to_string(),
            value: u.to_string(),
            target: "usize",
        })
    }
}
