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
//! `n_tokens` rows of `d` f32 values; I32 inputs are stored as `f32::from_bits` bit patterns.

pub mod alloc;
pub mod backend;
pub mod builder;
pub mod cache;
pub mod export;
pub mod fusion;
pub mod ops;
pub mod params;
pub mod registry;
pub mod scheduler;
pub mod weights;

pub use alloc::GraphAllocator;
pub use backend::{Backend, BackendDevice, BackendError, ComputeBackend, KvProvider};
pub use builder::GraphBuilder;
pub use cache::GraphCache;
pub use ops::{
    AttnMeta, AttnMode, EmbedMeta, FusedFfnMeta, FusedOp, FusedQkvMeta, KvcacheMeta, MatMulMeta, NodeMeta, NormMeta,
    Op, RopeMeta, RopeStyle,
};
pub use params::{CParams, GraphParams, GraphType};
pub use weights::{TensorSource, Weight};

pub type NodeId = usize;

/// Element type of a node's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    /// Integers (token ids, positions) stored as f32 bit patterns.
    I32,
}

/// A buffer in one backend's pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufRef {
    pub backend: Backend,
    pub id: usize,
}

/// One node of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct CNode {
    pub id: NodeId,
    /// Named after the model, e.g. `attn_norm-3`.
    pub name: String,
    pub op: Op,
    pub src: Vec<NodeId>,
    pub out_shape: [usize; 4],
    pub out_dtype: DType,
    /// Decided by the scheduler.
    pub backend: Option<Backend>,
    pub meta: NodeMeta,
}

impl CNode {
    pub fn n_elements(&self) -> usize {
        self.out_shape.iter().product()
    }
}

#[derive(Clone, Debug, Default)]
pub struct ComputeGraph {
    pub nodes: Vec<CNode>,
    pub inputs: Vec<NodeId>,
    pub outputs: Vec<NodeId>,
    /// Assigned by [`GraphCache`] on every (re)build; a reused graph keeps it.
    pub uid: u64,
}

/// Errors of graph construction, allocation and execution.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("graph has a cycle through node {node}")]
    Cycle { node: String },
    #[error("no input named '{name}' in the graph")]
    NoSuchInput { name: String },
    #[error("input '{name}' holds {expected} values, {got} given")]
    InputSize { name: String, expected: usize, got: usize },
    #[error("no backend can run node '{node}' ({op})")]
    Unassignable { node: String, op: &'static str },
    #[error("node '{node}' has no buffer")]
    NoBuffer { node: String },
    #[error("node '{node}' is assigned to {expected} but its buffer is on {actual}")]
    SplitMismatch {
        node: String,
        expected: String,
        actual: String,
    },
    #[error("backend {name} is not part of this allocator")]
    MissingBackend { name: String },
    #[error(transparent)]
    Backend(#[from] BackendError),
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

    /// The node named `name`.
    pub fn find(&self, name: &str) -> Option<&CNode> {
        self.nodes.iter().find(|n| n.name == name)
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
