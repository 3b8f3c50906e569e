//! A fleet that changes under steady streaming load, by reload and by registration: it grows
//! from 2 to 6 engines and back with no failed request; each new engine is in the first or
//! second snapshot installed after it joined and then gets requests; a removed engine gets no
//! request started after the snapshot without it was installed, and its running streams
//! finish. An invalid reload keeps the old fleet and says why; leases that run out remove
//! their engines. Run with `--nocapture` for the table of each change.
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines

mod fleet_support;
mod support;
mod wait;

use bytes::Bytes;
use fleet_support::*;
use http_body_util::{BodyExt, Full};
use ilb_controlplane::Registrar;
use ilb_engine_sim::EngineHandle;
use ilb_planning::fleet::members::Registration;
use std::time::Duration;
use tokio::time::Instant;

fn registration(engine: &EngineHandle, ttl_s: f64) -> Registration {
    Registration {
        id: engine.id().to_string(),
        url: engine.url(),
        model: "m".into(),
        region: "a".into(),
        profile: "gpu".into(),
        replicas: 1,
        capabilities: Vec::new(),
        residency: Vec::new(),
        capacity_rps: None,
        max_in_flight: None,
        ttl_s,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_grows_the_fleet_from_two_to_six_and_back_under_load_and_a_bad_file_changes_nothing() {
    let engines = engines(6).await;
    let all: Vec<&EngineHandle> = engines.iter().collect();
    let mut stack = Stack::start(parse(&fleet_toml(&all[..2], "")), 8).await;
    stack.run_for(Duration::from_secs(1)).await;

    let at = Instant::now();
    assert!(stack.cp.reloader().reload(Ok(parse(&fleet_toml(&all, "")))).await);
    stack.reflected("reload: 2 → 6 engines", at, &ids(&all[2..]), &[]).await;
    stack.run_for(Duration::from_secs(2)).await;

    let at = Instant::now();
    assert!(stack.cp.reloader().reload(Ok(parse(&fleet_toml(&all[..2], "")))).await);
    stack.reflected("reload: 6 → 2 engines", at, &[], &ids(&all[2..])).await;

    // A file naming a profile that does not exist: refused with the field, the fleet stays.
    let at = Instant::now();
    let mut bad = parse(&fleet_toml(&all, ""));
    bad.engines[2].profile = "h200".into();
    assert!(stack.cp.reloader().reload(Ok(bad)).await);
    let end = Instant::now() + DEADLINE;
    let reason = loop {
        if let Some(r) = stack.cp.view().membership.config.rejected.clone() {
            break r.reason;
        }
        assert!(Instant::now() < end, "the bad file was not reported");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(reason, "engines.e2.profile: unknown profile 'h200'");
    // /v1/state says so too.
    let state = get_json(&format!("{}/v1/state", stack.cp.url())).await;
    assert_eq!(state["membership"]["config"]["rejected"]["reason"], reason.as_str());
    stack.run_for(Duration::from_secs(2)).await;
    let expected: std::collections::BTreeSet<String> = ids(&all[..2]).into_iter().collect();
    for install in stack.installs.lock().unwrap().iter().filter(|i| i.at >= at) {
        assert_eq!(
            install.engines, expected,
            "a refused file changed the plan (version {})",
            install.version
        );
    }
    let members: Vec<String> = stack.cp.view().membership.engines.iter().map(|m| m.id.clone()).collect();
    assert_eq!(members, ids(&all[..2]));
    stack.rows.push(format!("| invalid reload (unknown profile) | refused: {reason} | - | - | 0 | - |"));

    // A good file after the bad one clears the refusal.
    assert!(stack.cp.reloader().reload(Ok(parse(&fleet_toml(&all[..3], "")))).await);
    stack.reflected("reload after the refused one: 2 → 3", Instant::now(), &ids(&all[2..3]), &[]).await;
    assert!(stack.cp.view().membership.config.rejected.is_none());

    let (recs, _) = stack.finish().await;
    assert_no_failures(&recs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_grows_the_fleet_and_delete_and_lease_expiry_shrink_it_under_load() {
    let engines = engines(6).await;
    let all: Vec<&EngineHandle> = engines.iter().collect();
    let mut stack = Stack::start(parse(&fleet_toml(&all[..2], "")), 8).await;
    stack.run_for(Duration::from_secs(1)).await;

    let at = Instant::now();
    let mut registrars: Vec<Registrar> =
        all[2..].iter().map(|e| Registrar::spawn(&stack.cp.url(), TOKEN, registration(e, 2.0))).collect();
    for r in &mut registrars {
        assert!(r.registered(DEADLINE).await);
    }
    stack.reflected("registration: 2 → 6 engines", at, &ids(&all[2..]), &[]).await;
    // Heartbeats keep the leases past their length.
    stack.run_for(Duration::from_secs(3)).await;
    let view = stack.cp.view();
    let registered: Vec<_> = view.membership.engines.iter().filter(|m| m.source == "registered").collect();
    assert_eq!(registered.len(), 4, "{:?}", view.membership.engines);
    for m in &registered {
        assert!(m.lease_age_ms.is_some_and(|age| age < 2000), "lease not renewed: {m:?}");
        assert!(m.registered_age_ms.unwrap() > 2000, "outlived its ttl by heartbeats: {m:?}");
    }

    let at = Instant::now();
    for r in registrars.drain(..2) {
        r.deregister().await.unwrap();
    }
    stack.reflected("DELETE: 6 → 4 engines", at, &[], &ids(&all[2..4])).await;

    // The last two stop renewing: their 2 s leases run out.
    let at = Instant::now();
    registrars.clear();
    stack
        .reflected("lease expiry (ttl 2 s, from the last heartbeat): 4 → 2 engines", at, &[], &ids(&all[4..]))
        .await;

    let (recs, _) = stack.finish().await;
    assert_no_failures(&recs);
}

async fn get_json(url: &str) -> serde_json::Value {
    let response =
        client().request(http::Request::get(url).body(Full::new(Bytes::new())).unwrap()).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

async fn call(method: &str, url: &str, token: Option<&str>, body: &str) -> (u16, serde_json::Value) {
    let mut request =
        http::Request::builder().method(method).uri(url).header("content-type", "application/json");
    if let Some(t) = token {
        request = request.header("authorization", format!("Bearer {t}"));
    }
    let response =
        client().request(request.body(Full::new(Bytes::from(body.to_owned()))).unwrap()).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null))
}

#[tokio::test]
async fn registrations_are_validated_like_config_engines_with_clear_errors() {
    let engines = engines(1).await;
    let cp = ilb_controlplane::ControlPlane::start(
        parse(&fleet_toml(&[&engines[0]], "")),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let url = format!("{}/v1/engines", cp.url());
    let good =
        r#"{"id":"r1","url":"http://127.0.0.1:9","model":"m","region":"a","profile":"gpu","ttl_s":30}"#;
    let cases: [(&str, Option<&str>, u16, &str); 12] = [
        (good, None, 401, "bearer token"),
        (good, Some("wrong"), 401, "bearer token"),
        (
            &good.replace("\"gpu\"", "\"h200\""),
            Some(TOKEN),
            400,
            "registration.profile: unknown profile 'h200'",
        ),
        (
            &good.replace("http://127.0.0.1:9", "http://user:s3cret-pw@x"),
            Some(TOKEN),
            400,
            "registration.url: 'http://<redacted>@x' must not carry credentials",
        ),
        (
            &good.replace("\"ttl_s\"", "\"replicas\":0,\"ttl_s\""),
            Some(TOKEN),
            400,
            "replicas: 0 is not in [1, 100000]",
        ),
        (
            &good.replace("\"ttl_s\"", "\"replicas\":4294967295,\"ttl_s\""),
            Some(TOKEN),
            400,
            "replicas: 4294967295 is not in [1, 100000]",
        ),
        (
            &good.replace("\"ttl_s\"", "\"capacity_rps\":1e-300,\"ttl_s\""),
            Some(TOKEN),
            400,
            "registration.capacity_rps: 1e-300 is not in [0.001, 1000000]",
        ),
        (
            &good.replace("\"ttl_s\"", "\"capacity_rps\":1e308,\"ttl_s\""),
            Some(TOKEN),
            400,
            "registration.capacity_rps: 1e308 is not in [0.001, 1000000]",
        ),
        (&good.replace("\"ttl_s\":30", "\"ttl_s\":0"), Some(TOKEN), 400, "ttl_s: 0 is not in (0, 3600]"),
        (
            &good.replace("\"r1\"", "\"e0\""),
            Some(TOKEN),
            409,
            "id: engine 'e0' is already defined by the config file",
        ),
        (
            &good.replace("\"ttl_s\":30", "\"ttl_s\":30,\"colour\":1"),
            Some(TOKEN),
            400,
            "unknown field `colour`",
        ),
        (
            &good.replace("\"model\":\"m\"", "\"model\":\"\""),
            Some(TOKEN),
            400,
            "registration.model: must not be empty",
        ),
    ];
    for (body, token, status, message) in cases {
        let (got, answer) = call("POST", &url, token, body).await;
        let text = answer["error"]["message"].as_str().unwrap_or_default().to_owned();
        assert_eq!(got, status, "{body}: {answer}");
        assert!(text.contains(message), "{body}: {text:?} should say {message:?}");
    }
    let (status, answer) = call("POST", &url, Some(TOKEN), good).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("registered")));
    let (status, answer) = call("POST", &url, Some(TOKEN), good).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("renewed")));
    let (status, _) = call("DELETE", &format!("{url}/r1"), Some(TOKEN), "").await;
    assert_eq!(status, 200);
    let (status, answer) = call("DELETE", &format!("{url}/r1"), Some(TOKEN), "").await;
    assert_eq!(status, 404, "{answer}");
    cp.shutdown().await;

    // Without a token configured, registration is off.
    let open = fleet_toml(&[&engines[0]], "").replace(&format!("token = \"{TOKEN}\""), "");
    let cp =
        ilb_controlplane::ControlPlane::start(parse(&open), "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let (status, answer) = call("POST", &format!("{}/v1/engines", cp.url()), None, good).await;
    assert_eq!(status, 403, "{answer}");
    cp.shutdown().await;
}
