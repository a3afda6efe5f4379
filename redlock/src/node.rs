//! One Redis node: a lazily (re)connected multiplexed connection, every request bounded by the
//! per-node timeout. Connecting happens in a background task so that a slow handshake is shared
//! by later requests instead of being restarted by each, and a dead node costs one timeout.

use super::config::ParsedNode;
use super::error::NodeErrorKind;
use super::scripts;
use futures::future::{BoxFuture, FutureExt, Shared};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, FromRedisValue, ScriptInvocation};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type ConnectResult = Result<MultiplexedConnection, NodeErrorKind>;

enum Slot {
    Empty,
    Connecting(Shared<BoxFuture<'static, ConnectResult>>),
    Ready {
        conn: MultiplexedConnection,
        generation: u64,
    },
}

/// After this many timeouts in a row the connection is presumed dead and replaced.
const TIMEOUTS_BEFORE_RECONNECT: u32 = 3;

pub(crate) struct Node {
    pub(crate) label: String,
    client: Client,
    slot: Arc<Mutex<SlotState>>,
    request_timeout: Duration,
    connect_timeout: Duration,
    timeouts_in_a_row: AtomicU32,
}

struct SlotState {
    slot: Slot,
    next_generation: u64,
}

impl Node {
    pub(crate) fn new(
        parsed: ParsedNode,
        request_timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Self, redis::RedisError> {
        Ok(Self {
            label: parsed.label,
            client: match parsed.tls {
                Some(certificates) => Client::build_with_tls(parsed.info, certificates)?,
                None => Client::open(parsed.info)?,
            },
            slot: Arc::new(Mutex::new(SlotState {
                slot: Slot::Empty,
                next_generation: 0,
            })),
            request_timeout,
            connect_timeout,
            timeouts_in_a_row: AtomicU32::new(0),
        })
    }

    /// Runs a script on this node, bounded by the request timeout (connecting included) and by
    /// `limit`, e.g. what is left of a lease.
    pub(crate) async fn run_within<T: FromRedisValue>(
        &self,
        request: &ScriptInvocation<'_>,
        limit: Duration,
    ) -> Result<T, NodeErrorKind> {
        let attempt = async {
            let (mut conn, generation) = self.connection().await?;
            match request.invoke_async::<T>(&mut conn).await {
                Ok(value) => Ok(value),
                Err(err) => {
                    let kind = NodeErrorKind::from_redis(&err);
                    let lost = matches!(kind, NodeErrorKind::Refused | NodeErrorKind::Unresolved);
                    if lost || err.is_unrecoverable_error() {
                        self.invalidate(generation);
                    }
                    Err(kind)
                }
            }
        };
        match tokio::time::timeout(limit.min(self.request_timeout), attempt).await {
            Ok(result) => {
                if result.is_ok() {
                    self.timeouts_in_a_row.store(0, Ordering::Relaxed);
                }
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

    async fn connection(&self) -> Result<(MultiplexedConnection, u64), NodeErrorKind> {
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

    fn spawn_connect(&self, generation: u64) -> Shared<BoxFuture<'static, ConnectResult>> {
        let client = self.client.clone();
        let slot = Arc::clone(&self.slot);
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
            let mut state = lock(&slot);
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

/// The slot mutex is held only for a few instructions and never across an await; a poisoned
/// lock can only come from a panic there, and the state is still consistent, so keep going.
fn lock(slot: &Mutex<SlotState>) -> std::sync::MutexGuard<'_, SlotState> {
    slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
