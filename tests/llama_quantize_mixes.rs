//! llama-quantize's mixes (Q4_K_M, Q5_K_S, …, and the plain types' own rules): our files
//! against the sha256 of llama-quantize's for the tiny models (from F32 and from F16), and our
//! per-tensor rules against llama-quantize's choices for the real Qwen2.5-Coder shapes
//! (`tests/fixtures/quantize/`, made as its README says).

mod common;

use minfer::gguf::GgufFile;
use minfer::quant::GgmlType;
use minfer::quantize::{plan, quantize_file, FileType, Imatrix, ModelFacts, QuantizeOptions, TensorMeta};
use std::collections::HashMap;
use std::path::Path;

fn sha256(path: &Path) -> String {
    common::sha256_hex(&std::fs::read(path).unwrap())
}

const MIXES: [&str; 20] = [
    "Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16", "BF16", "Q2_K",
    "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0",
];

/// With llama-imatrix's matrix (`tests/fixtures/imatrix/`), every file type from the tiny
/// qwen2 F32 model hashes as llama-quantize's `--imatrix` output did: the weighted quantizers of
/// every type, the entries found by name, and the four `quantize.imatrix.*` keys it adds (its
/// path as given, relative to the repository as the test runs).
#[test]
fn mixes_with_an_importance_matrix_match_llama_quantize() {
    let expected = common::sha256_manifest("llama-quantize-imatrix.sha256");
    let imatrix = Imatrix::load(Path::new("tests/fixtures/imatrix/tiny-qwen2.imatrix.gguf")).unwrap();
    let input = GgufFile::open(common::tiny_model("qwen2", "F32")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut wrong = Vec::new();
    for mix in [
        "Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16", "Q2_K",
        "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_NL", "IQ4_XS",
    ] {
        let name = format!("qwen2-F32-{mix}-imatrix.gguf");
        let out = dir.path().join(&name);
        let options = QuantizeOptions {
            ftype: FileType::from_name(mix).unwrap(),
            pure: false,
            n_threads: 2,
            imatrix: Some(&imatrix),
        };
        quantize_file(&input, &out, options, |_| Ok(())).unwrap();
        if sha256(&out) != expected[&name] {
            wrong.push(name);
        }
    }
    assert!(wrong.is_empty(), "differ from llama-quantize --imatrix: {wrong:?}");
}

#[test]
fn q2_k_s_without_an_importance_matrix_is_refused_as_llama_quantize_refuses_it() {
    let input = GgufFile::open(common::tiny_model("qwen2", "F32")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let options = QuantizeOptions {
        ftype: FileType::Q2_K_S,
        pure: false,
        n_threads: 2,
        imatrix: None,
    };
    let err = quantize_file(&input, &dir.path().join("out.gguf"), options, |_| Ok(())).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Q2_K_S needs an importance matrix (--imatrix FILE; `minfer imatrix` computes one)"
    );
}

#[test]
fn an_importance_matrix_entry_of_the_wrong_size_is_refused_naming_the_tensor() {
    // The tiny qwen3 model's rows are as long as qwen2's, but a one-entry legacy matrix for its
    // query weights with 255 columns is not.
    let dir = tempfile::tempdir().unwrap();
    let dat = dir.path().join("bad.dat");
    let mut b = 1i32.to_le_bytes().to_vec();
    let name = b"blk.0.attn_q.weight";
    b.extend((name.len() as i32).to_le_bytes());
    b.extend(name);
    b.extend(1i32.to_le_bytes());
    b.extend(255i32.to_le_bytes());
    b.extend(std::iter::repeat_n(1.0f32.to_le_bytes(), 255).flatten());
    std::fs::write(&dat, b).unwrap();
    let imatrix = Imatrix::load(&dat).unwrap();
    let input = GgufFile::open(common::tiny_model("qwen3", "F32")).unwrap();
    let options = QuantizeOptions {
        ftype: FileType::Q4_K_M,
        pure: false,
        n_threads: 2,
        imatrix: Some(&imatrix),
    };
    let err = quantize_file(&input, &dir.path().join("out.gguf"), options, |_| Ok(())).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor 'blk.0.attn_q.weight': the importance matrix has 255 weights for it, its rows need 256"
    );
}

