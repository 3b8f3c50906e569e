//! What the control plane shows: the latest plan with, for every weight, the numbers that made
//! it (network latency, expected engine latency at the planned load, marginal price, whether
//! capacity binds, penalty, residency). Served by `/v1/state`, `/v1/explain/weights` and the
//! dashboard; rebuilt after every solve.

use crate::fleet::{Fleet, Now};
use crate::plan::ModelPlan;
use crate::planner::Round;
use ilb_optimizer::Solution;
use serde::Serialize;

#[derive(Clone, Debug, Default, Serialize)]
pub struct View {
    pub version: u64,
    pub solved_unix_ms: u64,
    pub models: Vec<ModelView>,
    pub data_planes: Vec<DataPlaneView>,
    /// Where each engine came from (config, registration, discovery) and the config file's
    /// state (a refused reload and why).
    pub membership: crate::fleet::members::MembershipView,
    /// Solves that panicked since the control plane started (each is caught, the model's
    /// `error` says so, and the next tick solves again).
    pub solver_panics: u64,
    /// Planned snapshots the publisher refused because they failed validation.
    pub snapshots_refused: u64,
    /// Models with engines that the last round could not plan, and why.
    pub unplanned: Vec<crate::plan::Unplanned>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DataPlaneView {
    pub cluster: String,
    pub instance: String,
    pub age_ms: u64,
    /// The name in the verified client certificate its last report came with (mutual TLS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ModelView {
    pub model: String,
    pub solve_ms: f64,
    pub objective: f64,
    pub lower_bound: f64,
    pub gap: f64,
    pub mean_latency_ms: f64,
    /// Share of traffic whose engine changed against the previous solve.
    pub traffic_moved: Option<f64>,
    pub error: Option<String>,
    pub classes: Vec<ClassView>,
    pub engines: Vec<EngineView>,
    pub answers: AnswersView,
}

/// What a model's answers are like, as the objective's decode and tail terms take them.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AnswersView {
    /// Generated tokens per answer: the engines' token counters over their finished requests,
    /// against the configured `expected_output_tokens`.
    pub mean_output_tokens: f64,
    /// Quantiles of the decode tokens (generated tokens less the first) of the law planned with.
    pub decode_tokens_p50: Option<f64>,
    pub decode_tokens_p99: Option<f64>,
    /// Answers (decayed) in the histograms that shape that law: exposed by the engines
    /// (vLLM, SGLang, TGI), or counted by the data planes for engines that expose none.
    pub counted_by_engines: f64,
    pub counted_by_data_planes: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ClassView {
    pub cluster: String,
    pub class: String,
    pub residency: Option<String>,
    pub require: Vec<String>,
    /// Demand reported by data planes, req/s.
    pub measured_demand_rps: f64,
    /// The demand the plan expects, req/s: the centre of the class's demand band (at least the
    /// configured floor). It moves only when the measurement leaves the band, so it can sit up
    /// to a band below the measurement.
    pub planned_demand_rps: f64,
    /// What the plan routes on top of `planned_demand_rps` for bursts within the band (the
    /// optimizer plans each class at its band's top where the fleet has room), req/s.
    pub headroom_rps: f64,
    pub shed_rps: f64,
    /// The class's demand by priority, as planned: each part is shed at its priority's price,
    /// so the cheapest goes first.
    pub priorities: Vec<PriorityView>,
    pub routes: Vec<RouteView>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PriorityView {
    pub priority: &'static str,
    /// Measured demand of this priority, req/s.
    pub measured_demand_rps: f64,
    /// Demand planned for this priority (its share of the class's planned demand), req/s.
    pub planned_demand_rps: f64,
    /// What shedding one request of this priority costs in the objective, ms
    /// (`control_plane.shed_penalty_ms`).
    pub shed_price_ms: f64,
    pub shed_rps: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RouteView {
    pub engine: String,
    /// The published weight.
    pub weight: f64,
    /// Planned req/s: the weight's share of the class's admitted demand, except where the class
    /// holds its weights and part of its headroom is planned here (then weight may be 0).
    pub rps: f64,
    pub network_ms: f64,
    /// Expected engine latency at its planned load.
    pub engine_latency_ms: f64,
    /// Network + engine latency: what a request of this class sent there is expected to see.
    pub end_to_end_ms: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct EngineView {
    pub id: String,
    pub region: String,
    pub url: String,
    pub nominal_capacity_rps: f64,
    pub effective_capacity_rps: f64,
    pub health: f64,
    pub penalty: f64,
    /// Why the engine is penalised ("ttft 3.1× its profile at 42 req/s"), if it is.
    pub penalty_reason: Option<String>,
    pub planned_load_rps: f64,
    pub expected_latency_ms: f64,
    pub marginal_price_ms: f64,
    pub capacity_binds: bool,
    pub residency: Vec<String>,
    pub capabilities: Vec<String>,
    /// The latency curve the optimizer used (offline profile refined by observations, combined
    /// per the objective), in the optimizer's JSON shape.
    pub latency_profile: crate::profile::LatencyProfile,
    pub signals: SignalsView,
}

/// Where a signal came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The engine's own metrics.
    Engine,
    /// The data planes' reports (what the proxies measured), for engines that do not expose it.
    DataPlanes,
    /// Neither yet.
    None,
}

#[derive(Clone, Debug, Serialize)]
pub struct SignalsView {
    /// Which engine software the metrics come from: `vllm`, `sglang`, `llamacpp`, `tgi`,
    /// `ilb-sim`, or `unknown` (not scraped yet, or no metric ilb knows).
    pub kind: &'static str,
    /// Where `request_rate`, `ttft_ms` and `tbot_ms` (and so the latency fits) come from.
    pub sources: SourcesView,
    /// The engine reports it is asleep: it gets no traffic.
    pub asleep: bool,
    /// Ready replicas over all replicas, when the engine says.
    pub ready_fraction: Option<f64>,
    /// Why the data planes' fast guard holds the engine out now, if it does.
    pub held: Option<&'static str>,
    pub scrape_ok_age_ms: Option<u64>,
    pub scrape_error: Option<String>,
    pub running: f64,
    pub waiting: f64,
    pub kv_usage: f64,
    pub request_rate: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub tbot_ms: Option<f64>,
    pub cache_hit_rate: Option<f64>,
    pub error_rate: Option<f64>,
    /// Mean time queued before scheduling, ms (engine's queue-time histogram).
    pub queue_ms: Option<f64>,
    /// Preemptions (vLLM) or retractions (SGLang) per second: a sign of running past the knee.
    pub preemption_rate: Option<f64>,
    /// llama.cpp's own decode time per token, ms.
    pub decode_ms_per_token: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SourcesView {
    pub running: Source,
    pub request_rate: Source,
    pub ttft: Source,
    pub tbot: Source,
}

fn signals_view(
    fleet: &Fleet,
    idx: usize,
    now: Now,
    holds: &[(String, ilb_core::holds::HoldReason)],
) -> SignalsView {
    let rt = &fleet.engines[idx];
    let id = &fleet.config.engines[idx].id;
    let scraped = rt.kind.is_some();
    let source = |from_engine: bool, has_value: bool| match (from_engine, has_value) {
        (true, _) => Source::Engine,
        (false, true) => Source::DataPlanes,
        (false, false) => Source::None,
    };
    SignalsView {
        kind: rt.kind.map_or("unknown", |k| k.as_str()),
        sources: SourcesView {
            running: if scraped { Source::Engine } else { Source::None },
            request_rate: source(rt.requests_from_engine, rt.request_rate.value().is_some()),
            ttft: source(rt.ttft_from_engine, rt.ttft_ms.value().is_some()),
            tbot: source(rt.tbot_from_engine, rt.tbot_ms.value().is_some()),
        },
        asleep: rt.asleep,
        ready_fraction: rt.ready_fraction,
        held: holds.iter().find(|(engine, _)| engine == id).map(|(_, reason)| reason.as_str()),
        scrape_ok_age_ms: rt.last_scrape_ok.map(|t| now.saturating_sub(t).as_millis() as u64),
        scrape_error: rt.last_scrape_error.clone(),
        running: rt.running,
        waiting: rt.waiting,
        kv_usage: rt.kv_usage,
        request_rate: rt.request_rate.value(),
        ttft_ms: rt.ttft_ms.value(),
        tbot_ms: rt.tbot_ms.value(),
        cache_hit_rate: rt.cache_hit_rate.value(),
        error_rate: rt.error_rate.value(),
        queue_ms: rt.queue_ms.value(),
        preemption_rate: rt.preemption_rate.value(),
        decode_ms_per_token: rt.decode_ms_per_token.value(),
    }
}

/// The plan's classes with their routes and demand by priority.
fn class_views(fleet: &Fleet, plan: &ModelPlan, solution: Option<&Solution>) -> Vec<ClassView> {
    plan.classes
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let outcome = plan.outcome(k, solution);
            let routes = plan
                .engines
                .iter()
                .enumerate()
                .filter_map(|(j, &fleet_idx)| {
                    let network_ms = plan.network_ms(k, j)?;
                    let route = outcome.routes.iter().find(|r| r.0 == j);
                    let engine_latency_ms = solution.map_or(0.0, |s| s.engines[j].expected_latency_ms);
                    Some(RouteView {
                        engine: fleet.config.engines[fleet_idx].id.clone(),
                        weight: route.map_or(0.0, |r| r.2),
                        rps: route.map_or(0.0, |r| r.1),
                        network_ms,
                        engine_latency_ms,
                        end_to_end_ms: network_ms + engine_latency_ms,
                    })
                })
                .collect();
            let priorities = outcome
                .by_priority
                .iter()
                .map(|&(priority, planned, price, shed)| PriorityView {
                    priority: priority.as_str(),
                    measured_demand_rps: c.measured_by_priority[priority.index()],
                    planned_demand_rps: planned,
                    shed_price_ms: price,
                    shed_rps: shed,
                })
                .collect();
            ClassView {
                cluster: c.key.cluster.clone(),
                class: c.key.class.clone(),
                residency: c.residency.clone(),
                require: c.require.clone(),
                measured_demand_rps: c.measured_demand_rps,
                planned_demand_rps: outcome.planned_demand_rps,
                headroom_rps: outcome.headroom_rps,
                shed_rps: outcome.shed_rps,
                priorities,
                routes,
            }
        })
        .collect()
}

/// What `model`'s answers are like, as planning sees them.
fn answers(fleet: &Fleet, model: &str) -> AnswersView {
    let lengths = fleet.decode_lengths(model);
    let (counted_by_engines, counted_by_data_planes) = fleet.answers_counted(model);
    AnswersView {
        mean_output_tokens: fleet.output_tokens(model),
        decode_tokens_p50: lengths.quantile(0.5),
        decode_tokens_p99: lengths.quantile(0.99),
        counted_by_engines,
        counted_by_data_planes,
    }
}

/// The plan's engines with their planned load and signals.
fn engine_views(
    fleet: &Fleet,
    plan: &ModelPlan,
    solution: Option<&Solution>,
    now: Now,
    holds: &[(String, ilb_core::holds::HoldReason)],
) -> Vec<EngineView> {
    // The curves the plan was solved with, not the fleet's now (a scrape may have moved them).
    plan.engines
        .iter()
        .zip(plan.mean.iter().cloned())
        .enumerate()
        .map(|(j, (&idx, latency_profile))| {
            let cfg = &fleet.config.engines[idx];
            let rt = &fleet.engines[idx];
            let plan_j = solution.map(|s| &s.engines[j]);
            EngineView {
                id: cfg.id.clone(),
                region: cfg.region.clone(),
                url: cfg.url.clone(),
                nominal_capacity_rps: fleet.nominal_capacity(idx),
                effective_capacity_rps: plan.capacity_rps[j],
                health: fleet.health(idx, now),
                penalty: rt.penalty,
                penalty_reason: rt.penalty_reason.clone(),
                planned_load_rps: plan_j.map_or(0.0, |p| p.load_rps),
                expected_latency_ms: plan_j.map_or(0.0, |p| p.expected_latency_ms),
                marginal_price_ms: plan_j.map_or(0.0, |p| p.marginal_price_ms),
                capacity_binds: plan_j.is_some_and(|p| p.capacity_binds),
                residency: cfg.residency.clone(),
                capabilities: cfg.capabilities.clone(),
                latency_profile,
                signals: signals_view(fleet, idx, now, holds),
            }
        })
        .collect()
}

/// Builds the view of one solve round.
pub fn build(fleet: &Fleet, now: Now, round: &Round, version: u64, solved_unix_ms: u64) -> View {
    let holds = fleet.holds();
    let models = round
        .plans
        .iter()
        .zip(&round.results)
        .map(|(plan, (result, solve_ms))| {
            let solution = result.as_ref().ok();
            let classes = class_views(fleet, plan, solution);
            let engines = engine_views(fleet, plan, solution, now, &holds);
            ModelView {
                model: plan.model.clone(),
                solve_ms: *solve_ms,
                objective: solution.map_or(0.0, |s| s.objective),
                lower_bound: solution.map_or(0.0, |s| s.lower_bound),
                gap: solution.map_or(0.0, |s| s.gap),
                mean_latency_ms: solution.map_or(0.0, |s| s.mean_latency_ms),
                traffic_moved: solution.and_then(|s| s.traffic_moved),
                error: result.as_ref().err().cloned(),
                classes,
                engines,
                answers: answers(fleet, &plan.model),
            }
        })
        .collect();
    let data_planes = fleet
        .instances(now)
        .into_iter()
        .map(|(cluster, instance, age)| DataPlaneView {
            cluster,
            instance,
            age_ms: age.as_millis() as u64,
            identity: None,
        })
        .collect();
    View {
        version,
        solved_unix_ms,
        models,
        data_planes,
        membership: Default::default(),
        solver_panics: 0,
        snapshots_refused: 0,
        unplanned: round.unplanned.clone(),
    }
}
