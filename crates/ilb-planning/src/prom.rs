//! A bounded, zero-copy parser for the Prometheus text exposition format (0.0.4), tolerant of
//! the OpenMetrics additions engines emit (`# UNIT`, `# EOF`, `_created` samples, float-second
//! timestamps, exemplars after `#`).
//!
//! Why hand-written rather than a crate: `prometheus-parse` 0.2 (the common choice) matches
//! names with `\w+`, so it cannot read `vllm:num_requests_running` at all; it splits labels
//! on `,` and `=` without honouring quotes or escapes, and pulls in regex and chrono.
//! `openmetrics-parser` is strict OpenMetrics (rejects plain 0.0.4 dumps) and LGPL. The format
//! is small enough that a byte scanner of ~250 lines is easier to make robust and bounded.
//!
//! Robustness: the input is untrusted. Nothing here panics or indexes out of bounds; the input
//! size and the number of series are capped ([`Limits`]); a malformed line is skipped and
//! counted (`invalid_lines`, first one kept for diagnostics) rather than failing the whole
//! scrape, so one odd metric from an engine does not blind the control plane to the rest.
//! Names and label values borrow from the input; only values containing escapes allocate.

use std::borrow::Cow;
use std::collections::HashMap;

/// Hard bounds on one exposition. Exceeding them fails the parse (the scrape is then recorded
/// as failed), since a response that large is itself a sign of a misbehaving target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted body, bytes. Default 16 MiB (a busy vLLM dump is ~100 KiB).
    pub max_bytes: usize,
    /// Largest number of samples plus `# TYPE` entries. Default 200,000.
    pub max_series: usize,
    /// Largest number of labels on one sample; longer lines are skipped as invalid. Default 64.
    pub max_labels: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_bytes: 16 << 20, max_series: 200_000, max_labels: 64 }
    }
}

/// The declared type of a metric family. OpenMetrics-only types (info, stateset,
/// gaugehistogram, unknown) read as `Untyped`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
    Summary,
    Untyped,
}

/// One label pair. The value is unescaped (`\\`, `\"`, `\n`), borrowed when it had no escapes.
#[derive(Clone, Debug, PartialEq)]
pub struct Label<'a> {
    pub name: &'a str,
    pub value: Cow<'a, str>,
}

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample<'a> {
    /// The full sample name, including any `_bucket`, `_sum`, `_count`, `_total` suffix.
    pub name: &'a str,
    pub labels: Vec<Label<'a>>,
    /// May be NaN or ±infinity, as the format allows.
    pub value: f64,
    /// Milliseconds since the Unix epoch, when the line carried a timestamp.
    pub timestamp_ms: Option<i64>,
}

impl Sample<'_> {
    /// The value of label `name`, if present.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|label| label.name == name).map(|label| label.value.as_ref())
    }
}

/// A malformed line that was skipped.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct LineError {
    /// 1-based line number.
    pub line: usize,
    pub reason: &'static str,
}

/// Why a whole exposition was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("exposition of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    #[error("exposition has more than {limit} series")]
    TooManySeries { limit: usize },
    #[error("exposition is not valid utf-8")]
    NotUtf8,
}

/// A parsed exposition: samples in input order, plus the declared family types.
#[derive(Clone, Debug, Default)]
pub struct Exposition<'a> {
    pub samples: Vec<Sample<'a>>,
    types: HashMap<&'a str, MetricType>,
    /// Number of malformed lines skipped.
    pub invalid_lines: usize,
    /// The first malformed line, for diagnostics.
    pub first_invalid: Option<LineError>,
}

impl Exposition<'_> {
    /// The declared type of the family a sample name belongs to (`foo_bucket` → `foo`'s type).
    pub fn metric_type(&self, sample_name: &str) -> MetricType {
        if let Some(found) = self.types.get(sample_name) {
            return *found;
        }
        const SUFFIXES: [&str; 8] =
            ["_bucket", "_sum", "_count", "_total", "_created", "_gsum", "_gcount", "_info"];
        SUFFIXES
            .iter()
            .filter_map(|suffix| sample_name.strip_suffix(suffix))
            .find_map(|family| self.types.get(family).copied())
            .unwrap_or(MetricType::Untyped)
    }
}

