//! `minfer serve`: an OpenAI-compatible HTTP server (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/models`, `/health`, `/ready`, `/metrics`) on axum and tokio.
//!
//! The async runtime only moves bytes: generation runs on one engine thread (`slots`) whose one
//! session holds every slot's KV sequence over the one loaded [`Model`] (its backend set and
//! thread pool), and tokens come back over channels. The parts: `request` reads OpenAI
//! bodies, `routes` holds the handlers, `slots` the scheduler, `response` the JSON and SSE
//! shapes (a harmony model's reply read apart there), `tool_calls` the `<tool_call>` parser,
//! `metrics` the Prometheus counters, `lifecycle` what `/ready` answers, `error` the error
//! shapes. This module wires them together
//! and owns start-up (bind first, then load the model while `/health` and `/ready` answer),
//! the connections (accepted here and served by hyper, under a header-read timeout and a bound
//! on how many are open) and graceful shutdown (not ready, then the listener closed, then
//! in-flight work finished); it must not know the API's shapes itself.

mod apis;
mod body;
mod callers;
mod embeddings;
mod error;
mod lifecycle;
mod metrics;
mod models;
mod peer;
mod request;
mod response;
mod routes;
mod slots;
mod tool_calls;
mod write_timeout;

pub use error::{ApiError, ServerError};
pub use models::ModelsConfig;
pub use request::RequestDefaults;
pub use routes::SESSION_HEADER;

