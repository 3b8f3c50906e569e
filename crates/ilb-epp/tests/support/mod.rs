//! Helpers of the EPP's tests: an EPP on loopback over a manual snapshot, and ext_proc
//! messages as Envoy sends them.
#![allow(dead_code)]

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request::Request, processing_response::Response, HttpBody, HttpHeaders, ProcessingRequest,
    ProcessingResponse, ProtocolConfiguration,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use ilb_dataplane::{DataPlaneConfig, Router, SnapshotSource};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// A snapshot of model `m` over `engines` (id, url, weight).
pub fn snapshot(engines: &[(&str, &str, f64)]) -> ilb_core::snapshot::Snapshot {
    let list: Vec<String> =
        engines.iter().map(|(id, url, _)| format!(r#"{{"id": "{id}", "url": "{url}"}}"#)).collect();
    let weights: Vec<String> =
        engines.iter().map(|(id, _, w)| format!(r#"{{"engine": "{id}", "weight": {w}}}"#)).collect();
    let json = format!(
        r#"{{"format": 1, "version": 1, "created_unix_ms": 0, "cluster": "a",
            "engines": [{}],
            "models": [{{"model": "m", "classes": [{{"id": "default", "weights": [{}]}}]}}]}}"#,
        list.join(","),
        weights.join(",")
    );
    ilb_core::snapshot::Snapshot::from_json(json.as_bytes()).unwrap()
}

/// An EPP on loopback routing over `snapshot` (none: not ready), and a client.
pub async fn start(
    snapshot: Option<&ilb_core::snapshot::Snapshot>,
) -> (ilb_epp::Epp, ExternalProcessorClient<Channel>) {
    start_with(DataPlaneConfig::new("127.0.0.1:0".parse().unwrap()), snapshot).await
}

/// As [`start`], with the router's `config`.
pub async fn start_with(
    config: DataPlaneConfig,
    snapshot: Option<&ilb_core::snapshot::Snapshot>,
) -> (ilb_epp::Epp, ExternalProcessorClient<Channel>) {
    let router = Router::start(config, SnapshotSource::Manual, None);
    if let Some(snapshot) = snapshot {
        router.install(snapshot).unwrap();
    }
    let epp = ilb_epp::Epp::start("127.0.0.1:0".parse().unwrap(), router).await.unwrap();
    let client = ExternalProcessorClient::connect(format!("http://{}", epp.local_addr())).await.unwrap();
    (epp, client)
}

/// One open ext_proc stream: send messages, receive answers.
pub struct Stream {
    pub tx: mpsc::Sender<ProcessingRequest>,
    pub rx: tonic::Streaming<ProcessingResponse>,
}

impl Stream {
    pub async fn open(client: &mut ExternalProcessorClient<Channel>) -> Stream {
        let (tx, rx) = mpsc::channel(64);
        let rx = client.process(ReceiverStream::new(rx)).await.unwrap().into_inner();
        Stream { tx, rx }
    }

    pub async fn send(&self, message: ProcessingRequest) {
        self.tx.send(message).await.unwrap();
    }

    /// The next answer (a hang guard fails the test after 10 s).
    pub async fn recv(&mut self) -> Result<ProcessingResponse, tonic::Status> {
        match tokio::time::timeout(std::time::Duration::from_secs(10), self.rx.message()).await {
            Ok(Ok(Some(message))) => Ok(message),
            Ok(Ok(None)) => panic!("stream ended without an answer"),
            Ok(Err(status)) => Err(status),
            Err(_) => panic!("no answer within 10 s"),
        }
    }

    pub async fn answer(&mut self) -> Response {
        self.recv().await.unwrap().response.expect("an answer with a response")
    }
}

fn header_map(headers: &[(&str, &str)]) -> HeaderMap {
    HeaderMap {
        headers: headers
            .iter()
            .map(|(k, v)| HeaderValue {
                key: (*k).to_owned(),
                raw_value: v.as_bytes().to_vec(),
                ..Default::default()
            })
            .collect(),
    }
}

/// The request's headers as Envoy's first message, in the given body modes.
pub fn request_headers(
    headers: &[(&str, &str)],
    end_of_stream: bool,
    modes: Option<(BodySendMode, BodySendMode)>,
) -> ProcessingRequest {
    ProcessingRequest {
        protocol_config: modes.map(|(request, response)| ProtocolConfiguration {
            request_body_mode: request as i32,
            response_body_mode: response as i32,
            send_body_without_waiting_for_header_response: false,
        }),
        request: Some(Request::RequestHeaders(HttpHeaders {
            headers: Some(header_map(headers)),
            end_of_stream,
            ..Default::default()
        })),
        ..Default::default()
    }
}

pub const DUPLEX: Option<(BodySendMode, BodySendMode)> =
    Some((BodySendMode::FullDuplexStreamed, BodySendMode::FullDuplexStreamed));
pub const BUFFERED: Option<(BodySendMode, BodySendMode)> =
    Some((BodySendMode::Buffered, BodySendMode::Buffered));

pub fn chat_headers(session: Option<&str>) -> Vec<(&str, &str)> {
    let mut headers = vec![
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        (":authority", "gw"),
        ("content-type", "application/json"),
    ];
    if let Some(session) = session {
        headers.push(("x-session-id", session));
    }
    headers
}

pub fn chat_body(model: &str, content: &str) -> Vec<u8> {
    format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"{content}"}}],"max_tokens":3}}"#)
        .into_bytes()
}

