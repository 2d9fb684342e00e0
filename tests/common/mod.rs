//! Helpers shared by the integration tests: where fixtures and the default model live.
#![allow(dead_code)]

pub mod browser;
pub mod server;

use std::path::PathBuf;

pub const DEFAULT_MODEL_FILE: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// The fixtures: `$MINFER_FIXTURES` when set (a test binary run away from its checkout, as
/// `scripts/gpu-check.sh` does), else the repository's `tests/fixtures`.
pub fn fixtures() -> PathBuf {
    match std::env::var_os("MINFER_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"),
    }
}

pub fn tiny_model(arch: &str, ty: &str) -> PathBuf {
    fixtures().join(format!("models/tiny-{arch}-{ty}.gguf"))
}

/// The real test model in the model cache. `scripts/test.sh` fetches it before the tests run;
/// a test run without it fails here rather than passing vacuously.
pub fn default_model() -> PathBuf {
    cached_model(DEFAULT_MODEL_FILE, "scripts/fetch-model.sh")
}

/// The second real model, Qwen2.5-Coder-1.5B-Instruct Q4_K_M (the speculative decoding
/// target), fetched like the default one (`scripts/fetch-model.sh 1.5b`).
#[allow(dead_code)]
pub fn model_1_5b() -> PathBuf {
    cached_model("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "scripts/fetch-model.sh 1.5b")
}

/// SmolLM2-135M-Instruct Q4_1, the llama-architecture model (`scripts/fetch-model.sh smollm2`).
#[allow(dead_code)]
pub fn smollm2() -> PathBuf {
    cached_model("SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/fetch-model.sh smollm2")
}

/// Gemma 3 270M Q4_K_M (the gemma3-architecture model), fetched like the others
/// (`scripts/fetch-model.sh gemma3`).
#[allow(dead_code)]
pub fn gemma3() -> PathBuf {
    cached_model("gemma-3-270m-q4_k_m.gguf", "scripts/fetch-model.sh gemma3")
}

/// A real model and one session on it, shared by a reference test's cases behind a mutex.
#[allow(dead_code)]
pub struct Loaded {
    pub model: minfer::engine::Model,
    pub session: minfer::engine::Session,
}

/// The model at `path` on the CPU with 2 threads, as the llama.cpp references were made, with a
/// 1024-cell session.
#[allow(dead_code)]
pub fn load_reference_model(path: PathBuf) -> std::sync::Mutex<Loaded> {
    let options = minfer::engine::ModelOptions {
        n_threads: Some(2),
        backend: None,
        ..Default::default()
    };
    let model = minfer::engine::Model::load(path, &options).unwrap();
    let session = minfer::engine::Session::new(&model, 1024);
    std::sync::Mutex::new(Loaded { model, session })
}

/// One prompt of a llama.cpp reference set (`prompts.jsonl` beside `<index>.f32` files of the
/// last position's logits): its text, llama.cpp's tokens, its 32-step greedy continuation with
/// the top-1/top-2 gap at each step, and the gap at the last prompt position.
#[allow(dead_code)]
pub struct ReferenceCase {
    pub index: u64,
    pub prompt: String,
    pub tokens: Vec<u32>,
    pub greedy: Vec<u32>,
    pub gaps: Vec<f64>,
    pub top2_gap: f32,
}

/// Greedy continuations of `cases` on `loaded` equal to the reference's up to each case's first
/// near-tie (a top-1/top-2 gap under 0.25), with at least `min_steps` steps compared in all.
#[allow(dead_code)]
pub fn check_greedy_continuations(loaded: &mut Loaded, cases: &[ReferenceCase], min_steps: usize) {
    use minfer::engine::{generate, GenerateOptions};
    let mut compared = 0;
    for case in cases {
        let comparable = case.gaps.iter().position(|&g| g < 0.25).unwrap_or(case.greedy.len());
        if comparable == 0 {
            continue;
        }
        compared += comparable;
        let options = GenerateOptions {
            max_tokens: comparable,
            ignore_eos: true,
            sampling: minfer::sampling::SamplingParams::greedy(),
            ..Default::default()
        };
        let Loaded { model, session } = loaded;
        session.reset();
        let result = generate(session, model.tokenizer(), &case.tokens, &options, |_| Ok(())).unwrap();
        assert_eq!(result.tokens, case.greedy[..comparable], "prompt {}", case.index);
    }
    assert!(
        compared >= min_steps,
        "only {compared} greedy steps were clear enough to compare"
    );
}

/// The cases of the reference set in `dir` (under the fixtures).
#[allow(dead_code)]
pub fn reference_cases(dir: &str) -> Vec<ReferenceCase> {
    let text = std::fs::read_to_string(fixtures().join(dir).join("prompts.jsonl")).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect()
    };
    text.lines()
        .enumerate()
        .map(|(line, l)| {
            let c: serde_json::Value = serde_json::from_str(l).unwrap();
            let top = c["top20_last"].as_array().unwrap();
            ReferenceCase {
                index: c["index"].as_u64().unwrap_or(line as u64),
                prompt: c["prompt"].as_str().unwrap().to_string(),
                tokens: ids(&c["tokens"]),
                greedy: ids(&c["greedy"]),
                gaps: c["greedy_top2_gap"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|g| g.as_f64().unwrap())
                    .collect(),
                top2_gap: (top[0][1].as_f64().unwrap() - top[1][1].as_f64().unwrap()) as f32,
            }
        })
        .collect()
}