use crate::engine::{Model, ModelOptions, Session};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The stack of every thread that works on a request (the async workers, the blocking pool
/// that parses, renders and compiles grammars, the engine and its mask thread). Grammar and
/// schema compilation recurses with its input, and a stack overflow aborts the whole process
/// whatever the budgets missed; 32 MiB is 16 times the default and costs only address space
/// until touched.
pub(crate) const REQUEST_STACK_BYTES: usize = 32 << 20;

/// The endpoints that take a JSON body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// Reads `body` as the handler for `kind` does before it renders or tokenizes anything: the
/// JSON parse under its value budget, then the check of every field. The server runs exactly
/// these steps; this entry point is for tests and fuzzing.
pub fn read_request_body(kind: BodyKind, body: &[u8]) -> Result<(), ApiError> {
    match kind {
        BodyKind::Chat => request::from_body(body, |b| request::chat(b, &Default::default())).map(drop),
        BodyKind::Completion => request::from_body(body, |b| request::completion(b, &Default::default())).map(drop),
    }
}

/// How `minfer serve` runs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The GGUF file (any part of a split model).
    pub model: PathBuf,
    /// The model's name in `/v1/models` and every response (llama-server's `--alias`); the
    /// file's name without its extension when `None`.
    pub alias: Option<String>,
    /// Address to listen on.
    pub host: String,
    /// 0 picks a free port; the address is printed once bound.
    pub port: u16,
    /// Threads, backends, `-ngl`, how the file is read, the chat template: the model's
    /// options, shared by every slot.
    pub model_options: ModelOptions,
    /// The slots' session: one sequence per slot (`n_seq_max`, 1 to [`MAX_SLOTS`]), each of
    /// `n_ctx` cells (clamped to the model's training context), and the KV types.
    pub session: crate::engine::SessionOptions,
    /// The key clients must send as `Authorization: Bearer KEY`; `None` or empty: no key.
    pub api_key: Option<String>,
    /// Largest request body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// How long in-flight requests may run, once the listener is closed after SIGINT/SIGTERM,
    /// before they are cancelled.
    pub shutdown_timeout: Duration,
    /// How long after SIGINT/SIGTERM the server keeps accepting while `/ready` answers 503,
    /// so that a balancer with active health checks stops sending first (`--drain-delay`).
    pub drain_delay: Duration,
    /// Requests that may wait for a slot while every slot is busy; beyond them a request is
    /// answered 503 with `Retry-After` (`--queue-max`). `None`: any number (bounded only by
    /// `max_connections`, as each waiting request holds its connection).
    pub queue_max: Option<usize>,
    /// What a request gets for the fields it leaves out: the sampling flags of `minfer serve`
    /// (llama-server's `--temp`, `-s`, `-n`, …).
    pub defaults: RequestDefaults,
    /// How long a connection may take to send a request's headers, counted from the moment the
    /// server waits for them (so it also bounds an idle keep-alive connection).
    pub header_timeout: Duration,
    /// How long a request's body may take to arrive once its headers have.
    pub body_timeout: Duration,
    /// How long a response write may make no progress (a client that does not read) before
    /// the connection is closed.
    pub write_timeout: Duration,
    /// Most connections served at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// Control-token text in message content is read as control tokens (llama.cpp's way)
    /// instead of as text.
    pub special_in_content: bool,
    /// Tokens one forward pass takes at most: the generating slots' next tokens, then prompt
    /// chunks (`--batch-size`).
    pub batch_size: usize,
    /// The host tier of the prompt cache (`--cache-ram`), in bytes: cached prompts' K and V
    /// rows kept in memory after their cells are evicted. `None`: none. Only with one cache for
    /// all slots (`session.kv_unified`), and not for a model with a window cache.
    pub cache_ram: Option<usize>,
    /// `session.n_seq_max` is a default, not the user's `-np`: a model with sliding-window
    /// layers then gets 4 slots, as each slot keeps a window of its own in those layers.
    pub n_slots_auto: bool,
    /// Serve embeddings (`--embeddings`): `/v1/embeddings`, `/embedding`, Ollama's
    /// `/api/embed`, and `/rerank` when the pooling is `rank` (`--reranking`).
    pub embeddings: bool,
    /// The embeddings' pooling (`--pooling`); the model's rule, else `last`, when `None`.
    pub pooling: Option<crate::models::pooling::Pooling>,
    /// How embeddings are scaled when a request does not say (`--embd-normalize`).
    pub embd_normalize: crate::engine::Normalize,
    /// Origins allowed to call the server from a browser (`--cors-origin`, `*` for any).
    pub cors_origins: Vec<String>,
    /// Names besides its own that a server on loopback without a key answers in `Host`
    /// (`--allowed-host`, `*` for any): a proxy's upstream name.
    pub allowed_hosts: Vec<String>,
    /// Answer `/slots` (`--slots`).
    pub slots_endpoint: bool,
    /// Serve the chat page at `/` (off with `--no-webui`).
    pub webui: bool,
    /// Speculative decoding (`--model-draft`, `--spec-type`): where each slot's proposals come
    /// from, and how many a step checks.
    pub draft: Option<(crate::engine::DraftSource, crate::engine::DraftOptions)>,
    /// Several models (`--models-dir`): `model` is then unused, and each model the directory
    /// holds is served with these settings when a request names it.
    pub models: Option<ModelsConfig>,
}

/// The most slots a server runs: one KV sequence each, and a cache holds at most
/// [`MAX_SEQUENCES`](crate::engine::MAX_SEQUENCES) of them.
pub const MAX_SLOTS: usize = crate::engine::MAX_SEQUENCES;

/// Slots of a model with sliding-window layers when `-np` is not given.
pub const DEFAULT_SLOTS_WINDOWED: usize = 4;
/// The most tokens one forward pass may take (llama.cpp's largest common `n_batch`).
pub const MAX_BATCH_SIZE: usize = 8192;
/// Tokens one forward pass takes at most by default.
pub const DEFAULT_BATCH_SIZE: usize = slots::STEP_TOKENS;

/// The most connections a server keeps open (far above any slot count, within common
/// file-descriptor limits).
pub const MAX_CONNECTIONS: usize = 65_536;

