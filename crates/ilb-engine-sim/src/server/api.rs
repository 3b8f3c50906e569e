//! HTTP routing and the OpenAI endpoints: request parsing and validation, fault checks, and
//! either an immediate answer (latency modelling off) or a request submitted to the model.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use rand::Rng;
use serde::Deserialize;

use super::driver::{LiveEntry, LiveRequest};
use super::faults::Faults;
use super::metrics::FinishedReason;
use super::respond::{self, Completion, EngineBody, Kind, Source, SseStream};
use super::responses;
use super::Shared;
use crate::clock;
use crate::tokenize::{self, ChatPrompt};

type Reply = Response<EngineBody>;

/// Routes one request. Hot path for the inference endpoints.
pub async fn handle(request: Request<Incoming>, shared: Arc<Shared>) -> Reply {
    let (parts, body) = request.into_parts();
    match (&parts.method, parts.uri.path()) {
        (&Method::POST, "/v1/chat/completions") => completion(&shared, Kind::Chat, body).await,
        (&Method::POST, "/v1/completions") => completion(&shared, Kind::Text, body).await,
        (&Method::POST, "/v1/responses") => completion(&shared, Kind::Responses, body).await,
        (&Method::POST, "/v1/embeddings") => embeddings(&shared, body).await,
        (&Method::GET, "/v1/models") => models(&shared),
        (&Method::GET, "/health" | "/health_generate") => health(&shared),
        (&Method::GET, "/metrics") => respond::text_response(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            shared.render_metrics(),
        ),
        (&Method::GET, "/admin/faults") => faults_response(&shared.faults()),
        (&Method::PUT, "/admin/faults") => put_faults(&shared, body).await,
        (&Method::DELETE, "/admin/faults") => match shared.set_faults(Faults::default()) {
            Ok(()) => faults_response(&shared.faults()),
            Err(error) => bad_request(&error.to_string(), None),
        },
        (
            _,
            "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/responses"
            | "/v1/embeddings"
            | "/v1/models"
            | "/health"
            | "/metrics"
            | "/admin/faults",
        ) => respond::error(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method not allowed",
            None,
        ),
        (_, path) => {
            respond::error(StatusCode::NOT_FOUND, "not_found_error", &format!("no route for {path}"), None)
        }
    }
}

fn bad_request(message: &str, param: Option<&str>) -> Reply {
    respond::error(StatusCode::BAD_REQUEST, "invalid_request_error", message, param)
}

/// A request refused before any work: becomes an OpenAI error response.
struct Rejection {
    status: StatusCode,
    message: String,
    param: Option<&'static str>,
}

impl Rejection {
    fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self { status: StatusCode::BAD_REQUEST, message: message.into(), param }
    }

    fn reply(self) -> Reply {
        respond::error(self.status, "invalid_request_error", &self.message, self.param)
    }
}

async fn read_body(shared: &Shared, body: Incoming) -> Result<Bytes, Reply> {
    match Limited::new(body, shared.config.max_body_bytes).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(Rejection {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("request body exceeds {} bytes", shared.config.max_body_bytes),
            param: None,
        }),
        Err(error) => Err(Rejection::bad_request(format!("could not read request body: {error}"), None)),
    }
    .map_err(Rejection::reply)
}

#[derive(Deserialize)]
struct CompletionRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    messages: Option<Vec<ChatMessage>>,
    #[serde(default)]
    prompt: Option<Prompt>,
    #[serde(default)]
    max_tokens: Option<i64>,
    #[serde(default)]
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    n: Option<i64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    // The Responses API's fields.
    #[serde(default)]
    input: Option<responses::Input>,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    max_output_tokens: Option<i64>,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    store: Option<bool>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// The prompt's token ids, or a 400 naming the problem. `previous` is the stored
