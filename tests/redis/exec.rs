//! `lockedjob exec` as users run it: the real binary against real Redis nodes.

use testsupport as support;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::{alive, lockedjob_bin, wait_until, Persistence, RedisNodes, SetChecks};

const LOCK_KEY: &str = "lockedjob:lock:nightly";

fn exec_cmd(urls: &[String], extra: &[&str], command: &[&str]) -> Command {
    let mut cmd = Command::new(lockedjob_bin());
    cmd.arg("exec")
        .arg("--redis")
        .arg(urls.join(","))
        .args([
            "--lock",
            "nightly",
            "--cluster-id",
            "ci",
            "--runner-name",
            "runner",
        ])
        .args(extra)
        .arg("--")
        .args(command)
        .env_remove("LOCKEDJOB_REDIS_URLS")
        .env("RUST_LOG", "warn");
    cmd
}

fn run(urls: &[String], extra: &[&str], command: &[&str]) -> Output {
    exec_cmd(urls, extra, command)
        .output()
        .expect("run lockedjob exec")
}

fn spawn(urls: &[String], extra: &[&str], command: &[&str]) -> Child {
    exec_cmd(urls, extra, command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lockedjob exec")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn runs_the_command_with_the_lock_in_its_environment_and_passes_its_exit_code() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let out = run(
        &nodes.urls(),
        &[],
        &[
            "sh",
            "-c",
            "echo \"$LOCKEDJOB_FENCING_TOKEN|$LOCKEDJOB_LOCK_NAME|$LOCKEDJOB_HOLDER\"; exit 3",
        ],
    );
    assert_eq!(out.status.code(), Some(3), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "1|nightly|ci/runner");
    assert_eq!(
        nodes.count_key(LOCK_KEY),
        0,
        "lock released after the command"
    );

    let again = run(
        &nodes.urls(),
        &[],
        &["sh", "-c", "echo $LOCKEDJOB_FENCING_TOKEN"],
    );
    assert_eq!(again.status.code(), Some(0));
    assert_eq!(text(&again.stdout).trim(), "2", "the token grows");
}

#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn a_second_exec_fails_fast_without_wait_and_runs_after_the_first_with_wait() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let urls = nodes.urls();
    let first = spawn(
        &urls,
        &[],
        &["sh", "-c", "echo $LOCKEDJOB_FENCING_TOKEN; sleep 2"],
    );
    assert!(wait_until(Duration::from_secs(10), || nodes
        .count_key(LOCK_KEY)
        == 3));

    let refused = run(&urls, &[], &["echo", "should not run"]);
    assert_eq!(
        refused.status.code(),
        Some(75),
        "stderr: {}",
        text(&refused.stderr)
    );
    assert!(!text(&refused.stdout).contains("should not run"));
    assert!(
        text(&refused.stderr).contains("held by someone else"),
        "{}",
        text(&refused.stderr)
    );

    let waited = run(
        &urls,
        &["--wait", "30s"],
        &["sh", "-c", "echo $LOCKEDJOB_FENCING_TOKEN"],
    );
    let first = first.wait_with_output().expect("first exec");
    assert_eq!(first.status.code(), Some(0));
    assert_eq!(
        waited.status.code(),
        Some(0),
        "stderr: {}",
        text(&waited.stderr)
    );
    let first_token: u64 = text(&first.stdout).trim().parse().expect("first token");
    let second_token: u64 = text(&waited.stdout).trim().parse().expect("second token");
    assert!(second_token > first_token);
}

#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn losing_the_majority_stops_the_command_before_the_deadline() {
    let mut nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let pid_file = dir.path().join("child.pid");
    let script = format!("echo $$ > {}; exec sleep 60", pid_file.display());
    let ttl = Duration::from_secs(3);
    let mut child = spawn(&nodes.urls(), &["--ttl", "3s"], &["sh", "-c", &script]);
    assert!(wait_until(Duration::from_secs(10), || pid_file.exists()
        && !std::fs::read_to_string(&pid_file)
            .unwrap_or_default()
            .trim()
            .is_empty()));
    let command_pid: i32 = std::fs::read_to_string(&pid_file)
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");

    nodes[0].kill9();
    nodes[1].kill9();
    // Renewals happen every ttl/3, so the deadline is at most one TTL after the kill.
    let killed_at = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll exec") {
            break status;
        }
        assert!(
            killed_at.elapsed() < 4 * ttl,
            "exec did not stop the command"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let stopped_after = killed_at.elapsed();
    assert_eq!(status.code(), Some(76), "lease-lost exit code");
    assert!(
        stopped_after < ttl,
        "command outlived the lease deadline: {stopped_after:?}"
    );
    let alive = kill(Pid::from_raw(command_pid), None).is_ok();
    assert!(!alive, "the command is still running");
    let mut stderr = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .ok();
    assert!(stderr.contains("lease on \"nightly\" lost"), "{stderr}");
}

