//! The chart's default install on a real node (issue 30), as users install a published chart:
//! packaged, pushed to the cluster's OCI registry and installed from `oci://`; the nodes pull
//! every image from that registry. The operator image built from the Dockerfile
//! (`scripts/image.sh`: `buildah bud`, its base images made here from Debian's packages and
//! this machine's Rust toolchain) and the chart's own Redis StatefulSets with their volumes, one per node of five (the chart's hard
//! anti-affinity), in a namespace that enforces the `restricted` Pod Security Standard, runc
//! enforcing every security context. One value differs from the defaults: a restart delay of
//! 8 s instead of 60, to keep the test short.
//!
//! Then: the README's example LockedJob runs once per due time; each Redis pod is deleted in
//! turn, comes back out of service for the restart delay (its port refused), and its volume
//! keeps the fence; tokens keep growing; deleting the holder's operator pod hands the runs
//! over. The README's "`lockedjob exec` in a plain CronJob" container runs as written, in a
//! Job beside the release (so a wrong Service name, user or Secret fails here). Needs root.

use testsupport as support;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use kube::ResourceExt;
use localcluster::{LocalCluster, Options, Shared};
use lockedjob::api::LockedJob;
use lockedjob::elect::{lease_name, DEFAULT_RECORD_VALIDITY};
use serde_json::json;
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};
use support::kubernetes::eventually;

const RELEASE: &str = "locks";
const REDIS_NODES: usize = 5;
const RESTART_DELAY_SECONDS: u64 = 8;
const WAIT: Duration = Duration::from_secs(180);

use support::{chart_field, chart_image};

/// `helm package` and `helm push` of the chart to the cluster's registry; its `oci://`
/// repository.
fn publish_chart(cluster: &LocalCluster) -> String {
    let registry = cluster.registry();
    let dir = tempfile::tempdir().expect("temporary directory");
    let dir_arg = dir.path().to_str().expect("utf-8 path");
    tool(
        cluster,
        "helm",
        &["package", "charts/lockedjob-operator", "-d", dir_arg],
    );
    let package = dir
        .path()
        .join(format!("lockedjob-operator-{}.tgz", chart_field("version")));
    let package = package.to_str().expect("utf-8 path");
    let repository = format!("oci://{registry}/charts");
    tool(
        cluster,
        "helm",
        &["push", package, &repository, "--plain-http"],
    );
    format!("{repository}/lockedjob-operator")
}

/// Whether pods of `ns` matching `selector` pulled their image (an event `Pulled` saying
/// "Successfully pulled", not "already present on machine"): nodes start with no image but the
/// sandbox's, so the first such pod on each node pulls it. (Not every pod: two on one node
/// share a pull.)
async fn pulled_from_the_registry(client: &kube::Client, ns: &str, selector: &str) -> bool {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(selector))
        .await
        .expect("list pods")
        .items;
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default().fields("reason=Pulled"))
        .await
        .expect("list events")
        .items;
    let pulled = |pod: &Pod| {
        events.iter().any(|e| {
            e.involved_object.name.as_deref() == pod.metadata.name.as_deref()
                && e.message
                    .as_deref()
                    .is_some_and(|m| m.starts_with("Successfully pulled"))
        })
    };
    pods.iter().any(pulled)
}

fn repo(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

async fn cluster() -> Shared {
    tokio::task::spawn_blocking(|| {
        localcluster::shared_with("chart-real", || Options {
            nodes: REDIS_NODES as u8,
            images: BTreeMap::from([(chart_image(), support::dockerfile_image(&chart_image()))]),
            ..Options::named("chart")
        })
    })
    .await
    .expect("join")
    .expect("start a cluster with a real node")
}

fn tool(cluster: &LocalCluster, program: &str, args: &[&str]) -> String {
    let out = cluster
        .tool(program)
        .current_dir(repo(""))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn restricted_namespace(client: &kube::Client, prefix: &str) -> String {
    let name = format!("{prefix}-{}", std::process::id());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {
        "name": name,
        "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
    }}))
    .expect("namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
    name
}

fn redis_pod(i: usize) -> String {
    format!("{RELEASE}-lockedjob-operator-redis-{i}-0")
}

/// A run: its scheduled time, holder and token, from the pod's output.
#[derive(Debug, Clone, PartialEq)]
struct Run {
    scheduled: String,
    holder: String,
    token: u64,
}

