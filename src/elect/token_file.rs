//! The leader's token file (`--token-file`): what a workload reads to learn that it leads and
//! with which token.

use super::lease_runner::LeaseEvent;
use crate::redlock::{Lease, LeaseStatus, LeaseTiming};
use jiff::Timestamp;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

/// The leader's token file: what a workload reads to learn that it leads and with which token.
pub(super) struct TokenFile {
    path: PathBuf,
}

/// The token file's content.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LeaderRecord {
    pub lock: String,
    pub holder: String,
    pub token: u64,
    /// Past this wall-clock time the lease may have been given up: act only before it.
    pub valid_until: Timestamp,
}

impl TokenFile {
    /// Checks that the file can be written where asked, so a bad path fails at start-up and
    /// not on the first election, and removes a record left there.
    pub(super) fn new(path: &Path) -> Result<Self, String> {
        let dir = parent_dir(path);
        tempfile::NamedTempFile::new_in(dir).map_err(|e| {
            format!(
                "--token-file {}: cannot write in {}: {e}; give a path in a writable directory (an emptyDir volume in a pod)",
                path.display(),
                dir.display()
            )
        })?;
        let file = Self {
            path: path.to_path_buf(),
        };
        // A record left by an instance killed while it led: this one does not lead yet.
        file.remove();
        Ok(file)
    }

    pub(super) fn follow(&self, lease: &Lease, timing: &LeaseTiming, event: LeaseEvent) {
        match event {
            LeaseEvent::Held(status) => self.write(&leader_record(lease, timing, &status)),
            LeaseEvent::Lost => self.remove(),
        }
    }

    /// Replaces the file in one rename, so a reader sees the old record or the new one.
    pub(super) fn write(&self, record: &LeaderRecord) {
        let written = serde_json::to_vec(record)
            .map_err(std::io::Error::other)
            .and_then(|json| {
                let mut file = tempfile::NamedTempFile::new_in(parent_dir(&self.path))?;
                std::io::Write::write_all(&mut file, &json)?;
                file.persist(&self.path).map_err(|e| e.error)?;
                Ok(())
            });
        if let Err(e) = written {
            tracing::error!(path = %self.path.display(), error = %e, "cannot write the token file");
        }
    }

    pub(super) fn remove(&self) {
        match std::fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "cannot remove the token file")
            }
        }
    }
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// The record for a lease with this status: valid until the point where the watchdog gives up
/// (deadline minus the safety margin), on the wall clock now.
pub(super) fn leader_record(
    lease: &Lease,
    timing: &LeaseTiming,
    status: &LeaseStatus,
) -> LeaderRecord {
    let give_up = status
        .deadline
        .checked_sub(timing.safety_margin)
        .unwrap_or(status.deadline);
    let left = give_up.saturating_duration_since(Instant::now());
    let valid_until = Timestamp::now()
        .checked_add(jiff::SignedDuration::try_from(left).unwrap_or_default())
        .unwrap_or(Timestamp::MAX);
    LeaderRecord {
        lock: lease.name().to_string(),
        holder: lease.holder().to_string(),
        token: lease.token(),
        valid_until,
    }
}

/// A sidecar's leader record while it leads: in the token file and at `/leader`, valid for
/// `--record-validity` at most and rewritten every quarter of that by a task of its own, so
/// that slow API calls cannot let it lapse. If the sidecar dies, its workload stops acting
/// that soon, and a successor told so by the kubelet waits just that long (`ended.rs`).
pub(super) struct LiveRecord {
    file: Option<TokenFile>,
    endpoint: watch::Sender<Option<LeaderRecord>>,
    validity: Duration,
    /// When the last record was written (monotonic clock).
    last_written: std::sync::Mutex<Option<Instant>>,
}

