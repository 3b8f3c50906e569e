//! One ext_proc stream, which Envoy opens per HTTP request: the request's headers and body come
//! in, the pick goes out (header + `envoy.lb` metadata), then the response's headers and body
//! pass through while its [`Routing`] counts the engine that served it until the body ends.
//!
//! Request bodies are read whole (the pick needs the model and the prompt's prefix) in
//! `FULL_DUPLEX_STREAMED` mode, where they are sent back unchanged after the pick, or in
//! `BUFFERED` mode, where the pick rides on the body's response. Response bodies are passed
//! through chunk by chunk as they came (full duplex) or acknowledged (buffered).

use crate::inbound::{HttpBody, HttpHeaders, ProcessingRequest, Request};
use crate::wire::{self, Answer, Direction};
use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_response, CommonResponse, ProcessingResponse, TrailersResponse,
};
use ilb_dataplane::error::ProxyError;
use ilb_dataplane::{RouteRequest, Router, Routing};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

/// What went wrong with the stream itself (not with the HTTP request it carries, which gets an
/// immediate response): the gRPC status ending it.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("{0}")]
    Protocol(String),
}

/// How Envoy sends one direction's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BodyMode {
    None,
    Buffered,
    FullDuplex,
    /// `STREAMED`, `BUFFERED_PARTIAL`, `GRPC`: not spoken.
    Other(i32),
}

impl BodyMode {
    fn of(mode: i32) -> BodyMode {
        match BodySendMode::try_from(mode) {
            Ok(BodySendMode::None) => BodyMode::None,
            Ok(BodySendMode::Buffered) => BodyMode::Buffered,
            Ok(BodySendMode::FullDuplexStreamed) => BodyMode::FullDuplex,
            _ => BodyMode::Other(mode),
        }
    }
}

/// Which of Envoy's messages the pick answers.
#[derive(Clone, Copy, Debug)]
enum Via {
    /// The request has no body (or Envoy sends none): the headers' answer.
    Headers,
    /// Full duplex: the headers' answer, then the body sent back.
    DuplexBody { end_of_stream: bool },
    /// Buffered: the body's answer (the headers were answered when they came).
    BufferedBody,
}

/// What one of Envoy's messages asks for: nothing more (its answers, if any, were added), or a
/// pick first.
pub enum Step {
    Answered,
    Pick(Pick),
}

/// A pick under way (the router may wait while every engine is full): [`Stream::poll_pick`]
/// until it gives the answers. The router's future is boxed once here, not moved with each
/// message of the stream.
pub struct Pick {
    future: Pin<Box<dyn Future<Output = Result<Routing, ProxyError>> + Send>>,
    via: Via,
    /// The request body as read, sent back after the pick in full-duplex mode.
    body: Bytes,
    /// The pick answers the request's trailers: their own answer follows.
    trailers: bool,
}

/// The state of one stream.
pub struct Stream {
    router: Arc<Router>,
    request_mode: BodyMode,
    response_mode: BodyMode,
    headers: http::HeaderMap,
    path: Option<String>,
    subset: Option<Vec<String>>,
    /// The request body read so far: its first chunk as received (a body in one chunk is
    /// never copied), then the chunks gathered in `body`.
    first_chunk: Bytes,
    body: BytesMut,
    /// The request got its answer (a pick or an immediate response).
    answered: bool,
    routing: Option<Routing>,
    /// An immediate response was sent: Envoy ends the stream.
    done: bool,
}

impl Stream {
    pub fn new(router: Arc<Router>) -> Stream {
        Stream {
            router,
            // Until Envoy says otherwise (its first message carries the protocol configuration),
            // the modes the EPP protocol asks for.
            request_mode: BodyMode::FullDuplex,
            response_mode: BodyMode::FullDuplex,
            headers: http::HeaderMap::new(),
            path: None,
            subset: None,
            first_chunk: Bytes::new(),
            body: BytesMut::new(),
            answered: false,
            routing: None,
            done: false,
        }
    }

    /// Whether the stream has nothing left to do (an immediate response went out).
    pub fn done(&self) -> bool {
        self.done
    }

