//! The CPU's matrix product indexed by expert (`MatMulId`, ggml's `mul_mat_id`): the
//! (token, slot) rows are grouped by the expert they chose, and each expert that has any runs
//! as one ordinary product over its gathered rows — the dot-product kernels for a decode step's
//! single row, the matrix-matrix panel for a prompt's many. Only chosen experts' weight rows are
//! read, so a decode step streams `k` experts of the 3-D tensor and its mmapped pages.
//!
//! Every output is one complete dot product of the same kernels a `MatMul` uses, so the result
//! does not depend on the grouping, the number of tokens or the thread count. This file owns
//! the grouping; the arithmetic belongs to `kernels::matmul_rows`.

use super::{f32_values, ids_of, kernels, CpuBackend};
use crate::graph::{BackendError, BufRef, CNode, MatMulIdMeta};
use crate::quant::repack::{self, Repacked};

impl CpuBackend {
    /// `out[(t, s)] = W[ids[s, t]] @ x[t or (t, s)] (+ bias[ids[s, t]])` for a node of shape
    /// `[n_out, k, n_tokens]`.
    pub(super) fn mat_mul_id(
        &mut self,
        node: &CNode,
        m: &MatMulIdMeta,
        in_bufs: &[BufRef],
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        let [n_out, k, nt, _] = node.out_shape;
        let (n_in, n_expert) = (m.mm.in_dim, m.n_expert);
        if n_out != m.mm.out_dim || k == 0 || n_in == 0 {
            return Err(self.err(
                node,
                format!(
                    "output {:?} does not match the experts' {n_in}x{}",
                    node.out_shape, m.mm.out_dim
                ),
            ));
        }
        let weights = std::sync::Arc::clone(&self.weights);
        let w = weights
            .weight(&m.mm.weight_name)
            .ok_or_else(|| BackendError::MissingWeight {
                backend: "cpu".into(),
                node: node.name.clone(),
                weight: m.mm.weight_name.clone(),
            })?;
        let wtype = w.ggml_type;
        let expert_bytes = wtype
            .row_size(n_in as u64)
            .and_then(|r| usize::try_from(r).ok())
            .and_then(|r| r.checked_mul(n_out))
            .ok_or_else(|| self.err(node, format!("{wtype} rows of {n_in} values are not whole blocks")))?;
        if Some(w.data.len()) != expert_bytes.checked_mul(n_expert) {
            return Err(self.err(
                node,
                format!(
                    "weight '{}' holds {} bytes, {n_expert} experts of {expert_bytes} expected",
                    m.mm.weight_name,
                    w.data.len()
                ),
            ));
        }
        let bias = match &m.mm.bias_name {
            Some(name) => {
                let b = weights.weight(name).ok_or_else(|| BackendError::MissingWeight {
                    backend: "cpu".into(),
                    node: node.name.clone(),
                    weight: name.clone(),
                })?;
                let b = f32_values(name, b).map_err(|e| self.err(node, e))?;
                if b.len() != n_out * n_expert {
                    return Err(self.err(
                        node,
                        format!("bias '{name}' holds {} values, {n_out} x {n_expert} expected", b.len()),
                    ));
                }
                Some(b)
            }
            None => None,
        };
        // The experts repacked when the model loaded (when they fit in memory), expert e's rows
        // from row e * n_out.
        let device = std::sync::Arc::clone(&self.device);
        let repacked = device.repacked.get(&m.mm.weight_name);
        if let Some(r) = repacked.filter(|r| r.n_out != n_out * n_expert) {
            return Err(self.err(
                node,
                format!(
                    "the repacked experts have {} rows, {n_expert} x {n_out} expected",
                    r.n_out
                ),
            ));
        }
        let ids = ids_of(self.buffer(node, in_bufs[1])?).to_vec();
        if ids.len() != k * nt {
            return Err(self.err(node, format!("{} expert ids for {k} slots of {nt} tokens", ids.len())));
        }
        if let Some((i, &id)) = ids
            .iter()
            .enumerate()
            .find(|(_, &id)| id < 0 || id as usize >= n_expert)
        {
            return Err(self.err(
                node,
                format!("expert id {id} (slot {i}) is not one of the {n_expert} experts"),
            ));
        }
        let x = std::mem::take(&mut self.buffers[in_bufs[0].id]);
        // One input row a token (the gate and up products) or one a slot (the down product).
        let per_token = match x.len() {
            len if len == n_in * nt => 1,
            len if len == n_in * k * nt => k,
            len => {
                self.buffers[in_bufs[0].id] = x;
                return Err(self.err(
                    node,
                    format!("input of {len} values is neither {nt} nor {} rows of {n_in}", k * nt),
                ));
            }
        };
        // Slots grouped by expert, each group in token order: a counting sort of the ids.
        let mut start = vec![0usize; n_expert + 1];
        for &id in &ids {
            start[id as usize + 1] += 1;
        }
        for e in 0..n_expert {
            start[e + 1] += start[e];
        }
        let weight = (w.data, wtype, expert_bytes, repacked);
        let result = if start.windows(2).all(|g| g[1] - g[0] <= 1) {
            // A decode step: every chosen expert has one row. Quantize the input rows once and
            // share all the experts' output rows among the threads in one parallel run.
            self.one_row_per_expert(node, weight, &x, per_token, &ids, out)
        } else {
            let mut order = vec![0usize; ids.len()];
            let mut next = start.clone();
            for (slot, &id) in ids.iter().enumerate() {
                order[next[id as usize]] = slot;
                next[id as usize] += 1;
            }
            self.grouped_by_expert(node, weight, &x, per_token, &ids, (&start, &order), out)
        };
        self.buffers[in_bufs[0].id] = x;
        result?;
        // Each slot's row of its expert's bias (ggml's `add_id`), after its product.
        if let Some(b) = bias {
            for (o, &id) in out.chunks_exact_mut(n_out).zip(&ids) {
                let e = id as usize;
                for (v, &bv) in o.iter_mut().zip(&b[e * n_out..(e + 1) * n_out]) {
                    *v += bv;
                }
            }
        }
        Ok(())
    }

