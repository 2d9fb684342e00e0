//! The compute graph: one declarative graph per forward pass, built by a model, assigned to
//! backends, fused, allocated and executed by the scheduler, and reused across decode steps.
//!
//! The pipeline and its invariants are the Compute Graph Design: KV positions are data; the
//! topology is a function of [`GraphParams`] only; weights are named, not copied; the
//! allocator is the single owner of buffers; execution follows build order; fusion never
//! duplicates a backend's fused kernel; a backend that cannot run a node returns an error.
//!
//! This module knows no model and no file format. Dimension order, stated once: shapes are
//! `[ne0, ne1, ne2, ne3]` with ne0 contiguous; an activation `[d, n_tokens, 1, 1]` is stored as
//! `n_tokens` rows of `d` values. Buffers are bytes of a [`DType`] in a backend's own memory,
//! which the host reaches only by copies through the seam ([`ComputeBackend`]); I32 values are
//! little-endian `i32`.

pub mod alloc;
pub mod backend;
pub mod builder;
pub mod cache;
pub mod export;
pub mod fusion;
pub mod offload;
pub mod ops;
pub mod params;
pub mod registry;
pub mod scheduler;
pub mod weights;

pub use alloc::GraphAllocator;
pub use backend::{Backend, BackendDevice, BackendError, ComputeBackend, KShift, KvProvider};
pub use builder::GraphBuilder;
pub use cache::GraphCache;
pub use ops::{
    AttnMeta, AttnMode, EmbedMeta, FusedFfnMeta, FusedOp, FusedQkvMeta, InputKind, KvcacheMeta, MatMulIdMeta,
    MatMulMeta, NodeMeta, NormMeta, Op, RopeMeta, RopeStyle, YarnMeta,
};
pub use params::{CParams, GraphOutput, GraphParams, GraphType};
pub use weights::{TensorSource, Weight, WeightUse};

/// Index of a node in [`ComputeGraph::nodes`]; ids follow build order, so a node's sources
/// always have smaller ids.
pub type NodeId = usize;

/// Element type of a node's output and of a backend buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit floats (activations, logits, KV values).
    F32,
    /// 16-bit IEEE floats (an f16 KV cache, f16 activations on a device).
    F16,
    /// 32-bit little-endian integers (token ids, positions, row ids).
    I32,
    /// ggml's Q8_0 blocks: 32 values as one f16 scale and 32 `i8` (34 bytes a block); the
    /// activation type of the 32-value quantized matmuls.
    Q8_0,
}

impl DType {
    /// The name used in dumps and errors (`f32`, `q8_0`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::Q8_0 => "q8_0",
        }
    }

    /// A KV cache type by its llama.cpp name (`--cache-type-k`): `f32`, `f16` or `q8_0`.
    pub fn kv_cache_type(name: &str) -> Result<Self, String> {
        match name.to_ascii_lowercase().as_str() {
            "f32" => Ok(DType::F32),
            "f16" => Ok(DType::F16),
            "q8_0" => Ok(DType::Q8_0),
            other => Err(format!("'{other}' is not a KV cache type: use f32, f16 or q8_0")),
        }
    }

    /// The GGML type of the same layout, for converting a buffer's bytes with [`crate::quant`]
    /// (`None` for i32, which holds ids, not values).
    pub fn ggml_type(self) -> Option<crate::quant::GgmlType> {
        match self {
            DType::F32 => Some(crate::quant::GgmlType::F32),
            DType::F16 => Some(crate::quant::GgmlType::F16),
            DType::Q8_0 => Some(crate::quant::GgmlType::Q8_0),
            DType::I32 => None,
        }
    }

    /// Bytes that hold `n` values (Q8_0: whole blocks of 32).
    pub fn bytes(self, n: usize) -> usize {
        match self {
            DType::F32 | DType::I32 => n * 4,
            DType::F16 => n * 2,
            DType::Q8_0 => n.div_ceil(32) * 34,
        }
    }
}

