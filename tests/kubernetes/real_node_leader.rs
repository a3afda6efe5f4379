//! One leader across two clusters (issue 31): two local control planes, each with a real node
//! (kubelet, containerd, runc), run the leader-election example
//! (examples/leader-election/deployment.yaml), two replicas in each, against the same five
//! Redis nodes. The nodes are loopback processes; each cluster's pods reach them through a
//! proxy per node on the host's end of that cluster's link, which can also cut the cluster
//! off. The example's stand-in workload is replaced by one that, while `GET /leader` answers,
//! sends "CLUSTER POD TOKEN" every 100 ms to a fenced store this test serves on the host (it
//! refuses a token lower than the highest it took).
//!
//! Faults in turn: the leader's sidecar killed with SIGKILL, the leader's pod deleted, then
//! force-deleted, the leader's cluster cut off from every Redis node, the leader's pod frozen (cgroup freezer)
//! past its TTL while the other cluster is cut off, and three of the five Redis nodes paused
//! (no quorum: no leader anywhere until they return). Judged over the whole run, from the
//! store's log and from watches of both clusters' pods and the Service's EndpointSlices
//! (`judge`): no write refused but the frozen leader's after it woke (a stale write, which the
//! fence is for), each term's writes from one pod and its accepted writes not interleaved with
//! another term's, at most one pod with the condition `lockedjob.dev/leader` True at a time,
//! and the Services' ready endpoints at most one pod, the leader's while a pod leads. Events of the two clusters are merged by when this test
//! received them; within a cluster a watch keeps the API server's order. Needs root.

use testsupport as support;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use kube::ResourceExt;
use localcluster::{LocalCluster, Options};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::kubernetes::{apply_chart_rbac, client_for, create_namespace, kubectl_apply};
use support::{FaultProxy, Persistence, ProxyMode, RedisNodes};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_util::task::AbortOnDropHandle;

const EXAMPLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/leader-election/deployment.yaml"
);
const CLUSTERS: [&str; 2] = ["east", "west"];
const REDIS_NODES: usize = 5;
const WAIT: Duration = Duration::from_secs(120);
/// Accepted writes that show a term has settled in.
const SETTLED: usize = 10;

/// A pod of one cluster.
type PodRef = (String, String);

/// One write the fenced store received.
#[derive(Debug, Clone)]
struct Write {
    at: Instant,
    pod: PodRef,
    token: u64,
    accepted: bool,
}

/// A store that refuses a token lower than the highest it accepted, served on each cluster's
/// host address; it logs every write.
struct FencedStore {
    writes: Arc<Mutex<Vec<Write>>>,
    addrs: BTreeMap<String, std::net::SocketAddr>,
    _servers: Vec<AbortOnDropHandle<()>>,
}

impl FencedStore {
    async fn serve(clusters: &[(&str, std::net::Ipv4Addr)]) -> Self {
        let writes = Arc::new(Mutex::new(Vec::new()));
        let (mut addrs, mut servers) = (BTreeMap::new(), Vec::new());
        for (cluster, ip) in clusters {
            let listener = tokio::net::TcpListener::bind((*ip, 0))
                .await
                .expect("bind the fenced store");
            addrs.insert(cluster.to_string(), listener.local_addr().expect("addr"));
            let log = Arc::clone(&writes);
            servers.push(AbortOnDropHandle::new(tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(take_write(stream, Arc::clone(&log)));
                }
            })));
        }
        Self {
            writes,
            addrs,
            _servers: servers,
        }
    }

    fn log(&self) -> Vec<Write> {
        self.writes.lock().expect("store log").clone()
    }

    /// The latest term with at least `SETTLED` accepted writes and a token above `after`.
    fn settled_term(&self, after: u64) -> Option<(PodRef, u64)> {
        let log = self.log();
        let last = log.iter().rev().find(|w| w.accepted && w.token > after)?;
        let count = log
            .iter()
            .filter(|w| w.accepted && w.token == last.token)
            .count();
        (count >= SETTLED).then(|| (last.pod.clone(), last.token))
    }
}

