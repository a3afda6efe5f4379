//! The cluster's own certificate authority: the API server's serving certificate, the
//! service-account signing key, each kubelet's serving and client certificates, kube-proxy's
//! client certificate and the one the API server presents to the kubelets, written as PEM
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
    pub service_account_key: PathBuf,
    pub service_account_pub: PathBuf,
    pub node: NodeCerts,
}

/// Who a cluster's real nodes are and where the API server answers them.
#[derive(Debug, Clone)]
pub struct NodeIdentity {
    /// Each node's name and address.
    pub nodes: Vec<(String, Ipv4Addr)>,
    /// Further addresses of the API server: its address on the nodes' link and the first
    /// address of the service range.
    pub apiserver_ips: Vec<Ipv4Addr>,
}

/// A certificate and its key.
#[derive(Debug, Clone)]
pub struct CertPair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// One kubelet's certificates.
#[derive(Debug, Clone)]
pub struct KubeletCerts {
    /// Its API's, for the node's name and address.
    pub serving: CertPair,
    /// Its identity towards the API server (`system:node:NAME`, group `system:nodes`).
    pub client: CertPair,
}

#[derive(Debug, Clone)]
pub struct NodeCerts {
    /// Per node, in the order of `NodeIdentity::nodes`.
    pub kubelets: Vec<KubeletCerts>,
    /// kube-proxy's (`system:kube-proxy`, bound to `system:node-proxier` by default).
    pub proxy_client: CertPair,
    /// What the API server presents to the kubelet for logs and exec.
    pub apiserver_kubelet_client: CertPair,
}

fn pki_error(what: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |source| Error::Pki { what, source }
}

/// Names the API server answers to: loopback (a test's proxy in front of it), the in-cluster
/// names of the `kubernetes` Service, and `extra_ips` (its address on the nodes' link and the
/// Service's address), so in-cluster clients verify it too.
fn apiserver_names(extra_ips: &[Ipv4Addr]) -> Vec<SanType> {
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
    names.extend(
        extra_ips
            .iter()
            .map(|ip| SanType::IpAddress(IpAddr::V4(*ip))),
    );
    names
}

/// What a leaf certificate is for.
enum Usage {
    Server(Vec<SanType>),
    /// Common name is the user, organization the group.
    Client(Option<&'static str>),
}

fn issue(
    ca: &CertifiedIssuer<'_, KeyPair>,
    pair: &CertPair,
    common_name: &str,
    usage: Usage,
) -> Result<(), Error> {
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    match usage {
        Usage::Server(names) => {
            params.subject_alt_names = names;
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        }
        Usage::Client(group) => {
            if let Some(group) = group {
                params
                    .distinguished_name
                    .push(DnType::OrganizationName, group);
            }
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        }
    }
    let leaf_key = KeyPair::generate().map_err(pki_error("generate a key"))?;
    let leaf = params
        .signed_by(&leaf_key, ca)
        .map_err(pki_error("sign a certificate"))?;
    write(&pair.cert, &leaf.pem())?;
    write(&pair.key, &leaf_key.serialize_pem())
}

fn pair(dir: &Path, name: &str) -> CertPair {
    CertPair {
        cert: dir.join(format!("{name}.crt")),
        key: dir.join(format!("{name}.key")),
    }
}

impl Pki {
    /// Generates a fresh CA and every certificate and key into `dir`.
    pub fn generate(dir: &Path, node: &NodeIdentity) -> Result<Self, Error> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create the pki directory", e))?;
        let pki = Self {
            ca_cert: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            apiserver_cert: dir.join("apiserver.crt"),
            apiserver_key: dir.join("apiserver.key"),
            service_account_key: dir.join("sa.key"),
            service_account_pub: dir.join("sa.pub"),
            node: NodeCerts {
                kubelets: (0..node.nodes.len())
                    .map(|k| KubeletCerts {
                        serving: pair(dir, &format!("kubelet-{k}")),
                        client: pair(dir, &format!("kubelet-{k}-client")),
                    })
                    .collect(),
                proxy_client: pair(dir, "kube-proxy-client"),
                apiserver_kubelet_client: pair(dir, "apiserver-kubelet-client"),
            },
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

        let serving = pair(dir, "apiserver");
        issue(
            &ca,
            &serving,
            "kube-apiserver",
            Usage::Server(apiserver_names(&node.apiserver_ips)),
        )?;
        let certs = &pki.node;
        for ((name, ip), kubelet) in node.nodes.iter().zip(&certs.kubelets) {
            let dns = name.as_str().try_into().map_err(pki_error("name a node"))?;
            let names = vec![SanType::IpAddress(IpAddr::V4(*ip)), SanType::DnsName(dns)];
            issue(&ca, &kubelet.serving, name, Usage::Server(names))?;
            let user = format!("system:node:{name}");
            issue(
                &ca,
                &kubelet.client,
                &user,
                Usage::Client(Some("system:nodes")),
            )?;
        }
        issue(
            &ca,
            &certs.proxy_client,
            "system:kube-proxy",
            Usage::Client(None),
        )?;
        issue(
            &ca,
            &certs.apiserver_kubelet_client,
            "kube-apiserver-kubelet-client",
            Usage::Client(Some("system:masters")),
        )?;

        let sa = KeyPair::generate().map_err(pki_error("generate the service-account key"))?;
        write(&pki.service_account_key, &sa.serialize_pem())?;
        write(&pki.service_account_pub, &sa.public_key_pem())?;
        Ok(pki)
    }
}

fn write(path: &Path, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(|e| Error::io("write a certificate or key", e))
}
