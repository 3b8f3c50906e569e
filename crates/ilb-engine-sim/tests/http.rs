//! HTTP integration tests on loopback: OpenAI response formats (parsed field by field),
//! streaming timing, metrics, cache hits through the chat template, errors.
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines

mod common;

use std::time::Duration;

use common::*;
use http_body_util::BodyExt;
use ilb_engine_sim::tokenize::{count_tokens, ChatPrompt};
use ilb_engine_sim::HardwareProfile;
use serde_json::Value;

fn prompt_len(content: &str) -> u64 {
    let mut prompt = ChatPrompt::default();
    prompt.push_message("system", &["You are terse."]);
    prompt.push_message("user", &[content]);
    prompt.finish().len() as u64
}

#[tokio::test]
async fn chat_completion_non_streaming_format() {
    for latency in [true, false] {
        let engine = engine(fast_profile(), latency).await;
        let (status, body) = call_json(
            engine.addr(),
            "POST",
            "/v1/chat/completions",
            &chat_body("hi there", Some(5), false, false),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert!(body["id"].as_str().expect("id").starts_with("chatcmpl-"));
        assert_eq!(body["object"], "chat.completion");
        assert!(body["created"].as_u64().expect("created") > 1_600_000_000);
        assert_eq!(body["model"], MODEL);
        let choice = &body["choices"][0];
        assert_eq!(body["choices"].as_array().expect("choices").len(), 1);
        assert_eq!(choice["index"], 0);
        assert_eq!(choice["message"]["role"], "assistant");
        assert_eq!(count_tokens(choice["message"]["content"].as_str().expect("content")), 5);
        assert_eq!(choice["finish_reason"], "length");
        assert!(choice["logprobs"].is_null());
        let usage = &body["usage"];
        assert_eq!(usage["prompt_tokens"], prompt_len("hi there"));
        assert_eq!(usage["completion_tokens"], 5);
        assert_eq!(usage["total_tokens"], prompt_len("hi there") + 5);

        // No max_tokens: the default length, finish reason "stop".
        let (_, body) =
            call_json(engine.addr(), "POST", "/v1/chat/completions", &chat_body("hi", None, false, false))
                .await;
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        assert_eq!(body["usage"]["completion_tokens"], 8);
        engine.shutdown().await;
    }
}

#[tokio::test]
async fn text_completion_formats() {
    let engine = engine(fast_profile(), true).await;
    let request =
        serde_json::json!({"model": MODEL, "prompt": "once upon a time", "max_tokens": 4}).to_string();
    let (status, body) = call_json(engine.addr(), "POST", "/v1/completions", &request).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "text_completion");
    assert!(body["id"].as_str().expect("id").starts_with("cmpl-"));
    assert_eq!(count_tokens(body["choices"][0]["text"].as_str().expect("text")), 4);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["prompt_tokens"], 4);

    let request =
        serde_json::json!({"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 3, "stream": true}).to_string();
    let (status, text) = call(engine.addr(), "POST", "/v1/completions", &request).await;
    assert_eq!(status, 200);
    let events = sse_events(&text);
    assert_eq!(events.len(), 4, "{text}");
    assert_eq!(events[3], "[DONE]");
    let full: String = events[..3]
        .iter()
        .map(|event| {
            let chunk: Value = serde_json::from_str(event).expect("chunk");
            assert_eq!(chunk["object"], "text_completion");
            chunk["choices"][0]["text"].as_str().expect("text").to_owned()
        })
        .collect();
    assert_eq!(count_tokens(&full), 3);
    engine.shutdown().await;
}

#[tokio::test]
async fn chat_streaming_format_with_usage_matches_non_streaming() {
    for latency in [true, false] {
        let engine = engine(fast_profile(), latency).await;
        let (status, text) =
            call(engine.addr(), "POST", "/v1/chat/completions", &chat_body("stream me", Some(6), true, true))
                .await;
        assert_eq!(status, 200);
        let events = sse_events(&text);
        assert_eq!(events.len(), 6 + 2, "six content chunks, usage, [DONE]: {text}");
        assert_eq!(events[7], "[DONE]");
        let chunks: Vec<Value> =
            events[..7].iter().map(|event| serde_json::from_str(event).expect("json")).collect();
        let id = chunks[0]["id"].as_str().expect("id");
        let mut content = String::new();
        for (index, chunk) in chunks[..6].iter().enumerate() {
            assert_eq!(chunk["object"], "chat.completion.chunk");
            assert_eq!(chunk["id"], id);
            assert_eq!(chunk["model"], MODEL);
            assert!(
                chunk["usage"].is_null() && chunk.get("usage").is_some(),
                "usage: null on content chunks"
            );
            let choice = &chunk["choices"][0];
            assert_eq!(choice["index"], 0);
            let delta = &choice["delta"];
            if index == 0 {
                assert_eq!(delta["role"], "assistant");
            } else {
                assert!(delta.get("role").is_none());
            }
            content.push_str(delta["content"].as_str().expect("content"));
            let expected_reason = if index == 5 { Value::from("length") } else { Value::Null };
            assert_eq!(choice["finish_reason"], expected_reason);
        }
        let usage_chunk = &chunks[6];
        assert_eq!(usage_chunk["choices"], Value::Array(vec![]));
        assert_eq!(usage_chunk["usage"]["completion_tokens"], 6);
        assert_eq!(usage_chunk["usage"]["prompt_tokens"], prompt_len("stream me"));

        let (_, body) = call_json(
            engine.addr(),
            "POST",
            "/v1/chat/completions",
            &chat_body("stream me", Some(6), false, false),
        )
        .await;
        assert_eq!(body["choices"][0]["message"]["content"].as_str(), Some(content.as_str()));

        // Without include_usage there is no usage key at all.
        let (_, text) = call(
            engine.addr(),
            "POST",
            "/v1/chat/completions",
            &chat_body("stream me", Some(2), true, false),
        )
        .await;
        let events = sse_events(&text);
        assert_eq!(events.len(), 3);
        let first: Value = serde_json::from_str(&events[0]).expect("json");
        assert!(first.get("usage").is_none());
        engine.shutdown().await;
    }
}

#[tokio::test]
async fn first_chunk_arrives_before_the_engine_finishes() {
    let profile = HardwareProfile { iteration_base_ms: 20.0, ..fast_profile() };
    let engine = engine(profile, true).await;
    let response =
        send(engine.addr(), "POST", "/v1/chat/completions", &chat_body("hello", Some(40), true, false))
            .await
            .expect("request");
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    let frame = body.frame().await.expect("a frame").expect("no error");
    let first = String::from_utf8(frame.into_data().expect("data").to_vec()).expect("utf-8");
    assert!(first.contains("\"role\":\"assistant\""), "{first}");
    // 39 more tokens at >= 20 ms each are still to come.
    let stats = engine.stats();
    assert_eq!(stats.running, 1);
    assert_eq!(stats.requests_served, 0);
    let rest = body.collect().await.expect("rest").to_bytes();
    assert!(String::from_utf8_lossy(&rest).ends_with("data: [DONE]\n\n"));
    assert_eq!(engine.stats().requests_served, 1);
    engine.shutdown().await;
}

#[tokio::test]
async fn client_disconnect_mid_stream_aborts_the_sequence() {
    let profile = HardwareProfile { iteration_base_ms: 10.0, ..fast_profile() };
    let engine = engine(profile, true).await;
    let response =
        send(engine.addr(), "POST", "/v1/chat/completions", &chat_body("hello", Some(1000), true, false))
            .await
            .expect("request");
    let mut body = response.into_body();
    body.frame().await.expect("a frame").expect("no error");
    assert_eq!(engine.stats().running, 1);
    drop(body);
    assert!(eventually(Duration::from_secs(5), || engine.stats().running == 0).await, "sequence not aborted");
    let stats = engine.stats();
    assert_eq!(stats.requests_aborted, 1);
    assert_eq!(stats.kv_usage, 0.0);
    assert!(engine
        .metrics_text()
        .contains("vllm:request_success_total{model_name=\"test-model\",finished_reason=\"abort\"} 1.0"));
    engine.shutdown().await;
}

#[tokio::test]
async fn follow_up_turn_on_the_same_engine_has_lower_ttft_than_on_a_cold_engine() {
    // Prefill is expensive here (0.3 ms per token), iterations cheap.
    let profile = HardwareProfile { prefill_token_us: 300.0, ..fast_profile() };
    let (warm, cold) = (engine(profile.clone(), true).await, engine(profile, true).await);
    let history = (0..1500).map(|index| format!("w{index}")).collect::<Vec<_>>().join(" ");
    let turn_one = serde_json::json!({"model": MODEL, "max_tokens": 4,
        "messages": [{"role": "user", "content": history}]});
    let (_, first) = call_json(warm.addr(), "POST", "/v1/chat/completions", &turn_one.to_string()).await;
    let answer = first["choices"][0]["message"]["content"].as_str().expect("content").to_owned();
    let turn_two = serde_json::json!({"model": MODEL, "max_tokens": 1, "stream": true,
        "messages": [{"role": "user", "content": history}, {"role": "assistant", "content": answer},
                     {"role": "user", "content": "and then?"}]})
    .to_string();
    let time_to_first_chunk = |addr| {
        let body = turn_two.clone();
        async move {
            let started = tokio::time::Instant::now();
            let response = send(addr, "POST", "/v1/chat/completions", &body).await.expect("request");
            response.into_body().frame().await.expect("frame").expect("ok");
            started.elapsed()
        }
    };
    let warm_ttft = time_to_first_chunk(warm.addr()).await;
    let cold_ttft = time_to_first_chunk(cold.addr()).await;
    assert!(warm_ttft * 3 < cold_ttft, "warm {warm_ttft:?} cold {cold_ttft:?}");
    assert!(warm.stats().prefix_hits_tokens >= 1488, "{:?}", warm.stats());
    assert_eq!(cold.stats().prefix_hits_tokens, 0);
    assert!(warm.stats().prefix_hit_rate > 0.3);
}

#[tokio::test]
async fn metrics_use_vllm_names_and_histograms_move() {
    let engine = engine(fast_profile(), true).await;
    let (status, before) = call(engine.addr(), "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
    ] {
        assert!(before.contains(&format!("# HELP {name} ")), "no HELP for {name}");
        assert!(before.contains(&format!("# TYPE {name} ")), "no TYPE for {name}");
    }
    let label = "{model_name=\"test-model\"}";
    let count = |text: &str, name: &str| metric(text, &format!("{name}{label}")).expect(name);
    assert_eq!(count(&before, "vllm:time_to_first_token_seconds_count"), 0.0);
    assert_eq!(
        metric(&before, "vllm:time_to_first_token_seconds_bucket{model_name=\"test-model\",le=\"0.001\"}"),
        Some(0.0)
    );
    call(engine.addr(), "POST", "/v1/chat/completions", &chat_body("count me", Some(5), false, false)).await;
    let (_, after) = call(engine.addr(), "GET", "/metrics", "").await;
    assert_eq!(count(&after, "vllm:time_to_first_token_seconds_count"), 1.0);
    assert_eq!(count(&after, "vllm:inter_token_latency_seconds_count"), 4.0);
    assert_eq!(count(&after, "vllm:e2e_request_latency_seconds_count"), 1.0);
    assert_eq!(count(&after, "vllm:generation_tokens_total"), 5.0);
    assert_eq!(count(&after, "vllm:prompt_tokens_total"), prompt_len("count me") as f64);
    assert_eq!(count(&after, "vllm:prefix_cache_queries_total"), prompt_len("count me") as f64);
    assert_eq!(count(&after, "vllm:num_requests_running"), 0.0);
    let kv = count(&after, "vllm:kv_cache_usage_perc");
    assert!((0.0..=1.0).contains(&kv));
    assert_eq!(
        metric(&after, "vllm:request_success_total{model_name=\"test-model\",finished_reason=\"length\"}"),
        Some(1.0)
    );
    engine.shutdown().await;
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    let engine = spawn_small_body_engine().await;
    let addr = engine.addr();
    let check = |status: u16, body: &Value, param: Option<&str>| {
        let error = &body["error"];
        assert!(error["message"].is_string(), "{body}");
        assert!(error["type"].is_string(), "{body}");
        assert_eq!(error["param"].as_str(), param, "{body}");
        assert_eq!(error["code"], status);
    };
    let (status, body) = call_json(addr, "POST", "/v1/chat/completions", "{not json").await;
    assert_eq!(status, 400);
    check(400, &body, None);
    let two = serde_json::json!({"model": MODEL, "n": 2, "messages": [{"role": "user", "content": "x"}]});
    let (status, body) = call_json(addr, "POST", "/v1/chat/completions", &two.to_string()).await;
    assert_eq!(status, 400);
    check(400, &body, Some("n"));
    let zero =
        serde_json::json!({"model": MODEL, "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]});
    let (status, body) = call_json(addr, "POST", "/v1/chat/completions", &zero.to_string()).await;
    check(status, &body, Some("max_tokens"));
    let (status, body) =
        call_json(addr, "POST", "/v1/chat/completions", r#"{"model":"test-model","messages":[]}"#).await;
    check(status, &body, Some("messages"));
    let other = serde_json::json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]});
    let (status, body) = call_json(addr, "POST", "/v1/chat/completions", &other.to_string()).await;
    assert_eq!(status, 404);
    check(404, &body, Some("model"));
    let (status, body) = call_json(addr, "GET", "/v2/nothing", "").await;
    check(status, &body, None);
    assert_eq!(status, 404);
    let big = chat_body(&"word ".repeat(1000), Some(1), false, false);
    let (status, body) = call_json(addr, "POST", "/v1/chat/completions", &big).await;
    assert_eq!(status, 413);
    check(413, &body, None);
    let (status, _) = call_json(addr, "GET", "/v1/chat/completions", "").await;
    assert_eq!(status, 405);
    engine.shutdown().await;
}

async fn spawn_small_body_engine() -> ilb_engine_sim::EngineHandle {
    let config = ilb_engine_sim::EngineConfig { max_body_bytes: 1024, ..config(fast_profile(), true) };
    ilb_engine_sim::spawn(config, loopback()).await.expect("spawn")
}

#[tokio::test]
async fn models_embeddings_and_health() {
    let engine = engine(fast_profile(), true).await;
    let (status, body) = call_json(engine.addr(), "GET", "/v1/models", "").await;
    assert_eq!(status, 200);
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"][0]["id"], MODEL);
    let request = serde_json::json!({"model": MODEL, "input": ["a b", "c"]}).to_string();
    let (status, body) = call_json(engine.addr(), "POST", "/v1/embeddings", &request).await;
    assert_eq!(status, 200);
    assert_eq!(body["data"].as_array().expect("data").len(), 2);
    assert_eq!(body["data"][1]["index"], 1);
    assert_eq!(body["data"][0]["embedding"].as_array().expect("vector").len(), 32);
    assert_eq!(body["usage"]["prompt_tokens"], 3);
    let (_, again) = call_json(engine.addr(), "POST", "/v1/embeddings", &request).await;
    assert_eq!(body["data"], again["data"], "deterministic");
    assert_eq!(call(engine.addr(), "GET", "/health", "").await.0, 200);
    engine.shutdown().await;
}

#[tokio::test]
async fn spawn_many_uses_consecutive_ports_and_distinct_ids() {
    let engines =
        ilb_engine_sim::spawn_many(config(fast_profile(), false), loopback(), 3).await.expect("spawn");
    assert_eq!(engines.len(), 3);
    let ids: Vec<&str> = engines.iter().map(|engine| engine.id().as_str()).collect();
    assert_eq!(ids, ["sim-0", "sim-1", "sim-2"]);
    for engine in &engines {
        assert_eq!(call(engine.addr(), "GET", "/health", "").await.0, 200);
    }
    // Consecutive ports from a fixed first port: probe a free base (another process may
    // take a port in between, so try a few bases).
    let mut consecutive = None;
    for _ in 0..10 {
        let probe = std::net::TcpListener::bind(loopback()).expect("probe");
        let base = probe.local_addr().expect("addr");
        drop(probe);
        if let Ok(engines) = ilb_engine_sim::spawn_many(config(fast_profile(), false), base, 3).await {
            consecutive = Some((base.port(), engines));
            break;
        }
    }
    let (base, engines) = consecutive.expect("three consecutive free ports");
    let ports: Vec<u16> = engines.iter().map(|engine| engine.addr().port()).collect();
    assert_eq!(ports, [base, base + 1, base + 2]);
    assert!(engines[2].url().ends_with(&format!(":{}", base + 2)));
}
