//! The EPP protocol's vocabulary on Envoy's ext_proc messages: the names (header, metadata
//! namespaces and keys), reading the gateway's subset hint and the endpoint that served, and
//! building the answers (the pick as a header mutation plus `envoy.lb` dynamic metadata,
//! streamed body chunks, immediate responses).

use crate::inbound::HeaderMap as EnvoyHeaderMap;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption, Metadata};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_response, BodyMutation, BodyResponse, CommonResponse, HeaderMutation,
    HeadersResponse, ImmediateResponse, ProcessingResponse, StreamedBodyResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use http::{HeaderMap, HeaderName, StatusCode};

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

/// A body chunk sent back as it is, in full-duplex streamed mode.
pub fn streamed(body: &[u8], end_of_stream: bool) -> CommonResponse {
    CommonResponse {
        body_mutation: Some(BodyMutation {
            mutation: Some(body_mutation::Mutation::StreamedResponse(StreamedBodyResponse {
                body: body.to_vec(),
                end_of_stream,
                ..Default::default()
            })),
        }),
        ..Default::default()
    }
}

/// The request body sent back in chunks of at most [`BODY_CHUNK_LIMIT`] (one empty chunk for an
/// empty body); the last one ends the stream if `end_of_stream`.
pub fn request_body_chunks(body: &[u8], end_of_stream: bool) -> Vec<ProcessingResponse> {
    if body.is_empty() {
        return vec![request_body(streamed(body, end_of_stream))];
    }
    let n = body.len().div_ceil(BODY_CHUNK_LIMIT);
    body.chunks(BODY_CHUNK_LIMIT)
        .enumerate()
        .map(|(i, chunk)| request_body(streamed(chunk, end_of_stream && i + 1 == n)))
        .collect()
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
