//! Scraping against a tiny hyper server on loopback serving the fixtures, and each failure
//! kind: connect refused, timeout, bad status, oversized body, non-UTF-8 body.
#![allow(clippy::disallowed_methods)] // tests read their fixtures from files

use bytes::Bytes;
use http::{Response, StatusCode, Uri};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use ilb_controlplane::scrape::{http_client, scrape, scrape_with_limits, ScrapeError};
use ilb_planning::prom::Limits;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;

fn fixture(file: &str) -> String {
    std::fs::read_to_string(format!("{}/../ilb-planning/tests/fixtures/{file}", env!("CARGO_MANIFEST_DIR")))
        .unwrap()
}

/// Every fixture, with the engine it comes from.
const FIXTURES: [&str; 12] = [
    "vllm.txt",
    "vllm_later.txt",
    "vllm_v0.txt",
    "sglang.txt",
    "sglang_0.5_dp2_tp2.txt",
    "tgi_3.3.txt",
    "llamacpp_idle.txt",
    "llamacpp_busy.txt",
    "llamacpp_after.txt",
    "vllm_0.32_idle.txt",
    "vllm_0.32_busy.txt",
    "vllm_0.32_after.txt",
];

/// Serves every fixture at `/f/{file}`, and `/vllm`, `/sglang`, `/error`, `/slow`, `/binary` on an ephemeral loopback port.
/// The listener is bound before this returns, so no readiness wait is needed.
async fn serve() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (vllm, sglang) = (fixture("vllm.txt"), fixture("sglang.txt"));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let (vllm, sglang) = (vllm.clone(), sglang.clone());
            tokio::spawn(async move {
                let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let (vllm, sglang) = (vllm.clone(), sglang.clone());
                    async move {
                        let path = request.uri().path().to_owned();
                        let response = match path.as_str() {
                            p if p.starts_with("/f/") && FIXTURES.contains(&&p[3..]) => {
                                Response::new(Full::new(Bytes::from(fixture(&p[3..]))))
                            }
                            "/vllm" => Response::new(Full::new(Bytes::from(vllm))),
                            "/sglang" => Response::new(Full::new(Bytes::from(sglang))),
                            "/binary" => Response::new(Full::new(Bytes::from_static(&[0xff, 0xfe, 0x00]))),
                            "/slow" => {
                                // Longer than any test timeout; the client gives up first.
                                tokio::time::sleep(Duration::from_secs(30)).await;
                                Response::new(Full::new(Bytes::new()))
                            }
                            _ => {
                                let mut response = Response::new(Full::new(Bytes::from_static(b"boom")));
                                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                                response
                            }
                        };
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    address
}

fn url(address: SocketAddr, path: &str) -> Uri {
    format!("http://{address}{path}").parse().unwrap()
}

#[tokio::test]
async fn scrapes_vllm_and_sglang_fixtures() {
    let address = serve().await;
    let client = http_client();
    let vllm = scrape(&client, &url(address, "/vllm"), Duration::from_secs(5)).await.unwrap();
    let models: Vec<&str> = vllm.iter().map(|(model, _)| model.as_str()).collect();
    assert_eq!(models, ["Qwen/Qwen2.5-7B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"]);
    assert_eq!(vllm[1].1.running, Some(22.0));
    // Second scrape over the same kept-alive client.
    let sglang = scrape(&client, &url(address, "/sglang"), Duration::from_secs(5)).await.unwrap();
    assert_eq!(sglang.len(), 2);
}

#[tokio::test]
async fn bad_status_is_typed() {
    let address = serve().await;
    let error = scrape(&http_client(), &url(address, "/missing"), Duration::from_secs(5)).await.unwrap_err();
    assert!(matches!(error, ScrapeError::Status(StatusCode::SERVICE_UNAVAILABLE)), "{error}");
}

#[tokio::test]
async fn connect_refused_is_typed() {
    // Bind then drop: the port is very likely closed right after.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let error = scrape(&http_client(), &url(address, "/vllm"), Duration::from_secs(5)).await.unwrap_err();
    assert!(matches!(error, ScrapeError::Connect(_)), "{error}");
}

#[tokio::test]
async fn timeout_is_typed() {
    let address = serve().await;
    let timeout = Duration::from_millis(200);
    let error = scrape(&http_client(), &url(address, "/slow"), timeout).await.unwrap_err();
    assert!(matches!(error, ScrapeError::Timeout(t) if t == timeout), "{error}");
}

#[tokio::test]
async fn oversized_body_is_typed() {
    let address = serve().await;
    let limits = Limits { max_bytes: 1024, ..Limits::default() };
    let error = scrape_with_limits(&http_client(), &url(address, "/vllm"), Duration::from_secs(5), &limits)
        .await
        .unwrap_err();
    assert!(matches!(error, ScrapeError::BodyTooLarge { limit: 1024 }), "{error}");
}

#[tokio::test]
async fn unparsable_body_is_typed() {
    let address = serve().await;
    let error = scrape(&http_client(), &url(address, "/binary"), Duration::from_secs(5)).await.unwrap_err();
    assert!(matches!(error, ScrapeError::Parse(_)), "{error}");
}

#[tokio::test]
async fn scrapes_every_fixture_over_http() {
    use ilb_planning::signals::EngineFlavor;
    let address = serve().await;
    let client = http_client();
    for file in FIXTURES {
        let samples =
            scrape(&client, &url(address, &format!("/f/{file}")), Duration::from_secs(5)).await.unwrap();
        assert!(!samples.is_empty(), "{file}");
        let flavor = samples[0].1.flavor;
        let expected = match file.split(['_', '.']).next().unwrap() {
            "vllm" => EngineFlavor::Vllm,
            "sglang" => EngineFlavor::Sglang,
            "tgi" => EngineFlavor::Tgi,
            "llamacpp" => EngineFlavor::Llamacpp,
            other => panic!("fixture of unknown engine {other}"),
        };
        assert_eq!(flavor, expected, "{file}");
        assert!(samples.iter().all(|(_, s)| s.running.is_some()), "{file}: running read");
    }
}
