//! The Helm chart installed for real: `helm install` into the local control plane (real
//! kube-apiserver with RBAC, controller manager, scheduler) with a real node (kubelet,
//! containerd, runc), the operator running as the chart's own Deployment pods with in-cluster
//! configuration, the chart's args, env, probes and security context — against real
//! `redis-server` nodes on loopback, which the pods reach through a proxy per node on the
//! host's end of the node's link (`LockNodes`). The README's install block is run as written.
//!
//! The tests run one at a time: a release that watches every namespace would otherwise also
//! run the LockedJobs of the test beside it.

use crate::e2e;
use testsupport as support;

use e2e::{check, wait_for_holder, Cluster, Journal};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use localcluster::{LocalCluster, Options, Shared};
use lockedjob::api::LockedJob;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use support::kubernetes::{create_namespace, delete_namespace, eventually};
use support::{FaultProxy, Persistence, RedisNodes};

const CHART: &str = "charts/lockedjob-operator";
const LOCAL_VALUES: &str = "charts/lockedjob-operator/ci/local-values.yaml";
const README_MARKER: &str = "<!-- tests/kubernetes/helm.rs runs the next block -->";

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The local cluster of this test process, with a real node; the chart's image is the
/// `lockedjob` binary cargo built for the tests.
async fn helm_cluster() -> Shared {
    tokio::task::spawn_blocking(|| {
        localcluster::shared_with("helm", || Options {
            images: BTreeMap::from([(support::chart_image(), support::lockedjob_image())]),
            ..Options::named("helm")
        })
    })
    .await
    .expect("join the cluster start")
    .unwrap_or_else(|e| panic!("start the local cluster: {e}"))
}

/// helm and kubectl (built with the control plane), on one cluster, from the repository root,
/// with helm's own state in a directory of the test's.
struct Tools {
    cluster: Shared,
}

impl Tools {
    fn new(cluster: Shared) -> Self {
        Self { cluster }
    }

    /// helm or kubectl as `LocalCluster::tool` sets them up; any other program (the shell
    /// that runs the README's block) with the same environment and those two on PATH.
    fn command(&self, program: &str) -> Command {
        let bin = self.cluster.bin_dir();
        let mut command = if bin.join(program).is_file() {
            self.cluster.tool(program)
        } else {
            let mut shell = Command::new(program);
            for (key, value) in self.cluster.tool("kubectl").get_envs() {
                if let Some(value) = value {
                    shell.env(key, value);
                }
            }
            shell
        };
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        command.current_dir(repo(".")).env("PATH", path);
        command
    }

