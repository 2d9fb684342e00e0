//! Llama's hyper-parameters and tensors, checked against each other at load (linear RoPE scaling
//! and Llama 3.1's frequency factors included), and the refusals:
//! every tensor the graph does not read and every `llama.*` key that would change the computation
//! beyond what it builds is refused by name (descriptive keys are ignored).

use crate::gguf::GgufFile;
use crate::graph::{ComputeGraph, GraphParams, RopeStyle};
use crate::models::blocks::WeightRef;
use crate::models::moe::{ExpertParams, Ffn};
use crate::models::{
    check_arch_keys, check_tensor, check_used_tensors, f32_vector, layer_f32, layer_weight, optional_layer_f32,
    output_weight, rope_freq_factors, rope_scaling, ArchKey, HParams, ModelDef, ModelError,
};
use crate::quant::GgmlType;

/// Names and types of one layer's weights.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: String,
    pub q: WeightRef,
    pub k: WeightRef,
    pub v: WeightRef,
    /// Q/K/V biases, where the file has them (most llama files have none).
    pub q_bias: Option<String>,
    pub k_bias: Option<String>,
    pub v_bias: Option<String>,
    pub wo: WeightRef,
    /// Output projection and FFN biases, where the file has them.
    pub wo_bias: Option<String>,
    pub gate_bias: Option<String>,
    pub up_bias: Option<String>,
    pub down_bias: Option<String>,
    pub ffn_norm: String,
    /// Dense, or Mixtral's experts.
    pub ffn: Ffn,
}

/// A Llama model: its hyper-parameters and the names and types of all its weights, checked at load.
pub struct Llama {
    pub(crate) hparams: HParams,
    pub(crate) token_embd: GgmlType,
    /// `output.weight`, or `token_embd.weight` when the file ties the head to the embedding.
    pub(crate) output: WeightRef,
    pub(crate) layers: Vec<LayerWeights>,
}

/// The `llama.*` keys minfer reads or knows to be harmless; any other is refused by name.
pub(crate) const KEYS: &[ArchKey] = &[
    ArchKey::Read("block_count"),
    ArchKey::Read("context_length"),
    ArchKey::Read("embedding_length"),
    ArchKey::Read("feed_forward_length"),
    ArchKey::Read("attention.head_count"),
    ArchKey::Read("attention.head_count_kv"),
    ArchKey::Read("attention.key_length"),
    ArchKey::Read("attention.value_length"),
    ArchKey::Read("attention.layer_norm_rms_epsilon"),
    ArchKey::Read("rope.freq_base"),
    ArchKey::Read("rope.dimension_count"),
    ArchKey::Read("rope.scaling.type"),
    ArchKey::Read("rope.scaling.factor"),
    ArchKey::Read("rope.scale_linear"),
    // Only YaRN reads these (refused below); for linear scaling they describe the training.
    ArchKey::Descriptive("rope.scaling.original_context_length"),
    ArchKey::Descriptive("rope.scaling.finetuned"),
    // Descriptive: the vocabulary's size is the embedding's, and the layout note of Meta's
    // original checkpoints changes nothing once converted.
    ArchKey::Descriptive("vocab_size"),
    ArchKey::Descriptive("tensor_data_layout"),
    // Mixtral's experts, `feed_forward_length` wide each.
    ArchKey::Read("expert_count"),
    ArchKey::Read("expert_used_count"),
];

impl Llama {
    /// Read the hyper-parameters and check every tensor's presence, GGUF shape and type against
    /// them; refuse what the graph would not compute.
    pub fn load(file: &GgufFile) -> Result<Self, ModelError> {
        check_arch_keys(file, "llama", KEYS)?;
        Self::load_family(file, "llama")
    }

    /// [`Llama::load`] for a file of `arch`, a model of llama's layout whose own `{arch}.*` keys
    /// the caller has checked (Granite), its hyper-parameters read from `{arch}.*`.
    pub(crate) fn load_family(file: &GgufFile, arch: &'static str) -> Result<Self, ModelError> {
        // Llama pairs adjacent dimensions, as llama.cpp's LLAMA_ROPE_TYPE_NORM (the converter
        // permutes Q and K for it).
        let mut hp = HParams::load(file, arch, RopeStyle::Normal)?;
        // Mixtral: llama with experts of the FFN's width, weights normalized (llama.cpp's
        // `build_moe_ffn` for LLM_ARCH_LLAMA).
        hp.experts = ExpertParams::load(file, arch, "feed_forward_length", true)?;
        hp.rope_freq_scale = rope_scaling(file, arch)?;
        hp.rope_freq_factors = rope_freq_factors(file, &hp)?;
        let (e, v) = (hp.n_embd as u64, hp.n_vocab as u64);
        let q_out = (hp.n_head * hp.head_dim) as u64;
        let kv_out = hp.n_kv_embd() as u64;
        let ff = hp.n_ff as u64;

        let token_embd = check_tensor(file, "token_embd.weight", &[e, v])?;
        f32_vector(file, "output_norm.weight", e)?;
        let output = output_weight(file, &hp, token_embd)?;
        let layers: Vec<LayerWeights> = (0..hp.n_layer)
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
                    wo_bias: optional_layer_f32(file, il, "attn_output.bias", e)?,
                    ffn_norm: layer_f32(file, il, "ffn_norm.weight", e)?,
                    ffn: Ffn::load(file, il, &hp)?,
                    gate_bias: optional_layer_f32(file, il, "ffn_gate.bias", ff)?,
                    up_bias: optional_layer_f32(file, il, "ffn_up.bias", ff)?,
                    down_bias: optional_layer_f32(file, il, "ffn_down.bias", e)?,
                })
            })
            .collect::<Result<_, ModelError>>()?;
        let mut used = vec![
            "token_embd.weight".to_string(),
            "output_norm.weight".to_string(),
            output.0.clone(),
        ];
        used.extend(hp.rope_freq_factors.iter().cloned());
        for w in &layers {
            used.extend([&w.attn_norm, &w.q.0, &w.k.0, &w.v.0, &w.wo.0, &w.ffn_norm].map(String::clone));
            used.extend(w.ffn.names());
            used.extend(
                [
                    &w.q_bias,
                    &w.k_bias,
                    &w.v_bias,
                    &w.wo_bias,
                    &w.gate_bias,
                    &w.up_bias,
                    &w.down_bias,
                ]
                .into_iter()
                .flatten()
                .cloned(),
            );
        }
        check_used_tensors(file, arch, &used)?;
        Ok(Llama {
            hparams: hp,
            token_embd,
            output,
            layers,
        })
    }
}

impl ModelDef for Llama {
    fn arch(&self) -> &'static str {
        "llama"
    }

    fn hparams(&self) -> &HParams {
        &self.hparams
    }

    fn build_graph(&self, params: &GraphParams) -> ComputeGraph {
        self.graph(params)
    }
}