/// A buffer in one backend's pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufRef {
    /// The backend whose pool holds the buffer.
    pub backend: Backend,
    /// The buffer's id within that backend's pool.
    pub id: usize,
}

/// One node of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct CNode {
    /// Position in [`ComputeGraph::nodes`], i.e. the build order.
    pub id: NodeId,
    /// Named after the model, e.g. `attn_norm-3`.
    pub name: String,
    /// What the node computes.
    pub op: Op,
    /// Input nodes, in the order the op expects them (each [`Op`] documents its `src`).
    pub src: Vec<NodeId>,
    /// Output shape `[ne0, ne1, ne2, ne3]`, ne0 contiguous.
    pub out_shape: [usize; 4],
    /// Element type of the output buffer.
    pub out_dtype: DType,
    /// Decided by the scheduler.
    pub backend: Option<Backend>,
    /// The op's payload: weight names and types, norm, RoPE, attention and KV parameters.
    pub meta: NodeMeta,
}

impl CNode {
    /// Number of output values: the product of `out_shape`.
    pub fn n_elements(&self) -> usize {
        self.out_shape.iter().product()
    }

    /// Bytes of the node's output.
    pub fn n_bytes(&self) -> usize {
        self.out_dtype.bytes(self.n_elements())
    }

    /// The weights the node names (matmul weights and biases, norm weights, an embedding table,
    /// those of a fused node), each with whether the node multiplies by it.
    pub fn weight_names(&self) -> Vec<(&String, bool)> {
        fn matmul(m: &MatMulMeta) -> impl Iterator<Item = (&String, bool)> {
            std::iter::once((&m.weight_name, true)).chain(m.bias_name.iter().map(|b| (b, false)))
        }
        match &self.meta {
            NodeMeta::MatMul(m) => matmul(m).collect(),
            NodeMeta::MatMulId(m) => matmul(&m.mm).collect(),
            NodeMeta::Norm(m) => m.weight_name.iter().map(|n| (n, false)).collect(),
            NodeMeta::Embed(m) => vec![(&m.weight_name, false)],
            NodeMeta::FusedQkv(m) => [&m.q, &m.k, &m.v]
                .into_iter()
                .flat_map(matmul)
                .chain(
                    m.qk_norm
                        .iter()
                        .flat_map(|(q_norm, k_norm, _)| [(q_norm, false), (k_norm, false)]),
                )
                .chain(m.rope.freq_factors.iter().map(|n| (n, false)))
                .collect(),
            NodeMeta::FusedFfn(m) => matmul(&m.gate).chain(matmul(&m.up)).collect(),
            NodeMeta::Rope(m) => m.freq_factors.iter().map(|n| (n, false)).collect(),
            NodeMeta::Attn(m) => m.sinks.iter().map(|n| (n, false)).collect(),
            NodeMeta::None | NodeMeta::Input(_) | NodeMeta::Kvcache(_) => Vec::new(),
        }
    }

    /// The types of the weights the node multiplies or looks rows up in (a product's, an
    /// embedding's, a fused block's projections'); norm weights and biases are F32 always.
    pub fn weight_types(&self) -> Vec<crate::quant::GgmlType> {
        match &self.meta {
            NodeMeta::MatMul(m) => vec![m.weight_type],
            NodeMeta::MatMulId(m) => vec![m.mm.weight_type],
            NodeMeta::Embed(m) => vec![m.weight_type],
            NodeMeta::FusedQkv(m) => vec![m.q.weight_type, m.k.weight_type, m.v.weight_type],
            NodeMeta::FusedFfn(m) => vec![m.gate.weight_type, m.up.weight_type],
            _ => Vec::new(),
        }
    }

    /// The layer whose KV region the node reads or writes (a KV store, a fused QKV, an
    /// attention), if any.
    pub fn kv_layer(&self) -> Option<usize> {
        match (&self.op, &self.meta) {
            (Op::KvcacheStore { layer } | Op::FusedQKV { layer } | Op::FusedQkvNorm { layer }, _) => Some(*layer),
            (Op::Attn { .. }, NodeMeta::Attn(m)) => Some(m.layer),
            _ => None,
        }
    }
}

