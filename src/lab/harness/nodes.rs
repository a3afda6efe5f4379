//! Independent `redis-server` processes (no replication between them), as Redlock requires,
//! with the faults the lab and the tests inject: kill -9, SIGSTOP/SIGCONT, restart, and a wall
//! clock that can be moved while the server runs.

use super::clock::SkewedClock;
use super::error::{free_port, HarnessError};
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

/// A node that serves TLS only (its plaintext port off), from PEM files the caller made.
#[derive(Debug, Clone)]
pub struct NodeTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// Verifies client certificates, and is what the harness's own checks trust.
    pub ca_file: PathBuf,
    /// `tls-auth-clients yes`: a client without a certificate the CA signed is refused.
    pub require_client_cert: bool,
    /// Certificate and key the harness's own checks present (needed with client certificates).
    pub client: Option<(PathBuf, PathBuf)>,
    /// Host in the node's URL: one the certificate names (the server binds 127.0.0.1).
    pub host: String,
}

pub struct RedisNode {
    port: u16,
    dir: tempfile::TempDir,
    persistence: Persistence,
    child: Option<Child>,
    paused: bool,
    /// Set for nodes whose wall clock can be moved at run time.
    clock: Option<SkewedClock>,
    tls: Option<NodeTls>,
}

fn redis_server() -> Result<&'static Path, HarnessError> {
    ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
        .iter()
        .map(Path::new)
        .find(|p| p.exists())
        .ok_or(HarnessError::RedisServerMissing)
}

impl RedisNode {
    pub fn start(persistence: Persistence) -> Result<Self, HarnessError> {
        Self::start_inner(persistence, false, None)
    }

    /// A node that speaks TLS only.
    pub fn start_tls(persistence: Persistence, tls: NodeTls) -> Result<Self, HarnessError> {
        Self::start_inner(persistence, false, Some(tls))
    }

    /// A node whose wall clock can be moved at run time with [`RedisNode::shift_clock`].
    pub fn start_with_skewable_clock(persistence: Persistence) -> Result<Self, HarnessError> {
        Self::start_inner(persistence, true, None)
    }

    fn start_inner(
        persistence: Persistence,
        skewable: bool,
        tls: Option<NodeTls>,
    ) -> Result<Self, HarnessError> {
        let dir = tempfile::Builder::new()
            .prefix("lockedjob-redis-")
            .tempdir()
            .map_err(|e| HarnessError::Io("create a temp dir for redis-server", e))?;
        let clock = if skewable {
            Some(SkewedClock::new(&dir.path().join("clock-skew"))?)
        } else {
            None
        };
        let mut node = Self {
            port: 0,
            dir,
            persistence,
            child: None,
            paused: false,
            clock,
            tls,
        };
        for _ in 0..10 {
            node.port = free_port()?;
            if node.spawn()? {
                return Ok(node);
            }
        }
        Err(HarnessError::NotReady(node.log_tail()))
    }

