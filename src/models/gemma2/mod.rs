//! Gemma 2 (2B, 9B, 27B): the Gemma family's loader and graph (`models::gemma3`, where the three
//! generations' differences are listed) for the `gemma2` generation — sandwich norms without
//! Q/K norms, a 4096-position window on every other layer, and attention and final logit
//! soft-capping. This module only names the generation.

use crate::gguf::GgufFile;
use crate::models::gemma3::{Gemma3, Generation};
use crate::models::ModelError;

/// A `gemma2` file's model, its tensors checked.
pub fn load(file: &GgufFile) -> Result<Gemma3, ModelError> {
    Gemma3::load_family(file, Generation::Gemma2)
}
