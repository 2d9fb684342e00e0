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

/// What a graph input holds, so that the engine fills each from a batch by kind (llama.cpp's
/// `llm_graph_input_*` with `set_input`) rather than finding buffers by name. All are I32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InputKind {
    /// `[n_tokens]`: the token ids.
    TokenIds,
    /// `[n_tokens]`: each token's position in its sequence (RoPE, causality).
    Positions,
    /// `[n_tokens]`: the KV cell each token's K and V are stored in.
    KvCells,
    /// `[n_out]`: the batch rows whose logits are wanted (llama.cpp's `inp_out_ids`), present
    /// when fewer rows than tokens are.
    OutIds,
    /// `[n_ctx * n_seq_max]`: the cells each sequence of the batch may attend to, ordered by
    /// position, one sequence's list after another (explicit-span attention only).
    KvIndex,
    /// `[2, n_tokens]`: per token, the offset of its sequence's list in [`InputKind::KvIndex`]
    /// and how many of its cells it sees (explicit-span attention only).
    KvSpan,
    /// [`InputKind::KvCells`] of the window cache (llama.cpp's ISWA cache): the cell each
    /// token's K and V take in the windowed layers' smaller regions.
    KvCellsSwa,
    /// [`InputKind::KvIndex`] of the window cache (always explicit once it wraps).
    KvIndexSwa,
    /// [`InputKind::KvSpan`] of the window cache.
    KvSpanSwa,
}

impl InputKind {
    /// The input node's name.
    pub fn name(self) -> &'static str {
        match self {
            InputKind::TokenIds => "token_ids",
            InputKind::Positions => "positions",
            InputKind::KvCells => "kv_cells",
            InputKind::OutIds => "out_ids",
            InputKind::KvIndex => "kv_index",
            InputKind::KvSpan => "kv_span",
            InputKind::KvCellsSwa => "kv_cells_swa",
            InputKind::KvIndexSwa => "kv_index_swa",
            InputKind::KvSpanSwa => "kv_span_swa",
        }
    }
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
    /// The decode Q/K/V block as one [`Op::FusedQKV`] node, built by the shared blocks when the
    /// backend that runs the layers claims it.
    DecodeQkv,
    /// The decode FFN's gate, up and SwiGLU as one [`Op::FusedFFN`] node, likewise.
    DecodeFfn,
}

