//! Gemma (1: 2B, 7B): the Gemma family's loader and graph (`models::gemma3`, where the three
//! generations' differences are listed) for the `gemma` generation — pre-norms only, no window,
//! no soft-caps. This module only names the generation.

use crate::gguf::GgufFile;
use crate::models::gemma3::{Gemma3, Generation};
use crate::models::ModelError;

/// A `gemma` file's model, its tensors checked.
pub fn load(file: &GgufFile) -> Result<Gemma3, ModelError> {
    Gemma3::load_family(file, Generation::Gemma)
}
