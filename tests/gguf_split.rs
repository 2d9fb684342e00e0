//! Split models: parts named `name-0000N-of-0000M.gguf`, merged into one tensor index whichever
//! part is opened; inconsistent sets of parts are refused with the part and the reason.

use minfer::gguf::split::split_path;
use minfer::gguf::{GgufError, GgufFile, GgufWriter, Value};
use minfer::quant::GgmlType;
use std::path::Path;

/// Write a model split in three parts; part `i` holds tensors `t{i}a` and `t{i}b`, whose bytes
/// are all `i + 1` (so a data mix-up shows).
fn write_split(dir: &Path, prefix: &str, tweak: impl Fn(usize, &mut GgufWriter)) -> String {
    let prefix = dir.join(prefix).to_str().unwrap().to_string();
    for i in 0..3u16 {
        let mut w = GgufWriter::new();
        if i == 0 {
            w.set("general.architecture", Value::String("qwen2".into()));
        }
        w.set("split.no", Value::U16(i))
            .set("split.count", Value::U16(3))
            .set("split.tensors.count", Value::I32(6));
        for suffix in ["a", "b"] {
            w.add_tensor(&format!("t{i}{suffix}"), GgmlType::F32, &[4], vec![i as u8 + 1; 16])
                .unwrap();
        }
        tweak(i as usize, &mut w);
        w.write_file(Path::new(&split_path(&prefix, i as u32, 3))).unwrap();
    }
    prefix
}

#[test]
fn a_split_model_opens_from_any_part_as_one_tensor_index() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = write_split(dir.path(), "model", |_, _| {});
    for no in 0..3 {
        let file = GgufFile::open(split_path(&prefix, no, 3)).unwrap();
        assert_eq!(
            file.metadata().get_str("general.architecture").unwrap(),
            "qwen2",
            "metadata of the first part"
        );
        let names: Vec<&str> = file.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["t0a", "t0b", "t1a", "t1b", "t2a", "t2b"]);
        for (i, t) in file.tensors().iter().enumerate() {
            assert_eq!(t.part, i / 2);
            assert_eq!(file.tensor_data(t), &[(i / 2) as u8 + 1; 16], "{}", t.name);
        }
        assert_eq!(file.paths().count(), 3);
    }
}

#[test]
fn a_missing_part_is_refused_naming_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = write_split(dir.path(), "model", |_, _| {});
    std::fs::remove_file(split_path(&prefix, 2, 3)).unwrap();
    let err = GgufFile::open(split_path(&prefix, 0, 3)).err().unwrap();
    assert!(
        matches!(err, GgufError::Io { ref path, .. } if path.ends_with("model-00003-of-00003.gguf")),
        "{err}"
    );
}

#[test]
fn a_part_with_the_wrong_split_number_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = write_split(dir.path(), "model", |i, w| {
        if i == 1 {
            w.set("split.no", Value::U16(2));
        }
    });
    let err = GgufFile::open(split_path(&prefix, 0, 3)).err().unwrap();
    assert!(
        err.to_string()
            .contains("expected part 1 of 3, the file says split.no = 2"),
        "{err}"
    );
}

#[test]
fn a_tensor_in_two_parts_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = write_split(dir.path(), "model", |i, w| {
        if i == 2 {
            w.add_tensor("t0a", GgmlType::F32, &[4], vec![0; 16]).unwrap();
        }
    });
    let err = GgufFile::open(split_path(&prefix, 0, 3)).err().unwrap();
    assert!(
        matches!(err, GgufError::DuplicateTensor { ref name, ref location } if name == "t0a" && location.contains("parts 1 and 3")),
        "{err}"
    );
}

#[test]
fn a_wrong_total_tensor_count_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = write_split(dir.path(), "model", |i, w| {
        if i == 0 {
            w.set("split.tensors.count", Value::I32(7));
        }
    });
    let err = GgufFile::open(split_path(&prefix, 0, 3)).err().unwrap();
    assert!(
        err.to_string()
            .contains("split.tensors.count = 7, the parts hold 6 tensors"),
        "{err}"
    );
}

#[test]
fn a_split_file_without_the_split_naming_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = write_split(dir.path(), "model", |_, _| {});
    let renamed = dir.path().join("renamed.gguf");
    std::fs::rename(split_path(&prefix, 0, 3), &renamed).unwrap();
    let err = GgufFile::open(&renamed).err().unwrap();
    assert!(
        err.to_string().contains("does not end in -NNNNN-of-NNNNN.gguf"),
        "{err}"
    );
}
