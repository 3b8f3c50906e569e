//! TLS for every hop of ilb, on rustls with the `ring` provider (no OpenSSL): one place for
//! the settings both planes and the engine simulator share.
//!
//! - [`ClientTls`]: a client config (trust roots, an optional client certificate for mutual
//!   TLS, ALPN `http/1.1`, an in-memory session cache so a reconnect resumes instead of paying
//!   a full handshake), used for engines, scrapes and the control plane.
//! - [`ServerTls`]: a listener's config whose certificate can be replaced while it serves
//!   ([`ServerTls::reload`]): live connections keep the session they negotiated, new handshakes
//!   get the new certificate. An optional client CA makes it verify client certificates.
//!   [`ServerTls::handshake`] is every listener's accept: within a timeout, and a failure
//!   comes back with its reason ([`HandshakeError::reason`]).
//! - [`Failure`]: why a handshake failed, as a short label for metrics (`unknown_issuer`,
//!   `name_mismatch`, `expired`, ...) and a sentence a person can act on.
//!
//! Certificates come in as PEM bytes: this crate reads no files (the binary does, and watches
//! them for rotation), so that which file was read when stays in one place.

// No product function over `too-many-lines-threshold` (clippy.toml) lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// No unsafe code (the workspace's one `unsafe` is the optimizer's cache prefetch hint).
#![forbid(unsafe_code)]

mod failure;
mod identity;
#[cfg(feature = "test-certs")]
pub mod testing;

pub use failure::{classify, classify_io, Failure};
pub use identity::{certs_from_pem, peer_identity, Identity};
pub use rustls;
pub use rustls_pki_types::{CertificateDer, ServerName};
pub use tokio_rustls::{self, TlsAcceptor, TlsConnector};

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

/// Why a client's handshake with a [`ServerTls`] listener did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("tls handshake not finished within {0:?}")]
    TimedOut(Duration),
    #[error("tls handshake failed ({reason}): {error}")]
    Failed { reason: &'static str, error: std::io::Error },
}

impl HandshakeError {
    /// A short label for logs and metrics: `timeout`, a [`Failure`] label, or `transport`.
    pub fn reason(&self) -> &'static str {
        match self {
            HandshakeError::TimedOut(_) => "timeout",
            HandshakeError::Failed { reason, .. } => reason,
        }
    }
}

/// Why a TLS setting could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("no certificate found in the PEM data")]
    NoCertificate,
    #[error("no private key found in the PEM data")]
    NoKey,
    #[error("malformed PEM: {0}")]
    Pem(String),
    #[error("the private key does not belong to the certificate")]
    KeyMismatch,
    #[error("unusable certificate or key: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("no usable CA certificate in the bundle ({0})")]
    BadCa(String),
    #[error("cannot verify client certificates: {0}")]
    ClientVerifier(String),
    #[error("invalid server name '{0}'")]
    ServerName(String),
}

/// The crypto provider of every config built here (ring: builds with a C compiler alone).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Sessions remembered per client config for resumption (across all servers it talks to).
const SESSION_CACHE: usize = 4096;

/// How a client authenticates servers and itself.
#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    /// Trusted roots: the platform's and/or a configured CA bundle, as the caller merged them.
    pub roots: Vec<CertificateDer<'static>>,
    /// A client certificate and key, for servers that ask for one (mutual TLS).
    pub identity: Option<Identity>,
}

/// A TLS client configuration; cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    connector: TlsConnector,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("client_cert", &self.config.client_auth_cert_resolver.has_certs())
            .finish()
    }
}

impl ClientTls {
    /// Builds the config. Roots that do not parse are an error (an operator's CA bundle must
    /// not silently lose a certificate); an empty root set is allowed and fails every
    /// handshake with `unknown_issuer`.
    pub fn new(options: &ClientOptions) -> Result<ClientTls, TlsError> {
        let mut roots = RootCertStore::empty();
        for cert in &options.roots {
            roots.add(cert.clone()).map_err(|e| TlsError::BadCa(e.to_string()))?;
        }
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let mut config = match &options.identity {
            Some(id) => builder.with_client_auth_cert(id.chain.clone(), id.key.clone_key())?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config.resumption = rustls::client::Resumption::in_memory_sessions(SESSION_CACHE);
        let config = Arc::new(config);
        Ok(ClientTls { connector: TlsConnector::from(Arc::clone(&config)), config })
    }

    /// The rustls config (for hyper-rustls and the like).
    pub fn config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.config)
    }

    /// A copy of the config without ALPN protocols, as hyper-rustls wants it (it sets them from
    /// the HTTP versions it enables). It shares the session cache.
    pub fn config_without_alpn(&self) -> ClientConfig {
        let mut config = (*self.config).clone();
        config.alpn_protocols.clear();
        config
    }

    /// The connector for tokio streams.
    pub fn connector(&self) -> &TlsConnector {
        &self.connector
    }
}

