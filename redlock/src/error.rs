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
                "the Redis user lacks a right ({denied}); grant what the ACL SETUSER line of docs/security.md lists"
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
    /// The node's address, credentials removed.
    pub node: String,
    /// What went wrong there.
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
    /// The list of nodes is empty.
    #[error("no Redis nodes given: pass at least one redis:// URL (three or more independent nodes for fault tolerance)")]
    NoNodes,
    /// A node URL cannot be used: not `redis://` or `rediss://`, not parsable, not TCP, without
    /// a host, with certificate verification turned off, or not one the Redis client takes.
    #[error("Redis node URL {url:?} is not valid: {reason}; expected redis://[user:password@]host:port[/db] or rediss://...")]
    BadUrl {
        /// The URL (or the node's address), credentials hidden.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Two URLs name the same node (scheme, host, port and database).
    #[error("Redis node {node} is listed twice: every node must be an independent server")]
    DuplicateNode {
        /// The node's address, credentials removed.
        node: String,
    },
    /// A TTL of zero.
    #[error("lock TTL must be greater than zero")]
    ZeroTtl,
    /// A TTL the clock-drift allowance leaves too little of: in [`LeaseTiming::validate`], one
    /// under 100 ms or at most twice the allowance; in an acquisition, one at most the allowance.
    ///
    /// [`LeaseTiming::validate`]: crate::LeaseTiming::validate
    #[error("lock TTL {ttl:?} leaves no validity after the clock-drift allowance {drift:?}: use a TTL of at least 100ms")]
    TtlTooShort {
        /// The TTL given.
        ttl: Duration,
        /// The clock-drift allowance for that TTL: `ttl × drift_factor + 2 ms`.
        drift: Duration,
    },
    /// A renew interval of zero, or not shorter than the TTL.
    #[error(
        "renew interval {renew:?} must be shorter than the TTL {ttl:?} (ttl/3 is a good default)"
    )]
    RenewNotBelowTtl {
        /// The renew interval given.
        renew: Duration,
        /// The TTL.
        ttl: Duration,
    },
    /// The safety margin, the renew interval and the clock-drift allowance together reach the
    /// TTL: the watchdog would give up on the lease before its first renewal.
    #[error("safety margin {margin:?} plus renew interval {renew:?} must be shorter than the TTL {ttl:?}, or the lease is lost before the first renewal")]
    MarginTooLarge {
        /// The safety margin given.
        margin: Duration,
        /// The renew interval given.
        renew: Duration,
        /// The TTL.
        ttl: Duration,
    },
    /// A request timeout of zero.
    #[error("request timeout must be greater than zero (50ms is the default)")]
    ZeroRequestTimeout,
    /// A drift factor outside 0 to 0.5, or NaN; the factor as text.
    #[error("drift factor {0} must be within 0 and 0.5")]
    BadDriftFactor(String),
    /// An empty lock name.
    #[error("lock name must not be empty")]
    EmptyLockName,
    /// A key prefix that is empty or contains whitespace; the prefix given.
    #[error("key prefix must not be empty or contain whitespace: {0:?}")]
    BadPrefix(String),
    /// A TLS file cannot be read, is not valid PEM, holds no certificate (or no private key, or
    /// one of an unsupported type), or (the client key) is not the client certificate's key.
    #[error("TLS {what} {path:?} cannot be used: {reason}")]
    TlsFile {
        /// Which file: `CA file`, `client certificate file` or `client key file`.
        what: &'static str,
        /// The file's path.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The password file cannot be read, or is empty.
    #[error("Redis password file {path:?} cannot be used: {reason}")]
    PasswordFile {
        /// The file's path.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Only one of the client certificate file and the client key file is given.
    #[error("a client certificate and its key go together: give both --redis-cert-file and --redis-key-file (LOCKEDJOB_REDIS_CERT_FILE, LOCKEDJOB_REDIS_KEY_FILE), or neither")]
    ClientCertWithoutKey,
    /// TLS files are given, but a node is plain `redis://`.
    #[error("TLS files are given but Redis node {node} is plain redis://, which would send the lock traffic unencrypted: use rediss:// for every node")]
    TlsFilesWithPlainNode {
        /// That node's address, credentials removed.
        node: String,
    },
}

/// Why an acquire, extend or release did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The call's arguments are invalid (an empty lock name, a TTL too short): trying again
    /// cannot help, so `acquire` returns this at once.
    #[error(transparent)]
    Config(#[from] ConfigError),

    /// Another holder holds the lock, or may: one other value sits on enough nodes, counting
    /// those that did not answer, to reach a quorum. This attempt gave back what it took.
    #[error("lock {lock:?} is held by someone else ({granted} of {nodes} nodes granted, {quorum} needed); node errors: {}", Failures(failures))]
    Contended {
        /// The lock name.
        lock: String,
        /// Nodes that granted this attempt.
        granted: usize,
        /// Nodes that must agree.
        quorum: usize,
        /// All nodes.
        nodes: usize,
        /// Nodes that failed, and those that refused (as [`NodeErrorKind::WrongValue`]).
        failures: Vec<NodeFailure>,
        /// The largest progress-register value the answering nodes hold: with
        /// `try_acquire_step`, `progress >= step` means the holder is running that very step.
        progress: u64,
    },

    /// Contenders split the nodes so that no value reached a quorum: nobody holds the lock.
    /// Everyone gave their part back; the next attempt, after a short random delay, can win.
    #[error("lock {lock:?}: split vote, nobody holds it ({granted} of {nodes} nodes granted this attempt, at most {strongest_other} hold any other value, {quorum} needed); try again after a short random delay")]
    SplitVote {
        /// The lock name.
        lock: String,
        /// Nodes that granted this attempt.
        granted: usize,
        /// On how many answering nodes the most common other value sits.
        strongest_other: usize,
        /// Nodes that must agree.
        quorum: usize,
        /// All nodes.
        nodes: usize,
        /// Nodes that failed, and those that refused (as [`NodeErrorKind::WrongValue`]).
        failures: Vec<NodeFailure>,
        /// As in `Contended`.
        progress: u64,
    },

    /// Fewer than a quorum of nodes said yes to a round: to the lock (with no node holding
    /// another value), the fence, the progress register, or a renewal; `failures` says why.
    /// An acquisition gave back what it took.
    #[error("no quorum for lock {lock:?}: {granted} of {nodes} nodes answered yes, {quorum} needed; check these nodes: {}", Failures(failures))]
    NoQuorum {
        /// The lock name.
        lock: String,
        /// Nodes that said yes.
        granted: usize,
        /// Nodes that must agree.
        quorum: usize,
        /// All nodes.
        nodes: usize,
        /// Nodes that failed or, in a renewal, no longer hold the lease's value.
        failures: Vec<NodeFailure>,
    },

    /// The acquisition attempt or the renewal took so long that the TTL, less that time and
    /// the clock-drift allowance, left no validity. An acquisition gave back what it took.
    #[error("lock {lock:?}: the attempt took {elapsed:?} of the {ttl:?} TTL, leaving no validity; raise the TTL or look at node latency")]
    NoValidityLeft {
        /// The lock name.
        lock: String,
        /// How long the acquisition attempt or the renewal round took.
        elapsed: Duration,
        /// The lease TTL.
        ttl: Duration,
    },

    /// Phase 2 met a fence at or above its token in each of its 3 rounds: another acquisition
    /// issued tokens concurrently, so this one gave up and gave back what it took.
    #[error("lock {lock:?}: another acquisition issued fencing token {seen} concurrently (ours {token}); mutual exclusion was not guaranteed, so this attempt was given up")]
    FenceConflict {
        /// The lock name.
        lock: String,
        /// The token this attempt proposed last.
        token: u64,
        /// The largest fence a node reported: at least `token`.
        seen: u64,
    },

    /// `acquire` gave up: its wait, or its retries, ran out before an attempt succeeded.
    #[error("lock {lock:?} not acquired within {waited:?} ({attempts} attempts); last: {last}")]
    WaitExpired {
        /// The lock name.
        lock: String,
        /// Time since `acquire` began.
        waited: Duration,
        /// Attempts made.
        attempts: u32,
        /// The last attempt's error.
        last: Box<LockError>,
    },

    /// The lease's deadline passed, before a renewal began or by the time it came back.
    #[error("lease on {lock:?} has expired (deadline passed); acquire it again")]
    Expired {
        /// The lock name.
        lock: String,
    },

    /// A quorum granted the lock, but a holder had already started the step asked for, or a
    /// later one: nothing to do. This attempt gave the lock back.
    #[error("lock {lock:?}: step {step} was already started by an earlier holder (progress {done}); nothing to do")]
    StepDone {
        /// The lock name.
        lock: String,
        /// The step asked for.
        step: u64,
        /// The largest progress register the answering nodes hold: at least `step`.
        done: u64,
    },
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
