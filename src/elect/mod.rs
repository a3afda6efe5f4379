//! Leader election, `lockedjob elect LOCK -- CMD...`: for a long-running workload. Every replica
//! campaigns for the same lock; the one that holds it runs CMD with its fencing token, and
//! stops it before the lease deadline when renewals fail, then campaigns again.
//! `--observe` prints the leader each time it changes, like `etcdctl elect -l`.
//!
//! `--sidecar` runs no command: it holds leadership for the pod it runs in and shows it through
//! the token file and the pod's condition, label and a mirror Lease (`kubernetes.rs`).
//!
//! Differences from `exec` (docs/design.md, "Leader election"): `exec` makes one attempt (or
//! waits up to `--wait`) and exits 76 when the lease is lost; `elect` campaigns without end,
//! and after a lost lease stops the command and campaigns again.

mod args;
mod ended;
mod kubernetes;
pub mod lease_runner;
mod metrics;
mod observe;
mod preference;
mod token_file;

pub use args::{ElectArgs, ObserveOutput, DEFAULT_RECORD_VALIDITY};
pub use ended::HeldValue;
pub use kubernetes::{
    election_label, lease_name, ELECTION_LABEL, LEADER_CONDITION, LEADER_LABEL,
    LEADER_LOCK_ANNOTATION,
};
pub use observe::Observed;
pub use token_file::LeaderRecord;

use crate::child::{self, Signals};
use crate::exit;
use crate::http::Reply;
use crate::metrics::Metrics;
use crate::redlock::{Lease, LeaseTiming, LockError, Redlock, Watchdog};
use ended::{DeadHolders, TerminationMessage};
use jiff::Timestamp;
use kubernetes::{EndedLeaders, MirrorError, PodMirror};
use lease_runner::{next_deadline, LeaseEvent, Ran, Work};
use metrics::ElectionMetrics;
use preference::Preference;
use std::sync::Arc;
use std::time::{Duration, Instant};
use token_file::{LiveRecord, TokenFile};
use tokio::signal::unix::SignalKind;
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

/// Below this a sidecar's record would be rewritten more often than is sensible.
const MIN_RECORD_VALIDITY: Duration = Duration::from_millis(100);

/// Runs `elect` and returns the process exit code.
pub async fn run(args: ElectArgs) -> i32 {
    let timing = args.lease.timing(args.ttl);
    let config = args.redis.engine_config();
    if args.lock.trim().is_empty() || args.lock.chars().any(char::is_control) {
        eprintln!(
            "lockedjob elect: LOCK must name the election's lock (no control characters), got {:?}",
            args.lock
        );
        return exit::USAGE;
    }
    if !args.observe {
        if let Err(e) = timing.validate(config.drift_factor) {
            eprintln!("lockedjob elect: {e}");
            return exit::USAGE;
        }
    }
    // Checked here: clap counts a flag's implicit `false` as present for `requires`.
    if args.record_validity.is_some() && !args.sidecar {
        eprintln!("lockedjob elect: --record-validity applies to --sidecar only (a command's record lasts as long as its lease)");
        return exit::USAGE;
    }
    if args.record_validity() < MIN_RECORD_VALIDITY {
        eprintln!(
            "lockedjob elect: --record-validity must be at least {} (the sidecar rewrites the record every quarter of it), got {}",
            humantime::format_duration(MIN_RECORD_VALIDITY),
            humantime::format_duration(args.record_validity())
        );
        return exit::USAGE;
    }
    if args.retry_interval.is_zero() || args.poll_interval.is_zero() {
        eprintln!(
            "lockedjob elect: --retry-interval and --poll-interval must be greater than zero"
        );
        return exit::USAGE;
    }
    let token_file = match args.token_file.as_deref().map(TokenFile::new).transpose() {
        Ok(file) => file,
        Err(e) => {
            eprintln!("lockedjob elect: {e}");
            return exit::USAGE;
        }
    };
    let metrics = Metrics::new();
    let engine = match Redlock::with_metrics(config.clone(), metrics.lock().clone()) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("lockedjob elect: {e}");
            return exit::USAGE;
        }
    };
    if args.observe {
        return observe::observe(&engine, &args).await;
    }
    let preference = match Preference::new(args.priority, args.reclaim_after, &config) {
        Ok(preference) => preference,
        Err(e) => {
            eprintln!("lockedjob elect: {e}");
            return exit::USAGE;
        }
    };
    let candidate = Candidate {
        engine,
        preference,
        timing,
        election: Arc::new(ElectionMetrics::new()),
    };
    let span = tracing::info_span!("elect", lock = %args.lock, token = tracing::field::Empty);
    if args.sidecar {
        return run_sidecar(&args, candidate, metrics, token_file)
            .instrument(span)
            .await;
    }
    lead_while_elected(candidate, args, token_file)
        .instrument(span)
        .await
}