    /// Runs `program args`; (succeeded, stdout + stderr).
    fn try_run(&self, program: &str, args: &[&str]) -> (bool, String) {
        let out = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run {program}: {e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    fn run(&self, program: &str, args: &[&str]) -> String {
        let (ok, text) = self.try_run(program, args);
        assert!(ok, "{program} {}:\n{text}", args.join(" "));
        text
    }

    /// `kubectl auth can-i` as the release's ServiceAccount.
    fn can(&self, service_account: &str, args: &[&str]) -> bool {
        let mut all = vec!["auth", "can-i"];
        all.extend_from_slice(args);
        all.push("--as");
        all.push(service_account);
        let out = self
            .command("kubectl")
            .args(&all)
            .output()
            .expect("run kubectl auth can-i");
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            answer == "yes" || answer == "no",
            "kubectl auth can-i {args:?}: {answer} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        answer == "yes"
    }

    /// Waits for the Deployment's rollout (pods Ready by their readiness probe).
    fn rollout(&self, namespace: &str, deployment: &str) {
        self.run(
            "kubectl",
            &[
                "rollout",
                "status",
                &format!("deployment/{deployment}"),
                "-n",
                namespace,
                "--timeout=240s",
            ],
        );
    }
}

/// The test's Redis nodes (on loopback) and, for each, a proxy on the host's end of the real
/// node's link: the chart's pods run in the node's network namespace, where 127.0.0.1 is
/// their own.
struct LockNodes {
    nodes: RedisNodes,
    proxies: Vec<FaultProxy>,
}

impl LockNodes {
    fn start(local: &LocalCluster, nodes: RedisNodes) -> Self {
        let proxies = nodes
            .nodes
            .iter()
            .map(|node| FaultProxy::start_on(local.host_ip().into(), &node.addr()))
            .collect::<Result<Vec<_>, _>>()
            .expect("proxies on the host's link");
        Self { nodes, proxies }
    }

    /// The URLs the chart's pods use, as `redis.external` takes them (JSON): each node's own
    /// scheme, at its proxy's address.
    fn external(&self) -> String {
        let urls: Vec<String> = (self.nodes.urls().iter())
            .zip(&self.proxies)
            .map(|(url, proxy)| {
                let scheme = url.split_once("://").map_or("redis", |(s, _)| s);
                format!("{scheme}://{}", proxy.addr())
            })
            .collect();
        serde_json::to_string(&urls).expect("json")
    }
}

/// Uninstalls the release when the test ends, passed or not, so no operator outlives it.
struct Release<'a> {
    tools: &'a Tools,
    name: String,
    namespace: String,
}

impl<'a> Release<'a> {
    /// `helm install NAME charts/lockedjob-operator -n NAMESPACE -f ci/local-values.yaml` with
    /// `nodes` as the external lock nodes and `extra` arguments.
    fn install(
        tools: &'a Tools,
        name: &str,
        namespace: &str,
        nodes: &LockNodes,
        extra: &[&str],
    ) -> Self {
        let release = Self {
            tools,
            name: name.into(),
            namespace: namespace.into(),
        };
        let external = format!("redis.external={}", nodes.external());
        let mut args = vec![
            "install",
            name,
            CHART,
            "-n",
            namespace,
            "-f",
            LOCAL_VALUES,
            "--set-json",
            &external,
        ];
        args.extend_from_slice(extra);
        tools.run("helm", &args);
        release
    }
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let _ = self.tools.try_run(
            "helm",
            &[
                "uninstall",
                &self.name,
                "-n",
                &self.namespace,
                "--wait",
                "--timeout",
                "90s",
            ],
        );
    }
}

/// `fullname` in the chart's helpers, for a release whose name does not contain the chart's.
fn fullname(release: &str) -> String {
    format!("{release}-lockedjob-operator")
}

fn service_account(namespace: &str, release: &str) -> String {
    format!("system:serviceaccount:{namespace}:{}", fullname(release))
}

fn require_password(nodes: &LockNodes, password: &str) {
    for node in &nodes.nodes.nodes {
        let _: () = node
            .command(&["CONFIG", "SET", "requirepass", password])
            .unwrap_or_else(|e| panic!("set the password of {}: {e}", node.url()));
    }
}

/// The README block after the marker, as written.
fn readme_install_block() -> String {
    let readme = std::fs::read_to_string(repo("README.md")).expect("README.md");
    let after = readme
        .split_once(README_MARKER)
        .map(|(_, rest)| rest)
        .expect("the README marks its install block");
    let body = after
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("\n```"))
        .map(|(body, _)| body)
        .expect("a sh block after the marker");
    body.to_string()
}

async fn holder_pods(pods: &Api<Pod>, release: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(&format!(
        "app.kubernetes.io/instance={release},app.kubernetes.io/component=operator"
    )))
    .await
    .map(|l| l.items)
    .unwrap_or_default()
}

