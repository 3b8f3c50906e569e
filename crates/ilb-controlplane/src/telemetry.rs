//! The control plane's Prometheus metrics, every name in one place (`GET /metrics`): the table
//! `FAMILIES`, rendered from the latest plan's view; see `docs/metrics.md` for the list with
//! meanings.

use ilb_core::metrics::TextWriter;
use ilb_planning::view::{self, ClassView, EngineView, ModelView, View};

pub fn render(view: &View) -> String {
    let mut w = TextWriter::new();
    for family in FAMILIES {
        w.family(family.name, family.kind, family.help);
        family.samples.write(view, &mut w, family.name);
    }
    w.finish()
}

/// One metric family: its name, Prometheus type, help text and samples.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    samples: Samples,
}

/// How a family's samples come from the view.
enum Samples {
    /// One unlabelled sample.
    One(fn(&View) -> f64),
    /// One sample per model, labelled `model`.
    PerModel(fn(&ModelView) -> f64),
    /// One sample per engine of each model, labelled `model` and `engine` (NaN when None).
    PerEngine(fn(&EngineView) -> Option<f64>),
    /// One sample per class of each model, labelled `model`, `cluster` and `class`.
    PerClass(fn(&ClassView) -> f64),
    /// Labelled samples, written by the function.
    Labelled(fn(&View, &mut TextWriter, &str)),
}

impl Samples {
    fn write(&self, view: &View, w: &mut TextWriter, name: &str) {
        match self {
            Samples::One(value) => {
                w.sample(name, &[], value(view));
            }
            Samples::PerModel(value) => {
                for m in &view.models {
                    w.sample(name, &[("model", &m.model)], value(m));
                }
            }
            Samples::PerEngine(value) => {
                for m in &view.models {
                    for e in &m.engines {
                        w.sample(
                            name,
                            &[("model", &m.model), ("engine", &e.id)],
                            value(e).unwrap_or(f64::NAN),
                        );
                    }
                }
            }
            Samples::PerClass(value) => {
                for m in &view.models {
                    for c in &m.classes {
                        let labels =
                            [("model", m.model.as_str()), ("cluster", &c.cluster), ("class", &c.class)];
                        w.sample(name, &labels, value(c));
                    }
                }
            }
            Samples::Labelled(write) => write(view, w, name),
        }
    }
}

