//! `minfer viz`: a local web page that draws the forward graph a model runs (nodes coloured by
//! backend, splits and fused nodes marked) and, while it generates from a prompt typed there,
//! streams each step's per-node timings onto the graph and a running tokens/s chart over
//! Server-Sent Events.
//!
//! Routes: `GET /` (the page, embedded in the binary: no build step, no CDN), `GET /viz/graph`
//! (the graph the last step ran, as `--dump-graph-json` writes it, plus its splits), `GET
//! /viz/events` (the event stream), `POST /viz/run` (`{"prompt", "n_predict"}`: start a
//! generation; 409 while one runs) and `GET /health`.
//!
//! One generation runs at a time, on a thread of its own that owns the one session; the page's
//! events are broadcast to every open page. This module serves a diagnostic page: it must not
//! grow an API of its own beyond these routes (the OpenAI API is `server`'s).

use crate::engine::trace::{StepObserver, StepRecord};
use crate::engine::{EngineError, GenerateOptions, LoadError, Model, ModelOptions, Session, SessionOptions};
use crate::graph::scheduler::{Split, Work};
use crate::graph::ComputeGraph;
use crate::sampling::SamplingParams;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Instant;
use tokio::sync::broadcast;

/// The page, with its script and styles inline.
const PAGE: &str = include_str!("page.html");

/// How long a run's body may take to arrive, and how large it may be.
const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
const MAX_BODY_BYTES: usize = 1 << 20;

/// The most tokens one run may ask for.
pub const MAX_PREDICT: usize = 4096;

/// How `minfer viz` runs.
#[derive(Clone, Debug)]
pub struct VizConfig {
    /// The GGUF file.
    pub model: PathBuf,
    /// Address to listen on.
    pub host: String,
    /// 0 picks a free port; the address is printed once bound.
    pub port: u16,
    /// Threads, backends and file options, as for a run.
    pub options: ModelOptions,
    /// The session's context (clamped to the model's) and KV types, as for a run.
    pub session: SessionOptions,
}

/// Why the page could not be served.
#[derive(Debug, thiserror::Error)]
pub enum VizError {
    /// The model did not load.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The graph could not be prepared.
    #[error("cannot prepare the decode graph: {0}")]
    Engine(#[from] EngineError),
    /// The address is taken or not ours.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// host:port.
        addr: String,
        /// The system's reason.
        source: std::io::Error,
    },
    /// The runtime or the server failed.
    #[error("the page server failed: {0}")]
    Runtime(#[from] std::io::Error),
}

/// A generation the page asked for.
struct RunRequest {
    prompt: String,
    n_predict: usize,
}

struct VizState {
    model_name: String,
    /// Events for the open pages: `(event name, JSON data)`.
    events: broadcast::Sender<(&'static str, String)>,
    /// The graph of the last step (initially the decode graph).
    graph: Mutex<Value>,
    running: Arc<AtomicBool>,
    runs: Mutex<mpsc::Sender<RunRequest>>,
}

/// The graph JSON the page draws: `to_json` plus the splits.
fn graph_json(graph: &ComputeGraph, splits: &[Split], model: &str, kind: &str) -> Value {
    let mut value = graph.to_json(model, kind);
    value["splits"] = splits
        .iter()
        .map(|s| json!({"backend": s.backend.to_string(), "start": s.node_range.0, "end": s.node_range.1, "inputs": s.inputs}))
        .collect();
    value
}

/// Sends each step's timings (and a graph the page has not seen) to the pages.
struct PageObserver {
    state: Arc<VizState>,
    last_uid: u64,
    last_end: Option<Instant>,
    n_steps: u64,
}

impl StepObserver for PageObserver {
    fn on_step(&mut self, step: &StepRecord<'_>) {
        let graph = step.graph;
        if graph.uid != self.last_uid {
            self.last_uid = graph.uid;
            let kind = if step.n_tokens == 1 { "decode" } else { "prefill" };
            let value = graph_json(graph, step.splits, &self.state.model_name, kind);
            let text = value.to_string();
            *self.state.graph.lock().unwrap_or_else(PoisonError::into_inner) = value;
            let _ = self.state.events.send(("graph", text));
        }
        let mut times: Vec<(usize, f64)> = Vec::with_capacity(step.timings.len());
        let mut copies = 0;
        for t in step.timings {
            let us = t.end.saturating_duration_since(t.start).as_nanos() as f64 / 1e3;
            match t.work {
                Work::Execute => times.push((t.node, us)),
                Work::CopyTo(_) => copies += 1,
                Work::Synchronize(_) => {}
            }
        }
        let wall = step.end.saturating_duration_since(step.start);
        // Tokens per second as the user sees them: from one decode step's end to the next's.
        let tok_s = match (self.last_end, step.n_tokens) {
            (Some(prev), 1) => Some(1.0 / step.end.saturating_duration_since(prev).as_secs_f64().max(1e-9)),
            _ => None,
        };
        self.last_end = Some(step.end);
        let event = json!({
            "step": self.n_steps,
            "kind": if step.n_tokens == 1 { "decode" } else { "prefill" },
            "n_tokens": step.n_tokens,
            "uid": graph.uid,
            "wall_ms": wall.as_secs_f64() * 1e3,
            "copies": copies,
            "tok_s": tok_s,
            "times": times,
        });
        self.n_steps += 1;
        let _ = self.state.events.send(("step", event.to_string()));
    }
}

/// The generation thread: owns the session and runs one request at a time.
fn generation_loop(model: Arc<Model>, mut session: Session, state: Arc<VizState>, runs: mpsc::Receiver<RunRequest>) {
    for run in runs {
        // The next run is allowed once this one has ended however it ended, a panic included;
        // the flag is cleared before the last event, so a page that runs again on `done` is
        // not refused.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_one(&model, &mut session, &state, run)
        }));
        let last = match outcome {
            Ok(last) => last,
            Err(_) => ("error", json!({"error": "the generation panicked; the page serves on"})),
        };
        state.running.store(false, Ordering::Release);
        let _ = state.events.send((last.0, last.1.to_string()));
    }
}

