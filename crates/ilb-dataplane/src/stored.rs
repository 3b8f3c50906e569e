//! Operations on a response an engine stored (the Responses API's `retrieve`, `delete`,
//! `cancel` and `input_items.list`: `GET`/`DELETE /v1/responses/{id}`,
//! `POST /v1/responses/{id}/cancel`, `GET /v1/responses/{id}/input_items`). They name a
//! response, not a model, and only the engine that stored it can answer. The data plane
//! remembers which engine stored each response it proxied (`Shared::responses`, the table that
//! routes `previous_response_id`); such a request goes to that engine once (no other engine
//! has the response, so there is nothing to retry on), and one naming a response the data
//! plane does not know, or whose engine left the snapshot, gets an OpenAI-style 404.

use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::proxy::{read_body, route_header, send_once, stream_back, Target};
use crate::shared::Shared;
use http::{Request, Response};
use hyper::body::Incoming;
use ilb_core::classify;
use std::sync::Arc;

/// Forwards `req`, an operation on the stored response `id`, to the engine that stored it.
/// Its answer passes through whatever its status: the engine's 404 for a response it no longer
/// has, too, which counts against no engine (`engines::Verdict`).
pub async fn forward(shared: Arc<Shared>, id: &str, req: Request<Incoming>) -> Response<ProxyBody> {
    match send(&shared, id, req).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn send(
    shared: &Arc<Shared>,
    id: &str,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (mut parts, body) = req.into_parts();
    let body = read_body(shared, &mut parts.headers, body).await?;
    let installed = shared.routing.load().ok_or(ProxyError::NoSnapshot)?;
    let key = classify::response_key(id);
    let now_s = (shared.pool_clock.ms() / 1000) as u32;
    // The engine's place in some class of the table (the response's model is not named): its
    // in-flight count is the engine's, whichever class carries it.
    let target = installed
        .table
        .model_names()
        .iter()
        .filter_map(|name| installed.table.model(name.as_str()))
        .flat_map(|model| model.classes.iter())
        .find_map(|class| {
            let candidate = class.stored_at(&shared.responses, key, now_s)?;
            Some(Target { installed: &installed, class, candidate })
        })
        .ok_or_else(|| ProxyError::ResponseNotFound(id.to_owned()))?;
    let request_id = shared.next_request_id();
    let method = parts.method.clone();
    match send_once(shared, target, method, &parts, &body, request_id).await? {
        Ok((response, in_flight)) => {
            let route = route_header(shared, &installed, target.class, target.candidate, 1, false);
            Ok(stream_back(shared, response, in_flight, route, None))
        }
        Err(error) => Err(error),
    }
}
