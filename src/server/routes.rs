//! The HTTP surface: the axum router, its handlers, API-key checking, request counting, the
//! session id echoed for load balancers, and the small router that answers while the model
//! loads.
//!
//! Handlers read a body, let `request` check it, render and tokenize on the blocking pool
//! (templates and tokenization of a large prompt would otherwise stall the async runtime),
//! check the context budget, hand a job to the scheduler and turn its events into a response
//! with `response`. Nothing here generates, and nothing here blocks: the only waits are on
//! channels.

use super::apis::{Dialect, OpenAi};
use super::body;
use super::error::ApiError;
use super::lifecycle::{Lifecycle, Readiness};
use super::metrics::Metrics;
use super::peer::Peer;
use super::request::{self, Common, Prompt, PromptPiece, ToolChoice};
use super::response::{self as shapes, Collector, Endpoint, LlamaReply, Reply, Streamer};
use super::slots::{Job, Run, Scheduler};
use super::tool_calls;
use crate::engine::{GenerateOptions, Model};
use crate::template::reasoning::{ReasoningFormat, ThinkTags};
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// What every handler shares.
pub struct AppState {
    pub scheduler: Scheduler,
    /// The embedding thread, with `--embeddings`.
    pub embeddings: Option<super::embeddings::EmbedService>,
    /// The loaded model (tokenizer, chat template, backends), shared with the slots.
    pub model: Arc<Model>,
    pub metrics: Arc<Metrics>,
    /// The name `/v1/models` lists and responses carry.
    pub model_id: String,
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_slots: usize,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    /// How long a body may take to arrive once its headers have.
    pub body_timeout: std::time::Duration,
    pub created: u64,
    /// A prompt containing this text fails inside its slot (`MINFER_SERVE_FAULT`).
    pub fault_marker: Option<String>,
    /// The control-token texts kept as text where they come from a message (empty with
    /// `--special-in-content`).
    pub control_texts: Vec<String>,
    /// Origins a browser page may call the server from (`--cors-origin`; `*` for any).
    pub cors_origins: Vec<String>,
    /// Who may call a server without a key (`callers`).
    pub callers: super::callers::Callers,
    /// Bodies parsed at once: one per CPU.
    pub parsing: tokio::sync::Semaphore,
    /// Whether `/slots` answers (`--slots`, as llama-server puts it behind a flag).
    pub slots_endpoint: bool,
    /// Whether `/` serves the chat page (off with `--no-webui`).
    pub webui: bool,
    /// Loading, ready or draining, for `/ready`.
    pub lifecycle: Arc<Lifecycle>,
    /// Requests that may wait for a slot (`--queue-max`), reported by `/ready`.
    pub queue_max: Option<usize>,
    /// What a request gets for the fields it leaves out (the server's sampling flags).
    pub defaults: Arc<request::RequestDefaults>,
}

/// The header a load balancer hashes on to send every turn of a conversation to the replica
/// whose slots hold its KV prefix. A request's own value is echoed on the response; without
/// one, a generation echoes OpenAI's `user` field, so a client can learn the id to send.
pub const SESSION_HEADER: &str = "x-session-id";

/// The longest `user` echoed as a session id: an id, not a document.
const MAX_SESSION_ID: usize = 256;

/// The chat page: one static file, embedded so that the binary serves it offline.
const CHAT_PAGE: &str = include_str!("webui/index.html");

pub(super) type App = Arc<AppState>;

/// The routes answer at `/v1/...` and, as OpenAI-compatible servers commonly do, without the
/// prefix too, except `/completions`, which is llama-server's own `/completion` there, as in
/// llama-server (OpenAI's completions are `/v1/completions`).
pub fn router(app: App) -> Router {
    let _ = app
        .metrics
        .started
        .compare_exchange(0, super::unix_time(), Ordering::Relaxed, Ordering::Relaxed);
    let api = Router::new()
        .route("/chat/completions", post(chat))
        .route("/chat/completions/input_tokens", post(input_tokens))
        .route("/models", get(models));
    Router::new()
        .nest("/v1", api.clone().route("/completions", post(completions)))
        .merge(api)
        .route("/completions", post(native_completion))
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/props", get(props))
        .route("/completion", post(native_completion))
        .route("/infill", post(infill))
        .route("/apply-template", post(apply_template))
        .route("/slots", get(slots))
        .route("/slots/{id}", post(slot_action))
        .route("/v1/messages", post(super::apis::anthropic::messages))
        .route("/v1/messages/count_tokens", post(super::apis::anthropic::count_tokens))
        .route("/v1/responses", post(super::apis::responses::create))
        .route("/responses", post(super::apis::responses::create))
        .route("/api/chat", post(super::apis::ollama::chat))
        .route("/api/generate", post(super::apis::ollama::generate))
        .route("/api/tags", get(super::apis::ollama::tags))
        .route("/api/ps", get(super::apis::ollama::ps))
        .route("/api/show", post(super::apis::ollama::show))
        .route("/api/version", get(super::apis::ollama::version))
        .route("/api/embed", post(super::apis::ollama::embed))
        .route("/api/embeddings", post(super::apis::ollama::embeddings))
        .route("/api/pull", post(super::apis::ollama::unsupported))
        .route("/api/create", post(super::apis::ollama::unsupported))
        .route("/api/copy", post(super::apis::ollama::unsupported))
        .route("/api/push", post(super::apis::ollama::unsupported))
        .route("/api/delete", axum::routing::delete(super::apis::ollama::unsupported))
        .route("/v1/embeddings", post(super::embeddings::openai))
        .route("/embeddings", post(super::embeddings::native))
        .route("/embedding", post(super::embeddings::native))
        .route("/rerank", post(super::embeddings::rerank))
        .route("/reranking", post(super::embeddings::rerank))
        .route("/v1/rerank", post(super::embeddings::rerank))
        .route("/v1/reranking", post(super::embeddings::rerank))
        .route("/", get(chat_page))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(app.max_body_bytes))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), authenticate))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), super::callers::admit))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), cors))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), count))
        .layer(middleware::from_fn(echo_session))
        .with_state(app)
}

/// What answers between binding and the model's arrival: `/health` (the process is alive),
/// `/ready` (503, loading) and, for everything else, a 503 with `Retry-After`, as llama-server
/// answers while it loads.
pub fn loading_router() -> Router {
    Router::new()
        .route("/health", get(|| async { Json(json!({"status": "loading"})) }))
        .route(
            "/ready",
            get(|| async {
                let r = Readiness::Loading;
                (r.status(), Json(json!({"status": r.name()}))).into_response()
            }),
        )
        .fallback(|| async { unavailable("the model is still loading: try again shortly") })
}

/// A 503 whose `Retry-After` tells a client, or a balancer that retries, to come back in a
/// second.
fn unavailable(message: &str) -> Response {
    let mut response = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message).into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// The request's `X-Session-Id`, back on its response (over any `user` the handler echoed).
async fn echo_session(req: Request, next: Next) -> Response {
    let id = req.headers().get(SESSION_HEADER).cloned();
    let mut response = next.run(req).await;
    if let Some(id) = id {
        response.headers_mut().insert(SESSION_HEADER, id);
    }
    response
}

