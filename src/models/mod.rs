//! Model definitions: per architecture, the hyper-parameters, the tensors it needs (validated at
//! load) and the graph of one forward pass. A model describes; it never executes and knows no
//! generation loop. Adding an architecture costs one folder and one match arm in [`load_model`].

pub mod blocks;
pub mod gemma;
pub mod gemma2;
pub mod gemma3;
pub mod gpt_oss;
pub mod granite;
pub mod hparams;
pub mod llama;
pub mod moe;
pub mod phi3;
pub mod pooling;
pub mod qwen2;
pub mod qwen2moe;
pub mod qwen3;
pub mod qwen3moe;
pub mod weights;

use crate::gguf::{GgufError, GgufFile};
use crate::graph::{ComputeGraph, GraphParams};
use crate::quant::GgmlType;
pub use hparams::HParams;
pub use weights::{GgufWeights, WeightView};

/// Why a model could not be loaded from a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A metadata key is missing or has the wrong type.
    #[error(transparent)]
    Metadata(#[from] GgufError),
    /// `general.architecture` names an architecture minfer has no model for.
    #[error("unsupported architecture '{arch}' (general.architecture); minfer supports: {supported}")]
    UnknownArchitecture {
        /// The file's `general.architecture`.
        arch: String,
        /// The architectures minfer supports ([`ARCHITECTURES`]), comma-separated.
        supported: String,
    },
    /// A tensor the architecture needs is not in the file.
    #[error("tensor '{name}' is missing from the model")]
    MissingTensor {
        /// The GGUF tensor name.
        name: String,
    },
    /// A tensor's GGUF shape disagrees with the hyper-parameters.
    #[error("tensor '{name}' has shape {got:?}, expected {expected:?}")]
    BadShape {
        /// The GGUF tensor name.
        name: String,
        /// The shape the hyper-parameters imply, ne0 first.
        expected: Vec<u64>,
        /// The shape in the file, ne0 first.
        got: Vec<u64>,
    },
    /// A tensor's GGML type has no compute kernels in minfer (or is Q8_K, an activation-only type),
    /// or a norm weight or bias is not F32.
    #[error("tensor '{name}' has type {ggml_type}, which minfer cannot compute with")]
    UnsupportedType {
        /// The GGUF tensor name.
        name: String,
        /// The tensor's type.
        ggml_type: GgmlType,
    },
    /// A hyper-parameter is zero where it must be positive, or inconsistent with another (n_head_kv
    /// not dividing n_head, Qwen3's value_length differing from key_length).
    #[error("hyper-parameter {name} = {value} is invalid: {reason}")]
    BadHParam {
        /// The hyper-parameter (or its metadata key).
        name: &'static str,
        /// Its value.
        value: u64,
        /// Why it is invalid.
        reason: String,
    },
    /// A float hyper-parameter is NaN, infinite, or not positive where it must be.
    #[error("hyper-parameter {name} = {value} is invalid: {reason}")]
    BadFloatHParam {
        /// The hyper-parameter (or its metadata key).
        name: &'static str,
        /// Its value.
        value: f32,
        /// Why it is invalid.
        reason: &'static str,
    },
    /// The file holds a tensor the architecture's graph would not read: computing without it
    /// would silently give another model's output.
    #[error("tensor '{name}' is not used by minfer's {arch} model; refusing to run without it")]
    UnusedTensor {
        /// The GGUF tensor name.
        name: String,
        /// The architecture.
        arch: &'static str,
    },
    /// An `{arch}.*` metadata key minfer does not know: it may change the computation.
    #[error("metadata key '{key}' is not understood by minfer's {arch} model; refusing to guess what it changes")]
    UnknownKey {
        /// The key.
        key: String,
        /// The architecture.
        arch: &'static str,
    },
    /// A feature the file asks for that minfer does not compute yet.
    #[error("{what}: {reason}")]
    Unsupported {
        /// The key or tensor and its value.
        what: String,
        /// What is not supported.
        reason: String,
    },
    /// A norm weight or bias holds a NaN or an infinity, which would poison every logit.
    #[error("tensor '{name}' holds {value} at index {index}; its values must be finite")]
    NonFiniteWeight {
        /// The tensor.
        name: String,
        /// The first bad value's index.
        index: usize,
        /// The value.
        value: f32,
    },
}

/// What the engine needs of a model.
pub trait ModelDef: Send + Sync {
    /// The architecture name, as in `general.architecture` (`qwen2`).
    fn arch(&self) -> &'static str;
    /// The hyper-parameters read from the file.
    fn hparams(&self) -> &HParams;
    /// The forward pass for `params`: a pure function of them (the reuse invariant).
    fn build_graph(&self, params: &GraphParams) -> ComputeGraph;
    /// Weights the graph names that are bands of rows of a file tensor (Phi-3's fused Q/K/V and
    /// gate/up matrices), for the [`GgufWeights`] the backends read; none by default.
    fn weight_views(&self) -> Vec<WeightView> {
        Vec::new()
    }
}

