//! Loopback tests of the engine-side client: connection reuse after a clean body only, the
//! resend on an idle connection the engine closed, and body framing over a real socket.

use super::{send, EngineBody, Origin, Pool, PoolConfig, UpstreamError, UpstreamRequest};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response};
use http_body::Body;
use http_body_util::BodyExt;
use ilb_core::EngineId;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the scripted engine does after reading a request.
enum Then {
    KeepOpen,
    Close,
    /// Writes nothing more but keeps the connection open until the peer closes it.
    Hang,
}

/// A scripted engine: answers request `i` (counted over all connections) with `script(i)`.
struct ScriptedEngine {
    origin: Origin,
    pool: Pool,
    connections: Arc<AtomicUsize>,
    /// Connections the client closed (end of input seen by the engine).
    closed_by_client: Arc<AtomicUsize>,
    requests: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
}

impl ScriptedEngine {
    async fn start(script: impl Fn(usize) -> (Vec<u8>, Then) + Send + Sync + 'static) -> ScriptedEngine {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let closed_by_client = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
        let script = Arc::new(script);
        let (c, closed, r) = (Arc::clone(&connections), Arc::clone(&closed_by_client), Arc::clone(&requests));
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                c.fetch_add(1, SeqCst);
                let (script, closed, requests) = (Arc::clone(&script), Arc::clone(&closed), Arc::clone(&r));
                tokio::spawn(serve(stream, script, closed, requests));
            }
        });
        let origin = Origin::new(EngineId::new("e"), &format!("http://{addr}"));
        ScriptedEngine { origin, pool: Pool::default(), connections, closed_by_client, requests }
    }

    async fn send(&self, body: &'static str) -> Result<Response<EngineBody>, UpstreamError> {
        let mut headers = HeaderMap::new();
        headers.insert("x-test", HeaderValue::from_static("1"));
        let request = UpstreamRequest {
            method: Method::POST,
            uri: "/v1/completions".parse().unwrap(),
            host: self.origin.host_header(),
            headers: &headers,
            extra: None,
            body: Bytes::from_static(body.as_bytes()),
        };
        let tls = ilb_tls::ClientTls::new(&Default::default()).unwrap();
        send(&self.pool, &self.origin, 0, &PoolConfig::default(), Duration::from_secs(5), &tls, &request)
            .await
    }
}

async fn serve(
    mut stream: TcpStream,
    script: Arc<dyn Fn(usize) -> (Vec<u8>, Then) + Send + Sync>,
    closed: Arc<AtomicUsize>,
    requests: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
) {
    let mut buf = Vec::new();
    loop {
        // Read one request: head, then as many body bytes as its content-length says.
        let request = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .map_or(0, |v| v.trim().parse().unwrap());
                if buf.len() >= end + 4 + length {
                    break buf.drain(..end + 4 + length).collect::<Vec<u8>>();
                }
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => {
                    closed.fetch_add(1, SeqCst);
                    return;
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let index = {
            let mut requests = requests.lock().unwrap();
            requests.push(request);
            requests.len() - 1
        };
        let (response, then) = script(index);
        if stream.write_all(&response).await.is_err() {
            return;
        }
        match then {
            Then::KeepOpen => {}
            Then::Close => return,
            Then::Hang => {
                let mut chunk = [0u8; 64];
                while !matches!(stream.read(&mut chunk).await, Ok(0) | Err(_)) {}
                closed.fetch_add(1, SeqCst);
                return;
            }
        }
    }
}

fn ok(body: &str) -> (Vec<u8>, Then) {
    (format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len()).into_bytes(), Then::KeepOpen)
}

/// Reads the body to its end, returning its bytes and the connection if it may be reused.
async fn read_to_end(response: Response<EngineBody>) -> (Vec<u8>, Option<super::Conn>) {
    let mut body = response.into_body();
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        out.extend_from_slice(frame.unwrap().data_ref().unwrap());
    }
    let conn = body.take_reusable_conn();
    (out, conn)
}

