//! `lockedjob elect --sidecar` against the real API server of the local control plane and real
//! Redis nodes: the pod condition, label and mirror Lease follow the leader, a dead leader's
//! marks are cleared by its successor, and a missing right is named.
//!
//! The pods are created with a scheduling gate, so no node runs them and only the sidecars
//! (local processes here) write their conditions; that the kubelet then turns the
//! `readinessGate` into the pod's Ready condition is the kubelet's part, not exercised here.

use testsupport as support;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use lockedjob::elect::{lease_name, DEFAULT_RECORD_VALIDITY, LEADER_CONDITION, LEADER_LABEL};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::http_get as get;
use support::kubernetes::{
    apply_chart_rbac, client_for, create_namespace, delete_namespace, eventually, local_cluster,
};
use support::{lockedjob_bin, NodeChecks, Persistence, Reap, RedisNodes, SetChecks};
use tokio_util::task::AbortOnDropHandle;

/// A kubeconfig that acts as ServiceAccount `account` of `namespace` (a token from the API).
fn kubeconfig_of(
    local: &localcluster::LocalCluster,
    namespace: &str,
    account: &str,
    dir: &Path,
) -> std::path::PathBuf {
    let token = local
        .tool("kubectl")
        .args(["create", "token", account, "-n", namespace])
        .output()
        .expect("kubectl create token");
    assert!(
        token.status.success(),
        "{}",
        String::from_utf8_lossy(&token.stderr)
    );
    let token = String::from_utf8_lossy(&token.stdout).trim().to_string();
    let path = dir.join(format!("kubeconfig-{account}"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: {account}\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: {account}\ncurrent-context: c\n",
            server = local.server(),
            ca = local.ca_cert().display(),
        ),
    )
    .expect("kubeconfig");
    path
}

/// A sidecar with `extra` arguments (the TTL among them).
fn sidecar_with(
    urls: &[String],
    kubeconfig: &Path,
    namespace: &str,
    pod: &str,
    port: u16,
    log: &Path,
    extra: &[&str],
) -> Child {
    Command::new(lockedjob_bin())
        .args(["elect", "writer", "--sidecar"])
        .args(["--leader-addr", &format!("127.0.0.1:{port}")])
        .args(["--redis", &urls.join(",")])
        .args([
            "--cluster-id",
            "ci",
            "--runner-name",
            pod,
            "--pod-namespace",
            namespace,
        ])
        .args(["--retry-interval", "200ms"])
        .args(extra)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info,kube=warn")
        .env_remove("LOCKEDJOB_REDIS_URLS")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .expect("spawn lockedjob elect --sidecar")
}

/// A pod no node will run: only the sidecars write its status. Waits for the namespace's
/// `default` ServiceAccount first, which the controller manager creates after the namespace
/// (admission refuses pods until it exists).
async fn gated_pod(pods: &Api<Pod>, name: &str) {
    gated_pod_with(pods, name, json!([])).await
}

/// A gated pod with `init_containers` in its spec (the native sidecar whose status a test
/// writes as the kubelet would).
async fn gated_pod_with(pods: &Api<Pod>, name: &str, init_containers: serde_json::Value) {
    let namespace = pods.namespace().expect("a namespaced API").to_string();
    let accounts: Api<ServiceAccount> = Api::namespaced(pods.clone().into_client(), &namespace);
    assert!(
        eventually(Duration::from_secs(30), || async {
            accounts.get_opt("default").await.ok().flatten().is_some()
        })
        .await,
        "no default ServiceAccount in {namespace}"
    );
    let pod = json!({
        "metadata": {"name": name, "labels": {"app": "writer"}},
        "spec": support::kubernetes::restricted(json!({
            "schedulingGates": [{"name": "lockedjob.dev/test"}],
            "readinessGates": [{"conditionType": LEADER_CONDITION}],
            "initContainers": init_containers,
            "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sleep", "1000"]}],
        })),
    });
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).expect("pod"),
    )
    .await
    .unwrap_or_else(|e| panic!("create pod {name}: {e}"));
}

