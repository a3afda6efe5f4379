//! What went wrong in the harness, and the free-port helper every part starts with.

/// What went wrong starting or breaking a part, and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("redis-server not found in /usr/bin or /usr/local/bin: install it (apt-get install redis-server)")]
    RedisServerMissing,
    #[error("redis-server did not come up; the end of its log:\n{0}")]
    NotReady(String),
    #[error("cannot build the clock-skew shim (needs a C compiler, `cc`): {0}")]
    ClockShim(String),
    #[error("this node was not started with a movable clock")]
    ClockNotSkewable,
    #[error("cannot {0}: {1}")]
    Io(&'static str, #[source] std::io::Error),
    #[error("cannot signal the process: {0}")]
    Signal(#[source] nix::Error),
}

/// Binds port 0 on loopback to learn a free port. A small race remains until the server binds
/// it; callers retry on a failed start.
pub fn free_port() -> Result<u16, HarnessError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| HarnessError::Io("bind 127.0.0.1:0", e))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| HarnessError::Io("read a bound address", e))
}
