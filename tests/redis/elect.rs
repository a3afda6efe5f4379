//! `lockedjob elect` as users run it: the real binary, several candidates, real Redis nodes
//! with real faults (kill -9 of a candidate, SIGSTOP of a Redis majority).

use testsupport as support;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::{alive, lockedjob_bin, wait_until, Persistence, Reap, RedisNodes, SetChecks};

const LOCK_KEY: &str = "lockedjob:lock:writer";

fn elect_cmd(urls: &[String], runner: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(lockedjob_bin());
    cmd.arg("elect")
        .arg("writer")
        .arg("--redis")
        .arg(urls.join(","))
        .args(["--cluster-id", "ci", "--runner-name", runner])
        .args(extra)
        .env_remove("LOCKEDJOB_REDIS_URLS")
        .env("RUST_LOG", "info");
    cmd
}

/// A candidate whose command writes its pid to `DIR/RUNNER.pid`, appends "TOKEN HOLDER" to
/// `DIR/leaders.log` when it starts leading, then sleeps.
fn candidate(urls: &[String], dir: &Path, runner: &str, extra: &[&str]) -> Child {
    let script = format!(
        "echo $$ > {pid}; echo \"$LOCKEDJOB_FENCING_TOKEN $LOCKEDJOB_HOLDER\" >> {log}; exec sleep 1000",
        log = dir.join("leaders.log").display(),
        pid = dir.join(format!("{runner}.pid")).display(),
    );
    elect_cmd(urls, runner, extra)
        .arg("--")
        .args(["sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lockedjob elect")
}

/// A candidate whose command appends "start TOKEN HOLDER" to `DIR/journal.log` when it starts
/// and "end TOKEN HOLDER" when it is stopped (SIGTERM).
fn journaled_candidate(urls: &[String], dir: &Path, runner: &str, extra: &[&str]) -> Child {
    let script = format!(
        "line=\"$LOCKEDJOB_FENCING_TOKEN $LOCKEDJOB_HOLDER\"; echo \"start $line\" >> {log}; trap 'echo \"end $line\" >> {log}; exit 0' TERM; while :; do sleep 0.1; done",
        log = dir.join("journal.log").display(),
    );
    elect_cmd(urls, runner, extra)
        .arg("--")
        .args(["sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn lockedjob elect")
}

fn journal(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("journal.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The holders that started leading, in order.
fn starts(dir: &Path) -> Vec<String> {
    journal(dir)
        .iter()
        .filter_map(|line| line.strip_prefix("start "))
        .filter_map(|rest| rest.split_once(' ').map(|(_, holder)| holder.to_string()))
        .collect()
}

fn leaders(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("leaders.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The pid a candidate's command wrote, once it wrote one.
fn command_pid(dir: &Path, runner: &str) -> Option<i32> {
    std::fs::read_to_string(dir.join(format!("{runner}.pid")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn stderr_of(child: &mut Child) -> String {
    let mut text = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        use std::io::Read;
        let _ = stderr.read_to_string(&mut text);
    }
    text
}

#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn one_leader_at_a_time_and_a_killed_leaders_command_dies_with_it() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let fast = ["--ttl", "3s", "--retry-interval", "200ms"];
    let mut a = candidate(&nodes.urls(), dir.path(), "a", &fast);
    assert!(wait_until(Duration::from_secs(10), || leaders(dir.path())
        == ["1 ci/a"]));
    let b = candidate(&nodes.urls(), dir.path(), "b", &fast);
    let mut reap = Reap(vec![b]);
    // b campaigns (a dozen attempts) but does not lead while a holds the lease.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(leaders(dir.path()), ["1 ci/a"]);

    let a_command = command_pid(dir.path(), "a").expect("a's command pid");
    kill(Pid::from_raw(a.id() as i32), Signal::SIGKILL).expect("kill -9 a");
    let killed_at = Instant::now();
    let _ = a.wait();
    assert!(
        wait_until(Duration::from_secs(2), || !alive(a_command)),
        "a's command outlived its supervisor"
    );
    let gone_after = killed_at.elapsed();
    assert!(
        wait_until(Duration::from_secs(10), || leaders(dir.path()).len() == 2),
        "no new leader: {:?}",
        leaders(dir.path())
    );
    assert_eq!(leaders(dir.path()), ["1 ci/a", "2 ci/b"]);
    assert!(
        gone_after < Duration::from_secs(3),
        "a's command died {gone_after:?} after a, not before its lease could expire"
    );

    // A graceful stop releases at once: the lock is gone from every node.
    let mut b = reap.0.pop().expect("b");
    kill(Pid::from_raw(b.id() as i32), Signal::SIGTERM).expect("SIGTERM b");
    let status = b.wait().expect("b exits");
    let stderr = stderr_of(&mut b);
    assert_eq!(status.code(), Some(128 + 15), "{stderr}");
    assert!(stderr.contains("elected leader"), "{stderr}");
    assert_eq!(nodes.count_key(LOCK_KEY), 0, "leadership released");
}

#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn a_leader_cut_off_from_the_quorum_steps_down_before_its_deadline_and_leads_again() {
    let mut nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("leader.json");
    let token_path = token_file.to_string_lossy().into_owned();
    let a = candidate(
        &nodes.urls(),
        dir.path(),
        "a",
        &[
            "--ttl",
            "3s",
            "--retry-interval",
            "200ms",
            "--token-file",
            &token_path,
        ],
    );
    let _reap = Reap(vec![a]);
    // The token file is written once the command is started, which may not have run yet.
    assert!(wait_until(Duration::from_secs(10), || token_file.exists()
        && command_pid(dir.path(), "a").is_some()));
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&token_file).expect("token file"))
            .expect("the token file is JSON");
    assert_eq!(record["token"], 1);
    assert_eq!(record["holder"], "ci/a");
    assert_eq!(record["lock"], "writer");
    let valid_until: jiff::Timestamp = record["validUntil"]
        .as_str()
        .expect("validUntil")
        .parse()
        .expect("an RFC 3339 time");
    assert!(valid_until > jiff::Timestamp::now());
    // Each renewal (every ttl/3) writes a later validUntil.
    let valid_until_of = || -> Option<jiff::Timestamp> {
        let bytes = std::fs::read(&token_file).ok()?;
        let record: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
        record["validUntil"].as_str()?.parse().ok()
    };
    assert!(
        wait_until(Duration::from_secs(5), || valid_until_of()
            .is_some_and(|later| later > valid_until)),
        "the token file was not renewed"
    );
    let first_command = command_pid(dir.path(), "a").expect("command pid");

    nodes[1].pause().expect("SIGSTOP node 1");
    nodes[2].pause().expect("SIGSTOP node 2");
    let cut_at = Instant::now();
    assert!(
        wait_until(Duration::from_secs(6), || !alive(first_command)),
        "the command kept running without a quorum"
    );
    let stopped_after = cut_at.elapsed();
    assert!(!token_file.exists(), "the token file outlived leadership");
    // Renewals come every ttl/3, so the lease deadline is at most one TTL after the cut.
    assert!(
        stopped_after < Duration::from_secs(3),
        "the command was stopped {stopped_after:?} after the cut, past the lease deadline"
    );

    nodes[1].resume().expect("SIGCONT node 1");
    nodes[2].resume().expect("SIGCONT node 2");
    assert!(
        wait_until(Duration::from_secs(15), || leaders(dir.path()).len() == 2),
        "not elected again: {:?}",
        leaders(dir.path())
    );
    let again = leaders(dir.path());
    assert_eq!(again[0], "1 ci/a");
    let (token, holder) = again[1].split_once(' ').expect("TOKEN HOLDER");
    assert_eq!(holder, "ci/a");
    assert!(token.parse::<u64>().expect("a token") > 1, "{again:?}");
    assert!(wait_until(Duration::from_secs(5), || {
        std::fs::read(&token_file)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .is_some_and(|record| record["token"].as_u64() == token.parse().ok())
    }));
}

/// Lines an observer prints, as they come.
fn observe(urls: &[String]) -> (Child, mpsc::Receiver<serde_json::Value>) {
    let mut observer = elect_cmd(urls, "observer", &["--observe", "-o", "json"])
        .args(["--poll-interval", "100ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the observer");
    let stdout = observer.stdout.take().expect("stdout");
    let (lines, seen) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let json = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not one JSON object a line: {line:?}: {e}"));
            if lines.send(json).is_err() {
                break;
            }
        }
    });
    (observer, seen)
}

fn next_line(seen: &mpsc::Receiver<serde_json::Value>) -> serde_json::Value {
    seen.recv_timeout(Duration::from_secs(10))
        .expect("the observer printed a line")
}

#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn observe_prints_each_change_of_leader() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let (observer, seen) = observe(&nodes.urls());
    let mut reap = Reap(vec![observer]);
    assert_eq!(next_line(&seen)["state"], "none");

    let a = candidate(&nodes.urls(), dir.path(), "a", &[]);
    let line = next_line(&seen);
    assert_eq!(
        (
            &line["state"],
            &line["holder"],
            &line["cluster"],
            &line["token"]
        ),
        (
            &"leader".into(),
            &"ci/a".into(),
            &"ci".into(),
            &serde_json::Value::from(1)
        ),
        "{line}"
    );
    kill(Pid::from_raw(a.id() as i32), Signal::SIGTERM).expect("SIGTERM a");
    reap.0.push(a);
    assert_eq!(next_line(&seen)["state"], "none");

    reap.0.push(candidate(&nodes.urls(), dir.path(), "b", &[]));
    let line = next_line(&seen);
    assert_eq!(
        (&line["holder"], &line["token"]),
        (&"ci/b".into(), &2.into())
    );
    // Nothing changed: no more lines.
    assert!(seen.recv_timeout(Duration::from_millis(500)).is_err());
}

#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn bad_input_names_what_to_fix() {
    let nodes = RedisNodes::start(1, Persistence::None).expect("start redis-server");
    let urls = nodes.urls();
    let missing_dir: PathBuf = ["/nonexistent", "dir", "leader.json"].iter().collect();
    let missing = missing_dir.to_string_lossy().into_owned();
    // (arguments after `elect`, exit code, stderr fragment)
    let table: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["", "--", "true"], 64, "LOCK must name"),
        (vec!["writer"], 64, "<COMMAND>"),
        (
            vec!["writer", "--token-file", &missing, "--", "true"],
            64,
            "--token-file",
        ),
        (
            vec!["writer", "--observe", "--", "true"],
            64,
            "cannot be used with",
        ),
        (
            vec![
                "writer",
                "--ttl",
                "1s",
                "--renew-interval",
                "2s",
                "--",
                "true",
            ],
            64,
            "shorter than the TTL",
        ),
        (
            vec!["writer", "--retry-interval", "0", "--", "true"],
            64,
            "greater than zero",
        ),
        (
            vec!["writer", "--sidecar", "--record-validity", "10ms"],
            64,
            "--record-validity must be at least 100ms",
        ),
        (
            vec!["writer", "--record-validity", "2s", "--", "true"],
            64,
            "--sidecar",
        ),
        (
            vec!["writer", "--", "/nonexistent/command"],
            127,
            "cannot start",
        ),
    ];
    for (args, code, fragment) in table {
        let out = Command::new(lockedjob_bin())
            .arg("elect")
            .args(["--redis", &urls.join(",")])
            .args(&args)
            .env_remove("LOCKEDJOB_REDIS_URLS")
            .output()
            .expect("run lockedjob elect");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(
            stderr.contains(fragment),
            "{args:?}: expected {fragment:?} in {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// Preference (`--priority`): a candidate of higher priority takes leadership back from a
/// lower one through a clean handover (the old leader's command ends before the new one's
/// starts), once it has seen a quorum for `--reclaim-after`. An equal never takes over from a
/// healthy leader; after the leader dies the preferred candidate is the one elected, even
/// though a lower one may win the free lock first.
#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn a_preferred_candidate_takes_leadership_back_cleanly_and_an_equal_never_preempts() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let with = |priority: &'static str| {
        [
            "--ttl",
            "3s",
            "--retry-interval",
            "200ms",
            "--reclaim-after",
            "1s",
            "--priority",
            priority,
        ]
    };
    let standby = journaled_candidate(&nodes.urls(), dir.path(), "standby", &with("0"));
    let mut reap = Reap(vec![standby]);
    assert!(wait_until(Duration::from_secs(10), || starts(dir.path())
        == ["ci/standby"]));

    let primary = journaled_candidate(&nodes.urls(), dir.path(), "primary", &with("1"));
    reap.0.push(primary);
    assert!(
        wait_until(Duration::from_secs(15), || starts(dir.path()).len() == 2),
        "the primary takes over: {:?}",
        journal(dir.path())
    );
    let handover = journal(dir.path());
    assert_eq!(starts(dir.path()), ["ci/standby", "ci/primary"]);
    assert!(
        handover[1].starts_with("end ") && handover[1].ends_with("ci/standby"),
        "the standby's command ended before the primary's started: {handover:?}"
    );
    let token = |line: &str| -> u64 {
        line.split(' ')
            .nth(1)
            .and_then(|t| t.parse().ok())
            .expect("a token")
    };
    assert!(token(&handover[2]) > token(&handover[0]), "{handover:?}");

    // An equal joins: the healthy leader stays, for many renewals past --reclaim-after.
    let equal = journaled_candidate(&nodes.urls(), dir.path(), "equal", &with("1"));
    reap.0.push(equal);
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(starts(dir.path()), ["ci/standby", "ci/primary"]);

    // The primary dies: the equal, which the standby yields to, leads next.
    let mut primary = reap.0.remove(1);
    kill(Pid::from_raw(primary.id() as i32), Signal::SIGKILL).expect("kill -9 the primary");
    let _ = primary.wait();
    assert!(
        wait_until(Duration::from_secs(15), || starts(dir.path()).len() == 3),
        "a leader after the primary: {:?}",
        journal(dir.path())
    );
    assert_eq!(
        starts(dir.path())[2],
        "ci/equal",
        "{:?}",
        journal(dir.path())
    );
}

