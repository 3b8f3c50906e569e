//! `ilb control-plane` as a process: `--check-config` validates without starting; a running
//! control plane applies its edited file (watched by modification time) and, with
//! `--watch-ms 0`, on SIGHUP only; an invalid edit is refused with the field-named reason in
//! `/v1/state` and the running engines stay.
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(30);

fn fleet(engines: &[&str], profile: &str) -> String {
    let mut text = String::from(
        "[control_plane]\nlisten = \"127.0.0.1:0\"\nsolve_interval_ms = 200\n[[clusters]]\nid = \"a\"\nregion = \"a\"\n\
         [profiles.gpu]\ncapacity_rps = 10.0\nttft_t0_ms = 30.0\nttft_b_ms = 10.0\n",
    );
    for (i, id) in engines.iter().enumerate() {
        text.push_str(&format!(
            "[[engines]]\nid = \"{id}\"\nurl = \"http://127.0.0.1:{}\"\nmodel = \"m\"\nregion = \"a\"\nprofile = \"{profile}\"\n",
            9 + i
        ));
    }
    text
}

fn dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ilb-reload-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

struct Running {
    child: Child,
    url: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(config: &Path, watch_ms: u64) -> Running {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ilb"))
        .args(["control-plane", "--config"])
        .arg(config)
        .args(["--watch-ms", &watch_ms.to_string(), "--log", "warn"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line.trim().strip_prefix("control-plane: ").unwrap_or_else(|| panic!("{line:?}")).to_owned();
    Running { child, url }
}

async fn state(url: &str) -> serde_json::Value {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let request = http::Request::get(format!("{url}/v1/state")).body(Full::new(Bytes::new())).unwrap();
    let body = client.request(request).await.unwrap().into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

fn members(state: &serde_json::Value) -> Vec<String> {
    state["membership"]["engines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn until(url: &str, what: &str, check: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        let s = state(url).await;
        if check(&s) {
            return s;
        }
        assert!(tokio::time::Instant::now() < end, "{what}: {s}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn check_config_validates_without_starting() {
    let d = dir("check");
    let (good, bad) = (d.join("good.toml"), d.join("bad.toml"));
    std::fs::write(&good, fleet(&["e0"], "gpu")).unwrap();
    std::fs::write(&bad, fleet(&["e0"], "h200")).unwrap();
    let run = |path: &Path| {
        Command::new(env!("CARGO_BIN_EXE_ilb"))
            .args(["control-plane", "--check-config"])
            .arg(path)
            .output()
            .unwrap()
    };
    let ok = run(&good);
    assert!(ok.status.success() && String::from_utf8_lossy(&ok.stdout).ends_with(": ok\n"), "{ok:?}");
    let refused = run(&bad);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("engines.e0.profile: unknown profile 'h200'"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_file_is_applied_and_a_broken_one_refused_with_its_reason() {
    let d = dir("watch");
    let path = d.join("fleet.toml");
    std::fs::write(&path, fleet(&["e0"], "gpu")).unwrap();
    let cp = start(&path, 100);
    until(&cp.url, "the file's engine", |s| members(s) == ["e0"]).await;

    std::fs::write(&path, fleet(&["e0", "e1"], "gpu")).unwrap();
    until(&cp.url, "the edit was not applied", |s| members(s) == ["e0", "e1"]).await;

    std::fs::write(&path, fleet(&["e0", "e1", "e2"], "h200")).unwrap();
    let s = until(&cp.url, "the broken edit was not reported", |s| {
        !s["membership"]["config"]["rejected"].is_null()
    })
    .await;
    let reason = s["membership"]["config"]["rejected"]["reason"].as_str().unwrap();
    assert!(reason.contains("engines.e0.profile: unknown profile 'h200'"), "{reason}");
    assert_eq!(members(&s), ["e0", "e1"], "a refused file changed the fleet");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_file() {
    let d = dir("hup");
    let path = d.join("fleet.toml");
    std::fs::write(&path, fleet(&["e0"], "gpu")).unwrap();
    let cp = start(&path, 0);
    until(&cp.url, "the file's engine", |s| members(s) == ["e0"]).await;
    std::fs::write(&path, fleet(&["e0", "e1"], "gpu")).unwrap();
    // Not watched: nothing changes until the signal.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(members(&state(&cp.url).await), ["e0"]);
    let status = Command::new("kill").args(["-HUP", &cp.child.id().to_string()]).status().unwrap();
    assert!(status.success());
    until(&cp.url, "SIGHUP did not reload", |s| members(s) == ["e0", "e1"]).await;
}
