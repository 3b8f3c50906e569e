//! Seeded generator of realistic routing problems, shared by the benchmarks, the tests and the
//! fleet simulator: regions on a globe, network latency from great-circle distance (5–150 ms),
//! engines of a few hardware classes, demand placed differently from capacity, data-residency
//! zones that forbid 10–15 % of the pairs, and an overload knob that forces shedding.
//!
//! Two network models: the clustered one (every engine of a region at the region's centre, one
//! per-engine constant on top, so the columns of a region differ only by a constant) and the
//! noisy one ([`Noise`]: sites jittered around their region's centre and independent noise on
//! every pair, as measured round-trip times look).
//!
//! The fleet variant ([`Fleet`], `GenConfig::fleet`) looks like a real deployment rather than a
//! random one: sixteen real cloud regions whose shares of demand and of capacity are deliberately
//! mismatched, four hardware classes with an eightfold capacity spread and their own curves,
//! residency rules that forbid many pairs, and lognormal per-cluster demand.
//!
//! Pure: the same config gives the same problem, bit for bit, on every platform.

use crate::problem::{Class, Engine, Latency, NetworkMatrix, Problem};

/// What to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct GenConfig {
    pub n_classes: usize,
    pub n_engines: usize,
    pub seed: u64,
    /// Total demand / total usable capacity (0.75 typical, above 1 forces shedding).
    pub load_factor: f64,
    /// Fraction of classes restricted to their residency zone (≈ 0.18 gives 10–15 % forbidden).
    pub resident_fraction: f64,
    /// Fraction of engines with a fitted piecewise-linear curve instead of the queueing shape.
    pub piecewise_fraction: f64,
    pub rho: f64,
    /// `None`: the clustered network model; `Some`: sites and pairs jittered (see [`Noise`]).
    pub noise: Option<Noise>,
    /// `Some`: the real-looking fleet (see [`Fleet`]) instead of random regions and hardware;
    /// `resident_fraction` is then unused (the fleet's residency rules replace it).
    pub fleet: Option<Fleet>,
}

/// A fleet that looks like a real one (issue 33). Regions: the sixteen of [`FLEET_REGIONS`], each
/// with its share of demand and a ratio of capacity share to demand share between 0.2 and 1.6.
/// Hardware: the four classes of [`FLEET_HARDWARE`] (about 20, 45, 90 and 160 req/s, each ± 20 %;
/// t0 140 down to 40 ms, b 40 down to 8 ms), drawn per engine. Residency: `group_restricted` of the
/// clusters of the residency group (the EU regions) may use only that group's engines, and
/// `sovereign_engines` of the sovereign region's engines serve only that region's clusters; on
/// top, `random_forbidden` of all pairs are forbidden at random. Demand: a region's share split
/// over its clusters by lognormal weights with σ = `demand_sigma`.
#[derive(Clone, Debug, PartialEq)]
pub struct Fleet {
    pub group_restricted: f64,
    pub sovereign_engines: f64,
    pub random_forbidden: f64,
    pub demand_sigma: f64,
}

impl Default for Fleet {
    /// The fleet: half of the group's clusters restricted, 30 % sovereign engines, 2 %
    /// random forbidden pairs, σ = 0.6.
    fn default() -> Self {
        Fleet { group_restricted: 0.5, sovereign_engines: 0.3, random_forbidden: 0.02, demand_sigma: 0.6 }
    }
}

