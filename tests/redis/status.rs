//! `lockedjob status` as users run it, against real Redis nodes while `lockedjob exec` holds the
//! lock.

use testsupport as support;

use serde_json::Value;
use std::process::{Output, Stdio};
use std::time::Duration;
use support::{lockedjob, text, wait_until, Persistence, RedisNodes, SetChecks};

fn status(urls: &str, extra: &[&str]) -> Output {
    lockedjob(&["status", "nightly", "--redis", urls])
        .args(extra)
        .output()
        .expect("run lockedjob status")
}

#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
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
