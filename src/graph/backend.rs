//! The one device seam: the backend handle, the [`BackendDevice`] a process makes once per
//! backend and shares between its sessions, the [`ComputeBackend`] execution context each
//! session gets from it (its own buffers), and [`KvProvider`], the only way an executor reaches
//! the persistent KV regions.
//!
//! The split follows ggml's device and backend: what is worth having once per process (weights
//! prepared for the device, threads, device handles) belongs to the device; what a sequence's
//! forward pass writes (activations, KV) belongs to a context, so sessions never share a buffer.

use super::ops::{FusedOp, NodeMeta, Op, RopeMeta};
use super::{BufRef, CNode, DType, TensorSource, WeightUse};
use std::fmt;

/// A backend handle over a fixed id space. The ids are a file-format contract (saved KV
/// sessions name them), so they are appended, never renumbered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Backend(pub u16);

impl Backend {
    /// The host CPU backend, always built in.
    pub const CPU: Backend = Backend(0);
    /// Apple's Metal.
    pub const METAL: Backend = Backend(1);
    /// NVIDIA CUDA.
    pub const CUDA: Backend = Backend(2);
    /// wgpu: Vulkan, Metal or DX12, whichever the platform's GPU speaks.
    pub const WGPU: Backend = Backend(3);
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match super::registry::entry(*self) {
            Some(e) => f.write_str(e.name),
            None => write!(f, "backend#{}", self.0),
        }
    }
}

/// Why a backend could not run a node or access a buffer.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The backend was handed a node whose op (or op and payload) it cannot run.
    #[error("{backend} cannot run node '{node}' ({op})")]
    Unsupported {
        /// The backend's name.
        backend: String,
        /// The node's name.
        node: String,
        /// The node's op ([`Op::name`]).
        op: &'static str,
    },
    /// A kernel refused the node's operands, or the node lacked something it needs (a buffer, KV
    /// regions, a weight of the right type).
    #[error("{backend}: node '{node}': {message}")]
    Node {
        /// The backend's name.
        backend: String,
        /// The node's name.
        node: String,
        /// What went wrong.
        message: String,
    },
    /// A node names a weight its backend's [`TensorSource`] does not have.
    #[error("{backend}: node '{node}' names weight '{weight}', which is not registered")]
    MissingWeight {
        /// The backend's name.
        backend: String,
        /// The node's name.
        node: String,
        /// The weight name.
        weight: String,
    },
    /// A host read or write of a buffer failed: no such buffer, a length mismatch, a window past its
    /// end, or a buffer the host cannot read.
    #[error("{backend}: buffer {id} {problem}")]
    Buffer {
        /// The backend's name.
        backend: String,
        /// The buffer's id in the backend's pool.
        id: usize,
        /// What is wrong with it.
        problem: String,
    },
    /// The device could not measure itself (its memory's bandwidth, for `bench`).
    #[error("{backend}: measuring the device: {message}")]
    Measure {
        /// The backend's name.
        backend: String,
        /// What went wrong.
        message: String,
    },
    /// The device could not prepare a weight (upload it, repack it) when the model loaded.
    #[error("{backend}: preparing weight '{weight}': {message}")]
    Prepare {
        /// The backend's name.
        backend: String,
        /// The weight's name.
        weight: String,
        /// What went wrong.
        message: String,
    },
}

/// Bytes `offset..offset + len` of buffer `id`, which holds `bytes` bytes on `backend`: the range
/// a `read_buffer` or `write_buffer` may touch, or the error naming both.
pub fn buffer_window(
    backend: &str,
    id: usize,
    bytes: usize,
    offset: usize,
    len: usize,
) -> Result<std::ops::Range<usize>, BackendError> {
    offset
        .checked_add(len)
        .filter(|&end| end <= bytes)
        .map(|end| offset..end)
        .ok_or_else(|| BackendError::Buffer {
            backend: backend.into(),
            id,
            problem: format!("bytes {offset}..{offset}+{len} are outside its {bytes}"),
        })
}

/// A context shift's re-rotation of K rows (llama.cpp's K-shift): rows `first_row..first_row +
/// n_rows` of a K region, `rope.n_head` (= n_head_kv) heads each, turn by `delta` positions of
/// RoPE. A rotation, so exact up to rounding; an f16 or Q8_0 row is converted to f32 for it and
/// back, as llama.cpp does.
#[derive(Clone, Debug, PartialEq)]
pub struct KShift {
    /// The first row (cell) to turn.
    pub first_row: usize,
    /// Rows to turn.
    pub n_rows: usize,
    /// Positions to turn by (negative: back, after a discard).
    pub delta: i32,
    /// The model's rotation, with `n_head` the KV heads.
    pub rope: RopeMeta,
}

