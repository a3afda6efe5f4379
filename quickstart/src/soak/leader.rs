//! The leader Deployment of the soak: the leader-election example
//! (`examples/leader-election/deployment.yaml`, `lockedjob elect --sidecar`), two replicas in
//! each cluster against the shared nodes, one leader across both; its workload writes the
//! leader's token to the fenced store every second while its sidecar says it leads. Judged
//! from the store's answers: terms, leader changes, the longest time without a write.

use super::judge::stale_accepted;
use super::store::StoreWrite;
use super::workload::{NAMESPACE, TTL_SECONDS};
use crate::clusters::{repo, Side};
use serde::Serialize;
use std::net::SocketAddr;

/// The fenced store's register for the leader's writes.
pub const LOCK: &str = "soak-leader";

/// The example as this cluster runs it: the soak's namespace, the nodes through this cluster's
/// proxies (as the default user), the cluster's id, the soak's TTL, and a workload that writes
/// to the store.
pub fn manifest(side: &Side, urls: &[String], store: SocketAddr) -> Result<String, String> {
    let path = repo("examples/leader-election/deployment.yaml");
    let example =
        std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let script = format!(
        "trap 'exit 0' TERM; while :; do \
         if leader=$(wget -q -O - http://127.0.0.1:8087/leader); then \
         token=$(echo \"$leader\" | sed -n 's/.*\"token\":\\([0-9]*\\).*/\\1/p'); \
         echo \"{LOCK} $token $HOSTNAME\" | nc -w 5 {} {} >/dev/null; fi; \
         sleep 1 & wait $!; done",
        store.ip(),
        store.port()
    );
    let command = serde_json::to_string(&["sh", "-c", &script]).map_err(|e| e.to_string())?;
    let ttl = format!("\"--ttl\", \"{TTL_SECONDS}s\"");
    // The soak's nodes have a password and no ACL user: the sidecar signs in as the default
    // user, so the example's username and the line after it (its value) go.
    let mut skip_value = false;
    Ok(example
        .lines()
        .filter(|line| {
            let skip = skip_value || line.trim() == "- name: LOCKEDJOB_REDIS_USERNAME";
            skip_value = line.trim() == "- name: LOCKEDJOB_REDIS_USERNAME";
            !skip
        })
        .map(|line| {
            let indent = &line[..line.len() - line.trim_start().len()];
            if line.trim_start().starts_with("redis://") {
                format!("{indent}{}", urls.join(","))
            } else if line.trim_start().starts_with("command: [\"sh\"") {
                format!("{indent}command: {command}")
            } else {
                line.replace("namespace: demo", &format!("namespace: {NAMESPACE}"))
                    .replace("value: prod-eu", &format!("value: {}", side.id))
                    .replace("\"--ttl\", \"15s\"", &ttl)
            }
        })
        .collect::<Vec<_>>()
        .join("\n"))
}

/// What the leader's writes say.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeaderReport {
    pub writes: usize,
    /// Distinct tokens the store took, in the order it took them: one per term.
    pub terms: usize,
    pub leader_changes: usize,
    /// The longest time between two writes the store took, in seconds (the workload writes
    /// every second while a leader holds its term).
    pub longest_without_a_leader_s: f64,
    pub stale_writes_refused: usize,
    pub stale_writes_accepted: usize,
}

pub fn judge(writes: &[StoreWrite]) -> LeaderReport {
    let ours: Vec<&StoreWrite> = writes.iter().filter(|w| w.lock == LOCK).collect();
    let mut accepted: Vec<&&StoreWrite> = ours.iter().filter(|w| w.accepted).collect();
    accepted.sort_by_key(|w| w.call_us);
    let mut terms: Vec<u64> = accepted.iter().map(|w| w.token).collect();
    terms.dedup();
    let longest = accepted
        .windows(2)
        .map(|pair| pair[1].call_us.saturating_sub(pair[0].call_us) as f64 / 1e6)
        .fold(0.0, f64::max);
    LeaderReport {
        writes: ours.len(),
        terms: terms.len(),
        leader_changes: terms.len().saturating_sub(1),
        longest_without_a_leader_s: longest,
        stale_writes_refused: ours.iter().filter(|w| !w.accepted).count(),
        stale_writes_accepted: stale_accepted(&ours),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(token: u64, accepted: bool, at: f64) -> StoreWrite {
        StoreWrite {
            lock: LOCK.into(),
            writer: "writer-1".into(),
            token,
            accepted,
            call_us: (at * 1e6) as u64,
            return_us: (at * 1e6) as u64 + 100,
        }
    }

    #[test]
    fn terms_changes_gaps_and_refusals_are_read_from_the_writes() {
        let writes = [
            write(3, true, 0.0),
            write(3, true, 1.0),
            write(5, true, 7.5),
            write(3, false, 8.0),
            write(5, true, 8.5),
        ];
        let report = judge(&writes);
        assert_eq!(
            (report.writes, report.terms, report.leader_changes),
            (5, 2, 1)
        );
        assert_eq!(report.longest_without_a_leader_s, 6.5);
        assert_eq!(
            (report.stale_writes_refused, report.stale_writes_accepted),
            (1, 0)
        );
        let stale = [write(5, true, 0.0), write(3, true, 2.0)];
        assert_eq!(judge(&stale).stale_writes_accepted, 1);
    }
}
