//! Requests that share a round (docs/design.md, "Renewal" and "A run's life", 5).
//!
//! Some requests come once per lock in use per interval: every lease in work is renewed each
//! renew interval, and every Job a replica does not supervise is checked for a live holder.
//! One round each would cost each node one request per lock per interval: with a thousand
//! Jobs running, that was most of the lock traffic. Such a request instead waits a moment (its
//! linger) for others of its kind, and all that are waiting then go to the nodes as one
//! script call each. Rounds do not wait for each other, so a hung node still costs each
//! request one request timeout.

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Notify};
use tokio_util::task::AbortOnDropHandle;

/// The longest a renewal waits for company. A small part of any sensible TTL (30 s by default:
/// renewed every 10 s, given up 2 s before the deadline).
const MAX_LINGER: Duration = Duration::from_millis(1_500);

/// Requests per script call: bounds how long one call keeps a node busy (a few µs each).
const MAX_BATCH: usize = 256;

/// How long a renewal may wait for others: 1/20 of the lease's TTL (15 % of the time between
/// renewals at the default ttl/3), at most [`MAX_LINGER`], and at most a quarter of the time
/// left before the renewer gives up, so that waiting never costs the lease. It bounds how
/// often a replica's renewals reach each node, however many leases it holds: at 500 ms, a
/// thousand Jobs running a minute or more on a saturated cluster still cost 2 requests a run.
pub(crate) fn renewal_linger(ttl: Duration, until_give_up: Duration) -> Duration {
    (ttl / 20).min(MAX_LINGER).min(until_give_up / 4)
}

/// Sends one batch as one round through the sender (the engine): one answer per request, in
/// order.
pub(crate) type SendBatch<Sender, Request, Answer> =
    fn(Arc<Sender>, Vec<Request>) -> BoxFuture<'static, Vec<Answer>>;

struct Waiting<Request, Answer> {
    request: Request,
    send_by: Instant,
    answer: oneshot::Sender<Answer>,
}

struct Queue<Request, Answer> {
    waiting: Vec<Waiting<Request, Answer>>,
    /// The earliest `send_by` in `waiting`.
    earliest: Option<Instant>,
}

struct Shared<Request, Answer> {
    queue: Mutex<Queue<Request, Answer>>,
    /// Told when a request is due sooner than every other waiting one.
    sooner: Notify,
}

/// A queue of one kind of request and the task that sends it through `Sender` (the engine).
/// The task starts on first use and ends with the sender (it holds it only weakly, and only
/// for a round).
pub(crate) struct Batcher<Sender, Request, Answer> {
    shared: Arc<Shared<Request, Answer>>,
    send: SendBatch<Sender, Request, Answer>,
    task: OnceLock<AbortOnDropHandle<()>>,
}

impl<Sender, Request, Answer> Batcher<Sender, Request, Answer>
where
    Sender: Send + Sync + 'static,
    Request: Send + 'static,
    Answer: Send + 'static,
{
    pub(crate) fn new(send: SendBatch<Sender, Request, Answer>) -> Self {
        Self {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue {
                    waiting: Vec::new(),
                    earliest: None,
                }),
                sooner: Notify::new(),
            }),
            send,
            task: OnceLock::new(),
        }
    }

    /// Queues `request`, to be sent within `linger`; the receiver gets its answer. It gets
    /// none (a closed channel) only when the sender is going away.
    pub(crate) fn enqueue(
        &self,
        request: Request,
        linger: Duration,
        sender: impl FnOnce() -> Weak<Sender>,
    ) -> oneshot::Receiver<Answer> {
        self.task.get_or_init(|| {
            AbortOnDropHandle::new(tokio::spawn(send_rounds(
                Arc::clone(&self.shared),
                self.send,
                sender(),
            )))
        });
        let (answer, receiver) = oneshot::channel();
        let send_by = Instant::now() + linger;
        let sooner = {
            let mut queue = lock(&self.shared.queue);
            queue.waiting.push(Waiting {
                request,
                send_by,
                answer,
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
fn lock<Request, Answer>(
    queue: &Mutex<Queue<Request, Answer>>,
) -> MutexGuard<'_, Queue<Request, Answer>> {
    queue
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Up to [`MAX_BATCH`] waiting requests whose sender still waits, oldest first.
fn take_batch<Request, Answer>(shared: &Shared<Request, Answer>) -> Vec<Waiting<Request, Answer>> {
    let mut queue = lock(&shared.queue);
    queue.waiting.retain(|waiting| !waiting.answer.is_closed());
    let size = queue.waiting.len().min(MAX_BATCH);
    let rest = queue.waiting.split_off(size);
    let batch = std::mem::replace(&mut queue.waiting, rest);
    queue.earliest = queue.waiting.iter().map(|waiting| waiting.send_by).min();
    batch
}

async fn send_rounds<Sender, Request: Send + 'static, Answer: Send + 'static>(
    shared: Arc<Shared<Request, Answer>>,
    send: SendBatch<Sender, Request, Answer>,
    sender: Weak<Sender>,
) {
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
                let Some(sender) = sender.upgrade() else { return };
                rounds.push(send_batch(send, sender, batch));
            }
            Some(()) = rounds.next(), if !rounds.is_empty() => {}
        }
    }
}

async fn send_batch<Sender, Request, Answer>(
    send: SendBatch<Sender, Request, Answer>,
    sender: Arc<Sender>,
    batch: Vec<Waiting<Request, Answer>>,
) {
    let (requests, answers): (Vec<Request>, Vec<oneshot::Sender<Answer>>) = batch
        .into_iter()
        .map(|waiting| (waiting.request, waiting.answer))
        .unzip();
    for (answer, result) in answers.into_iter().zip(send(sender, requests).await) {
        // A sender that gave up (a stopped watchdog) no longer listens.
        let _ = answer.send(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_lingers_a_small_part_of_the_ttl_and_of_the_time_left() {
        let ms = Duration::from_millis;
        // (ttl, time before giving up, linger)
        let table = [
            (ms(600), ms(400), ms(30)),
            (ms(6_000), ms(3_000), ms(300)),
            (ms(30_000), ms(18_000), ms(1_500)),
            (ms(600_000), ms(390_000), MAX_LINGER),
            // A renewal close to giving up (a retry, or a renew interval near the TTL).
            (ms(30_000), ms(4_000), ms(1_000)),
            (ms(30_000), ms(400), ms(100)),
            (ms(30_000), Duration::ZERO, Duration::ZERO),
        ];
        for (ttl, until_give_up, expected) in table {
            assert_eq!(
                renewal_linger(ttl, until_give_up),
                expected,
                "ttl {ttl:?}, {until_give_up:?} left"
            );
        }
    }
}