/// The README's install block on a fresh cluster; then, through the chart's 3 replicas: a run
/// each due time and never two, and the holder's pod deleted mid-run hands the run over
/// without a second Job for that time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn readme_install_runs_each_due_time_once_across_the_chart_replicas() {
    let _turn = crate::beside();
    let _serial = ONE_AT_A_TIME.lock().await;
    let local = &helm_cluster().await;
    let tools = Tools::new(local.clone());
    let nodes = RedisNodes::start(3, Persistence::AppendFsyncAlways).expect("redis nodes");
    let nodes = LockNodes::start(local, nodes);
    let password = format!("pw-{:016x}", rand::random::<u64>());
    require_password(&nodes, &password);
    let _release = Release {
        tools: &tools,
        name: "locks".into(),
        namespace: "lockedjob".into(),
    };

    let block = readme_install_block();
    let out = tools
        .command("bash")
        .args(["-euo", "pipefail", "-c", &block])
        .env("LOCK_NODES", nodes.external())
        .env("LOCK_NODES_PASSWORD", &password)
        .output()
        .expect("run the README block");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(
        out.status.success(),
        "the README's install block:\n{block}\n---\n{text}"
    );
    assert!(
        text.contains("hello"),
        "kubectl get lj lists the example: {text}"
    );

    let cluster = Cluster::local("helm").await;
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), "lockedjob");
    let deployment = deployments
        .get(&fullname("locks"))
        .await
        .expect("the chart's Deployment");
    let ready = deployment.status.and_then(|s| s.ready_replicas);
    assert_eq!(ready, Some(3), "3 replicas Ready after helm install --wait");

    // Each due time once across the 3 replicas, tokens growing.
    let api: Api<LockedJob> = cluster.api();
    let journal = Journal::new(vec![cluster.api()]);
    api.create(
        &PostParams::default(),
        &cluster.journaled("every-two", &cluster.every(2), "local", None, 0.5),
    )
    .await
    .expect("create");
    let enough = journal
        .wait_for(Duration::from_secs(120), |runs| runs.len() >= 6)
        .await;
    let runs = journal.runs().await;
    check(&runs).unwrap_or_else(|e| panic!("{e}"));
    assert!(enough, "6 runs within 2 minutes, got {}", runs.len());
    api.delete("every-two", &DeleteParams::default())
        .await
        .expect("delete");

    // The holder's pod deleted mid-run: it hands the run over (SIGTERM), another replica
    // adopts the Job, and no scheduled time runs twice.
    api.create(
        &PostParams::default(),
        &cluster.journaled("handover", &cluster.every(4), "local", None, 3.0),
    )
    .await
    .expect("create");
    let holder = wait_for_holder(&api, "handover", Duration::from_secs(60)).await;
    let in_flight = api
        .get("handover")
        .await
        .ok()
        .and_then(|l| l.status?.last_run)
        .map(|r| r.scheduled_time.0.to_string())
        .expect("the holder's run");
    let pod = holder
        .strip_prefix("local/")
        .unwrap_or_else(|| panic!("holder {holder} is local/<pod>"))
        .to_string();
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "lockedjob");
    assert!(
        holder_pods(&pods, "locks")
            .await
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some(pod.as_str())),
        "the holder {holder} is one of the chart's pods"
    );
    pods.delete(&pod, &DeleteParams::default())
        .await
        .expect("delete the holder's pod");
    let handed_over = journal
        .wait_for(Duration::from_secs(90), |runs| {
            runs.iter()
                .filter(|r| r.lock.ends_with("/handover"))
                .count()
                >= 4
        })
        .await;
    let runs = journal.runs().await;
    check(&runs).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        handed_over,
        "runs went on after the holder's pod was deleted"
    );
    let finished: Vec<_> = runs
        .iter()
        .filter(|r| r.lock.ends_with("/handover") && r.scheduled == in_flight)
        .collect();
    assert_eq!(
        finished.len(),
        1,
        "the run in flight when its holder's pod was deleted ({in_flight}) finished once: {runs:?}"
    );
    let jobs: Api<Job> = cluster.api();
    let jobs = jobs.list(&ListParams::default()).await.expect("jobs").items;
    let mut times: Vec<String> = jobs
        .iter()
        .filter(|j| {
            j.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("handover-"))
        })
        .filter_map(|j| {
            j.metadata
                .annotations
                .as_ref()?
                .get(lockedjob::api::ANNOTATION_SCHEDULED_TIME)
                .cloned()
        })
        .collect();
    let count = times.len();
    times.sort();
    times.dedup();
    assert_eq!(times.len(), count, "one Job per scheduled time: {times:?}");
    let holders: std::collections::BTreeSet<String> = api
        .get("handover")
        .await
        .ok()
        .and_then(|l| l.status?.last_run.map(|r| r.holder))
        .into_iter()
        .collect();
    assert!(
        !holders.contains(&holder),
        "the deleted pod {holder} no longer holds the runs"
    );

    let kube = Api::<k8s_openapi::api::core::v1::Namespace>::all(cluster.client.clone());
    for namespace in ["team-a"] {
        let _ = kube.delete(namespace, &DeleteParams::background()).await;
    }
}