/// Every metric of the control plane, in the order `/metrics` shows them.
static FAMILIES: &[Family] = &[
    Family {
        name: "ilb_controlplane_snapshot_version",
        kind: "gauge",
        help: "Version of the latest published snapshots.",
        samples: Samples::One(|v| v.version as f64),
    },
    Family {
        name: "ilb_controlplane_solver_panics_total",
        kind: "counter",
        help: "Solves that panicked (caught; the model's error in /v1/state says so and the next tick solves again).",
        samples: Samples::One(|v| v.solver_panics as f64),
    },
    Family {
        name: "ilb_controlplane_snapshots_refused_total",
        kind: "counter",
        help: "Planned snapshots not published because they failed the data planes' validation (the cluster kept its previous one).",
        samples: Samples::One(|v| v.snapshots_refused as f64),
    },
    Family {
        name: "ilb_controlplane_engine_running",
        kind: "gauge",
        help: "Requests in the engine's running batch (scraped).",
        samples: Samples::PerEngine(|e| Some(e.signals.running)),
    },
    Family {
        name: "ilb_controlplane_engine_waiting",
        kind: "gauge",
        help: "Requests in the engine's queue (scraped).",
        samples: Samples::PerEngine(|e| Some(e.signals.waiting)),
    },
    Family {
        name: "ilb_controlplane_engine_kv_usage",
        kind: "gauge",
        help: "KV-cache usage fraction (scraped).",
        samples: Samples::PerEngine(|e| Some(e.signals.kv_usage)),
    },
    Family {
        name: "ilb_controlplane_engine_ttft_ms",
        kind: "gauge",
        help: "Smoothed time to first token (scraped, or reported by data planes for engines without a TTFT histogram).",
        samples: Samples::PerEngine(|e| e.signals.ttft_ms),
    },
    Family {
        name: "ilb_controlplane_engine_tbot_ms",
        kind: "gauge",
        help: "Smoothed time between output tokens (scraped, or reported by data planes).",
        samples: Samples::PerEngine(|e| e.signals.tbot_ms),
    },
    Family {
        name: "ilb_controlplane_engine_request_rate",
        kind: "gauge",
        help: "Smoothed finished requests per second (scraped, or reported by data planes).",
        samples: Samples::PerEngine(|e| e.signals.request_rate),
    },
    Family {
        name: "ilb_controlplane_engine_queue_ms",
        kind: "gauge",
        help: "Smoothed time queued before scheduling (scraped).",
        samples: Samples::PerEngine(|e| e.signals.queue_ms),
    },
    Family {
        name: "ilb_controlplane_engine_preemption_rate",
        kind: "gauge",
        help: "Smoothed preemptions (vLLM) or retractions (SGLang) per second (scraped).",
        samples: Samples::PerEngine(|e| e.signals.preemption_rate),
    },
    Family {
        name: "ilb_controlplane_engine_held",
        kind: "gauge",
        help: "1 while the fast guard holds the engine out of the data planes.",
        samples: Samples::PerEngine(|e| Some(if e.signals.held.is_some() { 1.0 } else { 0.0 })),
    },
    Family {
        name: "ilb_controlplane_engine_cache_hit_rate",
        kind: "gauge",
        help: "Smoothed prefix-cache hit rate (scraped).",
        samples: Samples::PerEngine(|e| e.signals.cache_hit_rate),
    },
    Family {
        name: "ilb_controlplane_engine_health",
        kind: "gauge",
        help: "1 with a fresh successful scrape, else 0.",
        samples: Samples::PerEngine(|e| Some(e.health)),
    },
    Family {
        name: "ilb_controlplane_engine_penalty",
        kind: "gauge",
        help: "Share of capacity withheld as an outlier penalty.",
        samples: Samples::PerEngine(|e| Some(e.penalty)),
    },
    Family {
        name: "ilb_controlplane_engine_nominal_capacity_rps",
        kind: "gauge",
        help: "Replicas × per-replica capacity.",
        samples: Samples::PerEngine(|e| Some(e.nominal_capacity_rps)),
    },
    Family {
        name: "ilb_controlplane_engine_effective_capacity_rps",
        kind: "gauge",
        help: "Capacity the optimizer plans with (health and penalty applied).",
        samples: Samples::PerEngine(|e| Some(e.effective_capacity_rps)),
    },
    Family {
        name: "ilb_controlplane_engine_planned_load_rps",
        kind: "gauge",
        help: "Load the latest plan sends to the engine.",
        samples: Samples::PerEngine(|e| Some(e.planned_load_rps)),
    },
    Family {
        name: "ilb_controlplane_engine_expected_latency_ms",
        kind: "gauge",
        help: "Expected engine latency at the planned load.",
        samples: Samples::PerEngine(|e| Some(e.expected_latency_ms)),
    },
    Family {
        name: "ilb_controlplane_engine_marginal_price_ms",
        kind: "gauge",
        help: "Marginal cost of one more request/s at the engine.",
        samples: Samples::PerEngine(|e| Some(e.marginal_price_ms)),
    },
    Family {
        name: "ilb_controlplane_engine_info",
        kind: "gauge",
        help: "1, labelled with the engine's kind and where its signals come from.",
        samples: Samples::Labelled(engine_info),
    },
    Family {
        name: "ilb_controlplane_weight",
        kind: "gauge",
        help: "Published share of a class's traffic for an engine.",
        samples: Samples::Labelled(weights),
    },
    Family {
        name: "ilb_controlplane_class_demand_rps",
        kind: "gauge",
        help: "Demand of a class as reported by data planes.",
        samples: Samples::PerClass(|c| c.measured_demand_rps),
    },
    Family {
        name: "ilb_controlplane_class_shed_rps",
        kind: "gauge",
        help: "Requests/s of a class the plan sheds.",
        samples: Samples::PerClass(|c| c.shed_rps),
    },
    Family {
        name: "ilb_controlplane_solve_seconds",
        kind: "gauge",
        help: "Duration of the latest solve.",
        samples: Samples::PerModel(|m| m.solve_ms / 1000.0),
    },
    Family {
        name: "ilb_controlplane_solve_gap",
        kind: "gauge",
        help: "Certified relative optimality gap of the latest solve.",
        samples: Samples::PerModel(|m| m.gap),
    },
    Family {
        name: "ilb_controlplane_traffic_moved",
        kind: "gauge",
        help: "Share of traffic whose engine changed in the latest solve.",
        samples: Samples::PerModel(|m| m.traffic_moved.unwrap_or(0.0)),
    },
    Family {
        name: "ilb_controlplane_expected_latency_ms",
        kind: "gauge",
        help: "Mean end-to-end latency the latest plan expects.",
        samples: Samples::PerModel(|m| m.mean_latency_ms),
    },
    Family {
        name: "ilb_controlplane_solve_failed",
        kind: "gauge",
        help: "1 when the latest solve of the model failed.",
        samples: Samples::PerModel(|m| if m.error.is_some() { 1.0 } else { 0.0 }),
    },
    Family {
        name: "ilb_controlplane_report_age_seconds",
        kind: "gauge",
        help: "Time since each live data plane last reported.",
        samples: Samples::Labelled(report_ages),
    },
];

fn engine_info(view: &View, w: &mut TextWriter, name: &str) {
    let source = |src: view::Source| match src {
        view::Source::Engine => "engine",
        view::Source::DataPlanes => "data_planes",
        view::Source::None => "none",
    };
    for m in &view.models {
        for e in &m.engines {
            let s = &e.signals;
            let labels = [
                ("model", m.model.as_str()),
                ("engine", e.id.as_str()),
                ("kind", s.kind),
                ("ttft_source", source(s.sources.ttft)),
                ("tbot_source", source(s.sources.tbot)),
                ("request_rate_source", source(s.sources.request_rate)),
            ];
            w.sample(name, &labels, 1.0);
        }
    }
}

