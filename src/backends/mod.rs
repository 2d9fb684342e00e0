//! Compute backends: each executes graph nodes on one kind of device.
//!
//! A backend owns its buffer pool and kernels; it knows the graph IR but no model. The CPU
//! backend is the reference every other backend is compared against.

pub mod cpu;
