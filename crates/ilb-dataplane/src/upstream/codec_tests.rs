//! Tests of the wire format: heads, framing, and body decoding on every split of the input.

use super::codec::{encode_request_head, parse_head, BodyDecoder, CodecError, Decoded, Framing, Head};
use super::UpstreamRequest;
use bytes::Bytes;
use bytes::BytesMut;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

fn parse(bytes: &[u8]) -> (Result<Option<Head>, CodecError>, BytesMut) {
    let mut buf = BytesMut::from(bytes);
    let head = parse_head(&mut buf);
    (head, buf)
}

/// Feeds `input` in pieces split at `splits`, decoding after each; then end of input if
/// `eof`. Returns the body, whether it ended, and the bytes left after it.
fn decode(
    framing: Framing,
    input: &[u8],
    splits: &[usize],
    eof: bool,
) -> Result<(Vec<u8>, bool, Vec<u8>), CodecError> {
    let mut decoder = BodyDecoder::new(framing);
    let mut buf = BytesMut::new();
    let mut body = Vec::new();
    let mut at = 0;
    for end in splits.iter().copied().chain([input.len()]) {
        buf.extend_from_slice(&input[at..end.max(at)]);
        at = end.max(at);
        while let Decoded::Data(data) = decoder.decode(&mut buf)? {
            assert!(!data.is_empty(), "no empty frames");
            body.extend_from_slice(&data);
        }
    }
    if eof {
        decoder.eof()?;
    }
    Ok((body, decoder.is_done(), buf.to_vec()))
}

#[test]
fn content_length_body_arrives_with_its_head() {
    let (head, mut rest) = parse(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5\r\n\
                x-a: 1\r\nx-a: 2\r\n\r\nhello",
    );
    let head = head.unwrap().unwrap();
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.version, Version::HTTP_11);
    assert_eq!(head.framing, Framing::Length(5));
    assert!(head.keep_alive);
    assert_eq!(head.headers["content-type"], "application/json");
    assert_eq!(head.headers.get_all("x-a").iter().collect::<Vec<_>>(), ["1", "2"]);
    let (empty, _) = parse(b"HTTP/1.1 200 OK\r\nx-empty:\r\nx-blank:   \r\ncontent-length: 0\r\n\r\n");
    let empty = empty.unwrap().unwrap();
    assert_eq!(
        (empty.headers["x-empty"].as_bytes(), empty.headers["x-blank"].as_bytes()),
        (&b""[..], &b""[..])
    );
    let mut decoder = BodyDecoder::new(head.framing);
    assert_eq!(decoder.remaining(), Some(5));
    assert_eq!(decoder.decode(&mut rest), Ok(Decoded::Data("hello".into())), "one frame");
    assert!(decoder.is_done());
    assert_eq!(decoder.remaining(), Some(0));
    assert_eq!(decoder.decode(&mut rest), Ok(Decoded::Done));
}

#[test]
fn an_incomplete_head_waits_for_more() {
    let full = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    let head_len = full.len() - 2;
    for cut in 0..head_len {
        let (head, buf) = parse(&full[..cut]);
        assert!(matches!(head, Ok(None)), "cut at {cut}");
        assert_eq!(&buf[..], &full[..cut], "nothing consumed at {cut}");
    }
    assert!(parse(&full[..head_len]).0.unwrap().is_some());
}

#[test]
fn interim_responses_are_skipped() {
    let input = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n\
                  HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n";
    let (head, rest) = parse(input);
    let head = head.unwrap().unwrap();
    assert_eq!(head.status, StatusCode::CREATED);
    assert!(!head.headers.contains_key("link"), "interim headers are not kept");
    assert!(BodyDecoder::new(head.framing).is_done());
    assert!(rest.is_empty());
    // An interim response followed by a partial final one: the interim one is consumed.
    let (head, rest) = parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200");
    assert!(matches!(head, Ok(None)));
    assert_eq!(&rest[..], b"HTTP/1.1 200");
    assert_eq!(
        parse(b"HTTP/1.1 101 Switching Protocols\r\n\r\n").0.unwrap_err(),
        CodecError::UnexpectedStatus(101)
    );
}

