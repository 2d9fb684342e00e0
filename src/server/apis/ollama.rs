//! Ollama's API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/ps`,
//! `/api/version`, `/api/embed`, `/api/embeddings`), what OpenWebUI, editor plugins and countless scripts speak.
//!
//! `/api/chat` becomes a chat completion request (messages with `thinking` and `tool_calls`,
//! `tools`, `format` `"json"` or a schema, `options`, `think`), `/api/generate` one user turn
//! after `system` (or, with `raw`, a completion of the prompt as it is); `options` take
//! llama.cpp's sampling fields by Ollama's names (`num_predict`, `repeat_penalty`, `top_k`, ...).
//! Both stream by default, as Ollama does: NDJSON lines (`message`/`response`, `thinking`,
//! `done: false`), then the last line with `done_reason` and the counts and durations in
//! nanoseconds; `stream: false` is the one last object with the whole text. Errors are
//! `{"error": "..."}`.
//!
//! A single-model server answers to any `model` name, as its OpenAI endpoints do, and never
//! unloads (`keep_alive` is taken and has nothing to do); the options that size the model at
//! load time (`num_ctx`, `num_gpu`, `num_thread`, ...) are the server's flags and are taken
//! without effect per request; images, `suffix`, `template` and `context` are refused by name.
//!
//! This file holds the shapes only: it reads JSON into JSON and writes lines.

use super::{ChunkParts, Dialect};
use crate::server::embeddings;
use crate::server::error::ApiError;
use crate::server::request::kind;
use crate::server::routes::{self, App};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value as Json};

/// The Ollama release whose API this one follows, for `/api/version` (clients gate features on
/// it).
pub const OLLAMA_API_VERSION: &str = "0.13.0";

/// `POST /api/chat`.
pub async fn chat(State(app): State<App>, req: Request) -> Response {
    let read = |body: &Json| read_chat(body).map(|(chat, dialect)| (Some(chat), dialect));
    routes::chat_as(app, req, read, error_body).await
}

/// `POST /api/generate`: a chat turn, or with `raw` a completion; an empty prompt only
/// answers that the model is loaded, as Ollama's does.
pub async fn generate(State(app): State<App>, req: Request) -> Response {
    routes::generate_as(app, req, read_generate, error_body).await
}

/// A failure in Ollama's shape.
pub fn error_body(e: &ApiError) -> Json {
    json!({ "error": e.message })
}

/// Reads `/api/generate`: `Ok(None)` for an empty prompt (the model is loaded: nothing to do),
/// else the chat request (`raw`: the completion request, second member true) and the dialect.
pub type Generate = Option<(Json, bool, Box<dyn Dialect>)>;

fn object(body: &Json) -> Result<&Map<String, Json>, ApiError> {
    match body {
        Json::Object(b) => Ok(b),
        other => Err(ApiError::bad_request(format!(
            "the request body must be a JSON object, not {}",
            kind(other)
        ))),
    }
}

pub fn read_chat(body: &Json) -> Result<(Json, Box<dyn Dialect>), ApiError> {
    let b = object(body)?;
    let mut chat = common(b)?;
    let messages = match b.get("messages") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, m)| message(i, m))
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(ApiError::field(
                "messages",
                format!("messages must be an array, not {}", kind(other)),
            ))
        }
    };
    chat.insert("messages".into(), Json::Array(messages));
    if let Some(tools) = b.get("tools").filter(|t| !t.is_null()) {
        chat.insert("tools".into(), tools.clone());
    }
    Ok((Json::Object(chat), Box::new(Ollama::new(b, false))))
}

