//! A fleet that changes under steady load: simulated engines, one control plane, one data
//! plane reporting to it, closed-loop streaming traffic, and a watcher recording every
//! snapshot the data plane installs. Each change is checked (the first snapshot published
//! after the control plane applied it reflects it; new engines get requests; removed ones get
//! none started after the snapshot without them, and their running streams finish) and
//! measured: how long until the installed plan reflected it, how many installs that took,
//! when a new engine got its first request, requests failed, streams cut.
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines
#![allow(dead_code)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use ilb_controlplane::ControlPlane;
use ilb_dataplane::report::ReportConfig;
use ilb_dataplane::{DataPlane, DataPlaneConfig, SnapshotSource};
use ilb_engine_sim::{EngineHandle, HardwareProfile};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Guards against hangs only; never a performance bound.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// A hang guard counted in polls, not a wall-clock bound: [`DEADLINE`]'s worth of sleeps of
/// `every`, which a loaded machine only stretches.
pub struct Polls {
    left: u128,
    every: Duration,
}

impl Polls {
    pub fn new(every: Duration) -> Polls {
        Polls { left: DEADLINE.as_millis() / every.as_millis().max(1), every }
    }

    /// Sleeps one poll; panics with `what` once the polls are used up.
    pub async fn wait(&mut self, what: &str) {
        assert!(self.left > 0, "gave up waiting: {what}");
        self.left -= 1;
        tokio::time::sleep(self.every).await;
    }
}
pub const SOLVE_MS: u64 = 500;
pub const TOKEN: &str = "fleet-secret";

pub use crate::support::client;

/// Streams last a few hundred ms (16 tokens at ~12 ms per iteration), so some are always
/// running on an engine when it leaves.
pub fn profile() -> HardwareProfile {
    HardwareProfile {
        name: "test".into(),
        max_num_seqs: 16,
        max_num_batched_tokens: 8192,
        kv_blocks: 8192,
        iteration_base_ms: 12.0,
        prefill_token_us: 1.0,
        decode_seq_us: 1.0,
        replicas: 1,
    }
}

/// `n` engines `e0`, `e1`, … with [`profile`].
pub async fn engines(n: usize) -> Vec<EngineHandle> {
    crate::support::engines(n as u64, &profile()).await
}

/// The fleet file: one cluster, one profile, `engines` as `[[engines]]`, then `extra`.
pub fn fleet_toml(engines: &[&EngineHandle], extra: &str) -> String {
    let mut text = format!(
        r#"
[control_plane]
listen = "127.0.0.1:0"
scrape_interval_ms = 250
solve_interval_ms = {SOLVE_MS}
smoothing_ms = 2000
token = "{TOKEN}"
[network]
use_measured = false
[[clusters]]
id = "a"
region = "a"
[profiles.gpu]
capacity_rps = 40.0
ttft_t0_ms = 30.0
ttft_b_ms = 10.0
"#
    );
    for e in engines {
        text.push_str(&format!(
            "[[engines]]\nid = \"{}\"\nurl = \"{}\"\nmodel = \"m\"\nregion = \"a\"\nprofile = \"gpu\"\n",
            e.id(),
            e.url()
        ));
    }
    text.push_str(extra);
    text
}

pub fn parse(text: &str) -> ilb_controlplane::FleetConfig {
    let config: ilb_controlplane::FleetConfig = toml::from_str(text).unwrap();
    config.validate().unwrap();
    config
}

/// One request of the load.
#[derive(Clone, Debug)]
pub struct Rec {
    pub started: Instant,
    pub finished: Instant,
    pub engine: String,
    pub status: u16,
    /// The stream ended with `data: [DONE]` and carried no error event.
    pub complete: bool,
}

impl Rec {
    pub fn ok(&self) -> bool {
        self.status == 200 && self.complete
    }
}

/// A snapshot the data plane installed: when the watcher saw it, and the engines it gives a
/// positive weight.
#[derive(Clone, Debug)]
pub struct Install {
    pub at: Instant,
    pub version: u64,
    pub engines: BTreeSet<String>,
}

pub struct Stack {
    pub cp: ControlPlane,
    pub dp: Arc<DataPlane>,
    pub recs: Arc<Mutex<Vec<Rec>>>,
    pub installs: Arc<Mutex<Vec<Install>>>,
    stop: watch::Sender<bool>,
    tasks: tokio::task::JoinSet<()>,
    pub rows: Vec<String>,
}

