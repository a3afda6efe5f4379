//! One Redis node: a lazily (re)connected multiplexed connection, every request bounded by the
//! per-node timeout. Connecting happens in a background task so that a slow handshake is shared
//! by later requests instead of being restarted by each, and a dead node costs one timeout.
//!
//! When the TLS files or the password change (`reload.rs`), the node gets a new client and
//! replaces its connection make-before-break: requests keep using the open connection until a
//! new one, opened with the new material, is ready; if the node refuses the new material, the
//! old connection stays in use and a warning says so
//! (docs/design.md, "Rotating certificates and passwords").

use super::config::ParsedNode;
use super::error::NodeErrorKind;
use super::scripts;
use futures::future::{BoxFuture, FutureExt, Shared};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, FromRedisValue, ScriptInvocation};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type ConnectResult = Result<MultiplexedConnection, NodeErrorKind>;

enum Slot {
    Empty,
    Connecting(Shared<BoxFuture<'static, ConnectResult>>),
    Ready {
        conn: MultiplexedConnection,
        generation: u64,
        /// The client (TLS material and password) it was opened with.
        material: u64,
    },
}

/// A connection opened under newer material to take the place of the one in use.
#[derive(Clone, Copy)]
enum Replacement {
    None,
    Opening,
    /// The node refused the new material then; try again after `RETRY_REPLACEMENT`.
    FailedAt(Instant),
}

/// After this many timeouts in a row the connection is presumed dead and replaced.
const TIMEOUTS_BEFORE_RECONNECT: u32 = 3;

/// How long a node that refused new material keeps the old connection before the next try:
/// in a rotation the nodes may learn the new CA a little after the clients.
const RETRY_REPLACEMENT: Duration = Duration::from_secs(5);

pub(crate) struct Node {
    pub(crate) label: String,
    slot: Arc<Mutex<SlotState>>,
    request_timeout: Duration,
    connect_timeout: Duration,
    timeouts_in_a_row: AtomicU32,
    /// Until a first request went out: a program's first round (a one-shot `exec` in a
    /// CronJob) waits for the connection, up to the connect timeout.
    first_request: AtomicBool,
}

struct SlotState {
    slot: Slot,
    next_generation: u64,
    /// What new connections are opened with, and its number: each reload makes a new one.
    client: Client,
    material: u64,
    replacement: Replacement,
}

/// A connection for one request, and whether it was open before the request (a connection
/// found broken then is worth one retry on a fresh one).
struct Checkout {
    conn: MultiplexedConnection,
    generation: u64,
    reused: bool,
}

impl Node {
    pub(crate) fn new(
        parsed: ParsedNode,
        request_timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Self, redis::RedisError> {
        Ok(Self {
            label: parsed.label.clone(),
            slot: Arc::new(Mutex::new(SlotState {
                slot: Slot::Empty,
                next_generation: 0,
                client: client_of(parsed)?,
                material: 0,
                replacement: Replacement::None,
            })),
            request_timeout,
            connect_timeout,
            timeouts_in_a_row: AtomicU32::new(0),
            first_request: AtomicBool::new(true),
        })
    }

    /// New connections use `parsed`'s password and TLS material from now on; the open
    /// connection is replaced make-before-break.
    pub(crate) fn replace_material(&self, parsed: ParsedNode) -> Result<(), redis::RedisError> {
        let client = client_of(parsed)?;
        let mut state = lock(&self.slot);
        state.client = client;
        state.material += 1;
        state.replacement = Replacement::None;
        if matches!(state.slot, Slot::Ready { .. }) {
            self.open_replacement(&mut state);
        }
        Ok(())
    }

    /// Runs a script on this node, bounded by the request timeout (connecting included) and by
    /// `limit`, e.g. what is left of a lease. A connection that was open before and turns out
    /// broken (the node restarted, or closed it) gets one retry on a fresh connection: every
    /// script is safe to repeat (`scripts.rs`).
    pub(crate) async fn run_within<T: FromRedisValue>(
        &self,
        request: &ScriptInvocation<'_>,
        limit: Duration,
    ) -> Result<T, NodeErrorKind> {
        let attempt = async {
            match self.send(request).await {
                Err((kind, true)) if kind.means_connection_lost() => {
                    self.send(request).await.map_err(|(kind, _)| kind)
                }
                other => other.map_err(|(kind, _)| kind),
            }
        };
        match tokio::time::timeout(limit.min(self.bound()), attempt).await {
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

    /// The request timeout; for the node's first request, the connect timeout on top. Later
    /// connections open in the background while requests fail fast, but a program that makes
    /// one attempt (`exec` with no `--wait`) would otherwise fail whenever a handshake takes
    /// longer than a request (TLS across regions: several round trips, not one).
    fn bound(&self) -> Duration {
        if self.first_request.swap(false, Ordering::Relaxed) {
            self.connect_timeout + self.request_timeout
        } else {
            self.request_timeout
        }
    }

    /// One try; a failure says whether the connection had been open before this request.
    async fn send<T: FromRedisValue>(
        &self,
        request: &ScriptInvocation<'_>,
    ) -> Result<T, (NodeErrorKind, bool)> {
        let mut checkout = self.connection().await.map_err(|kind| (kind, false))?;
        request
            .invoke_async::<T>(&mut checkout.conn)
            .await
            .map_err(|err| {
                let kind = NodeErrorKind::from_redis(&err);
                if kind.means_connection_lost() || err.is_unrecoverable_error() {
                    self.invalidate(checkout.generation);
                }
                (kind, checkout.reused)
            })
    }

    async fn connection(&self) -> Result<Checkout, NodeErrorKind> {
        let pending = {
            let mut state = lock(&self.slot);
            match &state.slot {
                Slot::Ready {
                    conn,
                    generation,
                    material,
                } => {
                    let checkout = Checkout {
                        conn: conn.clone(),
                        generation: *generation,
                        reused: true,
                    };
                    if *material < state.material {
                        self.open_replacement(&mut state);
                    }
                    return Ok(checkout);
                }
                Slot::Connecting(pending) => pending.clone(),
                Slot::Empty => {
                    let pending = self.spawn_connect(&mut state);
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
        Ok(Checkout {
            conn,
            generation,
            reused: false,
        })
    }

    fn spawn_connect(&self, state: &mut SlotState) -> Shared<BoxFuture<'static, ConnectResult>> {
        let (generation, material) = (state.next_generation, state.material);
        state.next_generation += 1;
        let opening = open(state.client.clone(), self.connect_timeout);
        let slot = Arc::clone(&self.slot);
        let task = tokio::spawn(async move {
            let result = opening.await;
            let mut state = lock(&slot);
            match &result {
                Ok(conn) => {
                    state.slot = Slot::Ready {
                        conn: conn.clone(),
                        generation,
                        material,
                    }
                }
                // A replacement may have filled the slot meanwhile; keep it.
                Err(_) if matches!(state.slot, Slot::Connecting(_)) => state.slot = Slot::Empty,
                Err(_) => {}
            }
            result
        });
        async move {
            task.await
                .unwrap_or_else(|e| Err(NodeErrorKind::Other(format!("connect task failed: {e}"))))
        }
        .boxed()
        .shared()
    }

    /// Opens a connection with the current material in the background; the open one stays in
    /// use until it is ready. At most one at a time, and not again soon after a refusal.
    fn open_replacement(&self, state: &mut SlotState) {
        match state.replacement {
            Replacement::Opening => return,
            Replacement::FailedAt(when) if when.elapsed() < RETRY_REPLACEMENT => return,
            _ => {}
        }
        state.replacement = Replacement::Opening;
        let (generation, material) = (state.next_generation, state.material);
        state.next_generation += 1;
        let opening = open(state.client.clone(), self.connect_timeout);
        let slot = Arc::clone(&self.slot);
        let label = self.label.clone();
        tokio::spawn(async move {
            let result = opening.await;
            let mut state = lock(&slot);
            if state.material != material {
                // Newer material arrived meanwhile; its own replacement is on the way.
                return;
            }
            match result {
                Ok(conn) => {
                    state.replacement = Replacement::None;
                    state.slot = Slot::Ready {
                        conn,
                        generation,
                        material,
                    };
                    tracing::info!(node = %label, "connection replaced with one opened with the new TLS files or password");
                }
                Err(kind) => {
                    state.replacement = Replacement::FailedAt(Instant::now());
                    tracing::warn!(node = %label, error = %kind, "the node refused a connection with the new TLS files or password; the connection opened before stays in use, retrying in {RETRY_REPLACEMENT:?}");
                }
            }
        });
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

fn client_of(parsed: ParsedNode) -> Result<Client, redis::RedisError> {
    match parsed.tls {
        Some(certificates) => Client::build_with_tls(parsed.info, certificates),
        None => Client::open(parsed.info),
    }
}

/// Connects and loads the scripts, within `connect_timeout`.
fn open(client: Client, connect_timeout: Duration) -> BoxFuture<'static, ConnectResult> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        // Requests are bounded by the engine, per call, not by the connection.
        .set_response_timeout(None);
    async move {
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
        match tokio::time::timeout(connect_timeout, connect).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(err)) => Err(NodeErrorKind::from_redis(&err)),
            Err(_) => Err(NodeErrorKind::Timeout),
        }
    }
    .boxed()
}

/// The slot mutex is held only for a few instructions and never across an await; a poisoned
/// lock can only come from a panic there, and the state is still consistent, so keep going.
fn lock(slot: &Mutex<SlotState>) -> std::sync::MutexGuard<'_, SlotState> {
    slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
