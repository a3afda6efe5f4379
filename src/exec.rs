//! `lockedjob exec`: run a command only while holding a lock, like `etcdctl lock` or
//! `consul lock`.
//!
//! Exit codes: the child's own (128 + signal when a signal ended it); [`EXIT_NOT_ACQUIRED`]
//! when the lock was not acquired within `--wait`; [`EXIT_LEASE_LOST`] when the lease was lost
//! and the child was stopped; [`EXIT_USAGE`] for bad usage or configuration;
//! [`EXIT_SPAWN_FAILED`] when the command could not be started.

use crate::api::{ENV_FENCING_TOKEN, ENV_HOLDER, ENV_LOCK_NAME};
use crate::options::{parse_duration, RedisOptions};
use crate::redlock::{LeaseTiming, LockError, Redlock, Watchdog, DEFAULT_TTL};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::process::ExitStatus;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};
use tracing::Instrument;

/// Bad usage or configuration (sysexits EX_USAGE).
pub const EXIT_USAGE: i32 = 64;
/// The lock was not acquired within `--wait` (sysexits EX_TEMPFAIL: try again later).
pub const EXIT_NOT_ACQUIRED: i32 = 75;
/// The lease was lost while the command ran; the command was stopped.
pub const EXIT_LEASE_LOST: i32 = 76;
/// The command could not be started (as shells do for "command not found").
pub const EXIT_SPAWN_FAILED: i32 = 127;

#[derive(Debug, Clone, clap::Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub redis: RedisOptions,
    /// Lock name; every runner of the same job must use the same name.
    #[arg(long)]
    pub lock: String,
    /// Lease TTL: how long the lock outlives a runner that vanished.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub ttl: Duration,
    /// How long to wait for the lock before giving up with exit code 75 (0: one attempt).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub wait: Duration,
    /// How often to renew the lease (default: ttl/3).
    #[arg(long, value_parser = parse_duration)]
    pub renew_interval: Option<Duration>,
    /// Give the lease up this long before its deadline when renewals fail (default: ttl/10,
    /// at most 2s). The command is stopped within this margin.
    #[arg(long, value_parser = parse_duration)]
    pub safety_margin: Option<Duration>,
    /// After lease loss, time between SIGTERM and SIGKILL; always cut short so that the
    /// command is dead before the lease deadline.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub kill_grace: Duration,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

impl ExecArgs {
    fn timing(&self) -> LeaseTiming {
        let defaults = LeaseTiming::from_ttl(self.ttl);
        LeaseTiming {
            ttl: self.ttl,
            renew_interval: self.renew_interval.unwrap_or(defaults.renew_interval),
            safety_margin: self.safety_margin.unwrap_or(defaults.safety_margin),
        }
    }
}

impl Default for ExecArgs {
    fn default() -> Self {
        Self {
            redis: RedisOptions::default(),
            lock: String::new(),
            ttl: DEFAULT_TTL,
            wait: Duration::ZERO,
            renew_interval: None,
            safety_margin: None,
            kill_grace: Duration::from_secs(10),
            command: Vec::new(),
        }
    }
}

/// Signals passed on to the command's process group.
const FORWARDED: [SignalKind; 6] = [
    SignalKind::terminate(),
    SignalKind::interrupt(),
    SignalKind::hangup(),
    SignalKind::quit(),
    SignalKind::user_defined1(),
    SignalKind::user_defined2(),
];

/// Runs `exec` and returns the process exit code.
pub async fn run(args: ExecArgs) -> i32 {
    let timing = args.timing();
    let config = args.redis.engine_config();
    if let Err(e) = timing.validate(config.drift_factor) {
        eprintln!("lockedjob exec: {e}");
        return EXIT_USAGE;
    }
    if args.lock.trim().is_empty() {
        eprintln!("lockedjob exec: --lock must name the lock");
        return EXIT_USAGE;
    }
    let engine = match Redlock::new(config) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("lockedjob exec: {e}");
            return EXIT_USAGE;
        }
    };
    let span = tracing::info_span!("exec", lock = %args.lock, token = tracing::field::Empty);
    run_locked(engine, args, timing).instrument(span).await
}

