//! The engine side's HTTP/1.1 wire format, without I/O: request heads out, response heads and
//! bodies (content-length, chunked, or until close) in.
//!
//! Everything here works on a `BytesMut` read buffer the caller fills, so it can be tested on
//! any split of the input. Response header values and body chunks are slices of that buffer
//! (no copy). Every malformed or oversized input is an error, never a panic.

use super::UpstreamRequest;
use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{StatusCode, Version};

/// Largest response head accepted (status line and headers, interim responses excluded).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most headers in one response head (hyper's default too).
const MAX_HEADERS: usize = 100;
/// Longest chunk-size line, extensions included.
const MAX_CHUNK_LINE: usize = 4096;
/// Most bytes of trailers after the last chunk (they are read and dropped).
const MAX_TRAILER_BYTES: usize = 64 * 1024;

/// Why an engine's response could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("response head larger than {MAX_HEAD_BYTES} bytes")]
    HeadTooLarge,
    #[error("malformed response head: {0}")]
    Head(httparse::Error),
    #[error("unexpected status {0}")]
    UnexpectedStatus(u16),
    #[error("invalid header in response head")]
    InvalidHeader,
    #[error("invalid content-length")]
    InvalidContentLength,
    #[error("malformed chunk size line")]
    InvalidChunkSize,
    #[error("chunk data not followed by CRLF")]
    InvalidChunkEnd,
    #[error("chunk trailers larger than {MAX_TRAILER_BYTES} bytes")]
    TrailersTooLarge,
    #[error("connection closed before the response ended")]
    UnexpectedEof,
}

/// How the body of a response is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    Length(u64),
    Chunked,
    /// Neither length nor chunked: the body runs until the engine closes the connection.
    Close,
}

/// A final (non-1xx) response head, its hop-by-hop headers removed.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub framing: Framing,
    /// Whether the connection may carry another request once this body has ended.
    pub keep_alive: bool,
}

/// Appends the head of `request` to `out`: request line, the client's headers except hop-by-hop
/// ones (RFC 9110 §7.6.1: the fixed list and any header the `Connection` header names), `Host`
/// and `Content-Length`, then the engine's `Host`, any extra header, and the body's length.
/// Copies the client's headers straight to the wire: no header map is cloned. Hot path.
pub fn encode_request_head(out: &mut Vec<u8>, request: &UpstreamRequest<'_>) {
    let target = request.uri.path_and_query().map_or("/", |pq| pq.as_str());
    out.extend_from_slice(request.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let named = connection_named(request.headers);
    for (name, value) in request.headers {
        // `Expect: 100-continue` asked the data plane, which has read the whole body by now.
        let replaced = name == header::HOST || name == header::CONTENT_LENGTH || name == header::EXPECT;
        if replaced || is_hop_by_hop(name) || named.contains(name) {
            continue;
        }
        push_header(out, name, value);
    }
    push_header(out, &header::HOST, request.host);
    if let Some((name, value)) = &request.extra {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"content-length: ");
    push_decimal(out, request.body.len() as u64);
    out.extend_from_slice(b"\r\n\r\n");
}

fn push_header(out: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    out.extend_from_slice(name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Headers that describe one hop, never forwarded in either direction (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Whether `name` is in the fixed hop-by-hop list (a string match: no hashing). Hot path.
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// The headers a message's `Connection` header names (hop-by-hop too). Allocates only when
/// there is a `Connection` header.
fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .filter_map(|token| HeaderName::from_bytes(token.trim_ascii()).ok())
        .collect()
}

fn push_decimal(out: &mut Vec<u8>, mut value: u64) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[start..]);
}

/// Parses the response head at the front of `buf`, skipping (and removing) interim 1xx
/// responses. `Ok(None)`: the head is not complete yet (what arrived stays in `buf`). On
/// success the head is removed from `buf`, which then starts with the body. Hot path.
pub fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, CodecError> {
    loop {
        // Engines send a handful of headers: parse with few slots to set up, retry with all.
        let parsed = match parse_one::<FEW_HEADERS>(buf) {
            Err(CodecError::Head(httparse::Error::TooManyHeaders)) => parse_one::<MAX_HEADERS>(buf),
            parsed => parsed,
        };
        match parsed? {
            Parsed::Partial => return Ok(None),
            Parsed::Interim => continue,
            Parsed::Final(head) => return Ok(Some(head)),
        }
    }
}

/// Headers the first parse attempt makes room for.
const FEW_HEADERS: usize = 16;

enum Parsed {
    Partial,
    /// A 1xx response was removed from the buffer.
    Interim,
    Final(Head),
}

/// One response head with room for `N` headers.
fn parse_one<const N: usize>(buf: &mut BytesMut) -> Result<Parsed, CodecError> {
    // Offsets of names and values into `buf`, so that values can be sliced out of the frozen
    // head without a copy once the parser's borrow of `buf` has ended.
    let mut spans = [(0u32, 0u32, 0u32, 0u32); N];
    let mut slots = [httparse::EMPTY_HEADER; N];
    let mut response = httparse::Response::new(&mut slots);
    let head_len = match response.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD_BYTES => return Err(CodecError::HeadTooLarge),
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(e) => return Err(CodecError::Head(e)),
    };
    if head_len > MAX_HEAD_BYTES {
        return Err(CodecError::HeadTooLarge);
    }
    let code = response.code.unwrap_or_default();
    if (100..200).contains(&code) {
        // 101 would switch protocols, which ilb never asks for.
        if code == 101 {
            return Err(CodecError::UnexpectedStatus(code));
        }
        buf.advance(head_len);
        return Ok(Parsed::Interim);
    }
    let status = StatusCode::from_u16(code).map_err(|_| CodecError::UnexpectedStatus(code))?;
    let version = if response.version == Some(0) { Version::HTTP_10 } else { Version::HTTP_11 };
    let base = buf.as_ptr() as usize;
    let n_headers = response.headers.len();
    // httparse hands out slices of `buf` (empty values too); checked all the same, so that a
    // slice from elsewhere is an error rather than a wrong offset. The head is below 64 KiB.
    let offset = |part: &[u8]| {
        (part.as_ptr() as usize)
            .checked_sub(base)
            .filter(|&at| at + part.len() <= head_len)
            .map(|at| at as u32)
    };
    for (span, h) in spans.iter_mut().zip(response.headers.iter()) {
        let (Some(name_at), Some(value_at)) = (offset(h.name.as_bytes()), offset(h.value)) else {
            return Err(CodecError::InvalidHeader);
        };
        *span = (name_at, h.name.len() as u32, value_at, h.value.len() as u32);
    }
    let head = buf.split_to(head_len).freeze();
    // Room for the header the proxy adds (`x-ilb-route`): a full map would grow for it.
    let mut headers = HeaderMap::with_capacity(n_headers + 1);
    let mut seen = Seen::default();
    for &(name_at, name_len, value_at, value_len) in &spans[..n_headers] {
        let (name_at, value_at) = (name_at as usize, value_at as usize);
        let name = HeaderName::from_bytes(&head[name_at..name_at + name_len as usize])
            .map_err(|_| CodecError::InvalidHeader)?;
        let value = HeaderValue::from_maybe_shared(head.slice(value_at..value_at + value_len as usize))
            .map_err(|_| CodecError::InvalidHeader)?;
        seen.note(&name);
        headers.append(name, value);
    }
    let (framing, ambiguous) = framing(status, &headers, &seen)?;
    let keep_alive = version == Version::HTTP_11
        && framing != Framing::Close
        && !ambiguous
        && !(seen.connection && has_token(&headers, &header::CONNECTION, "close"));
    if seen.hop_by_hop {
        for name in connection_named(&headers).iter().chain(&HOP_BY_HOP) {
            headers.remove(name);
        }
    }
    Ok(Parsed::Final(Head { status, version, headers, framing, keep_alive }))
}

