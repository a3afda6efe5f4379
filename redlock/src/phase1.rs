//! Phase 1 of an acquisition decided from the nodes' replies, with no I/O, so that the choice
//! among a token, phase 2 and each refusal is tested by tables (docs/design.md, "Acquire").

use super::timing::may_hold_quorum;
use std::collections::HashMap;

/// One node's reply to the phase-1 script (`ACQUIRE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Vote {
    /// The node stored our value.
    pub granted: bool,
    /// The fence register before this call.
    pub fence: Option<u64>,
    /// The progress register (step acquisitions only).
    pub progress: Option<u64>,
    /// The node raised its fence to our proposal.
    pub raised: bool,
    /// The value the node holds where it refused ours.
    pub current: Option<String>,
}

/// Phase 1's replies, counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Tally {
    pub answered: usize,
    pub granted: usize,
    pub raised: usize,
    /// Nodes that hold another value.
    pub held: usize,
    /// Refused, by node index: they hold no value of ours, so a release skips them.
    pub refused: Vec<bool>,
    /// The largest fence any answering node reported: every token this engine may return must
    /// exceed it.
    pub highest_fence: u64,
    /// The largest progress register any node reported. A node's progress was raised by a
    /// holder that started that step, so refusing nodes count too.
    pub done: u64,
    /// On how many answering nodes the most common other value sits.
    pub strongest_other: usize,
}

impl Tally {
    /// Counts the votes of `nodes` nodes (each `(node index, vote)`; the missing ones did not
    /// answer).
    pub fn of(nodes: usize, votes: impl IntoIterator<Item = (usize, Vote)>) -> Self {
        let mut tally = Self {
            answered: 0,
            granted: 0,
            raised: 0,
            held: 0,
            refused: vec![false; nodes],
            highest_fence: 0,
            done: 0,
            strongest_other: 0,
        };
        let mut other_values: HashMap<String, usize> = HashMap::new();
        for (index, vote) in votes {
            tally.answered += 1;
            tally.done = tally.done.max(vote.progress.unwrap_or(0));
            tally.highest_fence = tally.highest_fence.max(vote.fence.unwrap_or(0));
            if vote.granted {
                tally.granted += 1;
                tally.raised += usize::from(vote.raised);
            } else {
                tally.held += 1;
                if let Some(flag) = tally.refused.get_mut(index) {
                    *flag = true;
                }
                if let Some(current) = vote.current {
                    *other_values.entry(current).or_default() += 1;
                }
            }
        }
        tally.strongest_other = other_values.values().copied().max().unwrap_or(0);
        tally
    }
}

/// What an attempt does after phase 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Decision {
    /// Too few granted, and no node holds another value: nodes failed or timed out.
    NoQuorum,
    /// Too few granted, and another holder may have a quorum (counting the silent nodes).
    Contended,
    /// Too few granted, and not even the silent nodes could give any value a quorum.
    SplitVote,
    /// Granted, but a holder already started the step asked for (or a later one).
    StepDone { done: u64 },
    /// Our proposal was raised from below on a quorum: it is the token, in one round.
    Token(u64),
    /// Phase 2: the token must exceed `floor`.
    Fence { floor: u64 },
}

