//! The control plane's Prometheus metrics, every name in one place (`GET /metrics`), rendered
//! from the latest plan's view; see `docs/metrics.md` for the list with meanings.

use ilb_core::metrics::TextWriter;
use ilb_planning::view::{self, View};

pub fn render(view: &View) -> String {
    let mut w = TextWriter::new();
    w.family("ilb_controlplane_snapshot_version", "gauge", "Version of the latest published snapshots.");
    w.sample("ilb_controlplane_snapshot_version", &[], view.version as f64);
    w.family(
        "ilb_controlplane_solver_panics_total",
        "counter",
        "Solves that panicked (caught; the model's error in /v1/state says so and the next tick solves again).",
    );
    w.sample("ilb_controlplane_solver_panics_total", &[], view.solver_panics as f64);
    w.family(
        "ilb_controlplane_snapshots_refused_total",
        "counter",
        "Planned snapshots not published because they failed the data planes' validation (the cluster kept its previous one).",
    );
    w.sample("ilb_controlplane_snapshots_refused_total", &[], view.snapshots_refused as f64);

    type EngineField = fn(&view::EngineView) -> Option<f64>;
    let engine_gauges: [(&str, &str, EngineField); 17] = [
        ("ilb_controlplane_engine_running", "Requests in the engine's running batch (scraped).", |e| {
            Some(e.signals.running)
        }),
        ("ilb_controlplane_engine_waiting", "Requests in the engine's queue (scraped).", |e| {
            Some(e.signals.waiting)
        }),
        ("ilb_controlplane_engine_kv_usage", "KV-cache usage fraction (scraped).", |e| {
            Some(e.signals.kv_usage)
        }),
        (
            "ilb_controlplane_engine_ttft_ms",
            "Smoothed time to first token (scraped, or reported by data planes for engines without a TTFT histogram).",
            |e| e.signals.ttft_ms,
        ),
        (
            "ilb_controlplane_engine_tbot_ms",
            "Smoothed time between output tokens (scraped, or reported by data planes).",
            |e| e.signals.tbot_ms,
        ),
        (
            "ilb_controlplane_engine_request_rate",
            "Smoothed finished requests per second (scraped, or reported by data planes).",
            |e| e.signals.request_rate,
        ),
        ("ilb_controlplane_engine_queue_ms", "Smoothed time queued before scheduling (scraped).", |e| {
            e.signals.queue_ms
        }),
        (
            "ilb_controlplane_engine_preemption_rate",
            "Smoothed preemptions (vLLM) or retractions (SGLang) per second (scraped).",
            |e| e.signals.preemption_rate,
        ),
        ("ilb_controlplane_engine_held", "1 while the fast guard holds the engine out of the data planes.", |e| {
            Some(if e.signals.held.is_some() { 1.0 } else { 0.0 })
        }),
        ("ilb_controlplane_engine_cache_hit_rate", "Smoothed prefix-cache hit rate (scraped).", |e| {
            e.signals.cache_hit_rate
        }),
        ("ilb_controlplane_engine_health", "1 with a fresh successful scrape, else 0.", |e| Some(e.health)),
        ("ilb_controlplane_engine_penalty", "Share of capacity withheld as an outlier penalty.", |e| {
            Some(e.penalty)
        }),
        ("ilb_controlplane_engine_nominal_capacity_rps", "Replicas × per-replica capacity.", |e| {
            Some(e.nominal_capacity_rps)
        }),
        (
            "ilb_controlplane_engine_effective_capacity_rps",
            "Capacity the optimizer plans with (health and penalty applied).",
            |e| Some(e.effective_capacity_rps),
        ),
        ("ilb_controlplane_engine_planned_load_rps", "Load the latest plan sends to the engine.", |e| {
            Some(e.planned_load_rps)
        }),
        (
            "ilb_controlplane_engine_expected_latency_ms",
            "Expected engine latency at the planned load.",
            |e| Some(e.expected_latency_ms),
        ),
        (
            "ilb_controlplane_engine_marginal_price_ms",
            "Marginal cost of one more request/s at the engine.",
            |e| Some(e.marginal_price_ms),
        ),
    ];
    for (name, help, field) in engine_gauges {
        w.family(name, "gauge", help);
        for m in &view.models {
            for e in &m.engines {
                w.sample(name, &[("model", &m.model), ("engine", &e.id)], field(e).unwrap_or(f64::NAN));
            }
        }
    }
    w.family(
        "ilb_controlplane_engine_info",
        "gauge",
        "1, labelled with the engine's kind and where its signals come from.",
    );
    for m in &view.models {
        for e in &m.engines {
            let s = &e.signals;
            let source = |src: view::Source| match src {
                view::Source::Engine => "engine",
                view::Source::DataPlanes => "data_planes",
                view::Source::None => "none",
            };
            let labels = [
                ("model", m.model.as_str()),
                ("engine", e.id.as_str()),
                ("kind", s.kind),
                ("ttft_source", source(s.sources.ttft)),
                ("tbot_source", source(s.sources.tbot)),
                ("request_rate_source", source(s.sources.request_rate)),
            ];
            w.sample("ilb_controlplane_engine_info", &labels, 1.0);
        }
    }
    w.family("ilb_controlplane_weight", "gauge", "Published share of a class's traffic for an engine.");
    for m in &view.models {
        for c in &m.classes {
            for r in &c.routes {
                let labels = [
                    ("model", m.model.as_str()),
                    ("cluster", &c.cluster),
                    ("class", &c.class),
                    ("engine", &r.engine),
                ];
                w.sample("ilb_controlplane_weight", &labels, r.weight);
            }
        }
    }
    w.family("ilb_controlplane_class_demand_rps", "gauge", "Demand of a class as reported by data planes.");
    for m in &view.models {
        for c in &m.classes {
            let labels = [("model", m.model.as_str()), ("cluster", &c.cluster), ("class", &c.class)];
            w.sample("ilb_controlplane_class_demand_rps", &labels, c.measured_demand_rps);
        }
    }
    w.family("ilb_controlplane_class_shed_rps", "gauge", "Requests/s of a class the plan sheds.");
    for m in &view.models {
        for c in &m.classes {
            let labels = [("model", m.model.as_str()), ("cluster", &c.cluster), ("class", &c.class)];
            w.sample("ilb_controlplane_class_shed_rps", &labels, c.shed_rps);
        }
    }
    type ModelField = fn(&view::ModelView) -> f64;
    let model_gauges: [(&str, &str, ModelField); 5] = [
        ("ilb_controlplane_solve_seconds", "Duration of the latest solve.", |m| m.solve_ms / 1000.0),
        ("ilb_controlplane_solve_gap", "Certified relative optimality gap of the latest solve.", |m| m.gap),
        (
            "ilb_controlplane_traffic_moved",
            "Share of traffic whose engine changed in the latest solve.",
            |m| m.traffic_moved.unwrap_or(0.0),
        ),
        ("ilb_controlplane_expected_latency_ms", "Mean end-to-end latency the latest plan expects.", |m| {
            m.mean_latency_ms
        }),
        ("ilb_controlplane_solve_failed", "1 when the latest solve of the model failed.", |m| {
            if m.error.is_some() {
                1.0
            } else {
                0.0
            }
        }),
    ];
    for (name, help, field) in model_gauges {
        w.family(name, "gauge", help);
        for m in &view.models {
            w.sample(name, &[("model", &m.model)], field(m));
        }
    }
    w.family(
        "ilb_controlplane_report_age_seconds",
        "gauge",
        "Time since each live data plane last reported.",
    );
    for d in &view.data_planes {
        w.sample(
            "ilb_controlplane_report_age_seconds",
            &[("cluster", &d.cluster), ("instance", &d.instance)],
            d.age_ms as f64 / 1000.0,
        );
    }
    w.finish()
}
