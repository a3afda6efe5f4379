//! A lock as the nodes see it, for `lockedjob status`: each node's value, TTL, fence and
//! progress registers, and what a quorum of them says.

use super::lease::{holder_of, most_common};
use serde::Serialize;

/// One node's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeView {
    /// The node's URL, password hidden.
    pub node: String,
    /// Why the node did not answer; the fields below are then empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The lock value, `{holder}/{random}`.
    pub value: Option<String>,
    /// Milliseconds until the lock key expires on this node.
    pub ttl_ms: Option<u64>,
    /// The fence register: the highest token issued for this lock that this node saw.
    pub fence: Option<u64>,
    /// The progress register: the last step (for LockedJobs, scheduled time in unix ms) started.
    pub progress: Option<u64>,
}

impl NodeView {
    /// A node that did not answer: `error` says why, and every other field is empty.
    pub fn failed(node: String, error: String) -> Self {
        Self {
            node,
            error: Some(error),
            value: None,
            ttl_ms: None,
            fence: None,
            progress: None,
        }
    }

    /// The holder part of the value (`cluster/runner`).
    pub fn holder(&self) -> Option<&str> {
        self.value.as_deref().map(holder_of)
    }
}

/// A lock across the nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LockView {
    /// The lock name.
    pub lock: String,
    /// Nodes that must agree.
    pub quorum: usize,
    /// Nodes that answered.
    pub answered: usize,
    /// The holder whose value a quorum of nodes store; `None` when no value has a quorum.
    pub holder: Option<String>,
    /// On how many nodes the most common value is (a holder needs `quorum`).
    pub held_on: usize,
    /// The highest fence a quorum of the answering nodes has reached: while a quorum holds the
    /// lock, the holder's token (a failed attempt can raise the fence on a minority only);
    /// otherwise the last token issued. `None` when fewer than a quorum answered.
    pub token: Option<u64>,
    /// The highest progress a quorum of the answering nodes has reached, likewise.
    pub progress: Option<u64>,
    /// Each node's answer ([`Redlock::inspect`](crate::Redlock::inspect) lists them in the
    /// order the nodes are configured).
    pub nodes: Vec<NodeView>,
}

impl LockView {
    /// Sums up the answers `nodes` gave for `lock`, counting only the nodes that answered: the
    /// holder whose value at least `quorum` of them store, and the highest token and progress
    /// at least `quorum` of them have reached.
    pub fn new(lock: &str, quorum: usize, nodes: Vec<NodeView>) -> Self {
        let answering: Vec<&NodeView> = nodes.iter().filter(|n| n.error.is_none()).collect();
        let top = most_common(answering.iter().filter_map(|n| n.value.as_deref()));
        let holder = top
            .filter(|(_, count)| *count >= quorum)
            .map(|(value, _)| holder_of(value).to_string());
        let token = quorum_value(answering.iter().map(|n| n.fence.unwrap_or(0)), quorum);
        let progress = quorum_value(answering.iter().map(|n| n.progress.unwrap_or(0)), quorum);
        Self {
            lock: lock.to_string(),
            quorum,
            answered: answering.len(),
            holder,
            held_on: top.map_or(0, |(_, count)| count),
            token,
            progress,
            nodes,
        }
    }
}

/// The largest value at least `quorum` of `values` reach (the quorum-th largest); `None` when
/// fewer values are given, or it is 0 (registers start absent).
fn quorum_value(values: impl Iterator<Item = u64>, quorum: usize) -> Option<u64> {
    let mut values: Vec<u64> = values.collect();
    values.sort_unstable_by(|a, b| b.cmp(a));
    values
        .get(quorum.checked_sub(1)?)
        .copied()
        .filter(|v| *v > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(value: Option<&str>, fence: u64, progress: u64) -> NodeView {
        NodeView {
            node: "n".into(),
            error: None,
            value: value.map(str::to_string),
            ttl_ms: value.map(|_| 20_000),
            fence: (fence > 0).then_some(fence),
            progress: (progress > 0).then_some(progress),
        }
    }

    fn down() -> NodeView {
        NodeView::failed("n".into(), "timed out".into())
    }

    #[test]
    fn a_quorum_decides_holder_token_and_progress() {
        let a = Some("east/r1/abc");
        let b = Some("west/r2/def");
        // (what, nodes, holder, held_on, token, progress)
        type Row = (
            &'static str,
            Vec<NodeView>,
            Option<&'static str>,
            usize,
            Option<u64>,
            Option<u64>,
        );
        let table: Vec<Row> = vec![
            (
                "held everywhere",
                vec![node(a, 7, 60), node(a, 7, 60), node(a, 7, 60)],
                Some("east/r1"),
                3,
                Some(7),
                Some(60),
            ),
            (
                "a failed attempt raised a minority's fence: the holder's token is the quorum's",
                vec![node(a, 7, 60), node(a, 7, 60), node(b, 9, 60)],
                Some("east/r1"),
                2,
                Some(7),
                Some(60),
            ),
            (
                "a node down: still a quorum",
                vec![node(a, 7, 60), down(), node(a, 7, 60)],
                Some("east/r1"),
                2,
                Some(7),
                Some(60),
            ),
            (
                "split between two values: no holder",
                vec![node(a, 7, 0), node(b, 8, 0), node(None, 6, 0)],
                None,
                1,
                Some(7),
                None,
            ),
            (
                "free: the last token issued",
                vec![node(None, 4, 60), node(None, 4, 60), node(None, 3, 0)],
                None,
                0,
                Some(4),
                Some(60),
            ),
            (
                "fewer than a quorum answer: nothing is known",
                vec![node(a, 7, 60), down(), down()],
                None,
                1,
                None,
                None,
            ),
        ];
        for (what, nodes, holder, held_on, token, progress) in table {
            let view = LockView::new("nightly", 2, nodes);
            assert_eq!(view.holder.as_deref(), holder, "{what}: holder");
            assert_eq!(view.held_on, held_on, "{what}: held on");
            assert_eq!(view.token, token, "{what}: token");
            assert_eq!(view.progress, progress, "{what}: progress");
        }
    }
}