/// What a node computes. `src` lists the operands in order; the weights it reads are named in
/// the node's [`NodeMeta`].
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A leaf filled by the host before every execution.
    Input,
    /// `src[0] + src[1]`, element-wise over equal shapes (the residual adds; ggml's `add`).
    Add,
    /// `src[0] * src[1]`, element-wise over equal shapes (ggml's `mul`).
    Mul,
    /// `x * sigmoid(x)` of `src[0]` (ggml's `silu`).
    Silu,
    /// `silu(src[0]) * src[1]`, produced by the fusion pass.
    SwiGLU,
    /// gpt-oss's clamped SwiGLU of `src = [gate, up]` (ggml's `swiglu_oai`): with `g = min(gate,
    /// limit)` and `u = clamp(up, -limit, limit)`, `g / (1 + exp(-alpha g)) * (u + 1)`.
    SwigluOai {
        /// The sigmoid's slope (1.702 for gpt-oss).
        alpha: f32,
        /// The clamp (7 for gpt-oss).
        limit: f32,
    },
    /// `1 / (1 + exp(-x))` of `src[0]`, element-wise (ggml's `sigmoid`: Qwen2-MoE's shared-expert
    /// gate).
    Sigmoid,
    /// Softmax of each ne0 row of `src[0]` (ggml's `soft_max` without mask or scale: the
    /// mixture-of-experts router's probabilities).
    Softmax,
    /// The indices of the `k` largest values of each ne0 row of `src[0]`, largest first, as
    /// I32 `[k, rows]` (ggml's `argsort_top_k`); equal values keep index order (lower first).
    TopK {
        /// How many indices each row keeps (a router's `n_expert_used`).
        k: usize,
    },
    /// The experts' weights of each token: row `t` of `src[0]` (`[n_expert, n_tokens]`, the
    /// router's probabilities) at the indices of row `t` of `src[1]` (I32 `[k, n_tokens]`),
    /// then, with `norm`, divided by their sum (clamped below at 2^-14, as llama.cpp does) and
    /// multiplied by `scale` (1 for most models). Output `[k, n_tokens]` (ggml's `get_rows`,
    /// `sum_rows`, `clamp`, `div`, `scale` of `build_moe_ffn`).
    MoeWeights {
        /// Normalize the k weights to sum 1 (Mixtral, Qwen3-MoE; not Qwen2-MoE).
        norm: bool,
        /// The factor of every weight after normalizing (`expert_weights_scale`).
        scale: f32,
    },
    /// A matrix product indexed by expert (ggml's `mul_mat_id`): `src = [x, ids]`, the ids
    /// I32 `[k, n_tokens]`; for token `t` and slot `s`, output row `(s, t)` is expert
    /// `ids[s, t]`'s matrix (a slice of the 3-D weight in the [`MatMulIdMeta`]) times x's row —
    /// row `t` when x is `[n_in, n_tokens]` (the same input for every slot), row `(s, t)` when
    /// x is `[n_in, k, n_tokens]`. Output `[n_out, k, n_tokens]`. Only the chosen experts'
    /// rows are read.
    MatMulId,
    /// The weighted sum of each token's expert outputs: `src = [experts, weights]`, experts
    /// `[d, k, n_tokens]` and weights `[k, n_tokens]`; output `[d, n_tokens]` is
    /// `e_0 w_0 + e_1 w_1 + ...`, each product rounded, then added in slot order (ggml's `mul`
    /// and the chain of `add`s of `build_moe_ffn`).
    MoeSum,
    /// GELU (tanh approximation) of `src[0]`, as ggml's CPU computes it (`GGML_GELU_FP16`): the
    /// input rounded to f16 and the f16 result of `0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))`
    /// read back, with x <= -10 giving 0 and x >= 10 giving x (Gemma's FFN activation).
    Gelu,
    /// `src[0] * scale`, element-wise (ggml's `scale`: Granite's embedding, residual and logit
    /// scales).
    Scale {
        /// The constant factor.
        scale: f32,
    },
    /// `cap * tanh(src[0] / cap)`, element-wise: Gemma 2's final logit soft-capping, as ggml
    /// computes it (`scale` by `1 / cap`, `tanh`, `scale` by `cap`, each rounded to f32).
    Softcap {
        /// The cap (`final_logit_softcapping`).
        cap: f32,
    },
    /// RMS normalization of each ne0 row of `src[0]`, times the optional weight in the
    /// [`NormMeta`] (ggml's `rms_norm` followed by `mul`).
    RmsNorm {
        /// Added to the mean square before the square root (`attention.layer_norm_rms_epsilon`).
        eps: f32,
    },
    /// Per-head RMSNorm of a `[head_dim * n_head, n_tokens]` tensor (Qwen3's q/k norm).
    QkNorm {
        /// Width of one head: each head's span is normalized on its own.
        head_dim: usize,
        /// Heads per row: the row width over `head_dim`.
        n_head: usize,
        /// Added to the mean square before the square root.
        eps: f32,
    },
    /// `src[0] @ W^T (+ bias)`: `[n_in, n_tokens]` → `[n_out, n_tokens]`, with W and the bias named
    /// in the [`MatMulMeta`] (ggml's `mul_mat`).
    MatMul,
    /// Rows of a weight table (embedding lookup, `src = [ids]`, weight in the meta) or of an
    /// activation (`src = [x, ids]`, the tail-row selection).
    GetRows,
    /// Rotary position embedding of `src = [x, positions]`; the pairing style and frequencies are
    /// in the node's [`RopeMeta`].
    RoPE,
    /// Attention over the layer's KV cache; `src = [q, kv, positions]`, where token `t` sees
    /// cells `0..=positions[t]`. Softmax is fused in the kernel. `explicit_span`: the positions
    /// cannot bound the node (several sequences, or cells not in position order), so the node
    /// reads `src = [q, kv, positions, kv_index, kv_span]` ([`InputKind::KvIndex`],
    /// [`InputKind::KvSpan`]) and only a backend that reads an explicit span may take it.
    Attn {
        /// How query heads share KV heads.
        mode: AttnMode,
        /// Set when the positions alone cannot bound the attended cells (see above).
        explicit_span: bool,
        /// Set when each head's softmax has a learned sink logit ([`AttnMeta::sinks`]), so that a
        /// backend whose attention has none can decline the node.
        sinks: bool,
    },
    /// Writes K and V rows at the cells given by the KV-cells input; `src = [k, v, kv_cells]`.
    /// The output is the layer's K region; V is reached through `kv_pair(layer)`.
    KvcacheStore {
        /// The layer whose K and V regions are written.
        layer: usize,
    },
    /// A view of the layer's persistent K region (V through `kv_pair`); nothing to execute.
    KvcacheLoad {
        /// The layer whose K and V regions are viewed.
        layer: usize,
    },
    /// Decode-time Q/K/V block of Qwen2, built by the model when `CParams::fuse_qkv` is on:
    /// the three projections from one activation, their biases, RoPE on Q and K, and the K/V
    /// store at the cells. `src = [x, positions, kv_cells]`; the output is the roped Q.
    FusedQKV {
        /// The layer whose K and V regions the node writes.
        layer: usize,
    },
    /// Qwen3's form of [`Op::FusedQKV`]: no biases, per-head RMSNorm on Q and K before RoPE.
    FusedQkvNorm {
        /// The layer whose K and V regions the node writes.
        layer: usize,
    },
    /// Decode-time FFN activation: `silu(gate(x)) * up(x)` from one activation, built when
    /// `CParams::fuse_ffn` is on. `src = [x]`; the output is `[n_ff, n_tokens]`.
    FusedFFN,
}

