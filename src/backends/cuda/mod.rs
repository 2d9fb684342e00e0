//! The CUDA backend: an NVIDIA GPU behind the same device seam as the CPU. The device (made once
//! per process) holds the CUDA context, the kernels NVRTC compiled for its compute capability
//! and every weight uploaded once from the memory map; each session's context (`context.rs`)
//! holds its buffers and KV regions in device memory and its own stream.
//!
//! The driver is loaded at run time, so a build with this backend starts on a machine without
//! one; [`probe`] says which of the driver and a device is missing. Must not fall back to the
//! CPU: a node it cannot run is refused by name, a driver error is an error naming the node.

mod context;
pub mod nvrtc;

use crate::graph::registry::Unusable;
use crate::graph::{Backend, BackendDevice, BackendError, ComputeBackend, TensorSource, WeightUse};
use crate::quant::GgmlType;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream};
use std::collections::HashMap;
use std::sync::Arc;

pub use context::CudaBackend;

/// The library names the driver is looked for under (cudarc's list, dlopen's search path).
pub const DRIVER_LIBRARY: &str = "libcuda.so.1 (or libcuda.so)";

/// Whether this machine can run the CUDA backend: the driver loads and reports a device.
pub fn probe() -> Result<(), Unusable> {
    // SAFETY: only tries to open the library and drops the handle; no symbol is called unless
    // it opened, so a machine without a driver gets an error here instead of cudarc's panic.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Unusable::NoDriver {
            looked_for: DRIVER_LIBRARY.into(),
        });
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(()),
        Ok(_) => Err(Unusable::NoDevice {
            detail: "the driver reports 0 devices".into(),
        }),
        Err(e) => Err(Unusable::NoDevice {
            detail: format!("the driver reports {e}"),
        }),
    }
}

/// Device allocations made by every context of the process (buffers, KV regions, scratch):
/// what a test reads to show that decode steps allocate no device memory after the first.
static DEVICE_ALLOCATIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The number of device allocations the contexts have made so far.
pub fn device_allocations() -> usize {
    DEVICE_ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed)
}

fn count_device_allocation() {
    DEVICE_ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// The weight types the kernels read (matmul and embedding rows).
pub const WEIGHT_TYPES: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Every kernel the context launches, by its `extern "C"` name.
pub const KERNEL_NAMES: [&str; 8] = [
    "mul_mat",
    "get_rows_weight",
    "rms_norm",
    "rope",
    "elementwise",
    "get_rows_act",
    "kv_store",
    "attention",
];

/// A weight in device memory, in its file layout.
pub(crate) struct DeviceWeight {
    pub(crate) ggml_type: GgmlType,
    pub(crate) shape: Vec<u64>,
    pub(crate) data: CudaSlice<u8>,
}

/// The loaded kernels, by [`KERNEL_NAMES`] order.
pub(crate) struct Kernels {
    pub(crate) functions: HashMap<&'static str, CudaFunction>,
    // Kept alive for the functions.
    _modules: Vec<Arc<CudaModule>>,
}

/// What every context of the device shares: the CUDA context, the kernels and the weights.
pub(crate) struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) name: String,
    pub(crate) kernels: Kernels,
}

/// The CUDA device: made once per process, shared by every session.
pub struct CudaDevice {
    gpu: Arc<Gpu>,
    weights: Arc<HashMap<String, DeviceWeight>>,
    weights_bytes: usize,
}

fn prepare_error(weight: &str, message: impl std::fmt::Display) -> BackendError {
    BackendError::Prepare {
        backend: "cuda".into(),
        weight: weight.into(),
        message: message.to_string(),
    }
}

impl CudaDevice {
    /// Device 0: its context and its kernels, compiled with NVRTC for its compute capability
    /// (or read from the kernel cache). Errors name what failed.
    pub fn new() -> Result<Self, BackendError> {
        let startup = |message: String| prepare_error("(start-up)", message);
        probe().map_err(|e| startup(e.to_string()))?;
        let ctx = CudaContext::new(0).map_err(|e| startup(format!("creating the CUDA context: {e}")))?;
        let name = ctx.name().unwrap_or_else(|_| "CUDA device 0".into());
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| startup(format!("reading the compute capability: {e}")))?;
        let capability = u32::try_from(major * 10 + minor).unwrap_or(0);
        let cache = nvrtc::cache_dir();
        let mut modules = Vec::new();
        let mut functions = HashMap::new();
        for source in &nvrtc::SOURCES {
            let (ptx, _) =
                nvrtc::compile_cached(source, capability, cache.as_deref()).map_err(|e| startup(e.to_string()))?;
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
                .map_err(|e| startup(format!("loading kernel module {}: {e}", source.name)))?;
            for name in KERNEL_NAMES {
                if let Ok(f) = module.load_function(name) {
                    functions.insert(name, f);
                }
            }
            modules.push(module);
        }
        if let Some(missing) = KERNEL_NAMES.iter().find(|n| !functions.contains_key(*n)) {
            return Err(startup(format!("kernel '{missing}' is in no compiled module")));
        }
        // One stream per context and no buffer shared between streams (weights are written once,
        // before any context exists; the bandwidth measurement's buffers live and die on its own
        // stream): cudarc's per-buffer event tracking has nothing to order.
        // SAFETY: called before any allocation or launch on this context.
        unsafe { ctx.disable_event_tracking() };
        Ok(CudaDevice {
            gpu: Arc::new(Gpu {
                ctx,
                name,
                kernels: Kernels {
                    functions,
                    _modules: modules,
                },
            }),
            weights: Arc::new(HashMap::new()),
            weights_bytes: 0,
        })
    }

    /// The GPU's name as the driver reports it.
    pub fn gpu_name(&self) -> &str {
        &self.gpu.name
    }

    fn upload(stream: &Arc<CudaStream>, name: &str, bytes: &[u8]) -> Result<CudaSlice<u8>, BackendError> {
        let mut data = stream
            .alloc_zeros::<u8>(bytes.len().max(1))
            .map_err(|e| prepare_error(name, format!("allocating {} bytes: {e}", bytes.len())))?;
        if !bytes.is_empty() {
            stream
                .memcpy_htod(bytes, &mut data)
                .map_err(|e| prepare_error(name, format!("copying {} bytes to the device: {e}", bytes.len())))?;
        }
        Ok(data)
    }
}

