//! The comparison as text (a Markdown table, also what `ilb simulate` prints) and as JSON.

use crate::Comparison;
use std::fmt::Write;

/// The summary table: one row per policy, in run order.
pub fn table(c: &Comparison) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| policy | e2e mean | e2e p50 | e2e p99 | ttft mean | ttft p50 | ttft p99 | cache hit | goodput | shed | failed | util mean±sd | churn/period | osc/h |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for name in &c.order {
        let Some(r) = c.policies.get(name) else { continue };
        let _ = writeln!(
            out,
            "| {name} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1}% | {:.1} | {:.1}% | {} | {:.2}±{:.2} | {:.2}% | {:.1} |",
            r.e2e_ms.mean,
            r.e2e_ms.p50,
            r.e2e_ms.p99,
            r.ttft_ms.mean,
            r.ttft_ms.p50,
            r.ttft_ms.p99,
            100.0 * r.cache_hit_rate,
            r.goodput_rps,
            100.0 * r.shed_rate,
            r.failed,
            r.utilisation_mean,
            r.utilisation_spread,
            100.0 * r.weight_churn,
            r.oscillation,
        );
    }
    let _ = writeln!(out, "\nlatencies in ms (network included), goodput in req/s with TTFT within the SLO");
    if let Some(ilb) = c.policies.get("ilb") {
        if let Some(p) = ilb.steady_state_e2e_ms.or(ilb.predicted_e2e_ms) {
            let delta = 100.0 * (ilb.e2e_ms.mean - p) / p;
            let _ = writeln!(
                out,
                "ilb: optimizer-predicted mean latency at steady state {p:.1} ms, simulated {:.1} ms ({delta:+.1} %)",
                ilb.e2e_ms.mean
            );
        }
        if let Some(r) = ilb.replan_s {
            let _ = writeln!(out, "ilb: re-planned around failed engines within {r:.1} s");
        }
    }
    out
}

/// The comparison as pretty JSON (deterministic: ordered maps, no wall-clock fields).
pub fn json(c: &Comparison) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(c)
}
