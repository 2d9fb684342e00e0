//! The profile table: time per op kind, per layer and per weight matrix over the steps a
//! session ran while the profile watched, with each row's share of the steps' wall time and,
//! for the matrix products, the weight bytes read per second and the arithmetic rate.
//!
//! This module adds up what [`trace`](super::trace) observes; it times nothing itself.

use super::trace::{node_layer, StepObserver, StepRecord};
use crate::graph::scheduler::Work;
use crate::graph::{CNode, MatMulMeta, NodeMeta};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

/// One row of a profile table.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ProfileRow {
    /// The op kind (`MatMul`, `Attn`, …), the layer (`layer 3`, `outside layers`) or the weight
    /// matrix with its type (`ffn_down.weight Q6_K`).
    pub name: String,
    /// Node runs counted, over every step.
    pub runs: u64,
    /// Seconds spent in them.
    pub seconds: f64,
    /// Their share of the steps' wall time.
    pub share: f64,
    /// Weight bytes they read (matrix products only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_bytes: Option<u64>,
    /// Multiply-adds × 2 they did (matrix products only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flops: Option<u64>,
    /// Weight bytes read per second, GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gb_per_s: Option<f64>,
    /// GFLOP/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gflop_per_s: Option<f64>,
}

/// Where the time of a run of steps went.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Profile {
    /// Steps (forward passes) profiled.
    pub n_steps: u64,
    /// Their wall time, seconds (graph preparation, input upload and logits read included).
    pub step_seconds: f64,
    /// Seconds inside node runs, copies and waits: the rest of the steps is the engine's own.
    pub node_seconds: f64,
    /// By op kind, most time first.
    pub ops: Vec<ProfileRow>,
    /// By layer, in layer order (then the nodes outside the layers).
    pub layers: Vec<ProfileRow>,
    /// By weight matrix (summed over layers), most time first.
    pub matmuls: Vec<ProfileRow>,
}

#[derive(Default)]
struct Sum {
    runs: u64,
    nanos: u128,
    bytes: u64,
    flops: u64,
    matmul: bool,
}

impl Sum {
    fn add(&mut self, nanos: u128, matmul: Option<(u64, u64)>) {
        self.runs += 1;
        self.nanos += nanos;
        if let Some((bytes, flops)) = matmul {
            self.matmul = true;
            self.bytes += bytes;
            self.flops += flops;
        }
    }

    fn row(&self, name: String, step_nanos: u128) -> ProfileRow {
        let seconds = self.nanos as f64 / 1e9;
        let rate = |x: u64| (seconds > 0.0).then(|| x as f64 / seconds / 1e9);
        ProfileRow {
            name,
            runs: self.runs,
            seconds,
            share: if step_nanos > 0 {
                self.nanos as f64 / step_nanos as f64
            } else {
                0.0
            },
            weight_bytes: self.matmul.then_some(self.bytes),
            flops: self.matmul.then_some(self.flops),
            gb_per_s: if self.matmul { rate(self.bytes) } else { None },
            gflop_per_s: if self.matmul { rate(self.flops) } else { None },
        }
    }
}

/// Adds up the steps it observes; [`ProfileRecorder::profile`] makes the table.
#[derive(Default)]
pub struct ProfileRecorder {
    n_steps: u64,
    step_nanos: u128,
    node_nanos: u128,
    ops: BTreeMap<String, Sum>,
    layers: BTreeMap<(bool, usize), Sum>,
    matmuls: BTreeMap<String, Sum>,
}

/// The weight matrices a node multiplies by — one, or the three or two of a fused product —
/// each with how many of it the node reads (an expert product reads one matrix per chosen
/// expert: `k` distinct ones for a decode step, at most every expert for a prompt) and the rows
/// it multiplies.
fn matrices(node: &CNode) -> Vec<(&MatMulMeta, u64, usize)> {
    let n_tokens = node.out_shape[1];
    match &node.meta {
        NodeMeta::MatMul(m) => vec![(m, 1, n_tokens)],
        NodeMeta::MatMulId(m) => {
            let [_, k, nt, _] = node.out_shape;
            vec![(&m.mm, (k * nt).min(m.n_expert) as u64, k * nt)]
        }
        NodeMeta::FusedQkv(m) => vec![(&m.q, 1, n_tokens), (&m.k, 1, n_tokens), (&m.v, 1, n_tokens)],
        NodeMeta::FusedFfn(m) => vec![(&m.gate, 1, n_tokens), (&m.up, 1, n_tokens)],
        _ => Vec::new(),
    }
}

/// Bytes of `count` matrices of `m`'s shape, and the flops of multiplying `n_rows` rows by one.
fn matmul_cost(m: &MatMulMeta, count: u64, n_rows: usize) -> (u64, u64) {
    let bytes = m.weight_type.row_size(m.in_dim as u64).unwrap_or(0) * m.out_dim as u64;
    (bytes * count, 2 * (m.in_dim * m.out_dim * n_rows) as u64)
}

