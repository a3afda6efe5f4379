//! TLS to the nodes: the CA bundle that verifies them and the client certificate that mutual TLS
//! asks for, read and checked once at start-up; and what a failed handshake tells the user.

use super::error::ConfigError;
use redis::{ClientTlsConfig, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};

/// PEM files for `rediss://` nodes. Without a CA file the system's trust store verifies nodes;
/// the client certificate and key go together, for nodes that require mutual TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

impl TlsFiles {
    pub fn is_empty(&self) -> bool {
        self.ca_file.is_none() && self.cert_file.is_none() && self.key_file.is_none()
    }

    /// Reads and parses the files, so that a wrong path or a file of the wrong kind is reported
    /// at start-up, by name, rather than as a handshake failure on every node later.
    pub(crate) fn load(&self) -> Result<TlsCertificates, ConfigError> {
        let root_cert = match &self.ca_file {
            Some(path) => Some(read_certificates(path, "CA file")?),
            None => None,
        };
        let client_tls = match (&self.cert_file, &self.key_file) {
            (None, None) => None,
            (Some(_), None) | (None, Some(_)) => return Err(ConfigError::ClientCertWithoutKey),
            (Some(cert_path), Some(key_path)) => {
                let client_cert = read_certificates(cert_path, "client certificate file")?;
                let client_key = read(key_path, "client key file")?;
                PrivateKeyDer::from_pem_slice(&client_key).map_err(|e| {
                    tls_file_error(
                        "client key file",
                        key_path,
                        &format!("it holds no PEM private key ({e})"),
                    )
                })?;
                Some(ClientTlsConfig {
                    client_cert,
                    client_key,
                })
            }
        };
        Ok(TlsCertificates {
            client_tls,
            root_cert,
        })
    }
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| tls_file_error(what, path, &e.to_string()))
}

/// Reads a PEM file that must hold at least one certificate.
fn read_certificates(path: &Path, what: &'static str) -> Result<Vec<u8>, ConfigError> {
    let pem = read(path, what)?;
    let count = CertificateDer::pem_slice_iter(&pem)
        .try_fold(0, |count, cert| cert.map(|_| count + 1))
        .map_err(|e| tls_file_error(what, path, &format!("it is not valid PEM ({e})")))?;
    if count == 0 {
        return Err(tls_file_error(
            what,
            path,
            "it holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(pem)
}

fn tls_file_error(what: &'static str, path: &Path, reason: &str) -> ConfigError {
    ConfigError::TlsFile {
        what,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// The TLS error behind a connection failure, if any: tokio-rustls reports it as an I/O error
/// wrapping the rustls error, and redis-rs keeps that behind an `Arc<dyn Error>`.
pub(crate) fn tls_cause(err: &redis::RedisError) -> Option<&rustls::Error> {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(error) = cause {
        let unwrapped: &(dyn std::error::Error + 'static) = match error.downcast_ref::<Shared>() {
            Some(shared) => shared.as_ref(),
            None => error,
        };
        if let Some(tls) = unwrapped.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        // io::Error's `source` skips the error it wraps; look at that one first.
        if let Some(tls) = unwrapped
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls);
        }
        cause = error.source();
    }
    None
}

/// What a failed handshake means for the person configuring the nodes.
pub(crate) fn describe(err: &rustls::Error) -> String {
    use rustls::{AlertDescription as Alert, CertificateError as Cert, Error};
    let advice = match err {
        Error::InvalidCertificate(Cert::UnknownIssuer | Cert::BadSignature) => {
            "the node's certificate is not signed by a trusted CA; give the CA that signed it with --redis-ca-file or LOCKEDJOB_REDIS_CA_FILE"
        }
        Error::InvalidCertificate(Cert::Expired | Cert::ExpiredContext { .. }) => {
            "the node's certificate has expired; renew it on the node"
        }
        Error::InvalidCertificate(Cert::NotValidYet | Cert::NotValidYetContext { .. }) => {
            "the node's certificate is not valid yet; check the clocks of this host and of the CA"
        }
        Error::InvalidCertificate(Cert::NotValidForName | Cert::NotValidForNameContext { .. }) => {
            "the node's certificate does not name the host in its URL; use a URL with a name (or IP) the certificate lists"
        }
        Error::AlertReceived(
            Alert::CertificateRequired
            | Alert::BadCertificate
            | Alert::UnknownCA
            | Alert::CertificateUnknown
            | Alert::CertificateExpired
            | Alert::HandshakeFailure,
        ) => {
            "the node refused the connection during the TLS handshake: it requires a client certificate its CA signed; set --redis-cert-file and --redis-key-file (LOCKEDJOB_REDIS_CERT_FILE, LOCKEDJOB_REDIS_KEY_FILE)"
        }
        Error::InvalidMessage(_) => {
            "the node did not answer in TLS; does it serve TLS on this port (tls-port), or should the URL be redis://?"
        }
        _ => "TLS handshake failed",
    };
    format!("TLS: {advice} ({err})")
}
