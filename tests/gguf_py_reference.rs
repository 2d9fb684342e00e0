//! Our GGUF reader, writer, quantizers and dequantizers against gguf-py (the `gguf` package on
//! PyPI), an independent implementation. The vectors in `tests/fixtures/quant/` and
//! `tests/fixtures/gguf/` were made with it (see the READMEs there); the round-trip test runs it.

mod common;

use minfer::gguf::{Array, GgufFile, GgufWriter, Value};
use minfer::quant::{dequantize_row, quantize_row, GgmlType};
use std::path::PathBuf;

fn quant_fixture(name: &str) -> PathBuf {
    common::fixtures().join("quant").join(name)
}

fn assert_bits_equal(ours: &[f32], reference: &[f32], what: &str) {
    assert_eq!(ours.len(), reference.len(), "{what}: length");
    for (i, (a, b)) in ours.iter().zip(reference).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "{what}: value {i}: ours {a:e}, gguf-py {b:e}");
    }
}

fn assert_matches_gguf_py(ty: &str, stem: &str) {
    let ggml_type = GgmlType::from_name(ty).unwrap();
    let input = common::read_f32(&quant_fixture(&format!("{stem}.input.f32")));
    let expected = std::fs::read(quant_fixture(&format!("{stem}.quant.bin"))).unwrap();
    let dequant = common::read_f32(&quant_fixture(&format!("{stem}.dequant.f32")));

    let mut ours = vec![0u8; expected.len()];
    quantize_row(ggml_type, &input, &mut ours).unwrap();
    let block = ggml_type.type_size();
    if let Some(b) =
        (0..expected.len() / block).find(|&b| ours[b * block..(b + 1) * block] != expected[b * block..(b + 1) * block])
    {
        panic!(
            "{stem}: block {b} differs: ours {:?}, gguf-py {:?}",
            &ours[b * block..(b + 1) * block],
            &expected[b * block..(b + 1) * block]
        );
    }

    let mut values = vec![0f32; dequant.len()];
    dequantize_row(ggml_type, &expected, &mut values).unwrap();
    assert_bits_equal(&values, &dequant, stem);
}

fn assert_k_quant_dequantizes_like_gguf_py(ty: &str) {
    let ggml_type = GgmlType::from_name(ty).unwrap();
    let blocks = std::fs::read(quant_fixture(&format!("{ty}.blocks.bin"))).unwrap();
    let dequant = common::read_f32(&quant_fixture(&format!("{ty}.dequant.f32")));
    let mut values = vec![0f32; dequant.len()];
    dequantize_row(ggml_type, &blocks, &mut values).unwrap();
    assert_bits_equal(&values, &dequant, ty);
}

#[test]
fn f16_quantize_and_dequantize_match_gguf_py() {
    assert_matches_gguf_py("F16", "F16");
}

#[test]
fn f16_special_values_match_gguf_py() {
    assert_matches_gguf_py("F16", "F16.special");
}

#[test]
fn bf16_quantize_and_dequantize_match_gguf_py() {
    assert_matches_gguf_py("BF16", "BF16");
}

#[test]
fn bf16_special_values_match_gguf_py() {
    assert_matches_gguf_py("BF16", "BF16.special");
}

#[test]
fn q4_0_quantize_and_dequantize_match_gguf_py() {
    assert_matches_gguf_py("Q4_0", "Q4_0");
}

#[test]
fn q4_1_quantize_and_dequantize_match_gguf_py() {
    assert_matches_gguf_py("Q4_1", "Q4_1");
}

#[test]
fn q5_0_quantize_and_dequantize_match_gguf_py() {
    assert_matches_gguf_py("Q5_0", "Q5_0");
}

#[test]
fn q5_1_quantize_and_dequantize_match_gguf_py() {
    assert_matches_gguf_py("Q5_1", "Q5_1");
}

#[test]
fn q8_0_quantize_and_dequantize_match_gguf_py() {
    assert_matches_gguf_py("Q8_0", "Q8_0");
}