/// Whether `condition` holds within 1,000 polls 5 ms apart (a count, not a wall-clock bound).
async fn eventually(mut condition: impl FnMut() -> bool) -> bool {
    for _ in 0..1000 {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    condition()
}

#[tokio::test]
async fn a_connection_is_reused_after_a_clean_body() {
    let e = ScriptedEngine::start(|i| match i {
        0 => ok("first"),
        _ => (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\nsecond\r\n0\r\n\r\n".to_vec(),
            Then::KeepOpen,
        ),
    })
    .await;
    let response = e.send("{\"a\":1}").await.unwrap();
    let mut body = response.into_body();
    assert_eq!(body.size_hint().exact(), Some(5));
    // The whole small body is handed out in one frame, after which the body says it ended.
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "first");
    assert!(body.is_end_stream());
    let conn = body.take_reusable_conn().expect("reusable");
    e.pool.push(conn, 0, &PoolConfig::default());

    let (second, conn) = read_to_end(e.send("again").await.unwrap()).await;
    assert_eq!(second, b"second");
    assert!(conn.is_some(), "a chunked body that ended cleanly frees its connection too");
    assert_eq!(e.connections.load(SeqCst), 1);
    let requests = e.requests.lock().unwrap();
    let first = String::from_utf8(requests[0].clone()).unwrap();
    assert!(first.starts_with("POST /v1/completions HTTP/1.1\r\n"), "{first}");
    assert!(first.contains("x-test: 1\r\n") && first.contains("content-length: 7\r\n"), "{first}");
    assert!(first.ends_with("\r\n\r\n{\"a\":1}"), "{first}");
}

