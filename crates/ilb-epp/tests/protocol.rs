//! The EPP protocol on loopback: ext_proc messages as Envoy sends them, through tonic, to a
//! real `Epp` over the data plane's `Router` with a manual snapshot (the engines' addresses
//! are never dialled: the gateway forwards, not the EPP).

mod support;

use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{body_mutation::Mutation, CommonResponse};
use std::sync::atomic::Ordering::Relaxed;
use support::*;

const ENGINES: [(&str, &str, f64); 3] = [
    ("e1", "http://10.0.0.1:8001", 1.0),
    ("e2", "http://10.0.0.2:8002", 1.0),
    ("e3", "http://10.0.0.3:8003", 1.0),
];

fn streamed_body(common: &CommonResponse) -> (Vec<u8>, bool) {
    match common.body_mutation.as_ref().and_then(|m| m.mutation.as_ref()) {
        Some(Mutation::StreamedResponse(s)) => (s.body.clone(), s.end_of_stream),
        other => panic!("expected a streamed body, got {other:?}"),
    }
}

fn headers_common(response: Response) -> CommonResponse {
    match response {
        Response::RequestHeaders(h) => h.response.unwrap_or_default(),
        other => panic!("expected a request headers answer, got {other:?}"),
    }
}

/// Sends a chat request in full-duplex mode (body in two chunks) and returns the endpoints
/// picked (header; the metadata is checked equal) and the body sent back.
async fn pick_duplex(stream: &mut Stream, session: Option<&str>, content: &str) -> (Vec<String>, Vec<u8>) {
    let body = chat_body("m", content);
    stream.send(request_headers(&chat_headers(session), false, DUPLEX)).await;
    let (a, b) = body.split_at(body.len() / 2);
    stream.send(request_body(a, false)).await;
    stream.send(request_body(b, true)).await;
    let answer = stream.recv().await.unwrap();
    let header_value = {
        let common = headers_common(answer.response.clone().unwrap());
        assert!(common.clear_route_cache, "the route is chosen again with the new header");
        assert_eq!(set_header(&common, "content-length"), Some(body.len().to_string()));
        set_header(&common, "x-gateway-destination-endpoint").expect("the destination header")
    };
    assert_eq!(
        metadata_endpoints(&answer).as_deref(),
        Some(header_value.as_str()),
        "header and metadata agree"
    );
    let mut echoed = Vec::new();
    loop {
        match stream.answer().await {
            Response::RequestBody(b) => {
                let (chunk, eos) = streamed_body(&b.response.unwrap_or_default());
                echoed.extend(chunk);
                if eos {
                    break;
                }
            }
            other => panic!("expected the request body back, got {other:?}"),
        }
    }
    assert_eq!(echoed, body, "the request body goes back unchanged");
    (header_value.split(',').map(str::to_owned).collect(), echoed)
}

#[tokio::test]
async fn full_duplex_pick_in_header_and_metadata_then_the_response_passes_through() {
    let (epp, mut client) = start(Some(&snapshot(&ENGINES))).await;
    let mut stream = Stream::open(&mut client).await;
    let (endpoints, _) = pick_duplex(&mut stream, Some("s1"), "hello").await;
    assert_eq!(endpoints.len(), 3, "primary and two fallbacks (max_attempts 3): {endpoints:?}");
    let distinct: std::collections::BTreeSet<_> = endpoints.iter().collect();
    assert_eq!(distinct.len(), 3, "fallbacks are other engines: {endpoints:?}");
    let installed = epp.router().installed().unwrap();
    let engine = |endpoint: &str| {
        installed.engines.iter().find(|e| ilb_dataplane::state::endpoint_of(e) == endpoint).unwrap().clone()
    };
    assert_eq!(
        engine(&endpoints[0]).in_flight.load(Relaxed),
        1,
        "the primary counts in flight from the pick"
    );

    // Envoy retried past the primary: the second endpoint served.
    stream.send(response_headers("200", "text/event-stream", Some(&endpoints[1]))).await;
    assert!(matches!(stream.answer().await, Response::ResponseHeaders(_)));
    assert_eq!(engine(&endpoints[0]).in_flight.load(Relaxed), 0);
    assert_eq!(engine(&endpoints[0]).counters.failures.load(Relaxed), 1, "the primary failed");
    assert_eq!(engine(&endpoints[1]).in_flight.load(Relaxed), 1, "in flight on the engine that served");
    for (i, chunk) in ["data: {\"a\":1}\n\n", "data: [DONE]\n\n"].iter().enumerate() {
        let last = i == 1;
        stream.send(response_body(chunk.as_bytes(), last)).await;
        match stream.answer().await {
            Response::ResponseBody(b) => {
                let (body, eos) = streamed_body(&b.response.unwrap_or_default());
                assert_eq!(body, chunk.as_bytes(), "streamed chunks pass through untouched");
                assert_eq!(eos, last);
            }
            other => panic!("expected a response body answer, got {other:?}"),
        }
    }
    assert_eq!(engine(&endpoints[1]).in_flight.load(Relaxed), 0, "the count ends with the body");
    assert_eq!(engine(&endpoints[1]).counters.failures.load(Relaxed), 0);

    // The session is remembered on the engine that served.
    let mut next = Stream::open(&mut client).await;
    let (again, _) = pick_duplex(&mut next, Some("s1"), "hello again").await;
    assert_eq!(again[0], endpoints[1], "the next turn goes where the last one was served");
    drop(next);
    epp.shutdown().await;
}

