//! The backend scheduler: assigns each node to the highest-priority backend that supports it,
//! cuts the graph into splits where the backend changes, and executes split by split in build
//! order, staging values that cross a split boundary. Dead nodes are skipped; a node whose
//! buffer lives on another backend than its split is an error, never a silent fallback.

use super::alloc::GraphAllocator;
use super::backend::{Backend, KvProvider};
use super::ops::Op;
use super::{BufRef, ComputeGraph, GraphError, NodeId};
use std::time::Instant;

/// What a timed stretch of an execution did (see [`Timed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// The node ran on its split's backend.
    Execute,
    /// The node's value was copied to another backend's split that reads it.
    CopyTo(Backend),
    /// The split's backend was waited for before another backend's split.
    Synchronize(Backend),
}

/// One timed stretch of an execution: a node run, a copy across backends, or a wait. Recorded
/// only when the caller asks (a trace, a profile); an untimed execution reads no clock.
#[derive(Clone, Copy, Debug)]
pub struct Timed {
    /// The node run or copied (for a wait, the first node of the split that waited).
    pub node: NodeId,
    /// What was done.
    pub work: Work,
    /// When it started and ended; a backend that queues work asynchronously is timed at its
    /// synchronisation points instead.
    pub start: Instant,
    /// See `start`.
    pub end: Instant,
}

/// Runs `f`, recording its span as `work` on `node` when `timings` asks for it.
fn timed<T>(
    timings: &mut Option<&mut Vec<Timed>>,
    node: NodeId,
    work: Work,
    f: impl FnOnce() -> Result<T, GraphError>,
) -> Result<T, GraphError> {
    match timings {
        None => f(),
        Some(out) => {
            let start = Instant::now();
            let result = f();
            out.push(Timed {
                node,
                work,
                start,
                end: Instant::now(),
            });
            result
        }
    }
}

/// A contiguous run of nodes on one backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    /// The backend that runs every node of the split.
    pub backend: Backend,
    /// `[start, end)` node ids.
    pub node_range: (usize, usize),
    /// Nodes produced on another backend that this split reads (copied in).
    pub inputs: Vec<NodeId>,
    /// Nodes of this split read by another backend.
    pub outputs: Vec<NodeId>,
}

/// Assigns nodes to backends, splits the graph by backend and executes it; stateless.
pub struct BackendScheduler;

impl BackendScheduler {
    /// Give every unassigned node the first backend, in priority order, that supports it.
    pub fn assign_backends(graph: &mut ComputeGraph, alloc: &GraphAllocator) -> Result<(), GraphError> {
        for node in &mut graph.nodes {
            if node.backend.is_none() {
                let b = alloc.supports(node).ok_or_else(|| GraphError::unassignable(node))?;
                node.backend = Some(b);
            }
        }
        Ok(())
    }

    /// Cut the (assigned) graph where the backend changes; dead nodes do not cut.
    pub fn split_graph(graph: &ComputeGraph) -> Vec<Split> {
        let live = graph.live_nodes();
        let mut splits: Vec<Split> = Vec::new();
        for node in graph.nodes.iter().filter(|n| live[n.id]) {
            let b = node.backend.expect("assigned before splitting");
            match splits.last_mut() {
                Some(s) if s.backend == b => s.node_range.1 = node.id + 1,
                _ => splits.push(Split {
                    backend: b,
                    node_range: (node.id, node.id + 1),
                    inputs: vec![],
                    outputs: vec![],
                }),
            }
        }
        let split_of = |id: NodeId| splits.iter().position(|s| s.node_range.0 <= id && id < s.node_range.1);
        let mut edges = Vec::new();
        for (si, s) in splits.iter().enumerate() {
            for node in &graph.nodes[s.node_range.0..s.node_range.1] {
                if !live[node.id] {
                    continue;
                }
                for &src in &node.src {
                    if let Some(pi) = split_of(src) {
                        if splits[pi].backend != s.backend {
                            edges.push((pi, si, src));
                        }
                    }
                }
            }
        }
        for (pi, si, src) in edges {
            if !splits[si].inputs.contains(&src) {
                splits[si].inputs.push(src);
            }
            if !splits[pi].outputs.contains(&src) {
                splits[pi].outputs.push(src);
            }
        }
        splits
    }