#[test]
fn q4_k_dequantize_matches_gguf_py() {
    assert_k_quant_dequantizes_like_gguf_py("Q4_K");
}

#[test]
fn q5_k_dequantize_matches_gguf_py() {
    assert_k_quant_dequantizes_like_gguf_py("Q5_K");
}

#[test]
fn q6_k_dequantize_matches_gguf_py() {
    assert_k_quant_dequantizes_like_gguf_py("Q6_K");
}

#[test]
fn q2_k_dequantizes_like_gguf_py() {
    assert_k_quant_dequantizes_like_gguf_py("Q2_K");
}

#[test]
fn q3_k_dequantizes_like_gguf_py() {
    assert_k_quant_dequantizes_like_gguf_py("Q3_K");
}

#[test]
fn a_file_written_by_gguf_py_reads_back_identically() {
    let dir = common::fixtures().join("gguf");
    let file = GgufFile::open(dir.join("pywritten.gguf")).unwrap();
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("pywritten.json")).unwrap()).unwrap();
    assert_eq!(file.alignment(), 64);
    assert_eq!(common::dump_json(&file), expected);
}

/// A file exercising every value type, nested and empty arrays, a non-default alignment and
/// tensors of several types and ranks.
fn every_feature_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("roundtrip".into()))
        .set("general.alignment", Value::U32(128))
        .set("t.u8", Value::U8(250))
        .set("t.i8", Value::I8(-7))
        .set("t.u16", Value::U16(65535))
        .set("t.i16", Value::I16(-32768))
        .set("t.u32", Value::U32(u32::MAX))
        .set("t.i32", Value::I32(i32::MIN))
        .set("t.f32", Value::F32(-0.3))
        .set("t.bool", Value::Bool(true))
        .set("t.string", Value::String("naïve 日本 🚀".into()))
        .set("t.empty_string", Value::String(String::new()))
        .set("t.u64", Value::U64(u64::MAX))
        .set("t.i64", Value::I64(i64::MIN))
        .set("t.f64", Value::F64(1e-300))
        .set("t.arr_u8", Value::Array(Array::U8(vec![0, 255])))
        .set("t.arr_i8", Value::Array(Array::I8(vec![-128, 127])))
        .set("t.arr_u16", Value::Array(Array::U16(vec![1, 65535])))
        .set("t.arr_u32", Value::Array(Array::U32(vec![])))
        .set("t.arr_i64", Value::Array(Array::I64(vec![-1, i64::MAX])))
        .set("t.arr_f32", Value::Array(Array::F32(vec![1.5, -0.0, 3.25e-5])))
        .set("t.arr_bool", Value::Array(Array::Bool(vec![false, true])))
        .set(
            "t.arr_str",
            Value::Array(Array::String(vec!["a".into(), "".into(), "ü".into()])),
        )
        .set(
            "t.nested",
            Value::Array(Array::Array(vec![
                Array::U32(vec![1, 2]),
                Array::U32(vec![]),
                Array::U32(vec![u32::MAX]),
            ])),
        )
        .set(
            "t.nested_str",
            Value::Array(Array::Array(vec![
                Array::String(vec!["x".into()]),
                Array::String(vec!["y".into(), "z".into()]),
            ])),
        );
    // One tensor of every weight type minfer computes with (the weight rows of its type table),
    // of ranks 1 to 4 in turn, and an F32 tensor of an odd length. (The activation-only Q8_1
    // is left out: gguf-py sizes its blocks as ggml's old f32 `d` and `s`, 40 bytes, where
    // ggml's and ours are 36.)
    let value = |i: u64| ((i * 37 % 101) as f32 - 50.0) * 0.031;
    let mut tensors = vec![("odd.f32".to_string(), GgmlType::F32, vec![5u64])];
    for (i, row) in minfer::quant::traits::computable().enumerate() {
        let b = row.block_size as u64;
        let shape = [vec![b], vec![b, 2], vec![b, 2, 3], vec![b, 3, 2, 1]][i % 4].clone();
        tensors.push((format!("t{i}.{}", row.ty.name().to_lowercase()), row.ty, shape));
    }
    for (name, ty, shape) in tensors {
        let n: u64 = shape.iter().product();
        let values: Vec<f32> = (0..n).map(value).collect();
        let data = common::weight_bytes(ty, &values);
        w.add_tensor(&name, ty, &shape, data).unwrap();
    }
    w
}

