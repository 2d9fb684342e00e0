//! Several models behind one server (`minfer serve --models-dir DIR`, llama-server's router
//! mode, Ollama's habit): the directory's GGUF files are the models, each named by its file
//! name without `.gguf` (a symlink by its own name; a split model by its first part, without
//! the `-00001-of-0000N` suffix). A request names one in its `model` field (`?model=` on a
//! GET); that model loads on first use into a server of its own (its slots, its router, every
//! endpoint), and requests are handed to it. At most `--models-max` are loaded at once, and a
//! load that would not fit in the memory available first unloads the least recently used idle
//! models; a model with requests in flight is never unloaded, so a request waits for one to
//! finish rather than being lost. Loading one model does not hold up requests to another.
//!
//! Names are matched against the directory's listing, never joined into a path: a name with a
//! `/` or `..` in it is simply not one of the models.
//!
//! This file owns the registry and the dispatch; each model's server is `routes`' as it is.

use super::apis;
use super::error::ApiError;
use super::lifecycle::Lifecycle;
use super::routes::{self, App};
use super::{ServerConfig, ServerError};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A model of the directory: its name and file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub path: PathBuf,
    /// Bytes of the file (all parts of a split model).
    pub size: u64,
}

/// The models in `dir`, by name, sorted: `*.gguf` files and symlinks to them; of a split model
/// only the first part, named without its part suffix.
pub fn list(dir: &Path) -> Vec<Listed> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut models: Vec<Listed> = entries
        .flatten()
        .filter_map(|entry| {
            let file_name = entry.file_name().into_string().ok()?;
            let stem = file_name.strip_suffix(".gguf")?;
            let name = match split_part(stem) {
                Some((base, 1, _)) => base.to_string(),
                Some(_) => return None,
                None => stem.to_string(),
            };
            let path = entry.path();
            let size = std::fs::metadata(&path).ok().filter(|m| m.is_file())?.len();
            Some(Listed { name, path, size })
        })
        .collect();
    models.sort_by(|a, b| a.name.cmp(&b.name));
    models
}

/// `NAME-0000K-of-0000N` as `(NAME, K, N)`.
fn split_part(stem: &str) -> Option<(&str, u32, u32)> {
    let (rest, n) = stem.rsplit_once("-of-")?;
    let (base, k) = rest.rsplit_once('-')?;
    let (k, n) = (k.parse().ok()?, n.parse().ok()?);
    (n > 1 && rest.len() > base.len()).then_some((base, k, n))
}

/// The listed model a request's name means: the name itself, or with Ollama's default tag
/// `:latest` dropped, or the model fetched into the directory under that reference
/// (`qwen2.5-coder:0.5b` once `/api/pull` or `minfer pull` brought `ollama:qwen2.5-coder:0.5b`).
fn find<'a>(dir: &Path, models: &'a [Listed], name: &str) -> Option<&'a Listed> {
    let bare = name.strip_suffix(":latest").unwrap_or(name);
    if let Some(m) = models.iter().find(|m| m.name == name || m.name == bare) {
        return Some(m);
    }
    fetched(dir, name).and_then(|path| models.iter().find(|m| m.path == path))
}

/// The file a fetched reference (`hf:…`, `ollama:…`, or a bare `NAME:TAG`) resolved to in
/// `dir`, by the sidecars the download wrote.
#[cfg(feature = "download")]
fn fetched(dir: &Path, name: &str) -> Option<PathBuf> {
    use crate::download::{cache, ModelRef};
    match ModelRef::parse(name).ok()? {
        ModelRef::Local(_) => None,
        model_ref => cache::find_reference(dir, &model_ref.canonical()).ok().flatten(),
    }
}

#[cfg(not(feature = "download"))]
fn fetched(_dir: &Path, _name: &str) -> Option<PathBuf> {
    None
}

/// One loaded model.
struct Served {
    name: String,
    app: App,
    router: Router,
    /// When it last took a request (ms since the registry started), for least-recently-used.
    last_used: AtomicU64,
    /// Requests handed to it whose answers have not finished.
    in_flight: AtomicUsize,
    size: u64,
}