/// (condition status, has the leader label) of a pod.
async fn marks(pods: &Api<Pod>, name: &str) -> (Option<String>, bool) {
    let Ok(pod) = pods.get(name).await else {
        return (None, false);
    };
    let condition = pod
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == LEADER_CONDITION)
        .map(|c| c.status);
    let labelled = pod
        .metadata
        .labels
        .is_some_and(|l| l.get(LEADER_LABEL).map(String::as_str) == Some("true"));
    (condition, labelled)
}

/// Waits until the mirror Lease names `holder` after `transitions` transitions.
async fn wait_for_lease(
    leases: &Api<Lease>,
    holder: &str,
    transitions: i32,
    logs: &dyn Fn() -> String,
) {
    let expected = Some((holder.to_string(), transitions));
    assert!(
        eventually(Duration::from_secs(20), || async {
            lease_holder(leases).await == expected
        })
        .await,
        "the Lease: {:?}\n{}",
        lease_holder(leases).await,
        logs()
    );
}

async fn lease_holder(leases: &Api<Lease>) -> Option<(String, i32)> {
    let spec = leases.get(&lease_name("writer")).await.ok()?.spec?;
    Some((spec.holder_identity?, spec.lease_transitions.unwrap_or(0)))
}

fn leading() -> (Option<String>, bool) {
    (Some("True".into()), true)
}

fn not_leading() -> (Option<String>, bool) {
    (Some("False".into()), false)
}

/// Two candidates' pods in a namespace of their own, three Redis nodes, and the chart's RBAC
/// for the sidecars, which act as its ServiceAccount with its Role and nothing more.
struct Election {
    client: kube::Client,
    namespace: String,
    pods: Api<Pod>,
    nodes: RedisNodes,
    kubeconfig: std::path::PathBuf,
    dir: tempfile::TempDir,
}

const CANDIDATES: [&str; 2] = ["writer-a", "writer-b"];

impl Election {
    async fn new(prefix: &str, init_containers: serde_json::Value) -> Self {
        let local = &local_cluster("east").await;
        let client = client_for(&local.kubeconfig()).await;
        let namespace = create_namespace(&client, prefix).await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        for pod in CANDIDATES {
            gated_pod_with(&pods, pod, init_containers.clone()).await;
        }
        let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
        let dir = tempfile::tempdir().expect("dir");
        apply_chart_rbac(local, &namespace, dir.path());
        let kubeconfig = kubeconfig_of(local, &namespace, "lockedjob-elect", dir.path());
        Self {
            client,
            namespace,
            pods,
            nodes,
            kubeconfig,
            dir,
        }
    }

    fn log(&self, pod: &str) -> std::path::PathBuf {
        self.dir.path().join(format!("{pod}.log"))
    }

    /// Both sidecars' logs, for a failure's message.
    fn logs(&self) -> String {
        CANDIDATES
            .map(|pod| {
                let log = std::fs::read_to_string(self.log(pod)).unwrap_or_default();
                format!("--- {pod}\n{log}")
            })
            .join("\n")
    }

    /// When the mirror Lease says `pod` took the lock (its sidecar writes the Lease before its
    /// first record, and after its pod's marks, so a test that saw the marks may be a moment
    /// early); fails unless the Lease names `pod` within seconds.
    async fn lease_acquired_by(&self, pod: &str) -> jiff::Timestamp {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let spec = || async {
            let lease = leases.get(&lease_name("writer")).await.expect("the Lease");
            lease.spec.expect("a Lease spec")
        };
        let names_pod = eventually(Duration::from_secs(10), || async {
            spec()
                .await
                .holder_identity
                .is_some_and(|h| h.contains(pod))
        })
        .await;
        let spec = spec().await;
        let holder = spec.holder_identity.unwrap_or_default();
        assert!(names_pod, "the Lease names {holder}, not {pod}");
        spec.acquire_time.expect("acquireTime").0
    }

