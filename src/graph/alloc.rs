//! The graph allocator: the single owner of buffers. It holds the backends (and so their
//! pools), maps every live node to a buffer by liveness in build order, keeps the two
//! persistent KV regions of each layer across rebuilds, and stages values across backends.
//!
//! Rules (Compute Graph Design §3.3): liveness uses build order, never a Kahn order; inputs and
//! outputs are never freed; Silu, Gelu, Scale, Softcap and RoPE alias their input's buffer only when that input's
//! sole consumer is the node and both are on the same backend; dead nodes get no buffer.

use super::backend::{Backend, BackendError, ComputeBackend, KvProvider};
use super::ops::{KvcacheMeta, NodeMeta, Op};
use super::{BufRef, ComputeGraph, DType, GraphError, NodeId};
use std::collections::HashMap;

/// Owns the backends' execution contexts and maps graph nodes to their buffers; keeps each
/// layer's K and V regions across graphs.
pub struct GraphAllocator {
    backends: Vec<Box<dyn ComputeBackend>>,
    node_to_buf: HashMap<NodeId, BufRef>,
    /// Split-boundary staging: a value produced on one backend, copied for a consumer on another.
    cross: HashMap<(NodeId, Backend), BufRef>,
    /// Per-layer persistent [K, V] regions; they outlive every graph.
    kv: HashMap<usize, [BufRef; 2]>,
    /// Host bytes a cross-backend copy passes through, kept between executions so that a
    /// reused graph's copies allocate nothing.
    staging: Vec<u8>,
}

impl GraphAllocator {
    /// An allocator over `backends` (in priority order; the scheduler assigns in this order).
    pub fn new(backends: Vec<Box<dyn ComputeBackend>>) -> Self {
        GraphAllocator {
            backends,
            node_to_buf: HashMap::new(),
            cross: HashMap::new(),
            kv: HashMap::new(),
            staging: Vec::new(),
        }
    }

    /// The execution contexts, in priority order.
    pub fn backends(&self) -> impl Iterator<Item = &dyn ComputeBackend> {
        self.backends.iter().map(|b| b.as_ref())
    }

    /// The context of backend `handle`, or [`GraphError::MissingBackend`].
    pub fn backend(&self, handle: Backend) -> Result<&dyn ComputeBackend, GraphError> {
        self.backends
            .iter()
            .find(|b| b.handle() == handle)
            .map(|b| b.as_ref())
            .ok_or_else(|| GraphError::MissingBackend {
                name: handle.to_string(),
            })
    }

    /// The context of backend `handle`, mutably, or [`GraphError::MissingBackend`].
    pub fn backend_mut(&mut self, handle: Backend) -> Result<&mut (dyn ComputeBackend + 'static), GraphError> {
        self.backends
            .iter_mut()
            .find(|b| b.handle() == handle)
            .map(|b| b.as_mut())
            .ok_or_else(|| GraphError::MissingBackend {
                name: handle.to_string(),
            })
    }

    /// The first backend (by priority) that can run `node`: its op producing its dtype, with
    /// its payload, over weights of its types.
    pub fn supports(&self, node: &super::CNode) -> Option<Backend> {
        let types = node.weight_types();
        self.backends
            .iter()
            .find(|b| {
                b.supports_op(&node.op, node.out_dtype)
                    && b.supports_meta(&node.meta)
                    && types.iter().all(|&t| b.supports_weight(t))
            })
            .map(|b| b.handle())
    }

    /// The buffer holding node `id`'s output; `None` for a dead node or before allocation.
    pub fn node_buffer(&self, id: NodeId) -> Option<BufRef> {
        self.node_to_buf.get(&id).copied()
    }

    /// The staging copy of node `id` on `backend`, made by [`GraphAllocator::copy_across`].
    pub fn cross_buffer(&self, id: NodeId, backend: Backend) -> Option<BufRef> {
        self.cross.get(&(id, backend)).copied()
    }

