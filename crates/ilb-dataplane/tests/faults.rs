//! Fault injection on loopback: engines killed or hung under load, slow and malicious clients,
//! and attempts to use the data plane as an open proxy or to feed it a bad snapshot. Each test
//! prints its figures (`cargo test -p ilb-dataplane --test faults -- --nocapture`).
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines

mod support;

use http_body_util::BodyExt;
use ilb_engine_sim::Faults;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// What one client request came to.
#[derive(Debug)]
enum Outcome {
    /// 200 and a complete body (`[DONE]` for streams, a completion object otherwise);
    /// `retried` when the first engine tried failed.
    Ok { retried: bool },
    /// 200, part of the stream, then a well-formed SSE error event and a clean end.
    MidStreamError { engine: String },
    /// Anything else, including a hang past the client's deadline: the request was lost.
    Lost(String),
}

/// Sends one request and classifies the result; never takes longer than `deadline`.
async fn one_request(client: &TestClient, url: &str, key: &str, stream: bool, deadline: Duration) -> Outcome {
    let req = post(url, "/v1/chat/completions", &sim_body(key, stream, 40), &[("x-session-id", key)]);
    let attempt = async {
        let response = client.request(req).await.map_err(|e| format!("client error: {e}"))?;
        let (parts, body) = response.into_parts();
        let engine = routed_engine(&parts.headers).unwrap_or_default();
        let route = parts.headers.get("x-ilb-route").and_then(|v| v.to_str().ok()).unwrap_or_default();
        let retried = !route.contains("attempts=1");
        let bytes =
            body.collect().await.map_err(|e| format!("body did not end cleanly ({engine}): {e}"))?.to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if parts.status != 200 {
            return Err(format!("status {}: {text}", parts.status));
        }
        if !stream {
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
            return if v["choices"][0]["message"]["content"].is_string() {
                Ok(Outcome::Ok { retried })
            } else {
                Err(format!("not a completion: {text}"))
            };
        }
        match stream_end(&text) {
            StreamEnd::Done => Ok(Outcome::Ok { retried }),
            StreamEnd::ErrorEvent(_) => Ok(Outcome::MidStreamError { engine }),
            StreamEnd::Malformed(why) => Err(format!("malformed stream from {engine}: {why}")),
        }
    };
    match tokio::time::timeout(deadline, attempt).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(why)) => Outcome::Lost(why),
        Err(_) => Outcome::Lost(format!("no answer within {deadline:?}")),
    }
}

/// Closed-loop clients, half streaming, until `stop`; returns every outcome.
fn start_load(url: String, workers: usize, stop: Arc<AtomicBool>) -> tokio::task::JoinSet<Vec<Outcome>> {
    let client = client();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let (client, url, stop) = (client.clone(), url.clone(), stop.clone());
        tasks.spawn(async move {
            let mut outcomes = Vec::new();
            let mut n = 0;
            while !stop.load(Relaxed) {
                n += 1;
                let key = format!("w{w}-r{n}");
                outcomes.push(one_request(&client, &url, &key, w % 2 == 0, Duration::from_secs(10)).await);
            }
            outcomes
        });
    }
    tasks
}

/// What a load run came to.
struct Tally {
    ok: usize,
    /// Succeeded on another engine after the first one failed.
    retried: usize,
    /// The engine of each stream cut by a failure.
    mid_stream: Vec<String>,
    lost: Vec<String>,
}