/// Loads a model of one architecture from a file, its tensors checked.
pub type LoadFn = fn(&GgufFile) -> Result<Box<dyn ModelDef>, ModelError>;

/// The architectures minfer runs: each `general.architecture` value and its loader, one row an
/// architecture (its folder under `src/models/` is the rest).
pub const ARCHITECTURES: &[(&str, LoadFn)] = &[
    ("gemma", |file| Ok(Box::new(gemma::load(file)?))),
    ("gemma2", |file| Ok(Box::new(gemma2::load(file)?))),
    ("gemma3", |file| Ok(Box::new(gemma3::Gemma3::load(file)?))),
    ("gpt-oss", |file| Ok(Box::new(gpt_oss::GptOss::load(file)?))),
    ("granite", |file| Ok(Box::new(granite::Granite::load(file)?))),
    ("llama", |file| Ok(Box::new(llama::Llama::load(file)?))),
    ("phi3", |file| Ok(Box::new(phi3::Phi3::load(file)?))),
    ("qwen2", |file| Ok(Box::new(qwen2::Qwen2::load(file)?))),
    ("qwen2moe", |file| Ok(Box::new(qwen2moe::load(file)?))),
    ("qwen3", |file| Ok(Box::new(qwen3::Qwen3::load(file)?))),
    ("qwen3moe", |file| Ok(Box::new(qwen3moe::load(file)?))),
];