    /// Handles one message: adds the answers to send back to `out`, in order, or starts a pick
    /// that gives them.
    pub fn handle(&mut self, message: ProcessingRequest, out: &mut Vec<Answer>) -> Result<Step, StreamError> {
        if let Some(config) = &message.protocol_config {
            self.request_mode = BodyMode::of(config.request_body_mode);
            self.response_mode = BodyMode::of(config.response_body_mode);
        }
        // Only the headers' metadata is read (Envoy sends it with every message).
        let metadata = message.metadata_context.as_deref();
        let malformed = |error: wire::DecodeError| StreamError::Protocol(error.to_string());
        match message.request {
            Some(Request::RequestHeaders(headers)) => {
                self.subset = wire::subset_hint(metadata).map_err(malformed)?;
                self.request_headers(&headers, out)
            }
            Some(Request::RequestBody(body)) => self.request_body(body, out),
            Some(Request::RequestTrailers(_)) => {
                if !self.answered {
                    let via = match self.request_mode {
                        BodyMode::FullDuplex => Via::DuplexBody { end_of_stream: false },
                        _ => Via::BufferedBody,
                    };
                    return Ok(Step::Pick(self.pick(via, true)));
                }
                if !self.done {
                    out.push(request_trailers());
                }
                Ok(Step::Answered)
            }
            Some(Request::ResponseHeaders(headers)) => {
                let served = wire::served_endpoint(metadata).map_err(malformed)?;
                out.push(self.response_headers(served, &headers)?);
                Ok(Step::Answered)
            }
            Some(Request::ResponseBody(body)) => {
                out.push(self.response_body(body));
                Ok(Step::Answered)
            }
            Some(Request::ResponseTrailers(_)) => {
                self.finish();
                out.push(Answer::Message(ProcessingResponse {
                    response: Some(processing_response::Response::ResponseTrailers(
                        TrailersResponse::default(),
                    )),
                    ..Default::default()
                }));
                Ok(Step::Answered)
            }
            None => Err(StreamError::Protocol("a processing request without a request field".into())),
        }
    }

    fn request_headers(&mut self, headers: &HttpHeaders, out: &mut Vec<Answer>) -> Result<Step, StreamError> {
        if self.answered || !self.headers.is_empty() || self.path.is_some() {
            return Err(StreamError::Protocol("request headers sent twice on one stream".into()));
        }
        match wire::read_headers(headers) {
            Ok((map, path)) => {
                self.headers = map;
                self.path = path;
            }
            Err(wire::HeaderError::Malformed(e)) => return Err(StreamError::Protocol(e.to_string())),
            Err(e) => {
                out.push(self.refuse(ProxyError::BadRequest(e.to_string())));
                return Ok(Step::Answered);
            }
        }
        if headers.end_of_stream || self.request_mode == BodyMode::None {
            return Ok(Step::Pick(self.pick(Via::Headers, false)));
        }
        match self.request_mode {
            // Envoy waits for this answer before it sends the body.
            BodyMode::Buffered => out.push(Answer::Message(wire::request_headers(CommonResponse::default()))),
            BodyMode::FullDuplex => {}
            BodyMode::Other(mode) => out.push(self.refuse(ProxyError::BadRequest(format!(
                "ilb epp reads request bodies in FULL_DUPLEX_STREAMED or BUFFERED mode, not in mode {mode}; \
                 fix the gateway's ext_proc processing_mode"
            )))),
            BodyMode::None => unreachable!("routed above"),
        }
        Ok(Step::Answered)
    }

    fn request_body(&mut self, body: HttpBody, out: &mut Vec<Answer>) -> Result<Step, StreamError> {
        if self.answered {
            return Err(StreamError::Protocol("request body after the request was answered".into()));
        }
        if self.path.is_none() {
            return Err(StreamError::Protocol("request body before request headers".into()));
        }
        let limit = self.router.config().max_body_bytes;
        if self.first_chunk.len() + self.body.len() + body.body.len() > limit {
            out.push(self.refuse(ProxyError::BodyTooLarge { limit }));
            return Ok(Step::Answered);
        }
        if body.body.is_empty() {
            // Nothing to keep: Envoy ends a body with an empty chunk (the HTTP/1 codec passes
            // the body, then its end), which must not make a one-chunk body be copied.
        } else if self.first_chunk.is_empty() && self.body.is_empty() {
            self.first_chunk = body.body;
        } else {
            if self.body.is_empty() {
                self.body.extend_from_slice(&std::mem::take(&mut self.first_chunk));
            }
            self.body.extend_from_slice(&body.body);
        }
        match self.request_mode {
            // The whole body in one message (trailers may follow), which Envoy waits on.
            BodyMode::Buffered => Ok(Step::Pick(self.pick(Via::BufferedBody, false))),
            // Chunks as they arrive, answered once the body is whole.
            _ if body.end_of_stream => {
                Ok(Step::Pick(self.pick(Via::DuplexBody { end_of_stream: true }, false)))
            }
            _ => Ok(Step::Answered),
        }
    }

