//! The CPU backend: executes graph nodes with the kernels in [`kernels`] on f32 buffers in its
//! own buffer pool. Weights are resolved by name from the model file at execution time
//! (zero-copy), except the matrices the device repacked when the model loaded (see
//! [`repacks`]), which it holds itself.
//!
//! It must not decide anything the allocator owns (which node uses which buffer, aliasing) and
//! never falls back: a node it cannot run is an error naming the node.
//!
//! Two halves, as ggml's device and backend: a [`CpuDevice`] is made once per process and shared
//! by every session (the weights and the thread pool), and a [`CpuBackend`] is one session's
//! execution context over it (its buffer pool and scratch space). A session executing alone
//! runs its parallel nodes on every thread of the pool, whatever the number of sessions; while
//! several execute at once, each runs on its own thread (see `run_parallel`).
//!
//! Threads: the device owns a persistent [`pool::ThreadPool`] of `n_threads` threads. Matmuls
//! cut their output rows, and attention its (token, head) rows, into chunks that the pool's
//! threads claim one at a time; the chunk size depends on the sizes and the thread count only,
//! and every row is computed by exactly the same code whatever chunk holds it, so results are
//! bit-identical for any thread count. Element-wise additions, products and SwiGLU of a
//! prompt's size are cut into chunks of values the same way; the other nodes, and those of a
//! decode step, are cheap next to these and run on the calling thread. The parallel paths
//! allocate nothing per call: the row blocks and the quantized activations live in buffers
//! reused across calls, and one-token matmuls write their chunks straight into the output.

mod fused;
pub mod kernels;
mod mat_mul_id;
pub mod pool;
pub mod report;

use crate::graph::{
    Backend, BackendDevice, BackendError, BufRef, CNode, ComputeBackend, DType, FusedOp, NodeMeta, Op, TensorSource,
    WeightUse,
};
use crate::quant::{gemm, repack, repack::Repacked};
use kernels::{Activations, KernelError};
use pool::{Claim, ThreadPool};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, TryLockError};

/// What every session on the CPU shares: the weights and the thread pool. Cheap to clone (one
/// reference count); made once per process by the backend set.
#[derive(Clone)]
pub struct CpuDevice {
    shared: Arc<DeviceShared>,
}

struct DeviceShared {
    weights: Arc<dyn TensorSource>,
    /// The multiplied weights repacked for the 16-row kernels (`crate::quant::repack`), by name:
    /// every matrix of a type with the layout, when this CPU has the kernels.
    repacked: HashMap<String, Repacked>,
    /// One session's parallel node at a time: a job takes every thread.
    pool: Mutex<ThreadPool>,
    n_threads: usize,
    /// Contexts between their first node of a graph and its end (`synchronize`).
    executing: AtomicUsize,
    /// Bytes of expert weights the expert products have read: each chosen expert's matrix once
    /// a node (what a decode step streams of a mixture-of-experts model).
    expert_bytes_read: AtomicU64,
}

impl CpuDevice {
    /// Bytes of expert weights this device's expert products have read so far: each chosen
    /// expert's matrix once a node, so a decode step of a top-k model adds k matrices a product.
    pub fn expert_bytes_read(&self) -> u64 {
        self.shared.expert_bytes_read.load(Ordering::Relaxed)
    }

    /// A device whose nodes run on `n_threads` threads (at least 1), resolving weights through
    /// `weights`.
    pub fn new(weights: Arc<dyn TensorSource>, n_threads: usize) -> Self {
        let pool = ThreadPool::new(n_threads.max(1));
        let n_threads = pool.n_threads();
        CpuDevice {
            shared: Arc::new(DeviceShared {
                weights,
                repacked: HashMap::new(),
                pool: Mutex::new(pool),
                n_threads,
                executing: AtomicUsize::new(0),
                expert_bytes_read: AtomicU64::new(0),
            }),
        }
    }

    /// The threads nodes run on (fewer than asked only if the system refused a thread).
    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// A new execution context (its own buffers) over this device.
    pub fn context(&self) -> CpuBackend {
        CpuBackend::new(self)
    }
}

impl BackendDevice for CpuDevice {
    fn handle(&self) -> Backend {
        Backend::CPU
    }

    fn name(&self) -> &str {
        "cpu"
    }

    fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    fn weights_bytes(&self) -> usize {
        self.shared.repacked.values().map(|r| r.data.len()).sum()
    }

    /// Repacks every multiplied matrix that [`repacks`] takes (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
    /// Q4_K; rows in whole groups of 16), and tells the source it may give the original pages
    /// back (a file read into memory or locked keeps them: repacking then costs the copy).
    /// Other weights are read from the file in place.
    fn prepare_weights(&mut self, source: &dyn TensorSource, weights: &[WeightUse]) -> Result<(), BackendError> {
        let n_threads = self.shared.n_threads;
        let Some(shared) = Arc::get_mut(&mut self.shared) else {
            return Err(BackendError::Prepare {
                backend: "cpu".into(),
                weight: weights.first().map_or_else(String::new, |u| u.name.clone()),
                message: "weights must be prepared before any context exists".into(),
            });
        };
        let multiplied = || {
            weights
                .iter()
                .filter(|u| u.multiplied)
                .filter_map(|u| source.weight(&u.name).map(|w| (&u.name, w)))
        };
        // Experts are read a few at a time from the mapped file, so a model larger than memory
        // runs; repacked, they would all live in memory. They are repacked only when they fit
        // in half of what is available.
        let expert_bytes: u64 = multiplied()
            .filter(|(_, w)| w.shape.len() > 2 && repacks(w.ggml_type, w.shape))
            .map(|(_, w)| w.data.len() as u64)
            .sum();
        let experts_fit = expert_bytes > 0 && available_memory().is_some_and(|m| expert_bytes <= m / 2);
        for (name, w) in multiplied() {
            let (ty, shape) = (w.ggml_type, w.shape);
            if !repacks(ty, shape) || (shape.len() > 2 && !experts_fit) {
                continue;
            }
            let rows: u64 = shape[1..].iter().product();
            let (Ok(n_in), Ok(n_out)) = (usize::try_from(shape[0]), usize::try_from(rows)) else {
                continue;
            };
            let packed = repack::repack(ty, w.data, n_in, n_out, n_threads).map_err(|e| BackendError::Prepare {
                backend: "cpu".into(),
                weight: name.clone(),
                message: e.to_string(),
            })?;
            shared.repacked.insert(name.clone(), packed);
            source.release(name);
        }
        Ok(())
    }

