//! The HTTP routes: authentication, the OpenAI endpoints (whole responses and SSE streams),
//! health, metrics, the model list and the playground page.
//!
//! Invariants: a generation request is answered only after the worker's first message, so an
//! error found while starting it (prompt past the context, …) is a proper 4xx, not a broken
//! stream; a stream always ends with `data: [DONE]` (after an error object if it failed); a
//! client that disconnects drops its receiver, which the worker sees before its next pass.

use crate::api::{self, ChatRequest, CompletionRequest, Options};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::scheduler::{Finish, Input, Job, ModelSpec, Out, Worker};
use crate::ServeConfig;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{self, UnboundedReceiver};

/// A served model: its worker starts (and the model loads) on the first request.
struct Served {
    name: String,
    spec: ModelSpec,
    worker: OnceLock<Result<Worker, String>>,
    /// Known once loaded.
    kind: Arc<OnceLock<&'static str>>,
}

struct AppState {
    models: Vec<Served>,
    api_key: Option<String>,
    default_max_tokens: usize,
    metrics: Arc<Metrics>,
    next_id: AtomicU64,
}

type Shared = Arc<AppState>;

/// The server's routes over `cfg`'s models.
pub fn router(cfg: ServeConfig) -> std::io::Result<Router> {
    if cfg.models.is_empty() {
        return Err(std::io::Error::other("no model to serve"));
    }
    let state = Arc::new(AppState {
        models: cfg
            .models
            .into_iter()
            .map(|(name, spec)| Served {
                name,
                spec,
                worker: OnceLock::new(),
                kind: Arc::default(),
            })
            .collect(),
        api_key: cfg.api_key,
        default_max_tokens: cfg.default_max_tokens,
        metrics: Arc::new(Metrics::default()),
        next_id: AtomicU64::new(1),
    });
    Ok(Router::new()
        .route("/", get(playground))
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "no such route: see GET /v1/models, POST /v1/completions, POST /v1/chat/completions")
        })
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(DefaultBodyLimit::max(cfg.body_limit))
        .with_state(state))
}

/// `Authorization: Bearer KEY` on every route but `/health` and the page itself.
async fn auth(State(st): State<Shared>, req: Request, next: Next) -> Response {
    let open = matches!(req.uri().path(), "/health" | "/");
    if let (Some(key), false) = (&st.api_key, open) {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

async fn playground() -> Html<&'static str> {
    Html(include_str!("playground.html"))
}

async fn metrics(State(st): State<Shared>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn models(State(st): State<Shared>) -> Json<Value> {
    let data: Vec<Value> = st
        .models
        .iter()
        .map(|m| {
            json!({"id": m.name, "object": "model", "created": now(), "owned_by": "llada-rs",
                   "llada": {"kind": m.kind.get(), "loaded": m.kind.get().is_some(),
                             "speculative": m.spec.draft.is_some()}})
        })
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// The request body, within the limit.
fn body_bytes(
    b: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Bytes, ApiError> {
    b.map_err(|e| {
        ApiError::new(
            e.status(),
            format!("the body could not be read: {}", e.body_text()),
        )
    })
}

async fn completions(
    State(st): State<Shared>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    st.metrics.request();
    let r = async {
        let req: CompletionRequest = api::parse(&body_bytes(body)?)?;
        let prompt = req.prompt()?.to_string();
        Ok::<_, ApiError>((req.common, Input::Raw(prompt)))
    }
    .await;
    generate(st, r, Kind::Completion).await
}

async fn chat(
    State(st): State<Shared>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    st.metrics.request();
    let r = async {
        let req: ChatRequest = api::parse(&body_bytes(body)?)?;
        let msgs = req.messages()?;
        Ok::<_, ApiError>((req.common, Input::Chat(msgs)))
    }
    .await;
    generate(st, r, Kind::Chat).await
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Completion,
    Chat,
}

/// What every response chunk repeats.
#[derive(Clone)]
struct Meta {
    id: String,
    model: String,
    created: u64,
    kind: Kind,
}

async fn generate(st: Shared, r: Result<(api::Common, Input), ApiError>, kind: Kind) -> Response {
    match start(&st, r, kind).await {
        Ok((meta, opts, first, rx)) => {
            if opts.stream {
                stream_response(meta, opts, first, rx).into_response()
            } else {
                whole_response(meta, first, rx).await
            }
        }
        Err(e) => {
            st.metrics.rejected();
            e.into_response()
        }
    }
}

/// Check the request, queue it, and wait for the worker's first message.
async fn start(
    st: &Shared,
    r: Result<(api::Common, Input), ApiError>,
    kind: Kind,
) -> Result<(Meta, Options, Out, UnboundedReceiver<Out>), ApiError> {
    let (common, input) = r?;
    let served = match &common.model {
        None => &st.models[0],
        Some(name) => st.models.iter().find(|m| &m.name == name).ok_or_else(|| {
            let names: Vec<&str> = st.models.iter().map(|m| m.name.as_str()).collect();
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "model {name:?} is not served here; served: {}",
                    names.join(", ")
                ),
            )
            .code("model_not_found")
        })?,
    };
    let opts = common.options(st.default_max_tokens)?;
    let worker = served
        .worker
        .get_or_init(|| {
            Worker::spawn(
                &served.name,
                served.spec.clone(),
                st.metrics.clone(),
                served.kind.clone(),
            )
            .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| ApiError::internal(format!("the model's worker could not start: {e}")))?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    worker.submit(Job {
        input,
        opts: opts.clone(),
        tx,
    })?;
    let first = rx
        .recv()
        .await
        .ok_or_else(|| ApiError::internal("the worker dropped the request"))?;
    if let Out::Error(e) = first {
        return Err(e);
    }
    let n = st.next_id.fetch_add(1, Ordering::Relaxed);
    let meta = Meta {
        id: match kind {
            Kind::Completion => format!("cmpl-{n}"),
            Kind::Chat => format!("chatcmpl-{n}"),
        },
        model: served.name.clone(),
        created: now(),
        kind,
    };
    Ok((meta, opts, first, rx))
}

impl Meta {
    fn object(&self, stream: bool) -> &'static str {
        match (self.kind, stream) {
            (Kind::Completion, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
        }
    }
    /// A response body with one choice.
    fn body(&self, choice: Value, stream: bool) -> Value {
        json!({
            "id": self.id,
            "object": self.object(stream),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        })
    }
    /// A stream chunk carrying `text` (and the finish reason at the end).
    fn chunk(&self, text: Option<&str>, finish: Option<&str>, first: bool) -> Value {
        let choice = match self.kind {
            Kind::Completion => {
                json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish})
            }
            Kind::Chat => {
                let mut delta = json!({});
                if first {
                    delta["role"] = json!("assistant");
                }
                if let Some(t) = text {
                    delta["content"] = json!(t);
                }
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
        };
        self.body(choice, true)
    }
}

/// Collect the whole generation into one response.
async fn whole_response(meta: Meta, first: Out, mut rx: UnboundedReceiver<Out>) -> Response {
    let mut text = String::new();
    let mut next = Some(first);
    let finish: Finish = loop {
        let msg = match next.take() {
            Some(m) => Some(m),
            None => rx.recv().await,
        };
        match msg {
            Some(Out::Text(t)) => text.push_str(&t),
            Some(Out::Canvas(_)) => {}
            Some(Out::Done(f)) => break f,
            Some(Out::Error(e)) => return e.into_response(),
            None => return ApiError::internal("the worker dropped the request").into_response(),
        }
    };
    let choice = match meta.kind {
        Kind::Completion => {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish.reason})
        }
        Kind::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": null,
            "finish_reason": finish.reason,
        }),
    };
    let mut body = meta.body(choice, false);
    body["usage"] = finish.usage.json();
    Json(body).into_response()
}

