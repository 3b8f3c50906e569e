//! Validation of a [`ScenarioFile`] into a [`Scenario`]: every cross-reference resolved to an
//! index, engine groups expanded to engines, the region latency matrix computed with the
//! control plane's own network model. Errors name the field (`clusters.b.demand[1].class`).

use super::raw::*;
use ilb_engine_sim::HardwareProfile;
use ilb_planning::config::{ClassRule, ControlPlaneSettings, FleetConfig, Region};
use std::collections::HashSet;

/// A scenario that failed to parse or validate; the message names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct ScenarioError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, ScenarioError> {
    Err(ScenarioError(msg.into()))
}

/// One demand stream: one cluster's traffic of one model and class.
#[derive(Clone, Debug)]
pub struct Stream {
    pub cluster: usize,
    pub model: usize,
    /// Index into [`ScenarioFile::classes`], `None` for the default class.
    pub class_rule: Option<usize>,
    pub class_id: String,
    pub priority: String,
    pub demand: DemandSpec,
    /// Local time offset of the cluster's region, hours.
    pub utc_offset_h: f64,
}

/// One engine, expanded from its group.
#[derive(Clone, Debug)]
pub struct SimEngineSpec {
    pub id: String,
    pub group: usize,
    pub region: usize,
    pub model: usize,
    pub hardware: String,
    pub profile: HardwareProfile,
    pub capabilities: Vec<String>,
    pub residency: Vec<String>,
}

/// A validated scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub file: ScenarioFile,
    pub regions: Vec<String>,
    /// Cluster id and region index.
    pub clusters: Vec<(String, usize)>,
    pub models: Vec<String>,
    pub streams: Vec<Stream>,
    pub engines: Vec<SimEngineSpec>,
    /// Round trip between regions, ms, `net_ms[from * n_regions + to]`.
    pub net_ms: Vec<f64>,
}

const PRIORITIES: [&str; 4] = ["low", "normal", "high", "critical"];

fn positive(field: &str, v: f64) -> Result<(), ScenarioError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        err(format!("{field}: must be a positive number, got {v}"))
    }
}

fn non_negative(field: &str, v: f64) -> Result<(), ScenarioError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        err(format!("{field}: must be a non-negative number, got {v}"))
    }
}

fn length(field: &str, l: &LengthSpec) -> Result<(), ScenarioError> {
    positive(&format!("{field}.mean"), l.mean)?;
    if l.min == 0 || l.min > l.max {
        return err(format!("{field}: need 1 <= min <= max, got min {} max {}", l.min, l.max));
    }
    Ok(())
}

impl Scenario {
    pub fn new(file: ScenarioFile) -> Result<Scenario, ScenarioError> {
        positive("duration_s", file.duration_s)?;
        if !(file.warmup_s.is_finite() && file.warmup_s >= 0.0 && file.warmup_s < file.duration_s) {
            return err(format!("warmup_s: must be in [0, duration_s), got {}", file.warmup_s));
        }
        positive("slo_ttft_ms", file.slo_ttft_ms)?;
        positive("day_length_s", file.day_length_s)?;
        non_negative("start_utc_hour", file.start_utc_hour)?;
        validate_policies(&file)?;
        let regions = validate_regions(&file)?;
        let region_idx = |field: String, id: &str| {
            regions
                .iter()
                .position(|r| r == id)
                .ok_or_else(|| ScenarioError(format!("{field}: unknown region '{id}'")))
        };
        let engines = validate_engines(&file, &region_idx)?;
        let mut models: Vec<String> = engines.iter().map(|e| file.engines[e.group].model.clone()).collect();
        models.sort();
        models.dedup();
        let engines: Vec<SimEngineSpec> = engines
            .into_iter()
            .map(|mut e| {
                e.model = models.iter().position(|m| *m == file.engines[e.group].model).unwrap_or(0);
                e
            })
            .collect();
        validate_classes(&file)?;
        let offsets: Vec<f64> =
            file.regions.iter().map(|r| r.utc_offset_h.unwrap_or((r.lon / 15.0).round())).collect();
        let mut clusters = Vec::new();
        let mut streams = Vec::new();
        let mut cluster_ids = HashSet::new();
        for c in &file.clusters {
            let field = format!("clusters.{}", c.id);
            if c.id.is_empty() || !cluster_ids.insert(c.id.as_str()) {
                return err(format!("clusters: empty or duplicate id '{}'", c.id));
            }
            let region = region_idx(format!("{field}.region"), &c.region)?;
            if c.demand.is_empty() {
                return err(format!("{field}.demand: at least one entry is needed"));
            }
            let mut pairs = HashSet::new();
            for (i, d) in c.demand.iter().enumerate() {
                let f = format!("{field}.demand[{i}]");
                let (model, class_rule) = validate_demand(&file, &f, d, &models, &engines, &mut pairs)?;
                streams.push(Stream {
                    cluster: clusters.len(),
                    model,
                    class_rule,
                    class_id: d.class.clone(),
                    priority: d.priority.clone(),
                    demand: d.clone(),
                    utc_offset_h: offsets[region],
                });
            }
            clusters.push((c.id.clone(), region));
        }
        if clusters.is_empty() {
            return err("clusters: at least one front-end cluster is needed");
        }
        validate_workload(&file.workload)?;
        validate_control(&file.control, &file.feedback)?;
        validate_events(&file, &regions, &clusters)?;
        let net_ms = region_latencies(&file, &regions);
        Ok(Scenario { file, regions, clusters, models, streams, engines, net_ms })
    }

