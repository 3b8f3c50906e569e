//! `ilb profile --engine URL`: measures one engine's latency against its load, the offline
//! profiling the control plane's profiles start from, and prints the result as fleet TOML.
//!
//! Open-loop Poisson arrivals of streamed chat completions (each prompt different, so the
//! prefix cache does not flatter the engine) in steps of rising rate: from half the rate one
//! request at a time would sustain (or more: below), doubling until a step shows the engine past
//! its knee (requests failed, time to first token far above idle or rising through the step, or
//! the in-flight bound reached), then bisecting until the knee is bracketed within 10 % (a good
//! step at or above a bad one counts as noise near the knee), then measuring ½, ¾ and ¼ of the
//! knee, so that the curve spans the loads a fleet runs at. The search ends there or when the
//! time budget is spent. The search and the fit are [`search`]'s, which the fleet simulator's
//! calibration runs too. Each step records the rate it sent, the mean time to first token and
//! the mean time between output tokens, and the engine drains before the next step starts.
//!
//! A step lasts `--step-seconds` or until `--min-requests` arrivals past its warm-up,
//! whichever is longer: on a slow engine (seconds per request) a mean over a handful of
//! arrivals is noise. The first [`WARM_UP_SHARE`] of a step's arrivals meet an engine that
//! drained after the previous step, so they load it but are not counted.
//!
//! The printed block has the queueing profile (`[profiles.NAME]`: capacity, where TTFT's
//! fitted queueing curve has its pole, and t0 / b of TTFT and TBOT) and the measured points
//! as `[control_plane.measured_curves.NAME]`, both per replica. The control plane refines
//! either online from what it sees. `--rates R1,R2 --check FILE` measures other loads and sets
//! each beside what FILE's block predicts there, as the planner reads it.

use crate::traffic::read_stream;
use anyhow::{bail, Context};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use ilb_planning::config::{MeasuredCurves, Profile};
use ilb_planning::profile::search::{self, Measured, Step};
use ilb_planning::profile::{LatencyProfile, Observation};
use rand::{Rng, SeedableRng};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(clap::Args)]
pub struct ProfileArgs {
    /// Base URL of the engine's OpenAI-compatible API, e.g. `http://10.0.0.7:8000`.
    #[arg(long)]
    engine: String,
    /// Model to request (default: the first one `GET /v1/models` lists).
    #[arg(long)]
    model: Option<String>,
    /// Profile name in the printed TOML.
    #[arg(long, default_value = "engine")]
    name: String,
    /// Time budget of the load steps, seconds (the idle probe and draining come on top).
    #[arg(long, default_value_t = 120.0)]
    seconds: f64,
    /// Shortest load step, seconds.
    #[arg(long, default_value_t = 10.0)]
    step_seconds: f64,
    /// Counted arrivals per load step at least: a step lasts until this many were sent after
    /// its warm-up, if that takes longer than `--step-seconds`.
    #[arg(long, default_value_t = 20)]
    min_requests: u32,
    /// Words of each prompt (about as many tokens); use the fleet's typical prompt.
    #[arg(long, default_value_t = 200)]
    prompt_words: u32,
    /// `max_tokens` of each request; use the fleet's typical answer length.
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    /// Replicas behind the URL: the printed curves are per replica.
    #[arg(long, default_value_t = 1)]
    replicas: u32,
    /// Requests in flight at most; a step that reaches it is past the engine's knee.
    #[arg(long, default_value_t = 512)]
    max_in_flight: usize,
    /// Seed of the arrivals and prompts.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Instead of searching for the knee, one step at each of these rates (req/s, comma
    /// separated): to check a profile's curves at loads it was not measured at.
    #[arg(long, value_delimiter = ',')]
    rates: Option<Vec<f64>>,
    /// With `--rates`: a file holding a block this command printed (or a whole fleet TOML);
    /// each measured step is set beside the TTFT and TBOT that profile `--name` predicts at
    /// its load.
    #[arg(long, requires = "rates")]
    check: Option<std::path::PathBuf>,
}

