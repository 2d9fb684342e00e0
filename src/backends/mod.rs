//! Compute backends: each executes graph nodes on one kind of device.
//!
//! A backend is a device made once per process ([`BackendSet`], shared by every session) and one
//! execution context per session (its buffer pool). It knows the graph IR but no model. The CPU
//! backend is the reference every other backend is compared against; the CUDA backend (feature
//! `cuda`, on by default) loads its driver at run time, so every build starts on a machine
//! without one.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "wgpu")]
pub mod wgpu;

pub use cpu::default_threads;

use crate::graph::registry::Unusable;
use crate::graph::{Backend, BackendDevice, BackendError, ComputeBackend, TensorSource, WeightUse};
use std::sync::Arc;

/// The host's memory as Linux's `/proc/meminfo` reports it under `field` (`MemTotal`,
/// `MemAvailable`), in bytes; `None` where it cannot be read.
pub fn host_memory(field: &str) -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|rest| rest.starts_with(':')))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Whether backend `handle`, which this build contains, can run on this machine: the registry's
/// probe ([`crate::graph::registry::resolve_fence`]).
pub fn probe(handle: Backend) -> Result<(), Unusable> {
    match handle {
        Backend::CPU => Ok(()),
        #[cfg(feature = "cuda")]
        Backend::CUDA => cuda::probe(),
        #[cfg(feature = "wgpu")]
        Backend::WGPU => wgpu::probe(),
        other => Err(Unusable::NoDriver {
            looked_for: format!("the {other} backend, which this build does not contain"),
        }),
    }
}

/// What backend `handle` would run on here, for `minfer info`: the CPU's instruction set, a
/// GPU backend's device (a wgpu adapter's name, API, driver and kernel layout), or why it
/// cannot run.
pub fn describe(handle: Backend) -> String {
    match handle {
        Backend::CPU => {
            let amx = if crate::quant::simd::amx() { " + amx" } else { "" };
            format!(
                "{}{amx}, {} threads by default",
                crate::quant::simd::simd_level(),
                default_threads()
            )
        }
        #[cfg(feature = "wgpu")]
        Backend::WGPU => wgpu::describe(),
        other => match probe(other) {
            Ok(()) => "usable".into(),
            Err(why) => format!("unusable: {why}"),
        },
    }
}

/// The process's backends, in priority order: made once from the fence and the weights, then
/// shared (clone it: the devices are reference-counted) by every session over the model.
#[derive(Clone)]
pub struct BackendSet {
    devices: Vec<Arc<dyn BackendDevice>>,
    n_gpu_layers: Option<usize>,
}

/// A [`BackendSet`]'s devices before their weights are prepared.
pub struct UnpreparedSet {
    devices: Vec<Box<dyn BackendDevice>>,
    weights: Arc<dyn TensorSource>,
}

impl UnpreparedSet {
    /// The free memory of the first device that has memory of its own (a GPU's).
    pub fn free_memory(&self) -> Option<usize> {
        self.devices.iter().find_map(|d| d.free_memory())
    }

    /// Each device prepares the weights `uses_of` gives it; sessions offload `n_gpu_layers`.
    pub fn prepare(
        mut self,
        uses_of: &dyn Fn(Backend) -> Vec<WeightUse>,
        n_gpu_layers: Option<usize>,
    ) -> Result<BackendSet, BackendError> {
        for device in &mut self.devices {
            let uses = uses_of(device.handle());
            device.prepare_weights(self.weights.as_ref(), &uses)?;
        }
        Ok(BackendSet {
            devices: self.devices.into_iter().map(Arc::from).collect(),
            n_gpu_layers,
        })
    }
}

impl BackendSet {
    /// The devices of `fence` (in its order), resolving weights through `weights`, each having
    /// prepared the weights `weight_uses` names (the model's) once for the process; CPU work
    /// runs on `n_threads` threads (`None`: one per physical core).
    pub fn create(
        fence: &[Backend],
        weights: Arc<dyn TensorSource>,
        weight_uses: &[WeightUse],
        n_threads: Option<usize>,
    ) -> Result<Self, BackendError> {
        Self::create_split(fence, weights, &|_| weight_uses.to_vec(), n_threads, None)
    }

    /// [`BackendSet::create`] where each device prepares only the weights `uses_of` gives it
    /// (those of the nodes it will run: with a partial offload the CPU keeps the early layers
    /// and a device takes the rest), and sessions offload `n_gpu_layers` layers (`-ngl`).
    pub fn create_split(
        fence: &[Backend],
        weights: Arc<dyn TensorSource>,
        uses_of: &dyn Fn(Backend) -> Vec<WeightUse>,
        n_threads: Option<usize>,
        n_gpu_layers: Option<usize>,
    ) -> Result<Self, BackendError> {
        Self::open(fence, weights, n_threads)?.prepare(uses_of, n_gpu_layers)
    }

    /// The devices of `fence`, made but not yet given their weights: what a caller asks (free
    /// memory) before deciding what each prepares ([`UnpreparedSet::prepare`]).
    pub fn open(
        fence: &[Backend],
        weights: Arc<dyn TensorSource>,
        n_threads: Option<usize>,
    ) -> Result<UnpreparedSet, BackendError> {
        let n_threads = n_threads.unwrap_or_else(cpu::default_threads).max(1);
        let mut devices: Vec<Box<dyn BackendDevice>> = Vec::new();
        for &handle in fence {
            devices.push(match handle {
                Backend::CPU => Box::new(cpu::CpuDevice::new(Arc::clone(&weights), n_threads)),
                #[cfg(feature = "cuda")]
                Backend::CUDA => Box::new(cuda::CudaDevice::new()?),
                #[cfg(feature = "wgpu")]
                Backend::WGPU => Box::new(wgpu::WgpuDevice::new()?),
                // Backends this build does not contain never pass the registry's fence.
                _ => continue,
            });
        }
        Ok(UnpreparedSet { devices, weights })
    }

    /// The layers a device runs in every session (`-ngl`), `None` for all.
    pub fn n_gpu_layers(&self) -> Option<usize> {
        self.n_gpu_layers
    }

    /// The devices, in priority order.
    pub fn devices(&self) -> &[Arc<dyn BackendDevice>] {
        &self.devices
    }

    /// The backends taking part, in priority order.
    pub fn handles(&self) -> Vec<Backend> {
        self.devices.iter().map(|d| d.handle()).collect()
    }

    /// The host threads the CPU work runs on (the largest of the devices' counts).
    pub fn n_threads(&self) -> usize {
        self.devices.iter().map(|d| d.n_threads()).max().unwrap_or(1)
    }

    /// Bytes the devices prepared from the weights and hold themselves.
    pub fn weights_bytes(&self) -> usize {
        self.devices.iter().map(|d| d.weights_bytes()).sum()
    }

    /// One execution context per device, for a new session.
    pub fn new_contexts(&self) -> Vec<Box<dyn ComputeBackend>> {
        self.devices.iter().map(|d| d.new_context()).collect()
    }
}
