//! Building blocks the architectures share, in llama.cpp's `llm_graph_context` spirit: the
//! inputs and embedding, the attention tail (RoPE, KV store, attention, output projection),
//! the tail-row reduction, the SwiGLU FFN and the output head. A model file composes these
//! and adds only what makes it different.

use super::HParams;
use crate::graph::*;
use crate::quant::GgmlType;

/// A weight by name and type.
pub type WeightRef = (String, GgmlType);

/// The graph's inputs, typed ([`InputKind`]) so the engine fills them from its batch, and
/// declared at the head of the graph so they never cut a device run.
pub struct Inputs {
    /// Token ids.
    pub token_ids: NodeId, // I32 [n_tokens]
    /// Each token's position in its sequence.
    pub positions: NodeId, // I32 [n_tokens]
    /// The KV cell each token's K and V go to.
    pub kv_cells: NodeId, // I32 [n_tokens]
    /// The rows whose logits are wanted; `None` when every token's are.
    pub out_ids: Option<NodeId>, // I32 [n_out]
    /// The cells each token attends to, when the positions cannot say (`explicit_span`).
    pub span: Option<(NodeId, NodeId)>, // I32 [n_ctx * n_seq_max], I32 [2, n_tokens]
    /// The window cache's own cells and spans, when the session keeps one (`n_ctx_swa > 0`):
    /// the windowed layers store and attend through these instead.
    pub swa: Option<(NodeId, Option<(NodeId, NodeId)>)>,
}

impl Inputs {
    /// Layer `il`'s KV cells and attention spans: the window cache's for a windowed layer
    /// when the session keeps one, else the full cache's.
    pub fn layer(&self, hp: &HParams, il: usize) -> (NodeId, Option<(NodeId, NodeId)>) {
        match self.swa {
            Some(swa) if hp.is_swa(il) => swa,
            _ => (self.kv_cells, self.span),
        }
    }
}

/// Declare the graph's inputs for `params` (`out_ids` only when n_out < n_tokens, the span
/// lists only with `explicit_span`).
pub fn inputs(b: &mut GraphBuilder, params: &GraphParams) -> Inputs {
    let nt = params.n_tokens;
    let n_out = params.n_out.min(nt);
    let cparams = &params.cparams;
    let token_ids = b.typed_input(InputKind::TokenIds, [nt, 1, 1, 1]);
    let positions = b.typed_input(InputKind::Positions, [nt, 1, 1, 1]);
    let kv_cells = b.typed_input(InputKind::KvCells, [nt, 1, 1, 1]);
    let out_ids = (n_out < nt).then(|| b.typed_input(InputKind::OutIds, [n_out, 1, 1, 1]));
    let span = cparams.explicit_span.then(|| {
        let per_seq = cparams.n_ctx_seq.min(cparams.n_ctx);
        let index = b.typed_input(InputKind::KvIndex, [per_seq * cparams.n_seq_max, 1, 1, 1]);
        (index, b.typed_input(InputKind::KvSpan, [2, nt, 1, 1]))
    });
    let swa = (cparams.n_ctx_swa > 0).then(|| {
        let cells = b.typed_input(InputKind::KvCellsSwa, [nt, 1, 1, 1]);
        let span = cparams.explicit_span_swa.then(|| {
            // A cell shared by several sequences is listed once per sequence.
            let index = b.typed_input(InputKind::KvIndexSwa, [cparams.n_ctx_swa * cparams.n_seq_max, 1, 1, 1]);
            (index, b.typed_input(InputKind::KvSpanSwa, [2, nt, 1, 1]))
        });
        (cells, span)
    });
    Inputs {
        token_ids,
        positions,
        kv_cells,
        out_ids,
        span,
        swa,
    }
}

/// `F32 [n_embd, n_tokens]` rows of the token embedding, times the model's embedding scale
/// where it has one.
pub fn embedding(b: &mut GraphBuilder, hp: &HParams, ids: NodeId, table_type: GgmlType) -> NodeId {
    let meta = EmbedMeta {
        weight_name: "token_embd.weight".into(),
        weight_type: table_type,
        n_embd: hp.n_embd,
        n_rows: hp.n_vocab,
    };
    let x = b.embedding("token_embd", ids, meta);
    match hp.embedding_scale {
        Some(s) => b.scale("token_embd_scaled", x, s),
        None => x,
    }
}

