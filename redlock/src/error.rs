//! Errors of the lock engine. Each says what went wrong, on which node, and what to do.

use std::fmt;
use std::time::Duration;

/// Why one node did not take part in a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeErrorKind {
    /// No answer within the per-node request timeout: the node is slow, hung or partitioned.
    Timeout,
    /// The TCP connection was refused or reset: the node is down or restarting.
    Refused,
    /// The node's host name did not resolve: a wrong address, or DNS down.
    Unresolved,
    /// The node rejected our credentials (AUTH).
    Auth,
    /// The Redis user lacks a right (ACL): Redis's own words, which name the command or key.
    NoPermission(String),
    /// The node did not know a script even after reloading it.
    NoScript,
    /// The node answered, but the key holds another value (or none): we are not the holder there.
    WrongValue,
    /// The node is loading its dataset after a restart.
    Loading,
    /// The node answered something the protocol never writes: a key of ours holds a foreign
    /// value or type, or the address is not a Redis server.
    BadReply(String),
    /// The TLS handshake failed: what failed and what to change.
    Tls(String),
    /// Anything else the node or the connection reported.
    Other(String),
}

impl fmt::Display for NodeErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout => f.write_str("timed out"),
            Self::Refused => f.write_str("connection refused or reset"),
            Self::Unresolved => {
                f.write_str("the host name did not resolve (check the node's address and DNS)")
            }
            Self::Auth => f.write_str("authentication failed (check the Redis user/password)"),
            Self::NoPermission(denied) => write!(
                f,
                "the Redis user lacks a right ({denied}); grant what the README's ACL SETUSER line lists"
            ),
            Self::NoScript => f.write_str("script missing (NOSCRIPT) after reload"),
            Self::WrongValue => f.write_str("lock held by another value"),
            Self::Loading => f.write_str("node is loading its dataset"),
            Self::Tls(message) => f.write_str(message),
            Self::BadReply(reply) => write!(
                f,
                "unexpected reply ({reply}): a lock, fence or progress key holds a value or type this engine never writes, or the address is not a Redis server; inspect the keys under the prefix"
            ),
            Self::Other(message) => f.write_str(message),
        }
    }
}

impl NodeErrorKind {
    /// A short name of the kind, for a metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Refused => "refused",
            Self::Unresolved => "unresolved",
            Self::Auth => "auth",
            Self::NoPermission(_) => "no_permission",
            Self::NoScript => "no_script",
            Self::WrongValue => "wrong_value",
            Self::Loading => "loading",
            Self::BadReply(_) => "bad_reply",
            Self::Tls(_) => "tls",
            Self::Other(_) => "other",
        }
    }

    /// The connection itself failed (closed, reset, or its TLS session broke), as opposed to
    /// the node answering: a fresh connection may succeed.
    pub(crate) fn means_connection_lost(&self) -> bool {
        matches!(self, Self::Refused | Self::Unresolved | Self::Tls(_))
    }

    /// Classify a redis-rs error into what an operator needs to know.
    pub(crate) fn from_redis(err: &redis::RedisError) -> Self {
        use redis::{ErrorKind, ServerErrorKind};
        if err.is_timeout() {
            return Self::Timeout;
        }
        if let Some(tls) = super::handshake::tls_cause(err) {
            return Self::Tls(super::handshake::describe(tls));
        }
        // The resolver's failure has no io::ErrorKind of its own: std and tokio both say this.
        if err.is_io_error()
            && err
                .to_string()
                .contains("failed to lookup address information")
        {
            return Self::Unresolved;
        }
        if err.is_connection_refusal() || err.is_connection_dropped() {
            return Self::Refused;
        }
        match err.kind() {
            ErrorKind::AuthenticationFailed => Self::Auth,
            ErrorKind::Server(ServerErrorKind::NoPerm) => Self::NoPermission(denial(err)),
            ErrorKind::Server(ServerErrorKind::NoScript) => Self::NoScript,
            ErrorKind::Server(ServerErrorKind::BusyLoading) => Self::Loading,
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType => Self::BadReply(err.to_string()),
            _ if matches!(err.code(), Some("WRONGTYPE" | "NOTATOKEN")) => {
                Self::BadReply(err.to_string())
            }
            _ if err.is_io_error() => Self::Refused,
            _ => {
                let text = err.to_string();
                if text.contains("NOAUTH") || text.contains("WRONGPASS") {
                    Self::Auth
                } else if let Some(call) = super::scripts::denied_call(&text) {
                    // A right missing inside a script comes back as a script error.
                    Self::NoPermission(call)
                } else {
                    Self::Other(text)
                }
            }
        }
    }
}