/// What the router serves from: the directory, the server's settings for each model, and the
/// models loaded.
pub struct Registry {
    dir: PathBuf,
    max: usize,
    config: ServerConfig,
    /// Who may call a server without a key (as each model's own router checks it).
    callers: super::callers::Callers,
    /// Held while room is made for a model and it loads: loads, and the unloads that make
    /// room for them, happen one at a time, so `--models-max` and the memory check see every
    /// model. Requests to loaded models never wait on it.
    admission: Arc<tokio::sync::Mutex<()>>,
    /// The models loaded. A model is taken for a request (counted in flight) and chosen to be
    /// unloaded (removed) under this lock, so a model taken is never one being unloaded.
    loaded: Mutex<HashMap<String, Arc<Served>>>,
    started: Instant,
    lifecycle: Arc<Lifecycle>,
    loads: AtomicU64,
    unloads: AtomicU64,
    /// `MINFER_SERVE_LOAD_DELAY` before each load, for tests that watch a load in progress.
    load_delay: Duration,
}

/// Settings of the router itself.
#[derive(Clone, Debug)]
pub struct ModelsConfig {
    /// The directory whose GGUF files are the models.
    pub dir: PathBuf,
    /// Most models loaded at once (`--models-max`).
    pub max: usize,
}

impl Registry {
    pub fn new(models: ModelsConfig, config: ServerConfig, lifecycle: Arc<Lifecycle>, load_delay: Duration) -> Self {
        Registry {
            dir: models.dir,
            max: models.max.max(1),
            callers: super::callers::Callers {
                loopback: super::callers::is_loopback_bind(&config.host),
                allowed_hosts: config.allowed_hosts.clone(),
            },
            config,
            admission: Arc::new(tokio::sync::Mutex::new(())),
            loaded: Mutex::new(HashMap::new()),
            started: Instant::now(),
            lifecycle,
            loads: AtomicU64::new(0),
            unloads: AtomicU64::new(0),
            load_delay,
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn loaded(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Served>>> {
        self.loaded.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The loaded model `name`, taken for a request (counted in flight until the guard goes).
    fn take(&self, name: &str) -> Option<InFlight> {
        let loaded = self.loaded();
        let served = loaded.get(name)?;
        served.in_flight.fetch_add(1, Ordering::Relaxed);
        served.last_used.store(self.now_ms(), Ordering::Relaxed);
        Some(InFlight(Arc::clone(served)))
    }

    /// The model `listed`, taken for a request: loaded first if it is not, after making room.
    /// The load runs in a task of its own, so a client that goes away does not abandon a load
    /// half done (its model would hold its memory with nobody to unload it).
    async fn get(self: &Arc<Self>, listed: &Listed) -> Result<InFlight, ApiError> {
        if let Some(taken) = self.take(&listed.name) {
            return Ok(taken);
        }
        let registry = Arc::clone(self);
        let listed = listed.clone();
        tokio::spawn(async move {
            let _admitted = Arc::clone(&registry.admission).lock_owned().await;
            // Loaded by the request admitted before this one.
            if let Some(taken) = registry.take(&listed.name) {
                return Ok(taken);
            }
            registry.make_room(&listed).await?;
            registry.load(&listed).await
        })
        .await
        .map_err(|e| ApiError::internal(format!("loading the model failed: {e}")))?
    }

    /// Loads `listed` (admitted) and takes it.
    async fn load(&self, listed: &Listed) -> Result<InFlight, ApiError> {
        eprintln!(
            "minfer serve: loading model {} ({})",
            listed.name,
            listed.path.display()
        );
        let started = Instant::now();
        let mut config = self.config.clone();
        config.model = listed.path.clone();
        config.alias = Some(listed.name.clone());
        let lifecycle = Arc::new(Lifecycle::default());
        lifecycle.loaded();
        let delay = self.load_delay;
        let loaded = tokio::task::spawn_blocking(move || {
            std::thread::sleep(delay);
            super::load(&config, lifecycle)
        })
        .await
        .map_err(|e| ApiError::internal(format!("loading the model failed: {e}")))?
        .map_err(|e| load_error(&listed.name, &e))?;
        let served = Arc::new(Served {
            name: listed.name.clone(),
            router: routes::router(Arc::clone(&loaded.app)),
            app: loaded.app,
            last_used: AtomicU64::new(self.now_ms()),
            in_flight: AtomicUsize::new(1),
            size: listed.size,
        });
        self.loads.fetch_add(1, Ordering::Relaxed);
        eprintln!(
            "minfer serve: loaded model {} in {:.2} s (up to {} slots, each up to {} tokens of context)",
            listed.name,
            started.elapsed().as_secs_f64(),
            served.app.n_slots,
            served.app.n_ctx
        );
        self.loaded().insert(listed.name.clone(), Arc::clone(&served));
        Ok(InFlight(served))
    }

    /// Unloads least-recently-used idle models (admitted) until one more fits under
    /// `--models-max` and `listed` fits in the memory available (its weights, a quarter more
    /// for its KV cache and buffers, and 512 MiB); waits while every candidate has requests in
    /// flight, for [`ROOM_WAIT`] at most.
    async fn make_room(&self, listed: &Listed) -> Result<(), ApiError> {
        let started = Instant::now();
        loop {
            let (victim, bound) = {
                let mut loaded = self.loaded();
                if loaded.is_empty() {
                    return Ok(());
                }
                let over_count = loaded.len() >= self.max;
                let available = crate::backends::host_memory("MemAvailable:").unwrap_or(u64::MAX);
                let size = listed.size;
                let short_of_memory = size.saturating_add(size / 4).saturating_add(512 << 20) > available;
                if !over_count && !short_of_memory {
                    return Ok(());
                }
                // Chosen and removed under one hold of the lock: nothing can take it after.
                let victim = loaded
                    .values()
                    .filter(|s| s.in_flight.load(Ordering::Relaxed) == 0)
                    .min_by_key(|s| s.last_used.load(Ordering::Relaxed))
                    .map(|s| s.name.clone())
                    .and_then(|name| loaded.remove(&name));
                (victim, if over_count { "--models-max" } else { "memory" })
            };
            match victim {
                Some(victim) => self.unload(victim, bound).await,
                None if started.elapsed() >= ROOM_WAIT => {
                    return Err(ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "model {} cannot be loaded now: every loaded model is answering requests \
                             (--models-max {}); try again shortly",
                            listed.name, self.max
                        ),
                    ))
                }
                // Every loaded model is answering: the first to finish makes the room.
                None => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    async fn unload(&self, served: Arc<Served>, bound: &str) {
        let scheduler = served.app.scheduler.clone();
        // The engine loop ends and drops its session; the model's memory goes with the last
        // handle, and the allocator gives the freed pages back.
        let _ = tokio::task::spawn_blocking(move || {
            scheduler.close();
            super::body::release_freed_memory();
        })
        .await;
        self.unloads.fetch_add(1, Ordering::Relaxed);
        eprintln!(
            "minfer serve: unloaded model {} (least recently used; {bound} bound, {} MiB)",
            served.name,
            served.size >> 20
        );
    }
}

/// How long a load waits for a loaded model to become idle before it is refused.
const ROOM_WAIT: Duration = Duration::from_secs(120);

fn load_error(name: &str, e: &ServerError) -> ApiError {
    ApiError::internal(format!("model {name} could not be loaded: {e}"))
}

type Shared = Arc<Registry>;

/// The router of several models: its own listings, health and metrics, and every other
/// request handed to the model it names.
pub fn router(registry: Shared) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/ready", get(ready))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/api/tags", get(tags))
        .route("/api/ps", get(ps))
        .route("/api/version", get(apis::ollama::version))
        .route("/metrics", get(metrics))
        .route("/api/pull", axum::routing::post(pull))
        .fallback(dispatch)
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&registry), admit))
        .with_state(registry)
}

