//! Graph export: Graphviz DOT (nodes coloured by backend) and the JSON schema the visualizer
//! reads (`{format: "minfer-graph", version: 1, ...}`). Both describe the graph a run really
//! uses: after backend assignment and fusion.

use super::ops::{NodeMeta, Op};
use super::{Backend, ComputeGraph};
use serde_json::{json, Value};
use std::fmt::Write;

fn colour(backend: Option<Backend>) -> &'static str {
    match backend {
        Some(Backend::CPU) => "lightyellow",
        Some(Backend::METAL) => "lightblue",
        Some(Backend::CUDA) => "lightgreen",
        Some(_) => "lightpink",
        None => "white",
    }
}

/// Op payload details for labels and the JSON `detail` field.
pub fn op_detail(op: &Op) -> String {
    match op {
        Op::RmsNorm { eps } => format!("eps={eps:e}"),
        Op::QkNorm { head_dim, n_head, eps } => format!("head_dim={head_dim} n_head={n_head} eps={eps:e}"),
        Op::Attn {
            mode,
            explicit_span,
            sinks,
        } => format!("{mode:?} explicit_span={explicit_span} sinks={sinks}"),
        Op::KvcacheStore { layer }
        | Op::KvcacheLoad { layer }
        | Op::FusedQKV { layer }
        | Op::FusedQkvNorm { layer } => format!("layer={layer}"),
        Op::TopK { k } => format!("k={k}"),
        Op::SwigluOai { alpha, limit } => format!("alpha={alpha} limit={limit}"),
        Op::MoeWeights { norm, scale } => format!("norm={norm} scale={scale}"),
        _ => String::new(),
    }
}

fn meta_json(meta: &NodeMeta) -> Value {
    match meta {
        NodeMeta::None => Value::Null,
        NodeMeta::Input(kind) => serde_json::json!({ "input": kind.name() }),
        NodeMeta::MatMul(m) => json!({
            "weight": m.weight_name, "type": m.weight_type.name(), "bias": m.bias_name,
            "in_dim": m.in_dim, "out_dim": m.out_dim,
        }),
        NodeMeta::MatMulId(m) => json!({
            "weight": m.mm.weight_name, "type": m.mm.weight_type.name(), "bias": m.mm.bias_name,
            "in_dim": m.mm.in_dim, "out_dim": m.mm.out_dim, "n_expert": m.n_expert,
        }),
        NodeMeta::Norm(m) => json!({ "weight": m.weight_name }),
        NodeMeta::Rope(m) => json!({
            "n_head": m.n_head, "head_dim": m.head_dim, "n_rot": m.n_rot, "freq_base": m.freq_base,
            "freq_scale": m.freq_scale, "freq_factors": m.freq_factors,
        }),
        NodeMeta::Attn(m) => json!({
            "layer": m.layer, "n_head": m.n_head, "n_head_kv": m.n_head_kv, "head_dim": m.head_dim,
            "kq_scale": m.kq_scale, "softcap": m.softcap, "n_swa": m.n_swa,
        }),
        NodeMeta::Kvcache(m) => json!({ "n_kv_embd": m.n_kv_embd, "n_ctx": m.n_ctx }),
        NodeMeta::FusedQkv(m) => json!({
            "q": m.q.weight_name, "k": m.k.weight_name, "v": m.v.weight_name,
            "biases": [m.q.bias_name, m.k.bias_name, m.v.bias_name],
            "qk_norm": m.qk_norm.as_ref().map(|(q, k, eps)| json!([q, k, eps])),
            "n_head": m.rope.n_head, "n_head_kv": m.n_head_kv, "head_dim": m.rope.head_dim,
        }),
        NodeMeta::FusedFfn(m) => json!({ "gate": m.gate.weight_name, "up": m.up.weight_name, "n_ff": m.gate.out_dim }),
        NodeMeta::Embed(m) => json!({
            "weight": m.weight_name, "type": m.weight_type.name(), "n_embd": m.n_embd, "n_rows": m.n_rows,
        }),
    }
}

impl ComputeGraph {
    /// Graphviz DOT: one box per node labelled with its name and op, filled by backend; inputs
    /// and outputs drawn as double octagons.
    pub fn to_dot(&self) -> String {
        let live = self.live_nodes();
        let mut out = String::from(
            "digraph minfer {\n  rankdir=TB;\n  node [shape=box, style=filled, fontname=\"monospace\"];\n",
        );
        for node in &self.nodes {
            let detail = op_detail(&node.op);
            let mut label = format!("{}\\n{}", node.name, node.op.name());
            if !detail.is_empty() {
                let _ = write!(label, " {detail}");
            }
            let shape = if self.inputs.contains(&node.id) || self.outputs.contains(&node.id) {
                "doubleoctagon"
            } else {
                "box"
            };
            let style = if live[node.id] { "filled" } else { "filled,dashed" };
            let _ = writeln!(
                out,
                "  n{} [label=\"{}\", shape={shape}, style=\"{style}\", fillcolor={}];",
                node.id,
                label.replace('"', "\\\""),
                colour(node.backend)
            );
            for &s in &node.src {
                let _ = writeln!(out, "  n{s} -> n{};", node.id);
            }
        }
        out.push_str("}\n");
        out
    }

    /// The visualizer's JSON: `{format, version, model, kind, inputs, outputs, nodes: [...]}`;
    /// each node says whether it runs (`live`: a Silu folded into a SwiGLU does not) and whether
    /// the fusion pass made it (`fused`).
    pub fn to_json(&self, model: &str, kind: &str) -> Value {
        let live = self.live_nodes();
        let nodes: Vec<Value> = self
            .nodes
            .iter()
            .map(|n| {
                json!({
                    "live": live[n.id],
                    "fused": matches!(n.op, Op::SwiGLU | Op::FusedQKV { .. } | Op::FusedQkvNorm { .. } | Op::FusedFFN),
                    "id": n.id,
                    "name": n.name,
                    "op": n.op.name(),
                    "detail": op_detail(&n.op),
                    "shape": n.out_shape,
                    "dtype": n.out_dtype.name(),
                    "backend": n.backend.map(|b| b.to_string()),
                    "src": n.src,
                    "meta": meta_json(&n.meta),
                })
            })
            .collect();
        json!({
            "format": "minfer-graph",
            "version": 1,
            "model": model,
            "kind": kind,
            "uid": self.uid,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "nodes": nodes,
        })
    }
}