/// Every file type from `source` (F32 or F16) of the tiny `arch` model hashes as
/// llama-quantize's output did.
fn assert_mixes_match_llama_quantize(arch: &str, source: &str) {
    let expected = common::sha256_manifest("llama-quantize.sha256");
    let input = GgufFile::open(common::tiny_model(arch, source)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut wrong = Vec::new();
    for mix in MIXES {
        let name = format!("{arch}-{source}-{mix}.gguf");
        let out = dir.path().join(&name);
        let options = QuantizeOptions {
            ftype: FileType::from_name(mix).unwrap(),
            pure: false,
            n_threads: 2,
            imatrix: None,
        };
        quantize_file(&input, &out, options, |_| Ok(())).unwrap();
        if sha256(&out) != expected[&name] {
            wrong.push(name);
        }
    }
    assert!(wrong.is_empty(), "differ from llama-quantize's files: {wrong:?}");
}

#[test]
fn every_mix_of_the_tiny_qwen2_from_f32_is_llama_quantizes_file_byte_for_byte() {
    assert_mixes_match_llama_quantize("qwen2", "F32");
}

#[test]
fn every_mix_of_the_tiny_qwen2_from_f16_is_llama_quantizes_file_byte_for_byte() {
    assert_mixes_match_llama_quantize("qwen2", "F16");
}

#[test]
fn every_mix_of_the_tiny_mixtures_of_experts_is_llama_quantizes_file_byte_for_byte() {
    // The 3-D expert tensors quantized expert by expert, the routers kept in F32, and the
    // mixes' expert rules (ffn_down_exps of an 8-expert model) as llama-quantize applies them.
    for arch in ["qwen3moe", "qwen2moe", "mixtral"] {
        assert_mixes_match_llama_quantize(arch, "F32");
    }
}

#[test]
fn every_mix_of_the_tiny_qwen3_from_f32_is_llama_quantizes_file_byte_for_byte() {
    assert_mixes_match_llama_quantize("qwen3", "F32");
}

#[test]
fn every_mix_of_the_tiny_qwen3_from_f16_is_llama_quantizes_file_byte_for_byte() {
    assert_mixes_match_llama_quantize("qwen3", "F16");
}

/// The F16 inputs above are llama-quantize's own F16 files: quantizing the F32 model to F16
/// gives the fixture back.
#[test]
fn the_f16_fixtures_are_what_quantizing_the_f32_models_to_f16_writes() {
    let expected = common::sha256_manifest("llama-quantize.sha256");
    for arch in ["qwen2", "qwen3"] {
        assert_eq!(
            sha256(&common::tiny_model(arch, "F16")),
            expected[&format!("{arch}-F32-F16.gguf")],
            "{arch}"
        );
    }
}

/// The `--pure` files of `tests/fixtures/models/` come back whole, header and all.
#[test]
fn the_pure_mode_writes_llama_quantizes_pure_files_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["qwen2", "qwen3"] {
        let input = GgufFile::open(common::tiny_model(arch, "F32")).unwrap();
        for ty in [
            "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
        ] {
            let out = dir.path().join(format!("{arch}-{ty}.gguf"));
            let options = QuantizeOptions {
                imatrix: None,
                ftype: FileType::from_name(ty).unwrap(),
                pure: true,
                n_threads: 2,
            };
            quantize_file(&input, &out, options, |_| Ok(())).unwrap();
            assert!(
                std::fs::read(&out).unwrap() == std::fs::read(common::tiny_model(arch, ty)).unwrap(),
                "{arch} {ty} --pure differs from llama-quantize's file"
            );
        }
    }
}

