//! Checks a lab history. Pure: a [`History`] in, [`Findings`] out.
//!
//! What it looks for:
//! - **overlap**: two clients inside the critical section at the same time (mutual exclusion
//!   broken);
//! - **past deadline**: a client still in its critical section, or writing, after its own
//!   lease deadline (the lease discipline broken, even if nobody else noticed);
//! - **token order**: a lease granted after another with a token not larger (fencing broken);
//! - **no validity**: a lease handed out with no time left on it;
//! - **stale write accepted**: the fenced store took a write whose token is below one it took
//!   before (the store's own check broken).
//!
//! Overlaps and past-deadline acts are what Redlock's timing assumptions exclude; the last three
//! are what fencing must exclude even when those assumptions fail.

#[cfg(test)]
use super::history::StoreWrite;
use super::history::{ClientOp, History};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// One stay in the critical section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Section {
    pub client: u32,
    pub token: u64,
    pub start_us: u64,
    pub end_us: u64,
    /// No exit was recorded: the section runs to the end of the history.
    pub open: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overlap {
    pub first: Section,
    pub second: Section,
    pub from_us: u64,
    pub to_us: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LateAct {
    Exit,
    Write,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PastDeadline {
    pub client: u32,
    pub token: u64,
    pub act: LateAct,
    pub at_us: u64,
    pub deadline_us: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenOrder {
    pub earlier_client: u32,
    pub earlier_token: u64,
    pub later_client: u32,
    pub later_token: u64,
    pub at_us: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaleWrite {
    pub client: u32,
    pub token: u64,
    pub newest_token: u64,
    /// Index in the store's log of writes.
    pub position: usize,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub acquire_attempts: u64,
    pub acquisitions: u64,
    pub acquire_failures: u64,
    pub renewals: u64,
    pub lease_losses: u64,
    pub releases: u64,
    pub sections: u64,
    pub writes: u64,
    pub writes_rejected: u64,
}

/// The run's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// No violation of any kind.
    Safe,
    /// Mutual exclusion or the lease discipline broke, but tokens only grew and the fenced
    /// store refused every stale write: fenced storage stayed safe.
    Fenced,
    /// Fencing itself broke: a token did not grow, or the store took a stale write, or a lease
    /// came with no validity.
    Unsafe,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Findings {
    pub counts: Counts,
    pub overlaps: Vec<Overlap>,
    pub past_deadline: Vec<PastDeadline>,
    pub token_order: Vec<TokenOrder>,
    pub no_validity: Vec<(u32, u64)>,
    pub stale_writes_accepted: Vec<StaleWrite>,
}

impl Findings {
    /// Writes the fenced store refused: each came from a holder whose lease a newer holder had
    /// already superseded, so an unfenced store would have let it overwrite newer data.
    pub fn stale_writes_rejected(&self) -> u64 {
        self.counts.writes_rejected
    }

    pub fn verdict(&self) -> Verdict {
        if !self.token_order.is_empty()
            || !self.stale_writes_accepted.is_empty()
            || !self.no_validity.is_empty()
        {
            Verdict::Unsafe
        } else if !self.overlaps.is_empty() || !self.past_deadline.is_empty() {
            Verdict::Fenced
        } else {
            Verdict::Safe
        }
    }
}

/// Checks a history whose events are in time order.
pub fn check(history: &History) -> Findings {
    let mut findings = Findings::default();
    let counts = &mut findings.counts;
    // Per (client, token): the latest deadline known so far.
    let mut deadlines: HashMap<(u32, u64), u64> = HashMap::new();
    let mut newest_granted: Option<(u32, u64)> = None;
    for event in &history.events {
        let client = event.client;
        match &event.op {
            ClientOp::AcquireStart => counts.acquire_attempts += 1,
            ClientOp::AcquireFailed { .. } => counts.acquire_failures += 1,
            ClientOp::Acquired {
                token,
                validity_ms,
                deadline_us,
            } => {
                counts.acquisitions += 1;
                if *validity_ms == 0 {
                    findings.no_validity.push((client, *token));
                }
                if let Some((earlier_client, earlier_token)) = newest_granted {
                    if *token <= earlier_token {
                        findings.token_order.push(TokenOrder {
                            earlier_client,
                            earlier_token,
                            later_client: client,
                            later_token: *token,
                            at_us: event.at_us,
                        });
                    }
                }
                if newest_granted.is_none_or(|(_, t)| *token > t) {
                    newest_granted = Some((client, *token));
                }
                deadlines.insert((client, *token), *deadline_us);
            }
            ClientOp::Extended { token, deadline_us } => {
                counts.renewals += 1;
                let deadline = deadlines.entry((client, *token)).or_insert(0);
                *deadline = (*deadline).max(*deadline_us);
            }
            ClientOp::LeaseLost { .. } => counts.lease_losses += 1,
            ClientOp::Released { .. } => counts.releases += 1,
            ClientOp::Enter { .. } | ClientOp::WriteStart { .. } => {}
            ClientOp::Exit { token } => {
                late(
                    &mut findings.past_deadline,
                    &deadlines,
                    client,
                    *token,
                    LateAct::Exit,
                    event.at_us,
                );
            }
            ClientOp::Write { token, accepted } => {
                counts.writes += 1;
                if !*accepted {
                    counts.writes_rejected += 1;
                }
                late(
                    &mut findings.past_deadline,
                    &deadlines,
                    client,
                    *token,
                    LateAct::Write,
                    event.at_us,
                );
            }
        }
    }
    // In the store's own order: two clients' replies may reach the lab in either order.
    let mut newest_accepted: Option<u64> = None;
    for (position, write) in history.store_log.iter().enumerate() {
        if !write.accepted {
            continue;
        }
        if let Some(newest) = newest_accepted.filter(|n| write.token < *n) {
            findings.stale_writes_accepted.push(StaleWrite {
                client: write.client,
                token: write.token,
                newest_token: newest,
                position,
            });
        }
        newest_accepted = Some(newest_accepted.map_or(write.token, |n| n.max(write.token)));
    }
    let sections = sections(history);
    findings.counts.sections = sections.len() as u64;
    findings.overlaps = overlaps(sections);
    findings
}

/// Every stay in the critical section: each client's entry paired with its next exit; one
/// never left runs to the end of the history.
pub fn sections(history: &History) -> Vec<Section> {
    let mut open: HashMap<u32, (u64, u64)> = HashMap::new(); // client -> (token, entered)
    let mut sections = Vec::new();
    for event in &history.events {
        match event.op {
            ClientOp::Enter { token } => {
                open.insert(event.client, (token, event.at_us));
            }
            ClientOp::Exit { .. } => {
                if let Some((token, start_us)) = open.remove(&event.client) {
                    sections.push(Section {
                        client: event.client,
                        token,
                        start_us,
                        end_us: event.at_us,
                        open: false,
                    });
                }
            }
            _ => {}
        }
    }
    let mut still_open: Vec<_> = open.into_iter().collect();
    still_open.sort_unstable();
    for (client, (token, start_us)) in still_open {
        sections.push(Section {
            client,
            token,
            start_us,
            end_us: history.end_us.max(start_us),
            open: true,
        });
    }
    sections
}

fn late(
    out: &mut Vec<PastDeadline>,
    deadlines: &HashMap<(u32, u64), u64>,
    client: u32,
    token: u64,
    act: LateAct,
    at_us: u64,
) {
    if let Some(&deadline_us) = deadlines.get(&(client, token)) {
        if at_us > deadline_us {
            out.push(PastDeadline {
                client,
                token,
                act,
                at_us,
                deadline_us,
            });
        }
    }
}

/// Pairs of sections of different clients that share time, by a sweep over start times.
fn overlaps(mut sections: Vec<Section>) -> Vec<Overlap> {
    sections.sort_by_key(|s| (s.start_us, s.client));
    let mut found = Vec::new();
    for (i, first) in sections.iter().enumerate() {
        for second in &sections[i + 1..] {
            if second.start_us >= first.end_us {
                break;
            }
            if second.client != first.client {
                found.push(Overlap {
                    first: *first,
                    second: *second,
                    from_us: second.start_us,
                    to_us: first.end_us.min(second.end_us),
                });
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::history::ClientEvent;

    use crate::lab::history::event_at_ms as ev;

    fn acquired(at_ms: u64, client: u32, token: u64, validity_ms: u64) -> ClientEvent {
        ev(
            at_ms,
            client,
            ClientOp::Acquired {
                token,
                validity_ms,
                deadline_us: (at_ms + validity_ms) * 1000,
            },
        )
    }

    /// A well-behaved stay: acquire, enter, write, exit, release.
    fn stay(from_ms: u64, to_ms: u64, client: u32, token: u64) -> Vec<ClientEvent> {
        vec![
            ev(from_ms, client, ClientOp::AcquireStart),
            acquired(from_ms, client, token, 1000),
            ev(from_ms + 1, client, ClientOp::Enter { token }),
            ev(
                from_ms + 2,
                client,
                ClientOp::Write {
                    token,
                    accepted: true,
                },
            ),
            ev(to_ms, client, ClientOp::Exit { token }),
            ev(to_ms, client, ClientOp::Released { token }),
        ]
    }

    fn history(mut events: Vec<ClientEvent>) -> History {
        events.sort_by_key(|e| e.at_us);
        History {
            clients: 3,
            nodes: 5,
            end_us: 10_000_000,
            events,
            ..Default::default()
        }
    }

    fn concat(parts: Vec<Vec<ClientEvent>>) -> Vec<ClientEvent> {
        parts.into_iter().flatten().collect()
    }

    #[test]
    fn clean_history_is_safe() {
        let h = history(concat(vec![
            stay(0, 100, 0, 1),
            stay(150, 300, 1, 2),
            stay(300, 400, 2, 3),
        ]));
        let f = check(&h);
        assert_eq!(f.verdict(), Verdict::Safe, "{f:?}");
        assert_eq!(f.counts.acquisitions, 3);
        assert_eq!(f.counts.sections, 3);
        assert_eq!(f.counts.writes, 3);
    }

    /// Each kind of violation, alone, with the verdict it must give.
    #[test]
    fn each_violation_is_found_and_classified() {
        struct Case {
            name: &'static str,
            events: Vec<ClientEvent>,
            verdict: Verdict,
            check: fn(&Findings) -> bool,
        }
        let cases = vec![
            Case {
                name: "overlapping sections",
                events: concat(vec![stay(0, 200, 0, 1), stay(100, 300, 1, 2)]),
                verdict: Verdict::Fenced,
                check: |f| {
                    f.overlaps.len() == 1
                        && f.overlaps[0].from_us == 101_000
                        && f.overlaps[0].to_us == 200_000
                },
            },
            Case {
                name: "exit after the lease deadline",
                events: vec![
                    acquired(0, 0, 1, 100),
                    ev(1, 0, ClientOp::Enter { token: 1 }),
                    ev(150, 0, ClientOp::Exit { token: 1 }),
                ],
                verdict: Verdict::Fenced,
                check: |f| f.past_deadline.len() == 1 && f.past_deadline[0].act == LateAct::Exit,
            },
            Case {
                name: "a renewal moves the deadline: no violation",
                events: vec![
                    acquired(0, 0, 1, 100),
                    ev(1, 0, ClientOp::Enter { token: 1 }),
                    ev(
                        50,
                        0,
                        ClientOp::Extended {
                            token: 1,
                            deadline_us: 200_000,
                        },
                    ),
                    ev(150, 0, ClientOp::Exit { token: 1 }),
                ],
                verdict: Verdict::Safe,
                check: |f| f.counts.renewals == 1 && f.past_deadline.is_empty(),
            },
            Case {
                name: "token not growing",
                events: concat(vec![stay(0, 100, 0, 5), stay(200, 300, 1, 5)]),
                verdict: Verdict::Unsafe,
                check: |f| {
                    f.token_order.len() == 1
                        && f.token_order[0].later_client == 1
                        && f.token_order[0].later_token == 5
                },
            },
            Case {
                name: "token going down",
                events: concat(vec![stay(0, 100, 0, 7), stay(200, 300, 1, 3)]),
                verdict: Verdict::Unsafe,
                check: |f| f.token_order.len() == 1,
            },
            Case {
                name: "lease without validity",
                events: vec![acquired(0, 0, 1, 0)],
                verdict: Verdict::Unsafe,
                check: |f| f.no_validity == vec![(0, 1)],
            },
            Case {
                name: "store refused a stale write",
                events: vec![
                    ev(
                        0,
                        1,
                        ClientOp::Write {
                            token: 9,
                            accepted: true,
                        },
                    ),
                    ev(
                        10,
                        0,
                        ClientOp::Write {
                            token: 8,
                            accepted: false,
                        },
                    ),
                ],
                verdict: Verdict::Safe,
                check: |f| f.stale_writes_rejected() == 1 && f.stale_writes_accepted.is_empty(),
            },
            Case {
                name: "a section never left runs to the end and overlaps",
                events: vec![
                    acquired(0, 0, 1, 100_000),
                    ev(1, 0, ClientOp::Enter { token: 1 }),
                    acquired(500, 1, 2, 100_000),
                    ev(501, 1, ClientOp::Enter { token: 2 }),
                    ev(600, 1, ClientOp::Exit { token: 2 }),
                ],
                verdict: Verdict::Fenced,
                check: |f| f.overlaps.len() == 1 && f.overlaps[0].first.open,
            },
        ];
        for case in cases {
            let findings = check(&history(case.events));
            assert_eq!(
                findings.verdict(),
                case.verdict,
                "{}: {findings:?}",
                case.name
            );
            assert!((case.check)(&findings), "{}: {findings:?}", case.name);
        }
    }

    #[test]
    fn a_stale_write_the_store_took_is_judged_in_store_order() {
        let write = |client, token, accepted| StoreWrite {
            client,
            token,
            accepted,
        };
        // The lab saw the replies in the other order; the store's log is what counts.
        let mut h = history(vec![
            ev(
                0,
                0,
                ClientOp::Write {
                    token: 8,
                    accepted: true,
                },
            ),
            ev(
                1,
                1,
                ClientOp::Write {
                    token: 9,
                    accepted: true,
                },
            ),
        ]);
        h.store_log = vec![write(1, 9, true), write(0, 8, true)];
        let f = check(&h);
        assert_eq!(f.verdict(), Verdict::Unsafe);
        assert_eq!(
            f.stale_writes_accepted,
            vec![StaleWrite {
                client: 0,
                token: 8,
                newest_token: 9,
                position: 1
            }]
        );
        h.store_log = vec![write(0, 8, true), write(1, 9, true), write(0, 8, false)];
        assert_eq!(check(&h).verdict(), Verdict::Safe);
    }

    #[test]
    fn one_client_back_to_back_is_not_an_overlap() {
        let h = history(concat(vec![stay(0, 100, 0, 1), stay(100, 200, 0, 2)]));
        assert!(check(&h).overlaps.is_empty());
    }

    #[test]
    fn three_way_overlap_reports_each_pair() {
        let h = history(concat(vec![
            stay(0, 300, 0, 1),
            stay(100, 300, 1, 2),
            stay(200, 300, 2, 3),
        ]));
        assert_eq!(check(&h).overlaps.len(), 3);
    }
}