/// Parses raw bytes: checks the size bound before decoding, then [`parse`].
pub fn parse_bytes<'a>(bytes: &'a [u8], limits: &Limits) -> Result<Exposition<'a>, ParseError> {
    if bytes.len() > limits.max_bytes {
        return Err(ParseError::TooLarge { size: bytes.len(), limit: limits.max_bytes });
    }
    let text = std::str::from_utf8(bytes).map_err(|_| ParseError::NotUtf8)?;
    parse(text, limits)
}

/// Parses one text exposition. Malformed lines are skipped and counted; only exceeding a
/// [`Limits`] bound fails.
pub fn parse<'a>(text: &'a str, limits: &Limits) -> Result<Exposition<'a>, ParseError> {
    if text.len() > limits.max_bytes {
        return Err(ParseError::TooLarge { size: text.len(), limit: limits.max_bytes });
    }
    let mut out = Exposition::default();
    for (line_idx, raw_line) in text.split('\n').enumerate() {
        let line = raw_line.strip_suffix('\r').unwrap_or(raw_line).trim_start_matches([' ', '\t']);
        if line.is_empty() {
            continue;
        }
        let result = if let Some(comment) = line.strip_prefix('#') {
            match parse_comment(comment) {
                Comment::Eof => break,
                Comment::Type(name, metric_type) => {
                    out.types.insert(name, metric_type);
                    Ok(())
                }
                Comment::Other => Ok(()),
                Comment::Invalid(reason) => Err(reason),
            }
        } else {
            parse_sample(line, limits).map(|sample| out.samples.push(sample))
        };
        if let Err(reason) = result {
            out.invalid_lines += 1;
            if out.first_invalid.is_none() {
                out.first_invalid = Some(LineError { line: line_idx + 1, reason });
            }
        }
        if out.samples.len() + out.types.len() > limits.max_series {
            return Err(ParseError::TooManySeries { limit: limits.max_series });
        }
    }
    Ok(out)
}

enum Comment<'a> {
    Eof,
    Type(&'a str, MetricType),
    Other,
    Invalid(&'static str),
}

fn parse_comment(comment: &str) -> Comment<'_> {
    let mut tokens = comment.split([' ', '\t']).filter(|token| !token.is_empty());
    match tokens.next() {
        Some("EOF") => Comment::Eof,
        Some("TYPE") => {
            let (Some(name), Some(kind)) = (tokens.next(), tokens.next()) else {
                return Comment::Invalid("incomplete TYPE line");
            };
            if !is_metric_name(name) {
                return Comment::Invalid("invalid metric name in TYPE line");
            }
            let metric_type = match kind {
                "counter" => MetricType::Counter,
                "gauge" => MetricType::Gauge,
                "histogram" => MetricType::Histogram,
                "summary" => MetricType::Summary,
                _ => MetricType::Untyped,
            };
            Comment::Type(name, metric_type)
        }
        // HELP, UNIT and free-form comments carry nothing the control plane uses.
        _ => Comment::Other,
    }
}

fn is_name_start(byte: u8) -> bool {
    byte.is_ascii_alphabetic() || byte == b'_' || byte == b':'
}

fn is_name_char(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_' || byte == b':'
}

fn is_metric_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty() && is_name_start(bytes[0]) && bytes.iter().all(|b| is_name_char(*b))
}

/// Byte cursor over one line. Every index it slices at is just before or after an ASCII
/// delimiter, so slices always fall on char boundaries.
struct Cursor<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn skip_blanks(&mut self) -> usize {
        let start = self.pos;
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
        self.pos - start
    }

    fn take_while(&mut self, keep: impl Fn(u8) -> bool) -> &'a str {
        let start = self.pos;
        while self.peek().is_some_and(&keep) {
            self.pos += 1;
        }
        self.text.get(start..self.pos).unwrap_or("")
    }

    fn expect(&mut self, byte: u8, reason: &'static str) -> Result<(), &'static str> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(reason)
        }
    }
}