/// The model for `file`'s `general.architecture`, its tensors checked against its
/// hyper-parameters.
pub fn load_model(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    let arch = file.metadata().get_str("general.architecture")?;
    match ARCHITECTURES.iter().find(|(name, _)| *name == arch) {
        Some((_, load)) => load(file),
        None => Err(ModelError::UnknownArchitecture {
            arch: arch.to_string(),
            supported: ARCHITECTURES
                .iter()
                .map(|(name, _)| *name)
                .collect::<Vec<_>>()
                .join(", "),
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

/// Layer `il`'s weight `blk.{il}.{suffix}`, checked to have GGUF shape `shape`.
pub(crate) fn layer_weight(
    file: &GgufFile,
    il: usize,
    suffix: &str,
    shape: &[u64],
) -> Result<blocks::WeightRef, ModelError> {
    let name = format!("blk.{il}.{suffix}");
    let ty = check_tensor(file, &name, shape)?;
    Ok((name, ty))
}

/// Layer `il`'s F32 vector `blk.{il}.{suffix}` (norm weights, biases) of length `len`.
pub(crate) fn layer_f32(file: &GgufFile, il: usize, suffix: &str, len: u64) -> Result<String, ModelError> {
    let name = format!("blk.{il}.{suffix}");
    f32_vector(file, &name, len)?;
    Ok(name)
}

/// The linear RoPE scaling of an `arch` file, as llama.cpp reads it: `{arch}.rope.scaling.factor`
/// (or the older `rope.scale_linear`) turns into `freq_scale = 1 / factor`, 1 when absent or 0;
/// `rope.scaling.type` may be `none` or `linear`, and YaRN or LongRoPE are refused by name.
pub(crate) fn rope_scaling(file: &GgufFile, arch: &str) -> Result<f32, ModelError> {
    let m = file.metadata();
    let type_key = format!("{arch}.rope.scaling.type");
    if m.contains(&type_key) {
        let kind = m.get_str(&type_key)?;
        if kind != "none" && kind != "linear" {
            return Err(ModelError::Unsupported {
                what: format!("{type_key} = '{kind}'"),
                reason: format!("RoPE scaling '{kind}' is not supported for {arch} models (none and linear are)"),
            });
        }
    }
    for suffix in ["rope.scaling.factor", "rope.scale_linear"] {
        let key = format!("{arch}.{suffix}");
        if m.contains(&key) {
            let factor = m.get_float(&key)?;
            if factor == 0.0 {
                return Ok(1.0);
            }
            return hparams::positive_float("rope_scaling_factor", factor).map(|f| 1.0 / f);
        }
    }
    Ok(1.0)
}

/// The RoPE scaling of an `arch` file that may use YaRN, as llama.cpp's context derives it:
/// `rope.scaling.type` `none`, `linear` (the default) or `yarn`, `freq_scale = 1 / factor` (for
/// the windowed layers too). For YaRN the blend runs over `rope.scaling.original_context_length`
/// (else the training context) with llama.cpp's betas 32 and 1, and `hp.rope_attn_factor`
/// becomes llama.cpp's `yarn_attn_factor`: `get_mscale(factor) / (1 + 0.1 ln factor)` times
/// `rope.scaling.attn_factor`, in its f32 order. The `yarn_*` keys llama.cpp does not read for
/// these models are accepted only at the values it uses instead, and refused by name otherwise.
pub(crate) fn yarn_scaling(file: &GgufFile, arch: &str, hp: &mut HParams) -> Result<(), ModelError> {
    let m = file.metadata();
    let key = |suffix: &str| format!("{arch}.{suffix}");
    let kind = match m.contains(&key("rope.scaling.type")) {
        true => m.get_str(&key("rope.scaling.type"))?.to_string(),
        false => "linear".to_string(),
    };
    let mut freq_scale = 1.0f32;
    for suffix in ["rope.scaling.factor", "rope.scale_linear"] {
        if m.contains(&key(suffix)) {
            let factor = m.get_float(&key(suffix))?;
            if factor != 0.0 {
                freq_scale = 1.0 / hparams::positive_float("rope_scaling_factor", factor)?;
            }
            break;
        }
    }
    if m.contains(&key("rope.scaling.attn_factor")) {
        let f = m.get_float(&key("rope.scaling.attn_factor"))?;
        hp.rope_attn_factor = hparams::positive_float("rope.scaling.attn_factor", f)?;
    }
    for (suffix, expected) in [
        ("rope.scaling.yarn_beta_fast", 32.0f32),
        ("rope.scaling.yarn_beta_slow", 1.0),
        ("rope.scaling.yarn_ext_factor", 1.0),
        ("rope.scaling.yarn_attn_factor", 1.0),
    ] {
        if m.contains(&key(suffix)) {
            let value = m.get_float(&key(suffix))?;
            if value != expected {
                return Err(ModelError::Unsupported {
                    what: format!("{} = {value}", key(suffix)),
                    reason: format!("llama.cpp computes {arch} models with {expected} here and minfer does the same"),
                });
            }
        }
    }
    match kind.as_str() {
        "none" => freq_scale = 1.0,
        "linear" => {}
        "yarn" => {
            let n_ctx_orig = match m.contains(&key("rope.scaling.original_context_length")) {
                true => m.get_uint(&key("rope.scaling.original_context_length"))? as usize,
                false => hp.n_ctx_train,
            };
            if n_ctx_orig == 0 {
                return Err(ModelError::BadHParam {
                    name: "rope.scaling.original_context_length",
                    value: 0,
                    reason: "must be positive".into(),
                });
            }
            let factor = 1.0 / freq_scale;
            let mscale = if factor <= 1.0 {
                1.0
            } else {
                0.1 * 1.0 * factor.ln() + 1.0
            };
            // llama.cpp divides back out the magnitude ggml's kernel multiplies in (llama.cpp
            // PR 17945); the kernel's own factor is applied per layer in `blocks::rope_meta`.
            hp.rope_attn_factor *= mscale * (1.0 / (1.0 + 0.1 * factor.ln()));
            hp.rope_yarn = Some(hparams::YarnParams {
                ext_factor: 1.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                n_ctx_orig,
            });
        }
        other => {
            return Err(ModelError::Unsupported {
                what: format!("{} = '{other}'", key("rope.scaling.type")),
                reason: format!(
                    "RoPE scaling '{other}' is not supported for {arch} models (none, linear and yarn are)"
                ),
            })
        }
    }
    hp.rope_freq_scale = freq_scale;
    hp.rope_freq_scale_swa = freq_scale;
    Ok(())
}

/// `rope_freqs.weight`, the per-pair divisors of RoPE's angles (Llama 3.1's long-context
/// scaling, baked in by the converter), if the file has it: F32 `[n_rot / 2]`, every value finite
/// and above 0.
pub(crate) fn rope_freq_factors(file: &GgufFile, hp: &HParams) -> Result<Option<String>, ModelError> {
    rope_factor_tensor(file, "rope_freqs.weight", hp)
}

/// The RoPE factor tensor `name` (`rope_freqs`, `rope_factors_long`, `rope_factors_short`) if the
/// file has it, checked: F32 `[n_rot / 2]`, every value finite and above 0 (a divisor).
pub(crate) fn rope_factor_tensor(
    file: &GgufFile,
    name: &'static str,
    hp: &HParams,
) -> Result<Option<String>, ModelError> {
    let Ok(info) = file.tensor(name) else {
        return Ok(None);
    };
    f32_vector(file, name, (hp.n_rot / 2) as u64)?;
    let bytes = file.tensor_data(info);
    let bad = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .find(|v| *v <= 0.0);
    if let Some(value) = bad {
        return Err(ModelError::BadFloatHParam {
            name,
            value,
            reason: "every factor must be above 0",
        });
    }
    Ok(Some(name.to_string()))
}

/// Layer `il`'s F32 vector `blk.{il}.{suffix}` if the file has it (an optional bias).
pub(crate) fn optional_layer_f32(
    file: &GgufFile,
    il: usize,
    suffix: &str,
    len: u64,
) -> Result<Option<String>, ModelError> {
    let name = format!("blk.{il}.{suffix}");
    if file.tensor(&name).is_err() {
        return Ok(None);
    }
    f32_vector(file, &name, len)?;
    Ok(Some(name))
}

/// An `{arch}.*` key an architecture accepts: one it reads (and checks itself), or one that
/// describes the model without changing its computation.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ArchKey {
    Read(&'static str),
    Descriptive(&'static str),
}

/// Refuse, by name, any `{arch}.*` key not in `known` (suffixes after `{arch}.`): a key minfer
/// does not know may change the computation (a rope scaling, a logit scale), and guessing
/// would give wrong logits silently. Keys of other prefixes (`general.*`, `tokenizer.*`,
/// `quantize.*`, `split.*`) are not the model's computation and are not looked at here.
pub(crate) fn check_arch_keys(file: &GgufFile, arch: &'static str, known: &[ArchKey]) -> Result<(), ModelError> {
    let prefix = format!("{arch}.");
    for (key, _) in file.metadata().iter() {
        let Some(suffix) = key.strip_prefix(&prefix) else {
            continue;
        };
        // Every architecture's hyper-parameters read the pooling rule and the causal flag
        // ([`pooling::load`]); a reranker's class labels only name the rank head's outputs.
        let ok = ["pooling_type", "classifier.output_labels", "attention.causal"].contains(&suffix)
            || known.iter().any(|k| match k {
                ArchKey::Read(s) | ArchKey::Descriptive(s) => *s == suffix,
            });
        if !ok {
            return Err(ModelError::UnknownKey {
                key: key.to_string(),
                arch,
            });
        }
    }
    Ok(())
}

/// Refuse, by name, the first tensor of `file` not in `used` (the names the graph reads).
pub(crate) fn check_used_tensors(file: &GgufFile, arch: &'static str, used: &[String]) -> Result<(), ModelError> {
    let mut used: std::collections::HashSet<&str> = used.iter().map(String::as_str).collect();
    // Every architecture's rank head is read by [`pooling::load`] and the embeddings graph.
    used.extend(["cls.output.weight", "cls.output.bias"]);
    match file.tensors().iter().find(|t| !used.contains(t.name.as_str())) {
        Some(t) => Err(ModelError::UnusedTensor {
            name: t.name.clone(),
            arch,
        }),
        None => Ok(()),
    }
}

/// Check that `name` is an F32 vector of `len` finite values (a norm weight or a bias: small,
/// read whole at load).
pub(crate) fn f32_vector(file: &GgufFile, name: &str, len: u64) -> Result<(), ModelError> {
    f32_tensor(file, name, &[len])
}

/// Check that `name` is an F32 tensor of GGUF shape `shape` whose values are all finite (a norm
/// weight, a bias, the experts' bias matrices: small, read whole at load).
pub(crate) fn f32_tensor(file: &GgufFile, name: &str, shape: &[u64]) -> Result<(), ModelError> {
    let ty = check_tensor(file, name, shape)?;
    if ty != GgmlType::F32 {
        return Err(ModelError::UnsupportedType {
            name: name.to_string(),
            ggml_type: ty,
        });
    }
    let info = file.tensor(name)?;
    let bytes = file.tensor_data(info);
    let bad = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .enumerate()
        .find(|(_, v)| !v.is_finite());
    match bad {
        Some((index, value)) => Err(ModelError::NonFiniteWeight {
            name: name.to_string(),
            index,
            value,
        }),
        None => Ok(()),
    }
}

/// The output head: `output.weight`, or — when the file ties the head to the embedding and
/// has no `output.weight` — the token embedding itself.
pub(crate) fn output_weight(
    file: &GgufFile,
    hp: &HParams,
    token_embd: GgmlType,
) -> Result<blocks::WeightRef, ModelError> {
    let (e, v) = (hp.n_embd as u64, hp.n_vocab as u64);
    if file.tensor("output.weight").is_ok() {
        Ok((
            "output.weight".to_string(),
            check_tensor(file, "output.weight", &[e, v])?,
        ))
    } else {
        Ok(("token_embd.weight".to_string(), token_embd))
    }
}
