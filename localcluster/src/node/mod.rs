//! Real nodes: on each, containerd with runc, the kubelet and kube-proxy (`machine.rs`), in a
//! network namespace of the node's own (`network.rs`); images made here (`images.rs`) and
//! pulled from the cluster's registry (`registry.rs`), CoreDNS (`dns.rs`) and local volumes
//! behind a default StorageClass (`storage.rs`). Needs root.
//! What they change on the host and how that is put back: `host.rs`.
//!
//! Two phases, because the API server must listen on the nodes' link: [`prepare`] (the
//! network) before the control plane starts, [`RealNodes::start`] after it is ready. Dropping
//! the `RealNodes` stops their processes and removes what they made.

mod config;
mod dns;
mod host;
mod images;
mod machine;
mod network;
mod registry;
mod storage;

pub use images::ImageSource;
pub use network::{NodeNetwork, Subnets, MAX_NODES};

use crate::pki::{NodeIdentity, Pki};
use crate::Error;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use machine::Machine;
use registry::Registry;
use std::collections::BTreeMap;
use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The network and host state the nodes need before the control plane starts.
pub struct PreparedNodes {
    network: NodeNetwork,
    cluster_dir: PathBuf,
    registry: SocketAddrV4,
}

/// Claims a cluster index and creates the network of `nodes` nodes; first cleans up after
/// clusters whose owner died.
pub fn prepare(cluster_dir: &Path, nodes: u8) -> Result<PreparedNodes, Error> {
    if !nix::unistd::geteuid().is_root() {
        return Err(Error::Host(
            "a real node needs root (network namespaces, cgroups, mounts); run as root or use the node agent".into(),
        ));
    }
    let locked = host::lock_host()?;
    host::reclaim_stale(&locked);
    host::save_host_state(&locked)?;
    let network = NodeNetwork::create(nodes)?;
    let registry_port = crate::free_port().map_err(|e| Error::io("find a free port", e))?;
    let prepared = PreparedNodes {
        registry: SocketAddrV4::new(network.subnets.host_ip(), registry_port),
        network,
        cluster_dir: cluster_dir.to_path_buf(),
    };
    // From here on, dropping `prepared` (on any error) removes what was made; the lock goes
    // first, as that release takes it again.
    if let Err(e) = host::claim(&prepared.network.subnets, cluster_dir) {
        drop(locked);
        return Err(e);
    }
    Ok(prepared)
}

impl PreparedNodes {
    pub fn subnets(&self) -> Subnets {
        self.network.subnets
    }

    /// Where the nodes' image registry will listen: the host's end of their link.
    pub fn registry(&self) -> SocketAddrV4 {
        self.registry
    }

    /// `CLUSTER-node` for the first node, `CLUSTER-node-K` for the others.
    pub fn node_names(&self, cluster: &str) -> Vec<String> {
        (0..self.network.nodes)
            .map(|k| match k {
                0 => format!("{cluster}-node"),
                k => format!("{cluster}-node-{k}"),
            })
            .collect()
    }

    pub fn identity(&self, cluster: &str) -> NodeIdentity {
        let s = self.network.subnets;
        NodeIdentity {
            nodes: self
                .node_names(cluster)
                .into_iter()
                .zip(0..)
                .map(|(name, k)| (name, s.node(k).node_ip()))
                .collect(),
            apiserver_ips: vec![s.host_ip(), s.apiserver_service_ip()],
        }
    }
}

impl Drop for PreparedNodes {
    fn drop(&mut self) {
        host::release(&self.network.subnets, Some(&self.cluster_dir));
    }
}

/// What `RealNodes::start` needs from the control plane.
pub struct NodeStart<'a> {
    pub cluster_name: &'a str,
    pub bin_dir: &'a Path,
    pub pki: &'a Pki,
    /// `https://HOST_IP:PORT`.
    pub server: &'a str,
    /// The admin kubeconfig, for applying CoreDNS and the volumes.
    pub admin_kubeconfig: &'a Path,
    /// Image reference -> what the image is made of (`Options::images`).
    pub images: &'a BTreeMap<String, ImageSource>,
    pub client: kube::Client,
    pub timeout: Duration,
}

