//! The mixture-of-experts FFN (llama.cpp's `build_moe_ffn`), shared by the architectures with
//! experts (Qwen3-MoE, Qwen2-MoE, Mixtral's llama, gpt-oss): the expert hyper-parameters, a
//! layer's expert weights checked at load, and the block — router (gpt-oss's with a bias),
//! softmax gating or gpt-oss's softmax over the chosen logits, top-k, the experts' products
//! indexed by the chosen ids (gpt-oss's with per-expert biases), SiLU or gpt-oss's clamped
//! SwiGLU, their weighted sum, and Qwen2-MoE's gated shared expert. A layer's FFN is either
//! dense or experts ([`Ffn`]); an architecture loads one or the other and the block builds it.
//! This module describes the computation; it runs nothing.

use super::blocks::{self, matmul_meta, WeightRef};
use super::{check_arch_keys, check_tensor, f32_tensor, layer_f32, layer_weight, ArchKey, HParams, ModelError};
use crate::gguf::GgufFile;
use crate::graph::{GraphBuilder, GraphParams, MatMulIdMeta, NodeId};

/// The experts of a model's FFN layers, as llama.cpp reads them.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpertParams {
    /// Experts per layer (`expert_count`).
    pub n_expert: usize,
    /// Experts each token runs (`expert_used_count`).
    pub n_expert_used: usize,
    /// Inner width of one expert (`expert_feed_forward_length`; Mixtral's `feed_forward_length`).
    pub n_ff_exp: usize,
    /// Inner width of Qwen2-MoE's shared expert (`expert_shared_feed_forward_length`), 0 for none.
    pub n_ff_shexp: usize,
    /// Whether the chosen experts' weights are normalized to sum 1 (Mixtral and Qwen3-MoE; not
    /// Qwen2-MoE): fixed per architecture in llama.cpp's graphs.
    pub norm_w: bool,
    /// How the router's logits become the chosen experts' weights: fixed per architecture.
    pub gating: Gating,
    /// The experts' activation: fixed per architecture.
    pub activation: Activation,
    /// Whether the router and the experts' three products have biases (gpt-oss).
    pub biases: bool,
}

/// llama.cpp's `llama_expert_gating_func_type`, the kinds minfer's architectures use.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Gating {
    /// Softmax over all experts, then the top k of the probabilities (`SOFTMAX`).
    Softmax,
    /// The top k of the logits, then softmax over those k (`SOFTMAX_WEIGHT`, gpt-oss).
    SoftmaxWeight,
}

/// The activation between an expert's gate and up products (llama.cpp's `llm_ffn_op_type`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// `silu(gate) * up` (`LLM_FFN_SILU`).
    Silu,
    /// gpt-oss's clamped SwiGLU (`LLM_FFN_SWIGLU_OAI_MOE`, ggml's `swiglu_oai`).
    SwigluOai {
        /// The sigmoid's slope (1.702).
        alpha: f32,
        /// The clamp (7).
        limit: f32,
    },
}

impl ExpertParams {
    /// The expert keys of an `arch` file: `expert_count` and `expert_used_count` (both present
    /// and `0 < used <= count`, or neither: `None`, a dense model), and the experts' width from
    /// `width_key` (falling back, as llama.cpp does, to `feed_forward_length / used`).
    pub fn load(file: &GgufFile, arch: &str, width_key: &str, norm_w: bool) -> Result<Option<Self>, ModelError> {
        let m = file.metadata();
        let read = |suffix: &str| -> Result<Option<usize>, ModelError> {
            let key = format!("{arch}.{suffix}");
            Ok(match m.contains(&key) {
                true => Some(m.get_uint(&key)? as usize),
                false => None,
            })
        };
        let (n_expert, n_expert_used) = match (read("expert_count")?, read("expert_used_count")?) {
            (None | Some(0), None | Some(0)) => return Ok(None),
            (Some(n), Some(used)) if used > 0 && used <= n => (n, used),
            (n, used) => {
                return Err(ModelError::BadHParam {
                    name: "expert_used_count",
                    value: used.unwrap_or(0) as u64,
                    reason: format!("must be between 1 and expert_count = {}", n.unwrap_or(0)),
                })
            }
        };
        // Each id must fit the i32 ids of the graph; no GGUF model comes near.
        if n_expert > 1 << 16 {
            return Err(ModelError::BadHParam {
                name: "expert_count",
                value: n_expert as u64,
                reason: "more than 65536 experts".into(),
            });
        }
        let n_ff_exp = match read(width_key)? {
            Some(n) if n > 0 => n,
            _ => read("feed_forward_length")?.unwrap_or(0) / n_expert_used,
        };
        if n_ff_exp == 0 {
            return Err(ModelError::BadHParam {
                name: "expert_feed_forward_length",
                value: 0,
                reason: "must be positive".into(),
            });
        }
        Ok(Some(ExpertParams {
            n_expert,
            n_expert_used,
            n_ff_exp,
            n_ff_shexp: 0,
            norm_w,
            gating: Gating::Softmax,
            activation: Activation::Silu,
            biases: false,
        }))
    }
}

