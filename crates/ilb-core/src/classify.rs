//! Classification: what a request is (model, stream, affinity material) and what it asks for
//! (constraints; its priority is [`crate::priority`]), read from its body and headers without
//! copying the body.
//!
//! The body is parsed once with borrowing serde types: unknown fields are skipped, message
//! contents are kept as raw JSON slices of the original body. Malformed input is an error,
//! never a panic (a fuzz target exercises this).

use serde::de::{Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

/// Bytes of a completion prompt that make up its affinity prefix.
pub const PROMPT_PREFIX_BYTES: usize = 1024;
/// Most constraint tags one request may name.
pub const MAX_REQUIRE_TAGS: usize = 16;

/// Engine paths outside `/v1/` that are routed by their body's `model` like the OpenAI ones
/// (vLLM's and SGLang's tokenizer and pooling endpoints).
pub const ROOT_INFERENCE_PATHS: [&str; 6] =
    ["/tokenize", "/detokenize", "/rerank", "/score", "/classify", "/pooling"];

/// What kind of inference request a `POST` is, which decides where its affinity material is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    Embeddings,
    /// The Responses API (`/v1/responses`): `instructions` and `input`, and
    /// `previous_response_id` naming a response an engine stored.
    Responses,
    /// Any other inference path routed by its `model`: `/v1/messages`, `/v1/rerank`,
    /// `/v1/score`, `/v1/audio/transcriptions`, [`ROOT_INFERENCE_PATHS`], …
    Other,
}

impl Endpoint {
    /// The endpoint a `POST` to `path` is, or `None` for a path the data plane does not route
    /// (its own paths, and anything outside `/v1/` and [`ROOT_INFERENCE_PATHS`]).
    pub fn from_path(path: &str) -> Option<Endpoint> {
        match path {
            "/v1/chat/completions" => Some(Endpoint::ChatCompletions),
            "/v1/completions" => Some(Endpoint::Completions),
            "/v1/embeddings" => Some(Endpoint::Embeddings),
            "/v1/responses" => Some(Endpoint::Responses),
            // The model list is the data plane's own; a stored response's sub-paths carry no
            // model to route by.
            "/v1/models" => None,
            p if p.starts_with("/v1/models/") || p.starts_with("/v1/responses/") => None,
            p if p.starts_with("/v1/") && p.len() > 4 => Some(Endpoint::Other),
            p if ROOT_INFERENCE_PATHS.contains(&p) => Some(Endpoint::Other),
            _ => None,
        }
    }
}

/// An operation on a response an engine stored (the Responses API's `retrieve`, `delete`,
/// `cancel` and `input_items.list`): it carries no model, only the response's id, and only the
/// engine that stored the response can answer it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredResponseOp {
    /// `GET` or `DELETE /v1/responses/{id}`.
    Response,
    /// `POST /v1/responses/{id}/cancel`.
    Cancel,
    /// `GET /v1/responses/{id}/input_items`.
    InputItems,
}

impl StoredResponseOp {
    /// The operation on a stored response `path` names and the response's id, or `None` for
    /// any other path.
    pub fn from_path(path: &str) -> Option<(StoredResponseOp, &str)> {
        let rest = path.strip_prefix("/v1/responses/")?;
        let (id, op) = match rest.split_once('/') {
            None => (rest, StoredResponseOp::Response),
            Some((id, "cancel")) => (id, StoredResponseOp::Cancel),
            Some((id, "input_items")) => (id, StoredResponseOp::InputItems),
            Some(_) => return None,
        };
        (!id.is_empty()).then_some((op, id))
    }

    /// The methods the operation answers, as an `Allow` header lists them.
    pub fn allow(self) -> &'static str {
        match self {
            StoredResponseOp::Response => "GET, DELETE",
            StoredResponseOp::Cancel => "POST",
            StoredResponseOp::InputItems => "GET",
        }
    }

    /// Whether `method` (upper case) is one the operation answers.
    pub fn allows(self, method: &str) -> bool {
        self.allow().split(", ").any(|m| m == method)
    }
}