/// conversation a Responses request continues.
fn prompt_tokens(
    kind: Kind,
    request: &CompletionRequest,
    previous: Option<&[u32]>,
) -> Result<Vec<u32>, Rejection> {
    match kind {
        Kind::Responses => {
            if request.input.is_none() && previous.is_none() {
                return Err(Rejection::bad_request("input is required", Some("input")));
            }
            Ok(responses::prompt(previous, request.instructions.as_deref(), request.input.as_ref()))
        }
        Kind::Chat => {
            let messages = match &request.messages {
                Some(messages) if !messages.is_empty() => messages,
                _ => {
                    return Err(Rejection::bad_request(
                        "messages must be a non-empty array",
                        Some("messages"),
                    ))
                }
            };
            let mut prompt = ChatPrompt::default();
            for message in messages {
                match &message.content {
                    Some(Content::Text(text)) => prompt.push_message(&message.role, &[text]),
                    Some(Content::Parts(parts)) => {
                        let texts: Vec<&str> = parts.iter().filter_map(|part| part.text.as_deref()).collect();
                        prompt.push_message(&message.role, &texts);
                    }
                    None => prompt.push_message(&message.role, &[]),
                }
            }
            Ok(prompt.finish())
        }
        Kind::Text => {
            let mut tokens = Vec::new();
            match &request.prompt {
                Some(Prompt::Text(text)) => tokenize::tokenize_into(text, &mut tokens),
                Some(Prompt::Texts(texts)) if texts.len() == 1 => {
                    tokenize::tokenize_into(&texts[0], &mut tokens)
                }
                Some(Prompt::Tokens(ids)) => tokens.clone_from(ids),
                Some(Prompt::TokenLists(lists)) if lists.len() == 1 => tokens.clone_from(&lists[0]),
                Some(_) => {
                    return Err(Rejection::bad_request(
                        "only one prompt per request is supported",
                        Some("prompt"),
                    ))
                }
                None => return Err(Rejection::bad_request("prompt is required", Some("prompt"))),
            }
            if tokens.is_empty() {
                // An empty text still costs one token in a real engine (the BOS token).
                tokens.push(tokenize::MARKER_BASE + 11);
            }
            Ok(tokens)
        }
    }
}

async fn completion(shared: &Arc<Shared>, kind: Kind, body: Incoming) -> Reply {
    let started = clock::now();
    let Checked { request, tokens, output_tokens, finish_reason } = match check(shared, kind, body).await {
        Ok(checked) => checked,
        Err(reply) => return reply,
    };
    let stream = request.stream.unwrap_or(false);
    let faults = shared.faults();
    if faults.ready_replicas == Some(0) {
        return respond::error(StatusCode::SERVICE_UNAVAILABLE, "server_error", "no ready replicas", None);
    }
    if faults.hang {
        // Accept and never answer; the future is dropped when the client goes away.
        std::future::pending::<()>().await;
    }
    let (inject_error, drop_after_first) = shared.draw_faults(&faults, stream);
    if inject_error {
        shared.metrics.errors_injected.fetch_add(1, Ordering::Relaxed);
        return respond::error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "injected fault", None);
    }
    let id = shared.next_request_id.fetch_add(1, Ordering::Relaxed);
    let prefix = match kind {
        Kind::Chat => "chatcmpl-",
        Kind::Text => "cmpl-",
        Kind::Responses => "resp_",
    };
    let completion = Completion {
        kind,
        id: format!("{prefix}{:016x}", shared.id_salt ^ id),
        model: shared.config.model.to_string(),
        created: clock::unix_secs(),
        output_seed: tokenize::output_seed(shared.config.seed, &tokens),
        prompt_tokens: tokens.len() as u32,
        output_tokens,
        finish_reason,
        include_usage: stream
            && request.stream_options.as_ref().and_then(|options| options.include_usage).unwrap_or(false),
    };
    if kind == Kind::Responses && request.store != Some(false) {
        // Stored as soon as it is created, as OpenAI does (retrievable while in progress).
        shared.stored_responses().put(completion.id.clone(), responses::conversation(&tokens, &completion));
    }
    if !shared.config.latency {
        return direct(shared, completion, stream, drop_after_first, started);
    }
    through_model(shared, completion, id, tokens, stream, drop_after_first).await
}

/// A completion request as read and checked: its prompt tokens, and how many tokens to
/// generate with the finish reason that ends them.
struct Checked {
    request: CompletionRequest,
    tokens: Vec<u32>,
    output_tokens: u32,
    finish_reason: &'static str,
}

