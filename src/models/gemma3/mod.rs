//! Gemma 3 (text models, 270M to 27B): RMSNorm before and after both attention and FFN
//! ("sandwich" norms), per-head Q/K norms, NeoX RoPE, Q scaled by `1 / sqrt(head_dim)` before
//! attention (`1 / sqrt(n_embd / n_head)` for the 27B, as llama.cpp), a GELU-gated FFN, token
//! embeddings scaled by `sqrt(n_embd)`, and interleaved sliding-window attention: 5 local layers
//! to 1 global by default (`attention.sliding_window_pattern`), the local ones rotating with
//! `rope.freq_base_swa` (10000) and no linear scaling. The window is applied by the attention
//! over a full-size cache (every layer keeps n_ctx cells). Gemma 3n, vision (`clip`) and a
//! final logit soft-cap are refused by name, with every tensor and `gemma3.*` key the
//! computation does not read.

mod graph;

use crate::gguf::GgufFile;
use crate::graph::{ComputeGraph, GraphParams, RopeStyle};
use crate::models::blocks::WeightRef;
use crate::models::hparams::positive_float;
use crate::models::{
    check_arch_keys, check_tensor, check_used_tensors, f32_vector, layer_f32, layer_weight, output_weight,
    rope_scaling, ArchKey, HParams, ModelDef, ModelError,
};
use crate::quant::GgmlType;

const ARCH: &str = "gemma3";

/// The `gemma3.*` keys minfer reads or knows to be harmless; any other is refused by name.
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
    ArchKey::Read("final_logit_softcapping"),
    ArchKey::Descriptive("rope.scaling.original_context_length"),
    ArchKey::Descriptive("vocab_size"),
];

/// Names and types of one layer's weights.
#[derive(Clone, Debug)]
pub(crate) struct LayerWeights {
    pub attn_norm: String,
    pub q: WeightRef,
    pub k: WeightRef,
    pub v: WeightRef,
    pub q_norm: String,
    pub k_norm: String,
    pub wo: WeightRef,
    pub attn_post_norm: String,
    pub ffn_norm: String,
    pub gate: WeightRef,
    pub up: WeightRef,
    pub down: WeightRef,
    pub ffn_post_norm: String,
}

/// A Gemma 3 model: its hyper-parameters and the names and types of all its weights.
pub struct Gemma3 {
    hparams: HParams,
    token_embd: GgmlType,
    output: WeightRef,
    layers: Vec<LayerWeights>,
}

impl Gemma3 {
    /// Read the hyper-parameters and check every tensor's presence, GGUF shape and type against
    /// them; refuse what the graph would not compute.
    pub fn load(file: &GgufFile) -> Result<Self, ModelError> {
        check_arch_keys(file, ARCH, KEYS)?;
        let m = file.metadata();
        let key = |suffix: &str| format!("{ARCH}.{suffix}");
        if m.contains(&key("final_logit_softcapping")) {
            let cap = m.get_float(&key("final_logit_softcapping"))?;
            if cap != 0.0 {
                return Err(ModelError::Unsupported {
                    what: format!("{ARCH}.final_logit_softcapping = {cap}"),
                    reason: "a final logit soft-cap is not supported yet".into(),
                });
            }
        }
        let mut hp = HParams::load(file, ARCH, RopeStyle::Neox)?;
        if hp.n_rot != hp.head_dim {
            return Err(ModelError::BadHParam {
                name: "rope.dimension_count",
                value: hp.n_rot as u64,
                reason: format!("Gemma 3 rotates whole heads of {}", hp.head_dim),
            });
        }
        hp.rope_freq_scale = rope_scaling(file, ARCH)?;
        hp.embedding_scale = Some((hp.n_embd as f32).sqrt());
        // llama.cpp: the 27B (62 layers) scales by n_embd / n_head, the others by head_dim.
        let attn_dim = if hp.n_layer == 62 {
            hp.n_embd / hp.n_head
        } else {
            hp.head_dim
        };
        hp.q_scale = Some(1.0 / (attn_dim as f32).sqrt());
        hp.kq_scale = 1.0;
        if m.contains(&key("attention.sliding_window")) {
            hp.n_swa = m.get_uint(&key("attention.sliding_window"))? as usize;
        }
        if hp.n_swa > 0 {
            hp.swa_layers = swa_pattern(file, &hp)?;
            if m.contains(&key("rope.freq_base_swa")) {
                hp.rope_freq_base_swa = positive_float("rope.freq_base_swa", m.get_float(&key("rope.freq_base_swa"))?)?;
            }
        }

        let (e, v) = (hp.n_embd as u64, hp.n_vocab as u64);
        let q_out = (hp.n_head * hp.head_dim) as u64;
        let kv_out = hp.n_kv_embd() as u64;
        let (hd, ff) = (hp.head_dim as u64, hp.n_ff as u64);
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
                    q_norm: layer_f32(file, il, "attn_q_norm.weight", hd)?,
                    k_norm: layer_f32(file, il, "attn_k_norm.weight", hd)?,
                    wo: layer_weight(file, il, "attn_output.weight", &[q_out, e])?,
                    attn_post_norm: layer_f32(file, il, "post_attention_norm.weight", e)?,
                    ffn_norm: layer_f32(file, il, "ffn_norm.weight", e)?,
                    gate: layer_weight(file, il, "ffn_gate.weight", &[e, ff])?,
                    up: layer_weight(file, il, "ffn_up.weight", &[e, ff])?,
                    down: layer_weight(file, il, "ffn_down.weight", &[ff, e])?,
                    ffn_post_norm: layer_f32(file, il, "post_ffw_norm.weight", e)?,
                })
            })
            .collect::<Result<_, ModelError>>()?;
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
                    &w.q_norm,
                    &w.k_norm,
                    &w.wo.0,
                    &w.attn_post_norm,
                    &w.ffn_norm,
                    &w.gate.0,
                    &w.up.0,
                    &w.down.0,
                    &w.ffn_post_norm,
                ]
                .map(String::clone),
            );
        }
        check_used_tensors(file, ARCH, &used)?;
        Ok(Gemma3 {
            hparams: hp,
            token_embd,
            output,
            layers,
        })
    }
}

/// Which layers are local (windowed), as llama.cpp's `load_swa_pattern(ml, 6)`: a per-layer
/// boolean array, or a period n (default 6) whose last layer of each period is global.
fn swa_pattern(file: &GgufFile, hp: &HParams) -> Result<Vec<bool>, ModelError> {
    let m = file.metadata();
    let key = format!("{ARCH}.attention.sliding_window_pattern");
    if m.contains(&key) {
        if let Ok(crate::gguf::Array::Bool(flags)) = m.get_array(&key) {
            if flags.len() != hp.n_layer {
                return Err(ModelError::BadHParam {
                    name: "attention.sliding_window_pattern",
                    value: flags.len() as u64,
                    reason: format!("has {} flags for {} layers", flags.len(), hp.n_layer),
                });
            }
            return Ok(flags.clone());
        }
    }
    let n_pattern = match m.contains(&key) {
        true => m.get_uint(&key)? as usize,
        false => 6,
    };
    Ok((0..hp.n_layer)
        .map(|il| n_pattern == 0 || il % n_pattern < n_pattern - 1)
        .collect())
}

impl ModelDef for Gemma3 {
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
