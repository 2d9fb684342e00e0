//! `minfer MODEL --cnv` driven through a real pseudo-terminal, as a person would use it: the
//! replies of three greedy turns equal one-shot generation (`--no-template`) of the same
//! rendered conversations; each turn prefills only what the KV cache lacks; Ctrl-C stops a
//! reply and returns to the prompt, and the next turn works; Ctrl-D leaves with status 0. Then
//! the scripted form (standard input not a terminal): a conversation three times the context
//! long runs to its end with the context shifted, in flat memory.

mod common;

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_minfer");

/// How the line editor draws the prompt: it clears the line, then writes `> `.
const PROMPT: &str = "\u{1b}[K> ";

/// A child on the slave side of a pseudo-terminal (its controlling terminal), its standard
/// error collected apart.
struct Pty {
    master: File,
    child: Child,
    stderr: Arc<Mutex<String>>,
    /// Everything read from the terminal so far.
    seen: String,
}

impl Pty {
    fn spawn(args: &[&str]) -> Pty {
        let (mut master, mut slave) = (0, 0);
        let size = libc::winsize {
            ws_row: 24,
            ws_col: 200,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: openpty writes two descriptors; the name and termios pointers may be null.
        let rc = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), &size) };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: both descriptors were just opened and are owned here alone.
        let (master, slave) = unsafe { (File::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
        let mut command = Command::new(BIN);
        command
            .args(args)
            .env("TERM", "xterm")
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::piped());
        // SAFETY: setsid and the ioctl are async-signal-safe; the child takes the terminal (on
        // its standard input) as its controlling terminal, so Ctrl-C becomes SIGINT.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn().expect("minfer starts");
        drop(slave);
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().unwrap();
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Pty {
            master,
            child,
            stderr,
            seen: String::new(),
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.master.write_all(bytes).unwrap();
    }

    /// Reads until what was read since `from` contains `needle`; returns that text.
    fn read_until(&mut self, from: usize, needle: &str, timeout: Duration) -> String {
        let start = Instant::now();
        let mut buf = [0u8; 4096];
        while !self.seen[from..].contains(needle) {
            let left = timeout.saturating_sub(start.elapsed());
            assert!(
                !left.is_zero(),
                "no {needle:?} within {timeout:?}; terminal: {:?}\nstderr: {}",
                &self.seen[from..],
                self.stderr()
            );
            let mut poll = libc::pollfd {
                fd: self.master.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd on a descriptor this struct owns.
            let ready = unsafe { libc::poll(&mut poll, 1, left.as_millis().min(1000) as i32) };
            if ready > 0 {
                match self.master.read(&mut buf) {
                    Ok(n) if n > 0 => self.seen.push_str(&String::from_utf8_lossy(&buf[..n])),
                    // EIO: the child closed the terminal.
                    _ => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
        self.seen[from..].to_string()
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits for the child's standard error to contain `n` lines starting with `prefix`.
    fn wait_stderr_lines(&self, prefix: &str, n: usize, timeout: Duration) -> Vec<String> {
        let start = Instant::now();
        loop {
            // Complete lines only: the last one may still be arriving.
            let stderr = self.stderr();
            let complete = &stderr[..stderr.rfind('\n').map_or(0, |end| end + 1)];
            let lines: Vec<String> = complete
                .lines()
                .filter(|l| l.starts_with(prefix))
                .map(str::to_string)
                .collect();
            if lines.len() >= n {
                return lines;
            }
            // The last 600 bytes or so, from a character boundary (the reply may be any UTF-8).
            let mut from = self.seen.len().saturating_sub(600);
            while !self.seen.is_char_boundary(from) {
                from += 1;
            }
            let tail = &self.seen[from..];
            assert!(
                start.elapsed() < timeout,
                "stderr: {}\nterminal ends: {tail:?}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(args: &[&str], stdin: &[u8]) -> (String, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "minfer {args:?}: {stderr}");
    (stdout, stderr)
}

/// The conversation rendered by `minfer render`, as the model's template renders it.
fn render(model: &Path, dir: &Path, messages: &serde_json::Value) -> String {
    let file = dir.join("messages.json");
    std::fs::write(&file, messages.to_string()).unwrap();
    run(
        &["render", model.to_str().unwrap(), "--messages", file.to_str().unwrap()],
        b"",
    )
    .0
}

fn n_tokens(model: &Path, text: &str) -> usize {
    let (ids, _) = run(&["tokenize", model.to_str().unwrap(), "--ids", text], b"");
    serde_json::from_str::<Vec<u32>>(&ids).unwrap().len()
}

/// The number after `key` in a timing line.
fn number_after(line: &str, key: &str) -> usize {
    line.split(key)
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {key:?} in {line:?}"))
}

/// "Prefill: N tokens ... | Cached: M tokens" → (N, M).
fn prefill_and_cached(line: &str) -> (usize, usize) {
    (number_after(line, "Prefill: "), number_after(line, "Cached: "))
}

#[test]
fn three_turns_in_a_terminal_equal_one_shot_generation_and_prefill_only_new_tokens() {
    let model = common::tiny_model("qwen2", "Q8_0");
    let m = model.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let system = "Be brief.";
    let mut pty = Pty::spawn(&[m, "-cnv", "-sys", system, "--greedy", "-n", "16"]);
    pty.read_until(0, PROMPT, Duration::from_secs(30));
    let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
    let mut previous_prompt = 0;
    for (turn, user) in ["hello there", "what is a tree?", "thanks"].iter().enumerate() {
        messages.push(serde_json::json!({"role": "user", "content": user}));
        let rendered = render(&model, dir.path(), &serde_json::Value::from(messages.clone()));
        let (expected, _) = run(&[m, "--no-template", &rendered, "--greedy", "-n", "16"], b"");
        let from = pty.seen.len();
        pty.send(format!("{user}\r").as_bytes());
        let shown = pty.read_until(from, PROMPT, Duration::from_secs(30));
        // The terminal turns each \n into \r\n.
        let expected_shown = expected.replace('\n', "\r\n");
        assert!(
            shown.contains(&expected_shown),
            "turn {turn}: the reply differs from one-shot generation {expected:?}: {shown:?}"
        );
        let lines = pty.wait_stderr_lines("Prefill:", turn + 1, Duration::from_secs(30));
        let (prefilled, cached) = prefill_and_cached(&lines[turn]);
        let total = n_tokens(&model, &rendered);
        assert_eq!(prefilled + cached, total, "turn {turn}: {}", lines[turn]);
        // Only what follows the previous turn's prompt (reply included) is new.
        assert!(cached >= previous_prompt, "turn {turn}: {}", lines[turn]);
        previous_prompt = total;
        messages.push(serde_json::json!({"role": "assistant", "content": expected}));
    }
    let from = pty.seen.len();
    pty.send(b"\x04");
    let _ = pty.read_until(from, "", Duration::from_secs(1));
    let status = wait(&mut pty.child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "stderr: {}", pty.stderr());
}

fn wait(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(start.elapsed() < timeout, "no exit within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ctrl_c_stops_a_reply_and_returns_to_the_prompt_and_ctrl_d_leaves() {
    let model = common::tiny_model("qwen2", "Q8_0");
    // Replies without end: only Ctrl-C stops them (the context shifts as they run).
    let mut pty = Pty::spawn(&[
        model.to_str().unwrap(),
        "--cnv",
        "--greedy",
        "-n",
        "-1",
        "--ignore-eos",
        // Small enough that 300 ms of generation shifts it whatever the machine's speed.
        "--n-ctx",
        "64",
        "--context-shift",
    ]);
    pty.read_until(0, PROMPT, Duration::from_secs(30));
    for (turn, user) in ["write forever", "and again"].iter().enumerate() {
        let from = pty.seen.len();
        pty.send(format!("{user}\r").as_bytes());
        // Some of the reply, then Ctrl-C.
        let echo_end = pty.read_until(from, "\r\n", Duration::from_secs(30)).len();
        pty.read_until(from + echo_end, " ", Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(300));
        pty.send(b"\x03");
        pty.read_until(from, PROMPT, Duration::from_secs(30));
        let lines = pty.wait_stderr_lines("Prefill:", turn + 1, Duration::from_secs(30));
        assert!(lines[turn].contains("interrupted"), "{}", lines[turn]);
        assert!(lines[turn].contains("Context shifts:"), "{}", lines[turn]);
    }
    pty.send(b"\x04");
    let status = wait(&mut pty.child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "stderr: {}", pty.stderr());
}

#[test]
fn a_scripted_conversation_three_times_the_context_long_runs_to_its_end_in_flat_memory() {
    let model = common::tiny_model("qwen2", "Q8_0");
    let turns: String = (0..40).map(|i| format!("tell me about thing number {i}\n")).collect();
    let mut child = Command::new(BIN)
        .args([
            model.to_str().unwrap(),
            "--cnv",
            "-sys",
            "Be brief.",
            "--greedy",
            "-n",
            "24",
            "--n-ctx",
            "256",
            "--context-shift",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    let rss = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let rss = Arc::clone(&rss);
        std::thread::spawn(move || {
            while let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                if let Some(kb) = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                {
                    rss.lock().unwrap().push(kb);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    // One turn at a time, slowly enough for the memory samples to see every turn.
    for line in turns.lines() {
        writeln!(stdin, "{line}").unwrap();
        std::thread::sleep(Duration::from_millis(30));
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    sampler.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("Prefill:")).collect();
    assert_eq!(lines.len(), 40, "{stderr}");
    let evaluated: usize = lines
        .iter()
        .map(|l| {
            let (prefilled, _) = prefill_and_cached(l);
            let generated = number_after(l, "Generated: ");
            prefilled + generated
        })
        .sum();
    assert!(evaluated >= 3 * 256, "only {evaluated} tokens went through the context");
    assert!(
        stderr.contains("Context shifts:") || shifted_by_turns(&lines),
        "{stderr}"
    );
    // Once the context has filled, the memory stays where it is.
    let rss = rss.lock().unwrap();
    let after_fill = rss[rss.len() / 3];
    let last = *rss.iter().rev().nth(5).unwrap_or(&rss[rss.len() - 1]);
    let series: Vec<u64> = (0..10).map(|i| rss[i * rss.len() / 10]).collect();
    assert!(
        (last as f64) < after_fill as f64 * 1.1 + 2048.0,
        "RSS {after_fill} kB after a third of the turns, {last} kB at the end (tenths: {series:?})"
    );
}

/// Whether some turn found less cached than the conversation before it held: the context was
/// shifted before that turn was prefilled.
fn shifted_by_turns(lines: &[&str]) -> bool {
    lines.windows(2).any(|w| {
        let (p0, c0) = prefill_and_cached(w[0]);
        let (_, c1) = prefill_and_cached(w[1]);
        c1 < c0 + p0
    })
}

#[test]
fn the_model_alone_on_a_terminal_starts_a_conversation() {
    let model = common::tiny_model("qwen2", "Q8_0");
    let mut pty = Pty::spawn(&[model.to_str().unwrap(), "--greedy", "-n", "8"]);
    pty.read_until(0, PROMPT, Duration::from_secs(30));
    let from = pty.seen.len();
    pty.send(b"hello\r");
    pty.read_until(from, PROMPT, Duration::from_secs(30));
    pty.wait_stderr_lines("Prefill:", 1, Duration::from_secs(30));
    pty.send(b"\x04");
    let status = wait(&mut pty.child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "stderr: {}", pty.stderr());
}

#[test]
fn a_p_prompt_is_the_first_turn_and_an_unknown_command_is_never_sent_to_the_model() {
    let model = common::tiny_model("qwen2", "Q8_0");
    let m = model.to_str().unwrap();
    let base = ["-m", m, "-cnv", "--greedy", "-n", "4", "--n-ctx", "512"];
    // -p is answered before anything is read; then the piped turns.
    let mut with_p = base.to_vec();
    with_p.extend(["-p", "Hello"]);
    let (first, log) = run(&with_p, b"/bogus\n/read /no/such/file\n");
    assert_eq!(log.matches("Prefill: ").count(), 1, "one reply, to -p: {log}");
    assert!(log.contains("unknown command /bogus"), "{log}");
    assert!(log.contains("cannot read /no/such/file"), "{log}");
    // The same first turn typed gives the same reply.
    let (typed, _) = run(&base, b"Hello\n");
    assert_eq!(first, typed);
    // /regen writes the last reply again: greedy, the same text twice.
    let (twice, log) = run(&base, b"Hello\n/regen\n");
    assert_eq!(log.matches("Prefill: ").count(), 2, "{log}");
    assert_eq!(twice, format!("{typed}{typed}"));
}

#[test]
fn read_and_glob_add_files_to_the_next_turn_as_llama_cli_does() {
    let model = common::tiny_model("qwen2", "Q8_0");
    let m = model.to_str().unwrap();
    let base = ["-m", m, "-cnv", "--greedy", "-n", "4", "--n-ctx", "512"];
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.txt"), dir.path().join("b.txt"));
    std::fs::write(&a, "alpha\n").unwrap();
    std::fs::write(&b, "beta\n").unwrap();
    // The turn that -p sends, written out: each file under its header, then the typed line.
    let as_first_turn = |text: &str| {
        let mut args = base.to_vec();
        args.extend(["--no-escape", "-p", text]);
        run(&args, b"").0
    };
    let (read, log) = run(&base, format!("/read {}\nHello\n", a.display()).as_bytes());
    assert!(
        log.contains(&format!("added {} to the next turn", a.display())),
        "{log}"
    );
    assert_eq!(log.matches("Prefill: ").count(), 1, "{log}");
    assert_eq!(
        read,
        as_first_turn(&format!("--- File: {} ---\nalpha\nHello", a.display()))
    );
    let (globbed, log) = run(
        &base,
        format!("/glob {}/*.txt\nHello\n", dir.path().display()).as_bytes(),
    );
    assert_eq!(log.matches("Prefill: ").count(), 1, "{log}");
    let both = format!(
        "--- File: {} ---\nalpha\n--- File: {} ---\nbeta\nHello",
        a.display(),
        b.display()
    );
    assert_eq!(globbed, as_first_turn(&both));
    let (_, log) = run(&base, format!("/glob {}/*.none\n", dir.path().display()).as_bytes());
    assert!(log.contains("no file matches"), "{log}");
}
