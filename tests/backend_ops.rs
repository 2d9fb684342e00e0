//! The backend conformance test, in the spirit of llama.cpp's `test-backend-ops`: every op of
//! the IR, with representative shapes and every weight type, run on each registered backend and
//! on a host-opaque test backend, and compared with a one-thread CPU context by normalized mean
//! squared error (llama.cpp's NMSE, bound 1e-7). A new backend passes this test before a model
//! runs on it.
//!
//! The host-opaque backend ([`OpaqueDevice`]) keeps its buffers scrambled in memory of its own
//! and its weights in copies it took when it prepared them, so the only way to get a correct
//! value in or out of it is the seam's copies (`write_buffer`, `read_buffer`, staging across
//! backends): anything that borrowed its memory would read noise. It computes with the CPU
//! kernels on unscrambled copies, so it is exact; what it proves is the seam, not arithmetic.
//! One test breaks one of its ops on purpose and checks that the harness names exactly that op.

mod common;

use common::Rng;
use minfer::backends::cpu::{CpuBackend, CpuDevice};
use minfer::backends::BackendSet;
use minfer::graph::fusion::FusionPass;
use minfer::graph::registry;
use minfer::graph::scheduler::BackendScheduler;
use minfer::graph::{
    AttnMeta, Backend, BackendDevice, BackendError, BufRef, CNode, ComputeBackend, ComputeGraph, DType, FusedFfnMeta,
    FusedOp, FusedQkvMeta, GraphAllocator, GraphBuilder, GraphError, KvcacheMeta, MatMulIdMeta, MatMulMeta, NodeMeta,
    Op, RopeMeta, RopeStyle, TensorSource, Weight, WeightUse,
};
use minfer::quant::GgmlType;
use std::collections::HashMap;
use std::sync::Arc;

/// The bound on NMSE between a backend and the reference, as llama.cpp's default.
const MAX_NMSE: f64 = 1e-7;
/// The bound for a matmul by quantized weights, as llama.cpp's `test_mul_mat`: the CPU
/// quantizes the activations (to Q8_0 or Q8_K) for its integer dot products, and a backend that
/// multiplies f32 activations differs from it by that rounding (NMSE about 1e-5 measured).
const MAX_NMSE_QUANTIZED_MATMUL: f64 = 5e-4;

/// The NMSE bound of a case: [`MAX_NMSE_QUANTIZED_MATMUL`] where a node multiplies by quantized
/// weights, else [`MAX_NMSE`].
fn max_nmse(case: &Case) -> f64 {
    let is_quantized = |ty: GgmlType| !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
    let quantized = case.graph.nodes.iter().any(|n| match &n.meta {
        NodeMeta::MatMul(m) => is_quantized(m.weight_type),
        NodeMeta::MatMulId(m) => is_quantized(m.mm.weight_type),
        NodeMeta::FusedQkv(m) => is_quantized(m.q.weight_type),
        NodeMeta::FusedFfn(m) => is_quantized(m.gate.weight_type),
        _ => false,
    });
    if quantized {
        MAX_NMSE_QUANTIZED_MATMUL
    } else {
        MAX_NMSE
    }
}

/// The weight types a matmul or an embedding may use: every type minfer computes with except
/// the activation-only Q8_1 and Q8_K.
fn weight_types() -> Vec<GgmlType> {
    GgmlType::SUPPORTED
        .iter()
        .copied()
        .filter(|t| !matches!(t, GgmlType::Q8_1 | GgmlType::Q8_K))
        .collect()
}

/// Weights held in memory, quantized from random values: the cases' model file.
#[derive(Default)]
struct MemWeights {
    tensors: HashMap<String, (GgmlType, Vec<u64>, Vec<u8>)>,
}

impl MemWeights {
    /// Add `name`, a GGUF `[n_in, n_out]` (or `[n]`) tensor of type `ty` from random values.
    fn add(&mut self, rng: &mut Rng, name: &str, ty: GgmlType, shape: &[u64]) {
        let n: u64 = shape.iter().product();
        let values = rng.vec(n as usize, 1.0);
        let bytes = common::weight_bytes(ty, &values);
        self.tensors.insert(name.to_string(), (ty, shape.to_vec(), bytes));
    }

    /// Add `name`, an F32 vector of exactly `values`.
    fn add_f32(&mut self, name: &str, values: &[f32]) {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensors
            .insert(name.to_string(), (GgmlType::F32, vec![values.len() as u64], bytes));
    }
}

impl TensorSource for MemWeights {
    fn weight(&self, name: &str) -> Option<Weight<'_>> {
        self.tensors.get(name).map(|(ty, shape, data)| Weight {
            ggml_type: *ty,
            shape,
            data,
        })
    }
}

/// Values of one graph input.
#[derive(Clone)]
enum Data {
    F32(Vec<f32>),
    I32(Vec<i32>),
}

/// One conformance case: a graph, its weights, and the inputs of each execution (a later
/// execution reuses the graph, as a decode step does, so KV written before must persist).
struct Case {
    name: String,
    graph: ComputeGraph,
    weights: Arc<MemWeights>,
    steps: Vec<Vec<(&'static str, Data)>>,
}

/// Outputs of every execution of a case, in order.
fn run(case: &Case, backends: Vec<Box<dyn ComputeBackend>>) -> Result<Vec<Vec<f32>>, GraphError> {
    let mut graph = case.graph.clone();
    let mut alloc = GraphAllocator::new(backends);
    BackendScheduler::assign_backends(&mut graph, &alloc)?;
    FusionPass::run(&mut graph, &alloc);
    alloc.alloc_graph(&graph)?;
    let splits = BackendScheduler::split_graph(&graph);
    let mut outputs = Vec::new();
    for step in &case.steps {
        for (name, data) in step {
            match data {
                Data::F32(v) => alloc.fill_input(&graph, name, v)?,
                Data::I32(v) => alloc.fill_input_i32(&graph, name, v)?,
            }
        }
        BackendScheduler::execute_splits(&graph, &splits, &mut alloc, &mut Vec::new(), None)?;
        for &out in &graph.outputs {
            let mut values = Vec::new();
            alloc.read_f32(&graph, out, &mut values)?;
            outputs.push(values);
        }
    }
    Ok(outputs)
}

/// llama.cpp's normalized mean squared error: `sum((a - b)^2) / sum(b^2)`.
fn nmse(got: &[f32], reference: &[f32]) -> f64 {
    let err: f64 = got
        .iter()
        .zip(reference)
        .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
        .sum();
    let norm: f64 = reference.iter().map(|&b| (b as f64).powi(2)).sum();
    if norm == 0.0 {
        if err == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        err / norm
    }
}

// ---------------------------------------------------------------------------------------------
// The host-opaque test backend.

/// The test backend's handle (no registry entry: it prints as `backend#9`).
const OPAQUE: Backend = Backend(9);

/// What a byte of the opaque backend's memory is XORed with: a value read without the seam's
/// unscrambling copy is noise.
const SCRAMBLE: u8 = 0xA5;

/// A device whose memory the host cannot read directly. See the module documentation.
struct OpaqueDevice {
    /// The weights as the device "uploaded" them in `prepare_weights`.
    weights: Arc<MemWeights>,
    uploaded_bytes: usize,
    /// Ops (by `Op::name`) it claims; `None`: every op the CPU runs.
    claims: Option<&'static [&'static str]>,
    /// An op it computes wrongly on purpose (the output scaled by 1.01).
    broken: Option<&'static str>,
}

impl OpaqueDevice {
    fn new(claims: Option<&'static [&'static str]>, broken: Option<&'static str>) -> Self {
        OpaqueDevice {
            weights: Arc::new(MemWeights::default()),
            uploaded_bytes: 0,
            claims,
            broken,
        }
    }
}

impl BackendDevice for OpaqueDevice {
    fn handle(&self) -> Backend {
        OPAQUE
    }

    fn name(&self) -> &str {
        "opaque"
    }

    fn n_threads(&self) -> usize {
        1
    }

    fn weights_bytes(&self) -> usize {
        self.uploaded_bytes
    }

    fn prepare_weights(&mut self, source: &dyn TensorSource, weights: &[WeightUse]) -> Result<(), BackendError> {
        let mut uploaded = MemWeights::default();
        for name in weights.iter().map(|u| &u.name) {
            let w = source.weight(name).ok_or_else(|| BackendError::Buffer {
                backend: "opaque".into(),
                id: 0,
                problem: format!("weight '{name}' is not in the source"),
            })?;
            uploaded
                .tensors
                .insert(name.clone(), (w.ggml_type, w.shape.to_vec(), w.data.to_vec()));
            self.uploaded_bytes += w.data.len();
        }
        self.weights = Arc::new(uploaded);
        Ok(())
    }

    fn new_context(&self) -> Box<dyn ComputeBackend> {
        Box::new(OpaqueContext {
            memory: Vec::new(),
            info: Vec::new(),
            free: Vec::new(),
            inner: CpuDevice::new(Arc::clone(&self.weights) as Arc<dyn TensorSource>, 1).context(),
            inner_ids: Vec::new(),
            claims: self.claims,
            broken: self.broken,
        })
    }
}

