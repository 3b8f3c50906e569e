//! Randomly generated fleets: scenarios nobody tuned for, drawn from a seed.
//!
//! Each fleet has 2–8 regions at real coordinates (network latency from great-circle distance),
//! engine groups of mixed `l4` / `a100` / `h100` hardware placed independently of where the
//! demand is, so some regions hold much more capacity than their clusters use and others much
//! less (a region may have demand and no engines at all), and a total demand drawn between
//! half of a rough capacity estimate and a little beyond it. Outputs are short (12–40 tokens)
//! or long (100–300). Some fleets add a residency-bound class, and some an event: an engine
//! group that fails and recovers, a demand surge, or a grey engine that turns slower.
//!
//! The capacity estimate is the engine model's closed form at the workload's mean lengths and
//! no prefix caching, the same for every policy; it only sets the scale of the demand. The
//! generated [`ScenarioFile`] goes through [`Scenario::new`](super::Scenario::new) like a
//! written one, and prints as TOML (`ilb simulate --random N --dump DIR`), so any fleet can be
//! rerun and studied on its own.

use super::raw::{
    ClusterSpec, ControlSpec, DemandSpec, EngineGroupSpec, EventKind, EventSpec, LengthDist, LengthSpec,
    RegionSpec, ScenarioFile, WorkloadSpec,
};
use ilb_engine_sim::HardwareProfile;
use ilb_planning::config::{ClassRule, NetworkSettings};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use std::collections::BTreeMap;

/// Real places: (id, latitude, longitude, residency zone).
const PLACES: [(&str, f64, f64, &str); 16] = [
    ("us-east", 39.0, -77.5, "us"),
    ("us-central", 41.3, -95.9, "us"),
    ("us-west", 45.6, -121.2, "us"),
    ("ca-central", 45.5, -73.6, "ca"),
    ("sa-east", -23.5, -46.6, "br"),
    ("eu-west", 53.3, -6.3, "eu"),
    ("eu-central", 50.1, 8.7, "eu"),
    ("eu-north", 59.3, 18.1, "eu"),
    ("eu-south", 45.5, 9.2, "eu"),
    ("uk-south", 51.5, -0.1, "uk"),
    ("me-central", 25.3, 55.3, "me"),
    ("ap-south", 19.1, 72.9, "in"),
    ("ap-southeast", 1.35, 103.8, "sg"),
    ("ap-northeast", 35.7, 139.7, "jp"),
    ("ap-east", 22.3, 114.2, "hk"),
    ("au-east", -33.9, 151.2, "au"),
];

const HARDWARE: [&str; 3] = ["l4", "a100", "h100"];

/// The policies every random fleet compares.
pub const RANDOM_POLICIES: [&str; 5] = ["round-robin", "nearest", "least-loaded", "feedback", "ilb"];

/// Simulated seconds per random fleet and the warm-up excluded from the statistics.
const DURATION_S: f64 = 240.0;
const WARMUP_S: f64 = 40.0;

