//! Events about LockedJobs (`events.k8s.io/v1`), published in tasks of their own: a run never
//! waits for its Events.
//!
//! kube's `Recorder` is not used: it keeps every Event for six minutes to count repeats into a
//! series, and each publish takes a write lock on that cache and scans it. Ours are unique per
//! run (times, Job names, tokens), so nothing would ever be counted; at a thousand LockedJobs
//! the cache was tens of MiB per replica and its lock a queue in front of every Job create.

use super::context::Context;
use super::names::MANAGER;
use crate::api::LockedJob;
use jiff::Timestamp;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};
use tracing::Instrument;

/// The API server's limit for an Event's note.
const MAX_NOTE_BYTES: usize = 1024;

/// Why an Event is published; each reason has one type (Normal or Warning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The lock was won for a run whose Job existed already (an earlier holder created it, or
    /// an attempt whose reply was lost). A new Job's `Created` Event names the lock and token.
    Acquired,
    /// The run's Job was created.
    Created,
    /// The Job finished successfully.
    Completed,
    /// The Job failed.
    Failed,
    /// The API server refused the won run's Job: that time is skipped.
    CreateFailed,
    /// Quorum was lost mid-run.
    LockLost,
    /// A replica took over a run whose holder vanished.
    Adopted,
    /// This cluster's Job was deleted because another cluster holds the lock.
    OrphanDeleted,
    InvalidSpec,
    InvalidRunNow,
    TooManyMissedTimes,
    /// The backfill annotation is malformed or asks for the impossible; it was cleared.
    InvalidBackfill,
    /// Every time of the backfill range started.
    BackfillComplete,
    /// The backfill annotation was removed before the end.
    BackfillCancelled,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Acquired => "Acquired",
            Reason::Created => "Created",
            Reason::Completed => "Completed",
            Reason::Failed => "Failed",
            Reason::CreateFailed => "CreateFailed",
            Reason::LockLost => "LockLost",
            Reason::Adopted => "Adopted",
            Reason::OrphanDeleted => "OrphanDeleted",
            Reason::InvalidSpec => "InvalidSpec",
            Reason::InvalidRunNow => "InvalidRunNow",
            Reason::TooManyMissedTimes => "TooManyMissedTimes",
            Reason::InvalidBackfill => "InvalidBackfill",
            Reason::BackfillComplete => "BackfillComplete",
            Reason::BackfillCancelled => "BackfillCancelled",
        }
    }

    pub fn is_warning(self) -> bool {
        !matches!(
            self,
            Reason::Acquired
                | Reason::Created
                | Reason::Completed
                | Reason::Adopted
                | Reason::BackfillComplete
                | Reason::BackfillCancelled
        )
    }
}

/// Publishes an Event about `lj` in the background; a failure is logged as a warning (Events
/// are best effort, but a refused one is a bug to see).
pub fn publish(ctx: &Context, lj: &LockedJob, reason: Reason, note: String) {
    let Some(namespace) = lj.namespace() else {
        return;
    };
    let event = build(lj, &ctx.holder, reason, note, Timestamp::now());
    let api: Api<Event> = Api::namespaced(ctx.client.clone(), &namespace);
    ctx.tasks.spawn(
        async move {
            if let Err(e) = api.create(&PostParams::default(), &event).await {
                tracing::warn!(error = %e, "event not recorded");
            }
        }
        .in_current_span(),
    );
}

fn build(
    lj: &LockedJob,
    instance: &str,
    reason: Reason,
    mut note: String,
    now: Timestamp,
) -> Event {
    if note.len() > MAX_NOTE_BYTES {
        let mut end = MAX_NOTE_BYTES;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
    }
    Event {
        metadata: ObjectMeta {
            // kube-apiserver validates the prefix itself as a DNS subdomain, where a trailing
            // '-' is allowed and a trailing '.' is not.
            generate_name: Some(format!("{}-", lj.name_any())),
            namespace: lj.namespace(),
            ..Default::default()
        },
        event_time: Some(MicroTime(now)),
        type_: Some(
            if reason.is_warning() {
                "Warning"
            } else {
                "Normal"
            }
            .into(),
        ),
        reason: Some(reason.as_str().into()),
        action: Some(reason.as_str().into()),
        note: Some(note),
        regarding: Some(lj.object_ref(&())),
        reporting_controller: Some(MANAGER.into()),
        reporting_instance: Some(instance.into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn locked_job() -> LockedJob {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "lockedjob.dev/v1alpha1", "kind": "LockedJob",
            "metadata": {"name": "report", "namespace": "team-a", "uid": "u-1"},
            "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {"spec": {
                "containers": [{"name": "main", "image": "busybox"}]}}}}}
        }))
        .expect("locked job")
    }

    #[test]
    fn event_names_its_object_reporter_and_kind() {
        let now = Timestamp::from_second(1_800_000_000).expect("time");
        let event = build(&locked_job(), "c1/r0", Reason::LockLost, "gone".into(), now);
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(event.reason.as_deref(), Some("LockLost"));
        assert_eq!(event.reporting_instance.as_deref(), Some("c1/r0"));
        assert_eq!(event.metadata.generate_name.as_deref(), Some("report-"));
        assert_eq!(event.metadata.namespace.as_deref(), Some("team-a"));
        let regarding = event.regarding.expect("regarding");
        assert_eq!(regarding.kind.as_deref(), Some("LockedJob"));
        assert_eq!(regarding.uid.as_deref(), Some("u-1"));
        assert_eq!(event.event_time.map(|t| t.0), Some(now));
    }

    /// kube-apiserver's check of a name prefix (`NameIsDNSSubdomain` with prefix = true: a
    /// trailing '-' is masked, then the whole must be an RFC 1123 subdomain).
    fn valid_generate_name(prefix: &str) -> bool {
        let masked = match prefix.strip_suffix('-') {
            Some(stem) => format!("{stem}a"),
            None => prefix.to_string(),
        };
        masked.len() <= 253
            && masked.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }

    #[test]
    fn generated_event_names_pass_the_api_servers_prefix_check() {
        assert!(
            !valid_generate_name("report."),
            "the check itself rejects a trailing dot"
        );
        for name in ["report", "nightly-report", "a.b"] {
            let mut lj = locked_job();
            lj.metadata.name = Some(name.into());
            let event = build(
                &lj,
                "c1/r0",
                Reason::Created,
                String::new(),
                Timestamp::now(),
            );
            let prefix = event.metadata.generate_name.expect("generateName");
            assert!(valid_generate_name(&prefix), "{prefix:?}");
        }
    }

    #[test]
    fn long_notes_are_cut_at_the_api_limit_on_a_character_boundary() {
        let note = "é".repeat(MAX_NOTE_BYTES); // 2 bytes each
        let event = build(
            &locked_job(),
            "c1/r0",
            Reason::Created,
            note,
            Timestamp::now(),
        );
        let note = event.note.expect("note");
        assert!(note.len() <= MAX_NOTE_BYTES && note.len() >= MAX_NOTE_BYTES - 1);
        assert_eq!(event.type_.as_deref(), Some("Normal"));
    }
}
