//! Data planes of one cluster sharing what they decide (`peers`, `replicas.rs`), on loopback:
//! a conversation placed by one replica keeps its engine on another, replicas place by the
//! load all of them cause, bad deltas are refused and a hanging peer holds nothing up.
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines

mod support;

use ilb_core::snapshot::Snapshot;
use ilb_dataplane::{DataPlane, DataPlaneConfig, SnapshotSource};
use std::net::SocketAddr;
use std::time::Duration;
use support::*;

const DEADLINE: Duration = Duration::from_secs(10);

/// A data plane with an admin listener whose peers are `peers`.
fn replica_config(peers: Vec<String>) -> DataPlaneConfig {
    DataPlaneConfig {
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        peers,
        peer_interval: Duration::from_millis(50),
        ..config()
    }
}

/// Two replicas that name each other: the first from `first(url)`, with `url` the second's
/// address, installing `snapshots.0`; then the second from `second(addr, &first)`, bound at
/// `addr`, installing `snapshots.1`. The address is a loopback port bound and released to name
/// it before the second starts, so another socket can take it in between: then both start
/// again on another one.
async fn pair(
    first: impl Fn(String) -> DataPlaneConfig,
    second: impl Fn(SocketAddr, &DataPlane) -> DataPlaneConfig,
    snapshots: (&Snapshot, &Snapshot),
) -> (DataPlane, DataPlane) {
    for _ in 0..20 {
        let addr = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let one = data_plane(first(format!("http://{addr}")), snapshots.0).await;
        match DataPlane::start(second(addr, &one), SnapshotSource::Manual).await {
            Ok(two) => {
                two.install(snapshots.1).unwrap();
                return (one, two);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(e) => panic!("starting the second replica: {e}"),
        }
    }
    panic!("no free loopback port for the second replica in 20 tries");
}

async fn metric(client: &TestClient, dp: &DataPlane, name: &str) -> f64 {
    let base = dp.admin_url().unwrap_or_else(|| dp.url());
    let (_, text) = get(client, &format!("{base}/metrics")).await;
    text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0.0)
}

/// Polls an async condition until it holds, at most `DEADLINE`'s worth of 20-ms polls (a hang
/// guard counted in polls, which a loaded machine only stretches).
async fn until<F: std::future::Future<Output = bool>>(mut check: impl FnMut() -> F) -> bool {
    const EVERY: Duration = Duration::from_millis(20);
    for _ in 0..DEADLINE.as_millis() / EVERY.as_millis() {
        if check().await {
            return true;
        }
        tokio::time::sleep(EVERY).await;
    }
    check().await
}

async fn engine_for(client: &TestClient, dp: &DataPlane, key: &str) -> String {
    let req = post(&dp.url(), "/v1/chat/completions", &chat_body(key), &[("x-session-id", key)]);
    let (status, headers, _) = send(client, req).await;
    assert_eq!(status, 200);
    engine_of(&headers)
}

/// Two replicas whose snapshots lean opposite ways (as replicas on different snapshot versions
/// would): placing by load on idle engines, the first puts new conversations on `a` and the
/// second, without sharing, would put their follow-ups on `b` (a remembered engine within
/// `AFFINITY_KEEP_RATIO` of its hash home stays).
#[tokio::test]
async fn a_conversation_placed_by_one_replica_keeps_its_engine_on_another() {
    let (a, b) = (MockEngine::start("a").await, MockEngine::start("b").await);
    let client = client();
    let leaning_a = snapshot(1, &[("a", a.url(), 0.6), ("b", b.url(), 0.4)]);
    let (one, two) = pair(
        |peer| replica_config(vec![peer]),
        |admin, one| DataPlaneConfig {
            admin_listen: Some(admin),
            ..replica_config(vec![one.admin_url().unwrap()])
        },
        (&leaning_a, &snapshot(1, &[("a", a.url(), 0.4), ("b", b.url(), 0.6)])),
    )
    .await;
    let keys: Vec<String> = (0..40).map(|i| format!("conv-{i}")).collect();
    let mut placed = Vec::new();
    for key in &keys {
        placed.push(engine_for(&client, &one, key).await);
    }
    assert!(
        placed.iter().filter(|e| *e == "a").count() > 10,
        "the first replica places on a too: {placed:?}"
    );
    // Every placement reached the second replica (40 new keys, each noted once), and so did
    // the first one's idle state: a load figure still counting the last placement's request
    // could make a follow-up leave a (placing by load).
    let learned = "ilb_dataplane_replica_entries_learned_total";
    let peer_load = "ilb_dataplane_engine_peer_in_flight{engine=\"a\"}";
    assert!(
        until(|| async {
            metric(&client, &two, learned).await >= 40.0 && metric(&client, &two, peer_load).await == 0.0
        })
        .await
    );
    for (key, engine) in keys.iter().zip(&placed) {
        assert_eq!(&engine_for(&client, &two, key).await, engine, "{key} moved replicas and engines");
    }
}