impl Op {
    /// One op of each kind, with placeholder payloads: the IR's vocabulary, which conformance
    /// tests walk so that no op escapes them. The match below names every kind without a
    /// wildcard, so a new op is a compile error here until it is listed.
    pub fn every() -> Vec<Op> {
        let every = vec![
            Op::Input,
            Op::Add,
            Op::Mul,
            Op::Silu,
            Op::SwiGLU,
            Op::SwigluOai { alpha: 1.0, limit: 1.0 },
            Op::Sigmoid,
            Op::Softmax,
            Op::TopK { k: 1 },
            Op::MoeWeights {
                norm: false,
                scale: 1.0,
            },
            Op::MatMulId,
            Op::MoeSum,
            Op::Gelu,
            Op::Scale { scale: 1.0 },
            Op::Softcap { cap: 1.0 },
            Op::RmsNorm { eps: 0.0 },
            Op::QkNorm {
                head_dim: 0,
                n_head: 0,
                eps: 0.0,
            },
            Op::MatMul,
            Op::GetRows,
            Op::RoPE,
            Op::Attn {
                mode: AttnMode::Gqa,
                explicit_span: false,
                sinks: false,
            },
            Op::KvcacheStore { layer: 0 },
            Op::KvcacheLoad { layer: 0 },
            Op::FusedQKV { layer: 0 },
            Op::FusedQkvNorm { layer: 0 },
            Op::FusedFFN,
        ];
        for op in &every {
            match op {
                Op::Input
                | Op::Add
                | Op::Mul
                | Op::Silu
                | Op::SwiGLU
                | Op::SwigluOai { .. }
                | Op::Sigmoid
                | Op::Softmax
                | Op::TopK { .. }
                | Op::MoeWeights { .. }
                | Op::MatMulId
                | Op::MoeSum
                | Op::Gelu
                | Op::Scale { .. }
                | Op::Softcap { .. }
                | Op::RmsNorm { .. }
                | Op::QkNorm { .. }
                | Op::MatMul
                | Op::GetRows
                | Op::RoPE
                | Op::Attn { .. }
                | Op::KvcacheStore { .. }
                | Op::KvcacheLoad { .. }
                | Op::FusedQKV { .. }
                | Op::FusedQkvNorm { .. }
                | Op::FusedFFN => {}
            }
        }
        every
    }

