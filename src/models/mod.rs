//! Model definitions: per architecture, the hyper-parameters, the tensors it needs (validated at
//! load) and the graph of one forward pass. A model describes; it never executes and knows no
//! generation loop. Adding an architecture costs one folder and one match arm in [`load_model`].

pub mod hparams;
pub mod qwen2;
pub mod weights;

use crate::gguf::{GgufError, GgufFile};
use crate::graph::{ComputeGraph, GraphParams};
use crate::quant::GgmlType;
pub use hparams::HParams;
pub use weights::GgufWeights;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Metadata(#[from] GgufError),
    #[error("unsupported architecture '{arch}' (general.architecture); minfer supports: {supported}")]
    UnknownArchitecture { arch: String, supported: &'static str },
    #[error("tensor '{name}' is missing from the model")]
    MissingTensor { name: String },
    #[error("tensor '{name}' has shape {got:?}, expected {expected:?}")]
    BadShape {
        name: String,
        expected: Vec<u64>,
        got: Vec<u64>,
    },
    #[error("tensor '{name}' has type {ggml_type}, which minfer cannot compute with")]
    UnsupportedType { name: String, ggml_type: GgmlType },
    #[error("hyper-parameter {name} = {value} is invalid: {reason}")]
    BadHParam {
        name: &'static str,
        value: u64,
        reason: String,
    },
}

/// What the engine needs of a model.
pub trait ModelDef: Send + Sync {
    fn arch(&self) -> &'static str;
    fn hparams(&self) -> &HParams;
    /// The forward pass for `params`: a pure function of them (the reuse invariant).
    fn build_graph(&self, params: &GraphParams) -> ComputeGraph;
}

pub const SUPPORTED_ARCHITECTURES: &str = "qwen2";

/// The model for `file`'s `general.architecture`, its tensors checked against its
/// hyper-parameters.
pub fn load_model(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    let arch = file.metadata().get_str("general.architecture")?;
    match arch {
        "qwen2" => Ok(Box::new(qwen2::Qwen2::load(file)?)),
        other => Err(ModelError::UnknownArchitecture {
            arch: other.to_string(),
            supported: SUPPORTED_ARCHITECTURES,
        }),
    }
}

/// Check that tensor `name` exists with GGUF shape `shape` and a type minfer supports.
pub(crate) fn check_tensor(file: &GgufFile, name: &str, shape: &[u64]) -> Result<GgmlType, ModelError> {
    let t = file
        .tensor(name)
        .map_err(|_| ModelError::MissingTensor { name: name.to_string() })?;
    if t.shape != shape {
        return Err(ModelError::BadShape {
            name: name.to_string(),
            expected: shape.to_vec(),
            got: t.shape.clone(),
        });
    }
    if !t.ggml_type.is_supported() || t.ggml_type == GgmlType::Q8_K {
        return Err(ModelError::UnsupportedType {
            name: name.to_string(),
            ggml_type: t.ggml_type,
        });
    }
    Ok(t.ggml_type)
}