    fn new_context(&self) -> Box<dyn ComputeBackend> {
        Box::new(self.context())
    }

    /// The host memory's read bandwidth with this device's threads: what bounds a generated
    /// token on the CPU, which reads every weight once.
    fn copy_bandwidth(&self) -> Result<Option<f64>, BackendError> {
        Ok(Some(report::read_bandwidth(self.shared.n_threads)))
    }

    fn matmul_kernels(&self, matrices: &[(crate::quant::GgmlType, Vec<u64>)], n_tokens: usize) -> Option<String> {
        Some(report::matmul_kernels(matrices, n_tokens))
    }
}

/// Whether the CPU device repacks a multiplied matrix of `ty` and GGUF shape `shape` (ne0
/// first) when it prepares the weights: a type with the repacked layout, rows in whole groups
/// of 16, a CPU with the kernels, and `MINFER_NO_REPACK` unset (or `0`). A 3-D tensor of
/// experts is repacked as its experts' rows one after another (each expert whole groups), and
/// only while all of them fit in half the available memory ([`prepare_weights`]).
pub fn repacks(ty: crate::quant::GgmlType, shape: &[u64]) -> bool {
    // A matrix, or a 3-D tensor of experts' matrices (each expert's rows then whole groups).
    let matrix = shape.len() >= 2 && shape.get(3..).unwrap_or(&[]).iter().all(|&d| d == 1);
    let turned_off = std::env::var_os("MINFER_NO_REPACK").is_some_and(|v| !v.is_empty() && v != "0");
    matrix
        && !turned_off
        && repack::supports(ty)
        && shape[1].is_multiple_of(repack::GROUP as u64)
        && gemm::repacked_available(ty)
}

/// The memory available for new allocations (Linux's `MemAvailable`), or `None` where it cannot
/// be read.
fn available_memory() -> Option<u64> {
    super::host_memory("MemAvailable")
}

/// Run `job` on every thread of the device's pool while this session is the only one executing
/// a graph, else on the calling thread alone. A lone session (a single request on the server,
/// the CLI) so gets every core, and concurrent sessions each get one, never waiting for one
/// another's nodes and never putting more busy threads on the cores than there are sessions or
/// pool threads: measured on 2 cores with 2 and 4 concurrent server streams, sharing the pool
/// node by node instead lost 25 % of the aggregate rate to barrier waits of descheduled
/// workers. Jobs claim their chunks from a shared counter, so one thread runs them whole, with
/// the same chunks and the same bits. A poisoned lock only means a job panicked on another
/// session's thread; the pool re-raised that panic there and stays usable.
fn run_parallel<F: Fn(usize, usize) + Sync>(device: &DeviceShared, job: F) {
    if device.executing.load(Ordering::Relaxed) > 1 {
        return job(0, 1);
    }
    match device.pool.try_lock() {
        Ok(pool) => pool.run(job),
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner().run(job),
        Err(TryLockError::WouldBlock) => job(0, 1),
    }
}

/// Graph allocations a free buffer survives unused before its memory is given back: two keep
/// the buffers of alternating graphs (a prefill and the decode step after it, `bench`'s
/// repetitions) while the buffers of shapes that do not come back (prompt lengths) go.
const STALE_AFTER: u8 = 2;

/// One session's execution context on a [`CpuDevice`]: its buffer pool and scratch space.
pub struct CpuBackend {
    /// Each buffer's bytes, held as whole f32 words so kernels view f32 and i32 buffers in place.
    buffers: Vec<Vec<f32>>,
    /// Each buffer's size in bytes and element type.
    info: Vec<(usize, DType)>,
    free: Vec<usize>,
    /// Per buffer: graph allocations in a row that left it free; at [`STALE_AFTER`] its memory
    /// is given back (the id stays, empty, for reuse).
    idle: Vec<u8>,
    weights: Arc<dyn TensorSource>,
    device: Arc<DeviceShared>,
    /// Quantized activations of the current matmul, reused across calls.
    scratch: Vec<u8>,
    /// The row blocks of the current matmul when it has several tokens, one after another
    /// (chunk `i` holds rows `i * rows_per_chunk..` for every token); reused across calls.
    blocks: Vec<f32>,
    /// K and V (or the up projection) of a fused node, reused across steps.
    fused_k: Vec<f32>,
    fused_v: Vec<f32>,
    /// Whether this context is counted in the device's `executing`.
    executing: bool,
}

impl Drop for CpuBackend {
    fn drop(&mut self) {
        self.set_executing(false);
    }
}

/// Chunks per thread a parallel node is cut into: enough that a thread slowed down by another
/// process on a shared machine costs little, few enough that claiming a chunk stays cheap.
const CHUNKS_PER_THREAD: usize = 4;

/// Element-wise nodes with at least this many values (a prompt's, not a decode step's) are
/// shared by the pool's threads.
const PARALLEL_ELEMENTS: usize = 1 << 16;

/// Items per chunk when `n` items are shared by `n_threads` threads (at least 1).
fn chunk_len(n: usize, n_threads: usize) -> usize {
    if n_threads <= 1 {
        n.max(1)
    } else {
        n.div_ceil(n_threads * CHUNKS_PER_THREAD).max(1)
    }
}

