//! Graph reuse: the cache keeps the last graph, its allocator (and so the KV regions) and the
//! params it was built for. Equal params reuse the graph as is; any difference rebuilds it —
//! build, assign backends, fuse, allocate — with a fresh uid, keeping the allocator.

use super::alloc::GraphAllocator;
use super::fusion::FusionPass;
use super::params::GraphParams;
use super::scheduler::{BackendScheduler, Split, Timed};
use super::{BufRef, ComputeGraph, GraphError};
use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_GRAPH_UID: AtomicU64 = AtomicU64::new(1);

/// The last graph, its allocator and the params it was built for, so that a decode step with the
/// same [`GraphParams`] reuses the graph and its buffers instead of rebuilding.
pub struct GraphCache {
    graph: Option<ComputeGraph>,
    alloc: GraphAllocator,
    prev_params: Option<GraphParams>,
    rebuilds: usize,
    /// The cached graph's splits, computed once when it is built.
    splits: Vec<Split>,
    /// Each node's input buffers while executing, reused.
    in_bufs: Vec<BufRef>,
    /// Whether a reuse of the cached graph was checked against a fresh build.
    #[cfg(debug_assertions)]
    reuse_verified: bool,
}

impl GraphCache {
    /// An empty cache over `alloc`; the first [`GraphCache::prepare`] builds.
    pub fn new(alloc: GraphAllocator) -> Self {
        GraphCache {
            graph: None,
            alloc,
            prev_params: None,
            rebuilds: 0,
            splits: Vec::new(),
            in_bufs: Vec::new(),
            #[cfg(debug_assertions)]
            reuse_verified: false,
        }
    }

    /// Whether the cached graph was built for exactly these params (every field counts,
    /// including the fusion flags and the backend fence).
    pub fn try_reuse(&self, params: &GraphParams) -> bool {
        self.graph.is_some() && self.prev_params.as_ref() == Some(params)
    }

    /// Make the cached graph the one for `params`, building it with `build` only when the params
    /// differ from the last ones. Returns whether the graph was reused.
    pub fn prepare(
        &mut self,
        params: &GraphParams,
        build: impl Fn(&GraphParams) -> ComputeGraph,
    ) -> Result<bool, GraphError> {
        if self.try_reuse(params) {
            // The reuse invariant, checked structurally in debug builds on the first reuse of
            // each graph (later steps allocate nothing): equal params must build an identical
            // graph.
            #[cfg(debug_assertions)]
            if !self.reuse_verified {
                self.reuse_verified = true;
                let fresh = build(params);
                let cached = self.graph.as_ref().expect("try_reuse saw a graph");
                debug_assert!(
                    verify_structural_unfused(&fresh, cached),
                    "graph builder is not deterministic in its params"
                );
            }
            return Ok(true);
        }
        let mut graph = build(params);
        if let Some(n_gpu_layers) = params.cparams.n_gpu_layers {
            super::offload::pin_to_cpu(&mut graph, n_gpu_layers);
        }
        BackendScheduler::assign_backends(&mut graph, &self.alloc)?;
        FusionPass::run(&mut graph, &self.alloc);
        self.alloc.alloc_graph(&graph)?;
        self.splits = BackendScheduler::split_graph(&graph);
        #[cfg(debug_assertions)]
        {
            self.reuse_verified = false;
        }
        graph.uid = NEXT_GRAPH_UID.fetch_add(1, Ordering::Relaxed);
        self.graph = Some(graph);
        self.prev_params = Some(params.clone());
        self.rebuilds += 1;
        Ok(false)
    }

    /// The cached graph, if one was prepared.
    pub fn graph(&self) -> Option<&ComputeGraph> {
        self.graph.as_ref()
    }

    /// The allocator (and so the backends' contexts and the KV regions).
    pub fn alloc(&self) -> &GraphAllocator {
        &self.alloc
    }

    /// The allocator, mutably (to fill inputs or reset the KV regions).
    pub fn alloc_mut(&mut self) -> &mut GraphAllocator {
        &mut self.alloc
    }

    /// The graph and the allocator together, for filling inputs and reading outputs.
    pub fn parts(&mut self) -> Option<(&ComputeGraph, &mut GraphAllocator)> {
        self.graph.as_ref().map(|g| (g, &mut self.alloc))
    }

    /// Execute the cached graph; with `timings`, each node's run (and each copy and wait) is
    /// appended to it.
    pub fn execute(&mut self, timings: Option<&mut Vec<Timed>>) -> Result<(), GraphError> {
        let graph = self.graph.as_ref().ok_or_else(|| GraphError::NoBuffer {
            node: "<no graph>".into(),
        })?;
        BackendScheduler::execute_splits(graph, &self.splits, &mut self.alloc, &mut self.in_bufs, timings)
    }

    /// The cached graph's splits (backend runs), as executed.
    pub fn splits(&self) -> &[Split] {
        &self.splits
    }

    /// How many times a graph was built (the first build included).
    pub fn rebuild_count(&self) -> usize {
        self.rebuilds
    }
}

/// Whether two graphs have the same nodes: op with full payloads, shape, dtype, sources and
/// metadata, in the same order, and the same inputs and outputs. Backend assignment is ignored.
pub fn verify_structural(a: &ComputeGraph, b: &ComputeGraph) -> bool {
    a.nodes.len() == b.nodes.len()
        && a.inputs == b.inputs
        && a.outputs == b.outputs
        && a.nodes.iter().zip(&b.nodes).all(|(x, y)| {
            x.name == y.name
                && x.op == y.op
                && x.src == y.src
                && x.out_shape == y.out_shape
                && x.out_dtype == y.out_dtype
                && x.meta == y.meta
        })
}

/// [`verify_structural`] between a freshly built graph and a cached one that went through the
/// fusion pass: a fused node is compared with the pattern it replaced.
#[cfg(debug_assertions)]
fn verify_structural_unfused(fresh: &ComputeGraph, cached: &ComputeGraph) -> bool {
    use super::ops::Op;
    fresh.nodes.len() == cached.nodes.len()
        && fresh.inputs == cached.inputs
        && fresh.outputs == cached.outputs
        && fresh.nodes.iter().zip(&cached.nodes).all(|(x, y)| {
            let same_op = x.op == y.op && x.src == y.src || (x.op == Op::Mul && y.op == Op::SwiGLU);
            x.name == y.name && same_op && x.out_shape == y.out_shape && x.meta == y.meta
        })
}
