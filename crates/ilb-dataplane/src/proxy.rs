//! The request path: read and classify the request, pick an engine on the installed table,
//! forward, retry on another engine while nothing has reached the client, and stream back.

use crate::body::{ProxyBody, UpstreamBody};
use crate::error::ProxyError;
use crate::server::Shared;
use crate::state::Installed;
use crate::tried::Tried;
use crate::upstream::{Conn, EngineBody, UpstreamRequest};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use ilb_core::affinity::AffinityTable;
use ilb_core::admission::remaining_wait;
use ilb_core::classify::{self, Endpoint};
use ilb_core::priority::{self, Priority};
use ilb_core::table::{within_load_bound, ClassTable, Constraints};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::time::Instant;

// Names as `HeaderName` constants: a lookup by `&str` parses and validates the name each time.
pub const ROUTE_HEADER: HeaderName = HeaderName::from_static("x-ilb-route");
pub const SESSION_HEADERS: [HeaderName; 2] =
    [HeaderName::from_static("x-session-id"), HeaderName::from_static("x-ilb-affinity-key")];
pub const REQUIRE_HEADER: HeaderName = HeaderName::from_static("x-ilb-require");
pub const RESIDENCY_HEADER: HeaderName = HeaderName::from_static("x-ilb-residency");
pub const PRIORITY_HEADER: HeaderName = HeaderName::from_static(priority::HEADER);

/// What the request asked for, read from body and headers.
pub struct Classified<'a> {
    pub endpoint: Endpoint,
    pub model: std::borrow::Cow<'a, str>,
    pub require: Vec<&'a str>,
    pub residency: Option<&'a str>,
    pub priority: Priority,
    pub key_hash: u64,
    /// [`classify::response_key`] of the `previous_response_id` the request continues: the
    /// engine that stored that response is the only one that can serve it.
    pub previous_response: Option<u64>,
}

/// Counts one request against its engine and class from send until the response body ends.
pub struct InFlight {
    shared: Arc<Shared>,
    engine: Arc<crate::engines::EngineState>,
    class: Arc<crate::state::ClassState>,
    /// This class's requests in flight on this engine.
    class_engine: Arc<std::sync::atomic::AtomicU32>,
    started: Instant,
    finished: bool,
}

impl InFlight {
    fn start(shared: &Arc<Shared>, installed: &Installed, class: &ClassTable, candidate: usize) -> InFlight {
        let engine = Arc::clone(&installed.engines[class.candidates[candidate].engine_idx]);
        let class_engine = Arc::clone(&installed.class_engine_in_flight[class.seq][candidate]);
        let class = Arc::clone(&installed.classes[class.seq]);
        engine.in_flight.fetch_add(1, Relaxed);
        engine.counters.attempts.fetch_add(1, Relaxed);
        class.in_flight.fetch_add(1, Relaxed);
        class_engine.fetch_add(1, Relaxed);
        InFlight {
            shared: Arc::clone(shared),
            engine,
            class,
            class_engine,
            started: Instant::now(),
            finished: false,
        }
    }

    pub fn engine_id(&self) -> &str {
        self.engine.id.as_str()
    }

    /// Records how the attempt ended (once); a client that went away records nothing.
    pub fn finish(&mut self, ok: bool) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        self.engine.counters.duration.observe_micros(self.started.elapsed().as_micros() as u64);
        if ok {
            self.engine.record_success();
        } else {
            self.shared.engine_failed(&self.engine);
        }
    }

    /// The response body was read to its end: its connection may carry another request.
    pub fn release_conn(&self, conn: Conn) {
        let shared = &self.shared;
        self.engine.pool.push(conn, shared.pool_clock.ms(), &shared.config.upstream_pool);
    }

    /// A chunk of a streamed response body arrived at `now`; `previous` is when the one before
    /// it did (none for the first). Feeds the first-chunk and chunk-gap figures reported to the
    /// control plane.
    pub fn stream_chunk(&self, previous: Option<Instant>, now: Instant) {
        let counters = &self.engine.counters;
        match previous {
            None => counters.first_chunk.observe_micros(now.duration_since(self.started).as_micros() as u64),
            Some(before) => counters.chunk_gap.observe_micros(now.duration_since(before).as_micros() as u64),
        }
    }

    /// Remembers that this request's engine stored the response `id` (Responses API).
    pub fn remember_response(&self, id: &str, tag: u32, now_s: u32) {
        self.shared.responses.put(classify::response_key(id), tag, now_s);
    }

    fn first_byte(&self) {
        self.engine.counters.ttfb.observe_micros(self.started.elapsed().as_micros() as u64);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.engine.in_flight.fetch_sub(1, Relaxed);
        self.class.in_flight.fetch_sub(1, Relaxed);
        self.class_engine.fetch_sub(1, Relaxed);
        self.shared.waiters.slot_freed();
    }
}