/// The first kernel error of a parallel job (each chunk reports its own; they all check the
/// same sizes, so the first is as good as any).
struct FirstError(Mutex<Option<KernelError>>);

impl FirstError {
    fn new() -> Self {
        FirstError(Mutex::new(None))
    }

    fn record(&self, result: Result<(), KernelError>) {
        if let Err(e) = result {
            self.0.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(e);
        }
    }

    fn into_result(self) -> Result<(), KernelError> {
        match self.0.into_inner().unwrap_or_else(PoisonError::into_inner) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl CpuBackend {
    /// KV region `id` in its stored type (the dtype it was allocated with).
    fn region(&self, node: &CNode, id: usize) -> Result<kernels::KvRegion<'_>, BackendError> {
        let (bytes, dtype) = *self
            .info
            .get(id)
            .ok_or_else(|| self.err(node, format!("no KV region {id}")))?;
        let words = &self.buffers[id];
        kernels::KvRegion::of(words, dtype, kernels::region_values(bytes, dtype)).ok_or_else(|| {
            self.err(
                node,
                format!("KV region {id} does not hold {bytes} bytes of {}", dtype.name()),
            )
        })
    }

    /// [`CpuBackend::region`] for writing, over the region's words taken out of the pool.
    fn region_mut<'w>(
        &self,
        node: &CNode,
        id: usize,
        words: &'w mut [f32],
    ) -> Result<kernels::KvRegionMut<'w>, BackendError> {
        let (bytes, dtype) = *self
            .info
            .get(id)
            .ok_or_else(|| self.err(node, format!("no KV region {id}")))?;
        kernels::KvRegionMut::of(words, dtype, kernels::region_values(bytes, dtype)).ok_or_else(|| {
            self.err(
                node,
                format!("KV region {id} does not hold {bytes} bytes of {}", dtype.name()),
            )
        })
    }

    /// A context over `device`, with empty buffers.
    pub fn new(device: &CpuDevice) -> Self {
        CpuBackend {
            buffers: Vec::new(),
            info: Vec::new(),
            free: Vec::new(),
            idle: Vec::new(),
            weights: Arc::clone(&device.shared.weights),
            device: Arc::clone(&device.shared),
            scratch: Vec::new(),
            blocks: Vec::new(),
            fused_k: Vec::new(),
            fused_v: Vec::new(),
            executing: false,
        }
    }

    /// Bytes `offset..offset + len` of buffer `id`, checked against its size.
    fn byte_range(&self, id: usize, offset: usize, len: usize) -> Result<std::ops::Range<usize>, BackendError> {
        let (bytes, _) = self.info.get(id).copied().ok_or_else(|| BackendError::Buffer {
            backend: "cpu".into(),
            id,
            problem: "does not exist".into(),
        })?;
        crate::graph::backend::buffer_window("cpu", id, bytes, offset, len)
    }

    /// Count this context in (or out of) the device's sessions executing a graph.
    fn set_executing(&mut self, executing: bool) {
        if self.executing != executing {
            self.executing = executing;
            if executing {
                self.device.executing.fetch_add(1, Ordering::Relaxed);
            } else {
                self.device.executing.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// The threads nodes run on (the device's).
    pub fn n_threads(&self) -> usize {
        self.device.n_threads
    }
}

/// The physical cores of this machine (what `-t` defaults to), falling back to the logical count.
pub fn default_threads() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    physical_cores().unwrap_or(logical).clamp(1, logical)
}

fn physical_cores() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mut cores = std::collections::HashSet::new();
    let (mut phys, mut core) = (None, None);
    for line in info.lines() {
        let value = || line.split(':').nth(1).map(|v| v.trim().to_string());
        if line.starts_with("physical id") {
            phys = value();
        } else if line.starts_with("core id") {
            core = value();
        } else if line.trim().is_empty() {
            if let (Some(p), Some(c)) = (phys.take(), core.take()) {
                cores.insert((p, c));
            }
        }
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// An I32 input's values, which its f32 buffer holds as bit patterns: viewed in place.
fn ids_of(bits: &[f32]) -> &[i32] {
    bytemuck::cast_slice(bits)
}

impl CpuBackend {
    fn err(&self, node: &CNode, message: impl std::fmt::Display) -> BackendError {
        BackendError::Node {
            backend: "cpu".into(),
            node: node.name.clone(),
            message: message.to_string(),
        }
    }

    fn weight(&self, node: &CNode, name: &str) -> Result<crate::graph::Weight<'_>, BackendError> {
        self.weights.weight(name).ok_or_else(|| BackendError::MissingWeight {
            backend: "cpu".into(),
            node: node.name.clone(),
            weight: name.to_string(),
        })
    }

    fn f32_weight(&self, node: &CNode, name: &str) -> Result<&[f32], BackendError> {
        f32_values(name, self.weight(node, name)?).map_err(|e| self.err(node, e))
    }

    /// The values of the frequency-factor weight a RoPE names, if it names one.
    fn rope_factors(&self, node: &CNode, r: &crate::graph::RopeMeta) -> Result<Option<&[f32]>, BackendError> {
        r.freq_factors
            .as_deref()
            .map(|name| self.f32_weight(node, name))
            .transpose()
    }

    fn buffer(&self, node: &CNode, buf: BufRef) -> Result<&[f32], BackendError> {
        self.buffers
            .get(buf.id)
            .map(|b| b.as_slice())
            .ok_or_else(|| self.err(node, format!("no buffer {}", buf.id)))
    }

    /// `y = x @ W^T` over all threads; y is token-major `[n_out, n_tokens]`. `repacked` is the
    /// device's repacked copy of `w`, when it has one, and the row of it where `w`'s rows start
    /// (an expert's, within its tensor's): the product then reads that instead. The caller
    /// checks that the copy is of `w`'s whole tensor.
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &mut self,
        node: &CNode,
        w: &[u8],
        wtype: crate::quant::GgmlType,
        repacked: Option<(&Repacked, usize)>,
        n_in: usize,
        n_out: usize,
        x: &[f32],
        n_tokens: usize,
        y: &mut [f32],
    ) -> Result<(), BackendError> {
        let kerr = |e: KernelError| BackendError::Node {
            backend: "cpu".into(),
            node: node.name.clone(),
            message: e.to_string(),
        };
        if y.len() != n_out * n_tokens {
            return Err(self.err(
                node,
                format!("the output holds {} values, {n_out} x {n_tokens} expected", y.len()),
            ));
        }
        if let Some((r, first)) =
            repacked.filter(|(r, first)| (r.ty, r.n_in) != (wtype, n_in) || first + n_out > r.n_out)
        {
            return Err(self.err(
                node,
                format!(
                    "the repacked weight is {} {}x{}, the product needs {wtype} {n_in}x{n_out} from row {first}",
                    r.ty, r.n_in, r.n_out
                ),
            ));
        }
        let n_threads = self.device.n_threads;
        // Quantize the activation rows a chunk of tokens per thread; a row's bytes do not depend
        // on which thread quantized it.
        let mut buffers =
            kernels::ActivationBuffers::new(wtype, n_in, x, n_tokens, repacked.is_some(), &mut self.scratch)
                .map_err(kerr)?;
        if n_tokens < 2 * n_threads {
            // A decode step: waking the pool would cost more than the row.
            for chunk in buffers.chunks(n_tokens.max(1)) {
                kernels::quantize_chunk(chunk).map_err(kerr)?;
            }
        } else {
            let chunks = Claim::new(buffers.chunks(n_tokens.div_ceil(n_threads)));
            let failed = FirstError::new();
            run_parallel(&self.device, |_, _| {
                while let Some(chunk) = chunks.next() {
                    failed.record(kernels::quantize_chunk(chunk));
                }
            });
            failed.into_result().map_err(kerr)?;
        }
        let act: Activations<'_> = buffers.finish();
        // Each output row is one complete dot product whatever chunk holds it, so any split
        // gives the same bits. Repacked weights go in whole groups of rows.
        let rows_per_chunk = match repacked {
            Some(_) => chunk_len(n_out, n_threads).next_multiple_of(repack::GROUP),
            None => chunk_len(n_out, n_threads),
        };
        let rows_of = |rows: std::ops::Range<usize>, n_tokens: usize, block: &mut [f32]| match repacked {
            Some((r, first)) => {
                kernels::matmul_rows_repacked(r, act, n_tokens, first + rows.start..first + rows.end, block)
            }
            None => kernels::matmul_rows(w, wtype, n_in, n_out, act, n_tokens, rows, block),
        };
        let failed = FirstError::new();
        if n_tokens == 1 {
            // One token: a chunk's row block is the slice of `y` it covers; write it in place.
            let chunks = Claim::new(y.chunks_mut(rows_per_chunk).enumerate());
            run_parallel(&self.device, |_, _| {
                while let Some((i, block)) = chunks.next() {
                    let rows = i * rows_per_chunk..i * rows_per_chunk + block.len();
                    failed.record(rows_of(rows, 1, block));
                }
            });
            return failed.into_result().map_err(kerr);
        }
        let len = n_out * n_tokens;
        if self.blocks.len() < len {
            self.blocks.resize(len, 0.0);
        }
        // Whole panels per chunk, so the matrix-matrix kernel wastes no lanes.
        let rows_per_chunk = rows_per_chunk.next_multiple_of(crate::quant::gemm::PANEL).min(n_out);
        let block_len = rows_per_chunk * n_tokens;
        let chunks = Claim::new(self.blocks[..len].chunks_mut(block_len).enumerate());
        run_parallel(&self.device, |_, _| {
            while let Some((i, block)) = chunks.next() {
                let rows = i * rows_per_chunk..i * rows_per_chunk + block.len() / n_tokens;
                failed.record(rows_of(rows, n_tokens, block));
            }
        });
        failed.into_result().map_err(kerr)?;
        // Scatter the row blocks into the token-major output, the threads taking token chunks.
        let blocks = &self.blocks[..len];
        let tokens_per_chunk = chunk_len(n_tokens, n_threads);
        let outs = Claim::new(y.chunks_mut(n_out * tokens_per_chunk).enumerate());
        run_parallel(&self.device, |_, _| {
            while let Some((i, ys)) = outs.next() {
                for (dt, yt) in ys.chunks_exact_mut(n_out).enumerate() {
                    let t = i * tokens_per_chunk + dt;
                    for (c, block) in blocks.chunks(block_len).enumerate() {
                        let nr = block.len() / n_tokens;
                        let start = c * rows_per_chunk;
                        yt[start..start + nr].copy_from_slice(&block[t * nr..(t + 1) * nr]);
                    }
                }
            }
        });
        Ok(())
    }
}