/// The same handover in `--sidecar` mode (no command; the token file shows who leads): the
/// standby's file goes, the primary's comes, with a larger token.
#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn a_preferred_sidecar_takes_leadership_back_from_a_standby_sidecar() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = |runner: &str| dir.path().join(format!("{runner}.json"));
    let sidecar = |runner: &str, priority: &str| {
        let file = token_file(runner);
        let addr = format!("127.0.0.1:{}", support::free_port());
        elect_cmd(&nodes.urls(), runner, &[])
            .args(["--sidecar", "--ttl", "3s", "--retry-interval", "200ms"])
            .args(["--reclaim-after", "1s", "--priority", priority])
            .arg("--token-file")
            .arg(&file)
            .args(["--leader-addr", &addr])
            .arg("--termination-message-path")
            .arg(dir.path().join(format!("{runner}.termination")))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn lockedjob elect --sidecar")
    };
    let token_of = |runner: &str| -> Option<u64> {
        let text = std::fs::read_to_string(token_file(runner)).ok()?;
        serde_json::from_str::<serde_json::Value>(&text).ok()?["token"].as_u64()
    };
    let mut reap = Reap(vec![sidecar("standby", "0")]);
    assert!(wait_until(Duration::from_secs(10), || token_of("standby").is_some()));
    let standby_token = token_of("standby").expect("the standby leads");
    reap.0.push(sidecar("primary", "1"));
    assert!(
        wait_until(Duration::from_secs(15), || token_of("primary").is_some()),
        "the primary takes over"
    );
    assert_eq!(token_of("standby"), None, "the standby stepped down");
    assert!(token_of("primary") > Some(standby_token));
}

