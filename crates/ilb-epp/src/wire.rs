//! The EPP protocol's vocabulary on Envoy's ext_proc messages: the names (header, metadata
//! namespaces and keys), reading the gateway's subset hint and the endpoint that served, and
//! building the answers (the pick as a header mutation plus `envoy.lb` dynamic metadata,
//! streamed body chunks, immediate responses).

use crate::inbound::{HttpHeaders, MalformedHeaders};
use crate::protobuf::Fields;
use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_response, BodyMutation, BodyResponse, CommonResponse, HeaderMutation,
    HeadersResponse, ImmediateResponse, ProcessingResponse, StreamedBodyResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use http::{HeaderMap, StatusCode};
use ilb_dataplane::router::ROUTE_HEADERS;
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
    #[error(transparent)]
    Malformed(#[from] MalformedHeaders),
}

/// [`ROUTE_HEADERS`] in one place (the constant is a new array at each use).
static ROUTE_HEADER_NAMES: [http::HeaderName; 7] = ROUTE_HEADERS;

/// The request's headers that routing reads ([`ROUTE_HEADERS`], as an `http::HeaderMap`) and
/// its `:path`. The others are checked (a name or value `http` would refuse is an error, as
/// for the headers kept) but not copied: the router looks at no other header.
pub fn read_headers(headers: &HttpHeaders) -> Result<(HeaderMap, Option<String>), HeaderError> {
    let mut out = HeaderMap::new();
    let mut path = None;
    let whole = headers.headers.as_ref();
    for header in headers.iter() {
        let (key, value) = header?;
        if key == b":path" {
            path = Some(String::from_utf8_lossy(value).into_owned());
            continue;
        }
        if key.starts_with(b":") {
            continue;
        }
        let key_text = || String::from_utf8_lossy(key).into_owned();
        if !valid_name(key) {
            return Err(HeaderError::Name(key_text()));
        }
        if !valid_value(value) {
            return Err(HeaderError::Value(key_text()));
        }
        let Some(at) = route_header_texts().iter().position(|name| key.eq_ignore_ascii_case(name.as_bytes()))
        else {
            continue;
        };
        let name = &ROUTE_HEADER_NAMES[at];
        // The value as the slice of the frame it came in (no copy).
        let value = whole.map_or_else(|| Bytes::copy_from_slice(value), |whole| whole.slice_ref(value));
        let value =
            http::HeaderValue::from_maybe_shared(value).map_err(|_| HeaderError::Value(key_text()))?;
        out.append(name.clone(), value);
    }
    Ok((out, path))
}

/// Whether `http::HeaderName::from_bytes` takes `name` (a token of up to 64 KiB - 1 bytes,
/// uppercase allowed), checked without building one (a name not in its table allocates).
fn valid_name(name: &[u8]) -> bool {
    !name.is_empty() && name.len() < 1 << 16 && name.iter().all(|&b| TOKEN[usize::from(b)])
}

/// The bytes of a token (RFC 9110): letters, digits and ``!#$%&'*+-.^_`|~``.
static TOKEN: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    table
};

