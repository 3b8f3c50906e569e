//! Data plane end to end on loopback: routing, streaming, affinity, weights, errors, faults.
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines

mod support;

use http_body_util::BodyExt;
use ilb_dataplane::{DataPlane, DataPlaneConfig};
use std::collections::HashMap;
use std::time::Duration;
use support::*;

#[tokio::test]
async fn forwards_body_unchanged_and_explains_the_route() {
    let e1 = MockEngine::start("e1").await;
    let mut cfg = config();
    cfg.route_header = ilb_dataplane::config::RouteHeader::Full;
    let dp = data_plane(cfg, &snapshot(3, &[("e1", e1.url(), 1.0)])).await;
    let body =
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"unknown_field":{"keep":[1,2.50,"x"]}}"#;
    let req =
        post(&dp.url(), "/v1/chat/completions", body, &[("connection", "keep-alive"), ("x-custom", "1")]);
    let (status, headers, text) = send(&client(), req).await;
    assert_eq!(status, 200);
    assert_eq!(text, body, "engine must receive the client's bytes unchanged");
    let route = headers["x-ilb-route"].to_str().unwrap();
    assert!(route.starts_with("engine=e1; class=default; weight=1.0000; snapshot=3"), "{route}");
    let seen = headers["x-seen-headers"].to_str().unwrap();
    assert!(seen.contains("x-custom"), "{seen}");
    assert!(seen.contains("traceparent"), "a traceparent is created when absent: {seen}");
    assert!(!seen.contains("\"connection\""), "hop-by-hop header forwarded: {seen}");
    // W3C trace context: version 00, a 32-hex trace id, a 16-hex parent id, sampled.
    let tp = headers["x-seen-traceparent"].to_str().unwrap();
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!(parts.len(), 4, "{tp}");
    assert_eq!((parts[0], parts[3]), ("00", "01"), "{tp}");
    for (part, len) in [(parts[1], 32), (parts[2], 16)] {
        assert_eq!(part.len(), len, "{tp}");
        assert!(part.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)), "{tp}");
        assert!(part.bytes().any(|b| b != b'0'), "all-zero ids are invalid: {tp}");
    }
}

#[tokio::test]
async fn streams_chunks_as_they_arrive() {
    let e1 = MockEngine::start("e1").await;
    let dp = data_plane(config(), &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let req = post(
        &dp.url(),
        "/v1/chat/completions",
        &chat_body("s"),
        &[("x-mock-chunks", "3"), ("x-mock-gate", "1")],
    );
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    // The engine holds chunk 2 until the gate opens: chunk 1 must reach us before that.
    let first =
        tokio::time::timeout(Duration::from_secs(5), body.frame()).await.expect("first chunk was buffered");
    let first = first.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"data: {\"chunk\":0}\n\n");
    e1.gate.notify_one();
    let rest = body.collect().await.unwrap().to_bytes();
    assert!(rest.ends_with(b"data: [DONE]\n\n"));
}

#[tokio::test]
async fn same_session_same_engine_and_shares_follow_weights() {
    let engines = [MockEngine::start("a").await, MockEngine::start("b").await, MockEngine::start("c").await];
    let snap = snapshot(
        1,
        &[("a", engines[0].url(), 0.5), ("b", engines[1].url(), 0.3), ("c", engines[2].url(), 0.2)],
    );
    let dp = data_plane(config(), &snap).await;
    let client = client();
    // Affinity: one session always lands on one engine.
    let mut first = None;
    for _ in 0..20 {
        let req = post(&dp.url(), "/v1/chat/completions", &chat_body("x"), &[("x-session-id", "conv-42")]);
        let (status, headers, _) = send(&client, req).await;
        assert_eq!(status, 200);
        let engine = engine_of(&headers);
        assert_eq!(first.get_or_insert(engine.clone()), &engine);
    }
    // Shares: 3,000 sessions split about 50/30/20.
    let mut hits: HashMap<String, usize> = HashMap::new();
    let n = 3000;
    for i in 0..n {
        let key = format!("session-{i}");
        let req = post(&dp.url(), "/v1/chat/completions", &chat_body(&key), &[("x-session-id", &key)]);
        let (_, headers, _) = send(&client, req).await;
        *hits.entry(engine_of(&headers)).or_default() += 1;
    }
    for (engine, weight) in [("a", 0.5), ("b", 0.3), ("c", 0.2)] {
        let share = hits[engine] as f64 / n as f64;
        // 3,000 keys: binomial noise is ≤ 2.2 points at 3σ.
        assert!((share - weight).abs() < 0.03, "{engine}: {share} vs {weight}");
    }
}

