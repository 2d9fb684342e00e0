//! The server's errors: [`ServerError`] for what stops the server from starting or serving, and
//! [`ApiError`], one failed request, answered in OpenAI's error shape, which is also
//! llama-server's (`{"error": {"message", "type", "param", "code"}}`, `code` the HTTP status as
//! llama-server sends it) with its HTTP status. A prompt longer than the context is
//! llama-server's `exceed_context_size_error`, with `n_prompt_tokens` and `n_ctx` beside.
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
    /// A `type` of llama-server's own instead of the one the status implies
    /// (`exceed_context_size_error`), and the fields it adds beside the message.
    /// (Boxed: it is rare, and errors travel in every `Result` of the request readers.)
    pub llama_type: Option<Box<(&'static str, serde_json::Map<String, serde_json::Value>)>>,
}

impl ApiError {
    /// A 400 about field `param`.
    pub fn field(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.into()),
            llama_type: None,
        }
    }

    /// A 400 not tied to one field.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: None,
            llama_type: None,
        }
    }

    /// An error with any status.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
            llama_type: None,
        }
    }

    /// A 400 for a prompt of `n_prompt` tokens that leaves no room in a slot's `n_ctx`:
    /// llama-server's `exceed_context_size_error`, which clients tell apart to shorten the
    /// conversation.
    pub fn exceeds_context(
        param: impl Into<String>,
        message: impl Into<String>,
        n_prompt: usize,
        n_ctx: usize,
    ) -> Self {
        let mut extra = serde_json::Map::new();
        extra.insert("n_prompt_tokens".into(), n_prompt.into());
        extra.insert("n_ctx".into(), n_ctx.into());
        ApiError {
            llama_type: Some(Box::new(("exceed_context_size_error", extra))),
            ..Self::field(param, message)
        }
    }

    /// A 500: the server's fault, not the request's.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// OpenAI's `type` for the status.
    pub fn kind(&self) -> &'static str {
        if let Some(llama) = &self.llama_type {
            return llama.0;
        }
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_IMPLEMENTED => "not_supported_error",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The error JSON: `{"error": {"message", "type", "param", "code"}}` and what llama-server
    /// adds for its own types.
    pub fn body(&self) -> serde_json::Value {
        let mut body = json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.status.as_u16(),
            }
        });
        if let Some(llama) = &self.llama_type {
            for (k, v) in &llama.1 {
                body["error"][k] = v.clone();
            }
        }
        body
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_past_the_context_is_llama_servers_exceed_context_size_error_with_both_numbers() {
        let e = ApiError::exceeds_context("messages", "too long", 300, 256);
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            e.body(),
            json!({"error": {"message": "too long", "type": "exceed_context_size_error", "param": "messages",
                             "code": 400, "n_prompt_tokens": 300, "n_ctx": 256}})
        );
        // Other errors keep the type of their status, with the status as the code.
        let e = ApiError::new(StatusCode::NOT_IMPLEMENTED, "no");
        assert_eq!(e.body()["error"]["type"], "not_supported_error");
        assert_eq!(e.body()["error"]["code"], 501);
    }
}