impl Stack {
    pub async fn start(config: ilb_controlplane::FleetConfig, workers: usize) -> Stack {
        let cp = ControlPlane::start(config, "127.0.0.1:0".parse().unwrap()).await.unwrap();
        let mut dp_config = DataPlaneConfig::new("127.0.0.1:0".parse().unwrap());
        dp_config.cluster = Some(ilb_core::ClusterId::new("a"));
        let source = SnapshotSource::Poll {
            url: format!("{}/v1/snapshots/a", cp.url()),
            interval: Duration::from_millis(100),
            long_poll: true,
        };
        let mut reports = ReportConfig::new(format!("{}/v1/reports", cp.url()), "dp-a".into());
        reports.interval = Duration::from_millis(250);
        reports.token = Some(TOKEN.into());
        let dp = Arc::new(DataPlane::start_with_reports(dp_config, source, Some(reports)).await.unwrap());
        let (stop, stop_rx) = watch::channel(false);
        let recs = Arc::new(Mutex::new(Vec::new()));
        let installs = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(watch_installs(Arc::clone(&dp), Arc::clone(&installs), stop_rx.clone()));
        // Traffic starts once a first snapshot is installed.
        let mut guard = Polls::new(Duration::from_millis(20));
        while dp.installed().is_none_or(|i| i.table.engines.is_empty()) {
            guard.wait("no snapshot with engines installed").await;
        }
        for w in 0..workers {
            tasks.spawn(worker(w, dp.url(), Arc::clone(&recs), stop_rx.clone()));
        }
        Stack { cp, dp, recs, installs, stop, tasks, rows: Vec::new() }
    }

    /// Waits until the control plane has applied the change (its membership lists every engine
    /// of `present` and none of `absent`) and the installed plan gives every engine of
    /// `present` a weight and none of `absent` any; checks that the first snapshot published
    /// after the change was applied already reflects it (a count of plans, not a time), and
    /// records the change's row with the times measured from `at`.
    pub async fn reflected(
        &mut self,
        change: &str,
        at: Instant,
        present: &[String],
        absent: &[String],
    ) -> Instant {
        // The version published last when the change was applied: every later one must show it.
        let mut guard = Polls::new(Duration::from_millis(5));
        let applied_version = loop {
            let view = self.cp.view();
            let members: BTreeSet<&str> = view.membership.engines.iter().map(|m| m.id.as_str()).collect();
            if present.iter().all(|e| members.contains(e.as_str()))
                && absent.iter().all(|e| !members.contains(e.as_str()))
            {
                break view.version;
            }
            guard.wait(&format!("{change}: the control plane never applied it")).await;
        };
        let reflects = |i: &Install| {
            present.iter().all(|e| i.engines.contains(e)) && absent.iter().all(|e| !i.engines.contains(e))
        };
        let mut guard = Polls::new(Duration::from_millis(20));
        let install = loop {
            let first_after =
                self.installs.lock().unwrap().iter().find(|i| i.version > applied_version).cloned();
            if let Some(i) = first_after {
                if !reflects(&i) {
                    // What the plan made of each engine, to tell a plan that left an engine out
                    // (no capacity, no load) from one the data plane installed wrongly.
                    let view = self.cp.view();
                    let engines: Vec<String> = view
                        .models
                        .iter()
                        .flat_map(|m| &m.engines)
                        .map(|e| {
                            format!(
                                "{} load {:.2} of {:.1} rps",
                                e.id, e.planned_load_rps, e.effective_capacity_rps
                            )
                        })
                        .collect();
                    panic!(
                        "{change}: the first snapshot after the change was applied (version {}) does not reflect it: {:?}; the plan now (version {}): {engines:?}",
                        i.version, i.engines, view.version
                    );
                }
                break i;
            }
            guard.wait(&format!("{change}: no snapshot installed after the change")).await;
        };
        let installs_after = self
            .installs
            .lock()
            .unwrap()
            .iter()
            .filter(|i| i.at >= at && i.version <= install.version)
            .count();
        // New engines get traffic.
        let mut first_request = Duration::ZERO;
        for engine in present {
            let mut guard = Polls::new(Duration::from_millis(20));
            loop {
                let first = self
                    .recs
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|r| r.started >= at && r.engine == *engine)
                    .map(|r| r.started)
                    .min();
                if let Some(t) = first {
                    first_request = first_request.max(t - at);
                    break;
                }
                guard.wait(&format!("{change}: {engine} never got a request")).await;
            }
        }
        // Give the removed engines' running streams time to end before counting them.
        if !absent.is_empty() {
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        let recs = self.recs.lock().unwrap().clone();
        let late: Vec<&Rec> =
            recs.iter().filter(|r| r.started > install.at && absent.contains(&r.engine)).collect();
        assert!(
            late.is_empty(),
            "{change}: requests started after the plan dropped the engine went to it: {late:?}"
        );
        let draining: Vec<&Rec> = recs
            .iter()
            .filter(|r| absent.contains(&r.engine) && r.started <= install.at && r.finished >= install.at)
            .collect();
        let cut = draining.iter().filter(|r| !r.ok()).count();
        let failed = recs.iter().filter(|r| r.started >= at && !r.ok()).count();
        let row = format!(
            "| {change} | {:.0} ms | {} | {} | {failed} | {cut} of {} |",
            (install.at - at).as_secs_f64() * 1000.0,
            installs_after,
            if present.is_empty() {
                "-".to_owned()
            } else {
                format!("{:.0} ms", first_request.as_secs_f64() * 1000.0)
            },
            draining.len(),
        );
        println!("{row}");
        self.rows.push(row);
        install.at
    }

