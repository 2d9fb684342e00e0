//! The CPU backend (being written).

pub mod kernels;
