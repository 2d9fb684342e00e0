//! Our reference quantizers against llama-quantize's own output: quantizing the F32 tiny
//! models' tensors must reproduce the bytes of the files llama.cpp quantized from them
//! (`--pure`, no importance matrix, so llama.cpp used its `quantize_row_*_ref` functions).

mod common;

use minfer::gguf::GgufFile;
use minfer::quant::{dequantize_row, quantize_row, GgmlType};

fn assert_quantizer_reproduces_llama_quantize(arch: &str, ty: &str) {
    let original = GgufFile::open(common::tiny_model(arch, "F32")).unwrap();
    let quantized = GgufFile::open(common::tiny_model(arch, ty)).unwrap();
    let ggml_type = GgmlType::from_name(ty).unwrap();
    let mut checked = 0;
    for q in quantized.tensors() {
        if q.ggml_type == GgmlType::F32 {
            continue;
        }
        assert_eq!(
            q.ggml_type, ggml_type,
            "{}: --pure leaves every 2-D tensor in {ty}",
            q.name
        );
        let f = original.tensor(&q.name).unwrap();
        assert_eq!(f.shape, q.shape, "{}", q.name);
        let mut values = vec![0f32; f.n_elements() as usize];
        dequantize_row(GgmlType::F32, original.tensor_data(f), &mut values).unwrap();

        let expected = quantized.tensor_data(q);
        let mut ours = vec![0u8; expected.len()];
        quantize_row(ggml_type, &values, &mut ours).unwrap();

        let block = ggml_type.type_size();
        let bad: Vec<usize> = (0..expected.len() / block)
            .filter(|&b| ours[b * block..(b + 1) * block] != expected[b * block..(b + 1) * block])
            .collect();
        assert!(
            bad.is_empty(),
            "{arch} {ty} {}: {} of {} blocks differ from llama-quantize, first at block {}",
            q.name,
            bad.len(),
            expected.len() / block,
            bad[0]
        );
        checked += 1;
    }
    assert!(checked >= 8, "{arch} {ty}: only {checked} quantized tensors checked");
}

macro_rules! llama_quantize_tests {
    ($($name:ident: $arch:literal, $ty:literal;)*) => {
        $(
            #[test]
            fn $name() {
                assert_quantizer_reproduces_llama_quantize($arch, $ty);
            }
        )*
    };
}

llama_quantize_tests! {
    qwen2_f16_tensors_match_llama_quantize_byte_for_byte: "qwen2", "F16";
    qwen2_bf16_tensors_match_llama_quantize_byte_for_byte: "qwen2", "BF16";
    qwen2_q4_0_tensors_match_llama_quantize_byte_for_byte: "qwen2", "Q4_0";
    qwen2_q4_1_tensors_match_llama_quantize_byte_for_byte: "qwen2", "Q4_1";
    qwen2_q5_0_tensors_match_llama_quantize_byte_for_byte: "qwen2", "Q5_0";
    qwen2_q5_1_tensors_match_llama_quantize_byte_for_byte: "qwen2", "Q5_1";
    qwen2_q8_0_tensors_match_llama_quantize_byte_for_byte: "qwen2", "Q8_0";
    qwen2_q4_k_tensors_match_llama_quantize_byte_for_byte: "qwen2", "Q4_K";
    qwen2_q5_k_tensors_match_llama_quantize_byte_for_byte: "qwen2", "Q5_K";
    qwen2_q6_k_tensors_match_llama_quantize_byte_for_byte: "qwen2", "Q6_K";
    qwen2_q2_k_tensors_match_llama_quantize_byte_for_byte: "qwen2", "Q2_K";
    qwen2_q3_k_tensors_match_llama_quantize_byte_for_byte: "qwen2", "Q3_K";
    qwen2_iq4_nl_tensors_match_llama_quantize_byte_for_byte: "qwen2", "IQ4_NL";
    qwen2_iq4_xs_tensors_match_llama_quantize_byte_for_byte: "qwen2", "IQ4_XS";
    qwen3_f16_tensors_match_llama_quantize_byte_for_byte: "qwen3", "F16";
    qwen3_bf16_tensors_match_llama_quantize_byte_for_byte: "qwen3", "BF16";
    qwen3_q4_0_tensors_match_llama_quantize_byte_for_byte: "qwen3", "Q4_0";
    qwen3_q4_1_tensors_match_llama_quantize_byte_for_byte: "qwen3", "Q4_1";
    qwen3_q5_0_tensors_match_llama_quantize_byte_for_byte: "qwen3", "Q5_0";
    qwen3_q5_1_tensors_match_llama_quantize_byte_for_byte: "qwen3", "Q5_1";
    qwen3_q8_0_tensors_match_llama_quantize_byte_for_byte: "qwen3", "Q8_0";
    qwen3_q4_k_tensors_match_llama_quantize_byte_for_byte: "qwen3", "Q4_K";
    qwen3_q5_k_tensors_match_llama_quantize_byte_for_byte: "qwen3", "Q5_K";
    qwen3_q6_k_tensors_match_llama_quantize_byte_for_byte: "qwen3", "Q6_K";
}

