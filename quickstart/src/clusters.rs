//! Two local clusters sharing local Redis nodes, with the operator installed by the chart in
//! each: what the quickstart and the soak both stand on.

use kube::api::{Api, ListParams};
use kube::Client;
use localcluster::node::ImageSource;
use localcluster::{Binaries, LocalCluster, Options};
use lockedjob::api::{LockedJob, RunOutcome};
use lockedjob::lab::harness::FaultProxy;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
            images: BTreeMap::from([(image, ImageSource::Program(lockedjob.to_path_buf()))]),
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

/// The side and pod of the replica holding a run now: the holder of the latest `lastRun` still
/// running among the LockedJobs of `namespace` in every cluster. Runs are short beside their
/// periods, so it looks again every 200 ms for up to `wait`.
pub async fn running_holder(
    sides: &[Side],
    namespace: &str,
    wait: Duration,
) -> Option<(usize, String)> {
    let deadline = Instant::now() + wait;
    loop {
        let mut latest: Option<(jiff::Timestamp, String)> = None;
        for side in sides {
            let Ok(list) = Api::<LockedJob>::namespaced(side.client.clone(), namespace)
                .list(&ListParams::default())
                .await
            else {
                continue;
            };
            for run in list.items.into_iter().filter_map(|lj| lj.status?.last_run) {
                if run.outcome == RunOutcome::Running
                    && latest
                        .as_ref()
                        .is_none_or(|(t, _)| run.scheduled_time.0 > *t)
                {
                    latest = Some((run.scheduled_time.0, run.holder));
                }
            }
        }
        // The holder is `CLUSTER/POD`, the cluster being its side's id (the chart's clusterId).
        let found = latest.and_then(|(_, holder)| {
            let (cluster, pod) = holder.split_once('/')?;
            let side = sides.iter().position(|s| s.id == cluster)?;
            Some((side, pod.to_string()))
        });
        if found.is_some() || Instant::now() >= deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
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