/// Refuses a path that a server or ingress behind the data plane could read as another path
/// than the one routed here: a `.` or `..` segment, also percent-encoded (`%2e`, `%2E`), an
/// encoded slash or backslash (`%2f`, `%5c`), a backslash, an encoded `%` (`%25`, which a
/// second decoding turns into any of these) or an encoded NUL. Checked before the path is
/// matched against the routed paths, so that `/v1/%2e%2e/admin` never reaches an engine as a
/// `/v1/` path.
pub fn check_path(path: &str) -> Result<(), ClassifyError> {
    let bad = |why: &str| Err(ClassifyError::Path(format!("request path {path:?} {why}")));
    if !path.starts_with('/') {
        return bad("must start with '/'");
    }
    if path.contains('\\') {
        return bad("must not contain a backslash");
    }
    let bytes = path.as_bytes();
    for (i, _) in path.match_indices('%') {
        let escaped = match (bytes.get(i + 1), bytes.get(i + 2)) {
            (Some(&hi), Some(&lo)) => [hi.to_ascii_lowercase(), lo.to_ascii_lowercase()],
            _ => return bad("has a malformed percent escape"),
        };
        match &escaped {
            b"2f" | b"5c" => return bad("must not contain an encoded slash or backslash"),
            b"25" | b"00" => return bad("must not contain an encoded '%' or NUL"),
            _ => {}
        }
    }
    for segment in path.split('/') {
        // A segment of dots only, plain or encoded, is `.` or `..` to whatever decodes it.
        let mut rest = segment;
        let mut dots = 0;
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix('.') {
                rest = r;
            } else if rest.as_bytes().get(..3).is_some_and(|b| b.eq_ignore_ascii_case(b"%2e")) {
                rest = &rest[3..];
            } else {
                break;
            }
            dots += 1;
        }
        if rest.is_empty() && (dots == 1 || dots == 2) {
            return bad("must not contain '.' or '..' segments");
        }
    }
    Ok(())
}

/// The request priority, at its old path (it lives in [`crate::priority`]).
pub use crate::priority::Priority;

/// Why a request could not be classified; each maps to a 400.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClassifyError {
    #[error("request body is not valid JSON: {0}")]
    Json(String),
    #[error("request body does not have the expected shape: {0}")]
    Shape(String),
    #[error("request body must be a JSON object with a string 'model' field")]
    MissingModel,
    #[error("{0}")]
    BadHeader(String),
    #[error("{0}")]
    Path(String),
}

/// What the body says, borrowing from it.
#[derive(Debug, Default)]
pub struct BodyInfo<'a> {
    pub model: Cow<'a, str>,
    pub stream: bool,
    pub user: Option<Cow<'a, str>>,
    /// OpenAI's `prompt_cache_key`: a client's own name for requests that share a prefix.
    pub prompt_cache_key: Option<Cow<'a, str>>,
    /// The Responses API's `previous_response_id`: the stored response this one continues.
    pub previous_response_id: Option<Cow<'a, str>>,
    /// Hash of the conversation's leading part (system prompt and first user message, or the
    /// start of the prompt); `None` when there is nothing to hash.
    pub prefix_hash: Option<u64>,
}

/// Parses the fields routing needs out of an OpenAI request body.
pub fn parse_body(endpoint: Endpoint, body: &[u8]) -> Result<BodyInfo<'_>, ClassifyError> {
    // serde would also accept a struct spelled as an array; OpenAI bodies are objects.
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(ClassifyError::MissingModel);
    }
    let raw: RawBody<'_> = serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            ClassifyError::Shape(e.to_string())
        } else {
            ClassifyError::Json(e.to_string())
        }
    })?;
    let model = raw.model.ok_or(ClassifyError::MissingModel)?.0;
    if model.is_empty() {
        return Err(ClassifyError::MissingModel);
    }
    let prefix_hash = match endpoint {
        Endpoint::ChatCompletions => raw.messages.and_then(|m| m.0),
        Endpoint::Completions => raw.prompt.map(prefix_of),
        Endpoint::Embeddings => raw.input.map(prefix_of),
        Endpoint::Responses => responses_prefix(raw.instructions, raw.input)?,
        Endpoint::Other => match raw.messages {
            Some(ConversationPrefix(hash)) => hash,
            None => raw.prompt.or(raw.input).or(raw.query).map(prefix_of),
        },
    };
    Ok(BodyInfo {
        model,
        stream: raw.stream.unwrap_or(false),
        user: raw.user.map(|u| u.0),
        prompt_cache_key: raw.prompt_cache_key.map(|k| k.0),
        previous_response_id: raw.previous_response_id.map(|id| id.0),
        prefix_hash,
    })
}

fn prefix_of(raw_json: &RawValue) -> u64 {
    let bytes = raw_json.get().as_bytes();
    crate::stable_hash(&bytes[..bytes.len().min(PROMPT_PREFIX_BYTES)])
}

