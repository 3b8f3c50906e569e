//! Slow token streams for the streaming benchmark (`bench/streams.sh`): OpenAI-compatible mock
//! engines that stream like real ones, and a load client that runs many such streams at once
//! and measures how late each chunk arrives.
//!
//! ```text
//! stream_load serve --ports 19801,19802 [--spacing-ms 20-50] [--seed 1] [--tls-dir DIR]
//! stream_load load --url http://127.0.0.1:PORT/v1/chat/completions [--url ...] \
//!     [--streams 1000] [--chunks 256] [--rounds 1] [--ramp-ms 2000] [--ca DIR/ca.pem]
//! ```
//!
//! `serve`: every streamed chat completion sends `max_tokens` content chunks (one token each),
//! each after a pause drawn uniformly from `--spacing-ms` (seeded per request), then the finish
//! chunk, the usage chunk when `stream_options.include_usage` asks for it, and `data: [DONE]`,
//! the way vLLM does. Every content chunk carries the wall-clock time it was handed to the
//! socket (`@<unix ns>` inside its text), so a client on the same machine measures each chunk's
//! latency through whatever sits in between. A request with `stream` false gets one JSON
//! answer at once. The engines set TCP_NODELAY, as real ones do, and answer the probes routers
//! send (`/health`, `/v1/models`, `/get_server_info`, ...). With `--tls-dir` they serve https
//! with a throwaway CA's certificate for 127.0.0.1, written to `DIR` (`ca.pem`, `server.pem`,
//! `server.key`) for the router and the load client to use.
//!
//! `load`: `--streams` connections (kept alive; connection `i` goes to URL `i mod n`), started
//! evenly over `--ramp-ms`, each running `--rounds` streams one after the other. Prints one JSON
//! line: streams completed and failed (a status other than 200, a broken or short stream, a
//! missing `[DONE]`), content chunks received, per-chunk latency (sent by the engine → read by
//! the client) and time to the first chunk, as percentiles in milliseconds. `https` URLs are
//! trusted through `--ca`.
//!
//! A benchmark tool, not product code: it reads the clock and its arguments directly.
#![allow(clippy::disallowed_methods)]

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rand::{Rng, SeedableRng};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("serve") => Serve::parse(&args[1..]).and_then(serve),
        Some("load") => Load::parse(&args[1..]).and_then(load),
        _ => Err("usage: stream_load serve --ports P1,P2 [--spacing-ms 20-50] [--seed N] [--tls-dir DIR] | \
                  stream_load load --url URL [--url URL ...] [--streams N] [--chunks N] [--rounds N] [--ramp-ms MS] [--ca FILE]"
            .into()),
    };
    if let Err(e) = result {
        eprintln!("stream_load: {e}");
        std::process::exit(2);
    }
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The value after flag `args[i]`, parsed.
fn value<T: std::str::FromStr>(args: &[String], i: usize) -> Result<T, Error> {
    let text = args.get(i + 1).ok_or_else(|| format!("{} needs a value", args[i]))?;
    text.parse().map_err(|_| format!("{}: cannot parse '{text}'", args[i]).into())
}

fn unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

// ---------------------------------------------------------------- engines

struct Serve {
    ports: Vec<u16>,
    spacing_ms: (u64, u64),
    seed: u64,
    tls_dir: Option<std::path::PathBuf>,
}

impl Serve {
    fn parse(args: &[String]) -> Result<Serve, Error> {
        let mut serve = Serve { ports: vec![19801], spacing_ms: (20, 50), seed: 1, tls_dir: None };
        let mut i = 0;
        while i < args.len() {
            match args[i].as_str() {
                "--ports" => {
                    let list: String = value(args, i)?;
                    serve.ports = list.split(',').map(|p| p.trim().parse()).collect::<Result<_, _>>()?;
                }
                "--spacing-ms" => {
                    let range: String = value(args, i)?;
                    let (lo, hi) = range.split_once('-').unwrap_or((&range, &range));
                    serve.spacing_ms = (lo.parse()?, hi.parse()?);
                    if serve.spacing_ms.0 > serve.spacing_ms.1 {
                        return Err("--spacing-ms: LOW-HIGH with LOW <= HIGH".into());
                    }
                }
                "--seed" => serve.seed = value(args, i)?,
                "--tls-dir" => serve.tls_dir = Some(value::<String>(args, i)?.into()),
                other => return Err(format!("serve: unknown argument '{other}'").into()),
            }
            i += 2;
        }
        Ok(serve)
    }
}

