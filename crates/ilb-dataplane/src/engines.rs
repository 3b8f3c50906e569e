//! Per-engine runtime state that outlives snapshots: in-flight count, the local guard and the
//! counters reported to the control plane. One `EngineState` per engine id lives in the
//! registry; every compiled routing table points at the same `Arc`s, so a snapshot swap never
//! resets a count and a request finishing after its engine left the snapshot still decrements
//! the right counter.

use ilb_core::holds::HoldReason;
use ilb_core::metrics::Histogram;
use ilb_core::EngineId;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
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
    /// `http://host:port` or `https://host:port` with any path prefix, without a trailing slash.
    pub base_url: String,
    /// For an https engine, the name its certificate must carry (the URL's host).
    tls_name: Option<ilb_tls::ServerName<'static>>,
    /// The reason of the last failed TLS handshake, as `Failure::ALL` index + 1 (0: none
    /// since the last successful request).
    last_tls_failure: std::sync::atomic::AtomicU8,
    /// Failed TLS handshakes by reason, indexed like `Failure::ALL`.
    pub tls_failures: [AtomicU64; ilb_tls::Failure::ALL.len()],
    /// TLS handshakes that succeeded: full, and resumed from a cached session.
    pub tls_handshakes: [AtomicU64; 2],
    /// The `Host` header sent to the engine, built once.
    host: http::HeaderValue,
    /// Where to connect: host (without IPv6 brackets) and port.
    connect_host: String,
    connect_port: u16,
    path_prefix: String,
    /// Idle connections to this engine; dropped with this state when the engine leaves.
    pub pool: crate::upstream::Pool,
    /// Requests sent and not yet finished (streamed responses count until their last byte).
    pub in_flight: AtomicU32,
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
}

impl EngineState {
    pub fn new(id: EngineId, url: &str) -> EngineState {
        let base_url = url.trim_end_matches('/').to_owned();
        let (rest, https) = match base_url.strip_prefix("https://") {
            Some(rest) => (rest, true),
            None => (base_url.strip_prefix("http://").unwrap_or(&base_url), false),
        };
        let (authority, path_prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let parsed: Option<http::uri::Authority> = authority.parse().ok();
        let connect_host = parsed.as_ref().map_or(authority, |a| a.host());
        let connect_host = connect_host.trim_start_matches('[').trim_end_matches(']').to_owned();
        // A host rustls does not take as a server name (neither a DNS name nor an IP address)
        // gets a placeholder name, so its handshakes fail as `name_mismatch`.
        let tls_name = https.then(|| {
            ilb_tls::server_name(&connect_host)
                .unwrap_or_else(|_| ilb_tls::ServerName::try_from("invalid.invalid").expect("valid name"))
        });
        EngineState {
            id,
            host: http::HeaderValue::from_str(authority)
                .unwrap_or_else(|_| http::HeaderValue::from_static("localhost")),
            connect_host,
            connect_port: parsed.as_ref().and_then(|a| a.port_u16()).unwrap_or(if https { 443 } else { 80 }),
            tls_name,
            last_tls_failure: Default::default(),
            tls_failures: Default::default(),
            tls_handshakes: Default::default(),
            path_prefix: path_prefix.to_owned(),
            pool: crate::upstream::Pool::default(),
            base_url,
            in_flight: AtomicU32::new(0),
            consecutive_failures: AtomicU32::new(0),
            ejected: AtomicBool::new(false),
            ejections: AtomicU32::new(0),
            held: AtomicU8::new(0),
            probe_at_ms: AtomicU64::new(0),
            counters: EngineCounters::default(),
        }
    }

    /// The engine's origin-form URI (path and query, behind the engine URL's path prefix) for
    /// a request path. Hot path: no string parsing unless the engine URL has a path prefix.
    pub fn upstream_uri(
        &self,
        path_and_query: Option<&http::uri::PathAndQuery>,
    ) -> Result<http::Uri, http::Error> {
        let path = match path_and_query {
            Some(pq) if self.path_prefix.is_empty() => pq.clone(),
            Some(pq) => format!("{}{}", self.path_prefix, pq.as_str()).parse()?,
            None if self.path_prefix.is_empty() => http::uri::PathAndQuery::from_static("/"),
            None => self.path_prefix.parse()?,
        };
        Ok(http::Uri::from(path))
    }

    /// The `Host` header value for requests to this engine.
    pub fn host_header(&self) -> &http::HeaderValue {
        &self.host
    }

    /// Host (without IPv6 brackets) and port to connect to.
    pub fn connect_addr(&self) -> (&str, u16) {
        (&self.connect_host, self.connect_port)
    }

    /// The name to verify an https engine's certificate against; `None` for plain http.
    pub fn tls_name(&self) -> Option<&ilb_tls::ServerName<'static>> {
        self.tls_name.as_ref()
    }

