//! Certificates for TLS tests, made fresh per test with rcgen: a CA, server certificates for
//! chosen names and validity, client certificates; written as PEM files into a temp dir.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use std::path::{Path, PathBuf};

pub struct TestCa {
    dir: tempfile::TempDir,
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub ca_file: PathBuf,
}

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    Current,
    /// Expired in 2021.
    Expired,
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("lockedjob-pki-")
            .tempdir()
            .expect("temp dir for certificates");
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("self-signed CA");
        let ca_file = dir.path().join(format!("{name}-ca.crt"));
        write(&ca_file, &issuer.pem());
        Self {
            dir,
            issuer,
            ca_file,
        }
    }

    /// A serving certificate for `names` (DNS names or IP addresses).
    pub fn server(&self, file_name: &str, names: &[&str], validity: Validity) -> CertFiles {
        self.leaf(
            file_name,
            names,
            validity,
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    pub fn client(&self, file_name: &str) -> CertFiles {
        self.leaf(
            file_name,
            &[],
            Validity::Current,
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    fn leaf(
        &self,
        file_name: &str,
        names: &[&str],
        validity: Validity,
        usage: ExtendedKeyUsagePurpose,
    ) -> CertFiles {
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, file_name);
        params.subject_alt_names = names
            .iter()
            .map(|name| match name.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*name).try_into().expect("a DNS name")),
            })
            .collect();
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![usage];
        if validity == Validity::Expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("signed leaf");
        let files = CertFiles {
            cert: self.dir.path().join(format!("{file_name}.crt")),
            key: self.dir.path().join(format!("{file_name}.key")),
        };
        write(&files.cert, &cert.pem());
        write(&files.key, &key.serialize_pem());
        files
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
