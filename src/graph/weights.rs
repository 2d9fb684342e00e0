//! Named weights: how a backend resolves the weight a node names. The graph only knows the
//! names; a [`TensorSource`] (the model file, in practice) provides the bytes, zero-copy.

use crate::quant::GgmlType;

/// A weight tensor as stored in the model file.
#[derive(Clone, Copy, Debug)]
pub struct Weight<'a> {
    /// The tensor's GGML type (F32, F16, Q8_0, Q4_K, ...).
    pub ggml_type: GgmlType,
    /// GGUF shape, ne0 first.
    pub shape: &'a [u64],
    /// The raw bytes of the tensor, in its GGML type's layout.
    pub data: &'a [u8],
}

/// Anything that can hand out weights by name (a memory-mapped GGUF file).
pub trait TensorSource: Send + Sync {
    /// The weight named `name` (its GGUF tensor name), or `None` if there is none.
    fn weight(&self, name: &str) -> Option<Weight<'_>>;

    /// A hint that the weight named `name` will seldom be read again (a backend holds its own
    /// copy): a memory-mapped source may give its pages back to the system, to be read in
    /// again from the file if they are touched. The bytes stay valid; the default does nothing.
    fn release(&self, name: &str) {
        let _ = name;
    }
}

/// A weight a graph names, and whether a node multiplies by it (a matmul's or a fused
/// projection's matrix) rather than only reading it (an embedding table, a norm, a bias).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightUse {
    /// The weight's GGUF tensor name.
    pub name: String,
    /// Whether some node multiplies by it.
    pub multiplied: bool,
}
