//! The trace (`--trace FILE`): a 16-token generation on the real model writes Chrome
//! trace-event JSON with one event per executed node per step, each with its op, layer,
//! backend, shapes and types, nested in one event per step; the node times add up to the
//! steps' wall time within 10 %.

mod common;

use minfer::engine::{Model, ModelOptions, Session};
use minfer::graph::Op;
use serde_json::Value;
use std::process::Command;

/// Nodes a step of `n_tokens` runs: the graph's live nodes, less the inputs (filled by the
/// host) and the KV views (nothing to compute).
fn executed_nodes(model: &Model, n_tokens: usize) -> usize {
    let mut session = Session::new(model, 4096);
    let graph = session.prepare_graph(n_tokens, 1).unwrap();
    let live = graph.live_nodes();
    graph
        .nodes
        .iter()
        .filter(|n| live[n.id] && !matches!(n.op, Op::Input | Op::KvcacheLoad { .. }))
        .count()
}

#[test]
fn a_trace_of_sixteen_tokens_has_every_executed_node_of_every_step_and_adds_up() {
    let model_path = common::default_model();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let out = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg(&model_path)
        .args([
            "Write a haiku about the sea.",
            "-n",
            "16",
            "--greedy",
            "--ignore-eos",
            "-t",
            "2",
        ])
        .arg("--trace")
        .arg(&trace)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("trace written to"), "{stderr}");
    let json: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).expect("trace-event JSON");
    let events = json["traceEvents"].as_array().unwrap();
    let steps: Vec<&Value> = events.iter().filter(|e| e["cat"] == "step").collect();
    // The prompt in one pass, then one pass per token but the last.
    assert_eq!(steps.len(), 16);
    let model = Model::load(&model_path, &ModelOptions::default()).unwrap();
    let prompt_tokens = steps[0]["args"]["n_tokens"].as_u64().unwrap() as usize;
    let (prefill_nodes, decode_nodes) = (executed_nodes(&model, prompt_tokens), executed_nodes(&model, 1));
    let (mut node_us, mut step_us) = (0.0, 0.0);
    for (i, step) in steps.iter().enumerate() {
        assert_eq!(step["ph"], "X");
        let tid = &step["tid"];
        let (start, dur) = (step["ts"].as_f64().unwrap(), step["dur"].as_f64().unwrap());
        step_us += dur;
        let nodes: Vec<&Value> = events
            .iter()
            .filter(|e| e["cat"] != "step" && e["ph"] == "X" && e["args"]["step"] == i)
            .collect();
        let executed: Vec<&&Value> = nodes.iter().filter(|e| e["cat"] != "synchronize").collect();
        let expected = if i == 0 { prefill_nodes } else { decode_nodes };
        assert_eq!(executed.len(), expected, "step {i}");
        for e in &nodes {
            assert_eq!(&e["tid"], tid);
            let (ts, d) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
            assert!(
                ts >= start && ts + d <= start + dur + 1.0,
                "a node outside its step: {e}"
            );
            node_us += d;
        }
        for e in executed {
            let args = &e["args"];
            assert!(e["name"].is_string() && e["cat"] == args["op"], "{e}");
            assert_eq!(args["backend"], "cpu");
            assert!(args["shape"].as_array().unwrap().len() == 4 && args["dtype"].is_string());
            assert!(args.get("layer").is_some() && args["inputs"].is_array(), "{e}");
        }
    }
    let attn_3 = events
        .iter()
        .find(|e| e["cat"] == "Attn" && e["args"]["layer"] == 3)
        .expect("layer 3's attention");
    assert!(attn_3["args"]["inputs"].as_array().unwrap().len() >= 3);
    let ratio = node_us / step_us;
    eprintln!(
        "nodes {:.1} ms of {:.1} ms of steps ({:.1} %)",
        node_us / 1e3,
        step_us / 1e3,
        ratio * 100.0
    );
    assert!(
        (0.9..=1.0).contains(&ratio),
        "the node times cover {:.1} % of the steps",
        ratio * 100.0
    );
}

/// A trace file that cannot be created is refused before anything runs.
#[test]
fn a_trace_that_cannot_be_written_is_an_error_naming_the_file() {
    let out = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg(common::tiny_model("qwen2", "Q8_0"))
        .args(["hi", "-n", "2", "--trace", "/nonexistent-dir/trace.json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("/nonexistent-dir/trace.json"),
        "{stderr}"
    );
}