/// A throwaway CA and a server certificate for 127.0.0.1, written to `dir`.
fn server_tls(dir: &std::path::Path) -> Result<ilb_tls::TlsAcceptor, Error> {
    let ca = ilb_tls::testing::TestCa::new("stream_load throwaway ca");
    let server = ca.issue(&["127.0.0.1", "localhost"]);
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("ca.pem"), ca.pem())?;
    std::fs::write(dir.join("server.pem"), &server.cert_pem)?;
    std::fs::write(dir.join("server.key"), &server.key_pem)?;
    let tls = ilb_tls::ServerTls::new(&server.identity(), ilb_tls::ClientAuth::None)?;
    Ok(tls.acceptor().clone())
}

fn serve(config: Serve) -> Result<(), Error> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let tls = config.tls_dir.as_deref().map(server_tls).transpose()?;
    runtime.block_on(async move {
        let config = Arc::new(config);
        let mut listeners = Vec::new();
        for &port in &config.ports {
            listeners.push(TcpListener::bind(("127.0.0.1", port)).await?);
        }
        eprintln!("stream_load serve: listening on ports {:?}", config.ports);
        let requests = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut tasks = Vec::new();
        for listener in listeners {
            let (config, requests) = (Arc::clone(&config), Arc::clone(&requests));
            tasks.push(tokio::spawn(accept_loop(listener, config, requests, tls.clone())));
        }
        for task in tasks {
            task.await?;
        }
        Ok(())
    })
}

async fn accept_loop(
    listener: TcpListener,
    config: Arc<Serve>,
    requests: Arc<std::sync::atomic::AtomicU64>,
    tls: Option<ilb_tls::TlsAcceptor>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let _ = stream.set_nodelay(true);
        let (config, requests, tls) = (Arc::clone(&config), Arc::clone(&requests), tls.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let n = requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                answer(Arc::clone(&config), n, req)
            });
            let http = hyper::server::conn::http1::Builder::new();
            let _ = match tls {
                None => http.serve_connection(TokioIo::new(stream), service).await,
                Some(tls) => match tls.accept(stream).await {
                    Ok(stream) => http.serve_connection(TokioIo::new(stream), service).await,
                    Err(_) => return,
                },
            };
        });
    }
}

type EngineBody = http_body_util::Either<Full<Bytes>, TokenStream>;

fn json(status: StatusCode, text: String) -> Response<EngineBody> {
    let mut response = Response::new(http_body_util::Either::Left(Full::new(Bytes::from(text))));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
    response
}

#[derive(serde::Deserialize, Default)]
struct ChatRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(serde::Deserialize, Default)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

const MODEL: &str = "mock-model";

