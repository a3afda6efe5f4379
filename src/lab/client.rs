//! One lab client, run as its own process (`lockedjob lab-client`, started by the lab) so that
//! it can be paused with SIGSTOP like a real process in a GC pause. It loops: acquire the lock,
//! enter the critical section, work and write to the fenced store under the watchdog, leave,
//! release. Every step goes to stdout as one JSON line, stamped with the monotonic clock.

use super::history::{monotonic_us, ClientEvent, ClientOp};
use crate::redlock::{LeaseTiming, Redlock, RedlockConfig};
use clap::Args;
use std::io::Write;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    #[arg(long)]
    pub id: u32,
    /// Comma-separated lock node URLs.
    #[arg(long, value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// URL of the fenced store (a Redis node outside the lock's nodes).
    #[arg(long)]
    pub store: String,
    #[arg(long, default_value = "lab")]
    pub lock: String,
    #[arg(long, default_value_t = 1000)]
    pub ttl_ms: u64,
    /// How long a client stays in the critical section when nothing goes wrong.
    #[arg(long, default_value_t = 300)]
    pub hold_ms: u64,
    /// One unit of work between lease checks; each ends with a write to the store.
    #[arg(long, default_value_t = 40)]
    pub work_ms: u64,
    #[arg(long, default_value_t = 100)]
    pub request_timeout_ms: u64,
    /// CA that verifies rediss:// lock nodes (the lab's --tls-dir).
    #[arg(long)]
    pub redis_ca_file: Option<std::path::PathBuf>,
    /// A store that takes every write: the broken build the checkers must catch.
    #[arg(long)]
    pub unfenced_store: bool,
}

/// The fenced write: taken only if no larger token wrote before. Logs every attempt, in the
/// store's order, for the checker.
const FENCED_WRITE: &str = r"
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
local accepted = 0
if token >= last then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('SET', KEYS[2], ARGV[2])
  accepted = 1
end
redis.call('RPUSH', KEYS[3], ARGV[3] .. ':' .. ARGV[1] .. ':' .. accepted)
return accepted
";

/// [`FENCED_WRITE`] without the fence: takes every write (`--unfenced-store`).
const UNFENCED_WRITE: &str = r"
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
redis.call('RPUSH', KEYS[3], ARGV[3] .. ':' .. ARGV[1] .. ':1')
return 1
";

/// Lock values are `{HOLDER_PREFIX}{id}/{random}`: the lab reads who holds from them.
pub const HOLDER_PREFIX: &str = "lab/client-";

pub const STORE_TOKEN_KEY: &str = "lab:store:last_token";
pub const STORE_DATA_KEY: &str = "lab:store:data";
pub const STORE_LOG_KEY: &str = "lab:store:log";

