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
    #[error("method {method} is not allowed on {path}; allowed: {allow}")]
    MethodNotAllowed { method: String, path: String, allow: &'static str },
    #[error("{0}")]
    InvalidPath(String),
    #[error("{0}")]
    UnsupportedEncoding(String),
    #[error("Response with id '{0}' not found")]
    ResponseNotFound(String),
    /// The client did not send its request head in time (the slowloris guard).
    #[error("the client did not send the request head in time")]
    HeaderTimeout,
    /// A request head hyper could not parse and answered itself (`refusals.rs`), with the
    /// status it chose: 400, 414 or 431.
    #[error("{}", malformed_message(*.0))]
    MalformedHead(StatusCode),
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
            | ProxyError::NotFound { .. }
            | ProxyError::MethodNotAllowed { .. }
            | ProxyError::InvalidPath(_)
            | ProxyError::UnsupportedEncoding(_)
            | ProxyError::ResponseNotFound(_)
            | ProxyError::HeaderTimeout
            | ProxyError::MalformedHead(_) => Blame::Client,
            ProxyError::EngineTimeout { .. } | ProxyError::EngineFailed { .. } => Blame::Engine,
            ProxyError::NoSnapshot
            | ProxyError::NoHealthyEngine { .. }
            | ProxyError::Shed(_)
            | ProxyError::Overloaded { .. } => Blame::Internal,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::BadRequest(_) | ProxyError::InvalidPath(_) => StatusCode::BAD_REQUEST,
            ProxyError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ProxyError::UnsupportedEncoding(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ProxyError::ResponseNotFound(_) => StatusCode::NOT_FOUND,
            ProxyError::HeaderTimeout => StatusCode::REQUEST_TIMEOUT,
            ProxyError::MalformedHead(status) => *status,
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
            ProxyError::MethodNotAllowed { .. } => ("invalid_request_error", "method_not_allowed"),
            ProxyError::InvalidPath(_) => ("invalid_request_error", "invalid_path"),
            ProxyError::UnsupportedEncoding(_) => ("invalid_request_error", "unsupported_media_type"),
            ProxyError::ResponseNotFound(_) => ("invalid_request_error", "response_not_found"),
            ProxyError::HeaderTimeout => ("invalid_request_error", "header_timeout"),
            ProxyError::MalformedHead(status) => match *status {
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => ("invalid_request_error", "header_too_large"),
                StatusCode::URI_TOO_LONG => ("invalid_request_error", "uri_too_long"),
                _ => ("invalid_request_error", "malformed_request"),
            },
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
        let param = match self {
            ProxyError::UnknownModel(_) => Some("model"),
            ProxyError::ResponseNotFound(_) => Some("response_id"),
            _ => None,
        };
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
        if let ProxyError::MethodNotAllowed { allow, .. } = &self {
            headers.insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        response
    }
}

fn malformed_message(status: StatusCode) -> &'static str {
    match status {
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => {
            "the request head is too large (too many header fields, or too long)"
        }
        StatusCode::URI_TOO_LONG => "the request target is too long",
        _ => "the request head is malformed (request line, header syntax, or message framing)",
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