/// Resolves a layer's persistent (K, V) regions to buffer ids of the backend that holds them.
pub trait KvProvider {
    /// Buffer ids of `layer`'s (K, V) regions, or `None` before they are allocated.
    fn kv_pair(&self, layer: usize) -> Option<(usize, usize)>;
}

/// A backend as the process holds it: made once, shared by every session (behind an `Arc`),
/// and asked for one [`ComputeBackend`] context per session.
pub trait BackendDevice: Send + Sync {
    /// This device's backend handle.
    fn handle(&self) -> Backend;
    /// The backend's name, as the registry spells it (`cpu`).
    fn name(&self) -> &str;
    /// Host threads the device runs nodes on (1 for a device that computes elsewhere).
    fn n_threads(&self) -> usize;
    /// The hardware's own name (a GPU's, as its driver reports it), for reports; `None` for the
    /// host CPU.
    fn device_name(&self) -> Option<String> {
        None
    }
    /// Bytes of memory free on the device for weights and buffers, for `-ngl auto`; `None` for
    /// a device that shares the host's memory.
    fn free_memory(&self) -> Option<usize> {
        None
    }
    /// Bytes the device prepared from the weights and holds itself (uploads, repacked copies);
    /// 0 for a device that reads them in place.
    fn weights_bytes(&self) -> usize {
        0
    }
    /// The bandwidth of the device's memory in GB/s, over a buffer larger than any cache: what
    /// bounds a generated token, which reads every weight once (`bench --bandwidth`). A GPU
    /// measures a device-to-device copy (bytes read plus bytes written per second), the CPU a
    /// read with its threads. `None` for a device that cannot measure it (too little memory
    /// free to get past its caches).
    fn copy_bandwidth(&self) -> Result<Option<f64>, BackendError> {
        Ok(None)
    }
    /// Prepare the weights `weights` names once for the process, before any context exists:
    /// upload them to device memory, repack them for the device's kernels, or (the default, a
    /// device that reads the memory-mapped file in place) nothing. A weight the device cannot
    /// hold is an error naming it, never a silent fallback.
    fn prepare_weights(&mut self, source: &dyn TensorSource, weights: &[WeightUse]) -> Result<(), BackendError> {
        let _ = (source, weights);
        Ok(())
    }
    /// A new execution context: an empty buffer pool over this device's weights and threads.
    fn new_context(&self) -> Box<dyn ComputeBackend>;
    /// The kernels the device multiplies `matrices` (each a weight's type and GGUF shape) by
    /// `n_tokens` activation rows with, for `bench`'s `kernels` column; `None` for a device
    /// that does not name them.
    fn matmul_kernels(&self, matrices: &[(crate::quant::GgmlType, Vec<u64>)], n_tokens: usize) -> Option<String> {
        let _ = (matrices, n_tokens);
        None
    }
}

/// One session's execution context on a device. Buffers are bytes of a [`DType`] in the
/// backend's own memory, addressed by id, which the host never borrows: it writes and reads
/// them by copy (ggml's `set_tensor` / `get_tensor`), so a device whose memory the host cannot
/// touch fits the same seam. The allocator decides which node uses which buffer.
pub trait ComputeBackend: Send {
    /// The handle of the device this context runs on.
    fn handle(&self) -> Backend;
    /// The backend's name, as the registry spells it (`cpu`).
    fn name(&self) -> &str;
    /// The capability matrix: can this backend execute `op` producing `dtype`?
    fn supports_op(&self, op: &Op, dtype: DType) -> bool;
    /// Whether the backend computes everything `meta` asks of a node whose op it supports,
    /// where the payload changes the computation (a RoPE with YaRN's blend): a backend that
    /// would ignore part of a payload declines it here, so the node is placed elsewhere or
    /// refused by name. Every payload by default.
    fn supports_meta(&self, meta: &NodeMeta) -> bool {
        let _ = meta;
        true
    }
    /// Whether the backend has the fused kernel `fused`, so the fusion pass may produce it.
    fn supports_fused(&self, fused: FusedOp) -> bool;
    /// Whether the backend's products and embedding rows read weights of type `ty`: a node
    /// with a weight of another type goes to a backend that reads it ([`CNode::weight_types`]).
    /// Every type by default.
    fn supports_weight(&self, ty: crate::quant::GgmlType) -> bool {
        let _ = ty;
        true
    }