    /// Short name for dumps and traces.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input => "Input",
            Op::Add => "Add",
            Op::Mul => "Mul",
            Op::Silu => "Silu",
            Op::SwiGLU => "SwiGLU",
            Op::SwigluOai { .. } => "SwigluOai",
            Op::Sigmoid => "Sigmoid",
            Op::Softmax => "Softmax",
            Op::TopK { .. } => "TopK",
            Op::MoeWeights { .. } => "MoeWeights",
            Op::MatMulId => "MatMulId",
            Op::MoeSum => "MoeSum",
            Op::Gelu => "Gelu",
            Op::Scale { .. } => "Scale",
            Op::Softcap { .. } => "Softcap",
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
    /// GGUF tensor name, e.g. `blk.0.attn_q.weight`.
    pub weight_name: String,
    /// The weight's GGML type (F32, F16, Q8_0, Q4_K, ...): it picks the dot product and the
    /// activations' `vec_dot_type`.
    pub weight_type: GgmlType,
    /// Added to every output row when present (Qwen2's Q/K/V biases), F32 `[out_dim]`.
    pub bias_name: Option<String>,
    /// n_in: the weight's ne0, and the width of the input rows.
    pub in_dim: usize,
    /// n_out: the weight's ne1, and the width of the output rows.
    pub out_dim: usize,
}

/// The experts' weights of a [`Op::MatMulId`]: one 3-D tensor of GGUF shape
/// `[in_dim, out_dim, n_expert]`, expert `e` the `out_dim` rows from row `e * out_dim`.
#[derive(Clone, Debug, PartialEq)]
pub struct MatMulIdMeta {
    /// The weight as one expert's matrix: its name and type, `in_dim` and `out_dim` per expert,
    /// and an optional F32 bias of GGUF shape `[out_dim, n_expert]`, row `e` added to expert
    /// `e`'s outputs (ggml's `add_id`).
    pub mm: MatMulMeta,
    /// Experts in the tensor (its ne2); every id must be below it.
    pub n_expert: usize,
}

/// Payload of an RmsNorm or QkNorm node.
#[derive(Clone, Debug, PartialEq)]
pub struct NormMeta {
    /// The multiplicative norm weight, F32 `[d]` (or `[head_dim]` for QkNorm).
    pub weight_name: Option<String>,
}

/// Payload of a RoPE node, and of the RoPE step of a fused Q/K/V node.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeMeta {
    /// How dimensions pair: a property of the model family, from its hyper-parameters.
    pub style: RopeStyle,
    /// Heads in the rotated tensor: n_head for Q, n_head_kv for K.
    pub n_head: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Leading dimensions of each head that rotate (`rope.dimension_count`); the rest pass through.
    pub n_rot: usize,
    /// Base of the rotation frequencies, `theta_i = pos * freq_base^(-2i / n_rot)` (`rope.freq_base`).
    pub freq_base: f32,
    /// Linear position scaling (`rope.scaling.type = linear`): every angle is multiplied by it
    /// (1 / `rope.scaling.factor`); 1 when the model does not scale.
    pub freq_scale: f32,
    /// An F32 weight of n_rot / 2 values that divide pair i's angle (llama.cpp's `freq_factors`:
    /// Llama 3.1's `rope_freqs.weight`), named as every weight is; `None` divides by 1.
    pub freq_factors: Option<String>,
    /// Multiplies every cos and sin (ggml's `attn_factor`, YaRN's and LongRoPE's magnitude
    /// scaling: Phi-3's `rope.scaling.attn_factor`); 1 for most models. With YaRN it already
    /// holds the `1 + 0.1 ln(1 / freq_scale)` ggml's kernel multiplies in, so every backend
    /// scales by this one value and a K-shift (1 here) only rotates.
    pub attn_factor: f32,
    /// YaRN's extension (`rope.scaling.type = yarn`): pairs between the correction dimensions
    /// blend the scaled angle with the unscaled one; `None` without.
    pub yarn: Option<YarnMeta>,
}