    /// Starts the server on `self.port` in `self.dir`; false when it did not come up (the
    /// port was taken meanwhile, say).
    fn spawn(&mut self) -> Result<bool, HarnessError> {
        let mut cmd = Command::new(redis_server()?);
        match &self.tls {
            None => {
                cmd.arg("--port").arg(self.port.to_string());
            }
            Some(tls) => {
                cmd.args(["--port", "0", "--tls-port"])
                    .arg(self.port.to_string())
                    .arg("--tls-cert-file")
                    .arg(&tls.cert_file)
                    .arg("--tls-key-file")
                    .arg(&tls.key_file)
                    .arg("--tls-ca-cert-file")
                    .arg(&tls.ca_file)
                    .arg("--tls-auth-clients")
                    .arg(if tls.require_client_cert { "yes" } else { "no" });
            }
        }
        cmd.args(["--bind", "127.0.0.1", "--protected-mode", "no"])
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
        if let Some(clock) = &self.clock {
            clock.apply(&mut cmd);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd
            .spawn()
            .map_err(|e| HarnessError::Io("start redis-server", e))?;
        self.child = Some(child);
        self.paused = false;
        if self.wait_ready(Duration::from_secs(10)) {
            Ok(true)
        } else {
            self.kill9();
            Ok(false)
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
            if self.answers_as_ours() || self.accepts_tls_connections() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn url(&self) -> String {
        match &self.tls {
            None => format!("redis://127.0.0.1:{}", self.port),
            Some(tls) => format!("rediss://{}:{}", tls.host, self.port),
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    fn pid(&self) -> Option<Pid> {
        self.child.as_ref().map(|c| Pid::from_raw(c.id() as i32))
    }

    /// A short-timeout synchronous connection for checks.
    pub fn connection(&self) -> redis::RedisResult<redis::Connection> {
        let client = match &self.tls {
            None => redis::Client::open(self.url())?,
            Some(tls) => redis::Client::build_with_tls(self.url(), tls.certificates()?)?,
        };
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

    /// Whether the server on our port is our child: two starts can be handed the same free
    /// port, and the one whose server could not bind it would otherwise take the other's
    /// answer for its own (two nodes on one port, seen in CI).
    fn answers_as_ours(&self) -> bool {
        let Some(pid) = self.child.as_ref().map(Child::id) else {
            return false;
        };
        let ours = format!("process_id:{pid}");
        self.command::<String>(&["INFO", "server"])
            .is_ok_and(|info| info.lines().any(|line| line.trim() == ours))
    }

    /// For TLS nodes whose certificate the harness cannot verify (expired, or for another
    /// name, on purpose): listening is as ready as the harness can tell.
    fn accepts_tls_connections(&self) -> bool {
        self.tls.is_some()
            && std::net::TcpStream::connect_timeout(
                &std::net::SocketAddr::from(([127, 0, 0, 1], self.port)),
                Duration::from_millis(200),
            )
            .is_ok()
    }

    /// Runs one command on a fresh connection.
    pub fn command<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        let mut conn = self.connection()?;
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut conn)
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
    pub fn pause(&mut self) -> Result<(), HarnessError> {
        if let Some(pid) = self.pid() {
            kill(pid, Signal::SIGSTOP).map_err(HarnessError::Signal)?;
            self.paused = true;
        }
        Ok(())
    }

    pub fn resume(&mut self) -> Result<(), HarnessError> {
        if let Some(pid) = self.pid() {
            kill(pid, Signal::SIGCONT).map_err(HarnessError::Signal)?;
            self.paused = false;
        }
        Ok(())
    }

    /// Starts the node again on the same port with the same data directory (kill -9 first if
    /// it runs).
    pub fn restart(&mut self) -> Result<(), HarnessError> {
        self.kill9();
        for _ in 0..50 {
            if self.spawn()? {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(HarnessError::NotReady(self.log_tail()))
    }

    /// Moves this node's wall clock (`CLOCK_REALTIME`, which Redis expires keys by) to
    /// `offset` from the true time, at once, while it runs.
    pub fn shift_clock(&self, offset: Duration) -> Result<(), HarnessError> {
        self.clock
            .as_ref()
            .ok_or(HarnessError::ClockNotSkewable)?
            .set(offset)
    }

    /// Deletes what the node keeps on disk (its append-only files and any snapshot), as a
    /// lost disk would: it must be stopped. Its log stays.
    pub fn wipe(&mut self) -> Result<(), HarnessError> {
        let dir = self.dir.path();
        let aof = dir.join("appendonlydir");
        if aof.exists() {
            std::fs::remove_dir_all(&aof).map_err(|e| HarnessError::Io("wipe a node's data", e))?;
        }
        let snapshot = dir.join("dump.rdb");
        if snapshot.exists() {
            std::fs::remove_file(&snapshot)
                .map_err(|e| HarnessError::Io("wipe a node's data", e))?;
        }
        Ok(())
    }

    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }
}

impl NodeTls {
    fn certificates(&self) -> redis::RedisResult<redis::TlsCertificates> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| {
                redis::RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "cannot read a TLS file",
                    format!("{}: {e}", path.display()),
                ))
            })
        };
        let client_tls = match &self.client {
            Some((cert, key)) => Some(redis::ClientTlsConfig {
                client_cert: read(cert)?,
                client_key: read(key)?,
            }),
            None => None,
        };
        Ok(redis::TlsCertificates {
            client_tls,
            root_cert: Some(read(&self.ca_file)?),
        })
    }
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        if self.paused {
            let _ = self.resume();
        }
        self.kill9();
    }
}

/// N independent nodes.
pub struct RedisNodes {
    pub nodes: Vec<RedisNode>,
}

impl RedisNodes {
    pub fn start(count: usize, persistence: Persistence) -> Result<Self, HarnessError> {
        Self::start_with(count, persistence, |_| false, None)
    }

    /// Starts `count` nodes, those for which `skewable(index)` holds with a movable clock.
    pub fn start_where(
        count: usize,
        persistence: Persistence,
        skewable: impl Fn(usize) -> bool + Sync,
    ) -> Result<Self, HarnessError> {
        Self::start_with(count, persistence, skewable, None)
    }

    /// `count` nodes that speak TLS only, all with the same certificate.
    pub fn start_tls(
        count: usize,
        persistence: Persistence,
        tls: &NodeTls,
    ) -> Result<Self, HarnessError> {
        Self::start_with(count, persistence, |_| false, Some(tls))
    }

    /// `count` nodes, those for which `skewable(index)` holds with a movable clock, all
    /// serving TLS only when `tls` is given.
    pub fn start_with(
        count: usize,
        persistence: Persistence,
        skewable: impl Fn(usize) -> bool + Sync,
        tls: Option<&NodeTls>,
    ) -> Result<Self, HarnessError> {
        // In parallel: each start waits for its server to answer.
        let nodes = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..count)
                .map(|i| {
                    let skew = skewable(i);
                    let tls = tls.cloned();
                    scope.spawn(move || RedisNode::start_inner(persistence, skew, tls))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(HarnessError::NotReady("start panicked".into())))
                })
                .collect::<Result<Vec<_>, _>>()
        })?;
        Ok(Self { nodes })
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisNode::url).collect()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
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
