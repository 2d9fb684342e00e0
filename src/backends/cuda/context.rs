//! One session's execution context on the CUDA device: its buffers and KV regions in device
//! memory, its own stream, and the launch of each node's kernels. Work is queued on the stream
//! without waiting; the host waits only when it reads a buffer or synchronizes, and that is where
//! an asynchronous failure (a driver error, a bad id a kernel flagged) surfaces.
//!
//! Owns the mapping from graph ops to kernel launches; must not compute anything on the host.

use super::{DeviceWeight, Gpu};
use crate::graph::{
    Backend, BackendError, BufRef, CNode, ComputeBackend, DType, FusedOp, MatMulMeta, NodeMeta, Op, RopeMeta, RopeStyle,
};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use std::collections::HashMap;
use std::sync::Arc;

/// Rows `mul_mat` gives one block (a warp each) and tokens it takes together (MMV_TOKENS).
const MMV_ROWS_PER_BLOCK: u32 = 4;
const MMV_TOKENS: usize = 8;
/// Threads of an `attention` block (ATTN_TILE) and the widest head it takes.
const ATTN_THREADS: u32 = 128;
const ATTN_MAX_HEAD_DIM: usize = 256;

/// The kernels' error flags (MINFER_ERR_* in common.cuh).
const FLAG_MESSAGES: [(u32, &str); 3] = [
    (
        1,
        "a row id outside its table (a token id past the vocabulary, or an out_ids row)",
    ),
    (2, "a KV cell outside the cache"),
    (4, "an attention span outside the cache"),
];

/// A layer's KV regions as the kernels take them.
struct Regions {
    k: u64,
    v: u64,
    k_type: i32,
    v_type: i32,
    n_ctx: usize,
}

/// A kernel argument, kept alive until its launch.
enum Arg {
    Ptr(u64),
    I32(i32),
    I64(i64),
    F32(f32),
}

/// One buffer of the pool.
struct Slot {
    mem: Option<CudaSlice<u8>>,
    bytes: usize,
    dtype: DType,
    /// Why the allocation failed, reported by the first use (allocation cannot fail through
    /// the seam).
    failure: Option<String>,
}

/// A session's context on the CUDA device.
pub struct CudaBackend {
    gpu: Arc<Gpu>,
    weights: Arc<HashMap<String, DeviceWeight>>,
    stream: Result<Arc<CudaStream>, String>,
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// Temporaries of the fused nodes (K and V of a fused Q/K/V, gate and up of a fused FFN).
    scratch: [Option<CudaSlice<u8>>; 2],
    /// The kernels' error flags, read back when the context synchronizes.
    flags: Option<CudaSlice<u32>>,
}

impl CudaBackend {
    pub(super) fn new(gpu: Arc<Gpu>, weights: Arc<HashMap<String, DeviceWeight>>) -> Self {
        let stream = gpu.ctx.new_stream().map_err(|e| format!("creating a stream: {e}"));
        let flags = stream.as_ref().ok().and_then(|s| s.alloc_zeros::<u32>(1).ok());
        CudaBackend {
            gpu,
            weights,
            stream,
            slots: Vec::new(),
            free: Vec::new(),
            scratch: [None, None],
            flags,
        }
    }

    fn stream(&self) -> Result<&Arc<CudaStream>, BackendError> {
        self.stream.as_ref().map_err(|e| BackendError::Buffer {
            backend: "cuda".into(),
            id: 0,
            problem: e.clone(),
        })
    }

    fn err(node: &CNode, message: impl std::fmt::Display) -> BackendError {
        BackendError::Node {
            backend: "cuda".into(),
            node: node.name.clone(),
            message: message.to_string(),
        }
    }

    fn buffer_error(id: usize, problem: impl Into<String>) -> BackendError {
        BackendError::Buffer {
            backend: "cuda".into(),
            id,
            problem: problem.into(),
        }
    }

    fn slot(&self, id: usize) -> Result<&Slot, BackendError> {
        let slot = self
            .slots
            .get(id)
            .ok_or_else(|| Self::buffer_error(id, "does not exist"))?;
        if let Some(failure) = &slot.failure {
            return Err(Self::buffer_error(id, failure.clone()));
        }
        Ok(slot)
    }

    /// The device address of buffer `id`.
    fn ptr(&self, id: usize) -> Result<u64, BackendError> {
        let stream = self.stream()?;
        let slot = self.slot(id)?;
        let mem = slot
            .mem
            .as_ref()
            .ok_or_else(|| Self::buffer_error(id, "holds no memory"))?;
        let (ptr, _sync) = mem.device_ptr(stream);
        Ok(ptr)
    }

    /// Buffer `buf` for node `node`, which must hold at least `bytes` bytes.
    fn input(&self, node: &CNode, buf: BufRef, bytes: usize) -> Result<u64, BackendError> {
        let slot = self.slot(buf.id)?;
        if slot.bytes < bytes {
            return Err(Self::err(
                node,
                format!("buffer {} holds {} bytes, the node reads {bytes}", buf.id, slot.bytes),
            ));
        }
        self.ptr(buf.id)
    }

