//! The server's errors: [`ServerError`] for what stops the server from starting or serving, and
//! [`ApiError`], one failed request, answered in OpenAI's error shape
//! (`{"error": {"message", "type", "param", "code"}}`) with its HTTP status.
//!
//! This file only describes failures; deciding which status a failure deserves is the caller's
//! job, made where the failure is understood.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Why `minfer serve` could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The model could not be loaded.
    #[error(transparent)]
    Load(#[from] crate::engine::LoadError),
    /// The listening socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// `host:port` as configured.
        addr: String,
        /// The system's reason.
        source: std::io::Error,
    },
    /// Tokio or a slot thread could not start.
    #[error("the async runtime cannot start: {0}")]
    Runtime(std::io::Error),
    /// The listener failed while serving.
    #[error("the server failed: {0}")]
    Serve(std::io::Error),
    /// A configuration value is out of range.
    #[error("invalid option: {0}")]
    Config(String),
}

/// One request's failure, as the client sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// OpenAI's `error.message`.
    pub message: String,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
}

impl ApiError {
    /// A 400 about field `param`.
    pub fn field(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.into()),
        }
    }

    /// A 400 not tied to one field.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: None,
        }
    }

    /// An error with any status.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
        }
    }

    /// A 500: the server's fault, not the request's.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// OpenAI's `type` for the status.
    pub fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// OpenAI's error JSON: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": null,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}
