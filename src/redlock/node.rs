//! One Redis node: a lazily (re)connected multiplexed connection, every request bounded by the
//! per-node timeout, and calls that queue up while others are on the wire sent as one batch.
//! Connecting happens in a background task so that a slow handshake is shared by later
//! requests instead of being restarted by each, and a dead node costs one timeout.

use super::config::ParsedNode;
use super::error::NodeErrorKind;
use super::scripts;
use super::scripts::{Call, MAX_BATCH};
use crate::metrics::Metrics;
use futures::future::{BoxFuture, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, FromRedisValue, Value};
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::{oneshot, Notify};
use tokio_util::task::AbortOnDropHandle;

type ConnectResult = Result<MultiplexedConnection, NodeErrorKind>;

type Pending = futures::future::Shared<BoxFuture<'static, ConnectResult>>;

enum Slot {
    Empty,
    Connecting(Pending),
    Ready {
        conn: MultiplexedConnection,
        generation: u64,
    },
}

/// After this many timeouts in a row the connection is presumed dead and replaced.
const TIMEOUTS_BEFORE_RECONNECT: u32 = 3;

pub(crate) struct Node {
    pub(crate) label: String,
    shared: Arc<Shared>,
    /// Sends what callers queue; started on first use (inside a runtime), aborted with the node.
    sender: OnceLock<AbortOnDropHandle<()>>,
}

/// What a node's callers and its sending task share.
struct Shared {
    client: Client,
    slot: Mutex<SlotState>,
    request_timeout: Duration,
    connect_timeout: Duration,
    timeouts_in_a_row: AtomicU32,
    lane: Mutex<Lane>,
    metrics: Metrics,
    /// Wakes the sending task: a call was queued or a request came back.
    wake: Notify,
}

/// The calls waiting for this node, and the requests out on the wire.
#[derive(Default)]
struct Lane {
    queue: Vec<Queued>,
    in_flight: usize,
}

struct Queued {
    call: Arc<Call>,
    reply: oneshot::Sender<Result<Value, NodeErrorKind>>,
}

/// Requests on the wire at once per node. While they are out, new calls queue and leave
/// together in the next one: one call when a node is idle, many under load.
const IN_FLIGHT: usize = 2;

struct SlotState {
    slot: Slot,
    next_generation: u64,
}

impl Node {
    pub(crate) fn new(
        parsed: ParsedNode,
        request_timeout: Duration,
        connect_timeout: Duration,
        metrics: Metrics,
    ) -> Result<Self, redis::RedisError> {
        Ok(Self {
            label: parsed.label,
            shared: Arc::new(Shared {
                client: match parsed.tls {
                    Some(certificates) => Client::build_with_tls(parsed.info, certificates)?,
                    None => Client::open(parsed.info)?,
                },
                slot: Mutex::new(SlotState {
                    slot: Slot::Empty,
                    next_generation: 0,
                }),
                request_timeout,
                connect_timeout,
                timeouts_in_a_row: AtomicU32::new(0),
                lane: Mutex::new(Lane::default()),
                metrics,
                wake: Notify::new(),
            }),
            sender: OnceLock::new(),
        })
    }

    /// Runs a call on this node, bounded by the request timeout (connecting included) and by
    /// `limit`, e.g. what is left of a lease. On an idle node the caller sends it at once;
    /// otherwise it queues for the next batch. Calls leave in the order they were made, so a
    /// release never overtakes the acquire it undoes, and a queued call whose caller gave up
    /// is still sent: a SET that may land must meet the release that follows it.
    pub(crate) async fn run_within<T: FromRedisValue>(
        &self,
        call: &Arc<Call>,
        limit: Duration,
    ) -> Result<T, NodeErrorKind> {
        let limit = limit.min(self.shared.request_timeout);
        let shared = &self.shared;
        let reply = match shared.claim_idle() {
            Some(_claim) => {
                let cmd = scripts::command(std::iter::once(call.as_ref()));
                shared
                    .bounded(limit, shared.request(&cmd))
                    .await
                    .and_then(reply_of)
            }
            None => {
                self.sender.get_or_init(|| {
                    AbortOnDropHandle::new(tokio::spawn(send_queued(Arc::clone(shared))))
                });
                let (reply, answer) = oneshot::channel();
                lock(&shared.lane).queue.push(Queued {
                    call: Arc::clone(call),
                    reply,
                });
                shared.wake.notify_one();
                match tokio::time::timeout(limit, answer).await {
                    Ok(Ok(reply)) => reply,
                    Ok(Err(_)) => Err(NodeErrorKind::Other(
                        "the node's sending task stopped (the engine is shutting down)".into(),
                    )),
                    Err(_) => Err(NodeErrorKind::Timeout),
                }
            }
        };
        T::from_redis_value(reply?).map_err(|err| NodeErrorKind::from_redis(&err.into()))
    }
}

