//! `POST /v1/engines` (register, or renew the lease: the heartbeat) and
//! `DELETE /v1/engines/{id}`. Both need a verified client certificate or the configured bearer
//! token: with neither, registration is off, since a registered URL is one data planes will
//! forward to.

use super::{error, json, ApiState};
use crate::events::Event;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use ilb_planning::fleet::members::{RegisterError, Registration};
use std::time::Duration;
use tokio::sync::oneshot;

/// Largest registration body accepted.
const MAX_REGISTRATION_BYTES: usize = 64 << 10;
/// How long a request waits for the control loop's answer.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

type Body = Full<Bytes>;

/// `None` when the caller may change the engine set: a verified client certificate
/// (`certified`), or the bearer token; without a token and a certificate, registration is off.
fn check_auth<B>(state: &ApiState, certified: bool, req: &Request<B>) -> Option<Response<Body>> {
    if certified {
        return None;
    }
    if !state.has_token() {
        return Some(error(
            StatusCode::FORBIDDEN,
            "registration_disabled",
            "engine registration needs control_plane.token to be set",
        ));
    }
    (!state.authorized(req))
        .then(|| error(StatusCode::UNAUTHORIZED, "unauthorized", "a valid bearer token is required"))
}

async fn ask<T>(state: &ApiState, event: Event, reply: oneshot::Receiver<T>) -> Result<T, Response<Body>> {
    let busy = || error(StatusCode::SERVICE_UNAVAILABLE, "busy", "control loop is busy, try again");
    if state.events.try_send(event).is_err() {
        return Err(busy());
    }
    match tokio::time::timeout(REPLY_TIMEOUT, reply).await {
        Ok(Ok(answer)) => Ok(answer),
        _ => Err(busy()),
    }
}

pub(crate) async fn register(state: &ApiState, certified: bool, req: Request<Incoming>) -> Response<Body> {
    if let Some(refused) = check_auth(state, certified, &req) {
        return refused;
    }
    let body = match Limited::new(req.into_body(), MAX_REGISTRATION_BYTES).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error(StatusCode::PAYLOAD_TOO_LARGE, "invalid_body", &format!("cannot read body: {e}"))
        }
    };
    let registration: Registration = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_registration",
                &ilb_core::redact::message(&format!("malformed registration: {e}"), &[] as &[&str]),
            )
        }
    };
    let (id, ttl_s) = (registration.id.clone(), registration.ttl_s);
    let (tx, rx) = oneshot::channel();
    match ask(state, Event::Register(Box::new(registration), tx), rx).await {
        Ok(Ok(outcome)) => {
            json(StatusCode::OK, &serde_json::json!({"id": id, "status": outcome, "ttl_s": ttl_s}))
        }
        Ok(Err(RegisterError::Invalid(why))) => error(StatusCode::BAD_REQUEST, "invalid_registration", &why),
        Ok(Err(RegisterError::Conflict(why))) => error(StatusCode::CONFLICT, "engine_id_taken", &why),
        Err(busy) => busy,
    }
}

pub(crate) async fn deregister<B>(
    state: &ApiState,
    certified: bool,
    req: &Request<B>,
    id: &str,
) -> Response<Body> {
    if let Some(refused) = check_auth(state, certified, req) {
        return refused;
    }
    let (tx, rx) = oneshot::channel();
    match ask(state, Event::Deregister(id.to_owned(), tx), rx).await {
        Ok(true) => json(StatusCode::OK, &serde_json::json!({"id": id, "status": "removed"})),
        Ok(false) => {
            error(StatusCode::NOT_FOUND, "engine_not_registered", &format!("no registered engine '{id}'"))
        }
        Err(busy) => busy,
    }
}
