//! A real node: containerd with runc, the kubelet and kube-proxy, in a network namespace of
//! the node's own (`network.rs`), with images made here (`images.rs`), CoreDNS (`dns.rs`)
//! and local volumes behind a default StorageClass (`storage.rs`). Needs root. What it changes on the host and how that is put back:
//! `host.rs`.
//!
//! Two phases, because the API server must listen on the node's link: [`NodeNetwork::create`]
//! (through [`prepare`]) before the control plane starts, [`RealNode::start`] after it is
//! ready. Dropping the `RealNode` stops its processes and removes what it made.

mod config;
mod dns;
mod host;
mod images;
mod network;
mod storage;

pub use images::{BUSYBOX_IMAGE, REDIS_IMAGE};
pub use network::{NodeNetwork, Subnets};

use crate::pki::{CertPair, NodeIdentity, Pki};
use crate::process::Daemon;
use crate::Error;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The network and host state a node needs before the control plane starts.
pub struct PreparedNode {
    network: NodeNetwork,
    cluster_dir: PathBuf,
}

/// Claims a node index and creates its network; cleans up nodes whose owner died first.
pub fn prepare(cluster_dir: &Path) -> Result<PreparedNode, Error> {
    if !nix::unistd::geteuid().is_root() {
        return Err(Error::Host(
            "a real node needs root (network namespaces, cgroups, mounts); run as root or use the node agent".into(),
        ));
    }
    host::reclaim_stale();
    host::save_host_state()?;
    let network = NodeNetwork::create()?;
    let prepared = PreparedNode {
        network,
        cluster_dir: cluster_dir.to_path_buf(),
    };
    // From here on, dropping `prepared` (on any error) removes what was made.
    host::claim(&prepared.network.subnets, cluster_dir)?;
    Ok(prepared)
}

impl PreparedNode {
    pub fn subnets(&self) -> Subnets {
        self.network.subnets
    }

    pub fn identity(&self, node_name: &str) -> NodeIdentity {
        let s = self.network.subnets;
        NodeIdentity {
            node_name: node_name.to_string(),
            node_ip: s.node_ip(),
            apiserver_ips: vec![s.host_ip(), s.apiserver_service_ip()],
        }
    }
}

impl Drop for PreparedNode {
    fn drop(&mut self) {
        host::release(&self.network.subnets, Some(&self.cluster_dir));
    }
}

/// What `RealNode::start` needs from the control plane.
pub struct NodeStart<'a> {
    pub node_name: &'a str,
    pub bin_dir: &'a Path,
    pub pki: &'a Pki,
    /// `https://HOST_IP:PORT`.
    pub server: &'a str,
    /// The admin kubeconfig, for applying CoreDNS.
    pub admin_kubeconfig: &'a Path,
    /// Image reference -> the program an image is made of (`Options::images`).
    pub images: &'a std::collections::BTreeMap<String, PathBuf>,
    pub client: kube::Client,
    pub timeout: Duration,
}