/// "run of TIME by HOLDER, token N" (the example's command).
fn parse_run(line: &str) -> Option<Run> {
    let rest = line.trim().strip_prefix("run of ")?;
    let (scheduled, rest) = rest.split_once(" by ")?;
    let (holder, token) = rest.split_once(", token ")?;
    Some(Run {
        scheduled: scheduled.to_string(),
        holder: holder.to_string(),
        token: token.parse().ok()?,
    })
}

/// Every completed run so far, in the order of their scheduled times.
async fn runs(client: &kube::Client, ns: &str) -> Vec<Run> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut runs = Vec::new();
    for pod in pods
        .list(&ListParams::default())
        .await
        .expect("list pods")
        .items
    {
        let done = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded");
        if !done {
            continue;
        }
        let text = pods
            .logs(&pod.name_any(), &LogParams::default())
            .await
            .unwrap_or_default();
        runs.extend(text.lines().filter_map(parse_run));
    }
    runs.sort_by(|a, b| a.scheduled.cmp(&b.scheduled));
    runs
}

/// Polls `find` until it finds something or `WAIT` passes.
async fn poll<T, F, Fut>(mut find: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if let Some(found) = find().await {
            return Some(found);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}

async fn wait_for_run(client: &kube::Client, ns: &str, accept: impl Fn(&Run) -> bool) -> Run {
    let found = poll(|| async { runs(client, ns).await.into_iter().find(|r| accept(r)) }).await;
    found.unwrap_or_else(|| {
        panic!(
            "no such run: {:?}",
            futures::executor::block_on(runs(client, ns))
        )
    })
}

/// The fence a Redis node holds for `lock` (none: it never voted for it), read straight from
/// the node once it answers (a node loading its append-only file answers LOADING).
async fn fence_on(addr: SocketAddr, password: &str, lock: &str) -> Option<u64> {
    key_on(addr, password, &format!("lockedjob:fence:{lock}")).await
}

/// `GET key` on a Redis node as the chart's user, once the node answers.
async fn key_on<T: redis::FromRedisValue + std::fmt::Debug>(
    addr: SocketAddr,
    password: &str,
    key: &str,
) -> Option<T> {
    let read = || -> Result<Option<T>, redis::RedisError> {
        let client = redis::Client::open(format!("redis://lockedjob:{password}@{addr}/"))?;
        let mut connection = client.get_connection_with_timeout(Duration::from_secs(2))?;
        redis::cmd("GET").arg(key).query(&mut connection)
    };
    let answer = poll(|| async { read().ok() }).await;
    answer.unwrap_or_else(|| panic!("{addr} never answered GET: {:?}", read()))
}

async fn pod_ip(
    pods: &Api<Pod>,
    name: &str,
    other_than: Option<&str>,
) -> (String, std::net::IpAddr) {
    let found = poll(|| async {
        pods.get_opt(name).await.ok().flatten().and_then(|p| {
            let uid = p.uid()?;
            let ip = p.status?.pod_ip?.parse().ok()?;
            (Some(uid.as_str()) != other_than).then_some((uid, ip))
        })
    })
    .await;
    found.unwrap_or_else(|| panic!("pod {name} did not come back with an address"))
}

async fn all_ready(client: &kube::Client, ns: &str) -> bool {
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let sets_ready = sets.list(&ListParams::default()).await.is_ok_and(|l| {
        l.items.len() == REDIS_NODES
            && l.items
                .iter()
                .all(|s| s.status.as_ref().and_then(|s| s.ready_replicas) == Some(1))
    });
    let operator_ready = deployments
        .get(&format!("{RELEASE}-lockedjob-operator"))
        .await
        .is_ok_and(|d| d.status.and_then(|s| s.ready_replicas) == Some(3));
    sets_ready && operator_ready
}

/// The README's plain-CronJob container, in a Job in the release's namespace: its image is the
/// operator's (it holds the binary), its command `lockedjob --version`.
/// `nodes_ns`: the namespace the Redis Services' names are completed with.
fn readme_exec_job(name: &str, ns: &str, nodes_ns: &str, image: &str) -> String {
    let readme = std::fs::read_to_string(repo("README.md")).expect("README");
    let marker = "<!-- tests/kubernetes/real_node_chart.rs runs the next block -->";
    let after = &readme[readme.find(marker).expect("the README's marker") + marker.len()..];
    let block = after
        .split("```yaml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the README's yaml block");
    let block = block
        .replace("registry.example.com/sweep-with-lockedjob:1.0", image)
        .replace("/app/sweep]", "/usr/local/bin/lockedjob, --version]")
        .replace(".lockedjob.svc", &format!(".{nodes_ns}.svc"));
    let containers: String = block.lines().map(|l| format!("      {l}\n")).collect();
    format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  backoffLimit: 0\n  template:\n    spec:\n      restartPolicy: Never\n{containers}"
    )
}

