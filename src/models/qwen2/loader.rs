//! Qwen2's hyper-parameters and tensors, checked against each other at load so that graph
//! construction cannot fail later; also Qwen2-MoE's (`qwen2moe`: the same attention, experts and
//! a shared expert for the FFN).

use crate::gguf::GgufFile;
use crate::graph::{ComputeGraph, GraphParams, RopeStyle};
use crate::models::blocks::WeightRef;
use crate::models::moe::{self, ExpertParams, Ffn};
use crate::models::{check_tensor, f32_vector, layer_f32, layer_weight, output_weight, HParams, ModelDef, ModelError};
use crate::quant::GgmlType;

/// Names and types of one layer's weights.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: String,
    pub q: WeightRef,
    pub k: WeightRef,
    pub v: WeightRef,
    pub q_bias: String,
    pub k_bias: String,
    pub v_bias: String,
    pub wo: WeightRef,
    pub ffn_norm: String,
    pub ffn: Ffn,
}

/// A Qwen2 model: its hyper-parameters and the names and types of all its weights, checked at load.
pub struct Qwen2 {
    /// `qwen2`, or `qwen2moe` for the model with experts.
    pub(super) arch: &'static str,
    pub(crate) hparams: HParams,
    pub(super) token_embd: GgmlType,
    /// `output.weight`, or `token_embd.weight` when the file ties the head to the embedding.
    pub(super) output: WeightRef,
    pub(super) layers: Vec<LayerWeights>,
}

impl Qwen2 {
    /// Read the hyper-parameters and check every tensor's presence, GGUF shape and type against them.
    pub fn load(file: &GgufFile) -> Result<Self, ModelError> {
        Self::load_family(file, "qwen2")
    }

    /// [`Qwen2::load`] for `qwen2` or `qwen2moe`: the latter's keys and tensors are checked
    /// whole (an unknown key or an unread tensor is refused by name), its FFN layers are experts
    /// whose weights are not normalized (llama.cpp's Qwen2-MoE graph) and a shared expert of
    /// `expert_shared_feed_forward_length` (else `feed_forward_length`, as llama.cpp falls back).
    pub(crate) fn load_family(file: &GgufFile, arch: &'static str) -> Result<Self, ModelError> {
        // Qwen2 rotates halves (GPT-NeoX pairing), as llama.cpp's LLAMA_ROPE_TYPE_NEOX.
        let mut hp = HParams::load(file, arch, RopeStyle::Neox)?;
        if arch != "qwen2" {
            moe::check_keys(file, arch)?;
            let mut ex = moe::required(
                ExpertParams::load(file, arch, "expert_feed_forward_length", false)?,
                arch,
            )?;
            let key = format!("{arch}.expert_shared_feed_forward_length");
            ex.n_ff_shexp = match file.metadata().contains(&key) {
                true => file.metadata().get_uint(&key)? as usize,
                false => 0,
            };
            if ex.n_ff_shexp == 0 {
                ex.n_ff_shexp = hp.n_ff;
            }
            hp.experts = Some(ex);
        }
        let (e, v) = (hp.n_embd as u64, hp.n_vocab as u64);
        let q_out = (hp.n_head * hp.head_dim) as u64;
        let kv_out = hp.n_kv_embd() as u64;

        let token_embd = check_tensor(file, "token_embd.weight", &[e, v])?;
        f32_vector(file, "output_norm.weight", e)?;
        let output = output_weight(file, &hp, token_embd)?;
        let layers = (0..hp.n_layer)
            .map(|il| {
                Ok(LayerWeights {
                    attn_norm: layer_f32(file, il, "attn_norm.weight", e)?,
                    q: layer_weight(file, il, "attn_q.weight", &[e, q_out])?,
                    k: layer_weight(file, il, "attn_k.weight", &[e, kv_out])?,
                    v: layer_weight(file, il, "attn_v.weight", &[e, kv_out])?,
                    q_bias: layer_f32(file, il, "attn_q.bias", q_out)?,
                    k_bias: layer_f32(file, il, "attn_k.bias", kv_out)?,
                    v_bias: layer_f32(file, il, "attn_v.bias", kv_out)?,
                    wo: layer_weight(file, il, "attn_output.weight", &[q_out, e])?,
                    ffn_norm: layer_f32(file, il, "ffn_norm.weight", e)?,
                    ffn: Ffn::load(file, il, &hp)?,
                })
            })
            .collect::<Result<Vec<LayerWeights>, ModelError>>()?;
        if hp.experts.is_some() {
            let mut used = vec![
                "token_embd.weight".into(),
                "output_norm.weight".into(),
                output.0.clone(),
            ];
            for w in &layers {
                used.extend(
                    [
                        &w.attn_norm,
                        &w.q.0,
                        &w.k.0,
                        &w.v.0,
                        &w.q_bias,
                        &w.k_bias,
                        &w.v_bias,
                        &w.wo.0,
                        &w.ffn_norm,
                    ]
                    .map(String::clone),
                );
                used.extend(w.ffn.names());
            }
            crate::models::check_used_tensors(file, arch, &used)?;
        }
        Ok(Qwen2 {
            arch,
            hparams: hp,
            token_embd,
            output,
            layers,
        })
    }
}

impl ModelDef for Qwen2 {
    fn arch(&self) -> &'static str {
        self.arch
    }

    fn hparams(&self) -> &HParams {
        &self.hparams
    }

    fn build_graph(&self, params: &GraphParams) -> ComputeGraph {
        self.graph(params)
    }
}