fn parse_sample<'a>(line: &'a str, limits: &Limits) -> Result<Sample<'a>, &'static str> {
    let mut cursor = Cursor { text: line, pos: 0 };
    if !cursor.peek().is_some_and(is_name_start) {
        return Err("invalid metric name");
    }
    let name = cursor.take_while(is_name_char);
    let after_name = cursor.pos;
    cursor.skip_blanks();
    let mut labels = Vec::new();
    if cursor.peek() == Some(b'{') {
        cursor.pos += 1;
        parse_labels(&mut cursor, &mut labels, limits.max_labels)?;
    } else {
        // No label set: the blanks just skipped are the separator before the value.
        cursor.pos = after_name;
    }
    if cursor.skip_blanks() == 0 {
        return Err("missing value");
    }
    let value_token = cursor.take_while(|b| b != b' ' && b != b'\t');
    let value = value_token.parse::<f64>().map_err(|_| "invalid sample value")?;
    cursor.skip_blanks();
    let mut timestamp_ms = None;
    if cursor.peek().is_some_and(|b| b != b'#') {
        let token = cursor.take_while(|b| b != b' ' && b != b'\t');
        timestamp_ms = Some(parse_timestamp(token).ok_or("invalid timestamp")?);
        cursor.skip_blanks();
    }
    // Anything left must be an OpenMetrics exemplar (`# {...} value`), which is ignored.
    if cursor.peek().is_some_and(|b| b != b'#') {
        return Err("trailing garbage after sample");
    }
    Ok(Sample { name, labels, value, timestamp_ms })
}

/// 0.0.4 timestamps are integer milliseconds; OpenMetrics ones are float seconds.
fn parse_timestamp(token: &str) -> Option<i64> {
    if let Ok(ms) = token.parse::<i64>() {
        return Some(ms);
    }
    let seconds = token.parse::<f64>().ok().filter(|s| s.is_finite())?;
    let ms = (seconds * 1000.0).round();
    // `as` saturates; the explicit range check keeps absurd values out instead.
    (ms.abs() < 9.0e18).then_some(ms as i64)
}

fn parse_labels<'a>(
    cursor: &mut Cursor<'a>,
    labels: &mut Vec<Label<'a>>,
    max_labels: usize,
) -> Result<(), &'static str> {
    loop {
        cursor.skip_blanks();
        if cursor.peek() == Some(b'}') {
            cursor.pos += 1;
            return Ok(());
        }
        if !cursor.peek().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_') {
            return Err("invalid label name");
        }
        let name = cursor.take_while(|b| b.is_ascii_alphanumeric() || b == b'_');
        cursor.skip_blanks();
        cursor.expect(b'=', "expected '=' after label name")?;
        cursor.skip_blanks();
        cursor.expect(b'"', "expected '\"' to open label value")?;
        let value = parse_label_value(cursor)?;
        if labels.iter().any(|label| label.name == name) {
            return Err("duplicate label name");
        }
        if labels.len() >= max_labels {
            return Err("too many labels");
        }
        labels.push(Label { name, value });
        cursor.skip_blanks();
        match cursor.peek() {
            Some(b',') => cursor.pos += 1,
            Some(b'}') => {
                cursor.pos += 1;
                return Ok(());
            }
            _ => return Err("expected ',' or '}' after label value"),
        }
    }
}

/// Reads up to and including the closing quote; the opening quote is already consumed.
fn parse_label_value<'a>(cursor: &mut Cursor<'a>) -> Result<Cow<'a, str>, &'static str> {
    let start = cursor.pos;
    let mut has_escape = false;
    loop {
        match cursor.peek() {
            None => return Err("unterminated label value"),
            Some(b'"') => break,
            Some(b'\\') => {
                has_escape = true;
                // Skipping two bytes may land inside a multi-byte char; that is harmless
                // because continuation bytes never equal '"' or '\\', and we only slice
                // at the closing quote.
                cursor.pos += 2;
            }
            Some(_) => cursor.pos += 1,
        }
    }
    let raw = cursor.text.get(start..cursor.pos).ok_or("invalid label value")?;
    cursor.pos += 1;
    Ok(if has_escape { Cow::Owned(unescape(raw)) } else { Cow::Borrowed(raw) })
}

/// Undoes the three escapes the format defines; an unknown escape is kept as written.
fn unescape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            Some('n') => out.push('\n'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}