/// The README's exec Job with each Redis node named by its pod's own DNS name,
/// `<pod>.<headless Service>.<namespace>.svc`, instead of its ClusterIP Service.
fn exec_job_by_pod_names(name: &str, ns: &str, image: &str) -> String {
    let mut job = readme_exec_job(name, ns, ns, image);
    for i in 0..REDIS_NODES {
        let service = format!("{RELEASE}-lockedjob-operator-redis-{i}");
        let by_service = format!("//{service}.{ns}.svc:");
        assert!(job.contains(&by_service), "{by_service} in\n{job}");
        job = job.replace(
            &by_service,
            &format!("//{}.{service}-headless.{ns}.svc:", redis_pod(i)),
        );
    }
    job
}

/// Applies a Job and waits for its end: whether it succeeded, and its pod's output.
async fn run_job(
    cluster: &LocalCluster,
    client: &kube::Client,
    ns: &str,
    name: &str,
    job: &str,
) -> (Option<bool>, String) {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), job).expect("write the Job");
    tool(
        cluster,
        "kubectl",
        &["apply", "-f", &file.path().display().to_string()],
    );
    let outcome = poll(|| job_succeeded(client, ns, name)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod = pods
        .list(&ListParams::default().labels(&format!("job-name={name}")))
        .await
        .expect("list")
        .items
        .into_iter()
        .next()
        .map(|p| p.name_any())
        .unwrap_or_default();
    let output = pods
        .logs(&pod, &LogParams::default())
        .await
        .unwrap_or_default();
    (outcome, output)
}