    /// Starts writer-a's sidecar, then writer-b's, each with the arguments `extra(pod)`, and
    /// waits until a leads and b does not.
    async fn start_a_then_b(&self, extra: impl Fn(&str) -> Vec<String>) -> Reap {
        let mut reap = Reap(Vec::new());
        for pod in CANDIDATES {
            let args = extra(pod);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            reap.0.push(self.sidecar(pod, support::free_port(), &args));
            let shown = if pod == "writer-a" {
                leading()
            } else {
                not_leading()
            };
            assert!(
                eventually(Duration::from_secs(20), || async {
                    marks(&self.pods, pod).await == shown
                })
                .await,
                "{pod} never showed {shown:?}:\n{}",
                self.logs()
            );
        }
        reap
    }

    fn sidecar(&self, pod: &str, port: u16, extra: &[&str]) -> Child {
        let urls = self.nodes.urls();
        sidecar_with(
            &urls,
            &self.kubeconfig,
            &self.namespace,
            pod,
            port,
            &self.log(pod),
            extra,
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn the_pod_condition_label_and_lease_follow_the_leader() {
    let _turn = crate::beside();
    let election = Election::new("elect", json!([])).await;
    let (pods, nodes, client) = (&election.pods, &election.nodes, &election.client);
    let leases: Api<Lease> = Api::namespaced(client.clone(), &election.namespace);
    let logs = || election.logs();

    let (port_a, port_b) = (support::free_port(), support::free_port());
    let start = |pod: &str, port| election.sidecar(pod, port, &["--ttl", "3s"]);
    let mut reap = Reap(Vec::new());
    reap.0.push(start("writer-a", port_a));
    assert!(
        eventually(Duration::from_secs(20), || async {
            marks(pods, "writer-a").await == leading()
        })
        .await,
        "a never showed it leads:\n{}",
        logs()
    );
    reap.0.push(start("writer-b", port_b));
    assert!(
        eventually(Duration::from_secs(20), || async {
            marks(pods, "writer-b").await == not_leading()
        })
        .await,
        "b never showed it does not lead:\n{}",
        logs()
    );
    assert_eq!(marks(pods, "writer-a").await, leading());
    // The Lease is written after the pod's marks.
    wait_for_lease(&leases, "ci/writer-a", 0, &logs).await;
    // The workload's view: /leader answers only on the leader, with its token.
    let (status, body) = get(port_a, "/leader");
    assert_eq!(status, 200, "{body}");
    let record: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        (&record["holder"], &record["token"]),
        (&"ci/writer-a".into(), &1.into())
    );
    assert_eq!(get(port_b, "/leader").0, 503);
    let (_, metrics) = get(port_a, "/metrics");
    assert!(
        metrics.contains("lockedjob_leader 1") && metrics.contains("lockedjob_leader_token 1"),
        "{metrics}"
    );
    assert!(metrics.trim_end().ends_with("# EOF"), "{metrics}");

    // a's sidecar dies without stepping down: b leads after the TTL and clears a's marks.
    kill(Pid::from_raw(reap.0[0].id() as i32), Signal::SIGKILL).expect("kill -9 a");
    let _ = reap.0[0].wait();
    assert!(
        eventually(Duration::from_secs(20), || async {
            marks(pods, "writer-b").await == leading()
                && marks(pods, "writer-a").await == not_leading()
        })
        .await,
        "b did not take over cleanly: a {:?}, b {:?}\n{}",
        marks(pods, "writer-a").await,
        marks(pods, "writer-b").await,
        logs()
    );
    // The Lease is written after the pod's marks.
    wait_for_lease(&leases, "ci/writer-b", 1, &logs).await;
    assert_eq!(get(port_b, "/leader").0, 200);

    // A graceful stop: marks off, lock released at once.
    kill(Pid::from_raw(reap.0[1].id() as i32), Signal::SIGTERM).expect("SIGTERM b");
    let status = reap.0[1].wait().expect("b exits");
    assert_eq!(status.code(), Some(0), "{}", logs());
    assert_eq!(marks(pods, "writer-b").await, not_leading());
    assert_eq!(
        nodes.count_key("lockedjob:lock:writer"),
        0,
        "leadership released"
    );
    delete_namespace(client, &election.namespace).await;
}

/// The native sidecar's status as the kubelet writes it: restarted once, its last instance
/// terminated with `last_message`, its current one `state`.
fn sidecar_status(state: serde_json::Value, last_message: &str) -> serde_json::Value {
    json!({"status": {"initContainerStatuses": [{
        "name": "leader", "image": "lockedjob:test", "imageID": "", "ready": true,
        "restartCount": 1, "started": true, "state": state,
        "lastState": {"terminated": {"exitCode": 137, "reason": "Error", "message": last_message}},
    }]}})
}

/// Docs/design.md, "Failover when Kubernetes confirms the leader's end": once the pod's status
/// shows the leader's sidecar terminated with the lock value it wrote into its termination
/// message, the standby deletes that value and leads at once, long before the 30 s TTL. While
/// the status shows the leader's container running, a value of an older instance in its last
/// state frees nothing. (The test writes the status as the kubelet would; the pods are gated.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn a_leader_reported_terminated_by_the_kubelet_is_replaced_before_its_ttl() {
    let _turn = crate::beside();
    use kube::api::{Patch, PatchParams};
    let sidecar_spec =
        json!([{"name": "leader", "image": "lockedjob:test", "restartPolicy": "Always"}]);
    let election = Election::new("elect-ended", sidecar_spec).await;
    let (pods, nodes, client) = (&election.pods, &election.nodes, &election.client);
    let dir = election.dir.path();
    let log = |pod: &str| election.log(pod);
    let logs = || election.logs();
    // The kubelet makes each container instance an empty termination message file.
    let message_file = |pod: &str| dir.join(format!("{pod}.termination-log"));
    // Each pod's workload reads its own token file (an emptyDir of its pod).
    let token_file = |pod: &str| dir.join(format!("{pod}.leader.json"));
    for pod in CANDIDATES {
        std::fs::write(message_file(pod), "").expect("termination-log");
    }
    let mut reap = election
        .start_a_then_b(|pod| {
            let file = message_file(pod).display().to_string();
            let record = token_file(pod).display().to_string();
            let flags = ["--ttl", "30s", "--termination-message-path", &file];
            let mut args: Vec<String> = flags.iter().map(|a| a.to_string()).collect();
            args.extend(["--token-file".to_string(), record]);
            args
        })
        .await;
    let held = std::fs::read_to_string(message_file("writer-a")).expect("a's message");
    let value = serde_json::from_str::<serde_json::Value>(&held).expect("JSON")["value"]
        .as_str()
        .expect("a lock value")
        .to_string();
    let lock_key = "lockedjob:lock:writer";
    let stored = || nodes.nodes[0].get(lock_key);
    assert_eq!(stored(), Some(value.clone()), "a's value is the lock's");

    // a runs; its last instance (an older value) terminated: nothing may be freed.
    let older = json!({"lock": "writer", "value": "ci/writer-a/an-older-instance"}).to_string();
    let running = sidecar_status(
        json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}}),
        &older,
    );
    pods.patch_status("writer-a", &PatchParams::default(), &Patch::Merge(running))
        .await
        .expect("a's status: running");
    // b's watch sees it within moments; b attempts every 200 ms meanwhile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        stored(),
        Some(value.clone()),
        "a live leader lost its lock:\n{}",
        logs()
    );
    assert_eq!(marks(pods, "writer-b").await, not_leading());

    // a's sidecar dies; the kubelet reports it terminated with what its file held.
    kill(Pid::from_raw(reap.0[0].id() as i32), Signal::SIGKILL).expect("kill -9 a");
    let _ = reap.0[0].wait();
    let terminated = json!({"terminated": {"exitCode": 137, "reason": "Error", "message": held}});
    pods.patch_status(
        "writer-a",
        &PatchParams::default(),
        &Patch::Merge(sidecar_status(terminated, &older)),
    )
    .await
    .expect("a's status: terminated");
    // Well within the TTL: without the shortcut b waits for a's 30 s lease to run out.
    assert!(
        eventually(Duration::from_secs(10), || async {
            marks(pods, "writer-b").await == leading()
        })
        .await,
        "b did not take over before a's TTL:\n{}",
        logs()
    );
    assert!(
        std::fs::read_to_string(log("writer-b"))
            .unwrap_or_default()
            .contains("its lock value deleted"),
        "{}",
        logs()
    );
    let b_value = stored().expect("b holds the lock");
    assert_ne!(b_value, value);
    // a's workload could act until the last record its sidecar wrote expired (the file stays
    // when the sidecar is killed). b writes its Lease's acquireTime before its first record,
    // so its workload was told it leads only after that.
    let text = std::fs::read_to_string(token_file("writer-a")).expect("a's token file");
    let record: serde_json::Value = serde_json::from_str(&text).expect("a JSON record");
    let a_until: jiff::Timestamp = record["validUntil"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .expect("validUntil");
    let b_acquired = election.lease_acquired_by("writer-b").await;
    assert!(
        a_until <= b_acquired,
        "b led from {b_acquired} while a's workload could still act until {a_until}:\n{}",
        logs()
    );
    delete_namespace(client, &election.namespace).await;
}

