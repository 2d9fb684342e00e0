//! Qwen3's forward pass as a graph (Compute Graph Design §4.4): Qwen2's skeleton, bias-less
//! projections, and `QkNorm` on Q and K before RoPE.

use super::loader::Qwen3;
use crate::graph::{ComputeGraph, GraphBuilder, GraphParams};
use crate::models::blocks::{self, matmul_meta};
use crate::models::moe;

impl Qwen3 {
    pub(super) fn graph(&self, params: &GraphParams) -> ComputeGraph {
        let hp = &self.hparams;
        let mut b = GraphBuilder::new();
        let inp = blocks::inputs(&mut b, params);
        let mut h = blocks::embedding(&mut b, hp, inp.token_ids, self.token_embd); // F32 [n_embd, nt]
        let (q_out, kv_out) = (hp.n_head * hp.head_dim, hp.n_kv_embd());

        for (il, w) in self.layers.iter().enumerate() {
            let normed = b.rms_norm(&format!("attn_norm-{il}"), h, Some(&w.attn_norm), hp.rms_eps);
            let q = matmul_meta(&w.q, None, hp.n_embd, q_out);
            let k = matmul_meta(&w.k, None, hp.n_embd, kv_out);
            let v = matmul_meta(&w.v, None, hp.n_embd, kv_out);
            let norms = Some((w.q_norm.clone(), w.k_norm.clone(), hp.rms_eps));
            let wo = blocks::self_attention(
                &mut b,
                hp,
                params,
                il,
                &inp,
                normed,
                (q, k, v),
                norms,
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
