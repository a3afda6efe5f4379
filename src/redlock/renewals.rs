//! Renewals that share a round (docs/design.md, "Renewal").
//!
//! Every lease in work is renewed once per renew interval. One round per lease would cost each
//! node one request per lease per interval: with a thousand Jobs running, renewals would be
//! most of the lock traffic. A renewal instead waits a moment (its linger) for others, and all
//! that are waiting then go to each node as one script call. Rounds do not wait for each
//! other, so a hung node still costs a renewal one request timeout.

use super::engine::{Redlock, WeakRedlock};
use super::error::LockError;
use super::lease::Lease;
use futures::stream::{FuturesUnordered, StreamExt};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Notify};
use tokio_util::task::AbortOnDropHandle;

/// The longest a renewal waits for company. A small part of any sensible TTL (30 s by default:
/// renewed every 10 s, given up 2 s before the deadline).
const MAX_LINGER: Duration = Duration::from_millis(500);

/// Leases per script call: bounds how long one call keeps a node busy (a few µs a lease).
const MAX_BATCH: usize = 256;

/// How long a renewal may wait for others: 1/60 of the lease's TTL (a thirtieth of the time
/// between renewals at the default ttl/3), at most [`MAX_LINGER`], and at most a quarter of
/// the time left before the renewer gives up, so that waiting never costs the lease.
pub(crate) fn linger(ttl: Duration, until_give_up: Duration) -> Duration {
    (ttl / 60).min(MAX_LINGER).min(until_give_up / 4)
}

type Reply = Result<Instant, LockError>;

struct Waiting {
    lease: Lease,
    send_by: Instant,
    reply: oneshot::Sender<Reply>,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Waiting>,
    /// The earliest `send_by` in `waiting`.
    earliest: Option<Instant>,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    /// Told when a renewal is due sooner than every other waiting one.
    sooner: Notify,
}

/// The engine's renewal queue and the task that sends it. The task starts on first use and
/// ends with the engine (it holds it only weakly, and only for a round).
#[derive(Default)]
pub(crate) struct Renewals {
    shared: Arc<Shared>,
    task: OnceLock<AbortOnDropHandle<()>>,
}

impl Renewals {
    /// Queues a renewal of `lease`, to be sent within `linger`; the receiver gets its result.
    pub(crate) fn enqueue(
        &self,
        lease: &Lease,
        linger: Duration,
        engine: impl FnOnce() -> WeakRedlock,
    ) -> oneshot::Receiver<Reply> {
        self.task.get_or_init(|| {
            AbortOnDropHandle::new(tokio::spawn(send_rounds(
                Arc::clone(&self.shared),
                engine(),
            )))
        });
        let (reply, receiver) = oneshot::channel();
        let send_by = Instant::now() + linger;
        let sooner = {
            let mut queue = lock(&self.shared.queue);
            queue.waiting.push(Waiting {
                lease: lease.clone(),
                send_by,
                reply,
            });
            let sooner = queue.earliest.is_none_or(|earliest| send_by < earliest);
            if sooner {
                queue.earliest = Some(send_by);
            }
            sooner
        };
        if sooner {
            self.shared.sooner.notify_one();
        }
        receiver
    }
}

/// Held for a push or a drain, never across an await; a poisoned queue is still a queue.
fn lock(queue: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    queue
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Up to [`MAX_BATCH`] waiting renewals whose renewer still waits, oldest first.
fn take_batch(shared: &Shared) -> Vec<Waiting> {
    let mut queue = lock(&shared.queue);
    queue.waiting.retain(|waiting| !waiting.reply.is_closed());
    let size = queue.waiting.len().min(MAX_BATCH);
    let rest = queue.waiting.split_off(size);
    let batch = std::mem::replace(&mut queue.waiting, rest);
    queue.earliest = queue.waiting.iter().map(|waiting| waiting.send_by).min();
    batch
}

async fn send_rounds(shared: Arc<Shared>, engine: WeakRedlock) {
    let mut rounds = FuturesUnordered::new();
    loop {
        let due = lock(&shared.queue).earliest;
        // Far enough never to fire; the branch is disabled anyway when nothing waits.
        let wake = due.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            _ = shared.sooner.notified() => {}
            _ = tokio::time::sleep_until(wake.into()), if due.is_some() => {
                let batch = take_batch(&shared);
                if batch.is_empty() {
                    continue;
                }
                let Some(engine) = engine.upgrade() else { return };
                rounds.push(renew_batch(engine, batch));
            }
            Some(()) = rounds.next(), if !rounds.is_empty() => {}
        }
    }
}

async fn renew_batch(engine: Redlock, batch: Vec<Waiting>) {
    let leases: Vec<&Lease> = batch.iter().map(|waiting| &waiting.lease).collect();
    let results = engine.extend_many(&leases).await;
    for (waiting, result) in batch.into_iter().zip(results) {
        // A renewer that gave up (its watchdog stopped) no longer listens.
        let _ = waiting.reply.send(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linger_is_a_small_part_of_the_ttl_and_of_the_time_left() {
        let ms = Duration::from_millis;
        // (ttl, time before giving up, linger)
        let table = [
            (ms(600), ms(400), ms(10)),
            (ms(6_000), ms(3_000), ms(100)),
            (ms(30_000), ms(18_000), ms(500)),
            (ms(600_000), ms(390_000), MAX_LINGER),
            // A renewal close to giving up (a retry, or a renew interval near the TTL).
            (ms(30_000), ms(400), ms(100)),
            (ms(30_000), Duration::ZERO, Duration::ZERO),
        ];
        for (ttl, until_give_up, expected) in table {
            assert_eq!(
                linger(ttl, until_give_up),
                expected,
                "ttl {ttl:?}, {until_give_up:?} left"
            );
        }
    }
}
