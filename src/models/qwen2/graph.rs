//! Qwen2's forward pass as a graph (Compute Graph Design §4.1). Every node is named after the
//! model (`attn_norm-3`, `ffn_down-23`) so dumps and traces read like the architecture.

use super::loader::Qwen2;
use crate::graph::*;
use crate::quant::GgmlType;

impl Qwen2 {
    pub(super) fn graph(&self, params: &GraphParams) -> ComputeGraph {
        let hp = &self.hparams;
        let nt = params.n_tokens;
        let n_out = params.n_out.min(nt);
        let mut b = GraphBuilder::new();

        let token_ids = b.input("token_ids", [nt, 1, 1, 1], DType::I32); // I32 [nt]
        let positions = b.input("positions", [nt, 1, 1, 1], DType::I32); // I32 [nt]
                                                                         // Declared at the head of the graph, not beside its consumer, so that it does not cut
                                                                         // a device run into extra splits.
        let tail_ids = (n_out < nt).then(|| b.input("tail_ids", [n_out, 1, 1, 1], DType::I32)); // I32 [n_out]

        let embed = EmbedMeta {
            weight_name: "token_embd.weight".into(),
            weight_type: self.token_embd,
            n_embd: hp.n_embd,
            n_rows: hp.n_vocab,
        };
        let mut h = b.embedding("token_embd", token_ids, embed); // F32 [n_embd, nt]

        let kv_meta = KvcacheMeta {
            n_kv_embd: hp.n_kv_embd(),
            n_ctx: params.cparams.n_ctx,
        };
        let rope = |n_head: usize| RopeMeta {
            n_head,
            head_dim: hp.head_dim,
            n_rot: hp.n_rot,
            freq_base: hp.rope_freq_base,
        };
        let mm = |(name, ty): &(String, GgmlType), bias: Option<&String>, in_dim: usize, out_dim: usize| MatMulMeta {
            weight_name: name.clone(),
            weight_type: *ty,
            bias_name: bias.cloned(),
            in_dim,
            out_dim,
        };
        let q_out = hp.n_head * hp.head_dim;

        for (il, w) in self.layers.iter().enumerate() {
            let normed = b.rms_norm(&format!("attn_norm-{il}"), h, Some(&w.attn_norm), hp.rms_eps);
            let q = b.matmul(&format!("q-{il}"), normed, mm(&w.q, Some(&w.q_bias), hp.n_embd, q_out));
            let k = b.matmul(
                &format!("k-{il}"),
                normed,
                mm(&w.k, Some(&w.k_bias), hp.n_embd, hp.n_kv_embd()),
            );
            let v = b.matmul(
                &format!("v-{il}"),
                normed,
                mm(&w.v, Some(&w.v_bias), hp.n_embd, hp.n_kv_embd()),
            );
            let q = b.rope(&format!("q_rope-{il}"), q, positions, RopeStyle::Neox, rope(hp.n_head));
            let k = b.rope(
                &format!("k_rope-{il}"),
                k,
                positions,
                RopeStyle::Neox,
                rope(hp.n_head_kv),
            );
            b.kvcache_store(&format!("kv_store-{il}"), il, k, v, positions, kv_meta.clone());
            let kv = b.kvcache_load(&format!("kv_load-{il}"), il, kv_meta.clone());
            let attn_meta = AttnMeta {
                layer: il,
                n_head: hp.n_head,
                n_head_kv: hp.n_head_kv,
                head_dim: hp.head_dim,
            };
            let attn = b.attn(&format!("attn-{il}"), q, kv, positions, attn_meta);
            let mut wo = b.matmul(&format!("attn_out-{il}"), attn, mm(&w.wo, None, q_out, hp.n_embd));

            // The tail-row reduction: from the last layer's attention output on, only the
            // n_out rows whose logits are wanted are computed (llama.cpp's inp_out_ids).
            let mut residual = h;
            if il + 1 == self.layers.len() {
                if let Some(tail) = tail_ids {
                    wo = b.get_rows("attn_out_tail", wo, tail);
                    residual = b.get_rows("residual_tail", residual, tail);
                }
            }
            h = b.add(&format!("attn_residual-{il}"), residual, wo);

            let normed = b.rms_norm(&format!("ffn_norm-{il}"), h, Some(&w.ffn_norm), hp.rms_eps);
            let gate = b.matmul(&format!("ffn_gate-{il}"), normed, mm(&w.gate, None, hp.n_embd, hp.n_ff));
            let up = b.matmul(&format!("ffn_up-{il}"), normed, mm(&w.up, None, hp.n_embd, hp.n_ff));
            let act = b.silu(&format!("ffn_silu-{il}"), gate);
            let act = b.mul(&format!("ffn_swiglu-{il}"), act, up);
            let down = b.matmul(&format!("ffn_down-{il}"), act, mm(&w.down, None, hp.n_ff, hp.n_embd));
            h = b.add(&format!("ffn_residual-{il}"), h, down);
        }

        let normed = b.rms_norm("output_norm", h, Some("output_norm.weight"), hp.rms_eps);
        let logits = b.matmul("output", normed, mm(&self.output, None, hp.n_embd, hp.n_vocab)); // F32 [n_vocab, n_out]
        b.output(logits);
        b.build()
    }
}