    /// A buffer of `bytes` bytes holding `dtype` values, recycled from the free list when one
    /// is free (a backend may reuse a larger one).
    fn alloc_buffer(&mut self, bytes: usize, dtype: DType) -> usize;
    /// Return buffer `id` to the pool's free list for reuse.
    fn free_buffer(&mut self, id: usize);
    /// A buffer that bypasses the free list (split-boundary staging must not be recycled within
    /// one execution).
    fn alloc_fresh(&mut self, bytes: usize, dtype: DType) -> usize;
    /// Buffers in the pool, free or in use.
    fn pool_len(&self) -> usize;
    /// Give back the memory of the buffers on the free list that are not in `used` (their ids
    /// stay valid for reuse): called once a graph has all its buffers (`used`: those its nodes
    /// were given, freed again for later nodes or not), so that buffers no node of the current
    /// graph uses do not pile up as prompt lengths vary. Nothing by default.
    fn trim_free(&mut self, _used: &std::collections::HashSet<usize>) {}

    /// Execute one node. `in_bufs[i]` holds `node.src[i]`; `kv_pair` is the layer's (K, V)
    /// regions for KV and attention nodes. An unsupported node is an error, never a fallback.
    fn execute_node(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError>;

    /// The size in bytes and the element type of buffer `id`, if it exists.
    fn buffer_info(&self, id: usize) -> Option<(usize, DType)>;
    /// Copy `dst.len()` bytes of buffer `id`, from byte `offset`, into `dst`, once the work
    /// that writes them is done. A range outside the buffer is an error naming both.
    fn read_buffer(&mut self, id: usize, offset: usize, dst: &mut [u8]) -> Result<(), BackendError>;
    /// Copy `src` into buffer `id` from byte `offset`. A range outside the buffer is an error.
    fn write_buffer(&mut self, id: usize, offset: usize, src: &[u8]) -> Result<(), BackendError>;
    /// Turn K rows of KV region `id` by a context shift's positions ([`KShift`]), in the
    /// backend's own memory. A backend without it refuses by name (the default).
    fn rope_shift(&mut self, id: usize, shift: &KShift) -> Result<(), BackendError> {
        let _ = shift;
        Err(BackendError::Buffer {
            backend: self.name().into(),
            id,
            problem: "cannot be turned by a context shift: the backend has no K-shift".into(),
        })
    }
    /// Make row `i` of buffer `id` hold what row `from[i]` held (rows of `row_bytes` bytes): the
    /// compaction of a KV region after cells were freed. The default copies through the host;
    /// a device may do it in its own memory.
    fn gather_rows(&mut self, id: usize, row_bytes: usize, from: &[u32]) -> Result<(), BackendError> {
        let (bytes, _) = self.buffer_info(id).ok_or_else(|| BackendError::Buffer {
            backend: self.name().into(),
            id,
            problem: "does not exist".into(),
        })?;
        let mut region = vec![0u8; bytes];
        self.read_buffer(id, 0, &mut region)?;
        let mut packed = Vec::with_capacity(from.len() * row_bytes);
        for &src in from {
            let start = src as usize * row_bytes;
            let row = region
                .get(start..start + row_bytes)
                .ok_or_else(|| BackendError::Buffer {
                    backend: self.name().into(),
                    id,
                    problem: format!("has no row {src} of {row_bytes} bytes"),
                })?;
            packed.extend_from_slice(row);
        }
        self.write_buffer(id, 0, &packed)
    }
    /// Wait for all work submitted to this context; a device's asynchronous failure surfaces
    /// here.
    fn synchronize(&mut self) -> Result<(), BackendError>;
    /// Wait until the node (or the copy to this backend) just queued has run, when an execution
    /// is timed (a trace, a profile, `minfer viz`): a backend that queues its work returns from
    /// `execute_node` at the launch, so without the wait its nodes would be timed at their
    /// launches and every kernel's time would land on the next synchronisation. The default,
    /// for a backend that runs each node to completion, does nothing.
    fn wait_for_node(&mut self) -> Result<(), BackendError> {
        Ok(())
    }
}