const ROUTES: [&str; 39] = [
    "/",
    "/v1/chat/completions",
    "/v1/chat/completions/input_tokens",
    "/chat/completions/input_tokens",
    "/v1/completions",
    "/v1/models",
    "/chat/completions",
    "/completions",
    "/models",
    "/health",
    "/v1/health",
    "/embedding",
    "/ready",
    "/metrics",
    "/tokenize",
    "/detokenize",
    "/props",
    "/completion",
    "/infill",
    "/apply-template",
    "/slots",
    "/v1/embeddings",
    "/embeddings",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/responses",
    "/api/chat",
    "/api/generate",
    "/api/tags",
    "/api/ps",
    "/api/show",
    "/api/version",
    "/rerank",
    "/reranking",
    "/v1/rerank",
    "/v1/reranking",
    "/api/embed",
    "/api/embeddings",
];

async fn count(State(app): State<App>, req: Request, next: Next) -> Response {
    // Unknown paths share one label, so that probing cannot grow the metrics without bound.
    let route = ROUTES
        .iter()
        .find(|r| **r == req.uri().path())
        .copied()
        .unwrap_or("other");
    let response = next.run(req).await;
    app.metrics.record_response(route, response.status().as_u16());
    response
}

/// With `--api-key`, every route but `/health`, `/ready` and the chat page needs
/// `Authorization: Bearer KEY` (the page holds nothing secret; it asks for the key and sends it
/// with each request).
/// CORS for the origins given with `--cors-origin` (none by default, so a page elsewhere cannot
/// call the server): a preflight from one of them is answered here, before authentication (a
/// browser sends no credentials on it), and every response to one carries its origin.
async fn cors(State(app): State<App>, req: Request, next: Next) -> Response {
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .filter(|o| super::callers::cors_allows(&app.cors_origins, o))
        .map(str::to_string);
    let Some(origin) = origin else {
        return next.run(req).await;
    };
    let preflight = req.method() == axum::http::Method::OPTIONS
        && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut response = if preflight {
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            header::HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            header::HeaderValue::from_static("authorization, content-type"),
        );
        h.insert(header::ACCESS_CONTROL_MAX_AGE, header::HeaderValue::from_static("600"));
        r
    } else {
        next.run(req).await
    };
    if let Ok(value) = header::HeaderValue::from_str(&origin) {
        let h = response.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        h.append(header::VARY, header::HeaderValue::from_static("origin"));
    }
    response
}

async fn authenticate(State(app): State<App>, req: Request, next: Next) -> Response {
    if let Err(e) = check_key(app.api_key.as_deref(), &req) {
        return (e.status, Json(super::apis::error_body_for(req.uri().path(), &e))).into_response();
    }
    next.run(req).await
}

/// With a key, every route but `/health`, `/ready` and the chat page needs it, as
/// `Authorization: Bearer KEY` or, like llama-server, `X-Api-Key: KEY` (Anthropic's clients).
pub(super) fn check_key(key: Option<&str>, req: &Request) -> Result<(), ApiError> {
    let Some(key) = key else { return Ok(()) };
    if matches!(req.uri().path(), "/health" | "/v1/health" | "/ready" | "/") {
        return Ok(());
    }
    // The scheme is case-insensitive (RFC 9110 §11.1): `bearer KEY` is as good.
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim_start().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, key)| key)
        .or_else(|| req.headers().get("x-api-key").and_then(|v| v.to_str().ok()));
    match given {
        Some(g) if constant_time_eq(g.trim().as_bytes(), key.as_bytes()) => Ok(()),
        Some(_) => Err(ApiError::new(StatusCode::UNAUTHORIZED, "invalid API key")),
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing API key: send it as 'Authorization: Bearer KEY' or 'X-Api-Key: KEY'",
        )),
    }
}

/// Compares without an early exit, so timing does not reveal how much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no such endpoint: {} {}", req.method(), req.uri().path()),
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

async fn health(State(app): State<App>) -> Json<Value> {
    let busy = app.metrics.slots_busy.load(Ordering::Relaxed);
    Json(json!({
        "status": "ok",
        "slots_total": app.n_slots,
        "slots_idle": app.n_slots.saturating_sub(busy),
        "queue_depth": app.metrics.queue_depth.load(Ordering::Relaxed),
    }))
}

/// Whether to send this replica work: 200 when ready, 503 while loading, draining, or when
/// every slot is busy and `--queue-max` requests wait (a request sent now would be refused).
async fn ready(State(app): State<App>) -> Response {
    let readiness = Readiness::of(app.lifecycle.phase(), || app.scheduler.full());
    let busy = app.metrics.slots_busy.load(Ordering::Relaxed);
    let body = json!({
        "status": readiness.name(),
        "slots_total": app.n_slots,
        "slots_idle": app.n_slots.saturating_sub(busy),
        "queue_depth": app.metrics.queue_depth.load(Ordering::Relaxed),
        "queue_max": app.queue_max,
    });
    (readiness.status(), Json(body)).into_response()
}

