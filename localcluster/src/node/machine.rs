//! One node of a cluster: its files (`<cluster dir>/node-K`, `/run/localcluster/N/node-K`) and
//! its processes (containerd, the kubelet, kube-proxy), all in the node's network namespace.

use super::config::{self, NodePaths};
use super::network::{NodeNetwork, NodeSlot, Subnets};
use crate::pki::{KubeletCerts, Pki};
use crate::process::Daemon;
use crate::Error;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const NODE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub struct Machine {
    pub name: String,
    pub slot: NodeSlot,
    pub dir: PathBuf,
    state: PathBuf,
    bin_dir: PathBuf,
    netns: File,
    pub daemons: Vec<Daemon>,
}

/// What every node of a cluster shares.
pub struct Shared<'a> {
    pub subnets: &'a Subnets,
    pub server: &'a str,
    pub pki: &'a Pki,
    pub bin_dir: &'a Path,
    pub cluster_dir: &'a Path,
    pub state_root: &'a Path,
    /// The cluster's image registry, which containerd pulls every image from.
    pub registry: std::net::SocketAddrV4,
}

impl Machine {
    /// Writes node k's configuration; starts nothing yet.
    pub fn new(
        network: &NodeNetwork,
        k: u8,
        name: &str,
        certs: &KubeletCerts,
        s: &Shared,
    ) -> Result<Self, Error> {
        let machine = Self {
            name: name.to_string(),
            slot: s.subnets.node(k),
            dir: s.cluster_dir.join(format!("node-{k}")),
            state: s.state_root.join(format!("node-{k}")),
            bin_dir: s.bin_dir.to_path_buf(),
            netns: network.netns_file(k)?,
            daemons: Vec::new(),
        };
        machine.write_files(certs, s)?;
        Ok(machine)
    }

    fn paths(&self) -> NodePaths<'_> {
        NodePaths {
            dir: &self.dir,
            state: &self.state,
        }
    }

    pub fn containerd_socket(&self) -> String {
        self.paths().containerd_socket()
    }

    fn write_files(&self, certs: &KubeletCerts, s: &Shared) -> Result<(), Error> {
        let io = |what| move |e| Error::io(what, e);
        for sub in ["cni", "kubelet", "pod-logs"] {
            std::fs::create_dir_all(self.dir.join(sub))
                .map_err(io("create a node's directories"))?;
        }
        std::fs::create_dir_all(&self.state).map_err(io("create a node's state directory"))?;
        let node_certs = &s.pki.node;
        let paths = self.paths();
        let kubelet = config::KubeletSettings {
            paths: &paths,
            subnets: s.subnets,
            slot: &self.slot,
            port: crate::free_port().map_err(io("find a free port"))?,
            ca: &s.pki.ca_cert,
            serving: &certs.serving,
        };
        let proxy_kubeconfig = self.dir.join("kube-proxy.kubeconfig");
        let files = [
            ("containerd.toml", config::containerd(&paths)),
            (
                "cni/10-localcluster.conflist",
                config::cni(&paths, &self.slot),
            ),
            ("kubelet.json", config::kubelet(&kubelet)),
            (
                "kubelet.kubeconfig",
                config::kubeconfig(s.server, &s.pki.ca_cert, &certs.client),
            ),
            (
                "kube-proxy.kubeconfig",
                config::kubeconfig(s.server, &s.pki.ca_cert, &node_certs.proxy_client),
            ),
            (
                "kube-proxy.json",
                config::kube_proxy(&proxy_kubeconfig, &self.name, s.subnets, &self.slot),
            ),
            // No upstream resolver: pods with dnsPolicy Default resolve nothing off the machine.
            (
                "resolv.conf",
                "# localcluster: no upstream resolver\n".to_string(),
            ),
        ];
        for (name, text) in files {
            std::fs::write(self.dir.join(name), text)
                .map_err(io("write a node's configuration"))?;
        }
        super::registry::write_hosts_config(&self.dir.join("certs.d"), s.registry)
    }

    pub fn start_containerd(&mut self) -> Result<(), Error> {
        let args = [format!(
            "--config={}",
            self.dir.join("containerd.toml").display()
        )];
        self.spawn("containerd", &args)
    }

    pub fn containerd_answers(&self) -> bool {
        Command::new(self.bin_dir.join("ctr"))
            .args(["--address", &self.containerd_socket(), "version"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    pub fn start_kubelet(&mut self) -> Result<(), Error> {
        let args = [
            format!("--config={}", self.dir.join("kubelet.json").display()),
            format!(
                "--kubeconfig={}",
                self.dir.join("kubelet.kubeconfig").display()
            ),
            format!("--root-dir={}", self.dir.join("kubelet").display()),
            format!("--hostname-override={}", self.name),
            format!("--node-ip={}", self.slot.node_ip()),
            "--v=1".into(),
        ];
        self.spawn("kubelet", &args)
    }

    pub fn start_kube_proxy(&mut self) -> Result<(), Error> {
        let args = [
            format!("--config={}", self.dir.join("kube-proxy.json").display()),
            "--v=1".into(),
        ];
        self.spawn("kube-proxy", &args)
    }

    /// Logs go to `<cluster dir>/NAME.log` for the first node, `NAME-K.log` for the others.
    fn spawn(&mut self, name: &'static str, args: &[String]) -> Result<(), Error> {
        let mut command = Command::new(self.bin_dir.join(name));
        command
            .args(args)
            .env("PATH", format!("{}:{NODE_PATH}", self.bin_dir.display()));
        enter_netns(&mut command, &self.netns);
        let log_name = match self.slot.k {
            0 => format!("{name}.log"),
            k => format!("{name}-{k}.log"),
        };
        let log = self.dir.parent().unwrap_or(&self.dir).join(log_name);
        self.daemons
            .push(Daemon::spawn_command(command, log)?.named(name));
        Ok(())
    }

    /// Fails with the log of a process that exited (none of them should).
    pub fn check_alive(&mut self) -> Result<(), Error> {
        crate::process::all_alive(&mut self.daemons)
    }

    /// The kubelet first, so it restarts nothing; containerd last. The shims and containers
    /// go with the rest of the node (`host::release`).
    pub fn stop(&mut self) {
        for mut daemon in self.daemons.drain(..).rev() {
            daemon.stop(std::time::Duration::from_secs(5));
        }
    }
}

/// A node's processes run in its network namespace (and only that: they share the host's
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