/// The `{arch}.*` keys of Qwen2-MoE and Qwen3-MoE files: those their loaders read, and the
/// expert keys llama.cpp's graphs for them do not read (their gating, normalization and scale
/// are fixed per architecture there, so these only describe it). Any other is refused by name.
const QWEN_MOE_KEYS: &[ArchKey] = &[
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
    ArchKey::Read("expert_count"),
    ArchKey::Read("expert_used_count"),
    ArchKey::Read("expert_feed_forward_length"),
    ArchKey::Read("expert_shared_feed_forward_length"),
    ArchKey::Descriptive("expert_gating_func"),
    ArchKey::Descriptive("expert_weights_norm"),
    ArchKey::Descriptive("expert_weights_scale"),
    ArchKey::Descriptive("vocab_size"),
];

/// Refuse any `{arch}.*` key of a Qwen2-MoE or Qwen3-MoE file outside [`QWEN_MOE_KEYS`].
pub(crate) fn check_keys(file: &GgufFile, arch: &'static str) -> Result<(), ModelError> {
    check_arch_keys(file, arch, QWEN_MOE_KEYS)
}

/// The experts an architecture cannot do without, or the error naming the missing key.
pub(crate) fn required(experts: Option<ExpertParams>, arch: &str) -> Result<ExpertParams, ModelError> {
    experts.ok_or_else(|| ModelError::Unsupported {
        what: format!("{arch}.expert_count"),
        reason: format!("a {arch} model needs experts: expert_count and expert_used_count must be positive"),
    })
}

/// Qwen2-MoE's shared expert: a dense SwiGLU FFN every token runs, scaled by a sigmoid gate.
#[derive(Clone, Debug)]
pub struct SharedExpert {
    /// The gate's weight, GGUF shape `[n_embd]`: one output per token.
    pub gate_inp: WeightRef,
    /// GGUF shape `[n_embd, n_ff_shexp]`.
    pub gate: WeightRef,
    /// GGUF shape `[n_embd, n_ff_shexp]`.
    pub up: WeightRef,
    /// GGUF shape `[n_ff_shexp, n_embd]`.
    pub down: WeightRef,
}

/// The biases of a layer's router and experts (gpt-oss), F32.
#[derive(Clone, Debug)]
pub struct ExpertBiases {
    /// The router's, `[n_expert]`.
    pub gate_inp: String,
    /// The gate products', `[n_ff_exp, n_expert]`: row `e` for expert `e`.
    pub gate: String,
    /// The up products', `[n_ff_exp, n_expert]`.
    pub up: String,
    /// The down products', `[n_embd, n_expert]`.
    pub down: String,
}

/// One layer's experts.
#[derive(Clone, Debug)]
pub struct Experts {
    /// The router, GGUF shape `[n_embd, n_expert]`.
    pub gate_inp: WeightRef,
    /// GGUF shape `[n_embd, n_ff_exp, n_expert]`.
    pub gate: WeightRef,
    /// GGUF shape `[n_embd, n_ff_exp, n_expert]`.
    pub up: WeightRef,
    /// GGUF shape `[n_ff_exp, n_embd, n_expert]`.
    pub down: WeightRef,
    /// Qwen2-MoE's shared expert; `None` for the others.
    pub shared: Option<SharedExpert>,
    /// gpt-oss's biases; `None` for the others.
    pub biases: Option<ExpertBiases>,
}