/// One head's framing and reuse, or its error.
fn check(head: &str, expected: Result<(Framing, bool), CodecError>) {
    let (parsed, _) = parse(head.as_bytes());
    let got =
        parsed.map(|h| h.map(|h| (h.framing, h.keep_alive)).unwrap_or_else(|| panic!("incomplete: {head}")));
    assert_eq!(got, expected, "{head:?}");
}

#[test]
fn framing_and_reuse_follow_the_head() {
    use Framing::*;
    check("HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n", Ok((Length(7), true)));
    check("HTTP/1.1 200 OK\r\n\r\n", Ok((Close, false)));
    check("HTTP/1.0 200 OK\r\ncontent-length: 7\r\n\r\n", Ok((Length(7), false)));
    check("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 7\r\n\r\n", Ok((Length(7), false)));
    check(
        "HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\ncontent-length: 1\r\n\r\n",
        Ok((Length(1), false)),
    );
    check("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", Ok((Chunked, true)));
    check("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n", Ok((Chunked, true)));
    check("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n", Ok((Close, false)));
    check("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n", Ok((Chunked, false)));
    check("HTTP/1.1 204 No Content\r\n\r\n", Ok((Length(0), true)));
    check("HTTP/1.1 304 Not Modified\r\ncontent-length: 9\r\n\r\n", Ok((Length(0), true)));
    check("HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\ncontent-length: 5\r\n\r\n", Ok((Length(5), true)));
    for bad in ["5, 6", "-1", "+5", "abc", "", "99999999999999999999999", "5 5"] {
        check(
            &format!("HTTP/1.1 200 OK\r\ncontent-length: {bad}\r\n\r\n"),
            Err(CodecError::InvalidContentLength),
        );
    }
    check(
        "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
        Err(CodecError::InvalidContentLength),
    );
}

#[test]
fn malformed_heads_are_errors() {
    for bad in [
        "HTTP/1.1 abc OK\r\n\r\n",
        "garbage\r\n\r\n",
        "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        "HTTP/2 200 OK\r\n\r\n",
        "HTTP/1.1 200 OK\r\nbad name: x\r\n\r\n",
        "HTTP/1.1 20 OK\r\n\r\n",
    ] {
        assert!(matches!(parse(bad.as_bytes()).0, Err(CodecError::Head(_))), "{bad:?}");
    }
}

#[test]
fn oversized_heads_are_errors() {
    let big = "x".repeat(70 * 1024);
    // Still incomplete, but already too large.
    let partial = format!("HTTP/1.1 200 OK\r\nx-big: {big}");
    assert_eq!(parse(partial.as_bytes()).0.unwrap_err(), CodecError::HeadTooLarge);
    let complete = format!("HTTP/1.1 200 OK\r\nx-big: {big}\r\n\r\n");
    assert_eq!(parse(complete.as_bytes()).0.unwrap_err(), CodecError::HeadTooLarge);
    // More headers than the first attempt makes room for, fewer than the limit.
    let some: String = (0..60).map(|i| format!("x-{i}: v{i}\r\n")).collect();
    let head =
        parse(format!("HTTP/1.1 200 OK\r\n{some}content-length: 0\r\n\r\n").as_bytes()).0.unwrap().unwrap();
    assert_eq!((head.headers.len(), head.headers["x-59"].to_str().unwrap()), (61, "v59"));
    let many: String = (0..101).map(|i| format!("x-{i}: v\r\n")).collect();
    let (head, _) = parse(format!("HTTP/1.1 200 OK\r\n{many}\r\n").as_bytes());
    assert_eq!(head.unwrap_err(), CodecError::Head(httparse::Error::TooManyHeaders));
}

