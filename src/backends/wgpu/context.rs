//! One session's execution context on a wgpu device: its buffers in device memory, addressed by
//! id, and the dispatch of each node's kernel. The host reads and writes buffers only by copy
//! (a staging buffer mapped for reading, the queue's writes), and every wait is bounded by
//! [`WAIT_TIMEOUT`](super::WAIT_TIMEOUT).
//!
//! Owns the buffer pool and the kernels' bindings; must not know a model. Each node is one
//! submission for now (one per split is the goal).

use super::Shared;
use crate::graph::{Backend, BackendError, BufRef, CNode, ComputeBackend, DType, FusedOp, NodeMeta, Op};
use std::sync::Arc;

/// Storage bindings and copies move whole 4-byte words.
const ALIGN: u64 = wgpu::COPY_BUFFER_ALIGNMENT;
/// Invocations per workgroup of the element-wise and norm kernels (their WGSL says the same).
const WORKGROUP: u32 = 256;
/// The most workgroups one dimension of a dispatch takes (WebGPU's default limit).
const MAX_GROUPS: u32 = 65_535;

/// The compiled kernels, made once per device.
pub(crate) struct Pipelines {
    elementwise: wgpu::ComputePipeline,
    rms_norm: wgpu::ComputePipeline,
    rows: wgpu::ComputePipeline,
    mul_mat: wgpu::ComputePipeline,
    get_rows: wgpu::ComputePipeline,
    rope: wgpu::ComputePipeline,
    kv_store: wgpu::ComputePipeline,
    attention: wgpu::ComputePipeline,
}

fn pipeline(device: &wgpu::Device, label: &str, source: &str) -> wgpu::ComputePipeline {
    entry(device, label, source, "main")
}

fn entry(device: &wgpu::Device, label: &str, source: &str, entry_point: &str) -> wgpu::ComputePipeline {
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    });
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(label),
        layout: None,
        module: &module,
        entry_point: Some(entry_point),
        compilation_options: Default::default(),
        cache: None,
    })
}

/// The f16-to-f32 conversion by bit operations, shared by the kernels that read stored f16
/// (WGSL has no includes: it is prepended to their sources).
const F16: &str = include_str!("shaders/f16.wgsl");

/// Every kernel file: its name, its WGSL, and whether it reads stored f16.
const KERNELS: [(&str, &str, bool); 7] = [
    ("elementwise", include_str!("shaders/elementwise.wgsl"), false),
    ("rms_norm", include_str!("shaders/rms_norm.wgsl"), false),
    ("rows", include_str!("shaders/rows.wgsl"), false),
    ("rope", include_str!("shaders/rope.wgsl"), false),
    ("weights", include_str!("shaders/weights.wgsl"), true),
    ("kv", include_str!("shaders/kv.wgsl"), true),
    ("attention", include_str!("shaders/attention.wgsl"), true),
];

/// The whole WGSL of kernel file `name`, the shared f16 conversion prepended where it reads f16.
pub(crate) fn kernel_source(name: &str) -> String {
    let (_, source, f16) = KERNELS
        .iter()
        .find(|(n, ..)| *n == name)
        .expect("a kernel file of the table");
    if *f16 {
        format!("{F16}\n{source}")
    } else {
        source.to_string()
    }
}

/// The names of every kernel file: for tests that translate them to Metal and HLSL.
#[cfg(test)]
pub(crate) fn kernel_names() -> impl Iterator<Item = &'static str> {
    KERNELS.iter().map(|(name, ..)| *name)
}

impl Pipelines {
    pub(crate) fn new(device: &wgpu::Device) -> Self {
        let (weights, kv) = (kernel_source("weights"), kernel_source("kv"));
        Pipelines {
            elementwise: pipeline(device, "elementwise", &kernel_source("elementwise")),
            rms_norm: pipeline(device, "rms_norm", &kernel_source("rms_norm")),
            rows: pipeline(device, "rows", &kernel_source("rows")),
            mul_mat: entry(device, "mul_mat", &weights, "mul_mat"),
            get_rows: entry(device, "get_rows", &weights, "get_rows"),
            rope: pipeline(device, "rope", &kernel_source("rope")),
            kv_store: entry(device, "kv_store", &kv, "kv_store"),
            attention: pipeline(device, "attention", &kernel_source("attention")),
        }
    }
}