    fn weight(&self, node: &CNode, name: &str) -> Result<&DeviceWeight, BackendError> {
        self.weights.get(name).ok_or_else(|| BackendError::MissingWeight {
            backend: "cuda".into(),
            node: node.name.clone(),
            weight: name.into(),
        })
    }

    fn weight_ptr(&self, node: &CNode, name: &str) -> Result<u64, BackendError> {
        let stream = self.stream()?;
        let (ptr, _sync) = self.weight(node, name)?.data.device_ptr(stream);
        Ok(ptr)
    }

    /// An f32 weight of exactly `len` values (a norm weight, a bias).
    fn f32_weight(&self, node: &CNode, name: &str, len: usize) -> Result<u64, BackendError> {
        let w = self.weight(node, name)?;
        if w.ggml_type != crate::quant::GgmlType::F32 || w.data.len() != len * 4 {
            return Err(Self::err(
                node,
                format!(
                    "weight '{name}' is {} of {} bytes, the node needs {len} f32 values",
                    w.ggml_type.name(),
                    w.data.len()
                ),
            ));
        }
        self.weight_ptr(node, name)
    }

    fn launch(&self, node: &CNode, kernel: &'static str, cfg: LaunchConfig, args: &[Arg]) -> Result<(), BackendError> {
        let stream = self.stream()?;
        let function = self
            .gpu
            .kernels
            .functions
            .get(kernel)
            .ok_or_else(|| Self::err(node, format!("kernel '{kernel}' is not loaded")))?;
        let mut builder = stream.launch_builder(function);
        for arg in args {
            match arg {
                Arg::Ptr(v) => builder.arg(v),
                Arg::I32(v) => builder.arg(v),
                Arg::I64(v) => builder.arg(v),
                Arg::F32(v) => builder.arg(v),
            };
        }
        // SAFETY: every argument matches the kernel's parameter list (see the .cu files), and
        // every pointer is a live allocation of this context or the device's weights, sized
        // by the checks of the caller.
        unsafe { builder.launch(cfg) }
            .map(|_| ())
            .map_err(|e| Self::err(node, format!("launching {kernel}: {e}")))
    }

    fn flags_ptr(&self) -> Result<u64, BackendError> {
        let stream = self.stream()?;
        let flags = self
            .flags
            .as_ref()
            .ok_or_else(|| Self::buffer_error(0, "the error flags could not be allocated"))?;
        let (ptr, _sync) = flags.device_ptr(stream);
        Ok(ptr)
    }

    /// Scratch `which` with room for `bytes` bytes.
    fn scratch(&mut self, node: &CNode, which: usize, bytes: usize) -> Result<u64, BackendError> {
        let stream = Arc::clone(self.stream()?);
        if self.scratch[which].as_ref().is_none_or(|s| s.len() < bytes) {
            self.scratch[which] = None;
            super::count_device_allocation();
            let mem = stream
                .alloc_zeros::<u8>(bytes.max(1))
                .map_err(|e| Self::err(node, format!("allocating {bytes} bytes of scratch: {e}")))?;
            self.scratch[which] = Some(mem);
        }
        let mem = self.scratch[which].as_ref().expect("allocated above");
        let (ptr, _sync) = mem.device_ptr(&stream);
        Ok(ptr)
    }

    /// `y[t] = x[t] . W^T (+ bias)` for `nt` tokens of the weight `m` names.
    fn mul_mat(&self, node: &CNode, m: &MatMulMeta, x: u64, nt: usize, y: u64) -> Result<(), BackendError> {
        let w = self.weight(node, &m.weight_name)?;
        let ty = w.ggml_type;
        if ty != m.weight_type || w.shape.first().copied() != Some(m.in_dim as u64) {
            return Err(Self::err(
                node,
                format!(
                    "weight '{}' is {} {:?}, the node expects {} with {} inputs",
                    m.weight_name,
                    ty.name(),
                    w.shape,
                    m.weight_type.name(),
                    m.in_dim
                ),
            ));
        }
        if !m.in_dim.is_multiple_of(32) || !m.in_dim.is_multiple_of(ty.block_size()) {
            return Err(Self::err(
                node,
                format!(
                    "{} inputs is not a whole number of 32-value runs of {}",
                    m.in_dim,
                    ty.name()
                ),
            ));
        }
        let row_bytes = m.in_dim / ty.block_size() * ty.type_size();
        if w.data.len() < row_bytes * m.out_dim {
            return Err(Self::err(
                node,
                format!(
                    "weight '{}' holds {} bytes, not {} rows of {row_bytes}",
                    m.weight_name,
                    w.data.len(),
                    m.out_dim
                ),
            ));
        }
        let bias = match &m.bias_name {
            Some(b) => self.f32_weight(node, b, m.out_dim)?,
            None => 0,
        };
        let cfg = launch_config(
            (
                grid(m.out_dim.div_ceil(MMV_ROWS_PER_BLOCK as usize))?,
                grid(nt.div_ceil(MMV_TOKENS))?,
            ),
            32 * MMV_ROWS_PER_BLOCK,
        );
        let args = [
            Arg::Ptr(self.weight_ptr(node, &m.weight_name)?),
            Arg::I32(ty as i32),
            Arg::I64(row_bytes as i64),
            Arg::I32(int(m.in_dim)?),
            Arg::I32(int(m.out_dim)?),
            Arg::Ptr(x),
            Arg::I32(int(nt)?),
            Arg::Ptr(bias),
            Arg::Ptr(y),
        ];
        self.launch(node, "mul_mat", cfg, &args)
    }