/// A default request-body limit: far above any prompt that fits a context, far below memory.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 << 20;
/// Default seconds for a request's headers: ample for any client on any link, short enough
/// that idle or trickling connections cannot pile up.
pub const DEFAULT_HEADER_TIMEOUT_S: f64 = 10.0;
/// Default seconds for a request's body (8 MiB at 300 KiB/s).
pub const DEFAULT_BODY_TIMEOUT_S: f64 = 30.0;
/// Default seconds a response write may stall: a client that reads nothing for that long has
/// gone, or will never read.
pub const DEFAULT_WRITE_TIMEOUT_S: f64 = 30.0;
/// Default bound on open connections: far above the slots (waiting requests hold connections
/// too), far below the process's file-descriptor limit.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// A seed or id nobody can predict: std's per-process random hash keys, mixed with a counter.
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

pub(crate) fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Binds, loads the model while `/health` and `/ready` answer, starts the slots, serves until
/// SIGINT or SIGTERM, then drains: not ready, `drain_delay` later the listener closes, and
/// in-flight requests get `shutdown_timeout` more. Progress and one line per generation go to
/// standard error.
pub fn serve(config: ServerConfig) -> Result<(), ServerError> {
    body::keep_large_allocations_mapped();
    if !(1..=MAX_SLOTS).contains(&config.session.n_seq_max) {
        return Err(ServerError::Config(format!(
            "--n-slots {} is out of range: it must be from 1 to {MAX_SLOTS}",
            config.session.n_seq_max
        )));
    }
    if !(1..=MAX_CONNECTIONS).contains(&config.max_connections) {
        return Err(ServerError::Config(format!(
            "--max-connections {} is out of range: it must be from 1 to {MAX_CONNECTIONS}",
            config.max_connections
        )));
    }
    if !(1..=MAX_BATCH_SIZE).contains(&config.batch_size) {
        return Err(ServerError::Config(format!(
            "--batch-size {} is out of range: it must be from 1 to {MAX_BATCH_SIZE}",
            config.batch_size
        )));
    }
    if config.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        return Err(ServerError::Config(
            "the API key (--api-key or MINFER_API_KEY) is empty: give a key, or unset it to serve without one".into(),
        ));
    }
    if config.header_timeout.is_zero() || config.body_timeout.is_zero() || config.write_timeout.is_zero() {
        return Err(ServerError::Config(
            "--header-timeout, --body-timeout and --write-timeout must be above 0".into(),
        ));
    }
    let load_delay = load_delay()?;
    // The async side only parses, routes and copies bytes; two threads keep it responsive
    // without taking cores from the model's pool.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_stack_size(REQUEST_STACK_BYTES)
        .enable_all()
        .build()
        .map_err(ServerError::Runtime)?;
    let result = match config.models.clone() {
        Some(models) => runtime.block_on(run_router(config, models, load_delay)),
        None => runtime.block_on(run_server(config, load_delay)),
    };
    // The model may still be loading on the blocking pool after a signal: not waited for.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// `MINFER_SERVE_LOAD_DELAY`: seconds to wait before loading, so that tests (and anyone
/// trying a probe configuration) can watch `/ready` answer "loading" with a model that loads
/// in milliseconds.
fn load_delay() -> Result<Duration, ServerError> {
    let Ok(text) = std::env::var("MINFER_SERVE_LOAD_DELAY") else {
        return Ok(Duration::ZERO);
    };
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && (0.0..1e6).contains(s))
        .map(Duration::from_secs_f64)
        .ok_or_else(|| {
            ServerError::Config(format!(
                "MINFER_SERVE_LOAD_DELAY={text:?} is not a number of seconds from 0 to 1000000"
            ))
        })
}

/// What loading makes: the handlers' state and the scheduler whose slots run the model.
struct Loaded {
    app: Arc<routes::AppState>,
    scheduler: slots::Scheduler,
    n_threads: usize,
}