#[test]
fn a_file_written_by_us_reads_the_same_in_gguf_py_and_in_our_reader() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("roundtrip.gguf");
    let writer = every_feature_writer();
    writer.write_file(&path).unwrap();

    let ours = GgufFile::open(&path).unwrap();
    assert_eq!(
        ours.metadata(),
        writer.metadata(),
        "our reader reads back what we wrote"
    );
    assert_eq!(ours.alignment(), 128);
    for t in ours.tensors() {
        assert_eq!(t.offset % 128, 0, "{} is aligned", t.name);
    }

    let output = std::process::Command::new(common::python())
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/gguf_dump.py"))
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "gguf_dump.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let theirs: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(common::dump_json(&ours), theirs);
}

/// gguf-py cannot quantize Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4, TQ1_0 or TQ2_0: their bytes come from
/// llama.cpp 0c1e570 itself (`ggml_quantize_chunk` without an importance matrix, what
/// llama-quantize calls: `quantize_row_q{2,3}_K_ref`, `quantize_iq4_{nl,xs}` with their search
/// over 15 scales, `quantize_row_mxfp4_ref`) on the common input,
/// `tests/fixtures/quant/<T>.llama-quant.bin`.
fn assert_quantizes_to_llama_cpps_bytes(ty: GgmlType) {
    // The input every type shares (`<T>.input.f32` are one file).
    let input = common::read_f32(&quant_fixture("Q4_0.input.f32"));
    let expected = std::fs::read(quant_fixture(&format!("{ty}.llama-quant.bin"))).unwrap();
    let mut ours = vec![0u8; expected.len()];
    minfer::quant::quantize_row(ty, &input, &mut ours).unwrap();
    assert_same_blocks(&format!("{ty}"), ty.type_size(), &ours, &expected);
}

/// `ours` and `expected` hold the same blocks of `block` bytes; else the first that differs.
fn assert_same_blocks(what: &str, block: usize, ours: &[u8], expected: &[u8]) {
    assert_eq!(ours.len(), expected.len(), "{what}: lengths");
    if let Some(b) = (0..expected.len() / block).find(|&b| ours[b * block..][..block] != expected[b * block..][..block])
    {
        panic!(
            "{what}: block {b} differs: ours {:?}, llama.cpp {:?}",
            &ours[b * block..][..block],
            &expected[b * block..][..block]
        );
    }
}

#[test]
fn q2_k_quantizes_to_llama_cpps_bytes() {
    assert_quantizes_to_llama_cpps_bytes(GgmlType::Q2_K);
}

#[test]
fn q3_k_quantizes_to_llama_cpps_bytes() {
    assert_quantizes_to_llama_cpps_bytes(GgmlType::Q3_K);
}

#[test]
fn iq4_nl_dequantizes_like_gguf_py() {
    assert_k_quant_dequantizes_like_gguf_py("IQ4_NL");
}

#[test]
fn iq4_xs_dequantizes_like_gguf_py() {
    assert_k_quant_dequantizes_like_gguf_py("IQ4_XS");
}

#[test]
fn mxfp4_dequantizes_like_gguf_py() {
    assert_k_quant_dequantizes_like_gguf_py("MXFP4");
}

#[test]
fn iq4_nl_quantizes_to_llama_cpps_bytes() {
    assert_quantizes_to_llama_cpps_bytes(GgmlType::IQ4_NL);
}

#[test]
fn iq4_xs_quantizes_to_llama_cpps_bytes() {
    assert_quantizes_to_llama_cpps_bytes(GgmlType::IQ4_XS);
}

#[test]
fn mxfp4_quantizes_to_llama_cpps_bytes() {
    assert_quantizes_to_llama_cpps_bytes(GgmlType::MXFP4);
}