/// `residual + branch` (`{kind}_residual-{il}`), the branch first multiplied by the model's
/// residual scale where it has one (Granite).
pub(crate) fn residual_add(
    b: &mut GraphBuilder,
    hp: &HParams,
    kind: &str,
    il: usize,
    residual: NodeId,
    branch: NodeId,
) -> NodeId {
    let branch = match hp.residual_scale {
        Some(s) => b.scale(&format!("{kind}_scaled-{il}"), branch, s),
        None => branch,
    };
    b.add(&format!("{kind}_residual-{il}"), residual, branch)
}

/// The [`MatMulMeta`] of weight `(name, type)` with GGUF shape `[in_dim, out_dim]` and an
/// optional F32 `[out_dim]` bias.
pub fn matmul_meta((name, ty): &WeightRef, bias: Option<&String>, in_dim: usize, out_dim: usize) -> MatMulMeta {
    MatMulMeta {
        weight_name: name.clone(),
        weight_type: *ty,
        bias_name: bias.cloned(),
        in_dim,
        out_dim,
    }
}

/// From projected Q, K, V to the attention output projection: RoPE (the model's style) on Q
/// and K at the positions, the KV store at the cells, attention over the layer's cache, and
/// `wo`.
pub fn attention(
    b: &mut GraphBuilder,
    hp: &HParams,
    params: &GraphParams,
    il: usize,
    inp: &Inputs,
    (q, k, v): (NodeId, NodeId, NodeId),
    wo: MatMulMeta,
) -> NodeId {
    let kv_meta = kv_meta(hp, params, il);
    let n_ctx_seq = n_ctx_seq(params);
    let q = b.rope(
        &format!("q_rope-{il}"),
        q,
        inp.positions,
        rope_meta(hp, il, hp.n_head, n_ctx_seq),
    );
    let k = b.rope(
        &format!("k_rope-{il}"),
        k,
        inp.positions,
        rope_meta(hp, il, hp.n_head_kv, n_ctx_seq),
    );
    b.kvcache_store(&format!("kv_store-{il}"), il, k, v, inp.layer(hp, il).0, kv_meta);
    attend(b, hp, params, il, inp, q, wo)
}

/// A layer's self-attention from its normed input: the Q/K/V projections (`qkv`, biases in
/// their metas), the per-head norms of Q and K when the architecture has them (`qk_norm`: the
/// Q and K norm weights and eps), RoPE, the KV store, attention and `wo`. A decode step whose
/// session asked for the QKV fusion gets the fused node instead; the architecture does not
/// know which.
#[allow(clippy::too_many_arguments)]
pub fn self_attention(
    b: &mut GraphBuilder,
    hp: &HParams,
    params: &GraphParams,
    il: usize,
    inp: &Inputs,
    normed: NodeId,
    (q, k, v): (MatMulMeta, MatMulMeta, MatMulMeta),
    qk_norm: Option<(String, String, f32)>,
    wo: MatMulMeta,
) -> NodeId {
    if fuse_qkv(params) {
        return fused_attention(b, hp, params, il, inp, normed, (q, k, v), qk_norm, wo);
    }
    let mut q = b.matmul(&format!("q-{il}"), normed, q); // F32 [hd * n_head, nt]
    let mut k = b.matmul(&format!("k-{il}"), normed, k); // F32 [hd * n_head_kv, nt]
    let v = b.matmul(&format!("v-{il}"), normed, v);
    if let Some((q_norm, k_norm, eps)) = qk_norm {
        q = b.qk_norm(&format!("q_norm-{il}"), q, &q_norm, hp.head_dim, eps);
        k = b.qk_norm(&format!("k_norm-{il}"), k, &k_norm, hp.head_dim, eps);
    }
    attention(b, hp, params, il, inp, (q, k, v), wo)
}

/// Attention of an already roped Q over the layer's cache (whose K/V this step were stored
/// before), then `wo`.
pub fn attend(
    b: &mut GraphBuilder,
    hp: &HParams,
    params: &GraphParams,
    il: usize,
    inp: &Inputs,
    q: NodeId,
    wo: MatMulMeta,
) -> NodeId {
    // Built after the store, so build order runs the store first.
    let kv = b.kvcache_load(&format!("kv_load-{il}"), il, kv_meta(hp, params, il));
    let q = match hp.q_scale {
        Some(s) => b.scale(&format!("q_scaled-{il}"), q, s),
        None => q,
    };
    let meta = AttnMeta {
        layer: il,
        n_head: hp.n_head,
        n_head_kv: hp.n_head_kv,
        head_dim: hp.head_dim,
        kq_scale: hp.kq_scale,
        softcap: hp.attn_softcap,
        n_swa: hp.swa_window(il),
        sinks: hp.attn_sinks.then(|| format!("blk.{il}.attn_sinks.weight")),
    };
    let attn = b.attn(&format!("attn-{il}"), q, kv, inp.positions, inp.layer(hp, il).1, meta);
    b.matmul(&format!("attn_out-{il}"), attn, wo)
}

