//! The real default model (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M mix): `minfer info` reports what
//! llama.cpp reports, and every tensor dequantizes.

mod common;

use minfer::gguf::GgufFile;
use minfer::quant::{dequantize_row, GgmlType};

#[test]
fn the_default_model_has_the_published_hyper_parameters_and_type_counts() {
    let file = GgufFile::open(common::default_model()).unwrap();
    let m = file.metadata();
    assert_eq!(m.get_str("general.architecture").unwrap(), "qwen2");
    assert_eq!(m.get_uint("qwen2.block_count").unwrap(), 24);
    assert_eq!(m.get_uint("qwen2.embedding_length").unwrap(), 896);
    assert_eq!(m.get_uint("qwen2.attention.head_count").unwrap(), 14);
    assert_eq!(m.get_uint("qwen2.attention.head_count_kv").unwrap(), 2);
    assert_eq!(m.get_uint("qwen2.feed_forward_length").unwrap(), 4864);
    assert_eq!(m.get_array("tokenizer.ggml.tokens").unwrap().len(), 151936);
    let counts: Vec<(GgmlType, usize)> = file.tensor_type_counts().into_iter().map(|(t, n, _)| (t, n)).collect();
    assert_eq!(
        counts,
        [
            (GgmlType::Q5_0, 133),
            (GgmlType::F32, 121),
            (GgmlType::Q8_0, 13),
            (GgmlType::Q4_K, 12),
            (GgmlType::Q6_K, 12)
        ]
    );
    assert_eq!(file.file_size(), 491_400_064);
}

#[test]
fn every_tensor_of_the_default_model_dequantizes_to_finite_values() {
    let file = GgufFile::open(common::default_model()).unwrap();
    let mut values = Vec::new();
    for t in file.tensors() {
        values.resize(t.n_elements() as usize, 0.0);
        dequantize_row(t.ggml_type, file.tensor_data(t), &mut values).unwrap_or_else(|e| panic!("{}: {e}", t.name));
        assert!(
            values.iter().all(|v| v.is_finite()),
            "{} has a non-finite value",
            t.name
        );
        assert!(values.iter().any(|&v| v != 0.0), "{} is all zeros", t.name);
    }
}

#[test]
fn minfer_info_prints_the_summary_and_the_tensor_table() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(["info", "--tensors"])
        .arg(common::default_model())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for line in [
        "file format    = GGUF V3",
        "file type      = Q4_K - Medium (15)",
        "architecture   = qwen2",
        "  n_layer        = 24",
        "  n_embd         = 896",
        "  n_head         = 14",
        "  n_head_kv      = 2",
        "  n_ff           = 4864",
        "  n_vocab        = 151936",
        "  EOS token      = 151645 '<|im_end|>'",
        "  chat template  = present (2507 bytes)",
        "tensors: 291 (Q5_0 133, F32 121, Q8_0 13, Q4_K 12, Q6_K 12)",
    ] {
        assert!(text.lines().any(|l| l == line), "missing line {line:?} in:\n{text}");
    }
    let row = text
        .lines()
        .find(|l| l.contains(" token_embd.weight "))
        .expect("tensor table row");
    let fields: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&fields[1..4], ["token_embd.weight", "Q5_0", "[896,"], "{row}");
    assert!(row.contains("[896, 151936]"), "{row}");
}

#[test]
fn minfer_info_on_a_missing_file_fails_with_the_path() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(["info", "/nonexistent/model.gguf"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
}