fn cached_model(file: &str, fetch: &str) -> PathBuf {
    let cache = std::env::var_os("MINFER_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/minfer/models"));
    let path = cache.join(file);
    assert!(
        path.exists(),
        "{file} is missing at {}; run {fetch} (scripts/test.sh does)",
        path.display()
    );
    path
}

/// A weight of type `ty` from `values`: quantized, or, for a type minfer only reads, gguf-py's
/// random blocks of it (`tests/fixtures/quant/<T>.blocks.bin`) over and over.
pub fn weight_bytes(ty: minfer::quant::GgmlType, values: &[f32]) -> Vec<u8> {
    let mut bytes = vec![0u8; ty.row_size(values.len() as u64).unwrap() as usize];
    if minfer::quant::can_quantize(ty) {
        minfer::quant::quantize_row(ty, values, &mut bytes).unwrap();
    } else {
        let blocks = std::fs::read(fixtures().join(format!("quant/{ty}.blocks.bin"))).unwrap();
        for (out, block) in bytes.chunks_mut(blocks.len()).zip(std::iter::repeat(&blocks)) {
            out.copy_from_slice(&block[..out.len()]);
        }
    }
    bytes
}

/// The f32 values of a little-endian file.
pub fn read_f32(path: &std::path::Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// The Python interpreter of the project's virtualenv (made by `scripts/python-env.sh`), or
/// `$MINFER_PYTHON`.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("MINFER_PYTHON") {
        return PathBuf::from(p);
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing; run scripts/python-env.sh (scripts/test.sh does)",
        p.display()
    );
    p
}

fn array_json(a: &minfer::gguf::Array) -> serde_json::Value {
    use minfer::gguf::Array;
    use serde_json::json;
    let items: Vec<serde_json::Value> = match a {
        Array::U8(v) => v.iter().map(|x| json!(x)).collect(),
        Array::I8(v) => v.iter().map(|x| json!(x)).collect(),
        Array::U16(v) => v.iter().map(|x| json!(x)).collect(),
        Array::I16(v) => v.iter().map(|x| json!(x)).collect(),
        Array::U32(v) => v.iter().map(|x| json!(x)).collect(),
        Array::I32(v) => v.iter().map(|x| json!(x)).collect(),
        Array::U64(v) => v.iter().map(|x| json!(x)).collect(),
        Array::I64(v) => v.iter().map(|x| json!(x)).collect(),
        Array::F32(v) => v.iter().map(|x| json!(*x as f64)).collect(),
        Array::F64(v) => v.iter().map(|x| json!(x)).collect(),
        Array::Bool(v) => v.iter().map(|x| json!(x)).collect(),
        Array::String(v) => v.iter().map(|x| json!(x)).collect(),
        Array::Array(v) => v.iter().map(array_json).collect(),
    };
    json!({"type": a.element_type().name(), "items": items})
}

