//! One session's execution context on a wgpu device: its buffers in device memory, addressed by
//! id, and the recording of each node's kernel. The nodes of a split are recorded into one
//! command encoder and submitted when the scheduler synchronizes or the host reads or writes a
//! buffer (a queue write lands before the next submission, so recorded work is submitted
//! first), and every [`SUBMIT_EVERY`] dispatches, so that each submission's wait is bounded
//! however long the split (a long prompt on a slow device). Each dispatch's bind group and parameters are made the first time its
//! buffers and parameters occur and reused after, so a decode step creates no device object
//! after the first. The host reads and writes buffers only by copy, and every wait is bounded
//! per submission (`Shared::wait_timeout`).
//!
//! Owns the buffer pool, the bind groups and the recording; must not know a model.

use super::pipelines::WEIGHT_TYPES;
use super::{count_object, Shared, Weight};
use crate::graph::{Backend, BackendError, BufRef, CNode, ComputeBackend, DType, FusedOp, NodeMeta, Op};
use std::collections::HashMap;
use std::sync::Arc;
use wgpu::util::DeviceExt;

/// Storage bindings and copies move whole 4-byte words.
const ALIGN: u64 = wgpu::COPY_BUFFER_ALIGNMENT;
/// Invocations per workgroup of the element-wise and norm kernels (their WGSL says the same).
const WORKGROUP: u32 = 256;
/// The most workgroups one dimension of a dispatch takes (WebGPU's default limit).
const MAX_GROUPS: u32 = 65_535;
/// Rows of one workgroup of `weights.wgsl`'s `mul_mat`.
const MV_ROWS: u32 = 8;
/// Rows and tokens of one tile of `weights.wgsl`'s `mul_mm`.
const MM_TILE: usize = 64;
/// From this many tokens a product runs tiled (`mul_mm`); below, each token's row is a
/// matrix-vector product, which reads the weight once per token but wastes no tile.
pub(crate) const MM_MIN_TOKENS: usize = 8;
/// The most bindings of any kernel, the uniform included (attention's eight).
const MAX_BINDINGS: usize = 8;
/// The most parameter words of any kernel's `Params` (attention's 13, rounded up to 64 bytes: a
/// multiple of 16).
const PARAM_WORDS: usize = 16;
/// Dispatches recorded before a submission (llama.cpp's Vulkan backend submits every 100 nodes
/// too): a decode step of a small model is a few submissions, and no submission is long.
const SUBMIT_EVERY: usize = 100;
/// Bind groups kept per context; past this the cache starts over (prompt lengths each make
/// their own, decode steps reuse one set).
const MAX_BIND_GROUPS: usize = 4096;