/// A context of [`OpaqueDevice`]: scrambled buffers, and a CPU context that computes on
/// unscrambled copies of the ones a node touches.
struct OpaqueContext {
    memory: Vec<Vec<u8>>,
    info: Vec<(usize, DType)>,
    free: Vec<usize>,
    inner: CpuBackend,
    /// The inner CPU buffer each buffer is computed in.
    inner_ids: Vec<usize>,
    claims: Option<&'static [&'static str]>,
    broken: Option<&'static str>,
}

fn scramble(bytes: &mut [u8]) {
    for b in bytes {
        *b ^= SCRAMBLE;
    }
}

impl OpaqueContext {
    fn range(&self, id: usize, offset: usize, len: usize) -> Result<std::ops::Range<usize>, BackendError> {
        let bytes = self.info.get(id).map(|i| i.0).ok_or_else(|| BackendError::Buffer {
            backend: "opaque".into(),
            id,
            problem: "does not exist".into(),
        })?;
        minfer::graph::backend::buffer_window("opaque", id, bytes, offset, len)
    }

    /// Copy buffer `id` into its inner CPU buffer, unscrambled.
    fn upload(&mut self, id: usize) -> Result<(), BackendError> {
        let mut bytes = self.memory[id].clone();
        scramble(&mut bytes);
        self.inner.write_buffer(self.inner_ids[id], 0, &bytes)
    }

    /// Copy the inner CPU buffer of `id` back, scrambled.
    fn download(&mut self, id: usize) -> Result<(), BackendError> {
        let mut bytes = vec![0u8; self.memory[id].len()];
        self.inner.read_buffer(self.inner_ids[id], 0, &mut bytes)?;
        scramble(&mut bytes);
        self.memory[id] = bytes;
        Ok(())
    }

    fn inner_ref(&self, buf: BufRef) -> BufRef {
        BufRef {
            backend: Backend::CPU,
            id: self.inner_ids[buf.id],
        }
    }
}

impl ComputeBackend for OpaqueContext {
    fn handle(&self) -> Backend {
        OPAQUE
    }

    fn name(&self) -> &str {
        "opaque"
    }

    fn supports_op(&self, op: &Op, dtype: DType) -> bool {
        self.claims.is_none_or(|c| c.contains(&op.name())) && self.inner.supports_op(op, dtype)
    }

    fn supports_fused(&self, fused: FusedOp) -> bool {
        self.inner.supports_fused(fused)
    }

    fn alloc_buffer(&mut self, bytes: usize, dtype: DType) -> usize {
        if let Some(pos) = self.free.iter().position(|&id| self.info[id] == (bytes, dtype)) {
            return self.free.swap_remove(pos);
        }
        self.alloc_fresh(bytes, dtype)
    }

    fn free_buffer(&mut self, id: usize) {
        if id < self.memory.len() && !self.free.contains(&id) {
            self.free.push(id);
        }
    }

    fn alloc_fresh(&mut self, bytes: usize, dtype: DType) -> usize {
        // Zeroes, as the CPU's fresh buffers are.
        self.memory.push(vec![SCRAMBLE; bytes]);
        self.info.push((bytes, dtype));
        self.inner_ids.push(self.inner.alloc_fresh(bytes, dtype));
        self.memory.len() - 1
    }

    fn pool_len(&self) -> usize {
        self.memory.len()
    }

