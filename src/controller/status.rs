//! Status computation: conditions that keep their transition time while unchanged. Pure.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// One condition as a run or a reconcile wants it.
#[derive(Debug, Clone, Copy)]
pub struct ConditionUpdate<'a> {
    /// The condition type (`api::conditions`).
    pub kind: &'a str,
    pub status: bool,
    pub reason: &'a str,
    pub message: &'a str,
    /// The generation it describes; `None` for conditions about the world, not the spec.
    pub generation: Option<i64>,
}

/// Sets the condition, keeping `lastTransitionTime` when its status did not change.
pub fn set_condition(conditions: &mut Vec<Condition>, update: ConditionUpdate<'_>, now: Timestamp) {
    let ConditionUpdate {
        kind,
        status,
        reason,
        message,
        generation,
    } = update;
    let status = if status { "True" } else { "False" };
    let previous = conditions.iter().position(|c| c.type_ == kind);
    let transition = match previous.map(|i| &conditions[i]) {
        Some(old) if old.status == status => old.last_transition_time.clone(),
        _ => Time(now),
    };
    let condition = Condition {
        type_: kind.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        observed_generation: generation,
        last_transition_time: transition,
    };
    match previous {
        Some(i) => conditions[i] = condition,
        None => conditions.push(condition),
    }
}

pub fn condition_is_true(conditions: &[Condition], kind: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == kind && c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_on_a_status_change() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let t2: Timestamp = "2026-01-01T00:02:00Z".parse().unwrap();
        let mut conditions = Vec::new();
        set_condition(
            &mut conditions,
            ConditionUpdate {
                kind: "Ready",
                status: true,
                reason: "Scheduling",
                message: "ok",
                generation: Some(1),
            },
            t0,
        );
        set_condition(
            &mut conditions,
            ConditionUpdate {
                kind: "Ready",
                status: true,
                reason: "Scheduling",
                message: "still ok",
                generation: Some(2),
            },
            t1,
        );
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time.0, t0);
        assert_eq!(conditions[0].message, "still ok");
        assert_eq!(conditions[0].observed_generation, Some(2));
        set_condition(
            &mut conditions,
            ConditionUpdate {
                kind: "Ready",
                status: false,
                reason: "InvalidSpec",
                message: "bad",
                generation: Some(3),
            },
            t2,
        );
        assert_eq!(conditions[0].last_transition_time.0, t2);
        assert!(!condition_is_true(&conditions, "Ready"));
        set_condition(
            &mut conditions,
            ConditionUpdate {
                kind: "LockLost",
                status: true,
                reason: "QuorumLost",
                message: "x",
                generation: None,
            },
            t2,
        );
        assert!(condition_is_true(&conditions, "LockLost"));
        assert_eq!(conditions.len(), 2);
    }
}
