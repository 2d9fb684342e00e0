//! Qwen2's hyper-parameters and tensors, checked against each other at load so that graph
//! construction cannot fail later.

use crate::gguf::GgufFile;
use crate::graph::{ComputeGraph, GraphParams};
use crate::models::{check_tensor, HParams, ModelDef, ModelError};
use crate::quant::GgmlType;

/// Names and types of one layer's weights.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: String,
    pub q: (String, GgmlType),
    pub k: (String, GgmlType),
    pub v: (String, GgmlType),
    pub q_bias: String,
    pub k_bias: String,
    pub v_bias: String,
    pub wo: (String, GgmlType),
    pub ffn_norm: String,
    pub gate: (String, GgmlType),
    pub up: (String, GgmlType),
    pub down: (String, GgmlType),
}

pub struct Qwen2 {
    pub(super) hparams: HParams,
    pub(super) token_embd: GgmlType,
    /// `output.weight`, or `token_embd.weight` when the file ties the head to the embedding.
    pub(super) output: (String, GgmlType),
    pub(super) layers: Vec<LayerWeights>,
}

impl Qwen2 {
    pub fn load(file: &GgufFile) -> Result<Self, ModelError> {
        let hp = HParams::load(file, "qwen2")?;
        let (e, v) = (hp.n_embd as u64, hp.n_vocab as u64);
        let q_out = (hp.n_head * hp.head_dim) as u64;
        let kv_out = hp.n_kv_embd() as u64;
        let ff = hp.n_ff as u64;

        let token_embd = check_tensor(file, "token_embd.weight", &[e, v])?;
        check_tensor(file, "output_norm.weight", &[e])?;
        // A missing output head means tied embeddings: the logits reuse the embedding table.
        let output = if file.tensor("output.weight").is_ok() {
            (
                "output.weight".to_string(),
                check_tensor(file, "output.weight", &[e, v])?,
            )
        } else {
            ("token_embd.weight".to_string(), token_embd)
        };

        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let name = |t: &str| format!("blk.{il}.{t}");
            let weight = |t: &str, shape: &[u64]| -> Result<(String, GgmlType), ModelError> {
                let n = name(t);
                let ty = check_tensor(file, &n, shape)?;
                Ok((n, ty))
            };
            let f32_vec = |t: &str, len: u64| -> Result<String, ModelError> {
                let n = name(t);
                let ty = check_tensor(file, &n, &[len])?;
                if ty != GgmlType::F32 {
                    return Err(ModelError::UnsupportedType { name: n, ggml_type: ty });
                }
                Ok(n)
            };
            layers.push(LayerWeights {
                attn_norm: f32_vec("attn_norm.weight", e)?,
                q: weight("attn_q.weight", &[e, q_out])?,
                k: weight("attn_k.weight", &[e, kv_out])?,
                v: weight("attn_v.weight", &[e, kv_out])?,
                q_bias: f32_vec("attn_q.bias", q_out)?,
                k_bias: f32_vec("attn_k.bias", kv_out)?,
                v_bias: f32_vec("attn_v.bias", kv_out)?,
                wo: weight("attn_output.weight", &[q_out, e])?,
                ffn_norm: f32_vec("ffn_norm.weight", e)?,
                gate: weight("ffn_gate.weight", &[e, ff])?,
                up: weight("ffn_up.weight", &[e, ff])?,
                down: weight("ffn_down.weight", &[ff, e])?,
            });
        }
        Ok(Qwen2 {
            hparams: hp,
            token_embd,
            output,
            layers,
        })
    }
}

impl ModelDef for Qwen2 {
    fn arch(&self) -> &'static str {
        "qwen2"
    }

    fn hparams(&self) -> &HParams {
        &self.hparams
    }

    fn build_graph(&self, params: &GraphParams) -> ComputeGraph {
        self.graph(params)
    }
}
