//! Compute backends: each executes graph nodes on one kind of device.
//!
//! A backend owns its buffer pool and kernels; it knows the graph IR but no model. The CPU
//! backend is the reference every other backend is compared against.

pub mod cpu;

use crate::graph::{Backend, ComputeBackend, TensorSource};
use std::sync::Arc;

/// Instantiate the backends of `fence` (in its order), resolving weights through `weights`.
pub fn create(fence: &[Backend], weights: Arc<dyn TensorSource>, n_threads: usize) -> Vec<Box<dyn ComputeBackend>> {
    fence
        .iter()
        .filter_map(|&b| match b {
            Backend::CPU => {
                Some(Box::new(cpu::CpuBackend::new(Arc::clone(&weights), n_threads)) as Box<dyn ComputeBackend>)
            }
            // Backends this build does not contain never pass the registry's fence.
            _ => None,
        })
        .collect()
}
