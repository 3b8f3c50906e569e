//! OpenAI response shapes (non-streaming JSON, SSE chunks, errors) and the response body type,
//! including the streaming body that turns model token events into SSE chunks as they come.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body::{Body, Frame};
use serde::Serialize;
use tokio::sync::mpsc::UnboundedReceiver;

use super::driver::LiveRequest;
use crate::model::TokenEvent;
use crate::tokenize::output_word;

/// Which OpenAI endpoint a completion answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Text,
    /// The Responses API (`super::responses`).
    Responses,
}

/// Everything needed to format one completion's output.
#[derive(Clone, Debug)]
pub struct Completion {
    pub kind: Kind,
    pub id: String,
    pub model: String,
    pub created: u64,
    pub output_seed: u64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    pub finish_reason: &'static str,
    pub include_usage: bool,
}

#[derive(Serialize, Clone, Copy)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
}

impl Completion {
    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.output_tokens,
            total_tokens: self.prompt_tokens + self.output_tokens,
        }
    }

    fn object(&self, streaming: bool) -> &'static str {
        match (self.kind, streaming) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Text, _) => "text_completion",
            (Kind::Responses, _) => "response",
        }
    }

    /// The non-streaming response body.
    pub fn full_json(&self) -> Vec<u8> {
        if self.kind == Kind::Responses {
            return serde_json::to_vec(&self.response_object(true)).unwrap_or_default();
        }
        let text = crate::tokenize::output_text(self.output_seed, self.output_tokens);
        let choice = Choice {
            index: 0,
            message: (self.kind == Kind::Chat).then_some(Message { role: "assistant", content: &text }),
            text: (self.kind == Kind::Text).then_some(text.as_str()),
            delta: None,
            logprobs: (),
            finish_reason: Some(self.finish_reason),
        };
        let body = Envelope {
            id: &self.id,
            object: self.object(false),
            created: self.created,
            model: &self.model,
            choices: std::slice::from_ref(&choice),
            usage: Some(Some(self.usage())),
        };
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// One SSE event carrying output token `index` (1-based).
    pub fn chunk(&self, index: u32, last: bool) -> Bytes {
        if self.kind == Kind::Responses {
            return self.response_delta(index);
        }
        let word = output_word(self.output_seed, index - 1);
        let choice = Choice {
            index: 0,
            message: None,
            text: (self.kind == Kind::Text).then_some(word),
            delta: (self.kind == Kind::Chat)
                .then_some(Delta { role: (index == 1).then_some("assistant"), content: word }),
            logprobs: (),
            finish_reason: last.then_some(self.finish_reason),
        };
        let body = Envelope {
            id: &self.id,
            object: self.object(true),
            created: self.created,
            model: &self.model,
            choices: std::slice::from_ref(&choice),
            usage: self.include_usage.then_some(None),
        };
        sse(&body)
    }

    /// What follows the last content chunk: the usage chunk if asked for, then `[DONE]`.
    pub fn tail(&self) -> Bytes {
        if self.kind == Kind::Responses {
            return self.response_tail();
        }
        let mut out = Vec::new();
        if self.include_usage {
            let body = Envelope {
                id: &self.id,
                object: self.object(true),
                created: self.created,
                model: &self.model,
                choices: &[],
                usage: Some(Some(self.usage())),
            };
            out.extend_from_slice(&sse(&body));
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        Bytes::from(out)
    }

    /// The whole stream at once (latency modelling off).
    pub fn all_chunks(&self) -> VecDeque<Bytes> {
        let mut chunks: VecDeque<Bytes> =
            (1..=self.output_tokens).map(|index| self.chunk(index, index == self.output_tokens)).collect();
        chunks.push_back(self.tail());
        if let Some(head) = self.head() {
            chunks.push_front(head);
        }
        chunks
    }

    /// What a stream sends before its first token, at once: the Responses API's opening
    /// events (chat and text completions start with their first token).
    pub fn head(&self) -> Option<Bytes> {
        (self.kind == Kind::Responses).then(|| self.response_head())
    }
}

#[derive(Serialize)]
struct Envelope<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: &'a [Choice<'a>],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<Usage>>,
}

#[derive(Serialize)]
struct Choice<'a> {
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<Message<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delta: Option<Delta<'a>>,
    logprobs: (),
    finish_reason: Option<&'static str>,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    content: &'a str,
}

fn sse(value: &impl Serialize) -> Bytes {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"data: ");
    let _ = serde_json::to_writer(&mut out, value);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// The body error that makes hyper close the connection (the `drop_mid_stream` fault).
