//! The cluster's own certificate authority: the API server's serving certificate, the node
//! agent's kubelet serving certificate and the service-account signing key, written as PEM
//! files into the cluster's directory.

use crate::Error;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

/// Paths of the PEM files a control plane needs.
#[derive(Debug, Clone)]
pub struct Pki {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub apiserver_cert: PathBuf,
    pub apiserver_key: PathBuf,
    pub kubelet_cert: PathBuf,
    pub kubelet_key: PathBuf,
    pub service_account_key: PathBuf,
    pub service_account_pub: PathBuf,
}

fn pki_error(what: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |source| Error::Pki { what, source }
}

/// Names the API server answers to: loopback, and the in-cluster names of the `kubernetes`
/// Service (first address of the service range), so in-cluster clients verify it too.
fn apiserver_names() -> Vec<SanType> {
    let mut names: Vec<SanType> = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    .into_iter()
    .filter_map(|n| n.try_into().ok().map(SanType::DnsName))
    .collect();
    names.push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    names.push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))));
    names
}

impl Pki {
    /// Generates a fresh CA and every certificate and key into `dir`.
    pub fn generate(dir: &Path) -> Result<Self, Error> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create the pki directory", e))?;
        let pki = Self {
            ca_cert: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            apiserver_cert: dir.join("apiserver.crt"),
            apiserver_key: dir.join("apiserver.key"),
            kubelet_cert: dir.join("kubelet.crt"),
            kubelet_key: dir.join("kubelet.key"),
            service_account_key: dir.join("sa.key"),
            service_account_pub: dir.join("sa.pub"),
        };

        let mut ca_params = CertificateParams::default();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "lockedjob-localcluster-ca");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().map_err(pki_error("generate the CA key"))?;
        let ca_key_pem = ca_key.serialize_pem();
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key)
            .map_err(pki_error("self-sign the CA"))?;
        write(&pki.ca_cert, &ca.pem())?;
        write(&pki.ca_key, &ca_key_pem)?;

        for (cert, key, common_name) in [
            (&pki.apiserver_cert, &pki.apiserver_key, "kube-apiserver"),
            (
                &pki.kubelet_cert,
                &pki.kubelet_key,
                "localcluster-node-agent",
            ),
        ] {
            let mut params = CertificateParams::default();
            params
                .distinguished_name
                .push(DnType::CommonName, common_name);
            params.subject_alt_names = apiserver_names();
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            let leaf_key = KeyPair::generate().map_err(pki_error("generate a serving key"))?;
            let leaf = params
                .signed_by(&leaf_key, &ca)
                .map_err(pki_error("sign a serving certificate"))?;
            write(cert, &leaf.pem())?;
            write(key, &leaf_key.serialize_pem())?;
        }

        let sa = KeyPair::generate().map_err(pki_error("generate the service-account key"))?;
        write(&pki.service_account_key, &sa.serialize_pem())?;
        write(&pki.service_account_pub, &sa.public_key_pem())?;
        Ok(pki)
    }
}

fn write(path: &Path, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(|e| Error::io("write a certificate or key", e))
}