pub fn read_generate(body: &Json) -> Result<Generate, ApiError> {
    let b = object(body)?;
    for (name, why) in [
        ("suffix", "fill-in-the-middle is llama-server's /infill here"),
        ("template", "the model's own chat template is used"),
        ("context", "send the conversation to /api/chat instead"),
        ("images", "image input is not supported (minfer runs text-only models)"),
    ] {
        if b.get(name)
            .is_some_and(|v| !v.is_null() && *v != json!("") && *v != json!([]))
        {
            return Err(ApiError::field(name, format!("{name} is not supported: {why}")));
        }
    }
    let prompt = match b.get("prompt") {
        None | Some(Json::Null) => "",
        Some(Json::String(p)) => p.as_str(),
        Some(other) => {
            return Err(ApiError::field(
                "prompt",
                format!("prompt must be a string, not {}", kind(other)),
            ))
        }
    };
    if prompt.is_empty() {
        return Ok(None);
    }
    let mut request = common(b)?;
    let raw = b.get("raw").and_then(Json::as_bool).unwrap_or(false);
    if raw {
        request.insert("prompt".into(), json!(prompt));
    } else {
        let mut messages = Vec::new();
        if let Some(system) = b.get("system").and_then(Json::as_str).filter(|s| !s.is_empty()) {
            messages.push(json!({"role": "system", "content": system}));
        }
        messages.push(json!({"role": "user", "content": prompt}));
        request.insert("messages".into(), Json::Array(messages));
    }
    Ok(Some((Json::Object(request), raw, Box::new(Ollama::new(b, true)))))
}

/// The fields both endpoints share: `stream` (on unless false), `format`, `think`, `options`,
/// and llama-server's own fields passed through.
fn common(b: &Map<String, Json>) -> Result<Map<String, Json>, ApiError> {
    let mut chat = Map::new();
    chat.insert(
        "stream".into(),
        json!(b.get("stream").and_then(Json::as_bool).unwrap_or(true)),
    );
    match b.get("format") {
        None | Some(Json::Null) => {}
        Some(Json::String(f)) if f.is_empty() => {}
        Some(Json::String(f)) if f == "json" => {
            chat.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(schema @ Json::Object(_)) => {
            chat.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "format", "schema": schema}}),
            );
        }
        Some(other) => {
            return Err(ApiError::field(
                "format",
                format!("format must be \"json\" or a JSON schema object, not {other}"),
            ))
        }
    }
    match b.get("think") {
        None | Some(Json::Null) => {}
        Some(Json::Bool(on)) => {
            chat.insert("chat_template_kwargs".into(), json!({ "enable_thinking": on }));
        }
        Some(Json::String(level)) if matches!(level.as_str(), "low" | "medium" | "high") => {
            chat.insert("chat_template_kwargs".into(), json!({ "enable_thinking": true }));
            chat.insert("reasoning_effort".into(), json!(level));
        }
        Some(other) => {
            return Err(ApiError::field(
                "think",
                format!("think must be true, false, \"low\", \"medium\" or \"high\", not {other}"),
            ))
        }
    }
    if let Some(options) = b.get("options").filter(|o| !o.is_null()) {
        let Json::Object(options) = options else {
            return Err(ApiError::field("options", "options must be an object"));
        };
        for (name, value) in options {
            option(name, value, &mut chat)?;
        }
    }
    for (name, value) in b {
        if !OLLAMA_FIELDS.contains(&name.as_str()) {
            chat.entry(name.clone()).or_insert_with(|| value.clone());
        }
    }
    Ok(chat)
}

/// Ollama's request fields, read here or (routing) taken.
const OLLAMA_FIELDS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "system",
    "raw",
    "stream",
    "format",
    "think",
    "options",
    "tools",
    "keep_alive",
    "suffix",
    "template",
    "context",
    "images",
];