/// llama-server's `/tokenize`: `{"content", "add_special"?, "parse_special"?, "with_pieces"?}`
/// → `{"tokens": [id, ...]}`, or `[{"id", "piece"}, ...]` with pieces (a piece that is not
/// whole UTF-8 comes as its bytes, as llama-server sends it).
async fn tokenize(State(app): State<App>, req: Request) -> Response {
    let result = async {
        let (content, add_special, parse_special, with_pieces) = read_request(&app, req, request::tokenize).await?;
        let model = Arc::clone(&app.model);
        let ids = blocking(move || {
            let ids = model.tokenizer().encode(&content, add_special, parse_special);
            if content.len() >= LARGE_BODY_BYTES {
                drop(content);
                body::release_freed_memory();
            }
            Ok(ids)
        })
        .await?;
        Ok::<_, ApiError>(token_list(Arc::clone(&app.model), ids, with_pieces))
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// Bytes of `/tokenize`'s answer sent per chunk; an answer shorter than one goes whole.
const TOKEN_LIST_CHUNK: usize = 64 << 10;

/// `{"tokens": [...]}`. Built whole, a list of `{"id", "piece"}` objects is tens of times the
/// request's size as JSON values (gigabytes for a body of megabytes); here it is written as
/// bytes, and a long one a chunk at a time on the blocking pool as the client reads it, so the
/// answer holds the ids and a few chunks at any moment, however long it is.
fn token_list(model: Arc<Model>, ids: Vec<u32>, with_pieces: bool) -> Response {
    // About 30 bytes a token with its piece: a short list is one chunk, sent with its length.
    if ids.len() * if with_pieces { 32 } else { 8 } < TOKEN_LIST_CHUNK {
        let mut whole = Vec::new();
        write_token_list(&model, &ids, with_pieces, |chunk| {
            whole.extend_from_slice(&chunk);
            true
        });
        return ([(header::CONTENT_TYPE, "application/json")], whole).into_response();
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::convert::Infallible>>(2);
    tokio::task::spawn_blocking(move || {
        // The client left when a send fails: nothing more to write.
        write_token_list(&model, &ids, with_pieces, |chunk| {
            tx.blocking_send(Ok(Bytes::from(chunk))).is_ok()
        });
        if ids.len() * 4 >= LARGE_BODY_BYTES {
            drop(ids);
            body::release_freed_memory();
        }
    });
    let chunks = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
    ([(header::CONTENT_TYPE, "application/json")], Body::from_stream(chunks)).into_response()
}

/// Writes `{"tokens": [...]}` as chunks of about [`TOKEN_LIST_CHUNK`] bytes to `emit`, which
/// answers false to stop.
fn write_token_list(model: &Model, ids: &[u32], with_pieces: bool, mut emit: impl FnMut(Vec<u8>) -> bool) {
    use std::io::Write as _;
    let tokenizer = model.tokenizer();
    let mut chunk = Vec::with_capacity(TOKEN_LIST_CHUNK + 1024);
    chunk.extend_from_slice(b"{\"tokens\":[");
    for (i, &id) in ids.iter().enumerate() {
        if i > 0 {
            chunk.push(b',');
        }
        // Writing into a Vec cannot fail.
        if with_pieces {
            let bytes = tokenizer.token_to_piece(id, true);
            let _ = write!(chunk, "{{\"id\":{id},\"piece\":");
            let _ = match std::str::from_utf8(bytes) {
                Ok(text) => serde_json::to_writer(&mut chunk, text),
                Err(_) => serde_json::to_writer(&mut chunk, bytes),
            };
            chunk.push(b'}');
        } else {
            let _ = write!(chunk, "{id}");
        }
        if chunk.len() >= TOKEN_LIST_CHUNK {
            let full = std::mem::replace(&mut chunk, Vec::with_capacity(TOKEN_LIST_CHUNK + 1024));
            if !emit(full) {
                return;
            }
        }
    }
    chunk.extend_from_slice(b"]}");
    emit(chunk);
}

/// llama-server's `/detokenize`: `{"tokens": [id, ...]}` → `{"content": "..."}` (control tokens
/// as their text; bytes that are not UTF-8 become U+FFFD).
async fn detokenize(State(app): State<App>, req: Request) -> Response {
    let result = async {
        let ids = read_request(&app, req, request::detokenize).await?;
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= app.n_vocab) {
            return Err(ApiError::field(
                "tokens",
                format!("token id {bad} is outside the vocabulary of {} tokens", app.n_vocab),
            ));
        }
        let bytes = app.model.tokenizer().decode(&ids, true);
        Ok(Json(json!({ "content": String::from_utf8_lossy(&bytes) })).into_response())
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// llama-server's `/props`: every top-level key its `get_res_props` returns. The defaults a
/// request gets nest under `default_generation_settings.params` with the slot's `n_ctx`;
/// `model_path` is the file's name only (where it lies on the server's disk is no client's
/// business); what minfer has not (images, audio, sleeping, the MCP proxy) says so.
async fn props(State(app): State<App>) -> Json<Value> {
    let d = &app.defaults.sampling;
    let params = settings_json(&SettingsOf {
        sampling: d,
        seed: app.defaults.seed.unwrap_or(d.seed),
        n_predict: app.defaults.n_predict,
        stop: &[],
        ignore_eos: false,
        stream: false,
        n_probs: 0,
        llama: &request::LlamaFields {
            reasoning_format: app.defaults.reasoning_format,
            verbose: app.defaults.verbose,
            ..Default::default()
        },
        eog: &[],
    });
    let template = app.model.template();
    let source = template.source();
    // The template's abilities as llama.cpp names them, read from what its source uses.
    let caps = json!({
        "supports_string_content": true,
        "supports_typed_content": source.contains("content[") || source.contains("'type'") || source.contains("\"type\""),
        "supports_tools": source.contains("tools"),
        "supports_tool_calls": source.contains("tool_calls"),
        "supports_parallel_tool_calls": source.contains("tool_calls") && source.contains("for"),
        "supports_system_role": source.contains("system"),
        "supports_preserve_reasoning": source.contains("reasoning_content") || source.contains("thinking"),
        "supports_reasoning_effort": source.contains("reasoning_effort"),
        "supports_object_arguments": source.contains("arguments|items") || source.contains("arguments.items"),
    });
    let ftype = app
        .model
        .file()
        .metadata()
        .get_uint("general.file_type")
        .map_or("unknown", crate::quantize::llama_ftype_name);
    Json(json!({
        "default_generation_settings": {"params": params, "n_ctx": app.n_ctx},
        "total_slots": app.n_slots,
        "model_alias": app.model_id,
        "model_ftype": ftype,
        "model_path": app
            .model
            .path()
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        "modalities": {"vision": false, "video": false, "audio": false},
        "media_marker": "<__media__>",
        "endpoint_slots": app.slots_endpoint,
        "endpoint_props": false,
        "endpoint_metrics": true,
        "ui": app.webui,
        "ui_settings": {},
        "chat_template": source,
        "chat_template_caps": caps,
        "bos_token": template.bos_token(),
        "eos_token": template.eos_token(),
        "build_info": shapes::build_info(),
        "is_sleeping": false,
        "cors_proxy_enabled": false,
    }))
}

/// What `generation_settings` (and `/props`, `/slots`) are made from.
struct SettingsOf<'a> {
    sampling: &'a crate::sampling::SamplingParams,
    seed: u64,
    n_predict: Option<usize>,
    stop: &'a [String],
    ignore_eos: bool,
    stream: bool,
    n_probs: usize,
    llama: &'a request::LlamaFields,
    /// End-of-generation tokens banned by `ignore_eos`, listed among the biases as
    /// llama-server lists them.
    eog: &'a [u32],
}

/// llama-server's `generation_settings` (its `task_params::to_json`): every key, with minfer's
/// values; -1 where llama.cpp writes -1 for "no limit" or "the whole history". A bias of -inf
/// is null, as llama-server's JSON writes it.
fn settings_json(s: &SettingsOf) -> Value {
    let p = s.sampling;
    let last_n = |n: usize| {
        if n == usize::MAX {
            -1
        } else {
            n.min(i64::MAX as usize) as i64
        }
    };
    let bias = |token: u32, b: f32| json!({"bias": if b.is_finite() { json!(b) } else { Value::Null }, "token": token});
    let logit_bias: Vec<Value> = p
        .logit_bias
        .iter()
        .map(|&(t, b)| bias(t, b))
        .chain(s.eog.iter().map(|&t| bias(t, f32::NEG_INFINITY)))
        .collect();
    let n_predict = s.n_predict.map_or(-1, |n| n.min(i32::MAX as usize) as i64);
    let mut settings = json!({
        "seed": s.seed,
        "temperature": p.temperature,
        "dynatemp_range": 0.0,
        "dynatemp_exponent": 1.0,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "min_p": p.min_p,
        "top_n_sigma": p.top_n_sigma,
        "xtc_probability": p.xtc_probability,
        "xtc_threshold": p.xtc_threshold,
        "typical_p": p.typical_p,
        "repeat_last_n": last_n(p.penalty_last_n),
        "repeat_penalty": p.repeat_penalty,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "dry_multiplier": p.dry_multiplier,
        "dry_base": p.dry_base,
        "dry_allowed_length": p.dry_allowed_length,
        "dry_penalty_last_n": last_n(p.dry_penalty_last_n),
        "dry_sequence_breakers": p.dry_sequence_breakers,
        "mirostat": p.mirostat.number(),
        "mirostat_tau": p.mirostat_tau,
        "mirostat_eta": p.mirostat_eta,
        "adaptive_target": -1.0,
        "adaptive_decay": 0.9,
    });
    let more = json!({
        "stop": s.stop,
        "max_tokens": n_predict,
        "n_predict": n_predict,
        "n_keep": s.llama.n_keep,
        "n_discard": s.llama.n_discard,
        "ignore_eos": s.ignore_eos,
        "stream": s.stream,
        "logit_bias": logit_bias,
        "n_probs": s.n_probs,
        "min_keep": 0,
        "grammar": "",
        "grammar_lazy": false,
        "grammar_triggers": [],
        "preserved_tokens": [],
        "chat_format": "Content-only",
        "reasoning_format": s.llama.reasoning_format.name(),
        "reasoning_in_content": false,
        "generation_prompt": "",
        "samplers": p.samplers.iter().map(|k| k.name()).collect::<Vec<_>>(),
        "speculative.types": "none",
        "timings_per_token": s.llama.timings_per_token,
        "post_sampling_probs": s.llama.post_sampling_probs,
        "backend_sampling": false,
        "lora": [],
    });
    if let (Value::Object(settings), Value::Object(more)) = (&mut settings, more) {
        settings.extend(more);
    }
    settings
}

/// The chat page at `/` (a 404 with `--no-webui`).
async fn chat_page(State(app): State<App>, req: Request) -> Response {
    if !app.webui {
        return not_found(req).await.into_response();
    }
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        CHAT_PAGE,
    )
        .into_response()
}

/// llama-server's `/slots`, with `--slots`: each slot's `id`, `n_ctx`, `speculative` and
/// `is_processing`, and, once it has run a request, that request's `id_task`, prompt counts,
/// `params` (its generation settings), `next_token` and the `prompt` and `generated` text.
async fn slots(State(app): State<App>) -> Response {
    if !app.slots_endpoint {
        return ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "the /slots endpoint is off: start the server with --slots",
        )
        .into_response();
    }
    let views = app.scheduler.slot_views();
    let state = Arc::clone(&app);
    // Detokenizing every slot's prompt is work for the blocking pool.
    let slots = blocking(move || {
        let tokenizer = state.model.tokenizer();
        Ok(views
            .iter()
            .enumerate()
            .map(|(id, v)| {
                let mut slot = json!({
                    "id": id,
                    "n_ctx": state.n_ctx,
                    "speculative": state.scheduler.speculative(),
                    "is_processing": v.processing,
                });
                if let Some(task) = v.task {
                    slot["id_task"] = json!(task);
                    slot["n_prompt_tokens"] = json!(v.prompt.len());
                    slot["n_prompt_tokens_processed"] = json!(v.n_prompt_processed);
                    slot["n_prompt_tokens_cache"] = json!(v.n_cached);
                    if let Some(settings) = &v.settings {
                        slot["params"] = (**settings).clone();
                    }
                    slot["next_token"] = json!([{
                        "has_next_token": v.has_next_token,
                        "has_new_line": v.has_new_line,
                        "n_remain": v.n_remain,
                        "n_decoded": v.n_decoded,
                    }]);
                    slot["prompt"] = json!(String::from_utf8_lossy(&tokenizer.decode(&v.prompt, true)));
                    slot["generated"] = json!(v.generated);
                }
                slot
            })
            .collect::<Vec<Value>>())
    })
    .await;
    match slots {
        Ok(slots) => Json(Value::Array(slots)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// llama-server's slot actions (`POST /slots/ID?action=save|restore|erase`): minfer keeps no
/// slot files, so each is refused by name.
async fn slot_action(req: Request) -> ApiError {
    let action = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("action=")))
        .unwrap_or("")
        .to_string();
    ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        format!(
            "the slot action '{action}' is not supported: minfer does not save, restore or erase slots \
             (a slot keeps its prompt's prefix for the next request by itself)"
        ),
    )
}

/// A chat request's messages and tools through the model's template, control-token text in
/// the messages kept as text, with the request's template variables (`chat_template_kwargs`,
/// `reasoning_effort`); what `/v1/chat/completions` reads and `/apply-template` shows. A harmony
/// template gets the messages as it reads them ([`harmony_messages`]).
fn render_chat(state: &AppState, req: &request::ChatRequest) -> Result<crate::template::Rendered, ApiError> {
    let template = state.model.template();
    let adjusted;
    let messages = if template.is_harmony() {
        adjusted = harmony_messages(&req.messages);
        &adjusted
    } else {
        &req.messages
    };
    let mut rendered = template
        .render_guarded(
            messages,
            req.tools.as_deref(),
            req.add_generation_prompt,
            &req.template_kwargs,
            &state.control_texts,
        )
        .map_err(|e| ApiError::field("messages", format!("the chat template cannot render the messages: {e}")))?;
    if let Some(prefill) = &req.prefill {
        // The continued message's text follows the opened turn; control-token text in it stays
        // text, as in any message.
        let start = rendered.text.len();
        rendered.text.push_str(prefill);
        rendered.literal.extend(
            literal_spans(prefill, &state.control_texts)
                .into_iter()
                .map(|r| start + r.start..start + r.end),
        );
    }
    Ok(rendered)
}

/// Where `guarded` texts occur in `text`, left to right, the longest at a place first.
fn literal_spans(text: &str, guarded: &[String]) -> Vec<std::ops::Range<usize>> {
    let mut spans = Vec::new();
    let mut at = 0;
    while at < text.len() {
        let found = guarded
            .iter()
            .filter(|g| !g.is_empty() && text[at..].starts_with(g.as_str()))
            .map(String::len)
            .max();
        match found {
            Some(n) => {
                spans.push(at..at + n);
                at += n;
            }
            None => at += text[at..].chars().next().map_or(1, char::len_utf8),
        }
    }
    spans
}

/// The conversation as gpt-oss's template reads it, as llama.cpp's server passes it: an
/// assistant turn's reasoning (OpenAI-style `reasoning_content`, what this server returns) in
/// the template's `thinking`, and, beside tool calls, no `content` (the template refuses both
/// content and thinking on a call, and prints the reasoning before the call only as
/// `thinking`). A null `content` on an assistant turn is left out too: the template tests it
/// for harmony's markers, which cannot be done on null, and prints the turn the same without it.
fn harmony_messages(messages: &[Value]) -> Vec<Value> {
    messages
        .iter()
        .map(|message| {
            let mut message = message.clone();
            if let Some(m) = message
                .as_object_mut()
                .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
            {
                if let Some(reasoning) = m.get("reasoning_content").filter(|r| r.is_string()).cloned() {
                    m.insert("thinking".into(), reasoning);
                    if m.get("tool_calls")
                        .and_then(Value::as_array)
                        .is_some_and(|c| !c.is_empty())
                    {
                        m.remove("content");
                    }
                }
                if m.get("content").is_some_and(Value::is_null) {
                    m.remove("content");
                }
            }
            message
        })
        .collect()
}

/// llama-server's `/apply-template`: the chat request's messages through the model's template,
/// as the prompt text a chat completion would read (`{"prompt"}`), without generating.
async fn apply_template(State(app): State<App>, req: Request) -> Response {
    let result = async {
        let req = read_request(&app, req, with_defaults(&app, request::chat)).await?;
        let state = Arc::clone(&app);
        blocking(move || {
            let rendered = render_chat(&state, &req)?;
            Ok(Json(json!({ "prompt": rendered.text })).into_response())
        })
        .await
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// llama-server's `/v1/chat/completions/input_tokens`: how many tokens the chat request's
/// prompt is (`{"input_tokens"}`), nothing generated.
async fn input_tokens(State(app): State<App>, req: Request) -> Response {
    let result = async {
        let req = read_request(&app, req, with_defaults(&app, request::chat)).await?;
        let state = Arc::clone(&app);
        blocking(move || {
            let rendered = render_chat(&state, &req)?;
            let n = state.model.encode_rendered(&rendered).len();
            Ok(Json(json!({ "input_tokens": n })).into_response())
        })
        .await
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// Refuses token ids outside the vocabulary, naming the field (and the prompt, of several).
fn check_ids(app: &AppState, field: &str, which: &str, ids: &[u32]) -> Result<(), ApiError> {
    match ids.iter().find(|&&id| id as usize >= app.n_vocab) {
        Some(&bad) => Err(ApiError::field(
            field,
            format!(
                "{which} holds token id {bad}, outside the vocabulary of {} tokens",
                app.n_vocab
            ),
        )),
        None => Ok(()),
    }
}

/// llama-server's own `/completion`: its prompts (one answer each, an array when there are
/// several), its fields and defaults, its answer.
async fn native_completion(State(app): State<App>, req: Request) -> Response {
    let result = async {
        let peer = peer_of(&req);
        let req = read_request(&app, req, with_defaults(&app, request::native_completion)).await?;
        let peer = watched(peer);
        let fault = faulty(&app, &req.prompts);
        let prompts = encode_prompts(&app, "prompt", req.prompts).await?;
        let tools = ReplyTools::plain(OpenAi::boxed(true));
        start(&app, Endpoint::Native, req.common, prompts, tools, fault, peer).await
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// llama-server's `/infill` (editor plugins' fill-in-the-middle): the other files of
/// `input_extra` (each after `<|file_sep|>` and its name, where the model has that token), then
/// `<|fim_prefix|>` prefix `<|fim_suffix|>` suffix `<|fim_middle|>` and `prompt`; the user's
/// text is never read for control tokens. A model without the three FIM tokens gets a 501.
async fn infill(State(app): State<App>, req: Request) -> Response {
    let result = async {
        let peer = peer_of(&req);
        let req = read_request(&app, req, with_defaults(&app, request::infill)).await?;
        let peer = watched(peer);
        let tokenizer = app.model.tokenizer();
        let id = |text: &str| tokenizer.token_id(text);
        let (Some(pre), Some(suf), Some(mid)) = (id("<|fim_prefix|>"), id("<|fim_suffix|>"), id("<|fim_middle|>"))
        else {
            return Err(ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "this model has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>)",
            ));
        };
        let sep = id("<|file_sep|>");
        let fault = app
            .fault_marker
            .as_deref()
            .is_some_and(|m| req.prefix.contains(m) || req.suffix.contains(m) || req.prompt.contains(m));
        let state = Arc::clone(&app);
        let (extra, prefix, suffix, prompt) = (req.extra, req.prefix, req.suffix, req.prompt);
        let tokens = blocking(move || {
            let tokenizer = state.model.tokenizer();
            let plain = |text: &str| tokenizer.encode(text, false, false);
            let mut tokens = Vec::new();
            if tokenizer.add_bos() {
                tokens.extend(tokenizer.bos());
            }
            for (name, text) in &extra {
                match sep {
                    Some(sep) => {
                        tokens.push(sep);
                        tokens.extend(plain(&format!("{name}\n{text}")));
                    }
                    None => tokens.extend(plain(text)),
                }
            }
            tokens.push(pre);
            tokens.extend(plain(&prefix));
            tokens.push(suf);
            tokens.extend(plain(&suffix));
            tokens.push(mid);
            tokens.extend(plain(&prompt));
            Ok(tokens)
        })
        .await?;
        let tools = ReplyTools::plain(OpenAi::boxed(true));
        start(&app, Endpoint::Native, req.common, vec![tokens], tools, fault, peer).await
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// `/v1/models`: the served model as OpenAI lists it, with llama-server's `aliases`, `tags`
/// and `meta` (vocabulary, context, size), and its Ollama-style `models` list.
async fn models(State(app): State<App>) -> Json<Value> {
    let file = app.model.file();
    let metadata = file.metadata();
    let hp = app.model.hparams();
    // llama.cpp's vocabulary types: 1 SentencePiece, 2 byte-level BPE, 3 WordPiece, 4 Unigram.
    let vocab_type = match metadata.get_str("tokenizer.ggml.model").unwrap_or_default() {
        "llama" => 1,
        "gpt2" => 2,
        "bert" => 3,
        "t5" => 4,
        "rwkv" => 5,
        _ => 0,
    };
    let ftype = metadata
        .get_uint("general.file_type")
        .map_or("unknown", crate::quantize::llama_ftype_name);
    let n_params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
    let size: u64 = file.tensors().iter().map(|t| t.size).sum();
    Json(json!({
        "object": "list",
        "data": [{
            "id": app.model_id,
            "aliases": [app.model_id],
            "tags": [],
            "object": "model",
            "created": app.created,
            "owned_by": "minfer",
            "meta": {
                "vocab_type": vocab_type, "n_vocab": app.n_vocab, "n_ctx": app.n_ctx,
                "n_ctx_train": hp.n_ctx_train, "n_embd": hp.n_embd, "n_params": n_params,
                "size": size, "ftype": ftype, "n_slots": app.n_slots,
            },
        }],
        "models": [{
            "name": app.model_id, "model": app.model_id, "modified_at": "", "size": "", "digest": "",
            "type": "model", "description": "", "tags": [""], "capabilities": ["completion"],
            "parameters": "",
            "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                        "parameter_size": "", "quantization_level": ""},
        }],
    }))
}

async fn metrics(State(app): State<App>) -> Response {
    let mut response = (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        app.metrics.render(),
    )
        .into_response();
    // llama-server's header: when the counters started.
    if let Ok(v) = HeaderValue::from_str(&app.metrics.started.load(Ordering::Relaxed).to_string()) {
        response.headers_mut().insert("process-start-time-unix", v);
    }
    response
}

/// `read` with the server's request defaults, for [`read_request`].
fn with_defaults<T: 'static>(
    app: &AppState,
    read: fn(&Value, &request::RequestDefaults) -> Result<T, ApiError>,
) -> impl FnOnce(&Value) -> Result<T, ApiError> + Send + 'static {
    let defaults = Arc::clone(&app.defaults);
    move |body| read(body, &defaults)
}

/// Reads the body within the body timeout (a client trickling it in would otherwise hold its
/// connection and task for as long as it likes), then parses it as JSON and reads it with
/// `read` (`request::chat`, `request::completion`) on the blocking pool: a body of megabytes
/// takes milliseconds to parse, which would stall every other connection on the async threads.
pub(super) async fn read_request<T: Send + 'static>(
    app: &AppState,
    req: Request,
    read: impl FnOnce(&Value) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let body = tokio::time::timeout(app.body_timeout, Bytes::from_request(req, &()))
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s",
                    app.body_timeout.as_secs_f64()
                ),
            )
        })?;
    let max_body_bytes = app.max_body_bytes;
    // Parsing is all CPU: more parses at once than cores only adds memory (each body's values
    // live until it is read).
    let _permit = app
        .parsing
        .acquire()
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    blocking(move || {
        let bytes = body_bytes(max_body_bytes, body)?;
        let large = bytes.len() >= LARGE_BODY_BYTES;
        let result = request::from_body(&bytes, read);
        if large {
            drop(bytes);
            body::release_freed_memory();
        }
        result
    })
    .await
}

/// A body past this size is followed by handing the freed memory back to the system.
const LARGE_BODY_BYTES: usize = 1 << 20;

fn body_bytes(max_body_bytes: usize, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than the limit of {max_body_bytes} bytes"),
        ),
        status => ApiError::new(
            status,
            format!("cannot read the request body: {}", rejection.body_text()),
        ),
    })
}