fn emit(client: u32, op: ClientOp) {
    let event = ClientEvent {
        at_us: monotonic_us(),
        client,
        op,
    };
    if let Ok(line) = serde_json::to_string(&event) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// An `Instant` on the shared monotonic clock, in microseconds.
fn monotonic_of(instant: Instant) -> u64 {
    let now = Instant::now();
    let now_us = monotonic_us();
    if instant >= now {
        now_us + (instant - now).as_micros() as u64
    } else {
        now_us.saturating_sub((now - instant).as_micros() as u64)
    }
}

/// Runs the client until SIGTERM; returns the exit code.
pub async fn run(args: ClientArgs) -> i32 {
    let id = args.id;
    let mut config = RedlockConfig::new(args.nodes.clone());
    config.request_timeout = Duration::from_millis(args.request_timeout_ms);
    config.holder = format!("{HOLDER_PREFIX}{id}");
    config.tls.ca_file = args.redis_ca_file.clone();
    let engine = match Redlock::new(config) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("lab client {id}: {e}");
            return 64;
        }
    };
    let store = match redis::Client::open(args.store.as_str()) {
        Ok(client) => client,
        Err(e) => {
            eprintln!("lab client {id}: bad store URL: {e}");
            return 64;
        }
    };
    let mut store = match store.get_multiplexed_async_connection().await {
        Ok(conn) => conn,
        Err(e) => {
            eprintln!("lab client {id}: cannot reach the store: {e}");
            return 69;
        }
    };
    let fenced_write = redis::Script::new(if args.unfenced_store {
        UNFENCED_WRITE
    } else {
        FENCED_WRITE
    });
    // Stop on SIGTERM, or when the lab's end of stdin closes (the lab died).
    let stop = CancellationToken::new();
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            if let Ok(mut term) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            {
                term.recv().await;
            }
            stop.cancel();
        });
    }
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut stdin = tokio::io::stdin();
            let mut buf = [0u8; 64];
            while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
            stop.cancel();
        });
    }
    let ttl = Duration::from_millis(args.ttl_ms);
    let timing = LeaseTiming::from_ttl(ttl);
    while !stop.is_cancelled() {
        emit(id, ClientOp::AcquireStart);
        let lease = match engine.try_acquire(&args.lock, ttl).await {
            Ok(lease) => lease,
            Err(e) => {
                emit(
                    id,
                    ClientOp::AcquireFailed {
                        reason: e.to_string(),
                    },
                );
                tokio::time::sleep(Duration::from_millis(10 + rand::random::<u64>() % 40)).await;
                continue;
            }
        };
        let token = lease.token();
        emit(
            id,
            ClientOp::Acquired {
                token,
                validity_ms: lease
                    .deadline()
                    .saturating_duration_since(lease.acquired_at())
                    .as_millis() as u64,
                deadline_us: monotonic_of(lease.deadline()),
            },
        );
        let watchdog = crate::redlock::Watchdog::spawn(engine.clone(), lease.clone(), timing);
        let lost = watchdog.lost();
        let mut status = watchdog.subscribe();
        let reporter = tokio::spawn({
            let lost = lost.clone();
            async move {
                let mut deadline = status.borrow().deadline;
                loop {
                    tokio::select! {
                        biased;
                        _ = lost.cancelled() => {
                            emit(id, ClientOp::LeaseLost { token });
                            return;
                        }
                        changed = status.changed() => {
                            if changed.is_err() {
                                return;
                            }
                            let now = status.borrow().deadline;
                            if now > deadline {
                                deadline = now;
                                emit(id, ClientOp::Extended { token, deadline_us: monotonic_of(now) });
                            }
                        }
                    }
                }
            }
        });
        emit(id, ClientOp::Enter { token });
        let leave_at = Instant::now() + Duration::from_millis(args.hold_ms);
        // The lease is checked before each unit of work, not between the work and its write:
        // a pause there (GC, SIGSTOP) is what only the fenced store can catch.
        while Instant::now() < leave_at && !lost.is_cancelled() && !stop.is_cancelled() {
            tokio::time::sleep(Duration::from_millis(args.work_ms)).await;
            emit(id, ClientOp::WriteStart { token });
            let accepted: redis::RedisResult<i64> = fenced_write
                .key(STORE_TOKEN_KEY)
                .key(STORE_DATA_KEY)
                .key(STORE_LOG_KEY)
                .arg(token)
                .arg(format!("written by client {id} with token {token}"))
                .arg(id)
                .invoke_async(&mut store)
                .await;
            match accepted {
                Ok(n) => emit(
                    id,
                    ClientOp::Write {
                        token,
                        accepted: n == 1,
                    },
                ),
                Err(e) => eprintln!("lab client {id}: store write failed: {e}"),
            }
        }
        emit(id, ClientOp::Exit { token });
        if watchdog.release(&engine).await {
            emit(id, ClientOp::Released { token });
        }
        // Let the reporter see a loss that raced the release.
        let _ = tokio::time::timeout(Duration::from_millis(50), reporter).await;
        // Give the others a chance, as a real job between runs would.
        tokio::time::sleep(Duration::from_millis(20 + rand::random::<u64>() % 60)).await;
    }
    0
}
