//! Runs a critical section under a lock held on the Redis nodes named on the command line:
//!
//! ```text
//! cargo run -p lockedjob-redlock --example critical_section -- \
//!     redis://127.0.0.1:6379 redis://127.0.0.1:6380 redis://127.0.0.1:6381
//! ```
//!
//! Start it twice at once: one prints its fencing token and works, the other is turned away
//! and says who holds the lock.

use lockedjob_redlock::{LeaseTiming, LockError, Redlock, RedlockConfig, Watchdog};
use std::process::ExitCode;
use std::time::Duration;

const LOCK: &str = "critical-section-example";
const TTL: Duration = Duration::from_secs(10);
const WORK: Duration = Duration::from_secs(3);

#[tokio::main]
async fn main() -> ExitCode {
    let nodes: Vec<String> = std::env::args().skip(1).collect();
    let engine = match Redlock::new(RedlockConfig::new(nodes)) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("bad configuration: {e}");
            return ExitCode::from(64);
        }
    };
    let lease = match engine.try_acquire(LOCK, TTL).await {
        Ok(lease) => lease,
        Err(e) if e.is_contended() => {
            let holder = engine.current_holder(LOCK).await;
            eprintln!(
                "held elsewhere ({}): {e}",
                holder.as_deref().unwrap_or("holder unknown")
            );
            return ExitCode::from(75);
        }
        Err(e) => return fail(e),
    };
    println!("acquired {LOCK} with fencing token {}", lease.token());
    let watchdog = Watchdog::spawn(engine.clone(), lease, LeaseTiming::from_ttl(TTL));
    let lost = watchdog.lost();
    tokio::select! {
        // Pass the token to every write, so storage rejects a holder that lost the lock.
        _ = tokio::time::sleep(WORK) => println!("work done"),
        _ = lost.cancelled() => {
            eprintln!("lease lost before the work was done: stopped");
            return ExitCode::from(75);
        }
    }
    watchdog.release(&engine).await;
    ExitCode::SUCCESS
}

fn fail(e: LockError) -> ExitCode {
    eprintln!("could not acquire {LOCK}: {e}");
    ExitCode::from(69)
}