impl ComputeBackend for CpuBackend {
    fn handle(&self) -> Backend {
        Backend::CPU
    }

    fn name(&self) -> &str {
        "cpu"
    }

    fn supports_op(&self, op: &Op, dtype: DType) -> bool {
        // Every op, named: a new one is a compile error here until it is handled or refused.
        match op {
            Op::Input => true,
            Op::Add
            | Op::Mul
            | Op::Silu
            | Op::Scale { .. }
            | Op::Softcap { .. }
            | Op::Gelu
            | Op::SwiGLU
            | Op::SwigluOai { .. }
            | Op::Sigmoid
            | Op::Softmax
            | Op::MoeWeights { .. }
            | Op::MatMulId
            | Op::MoeSum
            | Op::RmsNorm { .. }
            | Op::QkNorm { .. }
            | Op::MatMul
            | Op::GetRows
            | Op::RoPE
            | Op::Attn { .. }
            | Op::KvcacheStore { .. }
            | Op::KvcacheLoad { .. }
            | Op::FusedQKV { .. }
            | Op::FusedQkvNorm { .. }
            | Op::FusedFFN => dtype == DType::F32,
            Op::TopK { .. } => dtype == DType::I32,
        }
    }

    fn supports_fused(&self, fused: FusedOp) -> bool {
        match fused {
            FusedOp::SwiGLU => true,
            // The CPU runs the fused decode nodes (a test or `set_fusion` may build them) but
            // does not ask for them: they run the same kernels and only save graph bookkeeping,
            // which measured no gain (tg64 on the 0.5B model, 2 threads: 11.99 and 11.77 tok/s
            // fused, 12.21 and 12.12 unfused).
            FusedOp::DecodeQkv | FusedOp::DecodeFfn => false,
        }
    }