impl BackendDevice for CudaDevice {
    fn handle(&self) -> Backend {
        Backend::CUDA
    }

    fn name(&self) -> &str {
        "cuda"
    }

    fn n_threads(&self) -> usize {
        1
    }

    fn device_name(&self) -> Option<String> {
        Some(self.gpu.name.clone())
    }

    fn free_memory(&self) -> Option<usize> {
        self.gpu.ctx.mem_get_info().ok().map(|(free, _)| free)
    }

    fn weights_bytes(&self) -> usize {
        self.weights_bytes
    }

    /// The best of five timings of four device-to-device copies of 1 GiB (less where memory is
    /// short, but at least 256 MiB, far past any L2), timed with events on a stream of its own
    /// after two unmeasured copies (the clocks ramp up).
    fn copy_bandwidth(&self) -> Result<Option<f64>, BackendError> {
        use cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
        const MIN_BYTES: usize = 256 << 20;
        const COPIES: usize = 4;
        let fail = |what: &str, e: cudarc::driver::DriverError| BackendError::Measure {
            backend: "cuda".into(),
            message: format!("{what}: {e}"),
        };
        let (free, _) = self
            .gpu
            .ctx
            .mem_get_info()
            .map_err(|e| fail("reading the free memory", e))?;
        let bytes = (1usize << 30).min(free / 4);
        if bytes < MIN_BYTES {
            return Ok(None);
        }
        let stream = self.gpu.ctx.new_stream().map_err(|e| fail("creating a stream", e))?;
        let alloc = |n| {
            stream
                .alloc_zeros::<u8>(n)
                .map_err(|e| fail("allocating the copy buffers", e))
        };
        let (src, mut dst) = (alloc(bytes)?, alloc(bytes)?);
        let copy = |dst: &mut CudaSlice<u8>| stream.memcpy_dtod(&src, dst).map_err(|e| fail("copying", e));
        let event = || {
            stream
                .record_event(Some(CU_EVENT_DEFAULT))
                .map_err(|e| fail("recording an event", e))
        };
        for _ in 0..2 {
            copy(&mut dst)?;
        }
        let mut best = 0.0f64;
        for _ in 0..5 {
            let start = event()?;
            for _ in 0..COPIES {
                copy(&mut dst)?;
            }
            let end = event()?;
            let ms = start.elapsed_ms(&end).map_err(|e| fail("timing the copies", e))?;
            if ms > 0.0 {
                best = best.max((2 * COPIES * bytes) as f64 / (f64::from(ms) / 1e3) / 1e9);
            }
        }
        // The buffers are freed on the stream: give the memory back before the tests run.
        drop((src, dst));
        stream.synchronize().map_err(|e| fail("freeing the copy buffers", e))?;
        Ok((best > 0.0).then_some(best))
    }

    /// Uploads every weight the graph names, straight from the memory map, with a progress
    /// line on stderr for models over 256 MiB. A type the kernels cannot read is refused by name.
    fn prepare_weights(&mut self, source: &dyn TensorSource, weights: &[WeightUse]) -> Result<(), BackendError> {
        let stream = self.gpu.ctx.default_stream();
        let total: usize = weights
            .iter()
            .filter_map(|u| source.weight(&u.name))
            .map(|w| w.data.len())
            .sum();
        // Refused before any upload, naming both sizes (llama.cpp would fail mid-way).
        let (free, _) = self
            .gpu
            .ctx
            .mem_get_info()
            .map_err(|e| prepare_error("(all)", format!("reading the free device memory: {e}")))?;
        if total > free {
            return Err(prepare_error(
                "(all)",
                format!(
                    "the weights need {total} bytes of device memory and {free} are free: offload fewer layers (-ngl N)"
                ),
            ));
        }
        let progress = total > 256 << 20;
        let mut map = HashMap::new();
        let mut done = 0usize;
        for usage in weights {
            let Some(w) = source.weight(&usage.name) else {
                // Reported by the node that names it, as for any missing weight.
                continue;
            };
            if !WEIGHT_TYPES.contains(&w.ggml_type) {
                return Err(prepare_error(
                    &usage.name,
                    format!("the CUDA kernels cannot read {} weights", w.ggml_type.name()),
                ));
            }
            let data = Self::upload(&stream, &usage.name, w.data)?;
            done += w.data.len();
            if progress {
                eprint!("\rcuda: uploading weights {:>5} / {} MiB", done >> 20, total >> 20);
            }
            map.insert(
                usage.name.clone(),
                DeviceWeight {
                    ggml_type: w.ggml_type,
                    shape: w.shape.to_vec(),
                    data,
                },
            );
        }
        stream
            .synchronize()
            .map_err(|e| prepare_error("(upload)", format!("waiting for the uploads: {e}")))?;
        if progress {
            eprintln!();
        }
        self.weights_bytes = map.values().map(|w| w.data.len()).sum();
        self.weights = Arc::new(map);
        Ok(())
    }

    fn new_context(&self) -> Box<dyn ComputeBackend> {
        Box::new(CudaBackend::new(Arc::clone(&self.gpu), Arc::clone(&self.weights)))
    }
}