/// A real region: name, latitude, longitude, share of demand, capacity share / demand share, and
/// its residency: 1 = the residency group (EU), 2 = the sovereign region, 0 = neither. The
/// capacity shares are renormalised, so the ratios hold relative to each other (after it, the
/// regions hold from about a fifth of the capacity their demand needs up to about 1.6 times it).
pub const FLEET_REGIONS: [(&str, f64, f64, f64, f64, u8); 16] = [
    ("us-east", 38.9, -77.4, 0.16, 1.6, 0),
    ("us-west", 45.6, -121.2, 0.10, 1.5, 0),
    ("us-central", 41.3, -95.9, 0.06, 1.6, 0),
    ("canada", 45.5, -73.6, 0.03, 0.5, 0),
    ("brazil", -23.5, -46.6, 0.06, 0.2, 0),
    ("eu-west", 53.3, -6.3, 0.08, 1.3, 1),
    ("eu-central", 50.1, 8.7, 0.09, 0.6, 1),
    ("eu-north", 59.3, 18.1, 0.03, 1.6, 1),
    ("uk", 51.5, -0.1, 0.05, 0.7, 0),
    ("middle-east", 26.1, 50.6, 0.03, 0.3, 0),
    ("india", 19.1, 72.9, 0.08, 0.25, 2),
    ("singapore", 1.35, 103.8, 0.06, 1.4, 0),
    ("japan", 35.7, 139.7, 0.06, 0.9, 0),
    ("korea", 37.6, 127.0, 0.03, 1.2, 0),
    ("australia", -33.9, 151.2, 0.04, 0.8, 0),
    ("south-africa", -33.9, 18.4, 0.04, 0.2, 0),
];

/// The fleet's hardware classes: (share of engines, capacity req/s, t0 ms, b ms); capacity ± 20 %
/// per engine, t0 and b ± 10 %.
pub const FLEET_HARDWARE: [(f64, f64, f64, f64); 4] = [
    (0.35, 20.0, 140.0, 40.0),
    (0.30, 45.0, 100.0, 24.0),
    (0.20, 90.0, 70.0, 14.0),
    (0.15, 160.0, 40.0, 8.0),
];

/// The noisy network model: each cluster's site is its region's centre moved by up to
/// `cluster_jitter_deg` in latitude and longitude, each engine's by up to `engine_jitter_deg`,
/// and RTT = 5 ms + great-circle km / 130 + uniform [0, `pair_ms`) per pair, clipped to [5, 150].
#[derive(Clone, Debug, PartialEq)]
pub struct Noise {
    pub cluster_jitter_deg: f64,
    pub engine_jitter_deg: f64,
    pub pair_ms: f64,
}

impl Default for Noise {
    /// Metros and zones around a region's centre: clusters ±2°, engines ±1°, 0–3 ms per pair.
    fn default() -> Self {
        Noise { cluster_jitter_deg: 2.0, engine_jitter_deg: 1.0, pair_ms: 3.0 }
    }
}

impl GenConfig {
    /// A typical instance: 75 % load, 18 % resident classes, 20 % piecewise curves, ρ = 0.95.
    pub fn new(n_classes: usize, n_engines: usize, seed: u64) -> Self {
        GenConfig {
            n_classes,
            n_engines,
            seed,
            load_factor: 0.75,
            resident_fraction: 0.18,
            piecewise_fraction: 0.2,
            rho: 0.95,
            noise: None,
            fleet: None,
        }
    }

    /// A real-looking fleet ([`Fleet::default`]) on the noisy network model at 72 % load.
    pub fn fleet(n_classes: usize, n_engines: usize, seed: u64) -> Self {
        GenConfig { fleet: Some(Fleet::default()), ..Self::noisy(n_classes, n_engines, seed) }
    }

    /// A noisy instance ([`Noise::default`]) at 72 % load.
    pub fn noisy(n_classes: usize, n_engines: usize, seed: u64) -> Self {
        GenConfig {
            load_factor: 0.72,
            noise: Some(Noise::default()),
            ..Self::new(n_classes, n_engines, seed)
        }
    }

    /// The same with demand at `load_factor` × the usable capacity.
    pub fn with_load(mut self, load_factor: f64) -> Self {
        self.load_factor = load_factor;
        self
    }

    /// The same with demand at 120 % of the usable capacity.
    pub fn overloaded(mut self) -> Self {
        self.load_factor = 1.2;
        self
    }
}

