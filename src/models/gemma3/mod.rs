//! The Gemma family's loader and graph, one folder for three generations that differ only in
//! what their layers have (llama.cpp's `gemma`, `gemma2` and `gemma3` builders). All: token
//! embeddings scaled by `sqrt(n_embd)`, NeoX RoPE over whole heads, Q scaled before attention
//! (`1 / sqrt(head_dim)`; `1 / sqrt(n_embd / n_head)` for the Gemma 2 27B and the Gemma 3 27B, as
//! llama.cpp decides it by layer count) with an attention of `kq_scale` 1, and a GELU-gated FFN.
//!
//! - Gemma 3 (270M to 27B, text): RMSNorm before and after both attention and FFN ("sandwich"
//!   norms), per-head Q/K norms, interleaved sliding-window attention — 5 local layers to 1
//!   global by default (`attention.sliding_window_pattern`), the local ones rotating with
//!   `rope.freq_base_swa` (10000) and no linear scaling —, and an optional final logit soft-cap.
//! - Gemma 2: the sandwich norms, no Q/K norms, a 4096-position window on every other layer
//!   (layer 0 local) rotating with the global base, attention logits soft-capped at
//!   `attn_logit_softcapping` (50 by default) and the final logits at `final_logit_softcapping`
//!   (30 by default), always, as llama.cpp does.
//! - Gemma (1): pre-norms only, no window, no soft-caps.
//!
//! The windowed layers keep a window cache of their own in a session (the engine's `KvWindow`).
//! Gemma 3n, Gemma 4 and vision (`clip`) are other architectures, refused by name, as is every
//! tensor and key the computation does not read.

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

/// A Gemma generation: what its layers have, its keys, its defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Generation {
    /// `gemma`: Gemma 1.
    Gemma,
    /// `gemma2`.
    Gemma2,
    /// `gemma3`: text models.
    Gemma3,
}

impl Generation {
    /// The `general.architecture` value.
    pub fn arch(self) -> &'static str {
        match self {
            Generation::Gemma => "gemma",
            Generation::Gemma2 => "gemma2",
            Generation::Gemma3 => "gemma3",
        }
    }

    /// The `{arch}.*` keys minfer reads or knows to be harmless; any other is refused by name.
    fn keys(self) -> Vec<ArchKey> {
        let mut keys = vec![
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
            ArchKey::Descriptive("rope.scaling.original_context_length"),
            ArchKey::Descriptive("vocab_size"),
        ];
        if self != Generation::Gemma {
            keys.extend([
                ArchKey::Read("attention.sliding_window"),
                ArchKey::Read("attention.sliding_window_pattern"),
                ArchKey::Read("rope.freq_base_swa"),
                ArchKey::Read("final_logit_softcapping"),
            ]);
        }
        if self == Generation::Gemma2 {
            keys.push(ArchKey::Read("attn_logit_softcapping"));
        }
        keys
    }
}

/// Names and types of one layer's weights.
#[derive(Clone, Debug)]
pub(crate) struct LayerWeights {
    pub attn_norm: String,
    pub q: WeightRef,
    pub k: WeightRef,
    pub v: WeightRef,
    /// Gemma 3's per-head Q and K norms.
    pub qk_norm: Option<(String, String)>,
    pub wo: WeightRef,
    /// Gemma 2 and 3's norm of the attention output.
    pub attn_post_norm: Option<String>,
    pub ffn_norm: String,
    pub gate: WeightRef,
    pub up: WeightRef,
    pub down: WeightRef,
    /// Gemma 2 and 3's norm of the FFN output.
    pub ffn_post_norm: Option<String>,
}

/// A Gemma model of any generation: its hyper-parameters and the names and types of all its
/// weights.
pub struct Gemma3 {
    generation: Generation,
    hparams: HParams,
    token_embd: GgmlType,
    output: WeightRef,
    layers: Vec<LayerWeights>,
}

impl Gemma3 {
    /// A `gemma3` file.
    pub fn load(file: &GgufFile) -> Result<Self, ModelError> {
        Self::load_family(file, Generation::Gemma3)
    }