    /// The layer's KV regions, allocating them on `backend` on first use.
    fn ensure_kv(&mut self, layer: usize, backend: Backend, meta: &KvcacheMeta) -> Result<[BufRef; 2], GraphError> {
        if let Some(pair) = self.kv.get(&layer) {
            return Ok(*pair);
        }
        let len = meta.n_kv_embd * meta.n_ctx;
        let b = self.backend_mut(backend)?;
        let pair = [
            BufRef {
                backend,
                id: b.alloc_fresh(meta.type_k.bytes(len), meta.type_k),
            },
            BufRef {
                backend,
                id: b.alloc_fresh(meta.type_v.bytes(len), meta.type_v),
            },
        ];
        self.kv.insert(layer, pair);
        Ok(pair)
    }

    /// The layers whose KV regions exist (those a graph has run with), in order.
    pub fn kv_layers(&self) -> Vec<usize> {
        let mut layers: Vec<usize> = self.kv.keys().copied().collect();
        layers.sort_unstable();
        layers
    }

    /// Read the start of a layer's K (`v = false`) or V region into `dst`, through its backend.
    pub fn read_kv(&mut self, layer: usize, v: bool, dst: &mut [u8]) -> Result<(), GraphError> {
        let buf = self.kv_buffer(layer, v)?;
        Ok(self.backend_mut(buf.backend)?.read_buffer(buf.id, 0, dst)?)
    }

    /// Overwrite the start of a layer's K or V region with `src`, through its backend.
    pub fn write_kv(&mut self, layer: usize, v: bool, src: &[u8]) -> Result<(), GraphError> {
        let buf = self.kv_buffer(layer, v)?;
        Ok(self.backend_mut(buf.backend)?.write_buffer(buf.id, 0, src)?)
    }

    /// Read a layer's K (`v = false`) or V region from byte `offset` into `dst`.
    pub fn read_kv_at(&mut self, layer: usize, v: bool, offset: usize, dst: &mut [u8]) -> Result<(), GraphError> {
        let buf = self.kv_buffer(layer, v)?;
        Ok(self.backend_mut(buf.backend)?.read_buffer(buf.id, offset, dst)?)
    }

    /// Overwrite a layer's K or V region from byte `offset` with `src`.
    pub fn write_kv_at(&mut self, layer: usize, v: bool, offset: usize, src: &[u8]) -> Result<(), GraphError> {
        let buf = self.kv_buffer(layer, v)?;
        Ok(self.backend_mut(buf.backend)?.write_buffer(buf.id, offset, src)?)
    }

    /// Turn rows of a layer's K region by a context shift, on the backend that holds it.
    pub fn shift_k(&mut self, layer: usize, shift: &super::KShift) -> Result<(), GraphError> {
        let buf = self.kv_buffer(layer, false)?;
        Ok(self.backend_mut(buf.backend)?.rope_shift(buf.id, shift)?)
    }

    /// Make cell `i` of a layer's K (`v = false`) or V region hold what cell `from[i]` held
    /// (cells of `row_bytes` bytes), on the backend that holds it.
    pub fn gather_kv(&mut self, layer: usize, v: bool, row_bytes: usize, from: &[u32]) -> Result<(), GraphError> {
        let buf = self.kv_buffer(layer, v)?;
        Ok(self.backend_mut(buf.backend)?.gather_rows(buf.id, row_bytes, from)?)
    }

    fn kv_buffer(&self, layer: usize, v: bool) -> Result<BufRef, GraphError> {
        self.kv
            .get(&layer)
            .map(|pair| pair[usize::from(v)])
            .ok_or_else(|| GraphError::NoSuchInput {
                name: format!("the KV region of layer {layer}"),
            })
    }

    fn is_kv_buffer(&self, buf: BufRef) -> bool {
        self.kv.values().any(|pair| pair.contains(&buf))
    }

    /// Forget the KV regions' contents' validity is the caller's business; this drops them
    /// (e.g. when the context size changes).
    pub fn reset_kv(&mut self) -> Result<(), GraphError> {
        for (_, pair) in std::mem::take(&mut self.kv) {
            for buf in pair {
                self.backend_mut(buf.backend)?.free_buffer(buf.id);
            }
        }
        Ok(())
    }

