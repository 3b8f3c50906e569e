//! The EPP protocol's vocabulary on Envoy's ext_proc messages: the names (header, metadata
//! namespaces and keys), reading the gateway's subset hint and the endpoint that served, and
//! building the answers (the pick as a header mutation plus `envoy.lb` dynamic metadata,
//! streamed body chunks, immediate responses).

use crate::inbound::HeaderMap as EnvoyHeaderMap;
use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption, Metadata};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_response, BodyMutation, BodyResponse, CommonResponse, HeaderMutation,
    HeadersResponse, ImmediateResponse, ProcessingResponse, StreamedBodyResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use http::{HeaderMap, HeaderName, StatusCode};
use prost::encoding::{encode_varint, encoded_len_varint};
use prost::Message;

/// The header that carries the picked endpoints to the gateway.
pub const DESTINATION_ENDPOINT: &str = "x-gateway-destination-endpoint";
/// The namespace of the picked endpoints in the dynamic metadata, and of the endpoint that
/// served in the metadata the gateway sends back.
pub const DESTINATION_NAMESPACE: &str = "envoy.lb";
/// The key of the endpoint that served, in [`DESTINATION_NAMESPACE`].
pub const DESTINATION_SERVED: &str = "x-gateway-destination-endpoint-served";
/// The namespace and key of the gateway's subset hint.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// Envoy's ext_proc caps a streamed body chunk at 64 KiB; the reference EPP sends at most this.
pub const BODY_CHUNK_LIMIT: usize = 62_000;

/// Why a message's headers could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    #[error("header {0:?} has an invalid name")]
    Name(String),
    #[error("header {0} has an invalid value")]
    Value(String),
}

/// Envoy's headers as an `http::HeaderMap` (pseudo-headers left out) and the `:path`.
pub fn read_headers(headers: Option<&EnvoyHeaderMap>) -> Result<(HeaderMap, Option<String>), HeaderError> {
    let mut out = HeaderMap::new();
    let mut path = None;
    for header in headers.map(|h| h.headers.as_slice()).unwrap_or_default() {
        let value = header.value();
        if header.key == ":path" {
            path = Some(String::from_utf8_lossy(value).into_owned());
            continue;
        }
        if header.key.starts_with(b":") {
            continue;
        }
        let key = || String::from_utf8_lossy(&header.key).into_owned();
        let name = HeaderName::from_bytes(&header.key).map_err(|_| HeaderError::Name(key()))?;
        let value = http::HeaderValue::from_bytes(value).map_err(|_| HeaderError::Value(key()))?;
        out.append(name, value);
    }
    Ok((out, path))
}

/// A response's `:status`, if it has a valid one.
pub fn status_of(headers: Option<&EnvoyHeaderMap>) -> Option<StatusCode> {
    let header = headers?.headers.iter().find(|h| h.key == ":status")?;
    StatusCode::from_bytes(header.value()).ok()
}

/// A string or a list of strings at `namespace`.`key` of the metadata, split at commas.
fn endpoint_list(metadata: Option<&Metadata>, namespace: &str, key: &str) -> Option<Vec<String>> {
    let value = metadata?.filter_metadata.get(namespace)?.fields.get(key)?;
    let mut out = Vec::new();
    let mut push =
        |s: &str| out.extend(s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned));
    match &value.kind {
        Some(Kind::StringValue(s)) => push(s),
        Some(Kind::ListValue(list)) => {
            for item in &list.values {
                if let Some(Kind::StringValue(s)) = &item.kind {
                    push(s);
                }
            }
        }
        _ => {}
    }
    Some(out)
}

/// The gateway's subset hint: `None` when it set none (any endpoint), else the endpoints it
/// allows (possibly none: then nothing is eligible and the answer is 503).
pub fn subset_hint(metadata: Option<&Metadata>) -> Option<Vec<String>> {
    endpoint_list(metadata, SUBSET_NAMESPACE, SUBSET_KEY)
}

/// The endpoint that served, as the gateway reports it in `envoy.lb`.
pub fn served_endpoint(metadata: Option<&Metadata>) -> Option<String> {
    endpoint_list(metadata, DESTINATION_NAMESPACE, DESTINATION_SERVED)?.into_iter().next()
}

fn header(key: &str, value: &[u8]) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue { key: key.to_owned(), raw_value: value.to_vec(), ..Default::default() }),
        ..Default::default()
    }
}

