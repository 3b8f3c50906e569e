//! The response body the data plane sends to clients: either a small local body, or an
//! engine's body streamed through frame by frame as it arrives (never buffered).
//!
//! An engine's body is read from its connection by the client connection's own task as hyper
//! polls it ([`EngineBody`]); when it ends cleanly the connection goes back to its engine's
//! pool, and when the client goes away first the body, and with it the connection, is dropped,
//! which tells the engine to stop. The streamed body owns the request's [`InFlight`] guard
//! (`in_flight.rs`), so
//! an engine's in-flight count drops when the stream *ends* (or the client goes away), not
//! when headers arrive. It also enforces the idle gap between chunks, and turns a broken
//! engine stream into a well-formed SSE error event followed by a clean end, so a streaming
//! client sees an error instead of a hang.

use crate::clock;
use crate::engines::Outcome;
use crate::error::ProxyError;
use crate::in_flight::InFlight;
use crate::upstream::EngineBody;
use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use memchr::memmem::Finder;
use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub enum ProxyBody {
    Local(Option<Bytes>),
    /// Boxed: measured cheaper than moving the whole body through hyper's layers by value,
    /// although it costs an allocation per response.
    Upstream(Box<UpstreamBody>),
}

impl From<Bytes> for ProxyBody {
    fn from(b: Bytes) -> Self {
        ProxyBody::Local(Some(b))
    }
}

impl ProxyBody {
    pub fn empty() -> Self {
        ProxyBody::Local(None)
    }
}

