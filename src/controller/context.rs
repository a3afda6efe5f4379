//! What every reconcile and run task of one replica shares: clients, the engine, the Job
//! caches, the run bookkeeping, health and metrics.

use super::error::Error;
use super::health::Health;
use super::jobs;
use super::runs::Runs;
use super::subject::Subject;
use crate::metrics::Metrics;
use crate::redlock::Redlock;
use k8s_openapi::api::batch::v1::Job;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::Client;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The operator's Jobs, a cache per watched scope (`None`: all namespaces).
pub type JobCaches = Vec<(Option<String>, Store<Job>)>;

/// Shared by every reconcile and run task of one replica.
pub struct Context {
    pub client: Client,
    pub engine: Redlock,
    pub cluster_id: String,
    /// `{clusterId}/{podName}`.
    pub holder: String,
    /// Which runs this replica starts and supervises, and when to try them again.
    pub runs: Runs,
    pub health: Health,
    /// Cancelled on SIGTERM: no new runs; running ones are handed over.
    pub shutdown: CancellationToken,
    /// Watch caches of the operator's Jobs, one per watched scope (a namespace, or `None` for
    /// all): reconciles and supervisors read Jobs here instead of asking the API server.
    pub job_caches: JobCaches,
    /// Bounds this replica's lock attempts in flight (renewals are not bounded here).
    pub lock_attempts: tokio::sync::Semaphore,
    /// Every task a reconcile starts (runs, adoptions, Events): shutdown waits for them, so a
    /// run between winning its lock and supervising its Job still hands the lock over.
    pub tasks: TaskTracker,
    /// Rendered at `/metrics`; shared with the engine.
    pub metrics: Metrics,
}

/// Lock attempts one replica has in flight at most. When a thousand LockedJobs fall due in the
/// same second, firing every attempt at once overruns the nodes' request timeout; attempts
/// that time out still cost the nodes their work plus a release, and their retries feed the
/// overload. Queued here, they wait a moment and then succeed or lose cleanly.
pub const MAX_LOCK_ATTEMPTS_IN_FLIGHT: usize = 32;

impl Context {
    pub fn nodes(&self) -> usize {
        self.engine.node_labels().len()
    }

    fn job_cache(&self, namespace: &str) -> Option<&Store<Job>> {
        self.job_caches
            .iter()
            .find(|(scope, _)| scope.as_deref().is_none_or(|s| s == namespace))
            .map(|(_, store)| store)
    }

    /// The cached Jobs of `namespace` that `keep` accepts, once the cache has its first list.
    pub async fn cached_jobs(
        &self,
        namespace: &str,
        keep: impl Fn(&Job) -> bool,
    ) -> Result<Vec<Arc<Job>>, Error> {
        let cache = self.job_cache(namespace).ok_or(Error::JobCacheGone)?;
        // Many reconciles wait on this cache at start-up: see `store_ready`.
        if !store_ready(cache).await {
            return Err(Error::JobCacheGone);
        }
        Ok(cache
            .state_filter(|job| job.metadata.namespace.as_deref() == Some(namespace) && keep(job)))
    }

    /// The LockedJob's Jobs in the cache: its label and its owner reference (a Job left by an
    /// earlier LockedJob of the same name has another owner uid).
    pub async fn jobs_of(&self, subject: &Subject) -> Result<Vec<Arc<Job>>, Error> {
        use kube::ResourceExt;
        let (name, uid) = (&subject.name, subject.lj.uid().unwrap_or_default());
        self.cached_jobs(&subject.namespace, |j| {
            j.labels().get(jobs::LABEL_LOCKED_JOB) == Some(name)
                && j.owner_references().iter().any(|r| r.uid == uid)
        })
        .await
    }

    /// One cached Job; `None` also when the cache has not seen it (yet).
    pub fn cached_job(&self, namespace: &str, name: &str) -> Option<Arc<Job>> {
        self.job_cache(namespace)?
            .get(&ObjectRef::new(name).within(namespace))
    }

    pub fn is_ready(&self) -> bool {
        self.health.synced()
            && self.health.reachable() >= self.engine.quorum()
            && !self.shutdown.is_cancelled()
    }
}

/// Waits until a store has had its first list (false: its writer is gone). kube-runtime's
/// `wait_until_ready` wakes only the last of several concurrent waiters (its one-shot channel
/// keeps one waker), and the Controller waits on its own store too: a waiter that polled first
/// could sleep forever, leaving a replica unready (seen with the chart's pods). A fresh wait
/// every interval sees the value the other waiter received.
pub(super) async fn store_ready<K>(store: &Store<K>) -> bool
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        if let Ok(result) = tokio::time::timeout(STORE_READY_POLL, store.wait_until_ready()).await {
            return result.is_ok();
        }
    }
}

const STORE_READY_POLL: Duration = Duration::from_millis(200);
