//! Qwen3-MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): Qwen3's attention (per-head Q/K norms, NeoX
//! RoPE, no biases) with a mixture of experts in every FFN — softmax router, top-k, weights
//! normalized to sum 1 (`models::moe`). Qwen3's loader and graph build it; this module only
//! names the architecture.

use crate::gguf::GgufFile;
use crate::models::qwen3::Qwen3;
use crate::models::ModelError;

/// A `qwen3moe` file's model, its keys and tensors checked.
pub fn load(file: &GgufFile) -> Result<Qwen3, ModelError> {
    Qwen3::load_family(file, "qwen3moe")
}
