//! Errors of the request path and the one place they become HTTP responses.
//!
//! Every error records who failed (the client, an engine, or ilb itself) and maps to an
//! OpenAI-style JSON body `{"error": {"message", "type", "param", "code"}}` so that any OpenAI
//! SDK raises its usual exception type.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

/// Who caused an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blame {
    Client,
    Engine,
    Internal,
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("{0}")]
    BadRequest(String),
    #[error("request body exceeds the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("the client did not send the request body in time")]
    BodyTimeout,
    #[error("The model '{0}' does not exist")]
    UnknownModel(String),
    #[error("no route for {method} {path}")]
    NotFound { method: String, path: String },
    #[error("no routing snapshot installed yet")]
    NoSnapshot,
    #[error("no healthy engine for model '{model}'{detail}")]
    NoHealthyEngine { model: String, detail: String },
    #[error("request shed: {0}")]
    Shed(String),
    #[error("every engine for model '{model}' is at its concurrency limit; waited {waited_ms} ms")]
    Overloaded { model: String, waited_ms: u64 },
    #[error("engine '{engine}' did not respond within {timeout_ms} ms")]
    EngineTimeout { engine: String, timeout_ms: u64 },
    #[error("engine '{engine}' failed: {detail}")]
    EngineFailed { engine: String, detail: String },
}

impl ProxyError {
    pub fn blame(&self) -> Blame {
        match self {
            ProxyError::BadRequest(_)
            | ProxyError::BodyTooLarge { .. }
            | ProxyError::BodyTimeout
            | ProxyError::UnknownModel(_)
            | ProxyError::NotFound { .. } => Blame::Client,
            ProxyError::EngineTimeout { .. } | ProxyError::EngineFailed { .. } => Blame::Engine,
            ProxyError::NoSnapshot
            | ProxyError::NoHealthyEngine { .. }
            | ProxyError::Shed(_)
            | ProxyError::Overloaded { .. } => Blame::Internal,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ProxyError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            ProxyError::UnknownModel(_) | ProxyError::NotFound { .. } => StatusCode::NOT_FOUND,
            ProxyError::NoSnapshot | ProxyError::NoHealthyEngine { .. } | ProxyError::Overloaded { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ProxyError::Shed(_) => StatusCode::TOO_MANY_REQUESTS,
            ProxyError::EngineTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::EngineFailed { .. } => StatusCode::BAD_GATEWAY,
        }
    }

    /// OpenAI's `type` and `code` fields.
    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            ProxyError::BadRequest(_) => ("invalid_request_error", "invalid_request"),
            ProxyError::BodyTooLarge { .. } => ("invalid_request_error", "body_too_large"),
            ProxyError::BodyTimeout => ("invalid_request_error", "body_timeout"),
            ProxyError::UnknownModel(_) => ("invalid_request_error", "model_not_found"),
            ProxyError::NotFound { .. } => ("invalid_request_error", "not_found"),
            ProxyError::NoSnapshot => ("service_unavailable", "no_snapshot"),
            ProxyError::NoHealthyEngine { .. } => ("service_unavailable", "no_healthy_engine"),
            ProxyError::Shed(_) => ("rate_limit_exceeded", "shed"),
            ProxyError::Overloaded { .. } => ("service_unavailable", "overloaded"),
            ProxyError::EngineTimeout { .. } => ("upstream_error", "engine_timeout"),
            ProxyError::EngineFailed { .. } => ("upstream_error", "engine_failed"),
        }
    }

    /// Seconds a client should wait before retrying, where that is meaningful.
    fn retry_after_s(&self) -> Option<u32> {
        match self {
            ProxyError::NoSnapshot
            | ProxyError::NoHealthyEngine { .. }
            | ProxyError::Shed(_)
            | ProxyError::Overloaded { .. } => Some(1),
            _ => None,
        }
    }

    /// The JSON error body, shared with SSE error events.
    pub fn body_json(&self) -> String {
        let (kind, code) = self.kind();
        let param = matches!(self, ProxyError::UnknownModel(_)).then_some("model");
        serde_json::json!({
            "error": { "message": self.to_string(), "type": kind, "param": param, "code": code }
        })
        .to_string()
    }

    pub fn into_response<B: From<Bytes>>(self) -> Response<B> {
        let mut response = Response::new(B::from(Bytes::from(self.body_json())));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(s) = self.retry_after_s() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}

/// The error and its causes on one line (top-level messages are terse).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_to_openai_shape_and_status() {
        let e = ProxyError::UnknownModel("gpt-9".into());
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
        let v: serde_json::Value = serde_json::from_str(&e.body_json()).unwrap();
        assert_eq!(v["error"]["message"], "The model 'gpt-9' does not exist");
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["param"], "model");
        let r: Response<Bytes> = ProxyError::NoSnapshot.into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        assert_eq!(ProxyError::BodyTooLarge { limit: 1 }.blame(), Blame::Client);
    }
}