    /// Round trip from a region to a region, ms.
    pub fn region_ms(&self, from: usize, to: usize) -> f64 {
        self.net_ms[from * self.regions.len() + to]
    }
}

/// Whether an engine satisfies a class rule ([`ilb_core::constraint::satisfies`]).
pub fn allows(rule: &ClassRule, engine: &SimEngineSpec) -> bool {
    ilb_core::constraint::satisfies(
        &rule.require,
        rule.residency.as_deref(),
        &engine.capabilities,
        &engine.residency,
    )
}

/// The policies to compare: known ones, each once.
fn validate_policies(file: &ScenarioFile) -> Result<(), ScenarioError> {
    if file.policies.is_empty() {
        return err("policies: at least one policy is needed");
    }
    let mut seen = HashSet::new();
    for p in &file.policies {
        if !super::POLICIES.contains(&p.as_str()) {
            return err(format!("policies: unknown policy '{p}' (known: {})", super::POLICIES.join(", ")));
        }
        if !seen.insert(p.as_str()) {
            return err(format!("policies: '{p}' listed twice"));
        }
    }
    Ok(())
}

/// Class rules: unique ids, each with a constraint.
fn validate_classes(file: &ScenarioFile) -> Result<(), ScenarioError> {
    let mut class_ids = HashSet::from(["default"]);
    for (i, rule) in file.classes.iter().enumerate() {
        if !class_ids.insert(rule.id.as_str()) {
            return err(format!("classes[{i}].id: duplicate or reserved id '{}'", rule.id));
        }
        if rule.require.is_empty() && rule.residency.is_none() {
            return err(format!("classes.{}: needs `require` or `residency`", rule.id));
        }
    }
    Ok(())
}

/// One demand entry `d` of a cluster (`f` names it in errors, `pairs` holds the cluster's
/// (model, class) pairs so far): its model's index in `models` and its class rule's in
/// `file.classes` (None for the default class), once an engine of `engines` serves it.
fn validate_demand<'a>(
    file: &ScenarioFile,
    f: &str,
    d: &'a DemandSpec,
    models: &[String],
    engines: &[SimEngineSpec],
    pairs: &mut HashSet<(&'a str, &'a str)>,
) -> Result<(usize, Option<usize>), ScenarioError> {
    let model = models
        .iter()
        .position(|m| *m == d.model)
        .ok_or_else(|| ScenarioError(format!("{f}.model: no engine serves model '{}'", d.model)))?;
    let class_rule = if d.class == "default" {
        None
    } else {
        Some(file.classes.iter().position(|r| r.id == d.class).ok_or_else(|| {
            ScenarioError(format!("{f}.class: unknown class '{}' (not in [[classes]])", d.class))
        })?)
    };
    if let Some(rule) = class_rule {
        let served = engines.iter().any(|e| e.model == model && allows(&file.classes[rule], e));
        if !served {
            return err(format!("{f}.class: no engine of model '{}' satisfies class '{}'", d.model, d.class));
        }
    }
    if !pairs.insert((d.model.as_str(), d.class.as_str())) {
        return err(format!("{f}: model '{}' class '{}' listed twice in this cluster", d.model, d.class));
    }
    if !PRIORITIES.contains(&d.priority.as_str()) {
        return err(format!("{f}.priority: unknown priority '{}' (low, normal, high, critical)", d.priority));
    }
    non_negative(&format!("{f}.rps"), d.rps)?;
    if !(0.0..=1.0).contains(&d.amplitude) {
        return err(format!("{f}.amplitude: must be in [0, 1], got {}", d.amplitude));
    }
    for (s, step) in d.steps.iter().enumerate() {
        non_negative(&format!("{f}.steps[{s}].at_s"), step.at_s)?;
        non_negative(&format!("{f}.steps[{s}].factor"), step.factor)?;
    }
    Ok((model, class_rule))
}

