//! Phi-3 (Phi-3, Phi-3.5, Phi-4-mini): llama's graph over Phi-3's tensors — Q, K and V fused in
//! one `attn_qkv.weight` (or apart, as some converters write them) and the FFN's gate and up in
//! one `ffn_up.weight` of twice the width, both handed to the graph as views of their rows
//! ([`WeightView`]: no copy), NeoX RoPE over `rope.dimension_count` of each head's dimensions
//! (Phi-4-mini rotates 96 of 128), and LongRoPE: the long or short per-pair factors
//! (`rope_factors_long/short.weight`) by whether the context exceeds
//! `rope.scaling.original_context_length`, with the magnitude factor `rope.scaling.attn_factor`.
//! As in llama.cpp, `attention.sliding_window` is read but not applied (llama.cpp turns Phi's
//! sliding window off). Biases and experts (PhiMoE) are refused by name with every unused
//! tensor.

use crate::gguf::GgufFile;
use crate::graph::{ComputeGraph, GraphParams, RopeStyle};
use crate::models::blocks::WeightRef;
use crate::models::hparams::{positive_float, LongRope};
use crate::models::llama::{LayerWeights, Llama};
use crate::models::moe::Ffn;
use crate::models::{
    check_arch_keys, check_tensor, check_used_tensors, f32_vector, layer_f32, layer_weight, output_weight,
    rope_factor_tensor, rope_scaling, ArchKey, HParams, ModelDef, ModelError, WeightView,
};

const ARCH: &str = "phi3";

/// The `phi3.*` keys minfer reads or knows to be harmless; any other is refused by name.
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
    ArchKey::Read("rope.freq_base"),
    ArchKey::Read("rope.dimension_count"),
    ArchKey::Read("rope.scaling.type"),
    ArchKey::Read("rope.scaling.factor"),
    ArchKey::Read("rope.scaling.original_context_length"),
    ArchKey::Read("rope.scaling.attn_factor"),
    // llama.cpp reads Phi's window and then turns it off ("Phi SWA is currently disabled");
    // minfer computes what llama.cpp computes.
    ArchKey::Descriptive("attention.sliding_window"),
    ArchKey::Descriptive("vocab_size"),
];

/// A Phi-3 model: a llama model whose Q/K/V and gate/up weights are views of fused tensors.
pub struct Phi3 {
    model: Llama,
    views: Vec<WeightView>,
}

impl Phi3 {
    /// Read the hyper-parameters and check every tensor's presence, GGUF shape and type against
    /// them; refuse what the graph would not compute.
    pub fn load(file: &GgufFile) -> Result<Self, ModelError> {
        check_arch_keys(file, ARCH, KEYS)?;
        let m = file.metadata();
        let mut hp = HParams::load(file, ARCH, RopeStyle::Neox)?;
        hp.rope_freq_scale = rope_scaling(file, ARCH)?;
        let attn_factor_key = format!("{ARCH}.rope.scaling.attn_factor");
        if m.contains(&attn_factor_key) {
            hp.rope_attn_factor = positive_float("rope.scaling.attn_factor", m.get_float(&attn_factor_key)?)?;
        }
        let long = rope_factor_tensor(file, "rope_factors_long.weight", &hp)?;
        let short = rope_factor_tensor(file, "rope_factors_short.weight", &hp)?;
        hp.rope_long_short = match (long, short) {
            (Some(long), Some(short)) => {
                let orig_key = format!("{ARCH}.rope.scaling.original_context_length");
                let n_ctx_orig = match m.contains(&orig_key) {
                    true => m.get_uint(&orig_key)? as usize,
                    false => hp.n_ctx_train,
                };
                Some(LongRope {
                    long,
                    short,
                    n_ctx_orig,
                })
            }
            (None, None) => None,
            (Some(_), None) | (None, Some(_)) => {
                return Err(ModelError::MissingTensor {
                    name: "rope_factors_long.weight and rope_factors_short.weight (LongRoPE needs both)".into(),
                })
            }
        };
        let (e, v) = (hp.n_embd as u64, hp.n_vocab as u64);
        let q_out = (hp.n_head * hp.head_dim) as u64;
        let kv_out = hp.n_kv_embd() as u64;
        let ff = hp.n_ff as u64;

        let token_embd = check_tensor(file, "token_embd.weight", &[e, v])?;
        f32_vector(file, "output_norm.weight", e)?;
        let output = output_weight(file, &hp, token_embd)?;
        let mut views = Vec::new();
        let mut used = vec![
            "token_embd.weight".to_string(),
            "output_norm.weight".to_string(),
            output.0.clone(),
        ];
        used.extend(
            hp.rope_long_short
                .iter()
                .flat_map(|l| [l.long.clone(), l.short.clone()]),
        );
        let mut view = |base: &str, ty, name: &str, first_row: u64, n_rows: u64| -> WeightRef {
            let name = format!("{base}:{name}");
            views.push(WeightView {
                name: name.clone(),
                base: base.to_string(),
                first_row,
                n_rows,
            });
            (name, ty)
        };
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let qkv_name = format!("blk.{il}.attn_qkv.weight");
            let (q, k, v) = if file.tensor(&qkv_name).is_ok() {
                let (name, ty) = layer_weight(file, il, "attn_qkv.weight", &[e, q_out + 2 * kv_out])?;
                used.push(name.clone());
                (
                    view(&name, ty, "q", 0, q_out),
                    view(&name, ty, "k", q_out, kv_out),
                    view(&name, ty, "v", q_out + kv_out, kv_out),
                )
            } else {
                let q = layer_weight(file, il, "attn_q.weight", &[e, q_out])?;
                let k = layer_weight(file, il, "attn_k.weight", &[e, kv_out])?;
                let v = layer_weight(file, il, "attn_v.weight", &[e, kv_out])?;
                used.extend([&q.0, &k.0, &v.0].map(String::clone));
                (q, k, v)
            };
            // HF's Phi3MLP: `gate, up = gate_up_proj(x).chunk(2)` — the gate's rows first.
            let (up_name, up_ty) = layer_weight(file, il, "ffn_up.weight", &[e, 2 * ff])?;
            used.push(up_name.clone());
            let gate = view(&up_name, up_ty, "gate", 0, ff);
            let up = view(&up_name, up_ty, "up", ff, ff);
            let down = layer_weight(file, il, "ffn_down.weight", &[ff, e])?;
            used.push(down.0.clone());
            let w = LayerWeights {
                attn_norm: layer_f32(file, il, "attn_norm.weight", e)?,
                q,
                k,
                v,
                q_bias: None,
                k_bias: None,
                v_bias: None,
                wo: layer_weight(file, il, "attn_output.weight", &[q_out, e])?,
                wo_bias: None,
                gate_bias: None,
                up_bias: None,
                down_bias: None,
                ffn_norm: layer_f32(file, il, "ffn_norm.weight", e)?,
                ffn: Ffn::Dense { gate, up, down },
            };
            used.extend([&w.attn_norm, &w.wo.0, &w.ffn_norm].map(String::clone));
            layers.push(w);
        }
        check_used_tensors(file, ARCH, &used)?;
        Ok(Phi3 {
            model: Llama {
                hparams: hp,
                token_embd,
                output,
                layers,
            },
            views,
        })
    }
}

impl ModelDef for Phi3 {
    fn arch(&self) -> &'static str {
        ARCH
    }

    fn hparams(&self) -> &HParams {
        &self.model.hparams
    }

    fn build_graph(&self, params: &GraphParams) -> ComputeGraph {
        self.model.build_graph(params)
    }

    fn weight_views(&self) -> Vec<WeightView> {
        self.views.clone()
    }
}
