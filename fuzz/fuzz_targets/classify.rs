//! Fuzz target: request classification, the first code that reads a client's bytes.
//!
//! The first input byte picks the endpoint; the rest is the request body for
//! `classify::parse_body` and, when it is UTF-8, a header value for `parse_require`,
//! `Priority::parse` and the session-key hash. Besides "never panics", it checks what the data
//! plane relies on: a parsed body names a non-empty model and parses the same way twice, require
//! tags come out sorted, deduplicated, trimmed and bounded, and a parsed priority round-trips
//! through its name.

#![no_main]

use ilb_core::classify::{self, BodyInfo, Endpoint, Priority, MAX_REQUIRE_TAGS};
use libfuzzer_sys::fuzz_target;

/// Each endpoint with a path it is routed from.
const ENDPOINTS: [(Endpoint, &str); 5] = [
    (Endpoint::ChatCompletions, "/v1/chat/completions"),
    (Endpoint::Completions, "/v1/completions"),
    (Endpoint::Embeddings, "/v1/embeddings"),
    (Endpoint::Responses, "/v1/responses"),
    (Endpoint::Other, "/v1/messages"),
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let (endpoint, path) = ENDPOINTS[usize::from(selector) % ENDPOINTS.len()];
    assert_eq!(Endpoint::from_path(path), Some(endpoint));

    if let Ok(info) = classify::parse_body(endpoint, rest) {
        assert!(!info.model.is_empty(), "a classified body names a model");
        let again = classify::parse_body(endpoint, rest).expect("a body that parsed once parses again");
        assert_eq!(
            (&info.model, info.stream, &info.user, info.prefix_hash),
            (&again.model, again.stream, &again.user, again.prefix_hash)
        );
        let fallback = 0x5EED;
        let hash = classify::affinity_hash(None, &info, fallback);
        let named = [&info.prompt_cache_key, &info.user];
        if named.iter().all(|k| k.as_deref().is_none_or(str::is_empty)) && info.prefix_hash.is_none() {
            assert_eq!(hash, fallback, "nothing to hash falls back to the per-request key");
        }
    }

    let Ok(text) = std::str::from_utf8(rest) else { return };
    let _ = Endpoint::from_path(text);
    if let Ok(tags) = classify::parse_require(text) {
        assert!(tags.len() <= MAX_REQUIRE_TAGS, "{} tags", tags.len());
        assert!(tags.windows(2).all(|pair| pair[0] < pair[1]), "tags not sorted and deduplicated: {tags:?}");
        assert!(tags.iter().all(|t| !t.is_empty() && t.trim() == *t && !t.contains(',')), "{tags:?}");
    }
    if let Ok(priority) = Priority::parse(text) {
        assert_eq!(Priority::parse(priority.as_str()), Ok(priority));
    }
    let with_session = classify::affinity_hash(Some(text), &BodyInfo::default(), 1);
    if !text.is_empty() {
        assert_eq!(with_session, ilb_core::stable_hash(text.as_bytes()), "a session key is hashed as is");
    }
});
