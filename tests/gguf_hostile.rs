//! Hostile and malformed GGUF files: each failure class gives its own error, naming the
//! problem and the offset or key, without a panic.

use minfer::gguf::{parse_header, GgufError, GgufFile, GgufWriter, Value};
use minfer::quant::GgmlType;

/// Builds GGUF bytes by hand, so that tests can write what no writer would.
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.str(key).u32(4).u32(v)
    }
    fn tensor(&mut self, name: &str, shape: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(shape.len() as u32);
        for &d in shape {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pad to the default alignment and append `n` bytes of tensor data.
    fn data(&mut self, n: usize) -> &mut Self {
        let len = self.0.len().next_multiple_of(32);
        self.0.resize(len + n, 0);
        self
    }
    fn parse(&self) -> GgufError {
        parse_header(&self.0).expect_err("the file must be refused")
    }
}

fn valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("qwen2".into()));
    w.set(
        "tokenizer.ggml.tokens",
        Value::Array(minfer::gguf::Array::String(vec!["a".into(), "b".into()])),
    );
    w.add_tensor("t", GgmlType::F32, &[8, 2], vec![0; 64]).unwrap();
    w.to_bytes().unwrap()
}

#[test]
fn a_wrong_magic_is_refused_naming_the_bytes_found() {
    let mut bytes = valid_file();
    bytes[..4].copy_from_slice(b"GGML");
    let err = parse_header(&bytes).unwrap_err();
    assert!(
        matches!(err, GgufError::BadMagic { found } if &found == b"GGML"),
        "{err}"
    );
    assert!(err.to_string().contains("offset 0"), "{err}");
}

#[test]
fn an_unsupported_version_is_refused_naming_it() {
    for version in [0, 1, 4, 0xdead_beef] {
        let err = Raw::header(version, 0, 0).parse();
        assert!(
            matches!(err, GgufError::UnsupportedVersion { version: v } if v == version),
            "{err}"
        );
    }
}

#[test]
fn every_truncation_of_a_valid_file_is_refused_without_panicking() {
    let bytes = valid_file();
    assert!(parse_header(&bytes).is_ok());
    for len in 0..bytes.len() {
        let err = parse_header(&bytes[..len]).expect_err("a truncated file must be refused");
        assert!(
            matches!(
                err,
                GgufError::Truncated { .. } | GgufError::TensorOutOfBounds { .. } | GgufError::CountTooLarge { .. }
            ),
            "cut at {len}: {err}"
        );
    }
    let err = parse_header(&bytes[..10]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "file truncated: tensor count at offset 8 needs 8 bytes, 2 remain"
    );
}

#[test]
fn a_string_longer_than_the_file_is_refused_naming_its_key_and_offset() {
    let mut r = Raw::header(3, 0, 1);
    r.str("general.name").u32(8).u64(1 << 40);
    let err = r.parse();
    assert!(
        matches!(err, GgufError::Truncated { ref what, offset: 56, needed, .. } if what == "value of 'general.name'" && needed == 1 << 40),
        "{err}"
    );

    let mut r = Raw::header(3, 0, 1);
    r.u64(u64::MAX).u64(0).u64(0);
    let err = r.parse();
    assert!(
        matches!(err, GgufError::Truncated { ref what, .. } if what == "metadata key #0"),
        "{err}"
    );
}

#[test]
fn an_array_longer_than_the_file_is_refused_before_allocating() {
    let mut r = Raw::header(3, 0, 1);
    r.str("tokenizer.ggml.tokens").u32(9).u32(8).u64(u64::MAX / 4);
    let err = r.parse();
    assert!(
        matches!(err, GgufError::CountTooLarge { ref what, count, .. } if what == "array 'tokenizer.ggml.tokens'" && count == u64::MAX / 4),
        "{err}"
    );

    // count × element size overflowing u64 is caught too.
    let mut r = Raw::header(3, 0, 1);
    r.str("a").u32(9).u32(10).u64(u64::MAX);
    assert!(matches!(r.parse(), GgufError::CountTooLarge { .. }));
}