/// One generation; returns the event that ends it (`done` or `error`), for the caller to send
/// once the next run is allowed.
fn run_one(model: &Model, session: &mut Session, state: &VizState, run: RunRequest) -> (&'static str, Value) {
    let send = |name: &'static str, value: Value| {
        let _ = state.events.send((name, value.to_string()));
    };
    session.reset();
    let messages = [json!({"role": "user", "content": run.prompt})];
    let tokens = match model.template().render(&messages, None, true, &serde_json::Map::new()) {
        Ok(text) => model.encode(&text),
        Err(e) => return ("error", json!({"error": format!("the chat template failed: {e}")})),
    };
    send(
        "start",
        json!({"prompt_tokens": tokens.len(), "n_predict": run.n_predict}),
    );
    let options = GenerateOptions {
        max_tokens: run.n_predict,
        sampling: SamplingParams::greedy(),
        ..GenerateOptions::default()
    };
    let started = Instant::now();
    let result = crate::engine::generate(session, model.tokenizer(), &tokens, &options, |text| {
        send("text", json!({"text": String::from_utf8_lossy(text)}));
        Ok(())
    });
    match result {
        Ok(r) => (
            "done",
            json!({
                "n_generated": r.tokens.len(),
                "seconds": started.elapsed().as_secs_f64(),
                "tok_s": r.stats.gen_tok_per_s(),
                "stop": format!("{:?}", r.stop_reason),
            }),
        ),
        Err(e) => ("error", json!({"error": e.to_string()})),
    }
}

async fn page() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response()
}

async fn graph(State(state): State<Arc<VizState>>) -> Json<Value> {
    Json(state.graph.lock().unwrap_or_else(PoisonError::into_inner).clone())
}

