//! The data plane's Prometheus metrics, every name in one place (`GET /metrics`): the table
//! `FAMILIES`, rendered at scrape time from the atomics the request path already keeps; see
//! `docs/metrics.md` for the list with meanings.

use crate::engines::{EngineCounters, EngineState};
use crate::shared::Shared;
use crate::state::Installed;
use ilb_core::metrics::{Histogram, TextWriter, OUTPUT_TOKEN_BUCKETS};
use std::sync::atomic::Ordering::Relaxed;

pub fn render(shared: &Shared) -> String {
    let installed = shared.routing.current();
    let (window_requests, window_retries) = shared.budget.window(shared.uptime());
    let scrape = Scrape { shared, installed: installed.as_deref(), window_requests, window_retries };
    let mut w = TextWriter::new();
    for family in FAMILIES {
        // The installed snapshot's families are left out, header too, while there is none.
        if family.samples.of_snapshot() && scrape.installed.is_none() {
            continue;
        }
        w.family(family.name, family.kind, family.help);
        family.samples.write(&scrape, &mut w, family.name);
    }
    w.finish()
}

/// What one scrape reads: the shared state, the installed snapshot if any, and the retry
/// budget's window, taken once.
struct Scrape<'a> {
    shared: &'a Shared,
    installed: Option<&'a Installed>,
    window_requests: u64,
    window_retries: u64,
}

/// One metric family: its name, Prometheus type, help text and samples.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    samples: Samples,
}

/// How a family's samples come from a scrape.
enum Samples {
    /// One unlabelled sample.
    One(fn(&Scrape) -> f64),
    /// Labelled samples, written by the function.
    Labelled(fn(&Scrape, &mut TextWriter, &str)),
    /// Labelled samples of the installed snapshot, written by the function.
    Installed(fn(&Installed, &mut TextWriter, &str)),
    /// One sample per engine of the installed snapshot, labelled `engine`.
    PerEngine(fn(&EngineState) -> f64),
    /// One of each engine's latency histograms, labelled `engine`.
    EngineHistogram(fn(&EngineCounters) -> &Histogram),
    /// Each engine's generated tokens per answer, labelled `engine`.
    EngineTokens,
}

impl Samples {
    /// Whether the samples come from the installed snapshot.
    fn of_snapshot(&self) -> bool {
        !matches!(self, Samples::One(_) | Samples::Labelled(_))
    }

    fn write(&self, scrape: &Scrape, w: &mut TextWriter, name: &str) {
        let engines = scrape.installed.map_or(&[][..], |i| &i.engines[..]);
        match self {
            Samples::One(value) => {
                w.sample(name, &[], value(scrape));
            }
            Samples::Labelled(write) => write(scrape, w, name),
            Samples::Installed(write) => {
                if let Some(installed) = scrape.installed {
                    write(installed, w, name);
                }
            }
            Samples::PerEngine(value) => {
                for e in engines {
                    w.sample(name, &[("engine", e.id.as_str())], value(e));
                }
            }
            Samples::EngineHistogram(histogram) => {
                for e in engines {
                    w.histogram(name, &[("engine", e.id.as_str())], histogram(&e.counters));
                }
            }
            Samples::EngineTokens => {
                for e in engines {
                    let (counts, sum) = e.counters.output_tokens.read();
                    w.buckets(name, &[("engine", e.id.as_str())], &OUTPUT_TOKEN_BUCKETS, &counts, sum as f64);
                }
            }
        }
    }
}

