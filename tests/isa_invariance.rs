//! The real model's logits do not depend on the instruction set or the thread count: the prefill
//! GEMM (AVX-512 VNNI) on repacked weights and on the file's layout (`MINFER_NO_REPACK`), the
//! AVX2 and the scalar dot products, on one and two threads, all give the same bits (each kernel is bit-exact with its scalar reference). With the reference tests
//! (tests/qwen25_reference.rs) holding the default path to llama.cpp's logits, this holds every
//! path to them.

mod common;

use std::process::Command;

/// `minfer eval` of `text` on the default model with `threads` and the environment `env`, as
/// the bits of all logits at the last position.
fn logits(text: &str, threads: &str, env: &[(&str, &str)]) -> Vec<u32> {
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("logits.f32");
    let mut command = Command::new(env!("CARGO_BIN_EXE_minfer"));
    command
        .arg("eval")
        .arg(common::default_model())
        .args([text, "--top", "1", "-t", threads, "--out", out_file.to_str().unwrap()])
        .env_remove("MINFER_NO_AVX512")
        .env_remove("MINFER_NO_AVX2")
        .env_remove("MINFER_NO_REPACK");
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    common::read_f32(&out_file).iter().map(|v| v.to_bits()).collect()
}

#[test]
fn prompt_logits_are_bit_identical_across_instruction_sets_and_thread_counts() {
    // Long enough for the GEMM (and for several 16-row panels of tokens), over every weight type
    // of the model (Q5_0, Q8_0, Q4_K, Q6_K).
    let text = "def quicksort(items):\n    \"\"\"Sort a list of numbers in ascending order.\"\"\"\n    if len(items) <= 1:\n        return items\n    pivot = items[len(items) // 2]\n";
    let reference = logits(text, "2", &[]);
    assert_eq!(reference.len(), 151936);
    for (threads, env) in [
        ("1", &[][..]),
        ("2", &[("MINFER_NO_REPACK", "1")][..]),
        ("2", &[("MINFER_NO_AVX512", "1")][..]),
        ("1", &[("MINFER_NO_AVX2", "1")][..]),
    ] {
        let got = logits(text, threads, env);
        let differing = got.iter().zip(&reference).filter(|(a, b)| a != b).count();
        assert_eq!(differing, 0, "{differing} logits differ with -t {threads} {env:?}");
    }
}
