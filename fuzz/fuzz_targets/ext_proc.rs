//! Fuzz target: the EPP's ext_proc streams, the messages a gateway sends `ilb epp`.
//!
//! The input is a sequence of frames, each a little-endian `u16` length and that many bytes,
//! decoded as the EPP decodes them (`ilb_epp::inbound::ProcessingRequest`) and handed in order to one
//! [`ilb_epp::Stream`] over a router with three engines installed: headers (`wire::read_headers`,
//! the subset hint, the endpoint that served), bodies in any mode, trailers, in any order. Besides
//! "never panics", it checks what the gateway and the router rely on: every pick names only
//! installed engines, in the header and the metadata alike; an immediate response ends the
//! stream; and once the stream is dropped (Envoy closed it, whatever state it was in), no
//! engine still counts a request in flight.

#![no_main]

use envoy_types::pb::envoy::service::ext_proc::v3::{processing_response, ProcessingResponse};
use ilb_epp::inbound::ProcessingRequest;
use envoy_types::pb::google::protobuf::value::Kind;
use ilb_dataplane::{DataPlaneConfig, Router, SnapshotSource};
use libfuzzer_sys::fuzz_target;
use prost::Message;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};

const ENGINES: [&str; 3] = ["127.0.0.1:18001", "127.0.0.1:18002", "127.0.0.1:18003"];

struct World {
    runtime: tokio::runtime::Runtime,
    router: Arc<Router>,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let router = runtime.block_on(async {
            let config = DataPlaneConfig::new("127.0.0.1:0".parse().unwrap());
            let router = Router::start(config, SnapshotSource::Manual, None);
            let engines: Vec<String> = ENGINES
                .iter()
                .enumerate()
                .map(|(i, addr)| format!(r#"{{"id": "e{i}", "url": "http://{addr}"}}"#))
                .collect();
            let weights: Vec<String> =
                (0..ENGINES.len()).map(|i| format!(r#"{{"engine": "e{i}", "weight": 1}}"#)).collect();
            let json = format!(
                r#"{{"format": 1, "version": 1, "created_unix_ms": 0, "cluster": "a", "engines": [{}],
                    "models": [{{"model": "m", "classes": [{{"id": "default", "weights": [{}]}}]}}]}}"#,
                engines.join(","),
                weights.join(",")
            );
            router.install_json(json.as_bytes()).expect("the fuzz target's snapshot installs");
            router
        });
        World { runtime, router: Arc::new(router) }
    })
}

/// The frames of `data`: a u16 length (little-endian), then the bytes; a short tail is one frame.
fn frames(mut data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while data.len() >= 2 {
        let len = usize::from(u16::from_le_bytes([data[0], data[1]]));
        let rest = &data[2..];
        let take = len.min(rest.len());
        out.push(&rest[..take]);
        data = &rest[take..];
    }
    out
}

/// The endpoints a pick names, if `answer` carries one.
fn picked(answer: &envoy_types::pb::envoy::service::ext_proc::v3::ProcessingResponse) -> Option<Vec<String>> {
    let common = match answer.response.as_ref()? {
        processing_response::Response::RequestHeaders(h) => h.response.as_ref()?,
        processing_response::Response::RequestBody(b) => b.response.as_ref()?,
        _ => return None,
    };
    let header = common.header_mutation.as_ref()?.set_headers.iter().find_map(|h| {
        let h = h.header.as_ref()?;
        (h.key == ilb_epp::wire::DESTINATION_ENDPOINT).then(|| {
            if h.raw_value.is_empty() {
                h.value.clone()
            } else {
                String::from_utf8_lossy(&h.raw_value).into_owned()
            }
        })
    })?;
    Some(header.split(',').map(str::to_owned).collect())
}

fuzz_target!(|data: &[u8]| {
    let world = world();
    world.runtime.block_on(async {
        let mut stream = ilb_epp::Stream::new(Arc::clone(&world.router));
        for frame in frames(data) {
            let Ok(message) = ProcessingRequest::decode(frame) else { continue };
            let mut out = Vec::new();
            match stream.handle(message, &mut out) {
                Ok(ilb_epp::Step::Answered) => {}
                Ok(ilb_epp::Step::Pick(mut pick)) => {
                    std::future::poll_fn(|cx| stream.poll_pick(&mut pick, cx, &mut out)).await
                }
                Err(_) => break,
            }
            for answer in out {
                // What goes on the wire is the message the answer stands for.
                let mut wire = bytes::BytesMut::new();
                let rest = answer.clone().encode(&mut wire);
                wire.extend_from_slice(rest.as_deref().unwrap_or_default());
                let answer = &answer.to_message();
                assert_eq!(wire[0], 0, "uncompressed");
                assert_eq!(u32::from_be_bytes([wire[1], wire[2], wire[3], wire[4]]) as usize, wire.len() - 5);
                assert_eq!(&ProcessingResponse::decode(&wire[5..]).expect("the answer decodes"), answer);
                if let Some(endpoints) = picked(answer) {
                    assert!(!endpoints.is_empty());
                    for endpoint in &endpoints {
                        assert!(
                            ENGINES.contains(&endpoint.as_str()),
                            "picked {endpoint}, not an installed engine"
                        );
                    }
                    let metadata = answer.dynamic_metadata.as_ref().expect("a pick comes with its metadata");
                    let Some(Kind::StructValue(lb)) =
                        &metadata.fields[ilb_epp::wire::DESTINATION_NAMESPACE].kind
                    else {
                        panic!("envoy.lb is not a struct: {metadata:?}")
                    };
                    let Some(Kind::StringValue(listed)) =
                        &lb.fields[ilb_epp::wire::DESTINATION_ENDPOINT].kind
                    else {
                        panic!("no endpoints in envoy.lb: {lb:?}")
                    };
                    assert_eq!(
                        listed.split(',').collect::<Vec<_>>(),
                        endpoints,
                        "header and metadata differ"
                    );
                }
                if matches!(answer.response, Some(processing_response::Response::ImmediateResponse(_))) {
                    assert!(stream.done(), "an immediate response ends the stream");
                }
            }
            if stream.done() {
                break;
            }
        }
        drop(stream);
        let installed = world.router.installed().unwrap();
        for engine in &installed.engines {
            assert_eq!(
                engine.in_flight.load(Relaxed),
                0,
                "{} counts a request after its stream ended",
                engine.id
            );
        }
    });
});
