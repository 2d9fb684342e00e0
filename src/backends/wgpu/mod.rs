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
//! on wgpu builds the unfused chains); the backend stays behind the `wgpu` feature, off by
//! default, until it is measured, uploads tensors larger than one binding, and submits once per
//! split instead of once per node (docs/backends.md).

mod context;

pub use context::WgpuBackend;

use crate::graph::registry::Unusable;
use crate::graph::{Backend, BackendDevice, BackendError, ComputeBackend, TensorSource, WeightUse};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How long a wait for the device may take before it is an error naming what waited, never a
/// hang: a lost device or a runaway kernel.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(60);

/// The adapters of the platform's primary APIs (Vulkan, Metal, DX12).
fn adapters() -> (wgpu::Instance, Vec<wgpu::Adapter>) {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::PRIMARY,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
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
/// [`Unusable::SoftwareOnly`] when the only one is a software device.
pub fn probe() -> Result<(), Unusable> {
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
}

/// What is shared by every context of the process.
pub(crate) struct Shared {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) info: wgpu::AdapterInfo,
    pub(crate) pipelines: context::Pipelines,
    /// Every weight prepared, by name: its bytes as the file stores them.
    pub(crate) weights: HashMap<String, Arc<wgpu::Buffer>>,
}

/// A wgpu adapter, opened once per process; see the module documentation.
pub struct WgpuDevice {
    shared: Arc<Shared>,
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
        let pipelines = context::Pipelines::new(&device);
        Ok(WgpuDevice {
            shared: Arc::new(Shared {
                device,
                queue,
                info,
                pipelines,
                weights: HashMap::new(),
            }),
        })
    }

    /// The adapter as its driver reports it: name, API and driver.
    pub fn adapter_line(&self) -> String {
        let i = &self.shared.info;
        format!("{} ({:?}, {} {})", i.name, i.backend, i.driver, i.driver_info)
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
        self.shared.weights.values().map(|b| b.size() as usize).sum()
    }

    fn prepare_weights(&mut self, source: &dyn TensorSource, weights: &[WeightUse]) -> Result<(), BackendError> {
        let shared =
            Arc::get_mut(&mut self.shared).ok_or_else(|| device_error("weights prepared after a context was made"))?;
        let max = shared.device.limits().max_storage_buffer_binding_size as usize;
        for use_ in weights {
            let w = source.weight(&use_.name).ok_or_else(|| BackendError::MissingWeight {
                backend: "wgpu".into(),
                node: "(prepare)".into(),
                weight: use_.name.clone(),
            })?;
            if w.data.len() > max {
                return Err(BackendError::Prepare {
                    backend: "wgpu".into(),
                    weight: use_.name.clone(),
                    message: format!(
                        "{} bytes, more than one binding of this adapter holds ({max}); split bindings are not built yet",
                        w.data.len()
                    ),
                });
            }
            let buffer = context::upload(&shared.device, &shared.queue, &use_.name, w.data);
            shared.weights.insert(use_.name.clone(), Arc::new(buffer));
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
        for name in super::context::kernel_names() {
            let source = super::context::kernel_source(name);
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
