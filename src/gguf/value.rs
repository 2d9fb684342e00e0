//! GGUF metadata values: the thirteen value types, arrays (nested ones included), and the
//! metadata table with typed getters whose errors name the key and the actual type.

use super::error::{GgufError, Result};
use std::fmt;

/// A GGUF metadata value type; discriminants are the GGUF ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    /// `GGUF_TYPE_UINT8`.
    U8 = 0,
    /// `GGUF_TYPE_INT8`.
    I8 = 1,
    /// `GGUF_TYPE_UINT16`.
    U16 = 2,
    /// `GGUF_TYPE_INT16`.
    I16 = 3,
    /// `GGUF_TYPE_UINT32`.
    U32 = 4,
    /// `GGUF_TYPE_INT32`.
    I32 = 5,
    /// `GGUF_TYPE_FLOAT32`.
    F32 = 6,
    /// `GGUF_TYPE_BOOL`: one byte, non-zero is true.
    Bool = 7,
    /// `GGUF_TYPE_STRING`: u64 length, then UTF-8 bytes (no terminator).
    String = 8,
    /// `GGUF_TYPE_ARRAY`: element type id, u64 count, then the elements.
    Array = 9,
    /// `GGUF_TYPE_UINT64`.
    U64 = 10,
    /// `GGUF_TYPE_INT64`.
    I64 = 11,
    /// `GGUF_TYPE_FLOAT64`.
    F64 = 12,
}

impl ValueType {
    /// The type with GGUF id `id`, or `None` for an unknown id.
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The type's name as gguf-py spells it (`UINT32`, `FLOAT32`, `STRING`, ...).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "UINT8",
            I8 => "INT8",
            U16 => "UINT16",
            I16 => "INT16",
            U32 => "UINT32",
            I32 => "INT32",
            F32 => "FLOAT32",
            Bool => "BOOL",
            String => "STRING",
            Array => "ARRAY",
            U64 => "UINT64",
            I64 => "INT64",
            F64 => "FLOAT64",
        }
    }

    /// The fewest bytes one value of this type occupies in a file: a bound that keeps a hostile
    /// element count from making us allocate more than the file could hold.
    pub fn min_encoded_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
            String => 8,
            Array => 12,
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An array value. Stored per element type so that a large array costs what it costs in the
/// file, not a tagged enum per element.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    /// Array of `UINT8`.
    U8(Vec<u8>),
    /// Array of `INT8`.
    I8(Vec<i8>),
    /// Array of `UINT16`.
    U16(Vec<u16>),
    /// Array of `INT16`.
    I16(Vec<i16>),
    /// Array of `UINT32`.
    U32(Vec<u32>),
    /// Array of `INT32`.
    I32(Vec<i32>),
    /// Array of `FLOAT32`.
    F32(Vec<f32>),
    /// Array of `BOOL`.
    Bool(Vec<bool>),
    /// Array of `STRING` (e.g. `tokenizer.ggml.tokens`).
    String(Vec<String>),
    /// Array of arrays; the inner arrays may differ in type and length.
    Array(Vec<Array>),
    /// Array of `UINT64`.
    U64(Vec<u64>),
    /// Array of `INT64`.
    I64(Vec<i64>),
    /// Array of `FLOAT64`.
    F64(Vec<f64>),
}

impl Array {
    /// The GGUF type of the elements.
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements (inner arrays count as one each).
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `UINT8` value.
    U8(u8),
    /// `INT8` value.
    I8(i8),
    /// `UINT16` value.
    U16(u16),
    /// `INT16` value.
    I16(i16),
    /// `UINT32` value.
    U32(u32),
    /// `INT32` value.
    I32(i32),
    /// `FLOAT32` value.
    F32(f32),
    /// `BOOL` value.
    Bool(bool),
    /// `STRING` value.
    String(String),
    /// `ARRAY` value.
    Array(Array),
    /// `UINT64` value.
    U64(u64),
    /// `INT64` value.
    I64(i64),
    /// `FLOAT64` value.
    F64(f64),
}

impl Value {
    /// The GGUF type of the value.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The value as a signed integer if it is any integer type that fits.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v as i128,
            Value::I8(v) => v as i128,
            Value::U16(v) => v as i128,
            Value::I16(v) => v as i128,
            Value::U32(v) => v as i128,
            Value::I32(v) => v as i128,
            Value::U64(v) => v as i128,
            Value::I64(v) => v as i128,
            _ => return None,
        })
    }
}