/// One forward pass: nodes in build order (which is also the execution order), the inputs the
/// host fills and the outputs it reads back.
#[derive(Clone, Debug, Default)]
pub struct ComputeGraph {
    /// Every node, indexed by [`NodeId`].
    pub nodes: Vec<CNode>,
    /// Leaves the host fills before each execution; their buffers are never freed or reused.
    pub inputs: Vec<NodeId>,
    /// Nodes read back after execution; always live, never freed.
    pub outputs: Vec<NodeId>,
    /// Assigned by [`GraphCache`] on every (re)build; a reused graph keeps it.
    pub uid: u64,
}

/// Errors of graph construction, allocation and execution.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// The sources of a node lead back to it ([`ComputeGraph::topo_order`]).
    #[error("graph has a cycle through node {node}")]
    Cycle {
        /// A node left unordered by the cycle.
        node: String,
    },
    /// A host fill names an input the graph does not have.
    #[error("no input named '{name}' in the graph")]
    NoSuchInput {
        /// The requested input name.
        name: String,
    },
    /// The data given for an input does not match its size.
    #[error("input '{name}' holds {expected} bytes, {got} given")]
    InputSize {
        /// The input's name.
        name: String,
        /// Bytes the input holds (its element count in its dtype).
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// Data of one element type was given for (or asked of) a node of another.
    #[error("'{name}' holds {expected} values, {got} given or asked for")]
    InputType {
        /// The node's name.
        name: String,
        /// The node's dtype.
        expected: &'static str,
        /// The dtype of the caller's data.
        got: &'static str,
    },
    /// A read of a node's output into a slice of another size.
    #[error("node '{node}' holds {expected} bytes, read into {got}")]
    OutputSize {
        /// The node's name.
        node: String,
        /// Bytes of its output.
        expected: usize,
        /// Bytes of the destination.
        got: usize,
    },
    /// No backend in the allocator supports the node's op and dtype, or a node reached allocation
    /// without an assigned backend.
    #[error("no backend can run node '{node}' ({op}{weights})")]
    Unassignable {
        /// The node's name.
        node: String,
        /// Its op ([`Op::name`]).
        op: &'static str,
        /// The weight types it reads, as `", on Q2_K weights"` (empty for none): a backend
        /// may refuse a node for its weights alone.
        weights: String,
    },
    /// A node that must be read (a source, an output, a staged value) has no buffer: it is dead, was
    /// never allocated, or no graph has been prepared yet.
    #[error("node '{node}' has no buffer")]
    NoBuffer {
        /// The node's name or id, or `<no graph>` when nothing was prepared.
        node: String,
    },
    /// A node's output buffer lies on a different backend than the split executing it.
    #[error("node '{node}' is assigned to {expected} but its buffer is on {actual}")]
    SplitMismatch {
        /// The node's name.
        node: String,
        /// The backend of the split.
        expected: String,
        /// The backend that holds the buffer.
        actual: String,
    },
    /// A backend handle names a backend the allocator was not given.
    #[error("backend {name} is not part of this allocator")]
    MissingBackend {
        /// The backend's name.
        name: String,
    },
    /// A backend failed to run a node or to access a buffer.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl GraphError {
    /// [`GraphError::Unassignable`] for `node`, naming the weight types it reads.
    pub fn unassignable(node: &CNode) -> Self {
        let types = node.weight_types();
        let weights = if types.is_empty() {
            String::new()
        } else {
            let names: Vec<&str> = types.iter().map(|t| t.name()).collect();
            format!(", on {} weights", names.join("/"))
        };
        GraphError::Unassignable {
            node: node.name.clone(),
            op: node.op.name(),
            weights,
        }
    }
}