/// A local JSON answer (`/v1/models`, `/health`, `/debug/route`).
pub fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::from(Bytes::from(value.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Where to remember the id of a response an engine stores (a successful Responses request).
pub struct ResponseStore {
    /// The engine's affinity tag.
    pub tag: u32,
    pub now_s: u32,
}

pub struct UpstreamBody {
    inner: EngineBody,
    /// Armed on the first `Pending` only: most small responses complete without ever waiting,
    /// and then no timer is registered at all. Never moved per chunk: when it fires, it is
    /// moved to `idle_timeout` after `last_data` if data came since it was set.
    idle: Option<Pin<Box<Sleep>>>,
    /// The waker the idle timer was last polled with.
    idle_waker: Option<Waker>,
    idle_timeout: Duration,
    /// When the last data arrived, read only once the idle timer is armed (or for the chunk
    /// figures of a stream, from the same clock read).
    last_data: Instant,
    sse: bool,
    /// Whether everything forwarded so far ends at an SSE event boundary.
    at_boundary: bool,
    done: bool,
    /// When the last chunk of a streamed body arrived (SSE only), for the chunk-gap figures.
    last_chunk: Option<Instant>,
    in_flight: InFlight,
    /// The engine's status, for the guard's verdict when the body ends.
    status: StatusCode,
    /// Looks for the id of the response the engine stores, until it is found.
    response_id: Option<Box<ResponseIdReader>>,
    /// The answer's generated tokens, as its bytes tell.
    tokens: TokenCount,
}

impl UpstreamBody {
    pub fn new(
        inner: EngineBody,
        status: StatusCode,
        idle_timeout: Duration,
        sse: bool,
        in_flight: InFlight,
    ) -> Self {
        let mut body = UpstreamBody {
            status,
            inner,
            idle: None,
            idle_waker: None,
            idle_timeout,
            // Set again when the idle timer is armed; no clock read for a response that never waits.
            last_data: in_flight.started,
            sse,
            at_boundary: true,
            done: false,
            last_chunk: None,
            in_flight,
            response_id: None,
            tokens: TokenCount::default(),
        };
        if body.inner.is_end_stream() {
            // An empty body (length 0): hyper will not poll it at all.
            body.end();
        }
        body
    }

    /// Reads the id of the response this body carries (a Responses API answer, streamed or
    /// not) as it passes, and remembers that its engine stored it. The bytes go to the client
    /// unchanged and undelayed; a copy of the first [`RESPONSE_ID_WINDOW`] bytes is kept
    /// until the id is found.
    pub fn learn_response_id(&mut self, store: ResponseStore) {
        if !self.done {
            self.response_id = Some(ResponseIdReader::new(store, self.sse));
        }
    }

    fn read_response_id(&mut self, data: &[u8], ended: bool) {
        ResponseIdReader::read(&mut self.response_id, data, ended, &self.in_flight);
    }

    /// The engine's body ended cleanly: count the success and free its connection for reuse.
    fn end(&mut self) {
        self.read_response_id(&[], true);
        self.done = true;
        if let Some(tokens) = self.tokens.tokens().filter(|_| self.status.is_success()) {
            self.in_flight.answered_tokens(tokens);
        }
        self.in_flight.finish(Outcome::Answered(self.status));
        if let Some(conn) = self.inner.take_reusable_conn() {
            self.in_flight.release_conn(conn);
        }
    }

    /// Ends the stream after a failure: an SSE error event for streams, an error otherwise.
    fn fail(&mut self, error: ProxyError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.done = true;
        self.in_flight.finish(Outcome::BodyBroken);
        if !self.sse {
            return Poll::Ready(Some(Err(error.into())));
        }
        let prefix = if self.at_boundary { "" } else { "\n\n" };
        let event = format!("{prefix}data: {}\n\n", error.body_json());
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ProxyBody::Local(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Upstream(up) => up.poll_upstream(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Local(bytes) => bytes.is_none(),
            ProxyBody::Upstream(up) => up.done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Local(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ProxyBody::Local(None) => SizeHint::with_exact(0),
            ProxyBody::Upstream(up) => up.inner.size_hint(),
        }
    }
}

impl UpstreamBody {
    /// Hot path for streamed responses.
    fn poll_upstream(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if !data.is_empty() {
                        self.tokens.read(data, self.sse);
                        self.at_boundary = data.ends_with(b"\n\n") || data.ends_with(b"\r\n\r\n");
                        if self.sse || self.idle.is_some() {
                            // One clock read for the chunk figures and the idle gap.
                            let now = clock::now();
                            self.last_data = now;
                            // The closing `[DONE]` follows the last token at once: no token gap.
                            if self.sse && !data.starts_with(b"data: [DONE]") {
                                self.in_flight.stream_chunk(self.last_chunk, now);
                                self.last_chunk = Some(now);
                            }
                        }
                    }
                    if self.response_id.is_some() {
                        let data = data.clone();
                        self.read_response_id(&data, false);
                    }
                }
                if self.inner.is_end_stream() {
                    // A body of known length ends with its last chunk: hyper stops polling once
                    // it has written that many bytes, so record the end now.
                    self.end();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                let engine = self.in_flight.engine_id().to_owned();
                self.fail(ProxyError::EngineFailed { engine, detail: format!("stream broken: {e}") })
            }
            Poll::Ready(None) => {
                self.end();
                Poll::Ready(None)
            }
            Poll::Pending => {
                let timeout = self.idle_timeout;
                if self.idle.is_none() {
                    self.last_data = clock::now();
                    self.idle = Some(Box::pin(tokio::time::sleep_until(self.last_data + timeout)));
                }
                let Some(idle) = self.idle.as_mut() else { return Poll::Pending };
                // The timer holds the waker it was last polled with: while that is still this
                // task's and the timer has not fired, polling it again would only register the
                // same waker again (measured about 1 % of a streamed chunk's CPU).
                if !idle.is_elapsed() && self.idle_waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    return Poll::Pending;
                }
                self.idle_waker = Some(cx.waker().clone());
                loop {
                    ready!(idle.as_mut().poll(cx));
                    // Data came after the timer was set: the gap ends later.
                    let deadline = self.last_data + timeout;
                    if deadline <= idle.deadline() {
                        break;
                    }
                    idle.as_mut().reset(deadline);
                }
                let engine = self.in_flight.engine_id().to_owned();
                let timeout_ms = self.idle_timeout.as_millis() as u64;
                self.fail(ProxyError::EngineTimeout { engine, timeout_ms })
            }
        }
    }
}

/// How many tokens an answer generated, read from its bytes as they pass: the count the engine
/// states (`usage.completion_tokens` of every whole OpenAI-style answer, and of a stream's last
/// chunk when the client sets `stream_options.include_usage`; `timings.predicted_n`, which
/// llama.cpp puts on every answer and on its streams' closing chunk), else, for a stream that
/// ends with `data: [DONE]`, its events less `[DONE]` and a chat stream's opening role-only
/// chunk: one event per token, as vLLM and SGLang stream (the finish reason rides on the last
/// token's chunk). Answers of the Responses API count nothing (their usage names
/// `output_tokens`, their streams end without `[DONE]`). Per chunk: two searches for the keys
/// and, in streams, a count of event ends (about 25 ns for a 200-byte chunk).
#[derive(Debug, Default)]
pub(crate) struct TokenCount {
    /// SSE events ended so far (`\n\n`).
    events: u64,
    /// A chat stream's first chunk names the role and carries no token.
    role_chunk: bool,
    done: bool,
    usage: Option<u64>,
}

/// The keys under which engines state an answer's generated tokens.
static COUNT_KEYS: LazyLock<[Finder<'static>; 2]> =
    LazyLock::new(|| [Finder::new(b"\"completion_tokens\":"), Finder::new(b"\"predicted_n\":")]);
static EVENT_END: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\n\n"));

impl TokenCount {
    pub(crate) fn read(&mut self, data: &[u8], sse: bool) {
        for key in COUNT_KEYS.iter() {
            // Inside a JSON string a quote is escaped, so a key matches only as a key.
            let Some(at) = key.find(data) else { continue };
            let digits = data[at + key.needle().len()..].trim_ascii_start();
            let end = digits.iter().position(|b| !b.is_ascii_digit()).unwrap_or(digits.len());
            self.usage = std::str::from_utf8(&digits[..end]).ok().and_then(|d| d.parse().ok()).or(self.usage);
        }
        if sse {
            if self.events == 0 && memchr::memmem::find(data, b"\"role\"").is_some() {
                self.role_chunk = true;
            }
            self.events += EVENT_END.find_iter(data).count() as u64;
            self.done |= data.ends_with(b"data: [DONE]\n\n");
        }
    }

    /// The tokens, if the bytes told.
    pub(crate) fn tokens(&self) -> Option<u64> {
        let framing = 1 + u64::from(self.role_chunk);
        self.usage.or_else(|| self.done.then(|| self.events.saturating_sub(framing)))
    }
}

/// Bytes of a Responses answer searched for its id: the id comes first (the top-level `id` of
/// the JSON body, or the `response.created` event that opens a stream).
pub const RESPONSE_ID_WINDOW: usize = 64 * 1024;

/// The search for a response's id in the bytes of its body (the proxy's, and `ilb-epp`'s
/// through [`crate::Routing`]).
pub(crate) struct ResponseIdReader {
    store: ResponseStore,
    sse: bool,
    seen: Vec<u8>,
}

enum Found {
    Id(String),
    NotYet,
    /// The window is used up, or the body ended, without an id.
    Never,
}

/// The part of a Responses body (or of one of its stream events) that names the response.
#[derive(serde::Deserialize)]
struct NamesResponse {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    response: Option<Box<NamesResponse>>,
}

impl ResponseIdReader {
    /// A search for the id of a response `store` names, in an event stream if `sse`.
    pub(crate) fn new(store: ResponseStore, sse: bool) -> Box<ResponseIdReader> {
        Box::new(ResponseIdReader { store, sse, seen: Vec::new() })
    }

    /// Reads the next `data` of the body (`ended`: the body's last) into the search in `slot`,
    /// if one is under way; remembers the id for `in_flight`'s engine once it is found, and
    /// empties `slot` once the search is over (found, or never to be).
    pub(crate) fn read(
        slot: &mut Option<Box<ResponseIdReader>>,
        data: &[u8],
        ended: bool,
        in_flight: &InFlight,
    ) {
        let Some(reader) = slot.as_mut() else { return };
        match reader.push(data, ended) {
            Found::Id(id) => in_flight.remember_response(&id, reader.store.tag, reader.store.now_s),
            Found::Never => {}
            Found::NotYet => return,
        }
        *slot = None;
    }

    fn push(&mut self, data: &[u8], ended: bool) -> Found {
        let room = RESPONSE_ID_WINDOW.saturating_sub(self.seen.len());
        self.seen.extend_from_slice(&data[..data.len().min(room)]);
        let truncated = data.len() > room;
        if self.sse {
            return self.scan_events(ended || truncated);
        }
        match (ended, truncated) {
            (_, true) => Found::Never,
            (false, false) => Found::NotYet,
            (true, false) => match serde_json::from_slice::<NamesResponse>(&self.seen) {
                Ok(NamesResponse { id: Some(id), .. }) => Found::Id(id),
                _ => Found::Never,
            },
        }
    }

    /// The first complete event whose data names a response (`response.id`, or a top-level
    /// `id` for streams that put it there).
    fn scan_events(&self, last_chance: bool) -> Found {
        let text = String::from_utf8_lossy(&self.seen);
        let text = text.replace("\r\n", "\n");
        let complete = match text.rfind("\n\n") {
            Some(end) => &text[..end],
            None if last_chance => return Found::Never,
            None => return Found::NotYet,
        };
        for event in complete.split("\n\n") {
            let data: String = event
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect::<Vec<_>>()
                .join("\n");
            if let Ok(names) = serde_json::from_str::<NamesResponse>(&data) {
                if let Some(id) = names.response.and_then(|r| r.id).or(names.id) {
                    return Found::Id(id);
                }
            }
        }
        if last_chance {
            Found::Never
        } else {
            Found::NotYet
        }
    }
}

#[cfg(test)]
mod response_id_tests {
    use super::*;

    fn reader(sse: bool) -> ResponseIdReader {
        ResponseIdReader { store: ResponseStore { tag: 1, now_s: 0 }, sse, seen: Vec::new() }
    }

    fn id(found: Found) -> Option<String> {
        match found {
            Found::Id(id) => Some(id),
            _ => None,
        }
    }

    #[test]
    fn reads_the_id_of_a_json_body_at_its_end() {
        let mut r = reader(false);
        let body = br#"{"id":"resp_1","object":"response","output":[{"id":"msg_2","type":"message"}]}"#;
        assert!(matches!(r.push(&body[..20], false), Found::NotYet));
        assert_eq!(id(r.push(&body[20..], true)).as_deref(), Some("resp_1"));
        assert!(matches!(reader(false).push(b"{\"error\":{}}", true), Found::Never));
    }

    #[test]
    fn reads_the_id_of_a_stream_from_its_first_event_split_anywhere() {
        let stream = "event: response.created\r\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\
                      \"response\":{\"id\":\"resp_abc\",\"status\":\"in_progress\"}}\r\n\r\n\
                      event: response.output_text.delta\ndata: {\"delta\":\"hi\"}\n\n";
        for split in 0..stream.len() {
            let mut r = reader(true);
            let first = r.push(&stream.as_bytes()[..split], false);
            let found = match first {
                Found::Id(id) => Some(id),
                _ => id(r.push(&stream.as_bytes()[split..], true)),
            };
            assert_eq!(found.as_deref(), Some("resp_abc"), "split at {split}");
        }
    }

    #[test]
    fn gives_up_after_the_window() {
        let mut r = reader(true);
        let filler = vec![b'x'; RESPONSE_ID_WINDOW + 1];
        assert!(matches!(r.push(&filler, false), Found::Never));
    }

    fn counted(frames: &[&str], sse: bool) -> Option<u64> {
        let mut count = TokenCount::default();
        for frame in frames {
            count.read(frame.as_bytes(), sse);
        }
        count.tokens()
    }

    #[test]
    fn tokens_come_from_usage_or_from_the_streams_events() {
        let role = r#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;
        let token = |t: &str| format!(r#"data: {{"choices":[{{"index":0,"delta":{{"content":"{t}"}}}}]}}"#);
        let done = "data: [DONE]\n\n";
        // vLLM without usage: a role chunk, three tokens (the last with the finish reason).
        let (a, b, c) = (token("a"), token("b"), token("c"));
        let frames = [format!("{role}\n\n{a}\n\n"), format!("{b}\n\n"), format!("{c}\n\n"), done.to_owned()];
        let frames: Vec<&str> = frames.iter().map(String::as_str).collect();
        assert_eq!(counted(&frames, true), Some(3));
        // A text completion stream has no role chunk.
        assert_eq!(counted(&frames[1..], true), Some(2));
        // A stream that did not end with [DONE] counts nothing.
        assert_eq!(counted(&frames[..3], true), None);
        // With usage (`stream_options.include_usage`): its count, whatever the events, however
        // the number is spaced.
        let usage =
            r#"data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens": 41,"total_tokens":50}}"#;
        let with_usage = [frames[0], frames[1], &format!("{usage}\n\n"), done];
        assert_eq!(counted(&with_usage, true), Some(41));
        // A whole answer.
        let whole = r#"{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens":7}}"#;
        assert_eq!(counted(&[whole], false), Some(7));
        assert_eq!(counted(&[r#"{"data":[{"embedding":[0.1]}],"usage":{"prompt_tokens":3}}"#], false), None);
        // llama.cpp's own streams, captured live (xllamacpp 2026.10.11549, Gemma 3 270M,
        // max_tokens 5 and 4): no usage, `timings.predicted_n` on the closing chunk, which
        // carries no token either.
        let frames = |capture: &'static str| capture.split_inclusive("\n\n").collect::<Vec<_>>();
        assert_eq!(counted(&frames(include_str!("testdata/llamacpp_chat_stream.txt")), true), Some(5));
        assert_eq!(counted(&frames(include_str!("testdata/llamacpp_completion_stream.txt")), true), Some(4));
        // The key inside generated text is escaped, so it does not count.
        let quoted = token(r#"\"completion_tokens\": 99"#);
        assert_eq!(counted(&[&format!("{quoted}\n\n"), done], true), Some(1));
    }
}