/// A device buffer holding `bytes` (rounded up to whole words, at least one).
pub(crate) fn storage(device: &wgpu::Device, label: &str, bytes: u64) -> wgpu::Buffer {
    count_object();
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes.div_ceil(ALIGN).max(1) * ALIGN,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

/// Write `data` at `offset` (a multiple of 4), padding a ragged end with zeros.
pub(crate) fn write_words(queue: &wgpu::Queue, buffer: &wgpu::Buffer, offset: u64, data: &[u8]) {
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

/// A buffer's identity while the context lives (pool buffers and weights are never dropped).
fn address<T>(x: &T) -> usize {
    x as *const T as usize
}

/// What makes a bind group: the kernel, the buffers bound in order, and the parameters.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct BindKey {
    pipeline: usize,
    buffers: [usize; MAX_BINDINGS],
    params: [u32; PARAM_WORDS],
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
    /// The split being recorded, submitted by [`Self::flush`], and its dispatches so far.
    pending: Option<wgpu::CommandEncoder>,
    recorded: usize,
    /// What was submitted and not yet waited for, oldest first.
    submitted: std::collections::VecDeque<wgpu::SubmissionIndex>,
    bind_groups: HashMap<BindKey, wgpu::BindGroup>,
    /// A copy of each buffer some dispatch reads and writes at once (WebGPU binds a buffer for
    /// one or the other), by the buffer's address.
    aliases: HashMap<usize, wgpu::Buffer>,
    /// The host-mappable buffer reads come through, grown to the largest read.
    staging: Option<wgpu::Buffer>,
}

impl WgpuBackend {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        WgpuBackend {
            shared,
            slots: Vec::new(),
            pending: None,
            recorded: 0,
            submitted: std::collections::VecDeque::new(),
            bind_groups: HashMap::new(),
            aliases: HashMap::new(),
            staging: None,
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

    /// Submit what was recorded, if anything; the device's refusal of it is an error naming
    /// `what`.
    fn flush(&mut self, what: &str) -> Result<(), BackendError> {
        let Some(encoder) = self.pending.take() else {
            return Ok(());
        };
        self.recorded = 0;
        let scope = self.shared.device.push_error_scope(wgpu::ErrorFilter::Validation);
        self.submitted.push_back(self.shared.queue.submit([encoder.finish()]));
        match pollster::block_on(scope.pop()) {
            Some(e) => Err(BackendError::Node {
                backend: "wgpu".into(),
                node: what.into(),
                message: format!("the device refused the recorded work: {e}"),
            }),
            None => Ok(()),
        }
    }

    /// Submit what was recorded and wait for every submission in turn, each for at most the
    /// adapter's wait timeout.
    fn wait(&mut self, what: &str) -> Result<(), BackendError> {
        self.flush(what)?;
        while let Some(index) = self.submitted.pop_front() {
            let waited = self.shared.device.poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: Some(self.shared.wait_timeout),
            });
            if let Err(e) = waited {
                self.submitted.clear();
                return Err(BackendError::Node {
                    backend: "wgpu".into(),
                    node: what.into(),
                    message: format!("waiting for the device: {e}"),
                });
            }
        }
        Ok(())
    }

    /// Bytes `start..end` (whole words) of buffer `id`, copied to the host.
    fn read_words(&mut self, id: usize, start: u64, end: u64) -> Result<Vec<u8>, BackendError> {
        let len = end - start;
        self.flush(&format!("(before reading buffer {id})"))?;
        let device = &self.shared.device;
        if self.staging.as_ref().is_none_or(|s| s.size() < len) {
            count_object();
            self.staging = Some(device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: len,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
        }
        let staging = self.staging.as_ref().expect("made above");
        let mut encoder = device.create_command_encoder(&Default::default());
        encoder.copy_buffer_to_buffer(&self.slot(id)?.buffer, start, staging, 0, len);
        self.submitted.push_back(self.shared.queue.submit([encoder.finish()]));
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, ..len, move |r| {
            let _ = tx.send(r);
        });
        let staging = staging.clone();
        self.wait(&format!("(reading buffer {id})"))?;
        rx.recv_timeout(self.shared.wait_timeout)
            .map_err(|_| Self::buffer_error(id, "the device never mapped its copy"))?
            .map_err(|e| Self::buffer_error(id, format!("mapping its copy: {e}")))?;
        let bytes = staging
            .get_mapped_range(..len)
            .map_err(|e| Self::buffer_error(id, format!("mapping its copy: {e}")))?
            .to_vec();
        staging.unmap();
        Ok(bytes)
    }

    /// Record `pipeline` over `groups` workgroups with `inputs`, then `outputs`, then a uniform
    /// holding `params`, bound in that order (binding i is the i-th). An input that is also an
    /// output is read from a copy made first, since one dispatch may not bind a buffer both for
    /// reading and writing.
    fn dispatch(
        &mut self,
        node: &CNode,
        pipeline: &wgpu::ComputePipeline,
        inputs: &[&wgpu::Buffer],
        outputs: &[&wgpu::Buffer],
        params: &[u32],
        groups: (u32, u32, u32),
    ) -> Result<(), BackendError> {
        let mut key = BindKey {
            pipeline: address(pipeline),
            buffers: [0; MAX_BINDINGS],
            params: [0; PARAM_WORDS],
        };
        for (i, b) in inputs.iter().chain(outputs).enumerate() {
            key.buffers[i] = address(*b);
        }
        key.params[..params.len()].copy_from_slice(params);
        let device = &self.shared.device;
        let encoder = self
            .pending
            .get_or_insert_with(|| device.create_command_encoder(&Default::default()));
        for input in inputs.iter().filter(|b| outputs.contains(b)) {
            let copy = self
                .aliases
                .entry(address(*input))
                .or_insert_with(|| storage(device, "alias", input.size()));
            encoder.copy_buffer_to_buffer(input, 0, copy, 0, input.size());
        }
        if !self.bind_groups.contains_key(&key) {
            let bind_group = Self::bind_group(device, &self.aliases, node, pipeline, inputs, outputs, &key.params)?;
            if self.bind_groups.len() >= MAX_BIND_GROUPS {
                self.bind_groups.clear();
            }
            self.bind_groups.insert(key, bind_group);
        }
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &self.bind_groups[&key], &[]);
        pass.dispatch_workgroups(groups.0, groups.1, groups.2);
        drop(pass);
        self.recorded += 1;
        if self.recorded >= SUBMIT_EVERY {
            self.flush(&node.name)?;
        }
        Ok(())
    }

    fn bind_group(
        device: &wgpu::Device,
        aliases: &HashMap<usize, wgpu::Buffer>,
        node: &CNode,
        pipeline: &wgpu::ComputePipeline,
        inputs: &[&wgpu::Buffer],
        outputs: &[&wgpu::Buffer],
        params: &[u32; PARAM_WORDS],
    ) -> Result<wgpu::BindGroup, BackendError> {
        count_object();
        let uniform = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("params"),
            contents: bytemuck::cast_slice(params),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let bound = inputs
            .iter()
            .map(|b| match outputs.contains(b) {
                true => &aliases[&address(*b)],
                false => *b,
            })
            .chain(outputs.iter().copied())
            .chain([&uniform]);
        let entries: Vec<wgpu::BindGroupEntry<'_>> = bound
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        count_object();
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&node.name),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        match pollster::block_on(scope.pop()) {
            Some(e) => Err(Self::err(node, format!("the device refused the bindings: {e}"))),
            None => Ok(bind_group),
        }
    }

    fn buffer(&self, node: &CNode, buf: BufRef) -> Result<Arc<wgpu::Buffer>, BackendError> {
        self.slots
            .get(buf.id)
            .map(|s| Arc::clone(&s.buffer))
            .ok_or_else(|| Self::err(node, format!("buffer {} does not exist", buf.id)))
    }

    /// The uploaded weight `name`, in its file's layout.
    fn weight<'a>(shared: &'a Shared, node: &CNode, name: &str) -> Result<&'a Weight, BackendError> {
        shared.weights.get(name).ok_or_else(|| BackendError::MissingWeight {
            backend: "wgpu".into(),
            node: node.name.clone(),
            weight: name.into(),
        })
    }

    /// The one buffer of a small weight (a norm's, a bias), which is never split.
    fn whole(&self, node: &CNode, name: &str) -> Result<Arc<wgpu::Buffer>, BackendError> {
        match Self::weight(&self.shared, node, name)?.parts.as_slice() {
            [part] => Ok(Arc::clone(&part.buffer)),
            parts => Err(Self::err(
                node,
                format!("weight {name} is in {} parts where one was expected", parts.len()),
            )),
        }
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

    /// The kernels of weight type `ty`, or the refusal naming it.
    fn weight_kernels<'a>(
        node: &CNode,
        shared: &'a Shared,
        ty: crate::quant::GgmlType,
    ) -> Result<&'a super::pipelines::WeightKernels, BackendError> {
        shared
            .pipelines
            .weights(&shared.device, ty)
            .ok_or_else(|| Self::err(node, format!("weights of type {ty} are not read here")))
    }

    fn mul_mat(
        &mut self,
        node: &CNode,
        m: &crate::graph::MatMulMeta,
        x: BufRef,
        out: BufRef,
    ) -> Result<(), BackendError> {
        let shared = Arc::clone(&self.shared);
        let (ty, row_bytes) = Self::weight_layout(node, m.weight_type, m.in_dim)?;
        let kernels = Self::weight_kernels(node, &shared, m.weight_type)?;
        let nt = node.out_shape[1];
        let w = &Self::weight(&shared, node, &m.weight_name)?.parts;
        let x = self.buffer(node, x)?;
        let bias = match &m.bias_name {
            Some(name) => self.whole(node, name)?,
            None => Arc::clone(&x),
        };
        let out = self.buffer(node, out)?;
        let layout = shared.layout;
        for part in w {
            let words = [
                ty,
                row_bytes,
                m.in_dim as u32,
                m.out_dim as u32,
                nt as u32,
                u32::from(m.bias_name.is_some()),
                part.row0 as u32,
                part.rows as u32,
            ];
            let (pipeline, groups) = match layout {
                super::MatMulLayout::Rows => {
                    let (gx, gy) = Self::grid(node, part.rows, 64)?;
                    let kernel = if nt == 1 {
                        &kernels.mul_mat_rows
                    } else {
                        &kernels.mul_mat_rows8
                    };
                    (kernel, (gx, gy, 1))
                }
                _ if nt >= MM_MIN_TOKENS => {
                    let (rows, tokens) = (part.rows.div_ceil(MM_TILE), nt.div_ceil(MM_TILE));
                    let gx = u32::try_from(rows).ok().filter(|&g| g <= MAX_GROUPS);
                    let gy = u32::try_from(tokens).ok().filter(|&g| g <= MAX_GROUPS);
                    let (Some(gx), Some(gy)) = (gx, gy) else {
                        return Err(Self::err(
                            node,
                            format!("{} rows by {nt} tokens in one dispatch", part.rows),
                        ));
                    };
                    (&kernels.mul_mm, (gx, gy, 1))
                }
                _ => {
                    let (gx, gy) = Self::grid(node, part.rows, MV_ROWS)?;
                    (&kernels.mul_mat, (gx, gy, Self::rows_grid(node, nt)?))
                }
            };
            self.dispatch(node, pipeline, &[&part.buffer, &x, &bias], &[&out], &words, groups)?;
        }
        Ok(())
    }

    fn embed(
        &mut self,
        node: &CNode,
        m: &crate::graph::EmbedMeta,
        ids: BufRef,
        out: BufRef,
    ) -> Result<(), BackendError> {
        let shared = Arc::clone(&self.shared);
        let (ty, row_bytes) = Self::weight_layout(node, m.weight_type, m.n_embd)?;
        let kernels = Self::weight_kernels(node, &shared, m.weight_type)?;
        let nt = node.out_shape[1];
        let table = &Self::weight(&shared, node, &m.weight_name)?.parts;
        let ids = self.buffer(node, ids)?;
        let out = self.buffer(node, out)?;
        let gx = Self::rows_grid(node, nt)?;
        for part in table {
            let words = [
                ty,
                row_bytes,
                m.n_embd as u32,
                m.n_rows as u32,
                nt as u32,
                0,
                part.row0 as u32,
                part.rows as u32,
            ];
            self.dispatch(
                node,
                &kernels.get_rows,
                &[&part.buffer, &ids, &ids],
                &[&out],
                &words,
                (gx, 1, 1),
            )?;
        }
        Ok(())
    }

    fn gather_rows_node(&mut self, node: &CNode, src: BufRef, ids: BufRef, out: BufRef) -> Result<(), BackendError> {
        let [d, n_ids, ..] = node.out_shape;
        let n_rows_in = self.slot(src.id)?.bytes / 4 / d.max(1);
        let params = &[d as u32, n_rows_in as u32, n_ids as u32, 0];
        let gx = Self::rows_grid(node, n_ids)?;
        let (src, ids, out) = (
            self.buffer(node, src)?,
            self.buffer(node, ids)?,
            self.buffer(node, out)?,
        );
        let shared = Arc::clone(&self.shared);
        self.dispatch(node, &shared.pipelines.rows, &[&src, &ids], &[&out], params, (gx, 1, 1))
    }

    fn rope(
        &mut self,
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
        let theta_scale = m.theta_scale();
        let neox = u32::from(m.style == crate::graph::RopeStyle::Neox);
        let words = [
            m.n_head as u32,
            m.head_dim as u32,
            m.n_rot as u32,
            theta_scale.to_bits(),
            neox,
            nt as u32,
            m.freq_scale.to_bits(),
            u32::from(m.freq_factors.is_some()),
            m.attn_factor.to_bits(),
            0,
            0,
            0,
        ];
        let params = &words;
        let gx = Self::rows_grid(node, nt)?;
        let (x, positions, out) = (
            self.buffer(node, x)?,
            self.buffer(node, positions)?,
            self.buffer(node, out)?,
        );
        // Without factors the shader reads none: the positions stand in for the binding.
        let factors = match &m.freq_factors {
            Some(name) => self.whole(node, name)?,
            None => Arc::clone(&positions),
        };
        let shared = Arc::clone(&self.shared);
        self.dispatch(
            node,
            &shared.pipelines.rope,
            &[&x, &positions, &factors],
            &[&out],
            params,
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
        &mut self,
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
        let params = &words;
        let (k, v, cells) = (
            self.buffer(node, *k)?,
            self.buffer(node, *v)?,
            self.buffer(node, *cells)?,
        );
        let gx = Self::rows_grid(node, nt)?;
        let shared = Arc::clone(&self.shared);
        self.dispatch(
            node,
            &shared.pipelines.kv_store,
            &[&k, &v, &cells],
            &[&k_region, &v_region],
            params,
            (gx, 2, 1),
        )
    }

    fn attention(
        &mut self,
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
            m.kq_scale.to_bits(),
            u32::try_from(m.n_swa.unwrap_or(0)).unwrap_or(u32::MAX),
            m.softcap.unwrap_or(0.0).to_bits(),
        ];
        let params = &words;
        let out = self.buffer(node, out)?;
        let gy = Self::rows_grid(node, nt)?;
        let shared = Arc::clone(&self.shared);
        self.dispatch(
            node,
            &shared.pipelines.attention,
            &[&q, &k_region, &v_region, &positions, &index, &spans],
            &[&out],
            params,
            (m.n_head as u32, gy, 1),
        )
    }

    fn rms_norm(
        &mut self,
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
            Some(name) => self.whole(node, name)?,
            None => Arc::clone(&x),
        };
        let params = &[d as u32, rows as u32, eps.to_bits(), u32::from(weight.is_some())];
        let (gx, gy) = Self::grid(node, rows, 1)?;
        let out = self.buffer(node, out)?;
        let shared = Arc::clone(&self.shared);
        self.dispatch(
            node,
            &shared.pipelines.rms_norm,
            &[&x, &w],
            &[&out],
            params,
            (gx, gy, 1),
        )
    }
}

