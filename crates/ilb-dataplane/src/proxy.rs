//! The request path, top to bottom: read and classify the request, admit it (planned
//! shedding, `admission`), then the attempt loop (pick an engine, `pick`; wait for a slot when
//! all are full, `admission`; ask the retry budget before a retry, `budget`; send, and judge the
//! answer, `engines`), then respond: stream the engine's answer back, or the last failure.
//! A retry happens only while nothing has reached the client.

use crate::admission;
use crate::body::{ProxyBody, ResponseStore, UpstreamBody};
use crate::config::RouteHeader;
use crate::engines::{Answer, Outcome};
use crate::error::{error_chain, ProxyError};
use crate::in_flight::InFlight;
use crate::pick::{choose, NoCandidate, Pick};
use crate::shared::Shared;
use crate::state::{ClassState, Installed};
use crate::tried::Tried;
use crate::upstream::{EngineBody, UpstreamRequest};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use ilb_core::classify::{self, Endpoint};
use ilb_core::priority::{self, Priority};
use ilb_core::table::{ClassTable, Constraints};
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

/// Handles one OpenAI request end to end. Hot path.
pub async fn proxy(shared: Arc<Shared>, endpoint: Endpoint, req: Request<Incoming>) -> Response<ProxyBody> {
    match forward(&shared, endpoint, req).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

/// Read and classify, admit (planned shedding), then the attempt loop, then the answer: the
/// first engine response to pass on, or the last failure.
async fn forward(
    shared: &Arc<Shared>,
    endpoint: Endpoint,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (mut parts, body) = req.into_parts();
    let body = read_body(shared, &mut parts.headers, body).await?;
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
    let routed = Routed {
        shared,
        installed: &installed,
        model: &model.name,
        class,
        class_state: &installed.classes[class.seq],
        constraints: &constraints,
        request: &request,
        request_id,
        parts: &parts,
        body: &body,
    };
    routed.admit()?;
    shared.budget.record_request(shared.uptime());
    match routed.attempts().await? {
        Ended::Served(response) => Ok(response),
        Ended::Failed(failed) => routed.give_up(failed),
    }
}

/// One classified request on the installed table, between admission and its answer.
struct Routed<'r, 'a> {
    shared: &'r Arc<Shared>,
    installed: &'r Installed,
    model: &'r ilb_core::ModelName,
    class: &'r ClassTable,
    class_state: &'r ClassState,
    constraints: &'r Constraints<'a>,
    request: &'r Classified<'a>,
    request_id: u64,
    parts: &'r http::request::Parts,
    body: &'r Bytes,
}

/// How the attempt loop ended.
enum Ended {
    /// An engine's answer, on its way to the client.
    Served(Response<ProxyBody>),
    /// No attempt left, no engine left, or the retry budget spent (boxed: the failure path
    /// only).
    Failed(Box<Failed>),
}

/// What the attempts of a request that got no answer to pass on left behind.
#[derive(Default)]
struct Failed {
    tried: Tried,
    last_error: Option<ProxyError>,
    /// The last engine error response, passed on as is when no retry is left.
    last_response: Option<(Response<EngineBody>, InFlight)>,
    budget_exhausted: bool,
}

/// How one attempt went.
enum Attempt {
    Served(Response<ProxyBody>),
    /// The engine failed, timed out or answered with a retryable status (that answer kept).
    Failed {
        error: ProxyError,
        response: Option<(Response<EngineBody>, InFlight)>,
    },
}

impl Routed<'_, '_> {
    /// Planned shedding: the control plane says this class is over capacity
    /// ([`admission::arrive`]).
    fn admit(&self) -> Result<(), ProxyError> {
        admit(self.class_state, self.class, self.model, self.request.priority, self.request_id)
    }

    /// Picks an engine, waits for a slot when all are full, asks the retry budget before each
    /// retry, and sends; until an answer passes or no attempt is left.
    async fn attempts(&self) -> Result<Ended, ProxyError> {
        let shared = self.shared;
        let max_attempts = shared.config.max_attempts.max(1) as usize;
        let mut failed = Failed::default();
        // Read the clock only when a request has to wait for a slot.
        let mut wait_started: Option<Instant> = None;
        loop {
            let now_s = (shared.pool_clock.ms() / 1000) as u32;
            let candidate = match self.pick(failed.tried.as_slice(), now_s) {
                Ok(candidate) => candidate,
                Err(NoCandidate::Saturated) if failed.last_error.is_none() => {
                    // Every usable engine is at its concurrency limit: wait (bounded) for a slot.
                    let wait = admission::wait_for_slot(
                        &shared.waiters,
                        &shared.config,
                        self.request.priority,
                        &mut wait_started,
                    );
                    if let Err(waited) = wait.await {
                        self.class_state.overloaded.fetch_add(1, Relaxed);
                        let waited_ms = waited.as_millis() as u64;
                        return Err(ProxyError::Overloaded { model: self.model.to_string(), waited_ms });
                    }
                    continue;
                }
                Err(_) => break,
            };
            if !failed.tried.is_empty() {
                let utilisation = self.installed.table.utilisation;
                let tried = failed.tried.len();
                match shared.budget.retry(shared.uptime(), utilisation, self.request_id, tried) {
                    Some(backoff) => tokio::time::sleep(backoff).await,
                    None => {
                        failed.budget_exhausted = true;
                        break;
                    }
                }
            }
            failed.tried.push(candidate);
            match self.attempt(candidate, failed.tried.len(), now_s).await? {
                Attempt::Served(response) => return Ok(Ended::Served(response)),
                Attempt::Failed { error, response } => {
                    failed.last_error = Some(error);
                    failed.last_response = response;
                }
            }
            if failed.tried.len() >= max_attempts {
                break;
            }
        }
        Ok(Ended::Failed(Box::new(failed)))
    }

    /// The candidate for the next attempt ([`choose`]); remembered for the request's
    /// affinity key.
    fn pick(&self, tried: &[usize], now_s: u32) -> Result<usize, NoCandidate> {
        let target =
            ClassTarget { installed: self.installed, class: self.class, constraints: self.constraints };
        pick(self.shared, target, self.request, tried, now_s)
    }

    /// Sends the request to `candidate` (the `attempts`-th attempt) and judges the answer
    /// ([`Answer::of`]).
    async fn attempt(&self, candidate: usize, attempts: usize, now_s: u32) -> Result<Attempt, ProxyError> {
        let (shared, installed, class) = (self.shared, self.installed, self.class);
        let target = Target { installed, class, candidate };
        let (response, mut in_flight) =
            match send_once(shared, target, Method::POST, self.parts, self.body, self.request_id).await? {
                Ok(sent) => sent,
                Err(failed) => return Ok(Attempt::Failed { error: failed, response: None }),
            };
        let status = response.status();
        let answer = Answer::of(status);
        if answer == Answer::Serve {
            self.class_state.ok.fetch_add(1, Relaxed);
            let route = route_header(shared, installed, class, candidate, attempts, false);
            let stored = (self.request.endpoint == Endpoint::Responses && status.is_success())
                .then(|| ResponseStore { tag: class.affinity_tag(candidate), now_s });
            return Ok(Attempt::Served(stream_back(shared, response, in_flight, route, stored)));
        }
        in_flight.finish(Outcome::Answered(status));
        let engine = installed.table.engines[class.candidates[candidate].engine_idx].id.to_string();
        let error = ProxyError::EngineFailed { engine, detail: format!("status {status}") };
        Ok(Attempt::Failed { error, response: Some((response, in_flight)) })
    }

    /// No answer to pass on as a success: the last engine error response as it is, else the
    /// last error (saying when the retry budget stopped the retries), else no healthy engine.
    fn give_up(&self, failed: Box<Failed>) -> Result<Response<ProxyBody>, ProxyError> {
        self.class_state.failed.fetch_add(1, Relaxed);
        let Failed { tried, last_error, last_response, budget_exhausted } = *failed;
        if let Some((response, in_flight)) = last_response {
            let candidate = tried.as_slice().last().copied().unwrap_or_default();
            let route = route_header(
                self.shared,
                self.installed,
                self.class,
                candidate,
                tried.len(),
                budget_exhausted,
            );
            return Ok(stream_back(self.shared, response, in_flight, route, None));
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
                model: self.request.model.to_string(),
                detail: if self.constraints.is_empty() {
                    String::new()
                } else {
                    " satisfying the request's constraints".into()
                },
            }),
        }
    }
}