/// Ollama's options read by the sampler under llama-server's names.
const SAMPLING_OPTIONS: &[(&str, &str)] = &[
    ("temperature", "temperature"),
    ("top_k", "top_k"),
    ("top_p", "top_p"),
    ("min_p", "min_p"),
    ("typical_p", "typical_p"),
    ("repeat_penalty", "repeat_penalty"),
    ("repeat_last_n", "repeat_last_n"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
    ("seed", "seed"),
    ("stop", "stop"),
    ("mirostat", "mirostat"),
    ("mirostat_tau", "mirostat_tau"),
    ("mirostat_eta", "mirostat_eta"),
    ("num_keep", "n_keep"),
];

/// Options that size or place the model when Ollama loads it: here they are the server's
/// flags (`-c`, `-t`, `-ngl`, ...), fixed at start.
const LOAD_OPTIONS: &[&str] = &[
    "num_ctx",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "num_thread",
    "use_mmap",
    "use_mlock",
    "numa",
    "low_vram",
    "vocab_only",
    "f16_kv",
    "logits_all",
    "penalize_newline",
];

fn option(name: &str, value: &Json, chat: &mut Map<String, Json>) -> Result<(), ApiError> {
    if let Some((_, field)) = SAMPLING_OPTIONS.iter().find(|(n, _)| *n == name) {
        chat.insert((*field).into(), value.clone());
        return Ok(());
    }
    match name {
        // -1: until the model stops; -2: until the context is full; both are no limit here.
        "num_predict" => {
            if value.as_i64().is_none_or(|n| n >= 0) {
                chat.insert("max_tokens".into(), value.clone());
            }
        }
        "tfs_z" if value.as_f64() == Some(1.0) => {}
        _ if LOAD_OPTIONS.contains(&name) => {}
        _ => {
            return Err(ApiError::field(
                format!("options.{name}"),
                format!("options.{name} is not supported"),
            ))
        }
    }
    Ok(())
}

/// One Ollama message as a chat message: `thinking` its reasoning, `tool_calls` with object
/// arguments, a tool's `tool_name` its name.
fn message(index: usize, m: &Json) -> Result<Json, ApiError> {
    let at = format!("messages[{index}]");
    let Json::Object(map) = m else {
        return Err(ApiError::field(at.clone(), format!("{at} must be an object")));
    };
    if map
        .get("images")
        .is_some_and(|i| i.as_array().is_some_and(|a| !a.is_empty()))
    {
        return Err(ApiError::field(
            format!("{at}.images"),
            format!("{at}.images: image input is not supported (minfer runs text-only models)"),
        ));
    }
    let mut out = Map::new();
    for (name, value) in map {
        match name.as_str() {
            "thinking" => {
                out.insert("reasoning_content".into(), value.clone());
            }
            "tool_name" => {
                out.insert("name".into(), value.clone());
            }
            "tool_calls" => {
                let calls = value.as_array().cloned().unwrap_or_default();
                let calls: Vec<Json> = calls
                    .iter()
                    .enumerate()
                    .map(|(k, c)| {
                        let mut call = json!({"type": "function", "function": c["function"]});
                        call["id"] = c
                            .get("id")
                            .cloned()
                            .unwrap_or_else(|| json!(format!("call_{index}_{k}")));
                        call
                    })
                    .collect();
                out.insert("tool_calls".into(), Json::Array(calls));
            }
            "images" => {}
            _ => {
                out.insert(name.clone(), value.clone());
            }
        }
    }
    Ok(Json::Object(out))
}

/// RFC 3339 UTC with nanoseconds, as Ollama writes `created_at`.
fn timestamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let base = crate::template::format_utc("%Y-%m-%dT%H:%M:%S", now.as_secs() as i64);
    format!("{base}.{:09}Z", now.subsec_nanos())
}

/// Writes a chat answer as Ollama's lines (`/api/chat`: `message`; `/api/generate`:
/// `response`).
pub struct Ollama {
    model: String,
    generate: bool,
    /// How the answer ended, its tool calls, counts and llama-server's timings, for the last
    /// line.
    stop_type: Option<String>,
    calls: bool,
    usage: (u64, u64, u64),
    timings: Option<Json>,
    failed: bool,
}

impl Ollama {
    fn new(b: &Map<String, Json>, generate: bool) -> Ollama {
        Ollama {
            model: b.get("model").and_then(Json::as_str).unwrap_or_default().to_string(),
            generate,
            stop_type: None,
            calls: false,
            usage: (0, 0, 0),
            timings: None,
            failed: false,
        }
    }

