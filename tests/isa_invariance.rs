//! The real model's logits do not depend on the instruction set, the decoding kernel or the
//! thread count: the prefill GEMM (AVX-512 VNNI) on repacked weights and on the file's layout
//! (`MINFER_NO_REPACK`), the AVX2 and the scalar dot products, every decoding kernel
//! `MINFER_KERNEL` can force and the one measured on this CPU, on one and two threads, all give
//! the same bits (each kernel is bit-exact with its scalar reference). With the reference tests
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
        .env_remove("MINFER_NO_REPACK")
        .env_remove("MINFER_KERNEL");
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
        // The decoding kernels the choice picks between, forced (`quant::choice`): the prompt's
        // panels then read the file's layout or the repacked one.
        ("2", &[("MINFER_KERNEL", "avx2")][..]),
        (
            "2",
            &[("MINFER_KERNEL", "Q6_K=avx512-vnni,Q4_K=avx2,Q8_0=avx512-repacked")][..],
        ),
    ] {
        let forces_avx512 = env.iter().any(|(k, v)| *k == "MINFER_KERNEL" && v.contains("avx512"));
        if forces_avx512 && !minfer::quant::simd::Isa::Avx512.is_supported() {
            // A CPU without AVX-512 refuses those kernels by name (the next test checks it).
            continue;
        }
        let got = logits(text, threads, env);
        let differing = got.iter().zip(&reference).filter(|(a, b)| a != b).count();
        assert_eq!(differing, 0, "{differing} logits differ with -t {threads} {env:?}");
    }
}

/// The kernels `MINFER_KERNEL` can force on this CPU (`minfer bench` names them), widest first.
fn forcible() -> Vec<&'static str> {
    let mut kernels = vec!["scalar"];
    if minfer::quant::simd::Isa::Avx2.is_supported() {
        kernels.push("avx2");
    }
    if minfer::quant::simd::Isa::Avx512.is_supported() {
        kernels.extend(["avx512-vnni", "avx512-repacked"]);
    }
    kernels
}

#[test]
fn decoding_logits_are_bit_identical_whichever_kernel_is_forced_and_equal_the_scalar_references() {
    // Three tokens: fewer than the panel kernels take, so every product is a decoding kernel's
    // (the dot products, or the repacked tiles), on every weight type of the model.
    let text = "def main(";
    let scalar = logits(text, "2", &[("MINFER_KERNEL", "scalar")]);
    for kernel in forcible() {
        for threads in ["1", "2"] {
            let got = logits(text, threads, &[("MINFER_KERNEL", kernel)]);
            let differing = got.iter().zip(&scalar).filter(|(a, b)| a != b).count();
            assert_eq!(
                differing, 0,
                "{differing} logits differ with MINFER_KERNEL={kernel} -t {threads}"
            );
        }
    }
    // And whatever the measurement chose on this CPU.
    let measured = logits(text, "2", &[]);
    assert!(
        measured == scalar,
        "the measured choice differs from the scalar references"
    );
}

#[test]
fn a_minfer_kernel_that_names_no_kernel_or_one_this_cpu_lacks_is_refused_by_name() {
    let run = |value: &str, extra: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_minfer"));
        command
            .arg("eval")
            .arg(common::default_model())
            .args(["def", "--top", "1"])
            .env("MINFER_KERNEL", value);
        for (k, v) in extra {
            command.env(k, v);
        }
        let out = command.output().unwrap();
        assert!(!out.status.success(), "MINFER_KERNEL={value} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run("Q4_K=avx1024", &[]);
    assert!(err.contains("MINFER_KERNEL: \"avx1024\" is not a kernel"), "{err}");
    let err = run("F16=avx2", &[]);
    assert!(err.contains("\"F16\" is not a quantized weight type"), "{err}");
    let err = run("avx512-vnni", &[("MINFER_NO_AVX512", "1")]);
    assert!(err.contains("avx512-vnni cannot run here"), "{err}");
}