/// One replica holds streams open on engine `a`; the other places new conversations on `b`
/// while they last, because it adds them to its own counts. Without admin listeners: the
/// deltas go to the client listeners and must not be taken for an engine endpoint there (the
/// first benchmark of issue 31 found every delivery proxied to an engine that way).
#[tokio::test]
async fn replicas_place_new_conversations_by_the_load_all_of_them_cause() {
    let (a, b) = (MockEngine::start("a").await, MockEngine::start("b").await);
    let client = client();
    let weights = [("a", a.url(), 0.5), ("b", b.url(), 0.5)];
    // The first replica routes to `a` alone, so that its held streams all land there.
    let only_a = snapshot(1, &[("a", a.url(), 1.0)]);
    let (one, two) = pair(
        |peer| DataPlaneConfig { admin_listen: None, ..replica_config(vec![peer]) },
        |listen, one| DataPlaneConfig { listen, admin_listen: None, ..replica_config(vec![one.url()]) },
        (&only_a, &snapshot(1, &weights)),
    )
    .await;
    // Streams held open by the mock's gate.
    let mut held = Vec::new();
    for i in 0..6 {
        let key = format!("held-{i}");
        let req = post(
            &one.url(),
            "/v1/chat/completions",
            &chat_body(&key),
            &[("x-session-id", &key), ("x-mock-chunks", "2"), ("x-mock-gate", "1")],
        );
        let client = client.clone();
        held.push(tokio::spawn(async move { send(&client, req).await }));
    }
    let peer_load = "ilb_dataplane_engine_peer_in_flight{engine=\"a\"}";
    assert!(
        until(|| async { metric(&client, &two, peer_load).await == 6.0 }).await,
        "the second replica sees a's load"
    );
    let fresh: Vec<String> = (0..20).map(|i| format!("new-{i}")).collect();
    let mut on_b = 0;
    for key in &fresh {
        on_b += usize::from(engine_for(&client, &two, key).await == "b");
    }
    assert_eq!(on_b, fresh.len(), "new conversations avoid the engine the other replica loads");
    // The gate wakes the streams waiting at it now: open it until all have ended.
    assert!(
        until(|| async {
            a.gate.notify_waiters();
            held.iter().all(|stream| stream.is_finished())
        })
        .await
    );
    for stream in held {
        let (status, _, _) = stream.await.unwrap();
        assert_eq!(status, 200);
    }
    assert!(
        until(|| async { metric(&client, &two, peer_load).await == 0.0 }).await,
        "finished streams leave the count"
    );
}

