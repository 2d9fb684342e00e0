//! The operator vocabulary of the IR and the per-node metadata (payloads the kernels need).
//!
//! Shapes follow llama.cpp: an activation is `[d, n_tokens, 1, 1]` (feature fastest) and is
//! stored token-major; a weight named in a payload has GGUF shape `[n_in, n_out]` and is stored
//! as `n_out` rows of `n_in` values. Weights are referenced by name, never copied into the IR.

use crate::quant::GgmlType;

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// Rotate halves: dimension i pairs with i + n_rot/2 (GPT-NeoX; what Qwen uses).
    Neox,
    /// Interleaved: dimension 2i pairs with 2i + 1 (the original LLaMA layout).
    Normal,
}

/// How attention groups query heads over KV heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnMode {
    /// Grouped-query attention: query head h reads KV head h / (n_head / n_head_kv).
    Gqa,
}

/// Fusions the peephole pass may apply when a backend claims them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FusedOp {
    /// `Mul(Silu(x), y)` → `SwiGLU(x, y)`.
    SwiGLU,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A leaf filled by the host before every execution.
    Input,
    Add,
    Mul,
    Silu,
    /// `silu(src[0]) * src[1]`, produced by the fusion pass.
    SwiGLU,
    RmsNorm {
        eps: f32,
    },
    /// Per-head RMSNorm of a `[head_dim * n_head, n_tokens]` tensor (Qwen3's q/k norm).
    QkNorm {
        head_dim: usize,
        n_head: usize,
        eps: f32,
    },
    MatMul,
    /// Rows of a weight table (embedding lookup, `src = [ids]`, weight in the meta) or of an
    /// activation (`src = [x, ids]`, the tail-row selection).
    GetRows,
    /// Rotary position embedding of `src = [x, positions]`; the pairing style and frequencies are
    /// in the node's [`RopeMeta`].
    RoPE,
    /// Attention over the layer's KV cache; `src = [q, kv, positions]`. Softmax is fused in the
    /// kernel. `explicit_span`: the positions cannot bound the node (several sequences, or a
    /// window not starting at cell 0), so only a backend that reads an explicit span may take it.
    Attn {
        mode: AttnMode,
        explicit_span: bool,
    },
    /// Writes K and V rows at the cells given by the positions input; `src = [k, v, positions]`.
    /// The output is the layer's K region; V is reached through `kv_pair(layer)`.
    KvcacheStore {
        layer: usize,
    },
    /// A view of the layer's persistent K region (V through `kv_pair`); nothing to execute.
    KvcacheLoad {
        layer: usize,
    },
    /// Decode-time Q/K/V block of Qwen2, built by the model when `CParams::fuse_qkv` is on:
    /// the three projections from one activation, their biases, RoPE on Q and K, and the K/V
    /// store at the positions. `src = [x, positions]`; the output is the roped Q.
    FusedQKV {
        layer: usize,
    },
    /// Qwen3's form of [`Op::FusedQKV`]: no biases, per-head RMSNorm on Q and K before RoPE.
    FusedQkvNorm {
        layer: usize,
    },
    /// Decode-time FFN activation: `silu(gate(x)) * up(x)` from one activation, built when
    /// `CParams::fuse_ffn` is on. `src = [x]`; the output is `[n_ff, n_tokens]`.
    FusedFFN,
}

impl Op {
    /// Short name for dumps and traces.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input => "Input",
            Op::Add => "Add",
            Op::Mul => "Mul",
            Op::Silu => "Silu",
            Op::SwiGLU => "SwiGLU",
            Op::RmsNorm { .. } => "RmsNorm",
            Op::QkNorm { .. } => "QkNorm",
            Op::MatMul => "MatMul",
            Op::GetRows => "GetRows",
            Op::RoPE => "RoPE",
            Op::Attn { .. } => "Attn",
            Op::KvcacheStore { .. } => "KvcacheStore",
            Op::KvcacheLoad { .. } => "KvcacheLoad",
            Op::FusedQKV { .. } => "FusedQKV",
            Op::FusedQkvNorm { .. } => "FusedQkvNorm",
            Op::FusedFFN => "FusedFFN",
        }
    }

    /// Whether executing the node has an effect beyond its output buffer (so it is never dead).
    pub fn has_side_effect(&self) -> bool {
        matches!(
            self,
            Op::KvcacheStore { .. } | Op::FusedQKV { .. } | Op::FusedQkvNorm { .. }
        )
    }

    /// The layer whose KV regions the node touches.
    pub fn kv_layer(&self) -> Option<usize> {
        match self {
            Op::KvcacheStore { layer }
            | Op::KvcacheLoad { layer }
            | Op::FusedQKV { layer }
            | Op::FusedQkvNorm { layer } => Some(*layer),
            _ => None,
        }
    }
}

/// A weight as the IR names it: the backend resolves the name in its weight registry.
#[derive(Clone, Debug, PartialEq)]
pub struct MatMulMeta {
    pub weight_name: String,
    pub weight_type: GgmlType,
    /// Added to every output row when present (Qwen2's Q/K/V biases), F32 `[out_dim]`.
    pub bias_name: Option<String>,
    pub in_dim: usize,
    pub out_dim: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NormMeta {
    /// The multiplicative norm weight, F32 `[d]` (or `[head_dim]` for QkNorm).
    pub weight_name: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RopeMeta {
    /// How dimensions pair: a property of the model family, from its hyper-parameters.
    pub style: RopeStyle,
    pub n_head: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub freq_base: f32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct AttnMeta {
    pub layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct KvcacheMeta {
    /// Values per cell: n_head_kv * head_dim.
    pub n_kv_embd: usize,
    /// Cells per region.
    pub n_ctx: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct EmbedMeta {
    pub weight_name: String,
    pub weight_type: GgmlType,
    pub n_embd: usize,
    pub n_rows: usize,
}

/// What a fused Q/K/V node needs: the three projections (with Qwen2's biases or Qwen3's
/// per-head norm weights), the RoPE parameters and the KV geometry.
#[derive(Clone, Debug, PartialEq)]
pub struct FusedQkvMeta {
    pub q: MatMulMeta,
    pub k: MatMulMeta,
    pub v: MatMulMeta,
    /// Per-head RMSNorm weights `[head_dim]` for Q and K (Qwen3), with their epsilon.
    pub qk_norm: Option<(String, String, f32)>,
    pub rope: RopeMeta,
    pub n_head_kv: usize,
    pub kv: KvcacheMeta,
}

#[derive(Clone, Debug, PartialEq)]
pub struct FusedFfnMeta {
    pub gate: MatMulMeta,
    pub up: MatMulMeta,
}

/// Per-node metadata, a concrete enum so the structural check can compare it.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeMeta {
    None,
    MatMul(MatMulMeta),
    Norm(NormMeta),
    Rope(RopeMeta),
    Attn(AttnMeta),
    Kvcache(KvcacheMeta),
    Embed(EmbedMeta),
    FusedQkv(FusedQkvMeta),
    FusedFfn(FusedFfnMeta),
}