/// Redis's words for a denial, once: a pipeline repeats them for every command it held.
fn denial(err: &redis::RedisError) -> String {
    let first = err.clone().into_server_errors().and_then(|errors| {
        errors
            .first()
            .and_then(|(_, server)| server.details().map(|d| format!("NOPERM {d}")))
    });
    first
        .or_else(|| err.detail().map(|d| format!("NOPERM {d}")))
        .unwrap_or_else(|| err.to_string())
}

/// One node's failure, named by its address (credentials redacted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFailure {
    pub node: String,
    pub kind: NodeErrorKind,
}

impl fmt::Display for NodeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.node, self.kind)
    }
}

/// Renders a list of node failures as `a: timed out; b: refused`.
pub struct Failures<'a>(pub &'a [NodeFailure]);

impl fmt::Display for Failures<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        for (i, failure) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{failure}")?;
        }
        Ok(())
    }
}

/// Bad engine configuration: found before any node is contacted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("no Redis nodes given: pass at least one redis:// URL (three or more independent nodes for fault tolerance)")]
    NoNodes,
    #[error("Redis node URL {url:?} is not valid: {reason}; expected redis://[user:password@]host:port[/db] or rediss://...")]
    BadUrl { url: String, reason: String },
    #[error("Redis node {node} is listed twice: every node must be an independent server")]
    DuplicateNode { node: String },
    #[error("lock TTL must be greater than zero")]
    ZeroTtl,
    #[error("lock TTL {ttl:?} leaves no validity after the clock-drift allowance {drift:?}: use a TTL of at least 100ms")]
    TtlTooShort { ttl: Duration, drift: Duration },
    #[error(
        "renew interval {renew:?} must be shorter than the TTL {ttl:?} (ttl/3 is a good default)"
    )]
    RenewNotBelowTtl { renew: Duration, ttl: Duration },
    #[error("safety margin {margin:?} plus renew interval {renew:?} must be shorter than the TTL {ttl:?}, or the lease is lost before the first renewal")]
    MarginTooLarge {
        margin: Duration,
        renew: Duration,
        ttl: Duration,
    },
    #[error("request timeout must be greater than zero (50ms is the default)")]
    ZeroRequestTimeout,
    #[error("drift factor {0} must be within 0 and 0.5")]
    BadDriftFactor(String),
    #[error("lock name must not be empty")]
    EmptyLockName,
    #[error("key prefix must not be empty or contain whitespace: {0:?}")]
    BadPrefix(String),
    #[error("TLS {what} {path:?} cannot be used: {reason}")]
    TlsFile {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("Redis password file {path:?} cannot be used: {reason}")]
    PasswordFile { path: String, reason: String },
    #[error("a client certificate and its key go together: give both --redis-cert-file and --redis-key-file (LOCKEDJOB_REDIS_CERT_FILE, LOCKEDJOB_REDIS_KEY_FILE), or neither")]
    ClientCertWithoutKey,
    #[error("TLS files are given but Redis node {node} is plain redis://, which would send the lock traffic unencrypted: use rediss:// for every node")]
    TlsFilesWithPlainNode { node: String },
}

