//! Watching the forward passes: after each step a session hands its observers the graph it ran
//! and the timed runs of its nodes (and any copies and waits between backends); the Chrome
//! trace-event writer behind `--trace FILE` / `MINFER_TRACE` is one such observer, the profile
//! table another. A session without observers reads no clock.
//!
//! This module records and writes; it changes nothing about how a step executes.

use crate::graph::scheduler::{Split, Timed, Work};
use crate::graph::{CNode, ComputeGraph};
use serde_json::{json, Value};
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// One executed forward pass, as an observer sees it.
pub struct StepRecord<'a> {
    /// The graph that ran (after backend assignment and fusion).
    pub graph: &'a ComputeGraph,
    /// Its splits: runs of nodes on one backend.
    pub splits: &'a [Split],
    /// Every node run, copy and wait, in execution order.
    pub timings: &'a [Timed],
    /// When the step started (before the graph was prepared and its inputs filled) and ended
    /// (after the logits were read back).
    pub start: Instant,
    /// See `start`.
    pub end: Instant,
    /// Tokens of the batch.
    pub n_tokens: usize,
    /// Rows of logits it produced.
    pub n_outputs: usize,
    /// Whether the graph was built for this step (else a cached one was reused).
    pub rebuilt: bool,
}

/// Something that watches every step of a session.
pub trait StepObserver: Send {
    /// Called after each forward pass that succeeded.
    fn on_step(&mut self, step: &StepRecord<'_>);
}

/// The layer a node belongs to: from its op or metadata, else from its name's `-N` suffix
/// (`attn_norm-3`); `None` for the nodes outside the layers (embedding, output head).
pub fn node_layer(node: &CNode) -> Option<usize> {
    node.kv_layer()
        .or_else(|| node.name.rsplit_once('-').and_then(|(_, n)| n.parse().ok()))
}

/// A Chrome trace-event file (the JSON object format, which Perfetto and `chrome://tracing`
/// open): one complete event per executed node per step, nested under one event per step, on
/// one track per session. The file is valid JSON after every step: the closing brackets are
/// written after each step and overwritten by the next.
pub struct ChromeTrace {
    out: BufWriter<File>,
    path: PathBuf,
    epoch: Instant,
    n_steps: u64,
    n_tracks: u64,
    /// The first write error; later steps are not written.
    failed: Option<std::io::Error>,
}

const TRAILER: &[u8] = b"\n]}\n";

impl ChromeTrace {
    /// Creates (or truncates) `path` and writes the file's head.
    pub fn create(path: &Path) -> std::io::Result<ChromeTrace> {
        let mut out = BufWriter::new(File::create(path)?);
        out.write_all(br#"{"displayTimeUnit":"ms","otherData":{"producer":"minfer"},"traceEvents":["#)?;
        let process = json!({"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "minfer"}});
        write!(out, "\n{process}")?;
        out.write_all(TRAILER)?;
        out.flush()?;
        Ok(ChromeTrace {
            out,
            path: path.to_path_buf(),
            epoch: Instant::now(),
            n_steps: 0,
            n_tracks: 0,
            failed: None,
        })
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The first write error, if writing failed.
    pub fn error(&self) -> Option<&std::io::Error> {
        self.failed.as_ref()
    }

    fn micros(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.epoch).as_nanos() as f64 / 1e3
    }

    fn append(&mut self, events: &[Value]) {
        if self.failed.is_some() {
            return;
        }
        let result = (|| -> std::io::Result<()> {
            self.out.seek(SeekFrom::End(-(TRAILER.len() as i64)))?;
            for event in events {
                write!(self.out, ",\n{event}")?;
            }
            self.out.write_all(TRAILER)?;
            self.out.flush()
        })();
        if let Err(e) = result {
            self.failed = Some(e);
        }
    }

    /// A new track, `session N`; its thread id.
    fn new_track(&mut self) -> u64 {
        self.n_tracks += 1;
        let tid = self.n_tracks;
        let name = format!("session {tid}");
        self.append(&[json!({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": name}})]);
        tid
    }

    fn write_step(&mut self, tid: u64, step: &StepRecord<'_>) {
        let graph = step.graph;
        let n = self.n_steps;
        self.n_steps += 1;
        let kind = if step.n_tokens == 1 { "decode" } else { "prefill" };
        let mut events = Vec::with_capacity(step.timings.len() + 1);
        events.push(json!({
            "name": format!("{kind} ({} tokens)", step.n_tokens),
            "cat": "step",
            "ph": "X",
            "pid": 1,
            "tid": tid,
            "ts": self.micros(step.start),
            "dur": step.end.saturating_duration_since(step.start).as_nanos() as f64 / 1e3,
            "args": {
                "step": n, "kind": kind, "n_tokens": step.n_tokens, "n_outputs": step.n_outputs,
                "graph_uid": graph.uid, "rebuilt": step.rebuilt, "n_splits": step.splits.len(),
            },
        }));
        for t in step.timings {
            let node = &graph.nodes[t.node];
            let (name, cat, backend) = match t.work {
                Work::Execute => (node.name.clone(), node.op.name().to_string(), node.backend),
                Work::CopyTo(to) => (format!("copy {} to {to}", node.name), "copy".into(), Some(to)),
                Work::Synchronize(b) => (format!("synchronize {b}"), "synchronize".into(), Some(b)),
            };
            let inputs: Vec<Value> = node
                .src
                .iter()
                .map(|&s| {
                    let src = &graph.nodes[s];
                    json!({"name": src.name, "shape": src.out_shape, "dtype": src.out_dtype.name()})
                })
                .collect();
            events.push(json!({
                "name": name,
                "cat": cat,
                "ph": "X",
                "pid": 1,
                "tid": tid,
                "ts": self.micros(t.start),
                "dur": t.end.saturating_duration_since(t.start).as_nanos() as f64 / 1e3,
                "args": {
                    "step": n, "node": node.id, "op": node.op.name(), "layer": node_layer(node),
                    "backend": backend.map(|b| b.to_string()), "shape": node.out_shape,
                    "dtype": node.out_dtype.name(), "inputs": inputs,
                },
            }));
        }
        self.append(&events);
    }
}

/// A session's track in a shared [`ChromeTrace`].
struct TraceTrack {
    trace: Arc<Mutex<ChromeTrace>>,
    tid: u64,
}

impl StepObserver for TraceTrack {
    fn on_step(&mut self, step: &StepRecord<'_>) {
        self.trace
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .write_step(self.tid, step);
    }
}

/// The process's trace file, once [`trace_to`] has opened one: every session created after it
/// records its steps there, on a track of its own.
static PROCESS_TRACE: Mutex<Option<Arc<Mutex<ChromeTrace>>>> = Mutex::new(None);

/// Records every forward pass of the sessions created from now on into a Chrome trace at
/// `path` (`--trace FILE`, `MINFER_TRACE`).
pub fn trace_to(path: &Path) -> std::io::Result<()> {
    let trace = ChromeTrace::create(path)?;
    *PROCESS_TRACE.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(Mutex::new(trace)));
    Ok(())
}

/// The process trace's path and its first write error, if a trace is open and writing failed.
pub fn trace_status() -> Option<(PathBuf, Option<String>)> {
    let guard = PROCESS_TRACE.lock().unwrap_or_else(PoisonError::into_inner);
    let trace = guard.as_ref()?.lock().unwrap_or_else(PoisonError::into_inner);
    Some((trace.path().to_path_buf(), trace.error().map(|e| e.to_string())))
}

/// A new session's observer on the process trace, if one is open.
pub(super) fn process_observer() -> Option<Box<dyn StepObserver>> {
    let trace = Arc::clone(PROCESS_TRACE.lock().unwrap_or_else(PoisonError::into_inner).as_ref()?);
    let tid = trace.lock().unwrap_or_else(PoisonError::into_inner).new_track();
    Some(Box::new(TraceTrack { trace, tid }))
}