/// What an idle engine does: one request at a time.
#[derive(Clone, Copy, Debug)]
struct Idle {
    ttft_ms: f64,
    e2e_ms: f64,
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The share of a step's first arrivals not counted: the engine's queue is still filling.
const WARM_UP_SHARE: f64 = 0.25;
/// Longest wait for one request (a hung engine fails the profile instead of stalling it).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

pub fn run(args: ProfileArgs) -> anyhow::Result<()> {
    if !(args.seconds > 0.0 && args.step_seconds > 0.0 && args.seconds >= args.step_seconds) {
        bail!("--seconds and --step-seconds must be positive, --seconds at least one step");
    }
    if args.replicas == 0 || args.max_tokens < 2 || args.max_in_flight == 0 {
        bail!("--replicas and --max-in-flight must be at least 1, --max-tokens at least 2");
    }
    if let Some(rates) = &args.rates {
        if rates.is_empty() || rates.iter().any(|r| !r.is_finite() || *r <= 0.0) {
            bail!("--rates takes positive rates, e.g. --rates 0.5,1.5");
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(profile(args))
}

async fn profile(args: ProfileArgs) -> anyhow::Result<()> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
    let base = args.engine.trim_end_matches('/').to_owned();
    let model = match &args.model {
        Some(m) => m.clone(),
        None => first_model(&client, &base).await?,
    };
    let probe = Probe {
        nonce: crate::clock::unix_nanos(),
        client,
        url: format!("{base}/v1/chat/completions"),
        model,
        args: Arc::new(args),
    };
    // A bad file fails before the engine is loaded, not after.
    let predicted = match &probe.args.check {
        Some(path) => Some(Prediction::read(path, &probe.args.name)?),
        None => None,
    };
    let idle = probe.idle().await?;
    eprintln!("idle: TTFT {:.0} ms, whole answer {:.0} ms", idle.ttft_ms, idle.e2e_ms);
    let steps = probe.sweep(idle).await?;
    if probe.args.rates.is_some() {
        print!("{}", measurements(&probe, &steps, predicted.as_ref()));
    } else {
        print!("{}", render(&probe, &steps)?);
    }
    Ok(())
}

async fn first_model(client: &HttpClient, base: &str) -> anyhow::Result<String> {
    let request = Request::get(format!("{base}/v1/models")).body(Full::new(Bytes::new()))?;
    let response = tokio::time::timeout(REQUEST_TIMEOUT, client.request(request))
        .await
        .context("GET /v1/models timed out")?
        .context("GET /v1/models")?;
    let status = response.status();
    let body = response.into_body().collect().await.context("reading /v1/models")?.to_bytes();
    if !status.is_success() {
        bail!("GET /v1/models answered {status}; give --model");
    }
    let value: serde_json::Value = serde_json::from_slice(&body).context("GET /v1/models is not JSON")?;
    value["data"][0]["id"].as_str().map(str::to_owned).context("GET /v1/models lists no model; give --model")
}

/// One step's line of progress on stderr.
fn report(step: &Step) {
    if step.ttft_ms.is_nan() {
        eprintln!("no request completed");
    } else {
        eprintln!(
            "sent {:.2} req/s, TTFT {:.0} ms, TBOT {:.1} ms{}",
            step.load_rps,
            step.ttft_ms,
            step.tbot_ms,
            if step.overloaded { " (past the knee)" } else { "" }
        );
    }
}

struct Probe {
    /// Random per run, at the start of every prompt.
    nonce: u64,
    client: HttpClient,
    url: String,
    model: String,
    args: Arc<ProfileArgs>,
}

/// One request's measurements: TTFT and time between tokens, ms.
type Timing = (f64, Option<f64>);

/// One request of a step: its arrival's sequence number in the step, and how it went.
type Outcome = (u64, Result<Timing, String>);

impl Probe {
    /// Five requests one at a time; the medians.
    async fn idle(&self) -> anyhow::Result<Idle> {
        let (mut ttft, mut e2e) = (Vec::new(), Vec::new());
        for i in 0..5 {
            let started = crate::clock::now();
            let (first, _) = self.request(u64::MAX - i).await.map_err(anyhow::Error::msg)?;
            ttft.push(first);
            e2e.push(crate::clock::since(started).as_secs_f64() * 1000.0);
        }
        Ok(Idle { ttft_ms: median(&mut ttft), e2e_ms: median(&mut e2e) })
    }

    /// The load steps of [`search::next_rate`]'s search, within the budget; or
    /// the rates given with `--rates`.
    async fn sweep(&self, idle: Idle) -> anyhow::Result<Vec<Step>> {
        if let Some(rates) = &self.args.rates {
            let mut steps = Vec::new();
            for (k, &rate) in rates.iter().enumerate() {
                eprint!(
                    "step {}/{}: {rate:.2} req/s for {:.0} s … ",
                    k + 1,
                    rates.len(),
                    self.step_length(rate)
                );
                let step = self.step(rate, k as u64, idle).await?;
                report(&step);
                steps.push(step);
            }
            return Ok(steps);
        }
        // Half the rate one request at a time sustains, or the rate that counts
        // `--min-requests` in one `--step-seconds` if that is higher: below it steps only get
        // longer. A first step past the knee halves the rate.
        let mut rate = (0.5 * 1000.0 / idle.e2e_ms.max(1.0))
            .max(f64::from(self.args.min_requests) / ((1.0 - WARM_UP_SHARE) * self.args.step_seconds));
        let mut steps: Vec<Step> = Vec::new();
        let mut spent = 0.0;
        while spent < self.args.seconds {
            let length = self.step_length(rate);
            eprint!(
                "step {}: {rate:.2} req/s for {length:.0} s ({spent:.0} of {:.0} s spent) … ",
                steps.len() + 1,
                self.args.seconds
            );
            let step = self.step(rate, steps.len() as u64, idle).await?;
            spent += length;
            report(&step);
            steps.push(step);
            match search::next_rate(&steps) {
                Some(next) => rate = next,
                None => break,
            }
        }
        Ok(steps)
    }

    /// How long a step at `rate` sends: `--step-seconds`, or long enough for `--min-requests`
    /// after the warm-up.
    fn step_length(&self, rate: f64) -> f64 {
        self.args.step_seconds.max(f64::from(self.args.min_requests) / ((1.0 - WARM_UP_SHARE) * rate))
    }

    /// Poisson arrivals at `rate` for one step; then waits for what is in flight.
    async fn step(&self, rate: f64, index: u64, idle: Idle) -> anyhow::Result<Step> {
        let length = Duration::from_secs_f64(self.step_length(rate));
        let mut rng = rand_pcg::Pcg64::seed_from_u64(self.args.seed ^ index.wrapping_mul(0x9E37_79B9));
        let results: Arc<Mutex<Vec<Outcome>>> = Arc::default();
        let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        let started = crate::clock::now();
        let (mut next, mut sent, mut saturated) = (started, 0u64, false);
        loop {
            next += Duration::from_secs_f64(-(1.0 - rng.gen::<f64>()).ln() / rate);
            if next.duration_since(started) >= length {
                break;
            }
            tokio::time::sleep_until(next).await;
            if in_flight.load(std::sync::atomic::Ordering::Relaxed) >= self.args.max_in_flight {
                saturated = true;
                continue;
            }
            let arrival = sent;
            sent += 1;
            let (probe, results, in_flight) = (self.share(), Arc::clone(&results), Arc::clone(&in_flight));
            let seed = rng.gen::<u64>();
            in_flight.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tasks.spawn(async move {
                let result = probe.request(seed).await;
                in_flight.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                results.lock().unwrap_or_else(|p| p.into_inner()).push((arrival, result));
            });
        }
        while tasks.join_next().await.is_some() {}
        let elapsed_s = length.as_secs_f64();
        let mut results = std::mem::take(&mut *results.lock().unwrap_or_else(|p| p.into_inner()));
        results.sort_by_key(|(arrival, _)| *arrival);
        let errors: Vec<&String> = results.iter().filter_map(|(_, r)| r.as_ref().err()).collect();
        if let Some(first) = errors.first() {
            if errors.len() * 10 > results.len() {
                bail!(
                    "{} of {} requests failed at {rate:.2} req/s, e.g. {first}",
                    errors.len(),
                    results.len()
                );
            }
        }
        let warm_up = (WARM_UP_SHARE * sent as f64).floor() as u64;
        let completed = results.iter().filter(|(_, r)| r.is_ok()).count() as u64;
        let timings: Vec<Timing> = results
            .into_iter()
            .filter(|(arrival, _)| *arrival >= warm_up)
            .filter_map(|(_, r)| r.ok())
            .collect();
        let ttft_ms = mean(timings.iter().map(|t| t.0));
        let tbot_ms = mean(timings.iter().filter_map(|t| t.1));
        let measured = Measured {
            sent,
            completed,
            ttft_ms,
            idle_ttft_ms: idle.ttft_ms,
            queue_grew: queue_grew(&timings, idle),
        };
        let overloaded = saturated || measured.past_knee();
        // Below the knee every arrival completes, so the load is the rate the step sent
        // (completions include the stragglers drained after it).
        Ok(Step { offered_rps: rate, load_rps: sent as f64 / elapsed_s, ttft_ms, tbot_ms, overloaded })
    }

    fn share(&self) -> Probe {
        Probe {
            nonce: self.nonce,
            client: self.client.clone(),
            url: self.url.clone(),
            model: self.model.clone(),
            args: Arc::clone(&self.args),
        }
    }

    /// One streamed request with a prompt of its own: (TTFT, mean time between tokens), ms.
    async fn request(&self, seed: u64) -> Result<Timing, String> {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
        const WORDS: [&str; 16] = [
            "river", "stone", "market", "engine", "garden", "signal", "harbor", "ledger", "window", "copper",
            "forest", "thread", "planet", "candle", "bridge", "motion",
        ];
        // The run's nonce first: an engine's prefix cache keeps prompts from an earlier run.
        let mut prompt = format!("Request {:x}-{seed}. Summarise:", self.nonce);
        for _ in 0..self.args.prompt_words {
            prompt.push(' ');
            prompt.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
        }
        let body = serde_json::json!({
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.args.max_tokens,
            "ignore_eos": true,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let body = Bytes::from(body.to_string());
        let request = || {
            Request::post(&self.url)
                .header("content-type", "application/json")
                .body(Full::new(body.clone()))
                .map_err(|e| e.to_string())
        };
        let started = crate::clock::now();
        let exchange = async {
            // A pooled connection the engine closed as it was reused (llama.cpp's server closes
            // idle ones after 5 s) fails before any answer: one retry on a new connection.
            let response = match self.client.request(request()?).await {
                Ok(response) => response,
                Err(e) if e.is_connect() => return Err(error_chain(&e)),
                Err(_) => self.client.request(request()?).await.map_err(|e| error_chain(&e))?,
            };
            if !response.status().is_success() {
                return Err(format!("status {}", response.status()));
            }
            read_stream(response.into_body(), started).await
        };
        let timings =
            tokio::time::timeout(REQUEST_TIMEOUT, exchange).await.map_err(|_| "timed out".to_owned())??;
        let ttft = timings.ttft_ms.ok_or("the stream had no content")?;
        let tokens = timings.completion_tokens.map_or(u64::from(timings.content_chunks), |t| t.max(1));
        let tbot = (tokens > 1).then(|| (timings.last_content_ms - ttft) / (tokens - 1) as f64);
        Ok((ttft, tbot))
    }
}

/// An error with its causes, `a: b: c`.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text += &format!(": {cause}");
        source = cause.source();
    }
    text
}

/// Whether TTFT rose through the step (timings in arrival order) as a queue that outgrows
/// the engine makes it: its last quarter's mean against its first quarter's.
fn queue_grew(timings: &[Timing], idle: Idle) -> bool {
    let quarter = timings.len() / 4;
    if quarter < 2 {
        return false;
    }
    let first = mean(timings[..quarter].iter().map(|t| t.0));
    let last = mean(timings[timings.len() - quarter..].iter().map(|t| t.0));
    search::grew(first, last, idle.ttft_ms)
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 {
        f64::NAN
    } else {
        sum / n as f64
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// `--rates`: what each step measured, per replica, one line each; with `--check`, beside
/// what the profile predicts and the error.
fn measurements(probe: &Probe, steps: &[Step], predicted: Option<&Prediction>) -> String {
    let replicas = f64::from(probe.args.replicas);
    let mut out = format!(
        "# ilb profile --rates of {} (model {}): prompts of {} words, {} output tokens; per replica of {}.\n",
        probe.args.engine, probe.model, probe.args.prompt_words, probe.args.max_tokens, probe.args.replicas
    );
    let Some(predicted) = predicted else {
        out += "# load_rps ttft_ms tbot_ms past_knee\n";
        for s in steps {
            out +=
                &format!("{:.3} {:.1} {:.2} {}\n", s.load_rps / replicas, s.ttft_ms, s.tbot_ms, s.overloaded);
        }
        return out;
    };
    out += &format!(
        "# predicted by profile {} of {}: from its measured curves where it has them (as the planner \
         reads them), else from its queueing fit; error = predicted / measured - 1\n\
         # load_rps ttft_ms predicted error tbot_ms predicted error past_knee\n",
        probe.args.name,
        predicted.source.display()
    );
    let error = |predicted: f64, measured: f64| format!("{:+.1}%", 100.0 * (predicted / measured - 1.0));
    for s in steps {
        let load = s.load_rps / replicas;
        let (ttft, tbot) = predicted.at(load);
        out += &format!(
            "{load:.3} {:.1} {ttft:.1} {} {:.2} {tbot:.2} {} {}\n",
            s.ttft_ms,
            error(ttft, s.ttft_ms),
            s.tbot_ms,
            error(tbot, s.tbot_ms),
            s.overloaded
        );
    }
    out
}

/// A profile block read back for `--check`: the curves the planner would start from.
struct Prediction {
    source: std::path::PathBuf,
    capacity_rps: f64,
    ttft: LatencyProfile,
    tbot: LatencyProfile,
}

impl Prediction {
    /// Profile `name` of the TOML at `path` (a block `ilb profile` printed, or a fleet file).
    fn read(path: &std::path::Path, name: &str) -> anyhow::Result<Prediction> {
        #[derive(serde::Deserialize)]
        struct File {
            #[serde(default)]
            profiles: std::collections::BTreeMap<String, Profile>,
            #[serde(default)]
            control_plane: Option<ControlPlane>,
        }
        #[derive(serde::Deserialize)]
        struct ControlPlane {
            #[serde(default)]
            measured_curves: std::collections::BTreeMap<String, MeasuredCurves>,
        }
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let file: File = toml::from_str(&text).with_context(|| format!("{} is not TOML", path.display()))?;
        let profile = file
            .profiles
            .get(name)
            .with_context(|| format!("{} has no [profiles.{name}] (give --name)", path.display()))?;
        let curves = file.control_plane.and_then(|c| c.measured_curves.get(name).cloned());
        let curve = |points: Option<&Vec<[f64; 2]>>,
                     t0_ms: f64,
                     b_ms: f64|
         -> anyhow::Result<LatencyProfile> {
            let profile = match points {
                Some(points) => LatencyProfile::Piecewise(points.iter().map(|&[y, ms]| (y, ms)).collect()),
                None => LatencyProfile::Queueing { t0_ms, b_ms },
            };
            profile.validate().with_context(|| format!("profile {name} of {}", path.display()))?;
            Ok(match profile {
                LatencyProfile::Piecewise(points) => LatencyProfile::through_measured(&points),
                queueing => queueing,
            })
        };
        Ok(Prediction {
            source: path.to_owned(),
            capacity_rps: profile.capacity_rps,
            ttft: curve(
                curves.as_ref().and_then(|c| c.ttft_curve.as_ref()),
                profile.ttft_t0_ms,
                profile.ttft_b_ms,
            )?,
            tbot: curve(
                curves.as_ref().and_then(|c| c.tbot_curve.as_ref()),
                profile.tbot_t0_ms,
                profile.tbot_b_ms,
            )?,
        })
    }

    /// Predicted (TTFT, TBOT), ms, at a per-replica load.
    fn at(&self, load_rps: f64) -> (f64, f64) {
        (self.ttft.latency_ms(load_rps, self.capacity_rps), self.tbot.latency_ms(load_rps, self.capacity_rps))
    }
}

/// The profile block: capacity and queueing fits, and the measured curves, per replica.
fn render(probe: &Probe, steps: &[Step]) -> anyhow::Result<String> {
    let fitted = search::fit(steps, probe.args.replicas).map_err(|e| {
        anyhow::anyhow!(
            "{e}: give more --seconds or a longer --step-seconds, and check that the engine is not busy \
             with other work"
        )
    })?;
    let (ttft, tbot) = (&fitted.ttft_curve, &fitted.tbot_curve);
    let curve = |observations: &[Observation]| -> String {
        let knots: Vec<String> =
            observations.iter().map(|o| format!("[{:.3}, {:.2}]", o.load_rps, o.latency_ms)).collect();
        format!("[{}]", knots.join(", "))
    };
    let name = &probe.args.name;
    let mut out = format!(
        "# ilb profile of {} (model {}): {} load steps, {} of them below the knee; prompts of {} words, \
         {} output tokens; per replica of {}.\n",
        probe.args.engine,
        probe.model,
        steps.len(),
        fitted.below_knee,
        probe.args.prompt_words,
        probe.args.max_tokens,
        probe.args.replicas
    );
    out += &format!(
        "[profiles.{name}]\ncapacity_rps = {:.3}\nttft_t0_ms = {:.2}\nttft_b_ms = {:.2}\n\
         tbot_t0_ms = {:.3}\ntbot_b_ms = {:.3}\n\n",
        fitted.capacity_rps, fitted.ttft_t0_ms, fitted.ttft_b_ms, fitted.tbot_t0_ms, fitted.tbot_b_ms
    );
    out += &format!("[control_plane.measured_curves.{name}]\nttft_curve = {}\n", curve(ttft));
    if tbot.len() >= 2 {
        out += &format!("tbot_curve = {}\n", curve(tbot));
    }
    Ok(out)
}
