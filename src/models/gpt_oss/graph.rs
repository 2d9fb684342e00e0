//! gpt-oss's forward pass as a graph, as llama.cpp's `llm_build_openai_moe_iswa`: pre-norm
//! attention with biases and sinks (windowed on the local layers), then the experts after the
//! `post_attention_norm`.

use super::GptOss;
use crate::graph::{ComputeGraph, GraphBuilder, GraphParams};
use crate::models::blocks::{self, matmul_meta};
use crate::models::moe;

impl GptOss {
    pub(super) fn graph(&self, params: &GraphParams) -> ComputeGraph {
        let hp = &self.hparams;
        let mut b = GraphBuilder::new();
        let inp = blocks::inputs(&mut b, params);
        let mut h = blocks::embedding(&mut b, hp, inp.token_ids, self.token_embd); // F32 [n_embd, nt]
        let (q_out, kv_out) = (hp.n_head * hp.head_dim, hp.n_kv_embd());
        for (il, w) in self.layers.iter().enumerate() {
            let normed = b.rms_norm(&format!("attn_norm-{il}"), h, Some(&w.attn_norm), hp.rms_eps);
            let q = matmul_meta(&w.q, w.q_bias.as_ref(), hp.n_embd, q_out);
            let k = matmul_meta(&w.k, w.k_bias.as_ref(), hp.n_embd, kv_out);
            let v = matmul_meta(&w.v, w.v_bias.as_ref(), hp.n_embd, kv_out);
            let wo = blocks::wo_meta(hp, &w.wo, Some(&w.wo_bias));
            let wo = blocks::self_attention(&mut b, hp, params, il, &inp, normed, (q, k, v), None, wo);
            let last = il + 1 == self.layers.len();
            h = blocks::attention_residual(&mut b, hp, il, last, inp.out_ids, h, wo);
            h = moe::ffn(&mut b, hp, params, il, h, &w.ffn_norm, &w.ffn);
        }
        blocks::output_head(&mut b, hp, params, h, &self.output); // F32 [n_vocab, n_out]
        b.build()
    }
}