#[test]
fn arrays_nested_beyond_the_depth_limit_are_refused() {
    let mut r = Raw::header(3, 0, 1);
    r.str("deep");
    r.u32(9);
    for _ in 0..40 {
        r.u32(9).u64(1);
    }
    r.u32(4).u64(0);
    let err = r.parse();
    assert!(
        matches!(err, GgufError::NestingTooDeep { ref key, .. } if key == "deep"),
        "{err}"
    );
}

#[test]
fn absurd_tensor_and_key_counts_are_refused_before_allocating() {
    let err = Raw::header(3, u64::MAX, 0).parse();
    assert!(
        matches!(err, GgufError::CountTooLarge { ref what, count: u64::MAX, .. } if what == "tensor count"),
        "{err}"
    );
    let err = Raw::header(3, 0, 1 << 50).parse();
    assert!(
        matches!(err, GgufError::CountTooLarge { ref what, .. } if what == "metadata key/value count"),
        "{err}"
    );
}

#[test]
fn more_than_four_dimensions_are_refused() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[1, 1, 1, 1, 1], 0, 0).data(4);
    let err = r.parse();
    assert!(
        matches!(err, GgufError::TooManyDims { ref name, n_dims: 5, .. } if name == "t"),
        "{err}"
    );
}

#[test]
fn an_element_count_that_overflows_is_refused_naming_the_tensor() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("big", &[1 << 32, 1 << 32, 1 << 2], 0, 0).data(4);
    let err = r.parse();
    assert!(
        matches!(err, GgufError::ElementCountOverflow { ref name, .. } if name == "big"),
        "{err}"
    );

    // Fits in u64 but not in ggml's int64_t.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("big", &[1 << 32, 1 << 31], 0, 0).data(4);
    assert!(matches!(r.parse(), GgufError::ElementCountOverflow { .. }));

    // Element count fits, byte size does not.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("big", &[1 << 31, 1 << 31], 28, 0).data(4);
    assert!(matches!(r.parse(), GgufError::ElementCountOverflow { .. }));
}

#[test]
fn a_row_that_is_not_whole_blocks_is_refused() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("q", &[33, 1], GgmlType::Q4_0 as u32, 0).data(64);
    let err = r.parse();
    assert!(
        matches!(
            err,
            GgufError::PartialBlock {
                ne0: 33,
                ggml_type: GgmlType::Q4_0,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn tensor_data_past_the_end_of_the_file_is_refused() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("w", &[16, 4], 0, 0).data(255);
    let err = r.parse();
    assert!(
        matches!(err, GgufError::TensorOutOfBounds { ref name, start: 0, end: 256, data_len: 255 } if name == "w"),
        "{err}"
    );

    // An offset near u64::MAX must not wrap around.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("w", &[16], 0, u64::MAX - 31).data(64);
    assert!(matches!(r.parse(), GgufError::TensorOutOfBounds { .. }));
}

#[test]
fn an_empty_tensor_in_a_file_cut_before_its_data_section_is_refused() {
    // Found by the fuzzer (fuzz/regressions/empty_tensor_data_offset_past_eof.gguf): a
    // zero-element tensor passed the bounds check while the data section began past the end.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("e", &[0], 0, 0);
    assert!(!r.0.len().is_multiple_of(32), "the file must end inside the padding");
    let err = r.parse();
    assert!(
        matches!(err, GgufError::TensorOutOfBounds { ref name, .. } if name == "e"),
        "{err}"
    );
    let bytes = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fuzz/regressions/empty_tensor_data_offset_past_eof.gguf"
    ))
    .unwrap();
    assert!(parse_header(&bytes).is_err());
}

#[test]
fn a_zero_length_row_with_overflowing_row_count_is_refused() {
    // Found by the fuzzer (fuzz/regressions/tensor_size_rows_product_overflow.gguf): with
    // ne0 = 0 the element count is 0 but the row count overflowed.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("z", &[0, 1 << 40, 1 << 40], 0, 0).data(32);
    let err = r.parse();
    assert!(
        matches!(err, GgufError::ElementCountOverflow { ref name, .. } if name == "z"),
        "{err}"
    );
    let bytes = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fuzz/regressions/tensor_size_rows_product_overflow.gguf"
    ))
    .unwrap();
    assert!(parse_header(&bytes).is_err());
}