    /// Lets the load run for a while.
    pub async fn run_for(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    /// Stops the load and returns every request made.
    pub async fn finish(mut self) -> (Vec<Rec>, Vec<String>) {
        let _ = self.stop.send(true);
        while self.tasks.join_next().await.is_some() {}
        let recs = self.recs.lock().unwrap().clone();
        let dp = Arc::try_unwrap(self.dp).ok().expect("data plane still shared");
        dp.shutdown().await;
        self.cp.shutdown().await;
        println!("| change | plan reflected it after | installs | first request on new engines | requests failed | streams cut (of running on removed engines) |");
        for row in &self.rows {
            println!("{row}");
        }
        (recs, self.rows)
    }
}

pub fn assert_no_failures(recs: &[Rec]) {
    let failed: Vec<&Rec> = recs.iter().filter(|r| !r.ok()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {:?}",
        failed.len(),
        recs.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(recs.len() > 50, "too little load to show anything: {} requests", recs.len());
}

async fn watch_installs(
    dp: Arc<DataPlane>,
    installs: Arc<Mutex<Vec<Install>>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut last = None;
    loop {
        if let Some(installed) = dp.installed() {
            let table = &installed.table;
            if last != Some(table.version.0) {
                last = Some(table.version.0);
                let engines = table
                    .models()
                    .flat_map(|m| &m.classes)
                    .flat_map(|c| &c.candidates)
                    .filter(|c| c.weight > 0.0)
                    .map(|c| table.engines[c.engine_idx].id.to_string())
                    .collect();
                installs.lock().unwrap().push(Install {
                    at: Instant::now(),
                    version: table.version.0,
                    engines,
                });
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Closed-loop streaming chat requests; each worker starts a new conversation every third
/// turn (a fixed set of conversations would stay on their engines by affinity, and new
/// engines would only see traffic when the old ones ran out of room).
pub async fn worker(w: usize, url: String, recs: Arc<Mutex<Vec<Rec>>>, mut stop: watch::Receiver<bool>) {
    let client = client();
    let mut n = 0u64;
    loop {
        if *stop.borrow() {
            return;
        }
        n += 1;
        let session = format!("w{w}-conv-{}", n / 3);
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"turn {n} of {session}"}}],"max_tokens":16,"stream":true}}"#
        );
        let request = http::Request::post(format!("{url}/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("x-session-id", &session)
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let started = Instant::now();
        let (status, engine, complete) = match client.request(request).await {
            Ok(response) => {
                let status = response.status().as_u16();
                let engine = response
                    .headers()
                    .get("x-ilb-route")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.split("; ").find_map(|p| p.strip_prefix("engine=")))
                    .unwrap_or("")
                    .to_owned();
                let body = response.into_body().collect().await.map(|b| b.to_bytes());
                let complete = body.is_ok_and(|b| {
                    let text = String::from_utf8_lossy(&b);
                    text.ends_with("data: [DONE]\n\n") && !text.contains("\"error\"")
                });
                (status, engine, complete)
            }
            Err(_) => (0, String::new(), false),
        };
        recs.lock().unwrap().push(Rec { started, finished: Instant::now(), engine, status, complete });
        if stop.has_changed().unwrap_or(true) && *stop.borrow_and_update() {
            return;
        }
    }
}

/// Engine ids of `engines`.
pub fn ids(engines: &[&EngineHandle]) -> Vec<String> {
    engines.iter().map(|e| e.id().to_string()).collect()
}

/// Two clusters in regions `a` and `b` 40 ms apart, one engine in each (`e0` in a, `e1` in b);
/// `control_plane` adds lines to the `[control_plane]` table.
pub fn two_region_fleet(control_plane: &str, e0: &str, e1: &str) -> ilb_controlplane::FleetConfig {
    parse(&format!(
        r#"
[control_plane]
scrape_interval_ms = 250
solve_interval_ms = {SOLVE_MS}
token = "{TOKEN}"
{control_plane}
[network]
use_measured = false
latency = [ {{ from = "a", to = "a", ms = 5.0 }}, {{ from = "a", to = "b", ms = 40.0 }}, {{ from = "b", to = "b", ms = 5.0 }} ]
[[clusters]]
id = "a"
region = "a"
[[clusters]]
id = "b"
region = "b"
[profiles.gpu]
capacity_rps = 100.0
ttft_t0_ms = 30.0
ttft_b_ms = 10.0
[[engines]]
id = "e0"
url = "{e0}"
model = "m"
region = "a"
profile = "gpu"
[[engines]]
id = "e1"
url = "{e1}"
model = "m"
region = "b"
profile = "gpu"
"#
    ))
}