#[test]
fn chunked_bodies_with_extensions_and_trailers() {
    let input = b"5;ext=1\r\nhello\r\n6 ; a=b\r\n world\r\nA\r\n0123456789\r\n0\r\ntrailer: x\r\n\r\nNEXT";
    let (body, done, rest) = decode(Framing::Chunked, input, &[], false).unwrap();
    assert_eq!(body, b"hello world0123456789");
    assert!(done);
    assert_eq!(rest, b"NEXT", "bytes after the body are left alone");
    // Bare LF line ends are accepted.
    let (body, done, _) = decode(Framing::Chunked, b"3\nabc\n0\n\n", &[], false).unwrap();
    assert_eq!((body.as_slice(), done), (&b"abc"[..], true));
}

#[test]
fn malformed_chunks_are_errors() {
    let long_line = "0".repeat(5000);
    for (input, error) in [
        ("x\r\n", CodecError::InvalidChunkSize),
        ("\r\n", CodecError::InvalidChunkSize),
        ("5 x\r\nhello\r\n", CodecError::InvalidChunkSize),
        ("-5\r\n", CodecError::InvalidChunkSize),
        ("11111111111111111\r\n", CodecError::InvalidChunkSize),
        ("5\r\nhelloXX", CodecError::InvalidChunkEnd),
        ("5\r\nhello\rX", CodecError::InvalidChunkEnd),
        (long_line.as_str(), CodecError::InvalidChunkSize),
    ] {
        assert_eq!(
            decode(Framing::Chunked, input.as_bytes(), &[], false).unwrap_err(),
            error,
            "{input:.40?}"
        );
    }
    let trailers = format!("0\r\n{}", "t: x\r\n".repeat(12_000));
    assert_eq!(
        decode(Framing::Chunked, trailers.as_bytes(), &[], false).unwrap_err(),
        CodecError::TrailersTooLarge
    );
}

#[test]
fn end_of_input_ends_only_a_body_that_runs_until_close() {
    let (body, done, _) = decode(Framing::Close, b"all of it", &[3], true).unwrap();
    assert_eq!((body.as_slice(), done), (&b"all of it"[..], true));
    assert_eq!(decode(Framing::Length(10), b"short", &[], true).unwrap_err(), CodecError::UnexpectedEof);
    assert_eq!(decode(Framing::Chunked, b"5\r\nhel", &[], true).unwrap_err(), CodecError::UnexpectedEof);
    let (body, done, _) = decode(Framing::Length(4), b"abcd", &[], true).unwrap();
    assert_eq!((body.as_slice(), done), (&b"abcd"[..], true));
}

fn request<'a>(headers: &'a HeaderMap, host: &'a HeaderValue, body: &'static str) -> UpstreamRequest<'a> {
    UpstreamRequest {
        method: Method::POST,
        uri: "/v1/chat/completions?x=1".parse().unwrap(),
        host,
        headers,
        extra: None,
        body: Bytes::from_static(body.as_bytes()),
    }
}

#[test]
fn request_head_is_one_flat_block_without_hop_by_hop_headers() {
    let host = HeaderValue::from_static("127.0.0.1:8000");
    let mut headers = HeaderMap::new();
    headers.insert("host", HeaderValue::from_static("ilb.example"));
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert("content-length", HeaderValue::from_static("999"));
    headers.insert("transfer-encoding", HeaderValue::from_static("chunked"));
    headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
    headers.insert("connection", HeaderValue::from_static("x-secret, Upgrade"));
    headers.insert("x-secret", HeaderValue::from_static("1"));
    headers.append("x-multi", HeaderValue::from_static("a"));
    headers.append("x-multi", HeaderValue::from_static("b"));
    let mut upstream = request(&headers, &host, "{}");
    upstream.extra = Some((HeaderName::from_static("traceparent"), b"00-1-2-01"));
    let mut out = b"left".to_vec();
    encode_request_head(&mut out, &upstream);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "leftPOST /v1/chat/completions?x=1 HTTP/1.1\r\ncontent-type: application/json\r\n\
         x-multi: a\r\nx-multi: b\r\n\
         host: 127.0.0.1:8000\r\ntraceparent: 00-1-2-01\r\ncontent-length: 2\r\n\r\n"
    );
    let empty = HeaderMap::new();
    let mut zero = Vec::new();
    encode_request_head(&mut zero, &request(&empty, &host, ""));
    assert_eq!(
        zero,
        b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: 127.0.0.1:8000\r\ncontent-length: 0\r\n\r\n"
    );
}

