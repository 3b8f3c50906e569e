//! Envoy's ext_proc messages as the EPP reads them: `ProcessingRequest` with only the fields
//! the EPP uses, decoded with less work than envoy-types' full message. Header names and
//! values and body chunks are `Bytes` slices of the received gRPC frame (no copy, no UTF-8
//! check, no allocation per header); fields the EPP does not read (`attributes`, flow control,
//! `observability_mode`) are skipped. Tags as in `envoy/service/ext_proc/v3/external_processor.proto`
//! and `envoy/config/core/v3/base.proto`.

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::service::ext_proc::v3::ProtocolConfiguration;

/// `envoy.service.ext_proc.v3.ProcessingRequest`, the fields the EPP reads.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessingRequest {
    #[prost(oneof = "Request", tags = "2, 3, 4, 5, 6, 7")]
    pub request: Option<Request>,
    #[prost(message, optional, tag = "8")]
    pub metadata_context: Option<Metadata>,
    #[prost(message, optional, tag = "11")]
    pub protocol_config: Option<ProtocolConfiguration>,
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

/// `envoy.service.ext_proc.v3.HttpHeaders`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpHeaders {
    #[prost(message, optional, tag = "1")]
    pub headers: Option<HeaderMap>,
    #[prost(bool, tag = "3")]
    pub end_of_stream: bool,
}

/// `envoy.config.core.v3.HeaderMap`.
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
