//! The node's configuration files: containerd's, the CNI network's, the kubelet's and
//! kube-proxy's. Each component's state lives under the cluster's directory or the node's
//! state directory, never in the host's defaults (`/var/lib/containerd`, `/etc/cni`, ...).

use super::network::{NodeSlot, Subnets};
use crate::pki::CertPair;
use std::path::Path;

/// Where a node's files are.
pub struct NodePaths<'a> {
    /// `<cluster dir>/node-K`: containerd's content store, the kubelet's root, pod logs.
    pub dir: &'a Path,
    /// `/run/localcluster/<N>/node-K`: sockets, containerd's state, the pods' network
    /// namespaces.
    pub state: &'a Path,
}

impl NodePaths<'_> {
    pub fn containerd_socket(&self) -> String {
        self.state.join("containerd.sock").display().to_string()
    }
}

/// The sandbox ("pause") image every pod's network namespace is held by.
pub const PAUSE_IMAGE: &str = "localcluster.local/pause:1";

/// containerd: CRI with runc, the CNI bridge below, and `restrict_oom_score_adj` because this
/// machine takes CAP_SYS_RESOURCE from every process (runc could not set a container's
/// oom_score_adj below its own and failed every sandbox). Nothing at a fixed host path.
pub fn containerd(paths: &NodePaths) -> String {
    let dir = paths.dir.display();
    let state = paths.state.display();
    let socket = paths.containerd_socket();
    format!(
        r#"version = 3
root = '{dir}/containerd'
state = '{state}/containerd'
imports = []

[grpc]
  address = '{socket}'

[ttrpc]
  address = '{socket}.ttrpc'

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'

[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = '{dir}/certs.d'

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = '{PAUSE_IMAGE}'

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_cdi = false

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = 'runc'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = '/usr/sbin/runc'
  Root = '{state}/runc'
  SystemdCgroup = false

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ['/usr/lib/cni']
  conf_dir = '{dir}/cni'

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'

[plugins.'io.containerd.shim.v1.manager']
  socket_dir = '{state}/s'

# NRI's socket is a fixed host path (/var/run/nri/nri.sock): every node would bind the same
# one (all but the first failed to start) and it stayed behind. No NRI plugin is used here.
[plugins.'io.containerd.nri.v1.nri']
  disable = true
"#,
    )
}

/// The CNI network's name, which prefixes the results libcni caches in /var/lib/cni (a path
/// containerd does not let us move): `localcluster-ljN` or `localcluster-ljN-k`.
pub fn cni_network(slot: &NodeSlot) -> String {
    format!("localcluster-{}", slot.netns())
}

/// A bridge inside the node's namespace, addresses from the node's pod range, no masquerade
/// (nothing is meant to leave).
pub fn cni(paths: &NodePaths, slot: &NodeSlot) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": cni_network(slot),
        "plugins": [{
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": slot.pod_cidr(), "gateway": slot.pod_gateway().to_string()}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": paths.state.join("ipam").display().to_string(),
            },
        }],
    })
    .to_string()
}

/// A kubeconfig that authenticates with a client certificate.
pub fn kubeconfig(server: &str, ca: &Path, client: &CertPair) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: node\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: local\n  context: {{cluster: local, user: node}}\ncurrent-context: local\n",
        ca.display(),
        client.cert.display(),
        client.key.display()
    )
}

pub struct KubeletSettings<'a> {
    pub paths: &'a NodePaths<'a>,
    pub subnets: &'a Subnets,
    pub slot: &'a NodeSlot,
    pub port: u16,
    pub ca: &'a Path,
    pub serving: &'a CertPair,
}

/// What this machine needs: cgroup v1 (`failCgroupV1: false`) with the cgroupfs driver, swap
/// tolerated, no oom_score_adj of its own (CAP_SYS_RESOURCE is missing); the pods' cgroups
/// under the node's own root; image garbage collection off (the images were built here and
/// cannot be pulled again); nothing served on the host but the kubelet's API on the node's
/// address (client certificates from the cluster's CA only).
pub fn kubelet(s: &KubeletSettings) -> String {
    let dir = s.paths.dir.display();
    serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": s.slot.node_ip().to_string(),
        "port": s.port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "tlsCertFile": s.serving.cert.display().to_string(),
        "tlsPrivateKeyFile": s.serving.key.display().to_string(),
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": false},
            "x509": {"clientCAFile": s.ca.display().to_string()},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": super::host::cgroup_name(s.slot),
        "failCgroupV1": false,
        "failSwapOn": false,
        "oomScoreAdj": 0,
        "containerRuntimeEndpoint": format!("unix://{}", s.paths.containerd_socket()),
        "clusterDNS": [s.subnets.dns_ip().to_string()],
        "clusterDomain": "cluster.local",
        "resolvConf": format!("{dir}/resolv.conf"),
        "podLogsDir": format!("{dir}/pod-logs"),
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "serializeImagePulls": false,
        // Benchmarks start a few hundred short Jobs a minute on a node (the pod range has 253).
        "maxPods": 250,
        "registerNode": true,
    })
    .to_string()
}

/// iptables mode inside the node's namespace; conntrack and localhost settings left alone,
/// since they are not the node's to change.
pub fn kube_proxy(
    kubeconfig: &Path,
    node_name: &str,
    subnets: &Subnets,
    slot: &NodeSlot,
) -> String {
    serde_json::json!({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig.display().to_string()},
        "mode": "iptables",
        "clusterCIDR": subnets.cluster_cidr(),
        "hostnameOverride": node_name,
        "bindAddress": slot.node_ip().to_string(),
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "iptables": {"localhostNodePorts": false},
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    })
    .to_string()
}