async fn answer(
    config: Arc<Serve>,
    n: u64,
    req: Request<Incoming>,
) -> Result<Response<EngineBody>, Infallible> {
    let path = req.uri().path().to_owned();
    if req.method() == http::Method::GET {
        let body = match path.as_str() {
            "/v1/models" => format!(
                r#"{{"object":"list","data":[{{"id":"{MODEL}","object":"model","created":0,"owned_by":"bench","root":"{MODEL}","max_model_len":32768}}]}}"#
            ),
            "/get_server_info" | "/server_info" => format!(
                r#"{{"model_path":"{MODEL}","tokenizer_path":"{MODEL}","served_model_name":"{MODEL}","dp_size":1,"tp_size":1,"version":"0.0.0-bench","max_total_num_tokens":1000000,"internal_states":[{{"load":0}}]}}"#
            ),
            "/get_model_info" | "/model_info" => format!(
                r#"{{"model_path":"{MODEL}","tokenizer_path":"{MODEL}","is_generation":true,"served_model_name":"{MODEL}","model_type":"llama","architectures":["LlamaForCausalLM"]}}"#
            ),
            "/get_load" | "/get_loads" => {
                r#"[{"dp_rank":0,"num_reqs":0,"num_waiting_reqs":0,"num_tokens":0}]"#.into()
            }
            "/version" => r#"{"version":"0.0.0-bench"}"#.into(),
            _ => String::new(),
        };
        return Ok(json(StatusCode::OK, body));
    }
    let Ok(body) = req.into_body().collect().await else {
        return Ok(json(StatusCode::BAD_REQUEST, r#"{"error":"unreadable body"}"#.into()));
    };
    let chat: ChatRequest = serde_json::from_slice(&body.to_bytes()).unwrap_or_default();
    let tokens = chat.max_tokens.or(chat.max_completion_tokens).unwrap_or(16).max(1);
    let model = chat.model.unwrap_or_else(|| MODEL.into());
    let id = format!("chatcmpl-bench-{n}");
    let created = unix_ns() / 1_000_000_000;
    if !chat.stream {
        let text = "tok ".repeat(tokens as usize);
        return Ok(json(
            StatusCode::OK,
            format!(
                r#"{{"id":"{id}","object":"chat.completion","created":{created},"model":"{model}","choices":[{{"index":0,"message":{{"role":"assistant","content":"{text}"}},"finish_reason":"length"}}],"usage":{{"prompt_tokens":8,"completion_tokens":{tokens},"total_tokens":{}}}}}"#,
                8 + tokens
            ),
        ));
    }
    let include_usage = chat.stream_options.is_some_and(|o| o.include_usage);
    let stream = TokenStream {
        prefix: format!(
            r#"data: {{"id":"{id}","object":"chat.completion.chunk","created":{created},"model":"{model}","#
        ),
        tokens,
        sent: 0,
        include_usage,
        tail: 0,
        spacing_ms: config.spacing_ms,
        rng: rand_pcg::Pcg64Mcg::seed_from_u64(config.seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        sleep: None,
    };
    let mut response = Response::new(http_body_util::Either::Right(stream));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
    headers.insert(header::CACHE_CONTROL, "no-cache".parse().unwrap());
    Ok(response)
}

/// A streamed chat completion: `tokens` content chunks, each after a pause, then the finish
/// chunk, the usage chunk (if asked for) and `[DONE]` at once.
struct TokenStream {
    /// `data: {"id":...,"model":...,` shared by every chunk.
    prefix: String,
    tokens: u32,
    sent: u32,
    include_usage: bool,
    /// Closing frames sent after the last token.
    tail: u8,
    spacing_ms: (u64, u64),
    rng: rand_pcg::Pcg64Mcg,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl TokenStream {
    fn pause(&mut self) -> Duration {
        let (lo, hi) = self.spacing_ms;
        Duration::from_micros(self.rng.gen_range(lo * 1000..=hi * 1000))
    }
}

impl Body for TokenStream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.sent < this.tokens {
            let pause = this.pause();
            let sleep = this.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(pause)));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let next = tokio::time::Instant::now() + this.pause();
            if let Some(sleep) = this.sleep.as_mut() {
                sleep.as_mut().reset(next);
            }
            let role = if this.sent == 0 { r#""role":"assistant","# } else { "" };
            this.sent += 1;
            let chunk = format!(
                r#"{}"choices":[{{"index":0,"delta":{{{role}"content":"tok@{} "}},"logprobs":null,"finish_reason":null}}]}}{}"#,
                this.prefix,
                unix_ns(),
                "\n\n"
            );
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(chunk)))));
        }
        this.tail += 1;
        let last = if this.include_usage { 3 } else { 2 };
        let frame = match this.tail {
            1 => format!(
                r#"{}"choices":[{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":"length"}}]}}{}"#,
                this.prefix, "\n\n"
            ),
            t if t < last => format!(
                r#"{}"choices":[],"usage":{{"prompt_tokens":8,"completion_tokens":{},"total_tokens":{}}}}}{}"#,
                this.prefix,
                this.tokens,
                this.tokens + 8,
                "\n\n"
            ),
            t if t == last => "data: [DONE]\n\n".to_owned(),
            _ => return Poll::Ready(None),
        };
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(frame)))))
    }
}

// ---------------------------------------------------------------- load

struct Load {
    urls: Vec<http::Uri>,
    /// For `https` URLs.
    tls: Option<ilb_tls::ClientTls>,
    streams: usize,
    chunks: u32,
    rounds: u32,
    ramp_ms: u64,
}

