//! The command line's main job on the tiny model, and its refusals: unknown architecture,
//! missing tensor, wrong shape, a prompt beyond the context, and the backend fence — each a
//! clear error with a non-zero exit, never a panic.

mod common;

use minfer::gguf::{GgufFile, GgufWriter, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn minfer(args: &[&str], model: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg(model)
        .args(args)
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A copy of the tiny qwen2 model with `edit` applied to its metadata and tensors.
fn edited_model(dir: &Path, edit: impl Fn(&str, &mut Vec<u64>) -> bool, meta: impl Fn(&mut GgufWriter)) -> PathBuf {
    let src = GgufFile::open(common::tiny_model("qwen2", "F32")).unwrap();
    let mut w = GgufWriter::new();
    w.set_all(src.metadata());
    meta(&mut w);
    for t in src.tensors() {
        let mut shape = t.shape.clone();
        if !edit(&t.name, &mut shape) {
            continue;
        }
        let n: u64 = shape.iter().product();
        let data = if n == t.n_elements() {
            src.tensor_data(t).to_vec()
        } else {
            vec![0u8; n as usize * 4]
        };
        w.add_tensor(&t.name, t.ggml_type, &shape, data).unwrap();
    }
    let path = dir.join("edited.gguf");
    w.write_file(&path).unwrap();
    path
}

#[test]
fn the_tiny_model_generates_greedily_and_prints_the_timing_line() {
    let out = minfer(
        &["Hello world", "--no-template", "--greedy", "-n", "8", "--ignore-eos"],
        &common::tiny_model("qwen2", "F32"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // llama.cpp's greedy continuation of "Hello world" on this model (tests/fixtures/tiny-reference).
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        " develop styleKEPage asourceformweb"
    );
    let err = stderr(&out);
    assert!(
        err.contains("Prefill: 4 tokens") && err.contains("Generated: 8 tokens") && err.contains("Total:"),
        "{err}"
    );
}

#[test]
fn a_stop_string_ends_generation_and_is_not_printed() {
    let out = minfer(
        &["Hello world", "--no-template", "--greedy", "-n", "16", "--stop", "Page"],
        &common::tiny_model("qwen2", "F32"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), " develop styleKE");
}

#[test]
fn the_prompt_is_read_from_standard_input_when_absent() {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg(common::tiny_model("qwen2", "F32"))
        .args(["--no-template", "--greedy", "-n", "3", "--ignore-eos"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"Hello world").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), " develop styleKE");
}

#[test]
fn an_unknown_architecture_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = edited_model(
        dir.path(),
        |_, _| true,
        |w| {
            w.set("general.architecture", Value::String("mamba".into()));
        },
    );
    let out = minfer(&["hi"], &path);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("unsupported architecture 'mamba'"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_missing_tensor_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = edited_model(dir.path(), |name, _| name != "blk.1.ffn_up.weight", |_| {});
    let out = minfer(&["hi"], &path);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("tensor 'blk.1.ffn_up.weight' is missing"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_tensor_of_the_wrong_shape_is_refused_with_both_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let path = edited_model(
        dir.path(),
        |name, shape| {
            if name == "blk.0.attn_k.weight" {
                *shape = vec![256, 64];
            }
            true
        },
        |_| {},
    );
    let out = minfer(&["hi"], &path);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("tensor 'blk.0.attn_k.weight' has shape [256, 64], expected [256, 128]"),
        "{err}"
    );
}

#[test]
fn a_prompt_beyond_the_context_is_refused_with_both_numbers() {
    let out = minfer(
        &["one two three four five six seven", "--no-template", "--n-ctx", "4"],
        &common::tiny_model("qwen2", "F32"),
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("the prompt has 10 tokens, more than the context of 4"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn the_backend_fence_refuses_unknown_and_absent_backends_distinctly() {
    let model = common::tiny_model("qwen2", "F32");
    let out = minfer(&["hi", "--backend", "tpu"], &model);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("unknown backend 'tpu'"), "{}", stderr(&out));
    // CUDA is built in (feature `cuda`, default): on a machine without the driver (CI's) the
    // refusal names the library it looked for; a build without the feature says so instead.
    let out = minfer(&["hi", "--backend", "cuda"], &model);
    let err = stderr(&out);
    if minfer::backends::probe(minfer::graph::Backend::CUDA).is_ok() {
        eprintln!("this machine has a CUDA device: the refusals of --backend cuda are not exercised here");
    } else if cfg!(feature = "cuda") {
        assert!(!out.status.success());
        let no_driver = err.contains("backend 'cuda' is built in but its driver is missing: libcuda.so.1");
        let no_device = err.contains("backend 'cuda' is built in and its driver loads, but there is no device");
        assert!(no_driver || no_device, "{err}");
    } else {
        assert!(err.contains("backend 'cuda' is not part of this build"), "{err}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg(&model)
        .args(["hi", "-n", "1"])
        .env("MINFER_BACKENDS", "metal")
        .output()
        .unwrap();
    assert!(
        stderr(&out).contains("backend 'metal' is not part of this build"),
        "{}",
        stderr(&out)
    );
    let out = minfer(
        &[
            "Hello world",
            "--no-template",
            "--greedy",
            "-n",
            "2",
            "--backend",
            "cpu",
        ],
        &model,
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn dump_graph_writes_the_graph_the_run_uses_and_exits() {
    let dir = tempfile::tempdir().unwrap();
    let dot = dir.path().join("g.dot");
    let json = dir.path().join("g.json");
    let out = minfer(
        &[
            "Hello world",
            "--no-template",
            "--dump-graph",
            dot.to_str().unwrap(),
            "--dump-graph-json",
            json.to_str().unwrap(),
        ],
        &common::tiny_model("qwen2", "F32"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stdout.is_empty(), "no generation after a dump");
    let dot = std::fs::read_to_string(dot).unwrap();
    assert!(
        dot.starts_with("digraph minfer {") && dot.contains("attn_norm-1") && dot.contains("fillcolor=lightyellow")
    );
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    assert_eq!(json["format"], "minfer-graph");
    assert_eq!(json["kind"], "prefill");
    let nodes = json["nodes"].as_array().unwrap();
    // The fusion the run applies is in the export: every FFN is a SwiGLU, and all nodes are on the CPU.
    assert_eq!(nodes.iter().filter(|n| n["op"] == "SwiGLU").count(), 2);
    assert!(nodes.iter().all(|n| n["backend"] == "cpu"));
    assert!(
        nodes.iter().any(|n| n["name"] == "attn_out_tail"),
        "the tail-row reduction of a 4-token prompt"
    );
}

#[test]
fn eval_prints_the_top_logits_and_writes_all_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("logits.f32");
    let out = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(["eval"])
        .arg(common::tiny_model("qwen2", "F32"))
        .args(["Hello world", "--top", "3", "--out", out_file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let top: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // llama.cpp's top-1 at the last position of "Hello world" is token 2225 (logit 51.10).
    assert_eq!(top[0][0], 2225);
    assert!((top[0][1].as_f64().unwrap() - 51.0977707).abs() < 0.5, "{top}");
    let all = common::read_f32(&out_file);
    assert_eq!(all.len(), 4003);
    assert_eq!(all[2225], top[0][1].as_f64().unwrap() as f32);
}

/// Runs the binary with `args` as given (no model inserted).
fn minfer_raw(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_minfer")).args(args).output().unwrap()
}

/// `minfer` with `base` then `extra`, which must succeed.
fn minfer_ok(base: &[&str], extra: &[&str]) -> Output {
    let args: Vec<&str> = base.iter().chain(extra).copied().collect();
    let out = minfer_raw(&args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    out
}

/// `minfer` with `args` fails, saying `says` on stderr.
fn assert_refused(args: &[&str], says: &str) {
    let out = minfer_raw(args);
    assert!(
        !out.status.success() && stderr(&out).contains(says),
        "{args:?}: {}",
        stderr(&out)
    );
}

#[test]
fn llama_cpp_style_command_lines_give_what_the_positional_ones_give() {
    let model = common::tiny_model("qwen2", "Q8_0");
    let m = model.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, "Hello there").unwrap();
    let reference = minfer_raw(&[m, "Hello there", "-n", "8", "--greedy", "--n-ctx", "512", "--seed", "3"]);
    assert!(reference.status.success(), "{}", stderr(&reference));
    for args in [
        vec![
            "-m",
            m,
            "-p",
            "Hello there",
            "-n",
            "8",
            "--greedy",
            "-c",
            "512",
            "-s",
            "3",
        ],
        vec![
            "-m",
            m,
            "Hello there",
            "-n",
            "8",
            "--greedy",
            "--ctx-size",
            "512",
            "-s",
            "3",
        ],
        vec![
            "--model",
            m,
            "--file",
            file.to_str().unwrap(),
            "-n",
            "8",
            "--greedy",
            "-c",
            "512",
            "-s",
            "3",
        ],
    ] {
        let out = minfer_raw(&args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert_eq!(out.stdout, reference.stdout, "{args:?}");
    }
    // -s -1 draws a seed and says which; -s -2 is refused.
    let out = minfer_raw(&["-m", m, "-p", "hi", "-n", "2", "-s", "-1"]);
    assert!(
        out.status.success() && stderr(&out).contains("--seed "),
        "{}",
        stderr(&out)
    );
    let out = minfer_raw(&["-m", m, "-p", "hi", "-s", "-2"]);
    assert!(!out.status.success() && stderr(&out).contains("--seed -2 is out of range"));
    // -e turns the escapes of the prompt and of -r (a stop string) into their characters.
    let escaped = minfer_raw(&["-m", m, "-p", r"a\tb", "-e", "--no-template", "-n", "1", "--greedy"]);
    let literal = minfer_raw(&["-m", m, "-p", "a\tb", "--no-template", "-n", "1", "--greedy"]);
    assert_eq!(escaped.stdout, literal.stdout);
    assert!(stderr(&escaped).contains("Prefill: 2 tokens"), "{}", stderr(&escaped));
    let stopped = minfer_raw(&[
        "-m",
        m,
        "-p",
        "hi",
        "-n",
        "64",
        "--greedy",
        "--ignore-eos",
        "-e",
        "-r",
        r"\n",
    ]);
    assert!(!String::from_utf8_lossy(&stopped.stdout).trim_end().contains('\n'));
}

#[test]
fn flash_attention_and_gpu_layer_flags_are_honoured_where_they_can_be_and_refused_by_name() {
    let model = common::tiny_model("qwen2", "Q8_0");
    let m = model.to_str().unwrap();
    let base = ["-m", m, "-p", "Hello", "-n", "4", "--greedy"];
    let reference = minfer_ok(&base, &[]);
    // The attention is always the fused kernel and everything runs on the CPU: these ask for
    // exactly that.
    for extra in [["-fa", "on"], ["-fa", "1"], ["-ngl", "0"]] {
        assert_eq!(minfer_ok(&base, &extra).stdout, reference.stdout, "{extra:?}");
    }
    // -ngl 99 with no usable GPU (this machine): llama.cpp's warning, and the CPU's text.
    if minfer::engine::usable_gpu().is_err() {
        let out = minfer_ok(&base, &["-ngl", "99"]);
        assert_eq!(out.stdout, reference.stdout);
        assert!(stderr(&out).contains("no GPU is usable here"), "{}", stderr(&out));
        // Naming the backend asks for the device: refused when it cannot be had.
        assert_refused(&["-m", m, "-p", "Hello", "-ngl", "99", "--backend", "cuda,cpu"], "cuda");
    }
    for (args, says) in [
        (vec!["-m", m, "-p", "Hello", "-fa", "off"], "-fa off cannot be honoured"),
        (vec!["serve", m, "-fa", "0"], "-fa 0 cannot be honoured"),
    ] {
        assert_refused(&args, says);
    }
}

#[test]
fn llama_cpp_output_model_file_and_template_flags_are_honoured_or_refused_by_name() {
    let model = common::tiny_model("qwen2", "Q8_0");
    let m = model.to_str().unwrap();
    let base = ["-m", m, "-p", "Hello", "-n", "6", "--greedy"];
    let run = |extra: &[&str]| minfer_ok(&base, extra);
    let reference = run(&[]);
    // Reading the file instead of mapping it, and llama.cpp's --jinja, change nothing.
    assert_eq!(run(&["--no-mmap"]).stdout, reference.stdout);
    assert_eq!(run(&["--jinja"]).stdout, reference.stdout);
    // --mlock works where the locked-memory limit allows the 3 MB model, and otherwise says so.
    let mut locked = base.to_vec();
    locked.push("--mlock");
    let out = minfer_raw(&locked);
    if out.status.success() {
        assert_eq!(out.stdout, reference.stdout);
    } else {
        assert!(stderr(&out).contains("ulimit -l"), "{}", stderr(&out));
    }
    // --color wraps the generated text in ANSI colour; without the codes it is the same text.
    let colored = String::from_utf8(run(&["--color"]).stdout).unwrap();
    assert!(
        colored.contains("\x1b[33m") && colored.contains("\x1b[0m"),
        "{colored:?}"
    );
    let plain = colored.replace("\x1b[33m", "").replace("\x1b[0m", "");
    assert_eq!(plain.as_bytes(), reference.stdout.as_slice());
    // --log-disable leaves standard error empty.
    assert!(run(&["--log-disable"]).stderr.is_empty());
    // A chat template from a file replaces the model's: the prompt's length changes with it.
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("plain.jinja");
    std::fs::write(&template, "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
    let templated = run(&["--chat-template-file", template.to_str().unwrap()]);
    let prefill = |out: &Output| {
        stderr(out)
            .lines()
            .find(|l| l.starts_with("Prefill: "))
            .map(|l| l.split(" in ").next().unwrap().to_string())
    };
    assert_eq!(prefill(&templated), prefill(&run(&["--no-template"])));
    assert_ne!(prefill(&templated), prefill(&reference));
    assert_eq!(templated.stdout, run(&["--no-template"]).stdout);
    // llama.cpp's built-in template names: chatml is the tiny Qwen2 model's own format (its
    // template adds a default system turn, so only the ending is compared); one minfer lacks is
    // refused by name.
    let chatml = run(&["--chat-template", "chatml"]);
    let raw = minfer_ok(
        &["-m", m, "-n", "6", "--greedy", "--no-template"],
        &["-p", "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"],
    );
    assert_eq!(chatml.stdout, raw.stdout);
    assert_eq!(prefill(&chatml), prefill(&raw));
    let refused = minfer_raw(&["-m", m, "-p", "Hello", "--chat-template", "grok-2"]);
    assert!(
        stderr(&refused).contains("built-in template grok-2 is not among minfer's"),
        "{}",
        stderr(&refused)
    );
    // The seed is drawn by default, and said, so that a sampled run can be repeated.
    let sampled = minfer_raw(&["-m", m, "-p", "Hello", "-n", "6", "--temp", "0.8"]);
    let said = stderr(&sampled);
    let seed = said
        .lines()
        .find_map(|l| l.strip_prefix("seed: "))
        .and_then(|l| l.split(' ').next())
        .unwrap_or_else(|| panic!("no drawn seed in: {said}"));
    let again = minfer_raw(&["-m", m, "-p", "Hello", "-n", "6", "--temp", "0.8", "-s", seed]);
    assert_eq!(again.stdout, sampled.stdout);
}

#[test]
fn batch_and_ubatch_sizes_set_the_prefill_passes_and_change_no_token() {
    let model = common::tiny_model("qwen2", "Q8_0");
    let m = model.to_str().unwrap();
    let prompt = "Hello there, how are you doing on this fine day?";
    let run = |extra: &[&str]| minfer_ok(&["-m", m, "-p", prompt, "-n", "6", "--greedy"], extra);
    let whole = run(&[]);
    let n_prompt: usize = stderr(&whole)
        .split("Prefill: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(!stderr(&whole).contains(" passes)"), "{}", stderr(&whole));
    for (extra, chunk) in [
        (vec!["-ub", "5"], 5),
        (vec!["-b", "7"], 7),
        (vec!["-b", "16", "-ub", "9"], 9),
    ] {
        let out = run(&extra);
        assert_eq!(out.stdout, whole.stdout, "{extra:?}");
        let passes = format!(", {} passes)", n_prompt.div_ceil(chunk));
        assert!(stderr(&out).contains(&passes), "{extra:?}: {}", stderr(&out));
    }
}

#[test]
fn n_minus_two_generates_until_the_context_is_full_and_says_so() {
    let model = common::tiny_model("qwen2", "Q8_0");
    let out = minfer_raw(&[
        "-m",
        model.to_str().unwrap(),
        "-p",
        "hi",
        "-n",
        "-2",
        "-c",
        "64",
        "--ignore-eos",
        "--greedy",
    ]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("the context of 64 tokens is full (-n -2)"), "{err}");
    assert!(!err.contains("Context shifts"), "{err}");
}

#[test]
fn llama_cpp_sampler_flags_run_reproducibly_and_bad_values_are_refused_by_flag() {
    let model = common::tiny_model("qwen2", "Q8_0");
    let m = model.to_str().unwrap();
    let base = ["-m", m, "-p", "Hello", "-n", "6", "--ignore-eos", "-s", "7"];
    let samplers = [
        "--typical",
        "0.9",
        "--top-n-sigma",
        "1.5",
        "--xtc-probability",
        "0.5",
        "--xtc-threshold",
        "0.1",
        "--dry-multiplier",
        "0.8",
        "--dry-sequence-breaker",
        "none",
        "--dry-sequence-breaker",
        ".",
        "--samplers",
        "penalties;dry;top-k;typical;top_p;min_p;xtc;temp",
    ];
    let first = minfer_ok(&base, &samplers);
    assert_eq!(minfer_ok(&base, &samplers).stdout, first.stdout);
    for mirostat in ["1", "2"] {
        let extra = ["--mirostat", mirostat, "--mirostat-lr", "0.2", "--mirostat-ent", "4"];
        assert_eq!(minfer_ok(&base, &extra).stdout, minfer_ok(&base, &extra).stdout);
    }
    // Greedy in any order: the temperature stage keeps the best token.
    let greedy = minfer_ok(&base, &["--temp", "0", "--repeat-penalty", "1"]);
    let reordered = minfer_ok(
        &base,
        &[
            "--temp",
            "0",
            "--repeat-penalty",
            "1",
            "--samplers",
            "temperature;top_k;min_p",
        ],
    );
    assert_eq!(reordered.stdout, greedy.stdout);
    for (extra, says) in [
        (["--mirostat", "3"], "--mirostat 3 is out of range"),
        (["--samplers", "top_k;wizard"], "unknown sampler 'wizard'"),
        (["--typical", "1.5"], "--typical 1.5 is out of range"),
        (["--dry-base", "0.5"], "--dry-base 0.5 is out of range"),
        (
            ["--dry-penalty-last-n", "-2"],
            "--dry-penalty-last-n -2 is out of range",
        ),
        (["--xtc-probability", "2"], "--xtc-probability 2 is out of range"),
    ] {
        let args: Vec<&str> = base.iter().chain(&extra).copied().collect();
        assert_refused(&args, says);
    }
}

#[test]
fn llama_cpp_defaults_escapes_a_one_turn_system_prompt_and_an_empty_prompt_refused() {
    let model = common::tiny_model("qwen2", "Q8_0");
    let m = model.to_str().unwrap();
    let base = ["-m", m, "-n", "4", "--greedy", "--n-ctx", "512"];
    // Escapes are on by default (llama.cpp's -e): `\n` in the prompt is a newline.
    let escaped = minfer_ok(&base, &["-p", r"Hello\nthere"]);
    let newline = minfer_ok(&base, &["-p", "Hello\nthere", "--no-escape"]);
    assert_eq!(escaped.stdout, newline.stdout);
    // -sys without -cnv: one turn after a system turn, as the template renders them.
    let dir = tempfile::tempdir().unwrap();
    let messages = dir.path().join("m.json");
    std::fs::write(
        &messages,
        r#"[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]"#,
    )
    .unwrap();
    let rendered = minfer_ok(&["render", m, "--messages", messages.to_str().unwrap()], &[]).stdout;
    let rendered = String::from_utf8(rendered).unwrap();
    let with_sys = minfer_ok(&base, &["-sys", "Be brief.", "-p", "Hello"]);
    let raw = minfer_ok(&base, &["--no-template", "--no-escape", "-p", &rendered]);
    assert_eq!(with_sys.stdout, raw.stdout);
    // Nothing on standard input is an error, not a reply to an empty turn.
    let out = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(base)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        !out.status.success() && stderr(&out).contains("the prompt is empty"),
        "{}",
        stderr(&out)
    );
    // A mistyped subcommand gets a did-you-mean.
    assert_refused(&["serv", m], "did you mean `minfer serve`");
}

#[test]
fn by_default_the_context_is_the_training_context_and_generation_runs_until_it_is_full() {
    // llama.cpp's -c 0 and -n -1: the tiny model was trained on 2048 positions, which fit any
    // machine's memory, and with no context shift a full context ends the generation.
    let model = common::tiny_model("qwen2", "Q8_0");
    let out = minfer(&["hi", "--ignore-eos", "--greedy"], &model);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("the context of 2048 tokens is full (--context-shift goes on past it)"),
        "{err}"
    );
    let number_after = |key: &str| -> usize {
        let rest = &err[err.find(key).unwrap() + key.len()..];
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    // Every cell holds a token read, and the last token sampled needs none.
    assert_eq!(number_after("Prefill: ") + number_after("Generated: "), 2049, "{err}");
    assert!(!err.contains("Context shifts"), "{err}");
}

#[test]
fn a_thinking_templates_reasoning_goes_to_standard_error_and_the_answer_to_standard_output() {
    // A template whose prompt opens the reasoning: the tiny model never closes it, so its whole
    // reply is reasoning — on stderr, stdout empty — and --reasoning-format none prints it as
    // generated on stdout.
    let model = common::tiny_model("qwen2", "Q8_0");
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("think.jinja");
    std::fs::write(
        &template,
        "{%- for m in messages %}{{ m.content }}{% endfor %}{{ '<think>\\n' }}{# replies close it with </think> #}",
    )
    .unwrap();
    let base = ["-m", model.to_str().unwrap(), "-p", "Hello", "-n", "8", "--greedy"];
    let mut args = base.to_vec();
    args.extend(["--chat-template-file", template.to_str().unwrap()]);
    let split = minfer_ok(&args, &[]);
    let plain = minfer_ok(&args, &["--reasoning-format", "none"]);
    let plain_text = String::from_utf8(plain.stdout).unwrap();
    assert!(!plain_text.trim().is_empty());
    assert!(split.stdout.is_empty(), "{:?}", String::from_utf8_lossy(&split.stdout));
    let err = stderr(&split);
    let reasoning = &err[..err.find("Prefill: ").unwrap()];
    assert_eq!(reasoning.trim(), plain_text.trim());
}

#[test]
fn a_reasoning_budget_closes_the_reasoning_and_the_model_answers_on_standard_output() {
    // The same opened template: with --reasoning-budget 3 the closing tag is forced after three
    // tokens, so the rest of the reply is the answer; budget 0 answers at once.
    let model = common::tiny_model("qwen2", "Q8_0");
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("think.jinja");
    std::fs::write(
        &template,
        "{%- for m in messages %}{{ m.content }}{% endfor %}{{ '<think>\\n' }}{# replies close it with </think> #}",
    )
    .unwrap();
    let base = ["-m", model.to_str().unwrap(), "-p", "Hello", "-n", "10", "--greedy"];
    let mut args = base.to_vec();
    args.extend(["--chat-template-file", template.to_str().unwrap()]);
    let plain = |budget: &str| {
        let out = minfer_ok(&args, &["--reasoning-format", "none", "--reasoning-budget", budget]);
        String::from_utf8(out.stdout).unwrap()
    };
    let (three, zero) = (plain("3"), plain("0"));
    assert!(zero.starts_with("</think>"), "{zero:?}");
    let unlimited = plain("-1");
    assert!(!unlimited.contains("</think>"), "{unlimited:?}");
    let closed = three.find("</think>").expect("the closing tag is forced");
    // What came before it is the start of the unlimited reply: the model's own three tokens.
    assert!(
        closed > 0 && unlimited.starts_with(&three[..closed]),
        "{three:?} {unlimited:?}"
    );
    let split = minfer_ok(&args, &["--reasoning-budget", "3"]);
    let answer = String::from_utf8(split.stdout).unwrap();
    assert_eq!(answer.trim(), three[closed + "</think>".len()..].trim());
}

#[test]
fn info_into_a_reader_that_stops_early_ends_quietly() {
    // `minfer info M | head -1`: the reader goes before the output is written.
    let model = common::tiny_model("qwen2", "Q8_0");
    let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(["info", model.to_str().unwrap(), "--tensors"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(
        out.status.success() && !err.contains("panicked"),
        "{:?}: {err}",
        out.status
    );
}