/// `minfer quantize IN OUT Q4_K_M` writes llama-quantize's file and a line per tensor, with
/// the rows that fell back; an unknown type is refused by name.
#[test]
fn the_quantize_command_writes_a_mix_and_reports_each_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q4_k_m.gguf");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg("quantize")
        .arg(common::tiny_model("qwen3", "F16"))
        .arg(&out)
        .args(["q4_k_m", "-t", "2"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{log}");
    assert_eq!(
        sha256(&out),
        common::sha256_manifest("llama-quantize.sha256")["qwen3-F16-Q4_K_M.gguf"]
    );
    let lines: Vec<&str> = log.lines().filter(|l| l.starts_with('[')).collect();
    let n = GgufFile::open(&out).unwrap().tensors().len();
    assert_eq!(lines.len(), n, "{log}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("blk.1.ffn_down.weight") && l.contains("-> Q6_K")),
        "{log}"
    );

    let run = std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg("quantize")
        .arg(common::tiny_model("qwen3", "F16"))
        .arg(dir.path().join("x.gguf"))
        .arg("IQ2_XS")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        !run.status.success() && err.contains("cannot quantize to IQ2_XS") && err.contains("Q4_K_M"),
        "{err}"
    );

    // Writing over the mapped input would truncate it under the reader.
    let input = dir.path().join("in.gguf");
    std::fs::copy(common::tiny_model("qwen3", "F16"), &input).unwrap();
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg("quantize")
        .arg(&input)
        .arg(&input)
        .arg("Q8_0")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success() && err.contains("is the input file"), "{err}");
    assert_eq!(sha256(&input), sha256(&common::tiny_model("qwen3", "F16")));
}

/// Our rules against llama-quantize's choices (`--dry-run` on the real files) for every file
/// type, over the real models' tensor names and shapes, and in its order.
fn assert_rules_match_llama_quantize(fixture: &str) {
    let text = std::fs::read_to_string(common::fixtures().join("quantize").join(fixture)).unwrap();
    let mut lines = text.lines();
    let facts_line = lines.next().unwrap().trim_start_matches("# ");
    let facts: HashMap<&str, &str> = facts_line.split(' ').filter_map(|kv| kv.split_once('=')).collect();
    let facts = ModelFacts {
        arch: facts["arch"].to_string(),
        n_layer: facts["block_count"].parse().unwrap(),
        n_expert: 0,
        n_gqa: facts["n_gqa"].parse().unwrap(),
        is_70b: false,
        has_imatrix: false,
    };
    let header: Vec<&str> = lines.next().unwrap().split('\t').collect();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split('\t').collect()).collect();
    let shapes: Vec<Vec<u64>> = rows
        .iter()
        .map(|r| r[1].split(',').map(|d| d.parse().unwrap()).collect())
        .collect();
    // Given in a scrambled order: the plan must find llama-quantize's order itself.
    let mut given: Vec<usize> = (0..rows.len()).collect();
    given.reverse();
    given.rotate_left(rows.len() / 3);
    let tensors: Vec<TensorMeta> = given
        .iter()
        .map(|&i| TensorMeta {
            name: rows[i][0],
            shape: &shapes[i],
            ggml_type: GgmlType::from_name(rows[i][2]).unwrap(),
        })
        .collect();
    assert!(rows.len() > 250, "{fixture}: {} tensors", rows.len());
    for (column, mix) in header.iter().enumerate().skip(3) {
        let ftype = FileType::from_name(mix).unwrap();
        let planned = plan(&tensors, &facts, ftype, false);
        let ours: Vec<(&str, &str)> = planned
            .iter()
            .map(|p| (tensors[p.index].name, p.ggml_type.name()))
            .collect();
        let theirs: Vec<(&str, &str)> = rows.iter().map(|r| (r[0], r[column])).collect();
        let differ: Vec<_> = ours.iter().zip(&theirs).filter(|(o, t)| o != t).collect();
        assert!(
            differ.is_empty(),
            "{fixture} {mix}: (ours, llama-quantize's): {differ:?}"
        );
    }
}

#[test]
fn the_rules_choose_llama_quantizes_types_for_qwen25_coder_0_5b() {
    assert_rules_match_llama_quantize("qwen2.5-coder-0.5b-types.tsv");
}

#[test]
fn the_rules_choose_llama_quantizes_types_for_qwen25_coder_1_5b() {
    assert_rules_match_llama_quantize("qwen2.5-coder-1.5b-types.tsv");
}
