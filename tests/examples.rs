//! The library's examples (`examples/generate.rs`, `examples/chat.rs`) run against a tiny model:
//! `generate` prints what the CLI prints for the same greedy request, and `chat` reuses the
//! KV cache of the first turn in the second.
//!
//! `cargo test` builds the examples before running the tests; run alone, this file needs
//! `cargo build --examples` first (it says so).

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// An example's binary, built by `cargo test` beside the test binaries (`target/<profile>/examples`).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo test` (which builds the examples) or `cargo build --examples` first",
        path.display()
    );
    path
}

#[test]
fn the_generate_example_prints_what_the_cli_prints_for_the_same_greedy_request() {
    let model = common::tiny_model("qwen3", "Q4_K");
    let out = Command::new(example("generate"))
        .args([model.to_str().unwrap(), "Name three colours", "12"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cli = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args([model.to_str().unwrap(), "Name three colours", "--greedy", "-n", "12"])
        .output()
        .unwrap();
    assert!(cli.status.success(), "{}", String::from_utf8_lossy(&cli.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!cli.stdout.is_empty());
    // The example ends its text with a newline; the CLI does not when stdout is a pipe.
    assert_eq!(text.strip_suffix('\n').unwrap(), String::from_utf8_lossy(&cli.stdout));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Prefill:"));
}

#[test]
fn the_chat_example_prefills_only_what_the_kv_cache_does_not_hold() {
    let model = common::tiny_model("qwen2", "Q8_0");
    let mut child = Command::new(example("chat"))
        .args([model.to_str().unwrap(), "Be brief.", "-n", "16"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Hello there\nAnd again\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // "[N of M prompt tokens reused] ..." once per turn.
    let turns: Vec<(usize, usize)> = stderr
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix('[')?;
            let mut words = rest.split(' ');
            let n = words.next()?.parse().ok()?;
            let m = words.nth(1)?.parse().ok()?;
            Some((n, m))
        })
        .collect();
    assert_eq!(turns.len(), 2, "{stderr}");
    assert_eq!(turns[0].0, 0, "nothing is cached before the first turn");
    // The second rendering starts with the first prompt, so at least all of it is reused.
    assert!(
        turns[1].0 >= turns[0].1,
        "second turn reused {} of the first turn's {}",
        turns[1].0,
        turns[0].1
    );
    assert!(turns[1].0 < turns[1].1);
}
