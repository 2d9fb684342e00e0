//! The model file as the graph's [`TensorSource`]: backends resolve weight names straight into
//! the memory map, zero-copy — the file's tensors by their GGUF names, and the views an
//! architecture declares (a band of rows of a file tensor under a name of its own: Phi-3's Q, K
//! and V inside `attn_qkv.weight`). Must not copy or convert any tensor.

use crate::gguf::GgufFile;
use crate::graph::{TensorSource, Weight};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

/// A weight that is rows `first_row..first_row + n_rows` of the 2-D file tensor `base`
/// (`[ne0, n_rows]` in GGUF order): a row is whole quantization blocks, so the view is a plain
/// byte range of the base.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightView {
    /// The name the graph uses.
    pub name: String,
    /// The file tensor it lies in.
    pub base: String,
    /// Its first row (ne1 index) in the base.
    pub first_row: u64,
    /// Its rows.
    pub n_rows: u64,
}

/// A view resolved against the file: where its bytes are and its shape.
struct ResolvedView {
    base: String,
    bytes: Range<usize>,
    shape: Vec<u64>,
}

/// A shared GGUF file that hands out its tensors, and the views declared on it, as weights by
/// name.
#[derive(Clone)]
pub struct GgufWeights {
    file: Arc<GgufFile>,
    views: Arc<HashMap<String, ResolvedView>>,
}

impl GgufWeights {
    /// The file's tensors, no views.
    pub fn new(file: Arc<GgufFile>) -> Self {
        GgufWeights {
            file,
            views: Arc::default(),
        }
    }

    /// The file's tensors and `views` (which the model's loader checked: each base is a 2-D
    /// tensor holding the rows). A view that does not fit its base is left out, so a graph
    /// naming it fails as for any missing weight.
    pub fn with_views(file: Arc<GgufFile>, views: &[WeightView]) -> Self {
        let resolved = views
            .iter()
            .filter_map(|v| {
                let t = file.tensor(&v.base).ok()?;
                let [ne0, ne1] = t.shape[..] else { return None };
                let end = v.first_row.checked_add(v.n_rows).filter(|&e| e <= ne1)?;
                let row = usize::try_from(t.ggml_type.row_size(ne0)?).ok()?;
                let bytes = usize::try_from(v.first_row).ok()? * row..usize::try_from(end).ok()? * row;
                let view = ResolvedView {
                    base: v.base.clone(),
                    bytes,
                    shape: vec![ne0, v.n_rows],
                };
                Some((v.name.clone(), view))
            })
            .collect();
        GgufWeights {
            file,
            views: Arc::new(resolved),
        }
    }

    /// The file.
    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }
}

impl TensorSource for GgufWeights {
    fn weight(&self, name: &str) -> Option<Weight<'_>> {
        if let Some(v) = self.views.get(name) {
            let t = self.file.tensor(&v.base).ok()?;
            return Some(Weight {
                ggml_type: t.ggml_type,
                shape: &v.shape,
                data: &self.file.tensor_data(t)[v.bytes.clone()],
            });
        }
        let t = self.file.tensor(name).ok()?;
        Some(Weight {
            ggml_type: t.ggml_type,
            shape: &t.shape,
            data: self.file.tensor_data(t),
        })
    }

    fn release(&self, name: &str) {
        if let Some(v) = self.views.get(name) {
            if let Ok(t) = self.file.tensor(&v.base) {
                self.file.release_tensor_bytes(t, v.bytes.clone());
            }
        } else if let Ok(t) = self.file.tensor(name) {
            self.file.release_tensor(t);
        }
    }
}