impl Load {
    fn parse(args: &[String]) -> Result<Load, Error> {
        let mut load =
            Load { urls: Vec::new(), tls: None, streams: 1000, chunks: 256, rounds: 1, ramp_ms: 2000 };
        let mut i = 0;
        while i < args.len() {
            match args[i].as_str() {
                "--url" => load.urls.push(value(args, i)?),
                "--streams" => load.streams = value(args, i)?,
                "--chunks" => load.chunks = value(args, i)?,
                "--rounds" => load.rounds = value(args, i)?,
                "--ramp-ms" => load.ramp_ms = value(args, i)?,
                "--ca" => {
                    let pem = std::fs::read(value::<String>(args, i)?)?;
                    let roots = ilb_tls::certs_from_pem(&pem)?;
                    load.tls =
                        Some(ilb_tls::ClientTls::new(&ilb_tls::ClientOptions { roots, identity: None })?);
                }
                other => return Err(format!("load: unknown argument '{other}'").into()),
            }
            i += 2;
        }
        if load.urls.is_empty() || load.streams == 0 || load.chunks == 0 {
            return Err("load: at least one --url, and --streams and --chunks above 0".into());
        }
        Ok(load)
    }
}

/// Latencies in microseconds, in buckets of 1 µs up to 10 ms, then of 100 µs up to 10 s.
struct Histogram {
    fine: Vec<u64>,
    coarse: Vec<u64>,
    count: u64,
    max_us: u64,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram { fine: vec![0; 10_000], coarse: vec![0; 100_000], count: 0, max_us: 0 }
    }

    fn record(&mut self, us: u64) {
        if us < 10_000 {
            self.fine[us as usize] += 1;
        } else {
            self.coarse[((us / 100) as usize).min(99_999)] += 1;
        }
        self.count += 1;
        self.max_us = self.max_us.max(us);
    }

    /// The `q` quantile in milliseconds (bucket upper bounds), or null when empty.
    fn quantile_ms(&self, q: f64) -> serde_json::Value {
        if self.count == 0 {
            return serde_json::Value::Null;
        }
        let rank = ((self.count as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (us, n) in self.fine.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return serde_json::json!((us as f64 + 1.0) / 1000.0);
            }
        }
        for (bucket, n) in self.coarse.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return serde_json::json!(((bucket as f64 + 1.0) * 100.0) / 1000.0);
            }
        }
        serde_json::json!(self.max_us as f64 / 1000.0)
    }
}

/// What the client connections saw, together.
struct Tally {
    chunk: Histogram,
    ttft: Histogram,
    ok: u64,
    failed: u64,
    chunks: u64,
    first_error: Option<String>,
}

impl Tally {
    fn fail(&mut self, what: String) {
        self.failed += 1;
        self.first_error.get_or_insert(what);
    }
}

type Shared = Arc<Mutex<Tally>>;

fn lock(tally: &Shared) -> std::sync::MutexGuard<'_, Tally> {
    tally.lock().unwrap_or_else(|p| p.into_inner())
}

fn load(config: Load) -> Result<(), Error> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let started = std::time::Instant::now();
    let tally: Shared = Arc::new(Mutex::new(Tally {
        chunk: Histogram::new(),
        ttft: Histogram::new(),
        ok: 0,
        failed: 0,
        chunks: 0,
        first_error: None,
    }));
    runtime.block_on(async {
        let config = Arc::new(config);
        let mut tasks = Vec::with_capacity(config.streams);
        for user in 0..config.streams {
            let (config, tally) = (Arc::clone(&config), Arc::clone(&tally));
            let delay = Duration::from_micros(config.ramp_ms * 1000 * user as u64 / config.streams as u64);
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                client(&config, user, &tally).await;
            }));
        }
        for task in tasks {
            let _ = task.await;
        }
    });
    let total = lock(&tally);
    let line = serde_json::json!({
        "streams_ok": total.ok,
        "streams_failed": total.failed,
        "chunks": total.chunks,
        "wall_s": started.elapsed().as_secs_f64(),
        "chunk_latency_ms": {
            "p50": total.chunk.quantile_ms(0.5), "p90": total.chunk.quantile_ms(0.9),
            "p99": total.chunk.quantile_ms(0.99), "p999": total.chunk.quantile_ms(0.999),
            "max": total.chunk.max_us as f64 / 1000.0,
        },
        "ttft_ms": {
            "p50": total.ttft.quantile_ms(0.5), "p99": total.ttft.quantile_ms(0.99),
            "max": total.ttft.max_us as f64 / 1000.0,
        },
        "first_error": total.first_error,
    });
    println!("{line}");
    Ok(())
}

