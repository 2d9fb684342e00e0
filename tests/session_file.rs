//! Saved sessions: a session saved and loaded into a fresh one continues with the logits of the
//! run that never stopped, bit for bit; every refusal class names its check and leaves the
//! session as it was; a save that fails midway leaves the previous file intact.

mod common;

use minfer::engine::session_file::{self, SessionFileError};
use minfer::engine::{Model, ModelOptions, Session};
use std::path::Path;

fn load(arch: &str, ty: &str) -> Model {
    let options = ModelOptions {
        n_threads: Some(2),
        backend: Some("cpu".into()),
        ..Default::default()
    };
    Model::load(common::tiny_model(arch, ty), &options).unwrap()
}

fn prompt(model: &Model, n: usize) -> Vec<u32> {
    let n_vocab = model.hparams().n_vocab as u64;
    let mut rng = common::Rng(0x9e37_79b9_7f4a_7c15);
    (0..n).map(|_| (rng.next() % n_vocab.min(3000)) as u32).collect()
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn a_reloaded_session_continues_with_the_logits_of_the_run_that_never_stopped() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, ty) in [("qwen2", "Q8_0"), ("qwen3", "Q4_K"), ("qwen2", "F16")] {
        let model = load(arch, ty);
        let path = dir.path().join(format!("{arch}-{ty}.session"));
        let tokens = prompt(&model, 30);
        let mut running = Session::new(&model, 64);
        running.eval(&tokens, 1).unwrap();
        assert_eq!(session_file::save(&mut running, &model, &path).unwrap(), 30);
        let mut reloaded = Session::new(&model, 64);
        assert_eq!(session_file::load(&mut reloaded, &model, &path).unwrap(), tokens);
        assert_eq!(reloaded.n_past(), 30);
        for &next in &tokens[..3] {
            let a = bits(running.eval(&[next], 1).unwrap());
            let b = bits(reloaded.eval(&[next], 1).unwrap());
            assert_eq!(a, b, "{arch} {ty}: the reloaded session's logits differ");
        }
    }
}

/// `session` still holds `tokens` and gives the logits it gave before.
fn untouched(session: &mut Session, tokens: &[u32], expected: &[u32]) {
    assert_eq!(session.seq_tokens(0), tokens);
    session.truncate(tokens.len() - 1);
    assert_eq!(bits(session.eval(&tokens[tokens.len() - 1..], 1).unwrap()), expected);
}

fn refusal(result: Result<Vec<u32>, SessionFileError>) -> String {
    match result {
        Err(e @ SessionFileError::Refused { .. }) => e.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn every_bad_session_file_is_refused_by_name_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let model = load("qwen2", "Q8_0");
    let saved_path = dir.path().join("good.session");
    let mut saver = Session::new(&model, 64);
    saver.eval(&prompt(&model, 20), 1).unwrap();
    session_file::save(&mut saver, &model, &saved_path).unwrap();
    let good = std::fs::read(&saved_path).unwrap();

    // The session each refusal must leave alone.
    let own: Vec<u32> = prompt(&model, 9).into_iter().rev().collect();
    let mut session = Session::new(&model, 64);
    let expected = bits(session.eval(&own, 1).unwrap());

    let bad = dir.path().join("bad.session");
    let check = |bytes: &[u8], needle: &str, session: &mut Session| {
        std::fs::write(&bad, bytes).unwrap();
        let message = refusal(session_file::load(session, &model, &bad));
        assert!(message.contains(needle), "expected {needle:?}: {message}");
        untouched(session, &own, &expected);
    };
    for cut in [0, 7, 30, 47, 48, 60, good.len() / 2, good.len() - 1] {
        let needle = if cut < 48 { "truncated" } else { "truncated or extended" };
        check(&good[..cut], needle, &mut session);
    }
    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x40;
    check(&flipped, "checksum", &mut session);
    let mut magic = good.clone();
    magic[0] = b'X';
    check(&magic, "bad magic", &mut session);
    let mut version = good.clone();
    version[8..12].copy_from_slice(&2u32.to_le_bytes());
    check(&version, "format version 2", &mut session);
    let mut cache_type = good.clone();
    cache_type[20..24].copy_from_slice(&(8u32 | 8 << 16).to_le_bytes());
    check(
        &cache_type,
        "stores K as q8_0 and V as q8_0, this session K as f16",
        &mut session,
    );
    let mut count = good.clone();
    count[36..40].copy_from_slice(&1000u32.to_le_bytes());
    check(&count, "1000 tokens, more than this session's context", &mut session);

    // Another model (the same architecture in another quantization).
    let other = load("qwen2", "Q4_0");
    let mut other_session = Session::new(&other, 64);
    let message = refusal(session_file::load(&mut other_session, &other, &saved_path));
    assert!(message.contains("another model"), "{message}");
    assert_eq!(other_session.n_past(), 0);
}

#[test]
fn a_save_that_fails_midway_leaves_the_previous_file_intact_and_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = load("qwen2", "Q8_0");
    let path = dir.path().join("s.session");
    let mut session = Session::new(&model, 64);
    let tokens = prompt(&model, 12);
    session.eval(&tokens, 1).unwrap();
    session_file::save(&mut session, &model, &path).unwrap();
    let before = std::fs::read(&path).unwrap();
    // The process dies after writing part of the new file: here, the writer fails there.
    let failed = session_file::write_atomic(&path, |file| {
        std::io::Write::write_all(file, &before[..before.len() / 2])?;
        Err(std::io::Error::other("killed"))
    });
    assert!(failed.is_err());
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(files.len(), 1, "a temporary file was left behind");
    let mut fresh = Session::new(&model, 64);
    assert_eq!(
        session_file::load(&mut fresh, &model, Path::new(&path)).unwrap(),
        tokens
    );
}