/// The answer to a routed request: the endpoints in the header and, identically, in the
/// `envoy.lb` dynamic metadata; the route cache cleared so that the route is chosen again with
/// the header. `content_length`: the body's length, set when the body is sent back streamed.
pub fn pick_common(endpoints: &str, content_length: Option<usize>) -> CommonResponse {
    let mut set_headers = vec![header(DESTINATION_ENDPOINT, endpoints.as_bytes())];
    if let Some(length) = content_length {
        set_headers.push(header("content-length", length.to_string().as_bytes()));
    }
    CommonResponse {
        header_mutation: Some(HeaderMutation { set_headers, ..Default::default() }),
        clear_route_cache: true,
        ..Default::default()
    }
}

/// `{"envoy.lb": {"x-gateway-destination-endpoint": endpoints}}`.
pub fn pick_metadata(endpoints: &str) -> Struct {
    let inner = Struct {
        fields: [(
            DESTINATION_ENDPOINT.to_owned(),
            Value { kind: Some(Kind::StringValue(endpoints.to_owned())) },
        )]
        .into(),
    };
    Struct {
        fields: [(DESTINATION_NAMESPACE.to_owned(), Value { kind: Some(Kind::StructValue(inner)) })].into(),
    }
}

pub fn request_headers(common: CommonResponse) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::RequestHeaders(HeadersResponse {
            response: Some(common),
        })),
        ..Default::default()
    }
}

pub fn request_body(common: CommonResponse) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::RequestBody(BodyResponse { response: Some(common) })),
        ..Default::default()
    }
}

pub fn response_headers() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseHeaders(HeadersResponse {
            response: Some(CommonResponse::default()),
        })),
        ..Default::default()
    }
}

pub fn response_body(common: CommonResponse) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseBody(BodyResponse { response: Some(common) })),
        ..Default::default()
    }
}

/// Which body a streamed chunk belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Request,
    Response,
}

/// One answer to the gateway, as the EPP sends it.
// Not boxed: an answer lives in a stream's reused answer list until it is encoded, and a box
// would cost an allocation per message.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// A message built with envoy-types' types: picks, immediate responses, buffered-mode
    /// answers, the response headers' answer.
    Message(ProcessingResponse),
    /// A body chunk sent back unchanged in full-duplex streamed mode: a `request_body` or
    /// `response_body` answer whose `streamed_response` holds `body`, encoded around the chunk
    /// as received (see [`Answer::encode`]).
    Streamed { direction: Direction, body: Bytes, end_of_stream: bool },
}

/// A chunk shorter than this is copied into the answer's buffer; a longer one is sent as the
/// slice of the gateway's frame it came in.
pub const COPY_LIMIT: usize = 1024;

impl Answer {
    /// The answer as envoy-types' message (tests and the fuzz target read answers this way).
    pub fn to_message(&self) -> ProcessingResponse {
        match self {
            Answer::Message(message) => message.clone(),
            Answer::Streamed { direction, body, end_of_stream } => {
                let common = CommonResponse {
                    body_mutation: Some(BodyMutation {
                        mutation: Some(body_mutation::Mutation::StreamedResponse(StreamedBodyResponse {
                            body: body.to_vec(),
                            end_of_stream: *end_of_stream,
                            ..Default::default()
                        })),
                    }),
                    ..Default::default()
                };
                match direction {
                    Direction::Request => request_body(common),
                    Direction::Response => response_body(common),
                }
            }
        }
    }

    /// Appends the answer as one gRPC message (uncompressed) to `out`. A streamed chunk of
    /// [`COPY_LIMIT`] bytes or more is not copied: `out` gets everything before it, and the
    /// chunk is returned to be sent right after `out`'s bytes (its fields come last).
    // Hot: every message of every stream is answered through here.
    pub fn encode(self, out: &mut BytesMut) -> Option<Bytes> {
        match self {
            Answer::Message(message) => {
                let len = message.encoded_len();
                out.reserve(5 + len);
                out.put_u8(0);
                out.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
                message.encode_raw(out);
                None
            }
            Answer::Streamed { direction, body, end_of_stream } => {
                // ProcessingResponse { request_body (3) | response_body (4): BodyResponse {
                //   response (1): CommonResponse { body_mutation (3): BodyMutation {
                //     streamed_response (3): StreamedBodyResponse { end_of_stream (2), body (1) }}}}}
                // `end_of_stream` before `body` (fields may come in any order), so that the
                // body ends the message.
                let body_field =
                    if body.is_empty() { 0 } else { 1 + encoded_len_varint(body.len() as u64) + body.len() };
                let streamed = usize::from(end_of_stream) * 2 + body_field;
                let mutation = 1 + encoded_len_varint(streamed as u64) + streamed;
                let common = 1 + encoded_len_varint(mutation as u64) + mutation;
                let body_response = 1 + encoded_len_varint(common as u64) + common;
                let message = 1 + encoded_len_varint(body_response as u64) + body_response;
                out.reserve(5 + message - body.len() + if body.len() < COPY_LIMIT { body.len() } else { 0 });
                out.put_u8(0);
                out.put_u32(u32::try_from(message).unwrap_or(u32::MAX));
                out.put_u8(match direction {
                    Direction::Request => 0x1a,
                    Direction::Response => 0x22,
                });
                encode_varint(body_response as u64, out);
                out.put_u8(0x0a);
                encode_varint(common as u64, out);
                out.put_u8(0x1a);
                encode_varint(mutation as u64, out);
                out.put_u8(0x1a);
                encode_varint(streamed as u64, out);
                if end_of_stream {
                    out.put_slice(&[0x10, 0x01]);
                }
                if body.is_empty() {
                    return None;
                }
                out.put_u8(0x0a);
                encode_varint(body.len() as u64, out);
                if body.len() < COPY_LIMIT {
                    out.put_slice(&body);
                    None
                } else {
                    Some(body)
                }
            }
        }
    }
}

