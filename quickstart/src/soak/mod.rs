//! The cluster soak (`soak --minutes M --seed S`): two local clusters with the operator
//! installed by the chart in each (3 replicas), the five shared Redis nodes of the quickstart,
//! a mix of LockedJobs sharing their locks across the clusters, and a seeded schedule of
//! overlapping faults; judged by our checker (`judge`) and by porcupine (`tools/porcupine-check`).
//! docs/testing.md, "The cluster soak", says what it covers and what it does not.

pub mod faults;
pub mod judge;
pub mod leader;
pub mod schedule;
pub mod store;
pub mod timeline;
pub mod workload;

use crate::clusters::{lockedjob_binary, NodeProxies, Side};
use faults::{carry_out, Executed, Targets};
use judge::{LockReport, Span};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams, PostParams};
use localcluster::Binaries;
use lockedjob::api::LockedJob;
use lockedjob::lab::harness::{Persistence, RedisNodes};
use lockedjob::lab::porcupine::{check_export, Independent};
use schedule::{Planned, Shape, CLOCK_NODE, NODES};
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use store::FencedStore;
use workload::{lock_name, now_seconds, Collector, RunKind, MIX, NAMESPACE, TTL_SECONDS};

/// A node's restart delay, as `start-redis.sh` has it: longer than any lease it voted for.
pub const RESTART_DELAY_MS: u64 = 12_000;
const CLUSTERS: [&str; 2] = ["east", "west"];
const REPLICAS: usize = 3;

pub struct Options {
    pub seconds: u64,
    pub seed: u64,
    pub out: PathBuf,
    /// The deliberately broken deployment: each cluster its own five nodes, so both run every
    /// time. Both checkers must object.
    pub split_nodes: bool,
    /// `tools/porcupine-check`; without it only our checker judges.
    pub porcupine_check: Option<PathBuf>,
}

#[derive(Serialize)]
struct Parameters {
    seed: u64,
    seconds: u64,
    ttl_seconds: u64,
    restart_delay_ms: u64,
    split_nodes: bool,
    clusters: [&'static str; 2],
    replicas: usize,
    mix: [workload::Kind; 4],
}

/// A run-now or backfill the soak asked for, and when its first run entered (none: it never
/// ran).
#[derive(Clone, Serialize)]
struct Request {
    asked: String,
    at: f64,
    first_run_after_s: Option<f64>,
}

impl Request {
    fn answered(asked: String, at: f64, kind: RunKind, runs: &[workload::Run]) -> Self {
        let first_run_after_s = runs
            .iter()
            .filter(|r| r.kind == kind && r.enter >= at)
            .map(|r| r.enter - at)
            .reduce(f64::min);
        Self {
            asked,
            at,
            first_run_after_s,
        }
    }
}

#[derive(Serialize)]
pub struct Report {
    parameters: Parameters,
    schedule: Vec<Planned>,
    faults: Vec<Executed>,
    faults_by_kind: BTreeMap<&'static str, usize>,
    requests: Vec<Request>,
    locks: Vec<LockReport>,
    leader: leader::LeaderReport,
    independent: BTreeMap<String, Independent>,
    /// What our checker objects to.
    ours: Vec<String>,
    /// What porcupine objects to, and where the two checkers disagree.
    porcupine: Vec<String>,
    disagreements: Vec<String>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.ours.is_empty() && self.porcupine.is_empty() && self.disagreements.is_empty()
    }

    pub fn ours(&self) -> &[String] {
        &self.ours
    }

    pub fn porcupine(&self) -> &[String] {
        &self.porcupine
    }

    fn timeline(&self, title: &str, seen: &Seen) -> String {
        let locks: Vec<String> = self.locks.iter().map(|l| l.lock.clone()).collect();
        let overlapping: Vec<String> = self
            .locks
            .iter()
            .flat_map(|l| &l.overlaps)
            .flat_map(|o| [o.first_pod.clone(), o.second_pod.clone()])
            .collect();
        timeline::render(
            title,
            &locks,
            &seen.runs,
            &seen.writes,
            &seen.executed,
            &overlapping,
        )
    }
}

pub fn say(text: impl std::fmt::Display) {
    eprintln!("[soak] {text}");
}

/// Runs the soak and writes `report.json` (and porcupine's input per lock) into `out`.
pub async fn run(options: &Options) -> Result<Report, String> {
    std::fs::create_dir_all(&options.out)
        .map_err(|e| format!("create {}: {e}", options.out.display()))?;
    let stand = Stand::start(options).await?;
    let seen = soak(options, stand).await?;
    let report = judge_all(options, &seen)?;
    write_json(&options.out.join("report.json"), &report)?;
    let picture = report.timeline(&format!("soak, seed {}", options.seed), &seen);
    let path = options.out.join("timeline.svg");
    std::fs::write(&path, picture).map_err(|e| format!("write {}: {e}", path.display()))?;
    write_json(
        &options.out.join("runs.json"),
        &json!({"runs": seen.runs, "writes": seen.writes}),
    )?;
    Ok(report)
}

