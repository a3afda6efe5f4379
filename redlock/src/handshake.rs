//! What a failed TLS handshake tells the person configuring the nodes.

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