/// Planned shedding: the control plane says this class is over capacity
/// ([`admission::arrive`]). Counts the arrival; a shed request is counted and refused (429).
/// The proxy and the endpoint picker (`router`) admit through this one function.
pub(crate) fn admit(
    class_state: &ClassState,
    class: &ClassTable,
    model: &ilb_core::ModelName,
    priority: Priority,
    request_id: u64,
) -> Result<(), ProxyError> {
    class_state.arrivals.fetch_add(1, Relaxed);
    if !admission::arrive(&class_state.priority, priority, request_id) {
        return Ok(());
    }
    class_state.shed.fetch_add(1, Relaxed);
    let share = admission::shed_probability(&class_state.priority, priority);
    Err(ProxyError::Shed(format!(
        "class '{}' of model '{}' is over capacity and sheds {} of its {} priority requests{}",
        class.id,
        model,
        if share >= 1.0 { "all".to_owned() } else { format!("{:.0} %", share * 100.0) },
        priority.as_str(),
        if priority == ilb_core::priority::Priority::Low { "" } else { " (lower priorities first)" },
    )))
}

/// A request's class on the installed table, and the constraints it was chosen for.
#[derive(Clone, Copy)]
pub(crate) struct ClassTarget<'a> {
    pub installed: &'a Installed,
    pub class: &'a ClassTable,
    pub constraints: &'a Constraints<'a>,
}