    /// A line's body: the model and time, and the text under the endpoint's key.
    fn line(&self, content: &str, thinking: Option<&str>, calls: Option<Json>, done: bool) -> Json {
        let mut line = json!({"model": self.model, "created_at": timestamp()});
        if self.generate {
            line["response"] = json!(content);
            if let Some(t) = thinking {
                line["thinking"] = json!(t);
            }
        } else {
            let mut message = json!({"role": "assistant", "content": content});
            if let Some(t) = thinking {
                message["thinking"] = json!(t);
            }
            if let Some(calls) = calls {
                message["tool_calls"] = calls;
            }
            line["message"] = message;
        }
        line["done"] = json!(done);
        line
    }

    /// The last line's fields: why it stopped, and the counts and durations (nanoseconds).
    fn finish(&self, line: &mut Json) {
        let reason = match self.stop_type.as_deref() {
            Some("limit") => "length",
            _ => "stop",
        };
        let ms = |key: &str| {
            self.timings
                .as_ref()
                .and_then(|t| t[key].as_f64())
                .map_or(0, |ms| (ms * 1e6) as u64)
        };
        let (prompt_ns, eval_ns) = (ms("prompt_ms"), ms("predicted_ms"));
        let (n_prompt, _, n_generated) = self.usage;
        line["done_reason"] = json!(reason);
        line["total_duration"] = json!(prompt_ns + eval_ns);
        line["load_duration"] = json!(0);
        line["prompt_eval_count"] = json!(n_prompt);
        line["prompt_eval_duration"] = json!(prompt_ns);
        line["eval_count"] = json!(n_generated);
        line["eval_duration"] = json!(eval_ns);
    }
}

/// Ollama's tool calls: the arguments as an object.
fn ollama_calls(calls: &[(String, String, String)]) -> Json {
    Json::Array(
        calls
            .iter()
            .enumerate()
            .map(|(k, (id, name, arguments))| {
                let arguments = serde_json::from_str::<Json>(arguments).unwrap_or(json!({}));
                json!({"id": id, "function": {"index": k, "name": name, "arguments": arguments}})
            })
            .collect(),
    )
}

impl Dialect for Ollama {
    fn whole(&mut self, chat: Json) -> Json {
        let choice = &chat["choices"][0];
        let message = &choice["message"];
        if self.model.is_empty() {
            self.model = chat["model"].as_str().unwrap_or_default().to_string();
        }
        self.stop_type = choice["stop_type"].as_str().map(str::to_string);
        self.usage = super::usage_counts(&chat["usage"]);
        self.timings = chat.get("timings").cloned();
        let text = message["content"]
            .as_str()
            .or(choice["text"].as_str())
            .unwrap_or_default();
        let thinking = message["reasoning_content"].as_str();
        let calls: Vec<(String, String, String)> = message["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let f = &c["function"];
                let text = |v: &Json| v.as_str().unwrap_or_default().to_string();
                (text(&c["id"]), text(&f["name"]), text(&f["arguments"]))
            })
            .collect();
        let calls = (!calls.is_empty()).then(|| ollama_calls(&calls));
        let mut line = self.line(text, thinking, calls, true);
        self.finish(&mut line);
        line
    }

    fn frames(&mut self, chunks: Vec<Json>) -> String {
        let mut out = String::new();
        for chunk in &chunks {
            let parts = ChunkParts::of(chunk);
            if let Some(e) = parts.error {
                self.failed = true;
                out.push_str(&format!("{}\n", error_body(&e)));
                continue;
            }
            if self.model.is_empty() {
                self.model = chunk["model"].as_str().unwrap_or_default().to_string();
            }
            if parts.reasoning.is_some() || parts.content.is_some() || !parts.calls.is_empty() {
                let calls = (!parts.calls.is_empty()).then(|| ollama_calls(&parts.calls));
                self.calls |= calls.is_some();
                let line = self.line(
                    parts.content.as_deref().unwrap_or(""),
                    parts.reasoning.as_deref(),
                    calls,
                    false,
                );
                out.push_str(&format!("{line}\n"));
            }
            if let Some((stop_type, _)) = parts.finish {
                self.stop_type = Some(stop_type);
            }
            if let Some(usage) = parts.usage {
                self.usage = usage;
            }
            if parts.timings.is_some() {
                self.timings = parts.timings;
            }
        }
        out
    }

    fn end(&mut self) -> String {
        if self.failed {
            return String::new();
        }
        let mut line = self.line("", None, None, true);
        self.finish(&mut line);
        format!("{line}\n")
    }

    fn keepalive(&self) -> String {
        // NDJSON has no comment, and Ollama's clients parse every line: a line of no text.
        format!("{}\n", self.line("", None, None, false))
    }

    fn content_type(&self) -> &'static str {
        "application/x-ndjson"
    }
}