/// Handles one OpenAI request end to end. Hot path.
pub async fn proxy(shared: Arc<Shared>, endpoint: Endpoint, req: Request<Incoming>) -> Response<ProxyBody> {
    match forward(&shared, endpoint, req).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn forward(
    shared: &Arc<Shared>,
    endpoint: Endpoint,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (parts, body) = req.into_parts();
    let body = read_body(shared, &parts.headers, body).await?;
    let request_id = shared.next_request_id();
    let form_model;
    let request = match multipart_boundary(&parts.headers) {
        Some(boundary) => {
            form_model = form_field(&body, boundary, "model").await?.ok_or_else(|| {
                ProxyError::BadRequest("a multipart request must have a 'model' form field".into())
            })?;
            let info = classify::BodyInfo { model: form_model.as_str().into(), ..Default::default() };
            classify_info(endpoint, info, &parts.headers, request_id)?
        }
        None => classify_request(endpoint, &parts.headers, &body, request_id)?,
    };
    let installed = shared.routing.load().ok_or(ProxyError::NoSnapshot)?;
    let model = installed
        .table
        .model(&request.model)
        .ok_or_else(|| ProxyError::UnknownModel(request.model.to_string()))?;
    let constraints = Constraints { require: &request.require, residency: request.residency };
    let class = model.class_for(&constraints);
    let class_state = &installed.classes[class.seq];
    class_state.arrivals.fetch_add(1, Relaxed);
    // Planned shedding: the control plane says this class is over capacity.
    if class_state.priority.arrive(request.priority, request_id) {
        class_state.shed.fetch_add(1, Relaxed);
        return Err(ProxyError::Shed(format!(
            "class '{}' of model '{}' is over capacity and sheds {} priority traffic first",
            class.id,
            model.name,
            request.priority.as_str()
        )));
    }

    shared.budget.record_request(shared.uptime());
    let max_attempts = shared.config.max_attempts.max(1) as usize;
    let mut tried = Tried::default();
    let mut last_error: Option<ProxyError> = None;
    // The last engine error response, passed on as is when no retry is left.
    let mut last_response: Option<(Response<EngineBody>, InFlight)> = None;
    let mut budget_exhausted = false;
    // Read the clock only when a request has to wait for a slot.
    let mut wait_started: Option<Instant> = None;
    loop {
        let now_s = (shared.pool_clock.ms() / 1000) as u32;
        let pinned = request.previous_response.and_then(|key| class.stored_at(&shared.responses, key, now_s));
        let candidate = match choose(
            &installed,
            class,
            &constraints,
            request.key_hash,
            Pick {
                tried: tried.as_slice(),
                pinned,
                affinity: &shared.affinity,
                now_s,
                place_new_by_load: shared.config.place_new_keys_by_load,
            },
        ) {
            Ok(candidate) => {
                class.remember(&shared.affinity, request.key_hash, candidate, now_s);
                candidate
            }
            Err(NoCandidate::Saturated) if last_error.is_none() => {
                // Every usable engine is at its concurrency limit: wait (bounded) for a slot.
                let waited = wait_started.get_or_insert_with(Instant::now).elapsed();
                let config = &shared.config;
                let waiting = shared.waiters.total();
                let Some(remaining) =
                    remaining_wait(request.priority, waited, config.queue_wait, waiting, config.max_waiting)
                else {
                    class_state.overloaded.fetch_add(1, Relaxed);
                    return Err(ProxyError::Overloaded {
                        model: model.name.to_string(),
                        waited_ms: waited.as_millis() as u64,
                    });
                };
                shared.waiters.wait(request.priority, remaining).await;
                continue;
            }
            Err(_) => break,
        };
        if !tried.is_empty() {
            if !shared.budget.try_retry(shared.uptime(), installed.table.utilisation) {
                budget_exhausted = true;
                break;
            }
            // Jittered back-off, deterministic per request: up to 10 ms, doubling per retry.
            let cap_us = 10_000u64 << (tried.len() - 1).min(4);
            let jitter = ilb_core::slots::mix(request_id ^ tried.len() as u64) % cap_us;
            tokio::time::sleep(std::time::Duration::from_micros(jitter)).await;
        }
        tried.push(candidate);
        let engine_idx = class.candidates[candidate].engine_idx;
        let mut in_flight = InFlight::start(shared, &installed, class, candidate);
        let trace: [u8; 55];
        let mut upstream = build_upstream(&installed, engine_idx, &parts.uri, &parts.headers, body.clone())?;
        if shared.config.create_traceparent && !parts.headers.contains_key(&TRACEPARENT) {
            trace = traceparent(shared.trace_seed, request_id);
            upstream.extra = Some((TRACEPARENT, &trace));
        }
        // Named in errors only: built on the failure paths, not per attempt.
        let engine_id = || installed.table.engines[engine_idx].id.to_string();
        let send = crate::upstream::send(
            &installed.engines[engine_idx],
            shared.pool_clock.ms(),
            &shared.config.upstream_pool,
            shared.config.timeouts.connect,
            &shared.engine_tls,
            &upstream,
        );
        match tokio::time::timeout_at(in_flight.started + shared.config.timeouts.first_byte, send).await {
            Ok(Ok(response)) => {
                in_flight.first_byte();
                let status = response.status();
                if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
                    // 429 means busy, not broken: retry elsewhere but do not count it against the engine.
                    in_flight.finish(status == StatusCode::TOO_MANY_REQUESTS);
                    let detail = format!("status {status}");
                    last_error = Some(ProxyError::EngineFailed { engine: engine_id(), detail });
                    last_response = Some((response, in_flight));
                } else {
                    class_state.ok.fetch_add(1, Relaxed);
                    let route = route_header(&installed, class, candidate, tried.len(), false);
                    let stored = (request.endpoint == Endpoint::Responses && status.is_success())
                        .then(|| ResponseStore { tag: class.affinity_tag(candidate), now_s });
                    return Ok(stream_back(shared, response, in_flight, route, stored));
                }
            }
            Ok(Err(e)) => {
                in_flight.finish(false);
                last_error = Some(ProxyError::EngineFailed { engine: engine_id(), detail: error_chain(&e) });
                last_response = None;
            }
            Err(_elapsed) => {
                in_flight.finish(false);
                let timeout_ms = shared.config.timeouts.first_byte.as_millis() as u64;
                last_error = Some(ProxyError::EngineTimeout { engine: engine_id(), timeout_ms });
                last_response = None;
            }
        }
        if tried.len() >= max_attempts {
            break;
        }
    }
    class_state.failed.fetch_add(1, Relaxed);
    if let Some((response, in_flight)) = last_response {
        let candidate = tried.as_slice().last().copied().unwrap_or_default();
        let route = route_header(&installed, class, candidate, tried.len(), budget_exhausted);
        return Ok(stream_back(shared, response, in_flight, route, None));
    }
    match last_error {
        Some(ProxyError::EngineFailed { engine, detail }) if budget_exhausted => {
            Err(ProxyError::EngineFailed {
                engine,
                detail: format!("{detail}; not retried: retry budget exhausted"),
            })
        }
        Some(error) => Err(error),
        None => Err(ProxyError::NoHealthyEngine {
            model: request.model.to_string(),
            detail: if constraints.is_empty() {
                String::new()
            } else {
                " satisfying the request's constraints".into()
            },
        }),
    }
}

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// A W3C trace context for a request that came without one: version 00, a 128-bit trace id and a
/// 64-bit parent id derived from this process's seed and the request id, sampled. Plain bytes
/// (lowercase hex and dashes, a valid header value): a `HeaderValue` would copy them to the heap.
fn traceparent(seed: u64, request_id: u64) -> [u8; 55] {
    let hi = ilb_core::slots::mix(seed ^ request_id);
    let lo = ilb_core::slots::mix(hi ^ 0x7472_6163_6569_6421);
    let span = ilb_core::slots::mix(lo ^ request_id).max(1);
    // 00-<32 hex>-<16 hex>-01, written in place (no formatting machinery on the hot path).
    let mut out = *b"00-00000000000000000000000000000000-0000000000000000-01";
    write_hex(&mut out[3..19], hi);
    write_hex(&mut out[19..35], lo);
    write_hex(&mut out[36..52], span);
    out
}