#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn the_command_and_its_children_die_with_exec_killed_by_sigkill() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let pids = dir.path().join("pids");
    // The command and a child of its own, as a shell script's pipeline has.
    let script = format!(
        "sleep 1000 & echo \"$$ $!\" > {}; while true; do sleep 0.05; done",
        pids.display()
    );
    let mut exec = spawn(&nodes.urls(), &["--ttl", "5s"], &["sh", "-c", &script]);
    assert!(wait_until(Duration::from_secs(10), || {
        std::fs::read_to_string(&pids).is_ok_and(|text| text.trim().split(' ').count() == 2)
    }));
    let tree: Vec<i32> = std::fs::read_to_string(&pids)
        .expect("pids")
        .split_whitespace()
        .map(|pid| pid.parse().expect("a pid"))
        .collect();
    assert!(tree.iter().all(|pid| alive(*pid)));

    kill(Pid::from_raw(exec.id() as i32), Signal::SIGKILL).expect("kill -9 exec");
    let killed_at = Instant::now();
    let _ = exec.wait();
    assert!(
        wait_until(Duration::from_secs(4), || tree
            .iter()
            .all(|pid| !alive(*pid))),
        "still running after exec was killed: {:?}",
        tree.iter().filter(|pid| alive(**pid)).collect::<Vec<_>>()
    );
    let gone_after = killed_at.elapsed();
    // The lease lives out its TTL after a kill -9; the work must be gone long before.
    assert!(
        gone_after < Duration::from_secs(5),
        "the command outlived exec by {gone_after:?}"
    );
}

#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn sigterm_reaches_the_command_and_the_lock_is_released() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("got-term");
    let script = format!(
        "trap 'echo term > {}; exit 0' TERM; while true; do sleep 0.05; done",
        marker.display()
    );
    let child = spawn(&nodes.urls(), &[], &["sh", "-c", &script]);
    assert!(wait_until(Duration::from_secs(10), || nodes
        .count_key(LOCK_KEY)
        == 3));
    std::thread::sleep(Duration::from_millis(200)); // let the trap be installed
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).expect("SIGTERM exec");
    let out = child.wait_with_output().expect("exec exits");
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap_or_default().trim(),
        "term"
    );
    assert_eq!(nodes.count_key(LOCK_KEY), 0, "lock released");
}

/// (urls, extra flags, command, exit code, stderr fragment)
type BadInputCase = (
    Vec<String>,
    Vec<&'static str>,
    Vec<&'static str>,
    i32,
    &'static str,
);

#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn bad_input_gives_clear_errors_and_distinct_exit_codes() {
    let nodes = RedisNodes::start(2, Persistence::None).expect("start redis-server");
    let dead = format!("redis://127.0.0.1:{}", support::free_port());
    let good = nodes.urls();
    let table: Vec<BadInputCase> = vec![
        (
            vec![String::new()],
            vec![],
            vec!["true"],
            64,
            "no Redis nodes",
        ),
        (
            vec!["redis://127.0.0.1:notaport".into()],
            vec![],
            vec!["true"],
            64,
            "not valid",
        ),
        (
            vec!["http://127.0.0.1:6379".into()],
            vec![],
            vec!["true"],
            64,
            "redis:// or rediss://",
        ),
        (
            good.clone(),
            vec!["--ttl", "0"],
            vec!["true"],
            64,
            "greater than zero",
        ),
        (
            good.clone(),
            vec!["--ttl", "1s", "--renew-interval", "2s"],
            vec!["true"],
            64,
            "shorter than the TTL",
        ),
        (
            good.clone(),
            vec!["--ttl", "soon"],
            vec!["true"],
            64,
            "not a valid duration",
        ),
        (
            vec![dead.clone(), dead.replace("127.0.0.1", "127.0.0.2")],
            vec![],
            vec!["true"],
            75,
            "refused",
        ),
        (
            good.clone(),
            vec![],
            vec!["/nonexistent/command"],
            127,
            "cannot start",
        ),
        // An even node count works, with a warning.
        (
            good.clone(),
            vec![],
            vec!["true"],
            0,
            "even number of Redis nodes",
        ),
    ];
    for (urls, extra, command, code, fragment) in table {
        let out = run(&urls, &extra, &command);
        let stderr = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{urls:?} {extra:?}: {stderr}"
        );
        assert!(
            stderr.contains(fragment),
            "{urls:?} {extra:?}: expected {fragment:?} in {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let usage = Command::new(lockedjob_bin())
        .args(["exec", "--lock", "x"])
        .env_remove("LOCKEDJOB_REDIS_URLS")
        .output()
        .expect("run");
    assert_eq!(usage.status.code(), Some(64));
}

/// A one-shot `exec` (a CronJob's) whose nodes are far away: each round trip takes 30 ms,
/// under the 50 ms request timeout, but opening a connection takes several. Its one attempt
/// waits for the first connections (up to the connect timeout) instead of failing on all nodes
/// as "timed out".
#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn a_one_shot_exec_over_slow_links_waits_for_its_first_connections() {
    use support::{FaultProxy, ProxyMode};
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let proxies: Vec<FaultProxy> = nodes
        .nodes
        .iter()
        .map(|node| FaultProxy::start(&node.addr()).expect("start proxy"))
        .collect();
    for proxy in &proxies {
        proxy.set_mode(ProxyMode::Delay(Duration::from_millis(15)));
    }
    let urls: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
    let out = run(&urls, &["--connect-timeout", "2s"], &["true"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}