/// The candidate for a request's next attempt ([`choose`]): the engine that stored the response
/// it continues if that one can serve, else the remembered or hashed engine; remembered for the
/// request's affinity key. The proxy and the endpoint picker (`router`) pick through this one
/// function. Hot path.
pub(crate) fn pick(
    shared: &Shared,
    target: ClassTarget<'_>,
    request: &Classified<'_>,
    tried: &[usize],
    now_s: u32,
) -> Result<usize, NoCandidate> {
    let ClassTarget { installed, class, constraints } = target;
    let pinned = request.previous_response.and_then(|key| class.stored_at(&shared.responses, key, now_s));
    let pick = Pick {
        tried,
        pinned,
        affinity: &shared.affinity,
        now_s,
        place_new_by_load: shared.config.place_new_keys_by_load,
    };
    let candidate = choose(installed, class, constraints, request.key_hash, pick)?;
    class.remember(&shared.affinity, request.key_hash, candidate, now_s);
    Ok(candidate)
}

/// One engine of one class of the installed table: where an attempt goes.
#[derive(Clone, Copy)]
pub(crate) struct Target<'a> {
    pub installed: &'a Installed,
    pub class: &'a ClassTable,
    pub candidate: usize,
}

/// Sends the client's request (`method`, its path and headers, `body`) to `target`'s engine
/// once, counted in flight from now: its response head and the in-flight guard that its body
/// takes over; or, when no head came in time, the error (the attempt already recorded as
/// [`Outcome::NoAnswer`]). Hot path.
pub(crate) async fn send_once(
    shared: &Arc<Shared>,
    target: Target<'_>,
    method: Method,
    parts: &http::request::Parts,
    body: &Bytes,
    request_id: u64,
) -> Result<Result<(Response<EngineBody>, InFlight), ProxyError>, ProxyError> {
    let Target { installed, class, candidate } = target;
    let engine_idx = class.candidates[candidate].engine_idx;
    let mut in_flight = InFlight::start(shared, installed, class, candidate);
    let trace: [u8; 55];
    let headers = &parts.headers;
    let mut upstream = build_upstream(installed, engine_idx, method, &parts.uri, headers, body.clone())?;
    if shared.config.create_traceparent && !headers.contains_key(&TRACEPARENT) {
        trace = traceparent(shared.trace_seed, request_id);
        upstream.extra = Some((TRACEPARENT, &trace));
    }
    // Named in errors only: built on the failure paths, not per attempt.
    let engine_id = || installed.table.engines[engine_idx].id.to_string();
    let engine = &installed.engines[engine_idx];
    let config = &shared.config;
    let send = crate::upstream::send(
        &engine.pool,
        &engine.origin,
        shared.pool_clock.ms(),
        &config.upstream_pool,
        config.timeouts.connect,
        &shared.engine_tls,
        &upstream,
    );
    let error = match tokio::time::timeout_at(in_flight.started + config.timeouts.first_byte, send).await {
        Ok(Ok(response)) => {
            in_flight.first_byte();
            return Ok(Ok((response, in_flight)));
        }
        Ok(Err(e)) => ProxyError::EngineFailed { engine: engine_id(), detail: error_chain(&e) },
        Err(_elapsed) => {
            let timeout_ms = config.timeouts.first_byte.as_millis() as u64;
            ProxyError::EngineTimeout { engine: engine_id(), timeout_ms }
        }
    };
    in_flight.finish(Outcome::NoAnswer);
    Ok(Err(error))
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

/// The request body, at most `max_body_bytes`, decoded when it came compressed ([`decode`]).
pub(crate) async fn read_body(
    shared: &Shared,
    headers: &mut HeaderMap,
    body: Incoming,
) -> Result<Bytes, ProxyError> {
    let limit = shared.config.max_body_bytes;
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let mut collect = std::pin::pin!(collect_limited(body, limit));
    // Small bodies usually arrived with the head: try once before arming a timer.
    let body = match futures_util::FutureExt::now_or_never(collect.as_mut()) {
        Some(result) => result,
        None => match tokio::time::timeout(shared.config.timeouts.client_body, collect).await {
            Ok(result) => result,
            Err(_) => Err(ProxyError::BodyTimeout),
        },
    }?;
    decode(headers, body, limit)
}

/// A body sent with `Content-Encoding: gzip` (or `x-gzip`) or `deflate`, decoded with `flate2`
/// and at most `limit` bytes once decoded (a small compressed body can grow to any size); its
/// `Content-Encoding` header is removed, since the engine gets the decoded bytes. `identity`
/// passes; any other encoding, or a list of them, is refused (415). Hot path: one header
/// lookup when the body is not compressed.
pub(crate) fn decode(headers: &mut HeaderMap, body: Bytes, limit: usize) -> Result<Bytes, ProxyError> {
    use std::io::Read;
    let mut encodings = headers.get_all(header::CONTENT_ENCODING).iter();
    let Some(first) = encodings.next() else { return Ok(body) };
    let unsupported = |what: &str| {
        ProxyError::UnsupportedEncoding(format!(
            "request content-encoding {what} is not supported; send the body plain, gzip or deflate"
        ))
    };
    if encodings.next().is_some() {
        return Err(unsupported("with several values"));
    }
    let encoding = first.to_str().map_err(|_| unsupported("that is not ascii"))?.trim().to_ascii_lowercase();
    let mut decoded = Vec::new();
    let read = match encoding.as_str() {
        "identity" => return Ok(body),
        "gzip" | "x-gzip" => {
            flate2::read::MultiGzDecoder::new(&body[..]).take(limit as u64 + 1).read_to_end(&mut decoded)
        }
        "deflate" => {
            flate2::read::ZlibDecoder::new(&body[..]).take(limit as u64 + 1).read_to_end(&mut decoded)
        }
        _ => return Err(unsupported(&format!("{encoding:?}"))),
    };
    read.map_err(|e| ProxyError::BadRequest(format!("request body is not valid {encoding}: {e}")))?;
    if decoded.len() > limit {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    headers.remove(header::CONTENT_ENCODING);
    Ok(Bytes::from(decoded))
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
pub(crate) fn classify_info<'a>(
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
pub(crate) fn multipart_boundary(headers: &HeaderMap) -> Option<String> {
    let content_type = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    multer::parse_boundary(content_type).ok()
}

/// The text of a multipart form's field `name`, read from the buffered body with `multer`.
pub(crate) async fn form_field(
    body: &Bytes,
    boundary: String,
    name: &str,
) -> Result<Option<String>, ProxyError> {
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
    method: Method,
    uri: &Uri,
    headers: &'a HeaderMap,
    body: Bytes,
) -> Result<UpstreamRequest<'a>, ProxyError> {
    let engine = &installed.engines[engine_idx];
    let target = engine
        .origin
        .upstream_uri(uri.path_and_query())
        .map_err(|e| ProxyError::BadRequest(format!("request path cannot be forwarded: {e}")))?;
    // Hop-by-hop headers are left out as the request is written (`upstream` owns the wire).
    Ok(UpstreamRequest { method, uri: target, host: engine.origin.host_header(), headers, extra: None, body })
}

/// The `x-ilb-route` value in the configured detail, or none (`RouteHeader::Off`): prebuilt at
/// install for a first try (hot path), formatted otherwise.
pub(crate) fn route_header(
    shared: &Shared,
    installed: &Installed,
    class: &ClassTable,
    candidate: usize,
    attempts: usize,
    budget_exhausted: bool,
) -> Option<HeaderValue> {
    let detail = shared.config.route_header;
    if detail == RouteHeader::Off {
        return None;
    }
    let Some(route) = installed.routes.get(class.seq).and_then(|r| r.get(candidate)) else {
        return Some(HeaderValue::from_static("engine=?"));
    };
    let (prefix, first_try) = match detail {
        RouteHeader::Full => (&route.prefix, &route.first_try),
        _ => (&route.id_prefix, &route.id_first_try),
    };
    if attempts == 1 && !budget_exhausted {
        return Some(first_try.clone());
    }
    let mut value = format!("{prefix}{attempts}");
    if budget_exhausted {
        value.push_str("; retry=budget-exhausted");
    }
    Some(HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("engine=?")))
}

pub(crate) fn stream_back(
    shared: &Shared,
    response: Response<EngineBody>,
    in_flight: InFlight,
    route: Option<HeaderValue>,
    stored: Option<ResponseStore>,
) -> Response<ProxyBody> {
    let (mut parts, body) = response.into_parts();
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("text/event-stream"));
    // Hop-by-hop headers were removed as the head was read (`upstream`).
    if let Some(route) = route {
        parts.headers.insert(ROUTE_HEADER, route);
    }
    let mut body = UpstreamBody::new(body, parts.status, shared.config.timeouts.idle, sse, in_flight);
    if let Some(stored) = stored {
        body.learn_response_id(stored);
    }
    Response::from_parts(parts, ProxyBody::Upstream(Box::new(body)))
}