impl Experts {
    /// Layer `il`'s expert tensors, checked against `hp` and `ex` (the shared expert's when
    /// `ex.n_ff_shexp > 0`, the biases when `ex.biases`).
    pub fn load(file: &GgufFile, il: usize, hp: &HParams, ex: &ExpertParams) -> Result<Self, ModelError> {
        let (e, n, ff) = (hp.n_embd as u64, ex.n_expert as u64, ex.n_ff_exp as u64);
        let shared = if ex.n_ff_shexp > 0 {
            let sh = ex.n_ff_shexp as u64;
            let name = format!("blk.{il}.ffn_gate_inp_shexp.weight");
            Some(SharedExpert {
                gate_inp: (name.clone(), check_tensor(file, &name, &[e])?),
                gate: layer_weight(file, il, "ffn_gate_shexp.weight", &[e, sh])?,
                up: layer_weight(file, il, "ffn_up_shexp.weight", &[e, sh])?,
                down: layer_weight(file, il, "ffn_down_shexp.weight", &[sh, e])?,
            })
        } else {
            None
        };
        // A bias matrix: row `e` of it for expert `e`.
        let layer_f32_matrix = |il: usize, suffix: &str, shape: &[u64]| -> Result<String, ModelError> {
            let name = format!("blk.{il}.{suffix}");
            f32_tensor(file, &name, shape)?;
            Ok(name)
        };
        let biases = match ex.biases {
            true => Some(ExpertBiases {
                gate_inp: layer_f32(file, il, "ffn_gate_inp.bias", n)?,
                gate: layer_f32_matrix(il, "ffn_gate_exps.bias", &[ff, n])?,
                up: layer_f32_matrix(il, "ffn_up_exps.bias", &[ff, n])?,
                down: layer_f32_matrix(il, "ffn_down_exps.bias", &[e, n])?,
            }),
            false => None,
        };
        Ok(Experts {
            gate_inp: layer_weight(file, il, "ffn_gate_inp.weight", &[e, n])?,
            gate: layer_weight(file, il, "ffn_gate_exps.weight", &[e, ff, n])?,
            up: layer_weight(file, il, "ffn_up_exps.weight", &[e, ff, n])?,
            down: layer_weight(file, il, "ffn_down_exps.weight", &[ff, e, n])?,
            shared,
            biases,
        })
    }

    /// Every tensor name the block reads.
    pub fn names(&self) -> Vec<String> {
        let mut names = vec![
            self.gate_inp.0.clone(),
            self.gate.0.clone(),
            self.up.0.clone(),
            self.down.0.clone(),
        ];
        if let Some(s) = &self.shared {
            names.extend([&s.gate_inp.0, &s.gate.0, &s.up.0, &s.down.0].map(String::clone));
        }
        if let Some(b) = &self.biases {
            names.extend([&b.gate_inp, &b.gate, &b.up, &b.down].map(String::clone));
        }
        names
    }
}

/// A layer's feed-forward network: dense, or experts.
#[derive(Clone, Debug)]
pub enum Ffn {
    /// `down(silu(gate(x)) * up(x))`, GGUF shapes `[n_embd, n_ff]` twice and `[n_ff, n_embd]`.
    Dense {
        /// `ffn_gate`, through SiLU.
        gate: WeightRef,
        /// `ffn_up`.
        up: WeightRef,
        /// `ffn_down`.
        down: WeightRef,
    },
    /// A mixture of experts.
    Experts(Box<Experts>),
}

impl Ffn {
    /// Layer `il`'s FFN: its experts when the model has them, else the dense `ffn_gate`,
    /// `ffn_up` and `ffn_down`.
    pub fn load(file: &GgufFile, il: usize, hp: &HParams) -> Result<Self, ModelError> {
        match &hp.experts {
            Some(ex) => Ok(Ffn::Experts(Box::new(Experts::load(file, il, hp, ex)?))),
            None => {
                let (e, ff) = (hp.n_embd as u64, hp.n_ff as u64);
                Ok(Ffn::Dense {
                    gate: layer_weight(file, il, "ffn_gate.weight", &[e, ff])?,
                    up: layer_weight(file, il, "ffn_up.weight", &[e, ff])?,
                    down: layer_weight(file, il, "ffn_down.weight", &[ff, e])?,
                })
            }
        }
    }

    /// Every tensor name the FFN reads.
    pub fn names(&self) -> Vec<String> {
        match self {
            Ffn::Dense { gate, up, down } => vec![gate.0.clone(), up.0.clone(), down.0.clone()],
            Ffn::Experts(x) => x.names(),
        }
    }
}

/// `h + ffn(norm(h))` for either kind of FFN (no biases: the dense form is
/// [`blocks::ffn_swiglu`]'s).
pub fn ffn(
    b: &mut GraphBuilder,
    hp: &HParams,
    params: &GraphParams,
    il: usize,
    h: NodeId,
    ffn_norm: &str,
    ffn: &Ffn,
) -> NodeId {
    match ffn {
        Ffn::Dense { gate, up, down } => {
            let metas = blocks::ffn_metas(hp, (gate, up, down), (None, None, None));
            blocks::ffn_swiglu(b, hp, params, il, h, ffn_norm, metas)
        }
        Ffn::Experts(x) => {
            let normed = b.rms_norm(&format!("ffn_norm-{il}"), h, Some(ffn_norm), hp.rms_eps);
            let out = experts(b, hp, il, normed, x);
            blocks::residual_add(b, hp, "ffn", il, h, out)
        }
    }
}

