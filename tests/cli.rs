//! The inspection commands as users run them: `lockedjob status` against real Redis nodes
//! while `lockedjob exec` holds the lock, `lockedjob next` on expressions and on a LockedJob in
//! the local control plane, and the shell completion scripts checked by the shells.

mod support;

use kube::api::{Api, PostParams};
use lockedjob::api::LockedJob;
use serde_json::{json, Value};
use std::process::{Command, Output, Stdio};
use std::time::Duration;
use support::{lockedjob_bin, wait_until, Persistence, RedisNodes, SetChecks};

fn lockedjob(args: &[&str]) -> Command {
    let mut cmd = Command::new(lockedjob_bin());
    cmd.args(args)
        .env_remove("LOCKEDJOB_REDIS_URLS")
        .env("RUST_LOG", "warn");
    cmd
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn status(urls: &str, extra: &[&str]) -> Output {
    lockedjob(&["status", "nightly", "--redis", urls])
        .args(extra)
        .output()
        .expect("run lockedjob status")
}

#[test]
fn status_shows_the_holder_token_and_each_node_and_says_when_a_quorum_is_missing() {
    let mut nodes = RedisNodes::start(3, Persistence::None).expect("redis nodes");
    let urls = nodes.urls().join(",");

    let free = status(&urls, &[]);
    assert_eq!(free.status.code(), Some(0), "{}", text(&free));
    assert!(
        text(&free).starts_with("lock nightly: free, last token -"),
        "{}",
        text(&free)
    );

    let mut holder = lockedjob(&["exec", "--redis", &urls, "--lock", "nightly"])
        .args(["--cluster-id", "ci", "--runner-name", "runner-a", "--"])
        .args(["sleep", "30"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn exec");
    assert!(
        wait_until(Duration::from_secs(10), || nodes
            .count_key("lockedjob:lock:nightly")
            == 3),
        "exec took the lock"
    );
    let held = status(&urls, &[]);
    let table = text(&held);
    assert_eq!(held.status.code(), Some(0), "{table}");
    assert!(
        table.starts_with("lock nightly: held by ci/runner-a on 3 of 3 nodes (quorum 2), token 1"),
        "{table}"
    );
    assert_eq!(
        table.lines().filter(|l| l.contains("ci/runner-a")).count(),
        4,
        "the summary and one row per node name the holder:\n{table}"
    );

    let json_out = status(&urls, &["-o", "json"]);
    let view: Value = serde_json::from_slice(&json_out.stdout).expect("status -o json is JSON");
    assert_eq!(view["holder"], "ci/runner-a");
    assert_eq!(view["token"], 1);
    assert_eq!(view["quorum"], 2);
    let ttl = view["nodes"][0]["ttl_ms"].as_u64().expect("a TTL");
    assert!(ttl > 0 && ttl <= 30_000, "{view}");

    // One node stops answering: still a quorum, and its row says so.
    nodes.nodes[2].pause().expect("SIGSTOP");
    let degraded = status(&urls, &[]);
    let table = text(&degraded);
    nodes.nodes[2].resume().expect("SIGCONT");
    assert_eq!(degraded.status.code(), Some(0), "{table}");
    assert!(table.contains("on 2 of 3 nodes"), "{table}");
    assert!(table.contains("(no answer:"), "{table}");

    // Two of three down: no quorum, exit 69.
    let _ = holder.kill();
    let _ = holder.wait();
    for node in &mut nodes.nodes[1..] {
        node.pause().expect("SIGSTOP");
    }
    let lost = status(&urls, &[]);
    for node in &mut nodes.nodes[1..] {
        node.resume().expect("SIGCONT");
    }
    assert_eq!(lost.status.code(), Some(69), "{}", text(&lost));
    assert!(
        text(&lost).starts_with("lock nightly: unknown, only 1 of 3 nodes answer (quorum 2)"),
        "{}",
        text(&lost)
    );

    let usage = lockedjob(&["status", "", "--redis", &urls])
        .output()
        .expect("run");
    assert_eq!(usage.status.code(), Some(64), "{}", text(&usage));
}

#[test]
fn next_prints_the_coming_times_and_rejects_bad_expressions_clearly() {
    let out = lockedjob(&["next", "*/20 * * * *", "-n", "3"])
        .args(["--after", "2026-01-01T10:05:00Z"])
        .output()
        .expect("run next");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "2026-01-01T10:20:00Z\n2026-01-01T10:40:00Z\n2026-01-01T11:00:00Z\n"
    );
    let zoned = lockedjob(&["next", "0 9 * * *", "--time-zone", "America/New_York"])
        .args(["-n", "1", "--after", "2026-07-01T00:00:00Z"])
        .output()
        .expect("run next");
    assert_eq!(
        String::from_utf8_lossy(&zoned.stdout),
        "2026-07-01T09:00:00-04:00 EDT  (2026-07-01T13:00:00Z)\n"
    );
    for (args, named) in [
        (vec!["next", "61 * * * *"], "not a valid cron expression"),
        (
            vec!["next", "0 9 * * *", "--time-zone", "Mars/Olympus"],
            "unknown time zone",
        ),
    ] {
        let out = lockedjob(&args).output().expect("run next");
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(named), "{args:?}: {}", text(&out));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_reads_a_lockedjobs_schedule_and_zone_from_the_cluster() {
    let cluster = support::kubernetes::local_cluster("cli").await;
    let client = support::kubernetes::client_for(&cluster.kubeconfig()).await;
    support::kubernetes::install_lockedjob_crd(&client, "cli")
        .await
        .expect("CRD");
    let namespace = support::kubernetes::create_namespace(&client, "cli").await;
    let lj: LockedJob = serde_json::from_value(json!({
        "apiVersion": "lockedjob.dev/v1alpha1", "kind": "LockedJob",
        "metadata": {"name": "report"},
        "spec": {"schedule": "30 6 * * 1", "timeZone": "Europe/Berlin",
            "jobTemplate": {"spec": {"template": {"spec": support::kubernetes::restricted(json!({"restartPolicy": "Never",
                "containers": [{"name": "main", "image": "busybox"}]}))}}}}
    }))
    .expect("LockedJob");
    Api::<LockedJob>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &lj)
        .await
        .expect("create");
    let kubeconfig = cluster.kubeconfig();
    let next = |name: &str| {
        lockedjob(&["next", name, "--namespace", &namespace, "-n", "2"])
            .args(["--after", "2026-12-03T00:00:00Z"])
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .expect("run next")
    };
    let out = next("report");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "2026-12-07T06:30:00+01:00 CET  (2026-12-07T05:30:00Z)\n\
         2026-12-14T06:30:00+01:00 CET  (2026-12-14T05:30:00Z)\n"
    );
    let missing = next("no-such-job");
    assert_eq!(missing.status.code(), Some(64), "{}", text(&missing));
    assert!(
        text(&missing).contains("no LockedJob \"no-such-job\""),
        "{}",
        text(&missing)
    );
    support::kubernetes::delete_namespace(&client, &namespace).await;
}

/// Each script is accepted by its shell (bash and zsh parse it without running; fish is not
/// installed here, so its script is only checked for its completions).
#[test]
fn completion_scripts_parse_in_their_shells() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (shell, check) in [("bash", Some("bash")), ("zsh", Some("zsh")), ("fish", None)] {
        let out = lockedjob(&["completions", shell]).output().expect("run");
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", text(&out));
        let script = String::from_utf8_lossy(&out.stdout).into_owned();
        for subcommand in ["exec", "operator", "status", "next", "completions"] {
            assert!(
                script.contains(subcommand),
                "{shell} script lacks {subcommand}"
            );
        }
        let Some(program) = check else { continue };
        let available = Command::new("sh")
            .args(["-c", &format!("command -v {program}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !available {
            eprintln!("{program} is not installed: its script is not parsed");
            continue;
        }
        let path = dir.path().join(format!("lockedjob.{shell}"));
        std::fs::write(&path, &script).expect("write script");
        let parsed = Command::new(program)
            .arg("-n")
            .arg(&path)
            .output()
            .expect("run the shell");
        assert!(parsed.status.success(), "{shell}: {}", text(&parsed));
    }
    let bad = lockedjob(&["completions", "cmd.exe"])
        .output()
        .expect("run");
    assert_eq!(bad.status.code(), Some(64), "{}", text(&bad));
}

#[test]
fn operator_refuses_a_lock_node_that_is_not_namespace_slash_statefulset() {
    let bad = lockedjob(&[
        "operator",
        "--redis",
        "redis://127.0.0.1:1",
        "--roll-lock-nodes",
        "lockedjob/locks-redis-0,locks-redis-1",
    ])
    .output()
    .expect("run lockedjob operator");
    let said = text(&bad);
    assert_eq!(bad.status.code(), Some(64), "{said}");
    assert!(
        said.contains("--roll-lock-nodes")
            && said.contains("\"locks-redis-1\" is not NAMESPACE/STATEFULSET"),
        "{said}"
    );
}