    fn alloc_buffer(&mut self, bytes: usize, dtype: DType) -> usize {
        // Only an exact size is recycled: within one graph a buffer passes from node to node,
        // and every node must find it at its own size. An emptied slot takes any size.
        let pick = self
            .free
            .iter()
            .position(|&id| self.info[id] == (bytes, dtype))
            .or_else(|| self.free.iter().position(|&id| self.buffers[id].capacity() == 0));
        let Some(pos) = pick else {
            return self.alloc_fresh(bytes, dtype);
        };
        let id = self.free.swap_remove(pos);
        if self.info[id] != (bytes, dtype) {
            self.buffers[id] = vec![0.0; bytes.div_ceil(4)];
            self.info[id] = (bytes, dtype);
        }
        self.idle[id] = 0;
        id
    }

    fn trim_free(&mut self, used: &std::collections::HashSet<usize>) {
        for id in 0..self.buffers.len() {
            if used.contains(&id) || !self.free.contains(&id) {
                self.idle[id] = 0;
                continue;
            }
            self.idle[id] = self.idle[id].saturating_add(1);
            if self.idle[id] >= STALE_AFTER {
                self.buffers[id] = Vec::new();
                self.info[id] = (0, DType::F32);
            }
        }
    }

    fn free_buffer(&mut self, id: usize) {
        if id < self.buffers.len() && !self.free.contains(&id) {
            self.free.push(id);
        }
    }

    fn alloc_fresh(&mut self, bytes: usize, dtype: DType) -> usize {
        // Whole f32 words, so that every kernel can view an f32 (or i32) buffer in place.
        self.buffers.push(vec![0.0; bytes.div_ceil(4)]);
        self.info.push((bytes, dtype));
        self.idle.push(0);
        self.buffers.len() - 1
    }

    fn pool_len(&self) -> usize {
        self.buffers.len()
    }

    fn execute_node(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError> {
        self.set_executing(true);
        if out_buf.id >= self.buffers.len() {
            return Err(self.err(node, format!("output buffer {} does not exist", out_buf.id)));
        }
        // Take the output out of the pool so inputs can be borrowed beside it. An input that is
        // the output itself (the allocator aliased it) is read from `out` directly.
        let mut out = std::mem::take(&mut self.buffers[out_buf.id]);
        let result = self.run(node, in_bufs, out_buf, &mut out, kv_pair);
        self.buffers[out_buf.id] = out;
        result
    }

    fn buffer_info(&self, id: usize) -> Option<(usize, DType)> {
        self.info.get(id).copied()
    }

    fn read_buffer(&mut self, id: usize, offset: usize, dst: &mut [u8]) -> Result<(), BackendError> {
        let range = self.byte_range(id, offset, dst.len())?;
        dst.copy_from_slice(&bytemuck::cast_slice::<f32, u8>(&self.buffers[id])[range]);
        Ok(())
    }

    fn write_buffer(&mut self, id: usize, offset: usize, src: &[u8]) -> Result<(), BackendError> {
        let range = self.byte_range(id, offset, src.len())?;
        bytemuck::cast_slice_mut::<f32, u8>(&mut self.buffers[id])[range].copy_from_slice(src);
        Ok(())
    }

    fn rope_shift(&mut self, id: usize, shift: &crate::graph::KShift) -> Result<(), BackendError> {
        self.byte_range(id, 0, 0)?;
        let (bytes, dtype) = self.info[id];
        let problem = |problem: String| BackendError::Buffer {
            backend: "cpu".into(),
            id,
            problem: format!("context shift: {problem}"),
        };
        let factors = match shift.rope.freq_factors.as_deref() {
            None => None,
            Some(name) => {
                let w = self
                    .weights
                    .weight(name)
                    .ok_or_else(|| problem(format!("no weight '{name}' for the RoPE frequency factors")))?;
                Some(f32_values(name, w).map_err(problem)?)
            }
        };
        kernels::rope_shift(&mut self.buffers[id], bytes, dtype, shift, factors).map_err(|e| problem(e.to_string()))
    }

    fn synchronize(&mut self) -> Result<(), BackendError> {
        // The graph (or this backend's split of it) is done.
        self.set_executing(false);
        Ok(())
    }
}

/// The values of weight `name` as f32, or why it holds none (its type is not F32, or its bytes
/// are not aligned for f32).
fn f32_values<'a>(name: &str, w: crate::graph::Weight<'a>) -> Result<&'a [f32], String> {
    if w.ggml_type != crate::quant::GgmlType::F32 {
        return Err(format!("weight '{name}' is {}, an F32 vector is needed", w.ggml_type));
    }
    bytemuck::try_cast_slice(w.data).map_err(|e| format!("weight '{name}': {e}"))
}