/// The served model as Ollama describes it: `details` (format, family, parameter size,
/// quantization level).
fn details(app: &App) -> Json {
    let file = app.model.file();
    let metadata = file.metadata();
    let arch = metadata.get_str("general.architecture").unwrap_or_default().to_string();
    let n_params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
    let parameter_size = if n_params >= 1_000_000_000 {
        format!("{:.1}B", n_params as f64 / 1e9)
    } else {
        format!("{:.2}M", n_params as f64 / 1e6)
    };
    let level = metadata
        .get_uint("general.file_type")
        .map_or("unknown".to_string(), |id| {
            quantization_level(crate::quantize::llama_ftype_name(id))
        });
    json!({"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
           "parameter_size": parameter_size, "quantization_level": level})
}

/// Ollama's short name for a llama.cpp file type (`Q4_K - Medium` is `Q4_K_M`).
fn quantization_level(llama_name: &str) -> String {
    let (base, rest) = llama_name.split_once(" - ").unwrap_or((llama_name, ""));
    match rest {
        "Small" => format!("{base}_S"),
        "Medium" => format!("{base}_M"),
        "Large" => format!("{base}_L"),
        _ => base.split(' ').next().unwrap_or(base).to_string(),
    }
}

fn size(app: &App) -> u64 {
    app.model.file().tensors().iter().map(|t| t.size).sum()
}

/// A model file's modification time as Ollama writes `modified_at` (RFC 3339, UTC).
pub fn modified_at(path: &std::path::Path) -> String {
    let modified = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs() as i64);
    crate::template::format_utc("%Y-%m-%dT%H:%M:%SZ", modified)
}

/// `GET /api/tags`: the models this server has.
pub async fn tags(State(app): State<App>) -> Response {
    axum::Json(json!({"models": [{
        "name": app.model_id, "model": app.model_id, "modified_at": modified_at(app.model.path()),
        "size": size(&app), "digest": "", "details": details(&app),
    }]}))
    .into_response()
}

/// `GET /api/ps`: the models loaded now (the one, always).
pub async fn ps(State(app): State<App>) -> Response {
    axum::Json(json!({"models": [{
        "name": app.model_id, "model": app.model_id, "size": size(&app), "digest": "",
        "details": details(&app), "expires_at": "0001-01-01T00:00:00Z", "size_vram": 0,
        "context_length": app.n_ctx,
    }]}))
    .into_response()
}

/// `GET /api/version`.
pub async fn version() -> Response {
    axum::Json(json!({"version": OLLAMA_API_VERSION, "minfer": env!("CARGO_PKG_VERSION")})).into_response()
}