/// A running node. Dropping it stops the kubelet, kube-proxy, containerd and every container,
/// unmounts, and removes the network.
pub struct RealNode {
    daemons: Vec<Daemon>,
    containerd_socket: String,
    // Last: dropped after the processes are stopped.
    prepared: PreparedNode,
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

/// `repository` -> `repository:latest`; a reference with a tag or digest stays.
fn with_tag(reference: &str) -> String {
    let last = reference.rsplit('/').next().unwrap_or(reference);
    if last.contains(':') || last.contains('@') {
        reference.to_string()
    } else {
        format!("{reference}:latest")
    }
}

const NODE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl RealNode {
    pub async fn start(prepared: PreparedNode, s: NodeStart<'_>) -> Result<Self, Error> {
        let subnets = prepared.subnets();
        let node_dir = prepared.cluster_dir.join("node");
        let state = host::state_dir(&subnets);
        let paths = config::NodePaths {
            dir: &node_dir,
            state: &state,
            bin_dir: s.bin_dir,
        };
        let certs = s
            .pki
            .node
            .as_ref()
            .ok_or_else(|| Error::Host("the cluster's PKI has no node certificates".into()))?;
        host::create_cgroups(&subnets)?;
        write_files(&paths, &subnets, s.server, s.pki, certs, s.node_name)?;

        let netns = prepared.network.netns_file()?;
        let mut node = Self {
            daemons: Vec::new(),
            containerd_socket: paths.containerd_socket(),
            prepared,
        };
        let containerd_args = vec![format!(
            "--config={}",
            node_dir.join("containerd.toml").display()
        )];
        node.spawn(&paths, &netns, "containerd", &containerd_args)?;
        node.wait_for_containerd(s.bin_dir, s.timeout).await?;
        let coredns = coredns_image(s.bin_dir);
        let mut specs = images::node_images(s.bin_dir, &coredns)?;
        for (reference, program) in s.images {
            specs.push(images::program_image(&with_tag(reference), program)?);
        }
        images::build_and_import(
            &specs,
            &node_dir.join("images"),
            s.bin_dir,
            &node.containerd_socket,
        )?;

        let kubelet_args = vec![
            format!("--config={}", node_dir.join("kubelet.json").display()),
            format!(
                "--kubeconfig={}",
                node_dir.join("kubelet.kubeconfig").display()
            ),
            format!("--root-dir={}", node_dir.join("kubelet").display()),
            format!("--hostname-override={}", s.node_name),
            format!("--node-ip={}", subnets.node_ip()),
            "--v=1".into(),
        ];
        node.spawn(&paths, &netns, "kubelet", &kubelet_args)?;
        node.wait_until(s.timeout, "kubelet", || node_ready(&s.client, s.node_name))
            .await?;
        let proxy_args = vec![
            format!("--config={}", node_dir.join("kube-proxy.json").display()),
            "--v=1".into(),
        ];
        node.spawn(&paths, &netns, "kube-proxy", &proxy_args)?;

        apply(
            s.bin_dir,
            s.admin_kubeconfig,
            &dns::manifest(&subnets, &coredns),
        )?;
        let volumes = storage::manifest(&node_dir, s.node_name)?;
        apply(s.bin_dir, s.admin_kubeconfig, &volumes)?;
        node.wait_until(s.timeout, "coredns", || {
            deployment_ready(&s.client, "kube-system", "coredns")
        })
        .await?;
        Ok(node)
    }

    pub fn subnets(&self) -> Subnets {
        self.prepared.subnets()
    }

    fn spawn(
        &mut self,
        paths: &config::NodePaths,
        netns: &File,
        name: &'static str,
        args: &[String],
    ) -> Result<(), Error> {
        let mut command = Command::new(paths.bin_dir.join(name));
        command
            .args(args)
            .env("PATH", format!("{}:{NODE_PATH}", paths.bin_dir.display()));
        enter_netns(&mut command, netns);
        let log = self.prepared.cluster_dir.join(format!("{name}.log"));
        self.daemons
            .push(Daemon::spawn_command(command, log)?.named(name));
        Ok(())
    }

    async fn wait_for_containerd(
        &mut self,
        bin_dir: &Path,
        timeout: Duration,
    ) -> Result<(), Error> {
        let ctr = bin_dir.join("ctr");
        let socket = self.containerd_socket.clone();
        self.wait_until(timeout, "containerd", || {
            let ok = Command::new(&ctr)
                .args(["--address", &socket, "version"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            async move { Ok(ok) }
        })
        .await
    }

    /// Polls `ready` until it says yes; fails at once, with its log, if a node process exited.
    async fn wait_until<F, Fut>(
        &mut self,
        timeout: Duration,
        what: &'static str,
        mut ready: F,
    ) -> Result<(), Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool, Error>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            if ready().await? {
                return Ok(());
            }
            self.check_alive()?;
            if Instant::now() >= deadline {
                let last = self.daemons.last();
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
        for daemon in &mut self.daemons {
            if let Some(status) = daemon.exited() {
                return Err(daemon.exited_error(status));
            }
        }
        Ok(())
    }

    fn stop(&mut self) {
        // The kubelet first, so it restarts nothing; containerd last.
        for mut daemon in self.daemons.drain(..).rev() {
            daemon.stop(Duration::from_secs(5));
        }
        // The shims and containers go with the rest of the node, when `prepared` drops.
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The node's processes run in its network namespace (and only that: they share the host's
/// mounts, so the kubelet's volume mounts are what containerd binds into containers).
fn enter_netns(command: &mut Command, netns: &File) {
    let fd = netns.as_raw_fd();
    // SAFETY: setns is async-signal-safe; `fd` stays open until the command has spawned.
    unsafe {
        command.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn write_files(
    paths: &config::NodePaths,
    subnets: &Subnets,
    server: &str,
    pki: &Pki,
    certs: &crate::pki::NodeCerts,
    node_name: &str,
) -> Result<(), Error> {
    let dir = paths.dir;
    for sub in ["cni", "kubelet", "pod-logs"] {
        std::fs::create_dir_all(dir.join(sub))
            .map_err(|e| Error::io("create the node's directories", e))?;
    }
    std::fs::create_dir_all(paths.state)
        .map_err(|e| Error::io("create the node's state directory", e))?;
    let serving = CertPair {
        cert: pki.kubelet_cert.clone(),
        key: pki.kubelet_key.clone(),
    };
    let kubelet = config::KubeletSettings {
        paths,
        subnets,
        port: crate::free_port().map_err(|e| Error::io("find a free port", e))?,
        ca: &pki.ca_cert,
        serving: &serving,
    };
    let proxy_kubeconfig = dir.join("kube-proxy.kubeconfig");
    let files = [
        ("containerd.toml", config::containerd(paths)),
        ("cni/10-localcluster.conflist", config::cni(paths, subnets)),
        ("kubelet.json", config::kubelet(&kubelet)),
        (
            "kubelet.kubeconfig",
            config::kubeconfig(server, &pki.ca_cert, &certs.kubelet_client),
        ),
        (
            "kube-proxy.kubeconfig",
            config::kubeconfig(server, &pki.ca_cert, &certs.proxy_client),
        ),
        (
            "kube-proxy.json",
            config::kube_proxy(&proxy_kubeconfig, node_name, subnets),
        ),
        // No upstream resolver: pods with dnsPolicy Default resolve nothing off the machine.
        (
            "resolv.conf",
            "# localcluster: no upstream resolver\n".to_string(),
        ),
    ];
    for (name, text) in files {
        std::fs::write(dir.join(name), text)
            .map_err(|e| Error::io("write the node's configuration", e))?;
    }
    Ok(())
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

async fn node_ready(client: &kube::Client, name: &str) -> Result<bool, Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let Ok(Some(node)) = nodes.get_opt(name).await else {
        return Ok(false);
    };
    Ok(node
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn deployment_ready(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<bool, Error> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let Ok(Some(deployment)) = deployments.get_opt(name).await else {
        return Ok(false);
    };
    Ok(deployment
        .status
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
        >= 1)
}