/// What every mode of `elect` campaigns and leads with.
struct Candidate {
    engine: Redlock,
    preference: Preference,
    timing: LeaseTiming,
    /// Served by the sidecar's `/metrics`; counted in every mode.
    election: Arc<ElectionMetrics>,
}

/// `--sidecar`: `/leader` answers (503) from the start; then the pod is marked not leading,
/// which also checks the sidecar's rights; then the campaign.
async fn run_sidecar(
    args: &ElectArgs,
    candidate: Candidate,
    metrics: Metrics,
    token_file: Option<TokenFile>,
) -> i32 {
    let listener = match tokio::net::TcpListener::bind(args.leader_addr).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!(
                "lockedjob elect: --leader-addr {}: {e}; give a free address",
                args.leader_addr
            );
            return exit::USAGE;
        }
    };
    let (shown, _) = watch::channel(None);
    let routes = routes(shown.subscribe(), Arc::clone(&candidate.election), metrics);
    let _server = AbortOnDropHandle::new(tokio::spawn(crate::http::serve(listener, routes)));
    let mirror = match pod_mirror(args).await {
        Ok(mirror) => mirror,
        Err(e) => {
            eprintln!("lockedjob elect: {e}");
            return exit::USAGE;
        }
    };
    let ended = match &mirror {
        Some(mirror) => match mirror.watch_ended_leaders().await {
            Ok(ended) => Some(ended),
            Err(e) => {
                eprintln!("lockedjob elect: {e}");
                return exit::USAGE;
            }
        },
        None => None,
    };
    let sidecar = Sidecar {
        candidate,
        record: LiveRecord::new(token_file, shown, args.record_validity()),
        termination: TerminationMessage::new(&args.termination_message_path),
        mirror,
        ended,
    };
    sidecar.run(args).await
}

/// The sidecar's HTTP routes: `/leader` while the record is valid, `/healthz`, `/metrics`.
fn routes(
    shown: watch::Receiver<Option<LeaderRecord>>,
    election: Arc<ElectionMetrics>,
    engine_metrics: Metrics,
) -> impl Fn(&str) -> Reply + Send + Sync + 'static {
    move |path| match path {
        "/leader" => match &*shown.borrow() {
            Some(record) if record.valid_until > Timestamp::now() => {
                Reply::json(200, serde_json::to_string(record).unwrap_or_default())
            }
            _ => Reply::json(503, r#"{"leading":false}"#),
        },
        "/healthz" => Reply::text(200, "ok\n"),
        "/metrics" => Reply::metrics(engine_metrics.render_with(&[&election.registry])),
        _ => Reply::not_found(),
    }
}

/// The pod mirror when the pod is known; checks the sidecar's rights at once by marking the
/// pod as not leading, which also clears what a sidecar killed while leading left behind.
async fn pod_mirror(args: &ElectArgs) -> Result<Option<PodMirror>, String> {
    let Some(namespace) = args.pod_namespace.as_deref().filter(|n| !n.is_empty()) else {
        return Ok(None);
    };
    let Some(pod) = args.redis.runner_name.as_deref().filter(|n| !n.is_empty()) else {
        return Err("--pod-namespace needs the pod's name in --runner-name or POD_NAME (downward API: metadata.name)".into());
    };
    let mirror = PodMirror::connect(namespace, pod, &args.lock)
        .await
        .map_err(|e| e.to_string())?;
    mirror
        .not_leading("Campaigning")
        .await
        .map_err(|e| e.to_string())?;
    Ok(Some(mirror))
}

