//! The independent checker (`tools/porcupine-check`, built by `scripts/porcupine-check.sh`):
//! porcupine, the linearizability checker of etcd's robustness tests, with a model of the
//! fenced store and of "one holder at a time", written from their definitions and nothing of
//! `checker.rs`. The lab exports its history in the tool's format, runs it, and a run is as
//! expected only when both checkers agree with the scenario (docs/design.md, "The lab's two
//! checkers").

use super::checker::Verdict;
use super::error::LabError;
use super::history::{ClientOp, History};
use serde::Serialize;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

/// One write to the fenced store: from its call to its answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Write {
    pub client: u32,
    pub call_us: u64,
    pub return_us: u64,
    pub token: u64,
    pub accepted: bool,
}

/// One entry to (`enter`) or exit from the critical section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    pub client: u32,
    pub at_us: u64,
    pub enter: bool,
    pub token: u64,
}

/// What `porcupine-check` reads.
#[derive(Debug, Default, PartialEq, Eq, Serialize)]
pub struct Export {
    pub writes: Vec<Write>,
    pub sections: Vec<Step>,
}

/// The history's writes (each answer paired with its client's call before it) and critical
/// sections. A write whose answer never came (the client died) is left out: it took no effect
/// the store logged for that client to see.
pub fn export(history: &History) -> Export {
    let mut export = Export::default();
    let mut calls: HashMap<u32, (u64, u64)> = HashMap::new();
    for event in &history.events {
        let client = event.client;
        match event.op {
            ClientOp::WriteStart { token } => {
                calls.insert(client, (event.at_us, token));
            }
            ClientOp::Write { token, accepted } => {
                let call_us = match calls.remove(&client) {
                    Some((at, started)) if started == token => at,
                    // No call recorded: the answer's own instant (a narrower interval only
                    // makes the check stricter).
                    _ => event.at_us,
                };
                export.writes.push(Write {
                    client,
                    call_us,
                    return_us: event.at_us,
                    token,
                    accepted,
                });
            }
            ClientOp::Enter { token } | ClientOp::Exit { token } => export.sections.push(Step {
                client,
                at_us: event.at_us,
                enter: matches!(event.op, ClientOp::Enter { .. }),
                token,
            }),
            _ => {}
        }
    }
    export
}

/// What the independent checker said about each model, and the verdict that follows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Independent {
    pub fenced_store: String,
    pub one_holder: String,
    /// `Unsafe` when the store's answers fit no order of the writes, `Fenced` when two
    /// clients were inside at once, `Safe` otherwise.
    pub verdict: Verdict,
}

/// Writes `porcupine.json` into `out`, runs `checker` on it (with HTML visualizations of a
/// failing model next to it), and reads its verdict.
pub fn check(checker: &Path, history: &History, out: &Path) -> Result<Independent, LabError> {
    check_export(checker, &export(history), out)
}

/// `check` for a history exported by another harness (the cluster soak's).
pub fn check_export(checker: &Path, export: &Export, out: &Path) -> Result<Independent, LabError> {
    let input = out.join("porcupine.json");
    let json = serde_json::to_string(export)
        .map_err(|e| LabError::Io("encode porcupine.json", std::io::Error::other(e)))?;
    std::fs::write(&input, json).map_err(|e| LabError::Io("write porcupine.json", e))?;
    let run = Command::new(checker)
        .arg("-visualize")
        .arg(out)
        .arg(&input)
        .output()
        .map_err(|e| LabError::Io("run the independent checker", e))?;
    let said = String::from_utf8_lossy(&run.stdout);
    let verdict_of = |model: &str| {
        said.lines()
            .find_map(|line| line.strip_prefix(model)?.strip_prefix(": "))
            .map(|rest| rest.split(" (").next().unwrap_or(rest).to_string())
    };
    let (Some(fenced_store), Some(one_holder)) =
        (verdict_of("fenced-store"), verdict_of("one-holder"))
    else {
        return Err(LabError::Checker(format!(
            "{} said neither model's verdict (exit {:?}): {}{}",
            checker.display(),
            run.status.code(),
            said,
            String::from_utf8_lossy(&run.stderr)
        )));
    };
    let verdict = if fenced_store != "ok" {
        Verdict::Unsafe
    } else if one_holder != "ok" {
        Verdict::Fenced
    } else {
        Verdict::Safe
    };
    Ok(Independent {
        fenced_store,
        one_holder,
        verdict,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::history::event_at_ms;

    #[test]
    fn writes_pair_with_their_calls_and_sections_keep_their_order() {
        let history = History {
            events: vec![
                event_at_ms(1, 1, ClientOp::Enter { token: 3 }),
                event_at_ms(2, 1, ClientOp::WriteStart { token: 3 }),
                event_at_ms(2, 2, ClientOp::WriteStart { token: 2 }),
                event_at_ms(
                    4,
                    1,
                    ClientOp::Write {
                        token: 3,
                        accepted: true,
                    },
                ),
                event_at_ms(
                    5,
                    2,
                    ClientOp::Write {
                        token: 2,
                        accepted: false,
                    },
                ),
                // An answer without its call: the answer's instant stands for both.
                event_at_ms(
                    6,
                    1,
                    ClientOp::Write {
                        token: 3,
                        accepted: true,
                    },
                ),
                event_at_ms(7, 1, ClientOp::Exit { token: 3 }),
            ],
            ..History::default()
        };
        let export = export(&history);
        let intervals: Vec<(u32, u64, u64, bool)> = export
            .writes
            .iter()
            .map(|w| (w.client, w.call_us, w.return_us, w.accepted))
            .collect();
        assert_eq!(
            intervals,
            [
                (1, 2000, 4000, true),
                (2, 2000, 5000, false),
                (1, 6000, 6000, true)
            ]
        );
        let steps: Vec<(u64, bool)> = export.sections.iter().map(|s| (s.at_us, s.enter)).collect();
        assert_eq!(steps, [(1000, true), (7000, false)]);
    }
}