/// One kept-alive connection running `rounds` streams (a new connection after a failure).
async fn client(config: &Load, user: usize, tally: &Shared) {
    let uri = &config.urls[user % config.urls.len()];
    let mut sender = None;
    for round in 0..config.rounds {
        if sender.is_none() {
            match connect(uri, config.tls.as_ref()).await {
                Ok(s) => sender = Some(s),
                Err(e) => {
                    lock(tally).fail(format!("connect: {e}"));
                    continue;
                }
            }
        }
        let Some(s) = sender.as_mut() else { continue };
        match one_stream(s, uri, config.chunks, user, round, tally).await {
            Ok(chunks) => {
                let mut t = lock(tally);
                t.ok += 1;
                t.chunks += chunks;
            }
            Err(e) => {
                sender = None;
                lock(tally).fail(e);
            }
        }
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(uri: &http::Uri, tls: Option<&ilb_tls::ClientTls>) -> Result<Sender, Error> {
    let host = uri.host().ok_or("url without host")?;
    let https = uri.scheme_str() == Some("https");
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = TcpStream::connect((host, port)).await?;
    tcp.set_nodelay(true)?;
    if !https {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(conn);
        return Ok(sender);
    }
    let tls = tls.ok_or("an https url needs --ca")?;
    let stream = tls.connector().connect(ilb_tls::server_name(host)?, tcp).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

/// One streamed chat completion: checks status, chunk count and `[DONE]`, and records every
/// chunk's latency and the time to the first chunk. Returns the content chunks.
async fn one_stream(
    sender: &mut Sender,
    uri: &http::Uri,
    chunks: u32,
    user: usize,
    round: u32,
    tally: &Shared,
) -> Result<u64, String> {
    let body = format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"system","content":"You are a helpful assistant."}},{{"role":"user","content":"Conversation {user}, turn {round}: tell me a long story."}}],"max_tokens":{chunks},"stream":true,"stream_options":{{"include_usage":true}}}}"#
    );
    let authority = uri.authority().map_or("127.0.0.1", |a| a.as_str());
    let request = Request::post(uri.path())
        .header(header::HOST, authority)
        .header(header::CONTENT_TYPE, "application/json")
        .header("x-session-id", format!("bench-{user}"))
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    sender.ready().await.map_err(|e| format!("connection: {e}"))?;
    let sent_ns = unix_ns();
    let response = sender.send_request(request).await.map_err(|e| format!("request: {e}"))?;
    if response.status() != StatusCode::OK {
        return Err(format!("status {}", response.status()));
    }
    let mut body = response.into_body();
    let mut scan = Scan::default();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("stream broken after {} chunks: {e}", scan.chunks))?;
        let Some(data) = frame.data_ref() else { continue };
        let now = unix_ns();
        let before = scan.chunks;
        let mut t = lock(tally);
        scan.push(data, now, &mut t.chunk);
        if before == 0 && scan.chunks > 0 {
            t.ttft.record(now.saturating_sub(sent_ns) / 1000);
        }
    }
    if scan.chunks != u64::from(chunks) || !scan.done {
        return Err(format!("short stream: {} of {chunks} chunks, [DONE] {}", scan.chunks, scan.done));
    }
    Ok(scan.chunks)
}

/// Finds the `tok@<unix ns>` stamps and `[DONE]` in a stream's bytes, split anywhere.
#[derive(Default)]
struct Scan {
    /// Bytes of the previous frame that may begin a stamp or `[DONE]` (never a whole stamp).
    carry: Vec<u8>,
    chunks: u64,
    done: bool,
}

impl Scan {
    fn push(&mut self, data: &[u8], now_ns: u64, latency: &mut Histogram) {
        let mut text = std::mem::take(&mut self.carry);
        text.extend_from_slice(data);
        let mut at = 0;
        while let Some(offset) = text[at..].iter().position(|&b| b == b'@') {
            let start = at + offset + 1;
            let digits = text[start..].iter().take_while(|b| b.is_ascii_digit()).count();
            if start + digits == text.len() {
                // The stamp may go on in the next frame.
                self.note_done(&text);
                self.carry = text[start - 1..].to_vec();
                return;
            }
            if let Some(stamp) =
                std::str::from_utf8(&text[start..start + digits]).ok().and_then(|s| s.parse::<u64>().ok())
            {
                latency.record(now_ns.saturating_sub(stamp) / 1000);
                self.chunks += 1;
            }
            at = start + digits;
        }
        self.note_done(&text);
        self.carry = text[text.len().saturating_sub(5).max(at)..].to_vec();
    }

    fn note_done(&mut self, text: &[u8]) {
        self.done |= text.windows(6).any(|w| w == b"[DONE]");
    }
}
