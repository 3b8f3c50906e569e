//! Per-engine runtime state that outlives snapshots: in-flight count, the local guard and the
//! counters reported to the control plane. One `EngineState` per engine id lives in the
//! registry; every compiled routing table points at the same `Arc`s, so a snapshot swap never
//! resets a count and a request finishing after its engine left the snapshot still decrements
//! the right counter.

use crate::upstream::{Origin, Pool};
use http::StatusCode;
use ilb_core::holds::HoldReason;
use ilb_core::metrics::{Histogram, TokenHistogram};
use ilb_core::EngineId;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// When and for how long the local guard ejects an engine.
#[derive(Clone, Debug)]
pub struct GuardConfig {
    /// Consecutive failures (connect errors, 5xx, timeouts) that eject an engine.
    pub consecutive_failures: u32,
    /// First ejection; doubles with every ejection in a row, up to `max_ejection`.
    pub base_ejection: Duration,
    pub max_ejection: Duration,
    /// Most of the installed engines that may be ejected at once (Envoy's max ejection
    /// percent): past it, failing engines stay in rotation, so a fleet-wide problem (or a bug in
    /// the guard) can never take every engine out. Default 0.5.
    pub max_ejected_fraction: f64,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            consecutive_failures: 3,
            base_ejection: Duration::from_millis(500),
            max_ejection: Duration::from_secs(30),
            max_ejected_fraction: 0.5,
        }
    }
}

/// The runtime state of one engine as this data plane sees it.
#[derive(Debug)]
pub struct EngineState {
    pub id: EngineId,
    /// Where the engine is and how to reach it (address, `Host`, TLS name and counters).
    pub origin: Origin,
    /// Idle connections to this engine; dropped with this state when the engine leaves.
    pub pool: Pool,
    /// Requests sent and not yet finished (streamed responses count until their last byte).
    pub in_flight: AtomicU32,
    /// Requests the other data planes of the cluster have in flight on this engine, as they
    /// last said (`replicas`); 0 without peers.
    pub peer_in_flight: AtomicU32,
    consecutive_failures: AtomicU32,
    ejected: AtomicBool,
    /// Ejections in a row without a success in between; sets the back-off.
    ejections: AtomicU32,
    /// Why the control plane's fast guard holds the engine out (0: not held; else
    /// [`hold_code`]); set by the holds follower, read on the request path.
    held: AtomicU8,
    /// Milliseconds since the data plane started when the next health probe is due.
    probe_at_ms: AtomicU64,
    pub counters: EngineCounters,
}

/// Cumulative counters; the reporter turns them into per-period figures.
#[derive(Debug, Default)]
pub struct EngineCounters {
    pub attempts: AtomicU64,
    pub failures: AtomicU64,
    pub ejections_total: AtomicU64,
    /// Request sent → response headers.
    pub ttfb: Histogram,
    /// Request sent → last byte of the response body.
    pub duration: Histogram,
    /// Request sent → first chunk of a streamed (SSE) response body.
    pub first_chunk: Histogram,
    /// Gap between consecutive chunks of a streamed response body.
    pub chunk_gap: Histogram,
    /// Generated tokens per answer that ended cleanly (`body.rs`, `TokenCount`).
    pub output_tokens: TokenHistogram,
}

impl EngineState {
    pub fn new(id: EngineId, url: &str) -> EngineState {
        EngineState {
            origin: Origin::new(id.clone(), url),
            id,
            pool: Pool::default(),
            in_flight: AtomicU32::new(0),
            peer_in_flight: AtomicU32::new(0),
            consecutive_failures: AtomicU32::new(0),
            ejected: AtomicBool::new(false),
            ejections: AtomicU32::new(0),
            held: AtomicU8::new(0),
            probe_at_ms: AtomicU64::new(0),
            counters: EngineCounters::default(),
        }
    }

    /// Hot path: one relaxed load.
    #[inline]
    pub fn is_ejected(&self) -> bool {
        self.ejected.load(Relaxed)
    }

    /// Whether the control plane's fast guard holds the engine out. Hot path: one relaxed load.
    #[inline]
    pub fn is_held(&self) -> bool {
        self.held.load(Relaxed) != 0
    }

    /// Why the engine is held, if it is.
    pub fn hold_reason(&self) -> Option<HoldReason> {
        match self.held.load(Relaxed) {
            1 => Some(HoldReason::Asleep),
            2 => Some(HoldReason::NoReadyReplicas),
            3 => Some(HoldReason::Unreachable),
            _ => None,
        }
    }

    /// Sets or clears the hold; returns whether it changed.
    pub fn set_hold(&self, reason: Option<HoldReason>) -> bool {
        self.held.swap(reason.map_or(0, hold_code), Relaxed) != reason.map_or(0, hold_code)
    }