impl CpuBackend {
    fn run(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
        out: &mut [f32],
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError> {
        let kerr = |e: KernelError| BackendError::Node {
            backend: "cpu".into(),
            node: node.name.clone(),
            message: e.to_string(),
        };
        let aliased = |i: usize| in_bufs.get(i).is_some_and(|b| *b == out_buf);
        let [d, nt, ..] = node.out_shape;
        match (&node.op, &node.meta) {
            (Op::Input | Op::KvcacheLoad { .. }, _) => Ok(()),
            (Op::GetRows, NodeMeta::Embed(m)) => {
                let ids = ids_of(self.buffer(node, in_bufs[0])?);
                let w = self.weight(node, &m.weight_name)?;
                kernels::get_rows(w.data, w.ggml_type, m.n_embd, m.n_rows, ids, out).map_err(kerr)
            }
            (Op::GetRows, _) => {
                let x = self.buffer(node, in_bufs[0])?;
                let ids = ids_of(self.buffer(node, in_bufs[1])?);
                let n_rows = x.len() / d.max(1);
                for (i, &id) in ids.iter().enumerate() {
                    let r = usize::try_from(id)
                        .ok()
                        .filter(|&r| r < n_rows)
                        .ok_or_else(|| self.err(node, format!("row id {id} is not a row of its {n_rows}-row input")))?;
                    out[i * d..(i + 1) * d].copy_from_slice(&x[r * d..(r + 1) * d]);
                }
                Ok(())
            }
            (Op::RmsNorm { eps }, NodeMeta::Norm(m)) => {
                let x = self.buffer(node, in_bufs[0])?;
                match &m.weight_name {
                    Some(w) => kernels::rms_norm_mul(x, self.f32_weight(node, w)?, d, *eps, out),
                    None => kernels::rms_norm(x, d, *eps, out),
                }
                .map_err(kerr)
            }
            (Op::QkNorm { head_dim, eps, .. }, NodeMeta::Norm(m)) => {
                let x = self.buffer(node, in_bufs[0])?;
                let name = m
                    .weight_name
                    .as_deref()
                    .ok_or_else(|| self.err(node, "QkNorm needs a weight"))?;
                kernels::rms_norm_mul(x, self.f32_weight(node, name)?, *head_dim, *eps, out).map_err(kerr)
            }
            (Op::MatMul, NodeMeta::MatMul(m)) => {
                let x = std::mem::take(&mut self.buffers[in_bufs[0].id]);
                let result = self.projection(node, m, &x, nt, out);
                self.buffers[in_bufs[0].id] = x;
                result
            }
            (Op::RoPE, NodeMeta::Rope(m)) => {
                if !aliased(0) {
                    out.copy_from_slice(self.buffer(node, in_bufs[0])?);
                }
                let positions = ids_of(self.buffer(node, in_bufs[1])?);
                kernels::rope(out, positions, nt, m.n_head, m, self.rope_factors(node, m)?).map_err(kerr)
            }
            (Op::Silu, _) => {
                if aliased(0) {
                    kernels::silu_inplace(out);
                    Ok(())
                } else {
                    kernels::silu(self.buffer(node, in_bufs[0])?, out).map_err(kerr)
                }
            }
            (Op::SwigluOai { alpha, limit }, _) => {
                // An operand that is the output itself (an allocator alias) is read from a copy.
                let operand = |i: usize| -> Result<std::borrow::Cow<'_, [f32]>, BackendError> {
                    Ok(match aliased(i) {
                        true => std::borrow::Cow::Owned(out.to_vec()),
                        false => std::borrow::Cow::Borrowed(self.buffer(node, in_bufs[i])?),
                    })
                };
                let (gate, up) = (operand(0)?, operand(1)?);
                kernels::swiglu_oai(&gate, &up, *alpha, *limit, out).map_err(kerr)
            }
            (Op::Sigmoid, _) => {
                if aliased(0) {
                    kernels::sigmoid_inplace(out);
                    Ok(())
                } else {
                    kernels::sigmoid(self.buffer(node, in_bufs[0])?, out).map_err(kerr)
                }
            }
            (Op::Softmax, _) => {
                if aliased(0) {
                    let x = out.to_vec();
                    kernels::softmax_rows(&x, d, out).map_err(kerr)
                } else {
                    kernels::softmax_rows(self.buffer(node, in_bufs[0])?, d, out).map_err(kerr)
                }
            }
            (Op::TopK { k }, _) => {
                let x = self.buffer(node, in_bufs[0])?;
                let n = x.len() / nt.max(1);
                kernels::top_k(x, n, *k, bytemuck::cast_slice_mut(out)).map_err(kerr)
            }
            (Op::MoeWeights { norm, scale }, _) => {
                let probs = self.buffer(node, in_bufs[0])?;
                let ids = ids_of(self.buffer(node, in_bufs[1])?);
                kernels::moe_weights(probs, probs.len() / nt.max(1), ids, d, *norm, *scale, out).map_err(kerr)
            }
            (Op::MoeSum, _) => {
                let experts = self.buffer(node, in_bufs[0])?;
                let weights = self.buffer(node, in_bufs[1])?;
                kernels::moe_sum(experts, weights, d, weights.len() / nt.max(1), out).map_err(kerr)
            }
            (Op::MatMulId, NodeMeta::MatMulId(m)) => self.mat_mul_id(node, m, in_bufs, out),
            (Op::Gelu, _) => {
                if aliased(0) {
                    kernels::gelu_inplace(out);
                    Ok(())
                } else {
                    kernels::gelu(self.buffer(node, in_bufs[0])?, out).map_err(kerr)
                }
            }
            (Op::Softcap { cap }, _) => {
                if aliased(0) {
                    kernels::softcap_inplace(out, *cap);
                    Ok(())
                } else {
                    kernels::softcap(self.buffer(node, in_bufs[0])?, *cap, out).map_err(kerr)
                }
            }
            (Op::Scale { scale }, _) => {
                if aliased(0) {
                    kernels::scale_inplace(out, *scale);
                    Ok(())
                } else {
                    kernels::scale(self.buffer(node, in_bufs[0])?, *scale, out).map_err(kerr)
                }
            }
            (Op::Add | Op::Mul | Op::SwiGLU, _) => {
                let a = self.buffer(node, in_bufs[0])?;
                let b = self.buffer(node, in_bufs[1])?;
                let kernel = match node.op {
                    Op::Add => kernels::add,
                    Op::Mul => kernels::mul,
                    _ => kernels::swiglu,
                };
                let n_threads = self.device.n_threads;
                if out.len() < PARALLEL_ELEMENTS || n_threads <= 1 || a.len() != out.len() || b.len() != out.len() {
                    return kernel(a, b, out).map_err(kerr);
                }
                // A prompt's activations: each value on its own, so any split gives the same bits.
                let per_chunk = chunk_len(out.len(), n_threads).next_multiple_of(64);
                let chunks = Claim::new(out.chunks_mut(per_chunk).enumerate());
                let failed = FirstError::new();
                run_parallel(&self.device, |_, _| {
                    while let Some((i, chunk)) = chunks.next() {
                        let at = i * per_chunk..i * per_chunk + chunk.len();
                        failed.record(kernel(&a[at.clone()], &b[at], chunk));
                    }
                });
                failed.into_result().map_err(kerr)
            }
            (Op::KvcacheStore { .. }, NodeMeta::Kvcache(_)) => {
                let (k_id, v_id) = kv_pair.ok_or_else(|| self.err(node, "no KV regions for this layer"))?;
                if k_id != out_buf.id {
                    return Err(self.err(node, "the store's output must be the layer's K region"));
                }
                let mut v_region = std::mem::take(&mut self.buffers[v_id]);
                let result = (|| {
                    let positions = ids_of(self.buffer(node, in_bufs[2])?);
                    let (k, v) = (self.buffer(node, in_bufs[0])?, self.buffer(node, in_bufs[1])?);
                    let width = k.len() / positions.len().max(1);
                    let k_region = self.region_mut(node, k_id, out)?;
                    let v_region = self.region_mut(node, v_id, &mut v_region)?;
                    kernels::kv_store(positions, k, v, width, k_region, v_region).map_err(kerr)
                })();
                self.buffers[v_id] = v_region;
                result
            }
            (Op::Attn { explicit_span, .. }, NodeMeta::Attn(m)) => {
                let (k_id, v_id) = kv_pair.ok_or_else(|| self.err(node, "no KV regions for this layer"))?;
                let q = self.buffer(node, in_bufs[0])?;
                let visible = if *explicit_span {
                    let (index, spans) = match in_bufs {
                        [_, _, _, index, spans] => (*index, *spans),
                        _ => return Err(self.err(node, "explicit-span attention needs kv_index and kv_span")),
                    };
                    kernels::Visible::Spans {
                        index: ids_of(self.buffer(node, index)?),
                        spans: ids_of(self.buffer(node, spans)?),
                        n_swa: m.n_swa,
                    }
                } else {
                    kernels::Visible::Prefix {
                        positions: ids_of(self.buffer(node, in_bufs[2])?),
                        n_swa: m.n_swa,
                    }
                };
                let k = self.region(node, k_id)?;
                let v = self.region(node, v_id)?;
                let stride = m.n_head_kv * m.head_dim;
                let n_kv = k.len() / stride.max(1);
                let (hd, n_rows) = (m.head_dim, nt * m.n_head);
                let mut scale = kernels::ScoreScale::new(m.kq_scale, m.softcap);
                if let Some(name) = &m.sinks {
                    let sinks = self.f32_weight(node, name)?;
                    if sinks.len() != m.n_head {
                        return Err(self.err(
                            node,
                            format!(
                                "sinks '{name}' hold {} values, one for each of {} heads",
                                sinks.len(),
                                m.n_head
                            ),
                        ));
                    }
                    scale = scale.with_sinks(sinks);
                }
                let n_threads = self.device.n_threads;
                if n_threads == 1 || n_rows <= 1 || hd == 0 || out.len() != n_rows * hd {
                    // One thread, nothing to split, or sizes the kernel will refuse.
                    return kernels::attention(
                        q,
                        k,
                        v,
                        visible,
                        nt,
                        m.n_head,
                        m.n_head_kv,
                        hd,
                        stride,
                        n_kv,
                        scale,
                        out,
                    )
                    .map_err(kerr);
                }
                // Later tokens attend to more cells: hand out the chunks last first, so the
                // heaviest are not the ones left over at the end.
                let rows_per_chunk = chunk_len(n_rows, n_threads);
                let chunks = Claim::new(out.chunks_mut(rows_per_chunk * hd).enumerate().rev());
                let failed = FirstError::new();
                run_parallel(&self.device, |_, _| {
                    while let Some((i, o)) = chunks.next() {
                        let rows = i * rows_per_chunk..i * rows_per_chunk + o.len() / hd;
                        failed.record(kernels::attention_heads(
                            q,
                            k,
                            v,
                            visible,
                            nt,
                            m.n_head,
                            m.n_head_kv,
                            hd,
                            stride,
                            n_kv,
                            scale,
                            rows,
                            o,
                        ));
                    }
                });
                failed.into_result().map_err(kerr)
            }
            (Op::FusedQKV { .. } | Op::FusedQkvNorm { .. }, NodeMeta::FusedQkv(m)) => {
                self.fused_qkv(node, m, in_bufs, out, kv_pair)
            }
            (Op::FusedFFN, NodeMeta::FusedFfn(m)) => self.fused_ffn(node, m, in_bufs, out),
            // A payload that is not its op's (a malformed graph). Every op is named above or
            // here, none by a wildcard: a new op fails to compile until it is run or refused.
            (
                op @ (Op::RmsNorm { .. }
                | Op::QkNorm { .. }
                | Op::MatMul
                | Op::MatMulId
                | Op::RoPE
                | Op::Attn { .. }
                | Op::KvcacheStore { .. }
                | Op::FusedQKV { .. }
                | Op::FusedQkvNorm { .. }
                | Op::FusedFFN),
                _,
            ) => Err(BackendError::Unsupported {
                backend: "cpu".into(),
                node: node.name.clone(),
                op: op.name(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CpuDevice;
    use crate::engine::{Model, ModelOptions, Session};
    use crate::graph::BackendDevice;
    use crate::models::GgufWeights;
    use std::path::PathBuf;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    /// A tiny model, and a CPU device of `n_threads` over its weights that the tests can look
    /// inside.
    fn load(model: &str, n_threads: usize) -> (Model, CpuDevice) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/models")
            .join(model);
        let options = ModelOptions {
            n_threads: Some(n_threads),
            backend: Some("cpu".into()),
            ..Default::default()
        };
        let model = Model::load(&path, &options).unwrap();
        let device = CpuDevice::new(Arc::new(GgufWeights::new(Arc::clone(model.file()))), n_threads);
        (model, device)
    }

    /// Prefill logits at every position, then greedy decode steps' logits, in a new session on
    /// `device`.
    fn session_logits(model: &Model, device: &CpuDevice) -> Vec<f32> {
        run(&mut Session::with_backends(
            Arc::clone(model.def()),
            vec![device.new_context()],
            128,
        ))
    }

    /// Prefill logits at every position of a fixed prompt, then greedy decode steps' logits.
    fn run(session: &mut Session) -> Vec<f32> {
        let n_vocab = session.model().hparams().n_vocab as u64;
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let prompt: Vec<u32> = (0..37)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed % n_vocab) as u32
            })
            .collect();
        let mut all = session.eval(&prompt, prompt.len()).unwrap().to_vec();
        for _ in 0..6 {
            let last = &all[all.len() - n_vocab as usize..];
            let next = (0..last.len()).max_by(|&a, &b| last[a].total_cmp(&last[b])).unwrap() as u32;
            all.extend_from_slice(session.eval(&[next], 1).unwrap());
        }
        all
    }

    /// Logits through the model's own backend set (`Session::new`), for one thread count.
    fn logits(model: &str, n_threads: usize) -> Vec<f32> {
        let (model, _) = load(model, n_threads);
        assert_eq!(model.backends().n_threads(), n_threads);
        run(&mut Session::new(&model, 128))
    }

    fn first_difference(a: &[f32], b: &[f32]) -> Option<usize> {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits())
    }