/// `watchNamespaces`: a Role and RoleBinding in each listed namespace and nothing
/// cluster-wide; the operator runs the LockedJobs there and cannot see other namespaces. What
/// the ServiceAccount may do, asked of the real authorizer. The monitoring objects (behind their
/// CRDs from prometheus-operator's module) are accepted by the API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn watch_namespaces_confine_the_operator_to_least_privilege() {
    let _turn = crate::beside();
    let _serial = ONE_AT_A_TIME.lock().await;
    let local = &helm_cluster().await;
    let tools = Tools::new(local.clone());
    let watched = Cluster::local("helm").await;
    let unwatched = Cluster::local("helm").await;
    let home = create_namespace(&watched.client, "locks").await;
    let nodes = RedisNodes::start(3, Persistence::AppendFsyncAlways).expect("redis nodes");
    let nodes = LockNodes::start(local, nodes);

    let crds = monitoring_crds();
    tools.run(
        "kubectl",
        &["apply", "--server-side", "-f", &crds.display().to_string()],
    );
    tools.run(
        "kubectl",
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
        ],
    );

    let watch = format!(
        "watchNamespaces={}",
        serde_json::to_string(&[&watched.namespace]).expect("json")
    );
    let release = Release::install(
        &tools,
        "confined",
        &home,
        &nodes,
        &[
            "--set",
            "redis.auth.enabled=false",
            "--set-json",
            &watch,
            "--set",
            "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true",
            "--wait",
            "--timeout",
            "5m",
        ],
    );
    for kind in ["servicemonitor", "prometheusrule", "role", "rolebinding"] {
        // RBAC objects carry the release's namespace in their names (rbac.yaml says why).
        let (namespace, name) = if kind.starts_with("role") {
            (
                &watched.namespace,
                format!("{home}-{}", fullname(&release.name)),
            )
        } else {
            (&home, fullname(&release.name))
        };
        tools.run("kubectl", &["get", kind, &name, "-n", namespace]);
    }
    let (_, cluster_roles) = tools.try_run(
        "kubectl",
        &[
            "get",
            "clusterrole",
            "-l",
            "app.kubernetes.io/instance=confined",
            "-o",
            "name",
        ],
    );
    assert!(
        cluster_roles.trim().is_empty(),
        "nothing cluster-wide: {cluster_roles}"
    );

    // What the ServiceAccount can and cannot do.
    let sa = service_account(&home, &release.name);
    let w = watched.namespace.as_str();
    let u = unwatched.namespace.as_str();
    let table: &[(&[&str], bool)] = &[
        (&["watch", "lockedjobs.lockedjob.dev", "-n", w], true),
        (&["patch", "lockedjobs.lockedjob.dev/status", "-n", w], true),
        (
            &["update", "lockedjobs.lockedjob.dev/finalizers", "-n", w],
            true,
        ),
        (&["create", "jobs.batch", "-n", w], true),
        (&["delete", "jobs.batch", "-n", w], true),
        (&["create", "events.events.k8s.io", "-n", w], true),
        (&["get", "secrets", "-n", w], false),
        (&["get", "secrets", "-n", &home], false),
        (&["deletecollection", "pods", "-n", w], true),
        (&["create", "pods", "-n", w], false),
        (&["delete", "pods", "-n", w], false),
        (&["deletecollection", "pods", "-n", u], false),
        (&["delete", "lockedjobs.lockedjob.dev", "-n", w], false),
        (&["list", "lockedjobs.lockedjob.dev", "-n", u], false),
        (&["create", "jobs.batch", "-n", u], false),
        (
            &["list", "lockedjobs.lockedjob.dev", "--all-namespaces"],
            false,
        ),
        (&["list", "nodes"], false),
    ];
    for (args, expected) in table {
        let allowed = tools.can(&sa, args);
        println!(
            "can-i {:<50} {}",
            args.join(" "),
            if allowed { "yes" } else { "no" }
        );
        assert_eq!(allowed, *expected, "{sa} can-i {args:?}");
    }

    // It runs the LockedJobs it watches, and never sees the others.
    let journal = Journal::new(vec![watched.api(), unwatched.api()]);
    for c in [&watched, &unwatched] {
        c.api::<LockedJob>()
            .create(
                &PostParams::default(),
                &c.journaled("confined", &c.every(2), "local", None, 0.2),
            )
            .await
            .expect("create");
    }
    let ran = journal
        .wait_for(Duration::from_secs(90), |runs| runs.len() >= 3)
        .await;
    let runs = journal.runs().await;
    check(&runs).unwrap_or_else(|e| panic!("{e}"));
    assert!(ran, "the watched namespace's LockedJob runs");
    assert!(
        runs.iter().all(|r| r.lock.starts_with(&format!("{w}/"))),
        "only the watched namespace ran: {runs:?}"
    );
    let outside = unwatched
        .api::<LockedJob>()
        .get("confined")
        .await
        .expect("get");
    assert!(
        outside.status.is_none() && outside.metadata.finalizers.is_none(),
        "the operator left the unwatched LockedJob alone: {outside:?}"
    );
    drop(release);
    delete_namespace(&watched.client, &home).await;
}

