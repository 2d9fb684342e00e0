//! Qwen2: pre-norm transformer with RMSNorm, GQA attention with Q/K/V biases, NeoX RoPE and a
//! SwiGLU FFN; the output head falls back to the token embedding when `output.weight` is
//! absent (tied embeddings).

mod graph;
mod loader;

pub use loader::Qwen2;
