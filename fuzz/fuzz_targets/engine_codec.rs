//! Fuzz target: the data plane's engine response codec (`ilb_dataplane::upstream::codec`), which
//! reads whatever bytes an engine's address sends back: response heads (interim 1xx included),
//! framing headers, chunked, length and close-delimited bodies.
//!
//! The first two input bytes choose where the rest is split; the response is decoded whole and
//! in those pieces. Checks: no panic; a length body ends with exactly its length; the decoder
//! never hands out an empty piece; and the outcome (head, body, or refusal) is the same however
//! the input is split.

#![no_main]

use bytes::BytesMut;
use ilb_dataplane::upstream::codec::{parse_head, BodyDecoder, Decoded, Framing};
use libfuzzer_sys::fuzz_target;

/// Status, header count, framing, body, or `None` when the codec refused the bytes.
type Outcome = Option<(u16, usize, Framing, Vec<u8>)>;

fn decode(input: &[u8], pieces: &[usize]) -> Outcome {
    let mut ends: Vec<usize> = pieces.iter().map(|&p| p.min(input.len())).collect();
    ends.push(input.len());
    let mut at = 0;
    let mut next = ends.into_iter().map(|end| {
        let piece = &input[at..end.max(at)];
        at = end.max(at);
        piece
    });
    let mut buf = BytesMut::new();
    let head = loop {
        match parse_head(&mut buf) {
            Ok(Some(head)) => break head,
            Ok(None) => buf.extend_from_slice(next.next()?),
            Err(_) => return None,
        }
    };
    let mut decoder = BodyDecoder::new(head.framing);
    let mut body = Vec::new();
    loop {
        match decoder.decode(&mut buf).ok()? {
            Decoded::Data(data) => {
                assert!(!data.is_empty(), "empty body piece");
                body.extend_from_slice(&data);
            }
            Decoded::Done => break,
            Decoded::NeedMore => match next.next() {
                Some(piece) => buf.extend_from_slice(piece),
                None => {
                    decoder.eof().ok()?;
                    break;
                }
            },
        }
    }
    if let Framing::Length(n) = head.framing {
        assert_eq!(body.len() as u64, n, "a length body ends with its length");
    }
    Some((head.status.as_u16(), head.headers.len(), head.framing, body))
}

fuzz_target!(|data: &[u8]| {
    let [a, b, rest @ ..] = data else { return };
    let whole = decode(rest, &[]);
    let split = decode(rest, &[usize::from(*a), usize::from(*a) + usize::from(*b)]);
    let bytewise: Vec<usize> = (0..rest.len().min(512)).collect();
    assert_eq!(whole, split, "the split changed the outcome");
    assert_eq!(whole, decode(rest, &bytewise), "byte-by-byte feeding changed the outcome");
});