/// Why an acquire, extend or release did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(transparent)]
    Config(#[from] ConfigError),

    #[error("lock {lock:?} is held by someone else ({granted} of {nodes} nodes granted, {quorum} needed); node errors: {}", Failures(failures))]
    Contended {
        lock: String,
        granted: usize,
        quorum: usize,
        nodes: usize,
        failures: Vec<NodeFailure>,
        /// The largest progress-register value the answering nodes hold: with
        /// `try_acquire_step`, `progress >= step` means the holder is running that very step.
        progress: u64,
    },

    /// Contenders split the nodes so that no value reached a quorum: nobody holds the lock.
    /// Everyone gave their part back; the next attempt, after a short random delay, can win.
    #[error("lock {lock:?}: split vote, nobody holds it ({granted} of {nodes} nodes granted this attempt, at most {strongest_other} hold any other value, {quorum} needed); try again after a short random delay")]
    SplitVote {
        lock: String,
        granted: usize,
        strongest_other: usize,
        quorum: usize,
        nodes: usize,
        failures: Vec<NodeFailure>,
        /// As in `Contended`.
        progress: u64,
    },

    #[error("no quorum for lock {lock:?}: {granted} of {nodes} nodes answered yes, {quorum} needed; check these nodes: {}", Failures(failures))]
    NoQuorum {
        lock: String,
        granted: usize,
        quorum: usize,
        nodes: usize,
        failures: Vec<NodeFailure>,
    },

    #[error("lock {lock:?}: the attempt took {elapsed:?} of the {ttl:?} TTL, leaving no validity; raise the TTL or look at node latency")]
    NoValidityLeft {
        lock: String,
        elapsed: Duration,
        ttl: Duration,
    },

    #[error("lock {lock:?}: another acquisition issued fencing token {seen} concurrently (ours {token}); mutual exclusion was not guaranteed, so this attempt was given up")]
    FenceConflict { lock: String, token: u64, seen: u64 },

    #[error("lock {lock:?} not acquired within {waited:?} ({attempts} attempts); last: {last}")]
    WaitExpired {
        lock: String,
        waited: Duration,
        attempts: u32,
        last: Box<LockError>,
    },

    #[error("lease on {lock:?} has expired (deadline passed); acquire it again")]
    Expired { lock: String },

    #[error("lock {lock:?}: step {step} was already started by an earlier holder (progress {done}); nothing to do")]
    StepDone { lock: String, step: u64, done: u64 },
}

impl LockError {
    /// True when the lock was simply held by another holder (as opposed to node trouble).
    pub fn is_contended(&self) -> bool {
        match self {
            Self::Contended { .. } | Self::SplitVote { .. } => true,
            Self::WaitExpired { last, .. } => last.is_contended(),
            _ => false,
        }
    }

    /// Node failures behind this error, if any.
    pub fn node_failures(&self) -> &[NodeFailure] {
        match self {
            Self::Contended { failures, .. }
            | Self::SplitVote { failures, .. }
            | Self::NoQuorum { failures, .. } => failures,
            Self::WaitExpired { last, .. } => last.node_failures(),
            _ => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_are_told_apart() {
        let io =
            |kind, text: &str| redis::RedisError::from(std::io::Error::new(kind, text.to_string()));
        let table = [
            (
                io(
                    std::io::ErrorKind::Other,
                    "failed to lookup address information: Name or service not known",
                ),
                NodeErrorKind::Unresolved,
            ),
            (
                io(std::io::ErrorKind::ConnectionRefused, "Connection refused"),
                NodeErrorKind::Refused,
            ),
            (
                io(
                    std::io::ErrorKind::ConnectionReset,
                    "Connection reset by peer",
                ),
                NodeErrorKind::Refused,
            ),
        ];
        for (err, kind) in table {
            assert_eq!(NodeErrorKind::from_redis(&err), kind, "{err}");
        }
    }
}