    /// Release the previous graph's buffers (never the KV regions) to their pools.
    fn release(&mut self) -> Result<(), GraphError> {
        let mut seen = std::collections::HashSet::new();
        let bufs: Vec<BufRef> = self
            .node_to_buf
            .drain()
            .map(|(_, b)| b)
            .chain(self.cross.drain().map(|(_, b)| b))
            .collect();
        for buf in bufs {
            if !self.is_kv_buffer(buf) && seen.insert(buf) {
                self.backend_mut(buf.backend)?.free_buffer(buf.id);
            }
        }
        Ok(())
    }

    /// Map every live node of `graph` (whose backends are assigned) to a buffer.
    pub fn alloc_graph(&mut self, graph: &ComputeGraph) -> Result<(), GraphError> {
        self.release()?;
        graph.topo_order()?;
        let n = graph.nodes.len();
        let live = graph.live_nodes();

        // Liveness in build order: a buffer may be reused once its last reader has run.
        let mut last_use: Vec<usize> = (0..n).collect();
        let mut consumers = vec![0usize; n];
        for node in graph.nodes.iter().filter(|node| live[node.id]) {
            for &s in &node.src {
                last_use[s] = last_use[s].max(node.id);
                consumers[s] += 1;
            }
        }
        for &id in graph.outputs.iter().chain(&graph.inputs) {
            last_use[id] = usize::MAX;
        }
        let mut frees_at: Vec<Vec<NodeId>> = vec![Vec::new(); n];
        for (id, &last) in last_use.iter().enumerate() {
            if live[id] && last != usize::MAX {
                frees_at[last].push(id);
            }
        }

        // The host fills every input before any node runs, so an input's live range starts at 0
        // whatever its build position: its buffer is taken before the walk, where no buffer a
        // node frees can be handed to it (an input built late would otherwise be overwritten).
        for &id in &graph.inputs {
            let node = &graph.nodes[id];
            let backend = node.backend.ok_or_else(|| GraphError::unassignable(node))?;
            let buf = BufRef {
                backend,
                id: self.backend_mut(backend)?.alloc_buffer(node.n_bytes(), node.out_dtype),
            };
            self.node_to_buf.insert(id, buf);
        }

        for node in &graph.nodes {
            if !live[node.id] || graph.inputs.contains(&node.id) {
                continue;
            }
            let backend = node.backend.ok_or_else(|| GraphError::unassignable(node))?;
            let buf = match &node.op {
                Op::KvcacheStore { layer } | Op::KvcacheLoad { layer } => {
                    let NodeMeta::Kvcache(m) = &node.meta else {
                        return Err(GraphError::unassignable(node));
                    };
                    self.ensure_kv(*layer, backend, m)?[0]
                }
                Op::Silu | Op::Gelu | Op::Scale { .. } | Op::Softcap { .. } | Op::RoPE
                    if self.can_alias(graph, node.src[0], backend, &consumers) =>
                {
                    let src = node.src[0];
                    // The node takes over its input's buffer: the input must not free it.
                    frees_at[last_use[src]].retain(|&x| x != src);
                    self.node_to_buf[&src]
                }
                _ => {
                    // Fused Q/K/V nodes store into the layer's regions, but their output (the
                    // roped Q) is an ordinary buffer.
                    if let (Op::FusedQKV { layer } | Op::FusedQkvNorm { layer }, NodeMeta::FusedQkv(m)) =
                        (&node.op, &node.meta)
                    {
                        self.ensure_kv(*layer, backend, &m.kv)?;
                    }
                    BufRef {
                        backend,
                        id: self.backend_mut(backend)?.alloc_buffer(node.n_bytes(), node.out_dtype),
                    }
                }
            };
            self.node_to_buf.insert(node.id, buf);
            for &expired in &frees_at[node.id] {
                let buf = self.node_to_buf[&expired];
                if !self.is_kv_buffer(buf) {
                    self.backend_mut(buf.backend)?.free_buffer(buf.id);
                }
            }
        }
        // What this graph did not take back from the pools is memory no step of it uses.
        for backend in &mut self.backends {
            let handle = backend.handle();
            let used: std::collections::HashSet<usize> = self
                .node_to_buf
                .values()
                .chain(self.cross.values())
                .chain(self.kv.values().flatten())
                .filter(|b| b.backend == handle)
                .map(|b| b.id)
                .collect();
            backend.trim_free(&used);
        }
        Ok(())
    }

