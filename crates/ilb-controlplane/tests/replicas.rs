//! Two control-plane replicas from one config, three data planes pulling from the first and
//! reporting to both, streaming load; the active replica is killed: no request fails, every
//! data plane moves to the other replica, a demand change after the kill shows in the weights
//! it installs, and when the killed replica comes back (same address) no data plane ever
//! installs a lower version. Registrations go to both replicas, so the survivor knows the
//! registered engine. Run with `--nocapture` for the figures.
//!
//! Version order across replicas: versions are Unix-millisecond publication times (each at
//! least the replica's previous plus one), and a data plane installs only a version at least
//! the one it holds. So the newest publication wins whichever replica made it; a replica whose
//! current version is older than the one held is waited on until it publishes a newer one
//! (within a solve period when the replicas' clocks agree to better than that).
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines

mod fleet_support;
mod support;
mod wait;

use bytes::Bytes;
use fleet_support::*;
use http_body_util::{BodyExt, Full};
use ilb_controlplane::ControlPlane;
use ilb_controlplane::Registrar;
use ilb_core::report::{ClassDemand, Report};
use ilb_core::{ClassId, ClusterId, ModelName};
use ilb_dataplane::report::ReportConfig;
use ilb_dataplane::{DataPlane, DataPlaneConfig, SnapshotSource};
use ilb_planning::fleet::members::Registration;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Every install one data plane made: (when, version).
type InstallLog = Arc<Mutex<Vec<(Instant, u64)>>>;

/// The weight data plane `dp` gives `engine` in its default class.
fn weight(dp: &DataPlane, engine: &str) -> f64 {
    let Some(installed) = dp.installed() else { return 0.0 };
    let t = &installed.table;
    t.models()
        .flat_map(|m| &m.classes)
        .filter(|c| c.id.as_str() == "default")
        .flat_map(|c| &c.candidates)
        .filter(|c| t.engines[c.engine_idx].id.as_str() == engine)
        .map(|c| c.weight)
        .sum()
}

