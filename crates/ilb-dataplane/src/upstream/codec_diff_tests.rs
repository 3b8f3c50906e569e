//! Differential test of the engine codec against an independent HTTP/1.1 client: the same
//! response bytes go to hyper's client connection (over an in-memory duplex pipe) and to
//! `parse_head` + `BodyDecoder` (fed in pieces split anywhere), and both must agree on the
//! status, the end-to-end headers and the body, or both must refuse the response.

use super::codec::{is_hop_by_hop, parse_head, BodyDecoder, Decoded};
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What a client made of a response: status, end-to-end headers (sorted, lowercase), body.
type Outcome = Option<(StatusCode, Vec<(String, Vec<u8>)>, Vec<u8>)>;

fn end_to_end(headers: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = headers
        .iter()
        .filter(|(name, _)| !is_hop_by_hop(name) && *name != http::header::CONTENT_LENGTH)
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect();
    out.sort();
    out
}

/// hyper's client reading `response` as the answer to one GET (the pipe closes after it).
async fn hyper_reads(response: &[u8]) -> Outcome {
    let (client_io, mut server_io) = tokio::io::duplex(1 << 20);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client_io)).await.ok()?;
    let driver = tokio::spawn(conn);
    let request =
        http::Request::get("/").header("host", "engine").body(http_body_util::Empty::<Bytes>::new()).ok()?;
    let sent = tokio::spawn(async move {
        let response = sender.send_request(request).await.ok()?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.ok()?.to_bytes().to_vec();
        Some((parts.status, end_to_end(&parts.headers), body))
    });
    // The request head, then the response, then end of input.
    let mut request = vec![0u8; 4096];
    let _ = server_io.read(&mut request).await;
    server_io.write_all(response).await.ok()?;
    server_io.shutdown().await.ok()?;
    let outcome = sent.await.ok()?;
    driver.abort();
    outcome
}

/// The codec reading `response` fed in pieces ending at `splits`, then end of input.
fn codec_reads(response: &[u8], splits: &[usize]) -> Outcome {
    let mut buf = BytesMut::new();
    let mut at = 0;
    let mut ends = splits.iter().copied().filter(|&s| s <= response.len()).collect::<Vec<_>>();
    ends.sort_unstable();
    ends.push(response.len());
    let mut pieces = ends.into_iter().map(move |end| {
        let piece = &response[at..end.max(at)];
        at = end.max(at);
        piece
    });
    let head = loop {
        match parse_head(&mut buf) {
            Ok(Some(head)) => break head,
            Ok(None) => buf.extend_from_slice(pieces.next()?),
            Err(_) => return None,
        }
    };
    let mut decoder = BodyDecoder::new(head.framing);
    let mut body = Vec::new();
    loop {
        match decoder.decode(&mut buf).ok()? {
            Decoded::Data(data) => body.extend_from_slice(&data),
            Decoded::Done => break,
            Decoded::NeedMore => match pieces.next() {
                Some(piece) => buf.extend_from_slice(piece),
                None => {
                    decoder.eof().ok()?;
                    break;
                }
            },
        }
    }
    Some((head.status, end_to_end(&head.headers), body))
}

#[derive(Clone, Debug)]
enum Framing {
    Length,
    Chunked { sizes: Vec<usize>, extension: bool, trailer: bool },
    Close,
}

fn framing() -> impl Strategy<Value = Framing> {
    prop_oneof![
        Just(Framing::Length),
        (vec(1usize..40, 0..6), any::<bool>(), any::<bool>())
            .prop_map(|(sizes, extension, trailer)| Framing::Chunked { sizes, extension, trailer }),
        Just(Framing::Close),
    ]
}

fn header_name() -> impl Strategy<Value = String> {
    "x-[a-z0-9]{1,10}(-[a-z]{1,6})?"
}

fn header_value() -> impl Strategy<Value = String> {
    // Visible ASCII and inner spaces; no leading or trailing whitespace (both sides trim it).
    "[!-~]([ !-~]{0,20}[!-~])?"
}

/// A response as an engine might send it: an optional `100 Continue`, a status, headers in
/// any case, and a body framed by length, chunks (with extensions and trailers) or close.
fn response() -> impl Strategy<Value = Vec<u8>> {
    (
        any::<bool>(),
        prop::sample::select(vec![200u16, 201, 204, 400, 404, 429, 500, 503]),
        vec((header_name(), header_value(), any::<bool>()), 0..6),
        vec(any::<u8>(), 0..120),
        framing(),
    )
        .prop_map(|(interim, status, headers, body, framing)| {
            let mut out = Vec::new();
            if interim {
                out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            }
            out.extend_from_slice(format!("HTTP/1.1 {status} X\r\n").as_bytes());
            for (name, value, upper) in headers {
                let name = if upper { name.to_ascii_uppercase() } else { name };
                out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
            }
            // 204 has no body whatever the framing says.
            let body: &[u8] = if status == 204 { &[] } else { &body };
            match framing {
                Framing::Length => {
                    out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
                    out.extend_from_slice(body);
                }
                Framing::Chunked { .. } if status == 204 => out.extend_from_slice(b"\r\n"),
                Framing::Chunked { sizes, extension, trailer } => {
                    out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                    let mut rest = body;
                    for size in sizes.iter().copied().chain([usize::MAX]) {
                        let (chunk, tail) = rest.split_at(size.min(rest.len()));
                        rest = tail;
                        if chunk.is_empty() {
                            continue;
                        }
                        let ext = if extension { ";name=value" } else { "" };
                        out.extend_from_slice(format!("{:X}{ext}\r\n", chunk.len()).as_bytes());
                        out.extend_from_slice(chunk);
                        out.extend_from_slice(b"\r\n");
                    }
                    out.extend_from_slice(b"0\r\n");
                    if trailer {
                        out.extend_from_slice(b"x-trailer: t\r\n");
                    }
                    out.extend_from_slice(b"\r\n");
                }
                Framing::Close => {
                    out.extend_from_slice(b"Connection: close\r\n\r\n");
                    out.extend_from_slice(body);
                }
            }
            out
        })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, rng_seed: RngSeed::Fixed(7), ..ProptestConfig::default() })]

    #[test]
    fn codec_and_hyper_agree_on_valid_responses(response in response(), splits in vec(0usize..400, 0..6)) {
        let theirs = runtime().block_on(hyper_reads(&response));
        prop_assert!(theirs.is_some(), "hyper refused a valid response: {:?}", String::from_utf8_lossy(&response));
        prop_assert_eq!(codec_reads(&response, &splits), theirs);
    }
}

/// Malformed responses: both refuse them (and the codec on every split).
#[test]
fn codec_and_hyper_both_refuse_malformed_responses() {
    let cases: [&[u8]; 6] = [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nZZ\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab",
        b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
    ];
    let rt = runtime();
    for response in cases {
        let text = String::from_utf8_lossy(response);
        assert_eq!(rt.block_on(hyper_reads(response)), None, "hyper accepted {text:?}");
        for split in 0..response.len() {
            assert_eq!(codec_reads(response, &[split]), None, "codec accepted {text:?} split at {split}");
        }
    }
}
