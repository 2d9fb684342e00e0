//! Hyper-parameters read from `{arch}.*` metadata keys, falling back to `llama.*` as converters
//! of LLaMA-like models sometimes write them.

use super::ModelError;
use crate::gguf::{GgufFile, Metadata};
use crate::graph::RopeStyle;

/// A model's hyper-parameters, named as llama.cpp names them.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    /// Vocabulary size: rows of `token_embd.weight` (its ne1).
    pub n_vocab: usize,
    /// Context length the model was trained with (`context_length`).
    pub n_ctx_train: usize,
    /// Width of the residual stream (`embedding_length`).
    pub n_embd: usize,
    /// Transformer blocks (`block_count`).
    pub n_layer: usize,
    /// Query heads (`attention.head_count`).
    pub n_head: usize,
    /// KV heads (`attention.head_count_kv`, else n_head); n_head is a multiple of it.
    pub n_head_kv: usize,
    /// Per-head dimension of Q and K (`attention.key_length`, else n_embd / n_head).
    pub head_dim: usize,
    /// Inner width of the FFN (`feed_forward_length`).
    pub n_ff: usize,
    /// Dimensions RoPE rotates (`rope.dimension_count`, else head_dim).
    pub n_rot: usize,
    /// Epsilon of every RMSNorm (`attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
    /// RoPE frequency base (`rope.freq_base`, else 10000).
    pub rope_freq_base: f32,
    /// How RoPE pairs a head's dimensions: fixed by the architecture (llama.cpp's
    /// `llama_model_rope_type`), not stored in the file.
    pub rope_style: RopeStyle,
    /// Linear RoPE scaling: 1 / `rope.scaling.factor` for `rope.scaling.type = linear`, else 1.
    /// Set by the architectures that read the scaling keys.
    pub rope_freq_scale: f32,
    /// The F32 weight of per-pair RoPE frequency divisors (Llama 3.1's `rope_freqs.weight`), if
    /// the model has one. Set by the architectures that read it.
    pub rope_freq_factors: Option<String>,
    /// LongRoPE (Phi-3): the long and short factor weights and the context length the model was
    /// trained at before its extension; a context above it rotates with the long ones. Set by
    /// the architectures that read it; `rope_freq_factors` wins where both are set.
    pub rope_long_short: Option<LongRope>,
    /// Multiplies RoPE's cos and sin (`rope.scaling.attn_factor`, LongRoPE's magnitude factor);
    /// 1 for most models.
    pub rope_attn_factor: f32,
    /// The attention scores' factor: `1 / sqrt(head_dim)`, unless the architecture reads its
    /// own (Granite's `attention.scale`).
    pub kq_scale: f32,
    /// Factor of the token embeddings before the first layer (Granite's `embedding_scale`).
    pub embedding_scale: Option<f32>,
    /// Factor of each attention and FFN output before its residual add (Granite's
    /// `residual_scale`).
    pub residual_scale: Option<f32>,
    /// Factor of the logits (1 / Granite's `logit_scale`).
    pub logit_scale: Option<f32>,
    /// Factor of the roped Q before attention (Gemma's `1 / sqrt(head_dim)`, applied to Q as
    /// llama.cpp does, the attention's own `kq_scale` then 1).
    pub q_scale: Option<f32>,
    /// Attention logit soft-capping (Gemma 2's `attn_logit_softcapping`), if the model has it.
    pub attn_softcap: Option<f32>,
    /// Final logit soft-capping (Gemma 2's `final_logit_softcapping`): the head's logits `l`
    /// become `cap * tanh(l / cap)`.
    pub final_softcap: Option<f32>,
    /// Sliding-window attention (`attention.sliding_window`, Gemma's local layers): the window in
    /// positions, 0 for none. Set by the architectures that read it.
    pub n_swa: usize,
    /// Which layers attend through the window (llama.cpp's `is_swa`); empty for none.
    pub swa_layers: Vec<bool>,
    /// RoPE base of the windowed layers (`rope.freq_base_swa`, llama.cpp's default 10000).
    pub rope_freq_base_swa: f32,
    /// RoPE scale of the windowed layers (llama.cpp's `rope_freq_scale_train_swa`): 1 (no
    /// linear scaling) unless the architecture scales them as the others (gpt-oss).
    pub rope_freq_scale_swa: f32,
    /// YaRN (`rope.scaling.type = yarn`): how the scaled rotation blends with the unscaled one;
    /// `None` for other models. Set by the architectures that read it.
    pub rope_yarn: Option<YarnParams>,
    /// Whether every layer has learned attention sinks (gpt-oss's `blk.N.attn_sinks.weight`, F32
    /// `[n_head]`). Set by the architectures that have them.
    pub attn_sinks: bool,
    /// The FFN's experts, for a mixture-of-experts model (llama.cpp's `n_expert`,
    /// `n_expert_used`, `n_ff_exp`): set by the architectures that have them, `None` for a
    /// dense FFN.
    pub experts: Option<super::moe::ExpertParams>,
    /// How the file says its hidden states pool into embeddings (`pooling_type`), if it says.
    pub pooling: Option<super::pooling::Pooling>,
    /// A reranker's classification head (`cls.output.weight`), if the file has one.
    pub rank_head: Option<super::pooling::RankHead>,
}

