//! TLS to the nodes: the CA bundle that verifies them and the client certificate that mutual TLS
//! asks for, read and checked at start-up and again whenever the files change (`reload.rs`).
//! What a failed handshake tells the user is in `handshake.rs`.

use super::error::ConfigError;
use redis::{ClientTlsConfig, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};

/// PEM files for `rediss://` nodes. Without a CA file the system's trust store verifies nodes;
/// the client certificate and key go together, for nodes that require mutual TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM bundle of the CA certificates that verify the nodes.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain), for mutual TLS; needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

impl TlsFiles {
    /// True when none of the three files is given.
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
                check_key_matches(&client_cert, cert_path, &client_key, key_path)?;
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

/// A key that is not the certificate's would fail every handshake, on every node, as "the node
/// refused our certificate"; in a rotation the key and the certificate are written apart, so
/// say which it is, before any node sees them.
fn check_key_matches(
    cert_pem: &[u8],
    cert_path: &Path,
    key_pem: &[u8],
    key_path: &Path,
) -> Result<(), ConfigError> {
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| {
        tls_file_error(
            "client key file",
            key_path,
            &format!("it holds no PEM private key ({e})"),
        )
    })?;
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            tls_file_error(
                "client certificate file",
                cert_path,
                &format!("it is not valid PEM ({e})"),
            )
        })?;
    let signing_key = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| {
        tls_file_error(
            "client key file",
            key_path,
            &format!("its key type is not supported ({e})"),
        )
    })?;
    match CertifiedKey::new(chain, signing_key).keys_match() {
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(tls_file_error(
                "client key file",
                key_path,
                &format!(
                    "it is not the key of the client certificate {}",
                    cert_path.display()
                ),
            ))
        }
        // A key type whose public half cannot be derived: the handshake will tell.
        _ => Ok(()),
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