/// `GET path` on `addr` over a fresh connection: (status line, body).
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: epp\r\nconnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), conn.read_to_string(&mut text))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (head.lines().next().unwrap_or("").to_owned(), body.to_owned())
}

#[tokio::test]
async fn the_admin_listener_serves_the_routers_metrics_and_a_successor_may_bind_it() {
    let mut config = ilb_dataplane::DataPlaneConfig::new("127.0.0.1:0".parse().unwrap());
    config.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    let (epp, mut client) = start_with(config.clone(), Some(&snapshot(&ENGINES))).await;
    let admin = epp.admin_addr().expect("an admin listener");
    let mut stream = Stream::open(&mut client).await;
    let (endpoints, _) = pick_duplex(&mut stream, Some("s1"), "hello").await;

    let engine = ENGINES.iter().find(|e| e.1.ends_with(&endpoints[0])).unwrap().0;
    let metric = |metrics: &str, name: &str, labels: &str| -> String {
        let prefix = format!("{name}{{engine=\"{engine}\"{labels}}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} in:\n{metrics}"))
            .to_owned()
    };
    let (status, metrics) = http_get(admin, "/metrics").await;
    assert!(status.contains(" 200 "), "{status}");
    assert_eq!(metric(&metrics, "ilb_dataplane_engine_in_flight", ""), "1", "the pick is in flight");

    stream.send(response_headers("200", "application/json", Some(&endpoints[0]))).await;
    assert!(matches!(stream.answer().await, Response::ResponseHeaders(_)));
    stream.send(response_body(b"{}", true)).await;
    assert!(matches!(stream.answer().await, Response::ResponseBody(_)));
    let metrics = http_get(admin, "/metrics").await.1;
    assert_eq!(metric(&metrics, "ilb_dataplane_engine_in_flight", ""), "0", "the response ended");
    assert_eq!(metric(&metrics, "ilb_dataplane_engine_attempts_total", ",outcome=\"ok\""), "1");
    assert!(http_get(admin, "/health").await.0.contains(" 200 "));

    // A successor binds the same admin address while this one runs (a rolling restart).
    config.admin_listen = Some(admin);
    let (successor, _client) = start_with(config, Some(&snapshot(&ENGINES))).await;
    assert_eq!(successor.admin_addr(), Some(admin));
    drop(stream);
    successor.shutdown().await;
    epp.shutdown().await;
}

#[tokio::test]
async fn one_session_one_engine_and_new_sessions_spread() {
    let (epp, mut client) = start(Some(&snapshot(&ENGINES))).await;
    let mut primaries = std::collections::BTreeMap::<String, usize>::new();
    for session in 0..60 {
        let mut seen = None;
        for turn in 0..3 {
            let mut stream = Stream::open(&mut client).await;
            let (endpoints, _) =
                pick_duplex(&mut stream, Some(&format!("session-{session}")), &format!("t{turn}")).await;
            stream.send(response_headers("200", "application/json", Some(&endpoints[0]))).await;
            stream.answer().await;
            stream.send(response_body(b"{}", true)).await;
            stream.answer().await;
            match &seen {
                None => seen = Some(endpoints[0].clone()),
                Some(first) => assert_eq!(first, &endpoints[0], "session {session} moved at turn {turn}"),
            }
        }
        *primaries.entry(seen.unwrap()).or_default() += 1;
    }
    assert_eq!(primaries.len(), 3, "new sessions use every engine: {primaries:?}");
    assert!(primaries.values().all(|&n| n >= 8), "roughly equal weights: {primaries:?}");
    epp.shutdown().await;
}