/// Running nodes. Dropping them stops every kubelet, kube-proxy, containerd and container,
/// unmounts, and removes the network.
pub struct RealNodes {
    machines: Vec<Machine>,
    registry: Registry,
    // Last: dropped after the processes are stopped.
    prepared: PreparedNodes,
}

/// The CoreDNS image's name (built here from the binary of `scripts/k8s-bins.sh`).
fn coredns_image(bin_dir: &Path) -> String {
    let version = std::fs::read_to_string(bin_dir.join(".coredns.version")).unwrap_or_default();
    let version = version.trim();
    format!(
        "localcluster.local/coredns:{}",
        if version.is_empty() { "local" } else { version }
    )
}

/// Every image the nodes need as a docker archive (reference, path): those made here written
/// into `work`, those built elsewhere checked to hold the reference they are given for.
fn image_archives(s: &NodeStart, work: &Path) -> Result<Vec<(String, PathBuf)>, Error> {
    let mut specs = images::node_images(s.bin_dir, &coredns_image(s.bin_dir))?;
    let mut built_elsewhere = Vec::new();
    for (reference, source) in s.images {
        let reference = with_tag(reference);
        match source {
            ImageSource::Program(program) => {
                specs.push(images::program_image(&reference, program)?)
            }
            ImageSource::Archive(archive) => {
                let tags = images::archive_tags(archive)?;
                if !tags.contains(&reference) {
                    return Err(Error::Host(format!(
                        "{} holds {tags:?}, not {reference}",
                        archive.display()
                    )));
                }
                built_elsewhere.push((reference, archive.clone()));
            }
        }
    }
    let mut archives = images::write_archives(&specs, work)?;
    archives.extend(built_elsewhere);
    Ok(archives)
}

/// `repository` -> `repository:latest`; a reference with a tag or digest stays.
fn with_tag(reference: &str) -> String {
    let last = reference.rsplit('/').next().unwrap_or(reference);
    if last.contains(':') || last.contains('@') {
        reference.to_string()
    } else {
        format!("{reference}:latest")
    }
}

impl RealNodes {
    pub async fn start(prepared: PreparedNodes, s: NodeStart<'_>) -> Result<Self, Error> {
        let subnets = prepared.subnets();
        let names = prepared.node_names(s.cluster_name);
        let certs = &s.pki.node;
        host::create_cgroups(&subnets, prepared.network.nodes)?;
        let state_root = host::state_dir(&subnets);
        let registry = Registry::start(
            s.bin_dir,
            &prepared.cluster_dir,
            prepared.registry,
            s.timeout,
        )
        .await?;
        let shared = machine::Shared {
            subnets: &subnets,
            server: s.server,
            pki: s.pki,
            bin_dir: s.bin_dir,
            cluster_dir: &prepared.cluster_dir,
            state_root: &state_root,
            registry: prepared.registry,
        };
        let machines = names
            .iter()
            .zip(&certs.kubelets)
            .zip(0..)
            .map(|((name, kubelet), k)| Machine::new(&prepared.network, k, name, kubelet, &shared))
            .collect::<Result<Vec<_>, _>>()?;
        let mut nodes = Self {
            machines,
            registry,
            prepared,
        };

        for machine in &mut nodes.machines {
            machine.start_containerd()?;
        }
        nodes
            .wait_until(s.timeout, "containerd", |m| {
                let answers = m.iter().all(Machine::containerd_answers);
                async move { Ok(answers) }
            })
            .await?;
        nodes.import_images(&s)?;

        for machine in &mut nodes.machines {
            machine.start_kubelet()?;
        }
        let client = s.client.clone();
        nodes
            .wait_until(s.timeout, "kubelet", |_| {
                all_ready(client.clone(), names.clone())
            })
            .await?;
        for machine in &mut nodes.machines {
            machine.start_kube_proxy()?;
        }

        let coredns = coredns_image(s.bin_dir);
        apply(
            s.bin_dir,
            s.admin_kubeconfig,
            &dns::manifest(&subnets, &coredns),
        )?;
        let volumes: Vec<(&str, PathBuf)> = nodes
            .machines
            .iter()
            .map(|m| (m.name.as_str(), m.dir.clone()))
            .collect();
        apply(s.bin_dir, s.admin_kubeconfig, &storage::manifest(&volumes)?)?;
        let client = s.client.clone();
        nodes
            .wait_until(s.timeout, "coredns", |_| {
                deployment_ready(client.clone(), "kube-system", "coredns")
            })
            .await?;
        Ok(nodes)
    }