/// The [`RopeMeta`] of layer `il`'s RoPE over `n_head` heads (n_head for Q, n_head_kv for K) in a
/// context of `n_ctx_seq` cells per sequence, which picks LongRoPE's factors as llama.cpp's
/// `get_rope_factors` does: the long ones above the original context, else the short ones. A
/// windowed layer rotates with its own base and scale (llama.cpp's `get_rope_freq_base` /
/// `get_rope_freq_scale`).
pub fn rope_meta(hp: &HParams, il: usize, n_head: usize, n_ctx_seq: usize) -> RopeMeta {
    let freq_factors = hp.rope_freq_factors.clone().or_else(|| {
        hp.rope_long_short.as_ref().map(|l| match n_ctx_seq > l.n_ctx_orig {
            true => l.long.clone(),
            false => l.short.clone(),
        })
    });
    let (freq_base, freq_scale) = match hp.is_swa(il) {
        true => (hp.rope_freq_base_swa, hp.rope_freq_scale_swa),
        false => (hp.rope_freq_base, hp.rope_freq_scale),
    };
    // YaRN's magnitude: ggml's kernel multiplies its `attn_factor` by `1 + 0.1 ln(1 / scale)`;
    // the product is taken here, once, in the same f32 order.
    let (attn_factor, yarn) = match &hp.rope_yarn {
        Some(y) => (
            hp.rope_attn_factor * (1.0 + 0.1 * (1.0 / freq_scale).ln()),
            Some(YarnMeta {
                ext_factor: y.ext_factor,
                corr_dims: YarnMeta::corr_dims(hp.n_rot, y.n_ctx_orig, freq_base, y.beta_fast, y.beta_slow),
            }),
        ),
        None => (hp.rope_attn_factor, None),
    };
    RopeMeta {
        style: hp.rope_style,
        n_head,
        head_dim: hp.head_dim,
        n_rot: hp.n_rot,
        freq_base,
        freq_scale,
        freq_factors,
        attn_factor,
        yarn,
    }
}

/// The metas of a SwiGLU FFN's gate, up and down weights (GGUF shapes `[n_embd, n_ff]` twice
/// and `[n_ff, n_embd]`), each with its optional bias.
pub fn ffn_metas(
    hp: &HParams,
    (gate, up, down): (&WeightRef, &WeightRef, &WeightRef),
    (gate_b, up_b, down_b): (Option<&String>, Option<&String>, Option<&String>),
) -> (MatMulMeta, MatMulMeta, MatMulMeta) {
    (
        matmul_meta(gate, gate_b, hp.n_embd, hp.n_ff),
        matmul_meta(up, up_b, hp.n_embd, hp.n_ff),
        matmul_meta(down, down_b, hp.n_ff, hp.n_embd),
    )
}

/// The meta of the attention output projection `wo` (GGUF shape `[n_head * head_dim, n_embd]`)
/// with its optional bias.
pub fn wo_meta(hp: &HParams, wo: &WeightRef, bias: Option<&String>) -> MatMulMeta {
    matmul_meta(wo, bias, hp.n_head * hp.head_dim, hp.n_embd)
}

/// The cells one sequence may hold (llama.cpp's `n_ctx_seq`).
pub fn n_ctx_seq(params: &GraphParams) -> usize {
    params.cparams.n_ctx_seq.min(params.cparams.n_ctx)
}

/// The geometry of layer `il`'s KV regions: n_kv_embd values per cell, n_ctx cells (the
/// window cache's `n_ctx_swa` for a windowed layer when the session keeps one).
pub fn kv_meta(hp: &HParams, params: &GraphParams, il: usize) -> KvcacheMeta {
    let c = &params.cparams;
    KvcacheMeta {
        n_kv_embd: hp.n_kv_embd(),
        n_ctx: if c.n_ctx_swa > 0 && hp.is_swa(il) {
            c.n_ctx_swa
        } else {
            c.n_ctx
        },
        type_k: params.cparams.type_k,
        type_v: params.cparams.type_v,
    }
}

