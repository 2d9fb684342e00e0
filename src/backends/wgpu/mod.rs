//! The wgpu backend: one set of WGSL compute kernels for every GPU vendor — Vulkan on Linux and
//! Android, Metal on macOS and iOS, DX12 on Windows — behind the same device seam as the CPU.
//! The device (made once per process) holds the adapter, the wgpu device and queue, the
//! compiled pipelines and the weights uploaded once; each session's context (`context.rs`)
//! holds its buffers in device memory.
//!
//! The GPU API is opened at run time, so a build with this backend starts on a machine without
//! one; [`probe`] says what is missing. A software adapter (Mesa's lavapipe or llvmpipe: the CPU
//! behind a Vulkan driver) is used only when a fence names `wgpu`, never joined to a default
//! fence. Must not fall back to the CPU: a node it cannot run is refused by name.
//!
//! Every op the unfused graphs build runs here (the fused decode nodes are declined, so a session
//! on wgpu builds the unfused chains). The weight products come in two layouts
//! ([`MatMulLayout`]): a GPU's (workgroup reductions; tiles through workgroup memory for
//! prompts) and a CPU's lanes (a software driver: one invocation per row), the adapter's kind
//! choosing (docs/backends.md).

mod context;
mod pipelines;

pub use context::WgpuBackend;
pub use pipelines::WEIGHT_TYPES;

use crate::graph::registry::Unusable;
use crate::graph::{Backend, BackendDevice, BackendError, ComputeBackend, TensorSource, WeightUse};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How long one submission may take to finish before waiting for it is an error naming what
/// waited, never a hang: a lost device or a runaway kernel.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(60);
/// The same on a software adapter, the CPU behind a driver, where a long prompt's submission
/// takes tens of seconds.
pub const SOFTWARE_WAIT_TIMEOUT: Duration = Duration::from_secs(600);

thread_local! {
    /// Device objects (buffers, bind groups) the wgpu backend made on this thread.
    static OBJECTS: Cell<usize> = const { Cell::new(0) };
}

fn count_object() {
    OBJECTS.with(|n| n.set(n.get() + 1));
}

/// How many device objects (buffers, bind groups) the wgpu backend has made on the calling
/// thread (a session runs its steps on its caller's): what a test counts to show that decode
/// steps after the first make none.
pub fn device_objects_made() -> usize {
    OBJECTS.with(Cell::get)
}

/// How the weight products are laid out over the device's invocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatMulLayout {
    /// A GPU's: a workgroup reduces each row for a token (`mul_mat`), and prompts are tiled
    /// through workgroup memory (`mul_mm`).
    Workgroups,
    /// A CPU's (a software driver, whose invocations are SIMD lanes): one invocation per row,
    /// all reading the same activations (`mul_mat_rows`).
    Rows,
}

impl MatMulLayout {
    fn name(self) -> &'static str {
        match self {
            MatMulLayout::Workgroups => "workgroups",
            MatMulLayout::Rows => "rows",
        }
    }
}

/// The environment variable that chooses the products' layout (`workgroups` or `rows`) over
/// the adapter's default (`rows` on a software adapter, `workgroups` on a GPU).
pub const MATMUL_ENV: &str = "MINFER_WGPU_MATMUL";

/// The environment variable that caps the bytes of one storage binding below the adapter's
/// own limit, so that splitting a large weight across bindings is exercised on small models.
pub const MAX_BINDING_ENV: &str = "MINFER_WGPU_MAX_BINDING";

/// The adapters of the platform's primary APIs (Vulkan, Metal, DX12).
fn adapters() -> (wgpu::Instance, Vec<wgpu::Adapter>) {
    let mut descriptor = wgpu::InstanceDescriptor {
        backends: wgpu::Backends::PRIMARY,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    };
    // A buffer past the driver's memory budget is refused at creation (where the driver
    // reports a budget), not left to fail later or lose the device.
    descriptor.memory_budget_thresholds.for_resource_creation = Some(95);
    let instance = wgpu::Instance::new(descriptor);
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY));
    (instance, adapters)
}

/// Whether an adapter is the CPU behind a software driver.
fn is_software(info: &wgpu::AdapterInfo) -> bool {
    info.device_type == wgpu::DeviceType::Cpu
}

