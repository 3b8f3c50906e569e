//! TLS files: the binary reads certificates, keys and CA bundles (the libraries take PEM bytes),
//! merges a configured CA with the platform's roots, and watches listener certificates for
//! rotation.
//!
//! A listener's certificate and key files are polled every second; when either changes, both
//! are read and checked together, and the pair replaces the served one for new handshakes
//! (live connections keep theirs). A pair that does not load (unreadable, malformed, a key that
//! is not the certificate's, as in the moment between writing the two files) is logged and the
//! running certificate stays; the next change is tried again.

use anyhow::Context;
use ilb_tls::{CertificateDer, ClientAuth, ClientOptions, ClientTls, Identity, ServerTls};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// TLS on a listener: the data plane's client listener, the control plane's API and dashboard
/// (and `ilb engine-sim`, by flags only). Flags: `--tls-cert FILE --tls-key FILE` (all three);
/// the control plane's `--tls-client-ca FILE` and `--tls-client-auth required|optional`. The
/// certificate and key files are polled every second and reloaded when either changes; live
/// connections keep their session, new handshakes get the new certificate, and a pair that
/// does not load (a key that is not the certificate's, say) is logged and the old one stays.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerTlsSection {
    /// PEM certificate chain, end-entity first, e.g. `"/etc/ilb/tls.crt"`. Watched: a changed
    /// file is reloaded without dropping connections.
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert` (PKCS#8, PKCS#1 or SEC1), e.g. `"/etc/ilb/tls.key"`. Watched.
    pub key: Option<PathBuf>,
    /// PEM bundle of the CAs that issue client certificates; set it to verify clients
    /// (control plane only: data planes then authenticate with certificates).
    pub client_ca: Option<PathBuf>,
    /// `"required"` (default: clients without a certificate fail the handshake) or
    /// `"optional"` (they connect, but snapshots and reports need a certificate or, for
    /// reports, the bearer token).
    pub client_auth: Option<String>,
}

/// How a client trusts https servers (engines, or the control plane), and the certificate it
/// presents if they ask for one. Without `ca` the platform's roots are trusted. Engine URLs
/// may be `https://host:port`: the certificate must name the URL's host (DNS name or IP
/// address), ALPN is `http/1.1`, connections are kept alive and sessions resumed. Flags:
/// `--engine-ca FILE`, `--engine-ca-only`, `--engine-cert FILE --engine-key FILE` (data plane
/// and control plane, for engines); the data plane's `--control-plane-ca FILE` and
/// `--client-cert FILE --client-key FILE` (for the control plane), and `--https-only`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTlsSection {
    /// PEM bundle of CAs to trust in addition to the platform's roots, e.g. `"/etc/ilb/ca.pem"`.
    pub ca: Option<PathBuf>,
    /// Trust only `ca`, not the platform's roots. Default false.
    pub ca_only: Option<bool>,
    /// PEM client certificate for mutual TLS (with `key`).
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

fn load_identity(cert: &Path, key: &Path) -> anyhow::Result<Identity> {
    Identity::from_pem(&read(cert)?, &read(key)?)
        .with_context(|| format!("certificate {} with key {}", cert.display(), key.display()))
}

fn load_cas(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    ilb_tls::certs_from_pem(&read(path)?).with_context(|| format!("CA bundle {}", path.display()))
}

/// The platform's trusted roots (the system store, `SSL_CERT_FILE`/`SSL_CERT_DIR`); problems
/// with single certificates are logged and skipped.
fn system_roots() -> Vec<CertificateDer<'static>> {
    let found = rustls_native_certs::load_native_certs();
    for error in &found.errors {
        tracing::debug!(%error, "skipped part of the platform's trust store");
    }
    if found.certs.is_empty() {
        tracing::warn!("no trusted roots found in the platform's store; https peers need a configured CA");
    }
    found.certs
}

impl ClientTlsSection {
    /// Builds the client config; `what` names the section in errors (e.g. `data_plane.engine_tls`).
    pub fn build(&self, what: &str) -> anyhow::Result<ClientTls> {
        let ca_only = self.ca_only.unwrap_or(false);
        if ca_only && self.ca.is_none() {
            anyhow::bail!("{what}.ca_only needs {what}.ca");
        }
        let mut roots = if ca_only { Vec::new() } else { system_roots() };
        if let Some(ca) = &self.ca {
            roots.extend(load_cas(ca).with_context(|| format!("{what}.ca"))?);
        }
        let identity = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                Some(load_identity(cert, key).with_context(|| format!("{what}.cert"))?)
            }
            (None, None) => None,
            _ => anyhow::bail!("{what}: give both cert and key, or neither"),
        };
        ClientTls::new(&ClientOptions { roots, identity }).with_context(|| what.to_owned())
    }
}

/// A listener's TLS with the paths it watches.
#[derive(Debug)]
pub struct Listener {
    pub tls: ServerTls,
    cert: PathBuf,
    key: PathBuf,
}

