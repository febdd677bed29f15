//! The server's one error type, answered as OpenAI's error object:
//! `{"error": {"message", "type", "param", "code"}}` with the HTTP status that fits.
//!
//! Invariant: every refusal a client can cause is a 4xx with a message naming what to change;
//! 5xx only for the engine's own failures (and 503 when the queue is full).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered to the client.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// OpenAI's `code` (e.g. `model_not_found`, `context_length_exceeded`).
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }
    /// 400, naming the field at fault.
    pub fn bad(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_string()),
            ..Self::new(StatusCode::BAD_REQUEST, message)
        }
    }
    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "missing or wrong API key: send `Authorization: Bearer KEY` with the server's --api-key",
        )
        .code("invalid_api_key")
    }
    pub fn busy() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server's queue is full: retry after a second",
        )
        .code("server_busy")
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// OpenAI's error type for the status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => "server_busy",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The error object (also sent as the last event of a stream that fails).
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind(),
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl From<llada::Error> for ApiError {
    fn from(e: llada::Error) -> Self {
        use llada::Error as E;
        use llada_model::ModelError as M;
        let msg = e.to_string();
        match &e {
            E::Model(M::ContextOverflow { .. }) => {
                ApiError::new(StatusCode::BAD_REQUEST, msg).code("context_length_exceeded")
            }
            E::Invalid(_) | E::Decode(_) | E::Model(M::BadRequest(_) | M::BadToken { .. }) => {
                ApiError::new(StatusCode::BAD_REQUEST, msg)
            }
            _ => ApiError::internal(msg),
        }
    }
}

impl From<llada_model::ModelError> for ApiError {
    fn from(e: llada_model::ModelError) -> Self {
        llada::Error::from(e).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}
