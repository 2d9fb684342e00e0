//! Parsing one GGUF file's header (metadata and tensor table) from its bytes.
//!
//! Every length, count and offset read from the file is checked against the bytes that remain
//! before anything is allocated for it, so a hostile file costs at most a constant factor of
//! its own size and never panics. This module does not open files or own their bytes: see
//! [`super::GgufFile`].

use super::error::{GgufError, Result};
use super::value::{Array, Metadata, Value, ValueType};
use crate::quant::GgmlType;
use std::collections::HashSet;

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: usize = 4;
/// The alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Arrays of arrays are legal; this bound keeps a hostile file from exhausting the stack.
pub const MAX_ARRAY_DEPTH: usize = 16;

/// One tensor of the table. `shape` is in ggml order: `shape[0]` (ne0) is the contiguous
/// dimension, so a weight matrix `[n_in, n_out]` is stored as `n_out` rows of `n_in` values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// The ggml type of the data (F32, F16, Q4_K, ...).
    pub ggml_type: GgmlType,
    /// Dimensions in ggml order: ne0 (contiguous) first; at most [`MAX_DIMS`].
    pub shape: Vec<u64>,
    /// Offset of the data relative to the start of its file's data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub size: u64,
    /// Which part of a split model holds the data (0 for single files).
    pub part: usize,
}

impl TensorInfo {
    /// Total element count: the product of `shape` (1 for a scalar).
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// The parsed header of one GGUF file.
#[derive(Clone, Debug)]
pub struct Header {
    /// GGUF version: 2 or 3.
    pub version: u32,
    /// The key/value metadata, in file order.
    pub metadata: Metadata,
    /// The tensor table, in file order.
    pub tensors: Vec<TensorInfo>,
    /// Data alignment in bytes: `general.alignment`, or [`DEFAULT_ALIGNMENT`] when absent.
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                needed: n,
                available: self.remaining(),
            });
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let b = self.take(N as u64, what)?;
        Ok(b.try_into().expect("take returned N bytes"))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let offset = self.pos as u64;
        let len = self.u64(&|| format!("length of {}", what()))?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8 { what: what(), offset })
    }

    /// Read an element count and check that `count` elements of at least `min_size` bytes each
    /// fit in what remains.
    fn count(&mut self, min_size: u64, what: &dyn Fn() -> String) -> Result<u64> {
        let offset = self.pos as u64;
        let count = self.u64(what)?;
        if count.checked_mul(min_size).is_none_or(|n| n > self.remaining()) {
            return Err(GgufError::CountTooLarge {
                what: what(),
                offset,
                count,
                available: self.remaining(),
            });
        }
        Ok(count)
    }
}