/// The `index`-th random fleet of the batch `seed` (the same pair always gives the same fleet).
pub fn random_fleet(seed: u64, index: u64) -> ScenarioFile {
    let mut rng = Pcg64Mcg::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index.wrapping_add(1));
    let regions = pick_regions(&mut rng);
    let workload = random_workload(&mut rng);
    let (engines, capacity_by_region) = random_engines(&mut rng, &regions, &workload);
    let capacity: f64 = capacity_by_region.iter().sum();
    let utilisation = random_utilisation(&mut rng);
    let residency = rng.gen_bool(0.3).then(|| residency_zone(&regions, &capacity_by_region)).flatten();
    let clusters = random_clusters(&mut rng, &regions, utilisation * capacity, residency.as_ref());
    let mut engines = engines;
    if let Some(zone) = &residency {
        for group in engines.iter_mut().filter(|g| zone.regions.contains(&g.region)) {
            group.residency = vec![zone.name.clone()];
        }
    }
    let events = random_event(&mut rng, &engines, &clusters);
    ScenarioFile {
        name: format!("random-{seed}-{index}"),
        description: format!(
            "{} regions, {} engine groups, demand {:.0} % of a rough capacity of {capacity:.0} req/s, \
             outputs of {:.0} tokens{}{}",
            regions.len(),
            engines.len(),
            100.0 * utilisation,
            workload.output_tokens.mean,
            residency.as_ref().map_or(String::new(), |z| format!(", residency zone {}", z.name)),
            events.first().map_or(String::new(), |e| format!(", {} at {:.0} s", e.kind.name(), e.at_s)),
        ),
        duration_s: DURATION_S,
        warmup_s: WARMUP_S,
        seed: seed ^ index.rotate_left(17),
        policies: RANDOM_POLICIES.iter().map(|p| (*p).to_owned()).collect(),
        slo_ttft_ms: 2000.0,
        day_length_s: 86_400.0,
        start_utc_hour: 0.0,
        regions: regions
            .iter()
            .map(|&i| RegionSpec {
                id: PLACES[i].0.to_owned(),
                lat: PLACES[i].1,
                lon: PLACES[i].2,
                utc_offset_h: None,
            })
            .collect(),
        network: NetworkSettings { base_ms: 5.0, ms_per_1000_km: 12.0, ..NetworkSettings::default() },
        clusters,
        classes: residency
            .iter()
            .map(|z| ClassRule { id: z.class.clone(), require: Vec::new(), residency: Some(z.name.clone()) })
            .collect(),
        hardware: BTreeMap::new(),
        engines,
        workload,
        control: ControlSpec { calibration_s: 30.0, ..ControlSpec::default() },
        feedback: Default::default(),
        events,
    }
}

/// 2–8 distinct places, in index order.
fn pick_regions(rng: &mut Pcg64Mcg) -> Vec<usize> {
    let n = rng.gen_range(2..=8);
    let mut all: Vec<usize> = (0..PLACES.len()).collect();
    for i in 0..n {
        let j = rng.gen_range(i..all.len());
        all.swap(i, j);
    }
    let mut picked = all[..n].to_vec();
    picked.sort_unstable();
    picked
}

/// Short answers (12–40 tokens) or long ones (100–300); prompts of 100–600 tokens.
fn random_workload(rng: &mut Pcg64Mcg) -> WorkloadSpec {
    let output_mean: f64 =
        if rng.gen_bool(0.5) { rng.gen_range(12.0..40.0) } else { rng.gen_range(100.0..300.0) };
    let first_prompt: f64 = rng.gen_range(100.0..600.0);
    let length = |mean: f64, min: u32, max: u32| LengthSpec { mean, min, max, dist: LengthDist::Exponential };
    WorkloadSpec {
        turns_mean: rng.gen_range(1.5..4.0),
        think_s: rng.gen_range(2.0..8.0),
        system_prompt_tokens: rng.gen_range(32..256),
        first_prompt_tokens: length(first_prompt.round(), 16, 2000),
        followup_tokens: length(rng.gen_range(20.0..120.0_f64).round(), 4, 500),
        output_tokens: length(output_mean.round(), 4, (output_mean * 4.0) as u32),
        max_context_tokens: 6000,
    }
}

