//! The Gemma family's forward pass as a graph: the shared attention (Gemma 3's Q/K norms, RoPE
//! per layer, the window, Q's scale, Gemma 2's soft-cap) wrapped in the post-attention norm of
//! Gemma 2 and 3, and the GELU FFN with their post-FFN norm; the shared head soft-caps the
//! logits where the model says. Every node is named after the model (`attn_post_norm-3`,
//! `ffn_gelu-5`).

use super::Gemma3;
use crate::graph::{ComputeGraph, GraphBuilder, GraphParams};
use crate::models::blocks::{self, matmul_meta};

impl Gemma3 {
    pub(super) fn graph(&self, params: &GraphParams) -> ComputeGraph {
        let hp = &self.hparams;
        let mut b = GraphBuilder::new();
        let inp = blocks::inputs(&mut b, params);
        // Scaled by sqrt(n_embd) inside (the embedding scale).
        let mut h = blocks::embedding(&mut b, hp, inp.token_ids, self.token_embd);
        let (q_out, kv_out) = (hp.n_head * hp.head_dim, hp.n_kv_embd());

        for (il, w) in self.layers.iter().enumerate() {
            let normed = b.rms_norm(&format!("attn_norm-{il}"), h, Some(&w.attn_norm), hp.rms_eps);
            let q = matmul_meta(&w.q, None, hp.n_embd, q_out);
            let k = matmul_meta(&w.k, None, hp.n_embd, kv_out);
            let v = matmul_meta(&w.v, None, hp.n_embd, kv_out);
            let norms = w.qk_norm.clone().map(|(q, k)| (q, k, hp.rms_eps));
            let wo = blocks::wo_meta(hp, &w.wo, None);
            let attn = blocks::self_attention(&mut b, hp, params, il, &inp, normed, (q, k, v), norms, wo);
            let attn = match &w.attn_post_norm {
                Some(norm) => b.rms_norm(&format!("attn_post_norm-{il}"), attn, Some(norm), hp.rms_eps),
                None => attn,
            };
            let last = il + 1 == self.layers.len();
            h = blocks::attention_residual(&mut b, hp, il, last, inp.out_ids, h, attn);

            let normed = b.rms_norm(&format!("ffn_norm-{il}"), h, Some(&w.ffn_norm), hp.rms_eps);
            let g = b.matmul(
                &format!("ffn_gate-{il}"),
                normed,
                matmul_meta(&w.gate, None, hp.n_embd, hp.n_ff),
            );
            let u = b.matmul(
                &format!("ffn_up-{il}"),
                normed,
                matmul_meta(&w.up, None, hp.n_embd, hp.n_ff),
            );
            let act = b.gelu(&format!("ffn_gelu-{il}"), g);
            let act = b.mul(&format!("ffn_geglu-{il}"), act, u);
            let d = b.matmul(
                &format!("ffn_down-{il}"),
                act,
                matmul_meta(&w.down, None, hp.n_ff, hp.n_embd),
            );
            let d = match &w.ffn_post_norm {
                Some(norm) => b.rms_norm(&format!("ffn_post_norm-{il}"), d, Some(norm), hp.rms_eps),
                None => d,
            };
            h = b.add(&format!("ffn_residual-{il}"), h, d);
        }
        blocks::output_head(&mut b, hp, params, h, &self.output);
        b.build()
    }
}