/// SplitMix64: tiny, seeded, portable.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Standard normal (Box–Muller, one of the pair).
    fn normal(&mut self) -> f64 {
        let u = 1.0 - self.unit(); // (0, 1]
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    fn index(&mut self, n: usize) -> usize {
        ((self.unit() * n as f64) as usize).min(n.saturating_sub(1))
    }

    /// Index drawn with probability proportional to `weights`.
    fn weighted(&mut self, weights: &[f64]) -> usize {
        let total: f64 = weights.iter().sum();
        let mut x = self.unit() * total;
        for (i, w) in weights.iter().enumerate() {
            if x < *w {
                return i;
            }
            x -= w;
        }
        weights.len() - 1
    }
}

#[derive(Clone)]
struct Region {
    lat: f64,
    lon: f64,
    zone: usize,
}

impl Region {
    /// The same region's site moved by up to `deg` degrees in latitude and longitude.
    fn jittered(&self, rng: &mut Rng, deg: f64) -> Region {
        Region {
            lat: (self.lat + rng.range(-deg, deg)).clamp(-89.0, 89.0),
            lon: self.lon + rng.range(-deg, deg),
            zone: self.zone,
        }
    }
}

/// Hardware classes: (capacity req/s, t0 ms, b ms).
const HARDWARE: [(f64, f64, f64); 3] = [(30.0, 60.0, 15.0), (20.0, 80.0, 20.0), (12.0, 110.0, 30.0)];

/// Generates one problem.
pub fn generate(config: &GenConfig) -> Problem {
    if let Some(fleet) = &config.fleet {
        return generate_fleet(config, fleet);
    }
    let mut rng = Rng(config.seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x5EED);
    let n_regions = (config.n_classes.max(config.n_engines) as f64).sqrt().ceil().clamp(3.0, 16.0) as usize;
    let regions: Vec<Region> = (0..n_regions)
        .map(|_| {
            let lon = rng.range(-180.0, 180.0);
            // Zones by longitude: Americas, Europe/Africa, Asia/Pacific.
            let zone = if lon < -30.0 {
                0
            } else if lon < 60.0 {
                1
            } else {
                2
            };
            Region { lat: rng.range(-45.0, 60.0), lon, zone }
        })
        .collect();
    // Demand and capacity are spread over regions with independent weights: they do not match.
    let demand_weight: Vec<f64> = (0..n_regions).map(|_| rng.range(0.2, 1.0).powi(2)).collect();
    let capacity_weight: Vec<f64> = (0..n_regions).map(|_| rng.range(0.2, 1.0).powi(2)).collect();

    let mut engines = Vec::with_capacity(config.n_engines);
    let mut engine_region = Vec::with_capacity(config.n_engines);
    let mut engine_jitter = Vec::with_capacity(config.n_engines);
    let mut engine_site = Vec::with_capacity(config.n_engines);
    for j in 0..config.n_engines {
        let region = if j < n_regions { j } else { rng.weighted(&capacity_weight) };
        let (cap, t0, b) = HARDWARE[rng.index(HARDWARE.len())];
        let capacity = cap * rng.range(0.8, 1.2);
        let latency = curve(&mut rng, config, capacity, t0, b);
        engines.push(Engine { id: format!("engine-{j}"), capacity_rps: capacity, latency });
        engine_region.push(region);
        engine_jitter.push(rng.range(0.0, 2.0));
        if let Some(noise) = &config.noise {
            engine_site.push(regions[region].jittered(&mut rng, noise.engine_jitter_deg));
        }
    }
    let usable: f64 = engines.iter().map(|e| e.capacity_rps * config.rho).sum();

    let mut classes = Vec::with_capacity(config.n_classes);
    let mut class_region = Vec::with_capacity(config.n_classes);
    let mut resident = Vec::with_capacity(config.n_classes);
    let mut raw_demand = Vec::with_capacity(config.n_classes);
    let mut class_site = Vec::with_capacity(config.n_classes);
    for k in 0..config.n_classes {
        let region = if k < n_regions { k } else { rng.weighted(&demand_weight) };
        class_region.push(region);
        if let Some(noise) = &config.noise {
            class_site.push(regions[region].jittered(&mut rng, noise.cluster_jitter_deg));
        }
        resident.push(rng.unit() < config.resident_fraction);
        raw_demand.push(demand_weight[region] * rng.range(0.3, 1.7));
    }
    let raw_total: f64 = raw_demand.iter().sum();
    for (k, raw) in raw_demand.iter().enumerate() {
        let tier = rng.index(3);
        classes.push(Class {
            id: format!("class-{k}"),
            demand_rps: config.load_factor * usable * raw / raw_total,
            shed_penalty_ms: [5_000.0, 10_000.0, 20_000.0][tier],
            headroom_rps: 0.0,
        });
    }
    // Values are finite and non-negative by construction.
    let network = match &config.noise {
        None => NetworkMatrix::from_fn_unchecked(config.n_classes, config.n_engines, |k, j| {
            let (a, b) = (&regions[class_region[k]], &regions[engine_region[j]]);
            if resident[k] && a.zone != b.zone {
                return None;
            }
            Some(network_ms(a, b) + engine_jitter[j])
        }),
        Some(noise) => {
            // Called engine-major, pair by pair: one draw per pair, allowed or not.
            NetworkMatrix::from_fn_unchecked(config.n_classes, config.n_engines, |k, j| {
                let pair = rng.range(0.0, noise.pair_ms);
                if resident[k] && regions[class_region[k]].zone != regions[engine_region[j]].zone {
                    return None;
                }
                let km = great_circle_km(&class_site[k], &engine_site[j]);
                Some((5.0 + km / 130.0 + pair).clamp(5.0, 150.0))
            })
        }
    };
    Problem { rho: config.rho, classes, engines, network_ms: network }
}

