//! The Responses API (`POST /v1/responses`): the request's `instructions` and `input` become a
//! chat prompt, `previous_response_id` continues a stored conversation, and the answer is a
//! `response` object or the event stream OpenAI defines (`response.created`,
//! `response.in_progress`, `response.output_item.added`, `response.content_part.added`,
//! `response.output_text.delta`…, `response.output_text.done`, `response.content_part.done`,
//! `response.output_item.done`, then `response.completed` or `response.incomplete`), each
//! framed as `event: TYPE` and `data: JSON` lines.
//!
//! Stored responses live in this engine's memory only, as in vLLM: another engine answers a
//! `previous_response_id` it never produced with a 404. That is what a router must get right.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use super::respond::Completion;
use crate::tokenize::{output_text, output_word, ChatPrompt};

/// Responses kept for `previous_response_id`, oldest dropped first.
pub const STORED_RESPONSES: usize = 8192;

#[derive(Deserialize)]
#[serde(untagged)]
pub enum Input {
    Text(String),
    Items(Vec<InputItem>),
}

#[derive(Deserialize)]
pub struct InputItem {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<ItemContent>,
    /// A tool result (`function_call_output`).
    #[serde(default)]
    output: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum ItemContent {
    Text(String),
    Parts(Vec<ItemPart>),
}

#[derive(Deserialize)]
pub struct ItemPart {
    #[serde(default)]
    text: Option<String>,
}

/// The prompt of a Responses request: the stored conversation it continues (if any), then its
/// instructions as a system message and its input items as messages.
pub fn prompt(previous: Option<&[u32]>, instructions: Option<&str>, input: Option<&Input>) -> Vec<u32> {
    let mut prompt = ChatPrompt::continuing(previous.map(<[u32]>::to_vec).unwrap_or_default());
    if let Some(instructions) = instructions {
        prompt.push_message("system", &[instructions]);
    }
    match input {
        Some(Input::Text(text)) => prompt.push_message("user", &[text]),
        Some(Input::Items(items)) => {
            for item in items {
                let role =
                    item.role.as_deref().unwrap_or(if item.output.is_some() { "tool" } else { "user" });
                match (&item.content, &item.output) {
                    (Some(ItemContent::Text(text)), _) => prompt.push_message(role, &[text]),
                    (Some(ItemContent::Parts(parts)), _) => {
                        let texts: Vec<&str> = parts.iter().filter_map(|p| p.text.as_deref()).collect();
                        prompt.push_message(role, &texts);
                    }
                    (None, Some(output)) => prompt.push_message(role, &[output]),
                    (None, None) => prompt.push_message(role, &[]),
                }
            }
        }
        None => {}
    }
    prompt.finish()
}

/// The conversation a stored response ends: its prompt, then its answer as an assistant turn.
pub fn conversation(prompt: &[u32], completion: &Completion) -> Arc<[u32]> {
    let mut turn = ChatPrompt::continuing(prompt.to_vec());
    turn.push_reply(&output_text(completion.output_seed, completion.output_tokens));
    turn.into_tokens().into()
}

/// Stored conversations by response id, bounded.
#[derive(Default)]
pub struct Store {
    by_id: HashMap<String, Arc<[u32]>>,
    order: VecDeque<String>,
}

impl Store {
    pub fn get(&self, id: &str) -> Option<Arc<[u32]>> {
        self.by_id.get(id).cloned()
    }

    pub fn put(&mut self, id: String, tokens: Arc<[u32]>) {
        if self.by_id.insert(id.clone(), tokens).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > STORED_RESPONSES {
            if let Some(old) = self.order.pop_front() {
                self.by_id.remove(&old);
            }
        }
    }
}

impl Completion {
    fn message_id(&self) -> String {
        format!("msg_{}", self.id.trim_start_matches("resp_"))
    }

    fn incomplete(&self) -> bool {
        self.finish_reason == "length"
    }