pub fn request_body(body: &[u8], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::RequestBody(HttpBody {
            body: body.to_vec(),
            end_of_stream,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// Response headers, with the endpoint that served in `envoy.lb` when given.
pub fn response_headers(status: &str, content_type: &str, served: Option<&str>) -> ProcessingRequest {
    let metadata_context = served.map(|served| {
        let inner = Struct {
            fields: [(
                "x-gateway-destination-endpoint-served".to_owned(),
                Value { kind: Some(Kind::StringValue(served.to_owned())) },
            )]
            .into(),
        };
        Metadata { filter_metadata: [("envoy.lb".to_owned(), inner)].into(), ..Default::default() }
    });
    ProcessingRequest {
        metadata_context,
        request: Some(Request::ResponseHeaders(HttpHeaders {
            headers: Some(header_map(&[(":status", status), ("content-type", content_type)])),
            end_of_stream: false,
            ..Default::default()
        })),
        ..Default::default()
    }
}

pub fn response_body(body: &[u8], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::ResponseBody(HttpBody {
            body: body.to_vec(),
            end_of_stream,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// The subset hint as Envoy's metadata.
pub fn with_subset(mut message: ProcessingRequest, subset: &[&str]) -> ProcessingRequest {
    let list = envoy_types::pb::google::protobuf::ListValue {
        values: subset.iter().map(|s| Value { kind: Some(Kind::StringValue((*s).to_owned())) }).collect(),
    };
    let inner = Struct {
        fields: [(
            "x-gateway-destination-endpoint-subset".to_owned(),
            Value { kind: Some(Kind::ListValue(list)) },
        )]
        .into(),
    };
    message.metadata_context = Some(Metadata {
        filter_metadata: [("envoy.lb.subset_hint".to_owned(), inner)].into(),
        ..Default::default()
    });
    message
}

/// The header `name`'s value in a common response's header mutation.
pub fn set_header(
    common: &envoy_types::pb::envoy::service::ext_proc::v3::CommonResponse,
    name: &str,
) -> Option<String> {
    common.header_mutation.as_ref()?.set_headers.iter().find_map(|h| {
        let h = h.header.as_ref()?;
        (h.key == name).then(|| String::from_utf8_lossy(&h.raw_value).into_owned())
    })
}

/// `envoy.lb`.`x-gateway-destination-endpoint` of a response's dynamic metadata.
pub fn metadata_endpoints(response: &ProcessingResponse) -> Option<String> {
    let lb = response.dynamic_metadata.as_ref()?.fields.get("envoy.lb")?;
    let Some(Kind::StructValue(lb)) = &lb.kind else { return None };
    match &lb.fields.get("x-gateway-destination-endpoint")?.kind {
        Some(Kind::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}
