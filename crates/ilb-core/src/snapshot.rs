//! The routing snapshot: what the control plane publishes for one front-end cluster and what a
//! data plane installs. JSON on the wire; see `docs/snapshot.md` for the format with examples.
//!
//! Parsing is strict (unknown fields are rejected, sizes are bounded) and [`Snapshot::validate`]
//! checks every cross-reference, so a data plane can reject a bad snapshot before it touches the
//! routing table and keep the last good one.

use crate::ids::{ClassId, ClusterId, EngineId, ModelName, SnapshotVersion};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// The wire-format revision this code reads and writes.
pub const FORMAT: u32 = 1;
/// Largest snapshot body accepted, in bytes.
pub const MAX_SNAPSHOT_BYTES: usize = 64 << 20;
/// Limits that keep a malicious snapshot from exhausting memory.
pub const MAX_ENGINES: usize = 100_000;
pub const MAX_MODELS: usize = 4_096;
pub const MAX_CLASSES_PER_MODEL: usize = 4_096;
pub const MAX_NAME_LEN: usize = 256;
/// Most slot-table entries all classes together may compile into (128 MiB of tables); bounds
/// the memory a snapshot can make a data plane allocate.
pub const MAX_TOTAL_SLOTS: usize = 1 << 25;
pub const MAX_URL_LEN: usize = 2_048;

/// A versioned routing snapshot for one front-end cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// Wire-format revision; must be [`FORMAT`].
    pub format: u32,
    /// Increases with every publication; data planes never install a lower one.
    pub version: SnapshotVersion,
    /// When the control plane created it, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// The front-end cluster these weights are for.
    pub cluster: ClusterId,
    /// Planned utilisation of the fleet in [0, 1]; retry budgets shrink as it rises.
    #[serde(default)]
    pub utilisation: f64,
    /// Every engine any class below may use.
    pub engines: Vec<EngineEntry>,
    /// Routes per served model.
    pub models: Vec<ModelRoutes>,
}

/// An engine a data plane may forward to. The data plane never forwards anywhere else.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineEntry {
    pub id: EngineId,
    /// Base URL, `http://host:port`; request paths are appended to it.
    pub url: String,
    #[serde(default)]
    pub region: String,
    /// Capabilities this engine offers (e.g. `long-context`, `tools`).
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Residency zones this engine satisfies (e.g. `eu`).
    #[serde(default)]
    pub residency: Vec<String>,
    /// Most requests this data plane may have in flight to the engine; 0 means no limit.
    #[serde(default)]
    pub max_in_flight: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRoutes {
    pub model: ModelName,
    pub classes: Vec<ClassRoutes>,
}

/// The weights of one traffic class (cluster × model × constraints).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassRoutes {
    pub id: ClassId,
    /// Capabilities a request must ask for (all of them) to be in this class.
    #[serde(default)]
    pub require: Vec<String>,
    /// Residency zone a request must ask for to be in this class.
    #[serde(default)]
    pub residency: Option<String>,
    /// Candidate engines and their share of this class's traffic. Need not sum to one; they
    /// are normalised. Zero-weight candidates are used only when no weighted one can serve.
    pub weights: Vec<EngineWeight>,
    /// Fraction of this class's traffic the control plane plans to shed, in [0, 1].
    #[serde(default)]
    pub shed_fraction: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineWeight {
    pub engine: EngineId,
    pub weight: f64,
    /// The optimizer's expected engine latency at the planned load, for explanations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_latency_ms: Option<f64>,
    /// Network latency from this cluster to the engine, for explanations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_ms: Option<f64>,
    /// How long the plan expects a request of this class to be in flight on this engine
    /// (network, time to first token and decode), ms. By Little's law an engine holds its rate
    /// times this many requests, so when every weighted candidate of a class has it, the data
    /// plane's load bound and placement by load compare an engine's requests in flight with
    /// its share of weight × in-flight time, not with its weight alone (a slow engine holding
    /// twice a fast one's requests per unit of rate is not overloaded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight_ms: Option<f64>,
}

/// Why a snapshot was rejected. The message names the offending item.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SnapshotError {
    #[error("snapshot is {0} bytes, over the {MAX_SNAPSHOT_BYTES} byte limit")]
    TooLarge(usize),
    #[error("malformed snapshot json: {0}")]
    Json(String),
    #[error("unsupported snapshot format {0} (this build reads {FORMAT})")]
    Format(u32),
    #[error("{what}: {count} exceeds the limit of {limit}")]
    TooMany { what: &'static str, count: usize, limit: usize },
    #[error("{0}")]
    Invalid(String),
}

fn invalid(msg: impl Into<String>) -> SnapshotError {
    SnapshotError::Invalid(msg.into())
}

impl Snapshot {
    /// Parses and validates a snapshot from JSON bytes.
    pub fn from_json(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
        if bytes.len() > MAX_SNAPSHOT_BYTES {
            return Err(SnapshotError::TooLarge(bytes.len()));
        }
        let snapshot: Snapshot =
            serde_json::from_slice(bytes).map_err(|e| SnapshotError::Json(e.to_string()))?;
        snapshot.validate()?;
        Ok(snapshot)
    }

