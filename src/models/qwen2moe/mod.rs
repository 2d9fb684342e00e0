//! Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (Q/K/V biases, NeoX RoPE)
//! with a mixture of experts in every FFN — softmax router, top-k, weights not normalized —
//! plus a shared expert every token runs, scaled by the sigmoid of its own gate
//! (`models::moe`). Qwen2's loader and graph build it; this module only names the
//! architecture.

use crate::gguf::GgufFile;
use crate::models::qwen2::Qwen2;
use crate::models::ModelError;

/// A `qwen2moe` file's model, its keys and tensors checked.
pub fn load(file: &GgufFile) -> Result<Qwen2, ModelError> {
    Qwen2::load_family(file, "qwen2moe")
}