impl LiveRecord {
    pub(super) fn new(
        file: Option<TokenFile>,
        endpoint: watch::Sender<Option<LeaderRecord>>,
        validity: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            file,
            endpoint,
            validity,
            last_written: std::sync::Mutex::new(None),
        })
    }

    /// When the last record written has expired for its reader, on the same node's clock,
    /// with the clock drift the locks allow; now if none was written.
    pub(super) fn expired_at(&self, drift_factor: f64) -> Instant {
        let written = *self.last_written.lock().unwrap_or_else(|e| e.into_inner());
        written.map_or_else(Instant::now, |at| {
            at + record_lifetime(self.validity, drift_factor)
        })
    }

    pub(super) fn validity(&self) -> Duration {
        self.validity
    }

    /// Writes the record of `lease` now and keeps it fresh from the watchdog's `statuses`
    /// until [`Freshness::stop`].
    pub(super) fn keep_fresh(
        self: &Arc<Self>,
        lease: Lease,
        timing: LeaseTiming,
        statuses: watch::Receiver<LeaseStatus>,
    ) -> Freshness {
        // Written before this returns, so the workload knows it leads before its pod is
        // marked and routed to; the task's first tick comes a period later.
        self.write(&lease, &timing, &statuses.borrow());
        let stop = CancellationToken::new();
        let (record, stopped) = (Arc::clone(self), stop.clone());
        let task = tokio::spawn(async move {
            let period = record.validity / 4;
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = stopped.cancelled() => return,
                    _ = ticks.tick() => record.write(&lease, &timing, &statuses.borrow()),
                }
            }
        });
        Freshness {
            stop,
            task: AbortOnDropHandle::new(task),
        }
    }

    fn write(&self, lease: &Lease, timing: &LeaseTiming, status: &LeaseStatus) {
        let record = leader_record(lease, timing, status);
        let reach = jiff::SignedDuration::try_from(self.validity).unwrap_or_default();
        let capped = Timestamp::now()
            .checked_add(reach)
            .unwrap_or(Timestamp::MAX);
        let record = LeaderRecord {
            valid_until: record.valid_until.min(capped),
            ..record
        };
        *self.last_written.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        if let Some(file) = &self.file {
            file.write(&record);
        }
        self.endpoint.send_replace(Some(record));
    }

    /// Leadership ends: `/leader` answers 503 at once (the file goes later, after the pod's
    /// marks: [`LiveRecord::remove_file`]).
    pub(super) fn withdraw_endpoint(&self) {
        self.endpoint.send_replace(None);
    }

    pub(super) fn remove_file(&self) {
        if let Some(file) = &self.file {
            file.remove();
        }
    }
}

/// How long after its writing a record of `validity` may still be acted on, as measured on
/// another clock: the validity and the drift the locks allow. The sidecar that wrote it and a
/// candidate that saw its writer die both wait this long.
pub(super) fn record_lifetime(validity: Duration, drift_factor: f64) -> Duration {
    validity + crate::redlock::timing::drift_allowance(validity, drift_factor)
}

/// The task keeping a record fresh. Dropped, it is aborted; [`Freshness::stop`] also waits
/// for a write in progress, so that nothing is written after it returns.
pub(super) struct Freshness {
    stop: CancellationToken,
    task: AbortOnDropHandle<()>,
}

impl Freshness {
    pub(super) async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

#[cfg(test)]
mod tests {
    use super::LiveRecord;
    use crate::lab::harness::{Persistence, RedisNodes};
    use crate::redlock::{LeaseStatus, LeaseTiming, Redlock, RedlockConfig};
    use std::time::Duration;
    use tokio::sync::watch;

    /// The record is there when `keep_fresh` returns, before the sidecar marks its pod: a
    /// reader that sees the pod (or the Lease) as leader finds `/leader` answering. Written
    /// only by the task, it lagged the Lease under load (CI, stop 56). A current-thread
    /// runtime: the task cannot have run before the check.
    #[tokio::test(flavor = "current_thread")]
    #[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
    async fn the_record_is_written_before_keep_fresh_returns() {
        let nodes = RedisNodes::start(1, Persistence::None).expect("start redis-server");
        let engine = Redlock::new(RedlockConfig::new(nodes.urls())).expect("engine");
        let ttl = Duration::from_secs(10);
        let lease = engine.try_acquire("writer", ttl).await.expect("lock");
        let (_, statuses) = watch::channel(LeaseStatus {
            deadline: lease.deadline(),
            renewals: 0,
            failed_rounds: 0,
            last_attempt: None,
        });
        let (endpoint, shown) = watch::channel(None);
        let record = LiveRecord::new(None, endpoint, Duration::from_secs(4));

        let fresh = record.keep_fresh(lease.clone(), LeaseTiming::from_ttl(ttl), statuses);

        let written = shown
            .borrow()
            .clone()
            .expect("a record before keep_fresh returns");
        assert_eq!(
            (written.holder.as_str(), written.token),
            (lease.holder(), lease.token())
        );
        fresh.stop().await;
        engine.release(&lease).await;
    }
}
