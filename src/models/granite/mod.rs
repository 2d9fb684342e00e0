//! Granite (IBM Granite 3.x dense): llama's layout and graph with four scales of its own, read
//! from `granite.*` — the token embeddings times `embedding_scale`, each attention and FFN output
//! times `residual_scale` before its residual add, the attention scores times `attention.scale`
//! instead of `1 / sqrt(head_dim)`, and the logits divided by `logit_scale` (llama.cpp's
//! `llm_build_granite`). The shared blocks apply them; this module only reads and checks them.
//! Granite's MoE, hybrid and vision forms are other architectures, refused by name; a file that
//! turns RoPE off (`rope.scaling.finetuned = false`) is refused too.

use crate::gguf::GgufFile;
use crate::graph::{ComputeGraph, GraphParams};
use crate::models::hparams::positive_float;
use crate::models::llama::{self, Llama};
use crate::models::{check_arch_keys, ArchKey, HParams, ModelDef, ModelError};

const ARCH: &str = "granite";

/// Granite's own keys, beside llama's.
const KEYS: &[ArchKey] = &[
    ArchKey::Read("logit_scale"),
    ArchKey::Read("residual_scale"),
    ArchKey::Read("embedding_scale"),
    ArchKey::Read("attention.scale"),
    ArchKey::Read("rope.scaling.finetuned"),
];

/// A Granite model: a llama model whose hyper-parameters carry the four scales.
pub struct Granite(Llama);

impl Granite {
    /// Read llama's hyper-parameters and tensors from `granite.*` and the scales; refuse what
    /// the graph would not compute.
    pub fn load(file: &GgufFile) -> Result<Self, ModelError> {
        check_arch_keys(file, ARCH, &[llama::KEYS, KEYS].concat())?;
        let m = file.metadata();
        let finetuned = format!("{ARCH}.rope.scaling.finetuned");
        if m.contains(&finetuned) && !m.get_bool(&finetuned)? {
            return Err(ModelError::Unsupported {
                what: format!("{finetuned} = false"),
                reason: "Granite without RoPE (its switch off) is not supported".into(),
            });
        }
        let mut model = Llama::load_family(file, ARCH)?;
        let hp = &mut model.hparams;
        // llama.cpp reads a missing scale, or 0, as none; the logit scale is required.
        let scale = |name: &'static str, suffix: &str| -> Result<Option<f32>, ModelError> {
            let key = format!("{ARCH}.{suffix}");
            if !m.contains(&key) {
                return Ok(None);
            }
            match m.get_float(&key)? {
                0.0 => Ok(None),
                v => positive_float(name, v).map(Some),
            }
        };
        let logit_scale = scale("logit_scale", "logit_scale")?.ok_or_else(|| ModelError::Unsupported {
            what: format!("{ARCH}.logit_scale"),
            reason: "a Granite file must give its logit scale (a non-zero value)".into(),
        })?;
        hp.logit_scale = Some(1.0 / logit_scale);
        hp.embedding_scale = scale("embedding_scale", "embedding_scale")?;
        hp.residual_scale = scale("residual_scale", "residual_scale")?;
        if let Some(s) = scale("attention.scale", "attention.scale")? {
            hp.kq_scale = s;
        }
        Ok(Granite(model))
    }
}

impl ModelDef for Granite {
    fn arch(&self) -> &'static str {
        ARCH
    }

    fn hparams(&self) -> &HParams {
        &self.0.hparams
    }

    fn build_graph(&self, params: &GraphParams) -> ComputeGraph {
        self.0.build_graph(params)
    }
}
