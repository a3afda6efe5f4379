//! A leader whose end Kubernetes has confirmed (docs/design.md, "Failover when Kubernetes
//! confirms the leader's end"). While it leads, a sidecar writes its lock and its lock value
//! into its container's termination message file. The kubelet gives every container instance
//! a file of its own and copies it into the pod's status only once that instance has exited.
//! So a terminated container status whose message names a lock value proves the one process
//! that held that value is gone, and a candidate may delete exactly that value at once
//! instead of waiting out its TTL, once the workload beside it can no longer act on its last
//! leader record: the message says how long each record stayed valid.

use k8s_openapi::api::core::v1::{ContainerStatus, PodStatus};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What a leading sidecar writes into its termination message file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldValue {
    pub lock: String,
    pub value: String,
    /// How far past its writing each leader record (token file, `/leader`) stayed valid: the
    /// workload may act that long after the sidecar's last refresh. Unknown: the record was
    /// valid up to the lease's give-up point, and only the TTL frees the lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_validity_ms: Option<u64>,
}

impl HeldValue {
    /// When a candidate that first saw this holder reported terminated at `seen` may delete its
    /// value: once the workload's last record has expired, counted with the clock drift the
    /// locks allow (the record's writer and reader share a node's clock, the candidate only
    /// measures an interval). `None`: never; the TTL frees the lock.
    pub fn free_at(
        &self,
        seen: std::time::Instant,
        drift_factor: f64,
    ) -> Option<std::time::Instant> {
        let validity = std::time::Duration::from_millis(self.record_validity_ms?);
        seen.checked_add(super::token_file::record_lifetime(validity, drift_factor))
    }
}

/// What container instances of `lock` that the pod's status shows terminated (now, or before
/// a restart) held: each one's holder is gone.
pub fn ended_holders(status: &PodStatus, lock: &str) -> Vec<HeldValue> {
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    containers
        .flat_map(terminated_messages)
        .filter_map(held_value)
        .filter(|held| held.lock == lock && !held.value.is_empty())
        .collect()
}

/// The dead holders a candidate has seen reported: when each may be freed, each once.
#[derive(Debug, Default)]
pub struct DeadHolders {
    /// Lock value → when it may be deleted; `None` once deleted, or never (no known validity).
    free_at: HashMap<String, Option<Instant>>,
}

impl DeadHolders {
    /// Takes the holders reported ended (pod, what it held) as seen `now` (the first sighting
    /// of each counts) and returns those whose value may be deleted now, each only once.
    pub fn due(
        &mut self,
        reported: Vec<(String, HeldValue)>,
        now: Instant,
        drift_factor: f64,
    ) -> Vec<(String, String)> {
        let mut due = Vec::new();
        for (pod, held) in reported {
            let free_at = *self.free_at.entry(held.value.clone()).or_insert_with(|| {
                let at = held.free_at(now, drift_factor);
                if at.is_none() {
                    tracing::info!(%pod, "the leader's container has terminated, but its message does not say how long its workload's record stays valid (an older sidecar): waiting out the TTL");
                }
                at
            });
            if free_at.is_some_and(|at| at <= now) {
                self.free_at.insert(held.value.clone(), None);
                due.push((pod, held.value));
            }
        }
        due
    }

    /// The earliest moment a holder seen so far may be freed.
    pub fn next_due(&self) -> Option<Instant> {
        self.free_at.values().flatten().min().copied()
    }
}

/// What a termination message says the container held. The kubelet puts the runtime's own
/// message, if any, before the file's text ("reason: text"), so the record is looked for at
/// the end.
fn held_value(message: &str) -> Option<HeldValue> {
    let start = message.rfind(r#"{"lock":"#)?;
    serde_json::from_str(&message[start..]).ok()
}

/// The termination messages of a container's current and last state, where terminated.
fn terminated_messages(status: &ContainerStatus) -> impl Iterator<Item = &str> {
    let current = status.state.as_ref().and_then(|s| s.terminated.as_ref());
    let last = status
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref());
    [current, last]
        .into_iter()
        .flatten()
        .filter_map(|terminated| terminated.message.as_deref())
}

/// The container's termination message file, where the leader writes what it holds.
pub struct TerminationMessage {
    path: PathBuf,
}