/// Campaign, lead, campaign again after a lost lease; return when the command ends or a signal
/// arrives while campaigning.
async fn lead_while_elected(
    candidate: Candidate,
    args: ElectArgs,
    token_file: Option<TokenFile>,
) -> i32 {
    let mut signals = Signals::watch();
    let Candidate {
        engine,
        preference,
        timing,
        ..
    } = &candidate;
    let work = Work {
        command: &args.command,
        kill_grace: args.lease.kill_grace,
        timing: *timing,
    };
    loop {
        let lease = match elected(&candidate, &args, None, &mut signals).await {
            Ok(lease) => lease,
            Err(NotElected::Signal(kind)) => return 128 + kind.as_raw_value(),
            Err(NotElected::Config) => return exit::USAGE,
        };
        let publish = |event: LeaseEvent| {
            if let Some(file) = &token_file {
                file.follow(&lease, timing, event);
            }
        };
        let step_down = preference.handover_requested(engine, &args.lock, timing.renew_interval);
        let ran = work
            .run(engine, lease.clone(), &mut signals, step_down, publish)
            .await;
        if let Some(file) = &token_file {
            file.remove();
        }
        match ran {
            Ran::Finished(status) => {
                let code = child::exit_code(status);
                tracing::info!(code, "command exited; leadership released");
                return code;
            }
            Ran::LeaseLost => {
                tracing::warn!("leadership lost (no Redis quorum renewed the lease); the command was stopped; campaigning again");
            }
            Ran::SteppedDown => {
                tracing::info!("handed leadership over to a candidate of higher priority; the command was stopped; campaigning again");
            }
            Ran::NotStarted(e) => {
                eprintln!("lockedjob elect: cannot start {:?}: {e}", args.command[0]);
                return exit::SPAWN_FAILED;
            }
            Ran::WaitFailed(e) => {
                eprintln!("lockedjob elect: waiting for the command failed: {e}");
                return exit::SPAWN_FAILED;
            }
        }
    }
}

/// `--sidecar`: leadership held for the pod, with no command of its own.
struct Sidecar {
    candidate: Candidate,
    /// The token file and what `GET /leader` answers.
    record: Arc<LiveRecord>,
    /// Names the lock value while leading, for the kubelet to report if the container dies.
    termination: TerminationMessage,
    mirror: Option<PodMirror>,
    /// The election's pods, watched (with the pod mirror only).
    ended: Option<EndedLeaders>,
}

/// How long one update of the pod or the Lease may take. While the lease is held (just won or
/// just renewed, so its give-up point is at least a TTL less the renew interval away), half a
/// renew interval: a slow API server must not keep the sidecar from watching its lease. On
/// the way out, half the safety margin: the token file must be gone before the deadline.
fn api_bound(timing: &LeaseTiming, event: &LeaseEvent) -> Duration {
    match event {
        LeaseEvent::Held(_) => timing.renew_interval / 2,
        LeaseEvent::Lost => timing.safety_margin / 2,
    }
}

/// Where the watchdog gives a lease of `deadline` up (as `Watchdog` computes it).
fn give_up_point(deadline: Instant, timing: &LeaseTiming) -> Option<Instant> {
    deadline.checked_sub(timing.safety_margin)
}

/// When a sidecar whose lease has not been renewed since `deadline` was set stops routing to its
/// pod: halfway from the renewal that failed to the watchdog's give-up point. Its pod must be
/// unready, and out of the Service's endpoints, before another cluster's candidate can take the
/// lock (at the deadline at the earliest); that takes a pod status patch, the kubelet's next look
/// at the pod and the EndpointSlice controller, on a node that may be starving the sidecar of
/// CPU. A blip shorter than half that time (several retried rounds) does not flip routing.
fn routing_withdrawn_at(deadline: Instant, timing: &LeaseTiming) -> Instant {
    let give_up = give_up_point(deadline, timing);
    let renewal_due = deadline.checked_sub(timing.ttl.saturating_sub(timing.renew_interval));
    match (renewal_due, give_up) {
        (Some(due), Some(give_up)) if due < give_up => due + (give_up - due) / 2,
        _ => deadline,
    }
}

