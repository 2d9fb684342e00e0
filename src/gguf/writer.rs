//! Writing GGUF v3 files: metadata, a tensor table and aligned tensor data, laid out as
//! llama.cpp and gguf-py write them (tensors in insertion order, each padded to the alignment).
//!
//! [`GgufWriter`] builds a whole file in memory; [`GgufStreamWriter`] writes the header first
//! (every tensor's offset follows from the declared types and shapes) and then takes the tensor
//! data one tensor at a time, so a tool that converts or copies a model holds one tensor, not
//! the file. Both lay out the same bytes.

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
        alignment(&self.metadata)
    }

    /// Serialise the whole file.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let alignment = self.alignment()?;
        let layout: Vec<_> = self
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t.ggml_type, t.shape.as_slice(), t.data.len() as u64))
            .collect();
        let mut out = header_bytes(&self.metadata, &layout, alignment);
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

/// One tensor of a [`GgufStreamWriter`]'s table: what the header says of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorLayout {
    /// The tensor name.
    pub name: String,
    /// The ggml type its data will have.
    pub ggml_type: GgmlType,
    /// Dimensions in ggml order (ne0 first).
    pub shape: Vec<u64>,
}

impl TensorLayout {
    /// The entry as ggml's `gguf_add_tensor` records a tensor: trailing dimensions of 1 dropped
    /// (`ggml_n_dims`), so that a `[256, 1]` tensor is written as `[256]`, as llama.cpp's
    /// tools write it.
    pub fn as_ggml_records(name: &str, ggml_type: GgmlType, shape: &[u64]) -> Self {
        let n_dims = shape.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
        TensorLayout {
            name: name.to_string(),
            ggml_type,
            shape: shape[..n_dims.min(shape.len())].to_vec(),
        }
    }
}

/// Writes a GGUF file in one pass: the header at creation, then [`GgufStreamWriter::write_tensor`]
/// once per declared tensor, in the declared order.
pub struct GgufStreamWriter<W: Write> {
    out: W,
    sizes: Vec<(String, u64)>,
    next: usize,
    alignment: u64,
    path: std::path::PathBuf,
    /// For a file: its temporary name, renamed to the final one by a successful finish.
    pending: Option<PendingFile>,
}

/// A file being written under a temporary name beside its final one (a new file of an
/// unpredictable name, [`crate::fs_safe::create_temp_beside`]): renamed into place once
/// complete, removed if dropped before, so that a failure part-way (a full disk, a refused
/// tensor) never leaves a truncated file under the final name.
struct PendingFile {
    temp: std::path::PathBuf,
    path: std::path::PathBuf,
}

impl PendingFile {
    fn commit(self) -> Result<()> {
        let result = std::fs::rename(&self.temp, &self.path).map_err(|source| GgufError::Io {
            path: self.path.clone(),
            source,
        });
        if result.is_ok() {
            // Renamed: nothing is left for the drop to remove.
            std::mem::forget(self);
        }
        result
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.temp);
    }
}

impl GgufStreamWriter<std::io::BufWriter<std::fs::File>> {
    /// Create the file at `path` (replacing any file there once it is complete) and write its
    /// header: `metadata`, then the table of `tensors`. The data goes to a new temporary file
    /// beside `path` (created exclusively: a link planted in the directory is never written
    /// through) until [`GgufStreamWriter::finish`] renames it.
    pub fn create(path: &Path, metadata: &Metadata, tensors: &[TensorLayout]) -> Result<Self> {
        let (file, temp) = crate::fs_safe::create_temp_beside(path).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let pending = PendingFile {
            temp,
            path: path.to_path_buf(),
        };
        let mut writer = Self::new(
            std::io::BufWriter::with_capacity(1 << 20, file),
            path,
            metadata,
            tensors,
        )?;
        writer.pending = Some(pending);
        Ok(writer)
    }
}

impl<W: Write> GgufStreamWriter<W> {
    /// Write the header into `out`; `path` names `out` in errors.
    pub fn new(out: W, path: &Path, metadata: &Metadata, tensors: &[TensorLayout]) -> Result<Self> {
        let alignment = alignment(metadata)?;
        let mut layout = Vec::with_capacity(tensors.len());
        let mut names = std::collections::HashSet::new();
        for t in tensors {
            if t.shape.len() > MAX_DIMS {
                return Err(GgufError::TooManyDims {
                    name: t.name.clone(),
                    offset: 0,
                    n_dims: t.shape.len() as u32,
                    max: MAX_DIMS,
                });
            }
            if !names.insert(t.name.as_str()) {
                return Err(GgufError::DuplicateTensor {
                    name: t.name.clone(),
                    location: " (declared twice)".into(),
                });
            }
            let size = tensor_size(&t.name, t.ggml_type, &t.shape)?;
            layout.push((t.name.as_str(), t.ggml_type, t.shape.as_slice(), size));
        }
        let header = header_bytes(metadata, &layout, alignment);
        let sizes = layout.iter().map(|&(n, _, _, size)| (n.to_string(), size)).collect();
        let mut writer = GgufStreamWriter {
            out,
            sizes,
            next: 0,
            alignment,
            path: path.to_path_buf(),
            pending: None,
        };
        writer.write(&header)?;
        Ok(writer)
    }

