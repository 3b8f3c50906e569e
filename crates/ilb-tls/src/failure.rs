//! Why a TLS handshake failed, in words a person can act on and as a metric label.

use rustls::{AlertDescription, CertificateError};

/// The reason of a failed handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The peer's chain does not lead to a trusted root.
    UnknownIssuer,
    /// The certificate is not valid for the name (or IP address) connected to.
    NameMismatch,
    Expired,
    NotYetValid,
    Revoked,
    /// Another problem with the peer's certificate (bad encoding, wrong key usage, signature).
    BadCertificate,
    /// The peer refused our certificate, or asked for one we did not send.
    PeerRejected,
    /// The peer sent an alert for another reason (no common cipher suite or version, ...).
    Alert,
    /// The peer does not speak TLS, or spoke it wrongly (a plain-HTTP port, say).
    Protocol,
}

impl Failure {
    /// A label for metrics: lowercase, stable.
    pub fn label(self) -> &'static str {
        match self {
            Failure::UnknownIssuer => "unknown_issuer",
            Failure::NameMismatch => "name_mismatch",
            Failure::Expired => "expired",
            Failure::NotYetValid => "not_yet_valid",
            Failure::Revoked => "revoked",
            Failure::BadCertificate => "bad_certificate",
            Failure::PeerRejected => "peer_rejected",
            Failure::Alert => "alert",
            Failure::Protocol => "protocol",
        }
    }

    /// Every failure, in label order of the enum (for metrics that list all labels).
    pub const ALL: [Failure; 9] = [
        Failure::UnknownIssuer,
        Failure::NameMismatch,
        Failure::Expired,
        Failure::NotYetValid,
        Failure::Revoked,
        Failure::BadCertificate,
        Failure::PeerRejected,
        Failure::Alert,
        Failure::Protocol,
    ];

    /// What to check, in one sentence.
    pub fn advice(self) -> &'static str {
        match self {
            Failure::UnknownIssuer => {
                "the certificate is not issued by a trusted CA: add the issuing CA to the trusted bundle"
            }
            Failure::NameMismatch => {
                "the certificate does not name the host connected to: connect by a name in its subject alternative names"
            }
            Failure::Expired => "the certificate has expired: renew it",
            Failure::NotYetValid => "the certificate is not valid yet: check its notBefore and the clocks",
            Failure::Revoked => "the certificate was revoked",
            Failure::BadCertificate => "the certificate is unusable (encoding, key usage or signature)",
            Failure::PeerRejected => {
                "the peer refused the handshake: check the client certificate it expects"
            }
            Failure::Alert => "the peer aborted the handshake (no common TLS version or cipher suite?)",
            Failure::Protocol => "the peer does not speak TLS here (is it a plain http port?)",
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tls {}: {}", self.label().replace('_', " "), self.advice())
    }
}

/// Classifies a rustls error.
pub fn classify(error: &rustls::Error) -> Failure {
    use rustls::Error as E;
    match error {
        E::InvalidCertificate(CertificateError::UnknownIssuer) => Failure::UnknownIssuer,
        E::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => Failure::NameMismatch,
        E::InvalidCertificate(CertificateError::Expired | CertificateError::ExpiredContext { .. }) => {
            Failure::Expired
        }
        E::InvalidCertificate(
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. },
        ) => Failure::NotYetValid,
        E::InvalidCertificate(CertificateError::Revoked) => Failure::Revoked,
        E::InvalidCertificate(_) => Failure::BadCertificate,
        E::AlertReceived(
            AlertDescription::BadCertificate
            | AlertDescription::CertificateRequired
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::CertificateExpired
            | AlertDescription::AccessDenied,
        )
        | E::NoCertificatesPresented => Failure::PeerRejected,
        E::InvalidMessage(_) | E::InappropriateMessage { .. } | E::InappropriateHandshakeMessage { .. } => {
            Failure::Protocol
        }
        _ => Failure::Alert,
    }
}

/// Classifies an I/O error from a tokio-rustls handshake: `None` when it is not a TLS error
/// (a reset or a refused connection is a transport failure, not a certificate problem).
pub fn classify_io(error: &std::io::Error) -> Option<Failure> {
    let inner = error.get_ref()?;
    inner.downcast_ref::<rustls::Error>().map(classify)
}