/// A leader whose pod is being deleted steps down at once (token file gone, marks off) and
/// releases the lock once its workload's last record has expired, without waiting for the
/// kubelet to stop the pod (which no node does here: a finalizer holds the deleted pod); it
/// campaigns no more and exits on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn a_leader_whose_pod_is_deleted_hands_over_once_its_record_has_expired() {
    let _turn = crate::beside();
    use kube::api::{DeleteParams, Patch, PatchParams};
    let election = Election::new("elect-deleted", json!([])).await;
    let (pods, nodes) = (&election.pods, &election.nodes);
    let dir = election.dir.path();
    let logs = || election.logs();
    let hold = json!({"metadata": {"finalizers": ["lockedjob.dev/test-hold"]}});
    pods.patch("writer-a", &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .expect("a finalizer on a's pod");
    let token_file = |pod: &str| dir.join(format!("{pod}.leader.json"));
    let mut reap = election
        .start_a_then_b(|pod| {
            let record = token_file(pod).display().to_string();
            ["--ttl", "30s", "--token-file", &record]
                .map(String::from)
                .to_vec()
        })
        .await;
    let deleted_at = jiff::Timestamp::now();
    pods.delete("writer-a", &DeleteParams::default())
        .await
        .expect("delete a's pod");
    // Well within the 30 s TTL, and without a kubelet.
    assert!(
        eventually(Duration::from_secs(10), || async {
            marks(pods, "writer-b").await == leading()
        })
        .await,
        "b did not take over from a deleted pod before a's TTL:\n{}",
        logs()
    );
    assert!(
        !token_file("writer-a").exists(),
        "a's record outlived its leadership"
    );
    // a refreshed its record every quarter of its validity until it saw the deletion, so its
    // workload could act until at least three quarters of that after the delete call; b may
    // lead only after that.
    let acquired = election.lease_acquired_by("writer-b").await;
    let three_quarters = DEFAULT_RECORD_VALIDITY * 3 / 4;
    let earliest = deleted_at + jiff::SignedDuration::try_from(three_quarters).expect("small");
    assert!(
        acquired >= earliest,
        "b led from {acquired}, before a's record could have expired ({earliest}):\n{}",
        logs()
    );
    assert!(
        matches!(reap.0[0].try_wait(), Ok(None)),
        "a's sidecar must wait for SIGTERM, not exit or campaign:\n{}",
        logs()
    );
    assert_eq!(
        nodes.nodes[0]
            .get("lockedjob:lock:writer")
            .map(|v| v.contains("writer-b")),
        Some(true)
    );
    kill(Pid::from_raw(reap.0[0].id() as i32), Signal::SIGTERM).expect("SIGTERM a");
    let status = reap.0[0].wait().expect("a exits");
    assert_eq!(status.code(), Some(0), "{}", logs());
    let release = json!({"metadata": {"finalizers": null}});
    let _ = pods
        .patch("writer-a", &PatchParams::default(), &Patch::Merge(&release))
        .await;
    delete_namespace(&election.client, &election.namespace).await;
}

