//! Helpers shared by the integration tests: where fixtures and the default model live.
#![allow(dead_code)]

use std::path::PathBuf;

pub const DEFAULT_MODEL_FILE: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn tiny_model(arch: &str, ty: &str) -> PathBuf {
    fixtures().join(format!("models/tiny-{arch}-{ty}.gguf"))
}

/// The real test model in the model cache. `scripts/test.sh` fetches it before the tests run;
/// a test run without it fails here rather than passing vacuously.
pub fn default_model() -> PathBuf {
    let cache = std::env::var_os("MINFER_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
                .join(".cache/minfer/models")
        });
    let path = cache.join(DEFAULT_MODEL_FILE);
    assert!(
        path.exists(),
        "the default model is missing at {}; run scripts/fetch-model.sh (scripts/test.sh does)",
        path.display()
    );
    path
}

pub fn read_f32(path: &std::path::Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}
