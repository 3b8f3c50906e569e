//! The data-plane report: what each data plane tells the control plane every period.
//! JSON on the wire (`POST /v1/reports` on the control plane).

use crate::ids::{ClassId, ClusterId, EngineId, ModelName};
use serde::{Deserialize, Serialize};

/// One data plane's observations over one reporting period.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    pub cluster: ClusterId,
    /// Identifies the data-plane instance (several may serve one cluster).
    pub instance: String,
    /// Increases with every report of this instance; duplicates and reorderings are dropped.
    pub sequence: u64,
    /// Length of the period the counts cover, in milliseconds.
    pub period_ms: u64,
    /// The snapshot version the data plane was routing on.
    pub snapshot_version: u64,
    pub demand: Vec<ClassDemand>,
    pub engines: Vec<EngineObservation>,
}

/// Demand of one traffic class as seen by this data plane.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassDemand {
    pub model: ModelName,
    pub class: ClassId,
    /// Requests that arrived in the period (admitted or shed).
    pub requests: u64,
    /// Requests shed by the data plane in the period.
    pub shed: u64,
    /// Smoothed arrival rate, requests per second.
    pub rps: f64,
    /// The smoothed rate split by priority. Absent from data planes older than this field:
    /// the control plane then counts the whole class as `normal`. (Control planes older than
    /// the field refuse reports that carry it: upgrade control planes first.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_priority: Option<PriorityRps>,
}

/// Requests per second of each priority (`x-ilb-priority`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PriorityRps {
    pub low: f64,
    pub normal: f64,
    pub high: f64,
    pub critical: f64,
}

impl PriorityRps {
    /// In priority order, lowest first.
    pub fn to_array(self) -> [f64; 4] {
        [self.low, self.normal, self.high, self.critical]
    }

    pub fn from_array([low, normal, high, critical]: [f64; 4]) -> PriorityRps {
        PriorityRps { low, normal, high, critical }
    }
}

/// One engine as seen through this data plane's proxy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineObservation {
    pub engine: EngineId,
    pub requests: u64,
    /// Failed attempts: connect errors, 5xx, timeouts, broken streams.
    pub errors: u64,
    /// Mean time to first response byte over the period, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttfb_ms: Option<f64>,
    /// Mean total request duration over the period, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    /// Mean time from sending the request to the first chunk of a streamed (SSE) response body
    /// over the period, milliseconds: time to first token as the client sees it, for engines
    /// that expose no TTFT histogram (llama.cpp, TGI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_chunk_ms: Option<f64>,
    /// Streamed responses whose first chunk arrived in the period (the weight of `first_chunk_ms`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub streams: u64,
    /// Mean gap between consecutive chunks of streamed response bodies over the period,
    /// milliseconds: the time between tokens as the client sees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_gap_ms: Option<f64>,
    /// Gaps measured in the period (the weight of `chunk_gap_ms`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub chunk_gaps: u64,
    /// Smoothed network round-trip time (TCP connect), milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_ms: Option<f64>,
    pub in_flight: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