    /// Run the graph: split by split, node by node in build order.
    pub fn execute(graph: &ComputeGraph, alloc: &mut GraphAllocator) -> Result<(), GraphError> {
        Self::execute_splits(graph, &Self::split_graph(graph), alloc, &mut Vec::new(), None)
    }

    /// [`Self::execute`] over splits computed once for the graph ([`Self::split_graph`]), with
    /// a reused buffer for each node's input list: what a cached graph runs every step, without
    /// allocating. A failed execution still waits for every backend, so that none is left with
    /// work in flight (or counted as executing) when the error reaches the caller. With
    /// `timings`, every node run, copy and wait is appended to it, in execution order.
    pub fn execute_splits(
        graph: &ComputeGraph,
        splits: &[Split],
        alloc: &mut GraphAllocator,
        in_bufs: &mut Vec<BufRef>,
        timings: Option<&mut Vec<Timed>>,
    ) -> Result<(), GraphError> {
        let result = Self::run_splits(graph, splits, alloc, in_bufs, timings);
        if result.is_err() {
            for handle in splits.iter().map(|s| s.backend) {
                // The execution's own error is the one to report.
                if let Ok(backend) = alloc.backend_mut(handle) {
                    let _ = backend.synchronize();
                }
            }
        }
        result
    }

    fn run_splits(
        graph: &ComputeGraph,
        splits: &[Split],
        alloc: &mut GraphAllocator,
        in_bufs: &mut Vec<BufRef>,
        mut timings: Option<&mut Vec<Timed>>,
    ) -> Result<(), GraphError> {
        let mut previous: Option<Backend> = None;
        for split in splits {
            if let Some(prev) = previous.filter(|&p| p != split.backend) {
                timed(&mut timings, split.node_range.0, Work::Synchronize(prev), || {
                    Ok(alloc.backend_mut(prev)?.synchronize()?)
                })?;
            }
            let waits = timings.is_some();
            for &src in &split.inputs {
                timed(&mut timings, src, Work::CopyTo(split.backend), || {
                    let copied = alloc.copy_across(src, split.backend)?;
                    if waits {
                        alloc.backend_mut(split.backend)?.wait_for_node()?;
                    }
                    Ok(copied)
                })?;
            }
            for node in &graph.nodes[split.node_range.0..split.node_range.1] {
                let Some(out) = alloc.node_buffer(node.id) else {
                    continue; // dead (e.g. a Silu folded into a SwiGLU)
                };
                if matches!(node.op, Op::Input | Op::KvcacheLoad { .. }) {
                    continue; // host-filled, or a view with nothing to compute
                }
                if out.backend != split.backend {
                    return Err(GraphError::SplitMismatch {
                        node: node.name.clone(),
                        expected: split.backend.to_string(),
                        actual: out.backend.to_string(),
                    });
                }
                in_bufs.clear();
                for &src in &node.src {
                    let buf = match alloc.node_buffer(src) {
                        Some(b) if b.backend == split.backend => b,
                        _ => alloc
                            .cross_buffer(src, split.backend)
                            .ok_or_else(|| GraphError::NoBuffer {
                                node: graph.nodes[src].name.clone(),
                            })?,
                    };
                    in_bufs.push(buf);
                }
                let kv = node.kv_layer().and_then(|l| alloc.kv_pair(l));
                timed(&mut timings, node.id, Work::Execute, || {
                    let backend = alloc.backend_mut(split.backend)?;
                    backend.execute_node(node, in_bufs, out, kv)?;
                    if waits {
                        backend.wait_for_node()?;
                    }
                    Ok(())
                })?;
            }
            previous = Some(split.backend);
        }
        if let (Some(prev), Some(last)) = (previous, splits.last()) {
            timed(&mut timings, last.node_range.0, Work::Synchronize(prev), || {
                Ok(alloc.backend_mut(prev)?.synchronize()?)
            })?;
        }
        Ok(())
    }
}
