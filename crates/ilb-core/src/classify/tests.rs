use super::*;
use proptest::prelude::*;

fn chat(body: &str) -> Result<BodyInfo<'_>, ClassifyError> {
    parse_body(Endpoint::ChatCompletions, body.as_bytes())
}

#[test]
fn reads_model_stream_and_user() {
    let b = chat(r#"{"model":"m","stream":true,"user":"u1","messages":[],"extra":{"x":[1,2]}}"#).unwrap();
    assert_eq!(b.model, "m");
    assert!(b.stream);
    assert_eq!(b.user.as_deref(), Some("u1"));
    assert_eq!(b.prefix_hash, None);
}

#[test]
fn escaped_model_names_are_decoded() {
    let b = chat(r#"{"model":"a\/b","messages":[]}"#).unwrap();
    assert_eq!(b.model, "a/b");
}

/// Regression: `Option<Cow<str>>` fields went through `Cow`'s own impl and allocated a copy of
/// every model, user and role string.
#[test]
fn plain_strings_borrow_from_the_body() {
    let b = chat(r#"{"model":"m","user":"u1","messages":[{"role":"user","content":"hi"}]}"#).unwrap();
    assert!(matches!(b.model, Cow::Borrowed("m")));
    assert!(matches!(b.user, Some(Cow::Borrowed("u1"))));
    let escaped = chat(r#"{"model":"a\/b","user":"\u0075","messages":[]}"#).unwrap();
    assert!(matches!(escaped.model, Cow::Owned(ref m) if m == "a/b"));
    assert!(matches!(escaped.user, Some(Cow::Owned(ref u)) if u == "u"));
}

#[test]
fn errors() {
    assert!(matches!(chat("{"), Err(ClassifyError::Json(_))));
    assert_eq!(chat(r#"["m"]"#).unwrap_err(), ClassifyError::MissingModel);
    assert!(matches!(chat("7"), Err(ClassifyError::Shape(_))));
    assert!(matches!(chat(r#"{"model":42}"#), Err(ClassifyError::Shape(_))));
    assert_eq!(chat(r#"{"messages":[]}"#).unwrap_err(), ClassifyError::MissingModel);
    assert_eq!(chat(r#"{"model":""}"#).unwrap_err(), ClassifyError::MissingModel);
    assert!(matches!(chat(r#"{"model":"m"} trailing"#), Err(ClassifyError::Json(_))));
}

#[test]
fn follow_up_turns_share_the_prefix_hash() {
    let turn1 =
        r#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}"#;
    let turn2 = r#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"},
        {"role":"assistant","content":"hello"},{"role":"user","content":"more"}]}"#;
    let other = r#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"bye"}]}"#;
    let (h1, h2, h3) = (
        chat(turn1).unwrap().prefix_hash,
        chat(turn2).unwrap().prefix_hash,
        chat(other).unwrap().prefix_hash,
    );
    assert!(h1.is_some());
    assert_eq!(h1, h2);
    assert_ne!(h1, h3);
}

#[test]
fn completion_prompts_hash_their_start() {
    let a = parse_body(Endpoint::Completions, br#"{"model":"m","prompt":"once upon a time"}"#).unwrap();
    let b = parse_body(Endpoint::Completions, br#"{"model":"m","prompt":"once upon a time"}"#).unwrap();
    assert_eq!(a.prefix_hash, b.prefix_hash);
    assert!(a.prefix_hash.is_some());
}

#[test]
fn affinity_prefers_session_then_user_then_prefix() {
    let body = chat(r#"{"model":"m","user":"u","messages":[{"role":"user","content":"x"}]}"#).unwrap();
    assert_eq!(affinity_hash(Some("s"), &body, 0), crate::stable_hash(b"s"));
    assert_eq!(affinity_hash(None, &body, 0), crate::stable_hash(b"u"));
    let anon = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#).unwrap();
    assert_eq!(affinity_hash(None, &anon, 0), anon.prefix_hash.unwrap());
    let empty = chat(r#"{"model":"m"}"#).unwrap();
    assert_eq!(affinity_hash(None, &empty, 99), 99);
}

#[test]
fn headers() {
    assert_eq!(parse_require(" b, a ,,a").unwrap(), vec!["a", "b"]);
}

proptest! {
    #![proptest_config(ProptestConfig { rng_seed: proptest::test_runner::RngSeed::Fixed(1), ..ProptestConfig::default() })]

    #[test]
    fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        for e in [Endpoint::ChatCompletions, Endpoint::Completions, Endpoint::Embeddings] {
            let _ = parse_body(e, &bytes);
        }
    }
}

#[test]
fn paths_route_by_kind() {
    assert_eq!(Endpoint::from_path("/v1/responses"), Some(Endpoint::Responses));
    assert_eq!(Endpoint::from_path("/v1/chat/completions"), Some(Endpoint::ChatCompletions));
    for other in ["/v1/messages", "/v1/rerank", "/v1/audio/transcriptions", "/tokenize", "/score"] {
        assert_eq!(Endpoint::from_path(other), Some(Endpoint::Other), "{other}");
    }
    for local in
        ["/v1/models", "/v1/models/m", "/v1/", "/v1", "/v1/responses/resp_1", "/health", "/tokenizer", "/"]
    {
        assert_eq!(Endpoint::from_path(local), None, "{local}");
    }
}

#[test]
fn responses_read_previous_id_cache_key_and_prefix() {
    let parse = |body: &str| parse_body(Endpoint::Responses, body.as_bytes()).unwrap().prefix_hash;
    let b = parse_body(
        Endpoint::Responses,
        br#"{"model":"m","input":"hi","previous_response_id":"resp_1","prompt_cache_key":"k"}"#,
    )
    .unwrap();
    assert_eq!(b.previous_response_id.as_deref(), Some("resp_1"));
    assert_eq!(b.prompt_cache_key.as_deref(), Some("k"));
    // The cache key names the conversation ahead of the user field and the prefix.
    assert_eq!(affinity_hash(None, &b, 0), crate::stable_hash(b"k"));
    assert_eq!(affinity_hash(Some("s"), &b, 0), crate::stable_hash(b"s"));
    // Items hash like chat messages up to the first user message; instructions count too.
    let items = r#"{"model":"m","input":[{"role":"user","content":"hi"}]}"#;
    let more = r#"{"model":"m","input":[{"role":"user","content":"hi"},{"role":"assistant","content":"x"}]}"#;
    assert_eq!(parse(items), parse(more));
    let instructed = r#"{"model":"m","instructions":"be brief","input":[{"role":"user","content":"hi"}]}"#;
    assert_ne!(parse(items), parse(instructed));
    assert!(parse(r#"{"model":"m","input":"text"}"#).is_some());
    assert!(matches!(
        parse_body(Endpoint::Responses, br#"{"model":"m","input":[1]}"#),
        Err(ClassifyError::Shape(_))
    ));
}

/// Regression (hardening finding 6): `/v1/%2e%2e/admin/x` was forwarded as it came, so an
/// engine or ingress that normalises paths would have served a non-`/v1` endpoint.
#[test]
fn dot_segments_and_encoded_slashes_are_refused() {
    for good in
        ["/v1/chat/completions", "/v1/responses/resp_1/cancel", "/v1/a.b/c..d", "/v1/...", "/tokenize"]
    {
        assert_eq!(check_path(good), Ok(()), "{good}");
    }
    for bad in [
        "/v1/../admin",
        "/v1/./chat/completions",
        "/v1/%2e%2e/admin/x",
        "/v1/%2E%2E/admin/x",
        "/v1/.%2e/sleep",
        "/v1/%2e/x",
        "/v1/..",
        "/v1/a%2fb",
        "/v1/a%2F..%2Fsleep",
        "/v1/a%5cb",
        "/v1\\..\\sleep",
        "/v1/%252e%252e/x",
        "/v1/x%00",
        "/v1/x%2",
        "v1/chat/completions",
    ] {
        assert!(matches!(check_path(bad), Err(ClassifyError::Path(_))), "{bad}");
    }
}

#[test]
fn stored_response_paths_name_their_operation_and_id() {
    use StoredResponseOp::*;
    assert_eq!(StoredResponseOp::from_path("/v1/responses/resp_1"), Some((Response, "resp_1")));
    assert_eq!(StoredResponseOp::from_path("/v1/responses/resp_1/cancel"), Some((Cancel, "resp_1")));
    assert_eq!(StoredResponseOp::from_path("/v1/responses/r/input_items"), Some((InputItems, "r")));
    for none in
        ["/v1/responses", "/v1/responses/", "/v1/responses//cancel", "/v1/responses/r/x", "/v1/models"]
    {
        assert_eq!(StoredResponseOp::from_path(none), None, "{none}");
    }
    assert!(Response.allows("GET") && Response.allows("DELETE") && !Response.allows("POST"));
    assert!(Cancel.allows("POST") && !Cancel.allows("GET"));
    assert_eq!(InputItems.allow(), "GET");
}