/// Reads a completion request and checks it as an engine would (model, `n`, token limits,
/// the previous response it continues, its prompt).
async fn check(shared: &Arc<Shared>, kind: Kind, body: Incoming) -> Result<Checked, Reply> {
    let bytes = read_body(shared, body).await?;
    let request: CompletionRequest = match serde_json::from_slice(&bytes) {
        Ok(request) => request,
        Err(error) => return Err(bad_request(&format!("invalid JSON body: {error}"), None)),
    };
    if let Some(model) = request.model.as_deref() {
        if model != shared.config.model.as_str() {
            return Err(respond::error(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                &format!("The model `{model}` does not exist."),
                Some("model"),
            ));
        }
    }
    if request.n.is_some_and(|n| n != 1) {
        return Err(bad_request("n must be 1", Some("n")));
    }
    let (output_tokens, finish_reason) =
        match request.max_output_tokens.or(request.max_completion_tokens).or(request.max_tokens) {
            Some(max) if max < 1 => {
                return Err(bad_request("max_tokens must be at least 1", Some("max_tokens")))
            }
            Some(max) => (max.min(i64::from(shared.config.max_tokens_cap)) as u32, "length"),
            None => (shared.config.default_max_tokens, "stop"),
        };
    let previous = match request.previous_response_id.as_deref() {
        Some(id) => match shared.stored_responses().get(id) {
            Some(tokens) => Some(tokens),
            None => {
                return Err(respond::error(
                    StatusCode::NOT_FOUND,
                    "invalid_request_error",
                    &format!("Response with id '{id}' not found."),
                    Some("previous_response_id"),
                ))
            }
        },
        None => None,
    };
    let tokens = match prompt_tokens(kind, &request, previous.as_deref()) {
        Ok(tokens) => tokens,
        Err(rejection) => return Err(rejection.reply()),
    };
    Ok(Checked { request, tokens, output_tokens, finish_reason })
}

/// Latency modelling on: submits the request to the model and streams or answers what it
/// generates.
async fn through_model(
    shared: &Arc<Shared>,
    completion: Completion,
    id: u64,
    tokens: Vec<u32>,
    stream: bool,
    drop_after_first: bool,
) -> Reply {
    let (output_tokens, finish_reason) = (completion.output_tokens, completion.finish_reason);
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    {
        let mut state = shared.cell.lock();
        let now = shared.cell.now();
        let model_request =
            crate::model::Request { id, prompt: tokens.into(), max_output_tokens: output_tokens };
        if let Err(error) = state.model.submit(now, model_request) {
            return bad_request(&error.to_string(), Some("messages"));
        }
        let reason = if finish_reason == "length" { FinishedReason::Length } else { FinishedReason::Stop };
        state.live.insert(id, LiveEntry { tokens: sender, arrival: now, last_token_at: now, reason });
    }
    shared.cell.wake.notify_one();
    let live = LiveRequest { cell: shared.cell.clone(), metrics: shared.metrics.clone(), id };
    if stream {
        let stream = SseStream::new(completion, Source::Model(receiver), drop_after_first, Some(live));
        return respond::sse_response(stream);
    }
    loop {
        match receiver.recv().await {
            Some(event) if event.finished => break,
            Some(_) => {}
            None => {
                return respond::error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    "engine shutting down",
                    None,
                )
            }
        }
    }
    drop(live);
    respond::json_response(StatusCode::OK, completion.full_json())
}

/// Latency modelling off: answer at once without the model.
fn direct(
    shared: &Shared,
    completion: Completion,
    stream: bool,
    drop_after_first: bool,
    started: tokio::time::Instant,
) -> Reply {
    let metrics = &shared.metrics;
    metrics.direct_prompt_tokens.fetch_add(u64::from(completion.prompt_tokens), Ordering::Relaxed);
    metrics.direct_generation_tokens.fetch_add(u64::from(completion.output_tokens), Ordering::Relaxed);
    let elapsed = clock::since(started).as_nanos() as u64;
    metrics.ttft.observe_ns(elapsed);
    metrics.e2e.observe_ns(elapsed);
    metrics.generated.observe_count(u64::from(completion.output_tokens));
    metrics.finished(if completion.finish_reason == "length" {
        FinishedReason::Length
    } else {
        FinishedReason::Stop
    });
    if !stream {
        return respond::json_response(StatusCode::OK, completion.full_json());
    }
    let chunks = completion.all_chunks();
    let source = if drop_after_first {
        Source::Ready(chunks)
    } else {
        // One frame for the whole stream: fewer writes.
        let mut all = Vec::with_capacity(chunks.iter().map(Bytes::len).sum());
        chunks.iter().for_each(|chunk| all.extend_from_slice(chunk));
        Source::Ready(std::iter::once(Bytes::from(all)).collect())
    };
    respond::sse_response(SseStream::new(completion, source, drop_after_first, None))
}