    /// Starts the pick for the request read so far, to answer it `via` the message Envoy waits
    /// on (and then the request's trailers if `trailers`).
    fn pick(&mut self, via: Via, trailers: bool) -> Pick {
        self.answered = true;
        let body = if self.body.is_empty() {
            std::mem::take(&mut self.first_chunk)
        } else {
            std::mem::take(&mut self.body).freeze()
        };
        // Taken: the request is answered, no message reads it again.
        let path = self.path.take().unwrap_or_default();
        let headers = std::mem::take(&mut self.headers);
        let subset = self.subset.take();
        let router = Arc::clone(&self.router);
        let request_body = body.clone();
        let future = Box::pin(async move {
            let request = RouteRequest {
                path: &path,
                headers: &headers,
                body: request_body,
                subset: subset.as_deref(),
            };
            router.route(request).await
        });
        Pick { future, via, body, trailers }
    }

    /// Once `pick` is done, adds its answers to `out`: the pick, or an immediate response for
    /// its error.
    pub fn poll_pick(&mut self, pick: &mut Pick, cx: &mut Context<'_>, out: &mut Vec<Answer>) -> Poll<()> {
        match ready!(pick.future.as_mut().poll(cx)) {
            Ok(routing) => self.answer(routing, pick.via, &pick.body, out),
            Err(error) => out.push(self.refuse(error)),
        }
        if pick.trailers && !self.done {
            out.push(request_trailers());
        }
        Poll::Ready(())
    }

    /// The answer to a routed request `via` the message Envoy waits on.
    fn answer(&mut self, routing: Routing, via: Via, body: &Bytes, out: &mut Vec<Answer>) {
        let mut endpoints = String::with_capacity(routing.endpoints().map(|e| e.len() + 1).sum());
        for endpoint in routing.endpoints() {
            if !endpoints.is_empty() {
                endpoints.push(',');
            }
            endpoints.push_str(endpoint);
        }
        tracing::debug!(endpoints = %endpoints, engines = ?routing.engine_ids(), "picked");
        self.routing = Some(routing);
        match via {
            Via::Headers => {
                out.push(Answer::Pick { in_body: false, endpoints, content_length: None });
            }
            Via::DuplexBody { end_of_stream } => {
                // The headers are still held: their answer carries the pick, then the body
                // goes back as it came (the pick needed all of it).
                let content_length = Some(body.len());
                out.push(Answer::Pick { in_body: false, endpoints, content_length });
                wire::request_body_chunks(body, end_of_stream, out);
            }
            Via::BufferedBody => {
                out.push(Answer::Pick { in_body: true, endpoints, content_length: None });
            }
        }
    }

    /// The request's error as the gateway's immediate response: its status and OpenAI-style
    /// JSON body (a 4xx for the client's mistakes, 429 shed, 503 no engine).
    fn refuse(&mut self, error: ProxyError) -> Answer {
        self.answered = true;
        self.done = true;
        let status = error.status();
        let details = format!("ilb_epp_{}", status.as_u16());
        let response: http::Response<Bytes> = error.into_response();
        let (parts, body) = response.into_parts();
        Answer::Message(wire::immediate(status, &parts.headers, &body, &details))
    }

    fn response_headers(
        &mut self,
        served: Option<&str>,
        headers: &HttpHeaders,
    ) -> Result<Answer, StreamError> {
        // The first `:status` and `content-type`, in one pass over the headers.
        let (mut status, mut content_type) = (None, None);
        for header in headers.iter() {
            let (key, value) = header.map_err(|e| StreamError::Protocol(e.to_string()))?;
            if status.is_none() && key == b":status" {
                status = Some(value);
            } else if content_type.is_none() && key.eq_ignore_ascii_case(b"content-type") {
                content_type = Some(value);
            }
        }
        let status =
            status.and_then(|s| http::StatusCode::from_bytes(s).ok()).unwrap_or(http::StatusCode::OK);
        let sse = content_type.is_some_and(|content_type| content_type.starts_with(b"text/event-stream"));
        if let Some(routing) = &mut self.routing {
            routing.served(served, status, sse);
        }
        if headers.end_of_stream || self.response_mode == BodyMode::None {
            self.finish();
        }
        Ok(Answer::ResponseHeaders)
    }

    fn response_body(&mut self, body: HttpBody) -> Answer {
        if let Some(routing) = &mut self.routing {
            routing.body(&body.body);
        }
        if body.end_of_stream {
            self.finish();
        }
        match self.response_mode {
            BodyMode::FullDuplex => wire::streamed(Direction::Response, body.body, body.end_of_stream),
            _ => Answer::Message(wire::response_body(CommonResponse::default())),
        }
    }

    fn finish(&mut self) {
        if let Some(routing) = &mut self.routing {
            routing.finish();
        }
    }
}

fn request_trailers() -> Answer {
    Answer::Message(ProcessingResponse {
        response: Some(processing_response::Response::RequestTrailers(TrailersResponse::default())),
        ..Default::default()
    })
}
