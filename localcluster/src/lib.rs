//! A real local Kubernetes cluster, for lockedjob-operator's tests and for people trying the
//! operator: etcd, kube-apiserver, kube-controller-manager and kube-scheduler, built from Go
//! modules by `scripts/k8s-bins.sh`, each a process in a directory of the cluster's own; and
//! real nodes (`node/`: kubelet, containerd, runc, kube-proxy, CoreDNS, in network namespaces
//! of their own, pulling images from the cluster's registry). Needs root.
//!
//! Test support and a dev tool, not product code: nothing in the `lockedjob` crate uses it.
//!
//! ```no_run
//! let cluster = localcluster::LocalCluster::start(localcluster::Options::named("demo"))?;
//! println!("kubectl --kubeconfig {} get nodes", cluster.kubeconfig().display());
//! # Ok::<(), localcluster::Error>(())
//! ```

mod binaries;
mod cluster;
pub mod node;
mod pki;
mod ports;
mod process;
mod slots;

pub use binaries::{Binaries, BIN_DIR_ENV};
pub use cluster::{LocalCluster, Options};
pub use pki::Pki;
pub use ports::free_port;
pub use slots::{
    shared, shared_many, shared_with, start_many, stop_idle_shared, LazyOptions, Shared, LIMIT_ENV,
};

/// A shell function `now` printing the wall clock in seconds with microseconds, for commands
/// in pods: busybox's `date` (the nodes' `busybox:1.36`) has no `%N` and prints it as is, so
/// there the time comes from `adjtimex`, which only reads the clock.
pub const SHELL_NOW: &str = r#"now() { t=$(date +%s.%N); case $t in *N) adjtimex | awk '/tv_sec/ {s=$2} /tv_usec/ {u=$2} END {printf "%d.%06d", s, u}';; *) echo "$t";; esac; };"#;

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Pki {
        what: &'static str,
        source: rcgen::Error,
    },
    #[error("{name} not found in {dir}: run scripts/k8s-bins.sh (or point {BIN_DIR_ENV} at the directory it prints)")]
    MissingBinary { name: &'static str, dir: PathBuf },
    #[error("{script} failed ({status}); its messages above say why (is Go 1.26 installed?)")]
    BuildScript { script: PathBuf, status: String },
    #[error(
        "{process} did not become ready within {seconds} s; last lines of its log ({log}):\n{tail}"
    )]
    NotReady {
        process: &'static str,
        seconds: u64,
        log: PathBuf,
        tail: String,
    },
    #[error("{process} exited ({status}); last lines of its log ({log}):\n{tail}")]
    Exited {
        process: &'static str,
        status: String,
        log: PathBuf,
        tail: String,
    },
    /// A host change a real node needs failed (a command, a namespace, a cgroup).
    #[error("real node: {0}")]
    Host(String),
    #[error("Kubernetes client: {0}")]
    Client(String),
    #[error("the cluster's thread is gone (it stopped or panicked)")]
    Gone,
}

impl Error {
    /// A component could not bind its port (another process took it after it was picked).
    pub fn is_port_taken(&self) -> bool {
        match self {
            Error::Exited { tail, .. } | Error::NotReady { tail, .. } => {
                tail.contains("address already in use")
            }
            _ => false,
        }
    }

    pub(crate) fn io(what: &'static str, source: std::io::Error) -> Self {
        Self::Io { what, source }
    }
}