    /// Checks every invariant the routing table relies on.
    pub fn validate(&self) -> Result<(), SnapshotError> {
        if self.format != FORMAT {
            return Err(SnapshotError::Format(self.format));
        }
        check_count("engines", self.engines.len(), MAX_ENGINES)?;
        check_count("models", self.models.len(), MAX_MODELS)?;
        check_name("cluster", self.cluster.as_str())?;
        if !(0.0..=1.0).contains(&self.utilisation) {
            return Err(invalid(format!("utilisation {} is not in [0, 1]", self.utilisation)));
        }
        let mut engine_ids = HashSet::with_capacity(self.engines.len());
        for engine in &self.engines {
            check_name("engine id", engine.id.as_str())?;
            if !engine_ids.insert(engine.id.as_str()) {
                return Err(invalid(format!("duplicate engine id '{}'", engine.id)));
            }
            check_engine_url(&engine.url)
                .map_err(|why| invalid(format!("engine '{}': url '{}' {why}", engine.id, engine.url)))?;
            for tag in engine.capabilities.iter().chain(&engine.residency) {
                check_name("engine tag", tag)?;
            }
        }
        let mut models = HashSet::with_capacity(self.models.len());
        let mut total_slots = 0usize;
        for model in &self.models {
            check_name("model", model.model.as_str())?;
            if !models.insert(model.model.as_str()) {
                return Err(invalid(format!("duplicate model '{}'", model.model)));
            }
            check_count("classes", model.classes.len(), MAX_CLASSES_PER_MODEL)?;
            if model.classes.is_empty() {
                return Err(invalid(format!("model '{}' has no classes", model.model)));
            }
            let mut classes = HashSet::new();
            for class in &model.classes {
                let ctx = format!("model '{}' class '{}'", model.model, class.id);
                check_name("class id", class.id.as_str())?;
                if !classes.insert(class.id.as_str()) {
                    return Err(invalid(format!("{ctx}: duplicate class id")));
                }
                if !(0.0..=1.0).contains(&class.shed_fraction) {
                    return Err(invalid(format!(
                        "{ctx}: shed_fraction {} is not in [0, 1]",
                        class.shed_fraction
                    )));
                }
                check_count("weights", class.weights.len(), MAX_ENGINES)?;
                let mut seen = HashSet::with_capacity(class.weights.len());
                let mut total = 0.0;
                for w in &class.weights {
                    if !engine_ids.contains(w.engine.as_str()) {
                        return Err(invalid(format!("{ctx}: unknown engine '{}'", w.engine)));
                    }
                    if !seen.insert(w.engine.as_str()) {
                        return Err(invalid(format!("{ctx}: engine '{}' listed twice", w.engine)));
                    }
                    if !w.weight.is_finite() || w.weight < 0.0 {
                        return Err(invalid(format!(
                            "{ctx}: weight {} of engine '{}' is not a finite non-negative number",
                            w.weight, w.engine
                        )));
                    }
                    if let Some(ms) = w.in_flight_ms.filter(|ms| !(ms.is_finite() && *ms > 0.0)) {
                        return Err(invalid(format!(
                            "{ctx}: in_flight_ms {ms} of engine '{}' is not a positive number",
                            w.engine
                        )));
                    }
                    total += w.weight;
                }
                if class.weights.is_empty() {
                    return Err(invalid(format!("{ctx}: no candidate engines")));
                }
                if !(total > 0.0 && total.is_finite()) {
                    return Err(invalid(format!("{ctx}: weights sum to {total}, need > 0")));
                }
                let weighted = class.weights.iter().filter(|w| w.weight > 0.0).count();
                total_slots += 1usize << crate::slots::log2_slots_for(weighted);
                check_count("slot-table entries over all classes", total_slots, MAX_TOTAL_SLOTS)?;
            }
        }
        Ok(())
    }
}

fn check_count(what: &'static str, count: usize, limit: usize) -> Result<(), SnapshotError> {
    if count > limit {
        return Err(SnapshotError::TooMany { what, count, limit });
    }
    Ok(())
}

pub fn check_name(what: &str, name: &str) -> Result<(), SnapshotError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(invalid(format!("{what} '{name}' must be 1 to {MAX_NAME_LEN} bytes")));
    }
    if name.chars().any(|c| c.is_control()) {
        return Err(invalid(format!("{what} {name:?} contains control characters")));
    }
    Ok(())
}

/// Engines are `http://host:port` or `https://host:port` origins (optionally with a path
/// prefix). Anything else (other schemes, credentials, queries) is refused so that a snapshot
/// cannot turn the data plane into an open proxy.
pub fn check_engine_url(url: &str) -> Result<(), &'static str> {
    if url.len() > MAX_URL_LEN {
        return Err("is too long");
    }
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or("must start with http:// or https://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if authority.is_empty() {
        return Err("has no host");
    }
    if authority.contains('@') {
        return Err("must not carry credentials");
    }
    if path.contains(['?', '#']) {
        return Err("must not have a query or fragment");
    }
    if !url.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("contains characters that are not printable ascii");
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or("has an unterminated ipv6 address")?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':').ok_or("has junk after the ipv6 address")?)),
        }
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("has no host");
    }
    if port.is_some_and(|p| p.parse::<u16>().map_or(true, |p| p == 0)) {
        return Err("has an invalid port");
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
