//! Writing GGUF v3 files: metadata, a tensor table and aligned tensor data, laid out as
//! llama.cpp and gguf-py write them (tensors in insertion order, each padded to the alignment).

use super::error::{GgufError, Result};
use super::reader::{tensor_size, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
use super::value::{Array, Metadata, Value};
use crate::quant::GgmlType;
use std::io::Write;
use std::path::Path;

struct PendingTensor {
    name: String,
    ggml_type: GgmlType,
    shape: Vec<u64>,
    data: Vec<u8>,
}

/// Builds a GGUF file in memory and writes it out.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Metadata,
    tensors: Vec<PendingTensor>,
}

impl GgufWriter {
    /// An empty writer: no metadata, no tensors.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set a metadata key (replacing an earlier value). A `general.alignment` set here is the
    /// alignment the file is written with.
    pub fn set(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        self.metadata.set(key, value);
        self
    }

    /// Copy every metadata entry of `metadata`, in order.
    pub fn set_all(&mut self, metadata: &Metadata) -> &mut Self {
        for (k, v) in metadata.iter() {
            self.metadata.set(k, v.clone());
        }
        self
    }

    /// The metadata set so far.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Add a tensor; `shape` is in ggml order (ne0 first) and `data` must be exactly its size.
    pub fn add_tensor(&mut self, name: &str, ggml_type: GgmlType, shape: &[u64], data: Vec<u8>) -> Result<&mut Self> {
        if shape.len() > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                name: name.into(),
                offset: 0,
                n_dims: shape.len() as u32,
                max: MAX_DIMS,
            });
        }
        let size = tensor_size(name, ggml_type, shape)?;
        if size != data.len() as u64 {
            return Err(GgufError::DataSizeMismatch {
                name: name.into(),
                expected: size,
                got: data.len() as u64,
            });
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::DuplicateTensor {
                name: name.into(),
                location: " (added twice)".into(),
            });
        }
        self.tensors.push(PendingTensor {
            name: name.into(),
            ggml_type,
            shape: shape.to_vec(),
            data,
        });
        Ok(self)
    }

    fn alignment(&self) -> Result<u64> {
        match self.metadata.get("general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some(_) => {
                let a = self.metadata.get_u32("general.alignment")? as u64;
                if a == 0 || !a.is_power_of_two() {
                    return Err(GgufError::BadAlignment { alignment: a });
                }
                Ok(a)
            }
        }
    }

    /// Serialise the whole file.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let alignment = self.alignment()?;
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in self.metadata.iter() {
            write_string(&mut out, key);
            out.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
            write_value(&mut out, value);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            write_string(&mut out, &t.name);
            out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for d in &t.shape {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&(t.ggml_type as u32).to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + t.data.len() as u64).next_multiple_of(alignment);
        }
        pad_to(&mut out, alignment);
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
            pad_to(&mut out, alignment);
        }
        Ok(out)
    }

    /// Serialise the whole file (see [`GgufWriter::to_bytes`]) into `w`.
    pub fn write_to(&self, w: &mut impl Write) -> Result<()> {
        let bytes = self.to_bytes()?;
        w.write_all(&bytes).map_err(|source| GgufError::Io {
            path: "<stream>".into(),
            source,
        })
    }

    /// Serialise the whole file and write it to `path`, replacing any file there.
    pub fn write_file(&self, path: &Path) -> Result<()> {
        let bytes = self.to_bytes()?;
        std::fs::write(path, bytes).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

fn pad_to(out: &mut Vec<u8>, alignment: u64) {
    let len = (out.len() as u64).next_multiple_of(alignment) as usize;
    out.resize(len, 0);
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.push(*v as u8),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(*v as u8),
        Value::String(s) => write_string(out, s),
        Value::Array(a) => write_array(out, a),
    }
}

fn write_array(out: &mut Vec<u8>, array: &Array) {
    out.extend_from_slice(&(array.element_type() as u32).to_le_bytes());
    out.extend_from_slice(&(array.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr, $f:expr) => {
            for x in $v {
                $f(out, x)
            }
        };
    }
    match array {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => each!(v, |o: &mut Vec<u8>, x: &i8| o.push(*x as u8)),
        Array::Bool(v) => each!(v, |o: &mut Vec<u8>, x: &bool| o.push(*x as u8)),
        Array::U16(v) => each!(v, |o: &mut Vec<u8>, x: &u16| o.extend_from_slice(&x.to_le_bytes())),
        Array::I16(v) => each!(v, |o: &mut Vec<u8>, x: &i16| o.extend_from_slice(&x.to_le_bytes())),
        Array::U32(v) => each!(v, |o: &mut Vec<u8>, x: &u32| o.extend_from_slice(&x.to_le_bytes())),
        Array::I32(v) => each!(v, |o: &mut Vec<u8>, x: &i32| o.extend_from_slice(&x.to_le_bytes())),
        Array::F32(v) => each!(v, |o: &mut Vec<u8>, x: &f32| o.extend_from_slice(&x.to_le_bytes())),
        Array::U64(v) => each!(v, |o: &mut Vec<u8>, x: &u64| o.extend_from_slice(&x.to_le_bytes())),
        Array::I64(v) => each!(v, |o: &mut Vec<u8>, x: &i64| o.extend_from_slice(&x.to_le_bytes())),
        Array::F64(v) => each!(v, |o: &mut Vec<u8>, x: &f64| o.extend_from_slice(&x.to_le_bytes())),
        Array::String(v) => each!(v, |o: &mut Vec<u8>, x: &String| write_string(o, x)),
        Array::Array(v) => each!(v, write_array),
    }
}