/// YaRN's parameters as llama.cpp's context derives them from the file (`llama_context`'s
/// `yarn_*` cparams at their defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct YarnParams {
    /// The blend's strength (`yarn_ext_factor`): 1 for a YaRN model.
    pub ext_factor: f32,
    /// Rotations over the original context above which a pair keeps its unscaled angle
    /// (`yarn_beta_fast`, 32).
    pub beta_fast: f32,
    /// Rotations below which a pair takes the scaled angle (`yarn_beta_slow`, 1).
    pub beta_slow: f32,
    /// The context the model was trained at before scaling
    /// (`rope.scaling.original_context_length`, else `context_length`).
    pub n_ctx_orig: usize,
}

/// LongRoPE's two sets of per-pair frequency factors (llama.cpp's `get_rope_factors`).
#[derive(Clone, Debug, PartialEq)]
pub struct LongRope {
    /// `rope_factors_long.weight`, for contexts above `n_ctx_orig`.
    pub long: String,
    /// `rope_factors_short.weight`, for contexts up to `n_ctx_orig`.
    pub short: String,
    /// `rope.scaling.original_context_length`, else the training context.
    pub n_ctx_orig: usize,
}

impl HParams {
    /// Whether layer `il` attends through the sliding window.
    pub fn is_swa(&self, il: usize) -> bool {
        self.n_swa > 0 && self.swa_layers.get(il).copied().unwrap_or(false)
    }

    /// Layer `il`'s attention window, if it has one.
    pub fn swa_window(&self, il: usize) -> Option<usize> {
        self.is_swa(il).then_some(self.n_swa)
    }

