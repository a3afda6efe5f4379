//! What an agent is given, and the addresses it gives its node and pods.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub node_name: String,
    pub kubelet_version: String,
    /// Pods' working directories and container logs.
    pub dir: PathBuf,
    /// Serving certificate and key of the kubelet endpoint (logs).
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Where in-cluster clients reach the API server (`KUBERNETES_SERVICE_HOST/PORT`).
    pub apiserver_port: u16,
    pub ca_cert: PathBuf,
    /// Image repository (no tag) -> the program a container of that image runs when it names
    /// no command: its entrypoint, on this machine.
    pub images: BTreeMap<String, PathBuf>,
}

/// The node's address, where the kubelet endpoint and the API server listen.
pub(crate) const HOST_IP: &str = "127.0.0.1";

/// The pod's own address: derived from its uid, so every agent (and an agent restarted) gives
/// a pod the same one, spread over 127.16.0.1 – 127.239.255.254 so pods of several local
/// clusters rarely meet.
pub(crate) fn pod_ip(pod: &Pod) -> String {
    let uid = pod.uid().unwrap_or_default();
    let digest = uid
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
        .to_be_bytes();
    format!(
        "127.{}.{}.{}",
        16 + digest[0] % 224,
        digest[1],
        1 + digest[2] % 254
    )
}

/// `ghcr.io/org/app:1.2@sha256:...` -> `ghcr.io/org/app`.
pub(crate) fn repository_of(image: &str) -> &str {
    let image = image.split_once('@').map_or(image, |(name, _)| name);
    match image.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => name,
        _ => image,
    }
}