/// Loads the model and starts the slots (blocking: seconds for a large model).
fn load(config: &ServerConfig, lifecycle: Arc<lifecycle::Lifecycle>) -> Result<Loaded, ServerError> {
    let model = Arc::new(Model::load(&config.model, &config.model_options)?);
    let n_threads = model.backends().n_threads();
    let hp = model.hparams();
    let mut config = config.clone();
    if config.n_slots_auto && !config.session.swa_full && (0..hp.n_layer).any(|il| hp.is_swa(il)) {
        // 64 windows of every slot would outgrow the full cache they are meant to save.
        config.session.n_seq_max = config.session.n_seq_max.min(DEFAULT_SLOTS_WINDOWED);
    }
    let config = &config;
    // One session for every slot: sequence i is slot i, holding up to n_ctx positions (of one
    // shared cache, or of its own share).
    let session = Session::with_options(&model, &config.session).map_err(|e| ServerError::Config(e.to_string()))?;
    let n_ctx = session.n_ctx_seq();
    let cache_ram = match config.cache_ram {
        Some(_) if session.kv_window().is_some() => {
            eprintln!(
                "--cache-ram: not for this model: its windowed layers keep only their last positions, \
                 so a cached prompt cannot be copied out whole (--swa-full keeps them all)"
            );
            None
        }
        Some(_) if !config.session.kv_unified => {
            eprintln!("--cache-ram: not with --no-kv-unified: each slot keeps its own cells, none is evicted");
            None
        }
        ram => ram,
    };
    eprintln!(
        "KV cache: {} cells{}, {} slots, up to {n_ctx} cells each",
        session.n_ctx(),
        if config.session.kv_unified {
            " shared by the slots"
        } else {
            " split between the slots"
        },
        config.session.n_seq_max,
    );
    let n_vocab = model.hparams().n_vocab;
    let model_id = config.alias.clone().unwrap_or_else(|| {
        config
            .model
            .file_stem()
            .map_or_else(|| "model".to_string(), |s| s.to_string_lossy().into_owned())
    });
    let control_texts = if config.special_in_content {
        Vec::new()
    } else {
        model.tokenizer().control_token_texts()
    };
    let metrics = Arc::new(metrics::Metrics::default());
    // Each slot drafts on its own: a draft model's drafter holds a KV cache per slot, of the
    // slots' even share of the cache (a sequence that grows past it is decoded undrafted), not
    // each the whole of it.
    let n_ctx_draft = (session.n_ctx() / config.session.n_seq_max.max(1)).clamp(1, n_ctx);
    let drafters = match &config.draft {
        Some((source, options)) => {
            let drafters = (0..config.session.n_seq_max)
                .map(|_| source.drafter(model.tokenizer(), n_ctx_draft))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ServerError::Config(e.to_string()))?;
            Some((drafters, *options))
        }
        None => None,
    };
    let scheduler = slots::Scheduler::start(
        session,
        slots::SlotConfig {
            n_slots: config.session.n_seq_max,
            n_ctx,
            by_memory: config.session.kv_unified,
            cache_ram,
            step_tokens: config.batch_size,
            drafters,
            queue_max: config.queue_max,
        },
        Arc::clone(&model),
        Arc::clone(&metrics),
    )
    .map_err(ServerError::Runtime)?;
    // Embedding passes read up to --batch-size tokens, as llama-server's (n_batch = n_ubatch
    // with --embeddings), of as many inputs as fit: short inputs share a pass whatever the
    // slots (the embedder's cache is one pass of cells, cleared before each).
    let embeddings = config
        .embeddings
        .then(|| {
            let pass = (config.batch_size, crate::engine::MAX_SEQUENCES);
            embeddings::EmbedService::start(
                &model,
                config.pooling,
                pass,
                config.embd_normalize,
                Arc::clone(&metrics),
            )
        })
        .transpose()
        .map_err(|e| ServerError::Config(e.to_string()))?;
    let app = Arc::new(routes::AppState {
        scheduler: scheduler.clone(),
        embeddings,
        model,
        metrics,
        model_id,
        n_ctx,
        n_vocab,
        n_slots: config.session.n_seq_max,
        api_key: config.api_key.clone(),
        max_body_bytes: config.max_body_bytes,
        body_timeout: config.body_timeout,
        created: unix_time(),
        fault_marker: std::env::var("MINFER_SERVE_FAULT").ok().filter(|m| !m.is_empty()),
        control_texts,
        cors_origins: config.cors_origins.clone(),
        callers: callers::Callers {
            loopback: callers::is_loopback_bind(&config.host),
            allowed_hosts: config.allowed_hosts.clone(),
        },
        parsing: tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(2, |n| n.get())),
        slots_endpoint: config.slots_endpoint,
        webui: config.webui,
        lifecycle,
        queue_max: config.queue_max,
        defaults: Arc::new(config.defaults.clone()),
    });
    Ok(Loaded {
        app,
        scheduler,
        n_threads,
    })
}