/// Engine groups: each region gets none (20 %), one or two groups of 1–4 engines of a random
/// hardware type; at least two regions get engines. Returns the groups and each region's
/// rough capacity (req/s).
fn random_engines(
    rng: &mut Pcg64Mcg,
    regions: &[usize],
    workload: &WorkloadSpec,
) -> (Vec<EngineGroupSpec>, Vec<f64>) {
    let prompt = f64::from(workload.system_prompt_tokens)
        + workload.first_prompt_tokens.mean
        + (workload.turns_mean - 1.0).max(0.0) * workload.followup_tokens.mean;
    let output = workload.output_tokens.mean;
    let mut has_engines: Vec<bool> = regions.iter().map(|_| !rng.gen_bool(0.2)).collect();
    let mut order: Vec<usize> = (0..regions.len()).collect();
    order.sort_by_key(|&r| has_engines[r]);
    for &r in order.iter().take(2usize.saturating_sub(has_engines.iter().filter(|&&h| h).count())) {
        has_engines[r] = true;
    }
    let mut groups = Vec::new();
    let mut capacity = vec![0.0; regions.len()];
    for (r, &place) in regions.iter().enumerate() {
        if !has_engines[r] {
            continue;
        }
        for g in 0..rng.gen_range(1..=2) {
            let hardware = HARDWARE[rng.gen_range(0..HARDWARE.len())];
            let count = rng.gen_range(1..=4);
            let profile = HardwareProfile::by_name(hardware).unwrap_or_default();
            capacity[r] += f64::from(count) * profile.engine_capacity_rps(prompt, output);
            groups.push(EngineGroupSpec {
                group: format!("{}-{hardware}-{g}", PLACES[place].0),
                region: PLACES[place].0.to_owned(),
                count,
                hardware: hardware.to_owned(),
                replicas: None,
                model: "m".into(),
                capabilities: Vec::new(),
                residency: Vec::new(),
            });
        }
    }
    (groups, capacity)
}

/// Demand over the rough capacity: mostly 50–85 %, a fifth 85–97 %, a tenth 97–110 %.
fn random_utilisation(rng: &mut Pcg64Mcg) -> f64 {
    match rng.gen_range(0..10) {
        0 => rng.gen_range(0.97..1.10),
        1 | 2 => rng.gen_range(0.85..0.97),
        _ => rng.gen_range(0.50..0.85),
    }
}

/// A residency zone whose regions hold engines: its name, regions and class id.
struct Zone {
    name: String,
    regions: Vec<String>,
    class: String,
    /// Rough capacity of the zone's engines, req/s.
    capacity_rps: f64,
}

/// The zone of the first region with engines whose zone has engines, if any.
fn residency_zone(regions: &[usize], capacity: &[f64]) -> Option<Zone> {
    let r = (0..regions.len()).find(|&r| capacity[r] > 0.0)?;
    let name = PLACES[regions[r]].3;
    let members: Vec<usize> = (0..regions.len()).filter(|&k| PLACES[regions[k]].3 == name).collect();
    Some(Zone {
        name: name.to_owned(),
        regions: members.iter().map(|&k| PLACES[regions[k]].0.to_owned()).collect(),
        class: format!("{name}-only"),
        capacity_rps: members.iter().map(|&k| capacity[k]).sum(),
    })
}

/// One cluster per region, sharing `total_rps` by lognormal weights (σ = 0.8), independent of
/// where the capacity is. With a residency zone, the zone's first cluster sends a share of its
/// demand (at most 60 % of the zone's capacity) as the zone's class.
fn random_clusters(
    rng: &mut Pcg64Mcg,
    regions: &[usize],
    total_rps: f64,
    zone: Option<&Zone>,
) -> Vec<ClusterSpec> {
    let weights: Vec<f64> = regions.iter().map(|_| (0.8 * standard_normal(rng)).exp()).collect();
    let sum: f64 = weights.iter().sum();
    let mut clusters: Vec<ClusterSpec> = regions
        .iter()
        .zip(&weights)
        .map(|(&place, w)| ClusterSpec {
            id: PLACES[place].0.to_owned(),
            region: PLACES[place].0.to_owned(),
            demand: vec![demand("default", round_rps(total_rps * w / sum))],
        })
        .collect();
    if let Some(zone) = zone {
        let share = rng.gen_range(0.3..0.7);
        if let Some(cluster) = clusters.iter_mut().find(|c| zone.regions.contains(&c.region)) {
            let rps = cluster.demand[0].rps;
            let bound = round_rps((share * rps).min(0.6 * zone.capacity_rps));
            cluster.demand[0].rps = round_rps(rps - bound);
            cluster.demand.push(demand(&zone.class, bound));
        }
    }
    clusters
}

