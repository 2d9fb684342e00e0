//! The graph builder: an append-only, pure factory. It assigns ids, records shapes, dtypes and
//! metadata, and wires sources; it never computes and never allocates buffers. Sources are
//! always built before their consumers, so node-id order is a valid execution order.
//!
//! Shape mismatches here are bugs in a model definition (its loader validated the file), so
//! they are assertions, not errors.

use super::ops::*;
use super::{CNode, ComputeGraph, DType, NodeId};

/// Builds a [`ComputeGraph`] node by node; [`GraphBuilder::build`] hands it over.
#[derive(Default)]
pub struct GraphBuilder {
    graph: ComputeGraph,
}

impl GraphBuilder {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Output shape of node `id`, `[ne0, ne1, ne2, ne3]`.
    pub fn shape(&self, id: NodeId) -> [usize; 4] {
        self.graph.nodes[id].out_shape
    }

    /// Append a node; the general form every constructor uses.
    pub fn node(
        &mut self,
        name: &str,
        op: Op,
        src: &[NodeId],
        out_shape: [usize; 4],
        out_dtype: DType,
        meta: NodeMeta,
    ) -> NodeId {
        let id = self.graph.nodes.len();
        assert!(src.iter().all(|&s| s < id), "node '{name}' reads a node built after it");
        self.graph.nodes.push(CNode {
            id,
            name: name.to_string(),
            op,
            src: src.to_vec(),
            out_shape,
            out_dtype,
            backend: None,
            meta,
        });
        id
    }

    /// A leaf the host fills by name before every execution.
    pub fn input(&mut self, name: &str, shape: [usize; 4], dtype: DType) -> NodeId {
        let id = self.node(name, Op::Input, &[], shape, dtype, NodeMeta::None);
        self.graph.inputs.push(id);
        id
    }

    /// An I32 leaf the engine fills from the batch by its `kind` (named after it).
    pub fn typed_input(&mut self, kind: InputKind, shape: [usize; 4]) -> NodeId {
        let id = self.node(kind.name(), Op::Input, &[], shape, DType::I32, NodeMeta::Input(kind));
        self.graph.inputs.push(id);
        id
    }

    /// Rows `ids` of an embedding table: `[n_embd, n_ids]`.
    pub fn embedding(&mut self, name: &str, ids: NodeId, meta: EmbedMeta) -> NodeId {
        let n = self.shape(ids)[0];
        self.node(
            name,
            Op::GetRows,
            &[ids],
            [meta.n_embd, n, 1, 1],
            DType::F32,
            NodeMeta::Embed(meta),
        )
    }

    /// Rows `ids` of an activation `x`: `[d, n_ids]`.
    pub fn get_rows(&mut self, name: &str, x: NodeId, ids: NodeId) -> NodeId {
        let d = self.shape(x)[0];
        let n = self.shape(ids)[0];
        self.node(name, Op::GetRows, &[x, ids], [d, n, 1, 1], DType::F32, NodeMeta::None)
    }

    /// RMS normalization of each row of `x`, times the F32 `[d]` weight `weight_name` when given.
    pub fn rms_norm(&mut self, name: &str, x: NodeId, weight_name: Option<&str>, eps: f32) -> NodeId {
        let shape = self.shape(x);
        let meta = NormMeta {
            weight_name: weight_name.map(str::to_string),
        };
        self.node(name, Op::RmsNorm { eps }, &[x], shape, DType::F32, NodeMeta::Norm(meta))
    }

    /// Qwen3's per-head RMSNorm of `x` (`[head_dim * n_head, nt]`), each head times the F32
    /// `[head_dim]` weight `weight_name`.
    pub fn qk_norm(&mut self, name: &str, x: NodeId, weight_name: &str, head_dim: usize, eps: f32) -> NodeId {
        let shape = self.shape(x);
        assert_eq!(
            shape[0] % head_dim,
            0,
            "{name}: width {} is not whole heads of {head_dim}",
            shape[0]
        );
        let op = Op::QkNorm {
            head_dim,
            n_head: shape[0] / head_dim,
            eps,
        };
        let meta = NormMeta {
            weight_name: Some(weight_name.to_string()),
        };
        self.node(name, op, &[x], shape, DType::F32, NodeMeta::Norm(meta))
    }

    /// `x @ W^T (+ bias)`: `[in_dim, nt]` → `[out_dim, nt]`.
    pub fn matmul(&mut self, name: &str, x: NodeId, meta: MatMulMeta) -> NodeId {
        let shape = self.shape(x);
        assert_eq!(
            shape[0], meta.in_dim,
            "{name}: input width {} vs weight in_dim {}",
            shape[0], meta.in_dim
        );
        let out = [meta.out_dim, shape[1], 1, 1];
        self.node(name, Op::MatMul, &[x], out, DType::F32, NodeMeta::MatMul(meta))
    }