/// Runs blocking work (template rendering, tokenization) off the async threads.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("a request task failed: {e}")))?
}

async fn chat(State(app): State<App>, req: Request) -> Response {
    chat_as(app, req, |_| Ok((None, OpenAi::boxed(false))), ApiError::body).await
}

/// A chat request in another API's shape (`read` turns the body into a chat completion
/// request, `None` when it is one, and gives the dialect that writes the answer), answered
/// through the chat pipeline; a failure is written by `error`.
pub(super) async fn chat_as(
    app: App,
    req: Request,
    read: impl FnOnce(&Value) -> Result<(Option<Value>, Box<dyn Dialect>), ApiError> + Send + 'static,
    error: fn(&ApiError) -> Value,
) -> Response {
    let result = async {
        let peer = peer_of(&req);
        let defaults = Arc::clone(&app.defaults);
        let (req, dialect) = read_request(&app, req, move |body| {
            let (converted, dialect) = read(body)?;
            Ok((request::chat(converted.as_ref().unwrap_or(body), &defaults)?, dialect))
        })
        .await?;
        let peer = watched(peer);
        chat_reply(&app, req, peer, dialect).await
    }
    .await;
    result.unwrap_or_else(|e| (e.status, Json(error(&e))).into_response())
}

/// Ollama's `/api/generate`: `read` gives nothing for an empty prompt (the answer is that the
/// model is loaded), a chat request, or with `raw` a completion request of the prompt as it
/// is; answered in the dialect it gives, a failure written by `error`.
pub(super) async fn generate_as(
    app: App,
    req: Request,
    read: fn(&Value) -> Result<super::apis::ollama::Generate, ApiError>,
    error: fn(&ApiError) -> Value,
) -> Response {
    enum Read {
        Loaded(Value),
        Chat(request::ChatRequest, Box<dyn Dialect>),
        Raw(request::CompletionRequest, Box<dyn Dialect>),
    }
    let result = async {
        let peer = peer_of(&req);
        let defaults = Arc::clone(&app.defaults);
        let read = read_request(&app, req, move |body| {
            Ok(match read(body)? {
                None => Read::Loaded(body.get("model").cloned().unwrap_or(Value::Null)),
                Some((chat, false, dialect)) => Read::Chat(request::chat(&chat, &defaults)?, dialect),
                Some((completion, true, dialect)) => Read::Raw(request::completion(&completion, &defaults)?, dialect),
            })
        })
        .await?;
        let peer = watched(peer);
        match read {
            Read::Loaded(model) => Ok(Json(json!({
                "model": model, "created_at": "", "response": "", "done": true, "done_reason": "load",
            }))
            .into_response()),
            Read::Chat(req, dialect) => chat_reply(&app, req, peer, dialect).await,
            Read::Raw(req, dialect) => {
                let fault = faulty(&app, &req.prompts);
                let prompts = encode_prompts(&app, "prompt", req.prompts).await?;
                let reply = ReplyTools::plain(dialect);
                start(&app, Endpoint::Completion, req.common, prompts, reply, fault, peer).await
            }
        }
    }
    .await;
    result.unwrap_or_else(|e| (e.status, Json(error(&e))).into_response())
}

