//! Leader-election failover, measured with the real `lockedjob elect` binary against local
//! `redis-server` nodes: two candidates, the leader stopped each trial, the time until the other
//! candidate's command starts.
//! - graceful: SIGTERM to the leader (a pod deleted); it stops its command and releases;
//! - crash: SIGKILL to the leader (its lease lives out the TTL).
//!
//! The same trials with client-go's `tools/leaderelection` beside (`elect/client_go.rs`), at
//! its defaults and at our lease length. Then a paused leader: it and its work stopped past its
//! lease and continued; the writes of deposed leaders, and how many of them a fenced store
//! would take (`BENCH_PAUSE_TRIALS`, default 5).
//!
//! Also the sidecar's memory and idle CPU (`elect --sidecar`, leading, for `IDLE_SECONDS`).
//! `cargo bench --bench elect` runs it in full (`BENCH_TRIALS`, default 20; `BENCH_TTL`, default
//! 5s); under `cargo test` one trial of each, so that it cannot rot. `BENCH_NODE=real` measures
//! the sidecar in pods on a real node instead (`elect/kubernetes.rs`; root only). Build in release for
//! figures worth quoting (`cargo bench` does).

#[path = "elect/client_go.rs"]
mod client_go;
#[path = "elect/kubernetes.rs"]
mod kubernetes;
use testsupport as support;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::{lockedjob_bin, wait_until, Persistence, RedisNodes};

const IDLE_SECONDS: u64 = 20;

/// A candidate whose command appends "RUNNER NANOS" to `DIR/starts` when it starts leading,
/// then "RUNNER TOKEN NANOS" to `DIR/writes` every 100 ms while it leads. Its own process group,
/// so that a pause stops it whole.
fn candidate(urls: &[String], dir: &Path, runner: &str, ttl: &str) -> Child {
    let script = format!(
        "echo \"{runner} $(date +%s%N)\" >> {starts}; while :; do echo \"{runner} $LOCKEDJOB_FENCING_TOKEN $(date +%s%N)\" >> {writes}; sleep 0.1; done",
        starts = dir.join("starts").display(),
        writes = dir.join("writes").display(),
    );
    Command::new(lockedjob_bin())
        .args(["elect", "bench", "--redis", &urls.join(",")])
        .args([
            "--cluster-id",
            "bench",
            "--runner-name",
            runner,
            "--ttl",
            ttl,
        ])
        .args(["--", "sh", "-c", &script])
        .env_remove("LOCKEDJOB_REDIS_URLS")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(client_go::log(dir, runner))
        .process_group(0)
        .spawn()
        .expect("start lockedjob elect")
}

/// (runner, wall-clock nanoseconds) of each leadership start so far.
fn starts(dir: &Path) -> Vec<(String, u128)> {
    std::fs::read_to_string(dir.join("starts"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (runner, nanos) = line.split_once(' ')?;
            Some((runner.to_string(), nanos.trim().parse().ok()?))
        })
        .collect()
}

fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// The candidates of a run, by name. Dropped (also when a check fails), each is killed with
/// everything it started, so that no candidate outlives the bench.
struct Running(Vec<(String, Child)>);

impl Running {
    /// The position of the candidate named `name`.
    fn of(&self, name: &str) -> usize {
        self.0.iter().position(|(n, _)| n == name).expect("runs")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            signal_whole(child.id(), Signal::SIGCONT);
            signal_whole(child.id(), Signal::SIGKILL);
            let _ = child.wait();
        }
    }
}

/// Candidates "a" and "b", once one of them leads.
fn elected_pair(candidate: impl Fn(&Path, &str) -> Child, dir: &Path) -> Running {
    let running = Running(
        ["a", "b"]
            .iter()
            .map(|n| (n.to_string(), candidate(dir, n)))
            .collect(),
    );
    assert!(
        wait_until(Duration::from_secs(20), || starts(dir).len() == 1),
        "no first leader:\n{}",
        logs(dir)
    );
    running
}

/// One failover per trial: the leader gets `signal`, the time until the next start is measured;
/// the stopped candidate is started again to be the next trial's standby. `candidate(dir, name)`
/// starts a candidate that appends "NAME NANOS" to `dir/starts` when it starts leading.
fn failovers(
    candidate: impl Fn(&Path, &str) -> Child,
    signal: Signal,
    trials: usize,
) -> Vec<Duration> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut running = elected_pair(&candidate, dir.path());
    let mut took = Vec::new();
    for _ in 0..trials {
        let seen = starts(dir.path()).len();
        let leader = starts(dir.path()).last().expect("a leader").0.clone();
        let position = running.of(&leader);
        let child = &mut running.0[position].1;
        let stopped_at = now_nanos();
        kill(Pid::from_raw(child.id() as i32), signal).expect("signal the leader");
        let _ = child.wait();
        assert!(
            wait_until(Duration::from_secs(60), || starts(dir.path()).len() > seen),
            "no new leader"
        );
        let (_, started) = starts(dir.path())[seen].clone();
        took.push(Duration::from_nanos(
            started.saturating_sub(stopped_at) as u64
        ));
        running.0[position].1 = candidate(dir.path(), &leader);
        // Let the restarted candidate make its first attempt before the next trial.
        std::thread::sleep(Duration::from_millis(300));
    }
    took
}

