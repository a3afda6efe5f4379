//! Keeps a lease alive while work runs, and says so at once when it cannot.
//!
//! Renews every `renew_interval`; a failed round is retried quickly. If no renewal succeeded by
//! `deadline - safety_margin`, the lease is lost: the `lost` token is cancelled and the task
//! ends without ever renewing again, even if a later renewal would have worked. The holder must
//! stop its work and acquire afresh.
//!
//! Renewal lives only as long as the `Watchdog` handle: dropping it (a holder that returns
//! early or panics without `stop()`) ends the renewals, and the lease then expires by itself
//! instead of being kept alive by a detached task forever.

use super::batch::renewal_linger;
use super::config::LeaseTiming;
use super::engine::Redlock;
use super::lease::Lease;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

/// What the watchdog publishes after each round.
#[derive(Debug, Clone, Copy)]
pub struct LeaseStatus {
    /// The lease's deadline after the last successful renewal (at first, the lease's own),
    /// already reduced by the clock-drift allowance.
    pub deadline: Instant,
    /// Successful renewals so far.
    pub renewals: u64,
    /// Renewal rounds that came back with an error.
    pub failed_rounds: u64,
    /// When the last renewal attempt started; never at or after the deadline.
    pub last_attempt: Option<Instant>,
}

/// How the watchdog ended.
#[derive(Debug)]
pub enum WatchdogEnd {
    /// Stopped on request with the lease still valid: release it, or keep using its deadline.
    Stopped(Lease),
    /// The lease was lost; the lock may already belong to someone else.
    Lost(Lease),
}

/// Renews a lease in a background task, and cancels [`Watchdog::lost`] once
/// `deadline - safety_margin` comes with no renewal having pushed the deadline further.
/// Dropping it stops the renewals, and the lease then expires by itself.
pub struct Watchdog {
    lost: CancellationToken,
    stop: CancellationToken,
    status: watch::Receiver<LeaseStatus>,
    task: JoinHandle<WatchdogEnd>,
    name: String,
    token: u64,
    /// Cancels `stop` when the handle goes away without `stop()`.
    _stop_on_drop: DropGuard,
}

impl Watchdog {
    /// Starts renewing `lease` in a background task.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime, as `tokio::spawn` does.
    pub fn spawn(engine: Redlock, lease: Lease, timing: LeaseTiming) -> Self {
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let (tx, status) = watch::channel(LeaseStatus {
            deadline: lease.deadline,
            renewals: 0,
            failed_rounds: 0,
            last_attempt: None,
        });
        let (name, token) = (lease.name.clone(), lease.token);
        let task = tokio::spawn(run(engine, lease, timing, lost.clone(), stop.clone(), tx));
        Self {
            lost,
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
            status,
            task,
            name,
            token,
        }
    }

    /// Cancelled when the lease is lost. Clone it into the work to stop.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// True once the lease has been declared lost ([`Watchdog::lost`] is cancelled).
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// The latest status: deadline, renewals and failed rounds.
    pub fn status(&self) -> LeaseStatus {
        *self.status.borrow()
    }

    /// A receiver that sees every deadline update.
    pub fn subscribe(&self) -> watch::Receiver<LeaseStatus> {
        self.status.clone()
    }

