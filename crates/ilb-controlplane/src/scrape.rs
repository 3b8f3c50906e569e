//! Scraping one engine's Prometheus endpoint: one HTTP GET with an overall timeout and a body
//! size limit, parsed into one [`EngineSample`] per model.
//!
//! Errors are typed by where the scrape failed ([`ScrapeError`]): the caller records connect
//! failures and timeouts as health signals of the engine (it may be down), a bad status as
//! an unhealthy but reachable engine, and parse failures as a misconfigured target.

use bytes::Bytes;
use http::{header, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ilb_core::ModelName;
use ilb_planning::prom::{self, Limits, ParseError};
use ilb_planning::signals::{self, EngineSample};
use std::time::Duration;

/// The HTTP client scrapes go through (http or https); cheap to clone, keeps connections alive
/// between scrapes.
pub type HttpClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// A client with keep-alive for http engines; https engines fail their handshake (it trusts no
/// root). See [`https_client`].
pub fn http_client() -> HttpClient {
    https_client(
        &ilb_tls::ClientTls::new(&ilb_tls::ClientOptions::default()).expect("an empty config builds"),
    )
}

/// A client with keep-alive for http and https engines, trusting what `tls` trusts (and
/// presenting its client certificate, if any).
pub fn https_client(tls: &ilb_tls::ClientTls) -> HttpClient {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.config_without_alpn())
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(90)).build(connector)
}

/// How the text of a [`ScrapeError::Connect`] begins; the fleet reads it from the error text.
pub use ilb_planning::fleet::CONNECT_FAILED;

/// Why a scrape failed.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// The URL cannot be requested (e.g. no host).
    #[error("invalid scrape request: {0}")]
    InvalidRequest(String),
    /// TCP connect or the TLS handshake failed: the engine is likely down or unreachable, or
    /// its certificate is not trusted (the message names the reason). Displays with the
    /// [`CONNECT_FAILED`] prefix, which the fleet reads from the error text.
    #[error("connect failed: {0}")]
    Connect(String),
    /// No complete answer within the timeout (connect, headers and body together).
    #[error("scrape timed out after {0:?}")]
    Timeout(Duration),
    /// The engine answered with a non-success status.
    #[error("engine answered status {0}")]
    Status(StatusCode),
    /// The body is larger than the limit.
    #[error("metrics body exceeds {limit} bytes")]
    BodyTooLarge { limit: usize },
    /// The connection broke after connecting (reset, malformed HTTP, truncated body).
    #[error("request failed: {0}")]
    Transport(String),
    /// The body is not a usable Prometheus exposition.
    #[error("invalid exposition: {0}")]
    Parse(#[from] ParseError),
}

/// Scrapes `url` with the default [`Limits`]; see [`scrape_with_limits`].
pub async fn scrape(
    client: &HttpClient,
    url: &Uri,
    timeout: Duration,
) -> Result<Vec<(ModelName, EngineSample)>, ScrapeError> {
    scrape_with_limits(client, url, timeout, &Limits::default()).await
}

/// Fetches `url`, parses the exposition and extracts one sample per model. `timeout` bounds
/// the whole exchange; the body is capped at `limits.max_bytes`.
pub async fn scrape_with_limits(
    client: &HttpClient,
    url: &Uri,
    timeout: Duration,
    limits: &Limits,
) -> Result<Vec<(ModelName, EngineSample)>, ScrapeError> {
    let body = tokio::time::timeout(timeout, fetch(client, url, limits.max_bytes))
        .await
        .map_err(|_| ScrapeError::Timeout(timeout))??;
    let exposition = prom::parse_bytes(&body, limits)?;
    if let Some(first) = &exposition.first_invalid {
        tracing::debug!(url = %url, invalid_lines = exposition.invalid_lines, %first, "skipped malformed metric lines");
    }
    Ok(signals::extract(&exposition))
}

async fn fetch(client: &HttpClient, url: &Uri, max_bytes: usize) -> Result<Bytes, ScrapeError> {
    let request = Request::get(url.clone())
        // Ask for the classic text format; OpenMetrics answers are tolerated too.
        .header(header::ACCEPT, "text/plain;version=0.0.4;q=1,*/*;q=0.1")
        .header(header::USER_AGENT, "ilb-controlplane")
        .body(Empty::<Bytes>::new())
        .map_err(|error| ScrapeError::InvalidRequest(error.to_string()))?;
    let response = client.request(request).await.map_err(|error| {
        let message = error_chain(&error);
        if error.is_connect() {
            ScrapeError::Connect(message)
        } else {
            ScrapeError::Transport(message)
        }
    })?;
    let status = response.status();
    if !status.is_success() {
        return Err(ScrapeError::Status(status));
    }
    let declared_length = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared_length.is_some_and(|length| length > max_bytes as u64) {
        return Err(ScrapeError::BodyTooLarge { limit: max_bytes });
    }
    let collected = Limited::new(response.into_body(), max_bytes).collect().await.map_err(|error| {
        if error.downcast_ref::<LengthLimitError>().is_some() {
            ScrapeError::BodyTooLarge { limit: max_bytes }
        } else {
            ScrapeError::Transport(error_chain(error.as_ref()))
        }
    })?;
    Ok(collected.to_bytes())
}

/// An error and its sources on one line; hyper's top-level messages alone are too vague.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
