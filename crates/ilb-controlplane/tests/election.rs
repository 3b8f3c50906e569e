//! Two control-plane replicas electing their planner through a real etcd on loopback
//! (`election.rs`), four data planes pulling from them and reporting to both, streaming load.
//! Both replicas serve the same plan; the leader is killed (its lease is not revoked, as in a
//! crash): no request fails, the survivor is elected when the lease lapses and its plans reach
//! every data plane, and no data plane installs a plan of the old term after one of the new.
//! Run with `--nocapture` for the failover timings.
//!
//! etcd is found through `ILB_ETCD` or `etcd` on the PATH (Debian: `etcd-server`); without it
//! the test says so on stderr and passes, unless `ILB_REQUIRE_ETCD=1` (CI), where it fails.
#![allow(clippy::disallowed_methods)] // tests read the clock, env and files (etcd's data dir)

mod fleet_support;
mod support;
mod wait;

use fleet_support::*;
use http_body_util::BodyExt;
use ilb_controlplane::{ControlPlane, EtcdOptions, VERSION_BASE};
use ilb_dataplane::report::ReportConfig;
use ilb_dataplane::{DataPlane, DataPlaneConfig, SnapshotSource};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The term a version was published in (`election.rs`: 2^52 + term·2^24 + n).
fn term_of(version: u64) -> u64 {
    version.saturating_sub(VERSION_BASE) >> 24
}