/// The listening socket at `--host`:`--port`, and the address it got (port 0 picks one).
async fn bind(config: &ServerConfig) -> Result<(tokio::net::TcpListener, std::net::SocketAddr), ServerError> {
    let addr = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })?;
    let local = listener.local_addr().map_err(ServerError::Serve)?;
    Ok((listener, local))
}

async fn run_server(config: ServerConfig, load_delay: Duration) -> Result<(), ServerError> {
    let (listener, local) = bind(&config).await?;
    // Bound before the model loads, so that an orchestrator's probes see a live process that is
    // not ready yet rather than a refused connection it cannot tell from a dead one.
    eprintln!(
        "minfer serve: bound to http://{local}; loading the model (/health answers 200, /ready 503 until it is loaded)"
    );
    let lifecycle = Arc::new(lifecycle::Lifecycle::default());
    let (tx, rx) = tokio::sync::watch::channel(false);
    let (timeout, drain_delay) = (config.shutdown_timeout, config.drain_delay);
    let draining = Arc::clone(&lifecycle);
    log_other_signals();
    tokio::spawn(async move {
        shutdown_signal().await;
        // A second SIGINT (Ctrl-C pressed again) means now: the operator will not wait for the
        // drain. A repeated SIGTERM does not: service managers and scripts may send it more
        // than once, and their way to insist is SIGKILL.
        tokio::spawn(async {
            let _ = tokio::signal::ctrl_c().await;
            eprintln!("minfer serve: a second SIGINT: exiting at once, without finishing in-flight requests");
            std::process::exit(130);
        });
        // Not ready first: a balancer that polls /ready stops sending during the drain delay,
        // while requests it still sends are served.
        draining.drain();
        if !drain_delay.is_zero() {
            eprintln!(
                "minfer serve: draining: /ready answers 503; still accepting for {:.1} s",
                drain_delay.as_secs_f64()
            );
            tokio::time::sleep(drain_delay).await;
        }
        eprintln!(
            "minfer serve: shutting down: listener closed; in-flight requests get {:.0} s",
            timeout.as_secs_f64()
        );
        let _ = tx.send(true);
    });
    let limits = Limits {
        header_timeout: config.header_timeout,
        write_timeout: config.write_timeout,
        max_connections: config.max_connections,
    };
    let routers = Routers {
        loading: routes::loading_router(),
        loaded: Arc::new(std::sync::OnceLock::new()),
    };
    let loaded_router = Arc::clone(&routers.loaded);
    let mut server = std::pin::pin!(accept_loop(listener, routers, limits, rx.clone()));
    let loading = Arc::clone(&lifecycle);
    let mut load = tokio::task::spawn_blocking(move || {
        std::thread::sleep(load_delay);
        load(&config, loading)
    });
    let loaded = tokio::select! {
        loaded = &mut load => loaded.map_err(|e| ServerError::Runtime(std::io::Error::other(e)))??,
        // A signal while loading: the accept loop has closed; nothing was started to finish.
        result = &mut server => {
            result?;
            eprintln!("minfer serve: stopped before the model was loaded");
            return Ok(());
        }
    };
    let Loaded {
        app,
        scheduler,
        n_threads,
    } = loaded;
    eprintln!(
        "minfer serve: model {} | up to {} slots, each up to {} tokens of context, {} threads shared{}",
        app.model_id,
        app.n_slots,
        app.n_ctx,
        n_threads,
        if app.api_key.is_some() {
            " | API key required"
        } else {
            " | no API key"
        }
    );
    let _ = loaded_router.set(routes::router(Arc::clone(&app)));
    lifecycle.loaded();
    eprintln!("minfer serve: ready: listening on http://{local}");

    let mut stop = rx;
    tokio::select! {
        result = &mut server => result?,
        _ = async { let _ = stop.wait_for(|v| *v).await; tokio::time::sleep(timeout).await } => {
            eprintln!("minfer serve: cancelling the requests still running");
            scheduler.cancel_all();
            // Cancelled streams end at their next token; give them a moment to close cleanly.
            let _ = tokio::time::timeout(Duration::from_secs(2), &mut server).await;
        }
    }
    eprintln!("minfer serve: stopped");
    Ok(())
}

