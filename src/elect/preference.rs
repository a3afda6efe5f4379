//! Preference (`--priority`, docs/design.md, "Preference and stickiness"): after a failover, a
//! candidate of higher priority (the primary cluster's, say) takes leadership back, but only
//! once it has seen a Redis quorum for `--reclaim-after`, and only through a clean handover.
//!
//! It asks with a request lock, `{lock}#handover`, whose holder names its priority. The leader
//! reads it at each renewal and, when the asking priority is higher than its own, steps down
//! and releases. A candidate that wins the free lock while a request of higher priority than
//! its own is pending gives it back at once, so the asker is the one that gets it. Equal
//! priorities never take over from each other: a healthy leader is not preempted by an equal.

use crate::redlock::{Lease, LockError, Redlock, RedlockConfig};
use std::time::{Duration, Instant};

/// How a request lock's holder names its priority: `{cluster}/{pod}#priority=N`.
const PRIORITY_MARK: &str = "#priority=";

/// The request lock of election `lock`.
fn request_lock(lock: &str) -> String {
    format!("{lock}#handover")
}

/// The priority a request lock's holder names.
fn priority_of(holder: &str) -> Option<u32> {
    holder.rsplit_once(PRIORITY_MARK)?.1.parse().ok()
}

/// This candidate's priority, and the engine it asks for a handover with.
pub(super) struct Preference {
    priority: u32,
    reclaim_after: Duration,
    /// Same nodes, a holder that names the priority; only for a priority above 0.
    asking: Option<Redlock>,
}

impl Preference {
    pub fn new(
        priority: u32,
        reclaim_after: Duration,
        config: &RedlockConfig,
    ) -> Result<Self, crate::redlock::ConfigError> {
        let asking = if priority > 0 {
            let mut config = config.clone();
            config.holder = format!("{}{PRIORITY_MARK}{priority}", config.holder);
            Some(Redlock::new(config)?)
        } else {
            None
        };
        Ok(Self {
            priority,
            reclaim_after,
            asking,
        })
    }

    /// The priority that asks for `lock` now, if any asks (one quorum read).
    async fn pending(engine: &Redlock, lock: &str) -> Option<u32> {
        let holder = engine.current_holder_now(&request_lock(lock)).await?;
        priority_of(&holder)
    }

    /// Whether a candidate that just won the free `lock` must give it back: someone of
    /// higher priority is waiting for it.
    pub async fn must_yield(&self, engine: &Redlock, lock: &str) -> bool {
        Self::pending(engine, lock)
            .await
            .is_some_and(|asking| asking > self.priority)
    }

    /// Resolves once a candidate of higher priority asks for a handover, checking every
    /// `every` (the leader's renew interval); never while nobody outranks this one.
    pub async fn handover_requested(&self, engine: &Redlock, lock: &str, every: Duration) {
        loop {
            tokio::time::sleep(every).await;
            if self.must_yield(engine, lock).await {
                return;
            }
        }
    }

    /// A campaign's view of its own request: asks while the lock is held by another and this
    /// candidate has seen a quorum (a refusal for a holder) for `reclaim_after`.
    pub fn campaign(&self) -> Asking<'_> {
        Asking {
            preference: self,
            healthy_since: None,
            request: None,
        }
    }
}

/// One campaign's handover request.
pub(super) struct Asking<'a> {
    preference: &'a Preference,
    /// Since when every attempt found the lock held by another (a quorum answered).
    healthy_since: Option<Instant>,
    request: Option<Lease>,
}

impl Asking<'_> {
    /// After an attempt that did not win: keep asking, start asking, or stop.
    pub async fn after_attempt(&mut self, outcome: &LockError, lock: &str, request_ttl: Duration) {
        let Some(engine) = &self.preference.asking else {
            return;
        };
        if !outcome.is_contended() {
            self.healthy_since = None;
            return;
        }
        let since = *self.healthy_since.get_or_insert_with(Instant::now);
        if since.elapsed() < self.preference.reclaim_after {
            return;
        }
        if let Some(request) = &self.request {
            if engine.extend(request).await.is_ok() {
                return;
            }
        }
        self.request = match engine.try_acquire(&request_lock(lock), request_ttl).await {
            Ok(request) => {
                tracing::info!(
                    priority = self.preference.priority,
                    "the leader's lock is held elsewhere and a quorum answers: asking for a handover"
                );
                Some(request)
            }
            // Another candidate asks already; the leader compares priorities.
            Err(_) => None,
        };
    }

    /// Elected, or the campaign ends: the request is withdrawn.
    pub async fn withdraw(&mut self) {
        if let (Some(engine), Some(request)) = (&self.preference.asking, self.request.take()) {
            engine.release(&request).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_holder_names_its_priority() {
        let table = [
            ("prod-eu/writer-0#priority=2", Some(2)),
            ("prod-eu/writer-0#priority=0", Some(0)),
            ("prod-eu/writer-0", None),
            ("prod-eu/writer-0#priority=", None),
            ("prod-eu/writer-0#priority=-1", None),
            ("a#priority=1/b#priority=3", Some(3)),
        ];
        for (holder, expected) in table {
            assert_eq!(priority_of(holder), expected, "{holder}");
        }
        assert_eq!(request_lock("demo"), "demo#handover");
    }
}