/// The chart's own password Secret survives `helm upgrade` (the operator keeps reaching its
/// nodes) and `helm uninstall` (kept by its resource policy, as values.yaml says).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn upgrade_keeps_the_chart_made_password_and_uninstall_keeps_the_secret() {
    let _turn = crate::beside();
    let _serial = ONE_AT_A_TIME.lock().await;
    let local = &helm_cluster().await;
    let tools = Tools::new(local.clone());
    let cluster = Cluster::local("helm").await;
    let home = cluster.namespace.clone();
    let nodes = RedisNodes::start(3, Persistence::AppendFsyncAlways).expect("redis nodes");
    let nodes = LockNodes::start(local, nodes);
    let watch = format!("watchNamespaces=[\"{home}\"]");
    let release = Release::install(
        &tools,
        "upgraded",
        &home,
        &nodes,
        &["--set", "redis.auth.existingSecret=", "--set-json", &watch],
    );
    let deployment = fullname(&release.name);
    let secret_name = format!("{deployment}-redis-auth");
    let secrets: Api<Secret> = cluster.api();
    let password = || async {
        let secret = secrets.get(&secret_name).await.ok()?;
        let bytes = secret.data?.get("password")?.0.clone();
        String::from_utf8(bytes).ok()
    };
    let first = password()
        .await
        .expect("the chart created the password Secret");
    assert!(first.len() >= 32, "a long random password");
    // The nodes learn it, as an operator of external nodes would configure them.
    require_password(&nodes, &first);
    tools.rollout(&home, &deployment);

    tools.run(
        "helm",
        &[
            "upgrade",
            &release.name,
            CHART,
            "-n",
            &home,
            "--reuse-values",
            "--set",
            "logLevel=debug",
            "--wait",
            "--timeout",
            "5m",
        ],
    );
    assert_eq!(password().await.as_deref(), Some(first.as_str()), "kept");
    let deployments: Api<Deployment> = cluster.api();
    let upgraded = deployments.get(&deployment).await.expect("deployment");
    let env = upgraded
        .spec
        .template
        .spec
        .map(|s| s.containers[0].env.clone().unwrap_or_default())
        .unwrap_or_default();
    assert!(
        env.iter()
            .any(|e| e.name == "RUST_LOG" && e.value.as_deref() == Some("debug")),
        "the upgrade changed the pods' log level"
    );
    assert_eq!(
        upgraded.status.and_then(|s| s.ready_replicas),
        Some(3),
        "the upgraded replicas are Ready: they reach the nodes with the same password"
    );

    drop(release);
    assert!(
        eventually(Duration::from_secs(60), || async {
            deployments
                .get_opt(&deployment)
                .await
                .ok()
                .flatten()
                .is_none()
        })
        .await,
        "helm uninstall removed the Deployment"
    );
    assert_eq!(
        password().await.as_deref(),
        Some(first.as_str()),
        "helm uninstall keeps the password Secret"
    );
}