/// How many tokens a chat request's prompt is, the request in another API's shape (`read`, as
/// for [`chat_as`]).
pub(super) async fn count_as(
    app: &App,
    req: Request,
    read: impl FnOnce(&Value) -> Result<Value, ApiError> + Send + 'static,
) -> Result<usize, ApiError> {
    let defaults = Arc::clone(&app.defaults);
    let req = read_request(app, req, move |body| request::chat(&read(body)?, &defaults)).await?;
    let state = Arc::clone(app);
    blocking(move || {
        let rendered = render_chat(&state, &req)?;
        Ok(state.model.encode_rendered(&rendered).len())
    })
    .await
}

/// A read chat request, rendered, tokenized and answered in `dialect`'s shape.
async fn chat_reply(
    app: &App,
    req: request::ChatRequest,
    peer: Option<Arc<Peer>>,
    dialect: Box<dyn Dialect>,
) -> Result<Response, ApiError> {
    let tools: Vec<String> = req
        .tools
        .iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_string))
        .collect();
    // With tools, the reply follows their grammar: a valid call where one is required,
    // text or a valid call otherwise. A format the request asks for takes the place of the
    // optional call; with a required one it is a contradiction. A harmony model writes its
    // calls in its own messages, which the `<tool_call>` grammar would forbid (no grammar
    // text can produce a control token): its calls are read from the reply instead, and
    // one that must be made cannot be enforced yet.
    let mut common = req.common.clone();
    let harmony = app.model.template().is_harmony();
    if req.tools.is_some() {
        match (&req.tool_choice, &common.grammar) {
            (ToolChoice::Auto, Some(_)) => {}
            (_, Some((field, _))) => {
                return Err(ApiError::field(
                    field.clone(),
                    format!("{field} cannot be combined with a tool_choice that requires a call"),
                ))
            }
            (ToolChoice::Auto, None) if harmony => {}
            (_, None) if harmony => {
                return Err(ApiError::field(
                    "tool_choice",
                    "tool_choice can only be 'auto' or 'none' for a model that speaks harmony (gpt-oss): \
                     a call it must make cannot be enforced on its channels yet",
                ))
            }
            (choice, None) => {
                let tools = req.tools.as_deref().unwrap_or(&[]);
                common.grammar = Some(("tools".into(), tool_calls::call_grammar(tools, choice)));
            }
        }
    }
    let state = Arc::clone(app);
    let (text, tokens) = blocking(move || {
        let rendered = render_chat(&state, &req)?;
        let tokens = state.model.encode_rendered(&rendered);
        Ok((rendered.text, tokens))
    })
    .await?;
    let fault = app.fault_marker.as_deref().is_some_and(|m| text.contains(m));
    // A thinking template's reasoning goes to reasoning_content unless the request or the
    // server says `none` (harmony models are read by their own parser).
    let format = common.llama.reasoning_format;
    let think = (!harmony && format != ReasoningFormat::None)
        .then(|| ThinkTags::of_template(app.model.template().source()))
        .flatten()
        .map(|tags| super::response::Think {
            tags,
            opened: tags.opened_by(&text),
            legacy: format == ReasoningFormat::DeepseekLegacy,
        });
    // The budget counts the reasoning's tokens as the template tags it; a harmony model's
    // channels are not tags, and a budget there cannot be kept.
    if let Some(n) = common.llama.reasoning_budget {
        let tags = (!harmony)
            .then(|| ThinkTags::of_template(app.model.template().source()))
            .flatten();
        match tags {
            Some(tags) => {
                common.reasoning_budget = Some(crate::engine::ReasoningBudget::for_tags(
                    app.model.tokenizer(),
                    tags,
                    tags.opened_by(&text),
                    n,
                    &common.llama.reasoning_budget_message,
                ))
            }
            None if harmony => {
                return Err(ApiError::field(
                    "reasoning_budget_tokens",
                    "a reasoning budget cannot be kept for a model that speaks harmony (gpt-oss): its reasoning is a channel, not tags",
                ))
            }
            // A template that does not think: there is no reasoning to limit.
            None => {}
        }
    }
    let reply = ReplyTools {
        names: tools,
        think,
        dialect,
    };
    start(app, Endpoint::Chat, common, vec![tokens], reply, fault, peer).await
}