/// Parse and validate the header of a GGUF file whose complete contents are `bytes`.
pub fn parse_header(bytes: &[u8]) -> Result<Header> {
    let mut c = Cursor { bytes, pos: 0 };
    let magic: [u8; 4] = c.array(&|| "magic".into())?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = c.u32(&|| "version".into())?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion { version });
    }
    // Smallest tensor info: name length (8), n_dims (4), type (4), offset (8).
    let n_tensors = c.count(24, &|| "tensor count".into())?;
    // Smallest key/value: key length (8), value type (4), one byte of value.
    let n_kv = c.count(13, &|| "metadata key/value count".into())?;

    let mut metadata = Metadata::new();
    let mut seen_keys = HashSet::new();
    for i in 0..n_kv {
        let key_offset = c.pos as u64;
        let key = c.string(&|| format!("metadata key #{i}"))?;
        if !seen_keys.insert(key.clone()) {
            return Err(GgufError::DuplicateKey {
                key,
                offset: key_offset,
            });
        }
        let type_offset = c.pos as u64;
        let type_id = c.u32(&|| format!("value type of '{key}'"))?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.clone(),
            type_id,
            offset: type_offset,
        })?;
        let value = read_value(&mut c, &key, ty)?;
        metadata.push_unchecked(key, value);
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(_) => {
            let a = metadata.get_u32("general.alignment")? as u64;
            if a == 0 || !a.is_power_of_two() {
                return Err(GgufError::BadAlignment { alignment: a });
            }
            a
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        let info_offset = c.pos as u64;
        let name = c.string(&|| format!("name of tensor #{i}"))?;
        let n_dims = c.u32(&|| format!("dimension count of tensor '{name}'"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                name,
                offset: info_offset,
                n_dims,
                max: MAX_DIMS,
            });
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            shape.push(c.u64(&|| format!("dimension {d} of tensor '{name}'"))?);
        }
        let type_offset = c.pos as u64;
        let type_id = c.u32(&|| format!("type of tensor '{name}'"))?;
        let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
            name: name.clone(),
            offset: type_offset,
            type_id,
            known_as: crate::quant::unreadable_type_id(type_id),
        })?;
        let offset = c.u64(&|| format!("data offset of tensor '{name}'"))?;
        let size = tensor_size(&name, ggml_type, &shape)?;
        if offset % alignment != 0 {
            return Err(GgufError::MisalignedTensor {
                name,
                data_offset: offset,
                alignment,
            });
        }
        if !names.insert(name.clone()) {
            return Err(GgufError::DuplicateTensor {
                name,
                location: format!(" at offset {info_offset}"),
            });
        }
        tensors.push(TensorInfo {
            name,
            ggml_type,
            shape,
            offset,
            size,
            part: 0,
        });
    }

    let data_offset = (c.pos as u64).next_multiple_of(alignment);
    let data_len = (bytes.len() as u64).saturating_sub(data_offset);
    for t in &tensors {
        let end = t.offset.checked_add(t.size);
        // The data section itself may start past the end of a file cut short in its padding;
        // then even an empty tensor has no valid position.
        if data_offset > bytes.len() as u64 || end.is_none_or(|end| end > data_len) {
            return Err(GgufError::TensorOutOfBounds {
                name: t.name.clone(),
                start: t.offset,
                end: end.unwrap_or(u64::MAX),
                data_len,
            });
        }
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// Bytes of a tensor of `shape`, refusing element counts that overflow ggml's `int64_t` and
/// rows that are not whole blocks.
pub(crate) fn tensor_size(name: &str, ggml_type: GgmlType, shape: &[u64]) -> Result<u64> {
    let overflow = || GgufError::ElementCountOverflow {
        name: name.to_string(),
        shape: shape.to_vec(),
    };
    let n: u64 = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?;
    if n > i64::MAX as u64 {
        return Err(overflow());
    }
    let ne0 = shape.first().copied().unwrap_or(1);
    let row = ggml_type.row_size(ne0).ok_or_else(|| GgufError::PartialBlock {
        name: name.to_string(),
        ne0,
        ggml_type,
        block_size: ggml_type.block_size(),
    })?;
    // With ne0 = 0 the element count is 0 whatever the other dimensions, so their product is
    // not bounded by the check above.
    let rows = shape
        .iter()
        .skip(1)
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?;
    row.checked_mul(rows).ok_or_else(overflow)
}

fn read_value(c: &mut Cursor, key: &str, ty: ValueType) -> Result<Value> {
    let what = || format!("value of '{key}'");
    Ok(match ty {
        ValueType::U8 => Value::U8(c.array::<1>(&what)?[0]),
        ValueType::I8 => Value::I8(c.array::<1>(&what)?[0] as i8),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.array(&what)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.array(&what)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(c.array(&what)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.array(&what)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.array(&what)?)),
        ValueType::U64 => Value::U64(u64::from_le_bytes(c.array(&what)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.array(&what)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.array(&what)?)),
        ValueType::Bool => Value::Bool(c.array::<1>(&what)?[0] != 0),
        ValueType::String => Value::String(c.string(&what)?),
        ValueType::Array => Value::Array(read_array(c, key, 1)?),
    })
}

fn read_array(c: &mut Cursor, key: &str, depth: usize) -> Result<Array> {
    let offset = c.pos as u64;
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::NestingTooDeep {
            key: key.to_string(),
            max_depth: MAX_ARRAY_DEPTH,
            offset,
        });
    }
    let type_id = c.u32(&|| format!("array element type of '{key}'"))?;
    let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
        key: key.to_string(),
        type_id,
        offset,
    })?;
    let n = c.count(ty.min_encoded_size(), &|| format!("array '{key}'"))? as usize;
    let what = || format!("element of array '{key}'");

    fn fixed<T, const N: usize>(
        c: &mut Cursor,
        n: usize,
        what: &dyn Fn() -> String,
        f: fn([u8; N]) -> T,
    ) -> Result<Vec<T>> {
        // `count` checked that n * N bytes remain, so this cannot fail part-way.
        let bytes = c.take((n * N) as u64, what)?;
        Ok(bytes
            .chunks_exact(N)
            .map(|b| f(b.try_into().expect("chunk of N bytes")))
            .collect())
    }

    Ok(match ty {
        ValueType::U8 => Array::U8(fixed(c, n, &what, |b: [u8; 1]| b[0])?),
        ValueType::I8 => Array::I8(fixed(c, n, &what, |b: [u8; 1]| b[0] as i8)?),
        ValueType::Bool => Array::Bool(fixed(c, n, &what, |b: [u8; 1]| b[0] != 0)?),
        ValueType::U16 => Array::U16(fixed(c, n, &what, u16::from_le_bytes)?),
        ValueType::I16 => Array::I16(fixed(c, n, &what, i16::from_le_bytes)?),
        ValueType::U32 => Array::U32(fixed(c, n, &what, u32::from_le_bytes)?),
        ValueType::I32 => Array::I32(fixed(c, n, &what, i32::from_le_bytes)?),
        ValueType::F32 => Array::F32(fixed(c, n, &what, f32::from_le_bytes)?),
        ValueType::U64 => Array::U64(fixed(c, n, &what, u64::from_le_bytes)?),
        ValueType::I64 => Array::I64(fixed(c, n, &what, i64::from_le_bytes)?),
        ValueType::F64 => Array::F64(fixed(c, n, &what, f64::from_le_bytes)?),
        ValueType::String => {
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                v.push(c.string(&|| format!("element {i} of array '{key}'"))?);
            }
            Array::String(v)
        }
        ValueType::Array => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_array(c, key, depth + 1)?);
            }
            Array::Array(v)
        }
    })
}