impl Sidecar {
    /// The lease still holds but renewals have failed for a while: the pod stops being Ready
    /// (condition and label off, reason `RenewalFailing`) so Services stop routing to it, while
    /// the token file and `/leader` stay until the lease is lost, so the workload keeps its
    /// token. Bounded so that the give-up point still finds the loop listening.
    async fn withdraw_routing(&self, deadline: Instant) {
        let Some(mirror) = &self.mirror else { return };
        let timing = &self.candidate.timing;
        let to_give_up = give_up_point(deadline, timing).map_or(Duration::ZERO, |g| {
            g.saturating_duration_since(Instant::now())
        });
        let bound = (timing.renew_interval / 2).min(to_give_up / 2);
        tracing::warn!(
            bound_ms = bound.as_millis() as u64,
            "the lease has not been renewed for a while: this pod stops being Ready until a renewal succeeds"
        );
        bounded_update(bound, mirror.not_leading("RenewalFailing")).await;
    }

    /// Campaign, hold, step down and campaign again; return 0 on SIGTERM or SIGINT.
    async fn run(&self, args: &ElectArgs) -> i32 {
        let mut signals = Signals::watch();
        loop {
            let ended = self.ended.as_ref();
            let lease = match elected(&self.candidate, args, ended, &mut signals).await {
                Ok(lease) => lease,
                Err(NotElected::Signal(_)) => return 0,
                Err(NotElected::Config) => return exit::USAGE,
            };
            match self.hold(lease, &args.lock, &mut signals).await {
                Held::Stopped => return 0,
                Held::Lost => tracing::warn!(
                    "leadership lost (no Redis quorum renewed the lease); campaigning again"
                ),
                Held::HandedOver => tracing::info!(
                    "handed leadership over to a candidate of higher priority; campaigning again"
                ),
                Held::PodDeleted => {
                    tracing::info!(
                        "this pod is being deleted: stepped down and released; waiting for SIGTERM"
                    );
                    signals.next().await;
                    return 0;
                }
            }
        }
    }

    /// Holds `lease` until it is lost, a candidate of higher priority asks for it, or a signal
    /// asks to stop; steps down and releases the lock in every case.
    async fn hold(&self, lease: Lease, lock: &str, signals: &mut Signals) -> Held {
        let Candidate {
            engine,
            preference,
            timing,
            election,
        } = &self.candidate;
        let watchdog = Watchdog::spawn(engine.clone(), lease.clone(), *timing);
        self.termination.hold(&HeldValue {
            lock: lease.name().to_string(),
            value: lease.value().to_string(),
            record_validity_ms: Some(self.record.validity().as_millis() as u64),
        });
        let lost = watchdog.lost();
        let mut deadlines = watchdog.subscribe();
        let mut shown = watchdog.status();
        election.elected(lease.token());
        // The record first: the workload knows it leads before its pod is routed to.
        let fresh = self
            .record
            .keep_fresh(lease.clone(), *timing, watchdog.subscribe());
        // The pod's marks, once set; until then every renewal tries them again.
        let mut marked = self.show(&lease, LeaseEvent::Held(shown), true).await;
        // Not `!marked`: an update that timed out may have set the pod's marks before the
        // Lease's, so routing is withdrawn whenever renewals fail, once per renewal.
        let mut withdrawn = false;
        let step_down = preference.handover_requested(engine, lock, timing.renew_interval);
        tokio::pin!(step_down);
        let held = loop {
            let deleted = async {
                match &self.ended {
                    Some(pods) => pods.until_self_deleting().await,
                    None => std::future::pending().await,
                }
            };
            let unrenewed = routing_withdrawn_at(shown.deadline, timing);
            tokio::select! {
                _ = lost.cancelled() => break Held::Lost,
                _ = signals.next() => break Held::Stopped,
                () = &mut step_down => break Held::HandedOver,
                () = deleted => break Held::PodDeleted,
                Some(status) = next_deadline(&mut deadlines, shown.deadline) => {
                    shown = status;
                    withdrawn = false;
                    marked = self.show(&lease, LeaseEvent::Held(status), !marked).await || marked;
                }
                () = tokio::time::sleep_until(unrenewed.into()), if !withdrawn && self.mirror.is_some() => {
                    self.withdraw_routing(shown.deadline).await;
                    // Marked again by the next renewal, if one comes.
                    (withdrawn, marked) = (true, false);
                }
            }
        };
        election.stepped_down(held == Held::Lost, held == Held::HandedOver);
        fresh.stop().await;
        self.show(&lease, LeaseEvent::Lost, false).await;
        self.termination.clear();
        let held = match held {
            Held::PodDeleted => self.outlive_the_record(signals).await,
            held => held,
        };
        watchdog.release(engine).await;
        if let (Held::Stopped | Held::HandedOver | Held::PodDeleted, Some(mirror)) =
            (held, &self.mirror)
        {
            let bound = timing.safety_margin / 2;
            if let Ok(Err(e)) = tokio::time::timeout(bound, mirror.released()).await {
                tracing::debug!(error = %e, "cannot mark the pod released; the next leader comes at its next attempt");
            }
        }
        held
    }

