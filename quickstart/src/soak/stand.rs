//! What the soak stands on and does to the clusters besides faults: the nodes and the two
//! clusters with the operator, the LockedJobs and the leader Deployment; the run-now and the
//! backfill it asks for; the suspension at the end and the logs it keeps.

use super::config::{say, Options, CLUSTERS, REPLICAS};
use super::leader;
use super::schedule::{CLOCK_NODE, NODES};
use super::store::FencedStore;
use super::workload::{self, now_seconds, RunKind, ALLOW, FORBID, MIX, NAMESPACE};
use crate::clusters::{lockedjob_binary, NodeProxies, Side};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams, PostParams};
use localcluster::Binaries;
use lockedjob::api::{LockedJob, ANNOTATION_BACKFILL, ANNOTATION_RUN_NOW};
use lockedjob::lab::harness::{Persistence, RedisNodes};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the soak runs on: the nodes, the two clusters with the operator, the workload and the
/// leader Deployment, the store, the proxies.
pub(super) struct Stand {
    pub nodes: RedisNodes,
    pub password: String,
    pub sides: Arc<Vec<Side>>,
    pub store: FencedStore,
    pub proxies: Vec<NodeProxies>,
    /// When the LockedJobs were created, in seconds since the epoch.
    pub created: f64,
}

impl Stand {
    pub async fn start(options: &Options) -> Result<Self, String> {
        let lockedjob = lockedjob_binary()?;
        let bins = Binaries::locate().map_err(|e| e.to_string())?;
        let count = if options.split_nodes {
            2 * NODES
        } else {
            NODES
        } as usize;
        let nodes = RedisNodes::start_where(count, Persistence::AppendFsyncAlways, |i| {
            i == CLOCK_NODE as usize
        })
        .map_err(|e| format!("start redis-server: {e}"))?;
        let password = format!("{:032x}", rand::random::<u128>());
        for node in &nodes.nodes {
            node.command::<()>(&["CONFIG", "SET", "requirepass", &password])
                .map_err(|e| format!("set the password of {}: {e}", node.url()))?;
        }
        say(format!("{count} Redis nodes up (appendfsync always)"));
        let started = Instant::now();
        let (east, west) = tokio::join!(
            Side::start(CLUSTERS[0], &lockedjob, &bins),
            Side::start(CLUSTERS[1], &lockedjob, &bins)
        );
        let sides = Arc::new(vec![east?, west?]);
        say(format!(
            "clusters ready in {:.0} s",
            started.elapsed().as_secs_f64()
        ));
        let on: Vec<std::net::IpAddr> = sides.iter().map(|s| s.cluster.host_ip().into()).collect();
        let store = FencedStore::start(&on, !options.unfenced_store)
            .await
            .map_err(|e| format!("start the fenced store: {e}"))?;
        let addrs: Vec<String> = nodes.nodes.iter().map(|n| n.addr()).collect();
        let mut proxies = Vec::new();
        for (index, side) in sides.iter().enumerate() {
            // The broken deployment: the second cluster's own five nodes.
            let own = if options.split_nodes {
                index * NODES as usize
            } else {
                0
            };
            let side_proxies = NodeProxies::start(side, &addrs[own..own + NODES as usize])?;
            install(
                side,
                &side_proxies.urls(),
                &password,
                store.addrs()[index],
                &options.out,
            )
            .await?;
            proxies.push(side_proxies);
        }
        say(format!(
            "operator installed ({REPLICAS} replicas), {} LockedJobs and the leader Deployment applied in both clusters",
            MIX.len()
        ));
        Ok(Self {
            nodes,
            password,
            sides,
            store,
            proxies,
            created: now_seconds(),
        })
    }
}

/// The operator by the chart, the LockedJobs and the leader Deployment, in one cluster.
async fn install(
    side: &Side,
    urls: &[String],
    password: &str,
    store: std::net::SocketAddr,
    out: &std::path::Path,
) -> Result<(), String> {
    create_namespace(side).await?;
    let replicas = format!("replicaCount={REPLICAS}");
    // The leader Deployment's RBAC, as users get it from the chart.
    let leader_rbac = format!("leaderElection.namespaces={{{NAMESPACE}}}");
    side.install_operator(urls, password, &[&replicas, &leader_rbac])?;
    create_workload(side, store).await?;
    deploy_leader(side, urls, password, store, out)
}