impl ComputeBackend for WgpuBackend {
    fn supports_weight(&self, ty: crate::quant::GgmlType) -> bool {
        super::pipelines::WEIGHT_TYPES.contains(&ty)
    }

    fn handle(&self) -> Backend {
        Backend::WGPU
    }

    fn name(&self) -> &str {
        "wgpu"
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
        match op {
            // No sinks in this attention yet (gpt-oss): declined, so the node is refused by name
            // or runs on the CPU beside the device.
            Op::Attn { sinks: true, .. } => false,
            Op::Input => true,
            Op::Add
            | Op::Mul
            | Op::Silu
            | Op::Gelu
            | Op::Scale { .. }
            | Op::Softcap { .. }
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
            // Mixture-of-experts routing and expert products have no shaders yet: a graph with
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
            (Op::Add | Op::Mul | Op::Silu | Op::SwiGLU | Op::Scale { .. } | Op::Gelu | Op::Softcap { .. }, _) => {
                let n: usize = node.out_shape.iter().product();
                let (code, scale) = match node.op {
                    Op::Add => (0, 0.0),
                    Op::Mul => (1, 0.0),
                    Op::Silu => (2, 0.0),
                    Op::Scale { scale } => (4, scale),
                    Op::Gelu => (5, 0.0),
                    Op::Softcap { cap } => (6, cap),
                    _ => (3, 0.0),
                };
                let a = self.buffer(node, input(0)?)?;
                let b = if code == 2 || code >= 4 {
                    Arc::clone(&a)
                } else {
                    self.buffer(node, input(1)?)?
                };
                let (gx, gy) = Self::grid(node, n, WORKGROUP)?;
                let params = &[n as u32, code, gx * WORKGROUP, f32::to_bits(scale)];
                let out = self.buffer(node, out_buf)?;
                let shared = Arc::clone(&self.shared);
                self.dispatch(
                    node,
                    &shared.pipelines.elementwise,
                    &[&a, &b],
                    &[&out],
                    params,
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
        // The write lands before the next submission: what is recorded goes first.
        self.flush(&format!("(before writing buffer {id})"))?;
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
