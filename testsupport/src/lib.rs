//! Test support shared by the operator's test binaries and benches, compiled once for all of
//! them. The parts (real `redis-server` processes on free loopback ports with kill -9,
//! SIGSTOP/SIGCONT, restart and a movable clock, and the fault-injecting TCP proxy) live in
//! `lockedjob::lab::harness`, shared with `lockedjob lab`; here are the panicking shorthands a
//! test wants for its checks. Dev-only: the operator binary never links it.

pub use lockedjob::lab::harness::{
    FaultProxy, NodeTls, Persistence, ProxyMode, RedisNode, RedisNodes,
};

pub mod kubernetes;
pub mod pki;
pub mod rotation;

/// Checks on a node's data that fail the test, with context, when the node cannot answer.
pub trait NodeChecks {
    fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> T;

    fn get(&self, key: &str) -> Option<String> {
        self.query(&["GET", key])
    }

    /// `PTTL` of a key: -2 when absent, -1 without expiry.
    fn pttl(&self, key: &str) -> i64 {
        self.query(&["PTTL", key])
    }
}

impl NodeChecks for RedisNode {
    fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        self.command(args)
            .unwrap_or_else(|e| panic!("{args:?} on {}: {e}", self.url()))
    }
}

pub trait SetChecks {
    /// How many nodes that are up hold `key`.
    fn count_key(&self, key: &str) -> usize;
}

impl SetChecks for RedisNodes {
    fn count_key(&self, key: &str) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.is_running() && n.get(key).is_some())
            .count()
    }
}

use std::time::{Duration, Instant};

/// Polls `check` until it holds or `limit` passes. For waiting on state, never for asserting
/// how fast something happened.
pub fn wait_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

/// Whether process `pid` runs (a zombie, killed but not yet reaped by whoever inherited it,
/// counts as gone).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(") ")?.1.chars().next()?;
            Some(state != 'Z' && state != 'X')
        })
        .unwrap_or(false)
}

/// The value more than half of `nodes` nodes hold, among the `values` read from them (a node
/// outside a holder's quorum may hold nothing, or an older value).
pub fn majority(values: &[String], nodes: usize) -> Option<String> {
    values
        .iter()
        .find(|v| values.iter().filter(|w| w == v).count() * 2 > nodes)
        .cloned()
}

/// The host pid of the `lockedjob elect --sidecar` process of pod `pod` on a real node (its
/// containers are this host's processes): the one whose environment has `POD_NAME=pod`.
pub fn sidecar_pid(pod: &str) -> Option<i32> {
    let wanted = format!("POD_NAME={pod}");
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let sidecar = cmdline.split(|b| *b == 0).any(|a| a == b"--sidecar");
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            let of_pod = environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes());
            (sidecar && of_pod).then_some(pid)
        })
}

/// utime + stime of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which may itself hold spaces: state is the first, utime
    // and stime (fields 14 and 15 of proc(5)) the 12th and 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // SAFETY: sysconf reads a constant.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) as f64 / per_second
}

/// A `/proc/{pid}/status` memory figure in MiB, e.g. `VmHWM` (peak RSS).
pub fn status_mib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// Kills the processes it holds that still run when it is dropped: a test that fails early
/// leaves none behind.
pub struct Reap(pub Vec<std::process::Child>);