pub(super) fn decide(
    tally: &Tally,
    nodes: usize,
    quorum: usize,
    proposal: u64,
    step: Option<u64>,
) -> Decision {
    if tally.granted < quorum {
        let silent = nodes.saturating_sub(tally.answered);
        return match tally.held {
            0 => Decision::NoQuorum,
            _ if may_hold_quorum(tally.strongest_other, silent, quorum) => Decision::Contended,
            _ => Decision::SplitVote,
        };
    }
    if step.is_some_and(|step| tally.done >= step) {
        return Decision::StepDone { done: tally.done };
    }
    if tally.raised >= quorum {
        // Raised from below on a quorum: above every token any earlier acquisition got to a
        // quorum, and no other acquisition can raise this value on a quorum.
        return Decision::Token(proposal);
    }
    // The proposal fell short (another client's token went higher, or too few nodes granted
    // below it): above everything seen, and above the proposal, which some nodes may hold now.
    let floor = if tally.raised > 0 {
        tally.highest_fence.max(proposal)
    } else {
        tally.highest_fence
    };
    Decision::Fence { floor }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(fence: u64, raised: bool) -> Vote {
        Vote {
            granted: true,
            fence: Some(fence),
            progress: None,
            raised,
            current: None,
        }
    }

    fn refuse(fence: u64, holder: &str) -> Vote {
        Vote {
            granted: false,
            fence: Some(fence),
            progress: None,
            raised: false,
            current: Some(holder.into()),
        }
    }

    fn with_progress(mut vote: Vote, progress: u64) -> Vote {
        vote.progress = Some(progress);
        vote
    }

    /// (what, votes of 5 nodes (None: silent), proposal, step, decision)
    type Case = (&'static str, Vec<Option<Vote>>, u64, Option<u64>, Decision);

    #[test]
    fn phase_one_picks_the_token_phase_two_or_the_refusal() {
        let table: Vec<Case> = vec![
            (
                "all raised from below: the proposal is the token",
                vec![Some(grant(4, true)); 5],
                5,
                None,
                Decision::Token(5),
            ),
            (
                "a quorum raised, two silent: still the token",
                vec![
                    Some(grant(4, true)),
                    Some(grant(4, true)),
                    Some(grant(4, true)),
                    None,
                    None,
                ],
                5,
                None,
                Decision::Token(5),
            ),
            (
                "a node above the proposal: raised on 4, still a quorum",
                vec![
                    Some(grant(4, true)),
                    Some(grant(4, true)),
                    Some(grant(4, true)),
                    Some(grant(4, true)),
                    Some(grant(9, false)),
                ],
                5,
                None,
                Decision::Token(5),
            ),
            (
                "raised on 2 only: phase 2 above the proposal and every fence",
                vec![
                    Some(grant(4, true)),
                    Some(grant(4, true)),
                    Some(grant(9, false)),
                    Some(grant(9, false)),
                    Some(grant(9, false)),
                ],
                5,
                None,
                Decision::Fence { floor: 9 },
            ),
            (
                "raised nowhere: phase 2 above the highest fence",
                vec![
                    Some(grant(7, false)),
                    Some(grant(7, false)),
                    Some(grant(7, false)),
                    None,
                    None,
                ],
                5,
                None,
                Decision::Fence { floor: 7 },
            ),
            (
                "raised on a minority below the proposal: phase 2 above the proposal",
                vec![
                    Some(grant(1, true)),
                    Some(grant(3, false)),
                    Some(grant(3, false)),
                    None,
                    None,
                ],
                2,
                None,
                Decision::Fence { floor: 3 },
            ),
            (
                // Not from a real node (a granting node below the proposal raises), but the
                // nodes that raised hold the proposal now, so it counts as seen.
                "raised on one, the others report lower fences: above the proposal",
                vec![
                    Some(grant(1, true)),
                    Some(grant(1, false)),
                    Some(grant(1, false)),
                    None,
                    None,
                ],
                5,
                None,
                Decision::Fence { floor: 5 },
            ),
            (
                "two granted, three silent: no quorum",
                vec![Some(grant(0, true)), Some(grant(0, true)), None, None, None],
                1,
                None,
                Decision::NoQuorum,
            ),
            (
                "another holder on three: contended",
                vec![
                    Some(grant(0, true)),
                    Some(grant(0, true)),
                    Some(refuse(3, "b")),
                    Some(refuse(3, "b")),
                    Some(refuse(3, "b")),
                ],
                1,
                None,
                Decision::Contended,
            ),
            (
                "another value on two, one silent: it may hold a quorum",
                vec![
                    Some(grant(0, true)),
                    Some(grant(0, true)),
                    Some(refuse(3, "b")),
                    Some(refuse(3, "b")),
                    None,
                ],
                1,
                None,
                Decision::Contended,
            ),
            (
                "three values, none can reach three: a split vote",
                vec![
                    Some(grant(0, true)),
                    Some(grant(0, true)),
                    Some(refuse(3, "b")),
                    Some(refuse(3, "b")),
                    Some(refuse(3, "c")),
                ],
                1,
                None,
                Decision::SplitVote,
            ),
            (
                "the step was started (a refusing node counts): done",
                vec![
                    Some(grant(4, true)),
                    Some(grant(4, true)),
                    Some(grant(4, true)),
                    Some(with_progress(refuse(4, "b"), 60)),
                    None,
                ],
                5,
                Some(60),
                Decision::StepDone { done: 60 },
            ),
            (
                "a later step was started: done",
                vec![
                    Some(with_progress(grant(4, true), 120)),
                    Some(grant(4, true)),
                    Some(grant(4, true)),
                    None,
                    None,
                ],
                5,
                Some(60),
                Decision::StepDone { done: 120 },
            ),
            (
                "an earlier step only: the token",
                vec![
                    Some(with_progress(grant(4, true), 30)),
                    Some(grant(4, true)),
                    Some(grant(4, true)),
                    None,
                    None,
                ],
                5,
                Some(60),
                Decision::Token(5),
            ),
        ];
        for (what, votes, proposal, step, expected) in table {
            let nodes = votes.len();
            let tally = Tally::of(
                nodes,
                votes
                    .into_iter()
                    .enumerate()
                    .filter_map(|(i, vote)| Some((i, vote?))),
            );
            assert_eq!(decide(&tally, nodes, 3, proposal, step), expected, "{what}");
        }
    }

    #[test]
    fn the_tally_marks_the_refusing_nodes_and_the_strongest_other_value() {
        let tally = Tally::of(
            5,
            [
                (0, grant(2, true)),
                (2, refuse(7, "b")),
                (3, refuse(7, "b")),
                (4, refuse(8, "c")),
            ],
        );
        assert_eq!(tally.refused, [false, false, true, true, true]);
        assert_eq!(
            (
                tally.answered,
                tally.granted,
                tally.held,
                tally.strongest_other,
                tally.highest_fence
            ),
            (4, 1, 3, 2, 8)
        );
    }
}
