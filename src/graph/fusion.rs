//! The peephole fusion pass: `Mul(Silu(x), y)` → `SwiGLU(x, y)` (Silu on either side), applied
//! only where the mul's backend claims the fused kernel, so no backend gets a fusion it would
//! have to emulate. The orphaned Silu becomes a dead node: no buffer, not executed.
//!
//! The decode fusions (one node for a layer's Q/K/V block, one for its FFN's gate and up) are
//! built by the shared blocks rather than rewritten here; whether a session asks for them is
//! decided once, here too, from what the backend that runs the layers claims.

use super::alloc::GraphAllocator;
use super::ops::{FusedOp, Op};
use super::{ComputeBackend, ComputeGraph};

/// The decode fusions `(fuse_qkv, fuse_ffn)` for a session whose layers run on `layers` (the
/// first backend of its fence: the highest-priority one, or the device of an `-ngl` split):
/// each on when that backend claims it ([`FusedOp::DecodeQkv`], [`FusedOp::DecodeFfn`]), unless
/// `MINFER_NO_FUSE_QKV=1` or `MINFER_NO_FUSE_FFN=1` turns it off.
pub fn decode_fusions(layers: Option<&dyn ComputeBackend>) -> (bool, bool) {
    let on = |fused: FusedOp, var: &str| {
        layers.is_some_and(|b| b.supports_fused(fused)) && !std::env::var(var).is_ok_and(|v| v == "1")
    };
    (
        on(FusedOp::DecodeQkv, "MINFER_NO_FUSE_QKV"),
        on(FusedOp::DecodeFfn, "MINFER_NO_FUSE_FFN"),
    )
}

/// The peephole fusion pass (see the module docs); stateless.
pub struct FusionPass;

impl FusionPass {
    /// Rewrite `graph` in place; returns the number of rewrites.
    pub fn run(graph: &mut ComputeGraph, alloc: &GraphAllocator) -> usize {
        let mut consumers = vec![0usize; graph.nodes.len()];
        for node in &graph.nodes {
            for &s in &node.src {
                consumers[s] += 1;
            }
        }
        let mut rewrites = 0;
        for i in 0..graph.nodes.len() {
            let node = &graph.nodes[i];
            if node.op != Op::Mul {
                continue;
            }
            let supported = node
                .backend
                .and_then(|b| alloc.backend(b).ok())
                .is_some_and(|b| b.supports_fused(FusedOp::SwiGLU));
            if !supported {
                continue;
            }
            let (a, b) = (node.src[0], node.src[1]);
            let sole_silu = |s: usize| {
                graph.nodes[s].op == Op::Silu
                    && consumers[s] == 1
                    && graph.nodes[s].backend == node.backend
                    && !graph.outputs.contains(&s)
            };
            let (silu, other) = if sole_silu(a) {
                (a, b)
            } else if sole_silu(b) {
                (b, a)
            } else {
                continue;
            };
            let gate = graph.nodes[silu].src[0];
            let node = &mut graph.nodes[i];
            node.op = Op::SwiGLU;
            node.src = vec![gate, other];
            consumers[silu] -= 1;
            rewrites += 1;
        }
        rewrites
    }
}
