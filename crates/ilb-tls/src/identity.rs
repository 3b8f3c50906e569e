//! Certificates and keys from PEM, and the name a verified peer certificate carries.

use crate::{provider, TlsError};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A certificate chain and its private key, checked to belong together.
#[derive(Debug)]
pub struct Identity {
    pub(crate) chain: Vec<CertificateDer<'static>>,
    pub(crate) key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Identity { chain: self.chain.clone(), key: self.key.clone_key() }
    }
}

impl Identity {
    /// Parses a PEM certificate chain (end-entity first) and a PEM private key (PKCS#8, PKCS#1
    /// or SEC1), and checks that the key is the certificate's.
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Identity, TlsError> {
        let chain = certs_from_pem(cert_pem)?;
        let key = match PrivateKeyDer::from_pem_slice(key_pem) {
            Ok(key) => key,
            Err(rustls_pki_types::pem::Error::NoItemsFound) => return Err(TlsError::NoKey),
            Err(e) => return Err(TlsError::Pem(e.to_string())),
        };
        let identity = Identity { chain, key };
        identity.certified_key()?;
        Ok(identity)
    }

    /// The end-entity certificate.
    pub fn certificate(&self) -> &CertificateDer<'static> {
        &self.chain[0]
    }

    pub(crate) fn certified_key(&self) -> Result<CertifiedKey, TlsError> {
        match CertifiedKey::from_der(self.chain.clone(), self.key.clone_key(), &provider()) {
            Ok(key) => Ok(key),
            Err(rustls::Error::InconsistentKeys(_)) => Err(TlsError::KeyMismatch),
            Err(e) => Err(TlsError::Rustls(e)),
        }
    }
}

/// Every certificate in a PEM bundle; none at all is an error.
pub fn certs_from_pem(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    Ok(certs)
}

/// A short name for a verified client certificate, for logs and the control plane's list of
/// data planes: its first URI subject alternative name (a SPIFFE id, say), else its first DNS
/// name, else `sha256:` and the first 16 hex digits of its fingerprint.
pub fn peer_identity(cert: &CertificateDer<'_>) -> String {
    if let Ok(parsed) = webpki::EndEntityCert::try_from(cert) {
        if let Some(uri) = parsed.valid_uri_names().next() {
            return uri.to_owned();
        }
        if let Some(dns) = parsed.valid_dns_names().next() {
            return dns.to_owned();
        }
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, cert.as_ref());
    let hex: String = digest.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}
