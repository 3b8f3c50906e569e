//! Envoy's ext_proc messages as the EPP reads them: `ProcessingRequest` with only the fields
//! the EPP uses, decoded with less work than envoy-types' full message. Header names and
//! values and body chunks are `Bytes` slices of the received gRPC frame (no copy, no UTF-8
//! check, no allocation per header); fields the EPP does not read (`attributes`, flow control,
//! `observability_mode`) are skipped. Tags as in `envoy/service/ext_proc/v3/external_processor.proto`
//! and `envoy/config/core/v3/base.proto`.

use crate::protobuf::Fields;
use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::service::ext_proc::v3::ProtocolConfiguration;

/// `envoy.service.ext_proc.v3.ProcessingRequest`, the fields the EPP reads.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessingRequest {
    #[prost(oneof = "Request", tags = "2, 3, 4, 5, 6, 7")]
    pub request: Option<Request>,
    /// `envoy.config.core.v3.Metadata`, kept encoded (a slice of the frame): only the
    /// headers' metadata is read ([`ProcessingRequest::metadata`]), and Envoy sends it with
    /// every message.
    #[prost(bytes = "bytes", optional, tag = "8")]
    pub metadata_context: Option<Bytes>,
    #[prost(message, optional, tag = "11")]
    pub protocol_config: Option<ProtocolConfiguration>,
}

impl ProcessingRequest {
    /// The gateway's metadata, decoded; `Ok(None)` when it sent none.
    pub fn metadata(&self) -> Result<Option<Metadata>, prost::DecodeError> {
        self.metadata_context
            .as_ref()
            .map(|bytes| <Metadata as prost::Message>::decode(bytes.clone()))
            .transpose()
    }
}

/// The variants are named as in Envoy's proto.
#[allow(clippy::enum_variant_names)]
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Request {
    #[prost(message, tag = "2")]
    RequestHeaders(HttpHeaders),
    #[prost(message, tag = "3")]
    ResponseHeaders(HttpHeaders),
    #[prost(message, tag = "4")]
    RequestBody(HttpBody),
    #[prost(message, tag = "5")]
    ResponseBody(HttpBody),
    /// The trailers themselves are not read.
    #[prost(message, tag = "6")]
    RequestTrailers(HttpTrailers),
    #[prost(message, tag = "7")]
    ResponseTrailers(HttpTrailers),
}

/// `envoy.service.ext_proc.v3.HttpHeaders`. The header map is kept encoded (a slice of the
/// frame) and read in place with [`HttpHeaders::iter`]: no list of headers is built, and only
/// the headers the EPP reads are looked at.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpHeaders {
    /// `envoy.config.core.v3.HeaderMap`, encoded.
    #[prost(bytes = "bytes", optional, tag = "1")]
    pub headers: Option<Bytes>,
    #[prost(bool, tag = "3")]
    pub end_of_stream: bool,
}

impl HttpHeaders {
    /// The headers in order, as `(key, value)`, read from the encoding: `HeaderMap { headers
    /// (1): HeaderValue { key (1), value (2), raw_value (3) } }`, the value being `raw_value`
    /// (which Envoy sends) or else `value`, as [`HeaderValue::value`] reads it. An item is an
    /// error where the encoding is malformed (then iteration stops).
    pub fn iter(&self) -> Headers<'_> {
        Headers { map: Fields(self.headers.as_deref().unwrap_or_default()), failed: false }
    }

    /// The header map as envoy-types' message decodes it, through the EPP's [`HeaderMap`]
    /// (tests, and the fuzz target's checks).
    pub fn decoded(&self) -> Result<HeaderMap, prost::DecodeError> {
        <HeaderMap as prost::Message>::decode(self.headers.clone().unwrap_or_default())
    }
}

/// One header: its key and value.
pub type Header<'a> = (&'a [u8], &'a [u8]);

/// The headers of an [`HttpHeaders`] ([`HttpHeaders::iter`]).
pub struct Headers<'a> {
    map: Fields<'a>,
    failed: bool,
}

impl<'a> Iterator for Headers<'a> {
    type Item = Result<Header<'a>, MalformedHeaders>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let item = self.read();
        match item {
            Ok(None) => None,
            Ok(Some(header)) => Some(Ok(header)),
            Err(error) => {
                self.failed = true;
                Some(Err(error))
            }
        }
    }
}

impl<'a> Headers<'a> {
    fn read(&mut self) -> Result<Option<Header<'a>>, MalformedHeaders> {
        while let Some((tag, field)) = self.map.next_field().map_err(MalformedHeaders)? {
            let (1, Some(header)) = (tag, field) else { continue };
            let (mut key, mut value, mut raw_value): (&[u8], &[u8], &[u8]) = (&[], &[], &[]);
            let mut fields = Fields(header);
            while let Some((tag, field)) = fields.next_field().map_err(MalformedHeaders)? {
                match (tag, field) {
                    (1, Some(bytes)) => key = bytes,
                    (2, Some(bytes)) => value = bytes,
                    (3, Some(bytes)) => raw_value = bytes,
                    _ => {}
                }
            }
            return Ok(Some((key, if raw_value.is_empty() { value } else { raw_value })));
        }
        Ok(None)
    }
}