#[test]
fn a_misaligned_tensor_offset_is_refused() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[4], 0, 0).tensor("b", &[4], 0, 16).data(64);
    let err = r.parse();
    assert!(
        matches!(err, GgufError::MisalignedTensor { ref name, data_offset: 16, alignment: 32 } if name == "b"),
        "{err}"
    );
}

#[test]
fn duplicate_tensor_names_are_refused() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("w", &[4], 0, 0).tensor("w", &[4], 0, 32).data(64);
    let err = r.parse();
    assert!(
        matches!(err, GgufError::DuplicateTensor { ref name, .. } if name == "w"),
        "{err}"
    );
}

#[test]
fn an_unknown_ggml_type_id_is_refused_naming_the_tensor_and_id() {
    for (id, says) in [
        (4u32, "(Q4_2, removed from ggml)"),
        (31, "(Q4_0_4_4, removed from GGUF files by llama.cpp"),
        (38, "(IQ4_NL_8_8, removed"),
        (40, "(NVFP4, which minfer does not read yet)"),
        (1000, "unknown ggml type id 1000"),
    ] {
        let mut r = Raw::header(3, 1, 0);
        r.tensor("w", &[4], id, 0).data(64);
        let err = r.parse();
        assert!(
            matches!(err, GgufError::UnknownTensorType { ref name, type_id, .. } if name == "w" && type_id == id),
            "{err}"
        );
        assert!(err.to_string().contains(says), "{err}");
    }
}

#[test]
fn an_unknown_metadata_value_type_is_refused_naming_the_key() {
    let mut r = Raw::header(3, 0, 1);
    r.str("general.name").u32(13).u32(0);
    let err = r.parse();
    assert!(
        matches!(err, GgufError::UnknownValueType { ref key, type_id: 13, offset: 44 } if key == "general.name"),
        "{err}"
    );
}

#[test]
fn duplicate_metadata_keys_are_refused() {
    let mut r = Raw::header(3, 0, 2);
    r.kv_u32("a", 1).kv_u32("a", 2);
    let err = r.parse();
    assert!(
        matches!(err, GgufError::DuplicateKey { ref key, .. } if key == "a"),
        "{err}"
    );
}

#[test]
fn a_bad_alignment_is_refused() {
    for a in [0u32, 3, 48] {
        let mut r = Raw::header(3, 0, 1);
        r.kv_u32("general.alignment", a);
        let err = r.parse();
        assert!(
            matches!(err, GgufError::BadAlignment { alignment } if alignment == a as u64),
            "{err}"
        );
    }
    let mut r = Raw::header(3, 0, 1);
    r.str("general.alignment").u32(10).u64(32);
    let err = r.parse();
    assert_eq!(
        err.to_string(),
        "metadata key 'general.alignment' has type UINT64, expected UINT32"
    );
}

#[test]
fn invalid_utf8_in_a_string_is_refused_naming_the_key() {
    let mut r = Raw::header(3, 0, 1);
    r.str("general.name").u32(8).u64(2);
    r.0.extend_from_slice(&[0xff, 0xfe]);
    let err = r.parse();
    assert!(
        matches!(err, GgufError::InvalidUtf8 { ref what, .. } if what == "value of 'general.name'"),
        "{err}"
    );
}

#[test]
fn opening_an_empty_or_missing_file_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let err = GgufFile::open(&empty).err().unwrap();
    assert!(
        err.to_string().contains("empty.gguf") && err.to_string().contains("truncated"),
        "{err}"
    );
    let err = GgufFile::open(dir.path().join("missing.gguf")).err().unwrap();
    assert!(
        matches!(err, GgufError::Io { .. }) && err.to_string().contains("missing.gguf"),
        "{err}"
    );
}

#[test]
fn random_corruptions_of_a_valid_file_never_panic() {
    // A small deterministic mutation sweep (the fuzz target goes much further).
    let original = valid_file();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..20_000 {
        let mut bytes = original.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() as usize) % bytes.len();
            bytes[i] = next() as u8;
        }
        let _ = parse_header(&bytes);
    }
}
