//! The GGUF subsystem's error type. Every variant says what was wrong and where: the byte
//! offset in the file, the metadata key or the tensor name.

use super::value::ValueType;
use crate::quant::GgmlType;
use std::path::PathBuf;

/// Why a GGUF file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// Opening, mapping or writing a file failed at the OS level.
    #[error("cannot open {path}: {source}")]
    Io {
        /// The file (or `<stream>` for [`super::GgufWriter::write_to`]).
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `mlock` refused to lock the file's pages (usually `RLIMIT_MEMLOCK`, `ulimit -l`).
    #[error("cannot lock {path} in memory ({bytes} bytes): {source}; raise the locked-memory limit (ulimit -l) or leave out --mlock")]
    Mlock {
        /// The file.
        path: PathBuf,
        /// Its size.
        bytes: u64,
        /// The OS error.
        source: std::io::Error,
    },
    /// The path names a directory, a FIFO, a device or a socket: refused before opening it, since
    /// opening a FIFO blocks until a writer comes.
    #[error("{path} is {what}, not a model file")]
    NotAFile {
        /// The path as given.
        path: PathBuf,
        /// What it is (`a directory`, `a FIFO`, ...).
        what: &'static str,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic {found:02x?} at offset 0, expected \"GGUF\"")]
    BadMagic {
        /// The four bytes found at offset 0.
        found: [u8; 4],
    },
    /// The header's version is not 2 or 3.
    #[error("unsupported GGUF version {version} (minfer reads versions 2 and 3)")]
    UnsupportedVersion {
        /// The version read from the header.
        version: u32,
    },
    /// The file ends before a field it announces.
    #[error("file truncated: {what} at offset {offset} needs {needed} bytes, {available} remain")]
    Truncated {
        /// The field being read (`magic`, `value of 'KEY'`, ...).
        what: String,
        /// Byte offset of the field.
        offset: u64,
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the file from `offset`.
        available: u64,
    },
    /// A tensor, key/value or array count could not fit in the rest of the file even at the
    /// smallest encoding; refused before allocating for it.
    #[error("{what} at offset {offset} claims {count} entries, more than the {available} bytes left could hold")]
    CountTooLarge {
        /// The count being read (`tensor count`, `array 'KEY'`, ...).
        what: String,
        /// Byte offset of the count.
        offset: u64,
        /// The count as read.
        count: u64,
        /// Bytes left in the file after the count.
        available: u64,
    },
    /// A string (key, value or tensor name) is not valid UTF-8.
    #[error("invalid UTF-8 in {what} at offset {offset}")]
    InvalidUtf8 {
        /// The string being read.
        what: String,
        /// Byte offset of the string's length prefix.
        offset: u64,
    },
    /// A metadata value or array element type id is not one of the 13 GGUF value types.
    #[error("unknown metadata value type {type_id} for key '{key}' at offset {offset}")]
    UnknownValueType {
        /// The metadata key.
        key: String,
        /// The type id read.
        type_id: u32,
        /// Byte offset of the type id.
        offset: u64,
    },
    /// Arrays of arrays nest deeper than [`super::MAX_ARRAY_DEPTH`].
    #[error("metadata key '{key}': arrays nested deeper than {max_depth} levels at offset {offset}")]
    NestingTooDeep {
        /// The metadata key.
        key: String,
        /// The nesting limit.
        max_depth: usize,
        /// Byte offset of the array that went past the limit.
        offset: u64,
    },
    /// The same metadata key appears twice in one file.
    #[error("duplicate metadata key '{key}' at offset {offset}")]
    DuplicateKey {
        /// The repeated key.
        key: String,
        /// Byte offset of the second occurrence.
        offset: u64,
    },
    /// A required metadata key is absent.
    #[error("metadata key '{key}' is missing")]
    MissingKey {
        /// The key that was asked for.
        key: String,
    },
    /// A metadata getter found a value of another type.
    #[error("metadata key '{key}' has type {actual}, expected {expected}")]
    WrongType {
        /// The metadata key.
        key: String,
        /// The type (or kind of types) the getter accepts.
        expected: &'static str,
        /// The value's actual type.
        actual: ValueType,
    },
    /// An integer metadata value does not fit the type asked for (e.g. a negative value read
    /// with [`super::Metadata::get_uint`]).
    #[error("metadata key '{key}': value {value} is out of range for {expected}")]
    OutOfRange {
        /// The metadata key.
        key: String,
        /// The value, formatted.
        value: String,
        /// The range asked for.
        expected: &'static str,
    },
    /// `general.alignment` is zero or not a power of two.
    #[error("general.alignment = {alignment} is not a non-zero power of two")]
    BadAlignment {
        /// The alignment found.
        alignment: u64,
    },
    /// A tensor has more than `GGML_MAX_DIMS` ([`super::MAX_DIMS`]) dimensions.
    #[error("tensor '{name}' at offset {offset}: {n_dims} dimensions, at most {max} are allowed")]
    TooManyDims {
        /// The tensor name.
        name: String,
        /// Byte offset of the tensor info (0 when writing).
        offset: u64,
        /// The dimension count found.
        n_dims: u32,
        /// The limit, [`super::MAX_DIMS`].
        max: usize,
    },
    /// A tensor's type id is not a ggml type minfer knows.
    #[error("tensor '{name}' at offset {offset}: unknown ggml type id {type_id}{known_as}")]
    UnknownTensorType {
        /// The tensor name.
        name: String,
        /// Byte offset of the type id.
        offset: u64,
        /// The type id read.
        type_id: u32,
        /// What ggml calls the id, when it names one minfer cannot read
        /// ([`crate::quant::unreadable_type_id`]); empty otherwise.
        known_as: &'static str,
    },
    /// A tensor's element count or byte size overflows (ggml counts elements in `int64_t`).
    #[error("tensor '{name}': shape {shape:?} overflows the element count")]
    ElementCountOverflow {
        /// The tensor name.
        name: String,
        /// The shape, ne0 first.
        shape: Vec<u64>,
    },
    /// A tensor's rows (ne0) do not split into whole blocks of its quantized type.
    #[error("tensor '{name}': row length {ne0} is not a multiple of the {ggml_type} block size {block_size}")]
    PartialBlock {
        /// The tensor name.
        name: String,
        /// The row length in elements.
        ne0: u64,
        /// The tensor's type.
        ggml_type: GgmlType,
        /// Elements per block of that type.
        block_size: usize,
    },
    /// A tensor's data offset is not a multiple of the file's alignment.
    #[error("tensor '{name}': data offset {data_offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        /// The tensor name.
        name: String,
        /// Offset of the data within the data section.
        data_offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor's data extends past the end of the file.
    #[error("tensor '{name}': data [{start}, {end}) lies past the end of the data section ({data_len} bytes)")]
    TensorOutOfBounds {
        /// The tensor name.
        name: String,
        /// First byte, relative to the data section.
        start: u64,
        /// One past the last byte, relative to the data section (`u64::MAX` on overflow).
        end: u64,
        /// Length of the data section.
        data_len: u64,
    },
    /// [`super::GgufWriter::add_tensor`] got data of the wrong length for the shape and type.
    #[error("tensor '{name}': {got} bytes of data given, its shape and type need {expected}")]
    DataSizeMismatch {
        /// The tensor name.
        name: String,
        /// Bytes the shape and type need.
        expected: u64,
        /// Bytes given.
        got: u64,
    },
    /// Two tensors share a name (in one file, across split parts, or added twice to a writer).
    #[error("duplicate tensor name '{name}'{location}")]
    DuplicateTensor {
        /// The repeated name.
        name: String,
        /// Where the duplicate was found, preformatted with a leading space.
        location: String,
    },
    /// A [`super::GgufStreamWriter`] was given a tensor other than the next one it declared
    /// (an empty `name`: finished early; an empty `expected`: every tensor was written).
    #[error("tensor data written out of order: got '{name}', the header's next tensor is '{expected}'")]
    OutOfOrderTensor {
        /// The tensor written.
        name: String,
        /// The tensor the header places next.
        expected: String,
    },
    /// No tensor of that name exists in the model.
    #[error("tensor '{name}' not found")]
    MissingTensor {
        /// The name asked for.
        name: String,
    },
    /// The parts of a split model are inconsistent: bad file name, wrong `split.no` or
    /// `split.count`, or a `split.tensors.count` that does not match.
    #[error("split model {path}: {reason}")]
    Split {
        /// The part at fault.
        path: PathBuf,
        /// What is inconsistent.
        reason: String,
    },
    /// Another error, with the file it came from attached (see [`GgufError::in_file`]).
    #[error("{path}: {source}")]
    InFile {
        /// The file the error came from.
        path: PathBuf,
        /// The underlying error.
        source: Box<GgufError>,
    },
}

impl GgufError {
    /// Attach the file the error came from (once).
    pub fn in_file(self, path: &std::path::Path) -> GgufError {
        match self {
            e @ (GgufError::Io { .. }
            | GgufError::InFile { .. }
            | GgufError::Split { .. }
            | GgufError::NotAFile { .. }) => e,
            e => GgufError::InFile {
                path: path.to_path_buf(),
                source: Box::new(e),
            },
        }
    }
}

/// Result of every GGUF operation.
pub type Result<T> = std::result::Result<T, GgufError>;