/// The candidates' stderr, for a failure's message.
fn logs(dir: &Path) -> String {
    ["a", "b"]
        .iter()
        .map(|name| {
            let text = std::fs::read_to_string(dir.join(format!("{name}.log")));
            format!("--- {name}\n{}", text.unwrap_or_default())
        })
        .collect()
}

/// A write the candidates' work made: (runner, token, wall-clock nanoseconds).
type Write = (String, u64, u128);

fn writes(dir: &Path) -> Vec<Write> {
    let mut all: Vec<Write> = std::fs::read_to_string(dir.join("writes"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let runner = fields.next()?.to_string();
            Some((
                runner,
                fields.next()?.parse().ok()?,
                fields.next()?.parse().ok()?,
            ))
        })
        .collect();
    all.sort_by_key(|w| w.2);
    all
}

/// Signals a candidate and everything it started (its process group, and each child's own
/// group: `elect` runs its command in a group of its own).
fn signal_whole(pid: u32, signal: Signal) {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    let groups = std::iter::once(pid as i32)
        .chain(children.split_whitespace().filter_map(|c| c.parse().ok()));
    for group in groups {
        let _ = nix::sys::signal::killpg(Pid::from_raw(group), signal);
    }
}

/// Writes made by a deposed leader: after another candidate's start that came later than the
/// writer's own latest start (a woken leader's, or a leader's that has not noticed yet), and how
/// many of them a fenced store (a write is taken iff its token is at least the largest taken)
/// accepted.
#[derive(Default)]
struct Stale {
    made: usize,
    accepted: usize,
}

fn stale_writes(all: &[Write], starts: &[(String, u128)]) -> Stale {
    let deposed = |runner: &str, at: u128| {
        let own = starts
            .iter()
            .filter(|(r, s)| r == runner && *s <= at)
            .map(|s| s.1)
            .max();
        own.is_some_and(|own| {
            starts
                .iter()
                .any(|(r, s)| r != runner && *s > own && *s < at)
        })
    };
    let mut largest = 0;
    let mut stale = Stale::default();
    for (runner, token, at) in all {
        let accepted = *token >= largest;
        if accepted {
            largest = *token;
        }
        if deposed(runner, *at) {
            stale.made += 1;
            stale.accepted += usize::from(accepted);
        }
    }
    stale
}

/// One pause per trial: the leader and its work are stopped (SIGSTOP) for `pause`, longer
/// than its lease, so that the other candidate takes over, then continued; once its work has
/// stopped writing it is restarted as the next trial's standby. Then every deposed leader's
/// writes of the whole run are judged.
fn paused_leaders(
    candidate: impl Fn(&Path, &str) -> Child,
    pause: Duration,
    trials: usize,
) -> Stale {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut running = elected_pair(&candidate, dir.path());
    for _ in 0..trials {
        let seen = starts(dir.path()).len();
        let leader = starts(dir.path()).last().expect("a leader").0.clone();
        let position = running.of(&leader);
        let pid = running.0[position].1.id();
        signal_whole(pid, Signal::SIGSTOP);
        std::thread::sleep(pause);
        // Paused until a successor leads (client-go's may wait for a last retry period).
        assert!(
            wait_until(Duration::from_secs(60), || starts(dir.path()).len() > seen),
            "no successor while {leader} was paused: {:?}\n{}",
            starts(dir.path()),
            logs(dir.path())
        );
        let terms = |dir: &Path| starts(dir).iter().filter(|s| s.0 == leader).count();
        let terms_before = terms(dir.path());
        signal_whole(pid, Signal::SIGCONT);
        // Restarted once its work has been quiet for a second (it noticed, or was stopped), or
        // once it won a new term (a woken client-go leader can release its successor's Lease
        // and take it again: docs/benchmarks.md).
        let quiet = || {
            let last = writes(dir.path())
                .iter()
                .rev()
                .find(|w| w.0 == leader)
                .map(|w| w.2);
            terms(dir.path()) > terms_before
                || last.is_none_or(|at| now_nanos().saturating_sub(at) > 1_000_000_000)
        };
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            wait_until(Duration::from_secs(60), quiet),
            "the woken leader's work never stopped: {:?}\n{}",
            starts(dir.path()),
            logs(dir.path())
        );
        signal_whole(pid, Signal::SIGKILL);
        let _ = running.0[position].1.wait();
        running.0[position].1 = candidate(dir.path(), &leader);
        std::thread::sleep(Duration::from_millis(300));
    }
    // Let a leader that has not noticed yet finish its term before judging.
    std::thread::sleep(pause);
    drop(running);
    stale_writes(&writes(dir.path()), &starts(dir.path()))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn report(who: &str, what: &str, mut took: Vec<Duration>) {
    took.sort();
    println!(
        "| {who} | {what} | {} | {:.3} | {:.3} | {:.3} |",
        took.len(),
        percentile(&took, 0.5).as_secs_f64(),
        percentile(&took, 0.99).as_secs_f64(),
        took.last().copied().unwrap_or_default().as_secs_f64()
    );
}