/// Every metric of the data plane, in the order `/metrics` shows them.
static FAMILIES: &[Family] = &[
    Family {
        name: "ilb_dataplane_snapshot_version",
        kind: "gauge",
        help: "Version of the installed routing snapshot (0 = none).",
        samples: Samples::One(|s| s.installed.map_or(0.0, |i| i.table.version.0 as f64)),
    },
    Family {
        name: "ilb_dataplane_snapshot_age_seconds",
        kind: "gauge",
        help: "Age of the installed snapshot since the control plane created it.",
        samples: Samples::One(|s| {
            s.installed.map_or(f64::NAN, |i| {
                crate::clock::unix_ms().saturating_sub(i.table.created_unix_ms) as f64 / 1000.0
            })
        }),
    },
    Family {
        name: "ilb_dataplane_snapshot_installs_total",
        kind: "counter",
        help: "Snapshots installed.",
        samples: Samples::One(|s| s.shared.snapshot_installs.load(Relaxed) as f64),
    },
    Family {
        name: "ilb_dataplane_snapshot_rejections_total",
        kind: "counter",
        help: "Snapshots refused, by reason: malformed (not a snapshot's JSON), invalid, stale (older than the installed one), wrong_cluster, plain_engine (an http engine while https-only).",
        samples: Samples::Labelled(|s, w, name| {
            let reasons = crate::state::InstallError::REASONS.iter();
            for (reason, count) in reasons.zip(&s.shared.snapshot_rejections) {
                w.sample(name, &[("reason", reason)], count.load(Relaxed) as f64);
            }
        }),
    },
    Family {
        name: "ilb_dataplane_utilisation",
        kind: "gauge",
        help: "Fleet utilisation planned by the control plane (from the snapshot).",
        samples: Samples::One(|s| s.installed.map_or(f64::NAN, |i| i.table.utilisation)),
    },
    Family {
        name: "ilb_dataplane_retries_total",
        kind: "counter",
        help: "Retries sent to another engine.",
        samples: Samples::One(|s| s.shared.budget.retries_total.load(Relaxed) as f64),
    },
    Family {
        name: "ilb_dataplane_retry_budget_exhausted_total",
        kind: "counter",
        help: "Retries refused because the budget was spent.",
        samples: Samples::One(|s| s.shared.budget.exhausted_total.load(Relaxed) as f64),
    },
    Family {
        name: "ilb_dataplane_retry_budget_ratio",
        kind: "gauge",
        help: "Retries allowed per request at the current utilisation.",
        samples: Samples::One(|s| {
            let utilisation = s.installed.map_or(0.0, |i| i.table.utilisation);
            s.shared.budget.config().ratio_at(utilisation)
        }),
    },
    Family {
        name: "ilb_dataplane_retry_window_requests",
        kind: "gauge",
        help: "Requests in the retry budget's 10 s window.",
        samples: Samples::One(|s| s.window_requests as f64),
    },
    Family {
        name: "ilb_dataplane_retry_window_retries",
        kind: "gauge",
        help: "Retries in the retry budget's 10 s window.",
        samples: Samples::One(|s| s.window_retries as f64),
    },
    Family {
        name: "ilb_dataplane_waiting",
        kind: "gauge",
        help: "Requests waiting for a free engine slot.",
        samples: Samples::One(|s| s.shared.waiters.total() as f64),
    },
    // The exchange with the other data planes of the cluster (`replicas`).
    Family {
        name: "ilb_dataplane_replica_messages_received_total",
        kind: "counter",
        help: "Delta messages taken from peers.",
        samples: Samples::One(|s| s.shared.peers.messages_received.load(Relaxed) as f64),
    },
    Family {
        name: "ilb_dataplane_replica_messages_refused_total",
        kind: "counter",
        help: "Delta messages refused (malformed, oversized, too many peers).",
        samples: Samples::One(|s| s.shared.peers.messages_refused.load(Relaxed) as f64),
    },
    Family {
        name: "ilb_dataplane_replica_messages_sent_total",
        kind: "counter",
        help: "Delta messages a peer took.",
        samples: Samples::One(|s| s.shared.peers.messages_sent.load(Relaxed) as f64),
    },
    Family {
        name: "ilb_dataplane_replica_send_failures_total",
        kind: "counter",
        help: "Delta messages not delivered (error, timeout, refusal).",
        samples: Samples::One(|s| s.shared.peers.send_failures.load(Relaxed) as f64),
    },
    Family {
        name: "ilb_dataplane_replica_sends_skipped_total",
        kind: "counter",
        help: "Deliveries skipped while the peer was still busy with the previous one.",
        samples: Samples::One(|s| s.shared.peers.sends_skipped.load(Relaxed) as f64),
    },
    Family {
        name: "ilb_dataplane_replica_entries_learned_total",
        kind: "counter",
        help: "Affinity and stored-response entries learned from peers.",
        samples: Samples::One(|s| s.shared.peers.entries_learned.load(Relaxed) as f64),
    },
    // The installed snapshot's classes and engines.
    Family {
        name: "ilb_dataplane_requests_total",
        kind: "counter",
        help: "Requests by model, class and outcome (ok, failed, shed, overloaded).",
        samples: Samples::Installed(|installed, w, name| {
            for model in installed.table.models() {
                for class in &model.classes {
                    let s = &installed.classes[class.seq];
                    for (outcome, value) in
                        [("ok", &s.ok), ("failed", &s.failed), ("shed", &s.shed), ("overloaded", &s.overloaded)]
                    {
                        let labels =
                            [("model", model.name.as_str()), ("class", class.id.as_str()), ("outcome", outcome)];
                        w.sample(name, &labels, value.load(Relaxed) as f64);
                    }
                }
            }
        }),
    },
    Family {
        name: "ilb_dataplane_class_in_flight",
        kind: "gauge",
        help: "Requests in flight per class.",
        samples: Samples::Installed(|installed, w, name| {
            for model in installed.table.models() {
                for class in &model.classes {
                    let labels = [("model", model.name.as_str()), ("class", class.id.as_str())];
                    w.sample(name, &labels, installed.classes[class.seq].in_flight.load(Relaxed) as f64);
                }
            }
        }),
    },
    Family {
        name: "ilb_dataplane_engine_attempts_total",
        kind: "counter",
        help: "Attempts sent to each engine, by outcome.",
        samples: Samples::Installed(|installed, w, name| {
            for e in &installed.engines {
                let (attempts, failures) = (e.counters.attempts.load(Relaxed), e.counters.failures.load(Relaxed));
                let id = e.id.as_str();
                w.sample(name, &[("engine", id), ("outcome", "ok")], attempts.saturating_sub(failures) as f64);
                w.sample(name, &[("engine", id), ("outcome", "failed")], failures as f64);
            }
        }),
    },
    Family {
        name: "ilb_dataplane_engine_in_flight",
        kind: "gauge",
        help: "Requests in flight to each engine (until the last response byte).",
        samples: Samples::PerEngine(|e| e.in_flight.load(Relaxed) as f64),
    },
    Family {
        name: "ilb_dataplane_engine_peer_in_flight",
        kind: "gauge",
        help: "Requests the other data planes of the cluster said they have in flight to each engine.",
        samples: Samples::PerEngine(|e| e.peer_in_flight.load(Relaxed) as f64),
    },
    Family {
        name: "ilb_dataplane_engine_ejected",
        kind: "gauge",
        help: "1 while the local guard keeps the engine out.",
        samples: Samples::PerEngine(|e| f64::from(u8::from(e.is_ejected()))),
    },
    Family {
        name: "ilb_dataplane_engine_held",
        kind: "gauge",
        help: "1 while the control plane's fast guard holds the engine out (asleep, no ready replica, unreachable).",
        samples: Samples::PerEngine(|e| f64::from(u8::from(e.is_held()))),
    },
    Family {
        name: "ilb_dataplane_engine_tls_failures_total",
        kind: "counter",
        help: "Failed TLS handshakes with each https engine, by reason (unknown_issuer, name_mismatch, expired, ...).",
        samples: Samples::Installed(|installed, w, name| {
            for e in &installed.engines {
                for (failure, count) in ilb_tls::Failure::ALL.iter().zip(&e.origin.tls_failures) {
                    let count = count.load(Relaxed);
                    if count > 0 {
                        w.sample(name, &[("engine", e.id.as_str()), ("reason", failure.label())], count as f64);
                    }
                }
            }
        }),
    },
    Family {
        name: "ilb_dataplane_engine_tls_handshakes_total",
        kind: "counter",
        help: "TLS handshakes with each https engine that succeeded, full or resumed.",
        samples: Samples::Installed(|installed, w, name| {
            for e in installed.engines.iter().filter(|e| e.origin.tls_name().is_some()) {
                for (kind, count) in ["full", "resumed"].iter().zip(&e.origin.tls_handshakes) {
                    w.sample(name, &[("engine", e.id.as_str()), ("kind", kind)], count.load(Relaxed) as f64);
                }
            }
        }),
    },
    Family {
        name: "ilb_dataplane_guard_ejections_total",
        kind: "counter",
        help: "Times the local guard ejected the engine.",
        samples: Samples::PerEngine(|e| e.counters.ejections_total.load(Relaxed) as f64),
    },
    Family {
        name: "ilb_dataplane_ttfb_seconds",
        kind: "histogram",
        help: "Time from sending a request to an engine to its response headers.",
        samples: Samples::EngineHistogram(|c| &c.ttfb),
    },
    Family {
        name: "ilb_dataplane_stream_first_chunk_seconds",
        kind: "histogram",
        help: "Time from sending a request to an engine to the first chunk of its streamed response.",
        samples: Samples::EngineHistogram(|c| &c.first_chunk),
    },
    Family {
        name: "ilb_dataplane_stream_chunk_gap_seconds",
        kind: "histogram",
        help: "Time between consecutive chunks of an engine's streamed response.",
        samples: Samples::EngineHistogram(|c| &c.chunk_gap),
    },
    Family {
        name: "ilb_dataplane_request_duration_seconds",
        kind: "histogram",
        help: "Time from sending a request to an engine to the last response byte.",
        samples: Samples::EngineHistogram(|c| &c.duration),
    },
    Family {
        name: "ilb_dataplane_output_tokens",
        kind: "histogram",
        help: "Tokens an engine generated per answer that ended cleanly, as it states them (usage.completion_tokens, llama.cpp's timings.predicted_n) or else as a stream's token events; vLLM's request_generation_tokens buckets.",
        samples: Samples::EngineTokens,
    },
];