/// One connection: a line "CLUSTER POD TOKEN", answered "ok" or "stale".
async fn take_write(stream: tokio::net::TcpStream, log: Arc<Mutex<Vec<Write>>>) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    if BufReader::new(read).read_line(&mut line).await.is_err() {
        return;
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let [cluster, pod, token] = words[..] else {
        return;
    };
    let Ok(token) = token.parse::<u64>() else {
        return;
    };
    let accepted = {
        let mut log = log.lock().expect("store log");
        let highest = log.iter().filter(|w| w.accepted).map(|w| w.token).max();
        let accepted = highest.is_none_or(|h| token >= h);
        log.push(Write {
            at: Instant::now(),
            pod: (cluster.to_string(), pod.to_string()),
            token,
            accepted,
        });
        accepted
    };
    let _ = write
        .write_all(if accepted { b"ok\n" } else { b"stale\n" })
        .await;
}

/// What the watches saw, when.
#[derive(Debug, Clone)]
enum Seen {
    /// A pod's `lockedjob.dev/leader` condition (false also when the pod is gone).
    Leading(PodRef, bool),
    /// The pods a cluster's Service lists as ready endpoints.
    Endpoints(String, BTreeSet<String>),
}

type Timeline = Arc<Mutex<Vec<(Instant, Seen)>>>;

fn leads(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| {
        c.iter()
            .any(|c| c.type_ == "lockedjob.dev/leader" && c.status == "True")
    })
}

/// Records each change of the example's pods' leader condition in `cluster`.
async fn watch_leaders(pods: Api<Pod>, cluster: String, timeline: Timeline) {
    let config = watcher::Config::default().labels("app=writer");
    let mut shown: BTreeMap<String, bool> = BTreeMap::new();
    let mut events = watcher(pods, config).boxed();
    while let Some(event) = events.next().await {
        let (pod, leading) = match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                (pod.name_any(), leads(&pod))
            }
            Ok(watcher::Event::Delete(pod)) => (pod.name_any(), false),
            _ => continue,
        };
        if shown.insert(pod.clone(), leading) != Some(leading) {
            let seen = Seen::Leading((cluster.clone(), pod), leading);
            timeline
                .lock()
                .expect("timeline")
                .push((Instant::now(), seen));
        }
    }
}

/// Records each change of the pods the Service `writer` in `cluster` lists as ready.
async fn watch_endpoints(slices: Api<EndpointSlice>, cluster: String, timeline: Timeline) {
    let config = watcher::Config::default().labels("kubernetes.io/service-name=writer");
    let mut by_slice: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut shown = BTreeSet::new();
    let mut events = watcher(slices, config).boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(slice) | watcher::Event::InitApply(slice)) => {
                let ready = slice
                    .endpoints
                    .iter()
                    .flatten()
                    .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                    .filter_map(|e| e.target_ref.as_ref()?.name.clone())
                    .collect();
                by_slice.insert(slice.name_any(), ready);
            }
            Ok(watcher::Event::Delete(slice)) => {
                by_slice.remove(&slice.name_any());
            }
            _ => continue,
        }
        let ready: BTreeSet<String> = by_slice.values().flatten().cloned().collect();
        if ready != shown {
            shown = ready.clone();
            let seen = Seen::Endpoints(cluster.clone(), ready);
            timeline
                .lock()
                .expect("timeline")
                .push((Instant::now(), seen));
        }
    }
}

