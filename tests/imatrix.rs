//! `minfer imatrix` against llama-imatrix: the tiny qwen2 model's matrix on the calibration
//! text (`tests/fixtures/imatrix/`, made by llama.cpp 0c1e570 with `-c 128`), entry by entry,
//! and the file it writes read back as llama-quantize reads it.

mod common;

use minfer::engine::{compute_imatrix, ImatrixOptions, Model, ModelOptions, Session};
use minfer::quantize::Imatrix;
use std::path::Path;

fn fixture(name: &str) -> std::path::PathBuf {
    common::fixtures().join("imatrix").join(name)
}

#[test]
fn the_tiny_models_matrix_has_llama_imatrixs_entries_counts_and_mean_squares() {
    let options = ModelOptions {
        n_threads: Some(2),
        backend: Some("cpu".into()),
        ..Default::default()
    };
    let model = Model::load(common::tiny_model("qwen2", "F32"), &options).unwrap();
    let text = std::fs::read(fixture("calibration.txt")).unwrap();
    let tokens = model.tokenizer().encode_bytes(&text, true, false);
    let mut session = Session::new(&model, 128);
    let imatrix_options = ImatrixOptions {
        n_ctx: 128,
        max_chunks: None,
        process_output: false,
        dataset: "calibration.txt".into(),
    };
    let mut chunks = 0;
    let stats = compute_imatrix(&mut session, &tokens, None, &imatrix_options, |done| {
        chunks = done.index
    })
    .unwrap();
    assert_eq!(
        (chunks, stats.chunk_count()),
        (18, 18),
        "llama-imatrix ran 18 chunks of 128"
    );

    let dir = tempfile::tempdir().unwrap();
    let ours_path = dir.path().join("ours.imatrix.gguf");
    stats.write_gguf(&ours_path).unwrap();
    let ours = Imatrix::load(&ours_path).unwrap();
    let theirs = Imatrix::load(&fixture("tiny-qwen2.imatrix.gguf")).unwrap();
    assert_eq!((ours.len(), ours.chunk_count), (theirs.len(), theirs.chunk_count));
    assert_eq!(ours.datasets, ["calibration.txt"]);
    // Every layer matrix, with llama-imatrix's token count (the mean squares would differ by
    // whole factors otherwise) and its column sums to the float differences of the two
    // engines' activations (measured: at worst 0.3 % on one column).
    for (name, (sums, count)) in &stats.entries {
        assert_eq!(*count, 128 * 18, "{name}: every token of every chunk");
        let (a, b) = (ours.get(name).unwrap(), theirs.get(name).unwrap());
        assert_eq!(a.len(), sums.len());
        assert_eq!(a.len(), b.len(), "{name}");
        for (j, (&x, &y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-2 * y.abs(),
                "{name} column {j}: ours {x}, llama-imatrix {y}"
            );
        }
    }
}

#[test]
fn the_imatrix_command_writes_a_matrix_quantize_takes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.gguf");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(["imatrix"])
        .arg(common::tiny_model("qwen2", "F32"))
        .arg("-f")
        .arg(fixture("calibration.txt"))
        .arg("-o")
        .arg(&out)
        .args(["-c", "128", "--chunks", "3", "-t", "2"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{log}");
    assert!(log.contains("[1]") && log.contains("[3]"), "{log}");
    assert!(log.contains("stored 14 entries computed on 3 chunks"), "{log}");
    let quantized = dir.path().join("q.gguf");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg("quantize")
        .arg(common::tiny_model("qwen2", "F32"))
        .arg(&quantized)
        .args(["Q4_K_M", "--imatrix"])
        .arg(&out)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{log}");
    assert!(log.contains("loaded 14 importance matrix entries"), "{log}");
    assert!(Path::new(&quantized).exists());
}

#[test]
fn a_text_shorter_than_two_chunks_is_refused_with_its_token_count() {
    let options = ModelOptions {
        n_threads: Some(1),
        backend: Some("cpu".into()),
        ..Default::default()
    };
    let model = Model::load(common::tiny_model("qwen2", "F32"), &options).unwrap();
    let mut session = Session::new(&model, 128);
    let opts = ImatrixOptions {
        n_ctx: 128,
        max_chunks: None,
        process_output: false,
        dataset: String::new(),
    };
    let err = compute_imatrix(&mut session, &[1; 200], None, &opts, |_| {}).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the text tokenizes to 200 tokens; a context of 128 needs at least 256"
    );
}