/// Every request, before anything is loaded for it: the admission checks (host, origin,
/// declared size) and the API key, as each model's own router makes them.
async fn admit(State(registry): State<Shared>, req: Request, next: axum::middleware::Next) -> Response {
    let config = &registry.config;
    let checked = super::callers::check(
        &registry.callers,
        config.api_key.is_some(),
        &config.cors_origins,
        config.max_body_bytes,
        &req,
    )
    .and_then(|()| routes::check_key(config.api_key.as_deref(), &req));
    match checked {
        Ok(()) => next.run(req).await,
        Err(e) => (e.status, Json(apis::error_body_for(req.uri().path(), &e))).into_response(),
    }
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Ready once listening: models load on demand. 503 while draining.
async fn ready(State(registry): State<Shared>) -> Response {
    let r = super::lifecycle::Readiness::of(registry.lifecycle.phase(), || false);
    let loaded: Vec<String> = registry.loaded().keys().cloned().collect();
    (r.status(), Json(json!({"status": r.name(), "models_loaded": loaded}))).into_response()
}

fn state_of(registry: &Registry, name: &str) -> &'static str {
    if registry.loaded().contains_key(name) {
        "loaded"
    } else {
        "unloaded"
    }
}

/// `/v1/models`: every model of the directory, with whether it is loaded (llama-server's
/// router lists `status` so).
async fn models(State(registry): State<Shared>) -> Json<Value> {
    let data: Vec<Value> = list(&registry.dir)
        .iter()
        .map(|m| {
            json!({"id": m.name, "object": "model", "created": 0, "owned_by": "minfer",
                   "status": {"value": state_of(&registry, &m.name)}, "size": m.size})
        })
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// `/api/tags`: Ollama's list of the directory's models.
async fn tags(State(registry): State<Shared>) -> Json<Value> {
    let models: Vec<Value> = list(&registry.dir)
        .iter()
        .map(|m| {
            json!({"name": m.name, "model": m.name, "modified_at": apis::ollama::modified_at(&m.path), "size": m.size,
                   "digest": "", "details": {"format": "gguf"}})
        })
        .collect();
    Json(json!({ "models": models }))
}

/// `/api/ps`: the models loaded now.
async fn ps(State(registry): State<Shared>) -> Json<Value> {
    let loaded: Vec<Arc<Served>> = registry.loaded().values().cloned().collect();
    let models: Vec<Value> = loaded
        .iter()
        .map(|s| {
            json!({"name": s.name, "model": s.name, "size": s.size, "digest": "", "details": {"format": "gguf"},
                   "expires_at": "0001-01-01T00:00:00Z", "size_vram": 0, "context_length": s.app.n_ctx,
                   "in_flight": s.in_flight.load(Ordering::Relaxed)})
        })
        .collect();
    Json(json!({ "models": models }))
}

/// The router's counters, then each loaded model's, every sample labelled with its model.
async fn metrics(State(registry): State<Shared>) -> Response {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP minfer_models_loaded Models loaded now.\n# TYPE minfer_models_loaded gauge\nminfer_models_loaded {}",
        registry.loaded().len()
    );
    for (name, help, value) in [
        (
            "minfer_model_loads_total",
            "Models loaded since start.",
            &registry.loads,
        ),
        (
            "minfer_model_unloads_total",
            "Models unloaded since start.",
            &registry.unloads,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
            value.load(Ordering::Relaxed)
        );
    }
    let loaded: Vec<Arc<Served>> = registry.loaded().values().cloned().collect();
    let mut described = std::collections::HashSet::new();
    for served in &loaded {
        for line in served.app.metrics.render().lines() {
            if line.starts_with('#') {
                // HELP and TYPE once per metric name, as the format asks.
                if described.insert(line.to_string()) {
                    let _ = writeln!(out, "{line}");
                }
                continue;
            }
            let _ = writeln!(out, "{}", with_model_label(line, &served.name));
        }
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

/// A sample line with `model="NAME"` among its labels.
fn with_model_label(line: &str, model: &str) -> String {
    let label = format!("model=\"{}\"", model.replace('\\', "\\\\").replace('"', "\\\""));
    match line.find('{') {
        Some(i) if line[..i].find(' ').is_none() => format!("{}{{{label},{}", &line[..i], &line[i + 1..]),
        _ => match line.split_once(' ') {
            Some((name, value)) => format!("{name}{{{label}}} {value}"),
            None => line.to_string(),
        },
    }
}

/// Hands a request to the model it names, loading that model first if needed. The body is
/// read (within the server's limits) to find the name, then given to the model's router whole.
async fn dispatch(State(registry): State<Shared>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let fail = |e: ApiError| (e.status, Json(apis::error_body_for(&path, &e))).into_response();
    let query_model = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("model=")))
        .map(|m| m.replace("%3A", ":").replace("%3a", ":"));
    let (parts, body) = req.into_parts();
    let limit = registry.config.max_body_bytes;
    let bytes = match tokio::time::timeout(registry.config.body_timeout, axum::body::to_bytes(body, limit)).await {
        Err(_) => {
            return fail(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "the request body did not arrive in time",
            ))
        }
        Ok(Err(_)) => {
            return fail(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body could not be read within the limit of {limit} bytes"),
            ))
        }
        Ok(Ok(bytes)) => bytes,
    };
    let name = query_model.or_else(|| model_field(&bytes));
    let Some(name) = name else {
        return fail(ApiError::field(
            "model",
            "this server serves several models: name one in the request's 'model' field (GET /v1/models lists them)",
        ));
    };
    let models = list(&registry.dir);
    let Some(listed) = find(&registry.dir, &models, &name) else {
        return fail(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("model '{name}' is not one of this server's models (GET /v1/models lists them)"),
        ));
    };
    let taken = match registry.get(listed).await {
        Ok(taken) => taken,
        Err(e) => return fail(e),
    };
    let request = Request::from_parts(parts, Body::from(bytes));
    let response = match tower::ServiceExt::oneshot(taken.0.router.clone(), request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    // The answer is done when its body is: a stream holds the model until it ends.
    let (parts, body) = response.into_parts();
    let body = Body::from_stream(futures_util::StreamExt::map(body.into_data_stream(), move |chunk| {
        let _ = &taken;
        chunk
    }));
    Response::from_parts(parts, body)
}