/// The real-looking fleet: see [`Fleet`]. Sites and per-pair noise follow `config.noise` (none:
/// every site at its region's centre, no per-pair noise).
fn generate_fleet(config: &GenConfig, fleet: &Fleet) -> Problem {
    let mut rng = Rng(config.seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0xF1EE7);
    let noise = config.noise.clone().unwrap_or(Noise {
        cluster_jitter_deg: 0.0,
        engine_jitter_deg: 0.0,
        pair_ms: 0.0,
    });
    let regions: Vec<Region> = FLEET_REGIONS
        .iter()
        .map(|&(_, lat, lon, _, _, residency)| Region { lat, lon, zone: residency as usize })
        .collect();
    let demand_share: Vec<f64> = FLEET_REGIONS.iter().map(|r| r.3).collect();
    let capacity_share: Vec<f64> = FLEET_REGIONS.iter().map(|r| r.3 * r.4).collect();
    let hardware_share: Vec<f64> = FLEET_HARDWARE.iter().map(|h| h.0).collect();
    let n_regions = regions.len();

    let mut engines = Vec::with_capacity(config.n_engines);
    let mut engine_region = Vec::with_capacity(config.n_engines);
    let mut engine_site = Vec::with_capacity(config.n_engines);
    let mut sovereign_only = Vec::with_capacity(config.n_engines);
    for j in 0..config.n_engines {
        let region = if j < n_regions { j } else { rng.weighted(&capacity_share) };
        let (_, cap, t0, b) = FLEET_HARDWARE[rng.weighted(&hardware_share)];
        let capacity = cap * rng.range(0.8, 1.2);
        let (t0, b) = (t0 * rng.range(0.9, 1.1), b * rng.range(0.9, 1.1));
        engines.push(Engine {
            id: format!("engine-{j}"),
            capacity_rps: capacity,
            latency: curve(&mut rng, config, capacity, t0, b),
        });
        engine_site.push(regions[region].jittered(&mut rng, noise.engine_jitter_deg));
        sovereign_only.push(regions[region].zone == 2 && rng.unit() < fleet.sovereign_engines);
        engine_region.push(region);
    }
    let usable: f64 = engines.iter().map(|e| e.capacity_rps * config.rho).sum();

    let mut class_region = Vec::with_capacity(config.n_classes);
    let mut class_site = Vec::with_capacity(config.n_classes);
    let mut restricted = Vec::with_capacity(config.n_classes);
    let mut weight = Vec::with_capacity(config.n_classes);
    for k in 0..config.n_classes {
        let region = if k < n_regions { k } else { rng.weighted(&demand_share) };
        class_site.push(regions[region].jittered(&mut rng, noise.cluster_jitter_deg));
        restricted.push(regions[region].zone == 1 && rng.unit() < fleet.group_restricted);
        weight.push((fleet.demand_sigma * rng.normal()).exp());
        class_region.push(region);
    }
    // Each region's share of the demand, split over its clusters by their lognormal weights.
    let mut region_weight = vec![0.0; n_regions];
    for (k, w) in weight.iter().enumerate() {
        region_weight[class_region[k]] += w;
    }
    let present: f64 = (0..n_regions).filter(|&r| region_weight[r] > 0.0).map(|r| demand_share[r]).sum();
    let classes = (0..config.n_classes)
        .map(|k| {
            let r = class_region[k];
            Class {
                id: format!("class-{k}"),
                demand_rps: config.load_factor * usable * demand_share[r] / present * weight[k]
                    / region_weight[r],
                shed_penalty_ms: [5_000.0, 10_000.0, 20_000.0][rng.index(3)],
                headroom_rps: 0.0,
            }
        })
        .collect();
    // Engine-major, pair by pair: the same draws whether the pair is allowed or not.
    let network = NetworkMatrix::from_fn_unchecked(config.n_classes, config.n_engines, |k, j| {
        let pair = rng.range(0.0, noise.pair_ms);
        let random_forbidden = rng.unit() < fleet.random_forbidden;
        let (from, to) = (class_region[k], engine_region[j]);
        let residency = restricted[k] && regions[to].zone != 1;
        let sovereign = sovereign_only[j] && from != to;
        if random_forbidden || residency || sovereign {
            return None;
        }
        let km = great_circle_km(&class_site[k], &engine_site[j]);
        Some((5.0 + km / 130.0 + pair).clamp(5.0, 150.0))
    });
    Problem { rho: config.rho, classes, engines, network_ms: network }
}