fn etcd_binary() -> Option<PathBuf> {
    let found = std::env::var_os("ILB_ETCD").map(PathBuf::from).or_else(|| {
        std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join("etcd")).find(|p| p.is_file())
    });
    match found {
        Some(path) => Some(path),
        None if std::env::var("ILB_REQUIRE_ETCD").as_deref() == Ok("1") => {
            panic!("ILB_REQUIRE_ETCD=1 but no etcd: set ILB_ETCD or put etcd on the PATH")
        }
        None => {
            eprintln!("skipping: no etcd (set ILB_ETCD or put etcd on the PATH; Debian: apt-get install etcd-server)");
            None
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A single-member etcd on loopback with its own data dir; killed and removed on drop.
struct Etcd {
    child: std::process::Child,
    dir: PathBuf,
    url: String,
}

impl Etcd {
    async fn start(binary: &PathBuf) -> Etcd {
        let (client_port, peer) = (free_port(), free_port());
        let dir =
            std::env::temp_dir().join(format!("ilb-election-test-{}-{client_port}", std::process::id()));
        let url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = std::process::Command::new(binary)
            .args(["--name", "ilb-test", "--data-dir"])
            .arg(&dir)
            .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("ilb-test={peer_url}"), "--log-level", "error"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("etcd starts");
        let etcd = Etcd { child, dir, url };
        let mut polls = Polls::new(Duration::from_millis(50));
        loop {
            let request =
                http::Request::get(format!("{}/health", etcd.url)).body(Default::default()).unwrap();
            if let Ok(response) = client().request(request).await {
                let body = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                if String::from_utf8_lossy(&body).contains("true") {
                    return etcd;
                }
            }
            polls.wait("etcd to become healthy").await;
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn snapshot_body(url: &str) -> bytes::Bytes {
    let request = http::Request::get(url).body(Default::default()).unwrap();
    match client().request(request).await {
        Ok(response) if response.status() == 200 => {
            response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default()
        }
        _ => bytes::Bytes::new(),
    }
}

/// Every version one data plane installed, with when it saw it.
type InstallLog = Arc<Mutex<Vec<(Instant, u64)>>>;

async fn watch_installs(dp: Arc<DataPlane>, log: InstallLog, mut stop: watch::Receiver<bool>) {
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_elected_replica_plans_for_all_and_a_killed_leader_is_replaced_without_going_back() {
    let Some(binary) = etcd_binary() else { return };
    let etcd = Etcd::start(&binary).await;
    let engines = engines(2).await;
    let config = two_region_fleet("", &engines[0].url(), &engines[1].url());
    let options = |name: &str| EtcdOptions {
        endpoints: vec![etcd.url.clone()],
        prefix: "/ilb-test".into(),
        lease_ttl: Duration::from_secs(2),
        name: name.into(),
    };
    let listen = "127.0.0.1:0".parse().unwrap();
    let start = |name: &'static str| {
        ControlPlane::start_elected(config.clone(), listen, Default::default(), Some(options(name)))
    };
    let mut replicas = vec![Some(start("cp-0").await.unwrap()), Some(start("cp-1").await.unwrap())];
    let urls: Vec<String> = replicas.iter().flatten().map(|cp| cp.url()).collect();

    let mut dps = Vec::new();
    for (i, cluster) in ["a", "a", "b", "b"].iter().enumerate() {
        let mut c = DataPlaneConfig::new(listen);
        c.cluster = Some(ilb_core::ClusterId::new(*cluster));
        // Half the data planes pull from each replica first.
        let mut order = urls.clone();
        order.rotate_left(i % 2);
        let source = SnapshotSource::Replicas {
            urls: order.iter().map(|u| format!("{u}/v1/snapshots/{cluster}")).collect(),
            interval: Duration::from_millis(100),
            long_poll: true,
        };
        let mut reports = ReportConfig::new(format!("{}/v1/reports", urls[0]), format!("dp-{i}"));
        reports.also = vec![format!("{}/v1/reports", urls[1])];
        reports.interval = Duration::from_millis(250);
        reports.token = Some(TOKEN.into());
        dps.push(Arc::new(DataPlane::start_with_reports(c, source, Some(reports)).await.unwrap()));
    }

    // One leader; every data plane on its plans; both replicas serve the same bytes.
    let mut polls = Polls::new(Duration::from_millis(20));
    let leader = loop {
        let leaders: Vec<usize> =
            (0..2).filter(|&i| replicas[i].as_ref().and_then(ControlPlane::leader_term).is_some()).collect();
        let elected = dps.iter().all(|dp| dp.snapshot_version().is_some_and(|v| v.0 > VERSION_BASE));
        if leaders.len() == 1 && elected {
            let a = snapshot_body(&format!("{}/v1/snapshots/a", urls[0])).await;
            let b = snapshot_body(&format!("{}/v1/snapshots/a", urls[1])).await;
            if !a.is_empty() && a == b {
                break leaders[0];
            }
        }
        assert!(leaders.len() <= 1, "two leaders at once");
        polls.wait("a single leader whose plans both replicas serve").await;
    };
    let old_term = replicas[leader].as_ref().and_then(ControlPlane::leader_term).unwrap();

    let (stop, stop_rx) = watch::channel(false);
    let installs: Vec<InstallLog> = dps.iter().map(|_| Arc::default()).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for (dp, log) in dps.iter().zip(&installs) {
        tasks.spawn(watch_installs(Arc::clone(dp), Arc::clone(log), stop_rx.clone()));
    }
    let recs = Arc::new(Mutex::new(Vec::new()));
    for (i, dp) in dps.iter().enumerate() {
        tasks.spawn(worker(i, dp.url(), Arc::clone(&recs), stop_rx.clone()));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Kill the leader: its tasks stop, its lease is left to lapse.
    let killed_at = Instant::now();
    replicas[leader].take().unwrap().shutdown().await;
    let survivor = replicas[1 - leader].as_ref().unwrap();
    let mut polls = Polls::new(Duration::from_millis(5));
    let (elected_at, new_term) = loop {
        if let Some(term) = survivor.leader_term() {
            break (Instant::now(), term);
        }
        polls.wait("the survivor to be elected").await;
    };
    assert!(new_term > old_term, "terms grow: {old_term} then {new_term}");
    let installed_everywhere = loop {
        if dps.iter().all(|dp| dp.snapshot_version().is_some_and(|v| term_of(v.0) == new_term)) {
            break Instant::now();
        }
        polls.wait("the new leader's plans on every data plane").await;
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _ = stop.send(true);
    while tasks.join_next().await.is_some() {}

    let recs = recs.lock().unwrap().clone();
    assert_no_failures(&recs);
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
        let first_new =
            log.iter().position(|(_, v)| term_of(*v) == new_term).expect("installed the new term");
        assert!(
            log[first_new..].iter().all(|(_, v)| term_of(*v) == new_term),
            "data plane {i} installed an old-term plan after the new leader's: {log:?}"
        );
    }
    println!("| event | ms after the leader was killed |");
    println!("|---|---:|");
    println!(
        "| survivor elected (the lease of {} s lapsed) | {:.0} |",
        2,
        (elected_at - killed_at).as_secs_f64() * 1000.0
    );
    println!(
        "| new leader's plan installed on all 4 data planes | {:.0} ({:.0} after its election) |",
        (installed_everywhere - killed_at).as_secs_f64() * 1000.0,
        (installed_everywhere - elected_at).as_secs_f64() * 1000.0
    );
    println!("| requests failed | {} of {} |", recs.iter().filter(|r| !r.ok()).count(), recs.len());
    for dp in dps {
        Arc::try_unwrap(dp).ok().unwrap().shutdown().await;
    }
    for cp in replicas.into_iter().flatten() {
        cp.shutdown().await;
    }
    drop(etcd);
}
