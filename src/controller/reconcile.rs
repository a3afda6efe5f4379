//! Reconcile one LockedJob: validate, decide (pure schedule logic), start or adopt runs,
//! clean up history, report status. Runs happen in their own tasks; reconcile never blocks on
//! a lock or a Job.

use super::events::{self, Reason};
use super::jobs::{expired_history, job_state, scheduled_time, JobState, LABEL_LOCKED_JOB};
use super::run;
use super::status::{set_condition, ConditionUpdate};
use super::{Context, Error, FINALIZER};
use crate::api::{conditions, describe, validate, LockedJob, ANNOTATION_RUN_NOW};
use crate::schedule::{next_action, parse_run_now, Decision, History, SkipReason, TOO_MANY_MISSED};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::ResourceExt;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

const MAX_REQUEUE: Duration = Duration::from_secs(300);
/// Fallback retry of a status write another replica won (the watch usually comes first).
const CONFLICT_PAUSE: Duration = Duration::from_secs(2);

pub fn error_policy(lj: Arc<LockedJob>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(namespace = ?lj.namespace(), name = %lj.name_any(), %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

pub async fn reconcile(lj: Arc<LockedJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = lj.namespace().ok_or(Error::NoNamespace)?;
    let span = tracing::info_span!("reconcile", namespace = %namespace, name = %lj.name_any());
    reconcile_inner(lj, ctx, namespace).instrument(span).await
}

fn until(next: Option<Timestamp>, now: Timestamp) -> Duration {
    next.map(|t| {
        let ms = (t - now).get_milliseconds().max(0) as u64;
        Duration::from_millis(ms)
    })
    .unwrap_or(MAX_REQUEUE)
    .min(MAX_REQUEUE)
}

async fn reconcile_inner(
    lj: Arc<LockedJob>,
    ctx: Arc<Context>,
    namespace: String,
) -> Result<Action, Error> {
    let name = lj.name_any();
    let lockedjobs: Api<LockedJob> = Api::namespaced(ctx.client.clone(), &namespace);
    let uid = lj.uid().unwrap_or_default();
    let owned: Vec<Job> = ctx
        .cached_jobs(&namespace, |j| {
            j.labels().get(LABEL_LOCKED_JOB) == Some(&name)
                && j.owner_references().iter().any(|r| r.uid == uid)
        })
        .await?
        .iter()
        .map(|j| Job::clone(j))
        .collect();
    let active: Vec<&Job> = owned
        .iter()
        .filter(|j| job_state(j) == JobState::Active && j.metadata.deletion_timestamp.is_none())
        .collect();

    if lj.metadata.deletion_timestamp.is_some() {
        if lj.finalizers().iter().any(|f| f == FINALIZER) {
            let doomed: Vec<Job> = active.iter().map(|j| (*j).clone()).collect();
            run::stop_all(&ctx, &namespace, &doomed).await;
            let remaining: Vec<String> = lj
                .finalizers()
                .iter()
                .filter(|f| *f != FINALIZER)
                .cloned()
                .collect();
            let patch = json!([
                {"op": "test", "path": "/metadata/finalizers", "value": lj.finalizers()},
                {"op": "replace", "path": "/metadata/finalizers", "value": remaining},
            ]);
            let patch: json_patch::Patch = serde_json::from_value(patch).unwrap_or_default();
            lockedjobs
                .patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
                .await?;
            tracing::info!("LockedJob deleted: its Jobs were stopped and the finalizer removed");
        }
        return Ok(Action::await_change());
    }
    if ctx.shutdown.is_cancelled() {
        return Ok(Action::await_change());
    }
    if !lj.finalizers().iter().any(|f| f == FINALIZER) {
        let patch = if lj.metadata.finalizers.is_none() {
            json!([{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}])
        } else {
            json!([{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}])
        };
        let patch: json_patch::Patch = serde_json::from_value(patch).unwrap_or_default();
        lockedjobs
            .patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await?;
    }

    let now = Timestamp::now();
    let generation = lj.metadata.generation;
    let status = lj.status.clone().unwrap_or_default();
    let mut conditions = status.conditions.clone();
    let valid = match validate(&namespace, &name, &lj.spec) {
        Ok(valid) => valid,
        Err(errors) => {
            let message = describe(&errors);
            let already = status.observed_generation == generation
                && conditions.iter().any(|c| {
                    c.type_ == conditions::INVALID_SPEC
                        && c.status == "True"
                        && c.message == message
                });
            if !already {
                tracing::warn!(%message, "invalid spec");
                set_condition(
                    &mut conditions,
                    ConditionUpdate {
                        kind: conditions::INVALID_SPEC,
                        status: true,
                        reason: "InvalidSpec",
                        message: &message,
                        generation,
                    },
                    now,
                );
                set_condition(
                    &mut conditions,
                    ConditionUpdate {
                        kind: conditions::READY,
                        status: false,
                        reason: "InvalidSpec",
                        message: &message,
                        generation,
                    },
                    now,
                );
                let patch =
                    json!({"status": {"conditions": conditions, "observedGeneration": generation}});
                lockedjobs
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await?;
                events::publish(&ctx, &lj, Reason::InvalidSpec, message);
            }
            return Ok(Action::await_change());
        }
    };

    // A run requested with the run-now annotation (like `kubectl create job --from=cronjob/x`).
    if let Some(value) = lj.annotations().get(ANNOTATION_RUN_NOW) {
        match parse_run_now(value) {
            Ok(requested) => {
                ctx.tasks.spawn(run::start(
                    Arc::clone(&ctx),
                    Arc::clone(&lj),
                    valid.clone(),
                    requested,
                    run::RunKind::Manual,
                ));
            }
            Err(message) => {
                tracing::warn!(%message, "invalid run-now request");
                events::publish(&ctx, &lj, Reason::InvalidRunNow, message);
                run::clear_run_now(&ctx, &lj, value).await;
            }
        }
    }

    // Adopt or clean up active Jobs nobody here supervises (their holder may be gone).
    for job in &active {
        let key = (namespace.clone(), job.name_any());
        let supervised = ctx
            .supervised
            .lock()
            .map(|s| s.contains(&key))
            .unwrap_or(true);
        if !supervised
            && super::orphan_check_due(
                &ctx.orphan_checks,
                &key,
                std::time::Instant::now(),
                valid.timing.renew_interval,
            )
        {
            ctx.tasks.spawn(run::check_orphan(
                Arc::clone(&ctx),
                Arc::clone(&lj),
                valid.clone(),
                (*job).clone(),
            ));
        }
    }

    let last = owned
        .iter()
        .filter_map(scheduled_time)
        .chain(status.last_schedule_time.as_ref().map(|t| t.0))
        .max();
    let created = lj
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(now);
    let history = History {
        created,
        last_schedule_time: last,
        active_runs: active.len(),
    };
    let decision = next_action(&valid.policy, now, &history);
    tracing::debug!(?decision, "schedule decision");
    let next = match &decision {
        Decision::Run {
            scheduled,
            replace_active,
            missed,
            next,
        } => {
            if *missed > TOO_MANY_MISSED {
                events::publish(&ctx, &lj, Reason::TooManyMissedTimes, format!(
                    "more than {TOO_MANY_MISSED} missed start times; running only the latest. Set or decrease spec.startingDeadlineSeconds or check clock skew"));
            }
            let replace = if *replace_active {
                active.iter().map(|j| j.name_any()).collect()
            } else {
                Vec::new()
            };
            ctx.tasks.spawn(run::start(
                Arc::clone(&ctx),
                Arc::clone(&lj),
                valid.clone(),
                *scheduled,
                run::RunKind::Scheduled { replace },
            ));
            *next
        }
        Decision::Skip {
            reason: SkipReason::PreviousRunActive,
            next,
            ..
        } => {
            tracing::debug!(
                "a run is due but the previous one is active (concurrencyPolicy Forbid)"
            );
            *next
        }
        Decision::Skip { next, .. } | Decision::Wait { next } => *next,
    };

    let jobs_api: Api<Job> = Api::namespaced(ctx.client.clone(), &namespace);
    for doomed in expired_history(
        &owned,
        lj.spec.successful_jobs_history_limit.max(0) as usize,
        lj.spec.failed_jobs_history_limit.max(0) as usize,
    ) {
        let _ = jobs_api.delete(&doomed, &DeleteParams::background()).await;
    }

    // Conditions every replica computes alike; written only when they change.
    let reachable = ctx.reachable.load(std::sync::atomic::Ordering::Relaxed);
    let nodes = ctx.nodes();
    set_condition(
        &mut conditions,
        ConditionUpdate {
            kind: conditions::INVALID_SPEC,
            status: false,
            reason: "Valid",
            message: "the spec is valid",
            generation,
        },
        now,
    );
    let ready_message = match next {
        Some(t) if valid.policy.suspend => format!("suspended; next scheduled time {t}"),
        Some(t) => format!("next scheduled time {t}"),
        None => "the schedule has no future time".into(),
    };
    set_condition(
        &mut conditions,
        ConditionUpdate {
            kind: conditions::READY,
            status: true,
            reason: "Scheduling",
            message: &ready_message,
            generation,
        },
        now,
    );
    let degraded = reachable < nodes;
    set_condition(
        &mut conditions,
        ConditionUpdate {
            kind: conditions::REDIS_DEGRADED,
            status: degraded,
            reason: if degraded { "NodesDown" } else { "AllNodesUp" },
            message: &format!(
                "{reachable} of {nodes} Redis nodes answer (quorum {})",
                ctx.engine.quorum()
            ),
            generation: None,
        },
        now,
    );
    let active_refs: Vec<ObjectReference> = active
        .iter()
        .map(|j| ObjectReference {
            api_version: Some("batch/v1".into()),
            kind: Some("Job".into()),
            name: Some(j.name_any()),
            namespace: Some(namespace.clone()),
            uid: j.uid(),
            ..Default::default()
        })
        .collect();
    let unchanged =
        |a: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
         b: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]| {
            a.len() == b.len()
                && a.iter().all(|x| {
                    b.iter().any(|y| {
                        y.type_ == x.type_
                            && y.status == x.status
                            && y.reason == x.reason
                            && (y.type_ == conditions::READY || y.message == x.message)
                    })
                })
        };
    if !unchanged(&conditions, &status.conditions)
        || status.active != active_refs
        || status.observed_generation != generation
    {
        let patch = json!({"metadata": {"resourceVersion": lj.resource_version()},
            "status": {"conditions": conditions, "active": active_refs, "observedGeneration": generation}});
        match lockedjobs
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {}
            // Another replica wrote first: its version reaches us through the watch and
            // reconciles again anyway. Retrying at once made three replicas whose Job caches
            // lag each other fight over `active` (130 conflicts/s at 200 LockedJobs on a real
            // API server), so the fallback comes late and jittered.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                return Ok(Action::requeue(super::run::jittered(CONFLICT_PAUSE)))
            }
            Err(e) => return Err(e.into()),
        }
    }

    let mut wait = until(next, Timestamp::now());
    if !active.is_empty() {
        wait = wait.min(valid.timing.ttl / 2);
    }
    Ok(Action::requeue(wait.max(Duration::from_millis(50))))
}