    /// This pod is being deleted and the lease is still held: its workload may act on its last
    /// record until that has expired, so the lock is released only then, or at SIGTERM, which
    /// a native sidecar gets only once the main containers have exited, whichever comes first.
    /// Without this the next leader waits for the kubelet to begin stopping the pod, about a
    /// second after it learned of the deletion (docs/benchmarks.md).
    async fn outlive_the_record(&self, signals: &mut Signals) -> Held {
        let drift_factor = self.candidate.engine.config().drift_factor;
        let expired = self.record.expired_at(drift_factor);
        tokio::select! {
            () = tokio::time::sleep_until(expired.into()) => Held::PodDeleted,
            _ = signals.next() => Held::Stopped,
        }
    }

    /// Shows the lease to the pod: on election and renewal the mirrors (with `mark_pod`, the
    /// pod's label and condition too); on the way out `/leader` at once, the pod's marks, then
    /// the token file. The record itself is written at election, before the marks, and kept
    /// fresh apart ([`LiveRecord::keep_fresh`]).
    /// True when the API server took the update.
    async fn show(&self, lease: &Lease, event: LeaseEvent, mark_pod: bool) -> bool {
        if let LeaseEvent::Lost = event {
            self.record.withdraw_endpoint();
        }
        let updated = match &self.mirror {
            Some(mirror) => self.update_mirror(mirror, lease, &event, mark_pod).await,
            None => true,
        };
        if let LeaseEvent::Lost = event {
            self.record.remove_file();
        }
        updated
    }

    /// One bounded update of the pod's marks and the Lease. Before this pod is marked, the
    /// previous leader's pod must have stopped being Ready, so a Service never lists both.
    async fn update_mirror(
        &self,
        mirror: &PodMirror,
        lease: &Lease,
        event: &LeaseEvent,
        mark_pod: bool,
    ) -> bool {
        let timing = &self.candidate.timing;
        let ttl_seconds = i32::try_from(timing.ttl.as_secs().max(1)).unwrap_or(i32::MAX);
        let bound = api_bound(timing, event);
        let update = async {
            match event {
                LeaseEvent::Held(_) if mark_pod => {
                    mirror.clear_other_leaders().await?;
                    if let Some(pods) = &self.ended {
                        pods.until_no_other_ready(bound / 4).await?;
                        mirror
                            .until_no_endpoint_of(&pods.others(), bound / 4)
                            .await?;
                    }
                    mirror.leading(lease.holder(), ttl_seconds).await
                }
                LeaseEvent::Held(_) => mirror.renewed(lease.holder(), ttl_seconds).await,
                LeaseEvent::Lost => mirror.not_leading("SteppedDown").await,
            }
        };
        bounded_update(bound, update).await
    }
}