#[test]
fn iq2_xxs_dequantizes_like_gguf_py() {
    assert_k_quant_dequantizes_like_gguf_py("IQ2_XXS");
}

#[test]
fn iq2_xs_dequantizes_like_gguf_py() {
    assert_k_quant_dequantizes_like_gguf_py("IQ2_XS");
}

#[test]
fn iq2_s_dequantizes_like_gguf_py() {
    assert_k_quant_dequantizes_like_gguf_py("IQ2_S");
}

#[test]
fn iq3_xxs_dequantizes_like_gguf_py() {
    assert_k_quant_dequantizes_like_gguf_py("IQ3_XXS");
}

#[test]
fn iq3_s_dequantizes_like_gguf_py() {
    assert_k_quant_dequantizes_like_gguf_py("IQ3_S");
}

#[test]
fn iq1_s_dequantizes_like_gguf_py() {
    assert_k_quant_dequantizes_like_gguf_py("IQ1_S");
}

#[test]
fn iq1_m_dequantizes_like_gguf_py() {
    assert_k_quant_dequantizes_like_gguf_py("IQ1_M");
}

#[test]
fn tq1_0_dequantizes_like_gguf_py() {
    assert_k_quant_dequantizes_like_gguf_py("TQ1_0");
}

#[test]
fn tq2_0_dequantizes_like_gguf_py() {
    assert_k_quant_dequantizes_like_gguf_py("TQ2_0");
}

#[test]
fn tq1_0_quantizes_to_llama_cpps_bytes() {
    assert_quantizes_to_llama_cpps_bytes(GgmlType::TQ1_0);
}

#[test]
fn tq2_0_quantizes_to_llama_cpps_bytes() {
    assert_quantizes_to_llama_cpps_bytes(GgmlType::TQ2_0);
}

/// The common input quantized row by row with the importance matrix
/// `tests/fixtures/quant/imatrix-256.f32` (256 weights: numpy `default_rng(4401).exponential(1.0,
/// 256) + 0.01` as f32) gives llama.cpp 0c1e570's bytes (`ggml_quantize_chunk` with
/// `quant_weights`, what llama-quantize calls with `--imatrix`), `<T>.llama-quant-imatrix.bin`;
/// the types whose ggml quantizer ignores the matrix give their reference bytes.
fn assert_quantizes_with_an_imatrix_to_llama_cpps_bytes(ty: GgmlType) {
    let input = common::read_f32(&quant_fixture("Q4_0.input.f32"));
    let imatrix = common::read_f32(&quant_fixture("imatrix-256.f32"));
    let file = match ty {
        // gguf-py's Q8_0 bytes, which are llama.cpp's.
        GgmlType::Q8_0 => "Q8_0.quant.bin".to_string(),
        GgmlType::TQ1_0 | GgmlType::TQ2_0 | GgmlType::MXFP4 => format!("{ty}.llama-quant.bin"),
        _ => format!("{ty}.llama-quant-imatrix.bin"),
    };
    let expected = std::fs::read(quant_fixture(&file)).unwrap();
    let row_bytes = expected.len() / 64;
    let mut ours = vec![0u8; expected.len()];
    for (x, out) in input.chunks_exact(256).zip(ours.chunks_exact_mut(row_bytes)) {
        minfer::quant::quantize_row_imatrix(ty, x, &imatrix, out).unwrap();
    }
    assert_same_blocks(&format!("{ty} with an imatrix"), ty.type_size(), &ours, &expected);
}

#[test]
fn every_writable_type_quantizes_with_an_importance_matrix_to_llama_cpps_bytes() {
    use GgmlType::*;
    for ty in [
        Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4,
    ] {
        assert_quantizes_with_an_imatrix_to_llama_cpps_bytes(ty);
    }
}

#[test]
fn an_importance_matrix_of_another_length_is_refused_naming_both() {
    let err = minfer::quant::quantize_row_imatrix(GgmlType::Q4_K, &[0.0; 256], &[1.0; 255], &mut [0; 144]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "quantize Q4_K: 256 values need 256 importance weights, the matrix has 255"
    );
}