    fn execute_node(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError> {
        let kv: Vec<usize> = kv_pair.map(|(k, v)| vec![k, v]).unwrap_or_default();
        let touched: Vec<usize> = in_bufs
            .iter()
            .map(|b| b.id)
            .chain([out_buf.id])
            .chain(kv.clone())
            .collect();
        for &id in &touched {
            self.upload(id)?;
        }
        let inner_in: Vec<BufRef> = in_bufs.iter().map(|&b| self.inner_ref(b)).collect();
        let inner_out = self.inner_ref(out_buf);
        let inner_kv = kv_pair.map(|(k, v)| (self.inner_ids[k], self.inner_ids[v]));
        self.inner.execute_node(node, &inner_in, inner_out, inner_kv)?;
        self.inner.synchronize()?;
        if self.broken == Some(node.op.name()) {
            let mut bytes = vec![0u8; self.info[out_buf.id].0];
            self.inner.read_buffer(inner_out.id, 0, &mut bytes)?;
            let values: Vec<f32> = bytemuck::cast_slice::<u8, f32>(&bytes)
                .iter()
                .map(|v| v * 1.01)
                .collect();
            self.inner
                .write_buffer(inner_out.id, 0, bytemuck::cast_slice(&values))?;
        }
        for id in std::iter::once(out_buf.id).chain(kv) {
            self.download(id)?;
        }
        Ok(())
    }

    fn buffer_info(&self, id: usize) -> Option<(usize, DType)> {
        self.info.get(id).copied()
    }

    fn read_buffer(&mut self, id: usize, offset: usize, dst: &mut [u8]) -> Result<(), BackendError> {
        let range = self.range(id, offset, dst.len())?;
        dst.copy_from_slice(&self.memory[id][range]);
        scramble(dst);
        Ok(())
    }

    fn write_buffer(&mut self, id: usize, offset: usize, src: &[u8]) -> Result<(), BackendError> {
        let range = self.range(id, offset, src.len())?;
        let target = &mut self.memory[id][range];
        target.copy_from_slice(src);
        scramble(target);
        Ok(())
    }

    fn synchronize(&mut self) -> Result<(), BackendError> {
        self.inner.synchronize()
    }
}

// ---------------------------------------------------------------------------------------------
// The cases.

fn positions(p: &[i32]) -> Data {
    Data::I32(p.to_vec())
}

/// A case with one execution.
fn case(name: String, graph: ComputeGraph, weights: MemWeights, inputs: Vec<(&'static str, Data)>) -> Case {
    Case {
        name,
        graph,
        weights: Arc::new(weights),
        steps: vec![inputs],
    }
}

fn elementwise_cases(rng: &mut Rng) -> Vec<Case> {
    let d = 64;
    let nt = 3;
    let mut cases = Vec::new();
    type Build = fn(&mut GraphBuilder, usize, usize) -> usize;
    let ops: [(&str, Build); 10] = [
        ("Add", |b, x, y| b.add("out", x, y)),
        ("Mul", |b, x, y| b.mul("out", x, y)),
        ("Silu", |b, x, _| b.silu("out", x)),
        ("Sigmoid", |b, x, _| b.sigmoid("out", x)),
        // gpt-oss's, with x past its limit of 7 both ways.
        ("SwigluOai 1.702 7", |b, x, y| b.swiglu_oai("out", x, y, 1.702, 7.0)),
        ("Scale 0.22", |b, x, _| b.scale("out", x, 0.22)),
        ("Gelu", |b, x, _| b.gelu("out", x)),
        ("Softcap 30", |b, x, _| b.softcap("out", x, 30.0)),
        ("SwiGLU", |b, x, y| b.swiglu("out", x, y)),
        // Built unfused; the fusion pass folds it into SwiGLU where the backend claims it.
        ("Mul(Silu) fused", |b, x, y| {
            let s = b.silu("gate_silu", x);
            b.mul("out", s, y)
        }),
    ];
    for (name, build) in ops {
        let mut b = GraphBuilder::new();
        let x = b.input("x", [d, nt, 1, 1], DType::F32);
        let y = b.input("y", [d, nt, 1, 1], DType::F32);
        let out = build(&mut b, x, y);
        b.output(out);
        let inputs = vec![
            // Past GELU's cutoffs at ±10 too.
            ("x", Data::F32(rng.vec(d * nt, 12.0))),
            ("y", Data::F32(rng.vec(d * nt, 3.0))),
        ];
        cases.push(case(
            format!("{name} [{d}, {nt}]"),
            b.build(),
            MemWeights::default(),
            inputs,
        ));
    }
    cases
}

fn norm_cases(rng: &mut Rng) -> Vec<Case> {
    let mut cases = Vec::new();
    for with_weight in [true, false] {
        let (d, nt) = (96, 4);
        let mut weights = MemWeights::default();
        weights.add(rng, "norm.weight", GgmlType::F32, &[d as u64]);
        let mut b = GraphBuilder::new();
        let x = b.input("x", [d, nt, 1, 1], DType::F32);
        let out = b.rms_norm("out", x, with_weight.then_some("norm.weight"), 1e-6);
        b.output(out);
        let inputs = vec![("x", Data::F32(rng.vec(d * nt, 2.0)))];
        let name = format!("RmsNorm [{d}, {nt}] weight={with_weight}");
        cases.push(case(name, b.build(), weights, inputs));
    }
    let (head_dim, n_head, nt) = (32, 4, 3);
    let mut weights = MemWeights::default();
    weights.add(rng, "q_norm.weight", GgmlType::F32, &[head_dim as u64]);
    let mut b = GraphBuilder::new();
    let x = b.input("x", [head_dim * n_head, nt, 1, 1], DType::F32);
    let out = b.qk_norm("out", x, "q_norm.weight", head_dim, 1e-6);
    b.output(out);
    let inputs = vec![("x", Data::F32(rng.vec(head_dim * n_head * nt, 2.0)))];
    cases.push(case(
        format!("QkNorm head_dim={head_dim} n_head={n_head} nt={nt}"),
        b.build(),
        weights,
        inputs,
    ));
    cases
}

fn matmul_meta(name: &str, ty: GgmlType, bias: Option<&str>, in_dim: usize, out_dim: usize) -> MatMulMeta {
    MatMulMeta {
        weight_name: name.to_string(),
        weight_type: ty,
        bias_name: bias.map(str::to_string),
        in_dim,
        out_dim,
    }
}

fn matmul_cases(rng: &mut Rng) -> Vec<Case> {
    let n_in = 256;
    let mut cases = Vec::new();
    for ty in weight_types() {
        // One token (the decode path), nine (the batched kernels, with a partial tile) and a
        // prompt of several tiles each way, ragged at both ends.
        for (nt, n_out) in [(1, 40), (9, 40), (70, 130)] {
            let bias = (ty == GgmlType::Q8_0).then_some("w.bias");
            let mut weights = MemWeights::default();
            weights.add(rng, "w.weight", ty, &[n_in as u64, n_out as u64]);
            weights.add(rng, "w.bias", GgmlType::F32, &[n_out as u64]);
            let mut b = GraphBuilder::new();
            let x = b.input("x", [n_in, nt, 1, 1], DType::F32);
            let out = b.matmul("out", x, matmul_meta("w.weight", ty, bias, n_in, n_out));
            b.output(out);
            let inputs = vec![("x", Data::F32(rng.vec(n_in * nt, 1.0)))];
            let name = format!("MatMul {ty} [{n_in}, {n_out}] x [{n_in}, {nt}] bias={}", bias.is_some());
            cases.push(case(name, b.build(), weights, inputs));
        }
    }
    cases
}

/// A router's logits for `nt` tokens over `n_expert` experts: random, with the first token's
/// all equal and the second's in equal pairs, so that ties are chosen too.
fn router_logits(rng: &mut Rng, n_expert: usize, nt: usize) -> Vec<f32> {
    let mut logits = rng.vec(n_expert * nt, 3.0);
    logits[..n_expert].fill(0.5);
    for i in 0..n_expert {
        logits[n_expert + i] = (i / 2) as f32;
    }
    logits
}

/// Expert ids for `nt` tokens, `k` distinct ones a token.
fn expert_ids(rng: &mut Rng, n_expert: usize, k: usize, nt: usize) -> Vec<i32> {
    let mut ids = Vec::with_capacity(k * nt);
    for _ in 0..nt {
        let mut row: Vec<i32> = Vec::new();
        while row.len() < k {
            let e = rng.below(n_expert) as i32;
            if !row.contains(&e) {
                row.push(e);
            }
        }
        ids.extend(row);
    }
    ids
}

/// The mixture-of-experts ops: the router chain (softmax, top-k with ties, the weights with
/// and without normalizing), the weighted sum, and the product indexed by expert for every
/// weight type, one token and a prompt, with one input a token or one a slot, and a bias.
fn moe_cases(rng: &mut Rng) -> Vec<Case> {
    let mut cases = Vec::new();
    let (n_expert, k, nt) = (8, 3, 6);
    for (norm, scale) in [(true, 1.0), (false, 2.5)] {
        let mut b = GraphBuilder::new();
        let logits = b.input("logits", [n_expert, nt, 1, 1], DType::F32);
        let probs = b.softmax("probs", logits);
        let ids = b.top_k("ids", probs, k);
        let w = b.moe_weights("out", probs, ids, norm, scale);
        b.output(probs);
        b.output(w);
        let inputs = vec![("logits", Data::F32(router_logits(rng, n_expert, nt)))];
        let name = format!("Softmax, TopK {k} of {n_expert}, MoeWeights norm={norm} scale={scale} x {nt}");
        cases.push(case(name, b.build(), MemWeights::default(), inputs));
    }
    let d = 48;
    let mut b = GraphBuilder::new();
    let experts = b.input("experts", [d, k, nt, 1], DType::F32);
    let w = b.input("w", [k, nt, 1, 1], DType::F32);
    let out = b.moe_sum("out", experts, w);
    b.output(out);
    let inputs = vec![
        ("experts", Data::F32(rng.vec(d * k * nt, 2.0))),
        ("w", Data::F32(rng.vec(k * nt, 1.0))),
    ];
    cases.push(case(
        format!("MoeSum [{d}, {k}, {nt}]"),
        b.build(),
        MemWeights::default(),
        inputs,
    ));

    let (n_in, n_out, n_expert, k) = (256, 40, 4, 2);
    for ty in weight_types() {
        for (nt, per_slot) in [(1, false), (70, false), (9, true)] {
            let bias = (ty == GgmlType::Q8_0).then_some("w.bias");
            let mut weights = MemWeights::default();
            weights.add(rng, "w.weight", ty, &[n_in as u64, n_out as u64, n_expert as u64]);
            weights.add(rng, "w.bias", GgmlType::F32, &[(n_out * n_expert) as u64]);
            let mut b = GraphBuilder::new();
            let rows = if per_slot { k } else { 1 };
            let shape = if per_slot { [n_in, k, nt, 1] } else { [n_in, nt, 1, 1] };
            let x = b.input("x", shape, DType::F32);
            let ids = b.input("ids", [k, nt, 1, 1], DType::I32);
            let meta = MatMulIdMeta {
                mm: matmul_meta("w.weight", ty, bias, n_in, n_out),
                n_expert,
            };
            let out = b.matmul_id("out", x, ids, meta);
            b.output(out);
            let inputs = vec![
                ("x", Data::F32(rng.vec(n_in * rows * nt, 1.0))),
                ("ids", Data::I32(expert_ids(rng, n_expert, k, nt))),
            ];
            let name = format!(
                "MatMulId {ty} {n_expert} x [{n_in}, {n_out}] x [{n_in}, {rows}, {nt}] bias={}",
                bias.is_some()
            );
            cases.push(case(name, b.build(), weights, inputs));
        }
    }
    cases
}

fn get_rows_cases(rng: &mut Rng) -> Vec<Case> {
    let (n_embd, n_rows) = (256, 10);
    let ids = [7, 0, 9, 7];
    let mut cases = Vec::new();
    for ty in weight_types() {
        let mut weights = MemWeights::default();
        weights.add(rng, "token_embd.weight", ty, &[n_embd as u64, n_rows as u64]);
        let mut b = GraphBuilder::new();
        let t = b.input("token_ids", [ids.len(), 1, 1, 1], DType::I32);
        let meta = minfer::graph::EmbedMeta {
            weight_name: "token_embd.weight".into(),
            weight_type: ty,
            n_embd,
            n_rows,
        };
        let out = b.embedding("out", t, meta);
        b.output(out);
        let name = format!("GetRows embedding {ty} [{n_embd}, {n_rows}] ids {ids:?}");
        cases.push(case(name, b.build(), weights, vec![("token_ids", positions(&ids))]));
    }
    let (d, n) = (64, 5);
    let mut b = GraphBuilder::new();
    let x = b.input("x", [d, n, 1, 1], DType::F32);
    let rows = b.input("rows", [2, 1, 1, 1], DType::I32);
    let out = b.get_rows("out", x, rows);
    b.output(out);
    let inputs = vec![("x", Data::F32(rng.vec(d * n, 1.0))), ("rows", positions(&[4, 1]))];
    cases.push(case(
        format!("GetRows rows [{d}, {n}] ids [4, 1]"),
        b.build(),
        MemWeights::default(),
        inputs,
    ));
    cases
}

fn rope_meta(style: RopeStyle, n_head: usize, head_dim: usize, n_rot: usize) -> RopeMeta {
    RopeMeta {
        style,
        n_head,
        head_dim,
        n_rot,
        freq_base: 10000.0,
        freq_scale: 1.0,
        freq_factors: None,
        attn_factor: 1.0,
        yarn: None,
    }
}

fn rope_cases(rng: &mut Rng) -> Vec<Case> {
    let mut cases = Vec::new();
    for style in [RopeStyle::Neox, RopeStyle::Normal] {
        for n_rot in [32, 16] {
            let (n_head, head_dim, nt) = (4, 32, 3);
            let mut b = GraphBuilder::new();
            let x = b.input("x", [n_head * head_dim, nt, 1, 1], DType::F32);
            let pos = b.input("positions", [nt, 1, 1, 1], DType::I32);
            let out = b.rope("out", x, pos, rope_meta(style, n_head, head_dim, n_rot));
            b.output(out);
            let inputs = vec![
                ("x", Data::F32(rng.vec(n_head * head_dim * nt, 1.0))),
                ("positions", positions(&[0, 5, 1017])),
            ];
            let name = format!("RoPE {style:?} n_head={n_head} head_dim={head_dim} n_rot={n_rot}");
            cases.push(case(name, b.build(), MemWeights::default(), inputs));
        }
        // Llama 3.1's scaling: per-pair frequency factors from 1 to 8, and a linear scale.
        let (n_head, head_dim, n_rot, nt) = (2, 32, 32, 3);
        let mut weights = MemWeights::default();
        let factors: Vec<f32> = (0..n_rot / 2)
            .map(|i| 1.0 + 7.0 * i as f32 / (n_rot / 2) as f32)
            .collect();
        weights.add_f32("rope_freqs.weight", &factors);
        let meta = RopeMeta {
            freq_base: 500_000.0,
            freq_scale: 0.5,
            freq_factors: Some("rope_freqs.weight".into()),
            attn_factor: 1.19,
            ..rope_meta(style, n_head, head_dim, n_rot)
        };
        let mut b = GraphBuilder::new();
        let x = b.input("x", [n_head * head_dim, nt, 1, 1], DType::F32);
        let pos = b.input("positions", [nt, 1, 1, 1], DType::I32);
        let out = b.rope("out", x, pos, meta);
        b.output(out);
        let inputs = vec![
            ("x", Data::F32(rng.vec(n_head * head_dim * nt, 1.0))),
            ("positions", positions(&[0, 9, 2047])),
        ];
        let name = format!("RoPE {style:?} with frequency factors, freq_scale 0.5 and attn_factor 1.19");
        cases.push(case(name, b.build(), weights, inputs));
    }
    cases
}

/// The attention block's geometry: GQA with two query heads per KV head.
const N_HEAD: usize = 4;
const N_HEAD_KV: usize = 2;
const HEAD_DIM: usize = 32;
const N_CTX: usize = 16;

fn kv_meta() -> KvcacheMeta {
    kv_meta_of(DType::F32, DType::F32)
}

fn kv_meta_of(type_k: DType, type_v: DType) -> KvcacheMeta {
    KvcacheMeta {
        n_kv_embd: N_HEAD_KV * HEAD_DIM,
        n_ctx: N_CTX,
        type_k,
        type_v,
    }
}

fn attn_meta() -> AttnMeta {
    AttnMeta {
        layer: 0,
        n_head: N_HEAD,
        n_head_kv: N_HEAD_KV,
        head_dim: HEAD_DIM,
        kq_scale: 1.0 / (HEAD_DIM as f32).sqrt(),
        softcap: None,
        n_swa: None,
        sinks: None,
    }
}

/// KvcacheStore, KvcacheLoad and Attn, executed three times on one graph at successive
/// positions (three tokens at a time, or one as in decoding), so that the KV written by one
/// execution must persist in the backend's regions for the next; and the explicit-span form,
/// with two sequences interleaved in the cells (one token of each per step), each token seeing
/// its own sequence's cells only.
fn attention_cases(rng: &mut Rng) -> Vec<Case> {
    let mut cases = Vec::new();
    // Every KV cache type (`-ctk`, `-ctv`) in each form, K and V of different types once.
    let forms = [(3, false), (1, false), (2, true)];
    let types = [
        (DType::F32, DType::F32),
        (DType::F16, DType::F16),
        (DType::Q8_0, DType::Q8_0),
        (DType::Q8_0, DType::F16),
    ];
    for ((nt, explicit), (type_k, type_v)) in forms.into_iter().flat_map(|f| types.map(|t| (f, t))) {
        let kv_width = N_HEAD_KV * HEAD_DIM;
        let mut b = GraphBuilder::new();
        let q = b.input("q", [N_HEAD * HEAD_DIM, nt, 1, 1], DType::F32);
        let k = b.input("k", [kv_width, nt, 1, 1], DType::F32);
        let v = b.input("v", [kv_width, nt, 1, 1], DType::F32);
        let pos = b.input("positions", [nt, 1, 1, 1], DType::I32);
        let cells = b.input("cells", [nt, 1, 1, 1], DType::I32);
        let span = explicit.then(|| {
            (
                b.input("index", [2 * N_CTX, 1, 1, 1], DType::I32),
                b.input("spans", [2, nt, 1, 1], DType::I32),
            )
        });
        let store = b.kvcache_store("kv_store", 0, k, v, cells, kv_meta_of(type_k, type_v));
        let kv = b.kvcache_load("kv_load", 0, kv_meta_of(type_k, type_v));
        // Decoding also with a model's own score scale (Granite's), not 1 / sqrt(head_dim).
        let kq_scale = if nt == 1 { 0.0625 } else { attn_meta().kq_scale };
        // Prompts also through a sliding window narrower than what they see (Gemma's local layers).
        let n_swa = (nt > 1).then_some(2);
        // Two sequences also with a soft-cap low enough to bend the scores (Gemma 2's).
        let softcap = explicit.then_some(2.0);
        // F16 caches also with a learned sink logit per head (gpt-oss's).
        let sinks = (type_k == DType::F16).then(|| "sinks.weight".to_string());
        let meta = AttnMeta {
            kq_scale,
            softcap,
            n_swa,
            sinks: sinks.clone(),
            ..attn_meta()
        };
        let out = b.attn("out", q, kv, pos, span, meta);
        b.output(out);
        // The store's output is the K region itself: compared as f32 values when it holds them
        // (the store runs either way, a node with a side effect).
        if type_k == DType::F32 {
            b.output(store);
        }
        let steps = (0..3)
            .map(|step| {
                let mut inputs = vec![
                    ("q", Data::F32(rng.vec(N_HEAD * HEAD_DIM * nt, 1.0))),
                    ("k", Data::F32(rng.vec(kv_width * nt, 1.0))),
                    ("v", Data::F32(rng.vec(kv_width * nt, 1.0))),
                ];
                if explicit {
                    // Sequence A at cells 0, 2, 4, ..., sequence B at 1, 3, 5, ...
                    let p = step as i32;
                    let a: Vec<i32> = (0..=p).map(|i| 2 * i).collect();
                    let b_cells: Vec<i32> = (0..=p).map(|i| 2 * i + 1).collect();
                    let mut index = [a, b_cells].concat();
                    index.resize(2 * N_CTX, 0);
                    inputs.push(("positions", positions(&[p, p])));
                    inputs.push(("cells", positions(&[2 * p, 2 * p + 1])));
                    inputs.push(("index", Data::I32(index)));
                    inputs.push(("spans", positions(&[0, p + 1, p + 1, p + 1])));
                } else {
                    let first = (step * nt) as i32;
                    let p: Vec<i32> = (first..first + nt as i32).collect();
                    inputs.push(("positions", positions(&p)));
                    inputs.push(("cells", positions(&p)));
                }
                inputs
            })
            .collect();
        let form = if explicit {
            "explicit span, 2 sequences"
        } else {
            "bounded by position"
        };
        cases.push(Case {
            name: format!(
                "KvcacheStore + KvcacheLoad + Attn (GQA {N_HEAD}/{N_HEAD_KV}, head_dim {HEAD_DIM}, {form}, KV {}/{}, kq_scale {kq_scale}, softcap {softcap:?}, n_swa {n_swa:?}, sinks {}), {nt} token(s) x 3 steps",
                type_k.name(),
                type_v.name(),
                sinks.is_some()
            ),
            graph: b.build(),
            weights: Arc::new({
                let mut w = MemWeights::default();
                w.add_f32("sinks.weight", &[0.5, -1.0, 2.5, 0.0][..N_HEAD]);
                w
            }),
            steps,
        });
    }
    cases
}

/// The fused decode nodes: FusedQKV (Qwen2's biases), FusedQkvNorm (Qwen3's per-head norms),
/// each followed by attention over what they stored, and FusedFFN.
fn fused_cases(rng: &mut Rng) -> Vec<Case> {
    let n_embd = 256;
    let (q_out, kv_out) = (N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM);
    let mut cases = Vec::new();
    for (ty, qk_norm) in [(GgmlType::Q8_0, false), (GgmlType::Q4_K, true)] {
        let mut weights = MemWeights::default();
        for (name, out) in [("q", q_out), ("k", kv_out), ("v", kv_out)] {
            weights.add(rng, &format!("{name}.weight"), ty, &[n_embd as u64, out as u64]);
            weights.add(rng, &format!("{name}.bias"), GgmlType::F32, &[out as u64]);
        }
        weights.add(rng, "q_norm.weight", GgmlType::F32, &[HEAD_DIM as u64]);
        weights.add(rng, "k_norm.weight", GgmlType::F32, &[HEAD_DIM as u64]);
        let bias = |name: &'static str| (!qk_norm).then_some(name);
        let meta = FusedQkvMeta {
            q: matmul_meta("q.weight", ty, bias("q.bias"), n_embd, q_out),
            k: matmul_meta("k.weight", ty, bias("k.bias"), n_embd, kv_out),
            v: matmul_meta("v.weight", ty, bias("v.bias"), n_embd, kv_out),
            qk_norm: qk_norm.then(|| ("q_norm.weight".to_string(), "k_norm.weight".to_string(), 1e-6)),
            rope: rope_meta(RopeStyle::Neox, N_HEAD, HEAD_DIM, HEAD_DIM),
            n_head_kv: N_HEAD_KV,
            kv: kv_meta(),
        };
        let mut b = GraphBuilder::new();
        let x = b.input("x", [n_embd, 1, 1, 1], DType::F32);
        let pos = b.input("positions", [1, 1, 1, 1], DType::I32);
        // The cells are not the positions (the sequence starts at cell 3), so the attention
        // reads an explicit span.
        let cells = b.input("cells", [1, 1, 1, 1], DType::I32);
        let index = b.input("index", [N_CTX, 1, 1, 1], DType::I32);
        let spans = b.input("spans", [2, 1, 1, 1], DType::I32);
        let q = b.fused_qkv("qkv", 0, x, (pos, cells), meta);
        let kv = b.kvcache_load("kv_load", 0, kv_meta());
        let out = b.attn("out", q, kv, pos, Some((index, spans)), attn_meta());
        b.output(q);
        b.output(out);
        let steps = (0..3)
            .map(|p| {
                let mut index: Vec<i32> = (3..=3 + p).collect();
                index.resize(N_CTX, 0);
                vec![
                    ("x", Data::F32(rng.vec(n_embd, 1.0))),
                    ("positions", positions(&[p])),
                    ("cells", positions(&[3 + p])),
                    ("index", Data::I32(index)),
                    ("spans", positions(&[0, p + 1])),
                ]
            })
            .collect();
        let op = if qk_norm { "FusedQkvNorm" } else { "FusedQKV" };
        cases.push(Case {
            name: format!("{op} {ty} + Attn, 3 decode steps"),
            graph: b.build(),
            weights: Arc::new(weights),
            steps,
        });
    }
    let n_ff = 96;
    for nt in [1, 5] {
        let mut weights = MemWeights::default();
        weights.add(rng, "gate.weight", GgmlType::Q4_K, &[n_embd as u64, n_ff as u64]);
        weights.add(rng, "up.weight", GgmlType::Q6_K, &[n_embd as u64, n_ff as u64]);
        let meta = FusedFfnMeta {
            gate: matmul_meta("gate.weight", GgmlType::Q4_K, None, n_embd, n_ff),
            up: matmul_meta("up.weight", GgmlType::Q6_K, None, n_embd, n_ff),
        };
        let mut b = GraphBuilder::new();
        let x = b.input("x", [n_embd, nt, 1, 1], DType::F32);
        let out = b.fused_ffn("out", x, meta);
        b.output(out);
        let inputs = vec![("x", Data::F32(rng.vec(n_embd * nt, 1.0)))];
        cases.push(case(
            format!("FusedFFN Q4_K/Q6_K [{n_embd} -> {n_ff}] nt={nt}"),
            b.build(),
            weights,
            inputs,
        ));
    }
    cases
}

/// A chain over every kind of node, for the mixed case: norm, projection, residual, SiLU.
fn mixed_case(rng: &mut Rng) -> Case {
    let d = 256;
    let nt = 4;
    let mut weights = MemWeights::default();
    weights.add(rng, "norm.weight", GgmlType::F32, &[d as u64]);
    weights.add(rng, "w.weight", GgmlType::Q5_0, &[d as u64, d as u64]);
    let mut b = GraphBuilder::new();
    let x = b.input("x", [d, nt, 1, 1], DType::F32);
    let n = b.rms_norm("norm", x, Some("norm.weight"), 1e-6);
    let p = b.matmul("proj", n, matmul_meta("w.weight", GgmlType::Q5_0, None, d, d));
    let r = b.add("residual", p, x);
    let s = b.silu("act", r);
    let out = b.mul("out", s, x);
    b.output(out);
    case(
        "mixed: elementwise ops on the test backend, the rest on the CPU".into(),
        b.build(),
        weights,
        vec![("x", Data::F32(rng.vec(d * nt, 1.0)))],
    )
}

fn all_cases() -> Vec<Case> {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut cases = Vec::new();
    cases.extend(elementwise_cases(&mut rng));
    cases.extend(norm_cases(&mut rng));
    cases.extend(matmul_cases(&mut rng));
    cases.extend(get_rows_cases(&mut rng));
    cases.extend(rope_cases(&mut rng));
    cases.extend(attention_cases(&mut rng));
    cases.extend(fused_cases(&mut rng));
    cases.extend(moe_cases(&mut rng));
    cases
}

// ---------------------------------------------------------------------------------------------
// The harness.

/// Makes a backend's device over a case's weights, prepared for them.
type MakeDevice = Box<dyn Fn(&Case) -> Arc<dyn BackendDevice>>;

/// A backend under test.
struct Candidate {
    name: String,
    make: MakeDevice,
}

/// Every backend the registry says this build has and this machine can run, at three threads
/// where the device takes a thread count (the reference runs on one).
fn registered() -> Vec<Candidate> {
    registry::entries()
        .iter()
        .filter(|e| e.compiled && minfer::backends::probe(e.handle).is_ok())
        .map(|e| {
            let handle = e.handle;
            Candidate {
                name: e.name.to_string(),
                make: Box::new(move |case: &Case| {
                    let uses = case.graph.weight_uses();
                    let set = BackendSet::create(
                        &[handle],
                        Arc::clone(&case.weights) as Arc<dyn TensorSource>,
                        &uses,
                        Some(3),
                    )
                    .unwrap();
                    Arc::clone(&set.devices()[0])
                }),
            }
        })
        .collect()
}

/// The host-opaque backend, optionally with one op broken.
fn opaque(broken: Option<&'static str>) -> Candidate {
    Candidate {
        name: "opaque".into(),
        make: Box::new(move |case: &Case| {
            let mut device = OpaqueDevice::new(None, broken);
            device
                .prepare_weights(case.weights.as_ref(), &case.graph.weight_uses())
                .unwrap();
            Arc::new(device)
        }),
    }
}

/// One mismatch: the case, the backend, the worst output's NMSE (or the error it returned).
struct Failure {
    case: String,
    backend: String,
    problem: String,
}

/// The failures, one line each.
fn report(failures: &[Failure]) -> String {
    failures
        .iter()
        .map(|f| format!("\n  {} on {}: {}", f.case, f.backend, f.problem))
        .collect()
}

/// Run every case on `candidate` and on the reference CPU; every output of every execution must
/// be within [`MAX_NMSE`].
fn conformance(candidate: &Candidate, cases: &[Case]) -> (usize, Vec<Failure>) {
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in cases {
        let reference_device = CpuDevice::new(Arc::clone(&case.weights) as Arc<dyn TensorSource>, 1);
        let expected = run(case, vec![Box::new(reference_device.context())]).expect("the reference runs every case");
        let device = (candidate.make)(case);
        let fail = |problem: String| Failure {
            case: case.name.clone(),
            backend: candidate.name.clone(),
            problem,
        };
        match run(case, vec![device.new_context()]) {
            Err(e) => failures.push(fail(format!("error: {e}"))),
            Ok(got) => {
                checked += 1;
                let worst = got.iter().zip(&expected).map(|(g, e)| nmse(g, e)).fold(0.0, f64::max);
                let bound = max_nmse(case);
                if got.len() != expected.len() || worst > bound || worst.is_nan() {
                    failures.push(fail(format!("NMSE {worst:e} > {bound:e}")));
                }
            }
        }
    }
    (checked, failures)
}

#[test]
fn every_op_on_every_registered_backend_matches_the_cpu_reference() {
    let cases = all_cases();
    let candidates = registered();
    assert!(candidates.iter().any(|c| c.name == "cpu"));
    for candidate in &candidates {
        let (checked, failures) = conformance(candidate, &cases);
        assert!(failures.is_empty(), "{}", report(&failures));
        assert_eq!(checked, cases.len());
    }
}

#[test]
fn every_op_on_a_backend_whose_memory_the_host_cannot_read_matches_the_cpu_reference() {
    let cases = all_cases();
    let (checked, failures) = conformance(&opaque(None), &cases);
    assert!(failures.is_empty(), "{}", report(&failures));
    assert_eq!(checked, cases.len());
}

#[test]
fn the_cases_cover_every_op_of_the_ir_and_every_weight_type() {
    let cases = all_cases();
    let mut ops: Vec<&str> = Vec::new();
    let mut types: Vec<GgmlType> = Vec::new();
    for case in &cases {
        let mut graph = case.graph.clone();
        let alloc = GraphAllocator::new(vec![Box::new(
            CpuDevice::new(Arc::new(MemWeights::default()), 1).context(),
        )]);
        BackendScheduler::assign_backends(&mut graph, &alloc).unwrap();
        FusionPass::run(&mut graph, &alloc);
        for node in &graph.nodes {
            if !ops.contains(&node.op.name()) {
                ops.push(node.op.name());
            }
            match &node.meta {
                NodeMeta::MatMul(m) => types.push(m.weight_type),
                NodeMeta::Embed(m) => types.push(m.weight_type),
                _ => {}
            }
        }
    }
    // The IR's own list of its ops, so that a new op cannot escape the cases.
    let every_op = Op::every();
    for op in &every_op {
        assert!(ops.contains(&op.name()), "no case runs {}", op.name());
    }
    for ty in weight_types() {
        assert!(types.contains(&ty), "no case uses weight type {ty}");
    }
    assert_eq!(
        weight_types().len(),
        25,
        "F32, F16, BF16 and the twenty-two quantized types"
    );
}

#[test]
fn a_broken_op_on_the_test_backend_fails_the_cases_that_run_it_and_only_those() {
    let cases = all_cases();
    let (_, failures) = conformance(&opaque(Some("RmsNorm")), &cases);
    let failed: Vec<&str> = failures.iter().map(|f| f.case.as_str()).collect();
    let expected: Vec<&str> = cases
        .iter()
        .filter(|c| c.graph.nodes.iter().any(|n| n.op.name() == "RmsNorm"))
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(failed, expected, "{}", report(&failures));
    assert!(!expected.is_empty());
    eprintln!("with RmsNorm broken on the test backend:{}", report(&failures));
}

#[test]
fn a_graph_split_across_the_test_backend_and_the_cpu_matches_the_cpu_alone() {
    // The test backend claims only the elementwise ops, so values cross between it and the CPU
    // in both directions through the allocator's staging copies.
    static ELEMENTWISE: &[&str] = &["Input", "Add", "Mul", "Silu", "SwiGLU"];
    let mut rng = Rng(7);
    let case = mixed_case(&mut rng);
    let expected = run(
        &case,
        vec![Box::new(
            CpuDevice::new(Arc::clone(&case.weights) as Arc<dyn TensorSource>, 1).context(),
        )],
    )
    .unwrap();
    let mut device = OpaqueDevice::new(Some(ELEMENTWISE), None);
    device
        .prepare_weights(case.weights.as_ref(), &case.graph.weight_uses())
        .unwrap();
    let cpu = CpuDevice::new(Arc::clone(&case.weights) as Arc<dyn TensorSource>, 2);
    let backends: Vec<Box<dyn ComputeBackend>> = vec![device.new_context(), Box::new(cpu.context())];

    let mut graph = case.graph.clone();
    let alloc = GraphAllocator::new(backends);
    BackendScheduler::assign_backends(&mut graph, &alloc).unwrap();
    let splits = BackendScheduler::split_graph(&graph);
    assert!(splits.len() >= 3, "{splits:?}");
    assert!(splits.iter().any(|s| s.backend == OPAQUE) && splits.iter().any(|s| s.backend == Backend::CPU));
    drop(alloc);

    let backends: Vec<Box<dyn ComputeBackend>> = vec![device.new_context(), Box::new(cpu.context())];
    let got = run(&case, backends).unwrap();
    assert_eq!(got.len(), expected.len());
    for (g, e) in got.iter().zip(&expected) {
        assert!(
            g.iter().zip(e).all(|(a, b)| a.to_bits() == b.to_bits()),
            "the split run differs"
        );
    }
}

#[test]
fn a_device_prepares_the_weights_once_and_reports_the_bytes_it_holds() {
    let mut rng = Rng(11);
    let case = mixed_case(&mut rng);
    let names = case.graph.weight_names();
    assert_eq!(names, ["norm.weight", "w.weight"]);
    let mut device = OpaqueDevice::new(None, None);
    device
        .prepare_weights(case.weights.as_ref(), &case.graph.weight_uses())
        .unwrap();
    let held: usize = names.iter().map(|n| case.weights.weight(n).unwrap().data.len()).sum();
    assert_eq!(device.weights_bytes(), held);
    // The contexts compute from the device's copy: the source is not needed any more.
    let expected = run(
        &case,
        vec![Box::new(
            CpuDevice::new(Arc::clone(&case.weights) as Arc<dyn TensorSource>, 1).context(),
        )],
    )
    .unwrap();
    let detached = Case {
        weights: Arc::new(MemWeights::default()),
        ..case
    };
    assert_eq!(run(&detached, vec![device.new_context()]).unwrap(), expected);
    // Given no weight to prepare, the CPU reads them all in place and holds nothing itself.
    let set = BackendSet::create(
        &[Backend::CPU],
        detached.weights.clone() as Arc<dyn TensorSource>,
        &[],
        Some(1),
    )
    .unwrap();
    assert_eq!(set.weights_bytes(), 0);
}

#[test]
fn the_cpu_repacks_the_matrices_it_multiplies_and_computes_the_same_bits_from_them() {
    let mut rng = Rng(13);
    let mut cases = vec![mixed_case(&mut rng)];
    // Rows in whole groups, every weight type (those without the layout stay in place), one
    // token (the decode step), a few (straight from the records), a prompt's tile and more, and
    // a prompt (Q6_K's records expanded into the panel).
    let (n_in, n_out) = (256, 48);
    for ty in weight_types() {
        for nt in [1, 3, 9, 30] {
            let mut weights = MemWeights::default();
            weights.add(&mut rng, "w.weight", ty, &[n_in as u64, n_out as u64]);
            let mut b = GraphBuilder::new();
            let x = b.input("x", [n_in, nt, 1, 1], DType::F32);
            let out = b.matmul("out", x, matmul_meta("w.weight", ty, None, n_in, n_out));
            b.output(out);
            let inputs = vec![("x", Data::F32(rng.vec(n_in * nt, 1.0)))];
            cases.push(case(format!("MatMul {ty} x {nt}"), b.build(), weights, inputs));
            // And as 3 experts, 2 chosen a token: repacked expert by expert.
            let mut weights = MemWeights::default();
            weights.add(&mut rng, "e.weight", ty, &[n_in as u64, n_out as u64, 3]);
            let mut b = GraphBuilder::new();
            let x = b.input("x", [n_in, nt, 1, 1], DType::F32);
            let ids = b.input("ids", [2, nt, 1, 1], DType::I32);
            let meta = MatMulIdMeta {
                mm: matmul_meta("e.weight", ty, None, n_in, n_out),
                n_expert: 3,
            };
            let out = b.matmul_id("out", x, ids, meta);
            b.output(out);
            let inputs = vec![
                ("x", Data::F32(rng.vec(n_in * nt, 1.0))),
                ("ids", Data::I32(expert_ids(&mut rng, 3, 2, nt))),
            ];
            cases.push(case(format!("MatMulId {ty} x {nt}"), b.build(), weights, inputs));
        }
    }
    let mut repacked = 0;
    let mut mixed_repacked = 0;
    for (i, case) in cases.into_iter().enumerate() {
        let weights = Arc::clone(&case.weights) as Arc<dyn TensorSource>;
        let in_place = run(&case, vec![Box::new(CpuDevice::new(Arc::clone(&weights), 2).context())]).unwrap();
        let uses = case.graph.weight_uses();
        let set = BackendSet::create(&[Backend::CPU], weights, &uses, Some(2)).unwrap();
        // Every multiplied matrix of a type with the layout, rows in groups of 16, on a CPU with
        // the kernels; nothing else (norms, embedding tables, other types).
        let expected: usize = uses
            .iter()
            .filter(|u| u.multiplied)
            .filter_map(|u| case.weights.weight(&u.name))
            .filter(|w| minfer::backends::cpu::repacks(w.ggml_type, w.shape))
            // A record per 16 blocks (Q4_K's holds its scales unpacked, so it is a little larger).
            .map(|w| {
                w.data.len() / w.ggml_type.type_size() / 16 * minfer::quant::repack::record_bytes(w.ggml_type).unwrap()
            })
            .sum();
        assert_eq!(set.weights_bytes(), expected, "{}", case.name);
        repacked += usize::from(expected > 0);
        if i == 0 {
            mixed_repacked = usize::from(expected > 0);
        }
        let prepared = run(&case, set.new_contexts()).unwrap();
        for (p, e) in prepared.iter().zip(&in_place) {
            assert!(
                p.iter().zip(e).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{}: the repacked weights give other bits",
                case.name
            );
        }
    }
    // Four token counts of each type the CPU repacks, as a matrix and as experts: those with the
    // layout whose decoding kernel on this CPU is the repacked tile (`quant::choice`; all seven
    // where the tiles measure fastest), and the mixed case.
    let types = weight_types()
        .into_iter()
        .filter(|&ty| minfer::backends::cpu::repacks(ty, &[n_in as u64, n_out as u64]))
        .count();
    assert_eq!(repacked, 8 * types + mixed_repacked);
}

#[test]
fn buffers_of_every_dtype_round_trip_through_the_seam_and_refuse_ranges_outside_them() {
    let mut candidates: Vec<Box<dyn ComputeBackend>> = vec![
        Box::new(CpuDevice::new(Arc::new(MemWeights::default()), 1).context()),
        OpaqueDevice::new(None, None).new_context(),
    ];
    for backend in &mut candidates {
        for (dtype, n) in [(DType::F32, 10), (DType::F16, 7), (DType::I32, 3), (DType::Q8_0, 64)] {
            let bytes = dtype.bytes(n);
            let id = backend.alloc_fresh(bytes, dtype);
            assert_eq!(backend.buffer_info(id), Some((bytes, dtype)));
            let pattern: Vec<u8> = (0..bytes).map(|i| (i * 37 % 251) as u8).collect();
            backend.write_buffer(id, 0, &pattern).unwrap();
            let mut back = vec![0u8; bytes];
            backend.read_buffer(id, 0, &mut back).unwrap();
            assert_eq!(back, pattern, "{} {}", backend.name(), dtype.name());
            // A window in the middle.
            backend.write_buffer(id, 2, &[1, 2, 3]).unwrap();
            let mut window = [0u8; 5];
            backend.read_buffer(id, 1, &mut window).unwrap();
            assert_eq!(window, [pattern[1], 1, 2, 3, pattern[5]]);
            let err = backend
                .read_buffer(id, bytes - 1, &mut [0u8; 2])
                .unwrap_err()
                .to_string();
            assert!(err.contains(&format!("outside its {bytes}")), "{err}");
            assert!(backend.write_buffer(id + 100, 0, &[0]).is_err());
        }
        backend.synchronize().unwrap();
    }
    assert_eq!(DType::Q8_0.bytes(64), 68);
}

#[test]
fn a_partial_offload_runs_the_last_layers_on_the_device_and_gives_the_cpus_logits() {
    use minfer::engine::Session;
    use minfer::gguf::GgufFile;
    use minfer::graph::offload::{places, Place};
    use minfer::models::{load_model, GgufWeights};

    let file = Arc::new(GgufFile::open(common::tiny_model("qwen2", "Q8_0")).unwrap());
    let def: Arc<dyn minfer::models::ModelDef> = Arc::from(load_model(&file).unwrap());
    let weights: Arc<dyn TensorSource> = Arc::new(GgufWeights::new(Arc::clone(&file)));
    let tokens: Vec<u32> = (1..24).collect();
    let cpu = CpuDevice::new(Arc::clone(&weights), 2);
    let mut alone = Session::with_backends(Arc::clone(&def), vec![Box::new(cpu.context())], 64);
    let expected = alone.eval(&tokens, tokens.len()).unwrap().to_vec();

    // What `-ngl auto` weighs: each layer's tensors, and the head's.
    let (layer_bytes, head_bytes) = minfer::graph::offload::weight_bytes_by_place(alone.graph().unwrap(), |name| {
        file.tensor(name).map_or(0, |t| t.size as usize)
    });
    let size_of = |keep: &dyn Fn(&str) -> bool| -> usize {
        file.tensors()
            .iter()
            .filter(|t| keep(&t.name))
            .map(|t| t.size as usize)
            .sum()
    };
    assert_eq!(layer_bytes.len(), 2);
    for (il, &bytes) in layer_bytes.iter().enumerate() {
        assert_eq!(bytes, size_of(&|n| n.starts_with(&format!("blk.{il}."))), "layer {il}");
    }
    let head_names: &[&str] = if file.tensor("output.weight").is_ok() {
        &["output_norm.weight", "output.weight"]
    } else {
        &["output_norm.weight", "token_embd.weight"]
    };
    assert_eq!(head_bytes, size_of(&|n| head_names.contains(&n)));

    // The test device holds every weight, as a device given all layers would.
    let mut device = OpaqueDevice::new(None, None);
    let uses = alone.graph().unwrap().weight_uses();
    device.prepare_weights(weights.as_ref(), &uses).unwrap();
    for n_gpu_layers in [0, 1, 2, 3] {
        let backends: Vec<Box<dyn ComputeBackend>> = vec![device.new_context(), Box::new(cpu.context())];
        let mut session = Session::with_backends(Arc::clone(&def), backends, 64);
        session.set_gpu_layers(Some(n_gpu_layers));
        let got = session.eval(&tokens, tokens.len()).unwrap().to_vec();
        assert!(
            got.iter().zip(&expected).all(|(a, b)| a.to_bits() == b.to_bits()),
            "-ngl {n_gpu_layers}: the split run differs from the CPU alone"
        );
        // The tiny model has 2 layers: the last n on the device, the head too past 2, the
        // embedding lookup always on the CPU.
        let graph = session.graph().unwrap();
        let live = graph.live_nodes();
        for (node, place) in graph.nodes.iter().zip(places(graph)) {
            let on_device = match place {
                Some(Place::Embedding) => false,
                Some(Place::Layer(il)) => il + n_gpu_layers >= 2,
                Some(Place::Head) => n_gpu_layers > 2,
                None => continue,
            };
            if live[node.id] {
                let want = if on_device { OPAQUE } else { Backend::CPU };
                assert_eq!(node.backend, Some(want), "-ngl {n_gpu_layers}: node {}", node.name);
            }
        }
    }
}

#[test]
fn gpu_layers_for_a_fence_that_starts_with_the_cpu_are_refused_not_ignored() {
    use minfer::engine::{LoadError, Model, ModelOptions};
    let options = ModelOptions {
        backend: Some("cpu".into()),
        n_gpu_layers: Some(5),
        ..Default::default()
    };
    let err = Model::load(common::tiny_model("qwen2", "Q8_0"), &options)
        .err()
        .expect("refused");
    assert!(matches!(err, LoadError::GpuLayers { n_gpu_layers: 5, .. }), "{err}");
    assert!(
        err.to_string().contains("-ngl 5 does not fit the backend fence (cpu)"),
        "{err}"
    );
    // -ngl 0 asks nothing of a device: the CPU alone runs the model.
    let options = ModelOptions {
        backend: Some("cpu".into()),
        n_gpu_layers: Some(0),
        ..Default::default()
    };
    assert!(Model::load(common::tiny_model("qwen2", "Q8_0"), &options).is_ok());
}

/// The cases whose every node `device` claims.
#[cfg(feature = "wgpu")]
use minfer::backends::wgpu::MatMulLayout;

#[cfg(feature = "wgpu")]
fn claimed_cases(device: &dyn BackendDevice) -> Vec<Case> {
    let context = device.new_context();
    all_cases()
        .into_iter()
        .filter(|c| {
            c.graph.nodes.iter().all(|n| {
                context.supports_op(&n.op, n.out_dtype) && n.weight_types().iter().all(|&t| context.supports_weight(t))
            })
        })
        .collect()
}

/// The wgpu backend on whatever adapter this machine has (Mesa's lavapipe in CI), named as a
/// fence names it (so a software adapter is used), or `None` where there is none: a skip,
/// except where `MINFER_REQUIRE_WGPU=1` says an adapter is expected.
#[cfg(feature = "wgpu")]
fn wgpu_or_skip(test: &str) -> Option<minfer::backends::wgpu::WgpuDevice> {
    match minfer::backends::wgpu::WgpuDevice::new() {
        Ok(device) => Some(device),
        Err(why) => {
            assert!(
                std::env::var("MINFER_REQUIRE_WGPU").as_deref() != Ok("1"),
                "{test}: MINFER_REQUIRE_WGPU=1 but no wgpu adapter is usable: {why}"
            );
            eprintln!("{test}: skipped, no wgpu adapter: {why}");
            None
        }
    }
}

#[cfg(feature = "wgpu")]
#[test]
fn every_op_the_wgpu_backend_claims_matches_the_cpu_reference() {
    let Some(device) = wgpu_or_skip("every_op_the_wgpu_backend_claims_matches_the_cpu_reference") else {
        return;
    };
    eprintln!("wgpu adapter: {}", device.adapter_line());
    let cases = claimed_cases(&device);
    // Every case but the fused decode nodes, which the backend declines: the element-wise ops,
    // the norms, RoPE, the matmul and embedding rows of every weight type, the row gather, the
    // KV store and attention over f32, f16 and Q8_0 cells, bounded by position or by spans.
    assert!(cases.len() >= 69, "{}", cases.len());
    // Both layouts of the weight products: a GPU's (workgroup reductions, tiles for prompts)
    // and a CPU's lanes (a row per invocation), whichever this adapter would choose.
    for layout in [MatMulLayout::Workgroups, MatMulLayout::Rows] {
        let candidate = Candidate {
            name: format!("wgpu ({layout:?})"),
            make: Box::new(move |case: &Case| {
                let mut device = minfer::backends::wgpu::WgpuDevice::new().unwrap();
                device.set_matmul_layout(layout).unwrap();
                device
                    .prepare_weights(case.weights.as_ref(), &case.graph.weight_uses())
                    .unwrap();
                Arc::new(device)
            }),
        };
        let (checked, failures) = conformance(&candidate, &cases);
        assert!(failures.is_empty(), "{layout:?}: {}", report(&failures));
        assert_eq!(checked, cases.len());
    }
    let names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    eprintln!("wgpu matches the CPU on {} cases: {names:?}", cases.len());
}

#[cfg(feature = "wgpu")]
#[test]
fn a_model_larger_than_the_wgpu_devices_memory_is_refused_before_any_upload() {
    let Some(mut device) = wgpu_or_skip("a_model_larger_than_the_wgpu_devices_memory_is_refused_before_any_upload")
    else {
        return;
    };
    let case = all_cases()
        .into_iter()
        .find(|c| c.name.starts_with("MatMul Q8_0"))
        .unwrap();
    device.limit_memory(1024);
    let err = device
        .prepare_weights(case.weights.as_ref(), &case.graph.weight_uses())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bytes of device memory") && err.contains("may hold 1024"),
        "{err}"
    );
    assert_eq!(device.weights_bytes(), 0, "nothing was uploaded");
}

#[cfg(feature = "wgpu")]
#[test]
fn the_wgpu_backend_splits_weights_larger_than_one_binding_by_rows_and_still_matches_the_cpu() {
    let Some(_) =
        wgpu_or_skip("the_wgpu_backend_splits_weights_larger_than_one_binding_by_rows_and_still_matches_the_cpu")
    else {
        return;
    };
    // Every product and table lookup, with a binding that holds a few rows: each weight is
    // uploaded in many parts, as a real adapter's limit splits a large vocabulary's.
    let cases: Vec<Case> = claimed_cases(&minfer::backends::wgpu::WgpuDevice::new().unwrap())
        .into_iter()
        .filter(|c| c.name.starts_with("MatMul") || c.name.starts_with("GetRows"))
        .collect();
    assert!(cases.len() >= 22, "{}", cases.len());
    for layout in [MatMulLayout::Workgroups, MatMulLayout::Rows] {
        let candidate = Candidate {
            name: format!("wgpu ({layout:?}), 1 KiB bindings"),
            make: Box::new(move |case: &Case| {
                let mut device = minfer::backends::wgpu::WgpuDevice::new().unwrap();
                device.set_matmul_layout(layout).unwrap();
                device.limit_binding(1024);
                device
                    .prepare_weights(case.weights.as_ref(), &case.graph.weight_uses())
                    .unwrap();
                Arc::new(device)
            }),
        };
        let (checked, failures) = conformance(&candidate, &cases);
        assert!(failures.is_empty(), "{layout:?}: {}", report(&failures));
        assert_eq!(checked, cases.len());
    }
}

/// Runs `case` on a CPU device of `n_threads`.
fn run_cpu(case: &Case, n_threads: usize) -> Vec<Vec<f32>> {
    let device = CpuDevice::new(Arc::clone(&case.weights) as Arc<dyn TensorSource>, n_threads);
    run(case, vec![Box::new(device.context())]).unwrap()
}

#[test]
fn the_cpus_router_matches_a_softmax_and_stable_sort_in_f64() {
    let mut rng = Rng(0x51ed_270b_9a4c_11f3);
    let (n_expert, k, nt) = (16, 4, 20);
    let logits = router_logits(&mut rng, n_expert, nt);
    for norm in [true, false] {
        let mut b = GraphBuilder::new();
        let x = b.input("logits", [n_expert, nt, 1, 1], DType::F32);
        let probs = b.softmax("probs", x);
        let ids = b.top_k("ids", probs, k);
        let w = b.moe_weights("w", probs, ids, norm, 1.0);
        b.output(probs);
        b.output(w);
        let inputs = vec![("logits", Data::F32(logits.clone()))];
        let case = case("router".into(), b.build(), MemWeights::default(), inputs);
        let got = run_cpu(&case, 1);
        assert_eq!(got, run_cpu(&case, 3), "any thread count, the same bits");
        for t in 0..nt {
            let row = &logits[t * n_expert..(t + 1) * n_expert];
            let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
            let e: Vec<f64> = row.iter().map(|&v| (f64::from(v) - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            let p: Vec<f64> = e.iter().map(|v| v / sum).collect();
            for (i, want) in p.iter().enumerate() {
                let have = f64::from(got[0][t * n_expert + i]);
                assert!(
                    (have - want).abs() <= 1e-6 * want.max(1e-3),
                    "token {t} expert {i}: {have} vs {want}"
                );
            }
            let mut order: Vec<usize> = (0..n_expert).collect();
            // Stable: equal logits keep index order, the tie rule.
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            let chosen: Vec<f64> = order[..k].iter().map(|&i| p[i]).collect();
            let total: f64 = chosen.iter().sum();
            for (s, want) in chosen.iter().enumerate() {
                let want = if norm { want / total } else { *want };
                let have = f64::from(got[1][t * k + s]);
                assert!(
                    (have - want).abs() <= 2e-6 * want,
                    "token {t} slot {s}: {have} vs {want}"
                );
            }
        }
    }
}

#[test]
fn the_cpus_expert_product_is_each_chosen_experts_own_matmul_bit_for_bit() {
    let mut rng = Rng(0x0dd_b1a5_e5c0_ffee);
    let (n_in, n_out, n_expert, k) = (256, 48, 4, 2);
    // A prompt's grouped rows, and a decode step's one row an expert.
    for (ty, nt) in [1, 70].into_iter().flat_map(|nt| {
        [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::IQ4_XS,
            GgmlType::MXFP4,
        ]
        .map(|ty| (ty, nt))
    }) {
        let mut weights = MemWeights::default();
        weights.add(&mut rng, "w.weight", ty, &[n_in as u64, n_out as u64, n_expert as u64]);
        // Each expert's own bias row (ggml's `add_id`).
        weights.add(&mut rng, "w.bias", GgmlType::F32, &[(n_out * n_expert) as u64]);
        let all = weights.tensors["w.weight"].2.clone();
        let bias = bytemuck_f32(&weights.tensors["w.bias"].2);
        let x = rng.vec(n_in * nt, 1.0);
        let ids = expert_ids(&mut rng, n_expert, k, nt);
        let mut b = GraphBuilder::new();
        let xi = b.input("x", [n_in, nt, 1, 1], DType::F32);
        let ii = b.input("ids", [k, nt, 1, 1], DType::I32);
        let meta = MatMulIdMeta {
            mm: matmul_meta("w.weight", ty, Some("w.bias"), n_in, n_out),
            n_expert,
        };
        let out = b.matmul_id("out", xi, ii, meta);
        b.output(out);
        let inputs = vec![("x", Data::F32(x.clone())), ("ids", Data::I32(ids.clone()))];
        let id_case = case(format!("MatMulId {ty}"), b.build(), weights, inputs);
        let got = run_cpu(&id_case, 1);
        assert_eq!(got, run_cpu(&id_case, 3), "{ty}: any thread count, the same bits");
        let expert_bytes = all.len() / n_expert;
        for e in 0..n_expert {
            // Expert e alone, as an ordinary weight of its own, over every token.
            let mut own = MemWeights::default();
            own.add_f32("e.bias", &bias[e * n_out..(e + 1) * n_out]);
            own.tensors.insert(
                "e.weight".into(),
                (
                    ty,
                    vec![n_in as u64, n_out as u64],
                    all[e * expert_bytes..(e + 1) * expert_bytes].to_vec(),
                ),
            );
            let mut b = GraphBuilder::new();
            let xi = b.input("x", [n_in, nt, 1, 1], DType::F32);
            let y = b.matmul("y", xi, matmul_meta("e.weight", ty, Some("e.bias"), n_in, n_out));
            b.output(y);
            let plain = run_cpu(&case("e".into(), b.build(), own, vec![("x", Data::F32(x.clone()))]), 1);
            for (slot, &id) in ids.iter().enumerate() {
                if id as usize != e {
                    continue;
                }
                let t = slot / k;
                assert_eq!(
                    got[0][slot * n_out..(slot + 1) * n_out],
                    plain[0][t * n_out..(t + 1) * n_out],
                    "{ty}: token {t} slot {} through expert {e}",
                    slot % k
                );
            }
        }
        if ty == GgmlType::F32 {
            // And against the arithmetic itself, in f64.
            let w: Vec<f32> = bytemuck_f32(&all);
            for (slot, &id) in ids.iter().enumerate() {
                let t = slot / k;
                for o in 0..n_out {
                    let row = &w[(id as usize * n_out + o) * n_in..][..n_in];
                    let want: f64 = row
                        .iter()
                        .zip(&x[t * n_in..(t + 1) * n_in])
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum::<f64>()
                        + f64::from(bias[id as usize * n_out + o]);
                    let have = f64::from(got[0][slot * n_out + o]);
                    assert!((have - want).abs() <= 1e-4, "slot {slot} row {o}: {have} vs {want}");
                }
            }
        }
    }
}

/// Little-endian f32 values of `bytes`.
fn bytemuck_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}