impl ComputeGraph {
    /// Kahn's topological order, for validation only: execution and liveness use build order.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, GraphError> {
        let n = self.nodes.len();
        let mut indegree = vec![0usize; n];
        let mut consumers = vec![Vec::new(); n];
        for node in &self.nodes {
            for &s in &node.src {
                indegree[node.id] += 1;
                consumers[s].push(node.id);
            }
        }
        let mut ready: Vec<NodeId> = (0..n).filter(|&i| indegree[i] == 0).collect();
        let mut order = Vec::with_capacity(n);
        while let Some(i) = ready.pop() {
            order.push(i);
            for &c in &consumers[i] {
                indegree[c] -= 1;
                if indegree[c] == 0 {
                    ready.push(c);
                }
            }
        }
        match (0..n).find(|&i| indegree[i] > 0) {
            Some(i) => Err(GraphError::Cycle {
                node: self.nodes[i].name.clone(),
            }),
            None => Ok(order),
        }
    }

    /// Every weight the graph's nodes name (matmul weights and biases, norm weights, embedding
    /// tables, those of fused nodes), each once, in first-use order, with whether some node
    /// multiplies by it: what a backend prepares.
    pub fn weight_uses(&self) -> Vec<WeightUse> {
        self.weight_uses_of(|_| true)
    }

    /// [`Self::weight_uses`] of the nodes `keep` accepts: what one backend of a split graph
    /// prepares.
    pub fn weight_uses_of(&self, keep: impl Fn(&CNode) -> bool) -> Vec<WeightUse> {
        let mut uses: Vec<WeightUse> = Vec::new();
        for node in self.nodes.iter().filter(|n| keep(n)) {
            for (name, multiplied) in node.weight_names() {
                match uses.iter_mut().find(|u| &u.name == name) {
                    Some(u) => u.multiplied |= multiplied,
                    None => uses.push(WeightUse {
                        name: name.clone(),
                        multiplied,
                    }),
                }
            }
        }
        uses
    }

    /// The names of [`Self::weight_uses`].
    pub fn weight_names(&self) -> Vec<String> {
        self.weight_uses().into_iter().map(|u| u.name).collect()
    }

    /// The typed input of `kind`, if the graph has one.
    pub fn input_of(&self, kind: InputKind) -> Option<NodeId> {
        self.inputs
            .iter()
            .copied()
            .find(|&i| self.nodes[i].meta == NodeMeta::Input(kind))
    }

    /// The node named `name`.
    pub fn find(&self, name: &str) -> Option<&CNode> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Makes the input of every weight matrix product a graph output (after the ones it has),
    /// so that its rows outlive the step and can be read back: `minfer imatrix`'s statistics.
    pub fn keep_matmul_inputs(&mut self) {
        for i in 0..self.nodes.len() {
            let node = &self.nodes[i];
            if matches!(node.meta, NodeMeta::MatMul(_)) {
                let input = node.src[0];
                if !self.outputs.contains(&input) {
                    self.outputs.push(input);
                }
            }
        }
    }

    /// The weight matrix products (their weights' names) and the node each reads its input rows
    /// from, in build order.
    pub fn matmul_inputs(&self) -> impl Iterator<Item = (&str, NodeId)> {
        self.nodes.iter().filter_map(|node| match &node.meta {
            NodeMeta::MatMul(m) => Some((m.weight_name.as_str(), node.src[0])),
            _ => None,
        })
    }

    /// Nodes that must execute: the outputs, nodes with side effects, and everything they read.
    pub fn live_nodes(&self) -> Vec<bool> {
        let mut live = vec![false; self.nodes.len()];
        let mut stack: Vec<NodeId> = self.outputs.clone();
        stack.extend(self.nodes.iter().filter(|n| n.op.has_side_effect()).map(|n| n.id));
        stack.extend(self.inputs.iter().copied());
        while let Some(i) = stack.pop() {
            if !live[i] {
                live[i] = true;
                stack.extend(self.nodes[i].src.iter().copied());
            }
        }
        live
    }
}