async fn completions(State(app): State<App>, req: Request) -> Response {
    let result = async {
        let peer = peer_of(&req);
        let req = read_request(&app, req, with_defaults(&app, request::completion)).await?;
        let peer = watched(peer);
        let fault = faulty(&app, &req.prompts);
        let prompts = encode_prompts(&app, "prompt", req.prompts).await?;
        start(
            &app,
            Endpoint::Completion,
            req.common,
            prompts,
            ReplyTools::plain(OpenAi::boxed(false)),
            fault,
            peer,
        )
        .await
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// Whether a prompt holds the fault marker (`MINFER_SERVE_FAULT`).
fn faulty(app: &AppState, prompts: &[Prompt]) -> bool {
    let Some(marker) = app.fault_marker.as_deref() else {
        return false;
    };
    prompts.iter().any(|p| match p {
        Prompt::Text(t) => t.contains(marker),
        Prompt::Mixed(pieces) => pieces
            .iter()
            .any(|piece| matches!(piece, PromptPiece::Text(t) if t.contains(marker))),
        Prompt::Tokens(_) => false,
    })
}

/// The prompts as tokens, as llama-server reads them: a text with BOS (if the model adds one)
/// and control-token text parsed, ids as given, and in a mixed prompt the first piece's text
/// alone with BOS. Ids outside the vocabulary are refused, naming the prompt.
pub(super) async fn encode_prompts(app: &App, field: &str, prompts: Vec<Prompt>) -> Result<Vec<Vec<u32>>, ApiError> {
    let several = prompts.len() > 1;
    for (i, prompt) in prompts.iter().enumerate() {
        let which = if several {
            format!("{field} {i}")
        } else {
            format!("the {field}")
        };
        match prompt {
            Prompt::Tokens(ids) => check_ids(app, field, &which, ids)?,
            Prompt::Mixed(pieces) => {
                let ids: Vec<u32> = pieces
                    .iter()
                    .filter_map(|p| match p {
                        PromptPiece::Token(id) => Some(*id),
                        PromptPiece::Text(_) => None,
                    })
                    .collect();
                check_ids(app, field, &which, &ids)?
            }
            Prompt::Text(_) => {}
        }
    }
    let state = Arc::clone(app);
    blocking(move || {
        let tokenizer = state.model.tokenizer();
        Ok(prompts
            .into_iter()
            .map(|p| match p {
                Prompt::Text(t) => state.model.encode(&t),
                Prompt::Tokens(ids) => ids,
                Prompt::Mixed(pieces) => {
                    let mut ids = Vec::new();
                    for (i, piece) in pieces.into_iter().enumerate() {
                        match piece {
                            PromptPiece::Text(t) => ids.extend(tokenizer.encode(&t, i == 0, true)),
                            PromptPiece::Token(id) => ids.push(id),
                        }
                    }
                    ids
                }
            })
            .collect())
    })
    .await
}

/// The connection's peer, to watch for a hang-up while the request runs.
fn peer_of(req: &Request) -> Option<Arc<Peer>> {
    req.extensions().get::<Arc<Peer>>().cloned()
}

/// The peer to watch once the body is read: none if the client has already shut down its side,
/// as that is a half-close, and the client is waiting for the answer.
fn watched(peer: Option<Arc<Peer>>) -> Option<Arc<Peer>> {
    peer.filter(|peer| !peer.hung_up())
}

/// Sets the job's cancel flag when the response is dropped: the client went away, or the
/// stream ended.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// How a reply is read (for tool calls, and a thinking model's reasoning) and written.
struct ReplyTools {
    /// The offered tools' names; none: the reply is not parsed for calls.
    names: Vec<String>,
    /// How a thinking model's reply is split; `None`: it is not.
    think: Option<super::response::Think>,
    /// The API whose shape the answer takes.
    dialect: Box<dyn Dialect>,
}

impl ReplyTools {
    /// A reply read as generated, in `dialect`'s shape.
    fn plain(dialect: Box<dyn Dialect>) -> Self {
        ReplyTools {
            names: Vec::new(),
            think: None,
            dialect,
        }
    }
}

/// Requests taken so far, for `/slots`' `id_task`.
static TASKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Checks the slot, the biases and the context budget, queues the job and answers with its
/// stream or its whole result. A prompt that leaves no room in the context is llama-server's
/// `exceed_context_size_error`; a limit beyond the context is not an error, as in llama-server:
/// the run ends when the context is full (`length`, `truncated`).
async fn start(
    app: &App,
    endpoint: Endpoint,
    common: Common,
    prompts: Vec<Vec<u32>>,
    tools: ReplyTools,
    fault: bool,
    peer: Option<Arc<Peer>>,
) -> Result<Response, ApiError> {
    let mut dialect = tools.dialect;
    let session = common
        .user
        .as_deref()
        .filter(|u| !u.is_empty() && u.len() <= MAX_SESSION_ID)
        .and_then(|u| HeaderValue::from_str(u).ok());
    let with_session = |mut response: Response| {
        if let Some(id) = &session {
            response.headers_mut().insert(SESSION_HEADER, id.clone());
        }
        response
    };
    let n_ctx = app.n_ctx;
    let mut common = common;
    // Another API's answer is written from the whole chat answer, usage included; it has one
    // choice.
    common.include_usage |= dialect.translated();
    if dialect.translated() && common.n > 1 {
        return Err(ApiError::field(
            "n",
            format!(
                "n {} is not supported on this API: it answers with one message",
                common.n
            ),
        ));
    }
    if let Some(id) = common.llama.id_slot.filter(|&id| id >= app.n_slots) {
        return Err(ApiError::field(
            "id_slot",
            format!(
                "id_slot {id} is not a slot: the server has {} (0 to {})",
                app.n_slots,
                app.n_slots - 1
            ),
        ));
    }
    // Biases given as text: each of the text's tokens gets the bias, as llama-server does.
    if !common.logit_bias_text.is_empty() {
        let texts = std::mem::take(&mut common.logit_bias_text);
        let tokenizer = app.model.tokenizer();
        for (text, bias) in texts {
            let ids = tokenizer.encode(&text, false, false);
            common.sampling.logit_bias.extend(ids.into_iter().map(|id| (id, bias)));
        }
    }
    // The request reader does not know the vocabulary; the biased ids are checked here.
    if let Some(&(bad, _)) = common
        .sampling
        .logit_bias
        .iter()
        .find(|&&(id, _)| id as usize >= app.n_vocab)
    {
        return Err(ApiError::field(
            "logit_bias",
            format!(
                "logit_bias token id {bad} is outside the vocabulary of {} tokens",
                app.n_vocab
            ),
        ));
    }
    let mut runs = Vec::new();
    let seed = common.seed.unwrap_or_else(super::random_u64);
    let prompt_param = if endpoint == Endpoint::Chat {
        "messages"
    } else {
        "prompt"
    };
    let n_prompts = prompts.len();
    let mut n_prompt_each = Vec::with_capacity(n_prompts);
    for (p, prompt) in prompts.iter().enumerate() {
        let n_prompt = prompt.len();
        if n_prompt == 0 {
            return Err(ApiError::field(
                prompt_param,
                "the prompt is empty: there is nothing to continue",
            ));
        }
        if n_prompt >= n_ctx {
            return Err(ApiError::exceeds_context(
                prompt_param,
                format!(
                    "the request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens): \
                     the prompt has {n_prompt} tokens, which leaves no room in the context of {n_ctx} tokens; \
                     shorten it, or start the server with a larger --n-ctx"
                ),
                n_prompt,
                n_ctx,
            ));
        }
        n_prompt_each.push(n_prompt);
        // Without a limit, or with one past the context, generation runs to the context's end.
        let max_tokens = common.max_tokens.unwrap_or(n_ctx - n_prompt);
        for j in 0..common.n {
            runs.push(Run {
                index: p * common.n + j,
                prompt: prompt.clone(),
                seed: seed.wrapping_add(j as u64),
                max_tokens,
            });
        }
    }
    // llama-server's ignore_eos bans the end-of-generation tokens (a bias of -inf), so none is
    // ever chosen; a grammar still ends where it is complete.
    let eog = if common.ignore_eos && common.grammar.is_none() {
        app.model.tokenizer().eog()
    } else {
        Vec::new()
    };
    let settings = Arc::new(settings_json(&SettingsOf {
        sampling: &common.sampling,
        seed,
        n_predict: common.max_tokens,
        stop: &common.stop,
        ignore_eos: common.ignore_eos,
        stream: common.stream,
        n_probs: common.logprobs.unwrap_or(0),
        llama: &common.llama,
        eog: &eog,
    }));
    common
        .sampling
        .logit_bias
        .extend(eog.iter().map(|&id| (id, f32::NEG_INFINITY)));
    let grammar = match common.grammar {
        None => None,
        Some((field, spec)) => {
            let model = Arc::clone(&app.model);
            Some(
                blocking(move || {
                    model
                        .compile_grammar(&spec)
                        .map_err(|e| ApiError::field(field.clone(), format!("{field} cannot be used: {e}")))
                })
                .await?,
            )
        }
    };
    // The prompts as the model reads them, for llama-server's `prompt` and `__verbose`.
    let texts = if endpoint == Endpoint::Native || common.llama.verbose {
        let model = Arc::clone(&app.model);
        blocking(move || {
            let tokenizer = model.tokenizer();
            Ok(prompts
                .iter()
                .map(|p| String::from_utf8_lossy(&tokenizer.decode(p, true)).into_owned())
                .collect())
        })
        .await?
    } else {
        Vec::new()
    };
    let n_choices = runs.len();
    dialect.begin(n_prompt_each.iter().sum());
    // A harmony model's replies keep their control tokens (`<|channel|>`, `<|message|>`,
    // `<|end|>`, ...), which llama.cpp prints for it too: the chat reply is read back from them
    // and the completions endpoints return them, as llama-server does.
    let harmony = app.model.template().is_harmony();
    let (events, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let guard = CancelOnDrop(Arc::clone(&cancel));
    let llama = common.llama;
    let submitted = app.scheduler.submit(Job {
        runs,
        options: GenerateOptions {
            max_tokens: 0,
            stop: common.stop,
            ignore_eos: common.ignore_eos,
            sampling: common.sampling,
            grammar,
            special: harmony,
            context_shift: None,
            reasoning_budget: common.reasoning_budget,
        },
        logprobs: common.logprobs,
        post_sampling: llama.post_sampling_probs,
        id_slot: llama.id_slot,
        cache_prompt: llama.cache_prompt,
        progress: llama.return_progress && common.stream,
        timings_per_token: llama.timings_per_token && common.stream,
        task: TASKS.fetch_add(1, Ordering::Relaxed),
        settings: Arc::clone(&settings),
        events,
        cancel,
        peer,
        arrived: Instant::now(),
        fault,
    });
    if submitted.is_err() {
        app.metrics.rejected.fetch_add(1, Ordering::Relaxed);
        return Ok(with_session(unavailable(
            "every slot is busy and the queue is full (--queue-max): try again shortly, or another replica",
        )));
    }
    let prefix = if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" };
    let ping = (llama.sse_ping_interval > 0).then(|| std::time::Duration::from_secs(llama.sse_ping_interval as u64));
    let reply = Reply {
        id: format!("{prefix}-{:016x}", super::random_u64()),
        created: super::unix_time(),
        model: app.model_id.clone(),
        endpoint,
        tools: tools.names,
        think: tools.think,
        include_usage: common.include_usage,
        n: common.n,
        tokenizer: app.model.shared_tokenizer(),
        harmony,
        llama: LlamaReply {
            settings,
            prompts: texts,
            n_prompt: n_prompt_each,
            return_tokens: llama.return_tokens,
            response_fields: llama.response_fields,
            verbose: llama.verbose,
            post_sampling_probs: llama.post_sampling_probs,
            timings_per_token: llama.timings_per_token,
        },
        for_dialect: dialect.translated(),
    };
    if !common.stream {
        let mut collector = Collector::new(reply);
        while let Some(event) = rx.recv().await {
            collector.push(event)?;
        }
        drop(guard);
        let body = dialect.whole(collector.finish(n_choices)?);
        return Ok(with_session(Json(body).into_response()));
    }
    let streamer = Streamer::new(reply);
    let content_type = dialect.content_type();
    let frames = futures_util::stream::unfold(
        (rx, (streamer, dialect), guard, false),
        move |(mut rx, (mut streamer, mut dialect), guard, done)| async move {
            if done {
                return None;
            }
            // Events that make no frame (a log-probability waiting for its text) are skipped
            // here: an empty chunk would end a chunked body early. A stream silent for the ping
            // interval (a long prompt being read) gets an SSE comment, as llama-server sends,
            // so that clients and proxies with idle timeouts keep it open.
            loop {
                let next = match ping {
                    Some(interval) => match tokio::time::timeout(interval, rx.recv()).await {
                        Ok(next) => next,
                        Err(_) => {
                            let text = dialect.keepalive();
                            return Some((
                                Ok::<_, std::convert::Infallible>(text),
                                (rx, (streamer, dialect), guard, false),
                            ));
                        }
                    },
                    None => rx.recv().await,
                };
                match next {
                    Some(event) => {
                        let text = dialect.frames(streamer.push_frames(event));
                        if !text.is_empty() {
                            return Some((Ok(text), (rx, (streamer, dialect), guard, false)));
                        }
                    }
                    None => {
                        let mut text = dialect.frames(streamer.finish_frames());
                        text.push_str(&dialect.end());
                        if text.is_empty() {
                            return None;
                        }
                        return Some((Ok(text), (rx, (streamer, dialect), guard, true)));
                    }
                }
            }
        },
    );
    Response::builder()
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(frames))
        .map(with_session)
        .map_err(|e| ApiError::internal(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::ChatTemplate;

    fn gpt_oss() -> ChatTemplate {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/chat/templates/openai-gpt-oss-120b.jinja");
        ChatTemplate::new(&std::fs::read_to_string(path).unwrap(), "", "").unwrap()
    }

    #[test]
    fn a_harmony_template_reads_an_openai_assistant_turns_reasoning_content_as_its_thinking() {
        let template = gpt_oss();
        let call = json!([{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]);
        // What an OpenAI client sends back: this server's `reasoning_content`, null content.
        let openai = [
            json!({"role": "user", "content": "Hi"}),
            json!({"role": "assistant", "content": null, "reasoning_content": "Need f.", "tool_calls": call}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "2"}),
        ];
        let thinking = [
            openai[0].clone(),
            json!({"role": "assistant", "thinking": "Need f.", "tool_calls": call}),
            openai[2].clone(),
        ];
        let render = |messages: &[Value]| template.render(messages, None, true, &serde_json::Map::new());
        let expected = render(&thinking).unwrap();
        assert!(
            expected.contains("<|channel|>analysis<|message|>Need f.<|end|>"),
            "{expected}"
        );
        assert_eq!(render(&harmony_messages(&openai)).unwrap(), expected);
        // As sent, the template cannot test null content for its markers.
        assert!(render(&openai).is_err());
        // Content beside a call without reasoning is the template's own analysis text; a final
        // answer keeps its content, and other roles are left alone.
        let kept = [
            json!({"role": "assistant", "content": "Thinking aloud.", "tool_calls": call}),
            json!({"role": "assistant", "content": "Done.", "reasoning_content": "ok"}),
            json!({"role": "user", "content": null, "reasoning_content": "x"}),
        ];
        let adjusted = harmony_messages(&kept);
        assert_eq!(adjusted[0], kept[0]);
        assert_eq!(adjusted[1]["content"], "Done.");
        assert_eq!(adjusted[1]["thinking"], "ok");
        assert_eq!(adjusted[2], kept[2]);
    }
}