/// The adapter the backend uses: a discrete GPU, else an integrated one, else any hardware one,
/// else a software one.
fn choose(adapters: Vec<wgpu::Adapter>) -> Option<wgpu::Adapter> {
    let rank = |a: &wgpu::Adapter| match a.get_info().device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu | wgpu::DeviceType::Other => 2,
        wgpu::DeviceType::Cpu => 3,
    };
    adapters.into_iter().min_by_key(rank)
}

/// Whether this machine can run the wgpu backend: some adapter of Vulkan, Metal or DX12.
/// [`Unusable::SoftwareOnly`] when the only one is a software device. Asked once per process
/// (opening the GPU APIs to list their adapters is not free, and they do not change).
pub fn probe() -> Result<(), Unusable> {
    static PROBED: std::sync::OnceLock<Result<(), Unusable>> = std::sync::OnceLock::new();
    PROBED
        .get_or_init(|| {
            let (_, adapters) = adapters();
            match choose(adapters) {
                None => Err(Unusable::NoDevice {
                    detail: "no Vulkan, Metal or DX12 adapter (is a GPU driver, or Mesa's lavapipe, installed?)".into(),
                }),
                Some(a) if is_software(&a.get_info()) => Err(Unusable::SoftwareOnly {
                    adapter: a.get_info().name,
                }),
                Some(_) => Ok(()),
            }
        })
        .clone()
}

/// The adapter the backend would open, for `minfer info`: its name, API, driver and kernel
/// layout, and whether only a named fence uses it; or why there is none. Opens no device.
pub fn describe() -> String {
    let (_, adapters) = adapters();
    let Some(adapter) = choose(adapters) else {
        return "unusable: no Vulkan, Metal or DX12 adapter".into();
    };
    let info = adapter.get_info();
    let layout = match default_layout(&info) {
        Ok(layout) => layout.name().to_string(),
        Err(e) => e.to_string(),
    };
    let software = if is_software(&info) {
        "; a software adapter: used only when --backend names wgpu"
    } else {
        ""
    };
    format!(
        "{} ({:?}, {} {}; matmul: {layout}{software})",
        info.name, info.backend, info.driver, info.driver_info
    )
}

/// The products' layout: [`MATMUL_ENV`]'s, else the adapter's kind's.
fn default_layout(info: &wgpu::AdapterInfo) -> Result<MatMulLayout, BackendError> {
    match std::env::var(MATMUL_ENV).as_deref() {
        Ok("rows") => Ok(MatMulLayout::Rows),
        Ok("workgroups") => Ok(MatMulLayout::Workgroups),
        Ok(other) => Err(device_error(format!(
            "{MATMUL_ENV}={other:?}: the layouts are \"workgroups\" and \"rows\""
        ))),
        Err(_) if is_software(info) => Ok(MatMulLayout::Rows),
        Err(_) => Ok(MatMulLayout::Workgroups),
    }
}

/// What is shared by every context of the process.
pub(crate) struct Shared {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) info: wgpu::AdapterInfo,
    pub(crate) pipelines: pipelines::Pipelines,
    pub(crate) layout: MatMulLayout,
    /// How long one submission may take ([`WAIT_TIMEOUT`], or [`SOFTWARE_WAIT_TIMEOUT`]).
    pub(crate) wait_timeout: Duration,
    /// Every weight prepared, by name: its bytes as the file stores them.
    pub(crate) weights: HashMap<String, Weight>,
}

/// A weight in device memory: whole rows in each part, as many parts as one binding's limit
/// asks (one for all but the largest tensors).
#[derive(Clone)]
pub(crate) struct Weight {
    pub(crate) parts: Vec<Part>,
}

/// Rows `row0 .. row0 + rows` of a weight, in one buffer.
#[derive(Clone)]
pub(crate) struct Part {
    pub(crate) buffer: Arc<wgpu::Buffer>,
    pub(crate) row0: usize,
    pub(crate) rows: usize,
}

/// A wgpu adapter, opened once per process; see the module documentation.
pub struct WgpuDevice {
    shared: Arc<Shared>,
    /// The most bytes one weight buffer holds: the adapter's binding limit, or less where
    /// [`MAX_BINDING_ENV`] or [`WgpuDevice::limit_binding`] asks.
    max_binding: u64,
    /// The most bytes of weights the device may hold ([`WgpuDevice::limit_memory`]); the
    /// driver's own refusal otherwise.
    max_memory: Option<u64>,
}

