//! The one device seam: the backend handle, the [`BackendDevice`] a process makes once per
//! backend and shares between its sessions, the [`ComputeBackend`] execution context each
//! session gets from it (its own buffers), and [`KvProvider`], the only way an executor reaches
//! the persistent KV regions.
//!
//! The split follows ggml's device and backend: what is worth having once per process (weights
//! prepared for the device, threads, device handles) belongs to the device; what a sequence's
//! forward pass writes (activations, KV) belongs to a context, so sessions never share a buffer.

use super::ops::{FusedOp, Op};
use super::{BufRef, CNode, DType};
use std::fmt;

/// A backend handle over a fixed id space. The ids are a file-format contract (saved KV
/// sessions name them), so they are appended, never renumbered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Backend(pub u16);

impl Backend {
    pub const CPU: Backend = Backend(0);
    pub const METAL: Backend = Backend(1);
    pub const CUDA: Backend = Backend(2);
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match super::registry::entry(*self) {
            Some(e) => f.write_str(e.name),
            None => write!(f, "backend#{}", self.0),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{backend} cannot run node '{node}' ({op})")]
    Unsupported {
        backend: String,
        node: String,
        op: &'static str,
    },
    #[error("{backend}: node '{node}': {message}")]
    Node {
        backend: String,
        node: String,
        message: String,
    },
    #[error("{backend}: node '{node}' names weight '{weight}', which is not registered")]
    MissingWeight {
        backend: String,
        node: String,
        weight: String,
    },
    #[error("{backend}: buffer {id} {problem}")]
    Buffer {
        backend: String,
        id: usize,
        problem: String,
    },
}

/// Resolves a layer's persistent (K, V) regions to buffer ids of the backend that holds them.
pub trait KvProvider {
    fn kv_pair(&self, layer: usize) -> Option<(usize, usize)>;
}

/// A backend as the process holds it: made once, shared by every session (behind an `Arc`),
/// and asked for one [`ComputeBackend`] context per session.
pub trait BackendDevice: Send + Sync {
    fn handle(&self) -> Backend;
    fn name(&self) -> &str;
    /// Host threads the device runs nodes on (1 for a device that computes elsewhere).
    fn n_threads(&self) -> usize;
    /// Bytes the device prepared from the weights and holds itself (uploads, repacked copies);
    /// 0 for a device that reads them in place.
    fn weights_bytes(&self) -> usize {
        0
    }
    /// A new execution context: an empty buffer pool over this device's weights and threads.
    fn new_context(&self) -> Box<dyn ComputeBackend>;
}

/// One session's execution context on a device. Buffers are f32 arrays in the backend's own pool,
/// addressed by id; the allocator decides which node uses which buffer.
pub trait ComputeBackend: Send {
    fn handle(&self) -> Backend;
    fn name(&self) -> &str;
    /// The capability matrix: can this backend execute `op` producing `dtype`?
    fn supports_op(&self, op: &Op, dtype: DType) -> bool;
    fn supports_fused(&self, fused: FusedOp) -> bool;

    /// A buffer of `len` f32 values, recycled from the free list when one of that length is free.
    fn alloc_buffer(&mut self, len: usize) -> usize;
    fn free_buffer(&mut self, id: usize);
    /// A buffer that bypasses the free list (split-boundary staging must not be recycled within
    /// one execution).
    fn alloc_fresh(&mut self, len: usize) -> usize;
    fn pool_len(&self) -> usize;

    /// Execute one node. `in_bufs[i]` holds `node.src[i]`; `kv_pair` is the layer's (K, V)
    /// regions for KV and attention nodes. An unsupported node is an error, never a fallback.
    fn execute_node(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError>;

    fn read_host(&self, id: usize) -> Option<&[f32]>;
    /// Overwrite buffer `id` with `data`, which must have exactly its length.
    fn write_host(&mut self, id: usize, data: &[f32]) -> Result<(), BackendError>;
    /// Write `data` at `offset` into buffer `id` (used to fill only part of a buffer).
    fn write_host_window(&mut self, id: usize, offset: usize, data: &[f32]) -> Result<(), BackendError>;
    /// Wait for all work submitted to this backend.
    fn synchronize(&mut self);
}