    fn can_alias(&self, graph: &ComputeGraph, src: NodeId, backend: Backend, consumers: &[usize]) -> bool {
        let s = &graph.nodes[src];
        consumers[src] == 1
            && s.backend == Some(backend)
            && !graph.inputs.contains(&src)
            && !graph.outputs.contains(&src)
            && s.op.kv_layer().is_none()
            && self.node_to_buf.get(&src).is_some_and(|b| b.backend == backend)
    }

    /// Stage `node`'s value for a consumer on `dst`: copied out of its backend into the host
    /// staging bytes, then into a buffer of `dst`. The staging buffer is created once per graph
    /// and rewritten on every execution; the host bytes are reused across executions.
    pub fn copy_across(&mut self, node: NodeId, dst: Backend) -> Result<BufRef, GraphError> {
        let src = self
            .node_to_buf
            .get(&node)
            .copied()
            .ok_or_else(|| GraphError::NoBuffer { node: node.to_string() })?;
        let (bytes, dtype) = self.buffer_info(src)?;
        let mut staging = std::mem::take(&mut self.staging);
        staging.resize(bytes, 0);
        let copied = (|| {
            self.backend_mut(src.backend)?.read_buffer(src.id, 0, &mut staging)?;
            let target = match self.cross.get(&(node, dst)) {
                Some(b) => *b,
                None => {
                    let b = BufRef {
                        backend: dst,
                        id: self.backend_mut(dst)?.alloc_fresh(bytes, dtype),
                    };
                    self.cross.insert((node, dst), b);
                    b
                }
            };
            self.backend_mut(dst)?.write_buffer(target.id, 0, &staging)?;
            Ok(target)
        })();
        self.staging = staging;
        copied
    }

    /// The size and element type of `buf`.
    fn buffer_info(&self, buf: BufRef) -> Result<(usize, DType), GraphError> {
        self.backend(buf.backend)?.buffer_info(buf.id).ok_or_else(|| {
            GraphError::Backend(BackendError::Buffer {
                backend: buf.backend.to_string(),
                id: buf.id,
                problem: "does not exist".into(),
            })
        })
    }

    /// The input node named `name`.
    fn input_named(graph: &ComputeGraph, name: &str) -> Result<NodeId, GraphError> {
        graph
            .inputs
            .iter()
            .copied()
            .find(|&i| graph.nodes[i].name == name)
            .ok_or_else(|| GraphError::NoSuchInput { name: name.to_string() })
    }

    /// Fill input `name` with `bytes`, which must be exactly its size.
    pub fn fill_input_bytes(&mut self, graph: &ComputeGraph, name: &str, bytes: &[u8]) -> Result<(), GraphError> {
        self.fill_node(graph, Self::input_named(graph, name)?, None, bytes, false)
    }

    /// Fill an F32 input.
    pub fn fill_input(&mut self, graph: &ComputeGraph, name: &str, data: &[f32]) -> Result<(), GraphError> {
        let id = Self::input_named(graph, name)?;
        self.fill_node(graph, id, Some(DType::F32), bytemuck::cast_slice(data), false)
    }

    /// Fill an I32 input.
    pub fn fill_input_i32(&mut self, graph: &ComputeGraph, name: &str, data: &[i32]) -> Result<(), GraphError> {
        let id = Self::input_named(graph, name)?;
        self.fill_node(graph, id, Some(DType::I32), bytemuck::cast_slice(data), false)
    }

