//! gpt-oss (OpenAI's gpt-oss-20b and -120b; llama.cpp's `LLM_ARCH_OPENAI_MOE`): attention with
//! Q/K/V/output biases and learned sinks, sliding-window attention (128 positions) on every
//! other layer, NeoX RoPE with YaRN scaling, and a mixture of experts in every FFN — a biased
//! router whose top-k logits are softmaxed, experts with biases and the clamped SwiGLU
//! (`models::moe`). This module reads and checks the file; `graph` builds the forward pass.
//! Every `gpt-oss.*` key is read or known to be descriptive, and every tensor is read: anything
//! else is refused by name.

mod graph;

use crate::gguf::GgufFile;
use crate::graph::{ComputeGraph, GraphParams, RopeStyle};
use crate::models::blocks::WeightRef;
use crate::models::hparams::{positive_float, swa_pattern};
use crate::models::moe::{Activation, ExpertParams, Ffn, Gating};
use crate::models::{
    check_arch_keys, check_tensor, check_used_tensors, f32_vector, layer_f32, layer_weight, moe, optional_layer_f32,
    yarn_scaling, ArchKey, HParams, ModelDef, ModelError,
};
use crate::quant::GgmlType;

const ARCH: &str = "gpt-oss";

/// The `gpt-oss.*` keys: those the loader reads, and those that only describe the model.
const KEYS: &[ArchKey] = &[
    ArchKey::Read("block_count"),
    ArchKey::Read("context_length"),
    ArchKey::Read("embedding_length"),
    ArchKey::Read("feed_forward_length"),
    ArchKey::Read("attention.head_count"),
    ArchKey::Read("attention.head_count_kv"),
    ArchKey::Read("attention.key_length"),
    ArchKey::Read("attention.value_length"),
    ArchKey::Read("attention.layer_norm_rms_epsilon"),
    ArchKey::Read("attention.sliding_window"),
    ArchKey::Read("attention.sliding_window_pattern"),
    ArchKey::Read("rope.freq_base"),
    ArchKey::Read("rope.freq_base_swa"),
    ArchKey::Read("rope.dimension_count"),
    ArchKey::Read("rope.scaling.type"),
    ArchKey::Read("rope.scaling.factor"),
    ArchKey::Read("rope.scaling.original_context_length"),
    ArchKey::Read("rope.scaling.attn_factor"),
    ArchKey::Read("rope.scaling.yarn_beta_fast"),
    ArchKey::Read("rope.scaling.yarn_beta_slow"),
    ArchKey::Read("rope.scaling.yarn_ext_factor"),
    ArchKey::Read("rope.scaling.yarn_attn_factor"),
    ArchKey::Read("expert_count"),
    ArchKey::Read("expert_used_count"),
    ArchKey::Read("expert_feed_forward_length"),
    // llama.cpp's gpt-oss graph fixes its gating and never scales the weights.
    ArchKey::Descriptive("expert_gating_func"),
    ArchKey::Descriptive("expert_weights_scale"),
    ArchKey::Descriptive("vocab_size"),
];

/// Names and types of one layer's weights.
#[derive(Clone, Debug)]
struct LayerWeights {
    attn_norm: String,
    q: WeightRef,
    k: WeightRef,
    v: WeightRef,
    /// Q/K/V biases: every gpt-oss file has them, llama.cpp does not require them.
    q_bias: Option<String>,
    k_bias: Option<String>,
    v_bias: Option<String>,
    wo: WeightRef,
    wo_bias: String,
    /// One logit per query head, F32 `[n_head]`.
    sinks: String,
    /// The norm before the FFN (`post_attention_norm`, llama.cpp's `attn_post_norm`).
    ffn_norm: String,
    ffn: Ffn,
}

/// A gpt-oss model: its hyper-parameters and the names and types of all its weights.
pub struct GptOss {
    pub(crate) hparams: HParams,
    token_embd: GgmlType,
    output: WeightRef,
    layers: Vec<LayerWeights>,
}