    /// Write the next tensor's data (the tensors go in the order they were declared), padded
    /// to the alignment.
    pub fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<()> {
        let (expected_name, size) = match self.sizes.get(self.next) {
            Some((n, s)) => (n.as_str(), *s),
            None => ("", 0),
        };
        if expected_name != name {
            return Err(GgufError::OutOfOrderTensor {
                name: name.into(),
                expected: expected_name.into(),
            });
        }
        if size != data.len() as u64 {
            return Err(GgufError::DataSizeMismatch {
                name: name.into(),
                expected: size,
                got: data.len() as u64,
            });
        }
        let padding = (size.next_multiple_of(self.alignment) - size) as usize;
        self.next += 1;
        self.write(data)?;
        self.write(&vec![0u8; padding])?;
        Ok(())
    }

    /// Check that every declared tensor was written and flush the output; a file is then
    /// renamed to its final name.
    pub fn finish(mut self) -> Result<W> {
        if let Some((name, _)) = self.sizes.get(self.next) {
            return Err(GgufError::OutOfOrderTensor {
                name: String::new(),
                expected: name.clone(),
            });
        }
        self.out.flush().map_err(|source| GgufError::Io {
            path: self.path.clone(),
            source,
        })?;
        if let Some(pending) = self.pending.take() {
            pending.commit()?;
        }
        Ok(self.out)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).map_err(|source| GgufError::Io {
            path: self.path.clone(),
            source,
        })
    }
}

/// The file's alignment: `general.alignment` if set (a power of two), else the default.
fn alignment(metadata: &Metadata) -> Result<u64> {
    match metadata.get("general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(_) => {
            let a = metadata.get_u32("general.alignment")? as u64;
            if a == 0 || !a.is_power_of_two() {
                return Err(GgufError::BadAlignment { alignment: a });
            }
            Ok(a)
        }
    }
}

/// The header: magic, version, counts, metadata and the tensor table (name, type, shape and
/// the size of each tensor's data, which places the next), padded to the alignment.
fn header_bytes(metadata: &Metadata, tensors: &[(&str, GgmlType, &[u64], u64)], alignment: u64) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&GGUF_MAGIC);
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata.iter() {
        write_string(&mut out, key);
        out.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
        write_value(&mut out, value);
    }
    let mut offset = 0u64;
    for &(name, ggml_type, shape, size) in tensors {
        write_string(&mut out, name);
        out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        for d in shape {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&(ggml_type as u32).to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offset = (offset + size).next_multiple_of(alignment);
    }
    pad_to(&mut out, alignment);
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_file_appears_under_its_name_only_when_complete() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let names = || -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            names
        };
        let layout = [TensorLayout::as_ggml_records("t", GgmlType::F32, &[4])];
        // Dropped before its tensor: nothing under either name.
        let writer = GgufStreamWriter::create(&path, &Metadata::default(), &layout).unwrap();
        let during = names();
        assert!(
            during.len() == 1 && during[0].starts_with(".m.gguf.") && during[0].ends_with(".tmp"),
            "{during:?}"
        );
        drop(writer);
        assert_eq!(names(), Vec::<String>::new());
        // A refused tensor, then a finish that finds one missing: still nothing.
        let mut writer = GgufStreamWriter::create(&path, &Metadata::default(), &layout).unwrap();
        assert!(writer.write_tensor("t", &[0; 3]).is_err());
        assert!(writer.finish().is_err());
        assert_eq!(names(), Vec::<String>::new());
        // Complete: renamed into place, and it reads back.
        let mut writer = GgufStreamWriter::create(&path, &Metadata::default(), &layout).unwrap();
        writer.write_tensor("t", &[0; 16]).unwrap();
        writer.finish().unwrap();
        assert_eq!(names(), ["m.gguf"]);
        assert_eq!(crate::gguf::GgufFile::open(&path).unwrap().tensors().len(), 1);
    }
}