/// Whether this graph uses the decode fusions: one token, and the flag on (the flags are part
/// of the reuse identity, so a graph never mixes).
fn fuse_qkv(params: &GraphParams) -> bool {
    params.gtype == GraphType::Decode && params.cparams.fuse_qkv
}

/// Whether this graph uses the decode FFN fusion: one token, and the flag on.
fn fuse_ffn(params: &GraphParams) -> bool {
    params.gtype == GraphType::Decode && params.cparams.fuse_ffn
}

/// The decode Q/K/V block as one fused node (projections, optional biases or per-head norms,
/// RoPE, KV store), followed by attention. `qkv` are the projections' metas.
#[allow(clippy::too_many_arguments)]
fn fused_attention(
    b: &mut GraphBuilder,
    hp: &HParams,
    params: &GraphParams,
    il: usize,
    inp: &Inputs,
    normed: NodeId,
    (q, k, v): (MatMulMeta, MatMulMeta, MatMulMeta),
    qk_norm: Option<(String, String, f32)>,
    wo: MatMulMeta,
) -> NodeId {
    let meta = FusedQkvMeta {
        q,
        k,
        v,
        qk_norm,
        rope: rope_meta(hp, il, hp.n_head, n_ctx_seq(params)),
        n_head_kv: hp.n_head_kv,
        kv: kv_meta(hp, params, il),
    };
    let q = b.fused_qkv(
        &format!("qkv-{il}"),
        il,
        normed,
        (inp.positions, inp.layer(hp, il).0),
        meta,
    );
    attend(b, hp, params, il, inp, q, wo)
}

/// The residual add after attention. On the last layer, with output ids, only the rows whose
/// logits are wanted go on (llama.cpp's `inp_out_ids`), so the last FFN and the head run on
/// n_out rows.
pub fn attention_residual(
    b: &mut GraphBuilder,
    hp: &HParams,
    il: usize,
    last: bool,
    out_ids: Option<NodeId>,
    h: NodeId,
    wo: NodeId,
) -> NodeId {
    let (mut residual, mut wo) = (h, wo);
    if let (true, Some(rows)) = (last, out_ids) {
        wo = b.get_rows("attn_out_tail", wo, rows);
        residual = b.get_rows("residual_tail", residual, rows);
    }
    residual_add(b, hp, "attn", il, residual, wo)
}

/// `h + down(silu(gate(norm(h))) * up(norm(h)))`, the projections' metas (with their biases,
/// where the model has them) from [`ffn_metas`]. Unfused, the fusion pass folds silu·mul into
/// SwiGLU; with the decode FFN fusion, gate, up and SwiGLU are one node.
#[allow(clippy::too_many_arguments)]
pub fn ffn_swiglu(
    b: &mut GraphBuilder,
    hp: &HParams,
    params: &GraphParams,
    il: usize,
    h: NodeId,
    ffn_norm: &str,
    (gate, up, down): (MatMulMeta, MatMulMeta, MatMulMeta),
) -> NodeId {
    let normed = b.rms_norm(&format!("ffn_norm-{il}"), h, Some(ffn_norm), hp.rms_eps);
    let act = if fuse_ffn(params) {
        b.fused_ffn(&format!("ffn_gate_up-{il}"), normed, FusedFfnMeta { gate, up })
    } else {
        let g = b.matmul(&format!("ffn_gate-{il}"), normed, gate);
        let u = b.matmul(&format!("ffn_up-{il}"), normed, up);
        let act = b.silu(&format!("ffn_silu-{il}"), g);
        b.mul(&format!("ffn_swiglu-{il}"), act, u)
    };
    let d = b.matmul(&format!("ffn_down-{il}"), act, down);
    residual_add(b, hp, "ffn", il, h, d)
}

/// Final norm and what the graph ends with ([`GraphOutput`]), marked as the graph's output: the
/// head's logits `F32 [n_vocab, n_out]` (times the model's logit scale, soft-capped, where it
/// has them); the final norm's rows `F32 [n_embd, n_out]` for embeddings; a reranker's head on
/// them, `F32 [n_cls, n_out]`.
pub fn output_head(b: &mut GraphBuilder, hp: &HParams, params: &GraphParams, h: NodeId, output: &WeightRef) -> NodeId {
    let normed = b.rms_norm("output_norm", h, Some("output_norm.weight"), hp.rms_eps);
    let result = match (params.cparams.output, &hp.rank_head) {
        (GraphOutput::Logits, _) => {
            let logits = b.matmul("output", normed, matmul_meta(output, None, hp.n_embd, hp.n_vocab));
            let logits = match hp.logit_scale {
                Some(s) => b.scale("output_scaled", logits, s),
                None => logits,
            };
            match hp.final_softcap {
                Some(cap) => b.softcap("output_softcapped", logits, cap),
                None => logits,
            }
        }
        (GraphOutput::Embeddings, _) | (GraphOutput::Rank, None) => normed,
        (GraphOutput::Rank, Some(head)) => {
            let meta = matmul_meta(&head.weight, head.bias.as_ref(), hp.n_embd, head.n_cls);
            b.matmul("cls_output", normed, meta)
        }
    };
    b.output(result);
    result
}