#[tokio::test]
async fn a_body_dropped_early_closes_its_connection() {
    let e = ScriptedEngine::start(|i| match i {
        0 => (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n".to_vec(), Then::Hang),
        _ => ok("next"),
    })
    .await;
    let mut body = e.send("").await.unwrap().into_body();
    assert_eq!(body.frame().await.unwrap().unwrap().into_data().unwrap(), "first");
    assert!(body.take_reusable_conn().is_none(), "half-read");
    drop(body);
    assert!(eventually(|| e.closed_by_client.load(SeqCst) == 1).await, "the engine sees the close");
    assert_eq!(e.pool.idle_len(), 0);
    let (next, _) = read_to_end(e.send("").await.unwrap()).await;
    assert_eq!(next, b"next");
    assert_eq!(e.connections.load(SeqCst), 2);
}

#[tokio::test]
async fn connection_close_and_read_until_close_are_not_reused() {
    let e = ScriptedEngine::start(|i| match i {
        0 => {
            (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok".to_vec(), Then::KeepOpen)
        }
        _ => (b"HTTP/1.1 200 OK\r\n\r\nuntil the end".to_vec(), Then::Close),
    })
    .await;
    let (body, conn) = read_to_end(e.send("").await.unwrap()).await;
    assert_eq!((body.as_slice(), conn.is_none()), (&b"ok"[..], true));
    let (body, conn) = read_to_end(e.send("").await.unwrap()).await;
    assert_eq!((body.as_slice(), conn.is_none()), (&b"until the end"[..], true));
}

#[tokio::test]
async fn an_idle_connection_closed_by_the_engine_is_resent_on_a_new_one() {
    // The second request arrives on the pooled connection, which the engine then closes
    // without answering, as an engine closing idle connections does when the two cross.
    let e = ScriptedEngine::start(|i| match i {
        1 => (Vec::new(), Then::Close),
        _ => ok("fine"),
    })
    .await;
    let (_, conn) = read_to_end(e.send("").await.unwrap()).await;
    e.pool.push(conn.unwrap(), 0, &PoolConfig::default());
    let (body, _) = read_to_end(e.send("").await.unwrap()).await;
    assert_eq!(body, b"fine");
    assert_eq!(e.connections.load(SeqCst), 2);
    assert_eq!(e.requests.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn a_new_connection_closed_without_an_answer_is_an_error() {
    let e = ScriptedEngine::start(|_| (Vec::new(), Then::Close)).await;
    assert!(matches!(e.send("").await, Err(UpstreamError::Closed)));
    assert_eq!(e.connections.load(SeqCst), 1, "not resent");
    let garbage = ScriptedEngine::start(|_| (b"SMTP ready\r\n\r\n".to_vec(), Then::KeepOpen)).await;
    assert!(matches!(garbage.send("").await, Err(UpstreamError::Protocol(_))));
}

#[tokio::test]
async fn idle_connections_the_engine_closed_are_dropped() {
    let e = ScriptedEngine::start(|_| (ok("bye").0, Then::Close)).await;
    let (_, conn) = read_to_end(e.send("").await.unwrap()).await;
    e.pool.push(conn.expect("no close announced: looks reusable"), 0, &PoolConfig::default());
    assert!(
        eventually(|| {
            e.pool.sweep(0, &PoolConfig::default());
            e.pool.idle_len() == 0
        })
        .await
    );
}

#[tokio::test]
async fn a_body_cut_short_is_an_error() {
    let e = ScriptedEngine::start(|_| {
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort".to_vec(), Then::Close)
    })
    .await;
    let mut body = e.send("").await.unwrap().into_body();
    assert_eq!(body.frame().await.unwrap().unwrap().into_data().unwrap(), "short");
    let error = body.frame().await.unwrap().unwrap_err();
    assert_eq!(error.to_string(), "connection closed before the response ended");
    assert!(body.is_end_stream());
    assert!(body.take_reusable_conn().is_none());
}

#[tokio::test]
async fn large_bodies_cross_many_reads_and_large_buffers_are_not_kept() {
    let big = "x".repeat(200 * 1024);
    let response = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{big}", big.len()).into_bytes();
    let e = ScriptedEngine::start(move |_| (response.clone(), Then::KeepOpen)).await;
    let mut body = e.send("").await.unwrap().into_body();
    let (mut received, mut frames) = (0, 0);
    while let Some(frame) = body.frame().await {
        received += frame.unwrap().into_data().unwrap().len();
        frames += 1;
        assert_eq!(body.size_hint().exact(), Some((big.len() - received) as u64));
    }
    assert_eq!(received, big.len());
    assert!(frames > 1);
    let conn = body.take_reusable_conn().expect("reusable");
    assert!(conn.read_capacity() <= 16 * 1024, "capacity {}", conn.read_capacity());
}

#[tokio::test]
async fn chunks_read_together_leave_as_one_frame_with_their_bytes_unchanged() {
    // A stream's last token, its finish event and `[DONE]` arrive in one write.
    let events = ["data: {\"t\":1}\n\n", "data: {\"finish\":true}\n\n", "data: [DONE]\n\n"];
    let mut response = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for event in events {
        response.extend_from_slice(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes());
    }
    response.extend_from_slice(b"0\r\n\r\n");
    let e = ScriptedEngine::start(move |_| (response.clone(), Then::KeepOpen)).await;
    let mut body = e.send("").await.unwrap().into_body();
    let frame = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(frame, events.concat(), "one frame, the three events in order");
    assert!(body.is_end_stream());
    assert!(body.frame().await.is_none());
    assert!(body.take_reusable_conn().is_some(), "the connection ended cleanly");
}

#[tokio::test]
async fn a_malformed_chunk_after_good_ones_still_delivers_them_then_fails() {
    let e = ScriptedEngine::start(|_| {
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\nzz\r\n".to_vec(),
            Then::KeepOpen,
        )
    })
    .await;
    let mut body = e.send("").await.unwrap().into_body();
    assert_eq!(body.frame().await.unwrap().unwrap().into_data().unwrap(), "abcde");
    let error = body.frame().await.unwrap().unwrap_err();
    assert_eq!(error.to_string(), "malformed chunk size line");
    assert!(body.take_reusable_conn().is_none());
}
