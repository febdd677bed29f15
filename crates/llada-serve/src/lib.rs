//! # llada-serve: an OpenAI-compatible HTTP server for llada-rs
//!
//! `llada serve` in library form: [`router`] answers `GET /v1/models`, `POST /v1/completions`,
//! `POST /v1/chat/completions` (OpenAI's request and response shapes, `stream: true` as
//! server-sent events ending in `data: [DONE]`), `GET /health`, `GET /metrics` (Prometheus
//! text) and `GET /` (the playground page). Each served model has a worker thread
//! ([`scheduler`]) that decodes concurrent requests in shared forward passes (continuous
//! batching); diffusion models stream their denoising steps on request.
//!
//! Safety: the server binds where it is told (the CLI defaults to 127.0.0.1); with an API key
//! every route but `/health` and the static page needs `Authorization: Bearer KEY`; a request
//! names a model only by a served name (never a path); bodies are capped at
//! [`ServeConfig::body_limit`] bytes; a full queue answers 503 with `Retry-After`.

pub mod api;
pub mod error;
pub mod metrics;
pub mod routes;
pub mod scheduler;

pub use error::ApiError;
pub use routes::router;
pub use scheduler::ModelSpec;

use std::net::SocketAddr;

/// What to serve and how.
#[derive(Clone)]
pub struct ServeConfig {
    /// Served names and their models (the first is the default).
    pub models: Vec<(String, ModelSpec)>,
    pub api_key: Option<String>,
    /// `max_tokens` of a request that gives none.
    pub default_max_tokens: usize,
    /// Largest request body, in bytes.
    pub body_limit: usize,
}

/// Serve on `addr` until SIGTERM or Ctrl-C; in-flight requests finish first. `on_ready` gets
/// the bound address (port 0 picks a free one).
pub async fn serve(
    cfg: ServeConfig,
    addr: SocketAddr,
    on_ready: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    on_ready(listener.local_addr()?);
    let app = router(cfg)?;
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down: finishing in-flight requests");
}

/// [`serve`] on a runtime of its own (two I/O threads: decoding runs on the models' lanes, not
/// on the runtime), for callers without one.
pub fn serve_blocking(
    cfg: ServeConfig,
    addr: SocketAddr,
    on_ready: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("serve-io")
        .enable_all()
        .build()?
        .block_on(serve(cfg, addr, on_ready))
}
