//! `lockedjob elect LOCK --observe`: a line each time the leader changes, like `etcdctl elect -l`.

use super::args::{ElectArgs, ObserveOutput};
use crate::child::Signals;
use crate::redlock::{LockView, Redlock};
use jiff::Timestamp;

/// What `--observe` sees of an election at one read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// A quorum stores this holder's value; the token is the fence those nodes agree on.
    Leader { holder: String, token: Option<u64> },
    /// A quorum answered and none stores one value.
    NoLeader,
    /// Fewer than a quorum answered: nobody can know.
    Unknown { answered: usize, quorum: usize },
}

impl Observed {
    pub fn of(view: &LockView) -> Self {
        if view.answered < view.quorum {
            return Self::Unknown {
                answered: view.answered,
                quorum: view.quorum,
            };
        }
        match &view.holder {
            Some(holder) => Self::Leader {
                holder: holder.clone(),
                token: view.token,
            },
            None => Self::NoLeader,
        }
    }

    /// One `--observe` line.
    pub fn line(&self, lock: &str, since: Timestamp, output: ObserveOutput) -> String {
        match output {
            ObserveOutput::Text => match self {
                Self::Leader { holder, token } => match token {
                    Some(token) => format!("{since} {lock}: leader {holder}, token {token}"),
                    None => format!("{since} {lock}: leader {holder}"),
                },
                Self::NoLeader => format!("{since} {lock}: no leader"),
                Self::Unknown { answered, quorum } => format!(
                    "{since} {lock}: unknown (only {answered} nodes answer, quorum {quorum})"
                ),
            },
            ObserveOutput::Json => {
                let (state, holder, token) = match self {
                    Self::Leader { holder, token } => ("leader", Some(holder.as_str()), *token),
                    Self::NoLeader => ("none", None, None),
                    Self::Unknown { .. } => ("unknown", None, None),
                };
                let cluster = holder.and_then(|h| h.split_once('/')).map(|(c, _)| c);
                serde_json::json!({
                    "lock": lock,
                    "state": state,
                    "holder": holder,
                    "cluster": cluster,
                    "token": token,
                    "since": since,
                })
                .to_string()
            }
        }
    }
}

/// Reads the election every `--poll-interval` and prints a line when what it sees changes.
/// Ends with 0 on SIGTERM or SIGINT.
pub(super) async fn observe(engine: &Redlock, args: &ElectArgs) -> i32 {
    let mut signals = Signals::watch();
    let mut last: Option<Observed> = None;
    loop {
        let seen = Observed::of(&engine.inspect(&args.lock).await);
        if last.as_ref() != Some(&seen) {
            println!("{}", seen.line(&args.lock, Timestamp::now(), args.output));
            last = Some(seen);
        }
        tokio::select! {
            _ = tokio::time::sleep(args.poll_interval) => {}
            _ = signals.next() => return 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redlock::NodeView;

    fn node(value: Option<&str>, fence: u64) -> NodeView {
        NodeView {
            node: "n".into(),
            error: None,
            value: value.map(str::to_string),
            ttl_ms: value.map(|_| 1_000),
            fence: Some(fence),
            progress: None,
        }
    }

    #[test]
    fn the_observer_names_a_leader_only_when_a_quorum_stores_its_value() {
        let down = || NodeView::failed("n".into(), "refused".into());
        let leader = |holder: &str, token| Observed::Leader {
            holder: holder.into(),
            token: Some(token),
        };
        let table = [
            (
                vec![
                    node(Some("west/a/1"), 4),
                    node(Some("west/a/1"), 4),
                    node(None, 3),
                ],
                leader("west/a", 4),
            ),
            // A failed attempt raised one node's fence: the quorum's fence is the holder's.
            (
                vec![
                    node(Some("west/a/1"), 4),
                    node(Some("west/a/1"), 4),
                    node(None, 5),
                ],
                leader("west/a", 4),
            ),
            (
                vec![
                    node(Some("west/a/1"), 4),
                    node(Some("east/b/2"), 5),
                    node(None, 5),
                ],
                Observed::NoLeader,
            ),
            (
                vec![node(None, 4), node(None, 4), node(None, 4)],
                Observed::NoLeader,
            ),
            (
                vec![node(Some("west/a/1"), 4), down(), down()],
                Observed::Unknown {
                    answered: 1,
                    quorum: 2,
                },
            ),
        ];
        for (nodes, expected) in table {
            let view = LockView::new("l", 2, nodes.clone());
            assert_eq!(Observed::of(&view), expected, "{nodes:?}");
        }
    }

    #[test]
    fn observe_lines_name_the_cluster_and_token() {
        let since: Timestamp = "2026-12-05T12:00:00Z".parse().expect("a timestamp");
        let seen = Observed::Leader {
            holder: "west/pod-a".into(),
            token: Some(7),
        };
        assert_eq!(
            seen.line("billing", since, ObserveOutput::Text),
            "2026-12-05T12:00:00Z billing: leader west/pod-a, token 7"
        );
        let json: serde_json::Value =
            serde_json::from_str(&seen.line("billing", since, ObserveOutput::Json))
                .expect("one JSON object");
        assert_eq!(json["cluster"], "west");
        assert_eq!(json["token"], 7);
        assert_eq!(json["state"], "leader");
        let none: serde_json::Value =
            serde_json::from_str(&Observed::NoLeader.line("billing", since, ObserveOutput::Json))
                .expect("one JSON object");
        assert_eq!(none["state"], "none");
        assert!(none["holder"].is_null());
    }
}