    pub fn record_success(&self) {
        if self.consecutive_failures.load(Relaxed) != 0 {
            self.consecutive_failures.store(0, Relaxed);
        }
        self.origin.clear_tls_failure();
        if self.ejections.load(Relaxed) != 0 && !self.is_ejected() {
            self.ejections.store(0, Relaxed);
        }
    }

    /// Counts a failure; returns true when this failure ejected the engine. `may_eject` is
    /// asked only when the threshold is reached (it checks the fleet-wide ejection cap).
    pub fn record_failure(
        &self,
        now_ms: u64,
        config: &GuardConfig,
        may_eject: impl FnOnce() -> bool,
    ) -> bool {
        self.counters.failures.fetch_add(1, Relaxed);
        let failures = self.consecutive_failures.fetch_add(1, Relaxed) + 1;
        if failures < config.consecutive_failures {
            return false;
        }
        if !may_eject() {
            self.consecutive_failures.store(0, Relaxed);
            return false;
        }
        self.eject(now_ms, config)
    }

    /// Ejects at once (e.g. after a failed probe); returns false if it already was.
    pub fn eject(&self, now_ms: u64, config: &GuardConfig) -> bool {
        if self.ejected.swap(true, Relaxed) {
            return false;
        }
        self.consecutive_failures.store(0, Relaxed);
        self.counters.ejections_total.fetch_add(1, Relaxed);
        self.schedule_probe(now_ms, config);
        true
    }

    /// A probe failed: keep the engine out and back off further.
    pub fn probe_failed(&self, now_ms: u64, config: &GuardConfig) {
        self.schedule_probe(now_ms, config);
    }

    /// Back in rotation on probation: a health probe passed, but `/health` can pass while
    /// inference hangs, so the next failure ejects again at once (with a longer back-off, since
    /// the ejection streak only resets on a successful request).
    pub fn readmit(&self, config: &GuardConfig) {
        self.consecutive_failures.store(config.consecutive_failures.saturating_sub(1), Relaxed);
        self.ejected.store(false, Relaxed);
    }

    /// Whether an ejected engine's next probe is due.
    pub fn probe_due(&self, now_ms: u64) -> bool {
        self.is_ejected() && self.probe_at_ms.load(Relaxed) <= now_ms
    }

    fn schedule_probe(&self, now_ms: u64, config: &GuardConfig) {
        let n = self.ejections.fetch_add(1, Relaxed).min(16);
        let backoff = config.base_ejection.saturating_mul(1 << n).min(config.max_ejection);
        self.probe_at_ms.store(now_ms + backoff.as_millis() as u64, Relaxed);
    }
}

/// What an engine's response status says the proxy should do with it. Whether the attempt
/// counts for or against the engine's health is [`Verdict::of`]'s call, not this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Passed on to the client (success, or the client's own error).
    Serve,
    /// 429: busy, not broken. Retried elsewhere, not counted against the engine.
    Busy,
    /// 5xx: retried elsewhere and counted as a failure by the local guard.
    Failed,
}

impl Answer {
    pub fn of(status: StatusCode) -> Answer {
        if status == StatusCode::TOO_MANY_REQUESTS {
            Answer::Busy
        } else if status.is_server_error() {
            Answer::Failed
        } else {
            Answer::Serve
        }
    }
}

/// How one attempt on an engine ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The engine answered with this status, and its body (if it was read) ended cleanly.
    Answered(StatusCode),
    /// No response head: connecting, writing or reading failed, or the first-byte timeout.
    NoAnswer,
    /// The response body broke off, or stalled past the idle timeout.
    BodyBroken,
}

/// What an attempt says about its engine's health, for the local guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The engine served: its failure streak resets.
    Healthy,
    /// Says nothing about the engine: the request's own fault (4xx: a body too large for the
    /// engine, a bad parameter, an unknown response id) or a busy engine (429). A client must
    /// not be able to get a healthy engine ejected, nor keep a failing one in rotation.
    Neutral,
    /// Counts against the engine: a 5xx, no answer, or a broken body.
    Failed,
}

impl Verdict {
    /// The one place that decides whether an attempt counts against its engine.
    pub fn of(outcome: Outcome) -> Verdict {
        match outcome {
            Outcome::Answered(status) if status.is_server_error() => Verdict::Failed,
            Outcome::Answered(status) if status.is_client_error() => Verdict::Neutral,
            Outcome::Answered(_) => Verdict::Healthy,
            Outcome::NoAnswer | Outcome::BodyBroken => Verdict::Failed,
        }
    }
}