/// `POST /api/show`: the model's details, template, capabilities and GGUF keys.
pub async fn show(State(app): State<App>) -> Response {
    let file = app.model.file();
    let metadata = file.metadata();
    let hp = app.model.hparams();
    let arch = metadata.get_str("general.architecture").unwrap_or_default().to_string();
    let mut info = Map::new();
    info.insert("general.architecture".into(), json!(arch));
    info.insert(
        "general.parameter_count".into(),
        json!(file.tensors().iter().map(|t| t.n_elements()).sum::<u64>()),
    );
    info.insert(format!("{arch}.context_length"), json!(hp.n_ctx_train));
    info.insert(format!("{arch}.embedding_length"), json!(hp.n_embd));
    info.insert(format!("{arch}.block_count"), json!(hp.n_layer));
    info.insert(format!("{arch}.attention.head_count"), json!(hp.n_head));
    info.insert(format!("{arch}.attention.head_count_kv"), json!(hp.n_head_kv));
    info.insert(
        "tokenizer.ggml.model".into(),
        json!(metadata.get_str("tokenizer.ggml.model").unwrap_or_default()),
    );
    let template = app.model.template().source().to_string();
    let mut capabilities = vec!["completion"];
    if template.contains("tools") {
        capabilities.push("tools");
    }
    if crate::template::reasoning::ThinkTags::of_template(&template).is_some() || app.model.template().is_harmony() {
        capabilities.push("thinking");
    }
    // The server's sampling defaults, as a Modelfile's PARAMETER lines name them.
    let p = &app.defaults.sampling;
    let mut parameters = vec![
        format!("temperature {}", p.temperature),
        format!("top_k {}", p.top_k),
        format!("top_p {}", p.top_p),
        format!("min_p {}", p.min_p),
        format!("repeat_penalty {}", p.repeat_penalty),
    ];
    parameters.extend(app.defaults.stop.iter().map(|s| format!("stop {s:?}")));
    let parameters = parameters.join("\n");
    axum::Json(json!({
        "modelfile": format!("FROM {}\n", app.model.path().display()),
        "parameters": parameters,
        "template": template,
        "details": details(&app),
        "model_info": info,
        "capabilities": capabilities,
        "modified_at": modified_at(app.model.path()),
    }))
    .into_response()
}

/// What Ollama's API has that minfer does not: refused by name.
pub async fn unsupported(req: Request) -> Response {
    let path = req.uri().path().to_string();
    let why = match path.as_str() {
        "/api/pull" => "this server serves the model it was started with (`minfer serve --models-dir DIR` serves and pulls several; `minfer pull` fetches)",
        _ => "minfer creates, copies, pushes and deletes no models over HTTP (use `minfer pull` and the model cache)",
    };
    let e = ApiError::new(StatusCode::NOT_IMPLEMENTED, format!("{path} is not supported: {why}"));
    (e.status, axum::Json(error_body(&e))).into_response()
}

/// `POST /api/embed`: `input` (a text or texts) as L2-normalized vectors, as Ollama answers;
/// `truncate` (default true) cuts an input to what one pass reads, else it is refused.
pub async fn embed(State(app): State<App>, req: Request) -> Response {
    let result = async {
        let start = std::time::Instant::now();
        let (texts, truncate, dimensions) = routes::read_request(&app, req, read_embed).await?;
        let (rows, pooling, n_tokens) = embeddings::embed_texts(&app, texts, truncate).await?;
        let vectors = pooled(rows, pooling)?;
        if let Some(d) = dimensions.filter(|&d| vectors.first().is_some_and(|v| v.len() != d)) {
            return Err(ApiError::bad_request(format!(
                "dimensions = {d} is not supported: this model's embeddings have {} dimensions and it was not trained to be truncated",
                vectors[0].len()
            )));
        }
        let vectors: Vec<Vec<f32>> = vectors
            .into_iter()
            .map(|mut v| {
                crate::engine::Normalize::EUCLIDEAN.apply(&mut v);
                v
            })
            .collect();
        Ok::<_, ApiError>(axum::Json(json!({
            "model": app.model_id, "embeddings": vectors, "total_duration": start.elapsed().as_nanos() as u64,
            "load_duration": 0, "prompt_eval_count": n_tokens,
        }))
        .into_response())
    }
    .await;
    result.unwrap_or_else(|e| (e.status, axum::Json(error_body(&e))).into_response())
}

/// `POST /api/embeddings`, Ollama's older form: `prompt` to one vector, not normalized (an
/// empty prompt gives an empty vector, as Ollama's does).
pub async fn embeddings(State(app): State<App>, req: Request) -> Response {
    let result = async {
        let prompt = routes::read_request(&app, req, |body| {
            let map = object(body)?;
            match map.get("prompt") {
                None | Some(Json::Null) => Ok(String::new()),
                Some(Json::String(p)) => Ok(p.clone()),
                Some(other) => Err(ApiError::field(
                    "prompt",
                    format!("prompt must be a string, not {}", kind(other)),
                )),
            }
        })
        .await?;
        if prompt.is_empty() {
            return Ok(axum::Json(json!({"embedding": []})).into_response());
        }
        let (rows, pooling, _) = embeddings::embed_texts(&app, vec![prompt], true).await?;
        let vector = pooled(rows, pooling)?.pop().unwrap_or_default();
        Ok::<_, ApiError>(axum::Json(json!({ "embedding": vector })).into_response())
    }
    .await;
    result.unwrap_or_else(|e| (e.status, axum::Json(error_body(&e))).into_response())
}