/// Writes `value` as lowercase hex, most significant digit first, filling `out` (16 bytes).
fn write_hex(out: &mut [u8], value: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in out.iter_mut().rev().enumerate() {
        *byte = DIGITS[((value >> (4 * i)) & 0xf) as usize];
    }
}

/// Why no candidate could be picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoCandidate {
    /// Usable engines exist but every one is at its `max_in_flight`.
    Saturated,
    /// No engine is usable: all ejected, already tried, or failing the constraints.
    Unavailable,
}

/// What a pick takes besides the class and the key.
pub(crate) struct Pick<'a> {
    /// Candidates already tried by this request.
    pub tried: &'a [usize],
    /// The candidate that must serve the request if it can (the engine that stored the
    /// response it continues), whatever its weight and load bound.
    pub pinned: Option<usize>,
    pub affinity: &'a AffinityTable,
    pub now_s: u32,
    /// Place keys the affinity table has never seen by load (`place_new_keys_by_load`).
    pub place_new_by_load: bool,
}

/// Picks a candidate: the pinned one if it is usable, else weighted consistent hashing on the
/// key, skipping engines that fail the request's constraints, are ejected, were already tried,
/// or are full; first with the load bound, then without it. Hot path.
pub(crate) fn choose(
    installed: &Installed,
    class: &ClassTable,
    constraints: &Constraints<'_>,
    key_hash: u64,
    pick: Pick<'_>,
) -> Result<usize, NoCandidate> {
    let Pick { tried, pinned, affinity, now_s, place_new_by_load } = pick;
    let class_load = installed.classes[class.seq].in_flight.load(Relaxed) as f64;
    let healthy = |candidate: usize| {
        let c = &class.candidates[candidate];
        !tried.contains(&candidate)
            && !installed.engines[c.engine_idx].is_ejected()
            && !installed.engines[c.engine_idx].is_held()
            && (constraints.is_empty() || constraints.allow(&installed.table.engines[c.engine_idx]))
    };
    let has_room = |candidate: usize| {
        let c = &class.candidates[candidate];
        let limit = installed.table.engines[c.engine_idx].max_in_flight;
        limit == 0 || installed.engines[c.engine_idx].in_flight.load(Relaxed) < limit
    };
    // The bound compares like with like: this class's requests on the candidate against the
    // class's share there (the engine's own count also holds other classes').
    let class_engine = &installed.class_engine_in_flight[class.seq];
    let bounded = |candidate: usize| {
        let c = &class.candidates[candidate];
        let in_flight = class_engine[candidate].load(Relaxed) as f64;
        within_load_bound(in_flight, c.weight, class_load) && healthy(candidate) && has_room(candidate)
    };
    if let Some(c) = pinned.filter(|&c| healthy(c)) {
        // Only this engine has the stored response: wait for its room rather than go elsewhere.
        return if has_room(c) { Ok(c) } else { Err(NoCandidate::Saturated) };
    }
    // A conversation stays on the engine that holds its KV cache while that engine keeps a
    // weight and room; only then does the hash decide.
    let load = |candidate: usize| class_engine[candidate].load(Relaxed) as f64;
    let new_by_load: Option<&dyn Fn(usize) -> f64> = place_new_by_load.then_some(&load);
    if let Some(c) =
        class.select(key_hash, affinity, now_s, bounded, |c| healthy(c) && has_room(c), new_by_load)
    {
        return Ok(c);
    }
    if class.pick(key_hash, healthy).is_some() {
        Err(NoCandidate::Saturated)
    } else {
        Err(NoCandidate::Unavailable)
    }
}