/// Whether one more of `engines` may be ejected under the cap `max_ejected_fraction`. As
/// Envoy does, one engine may always be ejected, whatever the fraction.
pub fn may_eject(engines: &[Arc<EngineState>], max_ejected_fraction: f64) -> bool {
    let ejected = engines.iter().filter(|e| e.is_ejected()).count();
    ejected == 0 || (ejected + 1) as f64 <= max_ejected_fraction * engines.len() as f64
}

fn hold_code(reason: HoldReason) -> u8 {
    match reason {
        HoldReason::Asleep => 1,
        HoldReason::NoReadyReplicas => 2,
        HoldReason::Unreachable => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (hardening finding 3): an engine's 4xx (a body too large for it) counted
    /// against it, so a client could get healthy engines ejected.
    #[test]
    fn only_engine_faults_count_against_an_engine() {
        let verdict = |status: u16| Verdict::of(Outcome::Answered(StatusCode::from_u16(status).unwrap()));
        for status in [200, 201, 204, 301, 304] {
            assert_eq!(verdict(status), Verdict::Healthy, "{status}");
        }
        for status in [400, 401, 403, 404, 408, 409, 413, 415, 422, 429, 499] {
            assert_eq!(verdict(status), Verdict::Neutral, "{status}");
        }
        for status in [500, 502, 503, 504] {
            assert_eq!(verdict(status), Verdict::Failed, "{status}");
        }
        assert_eq!(Verdict::of(Outcome::NoAnswer), Verdict::Failed);
        assert_eq!(Verdict::of(Outcome::BodyBroken), Verdict::Failed);
    }

    #[test]
    fn answers_and_the_ejection_cap() {
        assert_eq!(Answer::of(StatusCode::OK), Answer::Serve);
        assert_eq!(Answer::of(StatusCode::BAD_REQUEST), Answer::Serve, "the client's error is passed on");
        assert_eq!(Answer::of(StatusCode::TOO_MANY_REQUESTS), Answer::Busy);
        assert_eq!(Answer::of(StatusCode::BAD_GATEWAY), Answer::Failed);
        let config = GuardConfig::default();
        let engines: Vec<Arc<EngineState>> = (0..4)
            .map(|i| Arc::new(EngineState::new(EngineId::new(format!("e{i}")), "http://127.0.0.1:1")))
            .collect();
        assert!(may_eject(&engines, 0.0), "one engine may always be ejected");
        engines[0].eject(0, &config);
        assert!(!may_eject(&engines, 0.25), "a second would be half of four");
        assert!(may_eject(&engines, 0.5));
        engines[1].eject(0, &config);
        assert!(!may_eject(&engines, 0.5));
    }

    #[test]
    fn holds_set_and_clear() {
        let e = EngineState::new(EngineId::new("h"), "http://127.0.0.1:1/");
        assert!(!e.is_held() && e.hold_reason().is_none());
        assert!(e.set_hold(Some(HoldReason::Asleep)));
        assert!(!e.set_hold(Some(HoldReason::Asleep)));
        assert_eq!(e.hold_reason(), Some(HoldReason::Asleep));
        assert!(e.set_hold(Some(HoldReason::Unreachable)));
        assert_eq!(e.hold_reason(), Some(HoldReason::Unreachable));
        assert!(!e.is_ejected(), "a hold is not an ejection: no probes, no back-off");
        assert!(e.set_hold(None));
        assert!(!e.is_held());
    }

    #[test]
    fn ejects_after_consecutive_failures_and_backs_off() {
        let config = GuardConfig::default();
        let e = EngineState::new(EngineId::new("e"), "http://127.0.0.1:1/");
        assert_eq!(e.origin.base_url, "http://127.0.0.1:1");
        assert!(!e.record_failure(0, &config, || true));
        e.record_success();
        assert!(!e.record_failure(0, &config, || true));
        assert!(!e.record_failure(0, &config, || true));
        assert!(e.record_failure(0, &config, || true), "third failure in a row ejects");
        assert!(e.is_ejected());
        assert!(!e.probe_due(499));
        assert!(e.probe_due(500));
        e.probe_failed(500, &config);
        assert!(!e.probe_due(1499), "second back-off doubles");
        assert!(e.probe_due(1500));
        e.readmit(&config);
        assert!(!e.is_ejected());
        assert!(e.record_failure(1600, &config, || true), "on probation one failure ejects again");
        assert!(!e.probe_due(1600 + 1999), "and the back-off keeps doubling");
        e.readmit(&config);
        e.record_success();
        for _ in 0..3 {
            e.record_failure(2000, &config, || true);
        }
        assert!(e.probe_due(2500), "a success resets the back-off");
        let capped = EngineState::new(EngineId::new("c"), "http://127.0.0.1:2");
        for _ in 0..10 {
            assert!(!capped.record_failure(0, &config, || false), "the cap forbids ejection");
        }
        assert!(!capped.is_ejected());
    }
}
