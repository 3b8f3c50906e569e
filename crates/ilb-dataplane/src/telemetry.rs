//! The data plane's Prometheus metrics, every name in one place (`GET /metrics`). Everything is
//! rendered at scrape time from the atomics the request path already keeps; see
//! `docs/metrics.md` for the list with meanings.

use crate::engines::{EngineCounters, EngineState};
use crate::shared::Shared;
use ilb_core::metrics::{Histogram, TextWriter};
use std::sync::atomic::Ordering::Relaxed;

/// Which of an engine's latency histograms a metric shows.
type HistogramOf = fn(&EngineCounters) -> &Histogram;

pub fn render(shared: &Shared) -> String {
    let mut w = TextWriter::new();
    let installed = shared.routing.current();

    w.family(
        "ilb_dataplane_snapshot_version",
        "gauge",
        "Version of the installed routing snapshot (0 = none).",
    );
    w.sample(
        "ilb_dataplane_snapshot_version",
        &[],
        installed.as_ref().map_or(0.0, |i| i.table.version.0 as f64),
    );
    w.family(
        "ilb_dataplane_snapshot_age_seconds",
        "gauge",
        "Age of the installed snapshot since the control plane created it.",
    );
    let age = installed.as_ref().map_or(f64::NAN, |i| {
        crate::clock::unix_ms().saturating_sub(i.table.created_unix_ms) as f64 / 1000.0
    });
    w.sample("ilb_dataplane_snapshot_age_seconds", &[], age);
    w.family("ilb_dataplane_snapshot_installs_total", "counter", "Snapshots installed.");
    w.sample("ilb_dataplane_snapshot_installs_total", &[], shared.snapshot_installs.load(Relaxed) as f64);
    w.family(
        "ilb_dataplane_snapshot_rejections_total",
        "counter",
        "Snapshots refused, by reason: malformed (not a snapshot's JSON), invalid, stale (older than the installed one), wrong_cluster, plain_engine (an http engine while https-only).",
    );
    for (reason, count) in crate::state::InstallError::REASONS.iter().zip(&shared.snapshot_rejections) {
        w.sample(
            "ilb_dataplane_snapshot_rejections_total",
            &[("reason", reason)],
            count.load(Relaxed) as f64,
        );
    }
    w.family(
        "ilb_dataplane_utilisation",
        "gauge",
        "Fleet utilisation planned by the control plane (from the snapshot).",
    );
    w.sample("ilb_dataplane_utilisation", &[], installed.as_ref().map_or(f64::NAN, |i| i.table.utilisation));

    let budget = &shared.budget;
    let (window_requests, window_retries) = budget.window(shared.uptime());
    w.family("ilb_dataplane_retries_total", "counter", "Retries sent to another engine.");
    w.sample("ilb_dataplane_retries_total", &[], budget.retries_total.load(Relaxed) as f64);
    w.family(
        "ilb_dataplane_retry_budget_exhausted_total",
        "counter",
        "Retries refused because the budget was spent.",
    );
    w.sample("ilb_dataplane_retry_budget_exhausted_total", &[], budget.exhausted_total.load(Relaxed) as f64);
    w.family(
        "ilb_dataplane_retry_budget_ratio",
        "gauge",
        "Retries allowed per request at the current utilisation.",
    );
    let utilisation = installed.as_ref().map_or(0.0, |i| i.table.utilisation);
    w.sample("ilb_dataplane_retry_budget_ratio", &[], budget.config().ratio_at(utilisation));
    w.family("ilb_dataplane_retry_window_requests", "gauge", "Requests in the retry budget's 10 s window.");
    w.sample("ilb_dataplane_retry_window_requests", &[], window_requests as f64);
    w.family("ilb_dataplane_retry_window_retries", "gauge", "Retries in the retry budget's 10 s window.");
    w.sample("ilb_dataplane_retry_window_retries", &[], window_retries as f64);
    w.family("ilb_dataplane_waiting", "gauge", "Requests waiting for a free engine slot.");
    w.sample("ilb_dataplane_waiting", &[], shared.waiters.total() as f64);
    replicas(&mut w, &shared.peers);

    let Some(installed) = installed else { return w.finish() };
    w.family(
        "ilb_dataplane_requests_total",
        "counter",
        "Requests by model, class and outcome (ok, failed, shed, overloaded).",
    );
    for model in installed.table.models() {
        for class in &model.classes {
            let s = &installed.classes[class.seq];
            for (outcome, value) in
                [("ok", &s.ok), ("failed", &s.failed), ("shed", &s.shed), ("overloaded", &s.overloaded)]
            {
                let labels =
                    [("model", model.name.as_str()), ("class", class.id.as_str()), ("outcome", outcome)];
                w.sample("ilb_dataplane_requests_total", &labels, value.load(Relaxed) as f64);
            }
        }
    }
    w.family("ilb_dataplane_class_in_flight", "gauge", "Requests in flight per class.");
    for model in installed.table.models() {
        for class in &model.classes {
            let labels = [("model", model.name.as_str()), ("class", class.id.as_str())];
            w.sample(
                "ilb_dataplane_class_in_flight",
                &labels,
                installed.classes[class.seq].in_flight.load(Relaxed) as f64,
            );
        }
    }
    w.family("ilb_dataplane_engine_attempts_total", "counter", "Attempts sent to each engine, by outcome.");
    for e in &installed.engines {
        let (attempts, failures) = (e.counters.attempts.load(Relaxed), e.counters.failures.load(Relaxed));
        let id = e.id.as_str();
        w.sample(
            "ilb_dataplane_engine_attempts_total",
            &[("engine", id), ("outcome", "ok")],
            attempts.saturating_sub(failures) as f64,
        );
        w.sample(
            "ilb_dataplane_engine_attempts_total",
            &[("engine", id), ("outcome", "failed")],
            failures as f64,
        );
    }
    let gauge = |w: &mut TextWriter, name, help, value: fn(&EngineState) -> f64| {
        w.family(name, "gauge", help);
        for e in &installed.engines {
            w.sample(name, &[("engine", e.id.as_str())], value(e));
        }
    };
    gauge(
        &mut w,
        "ilb_dataplane_engine_in_flight",
        "Requests in flight to each engine (until the last response byte).",
        |e| e.in_flight.load(Relaxed) as f64,
    );
    gauge(
        &mut w,
        "ilb_dataplane_engine_peer_in_flight",
        "Requests the other data planes of the cluster said they have in flight to each engine.",
        |e| e.peer_in_flight.load(Relaxed) as f64,
    );
    gauge(&mut w, "ilb_dataplane_engine_ejected", "1 while the local guard keeps the engine out.", |e| {
        f64::from(u8::from(e.is_ejected()))
    });
    gauge(
        &mut w,
        "ilb_dataplane_engine_held",
        "1 while the control plane's fast guard holds the engine out (asleep, no ready replica, unreachable).",
        |e| f64::from(u8::from(e.is_held())),
    );
    w.family(
        "ilb_dataplane_engine_tls_failures_total",
        "counter",
        "Failed TLS handshakes with each https engine, by reason (unknown_issuer, name_mismatch, expired, ...).",
    );
    for e in &installed.engines {
        for (failure, count) in ilb_tls::Failure::ALL.iter().zip(&e.origin.tls_failures) {
            let count = count.load(Relaxed);
            if count > 0 {
                w.sample(
                    "ilb_dataplane_engine_tls_failures_total",
                    &[("engine", e.id.as_str()), ("reason", failure.label())],
                    count as f64,
                );
            }
        }
    }
    w.family(
        "ilb_dataplane_engine_tls_handshakes_total",
        "counter",
        "TLS handshakes with each https engine that succeeded, full or resumed.",
    );
    for e in installed.engines.iter().filter(|e| e.origin.tls_name().is_some()) {
        for (kind, count) in ["full", "resumed"].iter().zip(&e.origin.tls_handshakes) {
            w.sample(
                "ilb_dataplane_engine_tls_handshakes_total",
                &[("engine", e.id.as_str()), ("kind", kind)],
                count.load(Relaxed) as f64,
            );
        }
    }
    w.family("ilb_dataplane_guard_ejections_total", "counter", "Times the local guard ejected the engine.");
    for e in &installed.engines {
        w.sample(
            "ilb_dataplane_guard_ejections_total",
            &[("engine", e.id.as_str())],
            e.counters.ejections_total.load(Relaxed) as f64,
        );
    }
    let histograms: [(&str, &str, HistogramOf); 4] = [
        (
            "ilb_dataplane_ttfb_seconds",
            "Time from sending a request to an engine to its response headers.",
            |c| &c.ttfb,
        ),
        (
            "ilb_dataplane_stream_first_chunk_seconds",
            "Time from sending a request to an engine to the first chunk of its streamed response.",
            |c| &c.first_chunk,
        ),
        (
            "ilb_dataplane_stream_chunk_gap_seconds",
            "Time between consecutive chunks of an engine's streamed response.",
            |c| &c.chunk_gap,
        ),
        (
            "ilb_dataplane_request_duration_seconds",
            "Time from sending a request to an engine to the last response byte.",
            |c| &c.duration,
        ),
    ];
    for (name, help, histogram) in histograms {
        w.family(name, "histogram", help);
        for e in &installed.engines {
            w.histogram(name, &[("engine", e.id.as_str())], histogram(&e.counters));
        }
    }
    w.finish()
}

/// The exchange with the other data planes of the cluster (`replicas`).
fn replicas(w: &mut TextWriter, peers: &crate::shared::Peers) {
    let counters = [
        (
            "ilb_dataplane_replica_messages_received_total",
            "Delta messages taken from peers.",
            &peers.messages_received,
        ),
        (
            "ilb_dataplane_replica_messages_refused_total",
            "Delta messages refused (malformed, oversized, too many peers).",
            &peers.messages_refused,
        ),
        ("ilb_dataplane_replica_messages_sent_total", "Delta messages a peer took.", &peers.messages_sent),
        (
            "ilb_dataplane_replica_send_failures_total",
            "Delta messages not delivered (error, timeout, refusal).",
            &peers.send_failures,
        ),
        (
            "ilb_dataplane_replica_sends_skipped_total",
            "Deliveries skipped while the peer was still busy with the previous one.",
            &peers.sends_skipped,
        ),
        (
            "ilb_dataplane_replica_entries_learned_total",
            "Affinity and stored-response entries learned from peers.",
            &peers.entries_learned,
        ),
    ];
    for (name, help, counter) in counters {
        w.family(name, "counter", help);
        w.sample(name, &[], counter.load(Relaxed) as f64);
    }
}