/// Mutual TLS and the least-privilege user of docs/security.md, both from Secrets: the chart's replicas
/// verify the nodes with the CA Secret, show the client certificate from theirs, log in as the
/// ACL user, become Ready (a quorum answers them) and run each due time once; no node denied
/// anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn mutual_tls_and_the_acl_user_from_secrets() {
    let _turn = crate::beside();
    use support::pki::{TestCa, Validity};
    let _serial = ONE_AT_A_TIME.lock().await;
    let local = &helm_cluster().await;
    let tools = Tools::new(local.clone());
    let cluster = Cluster::local("helm").await;
    let home = cluster.namespace.clone();

    let ca = TestCa::new("lock-nodes");
    // The pods reach the nodes at the host's link address, the test at 127.0.0.1.
    let link = local.host_ip().to_string();
    let server = ca.server("lock-node", &["127.0.0.1", &link], Validity::Current);
    let client = ca.client("lockedjob-operator");
    let tls = support::NodeTls {
        cert_file: server.cert.clone(),
        key_file: server.key.clone(),
        ca_file: ca.ca_file.clone(),
        require_client_cert: true,
        client: Some((client.cert.clone(), client.key.clone())),
        host: "127.0.0.1".into(),
    };
    let nodes = RedisNodes::start_tls(3, Persistence::AppendFsyncAlways, &tls).expect("nodes");
    let nodes = LockNodes::start(local, nodes);
    let password = format!("pw-{:016x}", rand::random::<u64>());
    support::create_acl_user(&nodes.nodes, &support::readme_acl_setuser(&password));
    // The default user keeps what the test's own checks use and nothing the engine needs: a
    // replica that logged in as it would be denied, not quietly let in.
    for node in &nodes.nodes.nodes {
        node.command::<()>(&[
            "ACL",
            "SETUSER",
            "default",
            "resetkeys",
            "resetchannels",
            "-@all",
            "+ping",
            "+acl",
        ])
        .expect("restrict the default user");
    }

    let secrets: Api<Secret> = cluster.api();
    let file = |path: &Path| std::fs::read_to_string(path).expect("read a PEM file");
    for (name, data) in [
        (
            "lock-nodes-acl",
            vec![
                ("username", "lockedjob".to_string()),
                ("password", password.clone()),
            ],
        ),
        ("lock-nodes-tls", vec![("ca.crt", file(&ca.ca_file))]),
        (
            "lockedjob-client",
            vec![
                ("tls.crt", file(&client.cert)),
                ("tls.key", file(&client.key)),
            ],
        ),
    ] {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            string_data: Some(data.into_iter().map(|(k, v)| (k.to_string(), v)).collect()),
            ..Default::default()
        };
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("create a Secret");
    }

    let watch = format!("watchNamespaces=[\"{home}\"]");
    let release = Release::install(
        &tools,
        "secured",
        &home,
        &nodes,
        &[
            "--set-json",
            &watch,
            "--set",
            "redis.auth.existingSecret=lock-nodes-acl,redis.auth.usernameKey=username",
            "--set",
            "redis.tls.enabled=true,redis.tls.existingSecret=lock-nodes-tls,redis.tls.clientSecret=lockedjob-client",
        ],
    );
    tools.rollout(&home, &fullname(&release.name));

    let api: Api<LockedJob> = cluster.api();
    let journal = Journal::new(vec![cluster.api()]);
    api.create(
        &PostParams::default(),
        &cluster.journaled("over-tls", &cluster.every(2), "local", None, 0.5),
    )
    .await
    .expect("create");
    let enough = journal
        .wait_for(Duration::from_secs(120), |runs| runs.len() >= 3)
        .await;
    let runs = journal.runs().await;
    check(&runs).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        enough,
        "3 runs over mutual TLS within 2 minutes, got {}",
        runs.len()
    );
    assert_eq!(
        support::acl_denials(&nodes.nodes),
        Vec::<String>::new(),
        "the operator needed no right beyond docs/security.md's"
    );
    api.delete("over-tls", &DeleteParams::default())
        .await
        .expect("delete");
}

/// The ServiceMonitor and PrometheusRule CRDs (scripts/monitoring-crds.sh fetches them from
/// the Go module proxy; `$LOCKEDJOB_MONITORING_CRDS` names the directory).
fn monitoring_crds() -> PathBuf {
    if let Some(dir) = std::env::var_os("LOCKEDJOB_MONITORING_CRDS") {
        return PathBuf::from(dir);
    }
    let out = Command::new("bash")
        .arg(repo("scripts/monitoring-crds.sh"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run scripts/monitoring-crds.sh");
    assert!(out.status.success(), "scripts/monitoring-crds.sh failed");
    PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .expect("the script prints the directory")
            .trim(),
    )
}
