//! Two local clusters sharing local Redis nodes, with the operator installed by the chart in
//! each: what the quickstart and the soak both stand on.

use kube::Client;
use localcluster::{Binaries, LocalCluster, Options};
use lockedjob::lab::harness::FaultProxy;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const IMAGE: &str = "ghcr.io/lockedjob/lockedjob-operator";
/// Where the chart's release lives in each cluster.
pub const RELEASE_NAMESPACE: &str = "lockedjob";

/// Runs `work` on a runtime of two worker threads (the machine's cores), as both dev tools do.
pub fn block_on<F: std::future::Future>(work: F) -> Result<F::Output, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("start the async runtime: {e}"))?;
    Ok(runtime.block_on(work))
}

pub fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// The `lockedjob` binary the clusters' image holds: `QUICKSTART_LOCKEDJOB`, or cargo's debug
/// build.
pub fn lockedjob_binary() -> Result<PathBuf, String> {
    let path = std::env::var_os("QUICKSTART_LOCKEDJOB")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo("target/debug/lockedjob"));
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} not found: cargo build --bin lockedjob",
            path.display()
        ))
    }
}

/// One local cluster with the operator installed.
pub struct Side {
    pub id: &'static str,
    pub cluster: LocalCluster,
    pub client: Client,
}

impl Side {
    /// Starts cluster `id` with the operator's image made from `lockedjob`.
    pub async fn start(
        id: &'static str,
        lockedjob: &Path,
        bins: &Binaries,
    ) -> Result<Side, String> {
        let image = format!("{IMAGE}:{}", chart_app_version()?);
        let options = Options {
            binaries: Some(bins.clone()),
            images: BTreeMap::from([(image, lockedjob.to_path_buf())]),
            ..Options::named(id)
        };
        let cluster = tokio::task::spawn_blocking(move || LocalCluster::start(options))
            .await
            .map_err(|e| format!("start {id}: {e}"))?
            .map_err(|e| format!("start {id}: {e}"))?;
        let client = cluster.client().await.map_err(|e| e.to_string())?;
        Ok(Side {
            id,
            cluster,
            client,
        })
    }

    /// Runs one of the cluster's tools (kubectl, helm) from the repository's root; its output,
    /// or an error with both streams.
    pub fn tool(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let out = self
            .cluster
            .tool(program)
            .args(args)
            .current_dir(repo("."))
            .output()
            .map_err(|e| format!("run {program}: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!(
                "{program} {} on {}: {}{}",
                args.join(" "),
                self.id,
                text,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// `helm install locks` with 3 replicas, cluster id `id`, the lock nodes at `urls` with
    /// `password`, and `extra` values (`--set` arguments).
    pub fn install_operator(
        &self,
        urls: &[String],
        password: &str,
        extra: &[&str],
    ) -> Result<(), String> {
        let external = serde_json::to_string(urls).map_err(|e| e.to_string())?;
        self.tool("kubectl", &["create", "namespace", RELEASE_NAMESPACE])?;
        self.tool(
            "kubectl",
            &[
                "create",
                "secret",
                "generic",
                "lock-nodes",
                "-n",
                RELEASE_NAMESPACE,
                &format!("--from-literal=password={password}"),
            ],
        )?;
        let cluster_id = format!("clusterId={}", self.id);
        let external = format!("redis.external={external}");
        let mut args = vec![
            "install",
            "locks",
            "charts/lockedjob-operator",
            "-n",
            RELEASE_NAMESPACE,
            "-f",
            "charts/lockedjob-operator/ci/local-values.yaml",
            "--set",
            &cluster_id,
            "--set-json",
            &external,
            "--wait",
            "--timeout",
            "5m",
        ];
        for value in extra {
            args.extend(["--set", value]);
        }
        self.tool("helm", &args).map(drop)
    }
}

/// The tag the chart's Deployment names by default (Chart.yaml's `appVersion`).
pub fn chart_app_version() -> Result<String, String> {
    let path = repo("charts/lockedjob-operator/Chart.yaml");
    let chart =
        std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    chart
        .lines()
        .find_map(|l| l.strip_prefix("appVersion:"))
        .map(|v| v.trim().trim_matches('"').to_string())
        .ok_or_else(|| format!("{} has no appVersion", path.display()))
}

/// The lock nodes as one cluster's pods reach them: pods live in their node's network
/// namespace, where 127.0.0.1 is their own, so a proxy per node listens on the host's end of the
/// cluster's node link. The proxies also inject the soak's network faults.
pub struct NodeProxies {
    pub proxies: Vec<FaultProxy>,
}

impl NodeProxies {
    /// Proxies on the host's end of `side`'s node link to the nodes at `addrs` (`host:port`).
    pub fn start(side: &Side, addrs: &[String]) -> Result<Self, String> {
        let host_ip = side.cluster.host_ip();
        let proxies = addrs
            .iter()
            .map(|addr| FaultProxy::start_on(host_ip.into(), addr))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("start the proxies to the Redis nodes: {e}"))?;
        Ok(Self { proxies })
    }

    pub fn urls(&self) -> Vec<String> {
        self.proxies.iter().map(FaultProxy::url).collect()
    }
}
