//! Certificates made at run time with rcgen, for tests and the demo (feature `test-certs`):
//! a CA, and server or client certificates it issues. Keys are fresh ECDSA P-256 keys.

use crate::{certs_from_pem, CertificateDer, Identity};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose, SanType};

/// A certificate authority that issues certificates.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// An issued certificate and its key, as PEM.
#[derive(Clone, Debug)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Issued {
    pub fn identity(&self) -> Identity {
        Identity::from_pem(self.cert_pem.as_bytes(), self.key_pem.as_bytes())
            .expect("rcgen makes valid pairs")
    }
}

/// The validity of an issued certificate.
#[derive(Clone, Copy, Debug, Default)]
pub enum Validity {
    /// rcgen's default: from 1975 to 4096.
    #[default]
    Long,
    /// Expired: valid only during 2020.
    Expired,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("key generation");
        let cert = params.self_signed(&key).expect("self-signed CA");
        TestCa { cert, key }
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    pub fn der(&self) -> CertificateDer<'static> {
        certs_from_pem(self.pem().as_bytes()).expect("valid pem").remove(0)
    }

    /// A certificate for `names` (DNS names, or IP addresses such as `127.0.0.1`).
    pub fn issue(&self, names: &[&str]) -> Issued {
        self.issue_with(names, Validity::Long)
    }

    pub fn issue_with(&self, names: &[&str], validity: Validity) -> Issued {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("valid names");
        params.distinguished_name.push(DnType::CommonName, "ilb test");
        if let Validity::Expired = validity {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        self.sign(params)
    }

    /// A client certificate naming `uri` (e.g. `spiffe://ilb/dp/eu-1`) as its URI SAN.
    pub fn issue_client(&self, uri: &str) -> Issued {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
        params.distinguished_name.push(DnType::CommonName, uri);
        params.subject_alt_names = vec![SanType::URI(uri.try_into().expect("ascii uri"))];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Issued {
        let key = KeyPair::generate().expect("key generation");
        let cert = params.signed_by(&key, &self.cert, &self.key).expect("signing");
        Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() }
    }
}