async fn read_body(shared: &Shared, headers: &HeaderMap, body: Incoming) -> Result<Bytes, ProxyError> {
    let limit = shared.config.max_body_bytes;
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let mut collect = std::pin::pin!(collect_limited(body, limit));
    // Small bodies usually arrived with the head: try once before arming a timer.
    match futures_util::FutureExt::now_or_never(collect.as_mut()) {
        Some(result) => result,
        None => match tokio::time::timeout(shared.config.timeouts.client_body, collect).await {
            Ok(result) => result,
            Err(_) => Err(ProxyError::BodyTimeout),
        },
    }
}

/// The whole body, at most `limit` bytes. A body that arrives as one frame (a small one read
/// with its head) is passed on as it is: no list of frames, no copy.
async fn collect_limited(mut body: Incoming, limit: usize) -> Result<Bytes, ProxyError> {
    let mut first: Option<Bytes> = None;
    let mut joined: Option<bytes::BytesMut> = None;
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ProxyError::BadRequest(format!("could not read the request body: {e}")))?;
        // Trailers carry nothing routing or the engine request needs; they are dropped, as
        // collecting into bytes did.
        let Ok(data) = frame.into_data() else { continue };
        len += data.len();
        if len > limit {
            return Err(ProxyError::BodyTooLarge { limit });
        }
        match (&mut first, &mut joined) {
            (None, None) => first = Some(data),
            (Some(_), None) => {
                let mut buf = bytes::BytesMut::with_capacity(len);
                buf.extend_from_slice(first.take().as_deref().unwrap_or_default());
                buf.extend_from_slice(&data);
                joined = Some(buf);
            }
            (_, Some(buf)) => buf.extend_from_slice(&data),
        }
    }
    Ok(match joined {
        Some(buf) => buf.freeze(),
        None => first.unwrap_or_default(),
    })
}

