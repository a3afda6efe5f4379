//! Redlock over N independent nodes, with a two-phase fencing token (docs/design.md, "Redlock, as this project does it").

use super::batch::{Batcher, SendBatch};
use super::config::RedlockConfig;
use super::error::ConfigError;
use super::error::{Failures, LockError, NodeErrorKind, NodeFailure};
use super::inspect::{LockView, NodeView};
use super::lease::{holder_of, most_common, Lease};
use super::node::Node;
use super::phase1::{self, Decision, Tally, Vote};
use super::reload;
use super::scripts;
use super::timing::{backoff, drift_allowance, quorum, validity};
use crate::metrics::{LockMetrics, Outcome};
use futures::future::join_all;
use redis::FromRedisValue;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Phase-2 rounds before a token conflict is reported instead of retried.
const MAX_FENCE_ROUNDS: u32 = 3;

/// Lock names whose last token the engine remembers for its proposals.
const SEEN_TOKENS_LIMIT: usize = 4096;

/// The lock engine. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<Node>,
    config: RedlockConfig,
    quorum: usize,
    /// When false, requests go to one node after the other (only for the benchmark's baseline).
    parallel: bool,
    metrics: LockMetrics,
    /// The highest token seen per lock name, for proposing the next one in phase 1.
    seen: Mutex<HashMap<String, u64>>,
    /// Requests that share rounds (`batch.rs`).
    renewals: Batcher<Inner, Lease, Result<Instant, LockError>>,
    hints: Batcher<Inner, String, Option<(String, Duration)>>,
    holder_reads: Batcher<Inner, String, Option<String>>,
}

/// How long an orphan check's reads (`value_on_any_node`, `current_holder`) wait for others:
/// they look for a holder that may have died a TTL ago, so a moment more does not matter.
const READ_LINGER: Duration = Duration::from_millis(250);

fn send_renewals(
    inner: Arc<Inner>,
    leases: Vec<Lease>,
) -> futures::future::BoxFuture<'static, Vec<Result<Instant, LockError>>> {
    let engine = Redlock { inner };
    Box::pin(async move {
        let leases: Vec<&Lease> = leases.iter().collect();
        engine.extend_many(&leases).await
    })
}

fn send_hints(
    inner: Arc<Inner>,
    names: Vec<String>,
) -> futures::future::BoxFuture<'static, Vec<Option<(String, Duration)>>> {
    let engine = Redlock { inner };
    Box::pin(async move {
        let node = rand::random::<u32>() as usize;
        engine.values_on_node(&names, node).await
    })
}

fn send_holder_reads(
    inner: Arc<Inner>,
    names: Vec<String>,
) -> futures::future::BoxFuture<'static, Vec<Option<String>>> {
    let engine = Redlock { inner };
    Box::pin(async move { engine.current_holders(&names).await })
}

/// The TLS or password files changed: new connections use what they hold now, if it is usable;
/// if not, a warning names the file and the material read before stays in use.
fn reload_material(inner: &Inner) {
    let applied = inner.config.parse_nodes().and_then(|parsed| {
        for (node, parsed) in inner.nodes.iter().zip(parsed) {
            node.replace_material(parsed)
                .map_err(|e| ConfigError::BadUrl {
                    url: node.label.clone(),
                    reason: e.to_string(),
                })?;
        }
        Ok(())
    });
    match applied {
        Ok(()) => {
            inner.metrics.record_material_reload(true);
            tracing::info!("TLS or password files changed: new connections use them");
        }
        Err(err) => {
            inner.metrics.record_material_reload(false);
            tracing::warn!(error = %err, "TLS or password files changed but cannot be used; connections keep the ones read before");
        }
    }
}

/// Held for a map lookup or insert, never across an await; a poisoned map is still a map.
fn lock_seen(
    seen: &Mutex<HashMap<String, u64>>,
) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
    seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One node's word on a step before a lock attempt ([`Redlock::step_hint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepHint {
    /// The node records the step, or a later one, as started.
    Started,
    /// The node stores a value of the lock: someone holds it, or held it a moment ago.
    Held,
    /// Neither, or no answer: proves nothing.
    Unknown,
}

/// A node's answer to phase 1: granted 0/1, fence before, progress, raised 0/1, and the
/// current holder where refused.
type Grant = (i64, Option<u64>, Option<u64>, i64, Option<String>);

/// What each node said in one round.
struct Round<T> {
    replies: Vec<(usize, T)>,
    failures: Vec<NodeFailure>,
}