#[derive(Debug, thiserror::Error)]
#[error("stream dropped by fault injection")]
pub struct DroppedByFault;

/// Every response body the simulator sends.
pub enum EngineBody {
    Full(Option<Bytes>),
    Stream(Box<SseStream>),
}

impl EngineBody {
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Self::Full(Some(bytes.into()))
    }
}

impl Body for EngineBody {
    type Data = Bytes;
    type Error = DroppedByFault;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            Self::Full(bytes) => Poll::Ready(bytes.take().map(|bytes| Ok(Frame::data(bytes)))),
            Self::Stream(stream) => stream.poll_chunk(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Self::Full(None))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            Self::Full(Some(bytes)) => http_body::SizeHint::with_exact(bytes.len() as u64),
            Self::Full(None) => http_body::SizeHint::with_exact(0),
            Self::Stream(_) => http_body::SizeHint::default(),
        }
    }
}

/// Where a stream's chunks come from.
pub enum Source {
    /// Token events from the model driver, one chunk per token as its iteration ends.
    Model(UnboundedReceiver<TokenEvent>),
    /// Precomputed chunks (latency modelling off).
    Ready(VecDeque<Bytes>),
}

/// A streamed completion. Dropping it (client gone) aborts the sequence in the model through
/// its [`LiveRequest`] guard.
pub struct SseStream {
    completion: Completion,
    source: Source,
    drop_after_first: bool,
    /// Held only for its `Drop`, which aborts an unfinished request.
    _live: Option<LiveRequest>,
    sent_first: bool,
    /// Whether the opening events went out (Responses streams from the model).
    sent_head: bool,
    finished: bool,
    drop_timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl SseStream {
    pub fn new(
        completion: Completion,
        source: Source,
        drop_after_first: bool,
        live: Option<LiveRequest>,
    ) -> Self {
        Self {
            completion,
            source,
            drop_after_first,
            _live: live,
            sent_first: false,
            sent_head: false,
            finished: false,
            drop_timer: None,
        }
    }

    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, DroppedByFault>>> {
        if self.finished {
            return Poll::Ready(None);
        }
        if !self.sent_head {
            self.sent_head = true;
            if let (Source::Model(_), Some(head)) = (&self.source, self.completion.head()) {
                return Poll::Ready(Some(Ok(Frame::data(head))));
            }
        }
        if let Some(timer) = self.drop_timer.as_mut() {
            // Waiting (Pending) first lets hyper flush the first chunk before the connection
            // is torn down.
            ready!(timer.as_mut().poll(cx));
            self.finished = true;
            return Poll::Ready(Some(Err(DroppedByFault)));
        }
        let chunk = match &mut self.source {
            Source::Ready(chunks) => match chunks.pop_front() {
                Some(chunk) => chunk,
                None => {
                    self.finished = true;
                    return Poll::Ready(None);
                }
            },
            Source::Model(events) => match ready!(events.poll_recv(cx)) {
                Some(event) => {
                    let chunk = self.completion.chunk(event.index, event.finished);
                    if event.finished {
                        let mut both = Vec::with_capacity(chunk.len() + 256);
                        both.extend_from_slice(&chunk);
                        both.extend_from_slice(&self.completion.tail());
                        self.finished = true;
                        Bytes::from(both)
                    } else {
                        chunk
                    }
                }
                None => {
                    // The driver dropped the request (engine shutting down): end the stream.
                    self.finished = true;
                    return Poll::Ready(None);
                }
            },
        };
        if !self.sent_first && self.drop_after_first && !self.finished {
            self.drop_timer = Some(Box::pin(tokio::time::sleep(Duration::from_millis(5))));
        }
        self.sent_first = true;
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }
}

/// An OpenAI-shaped error response: `{"error":{"message","type","param","code"}}`.
pub fn error(status: StatusCode, kind: &str, message: &str, param: Option<&str>) -> Response<EngineBody> {
    let body = serde_json::json!({
        "error": { "message": message, "type": kind, "param": param, "code": status.as_u16() }
    });
    json_response(status, serde_json::to_vec(&body).unwrap_or_default())
}

pub fn json_response(status: StatusCode, body: Vec<u8>) -> Response<EngineBody> {
    let mut response = Response::new(EngineBody::full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

pub fn text_response(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<EngineBody> {
    let mut response = Response::new(EngineBody::full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

pub fn sse_response(stream: SseStream) -> Response<EngineBody> {
    let mut response = Response::new(EngineBody::Stream(Box::new(stream)));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
