//! What every `minfer bench` row says about the model: its file name, llama-bench's model type
//! (`qwen2 1B Q4_K - Medium`), size and parameter count, and the backends it runs on. Read from
//! the file and the loaded model; nothing here is timed.

use super::*;

/// What every row says about the model and the machine.
pub(super) struct ModelInfo {
    pub(super) filename: String,
    pub(super) model_type: String,
    pub(super) size: u64,
    pub(super) n_params: u64,
    pub(super) cpu_info: String,
    pub(super) gpu_info: String,
    pub(super) backends: String,
    /// Whether the CPU backend takes part (its kernels are then reported).
    pub(super) uses_cpu: bool,
    /// Whether every layer and the head run on a GPU (its memory then bounds generation).
    pub(super) all_on_gpu: bool,
}

impl ModelInfo {
    pub(super) fn new(path: &Path, model: &minfer::engine::Model) -> Self {
        let file = model.file();
        let handles = model.backends().handles();
        let gpus: Vec<String> = handles
            .iter()
            .filter(|&&b| b != minfer::graph::Backend::CPU)
            .map(|b| b.to_string().to_uppercase())
            .collect();
        let gpu_info = model.backends().devices().iter().find_map(|d| d.device_name());
        let all_on_gpu = gpu_info.is_some()
            && model
                .backends()
                .n_gpu_layers()
                .is_none_or(|n| n > model.hparams().n_layer);
        ModelInfo {
            filename: path.display().to_string(),
            model_type: model_type(file),
            size: file.tensors().iter().map(|t| t.size).sum(),
            n_params: file.tensors().iter().map(|t| t.n_elements()).sum(),
            cpu_info: cpu_name().unwrap_or_default(),
            gpu_info: gpu_info.unwrap_or_default(),
            // As llama-bench's `get_backend`: the backends besides the CPU's, else `CPU`.
            backends: if gpus.is_empty() { "CPU".into() } else { gpus.join(",") },
            uses_cpu: handles.contains(&minfer::graph::Backend::CPU),
            all_on_gpu,
        }
    }
}

/// The model as llama.cpp describes it (`llama_model_desc`, llama-bench's `model_type`):
/// architecture, size class and file type, e.g. `qwen2 1B Q4_K - Medium`.
pub fn model_type(file: &GgufFile) -> String {
    let arch = file.metadata().get_str("general.architecture").unwrap_or("unknown");
    format!("{arch} {} {}", size_class(file, arch), file_type_name(file))
}

/// llama.cpp's size class of a model (`llm_type_name` of the type its loader sets from the
/// layer count, and for some sizes the width, head count or vocabulary), `?B` where it sets
/// none. It is not the parameter count: Qwen2.5 0.5B (24 layers of 896) is `1B`, SmolLM2 135M
/// (30 layers) `256M`. Only the architectures minfer runs are known here, as llama.cpp 0c1e570
/// classes them.
pub fn size_class(file: &GgufFile, arch: &str) -> &'static str {
    let m = file.metadata();
    let key = |name: &str| format!("{arch}.{name}");
    let uint = |name: &str| m.get_uint(&key(name)).ok();
    // A per-layer array (a head count may be one) stands for its first layer, as llama.cpp's
    // `n_head()` does.
    let first = |name: &str| {
        uint(name).or_else(|| {
            use minfer::gguf::Array;
            match m.get_array(&key(name)).ok()? {
                Array::U32(v) => v.first().map(|&x| u64::from(x)),
                Array::I32(v) => v.first().and_then(|&x| u64::try_from(x).ok()),
                Array::U64(v) => v.first().copied(),
                Array::I64(v) => v.first().and_then(|&x| u64::try_from(x).ok()),
                _ => None,
            }
        })
    };
    // Multi-token-prediction layers are not counted (`n_layer()`).
    let n_layer = uint("block_count")
        .unwrap_or(0)
        .saturating_sub(uint("nextn_predict_layers").unwrap_or(0));
    let n_embd = uint("embedding_length").unwrap_or(0);
    let n_head = first("attention.head_count").unwrap_or(0);
    let n_head_kv = first("attention.head_count_kv").unwrap_or(n_head);
    let n_expert = uint("expert_count").unwrap_or(0);
    let n_vocab = uint("vocab_size").or_else(|| m.get_array("tokenizer.ggml.tokens").ok().map(|a| a.len() as u64));
    let class = match arch {
        "gemma" => match n_layer {
            18 => "2B",
            28 => "7B",
            _ => "",
        },
        "gemma2" => match n_layer {
            26 => "2B",
            42 => "9B",
            46 => "27B",
            _ => "",
        },
        "gemma3" => match n_layer {
            18 => "270M",
            26 => "1B",
            32 => "8B",
            34 => "4B",
            48 => "12B",
            62 => "27B",
            _ => "",
        },
        "gpt-oss" => match n_layer {
            24 => "20B",
            36 => "120B",
            _ => "",
        },
        "granite" => match (n_layer, n_embd) {
            (32, _) => "3B",
            (40, 2048) => "2B",
            (40, 2560) => "3B",
            (40, 4096) => "8B",
            (64, _) => "30B",
            _ => "",
        },
        "llama" if n_expert == 8 => match n_layer {
            32 => "8x7B",
            56 => "8x22B",
            _ => "",
        },
        "llama" => match n_layer {
            16 | 22 => "1B",
            26 | 28 => "3B",
            30 => "256M",
            // Granite's vocabulary has 49152 tokens.
            32 => match n_vocab.unwrap_or(0) {
                49152 => "3B",
                v if v < 40000 => "7B",
                _ => "8B",
            },
            36 => "8B",
            40 => "13B",
            48 => "34B",
            60 => "30B",
            80 if n_head == n_head_kv => "65B",
            80 => "70B",
            _ => "",
        },
        "phi3" => match n_layer {
            24 => "1B",
            32 => "3B",
            40 => "14B",
            _ => "",
        },
        "qwen2" => match n_layer {
            24 if n_embd == 1024 => "0.5B",
            24 => "1B",
            28 if n_embd == 1536 => "1.5B",
            28 | 32 => "7B",
            36 => "3B",
            40 if n_head == 20 => "4B",
            40 => "13B",
            48 => "14B",
            64 => "32B",
            80 => "70B",
            _ => "",
        },
        "qwen2moe" => match n_layer {
            24 => "A2.7B",
            28 => "57B.A14B",
            _ => "",
        },
        "qwen3" => match n_layer {
            28 if n_embd == 1024 => "0.6B",
            28 => "1.7B",
            36 if n_embd == 2560 => "4B",
            36 => "8B",
            40 => "14B",
            64 => "32B",
            _ => "",
        },
        "qwen3moe" => match n_layer {
            48 => "30B.A3B",
            94 => "235B.A22B",
            _ => "",
        },
        _ => "",
    };
    if class.is_empty() {
        "?B"
    } else {
        class
    }
}

