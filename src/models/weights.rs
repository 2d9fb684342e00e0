//! The model file as the graph's [`TensorSource`]: backends resolve weight names straight into
//! the memory map, zero-copy.

use crate::gguf::GgufFile;
use crate::graph::{TensorSource, Weight};
use std::sync::Arc;

/// A shared GGUF file that hands out its tensors as weights by name.
#[derive(Clone)]
pub struct GgufWeights(pub Arc<GgufFile>);

impl TensorSource for GgufWeights {
    fn weight(&self, name: &str) -> Option<Weight<'_>> {
        let t = self.0.tensor(name).ok()?;
        Some(Weight {
            ggml_type: t.ggml_type,
            shape: &t.shape,
            data: self.0.tensor_data(t),
        })
    }

    fn release(&self, name: &str) {
        if let Ok(t) = self.0.tensor(name) {
            self.0.release_tensor(t);
        }
    }
}