/// The experts' output `[n_embd, n_tokens]` for the normed input `x`: llama.cpp's
/// `build_moe_ffn` with the architecture's gating, activation and biases, plus the shared
/// expert where there is one.
pub fn experts(b: &mut GraphBuilder, hp: &HParams, il: usize, x: NodeId, w: &Experts) -> NodeId {
    let ex = hp
        .experts
        .as_ref()
        .expect("a layer with experts has expert hyper-parameters");
    let n_embd = hp.n_embd;
    let bias = |pick: fn(&ExpertBiases) -> &String| w.biases.as_ref().map(pick);
    let logits = b.matmul(
        &format!("ffn_moe_logits-{il}"),
        x,
        matmul_meta(&w.gate_inp, bias(|b| &b.gate_inp), n_embd, ex.n_expert),
    );
    let (ids, weights) = match ex.gating {
        Gating::Softmax => {
            let probs = b.softmax(&format!("ffn_moe_probs-{il}"), logits);
            let ids = b.top_k(&format!("ffn_moe_topk-{il}"), probs, ex.n_expert_used);
            (
                ids,
                b.moe_weights(&format!("ffn_moe_weights-{il}"), probs, ids, ex.norm_w, 1.0),
            )
        }
        Gating::SoftmaxWeight => {
            let ids = b.top_k(&format!("ffn_moe_topk-{il}"), logits, ex.n_expert_used);
            let chosen = b.moe_weights(&format!("ffn_moe_weights-{il}"), logits, ids, false, 1.0);
            // Their softmax sums to 1 already: `norm_w` has nothing left to do.
            (ids, b.softmax(&format!("ffn_moe_weights_softmax-{il}"), chosen))
        }
    };
    let id_meta = |w: &WeightRef, bias: Option<&String>, in_dim, out_dim| MatMulIdMeta {
        mm: matmul_meta(w, bias, in_dim, out_dim),
        n_expert: ex.n_expert,
    };
    let up = b.matmul_id(
        &format!("ffn_moe_up-{il}"),
        x,
        ids,
        id_meta(&w.up, bias(|b| &b.up), n_embd, ex.n_ff_exp),
    );
    let gate = b.matmul_id(
        &format!("ffn_moe_gate-{il}"),
        x,
        ids,
        id_meta(&w.gate, bias(|b| &b.gate), n_embd, ex.n_ff_exp),
    );
    let act = match ex.activation {
        Activation::Silu => {
            let act = b.silu(&format!("ffn_moe_silu-{il}"), gate);
            b.mul(&format!("ffn_moe_swiglu-{il}"), act, up)
        }
        Activation::SwigluOai { alpha, limit } => {
            b.swiglu_oai(&format!("ffn_moe_swiglu_oai-{il}"), gate, up, alpha, limit)
        }
    };
    let down = b.matmul_id(
        &format!("ffn_moe_down-{il}"),
        act,
        ids,
        id_meta(&w.down, bias(|b| &b.down), ex.n_ff_exp, n_embd),
    );
    let out = b.moe_sum(&format!("ffn_moe_out-{il}"), down, weights);
    let Some(s) = &w.shared else {
        return out;
    };
    // The shared expert, scaled per token by the sigmoid of its own gate: a one-slot weighted sum.
    let gate_logit = b.matmul(
        &format!("ffn_shexp_gate_inp-{il}"),
        x,
        matmul_meta(&s.gate_inp, None, n_embd, 1),
    );
    let gate_w = b.sigmoid(&format!("ffn_shexp_gate-{il}"), gate_logit);
    let n_ff = ex.n_ff_shexp;
    let g = b.matmul(
        &format!("ffn_shexp_gate_proj-{il}"),
        x,
        matmul_meta(&s.gate, None, n_embd, n_ff),
    );
    let u = b.matmul(&format!("ffn_shexp_up-{il}"), x, matmul_meta(&s.up, None, n_embd, n_ff));
    let act = b.silu(&format!("ffn_shexp_silu-{il}"), g);
    let act = b.mul(&format!("ffn_shexp_swiglu-{il}"), act, u);
    let shexp = b.matmul(
        &format!("ffn_shexp_down-{il}"),
        act,
        matmul_meta(&s.down, None, n_ff, n_embd),
    );
    let shexp = b.moe_sum(&format!("ffn_shexp_out-{il}"), shexp, gate_w);
    b.add(&format!("ffn_moe_shexp-{il}"), out, shexp)
}