/// A header map whose encoding is malformed.
#[derive(Debug, thiserror::Error)]
#[error("malformed header map: {0}")]
pub struct MalformedHeaders(&'static str);

/// `envoy.config.core.v3.HeaderMap`, decoded (see [`HttpHeaders::decoded`]).
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderMap {
    #[prost(message, repeated, tag = "1")]
    pub headers: Vec<HeaderValue>,
}

/// `envoy.config.core.v3.HeaderValue`: `key` and `value` are proto strings, read as bytes
/// (the same wire type) and checked where they are used (`http::HeaderName`/`HeaderValue`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValue {
    #[prost(bytes = "bytes", tag = "1")]
    pub key: Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    pub value: Bytes,
    #[prost(bytes = "bytes", tag = "3")]
    pub raw_value: Bytes,
}

impl HeaderValue {
    /// The value: `raw_value`, which Envoy sends, or `value`.
    pub fn value(&self) -> &[u8] {
        if self.raw_value.is_empty() {
            &self.value
        } else {
            &self.raw_value
        }
    }
}

/// `envoy.service.ext_proc.v3.HttpBody`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpBody {
    #[prost(bytes = "bytes", tag = "1")]
    pub body: Bytes,
    #[prost(bool, tag = "2")]
    pub end_of_stream: bool,
}

/// `envoy.service.ext_proc.v3.HttpTrailers`, its trailers skipped.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpTrailers {}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3 as core;
    use envoy_types::pb::envoy::service::ext_proc::v3 as full;
    use prost::Message;

    fn header(key: &str, value: &str, raw: &[u8]) -> core::HeaderValue {
        core::HeaderValue { key: key.into(), value: value.into(), raw_value: raw.to_vec() }
    }

    /// What envoy-types encodes, the EPP's subset decodes to the same fields.
    #[test]
    fn the_subset_decodes_what_envoy_types_encodes() {
        let headers = core::HeaderMap {
            headers: vec![header(":path", "", b"/v1/chat/completions"), header("x-session-id", "s1", b"")],
        };
        let config =
            full::ProtocolConfiguration { request_body_mode: 4, response_body_mode: 4, ..Default::default() };
        let messages = [
            full::ProcessingRequest {
                request: Some(full::processing_request::Request::RequestHeaders(full::HttpHeaders {
                    headers: Some(headers),
                    end_of_stream: false,
                    ..Default::default()
                })),
                protocol_config: Some(config),
                observability_mode: true,
                ..Default::default()
            },
            full::ProcessingRequest {
                request: Some(full::processing_request::Request::ResponseBody(full::HttpBody {
                    body: b"data: {}\n\n".to_vec(),
                    end_of_stream: true,
                    ..Default::default()
                })),
                ..Default::default()
            },
            full::ProcessingRequest {
                request: Some(full::processing_request::Request::RequestTrailers(full::HttpTrailers {
                    trailers: Some(core::HeaderMap { headers: vec![header("x-t", "v", b"")] }),
                })),
                ..Default::default()
            },
        ];
        for message in messages {
            let decoded = ProcessingRequest::decode(message.encode_to_vec().as_slice()).expect("decodes");
            assert_eq!(decoded.protocol_config, message.protocol_config);
            assert_eq!(decoded.metadata().expect("decodes"), message.metadata_context);
            match (decoded.request, message.request) {
                (
                    Some(Request::RequestHeaders(d)),
                    Some(full::processing_request::Request::RequestHeaders(f)),
                ) => {
                    assert_eq!(d.end_of_stream, f.end_of_stream);
                    let read: Vec<(&[u8], &[u8])> = d.iter().map(|h| h.expect("reads")).collect();
                    let fv = &f.headers.as_ref().unwrap().headers;
                    assert_eq!(read.len(), fv.len());
                    for (&(key, value), f) in read.iter().zip(fv) {
                        let fvalue =
                            if f.raw_value.is_empty() { f.value.as_bytes() } else { &f.raw_value[..] };
                        assert_eq!((key, value), (f.key.as_bytes(), fvalue));
                    }
                    let (d, f) = (d.decoded().unwrap().headers, f.headers.unwrap().headers);
                    assert_eq!(d.len(), f.len());
                    for (d, f) in d.iter().zip(&f) {
                        assert_eq!(
                            (&d.key[..], &d.value[..], &d.raw_value[..]),
                            (f.key.as_bytes(), f.value.as_bytes(), &f.raw_value[..])
                        );
                    }
                    assert_eq!(d[0].value(), b"/v1/chat/completions");
                    assert_eq!(d[1].value(), b"s1");
                }
                (
                    Some(Request::ResponseBody(d)),
                    Some(full::processing_request::Request::ResponseBody(f)),
                ) => {
                    assert_eq!((&d.body[..], d.end_of_stream), (&f.body[..], f.end_of_stream));
                }
                (
                    Some(Request::RequestTrailers(_)),
                    Some(full::processing_request::Request::RequestTrailers(_)),
                ) => {}
                (d, f) => panic!("decoded {d:?} from {f:?}"),
            }
        }
    }

    /// A malformed header map is an error when read, not a panic or a silent end.
    #[test]
    fn malformed_header_maps_are_errors() {
        let headers = core::HeaderMap { headers: vec![header("content-type", "", b"text/plain")] };
        let whole = headers.encode_to_vec();
        for cut in 1..whole.len() {
            let truncated =
                HttpHeaders { headers: Some(Bytes::copy_from_slice(&whole[..cut])), end_of_stream: false };
            assert!(truncated.iter().any(|h| h.is_err()), "{cut}");
        }
        let bad_wire_type = HttpHeaders { headers: Some(Bytes::from_static(&[0x0b])), end_of_stream: false };
        assert!(bad_wire_type.iter().next().expect("an item").is_err());
        assert_eq!(HttpHeaders::default().iter().count(), 0);
    }
}
