//! The data plane's own model list: `GET /v1/models` and `GET /v1/models/{id}` (the SDKs'
//! `models.list` and `models.retrieve`), answered from the installed snapshot's models.
//!
//! A model's object is the one its engines list in their own `/v1/models` where the data plane
//! asked them (quick mode discovers engines that way): its fields pass through (vLLM's
//! `max_model_len`, `root`, `parent`, `permission`; llama.cpp's `meta`; `created`,
//! `owned_by`). A snapshot from a control plane names models only, so with one the object is
//! OpenAI's four fields (`id`, `object: "model"`, `created: 0`, `owned_by: "ilb"`).

use crate::body::{json_response, ProxyBody};
use crate::error::ProxyError;
use crate::shared::Shared;
use http::{Response, StatusCode};
use serde_json::{json, Value};

/// `GET /v1/models`.
pub fn list(shared: &Shared) -> Response<ProxyBody> {
    let objects = shared.model_objects.load();
    let data: Vec<Value> = shared
        .routing
        .current()
        .map(|installed| installed.table.model_names().iter().map(|m| object(&objects, m.as_str())).collect())
        .unwrap_or_default();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}`: the model's object, or 404 `model_not_found` for a model the
/// snapshot does not route.
pub fn retrieve(shared: &Shared, id: &str) -> Response<ProxyBody> {
    let Some(installed) = shared.routing.current() else {
        return ProxyError::NoSnapshot.into_response();
    };
    match installed.table.model(id) {
        Some(model) => {
            json_response(StatusCode::OK, &object(&shared.model_objects.load(), model.name.as_str()))
        }
        None => ProxyError::UnknownModel(id.to_owned()).into_response(),
    }
}

fn object(objects: &crate::shared::ModelObjects, name: &str) -> Value {
    match objects.get(name) {
        Some(object) => {
            let mut object = object.clone();
            object.insert("id".into(), name.into());
            object.entry("object").or_insert_with(|| "model".into());
            Value::Object(object)
        }
        None => json!({"id": name, "object": "model", "created": 0, "owned_by": "ilb"}),
    }
}