#[cfg(test)]
mod tests {
    //! ARCHITECTURE.md's one-load rule, counted: a request reads the installed state once, and
    //! once more for each failed attempt that may eject its engine (to apply the ejection cap
    //! to the current table).

    use crate::{DataPlane, DataPlaneConfig, SnapshotSource};
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::{connect::HttpConnector, Client};
    use hyper_util::rt::TokioExecutor;
    use std::sync::atomic::Ordering::Relaxed;

    #[tokio::test]
    async fn a_request_loads_the_installed_state_once_and_again_per_failed_attempt() {
        let config = ilb_engine_sim::EngineConfig {
            id: ilb_core::EngineId::new("live"),
            model: ilb_core::ModelName::new("m"),
            ..ilb_engine_sim::EngineConfig::default()
        };
        let live = ilb_engine_sim::spawn(config, "127.0.0.1:0".parse().unwrap()).await.unwrap();
        // A port nobody listens on: every attempt there fails at connect.
        let dead = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", listener.local_addr().unwrap())
        };
        let snapshot = format!(
            r#"{{"format": 1, "version": 1, "created_unix_ms": 0, "cluster": "a",
                "engines": [{{"id": "live", "url": "{}"}}, {{"id": "dead", "url": "{dead}"}}],
                "models": [{{"model": "m", "classes": [{{"id": "default", "weights": [
                    {{"engine": "live", "weight": 1}}, {{"engine": "dead", "weight": 1}}]}}]}}]}}"#,
            live.url()
        );
        let mut config = DataPlaneConfig::new("127.0.0.1:0".parse().unwrap());
        // Every failure may eject, so every failed attempt reads the table again.
        config.guard.consecutive_failures = 1;
        let dp = DataPlane::start(config, SnapshotSource::Manual).await.unwrap();
        dp.install(&ilb_core::snapshot::Snapshot::from_json(snapshot.as_bytes()).unwrap()).unwrap();
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build(HttpConnector::new());

        let requests = 40;
        let before = dp.shared.routing.request_loads.load(Relaxed);
        let mut failed_attempts = 0;
        for n in 0..requests {
            let stream = if n % 2 == 0 { r#","stream":true"# } else { "" };
            let body = format!(
                r#"{{"model":"m","messages":[{{"role":"user","content":"hi {n}"}}],"max_tokens":3{stream}}}"#
            );
            let request = http::Request::post(format!("{}/v1/chat/completions", dp.url()))
                .header("content-type", "application/json")
                .header("x-session-id", format!("s{n}"))
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            let response = client.request(request).await.unwrap();
            assert!(response.status().is_success(), "request {n}: {}", response.status());
            let route = response.headers()[super::ROUTE_HEADER].to_str().unwrap().to_owned();
            let attempts: usize = route.split("attempts=").nth(1).unwrap()[..1].parse().unwrap();
            failed_attempts += attempts - 1;
            response.into_body().collect().await.unwrap();
        }
        let loads = dp.shared.routing.request_loads.load(Relaxed) - before;
        assert!(failed_attempts > 0, "no request tried the dead engine");
        assert_eq!(loads, requests + failed_attempts, "{failed_attempts} failed attempts");
    }
}
