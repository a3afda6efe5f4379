//! A leader whose end Kubernetes has confirmed (docs/design.md, "Failover when Kubernetes
//! confirms the leader's end"). While it leads, a sidecar writes its lock and its lock value
//! into its container's termination message file. The kubelet gives every container instance
//! a file of its own and copies it into the pod's status only once that instance has exited.
//! So a terminated container status whose message names a lock value proves the one process
//! that held that value is gone, and a candidate may delete exactly that value at once
//! instead of waiting out its TTL.

use k8s_openapi::api::core::v1::{ContainerStatus, PodStatus};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What a leading sidecar writes into its termination message file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldValue {
    pub lock: String,
    pub value: String,
}

/// The lock values of `lock` held by container instances that the pod's status shows
/// terminated (now, or before a restart): each one's holder is gone.
pub fn ended_holders(status: &PodStatus, lock: &str) -> Vec<String> {
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    containers
        .flat_map(terminated_messages)
        .filter_map(held_value)
        .filter(|held| held.lock == lock && !held.value.is_empty())
        .map(|held| held.value)
        .collect()
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

    fn message(lock: &str, value: &str) -> String {
        serde_json::to_string(&HeldValue {
            lock: lock.into(),
            value: value.into(),
        })
        .expect("json")
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
            assert_eq!(ended_holders(&status(value), "writer"), expected, "{what}");
        }
    }

    #[test]
    fn the_file_holds_the_value_while_leading_and_nothing_after() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("termination-log");
        std::fs::write(&path, "").expect("the kubelet's empty file");
        let file = TerminationMessage::new(&path);
        let held = HeldValue {
            lock: "writer".into(),
            value: "east/pod-a/r4nd".into(),
        };
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