    /// The images are written once and pushed to the registry through the first node's
    /// containerd; pods pull them from there. Only the sandbox image is imported into every
    /// node: containerd keeps it pinned and the kubelet never pulls it.
    fn import_images(&self, s: &NodeStart) -> Result<(), Error> {
        let work = self.prepared.cluster_dir.join("images");
        let archives = image_archives(s, &work)?;
        let (sandbox, pulled): (Vec<_>, Vec<_>) = archives
            .into_iter()
            .partition(|(name, _)| name == config::PAUSE_IMAGE);
        if let Some(first) = self.machines.first() {
            self.registry
                .push(&pulled, s.bin_dir, &first.containerd_socket())?;
        }
        for machine in &self.machines {
            images::import(&sandbox, s.bin_dir, &machine.containerd_socket(), "k8s.io")?;
        }
        std::fs::remove_dir_all(&work).map_err(|e| Error::io("remove the image archives", e))
    }

    /// Polls `ready` until it says yes; fails at once, with its log, if a node process exited.
    async fn wait_until<F, Fut>(
        &mut self,
        timeout: Duration,
        what: &'static str,
        mut ready: F,
    ) -> Result<(), Error>
    where
        F: FnMut(&[Machine]) -> Fut,
        Fut: std::future::Future<Output = Result<bool, Error>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            if ready(&self.machines).await? {
                return Ok(());
            }
            self.check_alive()?;
            if Instant::now() >= deadline {
                let last = self.machines.first().and_then(|m| m.daemons.last());
                return Err(Error::NotReady {
                    process: what,
                    seconds: timeout.as_secs(),
                    log: last.map(|d| d.log_path().to_path_buf()).unwrap_or_default(),
                    tail: last.map(|d| d.log_tail(30)).unwrap_or_default(),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Fails with the log of a node process that exited (none of them should).
    pub fn check_alive(&mut self) -> Result<(), Error> {
        self.machines.iter_mut().try_for_each(Machine::check_alive)
    }
}

impl Drop for RealNodes {
    fn drop(&mut self) {
        for machine in &mut self.machines {
            machine.stop();
        }
        self.registry.stop();
    }
}

fn apply(bin_dir: &Path, kubeconfig: &Path, manifest: &str) -> Result<(), Error> {
    use std::io::Write;
    let mut child = Command::new(bin_dir.join("kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["apply", "--server-side", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io("run kubectl apply", e))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(manifest.as_bytes())
            .map_err(|e| Error::io("write to kubectl apply", e))?;
    }
    let output = child
        .wait_with_output()
        .map_err(|e| Error::io("run kubectl apply", e))?;
    if output.status.success() {
        return Ok(());
    }
    Err(Error::Client(format!(
        "kubectl apply: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    )))
}

async fn all_ready(client: kube::Client, names: Vec<String>) -> Result<bool, Error> {
    let nodes: Api<Node> = Api::all(client);
    for name in names {
        let Ok(Some(node)) = nodes.get_opt(&name).await else {
            return Ok(false);
        };
        let ready = node
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if !ready {
            return Ok(false);
        }
    }
    Ok(true)
}

async fn deployment_ready(
    client: kube::Client,
    namespace: &str,
    name: &str,
) -> Result<bool, Error> {
    let deployments: Api<Deployment> = Api::namespaced(client, namespace);
    let Ok(Some(deployment)) = deployments.get_opt(name).await else {
        return Ok(false);
    };
    Ok(deployment
        .status
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
        >= 1)
}
