//! Qwen2's forward pass as a graph (Compute Graph Design §4.1). Every node is named after the
//! model (`attn_norm-3`, `ffn_down-23`) so dumps and traces read like the architecture.

use super::loader::Qwen2;
use crate::graph::{ComputeGraph, GraphBuilder, GraphParams};
use crate::models::blocks::{self, matmul_meta};
use crate::models::moe;

impl Qwen2 {
    pub(super) fn graph(&self, params: &GraphParams) -> ComputeGraph {
        let hp = &self.hparams;
        let mut b = GraphBuilder::new();
        let inp = blocks::inputs(&mut b, params);
        let mut h = blocks::embedding(&mut b, hp, inp.token_ids, self.token_embd); // F32 [n_embd, nt]
        let (q_out, kv_out) = (hp.n_head * hp.head_dim, hp.n_kv_embd());

        for (il, w) in self.layers.iter().enumerate() {
            let normed = b.rms_norm(&format!("attn_norm-{il}"), h, Some(&w.attn_norm), hp.rms_eps);
            // Qwen2 projects with biases.
            let q = matmul_meta(&w.q, Some(&w.q_bias), hp.n_embd, q_out);
            let k = matmul_meta(&w.k, Some(&w.k_bias), hp.n_embd, kv_out);
            let v = matmul_meta(&w.v, Some(&w.v_bias), hp.n_embd, kv_out);
            let wo = blocks::self_attention(
                &mut b,
                hp,
                params,
                il,
                &inp,
                normed,
                (q, k, v),
                None,
                blocks::wo_meta(hp, &w.wo, None),
            );
            let last = il + 1 == self.layers.len();
            h = blocks::attention_residual(&mut b, hp, il, last, inp.out_ids, h, wo);
            h = moe::ffn(&mut b, hp, params, il, h, &w.ffn_norm, &w.ffn);
        }
        blocks::output_head(&mut b, hp, params, h, &self.output); // F32 [n_vocab, n_out]
        b.build()
    }
}