    /// `[out_dim, k, n_tokens]`: each token's rows through its `k` chosen experts ([`Op::MatMulId`]);
    /// `x` is `[in_dim, n_tokens]` (one input for every slot) or `[in_dim, k, n_tokens]`.
    pub fn matmul_id(&mut self, name: &str, x: NodeId, ids: NodeId, meta: MatMulIdMeta) -> NodeId {
        let [k, nt, ..] = self.shape(ids);
        let shape = self.shape(x);
        assert_eq!(
            shape[0], meta.mm.in_dim,
            "{name}: input width {} vs in_dim {}",
            shape[0], meta.mm.in_dim
        );
        assert!(
            shape[1..] == [nt, 1, 1] || shape[1..] == [k, nt, 1],
            "{name}: input {shape:?} is neither one row nor {k} rows a token"
        );
        let out = [meta.mm.out_dim, k, nt, 1];
        self.node(name, Op::MatMulId, &[x, ids], out, DType::F32, NodeMeta::MatMulId(meta))
    }

    /// Softmax of each row of `x` ([`Op::Softmax`]).
    pub fn softmax(&mut self, name: &str, x: NodeId) -> NodeId {
        let shape = self.shape(x);
        self.node(name, Op::Softmax, &[x], shape, DType::F32, NodeMeta::None)
    }

    /// I32 `[k, rows]`: the indices of each row's `k` largest values ([`Op::TopK`]).
    pub fn top_k(&mut self, name: &str, x: NodeId, k: usize) -> NodeId {
        let [n, rows, ..] = self.shape(x);
        assert!(0 < k && k <= n, "{name}: top {k} of {n}");
        self.node(name, Op::TopK { k }, &[x], [k, rows, 1, 1], DType::I32, NodeMeta::None)
    }

    /// `[k, n_tokens]`: the chosen experts' weights ([`Op::MoeWeights`]).
    pub fn moe_weights(&mut self, name: &str, probs: NodeId, ids: NodeId, norm: bool, scale: f32) -> NodeId {
        let shape = self.shape(ids);
        assert_eq!(
            self.shape(probs)[1],
            shape[1],
            "{name}: tokens of probabilities and ids"
        );
        let op = Op::MoeWeights { norm, scale };
        self.node(name, op, &[probs, ids], shape, DType::F32, NodeMeta::None)
    }

    /// `[d, n_tokens]`: the weighted sum of each token's `k` expert outputs ([`Op::MoeSum`]).
    pub fn moe_sum(&mut self, name: &str, experts: NodeId, weights: NodeId) -> NodeId {
        let [k, nt, ..] = self.shape(weights);
        let shape = self.shape(experts);
        assert_eq!(
            shape[0] * shape[1] * shape[2],
            shape[0] * k * nt,
            "{name}: {shape:?} is not {k} rows a token"
        );
        self.node(
            name,
            Op::MoeSum,
            &[experts, weights],
            [shape[0], nt, 1, 1],
            DType::F32,
            NodeMeta::None,
        )
    }

    /// gpt-oss's clamped SwiGLU of `gate` and `up` ([`Op::SwigluOai`]).
    pub fn swiglu_oai(&mut self, name: &str, gate: NodeId, up: NodeId, alpha: f32, limit: f32) -> NodeId {
        self.binary(name, Op::SwigluOai { alpha, limit }, gate, up)
    }

    /// Element-wise sigmoid ([`Op::Sigmoid`]).
    pub fn sigmoid(&mut self, name: &str, x: NodeId) -> NodeId {
        let shape = self.shape(x);
        self.node(name, Op::Sigmoid, &[x], shape, DType::F32, NodeMeta::None)
    }

    /// Rotate the heads of `x` (`[n_head * head_dim, nt]`) by the positions (I32 `[nt]`).
    pub fn rope(&mut self, name: &str, x: NodeId, positions: NodeId, meta: RopeMeta) -> NodeId {
        let shape = self.shape(x);
        assert_eq!(shape[0], meta.n_head * meta.head_dim, "{name}: width vs heads");
        self.node(name, Op::RoPE, &[x, positions], shape, DType::F32, NodeMeta::Rope(meta))
    }

    /// Element-wise GELU ([`Op::Gelu`]).
    pub fn gelu(&mut self, name: &str, x: NodeId) -> NodeId {
        let shape = self.shape(x);
        self.node(name, Op::Gelu, &[x], shape, DType::F32, NodeMeta::None)
    }

    /// Element-wise `x * scale`.
    pub fn scale(&mut self, name: &str, x: NodeId, scale: f32) -> NodeId {
        let shape = self.shape(x);
        self.node(name, Op::Scale { scale }, &[x], shape, DType::F32, NodeMeta::None)
    }

    /// Element-wise `cap * tanh(x / cap)` ([`Op::Softcap`]).
    pub fn softcap(&mut self, name: &str, x: NodeId, cap: f32) -> NodeId {
        let shape = self.shape(x);
        self.node(name, Op::Softcap { cap }, &[x], shape, DType::F32, NodeMeta::None)
    }

    /// Element-wise `x * sigmoid(x)`.
    pub fn silu(&mut self, name: &str, x: NodeId) -> NodeId {
        let shape = self.shape(x);
        self.node(name, Op::Silu, &[x], shape, DType::F32, NodeMeta::None)
    }