/// Whether and how a listener asks clients for certificates.
#[derive(Clone, Debug, Default)]
pub enum ClientAuth {
    /// No client certificates (plain server TLS).
    #[default]
    None,
    /// Clients must present a certificate issued by one of these CAs, or the handshake fails.
    Required(Vec<CertificateDer<'static>>),
    /// Clients may present one; if they do, it must be issued by one of these CAs. The
    /// application decides what an anonymous client may do.
    Optional(Vec<CertificateDer<'static>>),
}

/// A listener's TLS configuration whose certificate rotates in place; cheap to clone.
#[derive(Clone)]
pub struct ServerTls {
    resolver: Arc<Rotating>,
    config: Arc<ServerConfig>,
    acceptor: TlsAcceptor,
    client_auth: bool,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").field("client_auth", &self.client_auth).finish()
    }
}

/// The certificate handed to every new handshake; swapped by [`ServerTls::reload`].
#[derive(Debug)]
struct Rotating {
    current: ArcSwap<CertifiedKey>,
}

impl ResolvesServerCert for Rotating {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

impl ServerTls {
    /// A listener config serving `identity`, ALPN `http/1.1`, with stateless session tickets
    /// so that clients resume.
    pub fn new(identity: &Identity, client_auth: ClientAuth) -> Result<ServerTls, TlsError> {
        let provider = provider();
        let resolver = Arc::new(Rotating { current: ArcSwap::from_pointee(identity.certified_key()?) });
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()?;
        let (builder, asks) = match &client_auth {
            ClientAuth::None => (builder.with_no_client_auth(), false),
            ClientAuth::Required(cas) | ClientAuth::Optional(cas) => {
                let mut roots = RootCertStore::empty();
                for cert in cas {
                    roots.add(cert.clone()).map_err(|e| TlsError::BadCa(e.to_string()))?;
                }
                if roots.is_empty() {
                    return Err(TlsError::BadCa("the client CA bundle is empty".into()));
                }
                let mut verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                if matches!(client_auth, ClientAuth::Optional(_)) {
                    verifier = verifier.allow_unauthenticated();
                }
                let verifier = verifier.build().map_err(|e| TlsError::ClientVerifier(e.to_string()))?;
                (builder.with_client_cert_verifier(verifier), true)
            }
        };
        let mut config = builder.with_cert_resolver(Arc::clone(&resolver) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config.ticketer = rustls::crypto::ring::Ticketer::new()?;
        let config = Arc::new(config);
        Ok(ServerTls {
            acceptor: TlsAcceptor::from(Arc::clone(&config)),
            config,
            resolver,
            client_auth: asks,
        })
    }

    /// The same listener config (and certificate rotation) offering `alpn` instead, e.g.
    /// `h2` for a gRPC listener.
    pub fn with_alpn(&self, alpn: &[&[u8]]) -> ServerTls {
        let mut config = (*self.config).clone();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let config = Arc::new(config);
        ServerTls {
            acceptor: TlsAcceptor::from(Arc::clone(&config)),
            config,
            resolver: Arc::clone(&self.resolver),
            client_auth: self.client_auth,
        }
    }

    /// Completes a client's handshake on `stream` within `timeout` (a client that stalls its
    /// handshake holds a listener's task no longer than that).
    pub async fn handshake<IO: AsyncRead + AsyncWrite + Unpin>(
        &self,
        stream: IO,
        timeout: Duration,
    ) -> Result<tokio_rustls::server::TlsStream<IO>, HandshakeError> {
        match tokio::time::timeout(timeout, self.acceptor.accept(stream)).await {
            Ok(Ok(tls)) => Ok(tls),
            Ok(Err(error)) => {
                let reason = classify_io(&error).map_or("transport", |f| f.label());
                Err(HandshakeError::Failed { reason, error })
            }
            Err(_) => Err(HandshakeError::TimedOut(timeout)),
        }
    }

    /// Serves `identity` to every handshake from now on; connections already established keep
    /// theirs. The identity was checked when it was built, so this cannot fail.
    pub fn reload(&self, identity: &Identity) -> Result<(), TlsError> {
        self.resolver.current.store(Arc::new(identity.certified_key()?));
        Ok(())
    }

    /// The end-entity certificate new handshakes get.
    pub fn current_certificate(&self) -> CertificateDer<'static> {
        self.resolver.current.load().cert[0].clone()
    }

    /// Whether client certificates are asked for.
    pub fn verifies_clients(&self) -> bool {
        self.client_auth
    }

    pub fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }

    /// The rustls config (for in-memory connections, as in the handshake benchmark).
    pub fn config(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.config)
    }
}

/// The name to check an https URL's host against: a DNS name, or an IP address for
/// `https://127.0.0.1:…` (checked against the certificate's IP subject alternative names).
/// IPv6 brackets are removed.
pub fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_owned()).map_err(|_| TlsError::ServerName(host.to_owned()))
}

#[cfg(test)]
mod tests;
