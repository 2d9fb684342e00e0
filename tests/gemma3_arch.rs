//! The `gemma3` architecture's loader: the tiny fixture's windowed and global layers, their RoPE
//! bases and Gemma's scales as read, and what it would not compute refused by name.

mod common;

use minfer::gguf::{GgufFile, GgufWriter, Value};
use minfer::models::load_model;

/// The tiny Gemma 3 fixture with `extra` keys set.
fn gemma3_file(extra: &[(&str, Value)]) -> (tempfile::TempDir, GgufFile) {
    let src = GgufFile::open(common::tiny_model("gemma3", "Q4_0")).unwrap();
    let mut w = GgufWriter::new();
    w.set_all(src.metadata());
    for (key, value) in extra {
        w.set(*key, value.clone());
    }
    for t in src.tensors() {
        w.add_tensor(&t.name, t.ggml_type, &t.shape, src.tensor_data(t).to_vec())
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gemma3.gguf");
    w.write_file(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    (dir, file)
}

#[test]
fn gemma3_reads_its_window_pattern_rope_bases_and_scales() {
    let (_dir, file) = gemma3_file(&[]);
    let model = load_model(&file).unwrap();
    assert_eq!(model.arch(), "gemma3");
    let hp = model.hparams();
    // Pattern 2: layer 0 local, layer 1 global.
    assert_eq!((hp.swa_window(0), hp.swa_window(1)), (Some(6), None));
    assert_eq!((hp.rope_freq_base_swa, hp.rope_freq_base), (10_000.0, 1_000_000.0));
    assert_eq!(hp.embedding_scale, Some((hp.n_embd as f32).sqrt()));
    assert_eq!(hp.q_scale, Some(1.0 / (hp.head_dim as f32).sqrt()));
    assert_eq!(hp.kq_scale, 1.0);
    // llama.cpp's default period is 6 (5 local, 1 global), and a flag per layer is accepted.
    let (_dir, file) = gemma3_file(&[(
        "gemma3.attention.sliding_window_pattern",
        Value::Array(minfer::gguf::Array::Bool(vec![false, true])),
    )]);
    let model = load_model(&file).unwrap();
    assert_eq!((model.hparams().is_swa(0), model.hparams().is_swa(1)), (false, true));
}

#[test]
fn gemma3_refuses_a_final_soft_cap_and_unknown_keys_by_name() {
    let refused = |extra: &[(&str, Value)]| {
        let (_dir, file) = gemma3_file(extra);
        load_model(&file).err().unwrap().to_string()
    };
    let err = refused(&[("gemma3.final_logit_softcapping", Value::F32(30.0))]);
    assert!(err.contains("gemma3.final_logit_softcapping = 30"), "{err}");
    let err = refused(&[("gemma3.attn_logit_softcapping", Value::F32(50.0))]);
    assert!(err.contains("gemma3.attn_logit_softcapping"), "{err}");
    let err = refused(&[(
        "gemma3.attention.sliding_window_pattern",
        Value::Array(minfer::gguf::Array::Bool(vec![true])),
    )]);
    assert!(err.contains("sliding_window_pattern"), "{err}");
}