/// Reads model, constraints, priority and affinity key. `request_id` seeds the affinity of
/// requests that carry nothing to hash.
pub fn classify_request<'a>(
    endpoint: Endpoint,
    headers: &'a HeaderMap,
    body: &'a [u8],
    request_id: u64,
) -> Result<Classified<'a>, ProxyError> {
    let info = classify::parse_body(endpoint, body).map_err(|e| ProxyError::BadRequest(e.to_string()))?;
    classify_info(endpoint, info, headers, request_id)
}

/// [`classify_request`] on a body already read (a JSON body, or a multipart form's fields).
fn classify_info<'a>(
    endpoint: Endpoint,
    info: classify::BodyInfo<'a>,
    headers: &'a HeaderMap,
    request_id: u64,
) -> Result<Classified<'a>, ProxyError> {
    let header_str = |name: &HeaderName| -> Result<Option<&'a str>, ProxyError> {
        match headers.get(name) {
            None => Ok(None),
            Some(v) => v
                .to_str()
                .map(Some)
                .map_err(|_| ProxyError::BadRequest(format!("header {name} is not visible ascii"))),
        }
    };
    let require = match header_str(&REQUIRE_HEADER)? {
        Some(h) => classify::parse_require(h).map_err(|e| ProxyError::BadRequest(e.to_string()))?,
        None => Vec::new(),
    };
    let residency = header_str(&RESIDENCY_HEADER)?.map(str::trim).filter(|r| !r.is_empty());
    let priority = Priority::from_header(header_str(&PRIORITY_HEADER)?)
        .map_err(|e| ProxyError::BadRequest(e.to_string()))?;
    let mut session = None;
    for name in &SESSION_HEADERS {
        if let Some(v) = header_str(name)? {
            session = Some(v);
            break;
        }
    }
    let key_hash = classify::affinity_hash(session, &info, ilb_core::slots::mix(request_id));
    let previous_response = info.previous_response_id.as_deref().map(classify::response_key);
    Ok(Classified { endpoint, model: info.model, require, residency, priority, key_hash, previous_response })
}

