//! GGUF v3: reading (memory-mapped, zero-copy, split models merged), writing, and the metadata
//! value model.
//!
//! This module owns the file format only. It knows the ggml type table (to lay out tensor
//! data) but nothing of models or execution. Every input is treated as hostile: a malformed
//! file yields a [`GgufError`] naming the offset or key, never a panic or an unbounded
//! allocation.

mod error;
mod file;
mod reader;
pub mod split;
mod value;
mod writer;

pub use error::{GgufError, Result};
pub use file::{GgufFile, OpenOptions};
pub use reader::{parse_header, Header, TensorInfo, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS};
pub use value::{Array, Metadata, Value, ValueType};
pub use writer::{GgufStreamWriter, GgufWriter, TensorLayout};