/// One vector per input: Ollama has no per-token rows or rank scores.
fn pooled(rows: Vec<crate::engine::Rows>, pooling: crate::models::pooling::Pooling) -> Result<Vec<Vec<f32>>, ApiError> {
    use crate::models::pooling::Pooling;
    if matches!(pooling, Pooling::None | Pooling::Rank) {
        return Err(ApiError::bad_request(format!(
            "this server pools embeddings by '{pooling}', which gives no single vector per input: start it with another --pooling"
        )));
    }
    Ok(rows.into_iter().filter_map(|mut r| r.pop()).collect())
}

/// An `/api/embed` body: `input` (a text or an array of texts), `truncate`, `dimensions`.
fn read_embed(body: &Json) -> Result<(Vec<String>, bool, Option<usize>), ApiError> {
    let map = object(body)?;
    let texts = match map.get("input") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::String(s)) => vec![s.clone()],
        Some(Json::Array(items)) => crate::server::request::strings("input", items)?,
        Some(other) => {
            return Err(ApiError::field(
                "input",
                format!("input must be a string or an array of strings, not {}", kind(other)),
            ))
        }
    };
    if texts.is_empty() {
        return Err(ApiError::field(
            "input",
            "input is required: a text or an array of texts",
        ));
    }
    embeddings::check_count("input", texts.len())?;
    let truncate = match map.get("truncate") {
        None | Some(Json::Null) => true,
        Some(Json::Bool(b)) => *b,
        Some(other) => {
            return Err(ApiError::field(
                "truncate",
                format!("truncate must be a boolean, not {}", kind(other)),
            ))
        }
    };
    let dimensions = match map.get("dimensions") {
        None | Some(Json::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|&d| d > 0)
                .ok_or_else(|| ApiError::field("dimensions", "dimensions must be a positive integer"))?
                as usize,
        ),
    };
    Ok((texts, truncate, dimensions))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_request_becomes_the_chat_completion_it_means() {
        let (chat, _) = read_chat(&json!({
            "model": "qwen2.5-coder:0.5b", "format": "json", "think": "high", "keep_alive": "5m",
            "options": {"temperature": 0.1, "num_predict": 7, "repeat_penalty": 1.1, "stop": ["\n"],
                        "num_ctx": 8192, "num_thread": 4, "num_keep": 5},
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "thinking": "Use the tool.",
                 "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
                {"role": "tool", "tool_name": "get_weather", "content": "5 C"},
            ],
        }))
        .unwrap();
        assert_eq!(chat["stream"], true, "Ollama streams unless told not to");
        assert_eq!(chat["response_format"], json!({"type": "json_object"}));
        assert_eq!(chat["reasoning_effort"], "high");
        assert_eq!(chat["chat_template_kwargs"], json!({"enable_thinking": true}));
        assert_eq!(
            (chat["temperature"].clone(), chat["max_tokens"].clone()),
            (json!(0.1), json!(7))
        );
        assert_eq!(
            (chat["repeat_penalty"].clone(), chat["n_keep"].clone()),
            (json!(1.1), json!(5))
        );
        assert_eq!(chat["stop"], json!(["\n"]));
        assert!(chat.get("num_ctx").is_none() && chat.get("keep_alive").is_none());
        assert_eq!(
            chat["messages"][1],
            json!({"role": "assistant", "content": "", "reasoning_content": "Use the tool.", "tool_calls": [
                {"id": "call_1_0", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]})
        );
        assert_eq!(
            chat["messages"][2],
            json!({"role": "tool", "name": "get_weather", "content": "5 C"})
        );
        crate::server::request::chat(&chat, &Default::default()).unwrap();
        // num_predict -1 and -2 are no limit.
        let (unlimited, _) = read_chat(&json!({"messages": [], "options": {"num_predict": -1}})).unwrap();
        assert!(unlimited.get("max_tokens").is_none());
    }

    #[test]
    fn generate_is_a_turn_after_the_system_prompt_or_with_raw_the_prompt_as_it_is() {
        let Some((chat, raw, _)) =
            read_generate(&json!({"prompt": "Hi", "system": "Be brief.", "stream": false})).unwrap()
        else {
            panic!("a prompt generates")
        };
        assert!(!raw);
        assert_eq!(
            chat["messages"],
            json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
        );
        assert_eq!(chat["stream"], false);
        let Some((completion, raw, _)) = read_generate(&json!({"prompt": "Once", "raw": true})).unwrap() else {
            panic!("a raw prompt generates")
        };
        assert!(raw);
        assert_eq!(completion["prompt"], "Once");
        assert!(
            read_generate(&json!({"model": "m"})).unwrap().is_none(),
            "an empty prompt only loads"
        );
        let refused = |body: Json| read_generate(&body).err().expect("refused").param.unwrap_or_default();
        assert_eq!(refused(json!({"prompt": "x", "suffix": "y"})), "suffix");
        assert_eq!(refused(json!({"prompt": "x", "images": ["AA"]})), "images");
        assert_eq!(refused(json!({"prompt": "x", "context": [1, 2]})), "context");
        assert_eq!(
            refused(json!({"prompt": "x", "options": {"tfs_z": 0.5}})),
            "options.tfs_z"
        );
    }

    #[test]
    fn answers_are_ollama_lines_with_counts_and_durations_in_nanoseconds() {
        let mut d = Ollama::new(&Map::new(), false);
        let chat = json!({
            "model": "m",
            "choices": [{"finish_reason": "length", "stop_type": "limit", "message": {
                "role": "assistant", "content": "Hi", "reasoning_content": "Hmm",
                "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{\"x\":1}"}}]}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 2},
            "timings": {"prompt_ms": 1.5, "predicted_ms": 2.0},
        });
        let line = d.whole(chat);
        assert_eq!(line["model"], "m");
        assert_eq!(line["message"]["content"], "Hi");
        assert_eq!(line["message"]["thinking"], "Hmm");
        assert_eq!(
            line["message"]["tool_calls"][0]["function"]["arguments"],
            json!({"x": 1})
        );
        assert_eq!(
            (line["done"].clone(), line["done_reason"].clone()),
            (json!(true), json!("length"))
        );
        assert_eq!(
            (line["prompt_eval_count"].clone(), line["eval_count"].clone()),
            (json!(9), json!(2))
        );
        assert_eq!(line["prompt_eval_duration"], 1_500_000);
        assert_eq!(line["total_duration"], 3_500_000);
        let mut g = Ollama::new(&Map::new(), true);
        let mut out = g.frames(vec![
            json!({"model": "m", "choices": [{"index": 0, "text": "Once", "finish_reason": null}]}),
        ]);
        out += &g.end();
        let lines: Vec<Json> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines[0]["response"], "Once");
        assert_eq!(lines[0]["done"], false);
        assert_eq!(lines[1]["done"], true);
        assert!(lines[1].get("message").is_none());
        // What an idle stream sends is a line Ollama's clients parse: no text, not done.
        let idle: Json = serde_json::from_str(g.keepalive().trim_end()).unwrap();
        assert_eq!(
            (idle["response"].clone(), idle["done"].clone()),
            (json!(""), json!(false))
        );
    }

    #[test]
    fn file_types_get_ollamas_short_names() {
        assert_eq!(quantization_level("Q4_K - Medium"), "Q4_K_M");
        assert_eq!(quantization_level("Q3_K - Small"), "Q3_K_S");
        assert_eq!(quantization_level("Q8_0"), "Q8_0");
        assert_eq!(quantization_level("IQ2_XXS - 2.0625 bpw"), "IQ2_XXS");
        assert_eq!(quantization_level("MXFP4 MoE"), "MXFP4");
    }
}