/// Serves the models of a directory (`--models-dir`): ready as soon as it listens, each model
/// loaded when a request first names it.
async fn run_router(config: ServerConfig, models: ModelsConfig, load_delay: Duration) -> Result<(), ServerError> {
    if !models.dir.is_dir() {
        return Err(ServerError::Config(format!(
            "--models-dir {}: no such directory",
            models.dir.display()
        )));
    }
    let (listener, local) = bind(&config).await?;
    let lifecycle = Arc::new(lifecycle::Lifecycle::default());
    lifecycle.loaded();
    let listed = models::list(&models.dir);
    eprintln!(
        "minfer serve: {} models in {} (loaded on first use, at most {} at once){}",
        listed.len(),
        models.dir.display(),
        models.max,
        if config.api_key.is_some() {
            " | API key required"
        } else {
            " | no API key"
        }
    );
    let registry = Arc::new(models::Registry::new(
        models,
        config.clone(),
        Arc::clone(&lifecycle),
        load_delay,
    ));
    let (tx, rx) = tokio::sync::watch::channel(false);
    let draining = Arc::clone(&lifecycle);
    let drain_delay = config.drain_delay;
    log_other_signals();
    tokio::spawn(async move {
        shutdown_signal().await;
        draining.drain();
        if !drain_delay.is_zero() {
            tokio::time::sleep(drain_delay).await;
        }
        eprintln!("minfer serve: shutting down: listener closed");
        let _ = tx.send(true);
    });
    let limits = Limits {
        header_timeout: config.header_timeout,
        write_timeout: config.write_timeout,
        max_connections: config.max_connections,
    };
    let loaded = Arc::new(std::sync::OnceLock::new());
    let _ = loaded.set(models::router(registry));
    let routers = Routers {
        loading: routes::loading_router(),
        loaded,
    };
    eprintln!("minfer serve: ready: listening on http://{local}");
    accept_loop(listener, routers, limits, rx).await?;
    eprintln!("minfer serve: stopped");
    Ok(())
}

/// The router that answers a request: the small one until the model is loaded, then the API.
/// Chosen per request, so a connection opened while loading is served fully afterwards.
struct Routers {
    loading: axum::Router,
    loaded: Arc<std::sync::OnceLock<axum::Router>>,
}

impl Routers {
    fn current(&self) -> axum::Router {
        self.loaded.get().unwrap_or(&self.loading).clone()
    }
}

/// What bounds the connections.
pub(crate) struct Limits {
    pub header_timeout: Duration,
    pub write_timeout: Duration,
    pub max_connections: usize,
}

impl Limits {
    /// `minfer serve`'s defaults: 10 s for a request's headers (idle keep-alive time
    /// included), 30 s for a write to make progress, 512 connections.
    pub fn defaults() -> Limits {
        Limits {
            header_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(30),
            max_connections: 512,
        }
    }
}