    /// Fill the I32 input node `input` (as the engine does, by the node it found by kind).
    pub fn fill_node_i32(&mut self, graph: &ComputeGraph, input: NodeId, data: &[i32]) -> Result<(), GraphError> {
        self.fill_node(graph, input, Some(DType::I32), bytemuck::cast_slice(data), false)
    }

    /// Write `data` over the first elements of an i32 input, leaving the rest as it was: for an
    /// input sized for the most a step can need (the explicit-span cell lists, whose readers
    /// stop where the spans say), so a step pays for what it lists, not for the bound.
    pub fn fill_node_i32_prefix(
        &mut self,
        graph: &ComputeGraph,
        input: NodeId,
        data: &[i32],
    ) -> Result<(), GraphError> {
        self.fill_node(graph, input, Some(DType::I32), bytemuck::cast_slice(data), true)
    }

    /// Write `bytes` into input node `id`'s buffer, checking that it is an input, that `dtype`
    /// (when given) is its element type and that `bytes` is exactly its size (with `prefix`, at
    /// most its size: the rest is left as it was).
    fn fill_node(
        &mut self,
        graph: &ComputeGraph,
        id: NodeId,
        dtype: Option<DType>,
        bytes: &[u8],
        prefix: bool,
    ) -> Result<(), GraphError> {
        let node = graph
            .nodes
            .get(id)
            .filter(|_| graph.inputs.contains(&id))
            .ok_or_else(|| GraphError::NoSuchInput {
                name: format!("node #{id}"),
            })?;
        if let Some(dtype) = dtype.filter(|&d| d != node.out_dtype) {
            return Err(GraphError::InputType {
                name: node.name.clone(),
                expected: node.out_dtype.name(),
                got: dtype.name(),
            });
        }
        if bytes.len() > node.n_bytes() || (!prefix && bytes.len() != node.n_bytes()) {
            return Err(GraphError::InputSize {
                name: node.name.clone(),
                expected: node.n_bytes(),
                got: bytes.len(),
            });
        }
        let buf = self.node_buffer(id).ok_or_else(|| GraphError::NoBuffer {
            node: node.name.clone(),
        })?;
        Ok(self.backend_mut(buf.backend)?.write_buffer(buf.id, 0, bytes)?)
    }

    /// Copy a node's output into `dst` (exactly its size in bytes).
    pub fn read_bytes(&mut self, graph: &ComputeGraph, node: NodeId, dst: &mut [u8]) -> Result<(), GraphError> {
        let buf = self.node_buffer(node).ok_or_else(|| GraphError::NoBuffer {
            node: graph.nodes[node].name.clone(),
        })?;
        let expected = graph.nodes[node].n_bytes();
        if dst.len() != expected {
            return Err(GraphError::OutputSize {
                node: graph.nodes[node].name.clone(),
                expected,
                got: dst.len(),
            });
        }
        Ok(self.backend_mut(buf.backend)?.read_buffer(buf.id, 0, dst)?)
    }

    /// Copy an F32 node's output into `dst`, resized to its element count (a reused `dst`
    /// allocates only when it must grow).
    pub fn read_f32(&mut self, graph: &ComputeGraph, node: NodeId, dst: &mut Vec<f32>) -> Result<(), GraphError> {
        let n = &graph.nodes[node];
        if n.out_dtype != DType::F32 {
            return Err(GraphError::InputType {
                name: n.name.clone(),
                expected: n.out_dtype.name(),
                got: DType::F32.name(),
            });
        }
        dst.resize(n.n_elements(), 0.0);
        self.read_bytes(graph, node, bytemuck::cast_slice_mut(dst))
    }

    /// Buffers each backend's pool holds (to check that reuse does not grow them).
    pub fn pool_sizes(&self) -> Vec<(Backend, usize)> {
        self.backends.iter().map(|b| (b.handle(), b.pool_len())).collect()
    }
}

impl KvProvider for GraphAllocator {
    fn kv_pair(&self, layer: usize) -> Option<(usize, usize)> {
        self.kv.get(&layer).map(|[k, v]| (k.id, v.id))
    }
}
