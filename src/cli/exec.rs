//! `lockedjob exec`: run a command only while holding a lock, like `etcdctl lock` or
//! `consul lock`.
//!
//! Exit codes: the child's own (128 + signal when a signal ended it); [`exit::NOT_ACQUIRED`]
//! when the lock was not acquired within `--wait`; [`exit::LEASE_LOST`] when the lease was lost
//! and the child was stopped; [`exit::USAGE`] for bad usage or configuration;
//! [`exit::SPAWN_FAILED`] when the command could not be started.

use crate::child::{self, Signals};
use crate::elect::lease_runner::{LeaseOptions, Ran, Work};
use crate::exit;
use crate::options::{parse_duration, RedisOptions};
use crate::redlock::{LeaseTiming, LockError, Redlock, DEFAULT_TTL};
use std::time::Duration;
use tracing::Instrument;

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
    #[command(flatten)]
    pub lease: LeaseOptions,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

impl Default for ExecArgs {
    fn default() -> Self {
        Self {
            redis: RedisOptions::default(),
            lock: String::new(),
            ttl: DEFAULT_TTL,
            wait: Duration::ZERO,
            lease: LeaseOptions::default(),
            command: Vec::new(),
        }
    }
}

/// Runs `exec` and returns the process exit code.
pub async fn run(args: ExecArgs) -> i32 {
    let timing = args.lease.timing(args.ttl);
    let config = args.redis.engine_config();
    if let Err(e) = timing.validate(config.drift_factor) {
        eprintln!("lockedjob exec: {e}");
        return exit::USAGE;
    }
    if args.lock.trim().is_empty() {
        eprintln!("lockedjob exec: --lock must name the lock");
        return exit::USAGE;
    }
    let engine = match Redlock::new(config) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("lockedjob exec: {e}");
            return exit::USAGE;
        }
    };
    let span = tracing::info_span!("exec", lock = %args.lock, token = tracing::field::Empty);
    run_locked(engine, args, timing).instrument(span).await
}

async fn run_locked(engine: Redlock, args: ExecArgs, timing: LeaseTiming) -> i32 {
    // Watch before acquiring, so a signal during the wait is not lost.
    let mut signals = Signals::watch();
    let acquired = if args.wait.is_zero() {
        engine.try_acquire(&args.lock, timing.ttl).await
    } else {
        tokio::select! {
            result = engine.acquire(&args.lock, timing.ttl, Some(args.wait)) => result,
            kind = signals.next() => {
                eprintln!("lockedjob exec: interrupted while waiting for the lock");
                return 128 + kind.as_raw_value();
            }
        }
    };
    let lease = match acquired {
        Ok(lease) => lease,
        Err(LockError::Config(e)) => {
            eprintln!("lockedjob exec: {e}");
            return exit::USAGE;
        }
        Err(e) => {
            eprintln!("lockedjob exec: lock {:?} not acquired: {e}", args.lock);
            return exit::NOT_ACQUIRED;
        }
    };
    tracing::Span::current().record("token", lease.token());
    tracing::info!(
        holder = lease.holder(),
        validity_ms = lease.remaining().as_millis() as u64,
        "lock acquired"
    );
    let work = Work {
        command: &args.command,
        kill_grace: args.lease.kill_grace,
        timing,
    };
    // Nobody asks `exec` to step down: it holds the lock until its command ends.
    let never = std::future::pending();
    match work.run(&engine, lease, &mut signals, never, |_| {}).await {
        Ran::Finished(status) => {
            let code = child::exit_code(status);
            tracing::info!(code, "command finished; lock released");
            code
        }
        // `SteppedDown` cannot happen: nothing asks.
        Ran::LeaseLost | Ran::SteppedDown => {
            eprintln!(
                "lockedjob exec: lease on {:?} lost (no Redis quorum renewed it); the command was stopped",
                args.lock
            );
            exit::LEASE_LOST
        }
        Ran::NotStarted(e) => {
            eprintln!("lockedjob exec: cannot start {:?}: {e}", args.command[0]);
            exit::SPAWN_FAILED
        }
        Ran::WaitFailed(e) => {
            eprintln!("lockedjob exec: waiting for the command failed: {e}");
            exit::SPAWN_FAILED
        }
    }
}