/// YaRN's per-pair blend of a RoPE node (ggml's `rope_yarn`), fixed when the graph is built.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnMeta {
    /// How much of the unscaled angle the ramp mixes in (llama.cpp's `yarn_ext_factor`: 1 for a
    /// YaRN model).
    pub ext_factor: f32,
    /// The pairs where the ramp runs from 1 (below `corr_dims[0]`: the unscaled angle) to 0
    /// (above `corr_dims[1]`: the scaled one), from [`YarnMeta::corr_dims`].
    pub corr_dims: [f32; 2],
}

impl YarnMeta {
    /// ggml's `ggml_rope_yarn_corr_dims`: the first and last pair whose wavelength lies between
    /// `n_ctx_orig / beta_fast` and `n_ctx_orig / beta_slow` rotations, in f32 as ggml computes
    /// them (the same rounding gives the same ramp).
    pub fn corr_dims(n_rot: usize, n_ctx_orig: usize, freq_base: f32, beta_fast: f32, beta_slow: f32) -> [f32; 2] {
        let dim = |beta: f32| {
            n_rot as f32 * (n_ctx_orig as f32 / (beta * 2.0 * std::f32::consts::PI)).ln() / (2.0 * freq_base.ln())
        };
        [
            dim(beta_fast).floor().max(0.0),
            dim(beta_slow).ceil().min(n_rot as f32 - 1.0),
        ]
    }

    /// Pair `i`'s angle from its unscaled one `extrap` and scaled one `interp` (ggml's
    /// `rope_yarn` with `rope_yarn_ramp`).
    #[inline]
    pub fn angle(&self, i: usize, extrap: f32, interp: f32) -> f32 {
        let [low, high] = self.corr_dims;
        let y = (i as f32 - low) / (high - low).max(0.001);
        let ramp_mix = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
        interp * (1.0 - ramp_mix) + extrap * ramp_mix
    }
}

impl RopeMeta {
    /// `freq_base^(-2 / n_rot)` in f32: the ratio of consecutive pairs' unscaled angles, built up
    /// by repeated multiplication as ggml's rope cache does (every backend uses this one value).
    pub fn theta_scale(&self) -> f32 {
        self.freq_base.powf(-2.0 / self.n_rot as f32)
    }

    /// Pair `i`'s angle from its unscaled one `theta` (`p * theta_scale^i`), as ggml's
    /// `rope_yarn` computes it without YaRN extension: `freq_scale * (theta / factor_i)`.
    /// Multiplying and dividing by 1 is exact, so an unscaled model's angles are `theta` itself.
    /// With YaRN, pair `i`'s angle blends this with the unscaled `theta / factor_i`.
    #[inline]
    pub fn angle(&self, i: usize, theta: f32, factor: f32) -> f32 {
        let extrap = theta / factor;
        let interp = self.freq_scale * extrap;
        match &self.yarn {
            Some(y) => y.angle(i, extrap, interp),
            None => interp,
        }
    }
}

/// Payload of an Attn node: which cache, and the head geometry.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnMeta {
    /// The layer whose KV cache is attended.
    pub layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// KV heads; each serves n_head / n_head_kv query heads.
    pub n_head_kv: usize,
    /// Width of one head of Q, K and V.
    pub head_dim: usize,
    /// The factor of the scores `q · k` before the softmax: `1 / sqrt(head_dim)` for most
    /// models, a file's own value for others (Granite's `attention.scale`).
    pub kq_scale: f32,
    /// Attention logit soft-capping (Gemma 2's `attn_logit_softcapping`): each scaled score
    /// `s` becomes `cap * tanh(s / cap)` before the softmax; `None` for most models.
    pub softcap: Option<f32>,
    /// Sliding-window attention (llama.cpp's `LLAMA_SWA_TYPE_STANDARD`): a token at position p
    /// sees only the cells of positions above `p - n_swa`; `None` sees the whole prefix.
    pub n_swa: Option<usize>,
    /// Attention sinks (gpt-oss's `attn_sinks.weight`): an F32 weight of one logit per query
    /// head, added to that head's softmax denominator as `exp(sink - max)`; `None` for most
    /// models.
    pub sinks: Option<String>,
}