async fn job_succeeded(client: &kube::Client, ns: &str, name: &str) -> Option<bool> {
    let job = Api::<Job>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .ok()?;
    let status = job.status?;
    if status.succeeded.unwrap_or(0) > 0 {
        Some(true)
    } else if status.failed.unwrap_or(0) > 0 {
        Some(false)
    } else {
        None
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn the_charts_defaults_run_on_a_real_node_in_a_restricted_namespace() {
    let _turn = crate::heavy();
    let cluster = &cluster().await;
    let client = cluster.client().await.expect("client");
    let ns = restricted_namespace(&client, "locks").await;
    let jobs_ns = restricted_namespace(&client, "demo").await;
    let delay = RESTART_DELAY_SECONDS.to_string();
    let chart = publish_chart(cluster);
    tool(
        cluster,
        "helm",
        &[
            "install",
            RELEASE,
            &chart,
            "--version",
            &chart_field("version"),
            "--plain-http",
            "--namespace",
            &ns,
            "--set",
            &format!("redis.restartDelaySeconds={delay}"),
            "--wait",
            "--timeout",
            "5m",
        ],
    );
    assert!(
        eventually(WAIT, || all_ready(&client, &ns)).await,
        "the release is not Ready"
    );
    for component in ["operator", "redis"] {
        let selector = format!("app.kubernetes.io/component={component}");
        assert!(
            pulled_from_the_registry(&client, &ns, &selector).await,
            "the {component} pods pulled their image from the cluster's registry"
        );
    }
    may_restart_its_lock_nodes_and_nothing_else(cluster, &ns);
    let redis_nodes: std::collections::BTreeSet<String> =
        Api::<Pod>::namespaced(client.clone(), &ns)
            .list(&ListParams::default().labels("app.kubernetes.io/component=redis"))
            .await
            .expect("list Redis pods")
            .items
            .into_iter()
            .filter_map(|p| p.spec.and_then(|s| s.node_name))
            .collect();
    assert_eq!(
        redis_nodes.len(),
        REDIS_NODES,
        "one Redis node per Kubernetes node: {redis_nodes:?}"
    );

    let image = chart_image();
    let job = readme_exec_job("readme-exec", &ns, &ns, &image);
    let (outcome, output) = run_job(cluster, &client, &ns, "readme-exec", &job).await;
    assert_eq!(
        outcome,
        Some(true),
        "the README's exec container:\n{job}\n{output}"
    );
    assert!(output.contains("lockedjob"), "{output}");
    // Each Redis pod also has its own DNS name, through the headless governing Service.
    let job = exec_job_by_pod_names("per-pod-exec", &ns, &image);
    let (outcome, output) = run_job(cluster, &client, &ns, "per-pod-exec", &job).await;
    assert_eq!(outcome, Some(true), "exec by pod names:\n{job}\n{output}");
    // Names that do not resolve are reported as such, not as a refused connection.
    let job = readme_exec_job("unresolved-exec", &ns, "no-such-namespace", &image);
    let (outcome, output) = run_job(cluster, &client, &ns, "unresolved-exec", &job).await;
    assert_eq!(outcome, Some(false), "{output}");
    assert!(output.contains("the host name did not resolve"), "{output}");

    tool(
        cluster,
        "kubectl",
        &[
            "apply",
            "-n",
            &jobs_ns,
            "-f",
            "examples/hello-every-10-seconds.yaml",
        ],
    );
    let first = wait_for_run(&client, &jobs_ns, |_| true).await;
    let lock = format!("{jobs_ns}/hello");

    let secret = Api::<Secret>::namespaced(client.clone(), &ns)
        .get(&format!("{RELEASE}-lockedjob-operator-redis-auth"))
        .await
        .expect("the chart's Redis password");
    let password =
        String::from_utf8(secret.data.expect("data")["password"].0.clone()).expect("utf-8");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut last = first.token;
    for i in 0..REDIS_NODES {
        let name = redis_pod(i);
        let (uid, ip) = pod_ip(&pods, &name, None).await;
        let fence = fence_on(SocketAddr::new(ip, 6379), &password, &lock).await;
        pods.delete(&name, &DeleteParams::default())
            .await
            .expect("delete a Redis pod");
        let (_, ip) = pod_ip(&pods, &name, Some(&uid)).await;
        let addr = SocketAddr::new(ip, 6379);
        // Out of service for the restart delay: nothing listens, so it grants no lock.
        let came_back = Instant::now();
        assert!(
            TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(),
            "{name} served at once, before its restart delay"
        );
        assert!(
            eventually(WAIT, || async {
                TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
            })
            .await,
            "{name} never served again"
        );
        assert!(came_back.elapsed() >= Duration::from_secs(RESTART_DELAY_SECONDS) / 2);
        // Its volume kept the fence (a node that had not voted yet holds none).
        let kept = fence_on(addr, &password, &lock).await;
        assert!(
            kept >= fence,
            "{name}: fence {fence:?} before, {kept:?} after"
        );
        assert!(
            eventually(WAIT, || all_ready(&client, &ns)).await,
            "not Ready after {name}"
        );
        last = wait_for_run(&client, &jobs_ns, |r| r.token > last)
            .await
            .token;
    }

    let lockedjobs: Api<LockedJob> = Api::namespaced(client.clone(), &jobs_ns);
    let holder = lockedjobs
        .get("hello")
        .await
        .expect("the LockedJob")
        .status
        .and_then(|s| s.last_run)
        .map(|r| r.holder)
        .expect("a holder");
    let holder_pod = holder.rsplit('/').next().expect("pod name").to_string();
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete(&holder_pod, &DeleteParams::default())
        .await
        .expect("delete the holder's operator pod");
    // A run by another replica (a failing wait panics with every run so far).
    wait_for_run(&client, &jobs_ns, |r| r.token > last && r.holder != holder).await;

    // Once per due time, and the token only grows with time.
    let all = runs(&client, &jobs_ns).await;
    for pair in all.windows(2) {
        assert!(
            pair[0].scheduled < pair[1].scheduled,
            "a due time ran twice: {pair:?}"
        );
        assert!(
            pair[0].token < pair[1].token,
            "token did not grow: {pair:?}"
        );
    }
    let jobs = Api::<Job>::namespaced(client.clone(), &jobs_ns)
        .list(&ListParams::default())
        .await
        .expect("jobs");
    assert!(jobs.items.len() >= all.len());

    let elect_ns = restricted_namespace(&client, "writer").await;
    the_example_leader_fails_over_when_its_sidecar_dies(cluster, &client, &ns, &elect_ns).await;
}

/// The pods of the leader-election example whose `lockedjob.dev/leader` condition is True.
async fn leading_pods(pods: &Api<Pod>) -> Vec<String> {
    let Ok(list) = pods.list(&ListParams::default().labels("app=writer")).await else {
        return Vec::new();
    };
    list.items
        .into_iter()
        .filter(|pod| {
            let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
            conditions.is_some_and(|c| {
                c.iter()
                    .any(|c| c.type_ == "lockedjob.dev/leader" && c.status == "True")
            })
        })
        .map(|pod| pod.name_any())
        .collect()
}

/// The leader-election example (examples/leader-election/deployment.yaml) on the real node,
/// with the chart's RBAC for it and the chart's Redis nodes: one of its two pods leads and is
/// Ready. Its sidecar is killed with SIGKILL; the kubelet reports the container terminated with
/// the lock value the sidecar wrote into its termination message, and the other pod takes over
/// without waiting for the 15 s TTL (docs/design.md, "Failover when Kubernetes confirms the
/// leader's end"): the kubelet's file, the restricted security context and the watch are all
/// real here.
async fn the_example_leader_fails_over_when_its_sidecar_dies(
    cluster: &LocalCluster,
    client: &kube::Client,
    nodes_ns: &str,
    ns: &str,
) {
    tool(
        cluster,
        "helm",
        &[
            "upgrade",
            RELEASE,
            "charts/lockedjob-operator",
            "--namespace",
            nodes_ns,
            "--reuse-values",
            "--set",
            &format!("leaderElection.namespaces={{{ns}}}"),
            "--wait",
            "--timeout",
            "5m",
        ],
    );
    let auth = Api::<Secret>::namespaced(client.clone(), nodes_ns)
        .get(&format!("{RELEASE}-lockedjob-operator-redis-auth"))
        .await
        .expect("the chart's Redis password");
    let copy: Secret = serde_json::from_value(json!({
        "metadata": {"name": "lockedjob-redis"},
        "data": auth.data.clone(),
    }))
    .expect("secret");
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &copy)
        .await
        .expect("the example's Secret");
    let example = std::fs::read_to_string(repo("examples/leader-election/deployment.yaml"))
        .expect("the example")
        .replace("namespace: demo", &format!("namespace: {ns}"))
        .replace(".lockedjob.svc", &format!(".{nodes_ns}.svc"));
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("leader.yaml");
    std::fs::write(&file, example).expect("write the example");
    tool(
        cluster,
        "kubectl",
        &["apply", "-f", file.to_str().expect("utf-8 path")],
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let leader = poll(|| async {
        let leading = leading_pods(&pods).await;
        (leading.len() == 1).then(|| leading[0].clone())
    })
    .await
    .expect("one of the example's pods leads");
    // The lock's value a majority of the chart's nodes hold: `{cluster}/{pod}/{random}`, new
    // each term (a node outside the holder's quorum may hold nothing, or an older value).
    let password =
        String::from_utf8(auth.data.expect("data")["password"].0.clone()).expect("utf-8");
    let mut nodes = Vec::new();
    for i in 0..REDIS_NODES {
        let (_, ip) = pod_ip(
            &Api::namespaced(client.clone(), nodes_ns),
            &redis_pod(i),
            None,
        )
        .await;
        nodes.push(SocketAddr::new(ip, 6379));
    }
    let key = "lockedjob:lock:demo-writer";
    let majority_value = || async {
        let mut values = Vec::new();
        for node in &nodes {
            values.push(key_on::<String>(*node, &password, key).await);
        }
        let values: Vec<String> = values.into_iter().flatten().collect();
        support::majority(&values, REDIS_NODES)
    };
    let held = poll(&majority_value)
        .await
        .expect("the leader's lock value");
    assert!(
        held.contains(&format!("/{leader}/")),
        "{held} is not {leader}'s"
    );

    let pid = support::sidecar_pid(&leader).expect("the leader's sidecar process");
    let killed_at = jiff::Timestamp::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill -9 the leader's sidecar");
    let killed = Instant::now();
    // The next term: the other pod, or the killed pod's restarted sidecar, holds the lock.
    let next: String = poll(|| async { majority_value().await.filter(|v| *v != held) })
        .await
        .expect("a next leader");
    let took = killed.elapsed();
    // Whoever deleted the dead leader's value says so (usually the next leader: it tries again
    // at once; the killed pod's restarted sidecar watches too).
    let mut logs = String::new();
    let names: Vec<String> = pods
        .list(&ListParams::default().labels("app=writer"))
        .await
        .expect("the example's pods")
        .items
        .iter()
        .map(|pod| pod.name_any())
        .collect();
    for pod in &names {
        let params = LogParams {
            container: Some("leader".into()),
            ..LogParams::default()
        };
        let log = pods.logs(pod, &params).await.unwrap_or_default();
        logs.push_str(&format!("--- {pod}\n{log}\n"));
    }
    assert!(
        logs.contains("its lock value deleted"),
        "the lock went to {next} after {took:?}, not through the kubelet's report:\n{logs}"
    );
    eprintln!("leader {leader}'s sidecar killed: {next} holds the lock after {took:?} (TTL 15 s)");
    next_leader_waited_for_the_dead_leaders_record(client, ns, (&leader, killed_at), &next, &logs)
        .await;
}

/// The killed sidecar's workload could act on its last record until that record expired, at
/// most the default `--record-validity` after the kill. The next leader writes its
/// Lease's acquireTime before its own record, so that time must come later. (When the killed
/// pod's restarted sidecar wins, the Lease keeps its first acquireTime: nothing to compare.)
async fn next_leader_waited_for_the_dead_leaders_record(
    client: &kube::Client,
    ns: &str,
    (leader, killed_at): (&str, jiff::Timestamp),
    next_value: &str,
    logs: &str,
) {
    let next_holder = next_value.rsplit_once('/').map_or(next_value, |(h, _)| h);
    if next_holder.ends_with(&format!("/{leader}")) {
        eprintln!("{leader}'s restarted sidecar leads again: no new acquireTime to compare");
        return;
    }
    let leases = Api::<Lease>::namespaced(client.clone(), ns);
    let acquired = poll(|| async {
        let spec = leases
            .get_opt(&lease_name("demo-writer"))
            .await
            .ok()??
            .spec?;
        (spec.holder_identity.as_deref() == Some(next_holder)).then_some(spec.acquire_time?.0)
    })
    .await
    .expect("the Lease names the next leader");
    let validity = jiff::SignedDuration::try_from(DEFAULT_RECORD_VALIDITY).expect("small");
    let record_expired = killed_at + validity;
    assert!(
        acquired >= record_expired,
        "{next_holder} led from {acquired}, before {leader}'s workload record expired ({record_expired} at the latest, {validity} after the kill at {killed_at}):\n{logs}"
    );
}

/// The last chart whose StatefulSets were governed by their ClusterIP Services (chart 0.1.0).
const PREVIOUS_CHART_COMMIT: &str = "34799b0fc2c6eca248eb05fdfd054a0417497a09";

/// The chart as it was at `commit`, from this repository's history, in `dir`.
fn chart_at(commit: &str, dir: &Path) -> std::path::PathBuf {
    let tar = dir.join("chart.tar");
    let archived = std::process::Command::new("git")
        .current_dir(repo(""))
        .args(["archive", "--format=tar", "-o"])
        .arg(&tar)
        .args([commit, "charts/lockedjob-operator"])
        .status()
        .expect("git archive");
    assert!(
        archived.success(),
        "git archive {commit}: the test needs the repository's history (not a shallow clone)"
    );
    let unpacked = std::process::Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(dir)
        .status()
        .expect("tar");
    assert!(unpacked.success(), "unpack the chart of {commit}");
    dir.join("charts/lockedjob-operator")
}

/// `helm install` or `helm upgrade` of `chart` as `RELEASE` in `ns`, waiting for it. Its
/// operators watch `ns` only: two installs that watch one namespace would both run its
/// LockedJobs, each under its own lock nodes (the other test's `hello` here).
fn helm_apply(cluster: &LocalCluster, verb: &str, chart: &Path, ns: &str) {
    let values =
        format!("redis.restartDelaySeconds={RESTART_DELAY_SECONDS},watchNamespaces={{{ns}}}");
    let chart = chart.to_str().expect("utf-8 path");
    let args = [verb, RELEASE, chart, "--namespace", ns, "--set", &values];
    let wait = ["--wait", "--timeout", "5m"];
    tool(cluster, "helm", &[&args[..], &wait[..]].concat());
}

/// The operator's rights for rolling the lock nodes (`kubectl auth can-i`, the real
/// authorizer): its own nodes' StatefulSets and pods, by name, nothing else.
fn may_restart_its_lock_nodes_and_nothing_else(cluster: &LocalCluster, ns: &str) {
    let sa = format!("system:serviceaccount:{ns}:{RELEASE}-lockedjob-operator");
    let set = format!("statefulset.apps/{RELEASE}-lockedjob-operator-redis-0");
    let pod = format!("pod/{}", redis_pod(0));
    let table: &[(&[&str], bool)] = &[
        (&["delete", &pod], true),
        (&["get", &set], true),
        (&["delete", "pod/some-other-pod"], false),
        (&["list", "pods"], false),
        (&["patch", &set], false),
        (&["delete", &set], false),
    ];
    for (args, expected) in table {
        let out = cluster
            .tool("kubectl")
            .args(["auth", "can-i", "-n", ns, "--as", &sa])
            .args(*args)
            .output()
            .expect("kubectl auth can-i");
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert_eq!(answer == "yes", *expected, "{sa} can-i {args:?}: {answer}");
    }
}

/// The release's StatefulSets (its Redis nodes: the only ones in `ns`).
async fn statefulsets(client: &kube::Client, ns: &str) -> Vec<StatefulSet> {
    Api::<StatefulSet>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("list StatefulSets")
        .items
}

/// Each Redis StatefulSet's update strategy.
async fn update_strategies(client: &kube::Client, ns: &str) -> Vec<String> {
    let sets = statefulsets(client, ns).await.into_iter();
    sets.map(|set| set.spec.update_strategy.and_then(|s| s.type_))
        .map(Option::unwrap_or_default)
        .collect()
}

/// Each Redis StatefulSet's governing Service, by StatefulSet name, and its uid.
async fn governing_services(client: &kube::Client, ns: &str) -> BTreeMap<String, (String, String)> {
    statefulsets(client, ns)
        .await
        .into_iter()
        .map(|set| {
            let governing = set.spec.service_name.clone().unwrap_or_default();
            (set.name_any(), (governing, set.uid().unwrap_or_default()))
        })
        .collect()
}

/// An install of the previous chart upgrades in place: a StatefulSet's `serviceName` cannot
/// change, so the upgrade keeps the ClusterIP Service as the governing one, adds the headless
/// Services beside, and the release keeps granting locks. Then the migration of docs/chart.md
/// ("Upgrading from chart 0.1.0"): the StatefulSets deleted with `--cascade=orphan`, the chart
/// upgraded again, each node restarted in turn; after it, every Redis pod answers at its own
/// DNS name. The release shares its name with the other test's, in another namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn an_install_of_the_previous_chart_upgrades_and_migrates_to_headless_services() {
    let _turn = crate::heavy();
    let cluster = &cluster().await;
    let client = cluster.client().await.expect("client");
    let ns = restricted_namespace(&client, "upgrade").await;
    let old = tempfile::tempdir().expect("dir");
    helm_apply(
        cluster,
        "install",
        &chart_at(PREVIOUS_CHART_COMMIT, old.path()),
        &ns,
    );
    let before = governing_services(&client, &ns).await;
    assert_eq!(before.len(), REDIS_NODES, "{before:?}");
    for (set, (governing, _)) in &before {
        assert_eq!(
            governing, set,
            "the previous chart governs by the ClusterIP Service"
        );
    }

    helm_apply(cluster, "upgrade", &repo("charts/lockedjob-operator"), &ns);
    assert_eq!(
        update_strategies(&client, &ns).await,
        vec!["RollingUpdate"; REDIS_NODES],
        "the upgrade kept each StatefulSet's update strategy (OnDelete would be refused)"
    );
    let after = governing_services(&client, &ns).await;
    assert_eq!(after, before, "the upgrade kept each StatefulSet as it was");
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    for set in before.keys() {
        let headless = services
            .get(&format!("{set}-headless"))
            .await
            .unwrap_or_else(|e| panic!("{set}-headless: {e}"));
        let cluster_ip = headless.spec.and_then(|s| s.cluster_ip);
        assert_eq!(cluster_ip.as_deref(), Some("None"), "{set}-headless");
    }
    assert!(
        eventually(WAIT, || all_ready(&client, &ns)).await,
        "the upgraded release is not Ready"
    );
    let image = chart_image();
    let job = readme_exec_job("after-upgrade", &ns, &ns, &image);
    let (outcome, output) = run_job(cluster, &client, &ns, "after-upgrade", &job).await;
    assert_eq!(outcome, Some(true), "exec after the upgrade:\n{output}");
    // Still governed by the ClusterIP Services: the pods have no names of their own yet.
    let job = exec_job_by_pod_names("by-pod-before-migration", &ns, &image);
    let (outcome, output) = run_job(cluster, &client, &ns, "by-pod-before-migration", &job).await;
    assert_eq!(outcome, Some(false), "{output}");
    assert!(output.contains("the host name did not resolve"), "{output}");

    migrate_to_headless_services(cluster, &client, &ns).await;
    let job = exec_job_by_pod_names("after-migration", &ns, &image);
    let (outcome, output) = run_job(cluster, &client, &ns, "after-migration", &job).await;
    assert_eq!(
        outcome,
        Some(true),
        "exec by pod names after the migration:\n{output}"
    );
}

/// The migration of docs/chart.md, command by command: the StatefulSets recreated around their pods,
/// then one `rollout restart` for all of them, which the operator carries out one node at a
/// time (the StatefulSets are `OnDelete`).
async fn migrate_to_headless_services(cluster: &LocalCluster, client: &kube::Client, ns: &str) {
    let selector =
        format!("app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=redis");
    let orphan = [
        "delete",
        "statefulset",
        "-n",
        ns,
        "-l",
        &selector,
        "--cascade=orphan",
    ];
    tool(cluster, "kubectl", &orphan);
    helm_apply(cluster, "upgrade", &repo("charts/lockedjob-operator"), ns);
    for (set, (governing, _)) in governing_services(client, ns).await {
        assert_eq!(governing, format!("{set}-headless"), "after the migration");
    }
    assert_eq!(
        update_strategies(client, ns).await,
        vec!["OnDelete"; REDIS_NODES],
        "the recreated StatefulSets are the operator's to roll"
    );
    let down = LockNodesDown::watch(client, ns);
    let restart = [
        "rollout",
        "restart",
        "statefulset",
        "-n",
        ns,
        "-l",
        &selector,
    ];
    tool(cluster, "kubectl", &restart);
    for field in ["updatedReplicas", "readyReplicas"] {
        let condition = format!("--for=jsonpath={{.status.{field}}}=1");
        let wait = ["wait", "statefulset", "-n", ns, "-l", &selector, &condition];
        tool(
            cluster,
            "kubectl",
            &[&wait[..], &["--timeout=10m"]].concat(),
        );
    }
    down.assert_one_at_a_time("the migration's restart").await;
}

/// Samples, while a roll runs, how many lock nodes are out of service at once (no pod, or a
/// pod not Ready), and which pods (by uid) were seen, to tell that a roll took place.
struct LockNodesDown {
    task: tokio::task::JoinHandle<(usize, usize)>,
    stop: tokio::sync::oneshot::Sender<()>,
    started: Instant,
}

impl LockNodesDown {
    fn watch(client: &kube::Client, ns: &str) -> Self {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let (mut most_down, mut uids) = (0, std::collections::BTreeSet::new());
            while stopped.try_recv().is_err() {
                let listed = pods
                    .list(&ListParams::default().labels("app.kubernetes.io/component=redis"))
                    .await;
                if let Ok(list) = listed {
                    let ready = list.items.iter().filter(|p| pod_ready(p)).count();
                    most_down = most_down.max(REDIS_NODES.saturating_sub(ready));
                    uids.extend(list.items.iter().filter_map(|p| p.uid()));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            (most_down, uids.len())
        });
        Self {
            task,
            stop,
            started: Instant::now(),
        }
    }

    /// Every node was restarted (a new pod each) and never two were out at once.
    async fn assert_one_at_a_time(self, what: &str) {
        let _ = self.stop.send(());
        let (most_down, pods_seen) = self.task.await.expect("the sampler");
        println!(
            "{what}: {pods_seen} lock node pods seen in {:.0?}, at most {most_down} out of service at once",
            self.started.elapsed()
        );
        assert!(
            pods_seen >= 2 * REDIS_NODES,
            "{what}: not every lock node was restarted ({pods_seen} pods seen)"
        );
        assert_eq!(most_down, 1, "{what}: lock nodes out of service at once");
    }
}

fn pod_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