/// The README's example Deployment (native sidecar, readiness gate, Service) is accepted by the
/// real API server as written, in a namespace of the test's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn the_example_leader_deployment_is_accepted_by_the_api_server() {
    let _turn = crate::beside();
    let local = &local_cluster("east").await;
    let client = client_for(&local.kubeconfig()).await;
    let namespace = create_namespace(&client, "elect-example").await;
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/leader-election/deployment.yaml"
    ))
    .expect("the example");
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("deployment.yaml");
    std::fs::write(
        &file,
        example.replace("namespace: demo", &format!("namespace: {namespace}")),
    )
    .expect("write");
    let out = local
        .tool("kubectl")
        .args(["apply", "--dry-run=server", "-f"])
        .arg(&file)
        .output()
        .expect("kubectl apply");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    delete_namespace(&client, &namespace).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn a_sidecar_without_the_right_to_patch_its_pod_status_says_which_right() {
    let _turn = crate::beside();
    let local = &local_cluster("east").await;
    let client = client_for(&local.kubeconfig()).await;
    let namespace = create_namespace(&client, "elect-rbac").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    gated_pod(&pods, "writer-a").await;
    // A ServiceAccount that may patch pods but not pods/status.
    let params = PostParams::default();
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "sidecar"}})).expect("sa");
    Api::<ServiceAccount>::namespaced(client.clone(), &namespace)
        .create(&params, &account)
        .await
        .expect("create the ServiceAccount");
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "sidecar"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "patch"]}],
    }))
    .expect("role");
    Api::<Role>::namespaced(client.clone(), &namespace)
        .create(&params, &role)
        .await
        .expect("create the Role");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "sidecar"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "sidecar"},
        "subjects": [{"kind": "ServiceAccount", "name": "sidecar", "namespace": namespace}],
    }))
    .expect("binding");
    Api::<RoleBinding>::namespaced(client.clone(), &namespace)
        .create(&params, &binding)
        .await
        .expect("create the RoleBinding");
    let dir = tempfile::tempdir().expect("dir");
    let kubeconfig = kubeconfig_of(local, &namespace, "sidecar", dir.path());
    let nodes = RedisNodes::start(1, Persistence::None).expect("start redis-server");
    let out = Command::new(lockedjob_bin())
        .args([
            "elect",
            "writer",
            "--sidecar",
            "--redis",
            &nodes.urls().join(","),
        ])
        .args(["--runner-name", "writer-a", "--pod-namespace", &namespace])
        .args([
            "--leader-addr",
            &format!("127.0.0.1:{}", support::free_port()),
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("LOCKEDJOB_REDIS_URLS")
        .output()
        .expect("run lockedjob elect --sidecar");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("cannot patch pods/status in namespace") && stderr.contains("forbidden"),
        "{stderr}"
    );
    assert_eq!(
        nodes.count_key("lockedjob:lock:writer"),
        0,
        "it never campaigned"
    );
    delete_namespace(&client, &namespace).await;
}

