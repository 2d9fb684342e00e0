//! `minfer serve`: an OpenAI-compatible HTTP server (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/models`, `/health`, `/metrics`) on axum and tokio.
//!
//! The async runtime only moves bytes: generation runs on one thread per slot (`slots`), each
//! with its own session over the one memory-mapped weight set, and tokens come back over
//! channels. The parts: `request` reads OpenAI bodies, `routes` holds the handlers, `slots` the
//! scheduler, `response` the JSON and SSE shapes, `tool_calls` the `<tool_call>` parser,
//! `metrics` the Prometheus counters, `error` the error shapes. This module wires them together
//! and owns start-up and graceful shutdown; it must not know the API's shapes itself.

mod error;
mod metrics;
mod request;
mod response;
mod routes;
mod slots;
mod tool_calls;

pub use error::{ApiError, ServerError};

use crate::cli::run::{self, LoadOptions};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How `minfer serve` runs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub model: PathBuf,
    pub host: String,
    /// 0 picks a free port; the address is printed once bound.
    pub port: u16,
    pub n_slots: usize,
    /// Context of each slot, in tokens (clamped to the model's training context).
    pub n_ctx: usize,
    /// Threads of each slot; `None`: the physical cores divided by the slots, at least 1.
    pub n_threads: Option<usize>,
    pub backend: Option<String>,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    /// How long in-flight requests may run after SIGINT/SIGTERM before they are cancelled.
    pub shutdown_timeout: Duration,
}

/// A default request-body limit: far above any prompt that fits a context, far below memory.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 << 20;

/// Threads per slot when `-t` is not given: the physical cores shared out among the slots.
pub fn default_threads_per_slot(n_slots: usize) -> usize {
    (crate::backends::cpu::default_threads() / n_slots.max(1)).max(1)
}

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

/// Loads the model, starts the slots, serves until SIGINT or SIGTERM, then shuts down within
/// `shutdown_timeout`. Progress and one line per generation go to standard error.
pub fn serve(config: ServerConfig) -> Result<(), ServerError> {
    if config.n_slots == 0 {
        return Err(ServerError::Config("--n-slots must be at least 1".into()));
    }
    let (file, tokenizer, template) = run::open(&config.model)?;
    let n_threads = config
        .n_threads
        .unwrap_or_else(|| default_threads_per_slot(config.n_slots));
    let options = LoadOptions {
        n_ctx: config.n_ctx,
        n_threads,
        backend: config.backend.clone(),
    };
    let sessions = (0..config.n_slots)
        .map(|_| run::new_session(&file, &options))
        .collect::<Result<Vec<_>, _>>()?;
    let n_ctx = sessions[0].n_ctx();
    let n_vocab = sessions[0].model().hparams().n_vocab;
    let model_id = config
        .model
        .file_stem()
        .map_or_else(|| "model".to_string(), |s| s.to_string_lossy().into_owned());
    let tokenizer = Arc::new(tokenizer);
    let metrics = Arc::new(metrics::Metrics::default());
    let scheduler = slots::Scheduler::start(sessions, Arc::clone(&tokenizer), Arc::clone(&metrics))
        .map_err(ServerError::Runtime)?;
    let app = Arc::new(routes::AppState {
        scheduler: scheduler.clone(),
        tokenizer,
        template: Arc::new(template),
        metrics,
        model_id,
        n_ctx,
        n_vocab,
        n_slots: config.n_slots,
        api_key: config.api_key.clone().filter(|k| !k.is_empty()),
        max_body_bytes: config.max_body_bytes,
        created: unix_time(),
        fault_marker: std::env::var("MINFER_SERVE_FAULT").ok().filter(|m| !m.is_empty()),
    });
    // The async side only parses, routes and copies bytes; two threads keep it responsive
    // without taking cores from the slots.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(ServerError::Runtime)?;
    let result = runtime.block_on(run_server(config, n_threads, app, scheduler));
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

async fn run_server(
    config: ServerConfig,
    n_threads: usize,
    app: Arc<routes::AppState>,
    scheduler: slots::Scheduler,
) -> Result<(), ServerError> {
    let addr = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: addr.clone(),
            source,
        })?;
    let local = listener.local_addr().map_err(ServerError::Serve)?;
    eprintln!(
        "minfer serve: model {} | {} slots × {} tokens of context, {} threads each{}",
        app.model_id,
        app.n_slots,
        app.n_ctx,
        n_threads,
        if app.api_key.is_some() {
            " | API key required"
        } else {
            ""
        }
    );
    eprintln!("minfer serve: listening on http://{local}");

    let (tx, rx) = tokio::sync::watch::channel(false);
    let timeout = config.shutdown_timeout;
    tokio::spawn(async move {
        shutdown_signal().await;
        eprintln!(
            "minfer serve: shutting down: no new connections; in-flight requests get {:.0} s",
            timeout.as_secs_f64()
        );
        let _ = tx.send(true);
    });
    let mut stop = rx.clone();
    let server = axum::serve(listener, routes::router(app)).with_graceful_shutdown(async move {
        let _ = stop.wait_for(|v| *v).await;
    });
    let mut server = std::pin::pin!(std::future::IntoFuture::into_future(server));
    let mut stop = rx;
    tokio::select! {
        result = &mut server => result.map_err(ServerError::Serve)?,
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
