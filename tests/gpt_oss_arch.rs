//! The `gpt-oss` loader: the tiny gpt-oss fixture loads with llama.cpp's hyper-parameters (the
//! window on the even layers, YaRN's magnitude, sinks, the scores' scale), and what it would not
//! compute as llama.cpp does is refused by name — other YaRN constants, an unknown scaling or
//! key, a missing or non-finite sink, a tensor the graph does not read. Logits against llama.cpp
//! are `tests/tiny_models.rs`'s.

mod common;

use minfer::gguf::{GgufFile, GgufWriter, Value};
use minfer::models::{load_model, ModelError};
use minfer::quant::GgmlType;

/// The tiny gpt-oss F32 model with `extra` keys set, tensors named in `drop` left out, and the
/// F32 tensors of `replace` given new values.
fn file(extra: &[(&str, Value)], drop: &[&str], replace: &[(&str, Vec<f32>)]) -> (tempfile::TempDir, GgufFile) {
    let src = GgufFile::open(common::tiny_model("gpt-oss", "F32")).unwrap();
    let mut w = GgufWriter::new();
    w.set_all(src.metadata());
    for (key, value) in extra {
        w.set(*key, value.clone());
    }
    for t in src.tensors().iter().filter(|t| !drop.contains(&t.name.as_str())) {
        let data = match replace.iter().find(|(name, _)| *name == t.name) {
            Some((_, values)) => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            None => src.tensor_data(t).to_vec(),
        };
        w.add_tensor(&t.name, t.ggml_type, &t.shape, data).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpt-oss.gguf");
    w.write_file(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    (dir, file)
}

fn refusal(extra: &[(&str, Value)], drop: &[&str], replace: &[(&str, Vec<f32>)]) -> ModelError {
    let (_dir, file) = file(extra, drop, replace);
    match load_model(&file) {
        Ok(_) => panic!("the file loaded"),
        Err(e) => e,
    }
}

#[test]
fn the_tiny_gpt_oss_loads_with_llama_cpps_window_yarn_sinks_and_score_scale() {
    let (_dir, file) = file(&[], &[], &[]);
    let model = load_model(&file).unwrap();
    assert_eq!(model.arch(), "gpt-oss");
    let hp = model.hparams();
    // llama.cpp's set_swa_pattern(2): the even layers windowed.
    assert_eq!((hp.n_swa, hp.swa_layers.clone()), (6, vec![true, false]));
    assert_eq!(hp.rope_freq_scale, 1.0 / 32.0);
    assert_eq!(hp.rope_freq_scale_swa, 1.0 / 32.0);
    let yarn = hp.rope_yarn.clone().unwrap();
    assert_eq!(
        (yarn.ext_factor, yarn.beta_fast, yarn.beta_slow, yarn.n_ctx_orig),
        (1.0, 32.0, 1.0, 4096)
    );
    // llama_context's yarn_attn_factor: get_mscale(32) / (1 + 0.1 ln 32), in f32.
    let factor = 32.0f32;
    let expected = (0.1 * factor.ln() + 1.0) * (1.0 / (1.0 + 0.1 * factor.ln()));
    assert_eq!(hp.rope_attn_factor, expected);
    assert_eq!(hp.kq_scale, 1.0 / 8.0);
    assert!(hp.attn_sinks);
    let ex = hp.experts.as_ref().unwrap();
    assert_eq!(
        (ex.n_expert, ex.n_expert_used, ex.n_ff_exp, ex.biases),
        (8, 4, 64, true)
    );
}

#[test]
fn yarn_constants_other_than_llama_cpps_are_refused_naming_the_key() {
    let err = refusal(&[("gpt-oss.rope.scaling.yarn_beta_fast", Value::F32(16.0))], &[], &[]);
    assert!(
        err.to_string().contains("gpt-oss.rope.scaling.yarn_beta_fast = 16"),
        "{err}"
    );
    // The values llama.cpp uses anyway are accepted.
    let (_dir, f) = file(
        &[
            ("gpt-oss.rope.scaling.yarn_beta_fast", Value::F32(32.0)),
            ("gpt-oss.rope.scaling.yarn_beta_slow", Value::F32(1.0)),
        ],
        &[],
        &[],
    );
    load_model(&f).unwrap();
}

#[test]
fn an_unknown_scaling_or_key_is_refused_by_name() {
    let err = refusal(
        &[("gpt-oss.rope.scaling.type", Value::String("longrope".into()))],
        &[],
        &[],
    );
    assert!(
        err.to_string().contains("gpt-oss.rope.scaling.type = 'longrope'"),
        "{err}"
    );
    let err = refusal(&[("gpt-oss.logit_scale", Value::F32(0.5))], &[], &[]);
    assert!(
        matches!(err, ModelError::UnknownKey { ref key, .. } if key == "gpt-oss.logit_scale"),
        "{err}"
    );
    let err = refusal(&[("gpt-oss.attention.sliding_window", Value::U32(0))], &[], &[]);
    assert!(err.to_string().contains("attention.sliding_window = 0"), "{err}");
}

#[test]
fn a_missing_or_non_finite_sink_and_a_missing_expert_bias_are_refused_by_name() {
    let err = refusal(&[], &["blk.1.attn_sinks.weight"], &[]);
    assert!(
        matches!(err, ModelError::MissingTensor { ref name } if name == "blk.1.attn_sinks.weight"),
        "{err}"
    );
    let err = refusal(&[], &[], &[("blk.0.attn_sinks.weight", vec![0.5, f32::NAN, 1.0, 2.0])]);
    assert!(
        matches!(err, ModelError::NonFiniteWeight { ref name, index: 1, .. } if name == "blk.0.attn_sinks.weight"),
        "{err}"
    );
    let err = refusal(&[], &["blk.0.ffn_down_exps.bias"], &[]);
    assert!(
        matches!(err, ModelError::MissingTensor { ref name } if name == "blk.0.ffn_down_exps.bias"),
        "{err}"
    );
}

#[test]
fn a_tensor_the_graph_does_not_read_is_refused_by_name() {
    let src = GgufFile::open(common::tiny_model("gpt-oss", "F32")).unwrap();
    let mut w = GgufWriter::new();
    w.set_all(src.metadata());
    for t in src.tensors() {
        w.add_tensor(&t.name, t.ggml_type, &t.shape, src.tensor_data(t).to_vec())
            .unwrap();
    }
    w.add_tensor("blk.0.ffn_norm.weight", GgmlType::F32, &[256], vec![0; 1024])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("extra.gguf");
    w.write_file(&path).unwrap();
    let err = match load_model(&GgufFile::open(&path).unwrap()) {
        Ok(_) => panic!("the file loaded"),
        Err(e) => e,
    };
    assert!(
        matches!(err, ModelError::UnusedTensor { ref name, .. } if name == "blk.0.ffn_norm.weight"),
        "{err}"
    );
}