/// A weight's name without its layer (`blk.3.ffn_down.weight` → `ffn_down.weight`), with its type.
fn matrix_name(m: &MatMulMeta) -> String {
    let name = match m.weight_name.strip_prefix("blk.") {
        Some(rest) => rest.split_once('.').map_or(rest, |(_, tail)| tail),
        None => &m.weight_name,
    };
    format!("{name} {}", m.weight_type)
}

impl ProfileRecorder {
    /// An empty recorder, shared: one handle goes to the session, the other reads the result.
    pub fn shared() -> Arc<Mutex<ProfileRecorder>> {
        Arc::new(Mutex::new(ProfileRecorder::default()))
    }

    /// Adds one step.
    pub fn record(&mut self, step: &StepRecord<'_>) {
        self.n_steps += 1;
        self.step_nanos += step.end.saturating_duration_since(step.start).as_nanos();
        for t in step.timings {
            let node = &step.graph.nodes[t.node];
            let nanos = t.end.saturating_duration_since(t.start).as_nanos();
            self.node_nanos += nanos;
            let kind = match t.work {
                Work::Execute => node.op.name().to_string(),
                Work::CopyTo(_) => "copy across backends".into(),
                Work::Synchronize(_) => "synchronize".into(),
            };
            let mats = if t.work == Work::Execute {
                matrices(node)
            } else {
                Vec::new()
            };
            let costs: Vec<(u64, u64)> = mats
                .iter()
                .map(|&(m, count, rows)| matmul_cost(m, count, rows))
                .collect();
            let cost = (!costs.is_empty()).then(|| costs.iter().fold((0, 0), |(b, f), &(b2, f2)| (b + b2, f + f2)));
            self.ops.entry(kind).or_default().add(nanos, cost);
            let layer = node_layer(node);
            self.layers
                .entry((layer.is_none(), layer.unwrap_or(0)))
                .or_default()
                .add(nanos, cost);
            // A fused product's time is shared among its matrices by their weight bytes.
            let total_bytes = cost.map_or(0, |(bytes, _)| bytes);
            for (&(m, _, _), &(bytes, flops)) in mats.iter().zip(&costs) {
                let part = nanos * u128::from(bytes) / u128::from(total_bytes.max(1));
                self.matmuls
                    .entry(matrix_name(m))
                    .or_default()
                    .add(part, Some((bytes, flops)));
            }
        }
    }

    /// The tables so far.
    pub fn profile(&self) -> Profile {
        let step = self.step_nanos;
        let mut ops: Vec<ProfileRow> = self.ops.iter().map(|(k, s)| s.row(k.clone(), step)).collect();
        ops.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        let layers = self
            .layers
            .iter()
            .map(|(&(outside, l), s)| {
                let name = if outside {
                    "outside layers".to_string()
                } else {
                    format!("layer {l}")
                };
                s.row(name, step)
            })
            .collect();
        let mut matmuls: Vec<ProfileRow> = self.matmuls.iter().map(|(k, s)| s.row(k.clone(), step)).collect();
        matmuls.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        Profile {
            n_steps: self.n_steps,
            step_seconds: step as f64 / 1e9,
            node_seconds: self.node_nanos as f64 / 1e9,
            ops,
            layers,
            matmuls,
        }
    }
}

/// A session's observer that adds every step to a shared recorder.
pub struct ProfileObserver(pub Arc<Mutex<ProfileRecorder>>);

impl StepObserver for ProfileObserver {
    fn on_step(&mut self, step: &StepRecord<'_>) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).record(step);
    }
}

impl Profile {
    /// The three tables as Markdown: op kinds, weight matrices, layers.
    pub fn to_markdown(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} steps, {:.3} s; {:.1} % of it inside nodes\n",
            self.n_steps,
            self.step_seconds,
            100.0 * self.node_seconds / self.step_seconds.max(1e-12)
        );
        let table = |out: &mut String, title: &str, rows: &[ProfileRow]| {
            let _ = writeln!(out, "| {title} | runs | ms | share | GB/s | GFLOP/s |");
            let _ = writeln!(out, "| --- | ---: | ---: | ---: | ---: | ---: |");
            for r in rows {
                let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.1}"));
                let _ = writeln!(
                    out,
                    "| {} | {} | {:.2} | {:.1} % | {} | {} |",
                    r.name,
                    r.runs,
                    r.seconds * 1e3,
                    r.share * 100.0,
                    opt(r.gb_per_s),
                    opt(r.gflop_per_s)
                );
            }
            out.push('\n');
        };
        table(&mut out, "op", &self.ops);
        table(&mut out, "weight matrix", &self.matmuls);
        table(&mut out, "layer", &self.layers);
        out
    }
}