impl TerminationMessage {
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
        }
    }

    /// Writes `held` while leading. The kubelet reads the file only after the container has
    /// exited, so a plain write is enough. Without the file (not in a pod, or a read-only
    /// path) only this shortcut is lost: the lock then frees after its TTL as before.
    pub fn hold(&self, held: &HeldValue) {
        let text = serde_json::to_string(held).unwrap_or_default();
        if let Err(e) = self.replace_with(&text) {
            tracing::debug!(path = %self.path.display(), error = %e, "cannot write the termination message; a successor will wait out the TTL if this container dies");
        }
    }

    /// Empties the file when leadership ends: a later exit names no lock value.
    pub fn clear(&self) {
        let _ = self.replace_with("");
    }

    /// Never creates the file: outside a pod the path may name a real device directory.
    fn replace_with(&self, text: &str) -> std::io::Result<()> {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&self.path)?;
        file.write_all(text.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(value: serde_json::Value) -> PodStatus {
        serde_json::from_value(value).expect("pod status")
    }

    fn held(lock: &str, value: &str) -> HeldValue {
        HeldValue {
            lock: lock.into(),
            value: value.into(),
            record_validity_ms: Some(1000),
        }
    }

    fn message(lock: &str, value: &str) -> String {
        serde_json::to_string(&held(lock, value)).expect("json")
    }

    #[test]
    fn only_a_terminated_instance_of_this_lock_names_an_ended_holder() {
        let held = message("writer", "east/pod-a/r4nd");
        let other_lock = message("reports", "east/pod-a/x");
        // (what, status, values of ended holders)
        let table: Vec<(&str, serde_json::Value, Vec<&str>)> = vec![
            ("no statuses yet", json!({}), vec![]),
            (
                "the sidecar runs: proves nothing",
                json!({"initContainerStatuses": [{"name": "leader", "image": "i", "imageID": "",
                    "ready": true, "restartCount": 0, "state": {"running": {}}}]}),
                vec![],
            ),
            (
                "the sidecar terminated with the value",
                json!({"initContainerStatuses": [{"name": "leader", "image": "i", "imageID": "",
                    "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 137, "message": held}}}]}),
                vec!["east/pod-a/r4nd"],
            ),
            (
                "restarted: the last instance terminated with the value",
                json!({"initContainerStatuses": [{"name": "leader", "image": "i", "imageID": "",
                    "ready": true, "restartCount": 1, "state": {"running": {}},
                    "lastState": {"terminated": {"exitCode": 137, "message": held}}}]}),
                vec!["east/pod-a/r4nd"],
            ),
            (
                "the runtime's message before the file's text",
                json!({"initContainerStatuses": [{"name": "leader", "image": "i", "imageID": "",
                    "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 137, "message": format!("OOMKilled: {held}")}}}]}),
                vec!["east/pod-a/r4nd"],
            ),
            (
                "a regular container terminated with the value",
                json!({"containerStatuses": [{"name": "app", "image": "i", "imageID": "",
                    "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 1, "message": held}}}]}),
                vec!["east/pod-a/r4nd"],
            ),
            (
                "terminated, but holding another lock",
                json!({"initContainerStatuses": [{"name": "leader", "image": "i", "imageID": "",
                    "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 137, "message": other_lock}}}]}),
                vec![],
            ),
            (
                "terminated after stepping down (empty file) or with logs as its message",
                json!({"initContainerStatuses": [{"name": "leader", "image": "i", "imageID": "",
                    "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 1, "message": "panic: oops"}}}]}),
                vec![],
            ),
        ];
        for (what, value, expected) in table {
            let values: Vec<String> = ended_holders(&status(value), "writer")
                .into_iter()
                .map(|held| held.value)
                .collect();
            assert_eq!(values, expected, "{what}");
        }
    }

    #[test]
    fn a_dead_holder_is_freed_only_after_its_workload_record_expired() {
        let seen = std::time::Instant::now();
        let ms = std::time::Duration::from_millis;
        // (record validity in the message, drift factor, freed how long after `seen`)
        let table = [
            (Some(1000), 0.01, Some(ms(1000 + 10 + 2))),
            (Some(1000), 0.0, Some(ms(1000 + 2))),
            (
                Some(250),
                0.01,
                Some(ms(250) + ms(250).mul_f64(0.01) + ms(2)),
            ),
            // An older sidecar: its record lasted to the lease's give-up point.
            (None, 0.01, None),
        ];
        for (validity, drift, expected) in table {
            let held = HeldValue {
                record_validity_ms: validity,
                ..held("writer", "east/pod-a/r4nd")
            };
            let freed = held.free_at(seen, drift).map(|at| at - seen);
            assert_eq!(freed, expected, "{validity:?} ms, drift {drift}");
        }
        let older: HeldValue =
            serde_json::from_str(r#"{"lock":"writer","value":"v"}"#).expect("old message");
        assert_eq!(older.record_validity_ms, None);
    }

    #[test]
    fn each_dead_holder_is_due_once_its_record_expired_counted_from_its_first_sighting() {
        let start = Instant::now();
        let ms = std::time::Duration::from_millis;
        let reported = |holders: &[(&str, Option<u64>)]| -> Vec<(String, HeldValue)> {
            holders
                .iter()
                .map(|(value, validity)| {
                    let held = HeldValue {
                        record_validity_ms: *validity,
                        ..held("writer", value)
                    };
                    ("pod".to_string(), held)
                })
                .collect()
        };
        let mut dead = DeadHolders::default();
        let both = reported(&[("a", Some(1000)), ("old", None)]);
        assert!(dead.due(both.clone(), start, 0.0).is_empty(), "just seen");
        assert_eq!(dead.next_due(), Some(start + ms(1002)));
        // Seen again later: the first sighting still counts.
        assert!(dead.due(both.clone(), start + ms(1001), 0.0).is_empty());
        let freed = dead.due(both.clone(), start + ms(1002), 0.0);
        assert_eq!(freed, vec![("pod".to_string(), "a".to_string())]);
        assert!(
            dead.due(both, start + ms(5000), 0.0).is_empty(),
            "only once"
        );
        assert_eq!(dead.next_due(), None, "nothing else will come due");
        let later = reported(&[("b", Some(200))]);
        assert!(dead.due(later.clone(), start + ms(6000), 0.0).is_empty());
        assert_eq!(dead.due(later, start + ms(6202), 0.0).len(), 1);
    }

    #[test]
    fn the_file_holds_the_value_while_leading_and_nothing_after() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("termination-log");
        std::fs::write(&path, "").expect("the kubelet's empty file");
        let file = TerminationMessage::new(&path);
        let held = held("writer", "east/pod-a/r4nd");
        file.hold(&held);
        let written: HeldValue =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
        assert_eq!(written, held);
        file.clear();
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "");
        // No file made by the kubelet: none is made here either.
        let absent = dir.path().join("absent");
        TerminationMessage::new(&absent).hold(&held);
        assert!(!absent.exists());
    }
}
