//! TLS to the nodes: the CA bundle that verifies them and the client certificate that mutual TLS
//! asks for, read and checked once at start-up. What a failed handshake tells the user is in
//! `handshake.rs`.

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