/// (status, reason) of the leader condition, each time it changed.
type ConditionChanges = Arc<Mutex<Vec<(String, String)>>>;

/// The leader condition's (status, reason) each time it changes on `pod`, as a watch sees it.
fn condition_changes(pods: &Api<Pod>, pod: &str) -> (ConditionChanges, AbortOnDropHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (record, pods) = (Arc::clone(&seen), pods.clone());
    let config = watcher::Config::default().fields(&format!("metadata.name={pod}"));
    let task = tokio::spawn(async move {
        let mut events = watcher(pods, config).applied_objects().boxed();
        while let Some(Ok(pod)) = events.next().await {
            let conditions = pod.status.and_then(|s| s.conditions).unwrap_or_default();
            let Some(c) = conditions.into_iter().find(|c| c.type_ == LEADER_CONDITION) else {
                continue;
            };
            let now = (c.status, c.reason.unwrap_or_default());
            let mut all = record.lock().expect("changes");
            if all.last() != Some(&now) {
                all.push(now);
            }
        }
    });
    (seen, AbortOnDropHandle::new(task))
}

/// Renewals failing (two of three Redis nodes paused): the leader's pod stops being Ready
/// (reason `RenewalFailing`) while it still holds the lease, before it steps down at the
/// give-up point, so a Service in its cluster stops routing to it before a candidate in
/// another cluster can take the lock. Fails on a sidecar that marks its pod only at the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn a_leader_whose_renewals_fail_stops_being_ready_before_it_steps_down() {
    let _turn = crate::beside();
    let mut election = Election::new("elect-fading", json!([])).await;
    let mut reap = Reap(Vec::new());
    reap.0
        .push(election.sidecar("writer-a", support::free_port(), &["--ttl", "3s"]));
    assert!(
        eventually(Duration::from_secs(20), || async {
            marks(&election.pods, "writer-a").await == leading()
        })
        .await,
        "a never showed it leads:\n{}",
        election.logs()
    );
    let (changes, _watch) = condition_changes(&election.pods, "writer-a");
    for node in &mut election.nodes.nodes[..2] {
        node.pause().expect("SIGSTOP a Redis node");
    }
    let stepped_down = eventually(Duration::from_secs(10), || async {
        let changes = changes.lock().expect("changes");
        changes.iter().any(|(_, reason)| reason == "SteppedDown")
    })
    .await;
    for node in &mut election.nodes.nodes[..2] {
        node.resume().expect("SIGCONT a Redis node");
    }
    let changes = changes.lock().expect("changes").clone();
    assert!(
        stepped_down,
        "never stepped down: {changes:?}\n{}",
        election.logs()
    );
    let reasons: Vec<&str> = changes.iter().map(|(_, r)| r.as_str()).collect();
    let failing = reasons.iter().position(|r| *r == "RenewalFailing");
    let down = reasons.iter().position(|r| *r == "SteppedDown");
    assert!(
        failing.is_some() && failing < down,
        "unready (RenewalFailing) before the step-down: {changes:?}\n{}",
        election.logs()
    );
    let failing_status = &changes[failing.unwrap_or_default()].0;
    assert_eq!(failing_status, "False", "{changes:?}");
    delete_namespace(&election.client, &election.namespace).await;
}