#[cfg(test)]
mod tests {
    use super::render;
    use crate::config::DataPlaneConfig;
    use crate::shared::Shared;
    use ilb_core::snapshot::{ClassRoutes, EngineEntry, EngineWeight, ModelRoutes, Snapshot, FORMAT};
    use ilb_core::{ClassId, ClusterId, EngineId, ModelName, SnapshotVersion};
    use std::sync::atomic::Ordering::Relaxed;

    fn snapshot() -> Snapshot {
        let engines = [("a", "http://10.0.0.1:8000", 0.75), ("b\"q", "https://10.0.0.2:8443", 0.25)];
        Snapshot {
            format: FORMAT,
            version: SnapshotVersion(7),
            created_unix_ms: 0,
            cluster: ClusterId::new("test"),
            utilisation: 0.5,
            engines: engines
                .iter()
                .map(|(id, url, _)| EngineEntry {
                    id: EngineId::new(*id),
                    url: (*url).to_owned(),
                    region: String::new(),
                    capabilities: vec![],
                    residency: vec![],
                    max_in_flight: 0,
                })
                .collect(),
            models: vec![ModelRoutes {
                model: ModelName::new("m"),
                classes: ["default", "batch"]
                    .iter()
                    .map(|class| ClassRoutes {
                        id: ClassId::new(*class),
                        require: vec![],
                        residency: None,
                        weights: engines
                            .iter()
                            .map(|(id, _, w)| EngineWeight {
                                engine: EngineId::new(*id),
                                weight: *w,
                                expected_latency_ms: None,
                                network_ms: None,
                                in_flight_ms: None,
                            })
                            .collect(),
                        shed_fraction: 0.0,
                    })
                    .collect(),
            }],
        }
    }