/// The blocks' fused and unfused paths, through Qwen2's tiny fixture: the RoPE pairing of the
/// hyper-parameters reaches both, with the same bits.
#[cfg(test)]
mod tests {
    use crate::backends::cpu::CpuDevice;
    use crate::engine::Session;
    use crate::gguf::GgufFile;
    use crate::graph::BackendDevice;
    use crate::graph::{CParams, GraphParams, NodeMeta, Op, RopeStyle};
    use crate::models::qwen2::Qwen2;
    use crate::models::{GgufWeights, ModelDef};
    use std::sync::Arc;

    fn tiny(style: RopeStyle) -> (Qwen2, Arc<GgufFile>) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/tiny-qwen2-Q8_0.gguf");
        let file = Arc::new(GgufFile::open(path).unwrap());
        let mut model = Qwen2::load(&file).unwrap();
        model.hparams.rope_style = style;
        (model, file)
    }

    /// The RoPE styles of every node that rotates: plain RoPE nodes and fused Q/K/V nodes.
    fn rope_styles(model: &Qwen2, n_tokens: usize, fuse: bool) -> Vec<RopeStyle> {
        let mut cparams = CParams::new(64, vec![0]);
        cparams.fuse_qkv = fuse;
        let graph = model.build_graph(&GraphParams::new(n_tokens, 1, cparams));
        graph
            .nodes
            .iter()
            .filter_map(|n| match (&n.op, &n.meta) {
                (Op::RoPE, NodeMeta::Rope(m)) => Some(m.style),
                (Op::FusedQKV { .. }, NodeMeta::FusedQkv(m)) => Some(m.rope.style),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_rope_style_comes_from_the_hyper_parameters_into_plain_and_fused_nodes() {
        let (model, _) = tiny(RopeStyle::Normal);
        let n_layer = model.hparams.n_layer;
        assert_eq!(rope_styles(&model, 5, false), vec![RopeStyle::Normal; 2 * n_layer]);
        assert_eq!(rope_styles(&model, 1, true), vec![RopeStyle::Normal; n_layer]);
        let (model, _) = tiny(RopeStyle::Neox);
        assert_eq!(rope_styles(&model, 1, true), vec![RopeStyle::Neox; n_layer]);
    }

    /// Logits of a 6-token prefill and two decode steps, with the decode fusions on or off.
    fn logits(style: RopeStyle, fuse: bool) -> Vec<f32> {
        let (model, file) = tiny(style);
        let device = CpuDevice::new(Arc::new(GgufWeights::new(file)), 1);
        let mut session = Session::with_backends(Box::new(model) as Box<dyn ModelDef>, vec![device.new_context()], 64);
        session.set_fusion(fuse, fuse);
        let mut all = session.eval(&[3, 14, 15, 92, 65, 35], 1).unwrap().to_vec();
        for t in [89, 79] {
            all.extend_from_slice(session.eval(&[t], 1).unwrap());
        }
        all
    }

    #[test]
    fn the_normal_pairing_reaches_the_kernels_of_fused_and_unfused_nodes_alike() {
        let normal = logits(RopeStyle::Normal, false);
        let normal_fused = logits(RopeStyle::Normal, true);
        assert!(
            normal
                .iter()
                .zip(&normal_fused)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "fused decode steps differ from unfused ones under the normal pairing"
        );
        // The style changes the result (positions above 0 rotate), so both paths really used it.
        let neox = logits(RopeStyle::Neox, false);
        let n_vocab = normal.len() / 3;
        let max_diff = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(max_diff(&normal[n_vocab..], &neox[n_vocab..]) > 1e-3);
        assert!(max_diff(&normal_fused[n_vocab..], &logits(RopeStyle::Neox, true)[n_vocab..]) > 1e-3);
    }
}