    /// The name of the lock whose lease is renewed.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lease's fencing token; renewals do not change it.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Stops renewing and hands back the lease (valid or lost).
    pub async fn stop(self) -> WatchdogEnd {
        self.stop.cancel();
        match self.task.await {
            Ok(end) => end,
            // The task only ends by returning; a panic inside it is a bug worth surfacing.
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    /// Stops renewing and releases the lock if the lease is still held. Returns true if it was.
    pub async fn release(self, engine: &Redlock) -> bool {
        match self.stop().await {
            WatchdogEnd::Stopped(lease) => {
                engine.release(&lease).await;
                true
            }
            WatchdogEnd::Lost(lease) => {
                // Our value may still sit on a minority; deleting it is harmless and frees it.
                engine.release(&lease).await;
                false
            }
        }
    }
}

/// Short pause between failed renewal rounds: quick enough to ride out a blip, slow enough not
/// to hammer a node that is restarting.
fn retry_delay(timing: &LeaseTiming) -> Duration {
    (timing.renew_interval / 4).clamp(Duration::from_millis(10), Duration::from_millis(250))
}

/// When the first renewal is due: one renew interval into the lease's life as its deadline
/// tells it, not into the watchdog's. What ran between acquiring and spawning (creating a Job
/// through a slow API server) must not push the first renewal past the give-up point.
fn first_renewal(lease: &Lease, timing: &LeaseTiming, now: Instant) -> Instant {
    let life_began = lease.deadline.checked_sub(lease.ttl).unwrap_or(now);
    (life_began + timing.renew_interval).min(now + timing.renew_interval)
}

async fn run(
    engine: Redlock,
    mut lease: Lease,
    timing: LeaseTiming,
    lost: CancellationToken,
    stop: CancellationToken,
    status: watch::Sender<LeaseStatus>,
) -> WatchdogEnd {
    let mut next_renewal = first_renewal(&lease, &timing, Instant::now());
    loop {
        let give_up_at = lease
            .deadline
            .checked_sub(timing.safety_margin)
            .unwrap_or(lease.deadline);
        let wake = next_renewal.min(give_up_at);
        tokio::select! {
            biased;
            _ = stop.cancelled() => return WatchdogEnd::Stopped(lease),
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
        if Instant::now() >= give_up_at {
            return declare_lost(&engine, lease, &lost);
        }
        let attempt_started = Instant::now();
        status.send_modify(|s| s.last_attempt = Some(attempt_started));
        let linger = renewal_linger(lease.ttl, give_up_at - attempt_started);
        let outcome = tokio::select! {
            biased;
            _ = stop.cancelled() => return WatchdogEnd::Stopped(lease),
            // Abandon a renewal that would end past the give-up point: the lease is over then.
            result = tokio::time::timeout_at(give_up_at.into(), engine.renew(&lease, linger)) => result,
        };
        match outcome {
            Ok(Ok(deadline)) => {
                lease.deadline = deadline;
                next_renewal = attempt_started + timing.renew_interval;
                status.send_modify(|s| {
                    s.deadline = deadline;
                    s.renewals += 1;
                });
                tracing::debug!(lock = %lease.name, token = lease.token, remaining_ms = lease.remaining().as_millis() as u64, "lease renewed");
            }
            Ok(Err(err)) => {
                status.send_modify(|s| s.failed_rounds += 1);
                tracing::warn!(lock = %lease.name, token = lease.token, error = %err, remaining_ms = lease.remaining().as_millis() as u64, "lease renewal failed; retrying");
                next_renewal = Instant::now() + retry_delay(&timing);
            }
            Err(_) => return declare_lost(&engine, lease, &lost),
        }
    }
}

fn declare_lost(engine: &Redlock, lease: Lease, lost: &CancellationToken) -> WatchdogEnd {
    engine.metrics().record_lease_lost();
    tracing::error!(lock = %lease.name, token = lease.token, "lease lost: no quorum renewed it before the safety margin; stopping the work");
    lost.cancel();
    WatchdogEnd::Lost(lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_renewal_counts_from_the_lease_not_from_the_spawn() {
        let ms = Duration::from_millis;
        let timing = LeaseTiming::from_ttl(ms(6_000)); // renew every 2 s
        let now = Instant::now() + ms(60_000);
        // (time since the lease's life began when the watchdog starts, first renewal from now)
        let table = [
            (ms(0), ms(2_000)),
            (ms(500), ms(1_500)),
            (ms(1_999), ms(1)),
            // Spawned late (a slow Job create): renew at once, not 2 s later.
            (ms(2_000), ms(0)),
            (ms(3_500), ms(0)),
        ];
        for (age, due_in) in table {
            let lease = Lease {
                refused: Vec::new(),
                name: "n".into(),
                value: "v".into(),
                token: 1,
                ttl: timing.ttl,
                acquired_at: now - age,
                deadline: now - age + timing.ttl,
            };
            let due = first_renewal(&lease, &timing, now);
            assert_eq!(due.saturating_duration_since(now), due_in, "age {age:?}");
        }
    }
}