    /// The `response` object, in progress (no output yet) or finished.
    pub fn response_object(&self, finished: bool) -> Value {
        let text = output_text(self.output_seed, self.output_tokens);
        let status = match (finished, self.incomplete()) {
            (false, _) => "in_progress",
            (true, false) => "completed",
            (true, true) => "incomplete",
        };
        let output = if finished { vec![self.message_item(&text, true)] } else { Vec::new() };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": output,
            "error": null,
            "incomplete_details": (finished && self.incomplete()).then(|| json!({"reason": "max_output_tokens"})),
            "instructions": null,
            "metadata": {},
            "parallel_tool_calls": true,
            "temperature": 1.0,
            "top_p": 1.0,
            "tool_choice": "auto",
            "tools": [],
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "usage": finished.then(|| json!({
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": self.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.prompt_tokens + self.output_tokens,
            })),
        })
    }

    fn message_item(&self, text: &str, finished: bool) -> Value {
        let content = if finished {
            vec![json!({"type": "output_text", "text": text, "annotations": []})]
        } else {
            Vec::new()
        };
        json!({
            "id": self.message_id(),
            "type": "message",
            "status": if finished { "completed" } else { "in_progress" },
            "role": "assistant",
            "content": content,
        })
    }

    /// The events before the first output token (sequence numbers 0 to 3).
    pub fn response_head(&self) -> Bytes {
        let item_id = self.message_id();
        let mut out = Vec::with_capacity(1024);
        event(&mut out, "response.created", 0, json!({"response": self.response_object(false)}));
        event(&mut out, "response.in_progress", 1, json!({"response": self.response_object(false)}));
        event(
            &mut out,
            "response.output_item.added",
            2,
            json!({"output_index": 0, "item": self.message_item("", false)}),
        );
        event(
            &mut out,
            "response.content_part.added",
            3,
            json!({"item_id": item_id, "output_index": 0, "content_index": 0,
                   "part": {"type": "output_text", "text": "", "annotations": []}}),
        );
        Bytes::from(out)
    }

    /// The delta event of output token `index` (1-based).
    pub fn response_delta(&self, index: u32) -> Bytes {
        let mut out = Vec::with_capacity(256);
        event(
            &mut out,
            "response.output_text.delta",
            3 + u64::from(index),
            json!({"item_id": self.message_id(), "output_index": 0, "content_index": 0,
                   "delta": output_word(self.output_seed, index - 1), "logprobs": []}),
        );
        Bytes::from(out)
    }

    /// The events after the last output token.
    pub fn response_tail(&self) -> Bytes {
        let text = output_text(self.output_seed, self.output_tokens);
        let item_id = self.message_id();
        let seq = 4 + u64::from(self.output_tokens);
        let part = json!({"type": "output_text", "text": text, "annotations": []});
        let mut out = Vec::with_capacity(2048 + 3 * text.len());
        event(
            &mut out,
            "response.output_text.done",
            seq,
            json!({"item_id": item_id, "output_index": 0, "content_index": 0, "text": text, "logprobs": []}),
        );
        event(
            &mut out,
            "response.content_part.done",
            seq + 1,
            json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": part}),
        );
        event(
            &mut out,
            "response.output_item.done",
            seq + 2,
            json!({"output_index": 0, "item": self.message_item(&text, true)}),
        );
        let last = if self.incomplete() { "response.incomplete" } else { "response.completed" };
        event(&mut out, last, seq + 3, json!({"response": self.response_object(true)}));
        Bytes::from(out)
    }
}

/// Appends one SSE event: `event: TYPE`, then `data:` with the payload plus its `type` and
/// `sequence_number`.
fn event(out: &mut Vec<u8>, kind: &str, sequence_number: u64, mut payload: Value) {
    if let Value::Object(fields) = &mut payload {
        fields.insert("type".into(), Value::from(kind));
        fields.insert("sequence_number".into(), Value::from(sequence_number));
    }
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    let _ = serde_json::to_writer(&mut *out, &payload);
    out.extend_from_slice(b"\n\n");
}
