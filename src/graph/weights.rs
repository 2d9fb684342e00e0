//! Named weights: how a backend resolves the weight a node names. The graph only knows the
//! names; a [`TensorSource`] (the model file, in practice) provides the bytes, zero-copy.

use crate::quant::GgmlType;

/// A weight tensor as stored in the model file.
#[derive(Clone, Copy, Debug)]
pub struct Weight<'a> {
    pub ggml_type: GgmlType,
    /// GGUF shape, ne0 first.
    pub shape: &'a [u64],
    pub data: &'a [u8],
}

/// Anything that can hand out weights by name (a memory-mapped GGUF file).
pub trait TensorSource: Send + Sync {
    fn weight(&self, name: &str) -> Option<Weight<'_>>;
}