async fn events(
    State(state): State<Arc<VizState>>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, std::convert::Infallible>>> {
    let receiver = state.events.subscribe();
    let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
        loop {
            match receiver.recv().await {
                Ok((name, data)) => return Some((Ok(Event::default().event(name).data(data)), receiver)),
                // A slow page misses steps; the next ones still come.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

async fn run(State(state): State<Arc<VizState>>, request: axum::extract::Request) -> Response {
    let refuse = |status: StatusCode, message: String| (status, Json(json!({"error": message}))).into_response();
    // A body that stops arriving would hold its connection for good.
    let body = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES)).await
    {
        Ok(Ok(body)) => body,
        Ok(Err(e)) => return refuse(StatusCode::BAD_REQUEST, format!("cannot read the body: {e}")),
        Err(_) => {
            return refuse(
                StatusCode::REQUEST_TIMEOUT,
                format!("the body did not arrive within {} s", BODY_TIMEOUT.as_secs()),
            )
        }
    };
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("the body is not JSON: {e}")),
    };
    let Some(prompt) = request["prompt"].as_str().filter(|p| !p.trim().is_empty()) else {
        return refuse(StatusCode::BAD_REQUEST, "\"prompt\" must be a non-empty string".into());
    };
    let n_predict = match &request["n_predict"] {
        Value::Null => 64,
        v => match v.as_u64().filter(|&n| (1..=MAX_PREDICT as u64).contains(&n)) {
            Some(n) => n as usize,
            None => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    format!("\"n_predict\" {v} is out of range: it must be from 1 to {MAX_PREDICT}"),
                )
            }
        },
    };
    if state.running.swap(true, Ordering::AcqRel) {
        return refuse(StatusCode::CONFLICT, "a generation is running; wait for its end".into());
    }
    let sent = state
        .runs
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .send(RunRequest {
            prompt: prompt.to_string(),
            n_predict,
        });
    if sent.is_err() {
        state.running.store(false, Ordering::Release);
        return refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the generation thread is gone".into(),
        );
    }
    (
        StatusCode::ACCEPTED,
        Json(json!({"started": true, "n_predict": n_predict})),
    )
        .into_response()
}

/// Loads the model, prepares its decode graph and serves the page until interrupted.
pub fn serve(config: VizConfig) -> Result<(), VizError> {
    let model = Arc::new(Model::load(&config.model, &config.options)?);
    let model_name = config
        .model
        .file_stem()
        .map_or_else(|| "model".to_string(), |s| s.to_string_lossy().into_owned());
    let mut session = Session::with_options(&model, &config.session)?;
    session.prepare_graph(1, 1)?;
    // Before any step has run, the page draws the decode graph as it will run.
    let decode = graph_json(
        session.graph().expect("prepared"),
        session.graph_splits(),
        &model_name,
        "decode",
    );
    let (sender, _) = broadcast::channel(1024);
    let (runs, receiver) = mpsc::channel();
    let state = Arc::new(VizState {
        model_name,
        events: sender,
        graph: Mutex::new(decode),
        running: Arc::new(AtomicBool::new(false)),
        runs: Mutex::new(runs),
    });
    session.add_step_observer(Box::new(PageObserver {
        state: Arc::clone(&state),
        last_uid: session.graph().map_or(0, |g| g.uid),
        last_end: None,
        n_steps: 0,
    }));
    {
        let (model, state) = (Arc::clone(&model), Arc::clone(&state));
        std::thread::Builder::new()
            .name("viz-generation".into())
            .spawn(move || generation_loop(model, session, state, receiver))?;
    }
    let app = Router::new()
        .route("/", get(page))
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/viz/graph", get(graph))
        .route("/viz/events", get(events))
        .route("/viz/run", post(run))
        .with_state(state);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let addr = format!("{}:{}", config.host, config.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|source| VizError::Bind { addr, source })?;
        eprintln!("minfer viz: listening on http://{}", listener.local_addr()?);
        // The server's connection handling: a client that never finishes its headers, or sits
        // idle, is closed after the header timeout instead of holding a connection for good.
        let (stop, stopped) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            let _ = stop.send(true);
        });
        crate::server::serve_router(listener, app, crate::server::Limits::defaults(), stopped)
            .await
            .map_err(|e| VizError::Runtime(std::io::Error::other(e.to_string())))?;
        Ok(())
    })
}
