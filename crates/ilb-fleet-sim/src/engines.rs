//! One simulated engine: the real [`EngineModel`] plus what a vLLM server would expose about
//! it (cumulative TTFT, inter-token and end-to-end histograms and generated tokens per request,
//! with vLLM's buckets), turned into the control plane's [`EngineSample`] as a scrape of
//! `/metrics` would.

use ilb_engine_sim::server::metrics::GENERATION_TOKEN_BUCKETS;
use ilb_engine_sim::{EngineModel, HardwareProfile, Nanos, Outcome};
use ilb_planning::signals::{EngineFlavor, EngineSample, Histogram};

/// vLLM's `time_to_first_token_seconds` buckets.
const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's `inter_token_latency_seconds` buckets.
const ITL_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// vLLM's `e2e_request_latency_seconds` buckets.
const E2E_BUCKETS: [f64; 20] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0,
];

/// A cumulative histogram being filled (per-bucket counts; the +Inf bucket last).
#[derive(Clone, Debug)]
struct Filling {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Filling {
    fn new(bounds: &'static [f64]) -> Self {
        Filling { bounds, counts: vec![0; bounds.len() + 1], sum: 0.0, count: 0 }
    }

    fn observe(&mut self, value: f64, times: u64) {
        let bucket = self.bounds.partition_point(|&b| b < value);
        self.counts[bucket] += times;
        self.sum += value * times as f64;
        self.count += times;
    }

    fn exposed(&self) -> Histogram {
        let mut cumulative = 0u64;
        let buckets = self
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(&self.counts)
            .map(|(le, n)| {
                cumulative += n;
                (le, cumulative as f64)
            })
            .collect();
        Histogram { buckets, sum: self.sum, count: self.count as f64 }
    }
}

/// An engine of the simulated fleet.
#[derive(Debug)]
pub struct SimEngine {
    pub model: EngineModel,
    pub profile: HardwareProfile,
    pub up: bool,
    /// The wake-up currently scheduled in the event heap (older entries are stale).
    pub wake: Option<Nanos>,
    ttft: Filling,
    itl: Filling,
    e2e: Filling,
    generated: Filling,
}

impl SimEngine {
    pub fn new(profile: &HardwareProfile) -> Result<SimEngine, ilb_engine_sim::ProfileError> {
        Ok(SimEngine {
            model: EngineModel::new(profile)?,
            profile: profile.clone(),
            up: true,
            wake: None,
            ttft: Filling::new(&TTFT_BUCKETS),
            itl: Filling::new(&ITL_BUCKETS),
            e2e: Filling::new(&E2E_BUCKETS),
            generated: Filling::new(GENERATION_TOKEN_BUCKETS),
        })
    }

    /// Records a finished request in the exposed histograms.
    pub fn observe(&mut self, o: &Outcome) {
        let ttft = o.first_token_at.saturating_sub(o.arrival) as f64 / 1e9;
        let e2e = o.finished_at.saturating_sub(o.arrival) as f64 / 1e9;
        self.ttft.observe(ttft, 1);
        self.e2e.observe(e2e, 1);
        self.generated.observe(f64::from(o.output_tokens), 1);
        if o.output_tokens > 1 {
            let gaps = u64::from(o.output_tokens - 1);
            let itl = o.finished_at.saturating_sub(o.first_token_at) as f64 / 1e9 / gaps as f64;
            self.itl.observe(itl, gaps);
        }
    }

    /// The engine crashed: everything it held is gone, and it restarts empty (counters from
    /// zero, which the control plane sees as a counter reset) when it recovers.
    pub fn crash(&mut self) -> Result<(), ilb_engine_sim::ProfileError> {
        let fresh = SimEngine::new(&self.profile)?;
        *self = SimEngine { up: false, ..fresh };
        Ok(())
    }

    /// What a scrape of the engine's `/metrics` yields now (vLLM flavour).
    pub fn sample(&self) -> EngineSample {
        let stats = self.model.stats();
        let c = stats.counters;
        EngineSample {
            flavor: EngineFlavor::Vllm,
            running: Some(stats.running as f64),
            waiting: Some(stats.waiting as f64),
            kv_usage: Some(stats.kv_usage),
            prompt_tokens: Some(c.prompt_tokens as f64),
            generation_tokens: Some(c.generation_tokens as f64),
            prefix_cache_queries: Some(c.prefix_queries_tokens as f64),
            prefix_cache_hits: Some(c.prefix_hits_tokens as f64),
            prefix_cache_hit_rate: None,
            requests_finished: Some((c.finished + c.aborted) as f64),
            requests_failed: Some(c.aborted as f64),
            gen_throughput: None,
            ttft: Some(self.ttft.exposed()),
            tbot: Some(self.itl.exposed()),
            e2e: Some(self.e2e.exposed()),
            output_tokens: Some(self.generated.exposed()),
            ..EngineSample::default()
        }
    }
}