impl ListenerTlsSection {
    /// `None` without `cert` and `key`; `allow_client_ca` is false where client verification
    /// is not supported (the data plane's client listener).
    pub fn build(&self, what: &str, allow_client_ca: bool) -> anyhow::Result<Option<Listener>> {
        let (cert, key) = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => (cert.clone(), key.clone()),
            (None, None) => {
                if self.client_ca.is_some() || self.client_auth.is_some() {
                    anyhow::bail!("{what}: client_ca and client_auth need cert and key");
                }
                return Ok(None);
            }
            _ => anyhow::bail!("{what}: give both cert and key, or neither"),
        };
        if !allow_client_ca && (self.client_ca.is_some() || self.client_auth.is_some()) {
            anyhow::bail!("{what}: client certificates are verified only by the control plane");
        }
        let client_auth = match (&self.client_ca, self.client_auth.as_deref()) {
            (None, None) => ClientAuth::None,
            (None, Some(_)) => anyhow::bail!("{what}.client_auth needs {what}.client_ca"),
            (Some(ca), None | Some("required")) => {
                ClientAuth::Required(load_cas(ca).with_context(|| format!("{what}.client_ca"))?)
            }
            (Some(ca), Some("optional")) => {
                ClientAuth::Optional(load_cas(ca).with_context(|| format!("{what}.client_ca"))?)
            }
            (Some(_), Some(other)) => {
                anyhow::bail!("{what}.client_auth: '{other}' is neither \"required\" nor \"optional\"")
            }
        };
        let identity = load_identity(&cert, &key).with_context(|| format!("{what}.cert"))?;
        let tls = ServerTls::new(&identity, client_auth).with_context(|| what.to_owned())?;
        Ok(Some(Listener { tls, cert, key }))
    }
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl Listener {
    /// Watches the certificate and key files until the task is dropped (see the module docs).
    pub async fn watch(self, every: Duration) {
        let stamp = || (mtime(&self.cert), mtime(&self.key));
        let mut seen = stamp();
        loop {
            tokio::time::sleep(every).await;
            let now = stamp();
            if now == seen {
                continue;
            }
            seen = now;
            match load_identity(&self.cert, &self.key).and_then(|id| Ok(self.tls.reload(&id)?)) {
                Ok(()) => tracing::info!(cert = %self.cert.display(), "tls certificate reloaded"),
                Err(e) => tracing::warn!(
                    cert = %self.cert.display(),
                    error = %format!("{e:#}"),
                    "new tls certificate rejected, keeping the current one"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ilb_tls::testing::TestCa;

    #[tokio::test]
    async fn a_changed_pair_is_reloaded_and_a_bad_one_rejected() {
        let dir = std::env::temp_dir().join(format!("ilb-tls-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        let ca = TestCa::new("ca");
        let first = ca.issue(&["127.0.0.1"]);
        std::fs::write(&cert, &first.cert_pem).unwrap();
        std::fs::write(&key, &first.key_pem).unwrap();
        let section =
            ListenerTlsSection { cert: Some(cert.clone()), key: Some(key.clone()), ..Default::default() };
        let listener = section.build("test", false).unwrap().unwrap();
        let tls = listener.tls.clone();
        let watcher = tokio::spawn(listener.watch(Duration::from_millis(20)));
        let served = || tls.current_certificate();
        assert_eq!(&served(), first.identity().certificate());

        // A key that is not the certificate's (half-written rotation): rejected, old one stays.
        let second = ca.issue(&["127.0.0.1"]);
        std::fs::write(&cert, &second.cert_pem).unwrap();
        bump(&cert);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(&served(), first.identity().certificate(), "a mismatched pair must not be served");
        // The key arrives: the pair loads.
        std::fs::write(&key, &second.key_pem).unwrap();
        bump(&key);
        // A hang guard counted in polls (1,000 × 20 ms), not a wall-clock bound.
        let mut polls = 0;
        while &served() != second.identity().certificate() {
            polls += 1;
            assert!(polls <= 1000, "the new pair was never loaded");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Garbage: rejected.
        std::fs::write(&cert, "not a certificate").unwrap();
        bump(&cert);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(&served(), second.identity().certificate());
        watcher.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Moves a file's mtime forward so a change within the file system's timestamp
    /// granularity is still seen.
    fn bump(path: &Path) {
        let file = std::fs::File::options().write(true).open(path).unwrap();
        let later = mtime(path).unwrap() + Duration::from_secs(1);
        file.set_modified(later).unwrap();
    }

    #[test]
    fn sections_are_checked() {
        let half = ListenerTlsSection { cert: Some("x".into()), ..Default::default() };
        assert!(half.build("t", true).unwrap_err().to_string().contains("both cert and key"));
        let client_ca = ListenerTlsSection { client_ca: Some("x".into()), ..Default::default() };
        assert!(client_ca.build("t", true).is_err());
        let only = ClientTlsSection { ca_only: Some(true), ..Default::default() };
        assert!(only.build("t").unwrap_err().to_string().contains("needs t.ca"));
        let missing = ClientTlsSection { ca: Some("/nonexistent/ca.pem".into()), ..Default::default() };
        assert!(format!("{:#}", missing.build("t").unwrap_err()).contains("cannot read"));
    }
}