/// A Responses request's prefix: its `instructions` (the system prompt) and its `input`, a
/// string or a list of items hashed like chat messages up to the first user message.
fn responses_prefix(
    instructions: Option<&RawValue>,
    input: Option<&RawValue>,
) -> Result<Option<u64>, ClassifyError> {
    let input_hash = match input {
        Some(raw) if raw.get().starts_with('[') => {
            serde_json::from_str::<ConversationPrefix>(raw.get())
                .map_err(|e| ClassifyError::Shape(format!("input: {e}")))?
                .0
        }
        Some(raw) => Some(prefix_of(raw)),
        None => None,
    };
    Ok(match (instructions.map(prefix_of), input_hash) {
        (Some(i), Some(h)) => Some(crate::slots::mix(i ^ h.rotate_left(17))),
        (i, h) => i.or(h),
    })
}

/// Splits a comma-separated `x-ilb-require` header into sorted, deduplicated tags.
pub fn parse_require(header: &str) -> Result<Vec<&str>, ClassifyError> {
    let mut tags: Vec<&str> = header.split(',').map(str::trim).filter(|t| !t.is_empty()).collect();
    tags.sort_unstable();
    tags.dedup();
    if tags.len() > MAX_REQUIRE_TAGS {
        return Err(ClassifyError::BadHeader(format!(
            "x-ilb-require names more than {MAX_REQUIRE_TAGS} tags"
        )));
    }
    Ok(tags)
}

/// The affinity key's hash: an explicit session key, else the body's `prompt_cache_key`, else
/// its `user` field, else the prompt prefix, else `fallback` (the caller passes something
/// per-request, e.g. a counter).
pub fn affinity_hash(session_header: Option<&str>, body: &BodyInfo<'_>, fallback: u64) -> u64 {
    let named = [session_header, body.prompt_cache_key.as_deref(), body.user.as_deref()];
    if let Some(key) = named.into_iter().flatten().find(|k| !k.is_empty()) {
        return crate::stable_hash(key.as_bytes());
    }
    body.prefix_hash.unwrap_or(fallback)
}

/// The key under which a data plane remembers which engine stored a response (the Responses
/// API's `id`, which a later request names as `previous_response_id`).
pub fn response_key(response_id: &str) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hasher.update(b"response\0");
    hasher.update(response_id.as_bytes());
    hasher.digest()
}

/// A string that borrows from the body unless it had escapes to decode. serde's derive
/// borrows a bare `Cow<'a, str>` field, but an `Option<Cow<'a, str>>` goes through `Cow`'s
/// own impl, which always allocates (three allocations per small chat request).
struct BorrowedStr<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for BorrowedStr<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(BorrowedStrVisitor(std::marker::PhantomData))
    }
}

struct BorrowedStrVisitor<'a>(std::marker::PhantomData<&'a str>);

impl<'de: 'a, 'a> Visitor<'de> for BorrowedStrVisitor<'a> {
    type Value = BorrowedStr<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(BorrowedStr(Cow::Borrowed(v)))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(BorrowedStr(Cow::Owned(v.to_owned())))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(BorrowedStr(Cow::Owned(v)))
    }
}

#[derive(Deserialize)]
struct RawBody<'a> {
    #[serde(borrow, default)]
    model: Option<BorrowedStr<'a>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(borrow, default)]
    user: Option<BorrowedStr<'a>>,
    #[serde(default)]
    messages: Option<ConversationPrefix>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    /// Rerank and score requests' text.
    #[serde(borrow, default)]
    query: Option<&'a RawValue>,
    #[serde(borrow, default)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt_cache_key: Option<BorrowedStr<'a>>,
    #[serde(borrow, default)]
    previous_response_id: Option<BorrowedStr<'a>>,
}

/// Hash of the chat messages up to and including the first user message. The remaining
/// messages are skipped without allocation.
struct ConversationPrefix(Option<u64>);

impl<'de> Deserialize<'de> for ConversationPrefix {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_seq(PrefixVisitor)
    }
}

struct PrefixVisitor;

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    role: Option<BorrowedStr<'a>>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

impl<'de> Visitor<'de> for PrefixVisitor {
    type Value = ConversationPrefix;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of messages")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ConversationPrefix, A::Error> {
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut hashed_any = false;
        let mut done = false;
        while !done {
            let Some(msg) = seq.next_element::<Message<'de>>()? else {
                break;
            };
            let role = msg.role.as_ref().map_or("", |r| &*r.0);
            hasher.update(role.as_bytes());
            hasher.update(b"\0");
            if let Some(content) = msg.content {
                let bytes = content.get().as_bytes();
                hasher.update(&bytes[..bytes.len().min(PROMPT_PREFIX_BYTES * 4)]);
            }
            hasher.update(b"\0");
            hashed_any = true;
            done = role == "user";
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(ConversationPrefix(hashed_any.then(|| hasher.digest())))
    }
}

impl fmt::Debug for ConversationPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConversationPrefix({:?})", self.0)
    }
}

#[cfg(test)]
mod tests;
