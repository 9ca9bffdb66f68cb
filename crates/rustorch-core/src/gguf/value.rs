//! Metadata values: the 13 GGUF value types, scalars and (nested) arrays.
//!
//! Arrays are stored typed (`Vec<u32>`, `Vec<String>`...), not as vectors of
//! `Value`, so a long array costs about what it takes on disk and typed
//! accessors can hand out slices.

use std::fmt;

/// A GGUF metadata value type, with its on-disk id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub const ALL: [ValueType; 13] = [
        ValueType::U8,
        ValueType::I8,
        ValueType::U16,
        ValueType::I16,
        ValueType::U32,
        ValueType::I32,
        ValueType::F32,
        ValueType::Bool,
        ValueType::String,
        ValueType::Array,
        ValueType::U64,
        ValueType::I64,
        ValueType::F64,
    ];

    /// The `gguf_type` id written before each value.
    pub fn id(self) -> u32 {
        match self {
            ValueType::U8 => 0,
            ValueType::I8 => 1,
            ValueType::U16 => 2,
            ValueType::I16 => 3,
            ValueType::U32 => 4,
            ValueType::I32 => 5,
            ValueType::F32 => 6,
            ValueType::Bool => 7,
            ValueType::String => 8,
            ValueType::Array => 9,
            ValueType::U64 => 10,
            ValueType::I64 => 11,
            ValueType::F64 => 12,
        }
    }

    pub fn from_id(id: u32) -> Option<ValueType> {
        ValueType::ALL.get(id as usize).copied()
    }

    /// The fewest bytes one value of this type takes on disk: a string is at
    /// least its 8-byte length, an array its 4-byte type and 8-byte count.
    /// Counts are checked against this before anything is allocated.
    pub fn min_encoded_size(self) -> u64 {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 12,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

/// A homogeneous array; the element type survives even when it is empty.
/// Nested arrays (`Array::Array`) may hold arrays of different types, as
/// each one carries its own type on disk.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F32(_) => ValueType::F32,
            Value::F64(_) => ValueType::F64,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
        }
    }

    /// The type as error messages name it: `u32`, `array of string`...
    pub fn type_desc(&self) -> String {
        match self {
            Value::Array(a) => a.type_desc(),
            v => v.value_type().name().to_string(),
        }
    }

    /// Any integer value that is non-negative and fits a `u64`.
    pub fn as_u64_lossless(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value printed in full, arrays cut after `max_items` entries
    /// (at every nesting level) with their length appended.
    pub fn summary(&self, max_items: usize) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = self.write_summary(&mut s, max_items);
        s
    }

    fn write_summary(&self, f: &mut impl fmt::Write, max_items: usize) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v:?}"),
            Value::F64(v) => write!(f, "{v:?}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(v) => write!(f, "{v:?}"),
            Value::Array(a) => a.write_summary(f, max_items),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_summary(f, usize::MAX)
    }
}

impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_summary(f, usize::MAX)
    }
}

/// Runs `$body` with `$v` bound to the typed vector of an `Array`.
macro_rules! with_array {
    ($a:expr, $v:ident => $body:expr) => {
        match $a {
            Array::U8($v) => $body,
            Array::I8($v) => $body,
            Array::U16($v) => $body,
            Array::I16($v) => $body,
            Array::U32($v) => $body,
            Array::I32($v) => $body,
            Array::U64($v) => $body,
            Array::I64($v) => $body,
            Array::F32($v) => $body,
            Array::F64($v) => $body,
            Array::Bool($v) => $body,
            Array::String($v) => $body,
            Array::Array($v) => $body,
        }
    };
}