/// A body chunk sent back as it is, in full-duplex streamed mode.
pub fn streamed(direction: Direction, body: Bytes, end_of_stream: bool) -> Answer {
    Answer::Streamed { direction, body, end_of_stream }
}

/// The request body sent back in chunks of at most [`BODY_CHUNK_LIMIT`] (one empty chunk for an
/// empty body); the last one ends the stream if `end_of_stream`.
pub fn request_body_chunks(body: &Bytes, end_of_stream: bool, out: &mut Vec<Answer>) {
    if body.is_empty() {
        out.push(streamed(Direction::Request, Bytes::new(), end_of_stream));
        return;
    }
    let mut start = 0;
    while start < body.len() {
        let end = (start + BODY_CHUNK_LIMIT).min(body.len());
        out.push(streamed(Direction::Request, body.slice(start..end), end_of_stream && end == body.len()));
        start = end;
    }
}

/// An answer the gateway sends the client itself: `status`, JSON `body` and `headers`.
pub fn immediate(status: StatusCode, headers: &HeaderMap, body: &[u8], details: &str) -> ProcessingResponse {
    let set_headers = headers.iter().map(|(name, value)| header(name.as_str(), value.as_bytes())).collect();
    ProcessingResponse {
        response: Some(processing_response::Response::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus { code: i32::from(status.as_u16()) }),
            headers: Some(HeaderMutation { set_headers, ..Default::default() }),
            body: body.to_vec(),
            details: details.to_owned(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answer's bytes as they go on the wire: the gRPC prefix, then the message.
    fn on_the_wire(answer: Answer) -> Vec<u8> {
        let mut out = BytesMut::new();
        let rest = answer.encode(&mut out);
        out.extend_from_slice(rest.as_deref().unwrap_or_default());
        out.to_vec()
    }

    /// Every answer decodes (with envoy-types) to the message it stands for, with the gRPC
    /// prefix's length right; long bodies are handed back uncopied, short ones copied.
    #[test]
    fn answers_encode_to_the_messages_they_stand_for() {
        let mut answers = vec![
            Answer::Message(response_headers()),
            Answer::Message(request_headers(pick_common("10.0.0.1:8000,10.0.0.2:8000", Some(12)))),
        ];
        for len in [0, 1, 100, 127, 128, 1023, 1024, 16_383, 16_384, 62_000, 70_000] {
            for end_of_stream in [false, true] {
                for direction in [Direction::Request, Direction::Response] {
                    let body = Bytes::from((0..len).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
                    answers.push(streamed(direction, body, end_of_stream));
                }
            }
        }
        for answer in answers {
            let wire = on_the_wire(answer.clone());
            assert_eq!(wire[0], 0);
            let len = u32::from_be_bytes([wire[1], wire[2], wire[3], wire[4]]) as usize;
            assert_eq!(len, wire.len() - 5, "{answer:?}");
            let decoded = ProcessingResponse::decode(&wire[5..]).expect("decodes");
            assert_eq!(decoded, answer.to_message());
            if let Answer::Streamed { body, .. } = &answer {
                let mut out = BytesMut::new();
                let rest = answer.clone().encode(&mut out);
                assert_eq!(rest.is_some(), body.len() >= COPY_LIMIT);
                if let Some(rest) = rest {
                    assert_eq!(rest.as_ptr(), body.as_ptr(), "a long body is sent as received");
                }
            }
        }
    }
}