/// The boundary of a `multipart/form-data` body (audio transcriptions and translations), or
/// `None` for any other content type.
fn multipart_boundary(headers: &HeaderMap) -> Option<String> {
    let content_type = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    multer::parse_boundary(content_type).ok()
}

/// The text of a multipart form's field `name`, read from the buffered body with `multer`.
async fn form_field(body: &Bytes, boundary: String, name: &str) -> Result<Option<String>, ProxyError> {
    let bad = |e: multer::Error| ProxyError::BadRequest(format!("malformed multipart body: {e}"));
    let whole = futures_util::stream::iter([Ok::<Bytes, std::convert::Infallible>(body.clone())]);
    let mut form = multer::Multipart::new(whole, boundary);
    while let Some(field) = form.next_field().await.map_err(bad)? {
        if field.name() == Some(name) {
            return field.text().await.map(Some).map_err(bad);
        }
    }
    Ok(None)
}

fn build_upstream<'a>(
    installed: &'a Installed,
    engine_idx: usize,
    uri: &Uri,
    headers: &'a HeaderMap,
    body: Bytes,
) -> Result<UpstreamRequest<'a>, ProxyError> {
    let engine = &installed.engines[engine_idx];
    let target = engine
        .upstream_uri(uri.path_and_query())
        .map_err(|e| ProxyError::BadRequest(format!("request path cannot be forwarded: {e}")))?;
    // Hop-by-hop headers are left out as the request is written (`upstream` owns the wire).
    Ok(UpstreamRequest {
        method: Method::POST,
        uri: target,
        host: engine.host_header(),
        headers,
        extra: None,
        body,
    })
}

/// The `x-ilb-route` value: prebuilt at install for a first try (hot path), formatted otherwise.
fn route_header(
    installed: &Installed,
    class: &ClassTable,
    candidate: usize,
    attempts: usize,
    budget_exhausted: bool,
) -> HeaderValue {
    let Some(route) = installed.routes.get(class.seq).and_then(|r| r.get(candidate)) else {
        return HeaderValue::from_static("engine=?");
    };
    if attempts == 1 && !budget_exhausted {
        return route.first_try.clone();
    }
    let mut value = format!("{}{attempts}", route.prefix);
    if budget_exhausted {
        value.push_str("; retry=budget-exhausted");
    }
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("engine=?"))
}

/// Where to remember the id of a response an engine stores (a successful Responses request).
pub struct ResponseStore {
    /// The engine's affinity tag.
    pub tag: u32,
    pub now_s: u32,
}

fn stream_back(
    shared: &Shared,
    response: Response<EngineBody>,
    in_flight: InFlight,
    route: HeaderValue,
    stored: Option<ResponseStore>,
) -> Response<ProxyBody> {
    let (mut parts, body) = response.into_parts();
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("text/event-stream"));
    // Hop-by-hop headers were removed as the head was read (`upstream`).
    parts.headers.insert(ROUTE_HEADER, route);
    let mut body = UpstreamBody::new(body, shared.config.timeouts.idle, sse, in_flight);
    if let Some(stored) = stored {
        body.learn_response_id(stored);
    }
    Response::from_parts(parts, ProxyBody::Upstream(Box::new(body)))
}

/// The error and its causes on one line (top-level messages are terse).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