async fn run_locked(engine: Redlock, args: ExecArgs, timing: LeaseTiming) -> i32 {
    // Install handlers before acquiring, so a signal during the wait is not lost.
    let mut signals = Vec::new();
    for kind in FORWARDED {
        match signal(kind) {
            Ok(stream) => signals.push((kind, stream)),
            Err(e) => tracing::warn!(error = %e, "cannot watch a signal"),
        }
    }

    let acquired = if args.wait.is_zero() {
        engine.try_acquire(&args.lock, timing.ttl).await
    } else {
        tokio::select! {
            result = engine.acquire(&args.lock, timing.ttl, Some(args.wait)) => result,
            kind = next_signal(&mut signals) => {
                eprintln!("lockedjob exec: interrupted while waiting for the lock");
                return 128 + kind.as_raw_value();
            }
        }
    };
    let lease = match acquired {
        Ok(lease) => lease,
        Err(LockError::Config(e)) => {
            eprintln!("lockedjob exec: {e}");
            return EXIT_USAGE;
        }
        Err(e) => {
            eprintln!("lockedjob exec: lock {:?} not acquired: {e}", args.lock);
            return EXIT_NOT_ACQUIRED;
        }
    };
    tracing::Span::current().record("token", lease.token());
    tracing::info!(
        holder = lease.holder(),
        validity_ms = lease.remaining().as_millis() as u64,
        "lock acquired"
    );

    let mut child = match spawn_child(&args, &lease) {
        Ok(child) => child,
        Err(e) => {
            eprintln!("lockedjob exec: cannot start {:?}: {e}", args.command[0]);
            engine.release(&lease).await;
            return EXIT_SPAWN_FAILED;
        }
    };
    let child_group = child.id().map(|pid| Pid::from_raw(pid as i32));
    let watchdog = Watchdog::spawn(engine.clone(), lease, timing);
    let lost = watchdog.lost();

    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            kind = next_signal(&mut signals) => {
                tracing::info!(signal = kind.as_raw_value(), "forwarding signal to the command");
                send(child_group, signal_of(kind));
            }
            _ = lost.cancelled() => {
                let deadline = watchdog.status().deadline;
                break stop_child(&mut child, child_group, deadline, args.kill_grace, timing.safety_margin).await;
            }
        }
    };

    let lease_held = watchdog.release(&engine).await;
    if !lease_held {
        eprintln!(
            "lockedjob exec: lease on {:?} lost (no Redis quorum renewed it); the command was stopped",
            args.lock
        );
        return EXIT_LEASE_LOST;
    }
    match status {
        Ok(status) => {
            tracing::info!(code = exit_code(status), "command finished; lock released");
            exit_code(status)
        }
        Err(e) => {
            eprintln!("lockedjob exec: waiting for the command failed: {e}");
            EXIT_SPAWN_FAILED
        }
    }
}

fn spawn_child(args: &ExecArgs, lease: &crate::redlock::Lease) -> std::io::Result<Child> {
    let mut command = Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env(ENV_FENCING_TOKEN, lease.token().to_string())
        .env(ENV_LOCK_NAME, lease.name())
        .env(ENV_HOLDER, lease.holder())
        // Its own process group: signals reach the command and its children exactly once, and
        // lease loss can stop the whole tree.
        .process_group(0)
        .kill_on_drop(true);
    command.spawn()
}

/// SIGTERM now, SIGKILL when the grace ends, and never later than shortly before the deadline.
async fn stop_child(
    child: &mut Child,
    group: Option<Pid>,
    deadline: Instant,
    grace: Duration,
    safety_margin: Duration,
) -> std::io::Result<ExitStatus> {
    tracing::warn!("lease lost: sending SIGTERM to the command");
    send(group, Signal::SIGTERM);
    let latest = deadline.checked_sub(safety_margin / 4).unwrap_or(deadline);
    let kill_at = (Instant::now() + grace).min(latest);
    tokio::select! {
        status = child.wait() => status,
        _ = tokio::time::sleep_until(kill_at.into()) => {
            tracing::warn!("grace over: sending SIGKILL to the command");
            send(group, Signal::SIGKILL);
            child.wait().await
        }
    }
}

fn send(group: Option<Pid>, sig: Signal) {
    if let Some(group) = group {
        // ESRCH: the group is already gone, which is what we wanted.
        let _ = killpg(group, sig);
    }
}

fn signal_of(kind: SignalKind) -> Signal {
    Signal::try_from(kind.as_raw_value()).unwrap_or(Signal::SIGTERM)
}

async fn next_signal(signals: &mut [(SignalKind, tokio::signal::unix::Signal)]) -> SignalKind {
    if signals.is_empty() {
        return std::future::pending().await;
    }
    let futures = signals
        .iter_mut()
        .map(|(kind, stream)| Box::pin(async move { stream.recv().await.map(|_| *kind) }));
    match futures::future::select_all(futures).await.0 {
        Some(kind) => kind,
        None => std::future::pending().await,
    }
}

/// The shell convention: the exit code, or 128 + the signal that ended the process.
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}
