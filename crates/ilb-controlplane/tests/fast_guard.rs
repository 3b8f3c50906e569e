//! The data planes' fast guard end to end on loopback: three simulated engines, a control
//! plane that plans once (the next solve is a minute away), one data plane. An engine that
//! reports zero ready replicas, or stops answering, is held by the data plane without a new
//! plan and without any request having failed on it (no traffic runs while it is taken out,
//! so the local guard cannot be what removed it); requests then avoid it, and it comes back
//! when it recovers. Deadlines only guard against hangs.
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines

mod support;
mod wait;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use ilb_controlplane::ControlPlane;
use ilb_core::holds::{EngineHolds, HoldReason};
use ilb_dataplane::DataPlane;
use ilb_engine_sim::{EngineHandle, Faults, HardwareProfile};
use std::time::Duration;
use support::HttpClient;
use tokio::time::Instant;

const HELD: usize = 1;

fn profile() -> HardwareProfile {
    HardwareProfile {
        name: "test".into(),
        max_num_seqs: 8,
        max_num_batched_tokens: 4096,
        kv_blocks: 4096,
        iteration_base_ms: 5.0,
        prefill_token_us: 1.0,
        decode_seq_us: 1.0,
        replicas: 1,
    }
}

/// `n` requests on sessions `{phase}-0…`: a fresh phase has no remembered engines (the
/// affinity table keeps a session on the engine that served it last).
async fn send(client: &HttpClient, url: &str, phase: &str, n: usize) {
    for i in 0..n {
        let body =
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi {i}"}}],"max_tokens":2}}"#);
        let request = http::Request::post(format!("{url}/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("x-session-id", format!("{phase}-{i}"))
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert!(response.status().is_success(), "status {}", response.status());
        response.into_body().collect().await.unwrap();
    }
}

fn served(engine: &EngineHandle) -> u64 {
    let s = engine.stats();
    s.requests_served + s.requests_aborted
}

/// Polls until the data plane's view of engine `HELD` is `held` and returns how long that
/// took (reported, not asserted). Gives up after 1,000 polls, a bound on observations rather
/// than on elapsed time: it only catches a hold that never comes.
async fn until_held(dp: &DataPlane, held: Option<HoldReason>) -> Duration {
    let started = Instant::now();
    for _ in 0..1000 {
        let installed = dp.installed().unwrap();
        if installed.engines[HELD].hold_reason() == held {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("engine hold never became {held:?} in 1,000 polls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_engines_get_no_requests_without_waiting_for_a_plan() {
    let engines = support::engines(3, &profile()).await;
    let fleet = support::fleet(&engines, "scrape_interval_ms = 250\nsolve_interval_ms = 60000");
    let cp = ControlPlane::start(fleet, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dp = support::data_plane(&cp.url(), "a", None).await;
    let version = dp.snapshot_version();
    let client = support::client();
    send(&client, &dp.url(), "before", 60).await;
    assert!(served(&engines[HELD]) > 0, "the engine had its share before the fault");

    // Zero ready replicas: the control plane's next scrape sees it, the data plane holds it.
    engines[HELD].set_faults(Faults { ready_replicas: Some(0), ..Faults::default() }).unwrap();
    let took = until_held(&dp, Some(HoldReason::NoReadyReplicas)).await;
    eprintln!("held for no ready replicas {:.0} ms after the fault", took.as_secs_f64() * 1000.0);
    assert_eq!(dp.snapshot_version(), version, "no new plan was needed");
    let holds: EngineHolds =
        serde_json::from_slice(&support::get(&client, &format!("{}/v1/engine-holds", cp.url())).await)
            .unwrap();
    assert_eq!(holds.held.len(), 1);
    assert_eq!(holds.held[0].engine.as_str(), "e1");
    let before = served(&engines[HELD]);
    send(&client, &dp.url(), "held", 60).await;
    assert_eq!(served(&engines[HELD]), before, "a held engine got requests");

    // Recovered: the hold goes, and the engine gets requests again on the same plan.
    engines[HELD].set_faults(Faults::default()).unwrap();
    until_held(&dp, None).await;
    send(&client, &dp.url(), "recovered", 60).await;
    assert!(served(&engines[HELD]) > before, "the engine got nothing after it recovered");

    // Down (its metrics endpoint stops answering): held as unreachable.
    engines[HELD].set_faults(Faults { down: true, ..Faults::default() }).unwrap();
    let took = until_held(&dp, Some(HoldReason::Unreachable)).await;
    eprintln!("held as unreachable {:.0} ms after it went down", took.as_secs_f64() * 1000.0);
    let before = served(&engines[HELD]);
    send(&client, &dp.url(), "down", 30).await;
    assert_eq!(served(&engines[HELD]), before);
    assert_eq!(dp.snapshot_version(), version, "still no new plan");
    engines[HELD].set_faults(Faults::default()).unwrap();
    until_held(&dp, None).await;

    dp.shutdown().await;
    cp.shutdown().await;
}