/// llama.cpp's name of the file's type (`llama_model_ftype_name`): `general.file_type`'s, or
/// when the file has none, `(guessed) ` and the type of most tensors' (`Q4_K - Medium` for
/// Q4_K), as its loader guesses.
pub fn file_type_name(file: &GgufFile) -> String {
    if let Ok(id) = file.metadata().get_uint("general.file_type") {
        return match super::super::info::file_type_name(id) {
            "unknown" => "unknown, may not work".to_string(),
            name => name.to_string(),
        };
    }
    // The type of the most tensors; a tie goes to the type that reached the count first, in
    // the order of the tensors' names.
    let mut tensors: Vec<_> = file.tensors().iter().collect();
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    let mut counts: Vec<(minfer::quant::GgmlType, usize)> = Vec::new();
    let mut best: Option<(minfer::quant::GgmlType, usize)> = None;
    for t in tensors {
        let n = match counts.iter_mut().find(|(ty, _)| *ty == t.ggml_type) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                counts.push((t.ggml_type, 1));
                1
            }
        };
        if best.is_none_or(|(_, max)| n > max) {
            best = Some((t.ggml_type, n));
        }
    }
    let guessed = best.map_or(0, |(ty, _)| guessed_file_type(ty.name()));
    format!("(guessed) {}", super::super::info::file_type_name(guessed))
}