/// A change goes out when it happens, not at the end of the period: with a period far longer
/// than the test's deadline, a held stream, its end and a new conversation all reach the other
/// replica.
#[tokio::test]
async fn changes_reach_the_peers_before_the_period_is_up() {
    let (a, b) = (MockEngine::start("a").await, MockEngine::start("b").await);
    let client = client();
    let weights = [("a", a.url(), 0.5), ("b", b.url(), 0.5)];
    let slow = |peers| DataPlaneConfig { peer_interval: Duration::from_secs(3600), ..replica_config(peers) };
    let (one, two) = pair(
        |peer| slow(vec![peer]),
        |admin, one| DataPlaneConfig { admin_listen: Some(admin), ..slow(vec![one.admin_url().unwrap()]) },
        (&snapshot(1, &weights), &snapshot(1, &weights)),
    )
    .await;
    let peer_load = |engine: &str| format!("ilb_dataplane_engine_peer_in_flight{{engine=\"{engine}\"}}");
    let peers_in_flight = || async {
        metric(&client, &two, &peer_load("a")).await + metric(&client, &two, &peer_load("b")).await
    };
    let req = post(
        &one.url(),
        "/v1/chat/completions",
        &chat_body("held"),
        &[("x-session-id", "held"), ("x-mock-chunks", "2"), ("x-mock-gate", "1")],
    );
    let held = tokio::spawn({
        let client = client.clone();
        async move { send(&client, req).await }
    });
    assert!(until(|| async { peers_in_flight().await == 1.0 }).await, "the held stream's load");
    let learned = "ilb_dataplane_replica_entries_learned_total";
    assert!(until(|| async { metric(&client, &two, learned).await >= 1.0 }).await, "its conversation");
    let placed = engine_for(&client, &one, "new").await;
    assert!(until(|| async { metric(&client, &two, learned).await >= 2.0 }).await, "a new conversation");
    assert_eq!(engine_for(&client, &two, "new").await, placed, "the new conversation keeps its engine");
    assert!(
        until(|| async {
            a.gate.notify_waiters();
            b.gate.notify_waiters();
            held.is_finished()
        })
        .await
    );
    assert_eq!(held.await.unwrap().0, 200);
    assert!(until(|| async { peers_in_flight().await == 0.0 }).await, "the stream's end");
}

/// Malformed and oversized messages get 400 and 413 and change nothing; a peer that accepts
/// connections and never answers has its deliveries skipped while requests are served.
#[tokio::test]
async fn bad_deltas_are_refused_and_a_hanging_peer_holds_nothing_up() {
    let a = MockEngine::start("a").await;
    let hanging = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hanging_url = format!("http://{}", hanging.local_addr().unwrap());
    // Accepts, reads nothing, answers nothing; keeps the sockets open.
    let hold = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = hanging.accept().await {
            open.push(socket);
        }
    });
    let mut config = replica_config(vec![hanging_url]);
    config.peer_timeout = Duration::from_secs(30);
    let dp = data_plane(config, &snapshot(1, &[("a", a.url(), 1.0)])).await;
    let client = client();
    let deltas_url = format!("{}/v1/replicas/deltas", dp.admin_url().unwrap());
    for (body, status) in [
        ("not json".to_owned(), 400),
        (r#"{"instance":"x","affinity":[[1,0]]}"#.to_owned(), 400),
        (r#"{"instance":"x","affinity":[[1,2]],"extra":true}"#.to_owned(), 400),
        (format!(r#"{{"instance":"x","affinity":[{}]}}"#, vec!["[1,2]"; 1 << 20].join(",")), 413),
    ] {
        let (got, _, text) = send(&client, post(&deltas_url, "", &body, &[])).await;
        assert_eq!(got, status, "{text}");
        assert!(text.contains("\"error\""), "{text}");
    }
    assert_eq!(metric(&client, &dp, "ilb_dataplane_replica_messages_refused_total").await, 4.0);
    assert_eq!(metric(&client, &dp, "ilb_dataplane_replica_entries_learned_total").await, 0.0);
    // Requests go on while the one delivery hangs and the following ones are skipped.
    let skipped = "ilb_dataplane_replica_sends_skipped_total";
    assert!(until(|| async { metric(&client, &dp, skipped).await >= 3.0 }).await, "later deliveries skipped");
    for i in 0..20 {
        assert_eq!(engine_for(&client, &dp, &format!("k{i}")).await, "a");
    }
    assert_eq!(metric(&client, &dp, "ilb_dataplane_replica_messages_sent_total").await, 0.0);
    hold.abort();
}
