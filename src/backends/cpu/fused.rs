//! The CPU's execution of the build-time fused nodes (`FusedQKV`, `FusedQkvNorm`, `FusedFFN`).
//!
//! Each runs exactly the kernels of the unfused chain it replaces, in the same order on the same
//! values, so fused and unfused graphs give bit-identical results; what the fusion removes is
//! graph overhead (nodes, intermediate buffers, scheduler steps), not arithmetic.

use super::{ids_of, kernels, CpuBackend};
use crate::graph::{BackendError, BufRef, CNode, FusedFfnMeta, FusedQkvMeta, MatMulMeta};

impl CpuBackend {
    /// `y = x @ W^T (+ bias)` for one projection of a fused node.
    pub(super) fn projection(
        &mut self,
        node: &CNode,
        m: &MatMulMeta,
        x: &[f32],
        nt: usize,
        y: &mut [f32],
    ) -> Result<(), BackendError> {
        let weights = std::sync::Arc::clone(&self.weights);
        let w = weights
            .weight(&m.weight_name)
            .ok_or_else(|| BackendError::MissingWeight {
                backend: "cpu".into(),
                node: node.name.clone(),
                weight: m.weight_name.clone(),
            })?;
        let device = std::sync::Arc::clone(&self.device);
        let repacked = device.repacked.get(&m.weight_name);
        if let Some(r) = repacked.filter(|r| r.n_out != m.out_dim) {
            return Err(self.err(
                node,
                format!(
                    "the repacked weight has {} rows, the product needs {}",
                    r.n_out, m.out_dim
                ),
            ));
        }
        let repacked = repacked.map(|r| (r, 0));
        self.matmul(node, w.data, w.ggml_type, repacked, m.in_dim, m.out_dim, x, nt, y)?;
        if let Some(bias) = &m.bias_name {
            kernels::add_row_broadcast_inplace(y, self.f32_weight(node, bias)?).map_err(|e| self.err(node, e))?;
        }
        Ok(())
    }

    /// Q, K, V from one activation; biases or per-head norms; RoPE on Q and K; K and V stored at
    /// the positions; the roped Q written to `out`.
    pub(super) fn fused_qkv(
        &mut self,
        node: &CNode,
        m: &FusedQkvMeta,
        in_bufs: &[BufRef],
        out: &mut [f32],
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError> {
        let nt = node.out_shape[1];
        let x = std::mem::take(&mut self.buffers[in_bufs[0].id]);
        // Held outside `self` for the node, like `x`: the projections need `&mut self`.
        let position_bits = match self.buffers.get_mut(in_bufs[1].id) {
            Some(b) => std::mem::take(b),
            None => return Err(self.err(node, format!("no buffer {}", in_bufs[1].id))),
        };
        let positions = ids_of(&position_bits);
        let cells_buf = match in_bufs.get(2) {
            Some(b) => *b,
            None => return Err(self.err(node, "a fused Q/K/V node needs the kv_cells input")),
        };
        // The cells' buffer is a different input, unless a caller passed the positions twice.
        let cell_bits = if cells_buf.id == in_bufs[1].id {
            None
        } else {
            match self.buffers.get_mut(cells_buf.id) {
                Some(b) => Some(std::mem::take(b)),
                None => return Err(self.err(node, format!("no buffer {}", cells_buf.id))),
            }
        };
        let cells = cell_bits.as_deref().map_or(positions, ids_of);
        let mut k = std::mem::take(&mut self.fused_k);
        let mut v = std::mem::take(&mut self.fused_v);
        k.resize(m.k.out_dim * nt, 0.0);
        v.resize(m.v.out_dim * nt, 0.0);
        let result = (|| {
            self.projection(node, &m.q, &x, nt, out)?;
            self.projection(node, &m.k, &x, nt, &mut k)?;
            self.projection(node, &m.v, &x, nt, &mut v)?;
            if let Some((q_norm, k_norm, eps)) = &m.qk_norm {
                let hd = m.rope.head_dim;
                let q_in = out.to_vec();
                kernels::rms_norm_mul(&q_in, self.f32_weight(node, q_norm)?, hd, *eps, out)
                    .map_err(|e| self.err(node, e))?;
                let k_in = k.clone();
                kernels::rms_norm_mul(&k_in, self.f32_weight(node, k_norm)?, hd, *eps, &mut k)
                    .map_err(|e| self.err(node, e))?;
            }
            let r = &m.rope;
            let factors = self.rope_factors(node, r)?;
            kernels::rope(out, positions, nt, r.n_head, r, factors).map_err(|e| self.err(node, e))?;
            kernels::rope(&mut k, positions, nt, m.n_head_kv, r, factors).map_err(|e| self.err(node, e))?;
            let (k_id, v_id) = kv_pair.ok_or_else(|| self.err(node, "no KV regions for this layer"))?;
            let mut k_region = std::mem::take(&mut self.buffers[k_id]);
            let mut v_region = std::mem::take(&mut self.buffers[v_id]);
            let stored = self.region_mut(node, k_id, &mut k_region).and_then(|kr| {
                let vr = self.region_mut(node, v_id, &mut v_region)?;
                kernels::kv_store(cells, &k, &v, m.kv.n_kv_embd, kr, vr).map_err(|e| self.err(node, e))
            });
            self.buffers[k_id] = k_region;
            self.buffers[v_id] = v_region;
            stored
        })();
        self.buffers[in_bufs[0].id] = x;
        if let Some(bits) = cell_bits {
            self.buffers[cells_buf.id] = bits;
        }
        self.buffers[in_bufs[1].id] = position_bits;
        self.fused_k = k;
        self.fused_v = v;
        result
    }

    /// `silu(gate(x)) * up(x)` into `out`.
    pub(super) fn fused_ffn(
        &mut self,
        node: &CNode,
        m: &FusedFfnMeta,
        in_bufs: &[BufRef],
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        let nt = node.out_shape[1];
        let x = std::mem::take(&mut self.buffers[in_bufs[0].id]);
        let mut up = std::mem::take(&mut self.fused_k);
        up.resize(m.up.out_dim * nt, 0.0);
        let result = (|| {
            self.projection(node, &m.gate, &x, nt, out)?;
            self.projection(node, &m.up, &x, nt, &mut up)?;
            kernels::swiglu_inplace(out, &up).map_err(|e| self.err(node, e))
        })();
        self.buffers[in_bufs[0].id] = x;
        self.fused_k = up;
        result
    }
}