/// `lockedjob_leaderless_seconds_total`: a candidate that campaigns while no Redis quorum
/// answers counts that time, and stops counting once there is a leader (itself here).
#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn a_candidate_counts_the_time_it_found_no_leader() {
    let mut nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    for node in &mut nodes.nodes[..2] {
        node.pause().expect("SIGSTOP a node of the majority");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let port = support::free_port();
    let token_file = dir.path().join("leader.json");
    let sidecar = elect_cmd(&nodes.urls(), "solo", &[])
        .args(["--sidecar", "--ttl", "3s", "--retry-interval", "200ms"])
        .arg("--token-file")
        .arg(&token_file)
        .args(["--leader-addr", &format!("127.0.0.1:{port}")])
        .arg("--termination-message-path")
        .arg(dir.path().join("termination"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn lockedjob elect --sidecar");
    let _reap = Reap(vec![sidecar]);
    let leaderless = || -> f64 {
        let (_, body) = support::http_get(port, "/metrics");
        body.lines()
            .find_map(|line| line.strip_prefix("lockedjob_leaderless_seconds_total "))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(-1.0)
    };
    assert!(
        wait_until(Duration::from_secs(10), || leaderless() == 0.0),
        "the sidecar serves its metrics"
    );
    std::thread::sleep(Duration::from_secs(1));
    for node in &mut nodes.nodes[..2] {
        node.resume().expect("SIGCONT");
    }
    assert!(
        wait_until(Duration::from_secs(10), || token_file.exists()),
        "leads once a quorum answers"
    );
    let counted = leaderless();
    assert!(
        counted > 0.0,
        "the time without a quorum was counted: {counted}"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        leaderless(),
        counted,
        "nothing more is counted while it leads"
    );
}