fn demand(class: &str, rps: f64) -> DemandSpec {
    DemandSpec {
        model: "m".into(),
        class: class.to_owned(),
        priority: "normal".into(),
        rps,
        curve: Default::default(),
        amplitude: 0.5,
        peak_local_hour: 14.0,
        steps: Vec::new(),
    }
}

/// Two decimals, and at least 0.1 req/s (a cluster always sends something).
fn round_rps(rps: f64) -> f64 {
    (rps.max(0.1) * 100.0).round() / 100.0
}

/// At most one event, in 45 % of fleets: a group fails at 90 s and recovers at 150 s, a
/// cluster's demand surges ×1.5–2.5 for 60 s from 100 s, or one engine turns 2–3× slower at
/// 100 s.
fn random_event(rng: &mut Pcg64Mcg, engines: &[EngineGroupSpec], clusters: &[ClusterSpec]) -> Vec<EventSpec> {
    let event = |at_s: f64, kind: EventKind| EventSpec {
        at_s,
        kind,
        group: None,
        count: None,
        region: None,
        cluster: None,
        factor: None,
        duration_s: None,
        window_s: None,
    };
    let group = engines[rng.gen_range(0..engines.len())].group.clone();
    match rng.gen_range(0..20) {
        0..=2 => vec![
            EventSpec {
                group: Some(group.clone()),
                window_s: Some(60.0),
                ..event(90.0, EventKind::EngineFailure)
            },
            EventSpec { group: Some(group), ..event(150.0, EventKind::EngineRecovery) },
        ],
        3..=5 => {
            let cluster = clusters[rng.gen_range(0..clusters.len())].id.clone();
            vec![EventSpec {
                cluster: Some(cluster),
                factor: Some(rng.gen_range(1.5..2.5)),
                duration_s: Some(60.0),
                ..event(100.0, EventKind::Surge)
            }]
        }
        6..=8 => vec![EventSpec {
            group: Some(group),
            count: Some(1),
            factor: Some(rng.gen_range(2.0..3.0)),
            ..event(100.0, EventKind::Slowdown)
        }],
        _ => Vec::new(),
    }
}

/// A standard normal draw (Box–Muller).
fn standard_normal(rng: &mut Pcg64Mcg) -> f64 {
    let u: f64 = rng.gen_range(f64::EPSILON..1.0);
    let v: f64 = rng.gen_range(0.0..1.0);
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Scenario;

    #[test]
    fn random_fleets_are_valid_and_reproducible() {
        for index in 0..40 {
            let file = random_fleet(7, index);
            let text = toml::to_string(&file).expect("serialises");
            let again = toml::to_string(&random_fleet(7, index)).expect("serialises");
            assert_eq!(text, again, "fleet {index} is not reproducible");
            Scenario::new(file).unwrap_or_else(|e| panic!("fleet {index}: {e}\n{text}"));
        }
    }

    #[test]
    fn random_fleets_vary() {
        let fleets: Vec<ScenarioFile> = (0..40).map(|i| random_fleet(1, i)).collect();
        let regions: std::collections::BTreeSet<usize> = fleets.iter().map(|f| f.regions.len()).collect();
        assert!(regions.len() >= 5, "region counts {regions:?}");
        assert!(fleets.iter().any(|f| !f.classes.is_empty()), "no residency class");
        for kind in [EventKind::EngineFailure, EventKind::Surge, EventKind::Slowdown] {
            assert!(fleets.iter().any(|f| f.events.iter().any(|e| e.kind == kind)), "no {}", kind.name());
        }
        assert!(fleets.iter().any(|f| f.workload.output_tokens.mean < 40.0));
        assert!(fleets.iter().any(|f| f.workload.output_tokens.mean >= 100.0));
    }
}