/// One update of the pod's marks or the Lease, given up after `bound`; true when the API
/// server took it. Failures are logged here.
async fn bounded_update(
    bound: Duration,
    update: impl std::future::Future<Output = Result<(), MirrorError>>,
) -> bool {
    match tokio::time::timeout(bound, update).await {
        Ok(Ok(())) => true,
        Ok(Err(
            e
            @ (MirrorError::PreviousLeaderReady { .. } | MirrorError::PreviousLeaderRouted { .. }),
        )) => {
            tracing::info!(error = %e, "not marking this pod yet");
            false
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "cannot update the pod or the Lease");
            false
        }
        Err(_) => {
            tracing::error!(
                bound_ms = bound.as_millis() as u64,
                "the API server did not answer in time; the pod or the Lease may show an old state"
            );
            false
        }
    }
}

/// How a sidecar's leadership ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// SIGTERM or SIGINT: the sidecar exits.
    Stopped,
    /// No Redis quorum renewed the lease in time.
    Lost,
    /// A candidate of higher priority asked for leadership.
    HandedOver,
    /// The pod is being deleted: the sidecar waits for SIGTERM.
    PodDeleted,
}

/// Why a campaign ended without a lease.
enum NotElected {
    /// A signal arrived while campaigning.
    Signal(SignalKind),
    /// The lock cannot be acquired as configured (reported on stderr).
    Config,
}

/// Campaigns until elected (the token then goes into the span), a signal arrives, or the
/// configuration turns out unusable.
async fn elected(
    candidate: &Candidate,
    args: &ElectArgs,
    ended: Option<&EndedLeaders>,
    signals: &mut Signals,
) -> Result<Lease, NotElected> {
    let lease = tokio::select! {
        lease = campaign(candidate, &args.lock, args.retry_interval, ended) => lease,
        kind = signals.next() => {
            tracing::info!(signal = kind.as_raw_value(), "stopped while campaigning");
            return Err(NotElected::Signal(kind));
        }
    };
    match lease {
        Ok(lease) => {
            tracing::Span::current().record("token", lease.token());
            tracing::info!(holder = lease.holder(), "elected leader");
            Ok(lease)
        }
        Err(e) => {
            eprintln!("lockedjob elect: {e}");
            Err(NotElected::Config)
        }
    }
}

/// Tries for the lock every `retry_interval` (±20%) until it is ours. Logs when the reason it
/// is not changes, not on every attempt. Only a configuration error ends the campaign. While
/// another holds the lock, a holder whose end Kubernetes confirmed (`ended`) has its value
/// deleted, and the next attempt comes at once; a candidate of higher priority asks for a
/// handover (`preference.rs`), and one that wins the free lock while a higher one asks gives
/// it back.
async fn campaign(
    candidate: &Candidate,
    lock: &str,
    retry_interval: Duration,
    ended: Option<&EndedLeaders>,
) -> Result<Lease, LockError> {
    let Candidate {
        engine,
        preference,
        timing,
        election,
    } = candidate;
    let mut asking = preference.campaign();
    let request_ttl = (retry_interval * 4).max(Duration::from_secs(1));
    let mut last_refusal = None;
    let mut dead = DeadHolders::default();
    // Since when the attempts found no leader; counted when one is found (or this one wins).
    let mut leaderless_since: Option<Instant> = None;
    let mut leader_seen = |seen: bool| match (seen, leaderless_since) {
        (true, Some(since)) => {
            election.saw_no_leader_for(since.elapsed());
            leaderless_since = None;
        }
        (false, None) => leaderless_since = Some(Instant::now()),
        _ => {}
    };
    loop {
        if ended.is_some_and(EndedLeaders::self_deleting) {
            // The pod is going away: a term won now would only be handed back.
            asking.withdraw().await;
            return std::future::pending().await;
        }
        match engine.try_acquire(lock, timing.ttl).await {
            Ok(lease) if preference.must_yield(engine, lock).await => {
                leader_seen(false);
                engine.release(&lease).await;
                tracing::info!("won the free lock while a candidate of higher priority asks for it: gave it back");
            }
            Ok(lease) => {
                leader_seen(true);
                asking.withdraw().await;
                return Ok(lease);
            }
            Err(e @ LockError::Config(_)) => {
                asking.withdraw().await;
                return Err(e);
            }
            Err(e) => {
                leader_seen(e.is_contended());
                let refusal = std::mem::discriminant(&e);
                if last_refusal != Some(refusal) {
                    tracing::info!(reason = %e, "not leader; campaigning");
                    last_refusal = Some(refusal);
                }
                asking.after_attempt(&e, lock, request_ttl).await;
                let freed = match ended {
                    Some(ended) if e.is_contended() => {
                        release_ended(engine, lock, ended, &mut dead).await
                    }
                    _ => false,
                };
                if freed {
                    continue;
                }
            }
        }
        let mut pause = retry_interval.mul_f64(0.8 + 0.4 * rand::random::<f64>());
        // A dead holder coming due ends the pause: its workload's record has just expired.
        if let Some(due) = dead.next_due() {
            pause = pause.min(due.saturating_duration_since(Instant::now()));
        }
        let pause = tokio::time::sleep(pause);
        match ended {
            // A change on an election pod (the leader stepping down, or reported gone) is
            // the moment to try again, not the end of the pause.
            Some(ended) => tokio::select! {
                _ = pause => {}
                _ = ended.changed() => {}
            },
            None => pause.await,
        }
    }
}