/// Round trips between every two regions, ms, row-major.
fn region_latencies(file: &ScenarioFile, regions: &[String]) -> Vec<f64> {
    let latency_config = FleetConfig {
        control_plane: ControlPlaneSettings::default(),
        regions: file.regions.iter().map(|r| Region { id: r.id.clone(), lat: r.lat, lon: r.lon }).collect(),
        network: file.network.clone(),
        clusters: Vec::new(),
        classes: Vec::new(),
        profiles: Default::default(),
        engines: Vec::new(),
        engine_groups: Vec::new(),
    };
    let mut net_ms = Vec::with_capacity(regions.len() * regions.len());
    for from in regions {
        for to in regions {
            net_ms.push(latency_config.region_latency_ms(from, to));
        }
    }
    net_ms
}

fn validate_regions(file: &ScenarioFile) -> Result<Vec<String>, ScenarioError> {
    if file.regions.is_empty() {
        return err("regions: at least one region is needed");
    }
    let mut ids = Vec::new();
    for r in &file.regions {
        if r.id.is_empty() || ids.contains(&r.id) {
            return err(format!("regions: empty or duplicate id '{}'", r.id));
        }
        if !(-90.0..=90.0).contains(&r.lat) || !(-180.0..=180.0).contains(&r.lon) {
            return err(format!("regions.{}: lat/lon out of range", r.id));
        }
        if let Some(o) = r.utc_offset_h {
            if !(-14.0..=14.0).contains(&o) {
                return err(format!("regions.{}.utc_offset_h: must be in [-14, 14]", r.id));
            }
        }
        ids.push(r.id.clone());
    }
    let n = &file.network;
    for (name, v) in
        [("base_ms", n.base_ms), ("ms_per_1000_km", n.ms_per_1000_km), ("same_region_ms", n.same_region_ms)]
    {
        non_negative(&format!("network.{name}"), v)?;
    }
    for link in &n.latency {
        non_negative(&format!("network.latency {}→{}", link.from, link.to), link.ms)?;
        for r in [&link.from, &link.to] {
            if !ids.contains(r) {
                return err(format!("network.latency: unknown region '{r}'"));
            }
        }
    }
    Ok(ids)
}

fn validate_engines(
    file: &ScenarioFile,
    region_idx: &dyn Fn(String, &str) -> Result<usize, ScenarioError>,
) -> Result<Vec<SimEngineSpec>, ScenarioError> {
    if file.engines.is_empty() {
        return err("engines: at least one engine group is needed");
    }
    for (name, profile) in &file.hardware {
        profile.validate().map_err(|e| ScenarioError(format!("hardware.{name}: {e}")))?;
    }
    let mut groups = HashSet::new();
    let mut out = Vec::new();
    for (g, spec) in file.engines.iter().enumerate() {
        let field = format!("engines.{}", spec.group);
        if spec.group.is_empty() || !groups.insert(spec.group.as_str()) {
            return err(format!("engines: empty or duplicate group '{}'", spec.group));
        }
        let region = region_idx(format!("{field}.region"), &spec.region)?;
        if spec.count == 0 {
            return err(format!("{field}.count: must be at least 1"));
        }
        if spec.model.is_empty() {
            return err(format!("{field}.model: must not be empty"));
        }
        let mut profile = match file.hardware.get(&spec.hardware) {
            Some(p) => p.clone(),
            None => HardwareProfile::by_name(&spec.hardware).map_err(|_| {
                ScenarioError(format!(
                    "{field}.hardware: unknown hardware '{}' (l4, a100, h100 or a [hardware.NAME] table)",
                    spec.hardware
                ))
            })?,
        };
        if let Some(r) = spec.replicas {
            if r == 0 {
                return err(format!("{field}.replicas: must be at least 1"));
            }
            profile.replicas = r;
        }
        for i in 0..spec.count {
            out.push(SimEngineSpec {
                id: format!("{}-{i}", spec.group),
                group: g,
                region,
                model: 0,
                hardware: spec.hardware.clone(),
                profile: profile.clone(),
                capabilities: spec.capabilities.clone(),
                residency: spec.residency.clone(),
            });
        }
    }
    Ok(out)
}

fn validate_workload(w: &WorkloadSpec) -> Result<(), ScenarioError> {
    if !(w.turns_mean.is_finite() && w.turns_mean >= 1.0) {
        return err(format!("workload.turns_mean: must be >= 1, got {}", w.turns_mean));
    }
    non_negative("workload.think_s", w.think_s)?;
    length("workload.first_prompt_tokens", &w.first_prompt_tokens)?;
    length("workload.followup_tokens", &w.followup_tokens)?;
    length("workload.output_tokens", &w.output_tokens)?;
    let first = w.system_prompt_tokens + w.first_prompt_tokens.max + w.output_tokens.max;
    if w.max_context_tokens < first {
        return err(format!(
            "workload.max_context_tokens: {} cannot hold the longest first turn ({first} tokens)",
            w.max_context_tokens
        ));
    }
    Ok(())
}

