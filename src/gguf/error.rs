//! The GGUF subsystem's error type. Every variant says what was wrong and where: the byte
//! offset in the file, the metadata key or the tensor name.

use super::value::ValueType;
use crate::quant::GgmlType;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot open {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("not a GGUF file: magic {found:02x?} at offset 0, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {version} (minfer reads versions 2 and 3)")]
    UnsupportedVersion { version: u32 },
    #[error("file truncated: {what} at offset {offset} needs {needed} bytes, {available} remain")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },
    #[error("{what} at offset {offset} claims {count} entries, more than the {available} bytes left could hold")]
    CountTooLarge {
        what: String,
        offset: u64,
        count: u64,
        available: u64,
    },
    #[error("invalid UTF-8 in {what} at offset {offset}")]
    InvalidUtf8 { what: String, offset: u64 },
    #[error("unknown metadata value type {type_id} for key '{key}' at offset {offset}")]
    UnknownValueType { key: String, type_id: u32, offset: u64 },
    #[error("metadata key '{key}': arrays nested deeper than {max_depth} levels at offset {offset}")]
    NestingTooDeep { key: String, max_depth: usize, offset: u64 },
    #[error("duplicate metadata key '{key}' at offset {offset}")]
    DuplicateKey { key: String, offset: u64 },
    #[error("metadata key '{key}' is missing")]
    MissingKey { key: String },
    #[error("metadata key '{key}' has type {actual}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        actual: ValueType,
    },
    #[error("metadata key '{key}': value {value} is out of range for {expected}")]
    OutOfRange {
        key: String,
        value: String,
        expected: &'static str,
    },
    #[error("general.alignment = {alignment} is not a non-zero power of two")]
    BadAlignment { alignment: u64 },
    #[error("tensor '{name}' at offset {offset}: {n_dims} dimensions, at most {max} are allowed")]
    TooManyDims {
        name: String,
        offset: u64,
        n_dims: u32,
        max: usize,
    },
    #[error("tensor '{name}' at offset {offset}: unknown ggml type id {type_id}")]
    UnknownTensorType { name: String, offset: u64, type_id: u32 },
    #[error("tensor '{name}': shape {shape:?} overflows the element count")]
    ElementCountOverflow { name: String, shape: Vec<u64> },
    #[error("tensor '{name}': row length {ne0} is not a multiple of the {ggml_type} block size {block_size}")]
    PartialBlock {
        name: String,
        ne0: u64,
        ggml_type: GgmlType,
        block_size: usize,
    },
    #[error("tensor '{name}': data offset {data_offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        name: String,
        data_offset: u64,
        alignment: u64,
    },
    #[error("tensor '{name}': data [{start}, {end}) lies past the end of the data section ({data_len} bytes)")]
    TensorOutOfBounds {
        name: String,
        start: u64,
        end: u64,
        data_len: u64,
    },
    #[error("tensor '{name}': {got} bytes of data given, its shape and type need {expected}")]
    DataSizeMismatch { name: String, expected: u64, got: u64 },
    #[error("duplicate tensor name '{name}'{location}")]
    DuplicateTensor { name: String, location: String },
    #[error("tensor '{name}' not found")]
    MissingTensor { name: String },
    #[error("split model {path}: {reason}")]
    Split { path: PathBuf, reason: String },
    #[error("{path}: {source}")]
    InFile { path: PathBuf, source: Box<GgufError> },
}

impl GgufError {
    /// Attach the file the error came from (once).
    pub fn in_file(self, path: &std::path::Path) -> GgufError {
        match self {
            e @ (GgufError::Io { .. } | GgufError::InFile { .. } | GgufError::Split { .. }) => e,
            e => GgufError::InFile {
                path: path.to_path_buf(),
                source: Box::new(e),
            },
        }
    }
}

pub type Result<T> = std::result::Result<T, GgufError>;