fn write_json(path: &std::path::Path, value: &impl Serialize) -> Result<(), String> {
    let json = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    std::fs::write(path, json).map_err(|e| format!("write {}: {e}", path.display()))
}

/// What the soak runs on: the nodes, the two clusters with the operator, the workload and the
/// leader Deployment, the store, the proxies.
struct Stand {
    nodes: RedisNodes,
    password: String,
    sides: Arc<Vec<Side>>,
    store: FencedStore,
    proxies: Vec<NodeProxies>,
    /// When the LockedJobs were created, in seconds since the epoch.
    created: f64,
}

impl Stand {
    async fn start(options: &Options) -> Result<Self, String> {
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
        let store = FencedStore::start(&on)
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

/// What the soak saw.
struct Seen {
    plan: Vec<Planned>,
    executed: Vec<Executed>,
    requests: Vec<Request>,
    runs: Vec<workload::Run>,
    writes: Vec<store::StoreWrite>,
    span: Span,
}

/// The faults carried out while the runs are read; then the LockedJobs suspended and the
/// last runs read.
async fn soak(options: &Options, stand: Stand) -> Result<Seen, String> {
    say(format!(
        "soaking for {} s, seed {}",
        options.seconds, options.seed
    ));
    let shape = Shape {
        seconds: options.seconds,
        ttl_ms: TTL_SECONDS * 1000,
        clusters: CLUSTERS.len(),
        replicas: REPLICAS,
        restart_delay_ms: RESTART_DELAY_MS,
    };
    let plan = schedule::schedule(options.seed, shape);
    let start = Instant::now();
    let sides = stand.sides.clone();
    let collector = Arc::new(tokio::sync::Mutex::new(Collector::default()));
    let (stop_reading, reading) = read_runs(sides.clone(), collector.clone());
    let requests = tokio::spawn(request_runs(sides.clone(), options.seconds, stand.created));
    // Held to the end, not only while faults are carried out: the nodes stop when dropped,
    // and the pods reach them through the proxies.
    let proxies = Arc::new(stand.proxies);
    let nodes = Arc::new(Mutex::new(stand.nodes));
    let targets = Targets {
        sides: sides.clone(),
        nodes: nodes.clone(),
        proxies: proxies.clone(),
        password: stand.password,
    };
    let executed = carry_out(&plan, start, targets).await;
    tokio::time::sleep_until((start + Duration::from_secs(options.seconds)).into()).await;
    let requests = requests.await.map_err(|e| e.to_string())?;

    say("suspending the LockedJobs and reading the last runs");
    let suspended = now_seconds();
    suspend(&sides).await?;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let _ = stop_reading.send(());
    let _ = reading.await;
    let mut collector = collector.lock().await;
    for side in sides.iter() {
        collector.read(side.id, &side.client).await;
    }
    let runs = collector.runs();
    drop((proxies, nodes));
    for side in sides.iter() {
        keep_logs(side, &options.out.join("logs"));
    }
    Ok(Seen {
        requests: requests
            .into_iter()
            .map(|(asked, at, kind)| Request::answered(asked, at, kind, &runs))
            .collect(),
        plan,
        executed,
        runs,
        writes: stand.store.log(),
        span: Span {
            from: stand.created + TTL_SECONDS as f64,
            to: suspended - TTL_SECONDS as f64,
        },
    })
}

/// Both checkers on every lock and on the leader's writes.
fn judge_all(options: &Options, seen: &Seen) -> Result<Report, String> {
    let mut report = Report {
        parameters: Parameters {
            seed: options.seed,
            seconds: options.seconds,
            ttl_seconds: TTL_SECONDS,
            restart_delay_ms: RESTART_DELAY_MS,
            split_nodes: options.split_nodes,
            clusters: CLUSTERS,
            replicas: REPLICAS,
            mix: MIX,
        },
        faults_by_kind: seen.executed.iter().fold(BTreeMap::new(), |mut m, f| {
            *m.entry(f.kind).or_default() += 1;
            m
        }),
        schedule: seen.plan.clone(),
        faults: seen.executed.clone(),
        requests: seen.requests.clone(),
        locks: Vec::new(),
        leader: leader::judge(&seen.writes),
        independent: BTreeMap::new(),
        ours: Vec::new(),
        porcupine: Vec::new(),
        disagreements: Vec::new(),
    };
    let ttl = TTL_SECONDS as f64;
    for kind in &MIX {
        let lock = lock_name(kind);
        let judged = judge::judge(
            kind,
            &lock,
            &seen.runs,
            &seen.writes,
            &seen.executed,
            seen.span,
            ttl,
        );
        report.ours.extend(judged.objections());
        if let Some(checker) = &options.porcupine_check {
            let dir = options.out.join("porcupine").join(&lock);
            std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
            let export = judge::export(&lock, &seen.runs, &seen.writes);
            let independent = check_export(checker, &export, &dir).map_err(|e| e.to_string())?;
            compare(&lock, &judged, &independent, &mut report);
            report.independent.insert(lock.clone(), independent);
        }
        report.locks.push(judged);
    }
    judge_leader(options, &seen.writes, &mut report)?;
    Ok(report)
}

/// The leader's objections: no term at all, or a stale write taken; and porcupine's verdict
/// on its writes (the fenced-store model; its sections are not recorded).
fn judge_leader(
    options: &Options,
    writes: &[store::StoreWrite],
    report: &mut Report,
) -> Result<(), String> {
    let said = &report.leader;
    if said.terms == 0 {
        report
            .ours
            .push(format!("{}: no leader ever wrote", leader::LOCK));
    }
    if said.stale_writes_accepted > 0 {
        report.ours.push(format!(
            "{}: {} stale writes were accepted",
            leader::LOCK,
            said.stale_writes_accepted
        ));
    }
    let Some(checker) = &options.porcupine_check else {
        return Ok(());
    };
    let dir = options.out.join("porcupine").join(leader::LOCK);
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let independent = check_export(checker, &judge::export(leader::LOCK, &[], writes), &dir)
        .map_err(|e| e.to_string())?;
    let fenced_ok = independent.fenced_store == "ok";
    if !fenced_ok {
        report.porcupine.push(format!(
            "{}: fenced-store: {}",
            leader::LOCK,
            independent.fenced_store
        ));
    }
    if fenced_ok != (said.stale_writes_accepted == 0) {
        report.disagreements.push(format!(
            "{}: porcupine's fenced-store says {}, ours counts {} stale writes accepted",
            leader::LOCK,
            independent.fenced_store,
            said.stale_writes_accepted
        ));
    }
    report
        .independent
        .insert(leader::LOCK.to_string(), independent);
    Ok(())
}

/// Porcupine's objections, and where it and our checker disagree: the store's answers fit
/// an order of the writes exactly when no stale write was accepted; the sections fit "one
/// holder at a time" exactly when our checker found no overlap.
fn compare(lock: &str, ours: &LockReport, independent: &Independent, report: &mut Report) {
    let fenced_ok = independent.fenced_store == "ok";
    let one_holder_ok = independent.one_holder == "ok";
    if !fenced_ok {
        report.porcupine.push(format!(
            "{lock}: fenced-store: {}",
            independent.fenced_store
        ));
    }
    if !one_holder_ok {
        report
            .porcupine
            .push(format!("{lock}: one-holder: {}", independent.one_holder));
    }
    if fenced_ok != (ours.stale_writes_accepted == 0) {
        report.disagreements.push(format!(
            "{lock}: porcupine's fenced-store says {}, ours counts {} stale writes accepted",
            independent.fenced_store, ours.stale_writes_accepted
        ));
    }
    if one_holder_ok != ours.overlaps.is_empty() {
        report.disagreements.push(format!(
            "{lock}: porcupine's one-holder says {}, ours found {} overlaps",
            independent.one_holder,
            ours.overlaps.len()
        ));
    }
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

/// Reads the runs every 2 s until told to stop.
fn read_runs(
    sides: Arc<Vec<Side>>,
    collector: Arc<tokio::sync::Mutex<Collector>>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        loop {
            for side in sides.iter() {
                collector.lock().await.read(side.id, &side.client).await;
            }
            tokio::select! {
                _ = &mut stopped => return,
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            }
        }
    });
    (stop, task)
}

/// A quarter in, a run-now of `forbid` in the first cluster; a third in, a backfill of
/// `allow`'s first two due times after the LockedJobs were created, in the second. Returns what was
/// asked, when, and the kind of run it asked for.
async fn request_runs(
    sides: Arc<Vec<Side>>,
    seconds: u64,
    created: f64,
) -> Vec<(String, f64, RunKind)> {
    let mut asked = Vec::new();
    tokio::time::sleep(Duration::from_secs(seconds / 4)).await;
    // A time off `forbid`'s 10 s grid, so that it is told from a scheduled run.
    let now = now_seconds() as i64;
    let at = now - now.rem_euclid(10) - 5;
    let run_now = format!("{}", jiff::Timestamp::from_second(at).unwrap_or_default());
    let said = annotate(
        &sides[0],
        "forbid",
        lockedjob::api::ANNOTATION_RUN_NOW,
        &run_now,
    )
    .await;
    asked.push((said, now_seconds(), RunKind::RunNow));
    tokio::time::sleep(Duration::from_secs(seconds / 3 - seconds / 4)).await;
    let first = (created as i64).div_euclid(20) * 20 + 20;
    let range = format!(
        "{}/{}",
        jiff::Timestamp::from_second(first).unwrap_or_default(),
        jiff::Timestamp::from_second(first + 20).unwrap_or_default()
    );
    let said = annotate(
        &sides[1],
        "allow",
        lockedjob::api::ANNOTATION_BACKFILL,
        &range,
    )
    .await;
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
fn keep_logs(side: &Side, dir: &std::path::Path) {
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

async fn suspend(sides: &[Side]) -> Result<(), String> {
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