/// Which headers that matter to framing and reuse a head holds, noted while it is built so
/// that absent ones cost no map lookup.
#[derive(Default)]
struct Seen {
    content_length: bool,
    transfer_encoding: bool,
    connection: bool,
    hop_by_hop: bool,
}

impl Seen {
    fn note(&mut self, name: &HeaderName) {
        self.content_length |= name == header::CONTENT_LENGTH;
        self.transfer_encoding |= name == header::TRANSFER_ENCODING;
        self.connection |= name == header::CONNECTION;
        self.hop_by_hop |= is_hop_by_hop(name);
    }
}

/// The body framing (RFC 9112 §6.3) and whether the head sent both length and chunked (then
/// chunked wins and the connection is not reused, as the RFC asks of such messages).
fn framing(status: StatusCode, headers: &HeaderMap, seen: &Seen) -> Result<(Framing, bool), CodecError> {
    if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok((Framing::Length(0), false));
    }
    let has_length = seen.content_length;
    if seen.transfer_encoding {
        // Only a final `chunked` delimits the body; any other coding runs until close.
        let last = headers
            .get_all(header::TRANSFER_ENCODING)
            .iter()
            .next_back()
            .and_then(|v| v.as_bytes().rsplit(|&b| b == b',').next())
            .map(|coding| coding.trim_ascii());
        let framing = match last {
            Some(coding) if coding.eq_ignore_ascii_case(b"chunked") => Framing::Chunked,
            _ => Framing::Close,
        };
        return Ok((framing, has_length));
    }
    if !has_length {
        return Ok((Framing::Close, false));
    }
    // Repeated values (in one header or several) must agree.
    let mut length: Option<u64> = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        for part in value.as_bytes().split(|&b| b == b',') {
            let part = part.trim_ascii();
            if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
                return Err(CodecError::InvalidContentLength);
            }
            let parsed = std::str::from_utf8(part)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or(CodecError::InvalidContentLength)?;
            if length.is_some_and(|l| l != parsed) {
                return Err(CodecError::InvalidContentLength);
            }
            length = Some(parsed);
        }
    }
    Ok((Framing::Length(length.ok_or(CodecError::InvalidContentLength)?), false))
}