#[derive(Deserialize)]
struct EmbeddingRequest {
    #[serde(default)]
    model: Option<String>,
    input: EmbeddingInput,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum EmbeddingInput {
    Text(String),
    Texts(Vec<String>),
}

async fn embeddings(shared: &Shared, body: Incoming) -> Reply {
    let bytes = match read_body(shared, body).await {
        Ok(bytes) => bytes,
        Err(reply) => return reply,
    };
    let request: EmbeddingRequest = match serde_json::from_slice(&bytes) {
        Ok(request) => request,
        Err(error) => return bad_request(&format!("invalid JSON body: {error}"), None),
    };
    let inputs = match request.input {
        EmbeddingInput::Text(text) => vec![text],
        EmbeddingInput::Texts(texts) => texts,
    };
    let dims = shared.config.embedding_dims;
    let data: Vec<serde_json::Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, text)| {
            serde_json::json!({"object": "embedding", "index": index, "embedding": tokenize::embedding(text, dims)})
        })
        .collect();
    let tokens: usize = inputs.iter().map(|text| tokenize::count_tokens(text)).sum();
    let body = serde_json::json!({
        "object": "list",
        "data": data,
        "model": request.model.unwrap_or_else(|| shared.config.model.to_string()),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    });
    respond::json_response(StatusCode::OK, serde_json::to_vec(&body).unwrap_or_default())
}

fn models(shared: &Shared) -> Reply {
    let body = serde_json::json!({
        "object": "list",
        "data": [{"id": shared.config.model.as_str(), "object": "model", "created": 0, "owned_by": "ilb-engine-sim",
                  "max_model_len": u64::from(shared.config.profile.kv_blocks) * 16}],
    });
    respond::json_response(StatusCode::OK, serde_json::to_vec(&body).unwrap_or_default())
}

fn health(shared: &Shared) -> Reply {
    if shared.faults().unhealthy() {
        respond::error(StatusCode::SERVICE_UNAVAILABLE, "server_error", "no ready replicas", None)
    } else {
        respond::text_response(StatusCode::OK, "text/plain", Bytes::new())
    }
}

fn faults_response(faults: &Faults) -> Reply {
    respond::json_response(StatusCode::OK, serde_json::to_vec(faults).unwrap_or_default())
}

async fn put_faults(shared: &Arc<Shared>, body: Incoming) -> Reply {
    let bytes = match read_body(shared, body).await {
        Ok(bytes) => bytes,
        Err(reply) => return reply,
    };
    let faults: Faults = match serde_json::from_slice(&bytes) {
        Ok(faults) => faults,
        Err(error) => return bad_request(&format!("invalid fault document: {error}"), None),
    };
    if let Err(error) = faults.validate() {
        return bad_request(&error.to_string(), Some(error.field));
    }
    if faults.down && !shared.faults().down {
        // Going down closes this very connection: answer first, apply a moment later.
        let response = faults_response(&faults);
        let shared = shared.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            let _ = shared.set_faults(faults);
        });
        return response;
    }
    match shared.set_faults(faults) {
        Ok(()) => faults_response(&shared.faults()),
        Err(error) => bad_request(&error.to_string(), Some(error.field)),
    }
}

/// Draws the per-request fault decisions from the engine's seeded RNG (only when a fault that
/// needs a draw is active, so the fault-free hot path takes no lock).
pub(super) fn draw(rng: &mut rand_pcg::Pcg64, faults: &Faults, stream: bool) -> (bool, bool) {
    let error = faults.error_rate > 0.0 && rng.gen_bool(faults.error_rate);
    let drop = stream && faults.drop_mid_stream > 0.0 && rng.gen_bool(faults.drop_mid_stream);
    (error, drop)
}