/// The `llama_ftype` llama.cpp's loader guesses for a file mostly of the ggml type `name`;
/// all F32 (0) for a type it does not map (MXFP4 among them).
fn guessed_file_type(name: &str) -> u64 {
    match name {
        "F16" => 1,
        "BF16" => 32,
        "Q4_0" => 2,
        "Q4_1" => 3,
        "Q5_0" => 8,
        "Q5_1" => 9,
        "Q8_0" => 7,
        "Q2_K" => 10,
        "Q3_K" => 12,
        "Q4_K" => 15,
        "Q5_K" => 17,
        "Q6_K" => 18,
        "TQ1_0" => 36,
        "TQ2_0" => 37,
        "IQ2_XXS" => 19,
        "IQ2_XS" => 20,
        "IQ2_S" => 28,
        "IQ3_XXS" => 23,
        "IQ1_S" => 24,
        "IQ1_M" => 31,
        "IQ4_NL" => 25,
        "IQ4_XS" => 30,
        "IQ3_S" => 26,
        "NVFP4" => 39,
        "Q1_0" => 40,
        "Q2_0" => 41,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_are_typed_as_llama_bench_types_them() {
        // tests/fixtures/bench/model-types.txt: llama-bench's model_type of each file.
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let fixture = std::fs::read_to_string(root.join("tests/fixtures/bench/model-types.txt")).unwrap();
        let cache = std::env::var_os("MINFER_MODELS")
            .map(std::path::PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/minfer/models")));
        let mut checked = 0;
        for line in fixture.lines().filter(|l| !l.starts_with('#')) {
            let (name, want) = line.split_once('|').unwrap();
            let tiny = root.join("tests/fixtures/models").join(name);
            // The tiny models are always there; the cache's only where fetched.
            let path = match (tiny.exists(), cache.as_ref().map(|c| c.join(name))) {
                (true, _) => tiny,
                (false, Some(cached)) if cached.exists() => cached,
                _ => continue,
            };
            let file = GgufFile::open(&path).unwrap();
            assert_eq!(model_type(&file), want, "{name}");
            checked += 1;
        }
        assert!(checked >= 52, "only {checked} models checked");
    }

    /// A file with `metadata` and one Q4_K matrix, two Q8_0 ones and one F32 vector: mostly Q8_0.
    fn metadata_file(name: &str, metadata: &[(&str, minfer::gguf::Value)]) -> GgufFile {
        use minfer::quant::GgmlType;
        let mut w = minfer::gguf::GgufWriter::new();
        for (key, value) in metadata {
            w.set(*key, value.clone());
        }
        w.add_tensor("a.weight", GgmlType::Q4_K, &[256], vec![0; 144]).unwrap();
        w.add_tensor("b.weight", GgmlType::Q8_0, &[32], vec![0; 34]).unwrap();
        w.add_tensor("c.weight", GgmlType::Q8_0, &[32], vec![0; 34]).unwrap();
        w.add_tensor("d.weight", GgmlType::F32, &[4], vec![0; 16]).unwrap();
        let path = std::env::temp_dir().join(format!("minfer-bench-{}-{name}.gguf", std::process::id()));
        w.write_file(&path).unwrap();
        let file = GgufFile::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file
    }

    #[test]
    fn size_classes_follow_llama_cpps_layer_count_and_width_rules() {
        use minfer::gguf::Value;
        let model = |name: &str, arch: &str, kv: &[(&str, u32)]| {
            let mut m: Vec<(String, Value)> = vec![
                ("general.architecture".into(), Value::String(arch.into())),
                ("general.file_type".into(), Value::U32(15)),
            ];
            m.extend(kv.iter().map(|(k, v)| (format!("{arch}.{k}"), Value::U32(*v))));
            let m: Vec<(&str, Value)> = m.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
            model_type(&metadata_file(name, &m))
        };
        let qwen = |layers, embd| model("q", "qwen2", &[("block_count", layers), ("embedding_length", embd)]);
        assert_eq!(qwen(24, 896), "qwen2 1B Q4_K - Medium", "Qwen2.5 0.5B");
        assert_eq!(qwen(24, 1024), "qwen2 0.5B Q4_K - Medium", "Qwen1.5 0.5B");
        assert_eq!(qwen(28, 1536), "qwen2 1.5B Q4_K - Medium");
        assert_eq!(qwen(28, 3584), "qwen2 7B Q4_K - Medium");
        assert_eq!(qwen(2, 256), "qwen2 ?B Q4_K - Medium");
        let llama = |layers, vocab, experts| {
            model(
                "l",
                "llama",
                &[
                    ("block_count", layers),
                    ("vocab_size", vocab),
                    ("expert_count", experts),
                ],
            )
        };
        assert_eq!(llama(32, 32000, 0), "llama 7B Q4_K - Medium");
        assert_eq!(llama(32, 128256, 0), "llama 8B Q4_K - Medium");
        assert_eq!(llama(32, 49152, 0), "llama 3B Q4_K - Medium");
        assert_eq!(llama(32, 32000, 8), "llama 8x7B Q4_K - Medium");
        assert_eq!(llama(30, 49152, 0), "llama 256M Q4_K - Medium", "SmolLM2 135M");
        let gpt = |layers| model("g", "gpt-oss", &[("block_count", layers)]);
        assert_eq!(gpt(24), "gpt-oss 20B Q4_K - Medium");
        assert_eq!(gpt(36), "gpt-oss 120B Q4_K - Medium");
        assert_eq!(
            model("m", "qwen3moe", &[("block_count", 48)]),
            "qwen3moe 30B.A3B Q4_K - Medium"
        );
        assert_eq!(model("x", "mamba", &[("block_count", 64)]), "mamba ?B Q4_K - Medium");
    }

    #[test]
    fn a_file_without_a_file_type_is_named_by_its_commonest_tensor_type_as_guessed() {
        use minfer::gguf::Value;
        let file = metadata_file(
            "guess",
            &[
                ("general.architecture", Value::String("qwen2".into())),
                ("qwen2.block_count", Value::U32(28)),
                ("qwen2.embedding_length", Value::U32(1536)),
            ],
        );
        assert_eq!(model_type(&file), "qwen2 1.5B (guessed) Q8_0");
        let unknown = metadata_file(
            "unknown",
            &[
                ("general.architecture", Value::String("qwen2".into())),
                ("general.file_type", Value::U32(4)),
            ],
        );
        assert_eq!(model_type(&unknown), "qwen2 ?B unknown, may not work");
    }
}