#[test]
fn response_hop_by_hop_headers_are_removed() {
    let (head, _) = parse(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: x-engine-hop\r\nx-engine-hop: 1\r\n\
          keep-alive: timeout=5\r\nupgrade: h2c\r\ncontent-type: text/event-stream\r\n\r\n",
    );
    let head = head.unwrap().unwrap();
    assert_eq!(head.framing, Framing::Chunked, "framing is read before the headers go");
    let names: Vec<&str> = head.headers.keys().map(|n| n.as_str()).collect();
    assert_eq!(names, ["content-type"]);
}

fn chunked(chunks: &[Vec<u8>], extensions: bool, upper: bool, trailers: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in chunks {
        let size = if upper { format!("{:X}", chunk.len()) } else { format!("{:x}", chunk.len()) };
        out.extend_from_slice(size.as_bytes());
        if extensions {
            out.extend_from_slice(b";name=\"v\"");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(chunk);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n");
    if trailers {
        out.extend_from_slice(b"x-checksum: 1\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

proptest! {
    #![proptest_config(ProptestConfig { rng_seed: RngSeed::Fixed(7), ..ProptestConfig::default() })]

    /// However the bytes are split across reads, the decoded body is the same, ends at the
    /// terminating chunk, and leaves what follows alone.
    #[test]
    fn chunked_decoding_is_independent_of_splits(
        chunks in vec(vec(any::<u8>(), 1..40), 0..6),
        extensions: bool,
        upper: bool,
        trailers: bool,
    ) {
        let mut input = chunked(&chunks, extensions, upper, trailers);
        let body_len = input.len();
        input.extend_from_slice(b"NEXT");
        let expected: Vec<u8> = chunks.concat();
        for split in 0..=body_len {
            let (body, done, rest) = decode(Framing::Chunked, &input, &[split], false).unwrap();
            prop_assert_eq!(&body, &expected, "split at {}", split);
            prop_assert!(done);
            prop_assert_eq!(rest, b"NEXT".to_vec());
        }
        let every_byte: Vec<usize> = (1..input.len()).collect();
        let (body, done, _) = decode(Framing::Chunked, &input, &every_byte, false).unwrap();
        prop_assert_eq!(body, expected);
        prop_assert!(done);
    }

    #[test]
    fn length_decoding_is_independent_of_splits(body in vec(any::<u8>(), 1..100), split in 0usize..100) {
        let mut input = body.clone();
        input.extend_from_slice(b"NEXT");
        let framing = Framing::Length(body.len() as u64);
        let (decoded, done, rest) = decode(framing, &input, &[split.min(input.len())], false).unwrap();
        prop_assert_eq!(decoded, body);
        prop_assert!(done);
        prop_assert_eq!(rest, b"NEXT".to_vec());
    }

    /// Whatever an engine sends, parsing and decoding return a value or an error.
    #[test]
    fn arbitrary_input_never_panics(bytes in vec(any::<u8>(), 0..300)) {
        let mut with_head = b"HTTP/1.1 200 OK\r\n".to_vec();
        with_head.extend_from_slice(&bytes);
        let _ = parse(&bytes);
        let _ = parse(&with_head);
        for framing in [Framing::Chunked, Framing::Length(50), Framing::Close] {
            let _ = decode(framing, &bytes, &[bytes.len() / 2], true);
        }
    }
}