#[tokio::test]
async fn weight_change_moves_few_keys() {
    let (a, b, c) =
        (MockEngine::start("a").await, MockEngine::start("b").await, MockEngine::start("c").await);
    let old = snapshot(1, &[("a", a.url(), 0.4), ("b", b.url(), 0.4), ("c", c.url(), 0.2)]);
    let new = snapshot(2, &[("a", a.url(), 0.3), ("b", b.url(), 0.4), ("c", c.url(), 0.3)]);
    let dp = data_plane(config(), &old).await;
    let client = client();
    let route_of = |key: usize| {
        let url = format!("{}/debug/route?model=m&key=k{key}", dp.url());
        let client = client.clone();
        async move {
            let (_, body) = get(&client, &url).await;
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            v["picked"].as_str().unwrap().to_owned()
        }
    };
    let mut before = Vec::new();
    for k in 0..4000 {
        before.push(route_of(k).await);
    }
    dp.install(&new).unwrap();
    let mut moved = 0;
    for (k, engine) in before.iter().enumerate() {
        if &route_of(k).await != engine {
            moved += 1;
        }
    }
    let moved = moved as f64 / 4000.0;
    // Total-variation distance between the weight vectors is 0.1: the least any scheme moves.
    assert!(moved <= 0.12 + 0.015, "moved {moved}");
    assert!(moved >= 0.07, "moved {moved}: weights were not applied");
}

/// Serves one chat request per session key and returns the engine of each.
async fn engines_of(dp: &DataPlane, client: &TestClient, keys: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let req = post(&dp.url(), "/v1/chat/completions", &chat_body(key), &[("x-session-id", key)]);
        let (status, headers, _) = send(client, req).await;
        assert_eq!(status, 200);
        out.push(engine_of(&headers));
    }
    out
}

#[tokio::test]
async fn conversations_keep_their_engine_across_a_weight_change_and_new_ones_follow_the_weights() {
    let (a, b) = (MockEngine::start("a").await, MockEngine::start("b").await);
    let old = snapshot(1, &[("a", a.url(), 0.5), ("b", b.url(), 0.5)]);
    let client = client();
    let keys: Vec<String> = (0..200).map(|i| format!("conv-{i}")).collect();
    let fresh: Vec<String> = (0..400).map(|i| format!("new-{i}")).collect();
    // Hashing alone keeps a conversation on any engine with weight and room, however small the
    // weight. Placing by load (the default) also lets a follow-up leave an engine weighted less
    // than half its hash pick (`ilb_core::table::AFFINITY_KEEP_RATIO`), so a's weight falls to
    // 0.35 there, not 0.1: conversations stay all the same.
    for (place_new_keys_by_load, weight_a) in [(false, 0.1), (true, 0.35)] {
        let new = snapshot(2, &[("a", a.url(), weight_a), ("b", b.url(), 1.0 - weight_a)]);
        for affinity_entries in [ilb_core::affinity::DEFAULT_ENTRIES, 0] {
            let config = DataPlaneConfig { affinity_entries, place_new_keys_by_load, ..config() };
            let dp = data_plane(config, &old).await;
            let before = engines_of(&dp, &client, &keys).await;
            assert!(before.iter().filter(|e| *e == "a").count() > 70, "both engines serve conversations");
            dp.install(&new).unwrap();
            let after = engines_of(&dp, &client, &keys).await;
            let moved = before.iter().zip(&after).filter(|(x, y)| x != y).count();
            let on_a = engines_of(&dp, &client, &fresh).await.iter().filter(|e| *e == "a").count();
            let share = on_a as f64 / fresh.len() as f64;
            assert!(
                (share - weight_a).abs() < 0.07,
                "new conversations follow the new weights: {on_a} of 400 on a"
            );
            if affinity_entries > 0 {
                assert_eq!(moved, 0, "remembered conversations stay while their engine has weight and room");
                let url = format!("{}/debug/route?model=m&key={}", dp.url(), keys[0]);
                let (_, body) = get(&client, &url).await;
                let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                assert_eq!(v["remembered"], v["picked"], "{v}");
            } else {
                // Without the table the hash alone decides: a's conversations move, about the
                // weight it lost.
                let expected = (0.5 - weight_a) * keys.len() as f64;
                assert!(moved as f64 > 0.5 * expected, "moved {moved}, about {expected:.0} expected");
            }
        }
    }
}

