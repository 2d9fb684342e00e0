//! The `llama` architecture's loader: a llama file runs, with linear RoPE scaling and Llama 3.1's
//! frequency factors; what it would not compute is refused by name — YaRN, experts, an unknown `llama.*` key, a tensor the graph does not read —
//! and a newer family llama.cpp knows is refused by name too. The files are the tiny qwen2
//! fixture relabelled as llama (its keys renamed, its Q/K/V biases kept: llama takes optional
//! biases), written with minfer's GGUF writer.

mod common;

use minfer::gguf::{GgufFile, GgufWriter, Value};
use minfer::models::{load_model, ModelError};

/// The tiny qwen2 model as a llama file, with `extra` keys set and `extra_tensors` added.
fn llama_file(extra: &[(&str, Value)], extra_tensors: &[(&str, Vec<u64>)]) -> (tempfile::TempDir, GgufFile) {
    let src = GgufFile::open(common::tiny_model("qwen2", "Q8_0")).unwrap();
    let mut w = GgufWriter::new();
    for (key, value) in src.metadata().iter() {
        match key {
            "general.architecture" => w.set(key, Value::String("llama".into())),
            k if k.starts_with("qwen2.") => w.set(k.replacen("qwen2.", "llama.", 1), value.clone()),
            k => w.set(k, value.clone()),
        };
    }
    for (key, value) in extra {
        w.set(*key, value.clone());
    }
    for t in src.tensors() {
        w.add_tensor(&t.name, t.ggml_type, &t.shape, src.tensor_data(t).to_vec())
            .unwrap();
    }
    for (name, shape) in extra_tensors {
        let n: u64 = shape.iter().product();
        w.add_tensor(name, minfer::quant::GgmlType::F32, shape, vec![0; 4 * n as usize])
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("llama.gguf");
    w.write_file(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    (dir, file)
}

fn refusal(extra: &[(&str, Value)], extra_tensors: &[(&str, Vec<u64>)]) -> ModelError {
    let (_dir, file) = llama_file(extra, extra_tensors);
    match load_model(&file) {
        Ok(_) => panic!("the file loaded"),
        Err(e) => e,
    }
}

#[test]
fn a_llama_file_loads_as_llama_with_adjacent_pair_rope() {
    let (_dir, file) = llama_file(&[], &[]);
    let model = load_model(&file).unwrap();
    assert_eq!(model.arch(), "llama");
    assert_eq!(model.hparams().rope_style, minfer::graph::RopeStyle::Normal);
}

#[test]
fn linear_rope_scaling_loads_as_its_inverse_factor_and_yarn_is_refused_by_name() {
    let err = refusal(&[("llama.rope.scaling.type", Value::String("yarn".into()))], &[]);
    assert!(err.to_string().contains("llama.rope.scaling.type = 'yarn'"), "{err}");
    let err = refusal(&[("llama.rope.scaling.type", Value::String("longrope".into()))], &[]);
    assert!(err.to_string().contains("'longrope'"), "{err}");
    // YaRN's own keys are unknown to a llama model.
    let err = refusal(&[("llama.rope.scaling.yarn_beta_fast", Value::F32(32.0))], &[]);
    assert!(err.to_string().contains("llama.rope.scaling.yarn_beta_fast"), "{err}");
    let scale = |extra: &[(&str, Value)]| {
        let (_dir, file) = llama_file(extra, &[]);
        load_model(&file).unwrap().hparams().rope_freq_scale
    };
    assert_eq!(scale(&[]), 1.0);
    assert_eq!(scale(&[("llama.rope.scaling.type", Value::String("none".into()))]), 1.0);
    let linear = [
        ("llama.rope.scaling.type", Value::String("linear".into())),
        ("llama.rope.scaling.factor", Value::F32(4.0)),
        ("llama.rope.scaling.original_context_length", Value::U32(4096)),
    ];
    assert_eq!(scale(&linear), 0.25);
    // The older key, and a factor of 0 meaning none, as llama.cpp reads them.
    assert_eq!(scale(&[("llama.rope.scale_linear", Value::F32(2.0))]), 0.5);
    assert_eq!(scale(&[("llama.rope.scaling.factor", Value::F32(0.0))]), 1.0);
    let err = refusal(&[("llama.rope.scaling.factor", Value::F32(-2.0))], &[]);
    assert!(err.to_string().contains("rope_scaling_factor"), "{err}");
}

#[test]
fn llama3_frequency_factors_load_and_bad_ones_are_refused_naming_the_tensor() {
    // The tiny model's heads are 64 wide: 32 factors, one per rotated pair.
    let (_dir, file) = llama_file(&[], &[("rope_freqs.weight", vec![32])]);
    let err = load_model(&file).err().unwrap();
    assert!(err.to_string().contains("rope_freqs.weight"), "zero factors: {err}");
    let err = refusal(&[], &[("rope_freqs.weight", vec![8])]);
    assert!(
        matches!(err, ModelError::BadShape { ref name, .. } if name == "rope_freqs.weight"),
        "{err}"
    );
    let model = load_model(&GgufFile::open(common::tiny_model("llama3", "Q4_0")).unwrap()).unwrap();
    assert_eq!(model.hparams().rope_freq_factors.as_deref(), Some("rope_freqs.weight"));
    assert_eq!(model.hparams().rope_freq_scale, 0.5);
}

#[test]
fn a_value_head_width_other_than_the_key_width_is_refused_naming_the_key() {
    // The tiny model's heads are 64 wide; minfer's cache stores K and V with one stride.
    let err = refusal(&[("llama.attention.value_length", Value::U32(32))], &[]);
    assert!(err.to_string().contains("attention.value_length = 32"), "{err}");
}

#[test]
fn experts_without_a_used_count_or_without_their_tensors_are_refused_naming_what_is_missing() {
    // Mixtral's keys are read now; a file that has them must have the rest of the experts too.
    let err = refusal(&[("llama.expert_count", Value::U32(8))], &[]);
    assert!(err.to_string().contains("expert_used_count = 0"), "{err}");
    let used = [
        ("llama.expert_count", Value::U32(8)),
        ("llama.expert_used_count", Value::U32(9)),
    ];
    let err = refusal(&used, &[]);
    assert!(err.to_string().contains("expert_used_count = 9"), "{err}");
    let used = [
        ("llama.expert_count", Value::U32(8)),
        ("llama.expert_used_count", Value::U32(2)),
    ];
    let err = refusal(&used, &[]);
    assert!(
        matches!(err, ModelError::MissingTensor { ref name } if name == "blk.0.ffn_gate_exps.weight" || name == "blk.0.ffn_gate_inp.weight"),
        "{err}"
    );
}

#[test]
fn an_unknown_llama_key_is_refused_by_name_and_descriptive_keys_are_not() {
    let err = refusal(&[("llama.logit_scale", Value::F32(0.5))], &[]);
    assert!(
        matches!(err, ModelError::UnknownKey { ref key, .. } if key == "llama.logit_scale"),
        "{err}"
    );
    let (_dir, file) = llama_file(
        &[
            ("general.description", Value::String("anything".into())),
            ("quantize.imatrix.file", Value::String("x.dat".into())),
        ],
        &[],
    );
    load_model(&file).unwrap();
}

#[test]
fn a_tensor_the_graph_does_not_read_is_refused_by_name() {
    // Phi-3's LongRoPE factors mean nothing to a llama model.
    let err = refusal(&[], &[("rope_factors_long.weight", vec![32])]);
    assert!(err.to_string().contains("'rope_factors_long.weight'"), "{err}");
    let err = refusal(&[], &[("blk.0.attn_sinks.weight", vec![4])]);
    assert!(err.to_string().contains("'blk.0.attn_sinks.weight'"), "{err}");
    // Optional biases load (the tiny llama3 fixture computes with them against llama.cpp), and
    // one of the wrong width is refused naming it.
    let (_dir, file) = llama_file(
        &[],
        &[("blk.0.attn_output.bias", vec![256]), ("blk.1.ffn_up.bias", vec![512])],
    );
    load_model(&file).unwrap();
    let err = refusal(&[], &[("blk.0.ffn_down.bias", vec![64])]);
    assert!(err.to_string().contains("'blk.0.ffn_down.bias'"), "{err}");
}

#[test]
fn newer_families_are_refused_by_name() {
    for arch in ["qwen35", "gemma4"] {
        let src = GgufFile::open(common::tiny_model("qwen2", "Q8_0")).unwrap();
        let mut w = GgufWriter::new();
        w.set_all(src.metadata());
        w.set("general.architecture", Value::String(arch.into()));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        w.write_file(&path).unwrap();
        let err = load_model(&GgufFile::open(&path).unwrap()).err().unwrap();
        assert!(
            err.to_string().contains(&format!("unsupported architecture '{arch}'")),
            "{err}"
        );
    }
}

/// The tiny Granite fixture without the keys `skip`, with `extra` set.
fn granite_file(skip: &[&str], extra: &[(&str, Value)]) -> (tempfile::TempDir, GgufFile) {
    let src = GgufFile::open(common::tiny_model("granite", "Q4_0")).unwrap();
    let mut w = GgufWriter::new();
    for (key, value) in src.metadata().iter().filter(|(k, _)| !skip.contains(k)) {
        w.set(key, value.clone());
    }
    for (key, value) in extra {
        w.set(*key, value.clone());
    }
    for t in src.tensors() {
        w.add_tensor(&t.name, t.ggml_type, &t.shape, src.tensor_data(t).to_vec())
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("granite.gguf");
    w.write_file(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    (dir, file)
}

#[test]
fn granite_reads_its_four_scales_and_refuses_a_file_without_its_logit_scale_or_rope() {
    let (_dir, file) = granite_file(&[], &[]);
    let model = load_model(&file).unwrap();
    assert_eq!(model.arch(), "granite");
    let hp = model.hparams();
    assert_eq!(hp.embedding_scale, Some(12.0));
    assert_eq!(hp.residual_scale, Some(0.22));
    assert_eq!(hp.kq_scale, 0.015625);
    assert_eq!(hp.logit_scale, Some(1.0 / 1.25));

    let refused = |skip: &[&str], extra: &[(&str, Value)]| {
        let (_dir, file) = granite_file(skip, extra);
        load_model(&file).err().unwrap().to_string()
    };
    let err = refused(&["granite.logit_scale"], &[]);
    assert!(err.contains("granite.logit_scale"), "{err}");
    let err = refused(&[], &[("granite.rope.scaling.finetuned", Value::Bool(false))]);
    assert!(err.contains("granite.rope.scaling.finetuned = false"), "{err}");
    let err = refused(&[], &[("granite.residual_scale", Value::F32(f32::NAN))]);
    assert!(err.contains("residual_scale"), "{err}");
    // A key of Granite's vision form is not one minfer reads.
    let err = refused(&[], &[("granite.deepstack_mapping", Value::U32(1))]);
    assert!(err.contains("granite.deepstack_mapping"), "{err}");
}

/// The LongRoPE factor weight the graph's first RoPE names at context `n_ctx`.
fn rope_factors_at(model: &dyn minfer::models::ModelDef, n_ctx: usize) -> Option<String> {
    use minfer::graph::{Backend, CParams, GraphParams, NodeMeta};
    let graph = model.build_graph(&GraphParams::new(2, 1, CParams::new(n_ctx, vec![Backend::CPU.0])));
    graph.nodes.iter().find_map(|n| match &n.meta {
        NodeMeta::Rope(m) => Some(m.freq_factors.clone()),
        _ => None,
    })?
}

#[test]
fn phi3_takes_longropes_short_factors_up_to_the_original_context_and_the_long_ones_beyond() {
    let file = GgufFile::open(common::tiny_model("phi3", "Q4_0")).unwrap();
    let model = load_model(&file).unwrap();
    assert_eq!(model.arch(), "phi3");
    let hp = model.hparams();
    assert_eq!((hp.n_rot, hp.head_dim), (32, 64), "partial rotary");
    assert_eq!(hp.rope_attn_factor, 1.19);
    // The tiny model's original context is 256 cells.
    assert_eq!(
        rope_factors_at(&*model, 256).as_deref(),
        Some("rope_factors_short.weight")
    );
    assert_eq!(
        rope_factors_at(&*model, 257).as_deref(),
        Some("rope_factors_long.weight")
    );
    // Q, K and V are views of the fused tensor's rows, gate and up of ffn_up's.
    let views = model.weight_views();
    let q = views.iter().find(|v| v.name == "blk.0.attn_qkv.weight:q").unwrap();
    assert_eq!((q.first_row, q.n_rows), (0, 256));
    let v = views.iter().find(|v| v.name == "blk.1.attn_qkv.weight:v").unwrap();
    assert_eq!((v.first_row, v.n_rows), (384, 128));
    let up = views.iter().find(|v| v.name == "blk.0.ffn_up.weight:up").unwrap();
    assert_eq!((up.first_row, up.n_rows), (512, 512));
}

#[test]
fn phi3_refuses_one_longrope_factor_set_without_the_other_and_a_bias_by_name() {
    let src = GgufFile::open(common::tiny_model("phi3", "Q4_0")).unwrap();
    let rewrite = |skip: &str, extra: Option<(&str, Vec<u64>)>| {
        let mut w = GgufWriter::new();
        w.set_all(src.metadata());
        for t in src.tensors().iter().filter(|t| t.name != skip) {
            w.add_tensor(&t.name, t.ggml_type, &t.shape, src.tensor_data(t).to_vec())
                .unwrap();
        }
        if let Some((name, shape)) = extra {
            let n: u64 = shape.iter().product();
            w.add_tensor(name, minfer::quant::GgmlType::F32, &shape, vec![0; 4 * n as usize])
                .unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("phi3.gguf");
        w.write_file(&path).unwrap();
        let err = load_model(&GgufFile::open(&path).unwrap()).err().unwrap();
        err.to_string()
    };
    let err = rewrite("rope_factors_short.weight", None);
    assert!(err.contains("rope_factors_short.weight"), "{err}");
    let err = rewrite("", Some(("blk.0.attn_qkv.bias", vec![512])));
    assert!(err.contains("'blk.0.attn_qkv.bias'"), "{err}");
}

#[test]
fn encoder_attention_unknown_pooling_and_dense_rank_heads_are_refused_by_name() {
    let err = refusal(&[("llama.attention.causal", Value::Bool(false))], &[]).to_string();
    assert!(err.contains("llama.attention.causal = false"), "{err}");
    let err = refusal(&[("llama.pooling_type", Value::U32(7))], &[]).to_string();
    assert!(err.contains("llama.pooling_type = 7"), "{err}");
    let err = refusal(&[("llama.pooling_type", Value::U32(4))], &[]).to_string();
    assert!(err.contains("cls.output.weight"), "{err}");
    let err = refusal(&[], &[("cls.weight", vec![256, 256])]).to_string();
    assert!(err.contains("cls.weight"), "{err}");
    // A causal flag that changes nothing, a pooling rule and a one-projection head load.
    let (_dir, file) = llama_file(
        &[
            ("llama.attention.causal", Value::Bool(true)),
            ("llama.pooling_type", Value::U32(1)),
        ],
        &[("cls.output.weight", vec![256, 3])],
    );
    let model = load_model(&file).unwrap();
    let hp = model.hparams();
    assert_eq!(hp.pooling, Some(minfer::models::pooling::Pooling::Mean));
    assert_eq!(hp.rank_head.as_ref().map(|h| h.n_cls), Some(3));
}