/// Serves `router` on `listener` under `limits` until `stop` turns true, then lets open
/// connections finish: `minfer serve`'s own connection handling, for the other pages the
/// binary serves (`minfer viz`), which `axum::serve` would leave without a header timeout.
pub(crate) async fn serve_router(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: Limits,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), ServerError> {
    let loaded = Arc::new(std::sync::OnceLock::new());
    let _ = loaded.set(router.clone());
    accept_loop(
        listener,
        Routers {
            loading: router,
            loaded,
        },
        limits,
        stop,
    )
    .await
}

/// Accepts connections until `stop` turns true, each under a permit of a semaphore so that at
/// most `max_connections` are open (the rest wait in the kernel's backlog, where they cost the
/// process nothing); then lets the open ones finish and returns once all are closed.
///
/// This replaces `axum::serve`, which has no header-read timeout: there, a client that
/// connects and never sends, or sends its headers a byte a minute, holds a connection forever.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    routers: Routers,
    limits: Limits,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), ServerError> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let mut http = hyper::server::conn::http1::Builder::new();
    // Half-closed: a client that shuts down its sending side after the request still gets the
    // response (a generation notices a client that left through `peer` instead). Header names
    // go out in title case (`Content-Type`, `Process-Start-Time-Unix`), as llama-server writes
    // them: HTTP/1 does not care, but clients that copy headers into a plain dictionary do.
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .half_close(true)
        .title_case_headers(true);
    let http = Arc::new(http);
    let routers = Arc::new(routers);
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&permits).acquire_owned() => permit.expect("the semaphore is never closed"),
            _ = stop.wait_for(|v| *v) => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Errors of one connection (reset before accept, out of descriptors): wait a
                // moment and go on, as the listener itself is fine.
                Err(e) => {
                    eprintln!("minfer serve: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.wait_for(|v| *v) => break,
        };
        let _ = stream.set_nodelay(true);
        // Every request of the connection carries its peer, for the generation to watch.
        let peer = peer::Peer::of(&stream).map(Arc::new);
        let routers = Arc::clone(&routers);
        let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            if let Some(peer) = &peer {
                request.extensions_mut().insert(Arc::clone(peer));
            }
            let inner = hyper_util::service::TowerToHyperService::new(routers.current());
            hyper::service::Service::call(&inner, request)
        });
        let http = Arc::clone(&http);
        let mut stop = stop.clone();
        let write_timeout = limits.write_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            let stream = write_timeout::WriteTimeout::new(stream, write_timeout);
            let connection = http.serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            // Errors here belong to one client (a timeout, a reset, bad HTTP): the connection
            // just ends.
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = stop.wait_for(|v| *v) => {}
            }
            // Shutting down: an idle connection closes now, one with a request in flight
            // after its response.
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        });
    }
    drop(listener);
    // Every permit back: every connection closed.
    let _ = permits.acquire_many(limits.max_connections as u32).await;
    Ok(())
}

/// SIGHUP, SIGUSR1 and SIGUSR2 end a process by default; a server (under a terminal that closes,
/// or a service manager that sends them to ask for a log reopen) should log them and keep
/// serving. SIGINT and SIGTERM, which do stop it, are `shutdown_signal`'s.
fn log_other_signals() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let kinds = [
            (SignalKind::hangup(), "SIGHUP"),
            (SignalKind::user_defined1(), "SIGUSR1"),
            (SignalKind::user_defined2(), "SIGUSR2"),
        ];
        for (kind, name) in kinds {
            match signal(kind) {
                Ok(mut stream) => {
                    tokio::spawn(async move {
                        while stream.recv().await.is_some() {
                            eprintln!(
                                "minfer serve: received {name}: ignored, still serving (SIGINT or SIGTERM stops the server)"
                            );
                        }
                    });
                }
                Err(e) => eprintln!("minfer serve: cannot handle {name}: {e}"),
            }
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
}