fn validate_control(c: &ControlSpec, f: &FeedbackSpec) -> Result<(), ScenarioError> {
    positive("control.solve_period_s", c.solve_period_s)?;
    positive("control.scrape_period_s", c.scrape_period_s)?;
    positive("control.report_period_s", c.report_period_s)?;
    non_negative("control.snapshot_delay_s", c.snapshot_delay_s)?;
    positive("control.smoothing_s", c.smoothing_s)?;
    positive("control.calibration_s", c.calibration_s)?;
    if let Some(s) = c.sample_period_s {
        positive("control.sample_period_s", s)?;
    }
    if !(c.rho > 0.0 && c.rho <= 1.0) {
        return err(format!("control.rho: {} is not in (0, 1]", c.rho));
    }
    if !(c.stability_ms.is_finite() && c.stability_ms >= 0.0) {
        return err("control.stability_ms: must be a non-negative number");
    }
    if !(0.0..=0.1).contains(&c.stability_tolerance) {
        return err("control.stability_tolerance: must be in [0, 0.1]");
    }
    if !(0.0..=10.0).contains(&c.demand_band_sigmas) {
        return err("control.demand_band_sigmas: must be in [0, 10]");
    }
    if !(0.0..=100.0).contains(&c.tail_weight) {
        return err("control.tail_weight: must be in [0, 100]");
    }
    if !(c.shed_price_floor.is_finite() && (0.0..=1000.0).contains(&c.shed_price_floor)) {
        return err("control.shed_price_floor: must be in [0, 1000]");
    }
    if !["ttft", "ttft_plus_decode"].contains(&c.objective.as_str()) {
        return err(format!(
            "control.objective: unknown objective '{}' (ttft, ttft_plus_decode)",
            c.objective
        ));
    }
    for p in PRIORITIES {
        match c.shed_penalty_ms.get(p) {
            Some(v) if v.is_finite() && *v > 0.0 => {}
            _ => return err(format!("control.shed_penalty_ms.{p}: must be a positive number")),
        }
    }
    if let Some(k) = c.shed_penalty_ms.keys().find(|k| !PRIORITIES.contains(&k.as_str())) {
        return err(format!("control.shed_penalty_ms.{k}: unknown priority"));
    }
    if !(1..=MAX_DATA_PLANES).contains(&c.data_planes) {
        return err(format!("control.data_planes: {} is not in [1, {MAX_DATA_PLANES}]", c.data_planes));
    }
    positive("feedback.period_s", f.period_s)?;
    non_negative("feedback.gain", f.gain)?;
    positive("feedback.min_weight", f.min_weight)?;
    if !(f.max_weight.is_finite() && f.max_weight > f.min_weight) {
        return err("feedback.max_weight: must be a number above min_weight");
    }
    Ok(())
}

fn validate_events(
    file: &ScenarioFile,
    regions: &[String],
    clusters: &[(String, usize)],
) -> Result<(), ScenarioError> {
    for (i, e) in file.events.iter().enumerate() {
        let f = format!("events[{i}]");
        if !(e.at_s.is_finite() && e.at_s >= 0.0 && e.at_s <= file.duration_s) {
            return err(format!("{f}.at_s: must be in [0, duration_s], got {}", e.at_s));
        }
        if let Some(g) = &e.group {
            if !file.engines.iter().any(|s| s.group == *g) {
                return err(format!("{f}.group: unknown engine group '{g}'"));
            }
        }
        if let Some(r) = &e.region {
            if !regions.contains(r) {
                return err(format!("{f}.region: unknown region '{r}'"));
            }
        }
        if let Some(c) = &e.cluster {
            if !clusters.iter().any(|(id, _)| id == c) {
                return err(format!("{f}.cluster: unknown cluster '{c}'"));
            }
        }
        match e.kind {
            EventKind::EngineFailure | EventKind::EngineRecovery | EventKind::Slowdown => {
                if e.group.is_none() && e.region.is_none() {
                    return err(format!("{f}: needs `group` or `region`"));
                }
            }
            EventKind::RegionOutage | EventKind::RegionRecovery => {
                if e.region.is_none() {
                    return err(format!("{f}.region: required for {:?}", e.kind));
                }
            }
            EventKind::Surge => {}
        }
        if matches!(e.kind, EventKind::Slowdown | EventKind::Surge) {
            positive(&format!("{f}.factor"), e.factor.unwrap_or(f64::NAN))?;
        }
        if let Some(d) = e.duration_s {
            positive(&format!("{f}.duration_s"), d)?;
        }
        if let Some(w) = e.window_s {
            positive(&format!("{f}.window_s"), w)?;
        }
    }
    Ok(())
}
