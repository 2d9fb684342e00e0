//! Qwen3: Qwen2's skeleton without attention biases, with a head dimension decoupled from
//! n_embd / n_head (`qwen3.attention.key_length`), and a per-head RMSNorm on Q and K after the
//! projections and before RoPE. The head is tied to the embedding when `output.weight` is absent.

mod graph;
mod loader;

pub use loader::Qwen3;