#[tokio::test]
async fn client_errors_get_openai_errors() {
    let e1 = MockEngine::start("e1").await;
    let mut cfg = config();
    cfg.max_body_bytes = 1024;
    let dp = data_plane(cfg, &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let client = client();
    let cases: [(&str, &str, u16, &str); 5] = [
        ("/v1/chat/completions", "{not json", 400, "invalid_request"),
        ("/v1/chat/completions", r#"{"messages":[]}"#, 400, "invalid_request"),
        ("/v1/chat/completions", r#"{"model":"nope","messages":[]}"#, 404, "model_not_found"),
        (
            "/v1/completions",
            &format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(2000)),
            413,
            "body_too_large",
        ),
        ("/nothing", r#"{"model":"m"}"#, 404, "not_found"),
    ];
    for (path, body, status, code) in cases {
        let (s, headers, text) = send(&client, post(&dp.url(), path, body, &[])).await;
        assert_eq!(s.as_u16(), status, "{path} {body:.40}: {text}");
        assert_eq!(headers["content-type"], "application/json");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["code"], code, "{text}");
        assert!(v["error"]["message"].as_str().unwrap().len() > 5);
    }
    assert_eq!(
        e1.requests.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "bad requests must not reach engines"
    );
}

#[tokio::test]
async fn no_healthy_engine_is_503_with_retry_after() {
    // A port with nothing listening.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut cfg = config();
    cfg.max_attempts = 1;
    let dp = data_plane(cfg, &snapshot(1, &[("gone", format!("http://{closed}"), 1.0)])).await;
    let client = client();
    let (s, _, text) = send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body("a"), &[])).await;
    assert_eq!(s, 502, "{text}");
    for _ in 0..2 {
        send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body("a"), &[])).await;
    }
    // Three connection failures in a row: ejected, so now nothing healthy is left.
    let (s, headers, text) =
        send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body("a"), &[])).await;
    assert_eq!(s, 503, "{text}");
    assert_eq!(headers["retry-after"], "1");
    assert!(text.contains("no_healthy_engine"));
}

#[tokio::test]
async fn engine_5xx_and_dead_engines_are_retried_elsewhere_and_ejected() {
    let good = MockEngine::start("good").await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let snap = snapshot(1, &[("dead", format!("http://{closed}"), 0.5), ("good", good.url(), 0.5)]);
    let dp = data_plane(config(), &snap).await;
    let client = client();
    for i in 0..40 {
        let key = format!("k{i}");
        let (s, headers, _) = send(
            &client,
            post(&dp.url(), "/v1/chat/completions", &chat_body(&key), &[("x-session-id", &key)]),
        )
        .await;
        assert_eq!(s, 200, "request {i} failed although a healthy engine exists");
        assert_eq!(engine_of(&headers), "good");
    }
    let (_, body) = get(&client, &format!("{}/debug/route?model=m&key=k1", dp.url())).await;
    assert!(body.contains("ejected by local guard"), "{body}");
    // A 500 from the engine is retried on another; with one attempt it passes through.
    let (s, headers, _) =
        send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body("z"), &[("x-mock-status", "500")]))
            .await;
    assert_eq!(s, 500);
    assert!(headers["x-ilb-route"].to_str().unwrap().contains("engine=good"));
}

#[tokio::test]
async fn hung_engine_trips_the_first_byte_timeout_and_fails_over() {
    let (hung, ok) = (MockEngine::start("hung").await, MockEngine::start("ok").await);
    let mut cfg = config();
    cfg.timeouts.first_byte = Duration::from_millis(300);
    let dp = data_plane(cfg.clone(), &snapshot(1, &[("hung", hung.url(), 1.0)])).await;
    let client = client();
    // A first answer leaves its connection in the pool: the hang happens on a reused one.
    let (s, _, _) = send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body("a"), &[])).await;
    assert_eq!(s, 200);
    let started = tokio::time::Instant::now();
    let (s, _, text) =
        send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body("a"), &[("x-mock-hang", "1")]))
            .await;
    assert_eq!(s, 504, "{text}");
    assert!(text.contains("engine_timeout"));
    assert!(
        started.elapsed() >= Duration::from_millis(290),
        "504 before the timeout: {:?}",
        started.elapsed()
    );
    // The timed-out connection is closed, never reused: the next request gets a new one.
    let (s, _, _) = send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body("a"), &[])).await;
    assert_eq!(s, 200);
    assert_eq!(hung.connections.load(std::sync::atomic::Ordering::SeqCst), 2);
    // With a healthy alternative the request fails over after the timeout.
    hung.hang.store(true, std::sync::atomic::Ordering::SeqCst);
    let dp2 = data_plane(cfg, &snapshot(1, &[("hung", hung.url(), 0.5), ("ok", ok.url(), 0.5)])).await;
    for i in 0..6 {
        let key = format!("k{i}");
        let req = post(&dp2.url(), "/v1/chat/completions", &chat_body(&key), &[("x-session-id", &key)]);
        let (s, headers, _) = send(&client, req).await;
        assert_eq!(s, 200);
        assert_eq!(engine_of(&headers), "ok");
    }
}