    /// RMSNorm of `rows` = (d, n_rows): n_rows rows of d values at `x`, into `out` (which may
    /// be `x`).
    fn rms_norm(
        &self,
        node: &CNode,
        x: u64,
        weight: u64,
        rows: (usize, usize),
        eps: f32,
        out: u64,
    ) -> Result<(), BackendError> {
        let (d, n_rows) = rows;
        let cfg = launch_config((grid(n_rows)?, 1), if d >= 256 { 256 } else { 64 });
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(weight),
            Arg::I32(int(d)?),
            Arg::F32(eps),
            Arg::Ptr(out),
        ];
        self.launch(node, "rms_norm", cfg, &args)
    }

    /// RoPE in place on `nt` tokens of `n_head` heads at `x`.
    fn rope(
        &self,
        node: &CNode,
        x: u64,
        positions: u64,
        nt: usize,
        n_head: usize,
        m: &RopeMeta,
    ) -> Result<(), BackendError> {
        if m.n_rot > m.head_dim || !m.n_rot.is_multiple_of(2) {
            return Err(Self::err(
                node,
                format!("n_rot {} does not fit heads of {}", m.n_rot, m.head_dim),
            ));
        }
        // The same f32 power as the CPU's rope cache.
        let theta_scale = m.theta_scale();
        let factors = match &m.freq_factors {
            Some(name) => self.f32_weight(node, name, m.n_rot / 2)?,
            None => 0,
        };
        let cfg = launch_config((grid(nt * n_head)?, 1), 64);
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(positions),
            Arg::I32(int(n_head)?),
            Arg::I32(int(m.head_dim)?),
            Arg::I32(int(m.n_rot)?),
            Arg::F32(theta_scale),
            Arg::I32(i32::from(m.style == RopeStyle::Neox)),
            Arg::Ptr(factors),
            Arg::F32(m.freq_scale),
            Arg::F32(m.attn_factor),
        ];
        self.launch(node, "rope", cfg, &args)
    }

    /// op 0 add, 1 mul, 2 swiglu, 3 silu over `n` values.
    fn elementwise(&self, node: &CNode, a: u64, b: u64, out: u64, n: usize, op: i32) -> Result<(), BackendError> {
        self.elementwise_scaled(node, a, b, out, n, op, 0.0)
    }

    /// [`Self::elementwise`] with the factor of op 4 (a * s).
    #[allow(clippy::too_many_arguments)]
    fn elementwise_scaled(
        &self,
        node: &CNode,
        a: u64,
        b: u64,
        out: u64,
        n: usize,
        op: i32,
        s: f32,
    ) -> Result<(), BackendError> {
        let cfg = launch_config((grid(n.div_ceil(256).clamp(1, 65_535))?, 1), 256);
        let args = [
            Arg::Ptr(a),
            Arg::Ptr(b),
            Arg::Ptr(out),
            Arg::I64(n as i64),
            Arg::I32(op),
            Arg::F32(s),
        ];
        self.launch(node, "elementwise", cfg, &args)
    }

    /// The layer's (K, V) regions: their addresses, their storage types (KV_F32, KV_F16,
    /// KV_Q8_0 in ops.cu) and their cells of `width` values.
    fn regions(&self, node: &CNode, kv_pair: Option<(usize, usize)>, width: usize) -> Result<Regions, BackendError> {
        let (k_id, v_id) = kv_pair.ok_or_else(|| Self::err(node, "no KV regions for this layer"))?;
        if width == 0 {
            return Err(Self::err(node, "KV cells of width 0"));
        }
        let layout = |id: usize| -> Result<(i32, usize), BackendError> {
            let slot = self.slot(id)?;
            let (code, n_ctx) = match slot.dtype {
                DType::F32 => (0, slot.bytes / 4 / width),
                DType::F16 => (1, slot.bytes / 2 / width),
                DType::Q8_0 if width.is_multiple_of(32) => (2, slot.bytes / 34 * 32 / width),
                other => {
                    return Err(Self::err(
                        node,
                        format!(
                            "a {} KV region of cells of {width} values (q8_0 needs whole blocks of 32)",
                            other.name()
                        ),
                    ))
                }
            };
            Ok((code, n_ctx))
        };
        let ((k_type, n_ctx), (v_type, v_ctx)) = (layout(k_id)?, layout(v_id)?);
        if n_ctx != v_ctx {
            return Err(Self::err(node, format!("K holds {n_ctx} cells and V {v_ctx}")));
        }
        Ok(Regions {
            k: self.ptr(k_id)?,
            v: self.ptr(v_id)?,
            k_type,
            v_type,
            n_ctx,
        })
    }

    /// Store `nt` K and V rows of `width` at the cells listed at `cells`.
    #[allow(clippy::too_many_arguments)]
    fn kv_store(
        &self,
        node: &CNode,
        k: u64,
        v: u64,
        cells: u64,
        nt: usize,
        width: usize,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError> {
        let r = self.regions(node, kv_pair, width)?;
        let cfg = launch_config((grid(nt)?, 1), 128);
        let args = [
            Arg::Ptr(k),
            Arg::Ptr(v),
            Arg::Ptr(cells),
            Arg::I32(int(width)?),
            Arg::I32(int(r.n_ctx)?),
            Arg::I32(r.k_type),
            Arg::I32(r.v_type),
            Arg::Ptr(r.k),
            Arg::Ptr(r.v),
            Arg::Ptr(self.flags_ptr()?),
        ];
        self.launch(node, "kv_store", cfg, &args)
    }

    fn run(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError> {
        let [d, nt, ..] = node.out_shape;
        let n = node.n_elements();
        // A KV store's output is the layer's K region, typed and sized by the cache (checked in
        // `regions`), not by the node's f32 shape.
        let out = if matches!(node.op, Op::KvcacheStore { .. }) {
            self.ptr(out_buf.id)?
        } else {
            self.input(node, out_buf, node.n_bytes())?
        };
        let f32s = |count: usize| count * 4;
        match (&node.op, &node.meta) {
            (Op::Input | Op::KvcacheLoad { .. }, _) => Ok(()),
            (Op::GetRows, NodeMeta::Embed(m)) => {
                let n_ids = n / m.n_embd.max(1);
                let ids = self.input(node, in_bufs[0], n_ids * 4)?;
                let w = self.weight(node, &m.weight_name)?;
                let ty = w.ggml_type;
                if !m.n_embd.is_multiple_of(32) || !m.n_embd.is_multiple_of(ty.block_size()) {
                    return Err(Self::err(
                        node,
                        format!("rows of {} values are not whole runs of 32", m.n_embd),
                    ));
                }
                let row_bytes = m.n_embd / ty.block_size() * ty.type_size();
                if w.data.len() < row_bytes * m.n_rows {
                    return Err(Self::err(
                        node,
                        format!("table '{}' is shorter than {} rows", m.weight_name, m.n_rows),
                    ));
                }
                let cfg = launch_config((grid(n_ids)?, 1), 32);
                let args = [
                    Arg::Ptr(self.weight_ptr(node, &m.weight_name)?),
                    Arg::I32(ty as i32),
                    Arg::I64(row_bytes as i64),
                    Arg::I32(int(m.n_embd)?),
                    Arg::I32(int(m.n_rows)?),
                    Arg::Ptr(ids),
                    Arg::Ptr(out),
                    Arg::Ptr(self.flags_ptr()?),
                ];
                self.launch(node, "get_rows_weight", cfg, &args)
            }
            (Op::GetRows, _) => {
                let n_ids = n / d.max(1);
                let x_slot_bytes = self.slot(in_bufs[0].id)?.bytes;
                let x = self.ptr(in_bufs[0].id)?;
                let ids = self.input(node, in_bufs[1], n_ids * 4)?;
                let cfg = launch_config((grid(n_ids)?, 1), 128);
                let args = [
                    Arg::Ptr(x),
                    Arg::Ptr(ids),
                    Arg::I32(int(d)?),
                    Arg::I32(int(x_slot_bytes / 4 / d.max(1))?),
                    Arg::Ptr(out),
                    Arg::Ptr(self.flags_ptr()?),
                ];
                self.launch(node, "get_rows_act", cfg, &args)
            }
            (Op::RmsNorm { eps }, NodeMeta::Norm(m)) => {
                let x = self.input(node, in_bufs[0], f32s(n))?;
                let w = match &m.weight_name {
                    Some(name) => self.f32_weight(node, name, d)?,
                    None => 0,
                };
                self.rms_norm(node, x, w, (d, n / d.max(1)), *eps, out)
            }
            (Op::QkNorm { head_dim, eps, .. }, NodeMeta::Norm(m)) => {
                let x = self.input(node, in_bufs[0], f32s(n))?;
                let name = m
                    .weight_name
                    .as_deref()
                    .ok_or_else(|| Self::err(node, "QkNorm needs a weight"))?;
                let w = self.f32_weight(node, name, *head_dim)?;
                self.rms_norm(node, x, w, (*head_dim, n / (*head_dim).max(1)), *eps, out)
            }
            (Op::MatMul, NodeMeta::MatMul(m)) => {
                let x = self.input(node, in_bufs[0], f32s(m.in_dim * nt))?;
                self.mul_mat(node, m, x, nt, out)
            }
            (Op::RoPE, NodeMeta::Rope(m)) => {
                if m.n_head * m.head_dim != d {
                    return Err(Self::err(
                        node,
                        format!("{} heads of {} are not rows of {d}", m.n_head, m.head_dim),
                    ));
                }
                let x = self.input(node, in_bufs[0], f32s(n))?;
                let positions = self.input(node, in_bufs[1], nt * 4)?;
                if x != out {
                    // SAFETY: both ranges are live allocations of at least n f32 (checked above).
                    unsafe { cudarc::driver::result::memcpy_dtod_async(out, x, f32s(n), self.stream()?.cu_stream()) }
                        .map_err(|e| Self::err(node, format!("copying the input: {e}")))?;
                }
                self.rope(node, out, positions, nt, m.n_head, m)
            }
            (Op::Silu, _) => {
                let x = self.input(node, in_bufs[0], f32s(n))?;
                self.elementwise(node, x, x, out, n, 3)
            }
            (Op::Gelu, _) => {
                let x = self.input(node, in_bufs[0], f32s(n))?;
                self.elementwise_scaled(node, x, x, out, n, 5, 0.0)
            }
            (Op::Scale { scale }, _) => {
                let x = self.input(node, in_bufs[0], f32s(n))?;
                self.elementwise_scaled(node, x, x, out, n, 4, *scale)
            }
            (Op::Softcap { cap }, _) => {
                let x = self.input(node, in_bufs[0], f32s(n))?;
                self.elementwise_scaled(node, x, x, out, n, 6, *cap)
            }
            (Op::Add | Op::Mul | Op::SwiGLU, _) => {
                let a = self.input(node, in_bufs[0], f32s(n))?;
                let b = self.input(node, in_bufs[1], f32s(n))?;
                let op = match node.op {
                    Op::Add => 0,
                    Op::Mul => 1,
                    _ => 2,
                };
                self.elementwise(node, a, b, out, n, op)
            }
            (Op::KvcacheStore { .. }, NodeMeta::Kvcache(meta)) => {
                if kv_pair.map(|p| p.0) != Some(out_buf.id) {
                    return Err(Self::err(node, "the store's output must be the layer's K region"));
                }
                let n_tok = self.slot(in_bufs[2].id)?.bytes / 4;
                let width = meta.n_kv_embd;
                let k = self.input(node, in_bufs[0], f32s(width * n_tok))?;
                let v = self.input(node, in_bufs[1], f32s(width * n_tok))?;
                let cells = self.ptr(in_bufs[2].id)?;
                self.kv_store(node, k, v, cells, n_tok, width, kv_pair)
            }
            (Op::Attn { explicit_span, .. }, NodeMeta::Attn(m)) => {
                if m.head_dim == 0 || m.head_dim > ATTN_MAX_HEAD_DIM {
                    return Err(Self::err(
                        node,
                        format!("heads of {} values (at most {ATTN_MAX_HEAD_DIM})", m.head_dim),
                    ));
                }
                if m.n_head_kv == 0 || !m.n_head.is_multiple_of(m.n_head_kv) {
                    return Err(Self::err(
                        node,
                        format!("{} query heads over {} KV heads", m.n_head, m.n_head_kv),
                    ));
                }
                let q = self.input(node, in_bufs[0], f32s(n))?;
                let positions = self.input(node, in_bufs[2], nt * 4)?;
                if m.n_head * m.head_dim != d {
                    return Err(Self::err(
                        node,
                        format!("{} heads of {} are not rows of {d}", m.n_head, m.head_dim),
                    ));
                }
                if nt > 65_535 {
                    return Err(Self::err(
                        node,
                        format!("{nt} tokens in one pass (attention takes at most 65,535)"),
                    ));
                }
                let (index, n_index, spans) = if *explicit_span {
                    match in_bufs {
                        [_, _, _, index, spans] => (
                            self.ptr(index.id)?,
                            self.slot(index.id)?.bytes / 4,
                            self.input(node, *spans, nt * 8)?,
                        ),
                        _ => return Err(Self::err(node, "explicit-span attention needs kv_index and kv_span")),
                    }
                } else {
                    (0, 0, 0)
                };
                let r = self.regions(node, kv_pair, m.n_head_kv * m.head_dim)?;
                let cfg = launch_config((grid(m.n_head)?, grid(nt)?), ATTN_THREADS);
                let args = [
                    Arg::Ptr(q),
                    Arg::Ptr(r.k),
                    Arg::Ptr(r.v),
                    Arg::I32(r.k_type),
                    Arg::I32(r.v_type),
                    Arg::Ptr(positions),
                    Arg::Ptr(index),
                    Arg::I32(int(n_index)?),
                    Arg::Ptr(spans),
                    Arg::I32(int(m.n_head)?),
                    Arg::I32(int(m.n_head_kv)?),
                    Arg::I32(int(m.head_dim)?),
                    Arg::I32(int(r.n_ctx)?),
                    Arg::Ptr(out),
                    Arg::Ptr(self.flags_ptr()?),
                    Arg::F32(m.kq_scale),
                    Arg::I32(int(m.n_swa.unwrap_or(0))?),
                    Arg::F32(m.softcap.unwrap_or(0.0)),
                ];
                self.launch(node, "attention", cfg, &args)
            }
            (Op::FusedQKV { .. } | Op::FusedQkvNorm { .. }, NodeMeta::FusedQkv(m)) => {
                let kv_width = m.kv.n_kv_embd;
                if m.k.out_dim != kv_width
                    || m.v.out_dim != kv_width
                    || m.n_head_kv * m.rope.head_dim != kv_width
                    || m.q.out_dim != d
                {
                    return Err(Self::err(
                        node,
                        format!(
                            "projections of {}, {} and {} do not fit KV cells of {kv_width} and rows of {d}",
                            m.q.out_dim, m.k.out_dim, m.v.out_dim
                        ),
                    ));
                }
                let x = self.input(node, in_bufs[0], f32s(m.q.in_dim * nt))?;
                let positions = self.input(node, in_bufs[1], nt * 4)?;
                let cells = self.input(node, in_bufs[2], nt * 4)?;
                let k = self.scratch(node, 0, f32s(m.k.out_dim * nt))?;
                let v = self.scratch(node, 1, f32s(m.v.out_dim * nt))?;
                self.mul_mat(node, &m.q, x, nt, out)?;
                self.mul_mat(node, &m.k, x, nt, k)?;
                self.mul_mat(node, &m.v, x, nt, v)?;
                let hd = m.rope.head_dim;
                if let Some((q_norm, k_norm, eps)) = &m.qk_norm {
                    let (qw, kw) = (self.f32_weight(node, q_norm, hd)?, self.f32_weight(node, k_norm, hd)?);
                    self.rms_norm(node, out, qw, (hd, nt * m.rope.n_head), *eps, out)?;
                    self.rms_norm(node, k, kw, (hd, nt * m.n_head_kv), *eps, k)?;
                }
                self.rope(node, out, positions, nt, m.rope.n_head, &m.rope)?;
                self.rope(node, k, positions, nt, m.n_head_kv, &m.rope)?;
                self.kv_store(node, k, v, cells, nt, m.kv.n_kv_embd, kv_pair)
            }
            (Op::FusedFFN, NodeMeta::FusedFfn(m)) => {
                if m.gate.out_dim != d || m.up.out_dim != d || m.gate.in_dim != m.up.in_dim {
                    return Err(Self::err(
                        node,
                        format!(
                            "gate and up of {} and {} outputs do not fit rows of {d}",
                            m.gate.out_dim, m.up.out_dim
                        ),
                    ));
                }
                let x = self.input(node, in_bufs[0], f32s(m.gate.in_dim * nt))?;
                let gate = self.scratch(node, 0, f32s(m.gate.out_dim * nt))?;
                let up = self.scratch(node, 1, f32s(m.up.out_dim * nt))?;
                self.mul_mat(node, &m.gate, x, nt, gate)?;
                self.mul_mat(node, &m.up, x, nt, up)?;
                self.elementwise(node, gate, up, out, n, 2)
            }
            // A payload that is not its op's (a malformed graph). Every op is named above or
            // here, none by a wildcard: a new op fails to compile until it is run or refused.
            (
                op @ (Op::RmsNorm { .. }
                | Op::QkNorm { .. }
                | Op::MatMul
                | Op::RoPE
                | Op::Attn { .. }
                | Op::KvcacheStore { .. }
                | Op::FusedQKV { .. }
                | Op::FusedQkvNorm { .. }
                | Op::FusedFFN
                | Op::Sigmoid
                | Op::Softmax
                | Op::TopK { .. }
                | Op::MoeWeights { .. }
                | Op::MatMulId
                | Op::MoeSum
                | Op::SwigluOai { .. }),
                _,
            ) => Err(BackendError::Unsupported {
                backend: "cuda".into(),
                node: node.name.clone(),
                op: op.name(),
            }),
        }
    }

    /// Wait until the stream has run everything queued on it.
    fn wait_for_stream(&self) -> Result<(), BackendError> {
        self.stream()?.synchronize().map_err(|e| BackendError::Node {
            backend: "cuda".into(),
            node: "(graph)".into(),
            message: format!("the device failed: {e}"),
        })
    }

    /// Read the kernels' error flags (after the stream is idle) and clear them.
    fn check_flags(&mut self) -> Result<(), BackendError> {
        let stream = Arc::clone(self.stream()?);
        let Some(flags) = self.flags.as_mut() else {
            return Err(Self::buffer_error(0, "the error flags could not be allocated"));
        };
        let raised = stream
            .clone_dtoh(flags)
            .map_err(|e| Self::buffer_error(0, format!("reading the error flags: {e}")))?[0];
        if raised == 0 {
            return Ok(());
        }
        stream
            .memset_zeros(flags)
            .map_err(|e| Self::buffer_error(0, format!("clearing the error flags: {e}")))?;
        let what: Vec<&str> = FLAG_MESSAGES
            .iter()
            .filter(|(bit, _)| raised & bit != 0)
            .map(|(_, m)| *m)
            .collect();
        Err(BackendError::Node {
            backend: "cuda".into(),
            node: "(graph)".into(),
            message: format!("a kernel found {}", what.join(" and ")),
        })
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // The weights are freed on another stream when the last context lets go of them: no
        // kernel of this one may still be reading them.
        if let Ok(stream) = &self.stream {
            let _ = stream.synchronize();
        }
    }
}

/// `grid` blocks of `threads` threads, no dynamic shared memory.
fn launch_config(grid: (u32, u32), threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid.0, grid.1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A grid dimension (at least 1), refused past CUDA's limit of 2^31 - 1 blocks for grid.x (grid.y,
/// at most 65,535, is checked where it is used).
fn grid(n: usize) -> Result<u32, BackendError> {
    u32::try_from(n.max(1))
        .ok()
        .filter(|&g| g < 1 << 31)
        .ok_or_else(|| BackendError::Node {
            backend: "cuda".into(),
            node: "(launch)".into(),
            message: format!("{n} blocks is past the grid's limit"),
        })
}

/// A size as a kernel's `int`, refused past `i32::MAX`.
fn int(n: usize) -> Result<i32, BackendError> {
    i32::try_from(n).map_err(|_| BackendError::Node {
        backend: "cuda".into(),
        node: "(launch)".into(),
        message: format!("{n} does not fit a kernel's 32-bit size"),
    })
}

impl ComputeBackend for CudaBackend {
    fn supports_weight(&self, ty: crate::quant::GgmlType) -> bool {
        super::WEIGHT_TYPES.contains(&ty)
    }

    fn handle(&self) -> Backend {
        Backend::CUDA
    }

    fn name(&self) -> &str {
        "cuda"
    }

    fn supports_meta(&self, meta: &NodeMeta) -> bool {
        // No YaRN blend in this RoPE kernel yet (gpt-oss): declined, as sinks are.
        match meta {
            NodeMeta::Rope(r) => r.yarn.is_none(),
            NodeMeta::FusedQkv(m) => m.rope.yarn.is_none(),
            _ => true,
        }
    }

    fn supports_op(&self, op: &Op, dtype: DType) -> bool {
        // Every op, named: a new one is a compile error here until it is handled or refused.
        match op {
            // No sinks in this attention yet (gpt-oss): declined, so the node is refused by name
            // or runs on the CPU beside the device.
            Op::Attn { sinks: true, .. } => false,
            Op::Input => dtype == DType::I32 || dtype == DType::F32,
            Op::Add
            | Op::Mul
            | Op::Silu
            | Op::Scale { .. }
            | Op::Softcap { .. }
            | Op::Gelu
            | Op::SwiGLU
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
            // Mixture-of-experts routing and expert products have no kernels yet: a graph with
            // experts runs them on the CPU beside the device (its split is reported), or, on the
            // device alone, is refused naming the op.
            Op::Sigmoid
            | Op::Softmax
            | Op::TopK { .. }
            | Op::MoeWeights { .. }
            | Op::MatMulId
            | Op::MoeSum
            | Op::SwigluOai { .. } => false,
        }
    }

    fn supports_fused(&self, fused: FusedOp) -> bool {
        // Each fused decode node is one launch instead of several: on a device, launches are
        // what a one-token step waits on.
        match fused {
            FusedOp::SwiGLU | FusedOp::DecodeQkv | FusedOp::DecodeFfn => true,
        }
    }

    fn alloc_buffer(&mut self, bytes: usize, dtype: DType) -> usize {
        // Only an exact size is recycled, as on the CPU.
        match self.free.iter().position(|&id| {
            let s = &self.slots[id];
            s.bytes == bytes && s.dtype == dtype && s.failure.is_none()
        }) {
            Some(pos) => self.free.swap_remove(pos),
            None => self.alloc_fresh(bytes, dtype),
        }
    }

    fn free_buffer(&mut self, id: usize) {
        if id < self.slots.len() && !self.free.contains(&id) {
            self.free.push(id);
        }
    }

    fn alloc_fresh(&mut self, bytes: usize, dtype: DType) -> usize {
        // Zeroed, as the CPU's are: a KV region's unwritten cells read as zeros.
        super::count_device_allocation();
        let (mem, failure) = match self.stream.as_ref() {
            Ok(stream) => match stream.alloc_zeros::<u8>(bytes.max(1)) {
                Ok(mem) => (Some(mem), None),
                Err(e) => (
                    None,
                    Some(format!("could not be allocated ({bytes} bytes of device memory): {e}")),
                ),
            },
            Err(e) => (None, Some(e.clone())),
        };
        self.slots.push(Slot {
            mem,
            bytes,
            dtype,
            failure,
        });
        self.slots.len() - 1
    }

    fn pool_len(&self) -> usize {
        self.slots.len()
    }

    fn execute_node(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError> {
        if let Some(b) = in_bufs.iter().chain([&out_buf]).find(|b| b.backend != Backend::CUDA) {
            return Err(Self::err(
                node,
                format!("buffer {} is on {}, not on the GPU", b.id, b.backend),
            ));
        }
        self.run(node, in_bufs, out_buf, kv_pair)
    }

    fn buffer_info(&self, id: usize) -> Option<(usize, DType)> {
        self.slots.get(id).map(|s| (s.bytes, s.dtype))
    }

    fn read_buffer(&mut self, id: usize, offset: usize, dst: &mut [u8]) -> Result<(), BackendError> {
        self.synchronize()?;
        let stream = Arc::clone(self.stream()?);
        let slot = self.slot(id)?;
        let range = crate::graph::backend::buffer_window("cuda", id, slot.bytes, offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let mem = slot
            .mem
            .as_ref()
            .ok_or_else(|| Self::buffer_error(id, "holds no memory"))?;
        let view = mem
            .try_slice(range)
            .ok_or_else(|| Self::buffer_error(id, "window outside the allocation"))?;
        stream
            .memcpy_dtoh(&view, dst)
            .and_then(|()| stream.synchronize())
            .map_err(|e| Self::buffer_error(id, format!("copying to the host: {e}")))
    }

    fn write_buffer(&mut self, id: usize, offset: usize, src: &[u8]) -> Result<(), BackendError> {
        let stream = Arc::clone(self.stream()?);
        let bytes = self.slot(id)?.bytes;
        let range = crate::graph::backend::buffer_window("cuda", id, bytes, offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let mem = self.slots[id]
            .mem
            .as_mut()
            .ok_or_else(|| Self::buffer_error(id, "holds no memory"))?;
        let mut view = mem
            .try_slice_mut(range)
            .ok_or_else(|| Self::buffer_error(id, "window outside the allocation"))?;
        stream
            .memcpy_htod(src, &mut view)
            .map_err(|e| Self::buffer_error(id, format!("copying from the host: {e}")))
    }

    /// A context shift happens once per half a context, not per token: the region comes to the
    /// host, turns with the CPU's reference rotation and goes back. (A device kernel would
    /// spare the two copies; the seam lets one replace this without touching the engine.)
    fn rope_shift(&mut self, id: usize, shift: &crate::graph::KShift) -> Result<(), BackendError> {
        let (bytes, dtype) = self
            .buffer_info(id)
            .ok_or_else(|| Self::buffer_error(id, "does not exist"))?;
        let mut words = vec![0f32; bytes.div_ceil(4)];
        self.read_buffer(id, 0, &mut bytemuck::cast_slice_mut(&mut words)[..bytes])?;
        let factors = match &shift.rope.freq_factors {
            None => None,
            Some(name) => {
                let w = self
                    .weights
                    .get(name)
                    .ok_or_else(|| Self::buffer_error(id, format!("context shift: no weight '{name}'")))?;
                let mut values = vec![0f32; w.data.len() / 4];
                let stream = Arc::clone(self.stream()?);
                stream
                    .memcpy_dtoh(&w.data.slice(..values.len() * 4), bytemuck::cast_slice_mut(&mut values))
                    .and_then(|()| stream.synchronize())
                    .map_err(|e| Self::buffer_error(id, format!("copying '{name}' to the host: {e}")))?;
                Some(values)
            }
        };
        crate::backends::cpu::kernels::rope_shift(&mut words, bytes, dtype, shift, factors.as_deref())
            .map_err(|e| Self::buffer_error(id, format!("context shift: {e}")))?;
        self.write_buffer(id, 0, &bytemuck::cast_slice(&words)[..bytes])
    }

    /// A timed node's kernels run to the end before the clock stops: the profile's per-node
    /// times are then the kernels' (each with its launch), at the cost of the overlap of a
    /// launch with the kernel before it. The error flags wait for the step's `synchronize`:
    /// reading them is a copy to the host, which would swamp a kernel of a few microseconds.
    fn wait_for_node(&mut self) -> Result<(), BackendError> {
        self.wait_for_stream()
    }

    fn synchronize(&mut self) -> Result<(), BackendError> {
        self.wait_for_stream()?;
        self.check_flags()
    }
}