fn device_error(message: impl Into<String>) -> BackendError {
    BackendError::Measure {
        backend: "wgpu".into(),
        message: message.into(),
    }
}

impl WgpuDevice {
    /// Open the best adapter (a software one too: a fence named this backend) and its device,
    /// with the adapter's own limits, and compile the kernels.
    pub fn new() -> Result<Self, BackendError> {
        let (_instance, adapters) = adapters();
        let adapter = choose(adapters).ok_or_else(|| device_error("no Vulkan, Metal or DX12 adapter"))?;
        let info = adapter.get_info();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("minfer"),
            required_features: wgpu::Features::empty(),
            required_limits: adapter.limits(),
            ..Default::default()
        }))
        .map_err(|e| device_error(format!("opening {}: {e}", info.name)))?;
        let pipelines = pipelines::Pipelines::new(&device);
        let layout = default_layout(&info)?;
        let wait_timeout = if is_software(&info) {
            SOFTWARE_WAIT_TIMEOUT
        } else {
            WAIT_TIMEOUT
        };
        let limits = device.limits();
        let mut max_binding = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        if let Some(cap) = std::env::var(MAX_BINDING_ENV).ok().and_then(|v| v.parse::<u64>().ok()) {
            max_binding = max_binding.min(cap);
        }
        Ok(WgpuDevice {
            max_binding,
            max_memory: None,
            shared: Arc::new(Shared {
                device,
                queue,
                info,
                pipelines,
                layout,
                wait_timeout,
                weights: HashMap::new(),
            }),
        })
    }

    /// Hold at most `bytes` in one weight buffer (and so in one binding), splitting larger
    /// weights by rows: what the adapter's own limit does to the largest tensors, on small ones.
    pub fn limit_binding(&mut self, bytes: u64) {
        self.max_binding = self.max_binding.min(bytes);
    }

    /// Hold at most `bytes` of weights: a model needing more is refused before any upload, as
    /// one the driver cannot hold is.
    pub fn limit_memory(&mut self, bytes: u64) {
        self.max_memory = Some(bytes);
    }

    /// Lay the weight products out as `layout` asks, whatever the adapter's default.
    pub fn set_matmul_layout(&mut self, layout: MatMulLayout) -> Result<(), BackendError> {
        let shared =
            Arc::get_mut(&mut self.shared).ok_or_else(|| device_error("layout chosen after a context was made"))?;
        shared.layout = layout;
        Ok(())
    }

    /// The adapter as its driver reports it: name, API, driver, and the kernels' choices.
    pub fn adapter_line(&self) -> String {
        let i = &self.shared.info;
        format!(
            "{} ({:?}, {} {}; matmul: {})",
            i.name,
            i.backend,
            i.driver,
            i.driver_info,
            self.shared.layout.name()
        )
    }
}

impl BackendDevice for WgpuDevice {
    fn handle(&self) -> Backend {
        Backend::WGPU
    }

    fn name(&self) -> &str {
        "wgpu"
    }

    fn n_threads(&self) -> usize {
        1
    }

    fn device_name(&self) -> Option<String> {
        Some(self.adapter_line())
    }

    fn weights_bytes(&self) -> usize {
        let parts = self.shared.weights.values().flat_map(|w| &w.parts);
        parts.map(|p| p.buffer.size() as usize).sum()
    }