/// Every violation of one leader at a time in the run, as lines for a failure's message.
/// `woken`: the term of a leader frozen past its lease, whose late writes the fence refuses.
fn judge(
    writes: &[Write],
    timeline: &[(Instant, Seen)],
    start: Instant,
    woken: u64,
) -> Vec<String> {
    let at = |t: Instant| format!("+{:.3}s", t.duration_since(start).as_secs_f64());
    let mut violations = Vec::new();
    let refused = writes.iter().filter(|w| !w.accepted && w.token != woken);
    for w in refused {
        violations.push(format!(
            "{}: stale write refused: {:?} with token {} after a higher one",
            at(w.at),
            w.pod,
            w.token
        ));
    }
    // Each term: one pod, and its accepted writes not interleaved with another term's.
    let mut terms: BTreeMap<u64, (PodRef, Instant, Instant)> = BTreeMap::new();
    for w in writes {
        let term = terms.entry(w.token).or_insert((w.pod.clone(), w.at, w.at));
        if term.0 != w.pod {
            violations.push(format!(
                "token {} written by {:?} and {:?}",
                w.token, term.0, w.pod
            ));
        }
        if w.accepted {
            term.2 = w.at;
        }
    }
    let spans: Vec<_> = terms.iter().collect();
    for pair in spans.windows(2) {
        let ((t1, (p1, _, end1)), (t2, (p2, start2, _))) = (pair[0], pair[1]);
        if start2 < end1 {
            violations.push(format!(
                "token {t2} ({p2:?}) wrote from {} while token {t1} ({p1:?}) wrote until {}",
                at(*start2),
                at(*end1)
            ));
        }
    }
    let mut leading: BTreeSet<PodRef> = BTreeSet::new();
    let mut endpoints: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (when, seen) in timeline {
        match seen {
            Seen::Leading(pod, true) => {
                leading.insert(pod.clone());
            }
            Seen::Leading(pod, false) => {
                leading.remove(pod);
            }
            Seen::Endpoints(cluster, ready) => {
                endpoints.insert(cluster.clone(), ready.clone());
            }
        }
        let ready: BTreeSet<PodRef> = endpoints
            .iter()
            .flat_map(|(c, pods)| pods.iter().map(move |p| (c.clone(), p.clone())))
            .collect();
        if leading.len() > 1 {
            violations.push(format!("{}: two pods lead: {leading:?}", at(*when)));
        }
        if ready.len() > 1 {
            violations.push(format!("{}: two ready endpoints: {ready:?}", at(*when)));
        }
        if let (Some(leader), Some(other)) = (leading.first(), ready.first()) {
            if leading.len() == 1 && other != leader {
                violations.push(format!(
                    "{}: the Service routes to {other:?} while {leader:?} leads",
                    at(*when)
                ));
            }
        }
    }
    violations
}

/// One cluster of the run: its control plane and real node, a client, the example's
/// namespace, and its proxies to the Redis nodes.
struct Site {
    name: String,
    cluster: LocalCluster,
    client: kube::Client,
    namespace: String,
    proxies: Vec<FaultProxy>,
}

impl Site {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn cut_off(&self, cut: bool) {
        let mode = if cut {
            ProxyMode::Blackhole
        } else {
            ProxyMode::Forward
        };
        for proxy in &self.proxies {
            proxy.set_mode(mode);
        }
    }
}

fn example_image() -> String {
    let example = std::fs::read_to_string(EXAMPLE).expect("the example");
    example
        .lines()
        .find_map(|l| l.trim().strip_prefix("image: ghcr.io/"))
        .map(|rest| format!("ghcr.io/{rest}"))
        .expect("the sidecar's image in the example")
}

/// The two clusters of the test, started once there is room for both (`localcluster`'s slots).
async fn start_clusters() -> (LocalCluster, LocalCluster) {
    let options = |name: &str| Options {
        nodes: 1,
        images: BTreeMap::from([(example_image(), support::lockedjob_image())]),
        ..Options::named(name)
    };
    let mut both =
        tokio::task::spawn_blocking(move || localcluster::start_many(CLUSTERS.map(options).into()))
            .await
            .expect("join")
            .unwrap_or_else(|e| panic!("start {CLUSTERS:?} with a real node each: {e}"));
    let west = both.pop().expect("two clusters");
    let east = both.pop().expect("two clusters");
    (east, west)
}