    fn binary(&mut self, name: &str, op: Op, a: NodeId, b: NodeId) -> NodeId {
        let shape = self.shape(a);
        assert_eq!(shape, self.shape(b), "{name}: operand shapes differ");
        self.node(name, op, &[a, b], shape, DType::F32, NodeMeta::None)
    }

    /// Element-wise `a + b`; the shapes must be equal.
    pub fn add(&mut self, name: &str, a: NodeId, b: NodeId) -> NodeId {
        self.binary(name, Op::Add, a, b)
    }

    /// Element-wise `a * b`; the shapes must be equal.
    pub fn mul(&mut self, name: &str, a: NodeId, b: NodeId) -> NodeId {
        self.binary(name, Op::Mul, a, b)
    }

    /// Element-wise `silu(gate) * up`; the shapes must be equal.
    pub fn swiglu(&mut self, name: &str, gate: NodeId, up: NodeId) -> NodeId {
        self.binary(name, Op::SwiGLU, gate, up)
    }

    /// Write this step's K and V rows into the layer's persistent regions at the cells
    /// `kv_cells` (I32 `[nt]`) gives. Its output is the K region.
    pub fn kvcache_store(
        &mut self,
        name: &str,
        layer: usize,
        k: NodeId,
        v: NodeId,
        kv_cells: NodeId,
        meta: KvcacheMeta,
    ) -> NodeId {
        assert_eq!(self.shape(k)[0], meta.n_kv_embd, "{name}: K width");
        assert_eq!(self.shape(v)[0], meta.n_kv_embd, "{name}: V width");
        let shape = [meta.n_kv_embd, meta.n_ctx, 1, 1];
        self.node(
            name,
            Op::KvcacheStore { layer },
            &[k, v, kv_cells],
            shape,
            DType::F32,
            NodeMeta::Kvcache(meta),
        )
    }

    /// A view of the layer's KV regions. It has no sources: build it after the store, so that
    /// build order puts the store first.
    pub fn kvcache_load(&mut self, name: &str, layer: usize, meta: KvcacheMeta) -> NodeId {
        let shape = [meta.n_kv_embd, meta.n_ctx, 1, 1];
        self.node(
            name,
            Op::KvcacheLoad { layer },
            &[],
            shape,
            DType::F32,
            NodeMeta::Kvcache(meta),
        )
    }

    /// Attention of `q` over the layer's cache; the output width comes from the meta. With
    /// `span` (the [`InputKind::KvIndex`] and [`InputKind::KvSpan`] inputs) each token sees the
    /// cells its span lists; without, cells `0..=position`.
    pub fn attn(
        &mut self,
        name: &str,
        q: NodeId,
        kv: NodeId,
        positions: NodeId,
        span: Option<(NodeId, NodeId)>,
        meta: AttnMeta,
    ) -> NodeId {
        let nt = self.shape(q)[1];
        let out = [meta.n_head * meta.head_dim, nt, 1, 1];
        let op = Op::Attn {
            mode: AttnMode::Gqa,
            explicit_span: span.is_some(),
            sinks: meta.sinks.is_some(),
        };
        match span {
            Some((index, spans)) => self.node(
                name,
                op,
                &[q, kv, positions, index, spans],
                out,
                DType::F32,
                NodeMeta::Attn(meta),
            ),
            None => self.node(name, op, &[q, kv, positions], out, DType::F32, NodeMeta::Attn(meta)),
        }
    }

    /// The decode Q/K/V block in one node (see [`Op::FusedQKV`]): output `[n_head*head_dim, nt]`.
    pub fn fused_qkv(
        &mut self,
        name: &str,
        layer: usize,
        x: NodeId,
        (positions, kv_cells): (NodeId, NodeId),
        meta: FusedQkvMeta,
    ) -> NodeId {
        let shape = self.shape(x);
        assert_eq!(shape[0], meta.q.in_dim, "{name}: input width");
        let op = if meta.qk_norm.is_some() {
            Op::FusedQkvNorm { layer }
        } else {
            Op::FusedQKV { layer }
        };
        let out = [meta.q.out_dim, shape[1], 1, 1];
        self.node(
            name,
            op,
            &[x, positions, kv_cells],
            out,
            DType::F32,
            NodeMeta::FusedQkv(Box::new(meta)),
        )
    }

    /// `silu(gate(x)) * up(x)` in one node: output `[n_ff, nt]`.
    pub fn fused_ffn(&mut self, name: &str, x: NodeId, meta: FusedFfnMeta) -> NodeId {
        let shape = self.shape(x);
        assert_eq!(shape[0], meta.gate.in_dim, "{name}: input width");
        let out = [meta.gate.out_dim, shape[1], 1, 1];
        self.node(name, Op::FusedFFN, &[x], out, DType::F32, NodeMeta::FusedFfn(meta))
    }

    /// Mark `node` as an output: it stays live and its buffer is kept for the host to read.
    pub fn output(&mut self, node: NodeId) {
        self.graph.outputs.push(node);
    }

    /// The finished graph, nodes in build order.
    pub fn build(self) -> ComputeGraph {
        self.graph
    }
}
