//! The OpenAI surface beyond chat and completions, on loopback: the Responses API (streamed
//! events passed through unchanged, `previous_response_id` reaching the engine that stored the
//! response), other model-routed paths, multipart forms, and paths that cannot be routed.

mod support;

use support::*;

/// Two simulated engines at equal weights: each stores only the responses it produced.
async fn two_engines() -> (Vec<ilb_engine_sim::EngineHandle>, ilb_dataplane::DataPlane) {
    let engines = sim_engines(2, quick_profile()).await;
    let dp = data_plane(config(), &sim_snapshot(1, &engines)).await;
    (engines, dp)
}

fn responses_body(input: &str, previous: Option<&str>, stream: bool) -> String {
    let previous = previous.map_or("null".to_owned(), |id| format!("\"{id}\""));
    format!(
        r#"{{"model":"m","input":"{input}","max_output_tokens":6,"stream":{stream},"previous_response_id":{previous}}}"#
    )
}

#[tokio::test]
async fn follow_ups_reach_the_engine_that_stored_the_response() {
    let (engines, dp) = two_engines().await;
    let client = client();
    let mut engines_seen = std::collections::HashSet::new();
    for conversation in 0..12 {
        // No session key: without the data plane's memory of response ids, each turn's input
        // hashes anywhere and half the follow-ups would reach an engine that answers 404.
        let first = responses_body(&format!("conversation {conversation} opens"), None, false);
        let (status, headers, text) = send(&client, post(&dp.url(), "/v1/responses", &first, &[])).await;
        assert_eq!(status, 200, "{text}");
        let stored_at = routed_engine(&headers).unwrap();
        engines_seen.insert(stored_at.clone());
        let mut id =
            serde_json::from_str::<serde_json::Value>(&text).unwrap()["id"].as_str().unwrap().to_owned();
        for turn in 1..4 {
            let stream = turn % 2 == 1;
            let body = responses_body(&format!("turn {turn} of {conversation}"), Some(&id), stream);
            let (status, headers, text) = send(&client, post(&dp.url(), "/v1/responses", &body, &[])).await;
            assert_eq!(status, 200, "turn {turn} of {conversation}: {text}");
            assert_eq!(routed_engine(&headers).as_deref(), Some(stored_at.as_str()), "turn {turn}");
            id = if stream {
                let created = text.lines().find(|l| l.starts_with("data: ")).unwrap();
                let v: serde_json::Value = serde_json::from_str(&created["data: ".len()..]).unwrap();
                v["response"]["id"].as_str().unwrap().to_owned()
            } else {
                serde_json::from_str::<serde_json::Value>(&text).unwrap()["id"].as_str().unwrap().to_owned()
            };
        }
    }
    assert_eq!(engines_seen.len(), 2, "conversations should start on both engines");
    // A response id no data plane has seen falls back to the hash: the engine says 404 itself.
    let unknown = responses_body("lost", Some("resp_unknown"), false);
    let (status, headers, text) = send(&client, post(&dp.url(), "/v1/responses", &unknown, &[])).await;
    assert_eq!(status, 404, "{text}");
    assert!(routed_engine(&headers).is_some(), "the 404 is the engine's, passed through");
    drop(engines);
}

#[tokio::test]
async fn response_streams_pass_through_unchanged() {
    let (engines, dp) = two_engines().await;
    let client = client();
    let body = responses_body("stream me", None, true);
    let (status, headers, via_ilb) = send(&client, post(&dp.url(), "/v1/responses", &body, &[])).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/event-stream");
    let types: Vec<&str> = via_ilb.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(types.first(), Some(&"response.created"));
    assert_eq!(types.last(), Some(&"response.incomplete"), "max_output_tokens ends it: {types:?}");
    assert_eq!(types.iter().filter(|t| **t == "response.output_text.delta").count(), 6);
    // Byte for byte what the engine sends, apart from the ids the engine makes per request.
    let engine = routed_engine(&headers).unwrap();
    let direct_url = engines[engine_index(&dp, &engine)].url();
    let (_, _, direct) = send(&client, post(&direct_url, "/v1/responses", &body, &[])).await;
    let normalise = |text: &str| {
        let v: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| {
                let mut v: serde_json::Value = serde_json::from_str(d).unwrap();
                strip_ids(&mut v);
                v
            })
            .collect();
        v
    };
    assert_eq!(normalise(&via_ilb), normalise(&direct));
    assert!(!via_ilb.contains("[DONE]"), "Responses streams end without [DONE]");
}