#[tokio::test]
async fn engine_dying_mid_stream_gives_an_sse_error_event_and_a_clean_end() {
    let e1 = MockEngine::start("e1").await;
    let dp = data_plane(config(), &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let req = post(
        &dp.url(),
        "/v1/chat/completions",
        &chat_body("s"),
        &[("x-mock-chunks", "5"), ("x-mock-die-after", "2")],
    );
    let (status, _, text) = send(&client(), req).await;
    assert_eq!(status, 200);
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 3, "{text}");
    assert_eq!(events[0], "data: {\"chunk\":0}");
    let error: serde_json::Value = serde_json::from_str(events[2].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(error["error"]["code"], "engine_failed");
}

#[tokio::test]
async fn the_idle_limit_bounds_each_gap_between_chunks_not_the_stream() {
    let e1 = MockEngine::start("e1").await;
    let mut cfg = config();
    cfg.timeouts.idle = Duration::from_secs(1);
    let dp = data_plane(cfg, &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    // Ten chunks 150 ms apart: longer than the limit in all, every gap well inside it.
    let headers = [("x-mock-chunks", "10"), ("x-mock-delay-ms", "150")];
    let (status, _, text) =
        send(&client(), post(&dp.url(), "/v1/chat/completions", &chat_body("s"), &headers)).await;
    assert_eq!(status, 200);
    assert!(!text.contains("error"), "{text}");
    assert_eq!(text.matches("\"chunk\"").count(), 10, "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    // A stream that stalls after its first chunk (its gate never opens) is cut after the limit,
    // with an SSE error event.
    let headers = [("x-mock-chunks", "3"), ("x-mock-gate", "1")];
    let (status, _, text) =
        send(&client(), post(&dp.url(), "/v1/chat/completions", &chat_body("t"), &headers)).await;
    assert_eq!(status, 200);
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 2, "{text}");
    assert_eq!(events[0], "data: {\"chunk\":0}");
    let error: serde_json::Value = serde_json::from_str(events[1].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(error["error"]["code"], "engine_timeout");
}

#[tokio::test]
async fn client_disconnect_cancels_the_upstream_stream() {
    let e1 = MockEngine::start("e1").await;
    let dp = data_plane(config(), &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let req = post(
        &dp.url(),
        "/v1/chat/completions",
        &chat_body("s"),
        &[("x-mock-chunks", "1000"), ("x-mock-delay-ms", "5")],
    );
    let resp = client().request(req).await.unwrap();
    let mut body = resp.into_body();
    body.frame().await.unwrap().unwrap();
    drop(body);
    assert!(
        eventually(Duration::from_secs(5), || e1.cancelled.load(std::sync::atomic::Ordering::SeqCst) == 1)
            .await
    );
    let installed = dp.installed().unwrap();
    assert!(
        eventually(Duration::from_secs(5), || installed.engines[0]
            .in_flight
            .load(std::sync::atomic::Ordering::SeqCst)
            == 0)
        .await
    );
    // The half-read connection is never reused: the next request opens a new one.
    let (status, _, _) = send(&client(), post(&dp.url(), "/v1/chat/completions", &chat_body("s"), &[])).await;
    assert_eq!(status, 200);
    assert_eq!(e1.connections.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_engine_connections_are_capped_and_expire() {
    let e1 = MockEngine::start("e1").await;
    let mut cfg = config();
    cfg.upstream_pool.max_idle_per_engine = 2;
    cfg.upstream_pool.idle_timeout = Duration::from_millis(300);
    cfg.probe_interval = Duration::from_millis(50);
    let dp = data_plane(cfg, &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    // Eight overlapping requests need eight connections.
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (client, url) = (client(), dp.url());
        tasks.push(tokio::spawn(async move {
            let headers = [("x-mock-chunks", "2"), ("x-mock-delay-ms", "500")];
            send(&client, post(&url, "/v1/chat/completions", &chat_body(&format!("k{i}")), &headers)).await.0
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    assert_eq!(e1.connections.load(std::sync::atomic::Ordering::SeqCst), 8);
    let installed = dp.installed().unwrap();
    assert_eq!(installed.engines[0].pool.idle_len(), 2, "at most max_idle_per_engine are kept");
    // Unused past the idle timeout, they are closed.
    assert!(eventually(Duration::from_secs(5), || installed.engines[0].pool.idle_len() == 0).await);
}

#[tokio::test]
async fn engine_connections_are_reused_and_every_response_end_is_counted() {
    use std::sync::atomic::Ordering::SeqCst;
    let e1 = MockEngine::start("e1").await;
    let dp = data_plane(config(), &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let client = client();
    for i in 0..10 {
        let headers: &[(&str, &str)] = if i % 2 == 0 { &[] } else { &[("x-mock-chunks", "3")] };
        let req = post(&dp.url(), "/v1/chat/completions", &chat_body("k"), headers);
        let (status, _, text) = send(&client, req).await;
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(e1.connections.load(SeqCst), 1, "sequential requests share one engine connection");
    let installed = dp.installed().unwrap();
    assert_eq!(installed.engines[0].pool.idle_len(), 1);
    // Bodies of known length end with their last chunk, streams with their last event: each
    // is a success with a duration, and nothing stays in flight.
    let line = r#"ilb_dataplane_request_duration_seconds_count{engine="e1"} 10"#;
    let (_, metrics) = get(&client, &format!("{}/metrics", dp.url())).await;
    assert!(metrics.contains(line), "missing {line:?} in:\n{metrics}");
    assert_eq!(installed.engines[0].in_flight.load(SeqCst), 0);

    // An engine that closes its connection after a response: the next request goes out on a
    // new connection, at the first attempt, and the engine is not blamed.
    let req = post(&dp.url(), "/v1/chat/completions", &chat_body("k"), &[("x-mock-close", "1")]);
    assert_eq!(send(&client, req).await.0, 200);
    for _ in 0..3 {
        let (status, headers, _) =
            send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body("k"), &[])).await;
        assert_eq!(status, 200);
        let route = headers["x-ilb-route"].to_str().unwrap();
        assert!(route.ends_with("attempts=1"), "{route}");
    }
    assert_eq!(e1.connections.load(SeqCst), 2);
    assert_eq!(installed.engines[0].counters.failures.load(SeqCst), 0);
}

#[tokio::test]
async fn invalid_or_older_snapshots_are_rejected_and_the_last_good_one_stays() {
    let e1 = MockEngine::start("e1").await;
    let dp = data_plane(config(), &snapshot(5, &[("e1", e1.url(), 1.0)])).await;
    let mut bad = snapshot(6, &[("e1", e1.url(), 1.0)]);
    bad.models[0].classes[0].weights[0].weight = f64::NAN;
    assert!(dp.install(&bad).is_err());
    let older = snapshot(4, &[("e1", e1.url(), 1.0)]);
    assert!(dp.install(&older).unwrap_err().to_string().contains("older"));
    assert_eq!(dp.snapshot_version().unwrap().0, 5);
    let (s, _, _) = send(&client(), post(&dp.url(), "/v1/chat/completions", &chat_body("a"), &[])).await;
    assert_eq!(s, 200);
}

#[tokio::test]
async fn quick_mode_discovers_models() {
    let (a, b) = (MockEngine::start("a").await, MockEngine::start("b").await);
    let source = ilb_dataplane::SnapshotSource::Discover {
        engines: vec![a.url(), b.url()],
        interval: Duration::from_secs(30),
    };
    let dp = ilb_dataplane::DataPlane::start(config(), source).await.unwrap();
    assert!(eventually(Duration::from_secs(5), || dp.snapshot_version().is_some()).await);
    let client = client();
    let (s, body) = get(&client, &format!("{}/v1/models", dp.url())).await;
    assert_eq!(s, 200);
    assert!(body.contains("\"id\":\"m\""), "{body}");
    let (s, _, _) = send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body("a"), &[])).await;
    assert_eq!(s, 200);
}

#[tokio::test]
async fn metrics_are_exposed_with_ilb_names() {
    let e1 = MockEngine::start("e1").await;
    let dp = data_plane(config(), &snapshot(9, &[("e1", e1.url(), 1.0)])).await;
    let client = client();
    send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body("a"), &[])).await;
    send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body("a"), &[("x-mock-status", "500")]))
        .await;
    let (status, text) = get(&client, &format!("{}/metrics", dp.url())).await;
    assert_eq!(status, 200);
    for line in [
        "ilb_dataplane_snapshot_version 9",
        "ilb_dataplane_requests_total{model=\"m\",class=\"default\",outcome=\"ok\"} 1",
        "ilb_dataplane_requests_total{model=\"m\",class=\"default\",outcome=\"failed\"} 1",
        "ilb_dataplane_engine_attempts_total{engine=\"e1\",outcome=\"ok\"} 1",
        "ilb_dataplane_ttfb_seconds_count{engine=\"e1\"} 2",
        "ilb_dataplane_engine_in_flight{engine=\"e1\"} 0",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    for name in text.lines().filter(|l| !l.starts_with('#')).map(|l| l.split(['{', ' ']).next().unwrap()) {
        assert!(name.starts_with("ilb_"), "{name} lacks the ilb_ prefix");
    }
}

#[tokio::test]
async fn an_incoming_traceparent_passes_through_unchanged() {
    let e1 = MockEngine::start("e1").await;
    let dp = data_plane(config(), &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (_, headers, _) =
        send(&client(), post(&dp.url(), "/v1/chat/completions", &chat_body("a"), &[("traceparent", tp)]))
            .await;
    assert_eq!(headers["x-seen-traceparent"], tp);
}

/// The load bound counts a class's own requests on an engine: another class holding many
/// requests there must not push this class's keys off their home engine (before, the bound
/// compared the engine's total in-flight count with one class's share of it).
#[tokio::test]
async fn load_bound_counts_only_the_class_own_requests() {
    use ilb_core::snapshot::{ClassRoutes, EngineWeight};
    use ilb_core::{ClassId, EngineId};
    let (e1, e2) = (MockEngine::start("e1").await, MockEngine::start("e2").await);
    let mut snap = snapshot(1, &[("e1", e1.url(), 1.0), ("e2", e2.url(), 0.0)]);
    for engine in &mut snap.engines {
        engine.capabilities = vec!["x".into()];
    }
    let half = |id: &str| EngineWeight {
        engine: EngineId::new(id),
        weight: 0.5,
        expected_latency_ms: None,
        network_ms: None,
        in_flight_ms: None,
    };
    snap.models[0].classes.push(ClassRoutes {
        id: ClassId::new("x"),
        require: vec!["x".into()],
        residency: None,
        weights: vec![half("e1"), half("e2")],
        shed_fraction: 0.0,
    });
    let dp = data_plane(config(), &snap).await;
    let client = client();
    // Twenty default-class streams held open on e1 (first chunk sent, the rest gated).
    let mut held = Vec::new();
    for i in 0..20 {
        let session = format!("held-{i}");
        let headers = [("x-mock-chunks", "3"), ("x-mock-gate", "1"), ("x-session-id", session.as_str())];
        let resp = client.request(post(&dp.url(), "/v1/chat/completions", &chat_body("h"), &headers)).await;
        let mut body = resp.unwrap().into_body();
        body.frame().await.expect("first chunk").unwrap();
        held.push(body);
    }
    let e1_idx = engine_index(&dp, "e1");
    assert_eq!(
        dp.installed().unwrap().engines[e1_idx].in_flight.load(std::sync::atomic::Ordering::Relaxed),
        20
    );
    // Class x splits its keys half and half, whatever the default class does on e1.
    let mut on_e1 = 0;
    for i in 0..40 {
        let session = format!("x-{i}");
        let headers = [("x-ilb-require", "x"), ("x-session-id", session.as_str())];
        let (status, headers, _) =
            send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body("x"), &headers)).await;
        assert_eq!(status, 200);
        on_e1 += usize::from(engine_of(&headers) == "e1");
    }
    assert!((10..=30).contains(&on_e1), "{on_e1} of 40 class-x keys on e1");
    for _ in 0..20 {
        e1.gate.notify_one();
    }
    for body in held {
        body.collect().await.unwrap();
    }
}

/// With `place_new_keys_by_load`, new conversations go to the less loaded of the hash's two
/// choices: with two engines and
/// four conversations streaming at once, each engine holds two (the hash alone splits 2–2 in
/// only 6 of 16 cases), and a follow-up of a held conversation stays where it is.
#[tokio::test]
async fn new_conversations_are_placed_by_load_and_follow_ups_stay() {
    let (e1, e2) = (MockEngine::start("e1").await, MockEngine::start("e2").await);
    let mut cfg = config();
    cfg.place_new_keys_by_load = true;
    let dp = data_plane(cfg, &snapshot(1, &[("e1", e1.url(), 1.0), ("e2", e2.url(), 1.0)])).await;
    let client = client();
    for round in 0..8 {
        let mut held = Vec::new();
        let mut placed = HashMap::<String, usize>::new();
        let mut first_engine = Vec::new();
        for i in 0..4 {
            let session = format!("round-{round}-conversation-{i}");
            let headers = [("x-mock-chunks", "3"), ("x-mock-gate", "1"), ("x-session-id", session.as_str())];
            let resp =
                client.request(post(&dp.url(), "/v1/chat/completions", &chat_body("c"), &headers)).await;
            let resp = resp.unwrap();
            let engine = engine_of(resp.headers());
            *placed.entry(engine.clone()).or_default() += 1;
            first_engine.push((session, engine));
            let mut body = resp.into_body();
            body.frame().await.expect("first chunk").unwrap();
            held.push(body);
        }
        assert_eq!(placed.get("e1"), Some(&2), "round {round}: {placed:?}");
        // A follow-up turn of a conversation stays on its engine although both are as loaded.
        for (session, engine) in &first_engine {
            let headers = [("x-session-id", session.as_str())];
            let (status, headers, _) =
                send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body("c"), &headers)).await;
            assert_eq!(status, 200);
            assert_eq!(&engine_of(&headers), engine, "follow-up of {session}");
        }
        for _ in 0..2 {
            e1.gate.notify_one();
            e2.gate.notify_one();
        }
        for body in held {
            body.collect().await.unwrap();
        }
    }
}

/// Shutdown reaches a keep-alive connection that waits for its next request (the connection's
/// task polls the shutdown signal only when it fires), and the idle timer still moves and
/// fires after a request: the connection is closed `header_read` after its response.
#[tokio::test]
async fn idle_connections_close_on_shutdown_and_after_header_read() {
    use tokio::io::AsyncWriteExt;
    let e1 = MockEngine::start("e1").await;
    let body = chat_body("s");
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut cfg = config();
    cfg.timeouts.header_read = Duration::from_millis(300);
    let dp = data_plane(cfg, &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let mut stream = tokio::net::TcpStream::connect(dp.local_addr()).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let started = tokio::time::Instant::now();
    let (bytes, closed) = read_until_close(&mut stream, Duration::from_secs(5)).await;
    let text = String::from_utf8_lossy(&bytes);
    assert!(closed && text.starts_with("HTTP/1.1 200") && text.contains(&body), "{text}");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(300), "closed {waited:?} after the request");

    let mut cfg = config();
    cfg.timeouts.header_read = Duration::from_secs(60);
    let dp = data_plane(cfg, &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let mut stream = tokio::net::TcpStream::connect(dp.local_addr()).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut bytes = Vec::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(5);
    while !String::from_utf8_lossy(&bytes).contains(&body) && tokio::time::Instant::now() < end {
        let (more, closed) = read_until_close(&mut stream, Duration::from_millis(50)).await;
        assert!(!closed, "closed before shutdown");
        bytes.extend(more);
    }
    assert!(String::from_utf8_lossy(&bytes).contains(&body));
    dp.shutdown().await;
    let (_, closed) = read_until_close(&mut stream, Duration::from_secs(5)).await;
    assert!(closed, "an idle connection stayed open after shutdown");
}

/// Classification reads each header's first value, prefers `x-session-id` to
/// `x-ilb-affinity-key`, and rejects a non-ASCII value only in a header it uses.
#[test]
fn classification_headers_first_value_and_session_precedence() {
    use ilb_core::classify::Endpoint;
    use ilb_core::priority::Priority;
    use ilb_dataplane::proxy::classify_request;
    let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let mut headers = http::HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    headers.append("x-ilb-affinity-key", "k2".parse().unwrap());
    headers.append("x-ilb-priority", "high".parse().unwrap());
    headers.append("x-ilb-priority", "low".parse().unwrap());
    headers.append("x-ilb-require", "b, a".parse().unwrap());
    headers.append("x-ilb-residency", " eu ".parse().unwrap());
    headers.append("x-session-id", "k1".parse().unwrap());
    let c = classify_request(Endpoint::ChatCompletions, &headers, body, 7).unwrap();
    assert_eq!(c.priority, Priority::High);
    assert_eq!(c.require, ["a", "b"]);
    assert_eq!(c.residency, Some("eu"));
    assert_eq!(c.key_hash, ilb_core::stable_hash(b"k1"));

    headers.insert("x-ilb-affinity-key", http::HeaderValue::from_bytes(b"\xff").unwrap());
    let c = classify_request(Endpoint::ChatCompletions, &headers, body, 7).unwrap();
    assert_eq!(c.key_hash, ilb_core::stable_hash(b"k1"), "an unused header is not checked");
    headers.remove("x-session-id");
    assert!(classify_request(Endpoint::ChatCompletions, &headers, body, 7).is_err());
}

/// Regression (hardening finding 3): an engine that refuses a body as too large answers 413 and
/// closes the connection while the data plane is still writing the body. The failed write
/// counted as an engine failure, the body went to two more engines, the client got
/// `502 engine_failed`, and a few such requests ejected healthy engines.
#[tokio::test]
async fn an_engines_early_413_reaches_the_client_and_counts_against_no_engine() {
    let (a, b) = (MockEngine::start("a").await, MockEngine::start("b").await);
    let dp = data_plane(config(), &snapshot(1, &[("a", a.url(), 1.0), ("b", b.url(), 1.0)])).await;
    let client = client();
    // Larger than the socket buffers take (so the write fails) and within ilb's 16 MiB; and
    // one that fits in them (the write succeeds, the answer is read as usual).
    let huge = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(15 << 20));
    let small = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(100 << 10));
    let n = 6;
    for i in 0..n {
        let body = if i % 2 == 0 { &huge } else { &small };
        let key = format!("k{i}");
        let headers = [("x-mock-max-body", "1024"), ("x-session-id", key.as_str())];
        let (status, headers, text) = send(&client, post(&dp.url(), "/v1/completions", body, &headers)).await;
        assert_eq!(status, 413, "request {i}: {text}");
        assert!(text.contains("engine says too large"), "the engine's own answer: {text}");
        assert!(!engine_of(&headers).is_empty());
    }
    let requests = a.requests.load(std::sync::atomic::Ordering::SeqCst)
        + b.requests.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(requests, n, "a request refused for its size is not retried");
    for engine in dp.installed().unwrap().engines.iter() {
        assert!(!engine.is_ejected(), "{} ejected", engine.id);
        assert_eq!(engine.counters.failures.load(std::sync::atomic::Ordering::Relaxed), 0, "{}", engine.id);
    }
    let (status, _, _) =
        send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body("after"), &[])).await;
    assert_eq!(status, 200);
}

