//! Qwen2: pre-norm transformer with RMSNorm, GQA attention with Q/K/V biases, NeoX RoPE and a
//! SwiGLU FFN; the output head falls back to the token embedding when `output.weight` is
//! absent (tied embeddings).

mod graph;
mod loader;

pub use loader::Qwen2;

#[cfg(test)]
mod tests {
    use super::Qwen2;
    use crate::backends::cpu::CpuDevice;
    use crate::engine::Session;
    use crate::gguf::GgufFile;
    use crate::graph::BackendDevice;
    use crate::graph::{CParams, GraphParams, NodeMeta, Op, RopeStyle};
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
        let device = CpuDevice::new(Arc::new(GgufWeights(file)), 1);
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