/// [`ROUTE_HEADER_NAMES`] as text, looked up once.
fn route_header_texts() -> &'static [&'static str; 7] {
    static TEXTS: std::sync::OnceLock<[&'static str; 7]> = std::sync::OnceLock::new();
    TEXTS.get_or_init(|| ROUTE_HEADER_NAMES.each_ref().map(http::HeaderName::as_str))
}

/// Whether `http::HeaderValue::from_bytes` takes `value`.
fn valid_value(value: &[u8]) -> bool {
    value.iter().all(|&b| b >= 32 && b != 127 || b == b'\t')
}

/// The strings at `namespace`.`key` of the gateway's metadata (an encoded
/// `envoy.config.core.v3.Metadata`): a string or a list of strings, each split at commas,
/// handed to `each` in order, trimmed, empty ones left out. `false` when the key is not there.
/// Read from the encoding without decoding the maps around it (a map entry given twice: the
/// last counts, as when decoded).
fn each_endpoint<'a>(
    metadata: Option<&'a [u8]>,
    namespace: &str,
    key: &str,
    mut each: impl FnMut(&'a str),
) -> Result<bool, DecodeError> {
    let Some(metadata) = metadata else { return Ok(false) };
    // Metadata { filter_metadata (1): map<string, Struct> }
    let Some(fields) = map_value(metadata, 1, namespace)? else { return Ok(false) };
    // Struct { fields (1): map<string, Value> }
    let Some(value) = map_value(fields, 1, key)? else { return Ok(false) };
    let mut push = |s: &'a str| s.split(',').map(str::trim).filter(|s| !s.is_empty()).for_each(&mut each);
    match value_kind(value)? {
        // Value { string_value (3) }
        Some((3, string)) => push(utf8(string)?),
        // Value { list_value (6): ListValue { values (1): Value } }
        Some((6, list)) => {
            let mut fields = Fields(list);
            while let Some((tag, item)) = fields.next_field().map_err(DecodeError)? {
                if let (1, Some(item)) = (tag, item) {
                    if let Some((3, string)) = value_kind(item)? {
                        push(utf8(string)?);
                    }
                }
            }
        }
        _ => {}
    }
    Ok(true)
}

/// [`each_endpoint`]'s strings as a list; `None` when the key is not there.
fn endpoint_list(
    metadata: Option<&[u8]>,
    namespace: &str,
    key: &str,
) -> Result<Option<Vec<String>>, DecodeError> {
    let mut out = Vec::new();
    let found = each_endpoint(metadata, namespace, key, |s| out.push(s.to_owned()))?;
    Ok(found.then_some(out))
}

/// The gateway's subset hint, from its encoded metadata: `None` when it set none (any
/// endpoint), else the endpoints it allows (possibly none: then nothing is eligible and the
/// answer is 503).
pub fn subset_hint(metadata: Option<&[u8]>) -> Result<Option<Vec<String>>, DecodeError> {
    endpoint_list(metadata, SUBSET_NAMESPACE, SUBSET_KEY)
}

/// The endpoint that served, as the gateway reports it in `envoy.lb` (its encoded metadata):
/// the first one named there.
pub fn served_endpoint(metadata: Option<&[u8]>) -> Result<Option<&str>, DecodeError> {
    let mut first = None;
    each_endpoint(metadata, DESTINATION_NAMESPACE, DESTINATION_SERVED, |s| {
        first.get_or_insert(s);
    })?;
    Ok(first)
}

/// Why the gateway's metadata could not be read.
#[derive(Debug, thiserror::Error)]
#[error("malformed metadata: {0}")]
pub struct DecodeError(&'static str);

/// The value of the last entry of the map field `tag` whose key is `key`.
fn map_value<'a>(message: &'a [u8], tag: u64, key: &str) -> Result<Option<&'a [u8]>, DecodeError> {
    let mut found = None;
    let mut fields = Fields(message);
    while let Some((field_tag, field)) = fields.next_field().map_err(DecodeError)? {
        let (true, Some(entry)) = (field_tag == tag, field) else { continue };
        // A map entry: { key (1), value (2) }, either possibly absent (empty).
        let (mut entry_key, mut entry_value): (&[u8], &[u8]) = (&[], &[]);
        let mut entry = Fields(entry);
        while let Some((entry_tag, field)) = entry.next_field().map_err(DecodeError)? {
            match (entry_tag, field) {
                (1, Some(bytes)) => entry_key = bytes,
                (2, Some(bytes)) => entry_value = bytes,
                _ => {}
            }
        }
        if entry_key == key.as_bytes() {
            found = Some(entry_value);
        }
    }
    Ok(found)
}

/// A `google.protobuf.Value`'s kind: the tag of its last oneof field and, if length-delimited,
/// its bytes.
fn value_kind(value: &[u8]) -> Result<Option<(u64, &[u8])>, DecodeError> {
    let mut kind = None;
    let mut fields = Fields(value);
    while let Some((tag, field)) = fields.next_field().map_err(DecodeError)? {
        if (1..=6).contains(&tag) {
            kind = Some((tag, field.unwrap_or_default()));
        }
    }
    Ok(kind)
}

fn utf8(bytes: &[u8]) -> Result<&str, DecodeError> {
    std::str::from_utf8(bytes).map_err(|_| DecodeError("a string is not UTF-8"))
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
    /// The pick: the `request_headers` answer (`request_body` if `in_body`: buffered mode) that sets
    /// [`DESTINATION_ENDPOINT`] to `endpoints` (and `content-length`, when the body is sent
    /// back streamed), clears the route cache, and puts `endpoints` in the `envoy.lb` dynamic
    /// metadata ([`pick_common`], [`pick_metadata`]); encoded by hand.
    Pick { in_body: bool, endpoints: String, content_length: Option<usize> },
    /// The response headers' answer, which changes nothing ([`response_headers`]): constant
    /// bytes.
    ResponseHeaders,
}

/// [`Answer::ResponseHeaders`] as a gRPC message: ProcessingResponse { response_headers (2):
/// HeadersResponse { response (1): CommonResponse {} } }.
const RESPONSE_HEADERS_ANSWER: [u8; 9] = [0, 0, 0, 0, 4, 0x12, 0x02, 0x0a, 0x00];

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
            Answer::Pick { in_body, endpoints, content_length } => {
                let common = pick_common(endpoints, *content_length);
                let mut answer = if *in_body { request_body(common) } else { request_headers(common) };
                answer.dynamic_metadata = Some(pick_metadata(endpoints));
                answer
            }
            Answer::ResponseHeaders => response_headers(),
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
            Answer::Pick { in_body, endpoints, content_length } => {
                encode_pick(in_body, &endpoints, content_length, out);
                None
            }
            Answer::ResponseHeaders => {
                out.extend_from_slice(&RESPONSE_HEADERS_ANSWER);
                None
            }
        }
    }
}

