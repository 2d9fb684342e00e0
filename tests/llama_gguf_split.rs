//! `split` and `merge` against llama.cpp's llama-gguf-split: our parts hash as its parts did
//! for the same input and flags (`tests/fixtures/quantize/llama-gguf-split.sha256`), open in
//! our reader as the original model, and merge back into the original file byte for byte.

mod common;

use minfer::gguf::split::{merge_file, split_file, split_path, SplitLimit};
use minfer::gguf::GgufFile;
use std::path::{Path, PathBuf};

/// The llama-gguf-split runs the manifest records: the part prefix, the input and the flags.
const CASES: [(&str, &str, &str, SplitLimit, bool); 4] = [
    ("q2-t10", "qwen2", "F32", SplitLimit::MaxTensors(10), false),
    ("q2-s5M", "qwen2", "F32", SplitLimit::MaxBytes(5_000_000), false),
    ("q3-s1M", "qwen3", "Q8_0", SplitLimit::MaxBytes(1_000_000), false),
    ("q3-t8-nf", "qwen3", "Q4_K", SplitLimit::MaxTensors(8), true),
];

fn sha256(path: &Path) -> String {
    common::sha256_hex(&std::fs::read(path).unwrap())
}

fn file_name(path: &Path) -> String {
    path.file_name().unwrap().to_str().unwrap().to_string()
}

#[test]
fn our_parts_are_llama_gguf_splits_byte_for_byte() {
    let expected = common::sha256_manifest("llama-gguf-split.sha256");
    let dir = tempfile::tempdir().unwrap();
    for (prefix, arch, ty, limit, no_first) in CASES {
        let input = GgufFile::open(common::tiny_model(arch, ty)).unwrap();
        let out_prefix = dir.path().join(prefix);
        let parts = split_file(&input, out_prefix.to_str().unwrap(), limit, no_first).unwrap();
        let names: Vec<String> = parts.iter().map(|p| file_name(&p.path)).collect();
        let mut theirs: Vec<&String> = expected
            .keys()
            .filter(|k| k.starts_with(&format!("{prefix}-")))
            .collect();
        theirs.sort();
        assert_eq!(names.iter().collect::<Vec<_>>(), theirs, "{prefix}: part names");
        for p in &parts {
            assert_eq!(sha256(&p.path), expected[&file_name(&p.path)], "{}", p.path.display());
        }
    }
}

#[test]
fn split_parts_read_as_the_original_model_and_merge_back_into_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    for (prefix, arch, ty, limit, no_first) in CASES {
        let original_path = common::tiny_model(arch, ty);
        let original = GgufFile::open(&original_path).unwrap();
        let out_prefix = dir.path().join(prefix);
        let parts = split_file(&original, out_prefix.to_str().unwrap(), limit, no_first).unwrap();
        assert!(parts.len() > 1, "{prefix}: one part");

        let reread = GgufFile::open(&parts.last().unwrap().path).unwrap();
        assert_eq!(reread.tensors().len(), original.tensors().len(), "{prefix}");
        for t in original.tensors() {
            let r = reread.tensor(&t.name).unwrap();
            assert_eq!((r.ggml_type, &r.shape), (t.ggml_type, &t.shape), "{prefix} {}", t.name);
            assert!(reread.tensor_data(r) == original.tensor_data(t), "{prefix} {}", t.name);
        }

        let merged = dir.path().join(format!("{prefix}-merged.gguf"));
        assert_eq!(merge_file(&parts[0].path, &merged).unwrap(), parts.len());
        assert!(
            std::fs::read(&merged).unwrap() == std::fs::read(&original_path).unwrap(),
            "{prefix}: the merged file is not the original"
        );
        let again = merge_file(&parts[0].path, &merged).unwrap_err().to_string();
        assert!(again.contains("already exists"), "{again}");
        // Splitting the split model again under its own prefix would write over what it reads.
        let bytes = std::fs::read(&parts[0].path).unwrap();
        let resplit = split_file(&reread, out_prefix.to_str().unwrap(), limit, no_first).unwrap_err();
        assert!(
            resplit.to_string().contains("would overwrite a file of the input"),
            "{resplit}"
        );
        assert!(
            std::fs::read(&parts[0].path).unwrap() == bytes,
            "{prefix}: a part was touched"
        );
    }
}

#[test]
fn the_split_and_merge_commands_round_trip_and_refuse_bad_limits() {
    let dir = tempfile::tempdir().unwrap();
    let original = common::tiny_model("qwen2", "F32");
    let prefix = dir.path().join("model");
    let minfer = |args: &[&std::ffi::OsStr]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
            .args(args)
            .output()
            .unwrap()
    };
    let run = minfer(&[
        "split".as_ref(),
        original.as_os_str(),
        prefix.as_os_str(),
        "--split-max-size".as_ref(),
        "5M".as_ref(),
    ]);
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{log}");
    assert!(log.contains("3 parts, 27 tensors"), "{log}");
    let first = PathBuf::from(split_path(prefix.to_str().unwrap(), 0, 3));
    assert_eq!(
        sha256(&first),
        common::sha256_manifest("llama-gguf-split.sha256")["q2-s5M-00001-of-00003.gguf"]
    );

    let merged = dir.path().join("merged.gguf");
    let run = minfer(&["merge".as_ref(), first.as_os_str(), merged.as_os_str()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(std::fs::read(&merged).unwrap() == std::fs::read(&original).unwrap());

    for (flag, value, says) in [
        ("--split-max-size", "5K", "--split-max-size 5K"),
        ("--split-max-size", "0M", "--split-max-size 0M"),
        ("--split-max-tensors", "0", "the limit must be positive"),
        ("--split-max-size", "1M", "would hold no tensor"),
    ] {
        let run = minfer(&[
            "split".as_ref(),
            original.as_os_str(),
            dir.path().join("bad").as_os_str(),
            flag.as_ref(),
            value.as_ref(),
        ]);
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success() && err.contains(says), "{flag} {value}: {err}");
    }
    let run = minfer(&[
        "merge".as_ref(),
        original.as_os_str(),
        dir.path().join("m.gguf").as_os_str(),
    ]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success() && err.contains("not a split model"), "{err}");
}