    fn prepare_weights(&mut self, source: &dyn TensorSource, weights: &[WeightUse]) -> Result<(), BackendError> {
        let shared =
            Arc::get_mut(&mut self.shared).ok_or_else(|| device_error("weights prepared after a context was made"))?;
        let max_binding = self.max_binding;
        let refuse = |name: &str, message: String| BackendError::Prepare {
            backend: "wgpu".into(),
            weight: name.into(),
            message,
        };
        // Sized first, then every buffer made, then written: a model that does not fit is
        // refused before any byte is uploaded.
        let mut planned = Vec::with_capacity(weights.len());
        let mut total = 0u64;
        for use_ in weights {
            let w = source.weight(&use_.name).ok_or_else(|| BackendError::MissingWeight {
                backend: "wgpu".into(),
                node: "(prepare)".into(),
                weight: use_.name.clone(),
            })?;
            let rows = w.shape.iter().skip(1).product::<u64>().max(1) as usize;
            let row_bytes = w.data.len() / rows;
            let per_part = (max_binding as usize / row_bytes.max(1)).min(rows);
            if per_part == 0 {
                return Err(refuse(
                    &use_.name,
                    format!(
                        "one row is {row_bytes} bytes, more than one binding of this adapter holds ({max_binding})"
                    ),
                ));
            }
            let parts: Vec<(usize, usize)> = (0..rows)
                .step_by(per_part)
                .map(|row0| (row0, per_part.min(rows - row0)))
                .collect();
            total += w.data.len() as u64;
            planned.push((use_.name.as_str(), w.data, row_bytes, parts));
        }
        let too_large = |why: String| {
            refuse(
                "(every weight)",
                format!(
                    "the {} weights need {total} bytes of device memory and {} {why}; \
                     give fewer layers to the GPU (-ngl) or use a smaller model",
                    weights.len(),
                    shared.info.name
                ),
            )
        };
        if let Some(limit) = self.max_memory.filter(|&limit| total > limit) {
            return Err(too_large(format!("may hold {limit}")));
        }
        let scope = shared.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let made: Vec<Vec<Part>> = planned
            .iter()
            .map(|(name, _, row_bytes, parts)| {
                let made = parts.iter().map(|&(row0, rows)| Part {
                    buffer: Arc::new(context::storage(&shared.device, name, (rows * row_bytes) as u64)),
                    row0,
                    rows,
                });
                made.collect()
            })
            .collect();
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(too_large(format!("refused the memory: {e}")));
        }
        for ((name, data, row_bytes, _), parts) in planned.into_iter().zip(made) {
            for part in &parts {
                let bytes = &data[part.row0 * row_bytes..(part.row0 + part.rows) * row_bytes];
                context::write_words(&shared.queue, &part.buffer, 0, bytes);
            }
            shared.weights.insert(name.to_string(), Weight { parts });
        }
        Ok(())
    }

    fn new_context(&self) -> Box<dyn ComputeBackend> {
        Box::new(WgpuBackend::new(Arc::clone(&self.shared)))
    }
}

#[cfg(test)]
mod tests {
    /// The module of `source`, validated as a Mac's and a Windows GPU's drivers would take it
    /// (no optional capability: the kernels ask for none yet).
    fn validated(name: &str, source: &str) -> (naga::Module, naga::valid::ModuleInfo) {
        let module =
            naga::front::wgsl::parse_str(source).unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(source)));
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::empty())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        (module, info)
    }

    #[test]
    fn every_kernel_translates_to_metal_shading_language_and_hlsl() {
        let sources = super::pipelines::kernel_names()
            .filter(|&name| name != "weights")
            .map(|name| (name.to_string(), super::pipelines::kernel_source(name)));
        let weights = super::pipelines::WEIGHT_TYPES.iter().flat_map(|&ty| {
            use super::pipelines::Tokens;
            [Tokens::One, Tokens::Eight].map(|tokens| {
                (
                    format!("weights {ty} {tokens:?}"),
                    super::pipelines::weight_source(ty, tokens),
                )
            })
        });
        for (name, source) in sources.chain(weights) {
            let name = name.as_str();
            let (module, info) = validated(name, &source);
            // Metal 2.4, what wgpu asks of an Apple Silicon Mac.
            let msl = naga::back::msl::Options {
                lang_version: (2, 4),
                ..Default::default()
            };
            let (metal, _) = naga::back::msl::write_string(&module, &info, &msl, &Default::default())
                .unwrap_or_else(|e| panic!("{name} to Metal: {e:?}"));
            assert!(metal.contains("kernel void"), "{name}: {metal}");
            // Shader model 6.0, DX12's with DXC.
            let hlsl = naga::back::hlsl::Options {
                shader_model: naga::back::hlsl::ShaderModel::V6_0,
                ..Default::default()
            };
            let pipeline = naga::back::hlsl::PipelineOptions { entry_point: None };
            let mut out = String::new();
            naga::back::hlsl::Writer::new(&mut out, &hlsl, &pipeline)
                .write(&module, &info, None)
                .unwrap_or_else(|e| panic!("{name} to HLSL: {e:?}"));
            assert!(out.contains("[numthreads("), "{name}: {out}");
        }
    }
}
