//! `GET /debug/route?model=M&key=K[&require=a,b][&residency=eu]`: the full routing decision a
//! request with that model and affinity key would get right now, as JSON — the class, every
//! candidate with its weight and state, where the key's slot landed and what was skipped.
//! It has no side effects: nothing is counted or sent.

use crate::body::{json_response, ProxyBody};
use crate::error::ProxyError;
use crate::pick::{choose, Pick};
use crate::shared::Shared;
use http::{Response, StatusCode};
use ilb_core::classify::parse_require;
use ilb_core::table::Constraints;
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;

pub fn route(shared: &Shared, query: Option<&str>) -> Response<ProxyBody> {
    match explain(shared, query.unwrap_or("")) {
        Ok(value) => json_response(StatusCode::OK, &value),
        Err(e) => e.into_response(),
    }
}

fn explain(shared: &Shared, query: &str) -> Result<serde_json::Value, ProxyError> {
    let params: Vec<_> = form_urlencoded::parse(query.as_bytes()).collect();
    let get = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_ref());
    let model_name =
        get("model").ok_or_else(|| ProxyError::BadRequest("query parameter 'model' is required".into()))?;
    let key = get("key").ok_or_else(|| ProxyError::BadRequest("query parameter 'key' is required".into()))?;
    let require =
        parse_require(get("require").unwrap_or("")).map_err(|e| ProxyError::BadRequest(e.to_string()))?;
    let residency = get("residency").filter(|r| !r.is_empty());

    let installed = shared.routing.current().ok_or(ProxyError::NoSnapshot)?;
    let model =
        installed.table.model(model_name).ok_or_else(|| ProxyError::UnknownModel(model_name.into()))?;
    let constraints = Constraints { require: &require, residency };
    let class = model.class_for(&constraints);
    let key_hash = ilb_core::stable_hash(key.as_bytes());
    let home = class.slots.probe(key_hash, 0);
    let class_load = installed.classes[class.seq].in_flight.load(Relaxed);
    let candidates: Vec<serde_json::Value> = class
        .candidates
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let entry = &installed.table.engines[c.engine_idx];
            let state = &installed.engines[c.engine_idx];
            let skip = if !constraints.allow(entry) {
                Some("constraints")
            } else if state.is_ejected() {
                Some("ejected by local guard")
            } else if let Some(reason) = state.hold_reason() {
                Some(match reason {
                    ilb_core::holds::HoldReason::Asleep => "held by the control plane: asleep",
                    ilb_core::holds::HoldReason::NoReadyReplicas => {
                        "held by the control plane: no ready replicas"
                    }
                    ilb_core::holds::HoldReason::Unreachable => "held by the control plane: unreachable",
                })
            } else if entry.max_in_flight != 0 && state.in_flight.load(Relaxed) >= entry.max_in_flight {
                Some("at max_in_flight")
            } else {
                None
            };
            json!({
                "engine": entry.id, "url": entry.url, "region": entry.region,
                "weight": c.weight, "expected_latency_ms": c.expected_latency_ms, "network_ms": c.network_ms,
                "in_flight": state.in_flight.load(Relaxed),
                "class_in_flight": installed.class_engine_in_flight[class.seq][i].load(Relaxed),
                "skip": skip, "home_slot": i == home,
                "tls_failure": state.origin.last_tls_failure().map(|f| json!({"reason": f.label(), "advice": f.advice()})),
            })
        })
        .collect();
    let now_s = (shared.pool_clock.ms() / 1000) as u32;
    let place_new_by_load = shared.config.place_new_keys_by_load;
    let pick = Pick { tried: &[], pinned: None, affinity: &shared.affinity, now_s, place_new_by_load };
    let chosen = choose(&installed, class, &constraints, key_hash, pick).ok();
    let remembered = class.remembered(&shared.affinity, key_hash, now_s);
    Ok(json!({
        "snapshot": installed.table.version,
        "cluster": installed.table.cluster,
        "model": model.name,
        "class": class.id,
        "shed_fraction": class.shed_fraction,
        "key_hash": format!("{key_hash:016x}"),
        "class_in_flight": class_load,
        "home": class.candidates.get(home).map(|c| &installed.table.engines[c.engine_idx].id),
        "picked": chosen.map(|c| &installed.table.engines[class.candidates[c].engine_idx].id),
        "remembered": remembered.map(|c| &installed.table.engines[class.candidates[c].engine_idx].id),
        "walked": chosen.is_some_and(|c| c != home && Some(c) != remembered),
        "candidates": candidates,
    }))
}