/// The workload: while its sidecar says it leads, it sends its token to the store.
fn writer_command(cluster: &str, store: std::net::SocketAddr) -> String {
    let script = format!(
        "trap 'exit 0' TERM; while :; do \
         if leader=$(wget -q -O - http://127.0.0.1:8087/leader); then \
         token=$(echo \"$leader\" | sed -n 's/.*\"token\":\\([0-9]*\\).*/\\1/p'); \
         echo \"{cluster} $HOSTNAME $token\" | nc {} {} >/dev/null; fi; \
         sleep 0.1 & wait $!; done",
        store.ip(),
        store.port()
    );
    serde_json::to_string(&["sh", "-c", &script]).expect("json")
}

/// The example as this site runs it: its namespace, the proxies' URLs, its cluster's name, a
/// 5 s TTL, and the fenced writer.
fn example_for(site: &Site, store: std::net::SocketAddr) -> String {
    let urls: Vec<String> = site.proxies.iter().map(FaultProxy::url).collect();
    std::fs::read_to_string(EXAMPLE)
        .expect("the example")
        .lines()
        .map(|line| {
            let indent = &line[..line.len() - line.trim_start().len()];
            if line.trim_start().starts_with("redis://") {
                format!("{indent}{}", urls.join(","))
            } else if line.trim_start().starts_with("command: [\"sh\"") {
                format!("{indent}command: {}", writer_command(&site.name, store))
            } else {
                line.replace("namespace: demo", &format!("namespace: {}", site.namespace))
                    .replace("value: prod-eu", &format!("value: {}", site.name))
                    .replace("\"--ttl\", \"15s\"", "\"--ttl\", \"5s\"")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn deploy(site: &Site, store: std::net::SocketAddr, password: &str) {
    let dir = tempfile::tempdir().expect("dir");
    apply_chart_rbac(&site.cluster, &site.namespace, dir.path());
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "lockedjob-redis"},
        "stringData": {"password": password},
    }))
    .expect("secret");
    Api::<Secret>::namespaced(site.client.clone(), &site.namespace)
        .create(&PostParams::default(), &secret)
        .await
        .expect("the example's Secret");
    let file = dir.path().join("leader.yaml");
    std::fs::write(&file, example_for(site, store)).expect("write the example");
    kubectl_apply(&site.cluster, &file);
}

/// Waits for a term above `after` to settle in; returns it, or fails with the store's tail.
async fn next_term(store: &FencedStore, after: u64, what: &str) -> (PodRef, u64) {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if let Some(term) = store.settled_term(after) {
            return term;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = store.log();
    panic!(
        "{what}: no term after token {after} settled in; the store's last writes: {:?}",
        &log[log.len().saturating_sub(10)..]
    );
}

/// Freezes (or thaws) every process of pod `uid` through its cgroup, as `docker pause` does:
/// the kubelet and the API server go on, the pod's sidecar and workload stand still.
fn freeze_pod(uid: &str, frozen: bool) {
    let wanted = format!("pod{uid}");
    let found = walkdir(std::path::Path::new("/sys/fs/cgroup/freezer"), 5)
        .into_iter()
        .find(|dir| dir.file_name().and_then(|n| n.to_str()) == Some(wanted.as_str()))
        .unwrap_or_else(|| panic!("no freezer cgroup {wanted}"));
    let state = if frozen { "FROZEN" } else { "THAWED" };
    std::fs::write(found.join("freezer.state"), state)
        .unwrap_or_else(|e| panic!("{state} {}: {e}", found.display()));
}

/// The directories under `root`, `depth` levels deep at most.
fn walkdir(root: &std::path::Path, depth: usize) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let dirs: Vec<_> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    let mut all = dirs.clone();
    if depth > 1 {
        for dir in dirs {
            all.extend(walkdir(&dir, depth - 1));
        }
    }
    all
}

/// The run: both sites, the Redis nodes, the store, and the term in office.
struct Run {
    sites: Vec<Site>,
    redis: RedisNodes,
    store: FencedStore,
    leader: PodRef,
    token: u64,
}