impl Array {
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F32(_) => ValueType::F32,
            Array::F64(_) => ValueType::F64,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
        }
    }

    pub fn len(&self) -> usize {
        with_array!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An empty array of the given element type.
    pub fn empty(elem: ValueType) -> Array {
        match elem {
            ValueType::U8 => Array::U8(Vec::new()),
            ValueType::I8 => Array::I8(Vec::new()),
            ValueType::U16 => Array::U16(Vec::new()),
            ValueType::I16 => Array::I16(Vec::new()),
            ValueType::U32 => Array::U32(Vec::new()),
            ValueType::I32 => Array::I32(Vec::new()),
            ValueType::U64 => Array::U64(Vec::new()),
            ValueType::I64 => Array::I64(Vec::new()),
            ValueType::F32 => Array::F32(Vec::new()),
            ValueType::F64 => Array::F64(Vec::new()),
            ValueType::Bool => Array::Bool(Vec::new()),
            ValueType::String => Array::String(Vec::new()),
            ValueType::Array => Array::Array(Vec::new()),
        }
    }

    /// How deeply arrays nest: 1 for an array of scalars or strings (or an
    /// empty array of arrays), 2 for an array of such arrays...
    pub fn depth(&self) -> usize {
        match self {
            Array::Array(v) => 1 + v.iter().map(Array::depth).max().unwrap_or(0),
            _ => 1,
        }
    }

    /// `array of u32`, `array of array`...
    pub fn type_desc(&self) -> String {
        format!("array of {}", self.elem_type())
    }

    /// Element `i` as a `Value` (copies strings and nested arrays).
    pub fn get(&self, i: usize) -> Option<Value> {
        match self {
            Array::U8(v) => v.get(i).map(|x| Value::U8(*x)),
            Array::I8(v) => v.get(i).map(|x| Value::I8(*x)),
            Array::U16(v) => v.get(i).map(|x| Value::U16(*x)),
            Array::I16(v) => v.get(i).map(|x| Value::I16(*x)),
            Array::U32(v) => v.get(i).map(|x| Value::U32(*x)),
            Array::I32(v) => v.get(i).map(|x| Value::I32(*x)),
            Array::U64(v) => v.get(i).map(|x| Value::U64(*x)),
            Array::I64(v) => v.get(i).map(|x| Value::I64(*x)),
            Array::F32(v) => v.get(i).map(|x| Value::F32(*x)),
            Array::F64(v) => v.get(i).map(|x| Value::F64(*x)),
            Array::Bool(v) => v.get(i).map(|x| Value::Bool(*x)),
            Array::String(v) => v.get(i).map(|x| Value::String(x.clone())),
            Array::Array(v) => v.get(i).map(|x| Value::Array(x.clone())),
        }
    }

    /// Like `Value::summary`.
    pub fn summary(&self, max_items: usize) -> String {
        let mut s = String::new();
        let _ = self.write_summary(&mut s, max_items);
        s
    }

    fn write_summary(&self, f: &mut impl fmt::Write, max_items: usize) -> fmt::Result {
        fn items<T>(
            f: &mut impl fmt::Write,
            v: &[T],
            max: usize,
            mut one: impl FnMut(&mut dyn fmt::Write, &T) -> fmt::Result,
        ) -> fmt::Result {
            f.write_char('[')?;
            for (i, x) in v.iter().take(max).enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                one(f, x)?;
            }
            if v.len() > max {
                write!(f, ", ... ({} items)", v.len())?;
            }
            f.write_char(']')
        }
        match self {
            Array::F32(v) => items(f, v, max_items, |f, x| write!(f, "{x:?}")),
            Array::F64(v) => items(f, v, max_items, |f, x| write!(f, "{x:?}")),
            Array::String(v) => items(f, v, max_items, |f, x| write!(f, "{x:?}")),
            Array::Array(v) => items(f, v, max_items, |f, x| {
                let mut s = String::new();
                x.write_summary(&mut s, max_items)?;
                f.write_str(&s)
            }),
            Array::U8(v) => items(f, v, max_items, |f, x| write!(f, "{x}")),
            Array::I8(v) => items(f, v, max_items, |f, x| write!(f, "{x}")),
            Array::U16(v) => items(f, v, max_items, |f, x| write!(f, "{x}")),
            Array::I16(v) => items(f, v, max_items, |f, x| write!(f, "{x}")),
            Array::U32(v) => items(f, v, max_items, |f, x| write!(f, "{x}")),
            Array::I32(v) => items(f, v, max_items, |f, x| write!(f, "{x}")),
            Array::U64(v) => items(f, v, max_items, |f, x| write!(f, "{x}")),
            Array::I64(v) => items(f, v, max_items, |f, x| write!(f, "{x}")),
            Array::Bool(v) => items(f, v, max_items, |f, x| write!(f, "{x}")),
        }
    }
}

macro_rules! value_from {
    ($($t:ty => $variant:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::$variant(v)
            }
        }
        impl From<Vec<$t>> for Array {
            fn from(v: Vec<$t>) -> Array {
                Array::$variant(v)
            }
        }
        impl From<Vec<$t>> for Value {
            fn from(v: Vec<$t>) -> Value {
                Value::Array(Array::$variant(v))
            }
        }
    )*};
}

value_from!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    u64 => U64, i64 => I64, f32 => F32, f64 => F64, bool => Bool, String => String,
);

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::String(v.to_string())
    }
}

impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Value {
        Value::Array(Array::String(v.into_iter().map(str::to_string).collect()))
    }
}

impl From<Array> for Value {
    fn from(a: Array) -> Value {
        Value::Array(a)
    }
}

impl From<Vec<Array>> for Value {
    fn from(v: Vec<Array>) -> Value {
        Value::Array(Array::Array(v))
    }
}

impl From<Vec<Array>> for Array {
    fn from(v: Vec<Array>) -> Array {
        Array::Array(v)
    }
}