impl GptOss {
    /// Read the hyper-parameters and check every key and tensor against them.
    pub fn load(file: &GgufFile) -> Result<Self, ModelError> {
        check_arch_keys(file, ARCH, KEYS)?;
        let m = file.metadata();
        // llama.cpp's LLAMA_ROPE_TYPE_NEOX for LLM_ARCH_OPENAI_MOE.
        let mut hp = HParams::load(file, ARCH, RopeStyle::Neox)?;
        // The scores' factor is 1 / sqrt(n_rot) in llama.cpp's gpt-oss graph.
        hp.kq_scale = 1.0 / (hp.n_rot as f32).sqrt();
        let mut ex = moe::required(
            ExpertParams::load(file, ARCH, "expert_feed_forward_length", false)?,
            ARCH,
        )?;
        ex.gating = Gating::SoftmaxWeight;
        ex.activation = Activation::SwigluOai {
            alpha: 1.702,
            limit: 7.0,
        };
        ex.biases = true;
        hp.experts = Some(ex);
        hp.attn_sinks = true;
        let window = format!("{ARCH}.attention.sliding_window");
        hp.n_swa = m.get_uint(&window)? as usize;
        if hp.n_swa == 0 {
            return Err(ModelError::BadHParam {
                name: "attention.sliding_window",
                value: 0,
                reason: "must be positive".into(),
            });
        }
        hp.swa_layers = swa_pattern(file, ARCH, &hp, 2)?;
        yarn_scaling(file, ARCH, &mut hp)?;
        // The windowed layers rotate as the others unless the file gives them a base.
        hp.rope_freq_base_swa = match m.contains(&format!("{ARCH}.rope.freq_base_swa")) {
            true => positive_float(
                "rope.freq_base_swa",
                m.get_float(&format!("{ARCH}.rope.freq_base_swa"))?,
            )?,
            false => hp.rope_freq_base,
        };

        let (e, v) = (hp.n_embd as u64, hp.n_vocab as u64);
        let q_out = (hp.n_head * hp.head_dim) as u64;
        let kv_out = hp.n_kv_embd() as u64;
        let token_embd = check_tensor(file, "token_embd.weight", &[e, v])?;
        f32_vector(file, "output_norm.weight", e)?;
        // llama.cpp requires the head: gpt-oss never ties it to the embedding.
        let output = (
            "output.weight".to_string(),
            check_tensor(file, "output.weight", &[e, v])?,
        );
        let layers = (0..hp.n_layer)
            .map(|il| {
                Ok(LayerWeights {
                    attn_norm: layer_f32(file, il, "attn_norm.weight", e)?,
                    q: layer_weight(file, il, "attn_q.weight", &[e, q_out])?,
                    k: layer_weight(file, il, "attn_k.weight", &[e, kv_out])?,
                    v: layer_weight(file, il, "attn_v.weight", &[e, kv_out])?,
                    q_bias: optional_layer_f32(file, il, "attn_q.bias", q_out)?,
                    k_bias: optional_layer_f32(file, il, "attn_k.bias", kv_out)?,
                    v_bias: optional_layer_f32(file, il, "attn_v.bias", kv_out)?,
                    wo: layer_weight(file, il, "attn_output.weight", &[q_out, e])?,
                    wo_bias: layer_f32(file, il, "attn_output.bias", e)?,
                    sinks: layer_f32(file, il, "attn_sinks.weight", hp.n_head as u64)?,
                    ffn_norm: layer_f32(file, il, "post_attention_norm.weight", e)?,
                    ffn: Ffn::load(file, il, &hp)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let mut used = vec![
            "token_embd.weight".to_string(),
            "output_norm.weight".to_string(),
            output.0.clone(),
        ];
        for w in &layers {
            used.extend(
                [
                    &w.attn_norm,
                    &w.q.0,
                    &w.k.0,
                    &w.v.0,
                    &w.wo.0,
                    &w.wo_bias,
                    &w.sinks,
                    &w.ffn_norm,
                ]
                .map(String::clone),
            );
            used.extend([&w.q_bias, &w.k_bias, &w.v_bias].into_iter().flatten().cloned());
            used.extend(w.ffn.names());
        }
        check_used_tensors(file, ARCH, &used)?;
        Ok(GptOss {
            hparams: hp,
            token_embd,
            output,
            layers,
        })
    }
}

impl ModelDef for GptOss {
    fn arch(&self) -> &'static str {
        ARCH
    }

    fn hparams(&self) -> &HParams {
        &self.hparams
    }

    fn build_graph(&self, params: &GraphParams) -> ComputeGraph {
        self.graph(params)
    }
}