    /// Read a `generation` file's hyper-parameters and check every tensor's presence, GGUF
    /// shape and type against them; refuse what the graph would not compute.
    pub fn load_family(file: &GgufFile, generation: Generation) -> Result<Self, ModelError> {
        let arch = generation.arch();
        check_arch_keys(file, arch, &generation.keys())?;
        let m = file.metadata();
        let key = |suffix: &str| format!("{arch}.{suffix}");
        let mut hp = HParams::load(file, arch, RopeStyle::Neox)?;
        if hp.n_rot != hp.head_dim {
            return Err(ModelError::BadHParam {
                name: "rope.dimension_count",
                value: hp.n_rot as u64,
                reason: format!("Gemma rotates whole heads of {}", hp.head_dim),
            });
        }
        hp.rope_freq_scale = rope_scaling(file, arch)?;
        hp.embedding_scale = Some((hp.n_embd as f32).sqrt());
        // llama.cpp: the 27Bs (Gemma 2's 46 layers, Gemma 3's 62) scale by n_embd / n_head.
        let big = match generation {
            Generation::Gemma => false,
            Generation::Gemma2 => hp.n_layer == 46,
            Generation::Gemma3 => hp.n_layer == 62,
        };
        let attn_dim = if big { hp.n_embd / hp.n_head } else { hp.head_dim };
        hp.q_scale = Some(1.0 / (attn_dim as f32).sqrt());
        hp.kq_scale = 1.0;
        // A soft-cap: the key's value, else the generation's default (none: 0).
        let cap = |suffix: &'static str, default: f32| -> Result<Option<f32>, ModelError> {
            let value = match m.contains(&key(suffix)) {
                true => m.get_float(&key(suffix))?,
                false => default,
            };
            match value {
                0.0 if generation != Generation::Gemma2 => Ok(None),
                v => positive_float(suffix, v).map(Some),
            }
        };
        match generation {
            Generation::Gemma => {}
            Generation::Gemma2 => {
                if hp.rope_freq_scale != 1.0 {
                    return Err(ModelError::Unsupported {
                        what: format!("{arch}.rope.scaling.factor"),
                        reason: "RoPE scaling on a Gemma 2 file is not supported".into(),
                    });
                }
                hp.attn_softcap = cap("attn_logit_softcapping", 50.0)?;
                hp.final_softcap = cap("final_logit_softcapping", 30.0)?;
                hp.n_swa = 4096;
                hp.rope_freq_base_swa = hp.rope_freq_base;
            }
            Generation::Gemma3 => hp.final_softcap = cap("final_logit_softcapping", 0.0)?,
        }
        if m.contains(&key("attention.sliding_window")) {
            hp.n_swa = m.get_uint(&key("attention.sliding_window"))? as usize;
        }
        if hp.n_swa > 0 {
            let default_pattern = if generation == Generation::Gemma2 { 2 } else { 6 };
            hp.swa_layers = crate::models::hparams::swa_pattern(file, arch, &hp, default_pattern)?;
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
        let sandwich = generation != Generation::Gemma;
        let layers: Vec<LayerWeights> = (0..hp.n_layer)
            .map(|il| {
                let post = |suffix: &str| sandwich.then(|| layer_f32(file, il, suffix, e)).transpose();
                Ok(LayerWeights {
                    attn_norm: layer_f32(file, il, "attn_norm.weight", e)?,
                    q: layer_weight(file, il, "attn_q.weight", &[e, q_out])?,
                    k: layer_weight(file, il, "attn_k.weight", &[e, kv_out])?,
                    v: layer_weight(file, il, "attn_v.weight", &[e, kv_out])?,
                    qk_norm: match generation {
                        Generation::Gemma3 => Some((
                            layer_f32(file, il, "attn_q_norm.weight", hd)?,
                            layer_f32(file, il, "attn_k_norm.weight", hd)?,
                        )),
                        _ => None,
                    },
                    wo: layer_weight(file, il, "attn_output.weight", &[q_out, e])?,
                    attn_post_norm: post("post_attention_norm.weight")?,
                    ffn_norm: layer_f32(file, il, "ffn_norm.weight", e)?,
                    gate: layer_weight(file, il, "ffn_gate.weight", &[e, ff])?,
                    up: layer_weight(file, il, "ffn_up.weight", &[e, ff])?,
                    down: layer_weight(file, il, "ffn_down.weight", &[ff, e])?,
                    ffn_post_norm: post("post_ffw_norm.weight")?,
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
                    &w.wo.0,
                    &w.ffn_norm,
                    &w.gate.0,
                    &w.up.0,
                    &w.down.0,
                ]
                .map(String::clone),
            );
            used.extend(w.qk_norm.iter().flat_map(|(q, k)| [q.clone(), k.clone()]));
            used.extend(w.attn_post_norm.iter().chain(&w.ffn_post_norm).cloned());
        }
        check_used_tensors(file, arch, &used)?;
        Ok(Gemma3 {
            generation,
            hparams: hp,
            token_embd,
            output,
            layers,
        })
    }
}

impl ModelDef for Gemma3 {
    fn arch(&self) -> &'static str {
        self.generation.arch()
    }

    fn hparams(&self) -> &HParams {
        &self.hparams
    }

    fn build_graph(&self, params: &GraphParams) -> ComputeGraph {
        self.graph(params)
    }
}