/// Server-sent events: a chunk per text piece, `event: denoising` per diffusion step (when
/// asked for), the finish chunk, usage (when asked for), then `[DONE]`.
fn stream_response(
    meta: Meta,
    opts: Options,
    first: Out,
    rx: UnboundedReceiver<Out>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    struct St {
        meta: Meta,
        include_usage: bool,
        pending: Vec<SseEvent>,
        first: Option<Out>,
        rx: UnboundedReceiver<Out>,
        started: bool,
        ended: bool,
    }
    let init = St {
        meta,
        include_usage: opts.include_usage,
        pending: vec![],
        first: Some(first),
        rx,
        started: false,
        ended: false,
    };
    let data = |v: &Value| SseEvent::default().data(v.to_string());
    let s = stream::unfold(init, move |mut s| async move {
        loop {
            if let Some(e) = s.pending.pop() {
                return Some((Ok(e), s));
            }
            if s.ended {
                return None;
            }
            let msg = match s.first.take() {
                Some(m) => Some(m),
                None => s.rx.recv().await,
            };
            let first = !s.started;
            s.started = true;
            // `pending` is a stack: push in reverse order of sending.
            match msg {
                Some(Out::Text(t)) => s.pending.push(data(&s.meta.chunk(Some(&t), None, first))),
                Some(Out::Canvas(mut c)) => {
                    c["id"] = json!(s.meta.id);
                    s.pending
                        .push(SseEvent::default().event("denoising").data(c.to_string()));
                }
                Some(Out::Done(f)) => {
                    s.ended = true;
                    s.pending.push(SseEvent::default().data("[DONE]"));
                    if s.include_usage {
                        let mut u = s.meta.body(json!(null), true);
                        u["choices"] = json!([]);
                        u["usage"] = f.usage.json();
                        s.pending.push(data(&u));
                    }
                    s.pending
                        .push(data(&s.meta.chunk(None, Some(f.reason), first)));
                }
                Some(Out::Error(e)) => {
                    s.ended = true;
                    s.pending.push(SseEvent::default().data("[DONE]"));
                    s.pending.push(data(&e.body()));
                }
                None => {
                    s.ended = true;
                    let e = ApiError::internal("the worker dropped the request");
                    s.pending.push(SseEvent::default().data("[DONE]"));
                    s.pending.push(data(&e.body()));
                }
            }
        }
    });
    Sse::new(s).keep_alive(KeepAlive::default())
}