    /// Counts a failed TLS handshake; returns true when its reason differs from the last one
    /// (the caller logs only then, not once per attempt).
    pub fn record_tls_failure(&self, failure: ilb_tls::Failure) -> bool {
        let index = ilb_tls::Failure::ALL.iter().position(|f| *f == failure).unwrap_or(0);
        self.tls_failures[index].fetch_add(1, Relaxed);
        self.last_tls_failure.swap(index as u8 + 1, Relaxed) != index as u8 + 1
    }

    /// The reason of the last failed TLS handshake, until a request succeeds again.
    pub fn last_tls_failure(&self) -> Option<ilb_tls::Failure> {
        match self.last_tls_failure.load(Relaxed) {
            0 => None,
            n => ilb_tls::Failure::ALL.get(n as usize - 1).copied(),
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
        if self.last_tls_failure.load(Relaxed) != 0 {
            self.last_tls_failure.store(0, Relaxed);
        }
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

    #[test]
    fn upstream_target_host_and_address() {
        let pq = |s: &str| s.parse::<http::uri::PathAndQuery>().unwrap();
        let e = EngineState::new(EngineId::new("p"), "http://127.0.0.1:8001/prefix/");
        assert_eq!(
            e.upstream_uri(Some(&pq("/v1/chat/completions?x=1"))).unwrap(),
            "/prefix/v1/chat/completions?x=1"
        );
        assert_eq!(e.host_header(), "127.0.0.1:8001");
        assert_eq!(e.connect_addr(), ("127.0.0.1", 8001));
        let v6 = EngineState::new(EngineId::new("v6"), "http://[::1]:8000");
        assert_eq!(v6.upstream_uri(Some(&pq("/v1/models"))).unwrap(), "/v1/models");
        assert_eq!(v6.host_header(), "[::1]:8000");
        assert_eq!(v6.connect_addr(), ("::1", 8000));
        let named = EngineState::new(EngineId::new("n"), "http://engine-7");
        assert_eq!(named.host_header(), "engine-7");
        assert_eq!(named.connect_addr(), ("engine-7", 80));
        assert!(named.tls_name().is_none());
        let tls = EngineState::new(EngineId::new("t"), "https://engine-7.example/v1");
        assert_eq!(tls.connect_addr(), ("engine-7.example", 443));
        assert_eq!(tls.tls_name().map(|n| n.to_str().into_owned()).as_deref(), Some("engine-7.example"));
        assert_eq!(tls.upstream_uri(Some(&pq("/x"))).unwrap(), "/v1/x");
        let tls_v6 = EngineState::new(EngineId::new("t6"), "https://[::1]:8443");
        assert_eq!(tls_v6.connect_addr(), ("::1", 8443));
        assert!(tls_v6.tls_name().is_some());
        assert!(tls.record_tls_failure(ilb_tls::Failure::Expired), "a new reason is logged");
        assert!(!tls.record_tls_failure(ilb_tls::Failure::Expired), "the same reason again is not");
        assert_eq!(tls.last_tls_failure(), Some(ilb_tls::Failure::Expired));
        tls.record_success();
        assert_eq!(tls.last_tls_failure(), None);
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
        assert_eq!(e.base_url, "http://127.0.0.1:1");
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