/// Ollama's `POST /api/pull` (`{"model"|"name", "stream"}`): fetches the model into the
/// directory with minfer's own download (`NAME[:TAG]` is `ollama:NAME:TAG`; `hf:` and
/// `ollama:` references as they are), then it is one of the models. Streamed as Ollama's
/// NDJSON status lines (`pulling manifest`, `pulling DIGEST` with `total` and `completed`,
/// `verifying sha256 digest`, `success`), or the last one alone with `stream: false`.
#[cfg(feature = "download")]
async fn pull(State(registry): State<Shared>, req: Request) -> Response {
    use crate::download::{self, Config, ModelRef, Progress};
    let fail = |e: ApiError| (e.status, Json(apis::ollama::error_body(&e))).into_response();
    let Ok(bytes) = axum::body::to_bytes(req.into_body(), 64 << 10).await else {
        return fail(ApiError::bad_request("the /api/pull body must be a small JSON object"));
    };
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let Some(name) = body["model"]
        .as_str()
        .or(body["name"].as_str())
        .filter(|n| !n.is_empty())
    else {
        return fail(ApiError::field(
            "model",
            "model is required: the model to pull, such as qwen2.5-coder:0.5b",
        ));
    };
    let reference = match ModelRef::parse(name) {
        Ok(ModelRef::Local(_)) => format!("ollama:{name}"),
        Ok(_) => name.to_string(),
        Err(e) => return fail(ApiError::field("model", e.to_string())),
    };
    if let Err(e) = ModelRef::parse(&reference) {
        return fail(ApiError::field("model", e.to_string()));
    }
    let mut config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => return fail(ApiError::internal(e.to_string())),
    };
    config.cache_dir = registry.dir.clone();
    let stream = body["stream"].as_bool().unwrap_or(true);

    /// Status lines sent as the download goes.
    struct Lines {
        tx: tokio::sync::mpsc::UnboundedSender<Value>,
        name: String,
        total: u64,
        /// The last hundredth reported, so a large file makes a hundred lines, not millions.
        step: u64,
    }
    impl Progress for Lines {
        fn start(&mut self, name: &str, total: u64, resumed_from: u64) {
            (self.name, self.total, self.step) = (name.to_string(), total, 0);
            let _ = self.tx.send(json!({"status": format!("pulling {name}"), "digest": name,
                                        "total": total, "completed": resumed_from}));
        }
        fn advance(&mut self, done: u64) {
            let step = done.saturating_mul(100) / self.total.max(1);
            if step > self.step {
                self.step = step;
                let _ = self
                    .tx
                    .send(json!({"status": format!("pulling {}", self.name), "digest": self.name,
                                            "total": self.total, "completed": done}));
            }
        }
        fn finish(&mut self) {
            let _ = self.tx.send(json!({"status": "verifying sha256 digest"}));
        }
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let _ = tx.send(json!({"status": "pulling manifest"}));
    let mut lines = Lines {
        tx: tx.clone(),
        name: String::new(),
        total: 0,
        step: 0,
    };
    let task = tokio::task::spawn_blocking(move || {
        let result = download::pull(&reference, &config, &mut lines);
        let last = match &result {
            Ok(path) => {
                eprintln!("minfer serve: pulled {reference} into {}", path.display());
                json!({"status": "success"})
            }
            Err(e) => json!({"error": e.to_string()}),
        };
        let _ = tx.send(last);
    });
    drop(task);
    if !stream {
        let mut last = Value::Null;
        while let Some(line) = rx.recv().await {
            last = line;
        }
        let status = if last.get("error").is_some() {
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            StatusCode::OK
        };
        return (status, Json(last)).into_response();
    }
    let lines = futures_util::stream::unfold(rx, |mut rx| async move {
        let line = rx.recv().await?;
        Some((Ok::<_, std::convert::Infallible>(format!("{line}\n")), rx))
    });
    Response::builder()
        .header(axum::http::header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(lines))
        .unwrap_or_else(|e| fail(ApiError::internal(e.to_string())))
}