    /// The snapshot's age depends on the clock: its sample is left out.
    fn without_age(text: &str) -> String {
        text.lines()
            .filter(|l| !l.starts_with("ilb_dataplane_snapshot_age_seconds "))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    /// Pins `/metrics` byte for byte, before and after a snapshot is installed (the text was
    /// recorded from the line-by-line renderer the table replaced).
    #[test]
    fn metrics_text_is_pinned() {
        let shared = Shared::new(DataPlaneConfig::new("127.0.0.1:0".parse().unwrap()));
        shared.snapshot_rejections[1].fetch_add(2, Relaxed);
        shared.peers.messages_sent.fetch_add(3, Relaxed);
        assert_eq!(render(&shared), include_str!("telemetry_empty.prom"));
        shared.install(&snapshot()).unwrap();
        let installed = shared.routing.current().unwrap();
        installed.classes[0].ok.fetch_add(5, Relaxed);
        installed.classes[1].failed.fetch_add(1, Relaxed);
        installed.classes[1].in_flight.fetch_add(2, Relaxed);
        let (a, b) = (&installed.engines[0], &installed.engines[1]);
        a.counters.attempts.fetch_add(9, Relaxed);
        a.counters.failures.fetch_add(2, Relaxed);
        a.counters.ejections_total.fetch_add(1, Relaxed);
        a.in_flight.fetch_add(4, Relaxed);
        b.peer_in_flight.fetch_add(6, Relaxed);
        b.origin.tls_failures[0].fetch_add(1, Relaxed);
        b.origin.tls_handshakes[1].fetch_add(3, Relaxed);
        a.counters.ttfb.observe_micros(3_000);
        b.counters.duration.observe_micros(700_000);
        b.counters.chunk_gap.observe_micros(20_000);
        a.counters.first_chunk.observe_micros(40_000);
        for tokens in [1, 6, 6, 700, 9_000] {
            a.counters.output_tokens.observe(tokens);
        }
        assert_eq!(without_age(&render(&shared)), include_str!("telemetry_installed.prom"));
    }
}