fn sidecar_idle(nodes: &RedisNodes, seconds: u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("leader.json");
    let mut sidecar = Command::new(lockedjob_bin())
        .args([
            "elect",
            "bench-sidecar",
            "--sidecar",
            "--redis",
            &nodes.urls().join(","),
        ])
        .args([
            "--leader-addr",
            &format!("127.0.0.1:{}", support::free_port()),
        ])
        .arg("--token-file")
        .arg(&token_file)
        .env_remove("LOCKEDJOB_REDIS_URLS")
        .env_remove("POD_NAMESPACE")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the sidecar");
    assert!(wait_until(Duration::from_secs(20), || token_file.exists()));
    let cpu_before = support::cpu_seconds(sidecar.id());
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    let (rss, cpu_after) = (
        support::status_mib(sidecar.id(), "VmRSS"),
        support::cpu_seconds(sidecar.id()),
    );
    let share = (cpu_after - cpu_before) / started.elapsed().as_secs_f64() * 100.0;
    println!(
        "sidecar leading, idle {seconds} s (default TTL 15s, renewals every 5 s): RSS {rss:.1} MiB, CPU {share:.2} % of a core"
    );
    let _ = sidecar.kill();
    let _ = sidecar.wait();
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let trials: usize = std::env::var("BENCH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 20 } else { 1 });
    if std::env::var("BENCH_NODE").is_ok_and(|v| v == "real") {
        println!("elect failover on a real node: a Deployment of 2 pods with `elect --sidecar --ttl 15s`, 3 Redis pods; stopped leader → the lock holds the other pod's value");
        println!();
        println!("| candidates | stop | trials | p50 s | p99 s | max s |");
        println!("|---|---|---|---|---|---|");
        for (what, took) in kubernetes::failovers(trials) {
            report("sidecar --ttl 15s", what, took);
        }
        return;
    }
    let ttl = std::env::var("BENCH_TTL").unwrap_or_else(|_| "5s".into());
    let lease = humantime::parse_duration(&ttl).expect("BENCH_TTL: a duration such as 5s");
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    println!("elect failover: 2 candidates, 3 local nodes, --ttl {ttl}, default --retry-interval; stopped leader → next leader's command started");
    println!("client-go: tools/leaderelection (v0.36.3, a Lease on a local kube-apiserver), LeaseDuration/RenewDeadline/RetryPeriod as given, ReleaseOnCancel; stopped leader → next OnStartedLeading");
    println!();
    println!("| candidates | stop | trials | p50 s | p99 s | max s |");
    println!("|---|---|---|---|---|---|");
    let ours = |dir: &Path, name: &str| candidate(&nodes.urls(), dir, name, &ttl);
    let elect = format!("lockedjob elect --ttl {ttl}");
    let stops = [
        ("graceful (SIGTERM)", Signal::SIGTERM),
        ("crash (SIGKILL)", Signal::SIGKILL),
    ];
    for (stop, signal) in stops {
        report(&elect, stop, failovers(ours, signal, trials));
    }
    let peers = client_go::Peers::start();
    let timings = [
        client_go::Timing::with_lease(lease),
        client_go::Timing::defaults(),
    ];
    for timing in &timings {
        let theirs = |dir: &Path, name: &str| peers.candidate("bench", timing, dir, name);
        let who = format!("client-go {}", timing.describe());
        for (stop, signal) in stops {
            report(&who, stop, failovers(theirs, signal, trials));
        }
    }

    let pauses: usize = std::env::var("BENCH_PAUSE_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 5 } else { 1 });
    println!();
    println!("The leader and its work stopped (SIGSTOP) for its lease + 2 s, then continued; the work writes every 100 ms while it leads (client-go hands it no token: 0); a deposed leader's write is one made after another candidate started leading");
    println!();
    println!("| candidates | pauses | writes by a deposed leader | accepted by a fenced store |");
    println!("|---|---|---|---|");
    let margin = Duration::from_secs(2);
    let stale = paused_leaders(ours, lease + margin, pauses);
    println!(
        "| {elect} | {pauses} | {} | {} |",
        stale.made, stale.accepted
    );
    for timing in &timings {
        let theirs = |dir: &Path, name: &str| peers.candidate("bench", timing, dir, name);
        let stale = paused_leaders(theirs, timing.lease + margin, pauses);
        let who = format!("client-go {}", timing.describe());
        println!("| {who} | {pauses} | {} | {} |", stale.made, stale.accepted);
    }
    println!();
    sidecar_idle(&nodes, if full { IDLE_SECONDS } else { 1 });
}
