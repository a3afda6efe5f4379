//! Independent `redis-server` nodes (no replication between them), as Redlock requires.

use super::free_port;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// `appendonly yes`, `appendfsync always`: acknowledged writes survive kill -9.
    AppendFsyncAlways,
    /// Nothing on disk: a restarted node comes back empty.
    None,
}

pub struct RedisNode {
    port: u16,
    dir: tempfile::TempDir,
    persistence: Persistence,
    child: Option<Child>,
    paused: bool,
    /// When set, the server runs under libfaketime reading its offset from this file, so the
    /// clock can be moved while it runs.
    faketime_file: Option<PathBuf>,
}

fn redis_server() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        for candidate in ["/usr/bin/redis-server", "/usr/local/bin/redis-server"] {
            if Path::new(candidate).exists() {
                return candidate.to_string();
            }
        }
        panic!("redis-server not found: run scripts/test.sh, which installs it (apt-get install redis-server)")
    })
}

fn libfaketime() -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

impl RedisNode {
    pub fn start(persistence: Persistence) -> Self {
        Self::start_inner(persistence, false)
    }

    /// A node whose wall clock can be shifted at run time with [`RedisNode::shift_clock`].
    pub fn start_with_fake_clock(persistence: Persistence) -> Self {
        Self::start_inner(persistence, true)
    }

    fn start_inner(persistence: Persistence, fake_clock: bool) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("lockedjob-redis-")
            .tempdir()
            .expect("create temp dir for redis");
        let faketime_file = fake_clock.then(|| {
            let file = dir.path().join("faketime");
            std::fs::write(&file, "+0s").expect("write faketime file");
            file
        });
        let mut node = Self {
            port: 0,
            dir,
            persistence,
            child: None,
            paused: false,
            faketime_file,
        };
        for _ in 0..10 {
            node.port = free_port();
            if node.spawn() {
                return node;
            }
        }
        panic!("could not start redis-server on a free port after 10 tries");
    }

    /// Starts the server on `self.port` in `self.dir`; false when it did not come up.
    fn spawn(&mut self) -> bool {
        let mut cmd = Command::new(redis_server());
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--protected-mode", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--save", "", "--daemonize", "no", "--loglevel", "warning"])
            .arg("--logfile")
            .arg(self.dir.path().join("redis.log"));
        match self.persistence {
            Persistence::AppendFsyncAlways => {
                cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
            }
            Persistence::None => {
                cmd.args(["--appendonly", "no"]);
            }
        }
        if let Some(file) = &self.faketime_file {
            let lib = libfaketime().expect(
                "libfaketime not found: run scripts/test.sh, which installs it (apt-get install faketime)",
            );
            cmd.env("LD_PRELOAD", lib)
                .env("FAKETIME_TIMESTAMP_FILE", file)
                .env("FAKETIME_NO_CACHE", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let Ok(child) = cmd.spawn() else {
            return false;
        };
        self.child = Some(child);
        self.paused = false;
        if self.wait_ready(Duration::from_secs(10)) {
            true
        } else {
            self.kill9();
            false
        }
    }

    fn wait_ready(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    return false; // exited, e.g. the port was taken
                }
            }
            if self.ping() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn pid(&self) -> Option<Pid> {
        self.child.as_ref().map(|c| Pid::from_raw(c.id() as i32))
    }

    /// A short-timeout synchronous connection for assertions.
    pub fn connection(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(self.url())?;
        let conn = client.get_connection_with_timeout(Duration::from_millis(500))?;
        conn.set_read_timeout(Some(Duration::from_secs(2)))?;
        conn.set_write_timeout(Some(Duration::from_secs(2)))?;
        Ok(conn)
    }

    pub fn ping(&self) -> bool {
        self.connection()
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok()
    }

    /// Runs a command for assertions; panics with context on failure.
    pub fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut conn = self
            .connection()
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url()));
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut conn)
            .unwrap_or_else(|e| panic!("{args:?} on {}: {e}", self.url()))
    }

    pub fn get(&self, key: &str) -> Option<String> {
        self.query(&["GET", key])
    }

    /// `PTTL` of a key: -2 when absent, -1 without expiry.
    pub fn pttl(&self, key: &str) -> i64 {
        self.query(&["PTTL", key])
    }

    /// kill -9: no shutdown, no final fsync beyond what `appendfsync` already did.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// SIGSTOP: the process keeps its sockets but answers nothing, like a hung node.
    pub fn pause(&mut self) {
        if let Some(pid) = self.pid() {
            kill(pid, Signal::SIGSTOP).expect("SIGSTOP redis");
            self.paused = true;
        }
    }

    pub fn resume(&mut self) {
        if let Some(pid) = self.pid() {
            kill(pid, Signal::SIGCONT).expect("SIGCONT redis");
            self.paused = false;
        }
    }

    /// Starts the node again on the same port with the same data directory.
    pub fn restart(&mut self) {
        self.kill9();
        for _ in 0..50 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("could not restart redis-server on port {}", self.port);
    }

    /// Moves this node's wall clock by `offset` (libfaketime syntax, e.g. "+60s").
    pub fn shift_clock(&self, offset: &str) {
        let file = self
            .faketime_file
            .as_ref()
            .expect("node was not started with a fake clock");
        std::fs::write(file, offset).expect("write faketime file");
    }

    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        if self.paused {
            self.resume();
        }
        self.kill9();
    }
}

/// N independent nodes.
pub struct RedisNodes {
    pub nodes: Vec<RedisNode>,
}

impl RedisNodes {
    pub fn start(count: usize, persistence: Persistence) -> Self {
        // Start in parallel: each start waits for its server to answer.
        let nodes = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..count)
                .map(|_| scope.spawn(move || RedisNode::start(persistence)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("start redis node"))
                .collect()
        });
        Self { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisNode::url).collect()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// How many nodes that are up hold `key`.
    pub fn count_key(&self, key: &str) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.is_running() && n.get(key).is_some())
            .count()
    }
}

impl std::ops::Index<usize> for RedisNodes {
    type Output = RedisNode;
    fn index(&self, index: usize) -> &RedisNode {
        &self.nodes[index]
    }
}

impl std::ops::IndexMut<usize> for RedisNodes {
    fn index_mut(&mut self, index: usize) -> &mut RedisNode {
        &mut self.nodes[index]
    }
}