/// The length of a length-delimited field (one-byte tag) holding `len` bytes.
fn field_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

/// A length-delimited field's key (one-byte `tag`) and length.
fn put_field(out: &mut BytesMut, tag: u8, len: usize) {
    out.put_u8(tag << 3 | 2);
    encode_varint(len as u64, out);
}

/// [`Answer::Pick`] as a gRPC message.
fn encode_pick(in_body: bool, endpoints: &str, content_length: Option<usize>, out: &mut BytesMut) {
    let mut length_digits = itoa::Buffer::new();
    let length = content_length.map(|length| length_digits.format(length).as_bytes());
    // HeaderValue { key (1), raw_value (3) } in a HeaderValueOption { header (1) }.
    let header_value = |key: &str, value: &[u8]| field_len(key.len()) + field_len(value.len());
    let endpoint_header = header_value(DESTINATION_ENDPOINT, endpoints.as_bytes());
    let length_header = length.map(|length| header_value("content-length", length));
    // HeaderMutation { set_headers (1)... }
    let mutation =
        field_len(field_len(endpoint_header)) + length_header.map_or(0, |h| field_len(field_len(h)));
    // CommonResponse { header_mutation (2), clear_route_cache (5) }
    let common = field_len(mutation) + 2;
    // HeadersResponse / BodyResponse { response (1) }
    let answer = field_len(common);
    // Struct { fields (1): { key (1), value (2): Value { string_value (3) } } }
    let inner_entry = field_len(DESTINATION_ENDPOINT.len()) + field_len(field_len(endpoints.len()));
    let inner = field_len(inner_entry);
    // Struct { fields (1): { key (1): "envoy.lb", value (2): Value { struct_value (5) } } }
    let outer_entry = field_len(DESTINATION_NAMESPACE.len()) + field_len(field_len(inner));
    let metadata = field_len(outer_entry);
    let message = field_len(answer) + field_len(metadata);
    out.reserve(5 + message);
    out.put_u8(0);
    out.put_u32(u32::try_from(message).unwrap_or(u32::MAX));
    // ProcessingResponse { request_headers (1) | request_body (3), dynamic_metadata (8) }
    put_field(out, if in_body { 3 } else { 1 }, answer);
    put_field(out, 1, common);
    put_field(out, 2, mutation);
    let put_header = |out: &mut BytesMut, key: &str, value: &[u8], len: usize| {
        put_field(out, 1, field_len(len));
        put_field(out, 1, len);
        put_field(out, 1, key.len());
        out.put_slice(key.as_bytes());
        put_field(out, 3, value.len());
        out.put_slice(value);
    };
    put_header(out, DESTINATION_ENDPOINT, endpoints.as_bytes(), endpoint_header);
    if let (Some(length), Some(len)) = (length, length_header) {
        put_header(out, "content-length", length, len);
    }
    out.put_slice(&[5 << 3, 1]);
    put_field(out, 8, metadata);
    put_field(out, 1, outer_entry);
    put_field(out, 1, DESTINATION_NAMESPACE.len());
    out.put_slice(DESTINATION_NAMESPACE.as_bytes());
    put_field(out, 2, field_len(inner));
    put_field(out, 5, inner);
    put_field(out, 1, inner_entry);
    put_field(out, 1, DESTINATION_ENDPOINT.len());
    out.put_slice(DESTINATION_ENDPOINT.as_bytes());
    put_field(out, 2, field_len(endpoints.len()));
    put_field(out, 3, endpoints.len());
    out.put_slice(endpoints.as_bytes());
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

    /// What envoy-types decodes from the metadata, as the EPP read it before `endpoint_list`
    /// read the encoding itself.
    fn decoded_list(metadata: &[u8], namespace: &str, key: &str) -> Option<Vec<String>> {
        use envoy_types::pb::envoy::config::core::v3::Metadata;
        let metadata = Metadata::decode(metadata).expect("decodes");
        let value = metadata.filter_metadata.get(namespace)?.fields.get(key)?;
        let split =
            |s: &str| s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect();
        Some(match &value.kind {
            Some(Kind::StringValue(s)) => split(s),
            Some(Kind::ListValue(list)) => list
                .values
                .iter()
                .filter_map(
                    |v| if let Some(Kind::StringValue(s)) = &v.kind { Some(s.as_str()) } else { None },
                )
                .flat_map(split)
                .collect::<Vec<_>>(),
            _ => Vec::new(),
        })
    }

    /// The endpoint lists read from the encoding are the ones envoy-types decodes: strings,
    /// lists, other kinds, absent namespaces and keys, entries given twice (the last counts).
    #[test]
    fn endpoint_lists_read_from_the_encoding_as_decoded() {
        use envoy_types::pb::envoy::config::core::v3::Metadata;
        use envoy_types::pb::google::protobuf::ListValue;
        let string = |s: &str| Value { kind: Some(Kind::StringValue(s.into())) };
        let list = |items: Vec<Value>| Value { kind: Some(Kind::ListValue(ListValue { values: items })) };
        let values = [
            string("10.0.0.1:8000"),
            string(" 10.0.0.1:8000 , 10.0.0.2:8000,,"),
            string(""),
            list(vec![string("a,b"), Value { kind: Some(Kind::NumberValue(1.0)) }, string("c")]),
            list(vec![]),
            Value { kind: Some(Kind::BoolValue(true)) },
            Value { kind: None },
        ];
        let mut cases: Vec<Vec<u8>> = Vec::new();
        for value in &values {
            let inner = Struct { fields: [(DESTINATION_SERVED.to_owned(), value.clone())].into() };
            let other = Struct { fields: [("other".to_owned(), string("x"))].into() };
            let metadata = Metadata {
                filter_metadata: [(DESTINATION_NAMESPACE.to_owned(), inner), ("else".to_owned(), other)]
                    .into(),
                ..Default::default()
            };
            cases.push(metadata.encode_to_vec());
        }
        // A namespace given twice: the second entry counts.
        let twice = |first: &str, second: &str| {
            let entry = |s: &str| {
                let inner = Struct { fields: [(DESTINATION_SERVED.to_owned(), string(s))].into() };
                Metadata {
                    filter_metadata: [(DESTINATION_NAMESPACE.to_owned(), inner)].into(),
                    ..Default::default()
                }
                .encode_to_vec()
            };
            [entry(first), entry(second)].concat()
        };
        cases.push(twice("10.0.0.1:1", "10.0.0.2:2"));
        cases.push(Metadata::default().encode_to_vec());
        for metadata in &cases {
            for (namespace, key) in [
                (DESTINATION_NAMESPACE, DESTINATION_SERVED),
                (DESTINATION_NAMESPACE, "absent"),
                ("absent", DESTINATION_SERVED),
            ] {
                assert_eq!(
                    endpoint_list(Some(metadata), namespace, key).expect("reads"),
                    decoded_list(metadata, namespace, key),
                    "{metadata:?} {namespace} {key}"
                );
            }
        }
        assert_eq!(served_endpoint(Some(&twice("10.0.0.1:1", "10.0.0.2:2"))).unwrap(), Some("10.0.0.2:2"));
        assert_eq!(endpoint_list(None, DESTINATION_NAMESPACE, DESTINATION_SERVED).unwrap(), None);
        // Malformed: truncated, a bad wire type.
        let whole = &cases[0];
        assert!(endpoint_list(Some(&whole[..whole.len() - 1]), DESTINATION_NAMESPACE, DESTINATION_SERVED)
            .is_err());
        assert!(endpoint_list(Some(&[0x0b]), DESTINATION_NAMESPACE, DESTINATION_SERVED).is_err());
    }

    /// Names and values are valid exactly when `http` takes them.
    #[test]
    fn header_checks_agree_with_http() {
        let mut names: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        names.extend((0..=255u8).map(|b| vec![b'x', b'-', b, b'a']));
        names.extend([
            b"Content-Type".to_vec(),
            b"x-request-id".to_vec(),
            Vec::new(),
            vec![b'a'; 65_535],
            vec![b'a'; 65_536],
        ]);
        for name in &names {
            assert_eq!(valid_name(name), http::HeaderName::from_bytes(name).is_ok(), "{name:?}");
            assert_eq!(valid_value(name), http::HeaderValue::from_bytes(name).is_ok(), "{name:?}");
        }
    }

    /// Every answer decodes (with envoy-types) to the message it stands for, with the gRPC
    /// prefix's length right; long bodies are handed back uncopied, short ones copied.
    #[test]
    fn answers_encode_to_the_messages_they_stand_for() {
        let mut answers = vec![
            Answer::Message(response_headers()),
            Answer::ResponseHeaders,
            Answer::Message(request_headers(pick_common("10.0.0.1:8000,10.0.0.2:8000", Some(12)))),
            Answer::Pick { in_body: false, endpoints: "10.0.0.1:8000".into(), content_length: None },
            Answer::Pick {
                in_body: false,
                endpoints: "10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000".into(),
                content_length: Some(204_800),
            },
            Answer::Pick { in_body: true, endpoints: "e".repeat(300), content_length: Some(0) },
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