/// Regression (hardening finding 7): the client listener revealed the fleet: `x-ilb-route`
/// carried engine addresses, weights and classes, and `/metrics` and `/debug/route` were
/// served on it. With an admin listener they move there; the header's detail is configurable.
#[tokio::test]
async fn an_admin_listener_takes_metrics_and_debug_off_the_client_port() {
    use ilb_dataplane::config::RouteHeader;
    let e1 = MockEngine::start("e1").await;
    let mut cfg = config();
    cfg.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    let dp = data_plane(cfg.clone(), &snapshot(4, &[("e1", e1.url(), 1.0)])).await;
    let admin = dp.admin_url().expect("an admin listener");
    let client = client();
    let (status, headers, _) =
        send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body("a"), &[])).await;
    assert_eq!(status, 200);
    assert_eq!(
        headers["x-ilb-route"], "engine=e1; attempts=1",
        "by default the engine's id and the attempts only"
    );
    for path in ["/metrics", "/debug/route?model=m&key=k"] {
        let (status, text) = get(&client, &format!("{}{path}", dp.url())).await;
        assert_eq!(status, 404, "{path} on the client port: {text}");
        let (status, text) = get(&client, &format!("{admin}{path}")).await;
        assert_eq!(status, 200, "{path} on the admin port: {text}");
    }
    for base in [dp.url(), admin.clone()] {
        let (status, text) = get(&client, &format!("{base}/health")).await;
        assert_eq!(status, 200, "{base}: {text}");
    }
    let (status, _, _) = send(&client, post(&admin, "/v1/chat/completions", &chat_body("a"), &[])).await;
    assert_eq!(status, 404, "the admin port proxies nothing");

    cfg.route_header = RouteHeader::Off;
    let quiet = data_plane(cfg, &snapshot(4, &[("e1", e1.url(), 1.0)])).await;
    let (status, headers, _) =
        send(&client, post(&quiet.url(), "/v1/chat/completions", &chat_body("a"), &[])).await;
    assert_eq!(status, 200);
    assert!(!headers.contains_key("x-ilb-route"), "{headers:?}");
}