async fn create_namespace(side: &Side) -> Result<(), String> {
    let namespace = serde_json::from_value::<Namespace>(json!({"metadata": {"name": NAMESPACE}}))
        .map_err(|e| e.to_string())?;
    Api::<Namespace>::all(side.client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(|e| format!("create namespace {NAMESPACE} on {}: {e}", side.id))
        .map(drop)
}

/// The leader-election example, with the Secret it names.
fn deploy_leader(
    side: &Side,
    urls: &[String],
    password: &str,
    store: std::net::SocketAddr,
    out: &std::path::Path,
) -> Result<(), String> {
    let literal = format!("--from-literal=password={password}");
    side.tool(
        "kubectl",
        &[
            "create",
            "secret",
            "generic",
            "lockedjob-redis",
            "-n",
            NAMESPACE,
            &literal,
        ],
    )?;
    let file = out.join(format!("leader-{}.yaml", side.id));
    std::fs::write(&file, leader::manifest(side, urls, store)?)
        .map_err(|e| format!("write {}: {e}", file.display()))?;
    let path = file.to_string_lossy().into_owned();
    side.tool("kubectl", &["apply", "-f", &path]).map(drop)
}

async fn create_workload(side: &Side, store: std::net::SocketAddr) -> Result<(), String> {
    let api = Api::<LockedJob>::namespaced(side.client.clone(), NAMESPACE);
    for kind in &MIX {
        let job = workload::locked_job(kind, store).map_err(|e| e.to_string())?;
        // The CRD came with the chart; it may take a moment to be served.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match api.create(&PostParams::default(), &job).await {
                Ok(_) => break,
                Err(e) if Instant::now() > deadline => {
                    return Err(format!(
                        "create LockedJob {} on {}: {e}",
                        kind.name, side.id
                    ))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
    Ok(())
}

/// A quarter in, a run-now of `forbid` in the first cluster; a third in, a backfill of
/// `allow`'s first two due times after the LockedJobs were created, in the second. Returns what was
/// asked, when, and the kind of run it asked for.
pub(super) async fn request_runs(
    sides: Arc<Vec<Side>>,
    seconds: u64,
    created: f64,
) -> Vec<(String, f64, RunKind)> {
    let mut asked = Vec::new();
    tokio::time::sleep(Duration::from_secs(seconds / 4)).await;
    // A time off `forbid`'s grid, so that it is told from a scheduled run.
    let (now, period) = (now_seconds() as i64, FORBID.period as i64);
    let at = now - now.rem_euclid(period) - period / 2;
    let run_now = format!("{}", jiff::Timestamp::from_second(at).unwrap_or_default());
    let said = annotate(&sides[0], FORBID.name, ANNOTATION_RUN_NOW, &run_now).await;
    asked.push((said, now_seconds(), RunKind::RunNow));
    tokio::time::sleep(Duration::from_secs(seconds / 3 - seconds / 4)).await;
    let period = ALLOW.period as i64;
    let first = (created as i64).div_euclid(period) * period + period;
    let range = format!(
        "{}/{}",
        jiff::Timestamp::from_second(first).unwrap_or_default(),
        jiff::Timestamp::from_second(first + period).unwrap_or_default()
    );
    let said = annotate(&sides[1], ALLOW.name, ANNOTATION_BACKFILL, &range).await;
    asked.push((said, now_seconds(), RunKind::Backfill));
    asked
}

async fn annotate(side: &Side, name: &str, key: &str, value: &str) -> String {
    let patch = json!({"metadata": {"annotations": {key: value}}});
    let outcome = Api::<LockedJob>::namespaced(side.client.clone(), NAMESPACE)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    let said = match outcome {
        Ok(_) => format!("{}: {name} {key}={value}", side.id),
        Err(e) => format!("{}: {name} {key}={value} failed: {e}", side.id),
    };
    say(&said);
    said
}

/// The operator replicas' logs and the LockedJobs as the soak left them, beside the report.
pub(super) fn keep_logs(side: &Side, dir: &std::path::Path) {
    let _ = std::fs::create_dir_all(dir);
    let keep = |file: String, args: &[&str]| {
        let text = side.tool("kubectl", args).unwrap_or_else(|e| e);
        let _ = std::fs::write(dir.join(file), text);
    };
    keep(
        format!("{}-lockedjobs.yaml", side.id),
        &["get", "lj", "-n", NAMESPACE, "-o", "yaml"],
    );
    keep(
        format!("{}-events.txt", side.id),
        &["get", "events", "-A", "--sort-by=.lastTimestamp"],
    );
    keep(
        format!("{}-leader.log", side.id),
        &[
            "logs",
            "-n",
            NAMESPACE,
            "-l",
            "app=writer",
            "--all-containers",
            "--prefix",
            "--tail=-1",
        ],
    );
    let pods = side
        .tool(
            "kubectl",
            &[
                "get",
                "pods",
                "-n",
                crate::clusters::RELEASE_NAMESPACE,
                "-o",
                "name",
            ],
        )
        .unwrap_or_default();
    for pod in pods.lines().filter_map(|l| l.strip_prefix("pod/")) {
        for (suffix, previous) in [("", "--previous=false"), (".previous", "--previous=true")] {
            keep(
                format!("{}-{pod}{suffix}.log", side.id),
                &[
                    "logs",
                    "-n",
                    crate::clusters::RELEASE_NAMESPACE,
                    pod,
                    previous,
                ],
            );
        }
    }
}

pub(super) async fn suspend(sides: &[Side]) -> Result<(), String> {
    for side in sides {
        let api = Api::<LockedJob>::namespaced(side.client.clone(), NAMESPACE);
        for kind in &MIX {
            api.patch(
                kind.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"suspend": true}})),
            )
            .await
            .map_err(|e| format!("suspend {} on {}: {e}", kind.name, side.id))?;
        }
    }
    Ok(())
}