async fn post_report(cp: &str, demand_rps: f64, sequence: u64) {
    let report = Report {
        replica: None,
        cluster: ClusterId::new("a"),
        instance: "extra-demand".into(),
        sequence,
        period_ms: 250,
        snapshot_version: 0,
        demand: vec![ClassDemand {
            model: ModelName::new("m"),
            class: ClassId::new("default"),
            requests: (demand_rps / 4.0) as u64,
            shed: 0,
            rps: demand_rps,
            by_priority: None,
        }],
        engines: vec![],
    };
    let request = http::Request::post(format!("{cp}/v1/reports"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(&report).unwrap())))
        .unwrap();
    let response = client().request(request).await.unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    let _ = response.into_body().collect().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_active_replica_under_load_fails_no_request_and_versions_never_go_down() {
    let engines = engines(3).await;
    let fleet = two_region_fleet("smoothing_ms = 1000", &engines[0].url(), &engines[1].url());
    let cp0 = ControlPlane::start(fleet.clone(), "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let cp1 = ControlPlane::start(fleet.clone(), "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let cp0_addr: SocketAddr = cp0.local_addr();
    let urls = [cp0.url(), cp1.url()];

    // A registered engine, heartbeating to both replicas.
    let registration = Registration {
        id: "r2".into(),
        url: engines[2].url(),
        model: "m".into(),
        region: "b".into(),
        profile: "gpu".into(),
        replicas: 1,
        capabilities: vec![],
        residency: vec![],
        capacity_rps: None,
        max_in_flight: None,
        ttl_s: 3.0,
    };
    let mut registrars: Vec<Registrar> =
        urls.iter().map(|u| Registrar::spawn(u, TOKEN, registration.clone())).collect();
    for r in &mut registrars {
        assert!(r.registered(DEADLINE).await);
    }

    let mut dps = Vec::new();
    for (i, cluster) in ["a", "a", "b"].iter().enumerate() {
        let mut c = DataPlaneConfig::new("127.0.0.1:0".parse().unwrap());
        c.cluster = Some(ilb_core::ClusterId::new(*cluster));
        let source = SnapshotSource::Replicas {
            urls: urls.iter().map(|u| format!("{u}/v1/snapshots/{cluster}")).collect(),
            interval: Duration::from_millis(100),
            long_poll: true,
        };
        let mut reports = ReportConfig::new(format!("{}/v1/reports", urls[0]), format!("dp-{i}"));
        reports.also = vec![format!("{}/v1/reports", urls[1])];
        reports.interval = Duration::from_millis(250);
        reports.token = Some(TOKEN.into());
        dps.push(Arc::new(DataPlane::start_with_reports(c, source, Some(reports)).await.unwrap()));
    }
    let end = Instant::now() + DEADLINE;
    while dps.iter().any(|dp| dp.installed().is_none_or(|i| i.table.engines.len() < 3)) {
        assert!(Instant::now() < end, "data planes never installed the registered engine");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Every install each data plane makes: (when, version).
    let (stop, stop_rx) = watch::channel(false);
    let installs: Vec<InstallLog> = dps.iter().map(|_| Arc::default()).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for (dp, log) in dps.iter().zip(&installs) {
        let (dp, log, mut stop) = (Arc::clone(dp), Arc::clone(log), stop_rx.clone());
        tasks.spawn(async move {
            loop {
                if let Some(v) = dp.snapshot_version() {
                    let mut log = log.lock().unwrap();
                    if log.last().is_none_or(|(_, last)| *last != v.0) {
                        log.push((Instant::now(), v.0));
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(5)) => {}
                    _ = stop.changed() => return,
                }
            }
        });
    }
    let recs = Arc::new(Mutex::new(Vec::new()));
    for (i, dp) in dps.iter().enumerate() {
        for w in 0..2 {
            tasks.spawn(worker(i * 10 + w, dp.url(), Arc::clone(&recs), stop_rx.clone()));
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let remote = weight(&dps[0], "e1") + weight(&dps[0], "r2");
    assert!(remote < 0.05, "light demand stays local: {remote}");

    // Kill the replica every data plane pulls from.
    let killed_at = Instant::now();
    cp0.shutdown().await;
    // A demand change only the survivor can see: cluster a now needs more than e0 has (150 req/s against its usable 95; the fleet has 285).
    let mut sequence = 1;
    let end = Instant::now() + DEADLINE;
    let spilled_at = loop {
        post_report(&urls[1], 150.0, sequence).await;
        sequence += 1;
        if dps[..2].iter().all(|dp| weight(dp, "e1") + weight(dp, "r2") > 0.2) {
            break Instant::now();
        }
        assert!(
            Instant::now() < end,
            "the survivor's plan never reached the data planes: {}",
            weight(&dps[0], "e1")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The survivor still knows the registered engine (its heartbeats went to both).
    assert!(cp1.view().membership.engines.iter().any(|m| m.id == "r2" && m.source == "registered"));
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The killed replica comes back on its address, from the same config.
    let restarted_at = Instant::now();
    let cp0 = ControlPlane::start(fleet.clone(), cp0_addr).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        cp0.view().membership.engines.iter().any(|m| m.id == "r2"),
        "heartbeats re-registered r2 on the restarted replica"
    );

    let _ = stop.send(true);
    while tasks.join_next().await.is_some() {}
    drop(registrars);
    let recs = recs.lock().unwrap().clone();
    assert_no_failures(&recs);
    let mut worst_gap = Duration::ZERO;
    for (i, log) in installs.iter().enumerate() {
        let log = log.lock().unwrap();
        for pair in log.windows(2) {
            assert!(
                pair[1].1 >= pair[0].1,
                "data plane {i} installed version {} after {}",
                pair[1].1,
                pair[0].1
            );
        }
        // Snapshot age around the kill: the longest time without a new install.
        let mut previous = killed_at;
        for (at, _) in log.iter().filter(|(at, _)| *at >= killed_at && *at <= restarted_at) {
            worst_gap = worst_gap.max(*at - previous);
            previous = *at;
        }
        assert!(log.iter().any(|(at, _)| *at > killed_at), "data plane {i} installed nothing after the kill");
    }
    println!("| change or fault | time until the plan reflected it | requests failed | streams cut |");
    println!(
        "| active control plane killed, demand change after it | {:.0} ms until the survivor's spill weights were installed on both cluster-a data planes; longest time without a new snapshot {:.0} ms (solve period {SOLVE_MS} ms) | {} of {} | {} |",
        (spilled_at - killed_at).as_secs_f64() * 1000.0,
        worst_gap.as_secs_f64() * 1000.0,
        recs.iter().filter(|r| !r.ok()).count(),
        recs.len(),
        recs.iter().filter(|r| r.status == 200 && !r.complete).count()
    );
    for dp in dps {
        Arc::try_unwrap(dp).ok().unwrap().shutdown().await;
    }
    cp0.shutdown().await;
    cp1.shutdown().await;
}