/// A new leader waits for the Services as well as the pods: while an EndpointSlice still lists
/// the dead leader's pod as ready (the EndpointSlice controller follows a pod's Ready condition
/// a moment later), the successor holds the lock but does not mark its pod; once no slice
/// does, it does. Fails on a sidecar that looks only at the pods' Ready condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
async fn a_new_leader_is_marked_only_once_no_service_routes_to_the_old_one() {
    let _turn = crate::beside();
    let election = Election::new("elect-routed", json!([])).await;
    let mut reap = election
        .start_a_then_b(|_| vec!["--ttl".into(), "3s".into()])
        .await;
    let slices: Api<EndpointSlice> = Api::namespaced(election.client.clone(), &election.namespace);
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "writer-stale", "labels": {"kubernetes.io/service-name": "writer"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true},
            "targetRef": {"kind": "Pod", "name": "writer-a", "namespace": election.namespace}}],
    }))
    .expect("slice");
    slices
        .create(&PostParams::default(), &slice)
        .await
        .expect("an EndpointSlice listing writer-a");

    kill(Pid::from_raw(reap.0[0].id() as i32), Signal::SIGKILL).expect("kill -9 a");
    let _ = reap.0[0].wait();
    let b_waits = eventually(Duration::from_secs(20), || async {
        let log = std::fs::read_to_string(election.log("writer-b")).unwrap_or_default();
        log.contains("EndpointSlice still lists")
    })
    .await;
    assert!(
        b_waits,
        "b never waited for the slice:\n{}",
        election.logs()
    );
    assert_eq!(
        marks(&election.pods, "writer-b").await,
        not_leading(),
        "b marked while a slice routes to a:\n{}",
        election.logs()
    );
    slices
        .delete("writer-stale", &Default::default())
        .await
        .expect("delete the slice");
    assert!(
        eventually(Duration::from_secs(20), || async {
            marks(&election.pods, "writer-b").await == leading()
        })
        .await,
        "b never marked its pod once no slice routed to a:\n{}",
        election.logs()
    );
    delete_namespace(&election.client, &election.namespace).await;
}