#[tokio::test]
async fn buffered_mode_answers_headers_at_once_and_the_pick_on_the_body() {
    let (epp, mut client) = start(Some(&snapshot(&ENGINES))).await;
    let mut stream = Stream::open(&mut client).await;
    stream.send(request_headers(&chat_headers(None), false, BUFFERED)).await;
    let common = headers_common(stream.answer().await);
    assert_eq!(set_header(&common, "x-gateway-destination-endpoint"), None, "no pick before the body");
    stream.send(request_body(&chat_body("m", "x"), true)).await;
    let answer = stream.recv().await.unwrap();
    let Some(Response::RequestBody(body)) = answer.response.clone() else { panic!("{answer:?}") };
    let common = body.response.unwrap();
    let picked = set_header(&common, "x-gateway-destination-endpoint").unwrap();
    assert_eq!(metadata_endpoints(&answer), Some(picked.clone()));
    assert!(common.body_mutation.is_none(), "the buffered body is left as it is");
    stream.send(response_headers("200", "application/json", None)).await;
    assert!(matches!(stream.answer().await, Response::ResponseHeaders(_)));
    stream.send(response_body(b"{}", true)).await;
    let Response::ResponseBody(b) = stream.answer().await else { panic!() };
    assert!(b.response.unwrap_or_default().body_mutation.is_none());
    let installed = epp.router().installed().unwrap();
    assert!(installed.engines.iter().all(|e| e.in_flight.load(Relaxed) == 0));
    epp.shutdown().await;
}

/// An immediate response's status and JSON body.
async fn refused(stream: &mut Stream) -> (u16, serde_json::Value) {
    match stream.answer().await {
        Response::ImmediateResponse(r) => {
            (r.status.unwrap().code as u16, serde_json::from_slice(&r.body).expect("a JSON body"))
        }
        other => panic!("expected an immediate response, got {other:?}"),
    }
}

#[tokio::test]
async fn errors_are_immediate_responses_with_openai_bodies() {
    let (epp, mut client) = start(Some(&snapshot(&ENGINES))).await;
    let cases: Vec<(Vec<u8>, Vec<&str>, u16, &str)> = vec![
        (chat_body("nope", "x"), vec![], 404, "model_not_found"),
        (b"{not json".to_vec(), vec![], 400, "invalid_request"),
        (chat_body("m", "x"), vec![], 503, "no_healthy_engine"), // an empty subset
        (chat_body("m", "x"), vec!["10.9.9.9:1"], 503, "no_healthy_engine"),
    ];
    for (i, (body, subset, status, code)) in cases.into_iter().enumerate() {
        let mut stream = Stream::open(&mut client).await;
        let headers = request_headers(&chat_headers(None), false, DUPLEX);
        let headers = if i >= 2 { with_subset(headers, &subset) } else { headers };
        stream.send(headers).await;
        stream.send(request_body(&body, true)).await;
        let (got, json) = refused(&mut stream).await;
        assert_eq!((got, json["error"]["code"].as_str().unwrap()), (status, code), "case {i}: {json}");
    }
    // A subset of one: that engine, and no fallback outside it.
    let mut stream = Stream::open(&mut client).await;
    stream.send(with_subset(request_headers(&chat_headers(None), false, DUPLEX), &["10.0.0.2:8002"])).await;
    stream.send(request_body(&chat_body("m", "x"), true)).await;
    let common = headers_common(stream.answer().await);
    assert_eq!(set_header(&common, "x-gateway-destination-endpoint").as_deref(), Some("10.0.0.2:8002"));
    epp.shutdown().await;
}

#[tokio::test]
async fn no_snapshot_is_503_and_health_follows_readiness() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let (epp, mut client) = start(None).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", epp.local_addr())).unwrap();
    let mut health = HealthClient::new(channel.connect().await.unwrap());
    let status = |health: &mut HealthClient<_>, service: &str| {
        let request = HealthCheckRequest { service: service.to_owned() };
        let mut health: HealthClient<tonic::transport::Channel> = std::mem::replace(health, health.clone());
        async move { health.check(request).await.unwrap().into_inner().status }
    };
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    let not_serving = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;
    assert_eq!(status(&mut health, "liveness").await, serving);
    assert_eq!(status(&mut health, "readiness").await, not_serving);
    assert_eq!(status(&mut health, ilb_epp::EXT_PROC_SERVICE).await, not_serving);
    let mut stream = Stream::open(&mut client).await;
    stream.send(request_headers(&chat_headers(None), false, DUPLEX)).await;
    stream.send(request_body(&chat_body("m", "x"), true)).await;
    let (code, json) = refused(&mut stream).await;
    assert_eq!((code, json["error"]["code"].as_str()), (503, Some("no_snapshot")));

    epp.router().install(&snapshot(&ENGINES)).unwrap();
    #[allow(clippy::disallowed_methods)] // the hang guard's deadline
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while status(&mut health, "readiness").await != serving {
        #[allow(clippy::disallowed_methods)]
        let late = std::time::Instant::now() > deadline;
        assert!(!late, "not ready 10 s after the install");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(status(&mut health, ilb_epp::EXT_PROC_SERVICE).await, serving);
    epp.shutdown().await;
}

