//! The client side of registration: what a sidecar or the engine simulator runs next to an
//! engine. [`Registrar::spawn`] registers at once and renews the lease every third of its
//! length (a failed renewal is retried sooner); [`Registrar::deregister`] stops renewing and
//! removes the engine with `DELETE /v1/engines/{id}`; dropping it only stops renewing (the
//! lease then runs out).

use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ilb_planning::fleet::members::Registration;
use std::time::Duration;
use tokio::sync::watch;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Why a registration call failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistrarError {
    #[error("request failed: {0}")]
    Transport(String),
    /// The control plane refused: its status and message.
    #[error("control plane answered {status}: {message}")]
    Refused { status: StatusCode, message: String },
}

/// Renews one engine's lease in the background until deregistered or dropped.
pub struct Registrar {
    client: HttpClient,
    base: String,
    token: String,
    id: String,
    task: tokio::task::JoinHandle<()>,
    /// Whether the latest call succeeded.
    ok: watch::Receiver<bool>,
}

async fn call(
    client: &HttpClient,
    method: Method,
    url: &str,
    token: &str,
    body: Bytes,
) -> Result<(), RegistrarError> {
    let request = Request::builder()
        .method(method)
        .uri(url)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Full::new(body))
        .map_err(|e| RegistrarError::Transport(e.to_string()))?;
    let call = async {
        let response = client.request(request).await.map_err(|e| RegistrarError::Transport(e.to_string()))?;
        let status = response.status();
        let body = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        if status.is_success() {
            return Ok(());
        }
        let message = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        Err(RegistrarError::Refused { status, message })
    };
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .map_err(|_| RegistrarError::Transport("timed out".into()))?
}

impl Registrar {
    /// Registers `registration` with the control plane at `control_plane` (base URL), and
    /// renews it every `ttl_s / 3`. Must run inside a tokio runtime.
    pub fn spawn(control_plane: &str, token: &str, registration: Registration) -> Registrar {
        let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        let base = control_plane.trim_end_matches('/').to_owned();
        let (ok_tx, ok) = watch::channel(false);
        let body = Bytes::from(serde_json::to_vec(&registration).unwrap_or_default());
        let every = Duration::from_secs_f64((registration.ttl_s / 3.0).max(0.05));
        let (task_client, url, task_token) = (client.clone(), format!("{base}/v1/engines"), token.to_owned());
        let id = registration.id.clone();
        let task = tokio::spawn(async move {
            loop {
                let result = call(&task_client, Method::POST, &url, &task_token, body.clone()).await;
                let pause = match &result {
                    Ok(()) => every,
                    Err(e) => {
                        tracing::warn!(engine = %id, error = %e, "registration failed; retrying");
                        (every / 4).max(Duration::from_millis(50))
                    }
                };
                ok_tx.send_replace(result.is_ok());
                tokio::time::sleep(pause).await;
            }
        });
        Registrar { client, base, token: token.to_owned(), id: registration.id, task, ok }
    }

    /// Waits until a registration call has succeeded (or `timeout` passed); true if it did.
    pub async fn registered(&mut self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.ok.wait_for(|ok| *ok)).await.is_ok_and(|r| r.is_ok())
    }

    /// Stops renewing and removes the engine now.
    pub async fn deregister(self) -> Result<(), RegistrarError> {
        self.task.abort();
        let url = format!("{}/v1/engines/{}", self.base, self.id);
        call(&self.client, Method::DELETE, &url, &self.token, Bytes::new()).await
    }
}

impl Drop for Registrar {
    fn drop(&mut self) {
        self.task.abort();
    }
}