fn weights(view: &View, w: &mut TextWriter, name: &str) {
    for m in &view.models {
        for c in &m.classes {
            for r in &c.routes {
                let labels = [
                    ("model", m.model.as_str()),
                    ("cluster", &c.cluster),
                    ("class", &c.class),
                    ("engine", &r.engine),
                ];
                w.sample(name, &labels, r.weight);
            }
        }
    }
}

fn report_ages(view: &View, w: &mut TextWriter, name: &str) {
    for d in &view.data_planes {
        w.sample(name, &[("cluster", &d.cluster), ("instance", &d.instance)], d.age_ms as f64 / 1000.0);
    }
}

#[cfg(test)]
mod tests {
    use super::render;
    use ilb_planning::profile::LatencyProfile;
    use ilb_planning::view::*;

    fn engine(id: &str, scraped: bool) -> EngineView {
        let source = if scraped { Source::Engine } else { Source::DataPlanes };
        EngineView {
            id: id.to_owned(),
            region: "eu".to_owned(),
            url: format!("http://{id}:8000"),
            nominal_capacity_rps: 10.0,
            effective_capacity_rps: 8.5,
            health: 1.0,
            penalty: 0.15,
            penalty_reason: None,
            planned_load_rps: 4.25,
            expected_latency_ms: 812.5,
            marginal_price_ms: 1300.0,
            capacity_binds: false,
            residency: vec![],
            capabilities: vec![],
            latency_profile: LatencyProfile::Queueing { t0_ms: 500.0, b_ms: 40.0 },
            signals: SignalsView {
                kind: if scraped { "vllm" } else { "unknown" },
                sources: SourcesView {
                    running: source,
                    request_rate: source,
                    ttft: source,
                    tbot: Source::None,
                },
                asleep: false,
                ready_fraction: None,
                held: (!scraped).then_some("asleep"),
                scrape_ok_age_ms: None,
                scrape_error: None,
                running: 3.0,
                waiting: 1.0,
                kv_usage: 0.25,
                request_rate: Some(4.0),
                ttft_ms: scraped.then_some(120.5),
                tbot_ms: None,
                cache_hit_rate: Some(0.5),
                error_rate: None,
                queue_ms: scraped.then_some(7.0),
                preemption_rate: None,
                decode_ms_per_token: None,
            },
        }
    }

    fn class(class: &str, engines: &[(&str, f64)]) -> ClassView {
        ClassView {
            cluster: "edge".to_owned(),
            class: class.to_owned(),
            residency: None,
            require: vec![],
            measured_demand_rps: 6.5,
            planned_demand_rps: 7.0,
            headroom_rps: 0.5,
            shed_rps: 0.25,
            priorities: vec![],
            routes: engines
                .iter()
                .map(|&(engine, weight)| RouteView {
                    engine: engine.to_owned(),
                    weight,
                    rps: 6.0 * weight,
                    network_ms: 2.0,
                    engine_latency_ms: 800.0,
                    end_to_end_ms: 802.0,
                })
                .collect(),
        }
    }

    /// Pins `/metrics` byte for byte (the text was recorded from the line-by-line renderer the
    /// table replaced).
    #[test]
    fn metrics_text_is_pinned() {
        let empty = View::default();
        assert_eq!(render(&empty), include_str!("telemetry_empty.prom"));
        let view = View {
            version: 42,
            solver_panics: 1,
            snapshots_refused: 2,
            models: vec![
                ModelView {
                    model: "llama".to_owned(),
                    solve_ms: 12.5,
                    objective: 100.0,
                    lower_bound: 99.0,
                    gap: 0.01,
                    mean_latency_ms: 805.25,
                    traffic_moved: Some(0.125),
                    error: None,
                    classes: vec![
                        class("default", &[("a", 0.75), ("b\"q", 0.25)]),
                        class("batch", &[("a", 1.0)]),
                    ],
                    engines: vec![engine("a", true), engine("b\"q", false)],
                    answers: Default::default(),
                },
                ModelView {
                    model: "qwen".to_owned(),
                    solve_ms: 0.0,
                    objective: 0.0,
                    lower_bound: 0.0,
                    gap: 0.0,
                    mean_latency_ms: 0.0,
                    traffic_moved: None,
                    error: Some("no engines".to_owned()),
                    classes: vec![],
                    engines: vec![],
                    answers: Default::default(),
                },
            ],
            data_planes: vec![DataPlaneView {
                cluster: "edge".to_owned(),
                instance: "dp-1".to_owned(),
                age_ms: 1500,
                identity: None,
            }],
            ..View::default()
        };
        assert_eq!(render(&view), include_str!("telemetry_view.prom"));
    }
}