/// The weight types `weights.wgsl` reads, by their GGML ids.
const WEIGHT_TYPES: [crate::quant::GgmlType; 11] = {
    use crate::quant::GgmlType::*;
    [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K]
};

/// A device buffer holding `bytes` (rounded up to whole words, at least one).
fn storage(device: &wgpu::Device, label: &str, bytes: u64) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes.div_ceil(ALIGN).max(1) * ALIGN,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

/// A device buffer holding `data` (a weight, uploaded once).
pub(crate) fn upload(device: &wgpu::Device, queue: &wgpu::Queue, label: &str, data: &[u8]) -> wgpu::Buffer {
    let buffer = storage(device, label, data.len() as u64);
    write_words(queue, &buffer, 0, data);
    buffer
}

/// Write `data` at `offset` (a multiple of 4), padding a ragged end with zeros.
fn write_words(queue: &wgpu::Queue, buffer: &wgpu::Buffer, offset: u64, data: &[u8]) {
    let whole = data.len() / 4 * 4;
    if whole > 0 {
        queue.write_buffer(buffer, offset, &data[..whole]);
    }
    if whole < data.len() {
        let mut tail = [0u8; 4];
        tail[..data.len() - whole].copy_from_slice(&data[whole..]);
        queue.write_buffer(buffer, offset + whole as u64, &tail);
    }
}

/// A buffer of the pool.
struct Slot {
    buffer: Arc<wgpu::Buffer>,
    /// Bytes asked for (the buffer may be larger).
    bytes: usize,
    dtype: DType,
    free: bool,
}

/// One session's context on the device; see the module documentation.
pub struct WgpuBackend {
    shared: Arc<Shared>,
    slots: Vec<Slot>,
}