fn value_json(v: &minfer::gguf::Value) -> serde_json::Value {
    use minfer::gguf::Value;
    use serde_json::json;
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F32(x) => json!(*x as f64),
        Value::F64(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(x) => json!(x),
        Value::Array(a) => array_json(a),
    }
}

/// What our reader sees in a file, in the shape `scripts/gguf_dump.py` prints with gguf-py.
pub fn dump_json(file: &minfer::gguf::GgufFile) -> serde_json::Value {
    use serde_json::json;
    let metadata: Vec<_> = file
        .metadata()
        .iter()
        .map(|(k, v)| json!({"key": k, "type": v.value_type().name(), "value": value_json(v)}))
        .collect();
    let tensors: Vec<_> = file
        .tensors()
        .iter()
        .map(|t| {
            let hex = sha256_hex(file.tensor_data(t));
            json!({"name": t.name, "type": t.ggml_type.name(), "shape": t.shape, "offset": t.offset, "sha256": hex})
        })
        .collect();
    json!({"version": file.version(), "metadata": metadata, "tensors": tensors})
}

/// Cosine similarity of two logit rows, accumulated in f64.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        ab += x as f64 * y as f64;
        aa += x as f64 * x as f64;
        bb += y as f64 * y as f64;
    }
    ab / (aa.sqrt() * bb.sqrt())
}

/// A seeded xorshift64 generator (13, 7, 17): deterministic, so a failing case replays.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Uniform in [-scale, scale).
    pub fn f32(&mut self, scale: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }

    /// `n` values of [`Rng::f32`].
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32(scale)).collect()
    }

    /// Uniform in the open interval (0, 1), with 53 bits.
    pub fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// A standard normal deviate (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A `sha256sum`-format manifest under `tests/fixtures/quantize/` (`HASH  FILE` lines, `#`
/// comments): file name → hash.
pub fn sha256_manifest(name: &str) -> std::collections::HashMap<String, String> {
    let text = std::fs::read_to_string(fixtures().join("quantize").join(name)).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (hash, file) = l.split_once("  ").unwrap();
            (file.to_string(), hash.to_string())
        })
        .collect()
}

/// `{"$ref": "#/$defs/d0"}` with `d0` → `d1` → ... → `d{n-1}` → an integer.
pub fn ref_chain(n: usize) -> serde_json::Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        let next = if i + 1 < n {
            serde_json::json!({"$ref": format!("#/$defs/d{}", i + 1)})
        } else {
            serde_json::json!({"type": "integer"})
        };
        defs.insert(format!("d{i}"), next);
    }
    serde_json::json!({"$ref": "#/$defs/d0", "$defs": defs})
}

/// `root ::= r1`, `r1 ::= r2`, ..., `r{n} ::= "a"`.
pub fn rule_chain(n: usize) -> String {
    let mut text = String::from("root ::= r1\n");
    for i in 1..n {
        text.push_str(&format!("r{i} ::= r{}\n", i + 1));
    }
    text.push_str(&format!("r{n} ::= \"a\"\n"));
    text
}

/// Whether a CUDA device is usable here. Without one the caller skips its GPU half, saying so;
/// where `MINFER_REQUIRE_CUDA=1` (the GPU machine's check script sets it) a missing device
/// fails the test instead, so that a GPU check cannot pass by skipping.
#[allow(dead_code)]
pub fn cuda_or_skip(test: &str) -> bool {
    match minfer::backends::probe(minfer::graph::Backend::CUDA) {
        Ok(()) => true,
        Err(why) => {
            assert!(
                std::env::var("MINFER_REQUIRE_CUDA").as_deref() != Ok("1"),
                "{test}: MINFER_REQUIRE_CUDA=1 but no CUDA device is usable: {why}"
            );
            eprintln!("{test}: no usable CUDA device ({why}): its GPU half is skipped");
            false
        }
    }
}