impl Redlock {
    /// Validates the configuration. Connects lazily: nodes that are down now are retried on use.
    /// Counts into metrics of its own; see [`Redlock::with_metrics`]. Inside a Tokio runtime,
    /// the TLS and password files are read again every `reload_interval` while the engine
    /// lives, and new connections use what changed.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] when the configuration cannot work: no nodes, a node given twice, a URL
    /// that does not parse, a zero request timeout, a drift factor or key prefix out of range.
    /// Nothing is sent to a node before this returns.
    pub fn new(config: RedlockConfig) -> Result<Self, ConfigError> {
        Self::with_metrics(config, LockMetrics::new())
    }

    /// Like [`Redlock::new`], counting into `metrics` (the operator's, which `/metrics` shows).
    ///
    /// # Errors
    ///
    /// Those of [`Redlock::new`].
    pub fn with_metrics(config: RedlockConfig, metrics: LockMetrics) -> Result<Self, ConfigError> {
        let watch = reload::Watch::new(config.watched_files());
        let parsed = config.parse_nodes()?;
        if parsed.len().is_multiple_of(2) {
            tracing::warn!(
                nodes = parsed.len(),
                "an even number of Redis nodes tolerates no more failures than one node fewer; use an odd number"
            );
        }
        let nodes = parsed
            .into_iter()
            .map(|node| {
                let label = node.label.clone();
                Node::new(node, config.request_timeout, config.connect_timeout).map_err(|e| {
                    ConfigError::BadUrl {
                        url: label,
                        reason: e.to_string(),
                    }
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let reload_interval = config.reload_interval;
        let engine = Self {
            inner: Arc::new(Inner {
                quorum: quorum(nodes.len()),
                nodes,
                config,
                parallel: true,
                metrics,
                seen: Mutex::new(HashMap::new()),
                renewals: Batcher::new(send_renewals as SendBatch<_, _, _>),
                hints: Batcher::new(send_hints as SendBatch<_, _, _>),
                holder_reads: Batcher::new(send_holder_reads as SendBatch<_, _, _>),
            }),
        };
        reload::spawn(engine.downgrade(), watch, reload_interval, reload_material);
        Ok(engine)
    }

    /// For tests and benches: the same engine, but asking nodes one after the other, a
    /// baseline for the benchmark. Unlike an engine from [`Redlock::new`], it never reads the
    /// TLS and password files again.
    ///
    /// # Errors
    ///
    /// Those of [`Redlock::new`]: a [`ConfigError`] when the configuration is invalid.
    pub fn new_sequential(config: RedlockConfig) -> Result<Self, ConfigError> {
        let engine = Self::new(config)?;
        let inner = Arc::try_unwrap(engine.inner).unwrap_or_else(|_| unreachable!("fresh Arc"));
        Ok(Self {
            inner: Arc::new(Inner {
                parallel: false,
                ..inner
            }),
        })
    }

    /// The engine without keeping it alive: what its batching tasks (`batch.rs`) hold.
    fn downgrade(&self) -> Weak<Inner> {
        Arc::downgrade(&self.inner)
    }

    /// The metrics this engine counts into: its own, or those given to
    /// [`Redlock::with_metrics`].
    pub fn metrics(&self) -> &LockMetrics {
        &self.inner.metrics
    }

    /// The configuration the engine was built with.
    pub fn config(&self) -> &RedlockConfig {
        &self.inner.config
    }

    /// How many nodes must agree: a strict majority of the configured nodes (`n / 2 + 1`), so
    /// that any two quorums share a node.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// Node addresses, credentials removed.
    pub fn node_labels(&self) -> Vec<String> {
        self.inner.nodes.iter().map(|n| n.label.clone()).collect()
    }

    /// The Redis key of lock `name`, `{prefix}:lock:{name}`: it holds the holder's value.
    pub fn lock_key(&self, name: &str) -> String {
        format!("{}:lock:{name}", self.inner.config.key_prefix)
    }

    /// The key of the fence register of lock `name`, `{prefix}:fence:{name}`: the highest
    /// fencing token issued for the lock.
    pub fn fence_key(&self, name: &str) -> String {
        format!("{}:fence:{name}", self.inner.config.key_prefix)
    }

    /// One attempt, no retries. The lease's token is larger than every token issued for `name`
    /// before, and its deadline is already reduced by the clock-drift allowance.
    ///
    /// # Errors
    ///
    /// - [`LockError::Config`]: an empty name, a zero TTL, or a TTL within the drift allowance;
    /// - [`LockError::Contended`] or [`LockError::SplitVote`]: another holder has the lock on
    ///   enough nodes that no quorum was ours (try again later);
    /// - [`LockError::NoQuorum`]: too few nodes answered or agreed (node failures listed);
    /// - [`LockError::NoValidityLeft`]: the quorum took longer than the TTL allows;
    /// - [`LockError::FenceConflict`]: the fence kept moving under concurrent holders.
    ///
    /// In every case what this attempt took on any node is given back before it returns.
    pub async fn try_acquire(&self, name: &str, ttl: Duration) -> Result<Lease, LockError> {
        let started = Instant::now();
        let result = self.attempt(name, ttl, None).await;
        self.inner
            .metrics
            .record_acquire(outcome_of(&result), started.elapsed());
        result
    }

    /// One attempt to acquire the lock in order to start `step` (for example a scheduled time),
    /// once across all holders. The lock's progress register is read in phase 1 and raised to
    /// `step` in phase 2, in the same round trips as the lock and the fence: a lease comes back
    /// only if no earlier holder started `step` or a later one, with `LockError::StepDone`
    /// otherwise. Two quorums intersect, so a holder that raised the register is always seen.
    ///
    /// # Errors
    ///
    /// Those of [`Redlock::try_acquire`], and [`LockError::StepDone`] when a quorum granted the
    /// lock but a holder already started `step` or a later one.
    pub async fn try_acquire_step(
        &self,
        name: &str,
        ttl: Duration,
        step: u64,
    ) -> Result<Lease, LockError> {
        self.try_acquire_step_in(name, ttl, name, step).await
    }

    /// Like [`Redlock::try_acquire_step`], but with the progress register of `register`
    /// instead of the lock's own: a sequence of steps of its own (a backfill) under the same
    /// lock and fence, so its runs exclude the schedule's and their tokens keep growing.
    ///
    /// # Errors
    ///
    /// Those of [`Redlock::try_acquire_step`].
    pub async fn try_acquire_step_in(
        &self,
        name: &str,
        ttl: Duration,
        register: &str,
        step: u64,
    ) -> Result<Lease, LockError> {
        let started = Instant::now();
        let result = self.attempt(name, ttl, Some((register, step))).await;
        self.inner
            .metrics
            .record_acquire(outcome_of(&result), started.elapsed());
        result
    }

    /// Attempts until success, retrying with full-jitter backoff. With `wait`, retries until
    /// that much time has passed; without, makes `retry_count` extra attempts.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] at once, for what no retry can fix; otherwise
    /// [`LockError::WaitExpired`] once the wait or the attempts are used up, with the last
    /// attempt's error inside.
    pub async fn acquire(
        &self,
        name: &str,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<Lease, LockError> {
        let started = Instant::now();
        let config = &self.inner.config;
        let mut attempt: u32 = 0;
        loop {
            let last = match self.try_acquire(name, ttl).await {
                Ok(lease) => return Ok(lease),
                Err(LockError::Config(e)) => return Err(e.into()),
                Err(e) => e,
            };
            let delay = backoff(
                attempt,
                config.retry_base_delay,
                config.retry_max_delay,
                rand::random::<f64>(),
            );
            attempt += 1;
            let give_up = match wait {
                Some(wait) => started.elapsed() + delay >= wait,
                None => attempt > config.retry_count,
            };
            if give_up {
                return Err(LockError::WaitExpired {
                    lock: name.to_string(),
                    waited: started.elapsed(),
                    attempts: attempt,
                    last: Box::new(last),
                });
            }
            tokio::time::sleep(delay).await;
        }
    }

    async fn attempt(
        &self,
        name: &str,
        ttl: Duration,
        step: Option<(&str, u64)>,
    ) -> Result<Lease, LockError> {
        if name.is_empty() {
            return Err(ConfigError::EmptyLockName.into());
        }
        let drift = drift_allowance(ttl, self.inner.config.drift_factor);
        if ttl.is_zero() {
            return Err(ConfigError::ZeroTtl.into());
        }
        if ttl <= drift {
            return Err(ConfigError::TtlTooShort { ttl, drift }.into());
        }
        let lock_key = self.lock_key(name);
        let fence_key = self.fence_key(name);
        // The progress register takes part only in step acquisitions.
        let progress = step.map(|(register, step)| (self.progress_key(register), step));
        let step = step.map(|(_, step)| step);
        let value = format!(
            "{}/{:032x}",
            self.inner.config.holder,
            rand::random::<u128>()
        );
        let ttl_ms = ttl.as_millis().max(1) as u64;
        let start = Instant::now();

        // Phase 1, one script a node: take the lock, read the fence (and, for a step, the
        // progress register), and where the lock was granted and the fence is below our
        // proposal, raise the fence to it. A proposal raised from below on a quorum is the
        // token, in one round (docs/design.md, "Acquire").
        let proposal = self.proposal(name);
        let mut grant = scripts::ACQUIRE.prepare_invoke();
        grant.key(&lock_key).key(&fence_key);
        if let Some((progress_key, _)) = &progress {
            grant.key(progress_key);
        }
        grant.arg(&value).arg(ttl_ms).arg(proposal);
        let phase1 = self.round::<Grant>("acquire", &grant, None).await;
        let mut failures = phase1.failures;
        let nodes = self.inner.nodes.len();
        let quorum = self.inner.quorum;
        let votes = phase1.replies.into_iter().map(|(index, reply)| {
            let (set, fence, progress, raised, current) = reply;
            let vote = Vote {
                granted: set == 1,
                fence,
                progress,
                raised: raised == 1,
                current,
            };
            (index, vote)
        });
        let tally = Tally::of(nodes, votes);
        for (index, _) in tally.refused.iter().enumerate().filter(|(_, r)| **r) {
            failures.push(self.failure(index, NodeErrorKind::WrongValue));
        }
        self.remember(name, tally.highest_fence);
        let refused = tally.refused.clone();
        let decision = phase1::decide(&tally, nodes, quorum, proposal, step);
        let token = match decision {
            Decision::Token(token) => {
                if let Some((progress_key, step)) = &progress {
                    // The progress register says a holder *started* the step, so it is raised
                    // only now that the lock is ours.
                    if let Err(err) = self.raise_progress(name, progress_key, *step).await {
                        self.release_value_except(&lock_key, &value, &refused).await;
                        return Err(err);
                    }
                }
                token
            }
            Decision::Fence { floor } => {
                match self
                    .fence(name, &fence_key, floor + 1, progress.as_ref())
                    .await
                {
                    Ok(token) => token,
                    Err(err) => {
                        self.release_value_except(&lock_key, &value, &refused).await;
                        return Err(err);
                    }
                }
            }
            refusal => {
                // A node whose SET NX answered nil holds no value of ours (the value is new
                // for this attempt), so it needs no delete; every other node does, including
                // those that did not answer. With several contenders this halves a loser's
                // traffic.
                self.release_value_except(&lock_key, &value, &refused).await;
                return Err(refusal_error(refusal, name, &tally, failures, quorum, step));
            }
        };
        self.remember(name, token);

        let now = Instant::now();
        let elapsed = now - start;
        match validity(ttl, elapsed, self.inner.config.drift_factor) {
            Some(left) => Ok(Lease {
                name: name.to_string(),
                value,
                refused,
                token,
                ttl,
                acquired_at: start,
                deadline: now + left,
            }),
            None => {
                self.release_value_except(&lock_key, &value, &refused).await;
                Err(LockError::NoValidityLeft {
                    lock: name.to_string(),
                    elapsed,
                    ttl,
                })
            }
        }
    }

    /// Phase 2: raises the fence to `token`, or above what the nodes report, until a quorum
    /// raised it from below: that makes the token unique. With a step (its progress key and
    /// value), the progress register is raised in the same script. Returns the token.
    async fn fence(
        &self,
        name: &str,
        fence_key: &str,
        mut token: u64,
        progress: Option<&(String, u64)>,
    ) -> Result<u64, LockError> {
        let quorum = self.inner.quorum;
        let mut rounds = 0;
        loop {
            rounds += 1;
            let mut raise = scripts::FENCE.prepare_invoke();
            raise.key(fence_key).arg(token);
            if let Some((progress_key, step)) = progress {
                raise.key(progress_key).arg(*step);
            }
            let phase2 = self.round::<i64>("fence", &raise, None).await;
            let raised = phase2
                .replies
                .iter()
                .filter(|(_, previous)| *previous < token as i64)
                .count();
            let seen = phase2.replies.iter().map(|(_, previous)| *previous).max();
            if raised >= quorum {
                return Ok(token);
            }
            match seen {
                Some(seen) if seen >= token as i64 && rounds < MAX_FENCE_ROUNDS => {
                    token = seen as u64 + 1;
                }
                Some(seen) if seen >= token as i64 => {
                    self.remember(name, seen as u64);
                    return Err(LockError::FenceConflict {
                        lock: name.to_string(),
                        token,
                        seen: seen as u64,
                    });
                }
                _ => return Err(self.no_quorum(name, raised, phase2.failures)),
            }
        }
    }

    /// Marks `step` started on a quorum (the token was settled in phase 1).
    async fn raise_progress(
        &self,
        name: &str,
        progress_key: &str,
        step: u64,
    ) -> Result<(), LockError> {
        let mut raise = scripts::PROGRESS.prepare_invoke();
        raise.key(progress_key).arg(step);
        let round = self.round::<i64>("progress", &raise, None).await;
        if round.replies.len() < self.inner.quorum {
            return Err(self.no_quorum(name, round.replies.len(), round.failures));
        }
        Ok(())
    }

    /// The token to propose for `name`: one above the highest this engine has seen for it.
    /// Right whenever this engine took the lock last or watched who did; otherwise phase 2
    /// corrects it.
    fn proposal(&self, name: &str) -> u64 {
        lock_seen(&self.inner.seen)
            .get(name)
            .map_or(1, |seen| seen + 1)
    }

    fn remember(&self, name: &str, token: u64) {
        let mut seen = lock_seen(&self.inner.seen);
        if let Some(known) = seen.get_mut(name) {
            *known = (*known).max(token);
            return;
        }
        if token == 0 {
            return;
        }
        // A bound for processes that use very many lock names (the benchmark); forgetting
        // costs at most one extra round per name.
        if seen.len() >= SEEN_TOKENS_LIMIT {
            seen.clear();
        }
        seen.insert(name.to_string(), token);
    }

    /// Pushes the lease's expiry out by its TTL on a quorum, within the current validity. The new
    /// deadline counts from the moment the extend began. Never re-creates an expired key.
    ///
    /// # Errors
    ///
    /// - [`LockError::Expired`]: the lease's deadline had passed; nothing was sent;
    /// - [`LockError::NoQuorum`]: fewer than a quorum still held this lease's value;
    /// - [`LockError::NoValidityLeft`]: the round ended past the new deadline.
    ///
    /// After any of these the holder must assume the lock may be someone else's.
    pub async fn extend(&self, lease: &Lease) -> Result<Instant, LockError> {
        let mut results = self.extend_many(&[lease]).await;
        results
            .pop()
            .unwrap_or_else(|| unreachable!("extend_many answers once per lease"))
    }

    /// Like [`Redlock::extend`], but waiting up to `linger` for other renewals to share the
    /// round (the watchdog's choice: `batch::renewal_linger`).
    /// What the watchdog calls: with hundreds of leases in work, each node then sees about one
    /// request per round of renewals instead of one per lease (docs/design.md, "Renewal").
    ///
    /// # Errors
    ///
    /// Those of [`Redlock::extend`].
    pub async fn renew(&self, lease: &Lease, linger: Duration) -> Result<Instant, LockError> {
        let renewals = &self.inner.renewals;
        self.in_shared_round(renewals, lease.clone(), linger, self.extend(lease))
            .await
    }

    /// Queues `request` on `batcher` for a shared round; when the batcher's task is gone (only
    /// while the engine is being dropped), answers with `alone` instead.
    async fn in_shared_round<Request: Send + 'static, Answer: Send + 'static>(
        &self,
        batcher: &Batcher<Inner, Request, Answer>,
        request: Request,
        linger: Duration,
        alone: impl std::future::Future<Output = Answer>,
    ) -> Answer {
        match batcher.enqueue(request, linger, || self.downgrade()).await {
            Ok(answer) => answer,
            Err(_) => alone.await,
        }
    }

    /// [`Redlock::extend`] for several leases in one round: each node gets one script call for
    /// all of them. Answers once per lease, in order, as `extend` would have for it alone,
    /// errors included (those of [`Redlock::extend`]).
    pub async fn extend_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        let start = Instant::now();
        let live = |lease: &&&Lease| lease.deadline > start;
        let mut invocation = scripts::EXTEND.prepare_invoke();
        let mut longest_left = Duration::ZERO;
        for lease in leases.iter().filter(live) {
            invocation
                .key(self.lock_key(&lease.name))
                .arg(&lease.value)
                .arg(lease.ttl.as_millis().max(1) as u64);
            longest_left = longest_left.max(lease.deadline - start);
        }
        let round = if longest_left.is_zero() {
            Round {
                replies: Vec::new(),
                failures: Vec::new(),
            }
        } else {
            // Bounded by the longest validity in the batch: each lease's own is checked below.
            self.round::<Vec<i64>>("extend", &invocation, Some(longest_left))
                .await
        };
        let now = Instant::now();
        let mut position = 0;
        let results: Vec<_> = leases
            .iter()
            .map(|lease| {
                if !live(&lease) {
                    return Err(LockError::Expired {
                        lock: lease.name.clone(),
                    });
                }
                let mut failures = round.failures.clone();
                let mut extended = 0;
                for (index, replies) in &round.replies {
                    if replies.get(position) == Some(&1) {
                        extended += 1;
                    } else {
                        failures.push(self.failure(*index, NodeErrorKind::WrongValue));
                    }
                }
                position += 1;
                self.extended_until(lease, start, now, extended, failures)
            })
            .collect();
        for result in &results {
            self.inner.metrics.record_renewal(result.is_ok());
        }
        results
    }

    /// The new deadline of a lease that `extended` nodes extended in a round begun at `start`.
    fn extended_until(
        &self,
        lease: &Lease,
        start: Instant,
        now: Instant,
        extended: usize,
        failures: Vec<NodeFailure>,
    ) -> Result<Instant, LockError> {
        self.check_held(lease, extended, failures)?;
        let drift = drift_allowance(lease.ttl, self.inner.config.drift_factor);
        let deadline = start + lease.ttl.saturating_sub(drift);
        if deadline <= now {
            return Err(LockError::NoValidityLeft {
                lock: lease.name.clone(),
                elapsed: now - start,
                ttl: lease.ttl,
            });
        }
        Ok(deadline)
    }

    /// The key of the progress register `name`, `{prefix}:progress:{name}`: the highest
    /// step started under it (a lock's own register has the lock's name).
    pub fn progress_key(&self, name: &str) -> String {
        format!("{}:progress:{name}", self.inner.config.key_prefix)
    }

    fn no_quorum(&self, lock: &str, granted: usize, failures: Vec<NodeFailure>) -> LockError {
        LockError::NoQuorum {
            lock: lock.to_string(),
            granted,
            quorum: self.inner.quorum,
            nodes: self.inner.nodes.len(),
            failures,
        }
    }

    fn check_held(
        &self,
        lease: &Lease,
        answered: usize,
        failures: Vec<NodeFailure>,
    ) -> Result<(), LockError> {
        if lease.is_expired() {
            return Err(LockError::Expired {
                lock: lease.name.clone(),
            });
        }
        if answered < self.inner.quorum {
            return Err(self.no_quorum(&lease.name, answered, failures));
        }
        Ok(())
    }

    /// Compare-and-delete on every node. Returns how many nodes deleted the key; a node that
    /// failed is logged (its key stays until the TTL runs out, which delays the next holder).
    pub async fn release(&self, lease: &Lease) -> usize {
        let (released, failures) = self
            .release_value_except(&self.lock_key(&lease.name), &lease.value, &lease.refused)
            .await;
        if !failures.is_empty() {
            tracing::warn!(
                lock = %lease.name,
                failures = %Failures(&failures),
                "release failed on some nodes; the lock stays there until its TTL runs out"
            );
        }
        self.inner.metrics.record_release();
        released
    }

    /// Compare-and-delete of a holder's `value` of lock `name` on every node, for a holder known
    /// to be dead (its process can no longer renew or act): the lock frees at once instead of
    /// a TTL later. Deletes nothing where the lock has another value. Returns how many nodes
    /// deleted it. Only safe when the holder is *confirmed* dead, not merely silent: a paused or
    /// cut-off holder would keep acting while another holds the lock (docs/design.md,
    /// "Failover when Kubernetes confirms the leader's end").
    pub async fn release_dead_holder(&self, name: &str, value: &str) -> usize {
        let (released, failures) = self
            .release_value_except(&self.lock_key(name), value, &[])
            .await;
        if !failures.is_empty() {
            tracing::warn!(lock = %name, failures = %Failures(&failures), "a dead holder's value could not be deleted everywhere; it stays there until its TTL runs out");
        }
        released
    }

    /// Deletes `value` from every node not marked in `skip` (indexed by node; shorter means the
    /// rest are not skipped), including those that timed out: a SET may have landed even
    /// though its reply was lost.
    async fn release_value_except(
        &self,
        lock_key: &str,
        value: &str,
        skip: &[bool],
    ) -> (usize, Vec<NodeFailure>) {
        let mut invocation = scripts::RELEASE.prepare_invoke();
        invocation.key(lock_key).arg(value);
        let round = self
            .round_except::<i64>("release", &invocation, None, skip)
            .await;
        let released = round.replies.iter().filter(|(_, n)| *n == 1).count();
        (released, round.failures)
    }

    /// How many nodes answer a trivial script now (readiness, degraded-mode reporting).
    pub async fn reachable_nodes(&self) -> usize {
        let invocation = scripts::PING.prepare_invoke();
        let round = self.round::<i64>("probe", &invocation, None).await;
        self.inner.metrics.set_nodes_reachable(round.replies.len());
        round.replies.len()
    }

    /// Who holds `name` now, as seen by a quorum: the holder part of the value a majority of
    /// nodes store, or `None` when no value has a majority. Waits a moment (250 ms) for other
    /// reads to share the round.
    pub async fn current_holder(&self, name: &str) -> Option<String> {
        let alone = async { self.current_holders(&[name.to_string()]).await.pop()? };
        let reads = &self.inner.holder_reads;
        self.in_shared_round(reads, name.to_string(), READ_LINGER, alone)
            .await
    }

    /// [`Redlock::current_holder`] without waiting for other reads to share the round: for a
    /// caller on a critical path (an election that must check before it shows leadership).
    pub async fn current_holder_now(&self, name: &str) -> Option<String> {
        self.current_holders(&[name.to_string()]).await.pop()?
    }

    /// [`Redlock::current_holder`] of each of `names`, in one round.
    async fn current_holders(&self, names: &[String]) -> Vec<Option<String>> {
        let mut invocation = scripts::GET.prepare_invoke();
        for name in names {
            invocation.key(self.lock_key(name));
        }
        let round = self
            .round::<Vec<Option<String>>>("holder", &invocation, None)
            .await;
        (0..names.len())
            .map(|position| {
                let values = round
                    .replies
                    .iter()
                    .filter_map(|(_, values)| values.get(position)?.as_deref());
                most_common(values)
                    .filter(|(_, count)| *count >= self.inner.quorum)
                    .map(|(value, _)| holder_of(value).to_string())
            })
            .collect()
    }

    /// The value one node (`which`, modulo the node count) stores for `name`, and how long
    /// that node keeps it unless it is renewed: `None` when it stores none or does not answer.
    /// One request, for a hint only (an orphan check): a node still holding a holder's value
    /// has seen it renewed within a TTL, but one node is no quorum, so nothing that needs the
    /// truth may rest on it.
    ///
    /// For tests, which ask a chosen node: the operator calls [`Redlock::value_on_any_node`]
    /// (which falls back on this one only while the engine is being dropped).
    pub async fn value_on_node(&self, name: &str, which: usize) -> Option<(String, Duration)> {
        self.values_on_node(&[name.to_string()], which)
            .await
            .pop()?
    }

    /// [`Redlock::value_on_node`] on a node picked at random per round, waiting a moment
    /// (250 ms) for other hints to share the request.
    pub async fn value_on_any_node(&self, name: &str) -> Option<(String, Duration)> {
        let alone = self.value_on_node(name, rand::random::<u32>() as usize);
        let hints = &self.inner.hints;
        self.in_shared_round(hints, name.to_string(), READ_LINGER, alone)
            .await
    }

    /// [`Redlock::value_on_node`] of each of `names`, in one request.
    async fn values_on_node(
        &self,
        names: &[String],
        which: usize,
    ) -> Vec<Option<(String, Duration)>> {
        let mut invocation = scripts::HINT.prepare_invoke();
        for name in names {
            invocation.key(self.lock_key(name));
        }
        let hints = self
            .on_node::<Vec<(Option<String>, i64)>>("hint", &invocation, which)
            .await
            .unwrap_or_default();
        (0..names.len())
            .map(|position| {
                let (value, pttl) = hints.get(position)?.clone();
                Some((value?, Duration::from_millis(pttl.max(0) as u64)))
            })
            .collect()
    }

    /// What one node (`which`, modulo the node count) says about `step` of the progress
    /// register `register` under the lock `lock`, before an attempt: one request instead of a
    /// round (and the releases of a refused one). A node's register is raised only by a holder
    /// that won the lock to start that step, and an attempt takes the largest register it
    /// sees, so with `Started` the attempt would come back `StepDone` or held by that runner.
    /// `Held` (the node stores a lock value) says the attempt would most likely be refused;
    /// one node is no quorum, so it may also be the leftover of an attempt that failed.
    pub async fn step_hint(&self, lock: &str, register: &str, step: u64, which: usize) -> StepHint {
        let mut invocation = scripts::GET.prepare_invoke();
        invocation
            .key(self.progress_key(register))
            .key(self.lock_key(lock));
        let Some(values) = self
            .on_node::<Vec<Option<String>>>("step_hint", &invocation, which)
            .await
        else {
            return StepHint::Unknown;
        };
        let mut values = values.into_iter();
        let started = values.next().flatten();
        let held = values.next().flatten();
        match (started.and_then(|v| v.parse::<u64>().ok()), held) {
            (Some(started), _) if started >= step => StepHint::Started,
            (_, Some(_)) => StepHint::Held,
            _ => StepHint::Unknown,
        }
    }

    /// Sends one invocation to one node (`which`, modulo the node count), bounded like every
    /// round: its reply, or `None` when it did not answer.
    async fn on_node<T: FromRedisValue + Send>(
        &self,
        op: &'static str,
        request: &redis::ScriptInvocation<'_>,
        which: usize,
    ) -> Option<T> {
        let count = self.inner.nodes.len();
        let skip: Vec<bool> = (0..count).map(|i| i != which % count.max(1)).collect();
        let round = self.round_except::<T>(op, request, None, &skip).await;
        round.replies.into_iter().next().map(|(_, reply)| reply)
    }

    /// Every node's view of `name`: value, TTL, fence and progress registers, or why the node
    /// did not answer (`lockedjob status`). Reads only.
    pub async fn inspect(&self, name: &str) -> LockView {
        let mut invocation = scripts::INSPECT.prepare_invoke();
        invocation
            .key(self.lock_key(name))
            .key(self.fence_key(name))
            .key(self.progress_key(name));
        type Reply = (Option<String>, i64, Option<String>, Option<String>);
        let round = self.round::<Reply>("inspect", &invocation, None).await;
        let register = |v: Option<String>| v.and_then(|v| v.parse::<u64>().ok());
        let mut views: Vec<(usize, NodeView)> = round
            .replies
            .into_iter()
            .map(|(index, (value, ttl, fence, progress))| {
                let view = NodeView {
                    node: self.inner.nodes[index].label.clone(),
                    error: None,
                    ttl_ms: u64::try_from(ttl).ok().filter(|_| value.is_some()),
                    value,
                    fence: register(fence),
                    progress: register(progress),
                };
                (index, view)
            })
            .collect();
        for failure in round.failures {
            let index = self
                .inner
                .nodes
                .iter()
                .position(|n| n.label == failure.node)
                .unwrap_or(usize::MAX);
            views.push((
                index,
                NodeView::failed(failure.node, failure.kind.to_string()),
            ));
        }
        views.sort_by_key(|(index, _)| *index);
        LockView::new(
            name,
            self.inner.quorum,
            views.into_iter().map(|(_, view)| view).collect(),
        )
    }

    /// Sends one invocation to every node (in parallel unless built sequential), each bounded
    /// by the request timeout and by `limit`.
    async fn round<T: FromRedisValue + Send>(
        &self,
        op: &'static str,
        request: &redis::ScriptInvocation<'_>,
        limit: Option<Duration>,
    ) -> Round<T> {
        self.round_except(op, request, limit, &[]).await
    }

    /// [`round`](Self::round) on every node not marked in `skip`.
    async fn round_except<T: FromRedisValue + Send>(
        &self,
        op: &'static str,
        request: &redis::ScriptInvocation<'_>,
        limit: Option<Duration>,
        skip: &[bool],
    ) -> Round<T> {
        // Without a limit of the caller's, each node's own bound holds (`Node::run_within`).
        let limit = limit.unwrap_or(Duration::MAX);
        let targets: Vec<(usize, &Node)> = self
            .inner
            .nodes
            .iter()
            .enumerate()
            .filter(|(index, _)| !skip.get(*index).copied().unwrap_or(false))
            .collect();
        self.inner.metrics.record_redis_requests(op, targets.len());
        let results: Vec<(usize, Result<T, NodeErrorKind>)> = if self.inner.parallel {
            join_all(targets.iter().map(|(index, node)| async move {
                (*index, self.timed(node, op, request, limit).await)
            }))
            .await
        } else {
            let mut results = Vec::with_capacity(targets.len());
            for (index, node) in &targets {
                results.push((*index, self.timed(node, op, request, limit).await));
            }
            results
        };
        let mut round = Round {
            replies: Vec::with_capacity(results.len()),
            failures: Vec::new(),
        };
        for (index, result) in results {
            match result {
                Ok(value) => round.replies.push((index, value)),
                Err(kind) => round.failures.push(self.failure(index, kind)),
            }
        }
        round
    }

    /// One node's request, its time counted by node, op and result.
    async fn timed<T: FromRedisValue + Send>(
        &self,
        node: &Node,
        op: &'static str,
        request: &redis::ScriptInvocation<'_>,
        limit: Duration,
    ) -> Result<T, NodeErrorKind> {
        let started = Instant::now();
        let result = node.run_within::<T>(request, limit).await;
        let kind = result.as_ref().err().map_or("ok", NodeErrorKind::label);
        self.inner
            .metrics
            .record_node_request(&node.label, op, kind, started.elapsed());
        result
    }

    fn failure(&self, index: usize, kind: NodeErrorKind) -> NodeFailure {
        NodeFailure {
            node: self.inner.nodes[index].label.clone(),
            kind,
        }
    }
}

fn outcome_of(result: &Result<Lease, LockError>) -> Outcome {
    match result {
        Ok(_) => Outcome::Acquired,
        Err(e) if e.is_contended() => Outcome::Contended,
        Err(LockError::StepDone { .. }) => Outcome::AlreadyDone,
        Err(_) => Outcome::Failed,
    }
}

/// The error of an attempt that phase 1 refused.
fn refusal_error(
    refusal: Decision,
    lock: &str,
    tally: &Tally,
    failures: Vec<NodeFailure>,
    quorum: usize,
    step: Option<u64>,
) -> LockError {
    let (lock, granted, done, nodes) = (
        lock.to_string(),
        tally.granted,
        tally.done,
        tally.refused.len(),
    );
    match refusal {
        Decision::StepDone { done } => LockError::StepDone {
            lock,
            step: step.unwrap_or(done),
            done,
        },
        Decision::Contended => LockError::Contended {
            lock,
            granted,
            quorum,
            nodes,
            failures,
            progress: done,
        },
        Decision::SplitVote => LockError::SplitVote {
            lock,
            granted,
            strongest_other: tally.strongest_other,
            quorum,
            nodes,
            failures,
            progress: done,
        },
        // Token and Fence are not refusals and never come here.
        Decision::NoQuorum | Decision::Token(_) | Decision::Fence { .. } => LockError::NoQuorum {
            lock,
            granted,
            quorum,
            nodes,
            failures,
        },
    }
}