impl Drop for Reap {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A top-level field of the chart's Chart.yaml (`version`, `appVersion`).
pub fn chart_field(field: &str) -> String {
    let chart =
        std::fs::read_to_string(repo("charts/lockedjob-operator/Chart.yaml")).expect("Chart.yaml");
    let prefix = format!("{field}:");
    chart
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map(|v| v.trim().trim_matches('"').to_string())
        .unwrap_or_else(|| panic!("Chart.yaml has no {field}"))
}

/// The image tag the chart's Deployment names by default.
pub fn chart_app_version() -> String {
    chart_field("appVersion")
}

/// The operator image the chart's values name by default (`image.repository`, the tag being
/// the chart's appVersion), which the tests' clusters serve under that name.
pub fn chart_image() -> String {
    format!(
        "ghcr.io/lockedjob/lockedjob-operator:{}",
        chart_app_version()
    )
}

/// A path in the repository (the operator crate's root).
pub fn repo(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testsupport lives in the repository")
        .join(path)
}

/// A text file's contents; panics naming the file.
pub fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// A YAML file as JSON values; panics naming the file.
pub fn yaml(path: &std::path::Path) -> serde_json::Value {
    serde_saphyr::from_str(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The files of `dir` ending in `.ext`, sorted.
pub fn files_in(dir: &std::path::Path, ext: &str) -> Vec<std::path::PathBuf> {
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    files
}

/// The `lockedjob` binary with `args`, as a user runs it: no lock nodes from the environment,
/// warnings only.
pub fn lockedjob(args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(lockedjob_bin());
    cmd.args(args)
        .env_remove("LOCKEDJOB_REDIS_URLS")
        .env("RUST_LOG", "warn");
    cmd
}

/// A finished command's stdout then stderr, for assertions and their messages.
pub fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Path of the built `lockedjob` binary: cargo builds it for the package's tests and benches,
/// beside their `deps/` directory (what `CARGO_BIN_EXE_lockedjob` names in the package itself).
pub fn lockedjob_bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test binary lives in target/PROFILE/deps");
    let bin = profile_dir.join("lockedjob");
    assert!(
        bin.exists(),
        "{} is missing: cargo builds it for the operator crate's tests and benches",
        bin.display()
    );
    bin
}

/// An image of the tests' `lockedjob` binary with its shared libraries, as distroless/cc
/// would hold it: quick to make, and it runs the code under test.
pub fn lockedjob_image() -> localcluster::node::ImageSource {
    localcluster::node::ImageSource::Program(lockedjob_bin())
}

/// The operator image built from the Dockerfile by `scripts/image.sh` (buildah, the base
/// images made here; cached, so only a change to the workspace builds again), named
/// `reference`. Needs root.
pub fn dockerfile_image(reference: &str) -> localcluster::node::ImageSource {
    let out = std::process::Command::new(repo("scripts/image.sh"))
        .args(["--tag", reference])
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run scripts/image.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scripts/image.sh --tag {reference} failed (its error above): {stdout}"
    );
    let archive = stdout.lines().last().expect("the archive's path");
    localcluster::node::ImageSource::Archive(archive.into())
}

/// A free loopback port outside the kernel's ephemeral range (see `localcluster::free_port`:
/// a port 0 choice could be taken as a client's source port before the server binds it).
pub fn free_port() -> u16 {
    localcluster::free_port().expect("a free loopback port")
}

/// `n` distinct free loopback ports (the cursor behind `free_port` hands none out twice).
pub fn free_ports(n: usize) -> Vec<u16> {
    (0..n).map(|_| free_port()).collect()
}

/// The least-privilege `ACL SETUSER` line of docs/security.md ("ACL user", after its marker;
/// it was the README's), split into arguments, with `password` for `<password>`: tests create
/// exactly the documented user.
pub fn readme_acl_setuser(password: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(repo("docs/security.md")).expect("docs/security.md");
    let (_, after) = readme
        .split_once("<!-- tests/redis/acl.rs runs the next line")
        .expect("docs/security.md marks its ACL line");
    let line = after
        .lines()
        .find(|line| line.starts_with("ACL SETUSER"))
        .expect("an ACL SETUSER line after the marker");
    line.split_whitespace()
        .map(|word| word.replace("<password>", password))
        .collect()
}

/// Creates (or replaces) the user of docs/security.md on every node.
pub fn create_acl_user(nodes: &RedisNodes, acl: &[String]) {
    let args: Vec<&str> = acl.iter().map(String::as_str).collect();
    let user = args.get(2).copied().expect("ACL SETUSER <user> ...");
    for node in &nodes.nodes {
        node.command::<()>(&["ACL", "DELUSER", user])
            .unwrap_or_else(|e| panic!("ACL DELUSER on {}: {e}", node.url()));
        node.command::<()>(&args)
            .unwrap_or_else(|e| panic!("ACL SETUSER on {}: {e}", node.url()));
        node.command::<()>(&["ACL", "LOG", "RESET"])
            .unwrap_or_else(|e| panic!("ACL LOG RESET on {}: {e}", node.url()));
    }
}

/// What the nodes' ACLs denied since the last reset (`ACL LOG`), one entry a line.
pub fn acl_denials(nodes: &RedisNodes) -> Vec<String> {
    nodes
        .nodes
        .iter()
        .flat_map(|node| {
            node.command::<Vec<redis::Value>>(&["ACL", "LOG"])
                .unwrap_or_else(|e| panic!("ACL LOG on {}: {e}", node.url()))
                .into_iter()
                .map(|entry| format!("{entry:?}"))
        })
        .collect()
}

/// `GET path` on a sidecar's address: (status code, body); (0, "") when nothing answers.
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    );
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}
