//! The data-plane report: what each data plane tells the control plane every period.
//! JSON on the wire (`POST /v1/reports` on the control plane).

use crate::bounds::{self, OutOfBounds};
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
    /// What this instance decided since its previous report, for the other data planes of its
    /// cluster: the control plane answers each report with the others' (see
    /// [`ReportAnswer`]). Absent from data planes older than the field and from those that
    /// exchange deltas directly (`--peer`). (Control planes older than the field refuse
    /// reports that carry it: upgrade control planes first.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<crate::deltas::Deltas>,
}

/// The control plane's answer to a report: what the other data planes of the reporter's
/// cluster decided since its previous report (their [`Report::replica`]), oldest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReportAnswer {
    #[serde(default)]
    pub replicas: Vec<crate::deltas::Deltas>,
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
    /// Generated tokens per answer finished in the period, for engines that expose no histogram
    /// of their own (llama.cpp).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<TokenCounts>,
}

/// A histogram of generated tokens per answer over
/// [`OUTPUT_TOKEN_BUCKETS`](crate::metrics::OUTPUT_TOKEN_BUCKETS).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenCounts {
    /// Answers per bucket, not cumulative: one per bound, then one above the last.
    pub buckets: Vec<u64>,
    /// Tokens over all of them.
    pub sum: u64,
}

impl TokenCounts {
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

impl Report {
    /// Parses and validates a report as it arrives on the wire.
    pub fn from_json(bytes: &[u8]) -> Result<Report, String> {
        let report: Report = serde_json::from_slice(bytes).map_err(|e| format!("malformed report: {e}"))?;
        report.validate().map_err(|e| format!("invalid report: {e}"))?;
        if let Some(deltas) = &report.replica {
            deltas.validate().map_err(|e| format!("invalid report: replica: {e}"))?;
        }
        Ok(report)
    }

    /// Checks every number against [`crate::bounds`], so that no rate or latency a data plane
    /// reports can make the control plane's demand or fits non-finite.
    pub fn validate(&self) -> Result<(), OutOfBounds> {
        bounds::check_count("period_ms", self.period_ms, &(0..=*bounds::PERIOD_MS.end()))?;
        for (i, d) in self.demand.iter().enumerate() {
            bounds::RATE_RPS.check(&format!("demand[{i}].rps"), d.rps)?;
            for (name, v) in ["low", "normal", "high", "critical"]
                .into_iter()
                .zip(d.by_priority.map(PriorityRps::to_array).unwrap_or_default())
            {
                bounds::RATE_RPS.check(&format!("demand[{i}].by_priority.{name}"), v)?;
            }
        }
        for (i, e) in self.engines.iter().enumerate() {
            for (name, v) in [
                ("ttfb_ms", e.ttfb_ms),
                ("duration_ms", e.duration_ms),
                ("first_chunk_ms", e.first_chunk_ms),
                ("chunk_gap_ms", e.chunk_gap_ms),
                ("rtt_ms", e.rtt_ms),
            ] {
                bounds::LATENCY_MS.check_opt(&format!("engines[{i}].{name}"), v)?;
            }
            if let Some(tokens) = &e.output_tokens {
                // One count per bucket of `OUTPUT_TOKEN_BUCKETS`, and +Inf.
                let expected = crate::metrics::OUTPUT_TOKEN_BUCKETS.len() as u64 + 1;
                let field = format!("engines[{i}].output_tokens.buckets (their number)");
                bounds::check_count(&field, tokens.buckets.len() as u64, &(expected..=expected))?;
            }
        }
        Ok(())
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(demand_rps: f64, rtt_ms: Option<f64>) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "cluster": "a", "instance": "i", "sequence": 1, "period_ms": 1000, "snapshot_version": 1,
            "demand": [{"model": "m", "class": "default", "requests": 1, "shed": 0, "rps": demand_rps}],
            "engines": [{"engine": "e", "requests": 1, "errors": 0, "rtt_ms": rtt_ms, "in_flight": 0}],
        }))
        .unwrap()
    }

    #[test]
    fn reports_with_numbers_out_of_bounds_are_refused() {
        assert!(Report::from_json(&report(2.5, Some(1.0))).is_ok());
        let error = Report::from_json(&report(1e300, None)).unwrap_err();
        assert_eq!(error, "invalid report: demand[0].rps: 1e300 is not in [0, 10000000]");
        assert!(Report::from_json(&report(-1.0, None)).is_err());
        assert!(Report::from_json(&report(1.0, Some(-3.0))).unwrap_err().contains("engines[0].rtt_ms"));
        // JSON has no NaN; a data plane's NaN serializes as null, which is no number at all.
        let nan = String::from_utf8(report(1.0, None)).unwrap().replace("\"rps\":1.0", "\"rps\":null");
        assert!(Report::from_json(nan.as_bytes()).unwrap_err().starts_with("malformed report"));
    }
}