/// The metadata table of a GGUF file, in file order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
}

macro_rules! strict_getter {
    ($(#[$doc:meta])* $fn:ident, $variant:ident, $ty:ty) => {
        $(#[$doc])*
        pub fn $fn(&self, key: &str) -> Result<$ty> {
            match self.require(key)? {
                Value::$variant(v) => Ok(v.clone()),
                other => Err(wrong_type(key, ValueType::$variant.name(), other)),
            }
        }
    };
}

fn wrong_type(key: &str, expected: &'static str, actual: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        actual: actual.value_type(),
    }
}

impl Metadata {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append or replace `key`.
    pub fn set(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        match self.entries.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => self.entries.push((key, value)),
        }
    }

    /// Remove `key`, returning its value if it was present.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        Some(self.entries.remove(i).1)
    }

    /// Remove `key` wherever it is and append it with `value`: where ggml's `gguf_set_val_*`
    /// puts a key, which decides the order of the keys in the files llama.cpp's tools write.
    pub fn set_last(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        self.remove(&key);
        self.entries.push((key, value));
    }

    pub(crate) fn push_unchecked(&mut self, key: String, value: Value) {
        self.entries.push((key, value));
    }

    /// The value of `key`, or `None` if absent.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Every key and value, in file (insertion) order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table has no keys.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `key`, or an error naming the missing key.
    pub fn require(&self, key: &str) -> Result<&Value> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey { key: key.to_string() })
    }

    strict_getter!(/// A `UINT8` value.
        get_u8, U8, u8);
    strict_getter!(/// A `UINT16` value.
        get_u16, U16, u16);
    strict_getter!(/// A `UINT32` value.
        get_u32, U32, u32);
    strict_getter!(/// An `INT32` value.
        get_i32, I32, i32);
    strict_getter!(/// A `UINT64` value.
        get_u64, U64, u64);
    strict_getter!(/// A `FLOAT32` value.
        get_f32, F32, f32);
    strict_getter!(/// A `BOOL` value.
        get_bool, Bool, bool);

    /// A `STRING` value, borrowed.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            other => Err(wrong_type(key, "STRING", other)),
        }
    }

    /// An `ARRAY` value, borrowed.
    pub fn get_array(&self, key: &str) -> Result<&Array> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            other => Err(wrong_type(key, "ARRAY", other)),
        }
    }

    /// Any integer type whose value fits a `u64`. Converters disagree on the integer width of
    /// hyper-parameters (u32, i32, u64), so model loaders read them through this.
    pub fn get_uint(&self, key: &str) -> Result<u64> {
        let value = self.require(key)?;
        let v = value
            .as_i128()
            .ok_or_else(|| wrong_type(key, "an unsigned integer", value))?;
        u64::try_from(v).map_err(|_| GgufError::OutOfRange {
            key: key.to_string(),
            value: v.to_string(),
            expected: "an unsigned integer",
        })
    }

    /// A `FLOAT32` or `FLOAT64` value as f32.
    pub fn get_float(&self, key: &str) -> Result<f32> {
        match self.require(key)? {
            Value::F32(v) => Ok(*v),
            Value::F64(v) => Ok(*v as f32),
            other => Err(wrong_type(key, "a float", other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_getter_of_the_wrong_type_names_the_key_and_the_actual_type() {
        let mut m = Metadata::new();
        m.set("qwen2.block_count", Value::String("24".into()));
        let err = m.get_u32("qwen2.block_count").unwrap_err();
        assert_eq!(
            err.to_string(),
            "metadata key 'qwen2.block_count' has type STRING, expected UINT32"
        );
        let err = m.get_u32("qwen2.context_length").unwrap_err();
        assert_eq!(err.to_string(), "metadata key 'qwen2.context_length' is missing");
    }

    #[test]
    fn get_uint_accepts_any_integer_width_but_not_negative_values() {
        let mut m = Metadata::new();
        m.set("a", Value::I32(7));
        m.set("b", Value::U64(1 << 40));
        m.set("c", Value::I64(-1));
        assert_eq!(m.get_uint("a").unwrap(), 7);
        assert_eq!(m.get_uint("b").unwrap(), 1 << 40);
        assert!(m
            .get_uint("c")
            .unwrap_err()
            .to_string()
            .contains("value -1 is out of range"));
    }
}
