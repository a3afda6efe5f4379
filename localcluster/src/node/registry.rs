//! The cluster's image registry (distribution, the registry behind Docker Hub's protocol):
//! the images made here are pushed to it once, and every node's containerd pulls what its pods
//! ask for from it, as a cluster pulls from a registry. Charts can be pushed to it too
//! (`helm push ... oci://ADDRESS/...`).
//!
//! It listens on the host's end of the nodes' link, not on 127.0.0.1: containerd runs in each
//! node's network namespace, where 127.0.0.1 is the node's own loopback. Plain HTTP: nothing
//! but this machine reaches that address.

use super::images;
use crate::process::Daemon;
use crate::Error;
use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// containerd's namespace the images are imported into before they are pushed; the kubelet's
/// (`k8s.io`) stays empty of them, so pods pull.
const PUSH_NAMESPACE: &str = "localcluster-push";

pub struct Registry {
    daemon: Daemon,
    address: SocketAddrV4,
}

impl Registry {
    /// Starts `registry serve` at `address` with its storage in `dir` and waits until it
    /// accepts connections.
    pub async fn start(
        bin_dir: &Path,
        dir: &Path,
        address: SocketAddrV4,
        timeout: Duration,
    ) -> Result<Self, Error> {
        let storage = dir.join("registry");
        std::fs::create_dir_all(&storage)
            .map_err(|e| Error::io("create the registry's storage", e))?;
        let config = dir.join("registry.yaml");
        std::fs::write(&config, config_text(&storage, address))
            .map_err(|e| Error::io("write the registry's configuration", e))?;
        let mut command = Command::new(bin_dir.join("registry"));
        command
            .arg("serve")
            .arg(&config)
            // Its tracing would export to an OTLP collector on localhost:4318 by default.
            .env("OTEL_TRACES_EXPORTER", "none");
        let log = dir.join("registry.log");
        let mut daemon = Daemon::spawn_command(command, log)?.named("registry");
        daemon.wait_listening(address.into(), timeout).await?;
        Ok(Self { daemon, address })
    }

    /// Pushes each archive's image (imported into the containerd at `socket`, in a namespace
    /// of its own) under the same repository and tag: `docker.io/library/busybox:1.36` becomes
    /// `ADDRESS/library/busybox:1.36`, which containerd asks for when a pod names the former.
    pub fn push(
        &self,
        archives: &[(String, PathBuf)],
        bin_dir: &Path,
        socket: &str,
    ) -> Result<(), Error> {
        images::import(archives, bin_dir, socket, PUSH_NAMESPACE)?;
        for (name, _) in archives {
            let remote = format!("{}/{}", self.address, repository_path(name));
            let push = ["images", "push", "--plain-http", &remote, name];
            images::ctr(bin_dir, socket, PUSH_NAMESPACE, &push, name)?;
        }
        Ok(())
    }

    /// Stops it (its storage goes with the cluster's directory).
    pub fn stop(&mut self) {
        self.daemon.stop(Duration::from_secs(5));
    }
}

fn config_text(storage: &Path, address: SocketAddrV4) -> String {
    format!(
        "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {address}\n",
        storage.display()
    )
}

/// A reference's repository path and tag without its registry host, as Docker normalizes
/// names: `ghcr.io/a/b:1` -> `a/b:1`, `busybox:1.36` -> `library/busybox:1.36`.
pub fn repository_path(reference: &str) -> String {
    match reference.split_once('/') {
        Some((host, rest)) if host.contains(['.', ':']) || host == "localhost" => rest.into(),
        Some(_) => reference.into(),
        None => format!("library/{reference}"),
    }
}

/// containerd's hosts directory (`config_path`) sending every registry's pulls to this one:
/// `_default` applies to any host without a directory of its own, so no pull leaves the
/// machine whatever a pod names.
pub fn write_hosts_config(config_path: &Path, registry: SocketAddrV4) -> Result<(), Error> {
    let dir = config_path.join("_default");
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("create containerd's hosts dir", e))?;
    std::fs::write(
        dir.join("hosts.toml"),
        format!("server = 'http://{registry}'\n"),
    )
    .map_err(|e| Error::io("write containerd's hosts.toml", e))
}

#[cfg(test)]
mod tests {
    use super::repository_path;

    #[test]
    fn repository_paths_drop_the_registry_host_as_docker_names_them() {
        for (reference, path) in [
            ("docker.io/library/busybox:1.36", "library/busybox:1.36"),
            (
                "ghcr.io/lockedjob/lockedjob-operator:latest",
                "lockedjob/lockedjob-operator:latest",
            ),
            ("localcluster.local/pause:1", "pause:1"),
            ("127.0.0.1:5000/team/app:2", "team/app:2"),
            ("localhost/app:2", "app:2"),
            ("busybox:1.36", "library/busybox:1.36"),
            ("team/app:2", "team/app:2"),
        ] {
            assert_eq!(repository_path(reference), path, "{reference}");
        }
    }
}