impl Run {
    fn site_of(&self, pod: &PodRef) -> &Site {
        self.sites.iter().find(|s| s.name == pod.0).expect("a site")
    }

    /// Waits for the next term to settle in, says how it went, and makes it the current one.
    async fn next_term(&mut self, after_what: &str) {
        let (old, (leader, token)) = (
            self.token,
            next_term(&self.store, self.token, after_what).await,
        );
        let log = self.store.log();
        let last_old = log.iter().filter(|w| w.token == old).map(|w| w.at).max();
        let first_new = log.iter().filter(|w| w.token == token).map(|w| w.at).min();
        let gap = match (last_old, first_new) {
            (Some(a), Some(b)) => b.saturating_duration_since(a),
            _ => Duration::ZERO,
        };
        let refused = log.iter().filter(|w| !w.accepted).count();
        eprintln!("{after_what}: {leader:?} leads with token {token}; writes {gap:?} apart, {refused} refused so far");
        (self.leader, self.token) = (leader, token);
    }

    /// The leader's sidecar dies; the kubelet reports it.
    async fn kill_the_leaders_sidecar(&mut self) {
        let pid = support::sidecar_pid(&self.leader.1).expect("the leader's sidecar process");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill -9 the leader's sidecar");
        self.next_term("after the sidecar's SIGKILL").await;
    }

    /// The leader's pod is deleted: its workload stops, then its sidecar releases.
    async fn delete_the_leaders_pod(&mut self) {
        let pods = self.site_of(&self.leader).pods();
        pods.delete(&self.leader.1, &DeleteParams::default())
            .await
            .expect("delete the leader's pod");
        self.next_term("after the leader's pod was deleted").await;
    }

    /// The leader's pod is deleted with `--force`: the object goes at once, with no word from
    /// the kubelet, so no candidate may shortcut; the kubelet then stops the pod.
    async fn force_delete_the_leaders_pod(&mut self) {
        let pods = self.site_of(&self.leader).pods();
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        pods.delete(&self.leader.1, &now)
            .await
            .expect("force-delete the leader's pod");
        self.next_term("after the leader's pod was force-deleted")
            .await;
    }

    /// The leader's cluster loses every Redis node: it steps down before its deadline, and the
    /// other cluster leads once the lease has run out.
    async fn cut_off_the_leaders_cluster(&mut self) {
        let cut = self.site_of(&self.leader).name.clone();
        self.site_of(&self.leader).cut_off(true);
        self.next_term("after the leader's cluster was cut off")
            .await;
        let site = self.sites.iter().find(|s| s.name == cut).expect("site");
        site.cut_off(false);
        assert_ne!(self.leader.0, cut, "a cut-off cluster cannot lead");
    }

    /// The leader's pod is frozen past its TTL while the other cluster is cut off, so its
    /// standby beside it takes over (and can clear the frozen pod's marks); then it wakes.
    /// Returns the frozen term.
    async fn freeze_the_leaders_pod(&mut self) -> u64 {
        let (frozen, leader) = (self.token, self.leader.clone());
        let other = self
            .sites
            .iter()
            .find(|s| s.name != leader.0)
            .expect("other");
        other.cut_off(true);
        let pods = self.site_of(&leader).pods();
        let uid = pods.get(&leader.1).await.expect("pod").uid().expect("uid");
        freeze_pod(&uid, true);
        self.next_term("while the leader was frozen").await;
        freeze_pod(&uid, false);
        self.sites.iter().for_each(|s| s.cut_off(false));
        frozen
    }

    /// Three of five Redis nodes paused: from a TTL on nobody writes; then they return.
    async fn lose_the_quorum(&mut self) {
        for node in &mut self.redis.nodes[..3] {
            node.pause().expect("SIGSTOP a Redis node");
        }
        let quiet_from = Instant::now() + Duration::from_secs(5);
        tokio::time::sleep(Duration::from_secs(8)).await;
        let during: Vec<Write> = self
            .store
            .log()
            .into_iter()
            .filter(|w| w.at > quiet_from)
            .collect();
        for node in &mut self.redis.nodes[..3] {
            node.resume().expect("SIGCONT a Redis node");
        }
        assert!(
            during.is_empty(),
            "writes with 3 of 5 Redis nodes paused, a TTL after they stopped: {during:?}"
        );
        self.next_term("after the quorum returned").await;
    }
}