/// Geometry of a layer's persistent K and V regions: `n_ctx` cells of `n_kv_embd` values each.
#[derive(Clone, Debug, PartialEq)]
pub struct KvcacheMeta {
    /// Values per cell: n_head_kv * head_dim.
    pub n_kv_embd: usize,
    /// Cells per region.
    pub n_ctx: usize,
    /// How the K region stores its values.
    pub type_k: super::DType,
    /// How the V region stores its values.
    pub type_v: super::DType,
}

/// Payload of an embedding GetRows: the weight table the ids index.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbedMeta {
    /// The table's GGUF name (`token_embd.weight`).
    pub weight_name: String,
    /// The table's GGML type; rows are dequantized to f32.
    pub weight_type: GgmlType,
    /// Row width: the table's ne0.
    pub n_embd: usize,
    /// Rows in the table (n_vocab, its ne1); every id must be below it.
    pub n_rows: usize,
}

/// What a fused Q/K/V node needs: the three projections (with Qwen2's biases or Qwen3's
/// per-head norm weights), the RoPE parameters and the KV geometry.
#[derive(Clone, Debug, PartialEq)]
pub struct FusedQkvMeta {
    /// Q projection: GGUF shape `[n_embd, n_head * head_dim]`.
    pub q: MatMulMeta,
    /// K projection: GGUF shape `[n_embd, n_head_kv * head_dim]`.
    pub k: MatMulMeta,
    /// V projection: same shape as K.
    pub v: MatMulMeta,
    /// Per-head RMSNorm weights `[head_dim]` for Q and K (Qwen3), with their epsilon.
    pub qk_norm: Option<(String, String, f32)>,
    /// RoPE of Q (its n_head); K is rotated the same way over `n_head_kv` heads.
    pub rope: RopeMeta,
    /// KV heads, for rotating K.
    pub n_head_kv: usize,
    /// The layer's KV regions that the roped K and the V are stored in.
    pub kv: KvcacheMeta,
}

/// Payload of a FusedFFN node: the two projections, both GGUF shape `[n_embd, n_ff]`.
#[derive(Clone, Debug, PartialEq)]
pub struct FusedFfnMeta {
    /// `ffn_gate`: its output goes through SiLU.
    pub gate: MatMulMeta,
    /// `ffn_up`: multiplies the activated gate.
    pub up: MatMulMeta,
}

/// Per-node metadata, a concrete enum so the structural check can compare it.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeMeta {
    /// No payload: a named Input, Add, Mul, Silu, SwiGLU, and GetRows over an activation.
    None,
    /// What a typed Input holds.
    Input(InputKind),
    /// The weight (and bias) of a MatMul.
    MatMul(MatMulMeta),
    /// The experts' weight (and bias) of a MatMulId.
    MatMulId(MatMulIdMeta),
    /// The weight of an RmsNorm or QkNorm.
    Norm(NormMeta),
    /// The rotation of a RoPE.
    Rope(RopeMeta),
    /// The cache and head geometry of an Attn.
    Attn(AttnMeta),
    /// The region geometry of a KvcacheStore or KvcacheLoad.
    Kvcache(KvcacheMeta),
    /// The table of an embedding GetRows.
    Embed(EmbedMeta),
    /// Everything a FusedQKV or FusedQkvNorm computes.
    FusedQkv(Box<FusedQkvMeta>),
    /// The projections of a FusedFFN.
    FusedFfn(FusedFfnMeta),
}

#[cfg(test)]
mod tests {
    use super::Op;

    #[test]
    fn every_op_kind_is_listed_once() {
        let names: Vec<&str> = Op::every().iter().map(Op::name).collect();
        let mut distinct = names.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
    }
}