/// Joins the load tasks within `deadline` (nothing may hang) and tallies the outcomes.
async fn finish_load(mut tasks: tokio::task::JoinSet<Vec<Outcome>>, deadline: Duration) -> Tally {
    let mut all = Vec::new();
    let joined = tokio::time::timeout(deadline, async {
        while let Some(result) = tasks.join_next().await {
            all.extend(result.unwrap());
        }
    })
    .await;
    assert!(joined.is_ok(), "clients still running {deadline:?} after the load stopped");
    let mut tally = Tally { ok: 0, retried: 0, mid_stream: Vec::new(), lost: Vec::new() };
    for outcome in all {
        match outcome {
            Outcome::Ok { retried } => {
                tally.ok += 1;
                tally.retried += usize::from(retried);
            }
            Outcome::MidStreamError { engine } => tally.mid_stream.push(engine),
            Outcome::Lost(why) => tally.lost.push(why),
        }
    }
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_killed_under_load_fails_over_and_is_ejected() {
    let engines = sim_engines(4, quick_profile()).await;
    let list: Vec<(&str, String, f64)> =
        ["e0", "e1", "e2", "e3"].iter().zip(&engines).map(|(id, e)| (*id, e.url(), 1.0)).collect();
    let mut snap = snapshot(1, &list);
    // Half the traffic on the victim, so that (with the load bound) both marker requests below
    // stay on it.
    snap.models[0].classes[0].weights[1].weight = 3.0;
    let dp = data_plane(config(), &snap).await;
    let victim = engine_index(&dp, "e1");
    let installed = dp.installed().unwrap();
    let client = client();
    // Two requests surely on the victim when it dies: one not yet answered (a long
    // non-streaming completion), which must be retried elsewhere and succeed, and one long
    // stream already under way, which must end with an SSE error event.
    // Both conversations start on the victim while it is idle: their later requests stay
    // there (session affinity) although new keys would go to less loaded engines.
    let waiting_key = key_routed_to(&dp, "e1", "waiting").await;
    let streaming_key = key_routed_to(&dp, "e1", "streaming").await;
    for key in [&waiting_key, &streaming_key] {
        let req = post(&dp.url(), "/v1/chat/completions", &sim_body(key, false, 1), &[("x-session-id", key)]);
        let (status, headers, _) = send(&client, req).await;
        assert_eq!((status.as_u16(), routed_engine(&headers).as_deref()), (200, Some("e1")));
    }
    let waiting = {
        let key = waiting_key;
        let req =
            post(&dp.url(), "/v1/chat/completions", &sim_body(&key, false, 300), &[("x-session-id", &key)]);
        let client = client.clone();
        tokio::spawn(async move { tokio::time::timeout(Duration::from_secs(10), send(&client, req)).await })
    };
    assert!(
        eventually(Duration::from_secs(5), || installed.engines[victim].in_flight.load(Relaxed) == 1).await
    );
    let streaming = {
        let key = streaming_key;
        let req =
            post(&dp.url(), "/v1/chat/completions", &sim_body(&key, true, 2000), &[("x-session-id", &key)]);
        let response = client.request(req).await.unwrap();
        assert_eq!(routed_engine(response.headers()).as_deref(), Some("e1"));
        let mut body = response.into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        tokio::spawn(async move {
            let rest = tokio::time::timeout(Duration::from_secs(10), body.collect()).await;
            let rest = rest.expect("the cut stream hung").expect("the cut stream did not end cleanly");
            String::from_utf8_lossy(&[first, rest.to_bytes()].concat()).into_owned()
        })
    };
    let stop = Arc::new(AtomicBool::new(false));
    let load = start_load(dp.url(), 24, stop.clone());

    // Kill it while it is serving several requests (half the clients stream).
    assert!(
        eventually(Duration::from_secs(10), || installed.engines[victim].in_flight.load(Relaxed) >= 4).await
    );
    let in_flight_at_kill = installed.engines[victim].in_flight.load(Relaxed);
    engines[1].set_faults(Faults { down: true, ..Faults::default() }).unwrap();
    let killed = Instant::now();
    assert!(eventually(Duration::from_secs(5), || installed.engines[victim].is_ejected()).await);
    let ejected_after = killed.elapsed();
    assert_eq!(debug_skip(&dp, "e1").await, "ejected by local guard");
    // Keep the load on the three survivors for a while with the victim out.
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Relaxed);
    let Tally { ok, retried, mid_stream, lost } = finish_load(load, Duration::from_secs(12)).await;
    let cut = streaming.await.unwrap();
    let StreamEnd::ErrorEvent(error) = stream_end(&cut) else {
        panic!("the stream cut by the kill did not end with an error event: {cut}")
    };
    assert_eq!(error["error"]["code"], "engine_failed", "{error}");
    let (status, headers, text) =
        waiting.await.unwrap().expect("the request waiting on the killed engine hung");
    assert_eq!(status, 200, "the request waiting on the killed engine was lost: {text}");
    let route = headers["x-ilb-route"].to_str().unwrap();
    assert!(!route.contains("engine=e1") && route.contains("attempts=2"), "{route}");

    eprintln!(
        "engine killed under load: {in_flight_at_kill} requests in flight on it; ejected after {} ms; \
         1 + {ok} ok ({retried} of them after a retry), 1 + {} ended mid-stream with an SSE error event (engines {:?}), {} lost {:?}",
        ejected_after.as_millis(),
        mid_stream.len(),
        mid_stream,
        lost.len(),
        lost.iter().take(3).collect::<Vec<_>>()
    );
    // How fast ejection is depends on the machine; that it happens (within the 5 s the wait
    // above allows) is the guard's job, and the figure is printed above.
    assert!(lost.is_empty(), "requests lost: {lost:?}");
    assert!(
        mid_stream.iter().all(|e| e == "e1"),
        "only streams on the killed engine may break: {mid_stream:?}"
    );
    assert!(ok >= 50, "only {ok} requests succeeded");
    let after_kill = installed.engines[victim].counters.attempts.load(Relaxed);
    assert!(installed.engines[victim].is_ejected(), "a dead engine was readmitted ({after_kill} attempts)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_engine_times_out_fails_over_and_is_ejected() {
    let engines = sim_engines(3, quick_profile()).await;
    engines[2].set_faults(Faults { hang: true, ..Faults::default() }).unwrap();
    let mut cfg = config();
    cfg.timeouts.first_byte = Duration::from_millis(300);
    let dp = data_plane(cfg, &sim_snapshot(1, &engines)).await;
    let hung = engine_index(&dp, "e2");
    let installed = dp.installed().unwrap();
    let ejected_at = Arc::new(Mutex::new(None::<Duration>));
    let watch = {
        let (installed, ejected_at) = (installed.clone(), ejected_at.clone());
        let started = Instant::now();
        tokio::spawn(async move {
            eventually(Duration::from_secs(10), || installed.engines[hung].is_ejected()).await;
            *ejected_at.lock().unwrap() = Some(started.elapsed());
        })
    };
    let client = client();
    let (retried, slowest) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..6 {
        let (client, url, retried, slowest) = (client.clone(), dp.url(), retried.clone(), slowest.clone());
        tasks.spawn(async move {
            for n in 0..8 {
                let key = format!("h{w}-{n}");
                let started = Instant::now();
                let req =
                    post(&url, "/v1/chat/completions", &sim_body(&key, false, 4), &[("x-session-id", &key)]);
                let (status, headers, text) =
                    tokio::time::timeout(Duration::from_secs(5), send(&client, req))
                        .await
                        .expect("request hung");
                assert_eq!(status, 200, "{text}");
                let route = headers["x-ilb-route"].to_str().unwrap().to_owned();
                assert_ne!(routed_engine(&headers).as_deref(), Some("e2"), "{route}");
                if !route.contains("attempts=1") {
                    retried.fetch_add(1, Relaxed);
                }
                slowest.fetch_max(started.elapsed().as_millis() as u64, Relaxed);
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    watch.await.unwrap();
    let ejected_at = ejected_at.lock().unwrap().expect("the hung engine was never ejected");
    let attempts = installed.engines[hung].counters.attempts.load(Relaxed);
    eprintln!(
        "hung engine: 48 requests, 0 lost, {} retried after the 300 ms first-byte timeout (slowest {} ms); \
         ejected after {} ms; {attempts} attempts reached it in all",
        retried.load(Relaxed),
        slowest.load(Relaxed),
        ejected_at.as_millis()
    );
    assert!(retried.load(Relaxed) >= 3, "the hung engine was never tried");
    // A retried request waited out the first-byte timeout first (a lower bound holds on any
    // machine); that none hung is the 5 s timeout's `expect` above.
    assert!(
        slowest.load(Relaxed) >= 290,
        "a retry came before the first-byte timeout: {} ms",
        slowest.load(Relaxed)
    );
    assert!(ejected_at > Duration::ZERO);
}

fn malicious_config() -> ilb_dataplane::DataPlaneConfig {
    let mut cfg = config();
    cfg.timeouts.header_read = Duration::from_millis(300);
    cfg.timeouts.client_body = Duration::from_millis(300);
    cfg.max_connections = 16;
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_headers_are_cut_off_and_normal_clients_still_served() {
    let e1 = MockEngine::start("e1").await;
    let dp = data_plane(malicious_config(), &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-pad: ";
    let mut slow = Vec::new();
    for _ in 0..4 {
        let stream = TcpStream::connect(dp.local_addr()).await.unwrap();
        let (mut reader, mut writer) = stream.into_split();
        let started = Instant::now();
        // One byte every 20 ms, then padding forever: the head never completes.
        let writer_task = tokio::spawn(async move {
            for &b in head.iter().chain(std::iter::repeat(&b'a')) {
                if writer.write_all(&[b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        slow.push(tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 1024];
            let closed = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    match reader.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            })
            .await
            .is_ok();
            writer_task.abort();
            (closed, started.elapsed())
        }));
    }
    // While they trickle, a normal client is served at once.
    let (status, took) = fresh_request(&dp.url(), "normal").await;
    assert_eq!(status, 200);
    let mut closed_after = Vec::new();
    for s in slow {
        let (closed, after) = s.await.unwrap();
        assert!(closed, "a slowloris connection was still open after 5 s");
        closed_after.push(after.as_millis());
    }
    eprintln!(
        "slowloris: normal request served in {} ms; trickling connections closed after {closed_after:?} ms \
         (header_read 300 ms)",
        took.as_millis()
    );
    // Closed by the header timeout (300 ms), not by anything sooner; the 5 s wait above
    // guards against a connection kept open.
    assert!(closed_after.iter().all(|&ms| ms >= 250), "{closed_after:?}");
    assert!(took > Duration::ZERO);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_body_gets_408_and_idle_flood_does_not_starve_clients() {
    let e1 = MockEngine::start("e1").await;
    let dp = data_plane(malicious_config(), &snapshot(1, &[("e1", e1.url(), 1.0)])).await;

    // A body that never finishes: 10 of 1,000 declared bytes.
    let mut stream = TcpStream::connect(dp.local_addr()).await.unwrap();
    let started = Instant::now();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                content-length: 1000\r\n\r\n{\"model\":";
    stream.write_all(head.as_bytes()).await.unwrap();
    let (bytes, _) = read_until_close(&mut stream, Duration::from_secs(5)).await;
    let took = started.elapsed();
    let (status, body) = parse_raw_response(&bytes).expect("no response to an unfinished body");
    assert_eq!(status, 408, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "body_timeout");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(took >= Duration::from_millis(250), "408 before the body timeout: {took:?}");

    // A flood of idle connections, 2.5 times max_connections, that never send a byte.
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(TcpStream::connect(dp.local_addr()).await.unwrap());
    }
    let (status, flooded) = fresh_request(&dp.url(), "during-flood").await;
    assert_eq!(status, 200);
    let mut closed = 0;
    for mut s in idle {
        if read_until_close(&mut s, Duration::from_secs(3)).await.1 {
            closed += 1;
        }
    }
    let (status, after) = fresh_request(&dp.url(), "after-flood").await;
    assert_eq!(status, 200);

    // Kept-alive connections that sent one request and then idle hold slots too: the header
    // timeout also bounds the wait for a connection's next request.
    let body = chat_body("keep-alive");
    let mut kept = Vec::new();
    for _ in 0..16 {
        let mut s = TcpStream::connect(dp.local_addr()).await.unwrap();
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(request.as_bytes()).await.unwrap();
        kept.push(s);
    }
    let (status, kept_alive) = fresh_request(&dp.url(), "after-keep-alive").await;
    assert_eq!(status, 200);
    for mut s in kept {
        let (bytes, closed) = read_until_close(&mut s, Duration::from_secs(3)).await;
        assert!(String::from_utf8_lossy(&bytes).starts_with("HTTP/1.1 200"));
        assert!(closed, "an idle kept-alive connection was kept open");
    }
    eprintln!(
        "unfinished body: 408 after {} ms (client_body 300 ms); idle flood of 40 connections \
         (max_connections 16): normal request served in {} ms, {closed} of 40 idle connections closed \
         by the data plane, next request {} ms; with 16 idle kept-alive connections {} ms",
        took.as_millis(),
        flooded.as_millis(),
        after.as_millis(),
        kept_alive.as_millis()
    );
    // The 16 idle connections holding slots must be closed (header_read) for the client to be
    // accepted; the accept queue holds the other 24 ahead of it, so a few rounds of 300 ms.
    // A starved client would wait forever: `fresh_request`'s own timeout fails the test then.
    // How long it waited depends on the machine and is printed above.
    assert_eq!(closed, 40, "idle connections were kept open");
    assert!(flooded > Duration::ZERO && after > Duration::ZERO && kept_alive > Duration::ZERO);
}

#[tokio::test]
async fn never_an_open_proxy() {
    let e1 = MockEngine::start("e1").await;
    let evil = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let evil_addr = evil.local_addr().unwrap();
    let dp = data_plane(config(), &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let body = chat_body("p");
    let hop = "connection: keep-alive, te\r\nkeep-alive: timeout=5\r\nte: trailers\r\nupgrade: h2c\r\n\
               proxy-authorization: Basic c2VjcmV0\r\n";
    let requests = [
        format!("POST /v1/chat/completions HTTP/1.1\r\nhost: {evil_addr}\r\n{hop}"),
        format!("POST http://{evil_addr}/v1/chat/completions HTTP/1.1\r\nhost: {evil_addr}\r\n"),
        format!("POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-forwarded-host: {evil_addr}\r\n"),
    ];
    for head in requests {
        let mut stream = TcpStream::connect(dp.local_addr()).await.unwrap();
        let request =
            format!("{head}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len());
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut bytes = Vec::new();
        let end = Instant::now() + Duration::from_secs(5);
        while !String::from_utf8_lossy(&bytes).contains(&body) && Instant::now() < end {
            let (more, closed) = read_until_close(&mut stream, Duration::from_millis(50)).await;
            bytes.extend(more);
            if closed {
                break;
            }
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        assert!(text.starts_with("HTTP/1.1 200"), "{head}: {text}");
        assert!(
            text.to_ascii_lowercase().contains("x-engine: e1"),
            "not answered by the snapshot's engine: {text}"
        );
        let seen = text.lines().find(|l| l.to_ascii_lowercase().starts_with("x-seen-headers")).unwrap();
        for name in
            ["connection", "keep-alive", "\"te\"", "upgrade", "proxy-authorization", "transfer-encoding"]
        {
            assert!(!seen.contains(name), "hop-by-hop {name} reached the engine: {seen}");
        }
    }
    // A chunked request body: the engine gets a plain body, never the client's transfer-encoding.
    let mut stream = TcpStream::connect(dp.local_addr()).await.unwrap();
    let chunked = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n\
         {:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    stream.write_all(chunked.as_bytes()).await.unwrap();
    let (bytes, _) = read_until_close(&mut stream, Duration::from_secs(5)).await;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    assert!(text.starts_with("HTTP/1.1 200") && text.contains(&body), "{text}");
    let seen = text.lines().find(|l| l.to_ascii_lowercase().starts_with("x-seen-headers")).unwrap();
    assert!(!seen.contains("transfer-encoding"), "{seen}");
    // Nothing ever connected to the address the requests named.
    assert!(tokio::time::timeout(Duration::from_millis(200), evil.accept()).await.is_err());
}

#[tokio::test]
async fn bad_snapshots_are_rejected_and_routing_continues() {
    let e1 = MockEngine::start("e1").await;
    let dp = data_plane(config(), &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let host = e1.addr;
    let cases = [
        (format!("http://user:pw@{host}"), "credentials"),
        (format!("https://user:pw@{host}"), "credentials"),
        (format!("ftp://{host}"), "http:// or https://"),
        (format!("gopher://{host}"), "http:// or https://"),
        (format!("http://{host}/v1?target=evil"), "query"),
        (format!("http://{host}/#frag"), "query or fragment"),
    ];
    for (url, why) in cases {
        let error = dp.install(&snapshot(2, &[("e1", url.clone(), 1.0)])).unwrap_err().to_string();
        assert!(error.contains(why), "{url}: {error}");
    }
    // 200,000 engines: over the limit, rejected by count before anything is compiled.
    let many: Vec<(String, String)> =
        (0..200_000).map(|i| (format!("e{i}"), format!("http://127.0.0.1:{}", 1 + i % 60_000))).collect();
    let list: Vec<(&str, String, f64)> =
        many.iter().map(|(id, url)| (id.as_str(), url.clone(), 1.0)).collect();
    let big = snapshot(3, &list);
    let error = dp.install(&big).unwrap_err().to_string();
    assert!(error.contains("200000") && error.contains("100000"), "{error}");
    // The same through the wire format, and a body over the byte limit.
    let json = serde_json::to_vec(&big).unwrap();
    let error = ilb_core::snapshot::Snapshot::from_json(&json).unwrap_err().to_string();
    assert!(error.contains("100000"), "{error}");
    let huge = vec![b' '; ilb_core::snapshot::MAX_SNAPSHOT_BYTES + 1];
    let error = ilb_core::snapshot::Snapshot::from_json(&huge).unwrap_err().to_string();
    assert!(error.contains(&ilb_core::snapshot::MAX_SNAPSHOT_BYTES.to_string()), "{error}");

    assert_eq!(dp.snapshot_version().unwrap().0, 1, "a rejected snapshot replaced the good one");
    let (status, headers, _) =
        send(&client(), post(&dp.url(), "/v1/chat/completions", &chat_body("a"), &[])).await;
    assert_eq!(status, 200);
    assert_eq!(engine_of(&headers), "e1");
}

/// Regression (found by the fault tests): headers named in the client's `Connection` header are
/// hop-by-hop (RFC 9110 §7.6.1) and must not reach the engine.
#[tokio::test]
async fn headers_named_in_connection_are_not_forwarded() {
    let e1 = MockEngine::start("e1").await;
    let dp = data_plane(config(), &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let headers = [("connection", "x-hop-secret"), ("x-hop-secret", "1"), ("x-custom", "2")];
    let req = post(&dp.url(), "/v1/chat/completions", &chat_body("a"), &headers);
    let (status, headers, _) = send(&client(), req).await;
    assert_eq!(status, 200);
    let seen = headers["x-seen-headers"].to_str().unwrap();
    assert!(seen.contains("x-custom"), "{seen}");
    assert!(!seen.contains("x-hop-secret"), "a header named in Connection reached the engine: {seen}");
}

/// Regression (found by the fault tests): every class compiles into a slot table, so without a
/// total bound a small snapshot could make the data plane allocate without limit.
#[tokio::test]
async fn a_small_snapshot_cannot_demand_huge_slot_tables() {
    let e1 = MockEngine::start("e1").await;
    let dp = data_plane(config(), &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let mut many = snapshot(2, &[("e1", e1.url(), 1.0)]);
    let class = many.models[0].classes[0].clone();
    many.models[0].classes = (0..4000)
        .map(|i| ilb_core::snapshot::ClassRoutes {
            id: ilb_core::ClassId::new(format!("c{i}")),
            require: if i == 0 { vec![] } else { vec![format!("t{i}")] },
            ..class.clone()
        })
        .collect();
    let json_bytes = serde_json::to_vec(&many).unwrap().len();
    match dp.install(&many) {
        Err(e) => assert!(e.to_string().contains("limit"), "{e}"),
        Ok(()) => {
            let installed = dp.installed().unwrap();
            let slot_bytes: usize = installed
                .table
                .models()
                .flat_map(|m| &m.classes)
                .map(|c| c.slots.n_slots() * std::mem::size_of::<u32>())
                .sum();
            assert!(
                slot_bytes <= 4 * ilb_core::snapshot::MAX_TOTAL_SLOTS,
                "a {json_bytes}-byte snapshot compiled into {} MiB of slot tables",
                slot_bytes >> 20
            );
        }
    }
    assert_eq!(dp.snapshot_version().unwrap().0, 1, "the last good snapshot stays");
}

/// A request body that arrives in pieces (chunked, written apart) reaches the engine whole, and
/// one that grows past `max_body_bytes` gets 413 although it declared no length.
#[tokio::test]
async fn request_bodies_in_pieces_are_joined_and_limited() {
    let e1 = MockEngine::start("e1").await;
    let mut cfg = config();
    cfg.max_body_bytes = 1024;
    let dp = data_plane(cfg, &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\
                connection: close\r\n\r\n";
    let addr = dp.local_addr();
    let send_in_pieces = |pieces: Vec<String>| async move {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        for piece in pieces {
            stream.write_all(format!("{:x}\r\n{piece}\r\n", piece.len()).as_bytes()).await.unwrap();
            stream.flush().await.unwrap();
            // Apart, so that the data plane most likely reads them as separate frames.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stream.write_all(b"0\r\n\r\n").await.unwrap();
        let (bytes, _) = read_until_close(&mut stream, Duration::from_secs(5)).await;
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let body = chat_body(&"p".repeat(300));
    let (a, rest) = body.split_at(10);
    let (b, c) = rest.split_at(200);
    let text = send_in_pieces(vec![a.to_owned(), b.to_owned(), c.to_owned()]).await;
    assert!(text.starts_with("HTTP/1.1 200") && text.contains(&body), "{text}");
    let text = send_in_pieces(vec!["x".repeat(600), "x".repeat(600)]).await;
    assert!(text.starts_with("HTTP/1.1 413") && text.contains("body_too_large"), "{text}");
}

/// Writes `request` on a fresh connection and reads until the data plane closes it (or 5 s).
async fn raw_exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let (bytes, _) = read_until_close(&mut stream, Duration::from_secs(5)).await;
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The status and the OpenAI error object of a raw answer; panics when the body is not one.
fn openai_error(text: &str) -> (u16, serde_json::Value) {
    let (status, body) = parse_raw_response(text.as_bytes()).unwrap_or_else(|| panic!("not HTTP: {text:?}"));
    assert!(text.to_ascii_lowercase().contains("content-type: application/json"), "{text}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    for field in ["message", "type", "code"] {
        assert!(v["error"][field].is_string(), "no error.{field}: {text}");
    }
    (status, v)
}

/// Regression (hardening finding 6): paths were forwarded without normalising dot segments, so
/// `POST /v1/%2e%2e/admin/x` reached the engine as such and an engine or ingress that
/// normalises paths would have exposed its non-`/v1` endpoints.
#[tokio::test]
async fn dot_segments_and_encoded_slashes_never_reach_an_engine() {
    let e1 = MockEngine::start("e1").await;
    let dp = data_plane(config(), &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let body = chat_body("p");
    for path in [
        "/v1/%2e%2e/admin/x",
        "/v1/%2E%2E/sleep",
        "/v1/../reset_prefix_cache",
        "/v1/./x/../../sleep",
        "/v1/a%2f..%2fsleep",
        "/v1/x%5C..%5Csleep",
        "/v1/%252e%252e/sleep",
    ] {
        let request = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let text = raw_exchange(dp.local_addr(), request.as_bytes()).await;
        let (status, error) = openai_error(&text);
        assert_eq!(status, 400, "{path}: {text}");
        assert_eq!(error["error"]["code"], "invalid_path", "{path}: {text}");
    }
    assert_eq!(e1.requests.load(std::sync::atomic::Ordering::SeqCst), 0, "a refused path reached the engine");
}

/// Regression (hardening finding 8): a gzip body was parsed as plain JSON (400 "not valid
/// JSON") with its `Content-Encoding` still forwarded, and `Expect: 100-continue` was forwarded
/// after the body had been read.
#[tokio::test]
async fn compressed_bodies_are_decoded_within_the_limit_and_expect_is_not_forwarded() {
    use std::io::Write;
    let e1 = MockEngine::start("e1").await;
    let mut cfg = config();
    cfg.max_body_bytes = 64 << 10;
    let dp = data_plane(cfg, &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let client = client();
    let gzip = |bytes: &[u8]| {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    };
    let body = chat_body("zipped");
    let request = |bytes: Vec<u8>, encoding: &str| {
        http::Request::post(format!("{}/v1/chat/completions", dp.url()))
            .header("content-type", "application/json")
            .header("content-encoding", encoding)
            .header("expect", "100-continue")
            .body(http_body_util::Full::new(bytes::Bytes::from(bytes)))
            .unwrap()
    };
    let (status, headers, text) = send(&client, request(gzip(body.as_bytes()), "gzip")).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(text, body, "the engine gets the decoded body");
    let seen = headers["x-seen-headers"].to_str().unwrap();
    assert!(!seen.contains("content-encoding"), "{seen}");
    assert!(!seen.contains("expect"), "{seen}");
    // Small on the wire, over the limit once decoded: the limit applies to the decoded body.
    let bomb = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(1 << 20));
    let (status, _, text) = send(&client, request(gzip(bomb.as_bytes()), "gzip")).await;
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("body_too_large"), "{text}");
    let (status, _, text) = send(&client, request(b"not gzip".to_vec(), "gzip")).await;
    assert_eq!(status, 400, "{text}");
    for encoding in ["br", "zstd", "gzip, br"] {
        let (status, _, text) = send(&client, request(body.clone().into_bytes(), encoding)).await;
        assert_eq!(status, 415, "{encoding}: {text}");
        assert!(text.contains("unsupported_media_type"), "{text}");
    }
    let (status, _, text) = send(&client, request(body.clone().into_bytes(), "identity")).await;
    assert_eq!(status, 200, "{text}");
}

/// Regression (hardening finding 9): requests hyper refuses before the data plane sees them
/// got bodiless answers (400, 431), a slow head none at all, and a wrong method on a known path
/// a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_refused_before_routing_get_openai_errors() {
    let e1 = MockEngine::start("e1").await;
    let dp = data_plane(malicious_config(), &snapshot(1, &[("e1", e1.url(), 1.0)])).await;
    let addr = dp.local_addr();
    let many_headers: String = (0..101).map(|i| format!("x-h{i}: v\r\n")).collect();
    let cases: Vec<(String, u16)> = vec![
        ("POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-bad: a\0b\r\ncontent-length: 0\r\n\r\n".into(), 400),
        ("POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-fold: a\r\n b\r\ncontent-length: 0\r\n\r\n".into(), 400),
        ("POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: xchunked\r\n\r\n".into(), 400),
        ("POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello".into(), 400),
        ("POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\n\r\n".into(), 400),
        ("POST /v1/chat/completions HTTP/2.0\r\nhost: x\r\ncontent-length: 0\r\n\r\n".into(), 400),
        (format!("POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n{many_headers}content-length: 0\r\n\r\n"), 431),
    ];
    for (request, expected) in cases {
        let text = raw_exchange(addr, request.as_bytes()).await;
        let (status, _) = openai_error(&text);
        assert_eq!(status, expected, "{request:?}: {text}");
    }
    // A head that never completes: 408 when the header timeout strikes.
    let text = raw_exchange(addr, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: ").await;
    let (status, error) = openai_error(&text);
    assert_eq!(status, 408, "{text}");
    assert_eq!(error["error"]["code"], "header_timeout", "{text}");
    // A wrong method on a known path: 405 with the methods it takes.
    for (request, allow) in [
        ("GET /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n", "POST"),
        ("DELETE /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n", "GET"),
        ("PUT /v1/responses/resp_1/cancel HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n", "POST"),
    ] {
        let text = raw_exchange(addr, request.as_bytes()).await;
        let (status, error) = openai_error(&text);
        assert_eq!(status, 405, "{request:?}: {text}");
        assert_eq!(error["error"]["code"], "method_not_allowed", "{text}");
        assert!(text.to_ascii_lowercase().contains(&format!("allow: {}", allow.to_ascii_lowercase())), "{text}");
    }
    assert_eq!(e1.requests.load(std::sync::atomic::Ordering::SeqCst), 0);
    // The data plane still serves.
    let (status, _) = fresh_request(&dp.url(), "after").await;
    assert_eq!(status, 200);
}
