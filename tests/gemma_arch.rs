//! The Gemma family's loaders (`gemma3`, `gemma2`, `gemma`): the tiny fixtures' windowed and
//! global layers, their RoPE bases, Gemma's scales and soft-caps as read, each generation's
//! defaults where a key is missing, and what they would not compute refused by name.

mod common;

use minfer::gguf::{GgufFile, GgufWriter, Value};
use minfer::models::load_model;

/// The tiny Gemma 3 fixture with `extra` keys set.
fn gemma3_file(extra: &[(&str, Value)]) -> (tempfile::TempDir, GgufFile) {
    fixture_with("gemma3", extra, &[])
}

/// The tiny fixture of `arch` with `extra` keys set and the keys `drop` left out.
fn fixture_with(arch: &str, extra: &[(&str, Value)], drop: &[&str]) -> (tempfile::TempDir, GgufFile) {
    let src = GgufFile::open(common::tiny_model(arch, "Q4_0")).unwrap();
    let mut metadata = src.metadata().clone();
    for key in drop {
        metadata.remove(key);
    }
    let mut w = GgufWriter::new();
    w.set_all(&metadata);
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
fn gemma3_takes_a_final_soft_cap_and_refuses_unknown_keys_by_name() {
    let (_dir, file) = gemma3_file(&[("gemma3.final_logit_softcapping", Value::F32(30.0))]);
    let model = load_model(&file).unwrap();
    assert_eq!(
        (model.hparams().final_softcap, model.hparams().attn_softcap),
        (Some(30.0), None)
    );
    let refused = |extra: &[(&str, Value)]| {
        let (_dir, file) = gemma3_file(extra);
        load_model(&file).err().unwrap().to_string()
    };
    let err = refused(&[("gemma3.attn_logit_softcapping", Value::F32(50.0))]);
    assert!(err.contains("gemma3.attn_logit_softcapping"), "{err}");
    let err = refused(&[(
        "gemma3.attention.sliding_window_pattern",
        Value::Array(minfer::gguf::Array::Bool(vec![true])),
    )]);
    assert!(err.contains("sliding_window_pattern"), "{err}");
}

#[test]
fn gemma2_reads_its_soft_caps_and_window_and_takes_llama_cpps_defaults_without_them() {
    let (_dir, file) = fixture_with("gemma2", &[], &[]);
    let model = load_model(&file).unwrap();
    assert_eq!(model.arch(), "gemma2");
    let hp = model.hparams();
    assert_eq!((hp.attn_softcap, hp.final_softcap), (Some(5.0), Some(100.0)));
    // Every other layer is local, layer 0 first, rotating with the global base.
    assert_eq!((hp.swa_window(0), hp.swa_window(1)), (Some(6), None));
    assert_eq!(hp.rope_freq_base_swa, hp.rope_freq_base);
    assert_eq!(hp.q_scale, Some(1.0 / (hp.head_dim as f32).sqrt()));
    let (_dir, file) = fixture_with(
        "gemma2",
        &[],
        &[
            "gemma2.attn_logit_softcapping",
            "gemma2.final_logit_softcapping",
            "gemma2.attention.sliding_window",
        ],
    );
    let model = load_model(&file).unwrap();
    let hp = model.hparams();
    assert_eq!(
        (hp.attn_softcap, hp.final_softcap, hp.n_swa),
        (Some(50.0), Some(30.0), 4096)
    );
    // A cap of 0 would divide by zero in llama.cpp: refused, naming the key.
    let (_dir, file) = fixture_with("gemma2", &[("gemma2.attn_logit_softcapping", Value::F32(0.0))], &[]);
    let err = load_model(&file).err().unwrap().to_string();
    assert!(err.contains("attn_logit_softcapping"), "{err}");
}

#[test]
fn gemma_has_no_window_no_soft_caps_and_refuses_gemma2_keys_and_post_norms() {
    let (_dir, file) = fixture_with("gemma", &[], &[]);
    let model = load_model(&file).unwrap();
    assert_eq!(model.arch(), "gemma");
    let hp = model.hparams();
    assert_eq!((hp.n_swa, hp.attn_softcap, hp.final_softcap), (0, None, None));
    let (_dir, file) = fixture_with("gemma", &[("gemma.attn_logit_softcapping", Value::F32(50.0))], &[]);
    let err = load_model(&file).err().unwrap().to_string();
    assert!(err.contains("gemma.attn_logit_softcapping"), "{err}");
    // Gemma 2's tensors in a Gemma file are not silently ignored.
    let err = load_model(&GgufFile::open(relabelled("gemma2", "gemma").1).unwrap())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("post_attention_norm"), "{err}");
}

/// The tiny `from` fixture's tensors and keys under architecture `to`.
fn relabelled(from: &str, to: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let src = GgufFile::open(common::tiny_model(from, "Q4_0")).unwrap();
    let mut w = GgufWriter::new();
    for (key, value) in src.metadata().iter() {
        let key = match key.strip_prefix(&format!("{from}.")) {
            Some(rest) if !rest.contains("softcapping") && !rest.starts_with("attention.sliding") => {
                format!("{to}.{rest}")
            }
            Some(_) => continue,
            None => key.to_string(),
        };
        w.set(&key, value.clone());
    }
    w.set("general.architecture", Value::String(to.into()));
    for t in src.tensors() {
        w.add_tensor(&t.name, t.ggml_type, &t.shape, src.tensor_data(t).to_vec())
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relabelled.gguf");
    w.write_file(&path).unwrap();
    (dir, path)
}
