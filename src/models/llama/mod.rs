//! Llama (Llama 2 and 3, CodeLlama, TinyLlama, SmolLM/SmolLM2, Mistral 7B, the R1 distills of
//! Llama): pre-norm transformer with RMSNorm, GQA attention with optional Q/K/V biases, normal
//! (adjacent-pair) RoPE and a SwiGLU FFN; the output head falls back to the token embedding when
//! `output.weight` is absent (tied embeddings), linear RoPE scaling and Llama 3.1's per-pair
//! frequency factors (`rope_freqs.weight`), and the optional biases of the attention output and
//! the FFN. What the architecture's files can hold that minfer does not compute yet (experts,
//! YaRN and LongRoPE scaling) is refused by name at load, with every tensor and `llama.*` key the
//! computation does not read.

mod graph;
mod loader;

pub use loader::Llama;
pub(crate) use loader::{LayerWeights, KEYS};