fn strip_ids(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            for key in ["id", "item_id", "created_at"] {
                map.remove(key);
            }
            map.values_mut().for_each(strip_ids);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_ids),
        _ => {}
    }
}

#[tokio::test]
async fn other_model_paths_are_routed_and_the_rest_get_a_404_naming_them() {
    let e1 = MockEngine::start("e1").await;
    let dp = data_plane(config(), &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let client = client();
    for path in ["/v1/messages", "/v1/rerank", "/v1/score", "/tokenize", "/rerank", "/v1/anything/new"] {
        let body = r#"{"model":"m","query":"q","messages":[{"role":"user","content":"hi"}]}"#;
        let (status, headers, text) = send(&client, post(&dp.url(), path, body, &[])).await;
        assert_eq!(status, 200, "{path}: {text}");
        assert_eq!(engine_of(&headers), "e1", "{path}");
        assert_eq!(text, body, "{path}: the body goes through unchanged");
    }
    let body = r#"{"model":"m"}"#;
    for path in ["/foo", "/v1"] {
        let (status, _, text) = send(&client, post(&dp.url(), path, body, &[])).await;
        assert_eq!(status, 404, "{path}: {text}");
        let error: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(error["error"]["message"].as_str().unwrap().contains(path), "{text}");
    }
    // A known path with the wrong method: 405 naming the methods it takes.
    let (status, headers, text) = send(&client, post(&dp.url(), "/v1/models", body, &[])).await;
    assert_eq!(status, 405, "{text}");
    assert_eq!(headers["allow"], "GET");
    assert!(text.contains("method_not_allowed"), "{text}");
    let (status, _, text) = send(&client, post(&dp.url(), "/v1/rerank", r#"{"query":"q"}"#, &[])).await;
    assert_eq!(status, 400, "a routed path needs a model: {text}");
    let (status, _, text) = send(&client, post(&dp.url(), "/v1/messages", r#"{"model":"other"}"#, &[])).await;
    assert_eq!(status, 404, "{text}");
    assert!(text.contains("model_not_found"), "{text}");
}

#[tokio::test]
async fn multipart_forms_route_by_their_model_field() {
    let e1 = MockEngine::start("e1").await;
    let dp = data_plane(config(), &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let client = client();
    let form = |model: Option<&str>| {
        let mut body = String::new();
        body.push_str("--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n");
        body.push_str("Content-Type: audio/wav\r\n\r\nRIFF....WAVE\r\n");
        if let Some(model) = model {
            body.push_str(&format!(
                "--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{model}\r\n"
            ));
        }
        body.push_str("--XyZ--\r\n");
        body
    };
    let content_type = [("content-type", "multipart/form-data; boundary=XyZ")];
    let body = form(Some("m"));
    let (status, headers, text) =
        send(&client, post(&dp.url(), "/v1/audio/transcriptions", &body, &content_type)).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(engine_of(&headers), "e1");
    assert_eq!(text, body, "the form goes through unchanged");
    let (status, _, text) =
        send(&client, post(&dp.url(), "/v1/audio/transcriptions", &form(None), &content_type)).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("'model' form field"), "{text}");
    let (status, _, text) =
        send(&client, post(&dp.url(), "/v1/audio/transcriptions", "--XyZ\r\nbroken", &content_type)).await;
    assert_eq!(status, 400, "{text}");
    let (status, _, text) =
        send(&client, post(&dp.url(), "/v1/audio/transcriptions", &form(Some("nope")), &content_type)).await;
    assert_eq!(status, 404, "{text}");
}

/// A request of any method with an empty body.
fn bare(method: &str, url: &str) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    http::Request::builder().method(method).uri(url).body(Default::default()).unwrap()
}

/// Regression (hardening finding 5): the SDK's `responses.retrieve`, `delete`, `cancel` and
/// `input_items.list` got `404 no route` although the data plane knew which engine stored the
/// response.
#[tokio::test]
async fn stored_response_operations_reach_the_engine_that_stored_the_response() {
    let (a, b) = (MockEngine::start("a").await, MockEngine::start("b").await);
    let dp = data_plane(config(), &snapshot(1, &[("a", a.url(), 1.0), ("b", b.url(), 1.0)])).await;
    let client = client();
    let mut stored_on = std::collections::HashSet::new();
    for i in 0..8 {
        // The mock engine echoes the body: its `id` is the id of the response it "stored".
        let body = format!(r#"{{"model":"m","input":"hi {i}","id":"resp_{i}"}}"#);
        let (status, headers, text) = send(&client, post(&dp.url(), "/v1/responses", &body, &[])).await;
        assert_eq!(status, 200, "{text}");
        let engine = engine_of(&headers);
        stored_on.insert(engine.clone());
        for (method, path) in [
            ("GET", format!("/v1/responses/resp_{i}")),
            ("DELETE", format!("/v1/responses/resp_{i}")),
            ("POST", format!("/v1/responses/resp_{i}/cancel")),
            ("GET", format!("/v1/responses/resp_{i}/input_items?limit=2&order=asc")),
        ] {
            let (status, headers, text) = send(&client, bare(method, &format!("{}{path}", dp.url()))).await;
            assert_eq!(status, 200, "{method} {path}: {text}");
            assert_eq!(engine_of(&headers), engine, "{method} {path}");
            assert_eq!(headers["x-seen-method"], method);
            assert_eq!(headers["x-seen-path"], path.as_str());
        }
    }
    assert_eq!(stored_on.len(), 2, "responses should be stored on both engines");
    let before = a.requests.load(std::sync::atomic::Ordering::SeqCst)
        + b.requests.load(std::sync::atomic::Ordering::SeqCst);
    let (status, headers, text) =
        send(&client, bare("GET", &format!("{}/v1/responses/resp_unknown", dp.url()))).await;
    assert_eq!(status, 404, "{text}");
    assert_eq!(headers["content-type"], "application/json");
    let error: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(error["error"]["message"].as_str().unwrap().contains("resp_unknown"), "{text}");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    let (status, headers, text) =
        send(&client, bare("PUT", &format!("{}/v1/responses/resp_1", dp.url()))).await;
    assert_eq!(status, 405, "{text}");
    assert_eq!(headers["allow"], "GET, DELETE");
    let after = a.requests.load(std::sync::atomic::Ordering::SeqCst)
        + b.requests.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(before, after, "an unknown id or a wrong method reaches no engine");
}

/// Regression (hardening finding 5): `models.retrieve(id)` was a 404 for a served model, and
/// the model list dropped the engines' own fields (vLLM's `max_model_len`, `root`, ...).
#[tokio::test]
async fn models_keep_the_engines_fields_and_are_retrieved_by_id() {
    let (a, b) = (MockEngine::start("a").await, MockEngine::start("b").await);
    let source = ilb_dataplane::SnapshotSource::Discover {
        engines: vec![a.url(), b.url()],
        interval: std::time::Duration::from_secs(30),
    };
    let dp = ilb_dataplane::DataPlane::start(config(), source).await.unwrap();
    assert!(eventually(std::time::Duration::from_secs(5), || dp.snapshot_version().is_some()).await);
    let client = client();
    let (status, text) = get(&client, &format!("{}/v1/models", dp.url())).await;
    assert_eq!(status, 200);
    let list: serde_json::Value = serde_json::from_str(&text).unwrap();
    let model = &list["data"][0];
    assert_eq!(model["id"], "m", "{text}");
    assert_eq!(model["max_model_len"], 4096, "{text}");
    assert_eq!(model["root"], "/models/m", "{text}");
    assert_eq!(model["owned_by"], "vllm", "{text}");
    assert!(model["permission"].is_array(), "{text}");
    let (status, text) = get(&client, &format!("{}/v1/models/m", dp.url())).await;
    assert_eq!(status, 200, "{text}");
    let retrieved: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(&retrieved, model);
    // The SDK percent-encodes a model name's slash (`org/model` is `org%2Fmodel`).
    let (status, text) = get(&client, &format!("{}/v1/models/%6D", dp.url())).await;
    assert_eq!(status, 200, "{text}");
    let (status, text) = get(&client, &format!("{}/v1/models/org%2Fnope", dp.url())).await;
    assert_eq!(status, 404, "{text}");
    assert!(text.contains("org/nope"), "{text}");
    let (status, text) = get(&client, &format!("{}/v1/models/nope", dp.url())).await;
    assert_eq!(status, 404, "{text}");
    assert!(text.contains("model_not_found"), "{text}");

    // From a snapshot alone the data plane knows the names only.
    let dp = data_plane(config(), &snapshot(1, &[("a", a.url(), 1.0)])).await;
    let (status, text) = get(&client, &format!("{}/v1/models/m", dp.url())).await;
    assert_eq!(status, 200, "{text}");
    let retrieved: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!((retrieved["id"].as_str(), retrieved["object"].as_str()), (Some("m"), Some("model")));
}
