//! Where an engine is and how to reach it, parsed once from its URL: the address to connect
//! to, the `Host` header, the path prefix, the name its TLS certificate must carry, and the
//! counts of its TLS handshakes. Everything [`super::send`] needs besides the engine's pool.

use ilb_core::EngineId;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

/// One engine's address and TLS identity, with its handshake counters.
#[derive(Debug)]
pub struct Origin {
    /// The engine's id, for logs.
    pub id: EngineId,
    /// `http://host:port` or `https://host:port` with any path prefix, without a trailing slash.
    pub base_url: String,
    /// For an https engine, the name its certificate must carry (the URL's host).
    tls_name: Option<ilb_tls::ServerName<'static>>,
    /// The reason of the last failed TLS handshake, as `Failure::ALL` index + 1 (0: none
    /// since the last successful request).
    last_tls_failure: AtomicU8,
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
}

impl Origin {
    pub fn new(id: EngineId, url: &str) -> Origin {
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
        Origin {
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
            base_url,
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

    /// A request succeeded: the last TLS failure is over.
    pub fn clear_tls_failure(&self) {
        if self.last_tls_failure.load(Relaxed) != 0 {
            self.last_tls_failure.store(0, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_target_host_and_address() {
        let pq = |s: &str| s.parse::<http::uri::PathAndQuery>().unwrap();
        let e = Origin::new(EngineId::new("p"), "http://127.0.0.1:8001/prefix/");
        assert_eq!(e.base_url, "http://127.0.0.1:8001/prefix");
        assert_eq!(
            e.upstream_uri(Some(&pq("/v1/chat/completions?x=1"))).unwrap(),
            "/prefix/v1/chat/completions?x=1"
        );
        assert_eq!(e.host_header(), "127.0.0.1:8001");
        assert_eq!(e.connect_addr(), ("127.0.0.1", 8001));
        let v6 = Origin::new(EngineId::new("v6"), "http://[::1]:8000");
        assert_eq!(v6.upstream_uri(Some(&pq("/v1/models"))).unwrap(), "/v1/models");
        assert_eq!(v6.host_header(), "[::1]:8000");
        assert_eq!(v6.connect_addr(), ("::1", 8000));
        let named = Origin::new(EngineId::new("n"), "http://engine-7");
        assert_eq!(named.host_header(), "engine-7");
        assert_eq!(named.connect_addr(), ("engine-7", 80));
        assert!(named.tls_name().is_none());
        let tls = Origin::new(EngineId::new("t"), "https://engine-7.example/v1");
        assert_eq!(tls.connect_addr(), ("engine-7.example", 443));
        assert_eq!(tls.tls_name().map(|n| n.to_str().into_owned()).as_deref(), Some("engine-7.example"));
        assert_eq!(tls.upstream_uri(Some(&pq("/x"))).unwrap(), "/v1/x");
        let tls_v6 = Origin::new(EngineId::new("t6"), "https://[::1]:8443");
        assert_eq!(tls_v6.connect_addr(), ("::1", 8443));
        assert!(tls_v6.tls_name().is_some());
        assert!(tls.record_tls_failure(ilb_tls::Failure::Expired), "a new reason is logged");
        assert!(!tls.record_tls_failure(ilb_tls::Failure::Expired), "the same reason again is not");
        assert_eq!(tls.last_tls_failure(), Some(ilb_tls::Failure::Expired));
        tls.clear_tls_failure();
        assert_eq!(tls.last_tls_failure(), None);
    }
}