    /// [`Self::mat_mul_id`] for a prompt: each expert's rows (`order[start[e]..start[e + 1]]`,
    /// slots in token order) gathered and run as one ordinary product, the matrix-matrix panel
    /// where there are enough of them, and scattered back to their slots.
    #[allow(clippy::too_many_arguments)]
    fn grouped_by_expert(
        &mut self,
        node: &CNode,
        (w, wtype, expert_bytes, repacked): (&[u8], crate::quant::GgmlType, usize, Option<&Repacked>),
        x: &[f32],
        per_token: usize,
        ids: &[i32],
        (start, order): (&[usize], &[usize]),
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        let [n_out, k, _, _] = node.out_shape;
        let n_in = x.len() / (ids.len() / k * per_token);
        let mut rows = std::mem::take(&mut self.fused_k);
        let mut ys = std::mem::take(&mut self.fused_v);
        let result = (|| {
            for e in 0..start.len() - 1 {
                let group = &order[start[e]..start[e + 1]];
                if group.is_empty() {
                    continue;
                }
                rows.clear();
                for &slot in group {
                    let r = if per_token == 1 { slot / k } else { slot };
                    rows.extend_from_slice(&x[r * n_in..(r + 1) * n_in]);
                }
                ys.resize(group.len() * n_out, 0.0);
                let we = &w[e * expert_bytes..(e + 1) * expert_bytes];
                self.device
                    .expert_bytes_read
                    .fetch_add(expert_bytes as u64, std::sync::atomic::Ordering::Relaxed);
                let packed = repacked.map(|r| (r, e * n_out));
                self.matmul(node, we, wtype, packed, n_in, n_out, &rows, group.len(), &mut ys)?;
                for (&slot, y) in group.iter().zip(ys.chunks_exact(n_out)) {
                    out[slot * n_out..(slot + 1) * n_out].copy_from_slice(y);
                }
            }
            Ok(())
        })();
        self.fused_k = rows;
        self.fused_v = ys;
        result
    }

    /// [`Self::mat_mul_id`] when no expert has more than one row (a decode step's top-k ids are
    /// distinct): the `x` rows quantized once (one a token, or one a slot), then every slot's
    /// output rows cut into chunks that the threads claim, each one complete dot product of the
    /// kernels an ordinary product of one token runs — the same bits.
    #[allow(clippy::too_many_arguments)]
    fn one_row_per_expert(
        &mut self,
        node: &CNode,
        (w, wtype, expert_bytes, repacked): (&[u8], crate::quant::GgmlType, usize, Option<&Repacked>),
        x: &[f32],
        per_token: usize,
        ids: &[i32],
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        let [n_out, k, _, _] = node.out_shape;
        let n_in = x.len() / (ids.len() / k * per_token);
        let kerr = |e: kernels::KernelError| BackendError::Node {
            backend: "cpu".into(),
            node: node.name.clone(),
            message: e.to_string(),
        };
        // Each input row quantized on its own (with the repacked kernel's terms where it runs),
        // so that a slot views its row's activations whole.
        let mut scratch: Vec<Vec<u8>> = (0..x.len() / n_in).map(|_| Vec::new()).collect();
        let acts = scratch
            .iter_mut()
            .zip(x.chunks_exact(n_in))
            .map(|(s, row)| {
                let mut b = kernels::ActivationBuffers::new(wtype, n_in, row, 1, repacked.is_some(), s)?;
                for chunk in b.chunks(1) {
                    kernels::quantize_chunk(chunk)?;
                }
                Ok(b.finish())
            })
            .collect::<Result<Vec<_>, kernels::KernelError>>()
            .map_err(kerr)?;
        let n_threads = self.device.n_threads;
        let rows_per_chunk = match repacked {
            Some(_) => super::chunk_len(n_out * ids.len(), n_threads).next_multiple_of(repack::GROUP),
            None => super::chunk_len(n_out * ids.len(), n_threads),
        }
        .min(n_out)
        .max(1);
        let mut items = Vec::new();
        for (slot, o) in out.chunks_exact_mut(n_out).enumerate() {
            for (c, block) in o.chunks_mut(rows_per_chunk).enumerate() {
                items.push((slot, c * rows_per_chunk, block));
            }
        }
        self.device
            .expert_bytes_read
            .fetch_add((expert_bytes * ids.len()) as u64, std::sync::atomic::Ordering::Relaxed);
        let items = super::Claim::new(items.into_iter());
        let failed = super::FirstError::new();
        super::run_parallel(&self.device, |_, _| {
            while let Some((slot, first, block)) = items.next() {
                let e = ids[slot] as usize;
                let r = if per_token == 1 { slot / k } else { slot };
                let rows = first..first + block.len();
                failed.record(match repacked {
                    Some(p) => kernels::matmul_rows_repacked(
                        p,
                        acts[r],
                        1,
                        e * n_out + rows.start..e * n_out + rows.end,
                        block,
                    ),
                    None => {
                        let we = &w[e * expert_bytes..(e + 1) * expert_bytes];
                        kernels::matmul_rows(we, wtype, n_in, n_out, acts[r], 1, rows, block)
                    }
                });
            }
        });
        failed.into_result().map_err(kerr)
    }
}
