//! Fault injection through `/admin/faults` and `EngineHandle::set_faults`: each fault, reset,
//! and validation.
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines

mod common;

use std::time::Duration;

use common::*;
use http_body_util::BodyExt;
use ilb_engine_sim::{Faults, HardwareProfile};
use serde_json::Value;

#[tokio::test]
async fn admin_endpoint_round_trips_and_resets() {
    let engine = engine(fast_profile(), false).await;
    let (status, body) = call_json(engine.addr(), "GET", "/admin/faults", "").await;
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_value::<Faults>(body).expect("faults"), Faults::default());
    let put = r#"{"slowdown": 3.0, "error_rate": 0.5, "hang": false, "drop_mid_stream": 0.0, "ready_replicas": null, "down": false}"#;
    let (status, body) = call_json(engine.addr(), "PUT", "/admin/faults", put).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["slowdown"], 3.0);
    assert_eq!(engine.faults().error_rate, 0.5);
    let (status, body) = call_json(engine.addr(), "DELETE", "/admin/faults", "").await;
    assert_eq!(status, 200);
    assert_eq!(body["error_rate"], 0.0);
    assert_eq!(engine.faults(), Faults::default());
    let (status, body) = call_json(engine.addr(), "PUT", "/admin/faults", r#"{"error_rate": 2}"#).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["param"], "error_rate");
    let (status, _) = call_json(engine.addr(), "PUT", "/admin/faults", r#"{"bogus": 1}"#).await;
    assert_eq!(status, 400);
    assert!(engine.set_faults(Faults { slowdown: 0.0, ..Faults::default() }).is_err());
}

#[tokio::test]
async fn error_rate_answers_that_fraction_with_500() {
    let engine = engine(fast_profile(), false).await;
    engine.set_faults(Faults { error_rate: 0.5, ..Faults::default() }).expect("faults");
    let mut errors = 0;
    for _ in 0..200 {
        let (status, body) =
            call_json(engine.addr(), "POST", "/v1/chat/completions", &chat_body("x", Some(1), false, false))
                .await;
        if status == 500 {
            errors += 1;
            assert_eq!(body["error"]["type"], "server_error");
        } else {
            assert_eq!(status, 200);
        }
    }
    assert!((70..=130).contains(&errors), "{errors} errors of 200 at rate 0.5");
    engine.set_faults(Faults { error_rate: 1.0, ..Faults::default() }).expect("faults");
    let (status, _) = call(engine.addr(), "POST", "/v1/completions", r#"{"prompt":"x"}"#).await;
    assert_eq!(status, 500);
    engine.set_faults(Faults::default()).expect("faults");
    let (status, _) = call(engine.addr(), "POST", "/v1/completions", r#"{"prompt":"x"}"#).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn hang_accepts_and_never_answers() {
    let engine = engine(fast_profile(), true).await;
    engine.set_faults(Faults { hang: true, ..Faults::default() }).expect("faults");
    let body = chat_body("x", Some(1), false, false);
    let pending = send(engine.addr(), "POST", "/v1/chat/completions", &body);
    assert!(tokio::time::timeout(Duration::from_millis(300), pending).await.is_err(), "answered while hung");
    assert_eq!(call(engine.addr(), "GET", "/health", "").await.0, 200, "health still answers");
    engine.set_faults(Faults::default()).expect("faults");
    let (status, _) =
        call(engine.addr(), "POST", "/v1/chat/completions", &chat_body("x", Some(1), false, false)).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn drop_mid_stream_closes_after_the_first_chunk() {
    for latency in [true, false] {
        let engine = engine(fast_profile(), latency).await;
        engine.set_faults(Faults { drop_mid_stream: 1.0, ..Faults::default() }).expect("faults");
        let response =
            send(engine.addr(), "POST", "/v1/chat/completions", &chat_body("x", Some(50), true, false))
                .await
                .expect("request");
        assert_eq!(response.status(), 200);
        let mut body = response.into_body();
        let first = body.frame().await.expect("first frame").expect("first chunk arrives");
        let first = String::from_utf8(first.into_data().expect("data").to_vec()).expect("utf-8");
        assert!(first.starts_with("data: {"), "{first}");
        let mut rest = Vec::new();
        let ended_with_error = loop {
            match body.frame().await {
                Some(Ok(frame)) => rest.extend_from_slice(&frame.into_data().unwrap_or_default()),
                Some(Err(_)) => break true,
                None => break false,
            }
        };
        assert!(ended_with_error, "stream ended cleanly: {}", String::from_utf8_lossy(&rest));
        assert!(!String::from_utf8_lossy(&rest).contains("[DONE]"));
        if latency {
            assert!(eventually(Duration::from_secs(5), || engine.stats().running == 0).await);
        }
        // Non-streaming requests are not affected.
        let (status, _) =
            call(engine.addr(), "POST", "/v1/chat/completions", &chat_body("x", Some(2), false, false)).await;
        assert_eq!(status, 200);
    }
}

#[tokio::test]
async fn zero_ready_replicas_fails_health_and_requests() {
    let engine = engine(fast_profile(), true).await;
    let (status, _) = call_json(engine.addr(), "PUT", "/admin/faults", r#"{"ready_replicas": 0}"#).await;
    assert_eq!(status, 200);
    assert_eq!(call(engine.addr(), "GET", "/health", "").await.0, 503);
    let (status, body) =
        call_json(engine.addr(), "POST", "/v1/chat/completions", &chat_body("x", Some(1), false, false))
            .await;
    assert_eq!(status, 503);
    assert!(body["error"]["message"].is_string());
    let (_, metrics) = call(engine.addr(), "GET", "/metrics", "").await;
    assert_eq!(metric(&metrics, "ilb_engine_ready_replicas{model_name=\"test-model\"}"), Some(0.0));
    call(engine.addr(), "DELETE", "/admin/faults", "").await;
    assert_eq!(call(engine.addr(), "GET", "/health", "").await.0, 200);
}

#[tokio::test]
async fn slowdown_multiplies_iteration_time() {
    let profile = HardwareProfile { iteration_base_ms: 10.0, ..fast_profile() };
    let engine = engine(profile, true).await;
    // End-to-end latency in model time: iterations run back to back on the model's clock, so
    // the sums are exact whatever the wall-clock scheduling jitter.
    let e2e_sum = |engine: &ilb_engine_sim::EngineHandle| {
        metric(&engine.metrics_text(), "vllm:e2e_request_latency_seconds_sum{model_name=\"test-model\"}")
            .expect("e2e sum")
    };
    let timed = |addr| async move {
        let started = tokio::time::Instant::now();
        let (status, _) =
            call(addr, "POST", "/v1/chat/completions", &chat_body("x", Some(10), false, false)).await;
        assert_eq!(status, 200);
        started.elapsed()
    };
    timed(engine.addr()).await;
    let normal = e2e_sum(&engine);
    engine.set_faults(Faults { slowdown: 3.0, ..Faults::default() }).expect("faults");
    let slow_wall = timed(engine.addr()).await;
    let slow = e2e_sum(&engine) - normal;
    assert!((slow / normal - 3.0).abs() < 0.01, "normal {normal} s, slowed {slow} s");
    assert!(slow_wall >= Duration::from_millis(300), "10 iterations of >= 30 ms: {slow_wall:?}");
}

#[tokio::test]
async fn down_closes_listener_and_connections_then_rebinds_the_same_port() {
    let profile = HardwareProfile { iteration_base_ms: 10.0, ..fast_profile() };
    let engine = engine(profile, true).await;
    let addr = engine.addr();
    let response = send(addr, "POST", "/v1/chat/completions", &chat_body("x", Some(500), true, false))
        .await
        .expect("request");
    let mut live = response.into_body();
    live.frame().await.expect("frame").expect("first chunk");

    engine.set_faults(Faults { down: true, ..Faults::default() }).expect("faults");
    let stream_end =
        tokio::time::timeout(Duration::from_secs(5), async { while let Some(Ok(_)) = live.frame().await {} });
    assert!(stream_end.await.is_ok(), "live connection was not closed");
    let mut refused = false;
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(refused, "listener still accepting while down");
    assert!(eventually(Duration::from_secs(5), || engine.stats().running == 0).await, "stream not aborted");

    engine.set_faults(Faults::default()).expect("faults");
    let mut healthy = false;
    for _ in 0..200 {
        if let Ok(response) = send(addr, "GET", "/health", "").await {
            healthy = response.status() == 200;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(healthy, "engine did not come back on {addr}");
}

#[tokio::test]
async fn down_for_ms_comes_back_by_itself() {
    let engine = engine(fast_profile(), false).await;
    let addr = engine.addr();
    let (status, body) =
        call_json(addr, "PUT", "/admin/faults", r#"{"down": true, "down_for_ms": 200}"#).await;
    assert_eq!(status, 200, "{body}");
    let mut was_down = false;
    let mut back = false;
    for _ in 0..400 {
        match send(addr, "GET", "/health", "").await {
            Err(_) => was_down = true,
            Ok(response) if was_down && response.status() == 200 => {
                back = true;
                break;
            }
            Ok(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(was_down && back, "down {was_down} back {back}");
    let faults: Value = call_json(addr, "GET", "/admin/faults", "").await.1;
    assert_eq!(faults["down"], false);
}