/// Deletes the lock values of leaders whose container the kubelet reports terminated, each
/// once, and only after the workload beside it can no longer act on its last leader record
/// (`dead` remembers when each was first seen). True when a node deleted one: the lock may be
/// free now.
async fn release_ended(
    engine: &Redlock,
    lock: &str,
    ended: &EndedLeaders,
    dead: &mut DeadHolders,
) -> bool {
    let mut freed = false;
    let drift_factor = engine.config().drift_factor;
    for (pod, value) in dead.due(ended.values(), Instant::now(), drift_factor) {
        let nodes = engine.release_dead_holder(lock, &value).await;
        if nodes > 0 {
            tracing::info!(%pod, nodes, "the leader's container has terminated (the kubelet reports it): its lock value deleted, taking over without waiting for the TTL");
            freed = true;
        }
    }
    freed
}

#[cfg(test)]
mod tests {
    use super::routing_withdrawn_at;
    use crate::redlock::LeaseTiming;
    use std::time::{Duration, Instant};

    /// Halfway between the renewal that was due and the give-up point, for the defaults and
    /// for timings a user set; never after the deadline.
    #[test]
    fn routing_is_withdrawn_halfway_from_the_failed_renewal_to_the_give_up_point() {
        let deadline = Instant::now() + Duration::from_secs(60);
        let ms = Duration::from_millis;
        let cases = [
            // TTL 5 s: renewal due 3.33 s before the deadline, give-up 0.5 s before.
            (LeaseTiming::from_ttl(Duration::from_secs(5)), ms(1_917)),
            // TTL 15 s (the example): due 10 s before, give-up 1.5 s before.
            (LeaseTiming::from_ttl(Duration::from_secs(15)), ms(5_750)),
            (
                LeaseTiming::from_ttl_or(
                    Duration::from_secs(10),
                    Some(Duration::from_secs(1)),
                    Some(Duration::from_secs(1)),
                ),
                ms(5_000),
            ),
        ];
        for (timing, before_deadline) in cases {
            let at = routing_withdrawn_at(deadline, &timing);
            let got = deadline - at;
            let off = got.abs_diff(before_deadline);
            assert!(off <= ms(1), "{timing:?}: {got:?} before the deadline");
        }
        // A margin at least the time between renewal and give-up leaves it at the deadline.
        let odd = LeaseTiming {
            ttl: Duration::from_secs(3),
            renew_interval: Duration::from_secs(2),
            safety_margin: Duration::from_secs(1),
        };
        assert_eq!(routing_withdrawn_at(deadline, &odd), deadline);
    }
}