/// Both sites: a cluster each, the example's namespace, proxies to every Redis node.
async fn sites(redis: &RedisNodes) -> Vec<Site> {
    let (east, west) = start_clusters().await;
    let mut sites = Vec::new();
    for (name, cluster) in CLUSTERS.into_iter().zip([east, west]) {
        let client = client_for(&cluster.kubeconfig()).await;
        let namespace = create_namespace(&client, "leader").await;
        let proxies = redis
            .nodes
            .iter()
            .map(|node| FaultProxy::start_on(cluster.host_ip().into(), &node.addr()))
            .collect::<Result<Vec<_>, _>>()
            .expect("proxies on the host's link");
        sites.push(Site {
            name: name.to_string(),
            cluster,
            client,
            namespace,
            proxies,
        });
    }
    sites
}

/// Watches of every site's pods and EndpointSlices into `timeline`, stopped when dropped.
fn watch_sites(sites: &[Site], timeline: &Timeline) -> Vec<AbortOnDropHandle<()>> {
    let mut watches = Vec::new();
    for site in sites {
        let slices = Api::namespaced(site.client.clone(), &site.namespace);
        let name = site.name.clone();
        let leaders = watch_leaders(site.pods(), name.clone(), Arc::clone(timeline));
        let endpoints = watch_endpoints(slices, name, Arc::clone(timeline));
        watches.push(AbortOnDropHandle::new(tokio::spawn(leaders)));
        watches.push(AbortOnDropHandle::new(tokio::spawn(endpoints)));
    }
    watches
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn one_leader_across_two_clusters_through_crashes_partitions_a_freeze_and_no_quorum() {
    let _turn = crate::beside();
    let redis = RedisNodes::start(REDIS_NODES, Persistence::None).expect("redis-server");
    let password = format!("{:032x}", rand::random::<u128>());
    support::create_acl_user(&redis, &support::readme_acl_setuser(&password));
    let sites = sites(&redis).await;
    let ips: Vec<_> = sites
        .iter()
        .map(|s| (s.name.as_str(), s.cluster.host_ip()))
        .collect();
    let store = FencedStore::serve(&ips).await;
    let timeline: Timeline = Arc::default();
    let watches = watch_sites(&sites, &timeline);
    let start = Instant::now();
    for site in &sites {
        deploy(site, store.addrs[&site.name], &password).await;
    }
    let (leader, token) = next_term(&store, 0, "first leader").await;
    let mut run = Run {
        sites,
        redis,
        store,
        leader,
        token,
    };
    run.kill_the_leaders_sidecar().await;
    run.delete_the_leaders_pod().await;
    run.force_delete_the_leaders_pod().await;
    run.cut_off_the_leaders_cluster().await;
    let frozen = run.freeze_the_leaders_pod().await;
    run.lose_the_quorum().await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    drop(watches);
    let writes = run.store.log();
    let timeline = timeline.lock().expect("timeline").clone();
    let violations = judge(&writes, &timeline, start, frozen);
    assert!(
        violations.is_empty(),
        "{} violations of one leader at a time:\n{}\nthe watches saw:\n{}",
        violations.len(),
        violations.join("\n"),
        timeline
            .iter()
            .map(|(t, s)| format!("+{:.3}s {s:?}", t.duration_since(start).as_secs_f64()))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let terms: BTreeSet<u64> = writes.iter().map(|w| w.token).collect();
    let refused = writes.iter().filter(|w| !w.accepted).count();
    eprintln!(
        "{} writes in {} terms, {refused} refused (the frozen leader's); {} changes seen by the watches",
        writes.len(),
        terms.len(),
        timeline.len()
    );
}