#[tokio::test]
async fn malformed_streams_end_with_invalid_argument_and_the_server_goes_on() {
    let (epp, mut client) = start(Some(&snapshot(&ENGINES))).await;
    // A body before any headers.
    let mut stream = Stream::open(&mut client).await;
    stream.send(request_body(b"{}", true)).await;
    assert_eq!(stream.recv().await.unwrap_err().code(), tonic::Code::InvalidArgument);
    // A message without a request.
    let mut stream = Stream::open(&mut client).await;
    stream.send(Default::default()).await;
    assert_eq!(stream.recv().await.unwrap_err().code(), tonic::Code::InvalidArgument);
    // Headers twice.
    let mut stream = Stream::open(&mut client).await;
    stream.send(request_headers(&chat_headers(None), false, DUPLEX)).await;
    stream.send(request_headers(&chat_headers(None), false, DUPLEX)).await;
    assert_eq!(stream.recv().await.unwrap_err().code(), tonic::Code::InvalidArgument);
    // An unsupported body mode gets an error response, not a hang.
    let mut stream = Stream::open(&mut client).await;
    let mode = envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode::Streamed;
    stream.send(request_headers(&chat_headers(None), false, Some((mode, mode)))).await;
    let (code, _) = refused(&mut stream).await;
    assert_eq!(code, 400);
    // A header value that is not a valid header value.
    let mut stream = Stream::open(&mut client).await;
    stream
        .send(request_headers(&[(":path", "/v1/chat/completions"), ("x-bad", "a\nb")], false, DUPLEX))
        .await;
    assert_eq!(refused(&mut stream).await.0, 400);
    // And the server still answers.
    let mut stream = Stream::open(&mut client).await;
    let (endpoints, _) = pick_duplex(&mut stream, None, "still here").await;
    assert!(!endpoints.is_empty());
    epp.shutdown().await;
}

/// Sends a Responses API request (`/v1/responses`, full duplex, one body chunk) and returns
/// the endpoints picked.
async fn pick_responses(stream: &mut Stream, body: &str) -> Vec<String> {
    let headers = [
        (":method", "POST"),
        (":path", "/v1/responses"),
        (":authority", "gw"),
        ("content-type", "application/json"),
    ];
    stream.send(request_headers(&headers, false, DUPLEX)).await;
    stream.send(request_body(body.as_bytes(), true)).await;
    let common = headers_common(stream.answer().await);
    let endpoints = set_header(&common, "x-gateway-destination-endpoint").expect("the destination header");
    loop {
        match stream.answer().await {
            Response::RequestBody(b) => {
                if streamed_body(&b.response.unwrap_or_default()).1 {
                    break;
                }
            }
            other => panic!("expected the request body back, got {other:?}"),
        }
    }
    endpoints.split(',').map(str::to_owned).collect()
}

/// A Responses API answer names the response its engine stored; a follow-up naming it
/// (`previous_response_id`) must reach that engine, which alone has it. The EPP reads the id
/// from the body passing through (a JSON body or the stream's `response.created` event, split
/// across chunks), from the engine the gateway says served (here a fallback).
#[tokio::test]
async fn a_follow_up_reaches_the_engine_that_stored_its_previous_response() {
    let (epp, mut client) = start(Some(&snapshot(&ENGINES))).await;
    for i in 0..6 {
        let mut stream = Stream::open(&mut client).await;
        let endpoints =
            pick_responses(&mut stream, &format!(r#"{{"model":"m","input":"question {i}"}}"#)).await;
        assert!(endpoints.len() >= 2, "a primary and a fallback: {endpoints:?}");
        let (stored_by, id) = (&endpoints[endpoints.len() - 1], format!("resp_{i}"));
        let body = if i % 2 == 0 {
            stream.send(response_headers("200", "text/event-stream", Some(stored_by))).await;
            format!(
                "event: response.created\ndata: {{\"type\":\"response.created\",\"response\":{{\"id\":\"{id}\"}}}}\n\n\
                 event: response.completed\ndata: {{}}\n\n"
            )
        } else {
            stream.send(response_headers("200", "application/json", Some(stored_by))).await;
            format!(r#"{{"id":"{id}","object":"response","output":[]}}"#)
        };
        assert!(matches!(stream.answer().await, Response::ResponseHeaders(_)));
        let (a, b) = body.as_bytes().split_at(20);
        stream.send(response_body(a, false)).await;
        stream.answer().await;
        stream.send(response_body(b, true)).await;
        stream.answer().await;

        let mut follow_up = Stream::open(&mut client).await;
        let body = format!(r#"{{"model":"m","input":"and then {i}?","previous_response_id":"{id}"}}"#);
        let again = pick_responses(&mut follow_up, &body).await;
        assert_eq!(&again[0], stored_by, "{id} was stored by {stored_by}");
    }
    epp.shutdown().await;
}