#[cfg(not(feature = "download"))]
async fn pull() -> Response {
    let e = ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "/api/pull is not supported: this build has no downloads",
    );
    (e.status, Json(apis::ollama::error_body(&e))).into_response()
}

/// Keeps a model from being unloaded while an answer of it is being sent.
struct InFlight(Arc<Served>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The `model` (or Ollama's `name`) field of a JSON body, read without building the rest.
fn model_field(bytes: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Named {
        model: Option<String>,
        name: Option<String>,
    }
    let named: Named = serde_json::from_slice(bytes).ok()?;
    named.model.or(named.name).filter(|m| !m.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directorys_models_are_its_gguf_files_named_without_the_extension_or_part_suffix() {
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in [
            ("a.gguf", 3),
            ("big-00001-of-00002.gguf", 5),
            ("big-00002-of-00002.gguf", 5),
            ("notes.txt", 1),
        ] {
            std::fs::write(dir.path().join(name), vec![0u8; bytes]).unwrap();
        }
        std::fs::create_dir(dir.path().join("sub.gguf")).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(dir.path().join("a.gguf"), dir.path().join("alias.gguf")).unwrap();
        let names: Vec<String> = list(dir.path()).into_iter().map(|m| m.name).collect();
        assert_eq!(names, ["a", "alias", "big"]);
        let models = list(dir.path());
        let dir = dir.path();
        assert_eq!(find(dir, &models, "big").unwrap().size, 5);
        assert_eq!(find(dir, &models, "a:latest").unwrap().name, "a");
        // A name is looked up, never joined into a path.
        for hostile in [
            "../a",
            "/etc/passwd",
            "a.gguf",
            "sub",
            "",
            "big-00002-of-00002",
            "ollama:../a",
        ] {
            assert!(find(dir, &models, hostile).is_none(), "{hostile}");
        }
    }

    #[test]
    fn each_models_metrics_carry_its_name() {
        assert_eq!(with_model_label("minfer_x 3", "m"), "minfer_x{model=\"m\"} 3");
        assert_eq!(
            with_model_label("minfer_y{route=\"/a\"} 1", "m"),
            "minfer_y{model=\"m\",route=\"/a\"} 1"
        );
    }

    #[test]
    fn the_model_is_read_from_the_body_or_ollamas_name_field() {
        assert_eq!(model_field(br#"{"model": "a", "messages": []}"#).as_deref(), Some("a"));
        assert_eq!(model_field(br#"{"name": "b"}"#).as_deref(), Some("b"));
        assert_eq!(model_field(br#"{"model": ""}"#), None);
        assert_eq!(model_field(b"not json"), None);
    }
}