/// The node's sending task: sends what is queued as one batch whenever fewer than
/// [`IN_FLIGHT`] requests are out.
async fn send_queued(shared: Arc<Shared>) {
    let mut sending = FuturesUnordered::new();
    loop {
        let batch: Vec<Queued> = {
            let mut lane = lock(&shared.lane);
            if lane.in_flight < IN_FLIGHT && !lane.queue.is_empty() {
                lane.in_flight += 1;
                let take = lane.queue.len().min(MAX_BATCH);
                lane.queue.drain(..take).collect()
            } else {
                Vec::new()
            }
        };
        if !batch.is_empty() {
            sending.push(Arc::clone(&shared).send(batch));
            continue;
        }
        tokio::select! {
            _ = shared.wake.notified() => {}
            Some(()) = sending.next(), if !sending.is_empty() => {}
        }
    }
}

/// A request slot taken by a caller that sends on its own; given back when dropped, also when
/// the caller gives up.
struct Claim<'a>(&'a Shared);

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.0.done_sending();
    }
}

impl Shared {
    /// A slot for sending at once, when nothing is queued or out and the connection is up.
    /// Sending on a live connection hands the request over in the caller's first poll, so it
    /// goes out even if the caller stops waiting (an acquisition that has its quorum); a call
    /// that would first wait for a connection queues instead, and the sending task sends it.
    fn claim_idle(&self) -> Option<Claim<'_>> {
        if !matches!(lock(&self.slot).slot, Slot::Ready { .. }) {
            return None;
        }
        let mut lane = lock(&self.lane);
        if lane.in_flight > 0 || !lane.queue.is_empty() {
            return None;
        }
        lane.in_flight += 1;
        Some(Claim(self))
    }

    fn done_sending(&self) {
        let queued = {
            let mut lane = lock(&self.lane);
            lane.in_flight -= 1;
            !lane.queue.is_empty()
        };
        if queued {
            self.wake.notify_one();
        }
    }

    /// A request bounded by `limit`; timeouts in a row replace the connection.
    async fn bounded(
        &self,
        limit: Duration,
        request: impl Future<Output = Result<Value, NodeErrorKind>>,
    ) -> Result<Value, NodeErrorKind> {
        match tokio::time::timeout(limit, request).await {
            Ok(result) => {
                self.timeouts_in_a_row.store(0, Ordering::Relaxed);
                result
            }
            Err(_) => {
                let in_a_row = self.timeouts_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
                if in_a_row >= TIMEOUTS_BEFORE_RECONNECT {
                    self.timeouts_in_a_row.store(0, Ordering::Relaxed);
                    self.invalidate_any();
                }
                Err(NodeErrorKind::Timeout)
            }
        }
    }

    /// Sends one batch and hands each caller its reply.
    async fn send(self: Arc<Self>, batch: Vec<Queued>) {
        let cmd = scripts::command(batch.iter().map(|queued| queued.call.as_ref()));
        let result = self.bounded(self.request_timeout, self.request(&cmd)).await;
        self.done_sending();
        let replies = match result {
            Ok(value) if batch.len() == 1 => vec![reply_of(value)],
            Ok(Value::Array(replies)) if replies.len() == batch.len() => {
                replies.into_iter().map(reply_of).collect()
            }
            Ok(other) => {
                let kind = match reply_of(other) {
                    Err(kind) => kind,
                    Ok(other) => NodeErrorKind::BadReply(format!(
                        "{other:?} where {} replies were due",
                        batch.len()
                    )),
                };
                vec![Err(kind); batch.len()]
            }
            Err(kind) => vec![Err(kind); batch.len()],
        };
        for (queued, reply) in batch.into_iter().zip(replies) {
            // A caller that gave up has dropped its end; nobody is left to tell.
            let _ = queued.reply.send(reply);
        }
    }

    /// One command on the current connection, reloading the scripts once if the node lost
    /// them (SCRIPT FLUSH, a restart behind a proxy that kept the connection).
    async fn request(self: &Arc<Self>, cmd: &redis::Cmd) -> Result<Value, NodeErrorKind> {
        let (mut conn, generation) = self.connection().await?;
        self.metrics.record_redis_script();
        let mut reloaded = false;
        loop {
            let failed = match conn.send_packed_command(cmd).await {
                Ok(Value::ServerError(err)) => redis::RedisError::from(err),
                Ok(value) => return Ok(value),
                Err(err) => err,
            };
            let kind = NodeErrorKind::from_redis(&failed);
            if matches!(kind, NodeErrorKind::NoScript) && !reloaded {
                reloaded = true;
                if scripts::load_all(&mut conn).await.is_ok() {
                    continue;
                }
            }
            if matches!(kind, NodeErrorKind::Refused) || failed.is_unrecoverable_error() {
                self.invalidate(generation);
            }
            return Err(kind);
        }
    }

    async fn connection(self: &Arc<Self>) -> Result<(MultiplexedConnection, u64), NodeErrorKind> {
        let pending = {
            let mut state = lock(&self.slot);
            match &state.slot {
                Slot::Ready { conn, generation } => return Ok((conn.clone(), *generation)),
                Slot::Connecting(pending) => pending.clone(),
                Slot::Empty => {
                    let pending = self.spawn_connect(state.next_generation);
                    state.slot = Slot::Connecting(pending.clone());
                    pending
                }
            }
        };
        let conn = pending.await?;
        let generation = match &lock(&self.slot).slot {
            Slot::Ready { generation, .. } => *generation,
            _ => u64::MAX,
        };
        Ok((conn, generation))
    }

    fn spawn_connect(self: &Arc<Self>, generation: u64) -> Pending {
        let client = self.client.clone();
        let shared = Arc::clone(self);
        let connect_timeout = self.connect_timeout;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            // Requests are bounded by the engine, per call, not by the connection.
            .set_response_timeout(None);
        let task = tokio::spawn(async move {
            let connect = async {
                let mut conn = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                // Load every script before the first request: a NOSCRIPT reply would cost a
                // second round trip, and if its request had already timed out the reload would
                // never happen (a release lost after a blip).
                scripts::load_all(&mut conn).await?;
                Ok::<_, redis::RedisError>(conn)
            };
            let result = match tokio::time::timeout(connect_timeout, connect).await {
                Ok(Ok(conn)) => Ok(conn),
                Ok(Err(err)) => Err(NodeErrorKind::from_redis(&err)),
                Err(_) => Err(NodeErrorKind::Timeout),
            };
            let mut state = lock(&shared.slot);
            state.slot = match &result {
                Ok(conn) => {
                    state.next_generation = generation + 1;
                    Slot::Ready {
                        conn: conn.clone(),
                        generation,
                    }
                }
                Err(_) => Slot::Empty,
            };
            result
        });
        async move {
            task.await
                .unwrap_or_else(|e| Err(NodeErrorKind::Other(format!("connect task failed: {e}"))))
        }
        .boxed()
        .shared()
    }

    /// Drops the connection of `generation` so that the next request reconnects.
    fn invalidate(&self, generation: u64) {
        let mut state = lock(&self.slot);
        if matches!(state.slot, Slot::Ready { generation: g, .. } if g == generation) {
            state.slot = Slot::Empty;
        }
    }

    fn invalidate_any(&self) {
        let mut state = lock(&self.slot);
        if matches!(state.slot, Slot::Ready { .. }) {
            state.slot = Slot::Empty;
        }
    }
}

/// A call's reply: an error reply of its own (a batch keeps the others') or its value.
fn reply_of(value: Value) -> Result<Value, NodeErrorKind> {
    match value {
        Value::ServerError(err) => Err(NodeErrorKind::from_redis(&err.into())),
        value => Ok(value),
    }
}

/// The slot and queue mutexes are held only for a few instructions and never across an await;
/// a poisoned lock can only come from a panic there, and the state is still consistent, so
/// keep going.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