    /// Values per KV cell: n_head_kv * head_dim.
    pub fn n_kv_embd(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// The hyper-parameters of an `arch` file, whose family rotates with `rope_style`.
    pub fn load(file: &GgufFile, arch: &str, rope_style: RopeStyle) -> Result<Self, ModelError> {
        let m = file.metadata();
        let n_embd = uint(m, arch, "embedding_length")?;
        let n_head = uint(m, arch, "attention.head_count")?;
        let positive = |name: &'static str, v: usize| {
            if v == 0 {
                Err(ModelError::BadHParam {
                    name,
                    value: 0,
                    reason: "must be positive".into(),
                })
            } else {
                Ok(v)
            }
        };
        positive("n_embd", n_embd)?;
        positive("n_head", n_head)?;
        let n_head_kv = opt_uint(m, arch, "attention.head_count_kv")?.unwrap_or(n_head);
        positive("n_head_kv", n_head_kv)?;
        if n_head % n_head_kv != 0 {
            return Err(ModelError::BadHParam {
                name: "n_head_kv",
                value: n_head_kv as u64,
                reason: format!("does not divide n_head = {n_head}"),
            });
        }
        let head_dim = opt_uint(m, arch, "attention.key_length")?.unwrap_or(n_embd / n_head);
        positive("head_dim", head_dim)?;
        // The V head width drives the attention output and the KV row stride like K's; minfer's
        // cache stores both with one stride, so they must agree.
        if let Some(value_length) = opt_uint(m, arch, "attention.value_length")? {
            if value_length != head_dim {
                return Err(ModelError::BadHParam {
                    name: "attention.value_length",
                    value: value_length as u64,
                    reason: format!("differs from key_length = {head_dim}"),
                });
            }
        }
        let n_vocab = file
            .tensor("token_embd.weight")
            .map_err(|_| ModelError::MissingTensor {
                name: "token_embd.weight".into(),
            })?
            .shape
            .get(1)
            .copied()
            .unwrap_or(0) as usize;
        positive("n_vocab", n_vocab)?;
        let mut hp = HParams {
            n_vocab,
            n_ctx_train: uint(m, arch, "context_length")?,
            n_embd,
            n_layer: positive("n_layer", uint(m, arch, "block_count")?)?,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: uint(m, arch, "feed_forward_length")?,
            n_rot: opt_uint(m, arch, "rope.dimension_count")?.unwrap_or(head_dim),
            rms_eps: positive_float("rms_eps", float(m, arch, "attention.layer_norm_rms_epsilon")?)?,
            rope_freq_base: positive_float(
                "rope_freq_base",
                opt_float(m, arch, "rope.freq_base")?.unwrap_or(10000.0),
            )?,
            rope_style,
            rope_freq_scale: 1.0,
            rope_freq_factors: None,
            rope_long_short: None,
            rope_attn_factor: 1.0,
            kq_scale: 1.0 / (head_dim as f32).sqrt(),
            embedding_scale: None,
            residual_scale: None,
            logit_scale: None,
            q_scale: None,
            attn_softcap: None,
            final_softcap: None,
            n_swa: 0,
            swa_layers: Vec::new(),
            rope_freq_base_swa: 10_000.0,
            rope_freq_scale_swa: 1.0,
            rope_yarn: None,
            attn_sinks: false,
            experts: None,
            pooling: None,
            rank_head: None,
        };
        (hp.pooling, hp.rank_head) = super::pooling::load(file, arch, &hp)?;
        Ok(hp)
    }
}

/// `value` if it is finite and above 0 (NaN fails the test too).
pub(crate) fn positive_float(name: &'static str, value: f32) -> Result<f32, ModelError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(ModelError::BadFloatHParam {
            name,
            value,
            reason: "must be a finite number above 0",
        })
    }
}

fn key_for(m: &Metadata, arch: &str, suffix: &str) -> String {
    let own = format!("{arch}.{suffix}");
    let llama = format!("llama.{suffix}");
    if !m.contains(&own) && m.contains(&llama) {
        llama
    } else {
        own
    }
}

fn uint(m: &Metadata, arch: &str, suffix: &str) -> Result<usize, ModelError> {
    Ok(m.get_uint(&key_for(m, arch, suffix))? as usize)
}

fn opt_uint(m: &Metadata, arch: &str, suffix: &str) -> Result<Option<usize>, ModelError> {
    let key = key_for(m, arch, suffix);
    if !m.contains(&key) {
        return Ok(None);
    }
    Ok(Some(m.get_uint(&key)? as usize))
}

fn float(m: &Metadata, arch: &str, suffix: &str) -> Result<f32, ModelError> {
    Ok(m.get_float(&key_for(m, arch, suffix))?)
}

fn opt_float(m: &Metadata, arch: &str, suffix: &str) -> Result<Option<f32>, ModelError> {
    let key = key_for(m, arch, suffix);
    if !m.contains(&key) {
        return Ok(None);
    }
    Ok(Some(m.get_float(&key)?))
}

/// Which layers are local (windowed), as llama.cpp's `load_swa_pattern(ml, default)`: a
/// per-layer boolean array, or a period n (Gemma 3's default 6, Gemma 2's and gpt-oss's 2) whose last layer of
/// each period is global.
pub(crate) fn swa_pattern(file: &GgufFile, arch: &str, hp: &HParams, default: usize) -> Result<Vec<bool>, ModelError> {
    let m = file.metadata();
    let key = format!("{arch}.attention.sliding_window_pattern");
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
        false => default,
    };
    Ok((0..hp.n_layer)
        .map(|il| n_pattern == 0 || il % n_pattern < n_pattern - 1)
        .collect())
}