/// Whether a comma-separated header lists `token` (case-insensitive).
fn has_token(headers: &HeaderMap, name: &HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.as_bytes().split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
    })
}

/// One step of body decoding.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Body bytes (never empty).
    Data(Bytes),
    /// The buffer holds no more body; read more (or call [`BodyDecoder::eof`] on end of input).
    NeedMore,
    /// The body ended; anything left in the buffer is not part of it.
    Done,
}

/// Incremental body decoder: hands out body bytes as soon as they are in the buffer.
#[derive(Clone, Debug)]
pub struct BodyDecoder {
    state: State,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Length(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkDataEnd,
    Trailers(usize),
    Close,
    Done,
}

impl BodyDecoder {
    pub fn new(framing: Framing) -> BodyDecoder {
        let state = match framing {
            Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::ChunkSize,
            Framing::Close => State::Close,
        };
        BodyDecoder { state }
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Body bytes still to come, when known.
    pub fn remaining(&self) -> Option<u64> {
        match self.state {
            State::Length(n) => Some(n),
            State::Done => Some(0),
            _ => None,
        }
    }

    /// Takes the next body bytes from the front of `buf`. Hot path.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, CodecError> {
        loop {
            match self.state {
                State::Done => return Ok(Decoded::Done),
                State::Length(_) | State::ChunkData(_) | State::Close if buf.is_empty() => {
                    return Ok(Decoded::NeedMore)
                }
                State::Length(remaining) => {
                    let n = remaining.min(buf.len() as u64);
                    self.state = if n == remaining { State::Done } else { State::Length(remaining - n) };
                    return Ok(Decoded::Data(buf.split_to(n as usize).freeze()));
                }
                State::Close => return Ok(Decoded::Data(buf.split().freeze())),
                State::ChunkData(remaining) => {
                    let n = remaining.min(buf.len() as u64);
                    self.state =
                        if n == remaining { State::ChunkDataEnd } else { State::ChunkData(remaining - n) };
                    return Ok(Decoded::Data(buf.split_to(n as usize).freeze()));
                }
                State::ChunkSize => {
                    let Some(line_len) = line_length(buf, MAX_CHUNK_LINE, CodecError::InvalidChunkSize)?
                    else {
                        return Ok(Decoded::NeedMore);
                    };
                    let size = parse_chunk_size(strip_cr(&buf[..line_len - 1]))?;
                    buf.advance(line_len);
                    self.state = if size == 0 { State::Trailers(0) } else { State::ChunkData(size) };
                }
                State::ChunkDataEnd => match buf.first() {
                    None => return Ok(Decoded::NeedMore),
                    Some(b'\n') => {
                        buf.advance(1);
                        self.state = State::ChunkSize;
                    }
                    Some(b'\r') if buf.len() < 2 => return Ok(Decoded::NeedMore),
                    Some(b'\r') if buf[1] == b'\n' => {
                        buf.advance(2);
                        self.state = State::ChunkSize;
                    }
                    Some(_) => return Err(CodecError::InvalidChunkEnd),
                },
                State::Trailers(seen) => {
                    let limit = MAX_TRAILER_BYTES - seen;
                    let Some(line_len) = line_length(buf, limit, CodecError::TrailersTooLarge)? else {
                        return Ok(Decoded::NeedMore);
                    };
                    let empty = strip_cr(&buf[..line_len - 1]).is_empty();
                    buf.advance(line_len);
                    self.state = if empty { State::Done } else { State::Trailers(seen + line_len) };
                }
            }
        }
    }

    /// The connection reached end of input: the body ends here if it runs until close.
    pub fn eof(&mut self) -> Result<(), CodecError> {
        match self.state {
            State::Close | State::Done => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err(CodecError::UnexpectedEof),
        }
    }
}

/// Length of the first line of `buf` including its `\n`; `Ok(None)` if incomplete, `too_long`
/// once `limit` bytes hold no line end.
fn line_length(buf: &[u8], limit: usize, too_long: CodecError) -> Result<Option<usize>, CodecError> {
    match buf.iter().take(limit).position(|&b| b == b'\n') {
        Some(at) => Ok(Some(at + 1)),
        None if buf.len() >= limit => Err(too_long),
        None => Ok(None),
    }
}

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// `1*HEXDIG [ BWS ; extensions ]`; extensions are ignored.
fn parse_chunk_size(line: &[u8]) -> Result<u64, CodecError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 16 {
        return Err(CodecError::InvalidChunkSize);
    }
    let rest = line[digits..].trim_ascii_start();
    if !rest.is_empty() && rest[0] != b';' {
        return Err(CodecError::InvalidChunkSize);
    }
    // At most 16 hex digits: fits in a u64.
    let size = line[..digits]
        .iter()
        .fold(0u64, |acc, &b| (acc << 4) | u64::from(char::from(b).to_digit(16).unwrap_or(0)));
    Ok(size)
}