impl WgpuBackend {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        WgpuBackend {
            shared,
            slots: Vec::new(),
        }
    }

    fn err(node: &CNode, message: impl Into<String>) -> BackendError {
        BackendError::Node {
            backend: "wgpu".into(),
            node: node.name.clone(),
            message: message.into(),
        }
    }

    fn buffer_error(id: usize, problem: impl Into<String>) -> BackendError {
        BackendError::Buffer {
            backend: "wgpu".into(),
            id,
            problem: problem.into(),
        }
    }

    fn slot(&self, id: usize) -> Result<&Slot, BackendError> {
        self.slots
            .get(id)
            .ok_or_else(|| Self::buffer_error(id, "does not exist"))
    }

    /// Wait for everything submitted, at most [`WAIT_TIMEOUT`](super::WAIT_TIMEOUT).
    fn wait(&self, what: &str) -> Result<(), BackendError> {
        self.shared
            .device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: Some(super::WAIT_TIMEOUT),
            })
            .map(|_| ())
            .map_err(|e| BackendError::Node {
                backend: "wgpu".into(),
                node: what.into(),
                message: format!("waiting for the device: {e}"),
            })
    }

    /// Bytes `start..end` (whole words) of buffer `id`, copied to the host.
    fn read_words(&self, id: usize, start: u64, end: u64) -> Result<Vec<u8>, BackendError> {
        let device = &self.shared.device;
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: end - start,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = device.create_command_encoder(&Default::default());
        encoder.copy_buffer_to_buffer(&self.slot(id)?.buffer, start, &staging, 0, end - start);
        self.shared.queue.submit([encoder.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait(&format!("(reading buffer {id})"))?;
        rx.recv_timeout(super::WAIT_TIMEOUT)
            .map_err(|_| Self::buffer_error(id, "the device never mapped its copy"))?
            .map_err(|e| Self::buffer_error(id, format!("mapping its copy: {e}")))?;
        let bytes = staging
            .get_mapped_range(..)
            .map_err(|e| Self::buffer_error(id, format!("mapping its copy: {e}")))?
            .to_vec();
        staging.unmap();
        Ok(bytes)
    }

    /// A uniform buffer holding `words` (4 or 8 of them, as the kernel's `Params`).
    fn uniform(&self, words: &[u32]) -> wgpu::Buffer {
        let buffer = self.shared.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params"),
            size: (words.len() as u64 * 4).div_ceil(16) * 16,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.shared.queue.write_buffer(&buffer, 0, bytemuck::cast_slice(words));
        buffer
    }

    /// Dispatch `pipeline` over `groups` workgroups with `bindings` in order (binding i is the
    /// i-th). An input that is also the output is read from a copy made first, since one
    /// dispatch may not bind a buffer both for reading and writing.
    fn dispatch(
        &self,
        node: &CNode,
        pipeline: &wgpu::ComputePipeline,
        inputs: &[&wgpu::Buffer],
        outputs: &[&wgpu::Buffer],
        params: &wgpu::Buffer,
        groups: (u32, u32, u32),
    ) -> Result<(), BackendError> {
        let device = &self.shared.device;
        let mut encoder = device.create_command_encoder(&Default::default());
        let copies: Vec<Option<wgpu::Buffer>> = inputs
            .iter()
            .map(|b| {
                outputs.contains(b).then(|| {
                    let copy = storage(device, "alias", b.size());
                    encoder.copy_buffer_to_buffer(b, 0, &copy, 0, b.size());
                    copy
                })
            })
            .collect();
        let mut entries: Vec<wgpu::BindGroupEntry<'_>> = inputs
            .iter()
            .zip(&copies)
            .enumerate()
            .map(|(i, (b, copy))| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: copy.as_ref().unwrap_or(b).as_entire_binding(),
            })
            .collect();
        for (i, out) in outputs.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: (inputs.len() + i) as u32,
                resource: out.as_entire_binding(),
            });
        }
        entries.push(wgpu::BindGroupEntry {
            binding: (inputs.len() + outputs.len()) as u32,
            resource: params.as_entire_binding(),
        });
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&node.name),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(groups.0, groups.1, groups.2);
        }
        self.shared.queue.submit([encoder.finish()]);
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Self::err(node, format!("the device refused the dispatch: {e}")));
        }
        Ok(())
    }

    fn buffer(&self, node: &CNode, buf: BufRef) -> Result<Arc<wgpu::Buffer>, BackendError> {
        self.slots
            .get(buf.id)
            .map(|s| Arc::clone(&s.buffer))
            .ok_or_else(|| Self::err(node, format!("buffer {} does not exist", buf.id)))
    }

    /// The uploaded bytes of weight `name`, in its file's layout.
    fn weight(&self, node: &CNode, name: &str) -> Result<Arc<wgpu::Buffer>, BackendError> {
        self.shared
            .weights
            .get(name)
            .cloned()
            .ok_or_else(|| BackendError::MissingWeight {
                backend: "wgpu".into(),
                node: node.name.clone(),
                weight: name.into(),
            })
    }

    /// Workgroups for `n` items, `per_group` a group: as rows of at most [`MAX_GROUPS`].
    fn grid(node: &CNode, n: usize, per_group: u32) -> Result<(u32, u32), BackendError> {
        let groups = u32::try_from(n.div_ceil(per_group as usize).max(1))
            .map_err(|_| Self::err(node, format!("{n} items are too many for one dispatch")))?;
        let x = groups.min(MAX_GROUPS);
        let y = groups.div_ceil(x);
        if y > MAX_GROUPS {
            return Err(Self::err(node, format!("{n} items are too many for one dispatch")));
        }
        Ok((x, y))
    }

    /// The type id and row bytes of a weight `weights.wgsl` reads, or the refusal naming it.
    fn weight_layout(node: &CNode, ty: crate::quant::GgmlType, n_in: usize) -> Result<(u32, u32), BackendError> {
        if !WEIGHT_TYPES.contains(&ty) {
            return Err(Self::err(node, format!("weights of type {ty} are not read here")));
        }
        let row = ty
            .row_size(n_in as u64)
            .and_then(|b| u32::try_from(b).ok())
            .ok_or_else(|| Self::err(node, format!("rows of {n_in} values are not whole {ty} blocks")))?;
        Ok((ty as u32, row))
    }

    fn mul_mat(&self, node: &CNode, m: &crate::graph::MatMulMeta, x: BufRef, out: BufRef) -> Result<(), BackendError> {
        let (ty, row_bytes) = Self::weight_layout(node, m.weight_type, m.in_dim)?;
        let nt = node.out_shape[1];
        let w = self.weight(node, &m.weight_name)?;
        let x = self.buffer(node, x)?;
        let bias = match &m.bias_name {
            Some(name) => self.weight(node, name)?,
            None => Arc::clone(&x),
        };
        let words = [
            ty,
            row_bytes,
            m.in_dim as u32,
            m.out_dim as u32,
            nt as u32,
            u32::from(m.bias_name.is_some()),
            0,
            0,
        ];
        let params = self.uniform(&words);
        let (gx, gy) = Self::grid(node, m.out_dim, 1)?;
        let gz = Self::rows_grid(node, nt)?;
        let out = self.buffer(node, out)?;
        self.dispatch(
            node,
            &self.shared.pipelines.mul_mat,
            &[&w, &x, &bias],
            &[&out],
            &params,
            (gx, gy, gz),
        )
    }

    fn embed(&self, node: &CNode, m: &crate::graph::EmbedMeta, ids: BufRef, out: BufRef) -> Result<(), BackendError> {
        let (ty, row_bytes) = Self::weight_layout(node, m.weight_type, m.n_embd)?;
        let nt = node.out_shape[1];
        let table = self.weight(node, &m.weight_name)?;
        let ids = self.buffer(node, ids)?;
        let words = [ty, row_bytes, m.n_embd as u32, m.n_rows as u32, nt as u32, 0, 0, 0];
        let params = self.uniform(&words);
        let gx = Self::rows_grid(node, nt)?;
        let out = self.buffer(node, out)?;
        self.dispatch(
            node,
            &self.shared.pipelines.get_rows,
            &[&table, &ids, &ids],
            &[&out],
            &params,
            (gx, 1, 1),
        )
    }

    fn gather_rows_node(&self, node: &CNode, src: BufRef, ids: BufRef, out: BufRef) -> Result<(), BackendError> {
        let [d, n_ids, ..] = node.out_shape;
        let n_rows_in = self.slot(src.id)?.bytes / 4 / d.max(1);
        let params = self.uniform(&[d as u32, n_rows_in as u32, n_ids as u32, 0]);
        let gx = Self::rows_grid(node, n_ids)?;
        let (src, ids, out) = (
            self.buffer(node, src)?,
            self.buffer(node, ids)?,
            self.buffer(node, out)?,
        );
        self.dispatch(
            node,
            &self.shared.pipelines.rows,
            &[&src, &ids],
            &[&out],
            &params,
            (gx, 1, 1),
        )
    }

    fn rope(
        &self,
        node: &CNode,
        m: &crate::graph::RopeMeta,
        x: BufRef,
        positions: BufRef,
        out: BufRef,
    ) -> Result<(), BackendError> {
        if m.n_rot > m.head_dim || !m.n_rot.is_multiple_of(2) {
            return Err(Self::err(
                node,
                format!("n_rot {} does not fit heads of {}", m.n_rot, m.head_dim),
            ));
        }
        let nt = node.out_shape[1];
        // The same f32 power as the CPU's kernel.
        let theta_scale = m.freq_base.powf(-2.0 / m.n_rot as f32);
        let neox = u32::from(m.style == crate::graph::RopeStyle::Neox);
        let words = [
            m.n_head as u32,
            m.head_dim as u32,
            m.n_rot as u32,
            theta_scale.to_bits(),
            neox,
            nt as u32,
            0,
            0,
        ];
        let params = self.uniform(&words);
        let gx = Self::rows_grid(node, nt)?;
        let (x, positions, out) = (
            self.buffer(node, x)?,
            self.buffer(node, positions)?,
            self.buffer(node, out)?,
        );
        self.dispatch(
            node,
            &self.shared.pipelines.rope,
            &[&x, &positions],
            &[&out],
            &params,
            (gx, 1, 1),
        )
    }

    /// One workgroup per row, at most [`MAX_GROUPS`] rows.
    fn rows_grid(node: &CNode, n: usize) -> Result<u32, BackendError> {
        u32::try_from(n)
            .ok()
            .filter(|&x| x <= MAX_GROUPS)
            .ok_or_else(|| Self::err(node, format!("{n} rows in one dispatch")))
    }

    /// The layer's (K, V) regions, their stored types and the GGML ids `kv.wgsl` and
    /// `attention.wgsl` read them by.
    fn regions(
        &self,
        node: &CNode,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<[(Arc<wgpu::Buffer>, DType, u32); 2], BackendError> {
        let (k, v) = kv_pair.ok_or_else(|| Self::err(node, "no KV regions for this layer"))?;
        let region = |id: usize| -> Result<(Arc<wgpu::Buffer>, DType, u32), BackendError> {
            let slot = self.slot(id)?;
            let ty = slot
                .dtype
                .ggml_type()
                .ok_or_else(|| Self::err(node, format!("a {} KV region", slot.dtype.name())))?;
            Ok((Arc::clone(&slot.buffer), slot.dtype, ty as u32))
        };
        Ok([region(k)?, region(v)?])
    }

    fn kv_store(
        &self,
        node: &CNode,
        meta: &crate::graph::KvcacheMeta,
        in_bufs: &[BufRef],
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError> {
        let [(k_region, _, type_k), (v_region, _, type_v)] = self.regions(node, kv_pair)?;
        let width = meta.n_kv_embd;
        if (!width.is_multiple_of(32) && (type_k == 8 || type_v == 8)) || !width.is_multiple_of(2) {
            return Err(Self::err(
                node,
                format!("cells of {width} values do not fit the KV types"),
            ));
        }
        let [k, v, cells] = in_bufs else {
            return Err(Self::err(node, "the store needs K, V and the cells"));
        };
        let nt = self.slot(cells.id)?.bytes / 4;
        let words = [
            width as u32,
            nt as u32,
            type_k,
            type_v,
            meta.n_ctx as u32,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ];
        let params = self.uniform(&words);
        let (k, v, cells) = (
            self.buffer(node, *k)?,
            self.buffer(node, *v)?,
            self.buffer(node, *cells)?,
        );
        let gx = Self::rows_grid(node, nt)?;
        self.dispatch(
            node,
            &self.shared.pipelines.kv_store,
            &[&k, &v, &cells],
            &[&k_region, &v_region],
            &params,
            (gx, 2, 1),
        )
    }

    fn attention(
        &self,
        node: &CNode,
        m: &crate::graph::AttnMeta,
        explicit_span: bool,
        in_bufs: &[BufRef],
        out: BufRef,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError> {
        if m.head_dim == 0 || m.head_dim > 256 {
            return Err(Self::err(node, format!("heads of {} values (at most 256)", m.head_dim)));
        }
        if m.n_head_kv == 0 || !m.n_head.is_multiple_of(m.n_head_kv) {
            return Err(Self::err(
                node,
                format!("{} query heads over {} KV heads", m.n_head, m.n_head_kv),
            ));
        }
        let [(k_region, k_dtype, type_k), (v_region, _, type_v)] = self.regions(node, kv_pair)?;
        let nt = node.out_shape[1];
        let width = m.n_head_kv * m.head_dim;
        let n_ctx = self.slot(kv_pair.map_or(0, |p| p.0))?.bytes / k_dtype.bytes(width).max(1);
        let q = self.buffer(node, in_bufs[0])?;
        let positions = self.buffer(node, *in_bufs.get(2).ok_or_else(|| Self::err(node, "no positions"))?)?;
        let (index, spans, n_index) = if explicit_span {
            match in_bufs {
                [_, _, _, index, spans] => (
                    self.buffer(node, *index)?,
                    self.buffer(node, *spans)?,
                    self.slot(index.id)?.bytes / 4,
                ),
                _ => return Err(Self::err(node, "explicit-span attention needs kv_index and kv_span")),
            }
        } else {
            (Arc::clone(&positions), Arc::clone(&positions), 0)
        };
        let words = [
            width as u32,
            nt as u32,
            type_k,
            type_v,
            n_ctx as u32,
            m.n_head as u32,
            m.head_dim as u32,
            u32::from(explicit_span),
            n_index as u32,
            m.n_head_kv as u32,
            0,
            0,
        ];
        let params = self.uniform(&words);
        let out = self.buffer(node, out)?;
        let gy = Self::rows_grid(node, nt)?;
        self.dispatch(
            node,
            &self.shared.pipelines.attention,
            &[&q, &k_region, &v_region, &positions, &index, &spans],
            &[&out],
            &params,
            (m.n_head as u32, gy, 1),
        )
    }

    fn rms_norm(
        &self,
        node: &CNode,
        x: BufRef,
        weight: Option<&str>,
        d: usize,
        eps: f32,
        out: BufRef,
    ) -> Result<(), BackendError> {
        let n: usize = node.out_shape.iter().product();
        if d == 0 || !n.is_multiple_of(d) {
            return Err(Self::err(node, format!("rows of {d} do not divide {n} values")));
        }
        let rows = n / d;
        let x = self.buffer(node, x)?;
        let w = match weight {
            Some(name) => self.weight(node, name)?,
            None => Arc::clone(&x),
        };
        let params = self.uniform(&[d as u32, rows as u32, eps.to_bits(), u32::from(weight.is_some())]);
        let (gx, gy) = Self::grid(node, rows, 1)?;
        let out = self.buffer(node, out)?;
        self.dispatch(
            node,
            &self.shared.pipelines.rms_norm,
            &[&x, &w],
            &[&out],
            &params,
            (gx, gy, 1),
        )
    }
}

impl ComputeBackend for WgpuBackend {
    fn handle(&self) -> Backend {
        Backend::WGPU
    }

    fn name(&self) -> &str {
        "wgpu"
    }

    fn supports_op(&self, op: &Op, dtype: DType) -> bool {
        match op {
            Op::Input => true,
            Op::Add
            | Op::Mul
            | Op::Silu
            | Op::SwiGLU
            | Op::RmsNorm { .. }
            | Op::QkNorm { .. }
            | Op::MatMul
            | Op::GetRows
            | Op::RoPE
            | Op::Attn { .. } => dtype == DType::F32,
            // The store writes the layer's regions in their own types; the load is a view of
            // them (its buffer is the K region), with nothing to run.
            Op::KvcacheStore { .. } | Op::KvcacheLoad { .. } => true,
            // The fused decode nodes are declined (`supports_fused` does not claim them).
            Op::FusedQKV { .. } | Op::FusedQkvNorm { .. } | Op::FusedFFN => false,
        }
    }

    fn supports_fused(&self, fused: FusedOp) -> bool {
        match fused {
            FusedOp::SwiGLU => true,
            FusedOp::DecodeQkv | FusedOp::DecodeFfn => false,
        }
    }

    fn alloc_buffer(&mut self, bytes: usize, dtype: DType) -> usize {
        // Only an exact size is recycled, as the CPU's pool does: within one graph a buffer
        // passes from node to node, and every node must find it at its own size (a gather's
        // rows are counted from it).
        match self
            .slots
            .iter()
            .position(|s| s.free && s.bytes == bytes && s.dtype == dtype)
        {
            Some(id) => {
                self.slots[id].free = false;
                id
            }
            None => self.alloc_fresh(bytes, dtype),
        }
    }

    fn free_buffer(&mut self, id: usize) {
        if let Some(slot) = self.slots.get_mut(id) {
            slot.free = true;
        }
    }

    fn alloc_fresh(&mut self, bytes: usize, dtype: DType) -> usize {
        let buffer = storage(&self.shared.device, "buffer", bytes as u64);
        self.slots.push(Slot {
            buffer: Arc::new(buffer),
            bytes,
            dtype,
            free: false,
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
        let input = |i: usize| {
            in_bufs
                .get(i)
                .copied()
                .ok_or_else(|| Self::err(node, format!("input {i} is missing")))
        };
        match (&node.op, &node.meta) {
            (Op::Input | Op::KvcacheLoad { .. }, _) => Ok(()),
            (Op::Add | Op::Mul | Op::Silu | Op::SwiGLU, _) => {
                let n: usize = node.out_shape.iter().product();
                let code = match node.op {
                    Op::Add => 0,
                    Op::Mul => 1,
                    Op::Silu => 2,
                    _ => 3,
                };
                let a = self.buffer(node, input(0)?)?;
                let b = if code == 2 {
                    Arc::clone(&a)
                } else {
                    self.buffer(node, input(1)?)?
                };
                let (gx, gy) = Self::grid(node, n, WORKGROUP)?;
                let params = self.uniform(&[n as u32, code, gx * WORKGROUP, 0]);
                let out = self.buffer(node, out_buf)?;
                self.dispatch(
                    node,
                    &self.shared.pipelines.elementwise,
                    &[&a, &b],
                    &[&out],
                    &params,
                    (gx, gy, 1),
                )
            }
            (Op::RmsNorm { eps }, NodeMeta::Norm(m)) => {
                let d = node.out_shape[0];
                self.rms_norm(node, input(0)?, m.weight_name.as_deref(), d, *eps, out_buf)
            }
            (Op::QkNorm { head_dim, eps, .. }, NodeMeta::Norm(m)) => {
                let name = m
                    .weight_name
                    .as_deref()
                    .ok_or_else(|| Self::err(node, "QkNorm needs a weight"))?;
                self.rms_norm(node, input(0)?, Some(name), *head_dim, *eps, out_buf)
            }
            (Op::MatMul, NodeMeta::MatMul(m)) => self.mul_mat(node, m, input(0)?, out_buf),
            (Op::GetRows, NodeMeta::Embed(m)) => self.embed(node, m, input(0)?, out_buf),
            (Op::GetRows, _) => self.gather_rows_node(node, input(0)?, input(1)?, out_buf),
            (Op::RoPE, NodeMeta::Rope(m)) => self.rope(node, m, input(0)?, input(1)?, out_buf),
            (Op::KvcacheStore { .. }, NodeMeta::Kvcache(meta)) => {
                if kv_pair.map(|p| p.0) != Some(out_buf.id) {
                    return Err(Self::err(node, "the store's output must be the layer's K region"));
                }
                self.kv_store(node, meta, in_bufs, kv_pair)
            }
            (Op::Attn { explicit_span, .. }, NodeMeta::Attn(m)) => {
                self.attention(node, m, *explicit_span, in_bufs, out_buf, kv_pair)
            }
            // Every op is named, none by a wildcard: a new op fails to compile here until it is
            // run or refused.
            (
                op @ (Op::RmsNorm { .. }
                | Op::QkNorm { .. }
                | Op::MatMul
                | Op::RoPE
                | Op::Attn { .. }
                | Op::KvcacheStore { .. }
                | Op::FusedQKV { .. }
                | Op::FusedQkvNorm { .. }
                | Op::FusedFFN),
                _,
            ) => Err(BackendError::Unsupported {
                backend: "wgpu".into(),
                node: node.name.clone(),
                op: op.name(),
            }),
        }
    }

    fn buffer_info(&self, id: usize) -> Option<(usize, DType)> {
        self.slots.get(id).map(|s| (s.bytes, s.dtype))
    }

    fn read_buffer(&mut self, id: usize, offset: usize, dst: &mut [u8]) -> Result<(), BackendError> {
        let bytes = self.slot(id)?.bytes;
        crate::graph::backend::buffer_window("wgpu", id, bytes, offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let start = offset as u64 / ALIGN * ALIGN;
        let end = (offset + dst.len()) as u64;
        let words = self.read_words(id, start, end.div_ceil(ALIGN) * ALIGN)?;
        let skip = (offset as u64 - start) as usize;
        dst.copy_from_slice(&words[skip..skip + dst.len()]);
        Ok(())
    }

    fn write_buffer(&mut self, id: usize, offset: usize, src: &[u8]) -> Result<(), BackendError> {
        let bytes = self.slot(id)?.bytes;
        crate::graph::backend::buffer_window("wgpu", id, bytes, offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let buffer = Arc::clone(&self.slot(id)?.buffer);
        let (start, end) = (
            offset as u64 / ALIGN * ALIGN,
            ((offset + src.len()) as u64).div_ceil(ALIGN) * ALIGN,
        );
        if start == offset as u64 && end == (offset + src.len()) as u64 {
            self.shared.queue.write_buffer(&buffer, start, src);
            return Ok(());
        }
        // A write that does not cover whole words keeps the bytes around it.
        let mut words = self.read_words(id, start, end)?;
        let skip = (offset as u64 - start) as usize;
        words[skip..skip + src.len()].copy_from_slice(src);
        self.shared.queue.write_buffer(&buffer, start, &words);
        Ok(())
    }

    fn synchronize(&mut self) -> Result<(), BackendError> {
        self.wait("(end of the split)")
    }

    fn wait_for_node(&mut self) -> Result<(), BackendError> {
        self.wait("(a timed node)")
    }
}
