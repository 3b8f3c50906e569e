//! Drain: an engine that leaves the snapshot gets no new requests, its streams already running
//! finish, its idle connections close at once and the busy ones as their responses end, and
//! its conversations move to the remaining engines without errors.

mod support;

use http_body_util::BodyExt;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;
use support::*;

const DEADLINE: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_removed_engine_finishes_its_streams_then_its_connections_close() {
    let e1 = MockEngine::start("e1").await;
    let e2 = MockEngine::start("e2").await;
    let dp = data_plane(config(), &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let client = client();

    // A stream held open at its second chunk, and a quick request beside it: e1 then has one
    // busy connection and one idle in the pool.
    let stream_req = post(
        &dp.url(),
        "/v1/chat/completions",
        &chat_body("s"),
        &[("x-mock-chunks", "5"), ("x-mock-gate", "1")],
    );
    let stream = client.request(stream_req).await.unwrap();
    assert_eq!(stream.status(), 200);
    let (status, headers, _) =
        send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body("q"), &[])).await;
    assert_eq!((status.as_u16(), engine_of(&headers).as_str()), (200, "e1"));
    assert!(eventually(DEADLINE, || e1.connections.load(SeqCst) == 2).await);
    assert_eq!(e1.closed.load(SeqCst), 0, "both connections are open while e1 is in the snapshot");

    dp.install(&snapshot(2, &[("e2", e2.url(), 1.0)])).unwrap();
    // The idle connection closes now; the busy one stays while its stream runs.
    assert!(eventually(DEADLINE, || e1.closed.load(SeqCst) == 1).await, "the idle connection was not closed");
    for i in 0..20 {
        let key = format!("after-{i}");
        let (status, headers, _) = send(
            &client,
            post(&dp.url(), "/v1/chat/completions", &chat_body(&key), &[("x-session-id", &key)]),
        )
        .await;
        assert_eq!(
            (status.as_u16(), engine_of(&headers).as_str()),
            (200, "e2"),
            "new requests go to e2 only"
        );
    }
    assert_eq!(e1.closed.load(SeqCst), 1, "the busy connection closed before its stream ended");

    e1.gate.notify_one();
    let body = stream.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("\"chunk\":4") && text.ends_with("data: [DONE]\n\n"), "stream cut: {text}");
    // Its last response over, the drained engine's connection closes instead of going back.
    assert!(eventually(DEADLINE, || e1.closed.load(SeqCst) == 2).await, "the drained connection stayed open");
    assert_eq!(e1.cancelled.load(SeqCst), 0);
    dp.shutdown().await;
}

#[tokio::test]
async fn an_engine_that_comes_back_before_its_drain_ends_pools_again() {
    let e1 = MockEngine::start("e1").await;
    let e2 = MockEngine::start("e2").await;
    let dp = data_plane(config(), &snapshot(1, &[("e1", e1.url(), 1.0), ("e2", e2.url(), 1.0)])).await;
    let client = client();
    let stream_req = post(
        &dp.url(),
        "/v1/chat/completions",
        &chat_body("s"),
        &[("x-mock-chunks", "3"), ("x-mock-gate", "1"), ("x-session-id", "k")],
    );
    let stream = client.request(stream_req).await.unwrap();
    let engine = engine_of(stream.headers());
    let (gone, other) = if engine == "e1" { (&e1, &e2) } else { (&e2, &e1) };
    let (gone_id, other_id) = if engine == "e1" { ("e1", "e2") } else { ("e2", "e1") };
    dp.install(&snapshot(2, &[(other_id, other.url(), 1.0)])).unwrap();
    dp.install(&snapshot(3, &[(other_id, other.url(), 1.0), (gone_id, gone.url(), 1.0)])).unwrap();
    gone.gate.notify_one();
    let body = stream.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).ends_with("data: [DONE]\n\n"));
    // Back in the snapshot, its connection goes back to the pool and is reused.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(gone.closed.load(SeqCst), 0, "an engine back in the snapshot keeps its connection");
    dp.shutdown().await;
}

#[tokio::test]
async fn conversations_of_a_removed_engine_move_without_errors() {
    let engines =
        [MockEngine::start("e1").await, MockEngine::start("e2").await, MockEngine::start("e3").await];
    let all: Vec<(&str, String, f64)> = engines.iter().map(|e| (e.name.as_str(), e.url(), 1.0)).collect();
    let dp = data_plane(config(), &snapshot(1, &all)).await;
    let client = client();
    let mut first = std::collections::HashMap::new();
    for i in 0..60 {
        let key = format!("conv-{i}");
        let (status, headers, _) = send(
            &client,
            post(&dp.url(), "/v1/chat/completions", &chat_body(&key), &[("x-session-id", &key)]),
        )
        .await;
        assert_eq!(status, 200);
        first.insert(key, engine_of(&headers));
    }
    assert!(first.values().any(|e| e == "e3"), "some conversations sit on e3");
    dp.install(&snapshot(2, &all[..2])).unwrap();
    for (key, was) in &first {
        let (status, headers, _) =
            send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body(key), &[("x-session-id", key)]))
                .await;
        assert_eq!(status, 200, "conversation {key} failed after its engine left");
        let now = engine_of(&headers);
        assert_ne!(now, "e3");
        if was != "e3" {
            assert_eq!(&now, was, "a conversation on a remaining engine stays there");
        }
    }
    dp.shutdown().await;
}