#[test]
fn the_cli_reuses_a_saved_session_for_a_prompt_that_extends_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cli.session");
    let model = common::tiny_model("qwen2", "Q8_0");
    let run = |prompt: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
            .arg(&model)
            .args([prompt, "--greedy", "-n", "8", "--session", file.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        (String::from_utf8_lossy(&out.stdout).into_owned(), err)
    };
    let (_, first) = run("Tell me a story about a cat");
    assert!(first.contains(": 0 of the prompt's"), "{first}");
    let (text, second) = run("Tell me a story about a cat and a dog");
    assert!(!second.contains(": 0 of the prompt's"), "{second}");
    // The same text as without the saved session.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg(&model)
        .args(["Tell me a story about a cat and a dog", "--greedy", "-n", "8"])
        .output()
        .unwrap();
    assert_eq!(text, String::from_utf8_lossy(&out.stdout));
}

/// Make a FIFO at `path`.
#[cfg(unix)]
fn mkfifo(path: &Path) {
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(
        unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) },
        0,
        "mkfifo {}",
        path.display()
    );
}

#[cfg(unix)]
#[test]
fn a_fifo_given_as_the_session_is_refused_at_once_and_never_written() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("session.fifo");
    mkfifo(&fifo);
    let model = common::tiny_model("qwen2", "Q8_0");
    let started = std::time::Instant::now();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg(&model)
        .args(["Hello", "--greedy", "-n", "2", "--session", fifo.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("minfer --session FIFO still waits after a minute");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!(
            "session file {} refused: it is a FIFO, not a regular file",
            fifo.display()
        )),
        "{err}"
    );

    // Saving there is refused too, and leaves the FIFO a FIFO.
    let model = load("qwen2", "Q8_0");
    let mut session = Session::new(&model, 64);
    session.eval(&prompt(&model, 5), 1).unwrap();
    let err = session_file::save(&mut session, &model, &fifo).unwrap_err();
    assert!(
        matches!(err, SessionFileError::Refused { .. }) && err.to_string().contains("it is a FIFO"),
        "{err}"
    );
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temporary file left"
    );
}

/// The FNV-1a hash the header keeps of the payload.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[test]
fn a_session_file_with_a_nan_in_its_cache_is_refused_naming_the_layer_even_with_a_valid_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let model = load("qwen2", "F16");
    let path = dir.path().join("nan.session");
    let n_tokens = 6;
    let mut saver = Session::new(&model, 64);
    saver.eval(&prompt(&model, n_tokens), 1).unwrap();
    session_file::save(&mut saver, &model, &path).unwrap();
    let good = std::fs::read(&path).unwrap();
    // The header: magic 8, version 4, identity 8, KV types 4 (f16 K and V here), n_layer 4,
    // n_kv_embd 4, n_ctx 4, tokens 4, checksum 8; then the tokens, then per layer K and V.
    let header = 48;
    let u32_at = |at: usize| u32::from_le_bytes(good[at..at + 4].try_into().unwrap()) as usize;
    assert_eq!(u32_at(20), 1 | 1 << 16, "f16 K and V");
    let (n_layer, n_kv_embd) = (u32_at(24), u32_at(28));
    assert!(n_layer >= 2);
    let rows = n_tokens * n_kv_embd * 2;
    let own: Vec<u32> = prompt(&model, 4);
    let mut session = Session::new(&model, 64);
    let expected = bits(session.eval(&own, 1).unwrap());
    for (layer, which, at_value) in [(1, "K", 7), (0, "V", n_kv_embd + 3)] {
        let mut bad = good.clone();
        let layer_start = header + n_tokens * 4 + layer * 2 * rows;
        let at = layer_start + if which == "V" { rows } else { 0 } + at_value * 2;
        bad[at..at + 2].copy_from_slice(&0x7e00u16.to_le_bytes()); // an f16 NaN
        let checksum = fnv1a(&bad[header..]);
        bad[40..48].copy_from_slice(&checksum.to_le_bytes());
        let bad_path = dir.path().join(format!("{which}{layer}.session"));
        std::fs::write(&bad_path, &bad).unwrap();
        let message = refusal(session_file::load(&mut session, &model, &bad_path));
        assert!(
            message.contains(&format!("layer {layer}'s {which} holds a value that is not finite"))
                && message.contains(&format!("at value {at_value} (token {})", at_value / n_kv_embd)),
            "{message}"
        );
        untouched(&mut session, &own, &expected);
    }
}