/// An engine's latency: the queueing shape, or (a `piecewise_fraction` of engines) noisy samples
/// of it up to 95 % of capacity, as a fitted curve.
fn curve(rng: &mut Rng, config: &GenConfig, capacity: f64, t0: f64, b: f64) -> Latency {
    if rng.unit() < config.piecewise_fraction {
        let points = (0..6)
            .map(|i| {
                let y = capacity * 0.95 * i as f64 / 5.0;
                [y, (t0 + b * y / (capacity - y)) * rng.range(0.97, 1.03)]
            })
            .collect();
        Latency::Piecewise(points)
    } else {
        Latency::Queueing { t0_ms: t0, b_ms: b }
    }
}

/// 5 ms within a region up to 150 ms at the antipode.
fn network_ms(a: &Region, b: &Region) -> f64 {
    let (la, lb) = (a.lat.to_radians(), b.lat.to_radians());
    let dlat = lb - la;
    let dlon = (b.lon - a.lon).to_radians();
    let h = (dlat / 2.0).sin().powi(2) + la.cos() * lb.cos() * (dlon / 2.0).sin().powi(2);
    let angle = 2.0 * h.sqrt().min(1.0).asin(); // 0..π
    5.0 + 145.0 * angle / std::f64::consts::PI
}

/// Great-circle distance in km (haversine, mean Earth radius).
fn great_circle_km(a: &Region, b: &Region) -> f64 {
    let (la, lb) = (a.lat.to_radians(), b.lat.to_radians());
    let dlat = lb - la;
    let dlon = (b.lon - a.lon).to_radians();
    let h = (dlat / 2.0).sin().powi(2) + la.cos() * lb.cos() * (dlon / 2.0).sin().powi(2);
    2.0 * 6371.0 * h.sqrt().min(1.0).asin()
}

/// The same problem with every class demand scaled by a factor drawn in [1 − amplitude, 1 + amplitude].
pub fn perturb_demand(problem: &Problem, seed: u64, amplitude: f64) -> Problem {
    let mut rng = Rng(seed ^ 0xDE3A_0D00);
    let mut out = problem.clone();
    for class in &mut out.classes {
        class.demand_rps *= 1.0 + rng.range(-amplitude, amplitude);
    }
    out
}