    #[test]
    fn logits_are_bit_identical_for_one_two_and_three_threads() {
        for model in ["tiny-qwen2-Q4_K.gguf", "tiny-qwen3-Q8_0.gguf"] {
            let one = logits(model, 1);
            assert!(one.iter().all(|x| x.is_finite()), "{model}: non-finite logits");
            for n_threads in [2, 3] {
                let many = logits(model, n_threads);
                let first = first_difference(&one, &many);
                assert_eq!(
                    first, None,
                    "{model}: {n_threads} threads differ from 1 at logit {first:?}"
                );
            }
        }
    }

    #[test]
    fn a_session_runs_its_nodes_alone_while_the_pool_is_busy_with_the_same_bits() {
        let (model, device) = load("tiny-qwen2-Q4_K.gguf", 3);
        let lone = session_logits(&model, &device);
        // Another session executing a graph: this one must not take the pool.
        device.shared.executing.fetch_add(1, Ordering::Relaxed);
        let beside_another = session_logits(&model, &device);
        device.shared.executing.fetch_sub(1, Ordering::Relaxed);
        assert_eq!(first_difference(&lone, &beside_another), None);
        // The pool held elsewhere (a session between its count and its job): no waiting for it.
        let held = device.shared.pool.lock().unwrap();
        let pool_held = session_logits(&model, &device);
        drop(held);
        assert_eq!(first_difference(&lone, &pool_held), None);
        assert_eq!(device.shared.executing.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn concurrent_sessions_over_one_model_give_each_the_bits_of_a_lone_session() {
        let (model, device) = load("tiny-qwen3-Q8_0.gguf", 2);
        let lone = session_logits(&model, &device);
        let runs: Vec<Vec<f32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3).map(|_| s.spawn(|| session_logits(&model, &device))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (i, run) in runs.iter().enumerate() {
            assert_eq!(first_difference(&lone, run), None, "session {i}");
        }
        // Every context counted itself out when its graph ended.
        assert_eq!(device.shared.executing.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_decode_step_of_a_top_2_of_8_model_reads_two_experts_of_each_expert_matrix() {
        let (model, device) = load("tiny-qwen3moe-Q4_0.gguf", 2);
        let file = model.file();
        let expert_bytes: u64 = file
            .tensors()
            .iter()
            .filter(|t| t.name.contains("_exps."))
            .map(|t| t.size)
            .sum();
        let mut session = Session::with_backends(Arc::clone(model.def()), vec![device.new_context()], 64);
        let prompt = [39, 301, 385, 1879, 11, 7, 1200];
        session.eval(&prompt, 1).unwrap();
        // The prompt's 7 tokens chose at most 7 x 2 of 8 experts per layer: at most all of them.
        assert!(device.expert_bytes_read() <= expert_bytes);
        let before = device.expert_bytes_read();
        session.eval(&[3912], 1).unwrap();
        // Two of eight experts of every expert tensor: a quarter of their bytes, not all of them.
        assert_eq!(device.expert_bytes_read() - before, expert_bytes * 2 / 8);
    }
}