/// `minfer quantize F32 OUT TYPE --pure` writes the file llama-quantize wrote: every tensor
/// with its type and bytes, and `general.file_type`.
#[test]
fn the_quantize_command_writes_llama_quantizes_files() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, ty) in [
        ("qwen2", "Q4_0"),
        ("qwen2", "Q5_1"),
        ("qwen2", "Q4_K"),
        ("qwen3", "Q6_K"),
        ("qwen3", "Q8_0"),
    ] {
        let out = dir.path().join(format!("{arch}-{ty}.gguf"));
        let run = std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
            .arg("quantize")
            .arg(common::tiny_model(arch, "F32"))
            .arg(&out)
            .args([ty, "--pure", "-t", "2"])
            .output()
            .unwrap();
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        let ours = GgufFile::open(&out).unwrap();
        let theirs = GgufFile::open(common::tiny_model(arch, ty)).unwrap();
        assert_eq!(
            ours.metadata().get_uint("general.file_type").unwrap(),
            theirs.metadata().get_uint("general.file_type").unwrap(),
            "{arch} {ty}"
        );
        assert_eq!(ours.tensors().len(), theirs.tensors().len());
        for t in theirs.tensors() {
            let o = ours.tensor(&t.name).unwrap();
            assert_eq!(
                (o.ggml_type, &o.shape),
                (t.ggml_type, &t.shape),
                "{arch} {ty} {}",
                t.name
            );
            assert!(
                ours.tensor_data(o) == theirs.tensor_data(t),
                "{arch} {ty} {}: bytes differ",
                t.name
            );
        }
    }
    let refused = |args: &[&str], says: &str| {
        let run = std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
            .arg("quantize")
            .arg(common::tiny_model("qwen2", "F32"))
            .arg(dir.path().join("x.gguf"))
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success() && err.contains(says), "{args:?}: {err}");
    };
    refused(&["Q2_K_S"], "Q2_K_S needs an importance matrix (--imatrix FILE");
    refused(
        &["IQ3_S"],
        "IQ3_S yet (the grid searches of its i-quants (IQ1, IQ2, IQ3) are not written yet",
    );
    refused(
        &["MXFP4_MOE"],
        "MXFP4_MOE yet (no quantizer for its types, or no rules for the mix",
    );
    refused(&["Q7_K"], "cannot quantize to Q7_K: the types are");
}

/// `quantize` and `merge` once wrote through `OUT.tmp`, following a link planted there: another
/// user of the directory could make them overwrite any file the caller may write.
#[cfg(unix)]
#[test]
fn quantize_and_merge_never_write_through_a_link_planted_at_a_temporary_name() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"not yours to overwrite").unwrap();
    let plant = |out: &std::path::Path| {
        let mut temp = out.as_os_str().to_owned();
        temp.push(".tmp");
        std::os::unix::fs::symlink(&victim, &temp).unwrap();
    };
    let minfer = |args: &[&std::ffi::OsStr]| {
        let run = std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
            .args(args)
            .output()
            .unwrap();
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    };

    let quantized = dir.path().join("q.gguf");
    plant(&quantized);
    let f32_model = common::tiny_model("qwen2", "F32");
    minfer(&[
        "quantize".as_ref(),
        f32_model.as_os_str(),
        quantized.as_os_str(),
        "Q8_0".as_ref(),
        "--pure".as_ref(),
        "-t".as_ref(),
        "2".as_ref(),
    ]);
    assert_eq!(std::fs::read(&victim).unwrap(), b"not yours to overwrite");
    assert!(!std::fs::symlink_metadata(&quantized).unwrap().is_symlink());
    let ours = GgufFile::open(&quantized).unwrap();
    let theirs = GgufFile::open(common::tiny_model("qwen2", "Q8_0")).unwrap();
    for t in theirs.tensors() {
        assert!(
            ours.tensor_data(ours.tensor(&t.name).unwrap()) == theirs.tensor_data(t),
            "{}",
            t.name
        );
    }

    let original = common::tiny_model("qwen2", "Q4_0");
    let prefix = dir.path().join("part");
    let parts = minfer::gguf::split::split_file(
        &GgufFile::open(&original).unwrap(),
        prefix.to_str().unwrap(),
        minfer::gguf::split::SplitLimit::MaxTensors(10),
        false,
    )
    .unwrap();
    let merged = dir.path().join("merged.gguf");
    plant(&merged);
    minfer(&["merge".as_ref(), parts[0].path.as_os_str(), merged.as_os_str()]);
    assert_eq!(std::fs::read(&victim).unwrap(), b"not yours to overwrite");
    assert!(
        std::fs::read(&merged).unwrap() == std::fs::read(&original).unwrap(),
        "the merged file is not the original"
    );
}
